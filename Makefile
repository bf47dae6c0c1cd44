# attnlab: `make train` trains the default experiment, `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED_DATA := $(abspath ../shared/data)
# Point the real-data tests at the shared offline datasets when they are there.
export ATTNLAB_DATA_DIR ?= $(if $(wildcard $(SHARED_DATA)),$(SHARED_DATA),$(CURDIR)/data)

.PHONY: install data train test test-fast clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# `make data` downloads the datasets into ./data (or into ATTNLAB_DATA_DIR when you set it), never into ../shared/data
FETCH_DIR := $(if $(filter file,$(origin ATTNLAB_DATA_DIR)),$(CURDIR)/data,$(ATTNLAB_DATA_DIR))
data: install
	$(PY) -m attnlab.data.fetch --data-dir $(FETCH_DIR)

train: install
	$(PY) train.py $(ARGS)

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf logs .cache .pytest_cache
