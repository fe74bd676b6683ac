# Every target installs what it needs into .venv first (once, guarded by a stamp).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NP     ?= 2
# chainer 7.8.1 needs numpy<2 and setuptools<74, at build and at run time.
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install test test-fast demo bench docs lint clean

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "setuptools<74" wheel "numpy<2"
	# chainer ships only as source; build it against the pinned setuptools.
	$(PY) -m pip install -q --no-build-isolation "chainer==7.8.1"
	$(PY) -m pip install -q --no-build-isolation -e ".[mpich,examples,dev]"
	touch $@

lint: $(STAMP)
	$(PY) -m ruff check $(wildcard mnpar _mnpar_compat tests benchmarks examples setup.py)
	$(PY) -m mypy mnpar _mnpar_compat

docs: $(STAMP)
	$(PY) -m sphinx -E -W --keep-going -q -b html docs docs/_build/html

test: lint docs
	$(PY) tests/run_suite.py

test-fast: $(STAMP)
	$(PY) tests/run_suite.py --sizes 2

demo: $(STAMP)
	$(VENV)/bin/mpiexec -n 2 $(PY) examples/mlp/train_mlp.py

# Ratios against raw mpi4py and ChainerMN, measured in the same run; last, the soak test.
bench: $(STAMP)
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_p2p.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_allreduce.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_mlp.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_data_parallel.py
	$(VENV)/bin/mpiexec -n 3 $(PY) -W ignore benchmarks/bench_wait.py
	$(VENV)/bin/mpiexec -n 2 $(PY) -W ignore benchmarks/bench_pipeline.py
	$(VENV)/bin/mpiexec -n 3 $(PY) -W ignore benchmarks/soak.py

clean:
	rm -rf $(VENV) build docs/_build *.egg-info
