# Every target installs what it needs into its venv first (once, guarded by a stamp).
#   make test                        Python 3.11 (else python3), numpy 1.26: .venv
#   make test NUMPY=2                numpy 2: .venv-numpy2
#   make test PYTHON=python3.12      .venv-py3.12 (Python 3.13+ has numpy 2 only)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PYVER  := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
NUMPY  ?= $(if $(filter 3.9 3.10 3.11 3.12,$(PYVER)),1,2)
VENV   ?= .venv$(if $(filter-out 3.11,$(PYVER)),-py$(PYVER))$(if $(filter 2,$(NUMPY)),-numpy2)
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# chainer 7.8.1 needs setuptools<74 at build and at run time; the numpy pin
# (numpy<2, or numpy>=2 with mnpar's compatibility layer) comes second.
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt $(CURDIR)/constraints-numpy$(NUMPY).txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install test test-fast test-cluster demo bench docs lint clean numpy1-reference gpu-wheels \
        cluster-packages venv-openmpi venv-mpich test-system-mpi

install: $(STAMP)

$(STAMP): setup.py constraints.txt constraints-numpy$(NUMPY).txt
	@echo "make install: $(VENV), Python $(PYVER), numpy $(NUMPY) (once; later targets reuse it)"
	@echo "[1/4] a virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "[2/4] setuptools, wheel, numpy"
	$(PY) -m pip install setuptools wheel numpy
	@echo "[3/4] chainer 7.8.1: PyPI ships it only as source, so pip builds it here, against"
	@echo "      the pinned setuptools (minutes the first time; pip caches the wheel after)"
	$(PY) -m pip install --no-build-isolation "chainer==7.8.1"
	@echo "[4/4] mnpar, MPICH's wheel and mpi4py, and the examples' and tests' packages"
	$(PY) -m pip install --no-build-isolation -e ".[mpich,examples,dev]"
	touch $@
	@echo "make install: done ($(VENV))"

lint: $(STAMP)
	$(PY) -m ruff check $(wildcard mnpar _mnpar_compat tests benchmarks examples setup.py)
	$(PY) -m mypy mnpar _mnpar_compat

docs: $(STAMP)
	$(PY) -m sphinx -E -W --keep-going -q -b html docs docs/_build/html

test: lint docs
	$(PY) tests/run_suite.py

# On numpy 2, the suite (test or test-fast) also compares training losses with
# numpy 1.26's, run in the default .venv (Python 3.11), which this installs if needed.
ifeq ($(NUMPY)$(shell command -v python3.11 >/dev/null && python3.11 -c "" 2>/dev/null && echo 3.11),23.11)
test test-fast: export MNPAR_REFERENCE_PYTHON := $(CURDIR)/.venv/bin/python
test test-fast: numpy1-reference
endif

numpy1-reference:
	$(MAKE) install NUMPY=1 PYTHON=python3.11 VENV=.venv

# SUITE_ARGS: pytest's arguments for every run, e.g. SUITE_ARGS='-m "not slow"'.
test-fast: $(STAMP)
	$(PY) tests/run_suite.py --sizes 2 $(if $(SUITE_ARGS),-- $(SUITE_ARGS))

# mpiexec across test hosts (network namespaces, TCP between them), Slurm on them,
# the distribution's Open MPI and MPICH (the 2-rank suite's MPI modules, then the
# cluster tests under each), then the hosts' latencies; needs root and the packages
# of cluster-packages, and skips with the reason elsewhere (docs/cluster.rst).
test-cluster: $(STAMP)
	$(if $(CLUSTER_VENVS),$(MAKE) -j2 test-system-mpi)
	$(PY) -m pytest -q -rs tests/cluster
	$(PY) -W ignore benchmarks/cluster_latency.py

# As root: Slurm 22.05, Open MPI 4.1, MPICH 4.0 from apt (Debian 12); else says why.
cluster-packages:
	tests/cluster/install_packages.sh

