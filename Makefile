# Corral. `make help` lists the targets; every target sets itself up (venv, install, binaries).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# mypy's cache outside the clone: a fresh clone on a warm machine checks in seconds, not a minute
# (mypy re-checks what changed by content, whatever the clone's path).
MYPY_CACHE := $(HOME)/.cache/corral/mypy
SRC := api kube operator harness_image cli devtools
PACKAGES := api/corral_api kube/corral_kube operator/corral_operator harness_image/corral_harness \
  harness_image/corral_custodian harness_image/corral_common cli/corral_cli devtools/corral_dev
# Workers for `make test` (ADR 0097). The cluster, attack and e2e tiers mostly wait (for pods,
# operators, turns), so three workers on CI's 2 cores run them side by side; the groups keep the
# real node and the attack suite on one worker each. `make test TEST_WORKERS=0` runs everything
# one after another in one process.
TEST_WORKERS ?= 3
# The path test (hack/path-tests.sh) runs the unit and local-node tiers as one process beside
# the main run, which then takes one worker fewer: three processes on CI's 2 cores, as before.
MAIN_WORKERS := $(shell w=$(TEST_WORKERS); [ "$$w" -gt 1 ] && echo $$((w - 1)) || echo $$w)
# When `make test` started, builds and lint included: the run's summary reports it and fails a
# run past CORRAL_RUN_LIMIT_SECONDS (tests/conftest.py).
CORRAL_RUN_STARTED ?= $(shell date +%s)
CORRAL_RUN_STARTED := $(CORRAL_RUN_STARTED)
export CORRAL_RUN_STARTED

help: ## List the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

# uv installs the dev set from its cache (~/.cache/uv) in seconds where pip took minutes on a
# fresh clone (ADR 0097); the set and the versions are pyproject.toml's either way.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q 'uv>=0.5,<1'
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]'
	@# kopf imports kubernetes-asyncio whenever it is there: a venv made before ADR 0101 drops it
	$(BIN)/uv pip uninstall -q --python $(BIN)/python kubernetes-asyncio 2>/dev/null || true
	@touch $@

venv: $(STAMP) ## Create .venv and install Corral with its dev tools

control-plane: ## Build the pinned kube-apiserver, etcd, KCM, kubectl, helm (cached in ~/.cache/corral)
	bash hack/build-control-plane.sh

exec: ## Build corral-exec, the sandbox's tools service (static Go binary, cached in ~/.cache/corral)
	@bash hack/build-exec.sh >/dev/null

exec-check: ## gofmt, go vet and go test for corral-exec
	@cd harness_image/corral_exec && test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting" >&2; exit 1; }
	cd harness_image/corral_exec && CGO_ENABLED=0 GOTOOLCHAIN=local go vet ./... && CGO_ENABLED=0 GOTOOLCHAIN=local go test -count=1 ./...

gateway: ## Build corral-gateway, the sandboxes' egress gateway (static Go binary on smokescreen, cached in ~/.cache/corral)
	@bash hack/build-gateway.sh >/dev/null

gateway-check: ## gofmt, go vet and go test for corral-gateway
	@cd gateway && test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting" >&2; exit 1; }
	cd gateway && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go vet ./... && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go test -count=1 ./...

crds: $(STAMP) ## Regenerate crds/ and the chart's copy from the API models
	$(BIN)/python -m corral_api.crdgen crds charts/corral/crds

crds-check: $(STAMP) ## Fail if the generated CRDs differ from the models
	$(BIN)/python -m corral_api.crdgen crds charts/corral/crds --check

docs: $(STAMP) ## Write the docs' generated parts (docs/cli.md's columns and command reference)
	$(BIN)/python hack/docs-gen.py

docs-check: $(STAMP) ## Fail if the docs' generated parts differ from the code
	$(BIN)/python hack/docs-gen.py --check

lint: $(STAMP) ## ruff, mypy --strict and import-linter
	$(BIN)/ruff check $(SRC) tests tests_extra bench
	$(BIN)/mypy --cache-dir $(MYPY_CACHE) $(SRC)
	$(BIN)/lint-imports
	$(BIN)/pylint --rcfile /dev/null --disable=all --enable=duplicate-code --min-similarity-lines=8 \
	  --ignore-imports=yes --ignore-signatures=yes --ignore-docstrings=yes --ignore-comments=yes \
	  --score=no $(PACKAGES)

# Where the real node can run (root, Linux), its build starts first, in the background: a
# cold build (Go, debootstrap) then overlaps lint, the control plane's build and the other
# tiers; the node tier waits for it through the build scripts' locks.
node-background:
	@if [ "$$(id -u)" = 0 ] && [ "$$(uname -s)" = Linux ] && command -v go >/dev/null; then \
	  mkdir -p "$(HOME)/.cache/corral"; \
	  ( bash hack/node/install-packages.sh && { bash hack/node/build-images.sh & \
	    bash hack/node/build-node.sh; wait; } ) \
	    > "$(HOME)/.cache/corral/node-build.log" 2>&1 < /dev/null & \
	fi

