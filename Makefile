# gpudra developer entry points. Every install step lives here so a fresh machine needs nothing else.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lint test unit integration faults k8s bench cluster-up cluster-down demo proto schemas clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

# The test command named in README.md (and run by .ci/run): lint, unit tests, and the integration
# tests against a real local control plane and kubelet (built once into ~/.cache/gpudra).
test: lint k8s
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP) k8s
	$(BIN)/pytest tests/integration

# The fault suite (also part of `make test`): random SIGKILLs with an auditor, disk full at every
# write, damaged checkpoints, a read-only CDI root. Simulated GPUs, no cluster; about a minute.
faults: $(STAMP)
	$(BIN)/pytest tests/faults

k8s:
	bash deploy/local/build.sh >/dev/null

# Issue 15: gpudra's kubelet plugin side by side with dra-example-driver's (built from the Go module
# proxy into ~/.cache/gpudra), interleaved rounds on the local control plane; prints the table and
# rewrites its section of BENCHMARKS.md and docs/bench-latency.png. About 12 minutes on 2 cores.
bench: $(STAMP) k8s
	bash deploy/local/build-peer.sh >/dev/null
	$(BIN)/python -m tests.bench

# README's demo command: a real local cluster, simulated GPUs, gpudra installed, the examples prepared.
demo: $(STAMP) k8s
	$(BIN)/python -m tests.localcluster.demo

cluster-up: $(STAMP) k8s
	@$(BIN)/python -m tests.localcluster up $(if $(NODES),--nodes $(NODES))

cluster-down: $(STAMP)
	@$(BIN)/python -m tests.localcluster down

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

schemas: $(STAMP)
	$(BIN)/python -m gpudra.api.schema

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