# mpi4py built against the distribution's Open MPI or MPICH, in a venv of its own
# without the mpich extra (docs/installation.rst, "Using a system MPI instead"):
# make venv-openmpi, make venv-mpich. MPI4PY_CFLAGS=-O0 builds it in under half the
# time (these venvs run tests; leave it empty for real work). The venv's mpiexec
# runs the MPI's own launcher, as tests/run_suite.py looks for it there (a script,
# not a link: hydra looks for its proxy beside the path it was started as).
# test-cluster builds both at once (make -j2: two compilers on two cores); the
# editable installs, which write into the checkout, take turns (flock).
SYSTEM_MPIS := openmpi mpich
MPI4PY_CFLAGS ?= -O0
CLUSTER_VENVS := $(foreach m,$(SYSTEM_MPIS),$(if $(shell command -v mpicc.$(m) 2>/dev/null),.venv-$(m)/.installed))
venv-openmpi venv-mpich: venv-%: .venv-%/.installed
$(SYSTEM_MPIS:%=.venv-%/.installed): .venv-%/.installed: setup.py constraints.txt constraints-numpy$(NUMPY).txt
	@command -v mpicc.$* >/dev/null || { echo "venv-$*: needs mpicc.$* (make cluster-packages)"; exit 1; }
	rm -rf .venv-$*
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q setuptools wheel numpy
	MPICC=mpicc.$* CFLAGS="$(MPI4PY_CFLAGS)" .venv-$*/bin/python -m pip install -q --no-cache-dir --no-binary mpi4py mpi4py
	.venv-$*/bin/python -m pip install -q --no-build-isolation "chainer==7.8.1"
	mkdir -p build && flock build/.editable.lock \
	    .venv-$*/bin/python -m pip install -q --no-build-isolation -e ".[examples,dev]"
	printf '#!/bin/sh\nexec %s "$$@"\n' "$$(command -v mpiexec.$*)" > .venv-$*/bin/mpiexec
	chmod +x .venv-$*/bin/mpiexec
	.venv-$*/bin/python -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"
	touch $@

# The 2-rank suite's modules that exercise MPI, under each system MPI built above.
# Open MPI: more ranks than cores need oversubscription; as root, its two variables.
SYSTEM_MPI_TESTS := $(wildcard tests/test_communicators_*.py tests/test_functions_*.py \
    tests/test_links_*.py) tests/test_failfast.py tests/test_extensions_snapshot.py \
    tests/test_extensions_resume.py tests/test_optimizers_multi_node.py \
    tests/test_optimizers_double_buffering.py
OPENMPI_ENV := OMPI_MCA_rmaps_base_oversubscribe=1 \
    $(if $(filter 0,$(shell id -u)),OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
test-system-mpi: $(CLUSTER_VENVS)
	$(if $(wildcard .venv-openmpi/.installed),$(OPENMPI_ENV) .venv-openmpi/bin/python \
	    tests/run_suite.py --no-single --sizes 2 -- $(SYSTEM_MPI_TESTS))
	$(if $(wildcard .venv-mpich/.installed),.venv-mpich/bin/python \
	    tests/run_suite.py --no-single --sizes 2 -- $(SYSTEM_MPI_TESTS))

demo: $(STAMP)
	$(VENV)/bin/mpiexec -n 2 $(PY) examples/mlp/train_mlp.py

# Ratios against raw mpi4py and ChainerMN, measured in the same run; last, the soak test.
bench: $(STAMP)
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_p2p.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_p2p.py --rewrite
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_allreduce.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_mlp.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_data_parallel.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_sharded.py
	$(VENV)/bin/mpiexec -n 3 $(PY) -W ignore benchmarks/bench_wait.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_pipeline.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_random.py
	MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=4000000000 \
	  $(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_spatial.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_tensor.py
	$(PY) -W ignore benchmarks/bench_openblas.py $(if $(filter-out .venv-numpy2,$(VENV)),$(if $(wildcard .venv-numpy2/bin/python),--also .venv-numpy2/bin/python))
	$(VENV)/bin/mpiexec -n 3 $(PY) -W ignore benchmarks/soak.py

# Wheels for a GPU machine without internet (CPython 3.12, numpy 2 and cupy
# preinstalled): docs/installation.rst, "GPUs", says how to carry and use them.
GPU_WHEELS := build/gpu-wheels
gpu-wheels: $(STAMP)
	$(PY) -m pip wheel -q --no-deps --no-build-isolation "chainer==7.8.1" -w $(GPU_WHEELS)
	$(PY) -m pip download -q --only-binary=:all: --implementation cp --python-version 3.12 \
	    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d $(GPU_WHEELS) \
	    "setuptools<74" wheel mpi4py mpich threadpoolctl pytest pytest-timeout \
	    filelock protobuf six typing_extensions nltk
	du -sh $(GPU_WHEELS)

clean:
	rm -rf .venv .venv-* build docs/_build *.egg-info
