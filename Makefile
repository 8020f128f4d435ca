# eopipe developer entry points. Heavy downloads/builds are cached in $(EOPIPE_CACHE), keyed by version.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export EOPIPE_CACHE ?= $(HOME)/.cache/eopipe

.PHONY: help deps venv kafka k8s tools spark-jars test test-fast demo bench kind-e2e clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@echo "==> Python virtualenv $(VENV) (pip's cache makes later runs quick)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -qq -e '.[test,spark,bench]'
	@touch $@

venv: $(VENV)/.installed ## the project virtualenv

kafka: ## Kafka broker jars (Maven, cached)
	@bash hack/fetch-kafka.sh >/dev/null

k8s: ## Kubernetes control-plane binaries and etcd (built from Go modules, cached)
	@bash hack/build-k8s.sh >/dev/null

tools: ## helm and kubeconform for the chart tests (Go module proxy, cached)
	@bash hack/build-tools.sh >/dev/null

spark-jars: venv ## Spark's Kafka connector jars (Maven, cached)
	@bash hack/fetch-spark-jars.sh >/dev/null

deps: venv kafka k8s tools spark-jars ## everything the tests and the demo need

test: deps ## the whole test suite: unit, real Kafka, real control plane, fault tests
	$(PY) -m pytest

test-fast: deps ## everything but the long fault tests
	$(PY) -m pytest -m "not slow"

demo: deps ## the main job: a pipeline end to end with duplicates and faults, then verify (DEMO_ARGS=--quick|--break-dedup)
	$(PY) hack/demo.py $(DEMO_ARGS)

bench: deps ## benchmarks side by side, one table
	$(PY) -m bench

kind-e2e: ## end to end on a kind cluster (needs Docker, kind, helm; not run in CI: see hack/kind-e2e.sh)
	bash hack/kind-e2e.sh

clean: ## remove the virtualenv and test leftovers (the download cache stays)
	rm -rf $(VENV) .pytest_cache .work
