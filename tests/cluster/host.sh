#!/usr/bin/env bash
# Runs CMD on test host HOST as that host (tests/cluster/_hosts.py, _slurm.py):
#   host.sh HOST CMD...
# in the host's network namespace (mnpar-HOST, where /etc/hosts names h0, h1, ...)
# and under its own name (a UTS namespace of its own: `hostname` says HOST), as a
# login on that machine would. h0 is the head node (Slurm's controller, the login
# host); h1, h2, ... the compute hosts. The arguments stay separate (no shell line).
set -euo pipefail
host=${1:?usage: host.sh HOST CMD...}
shift
case $host in
    h[0-9] | h[1-9][0-9]) ;;
    *) echo "host.sh: $host is not a test host (h0, h1, ...)" >&2; exit 2 ;;
esac
exec ip netns exec "mnpar-$host" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
