# eopipe developer entry points. Heavy downloads/builds are cached in $(EOPIPE_CACHE), keyed by version.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export EOPIPE_CACHE ?= $(HOME)/.cache/eopipe
comma := ,

.PHONY: help deps venv kafka k8s tools spark-jars node-prep test test-unit test-integration test-e2e test-bench test-fast test-node cluster cluster-down soak demo bench bench-peers kind-e2e clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Two stamps: the unit tier needs only the package and pytest; the rest adds Spark and plots.
# Each is one `pip install -e`, which builds the compiled module (about 20 s): the full one
# stamps both, so `make test` on a fresh clone builds it once.
define pip_install
	@echo "==> Python virtualenv $(VENV) (pip's cache makes later runs quick)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -qq -e '.[$(1)]'
endef

$(VENV)/.installed-unit: pyproject.toml operator/eopipe/core/native.pyx operator/eopipe/core/native.pxd operator/eopipe/dedup/direct.pyx
	$(call pip_install,test)
	@touch $@

$(VENV)/.installed: pyproject.toml operator/eopipe/core/native.pyx operator/eopipe/core/native.pxd operator/eopipe/dedup/direct.pyx
	$(call pip_install,test$(comma)spark$(comma)bench)
	@touch $@ $(VENV)/.installed-unit

venv: $(VENV)/.installed ## the project virtualenv

kafka: ## Kafka broker jars (Maven, cached)
	@bash hack/fetch-kafka.sh >/dev/null

k8s: ## Kubernetes control-plane binaries and etcd (built from Go modules, cached)
	@bash hack/build-k8s.sh >/dev/null

tools: ## helm, kubeconform, promtool (chart and alert tests), toxiproxy (network faults), argocd-health (Argo CD's health runtime), argocd (its controller and repo server); Go module proxy, cached
	@bash hack/build-tools.sh >/dev/null

spark-jars: venv ## Spark's Kafka connector jars (Maven, cached)
	@bash hack/fetch-spark-jars.sh >/dev/null

deps: venv kafka k8s tools spark-jars ## everything the tests and the demo need

node-prep: venv kafka k8s spark-jars ## the node tier's packages, kubelet, images and seed, built or cached; starts nothing (root)
	$(PY) -m localenv.node prep

# On a new machine, `make test` spends its first half hour compiling Go and building images: two
# at a time, so the images' disk and network work overlaps the tools' compiles (node-prep only as
# root, like the node tier's tests).
# The soak and the benchmarks' own runs are left out of `make test` (CI's time): `make soak`, `make test-bench`.
# Short tracebacks: a failure's own lines come first in a CI log that is read in excerpts.
# Two phases (tests/conftest.py, in_phase): the unit tier and the node tier's tests in one
# process, then the rest in two pytest-xdist workers, a test file each at a time; both phases
# run, and the target fails if either did.
PYTEST_RUN = $(PY) -m pytest -m "not bench" --ignore=tests/soak --tb=short
test: ## the whole test suite: unit, integration (real Kafka, control plane, Spark), e2e, node tier and fault tests
	@$(MAKE) --no-print-directory -j2 deps $(if $(filter 0,$(shell id -u)),node-prep)
	@EOPIPE_NODE_TESTS=1 $(PYTEST_RUN) --phase node; node=$$?; \
	$(PYTEST_RUN) --phase local -n 2 --dist loadfile; local=$$?; \
	echo "make test: node phase exit $$node, local phase exit $$local"; [ $$node = 0 ] && [ $$local = 0 ]

test-unit: $(VENV)/.installed-unit ## the unit tier alone: no services, no Kafka, Java or Go (about two minutes)
	$(PY) -m pytest tests/unit

test-integration: deps ## the integration tier: real Kafka, control plane, Spark and chart tools, no node tier
	$(PY) -m pytest tests/integration

test-e2e: deps ## end to end on the process tier (control plane, workers, operator); the node tier's tests excluded
	$(PY) -m pytest tests/e2e -m "not node"

test-bench: deps ## the benchmarks run at a small size, each output verified (not in make test)
	$(PY) -m pytest tests/integration/test_bench.py

test-fast: deps ## everything but the long fault tests
	$(PY) -m pytest -m "not slow"

DURATION ?= 10m
SEED ?=
soak: deps ## randomized faults on three brokers under duplicated load, then verify (DURATION=10m SEED=n); report in .work/
	@mkdir -p .work
	EOPIPE_SOAK_DURATION=$(DURATION) EOPIPE_SOAK_SEED=$(SEED) EOPIPE_SOAK_REPORT=$(CURDIR)/.work/soak-report.json \
		$(PY) -m pytest tests/soak -s -p no:cacheprovider

demo: deps ## the main job: a pipeline end to end on the node tier (root) with duplicates and faults, then verify (DEMO_ARGS=--quick|--process-node|--on-cluster|--break-dedup)
	$(PY) hack/demo.py $(DEMO_ARGS)

bench: deps ## benchmarks side by side, one table
	$(PY) -m bench

bench-peers: deps ## the throughput table alone: eopipe vs Kafka Streams, Java copiers, Spark dedup
	$(PY) -m bench --peers

cluster: $(VENV)/.installed ## node tier: kubelet + containerd, CoreDNS, a provisioner, Kafka, Spark on pods, in network namespaces; the project's images (root; NODES=3 for three nodes)
	$(PY) -m localenv.node up $(if $(NODES),--nodes $(NODES))

cluster-down: ## stop the node tier and remove everything it made
	$(PY) -m localenv.node down

test-node: $(VENV)/.installed ## the node tier's tests alone (also in `make test`; root)
	EOPIPE_NODE_TESTS=1 $(PY) -m pytest tests/e2e/test_node_loss.py tests/e2e/test_node_tier.py -m node

kind-e2e: ## end to end on a kind cluster (needs Docker, kind, helm; not run in CI: see hack/kind-e2e.sh)
	bash hack/kind-e2e.sh

clean: ## remove the virtualenv and test leftovers (the download cache stays)
	rm -rf $(VENV) .pytest_cache .work
