#!/usr/bin/env bash
# What `make test-cluster` needs from the distribution, installed as root with apt-get
# (`make cluster-packages`; CI runs it): Slurm 22.05 (slurmctld, slurmd, srun...; its
# basic plugins hold both mpi/pmi2 and mpi/pmix), Open MPI 4.1 and MPICH 4.0 with their
# compiler wrappers (mpicc.openmpi, mpicc.mpich) for mpi4py. Elsewhere (not root, no
# apt-get) it says why and installs nothing: the cluster tests then skip with the reason.
# Services the packages would start (munge, slurmd, slurmctld) are held back: the tests
# start their own daemons with a configuration of their own.
set -euo pipefail
PACKAGES=(slurmctld slurmd slurm-client openmpi-bin libopenmpi-dev mpich libmpich-dev)
if [ "$(id -u)" != 0 ]; then
    echo "cluster-packages: skipped, needs root (apt-get install ${PACKAGES[*]})"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "cluster-packages: skipped, needs apt-get (Debian 12's ${PACKAGES[*]})"
    exit 0
fi
missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" \
        || missing+=("$package")
done
if [ ${#missing[@]} = 0 ]; then
    echo "cluster-packages: all installed"
    exit 0
fi
policy=/usr/sbin/policy-rc.d
ours=
if [ ! -e "$policy" ]; then  # no service starts while we install
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && ours=1
fi
trap '[ -n "$ours" ] && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "cluster-packages: installed ${missing[*]}"