test: $(STAMP) node-background lint crds-check docs-check chart-check control-plane exec exec-check gateway gateway-check ## Everything CI runs: lint, drift check, Go and Python tests (unit, wire, cluster, attack, node)
	@bash hack/path-tests.sh start
	@# The unit and local-node tiers run from the path test's copy (hack/path-tests.sh), not here.
	$(BIN)/pytest -q -p no:cacheprovider -rs -n $(MAIN_WORKERS) --dist loadgroup \
	  --ignore=tests/unit --ignore=tests/cluster/test_localnode.py; rc=$$?; \
	  bash hack/path-tests.sh wait || rc=$${rc/#0/1}; exit $$rc

test-unit: $(STAMP) ## Unit tests only (no processes, no cluster)
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

# checkov, the chart's manifest scanner (docs/security.md), pinned in its own venv so that
# .venv stays lean; uv installs it from its cache in seconds on a warm machine.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := $(HOME)/.cache/corral/venv-checkov

$(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION): | $(STAMP)
	rm -rf $(CHECKOV_VENV)
	$(BIN)/uv venv -q --python $(PYTHON) $(CHECKOV_VENV)
	$(BIN)/uv pip install -q --python $(CHECKOV_VENV)/bin/python 'checkov==$(CHECKOV_VERSION)'
	@touch $@

chart-check: $(STAMP) control-plane $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION) ## helm lint --strict, the chart README's drift, checkov over the rendered chart and a sandbox pod
	$(BIN)/python hack/chart-check.py --checkov $(CHECKOV_VENV)/bin/checkov

# The semantic memory embedder's tests run in their own venv, so .venv and `make test` stay lean.
EMBED_VENV := $(HOME)/.cache/corral/venv-memory-embeddings

$(EMBED_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(EMBED_VENV)
	$(EMBED_VENV)/bin/pip install -q --upgrade pip
	$(EMBED_VENV)/bin/pip install -q -e '.[sandbox,memory-embeddings]' pytest pytest-asyncio pytest-timeout
	@touch $@

test-embeddings: $(EMBED_VENV)/.installed ## The memory-embeddings extra's tests (tests_extra/embeddings), in its own venv under ~/.cache/corral
	$(EMBED_VENV)/bin/pytest -q -p no:cacheprovider tests_extra/embeddings

bench: $(STAMP) control-plane exec gateway ## Every benchmark, all figures in one run (pi beside Corral when installable); misses listed at the end
	@if peers=$$(bash hack/install-peers.sh 2>/dev/null); then export CORRAL_BENCH_PEERS="$$peers"; \
	else echo "(pi could not be installed: the per-step bench runs Corral alone)"; fi; \
	missed=""; \
	for b in bench/*_bench.py; do echo "== $$b"; $(BIN)/python $$b || missed="$$missed $$b"; done; \
	if [ -n "$$missed" ]; then echo "== targets missed (or bench failed):$$missed"; exit 1; fi

bench-peers: $(STAMP) exec ## Per-step overhead beside pi on the same tree and model (installs pi, pinned, into ~/.cache/corral/peers)
	@peers=$$(bash hack/install-peers.sh) && $(BIN)/python bench/steps_bench.py --peers "$$peers"

node: ## Build the real node (containerd, kubelet, kube-proxy, CoreDNS, kube-router) and Corral's images (root; cached in ~/.cache/corral)
	bash hack/node/install-packages.sh
	bash hack/node/build-node.sh >/dev/null
	bash hack/node/build-images.sh >/dev/null

demo: $(STAMP) ## Run the demo session on this machine: no cluster, no network, no key needed (SCENARIO=plan: a forced plan)
	CORRAL_BIN=$(BIN)/corral SCENARIO=$(SCENARIO) bash demo/run_demo.sh

dev-cluster: $(STAMP) control-plane exec ## Local cluster running Corral (control plane, node, operator, demo model, git server for the examples; NODE=real for real containers)
	$(BIN)/python -m corral_dev up

dev-cluster-down: $(STAMP) ## Stop everything dev-cluster started
	$(BIN)/python -m corral_dev down

e2e-kind: ## End-to-end on kind (needs Docker and kind; not in CI here)
	bash hack/e2e-kind.sh

clean: ## Remove the venv and local state (keeps the binary cache)
	rm -rf $(VENV) .corral

.PHONY: help venv node node-background exec exec-check gateway gateway-check control-plane crds crds-check docs docs-check chart-check lint test test-unit test-embeddings bench bench-peers demo dev-cluster dev-cluster-down e2e-kind clean
