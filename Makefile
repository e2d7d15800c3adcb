# Sluice developer commands. `make test` installs everything and runs every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/.tools/bin:$(PATH)

.PHONY: all deps tools protos check-protos lint typecheck test unit integration bench up clean

all: test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $@

## deps: the Python environment (.venv) with the project and its dev/test tools
deps: $(VENV)/.installed tools

## tools: system tools the tests use (redis-server, java, helm, prometheus)
tools:
	bash scripts/install-tools.sh

## protos: regenerate services/sluice/v1 from proto/ (committed; a test checks freshness)
protos: $(VENV)/.installed
	$(PY) scripts/gen_protos.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check services tests bench scripts spark-jobs
	$(VENV)/bin/ruff format --check services tests bench scripts spark-jobs

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

## test: install everything, then lint, type-check and run every test
test: deps lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider

unit: $(VENV)/.installed
	$(PY) -m pytest -q tests/unit

## up: run the whole system locally (private redis-server in ./sluice-data)
up: $(VENV)/.installed
	$(VENV)/bin/sluice up

bench: $(VENV)/.installed
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache
