#!/usr/bin/env bash
# hydra's "ssh" for the test hosts (tests/cluster/_hosts.py): hydra calls it as
#   netns_launcher.sh [-x] HOST CMD...
# like `ssh [-x] HOST CMD...`, and it runs CMD on test host HOST (host.sh: in the
# network namespace mnpar-HOST, under the host name HOST) instead of logging in
# anywhere; Open MPI's mpirun calls it the same way (plm_rsh_agent). Only test
# hosts h1, h2, ... (node1, node2, ...: their other names, as docs/cluster.rst's
# host files have them).
set -euo pipefail
[ "${1:-}" = -x ] && shift
host=${1:?usage: netns_launcher.sh [-x] HOST CMD...}
shift
case $host in node[1-9] | node[1-9][0-9]) host=h${host#node} ;; esac  # the docs' names
case $host in
    h[1-9] | h[1-9][0-9]) ;;
    *) echo "netns_launcher.sh: $host is not a test host (h1, h2, ...)" >&2; exit 2 ;;
esac
# ssh joins its arguments into one line for the remote shell; so does this.
# Each host has its own name: Open MPI names its shared-memory files after it,
# and two hosts of one name would share them. MNPAR_HOST_NAME: the name mnpar's
# errors give the host (as MPI.Get_processor_name() does now).
exec "$(dirname "$0")/host.sh" "$host" env MNPAR_HOST_NAME="$host" bash -c "$*"
