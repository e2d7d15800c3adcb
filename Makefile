# Sluice developer commands. `make test` installs everything and runs every test; `make help` lists targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/.tools/bin:$(PATH)

.PHONY: all help deps tools protos check-protos module-map guard-table lint typecheck test unit integration packaging bench compare up clean

all: test

## help: list the targets and what each does
help:
	@grep -E '^## ' $(MAKEFILE_LIST) | sed 's/^## /  /'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,dev,spark,bench]'
	touch $@

## deps: the Python environment (.venv) with the project and its dev/test tools
deps: $(VENV)/.installed tools

## tools: system tools the tests use (redis-server, java, helm, prometheus)
tools:
	bash scripts/install-tools.sh

## protos: regenerate services/sluice/v1 from proto/ (committed; a test checks freshness)
protos: $(VENV)/.installed
	$(PY) scripts/gen_protos.py

## check-protos: fail if the committed generated code differs from what `make protos` writes
check-protos: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_protos_fresh.py

## module-map: regenerate the module map of docs/architecture.md (a test checks freshness)
module-map: $(VENV)/.installed
	$(PY) scripts/module_map.py

## guard-table: regenerate docs/security.md's table of what each RPC needs (a test checks freshness)
guard-table: $(VENV)/.installed
	$(PY) scripts/guard_table.py

## lint: ruff lint and format check
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check services tests bench scripts spark-jobs
	$(VENV)/bin/ruff format --check services tests bench scripts spark-jobs

## typecheck: mypy --strict over the package, the tests and the benchmarks
typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

## test: install everything, then lint, type-check and run every test (TEST_WORKERS=3 parallel pytest-xdist
##   workers, file by file; TEST_WORKERS=0 runs them one at a time; docs/testing.md, "Test-suite budget")
TEST_WORKERS ?= 3
test: deps lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

## unit: the unit tests only (no processes, no Redis)
unit: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

## integration: the tests against real processes and a private Redis
integration: deps
	$(PY) -m pytest -q -p no:cacheprovider tests/integration tests/chaos tests/metrics tests/chart tests/deploy

## packaging: `pip install sluice` into a fresh venv at the lowest protobuf/grpcio, its SDK against `sluice up` (also in `test`)
packaging: deps
	$(PY) -m pytest -q -p no:cacheprovider tests/packaging

## bench: the data-plane benchmarks (produce, fetch, group and push consume, latency); results in bench/results
bench: $(VENV)/.installed
	$(PY) bench/log_throughput.py
	$(PY) bench/e2e_latency.py
	$(PY) bench/group_consume.py
	$(PY) bench/push_throughput.py

## compare: Sluice beside Redis Streams, NATS JetStream and RabbitMQ on servers of its own (QUICK=1: a short
##   smoke); writes docs/benchmarks.md, docs/benchmarks/*.png and docs/benchmarks/compare.json
compare: deps
	cd bench && $(CURDIR)/$(PY) -m compare $(if $(QUICK),--quick) --command "make compare$(if $(QUICK), QUICK=1)"

## up: run the whole system locally (private redis-server in ./sluice-data)
up: $(VENV)/.installed
	$(VENV)/bin/sluice up

## clean: remove the environment, tools and caches
clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache
