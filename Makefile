# attnlab: `make train` trains the default experiment, `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED_DATA := $(abspath ../shared/data)
# Point the real-data tests at the shared offline datasets when they are there.
export ATTNLAB_DATA_DIR ?= $(if $(wildcard $(SHARED_DATA)),$(SHARED_DATA),$(CURDIR)/data)

.PHONY: install data train lint test test-fast clean

# the bytecode of the ~20,000 modules installed (torch's CUDA build among them) compiled on every core, where pip
# compiles it on one; a file that does not compile (written for another Python) is left, as pip leaves it
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	$(PY) -m compileall -qq -j 0 $(VENV)/lib >/dev/null || true
	touch $@

install: $(VENV)/.installed

# `make data` downloads the datasets into ./data (or into ATTNLAB_DATA_DIR when you set it), never into ../shared/data
FETCH_DIR := $(if $(filter file,$(origin ATTNLAB_DATA_DIR)),$(CURDIR)/data,$(ATTNLAB_DATA_DIR))
data: install
	$(PY) -m attnlab.data.fetch --data-dir $(FETCH_DIR)

train: install
	$(PY) train.py $(ARGS)

lint: install
	$(PY) -m ruff check .

# test workers (pytest-xdist): each gets cores / workers torch threads (at least one); WORKERS=0 runs the tests in
# this process. Three on two cores: the SLURM cluster's tests run one after the other on one worker, which mostly
# waits on the cluster's jobs, while the other two use the cores
WORKERS ?= 3
XDIST := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)

# everything (what CI runs), then the 15 slowest tests; below the SLURM cluster's jobs in CPU priority
# (tools/slurm-cluster.sh starts its daemons at the normal one), so that a job gets its CPUs first, as on its nodes
test: install
	nice -n 5 $(PY) -m pytest -q $(XDIST) --durations=15 $(PYTEST_ARGS)

# the inner loop: every module on tiny configs, without the learning, benchmark and large-corpus tests (`slow`)
test-fast: install
	$(PY) -m pytest -q $(XDIST) -m "not slow" --durations=15 $(PYTEST_ARGS)

clean:
	rm -rf logs .cache .pytest_cache
