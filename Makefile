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

.PHONY: install test test-fast test-cluster demo bench docs lint clean numpy1-reference gpu-wheels

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

# On numpy 2, the suite also compares training losses with numpy 1.26's, run
# in the default .venv (Python 3.11), which this installs if needed.
ifeq ($(NUMPY)$(shell command -v python3.11 >/dev/null && python3.11 -c "" 2>/dev/null && echo 3.11),23.11)
test: export MNPAR_REFERENCE_PYTHON := $(CURDIR)/.venv/bin/python
test: numpy1-reference
endif

numpy1-reference:
	$(MAKE) install NUMPY=1 PYTHON=python3.11 VENV=.venv

test-fast: $(STAMP)
	$(PY) tests/run_suite.py --sizes 2

# mpiexec across test hosts (network namespaces, TCP between them), then their
# latencies; needs root, and skips with the reason elsewhere (docs/cluster.rst).
test-cluster: $(STAMP)
	$(PY) -m pytest -q tests/cluster
	$(PY) -W ignore benchmarks/cluster_latency.py

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
