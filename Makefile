# mcad developer entry points. Quick start on a fresh machine: `make demo`, then `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

# prereqs-TARGET: what TARGET needs is on this machine, else one line saying what to install (hack/prereqs.sh). Listed
# first among a target's prerequisites, so it runs before anything is built or started.
.PHONY: prereqs-%
prereqs-%:
	@PYTHON=$(PYTHON) hack/prereqs.sh $*

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint,docs]'
	touch $@

.PHONY: install
install: prereqs-install $(BIN)/.installed ## create .venv and install mcad (editable) with test, lint and docs extras

.PHONY: tools
tools: prereqs-tools ## build the pinned Kubernetes binaries into ~/.cache/mcad-dev (once; minutes when cold)
	hack/build-tools.sh >/dev/null

.PHONY: unit
# Every test that needs no cluster: test/conftest.py refuses a test under these two directories that asks for a
# cluster fixture, and -m "not cluster" keeps any such test from bringing the local control plane up regardless.
unit: prereqs-unit install ## fast tests: unit and component, no cluster, no network
	$(BIN)/pytest test/unit test/component -m "not cluster" $(PYTEST_ARGS)

.PHONY: test
test: prereqs-test install tools ## unit tests + everything that needs a cluster (brings the local one up and down if needed)
	$(BIN)/pytest test $(PYTEST_ARGS)

.PHONY: screenshots
screenshots: prereqs-screenshots install tools ## the README's dashboard pictures (docs/images/dashboard-*.png), taken by its browser tests
	MCAD_SCREENSHOTS=docs/images $(BIN)/pytest test/e2e/test_dashboard.py $(PYTEST_ARGS)

.PHONY: cluster
cluster: prereqs-cluster ## start the local control plane (NODES, NODE_CPU, NODE_MEMORY, NODE_GPU) and write .dev/kubeconfig
	hack/local-cluster.sh up

.PHONY: cluster-down
cluster-down: ## stop the local control plane and delete its state
	hack/local-cluster.sh down

.PHONY: demo
demo: prereqs-demo install tools ## the seed tutorial on a local 8-cpu cluster: queueing, then dispatch when capacity frees
	hack/demo.sh

.PHONY: demo-down
demo-down: ## stop the demo's controller and the local cluster
	-@[ -f .dev/demo-controller.pid ] && kill $$(cat .dev/demo-controller.pid) 2>/dev/null; rm -f .dev/demo-controller.pid .dev/demo-controller.kubeconfig
	hack/local-cluster.sh down

.PHONY: demo-hub
demo-hub: prereqs-demo-hub install tools ## multi-cluster: a hub and two worker clusters (3 local control planes), mcad in hub mode
	hack/demo-hub.sh

.PHONY: demo-hub-down
demo-hub-down: ## stop the hub demo's controller and its three clusters
	-@[ -f .dev/demo-hub-controller.pid ] && kill $$(cat .dev/demo-hub-controller.pid) 2>/dev/null; rm -f .dev/demo-hub-controller.pid
	for name in demo-hub demo-east demo-west; do $(BIN)/python hack/localcluster.py --name $$name down; done

.PHONY: api-reference
api-reference: install ## regenerate docs/reference/appwrapper.md from the CRD and hack/api-reference.yaml
	$(BIN)/python hack/gen-api-reference.py

.PHONY: lint
lint: install ## ruff and mypy
	$(BIN)/ruff check mcad test hack
	$(BIN)/mypy

.PHONY: bench
bench: prereqs-bench install tools ## benchmarks on throwaway local clusters -> bench-results.json (BENCH_ARGS="--scale 0.1 --scenarios churn")
	$(BIN)/python -m test.perf.bench $(BENCH_ARGS)

.PHONY: bench-kueue
bench-kueue: prereqs-bench install tools ## Kueue's own scheduler test (built from its Go module) next to churn (KUEUE_ARGS="--fraction 0.02 --with-churn")
	$(BIN)/python -m test.perf.kueue $(KUEUE_ARGS)

.PHONY: bench-admission
bench-admission: prereqs-bench install tools ## API server CPU per create / status write with the chart's creator policy, validating webhook call, status rule (ADMISSION_ARGS="--rounds 4")
	$(BIN)/python -m test.perf.admission_cost $(ADMISSION_ARGS)

.PHONY: bench-installed
bench-installed: prereqs-bench install tools ## with make e2e-up's cluster up: its controller pods' start and admission latency through the Service, next to a local process (INSTALLED_ARGS="--seconds 60")
	$(BIN)/python -m test.perf.installed $(INSTALLED_ARGS)

.PHONY: image
image: prereqs-image ## the controller image from the Dockerfile, checked (BASE_IMAGE=python:3.11-slim; local: made from Debian packages)
	hack/image.sh >/dev/null

.PHONY: e2e-up
e2e-up: prereqs-e2e image ## as root: a local cluster with one real kubelet node, the chart installed from the image (.dev/kubeconfig-e2e)
	$(PYTHON) hack/e2ecluster.py up

.PHONY: e2e-down
e2e-down: ## stop the e2e cluster and its node, and put this machine back as it was
	$(PYTHON) hack/e2ecluster.py down

.PHONY: e2e
e2e: prereqs-e2e install tools image ## as root: what only an installation shows, against the chart's Deployment in a real kubelet (E2E_ARGS="-k failover")
	$(BIN)/pytest test/installed --installed $(E2E_ARGS)

.PHONY: e2e-kind
e2e-kind: install tools ## test/installed and test/e2e on a throwaway KinD cluster, for machines that reach Docker Hub (KEEP_CLUSTER=1)
	E2E_ARGS="$(E2E_ARGS)" hack/e2e-kind.sh

.PHONY: docs
docs: install ## the documentation site from docs/ (mkdocs build --strict: a broken link or anchor fails) -> site/
	$(BIN)/mkdocs build --strict --site-dir site

.PHONY: docs-serve
docs-serve: install ## serve the documentation site on http://127.0.0.1:8000, rebuilt on every change (DOCS_ADDR=host:port)
	$(BIN)/mkdocs serve --dev-addr $(or $(DOCS_ADDR),127.0.0.1:8000)

.PHONY: clean
clean: ## remove the venv and local state (not the binary cache)
	-hack/local-cluster.sh down
	rm -rf $(VENV) .dev .pytest_cache .mypy_cache .ruff_cache *.egg-info site
