#!/usr/bin/env bash
# hydra's "ssh" for the test hosts (tests/cluster/_hosts.py): hydra calls it as
#   netns_launcher.sh [-x] HOST CMD...
# like `ssh [-x] HOST CMD...`, and it runs CMD in the network namespace of test
# host HOST (mnpar-HOST) instead of logging in anywhere. Only test hosts h1, h2, ...
set -euo pipefail
[ "${1:-}" = -x ] && shift
host=${1:?usage: netns_launcher.sh [-x] HOST CMD...}
shift
case $host in
    h[1-9] | h[1-9][0-9]) ;;
    *) echo "netns_launcher.sh: $host is not a test host (h1, h2, ...)" >&2; exit 2 ;;
esac
# ssh joins its arguments into one line for the remote shell; so does this.
# MNPAR_HOST_NAME: the name mnpar's errors give the host (all share the machine's).
exec ip netns exec "mnpar-$host" env MNPAR_HOST_NAME="$host" bash -c "$*"
