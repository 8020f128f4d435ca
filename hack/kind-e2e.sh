#!/usr/bin/env bash
# `make kind-e2e`: the end-to-end run on a kind cluster, for machines with Docker.
# NOT run in our CI (no Docker engine there); the same flow runs there on the node tier (a
# kubelet, containerd, the chart, examples as written: tests/e2e/test_node_tier.py, make demo).
# Needs: docker, kind, kubectl, helm on PATH.
#
#   1. a kind cluster `eopipe-e2e`; the operator image built from this repo and loaded into it
#   2. a single-node Kafka in namespace kafka (hack/kind/kafka.yaml): kafka.kafka.svc:9092, the
#      address examples/*.yaml name, so the example is applied as it is
#   3. the Helm chart, watching eopipe-e2e; examples/minimal.yaml applied and awaited Ready
#   4. `eopipe load` with duplicates while, as in `make demo`, a dedup pod is deleted, the
#      Kafka pod is deleted (broker restart), the dedup pods are scaled 1 -> 3 and source
#      partitions go 4 -> 8; then `eopipe verify` (load and verify run in pods next to Kafka);
#      exit status is verify's.
# The Spark stage needs the Kubeflow Spark Operator in the cluster; `make demo` covers it on the
# node tier (driver SIGKILL included), this script leaves it out.
#
# NetworkPolicy is enforced, by the same agent as on the node tier (localenv/node/addons.py):
# since kind v0.24.0 its default CNI, kindnetd, embeds sigs.k8s.io/kube-network-policies
# (v0.8.0 in kind v0.28.0 to v0.31.0; kind's images/kindnetd/go.mod), so no flag is needed; a
# cluster made with `networking.disableDefaultCNI: true` has no kindnetd and enforces nothing
# unless its own CNI does. The script checks both. The operator's policy for the pipeline's dedup
# pods is then in force throughout: the operator still has to reach their /status through it.
source "$(dirname "$0")/lib.sh"
NS=eopipe-e2e
CLUSTER="${KIND_CLUSTER:-eopipe-e2e}"
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-e2e needs $tool on PATH" >&2; exit 2; }
done

KIND_MIN=v0.24.0  # the first kind whose kindnetd enforces NetworkPolicy
kind_version="$(kind version | awk '{print $2}')"
if [[ "$(printf '%s\n' "$KIND_MIN" "$kind_version" | sort -V | head -1)" != "$KIND_MIN" ]]; then
  echo "kind-e2e needs kind $KIND_MIN or later (NetworkPolicy enforced by kindnetd); this is $kind_version" >&2
  exit 2
fi

step "kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kubectl -n kube-system get daemonset kindnet >/dev/null 2>&1 || {
  echo "kind-e2e: cluster $CLUSTER has no kindnet DaemonSet (disableDefaultCNI?): NetworkPolicy may not be enforced" >&2
  exit 2
}
step "operator image"
docker build --target operator -t eopipe:e2e "$REPO_ROOT"
kind load docker-image eopipe:e2e --name "$CLUSTER"

step "Kafka"
for ns in "$NS" kafka; do kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -; done
kubectl apply -f "$REPO_ROOT/hack/kind/kafka.yaml"
kubectl -n kafka rollout status statefulset/kafka --timeout=300s
BOOTSTRAP=kafka.kafka.svc:9092

step "operator (Helm)"
helm upgrade --install eopipe "$REPO_ROOT/charts/eopipe" -n eopipe-system --create-namespace \
  --set image.repository=eopipe --set image.tag=e2e --set image.pullPolicy=Never \
  --set "watchNamespaces={$NS}" --wait --timeout 300s

step "pipeline"
kubectl -n "$NS" apply -f "$REPO_ROOT/examples/minimal.yaml"
kubectl -n "$NS" wait eop/minimal --for=condition=Ready --timeout=300s
kubectl -n "$NS" get eop

step "load with duplicates, a dedup pod deleted mid-run, then verify"
run() { kubectl -n "$NS" run "$1" --rm -i --restart=Never --image=eopipe:e2e --image-pull-policy=Never -- "${@:2}"; }
settled() {  # Ready at the current generation with no rebalance under way
  kubectl -n "$NS" wait eop/minimal --for=condition=Ready --timeout=600s
  until [ "$(kubectl -n "$NS" get eop minimal -o jsonpath='{.status.rebalance.phase}')" = "" ]; do sleep 2; done
}
run e2e-load load --bootstrap "$BOOTSTRAP" --topic events --count 100000 --rate 1000 --poison 10 &
load=$!
sleep 10
step "fault: delete pod minimal-dedup-0"
kubectl -n "$NS" delete pod minimal-dedup-0 --wait=false
sleep 10
step "fault: delete the Kafka pod (broker restart)"
kubectl -n kafka delete pod kafka-0
kubectl -n kafka rollout status statefulset/kafka --timeout=300s
step "rebalance: dedup replicas 1 -> 3"
kubectl -n "$NS" patch eop minimal --type=merge -p '{"spec":{"dedup":{"replicas":3}}}'
settled
step "rebalance: source partitions 4 -> 8"
kubectl -n "$NS" patch eop minimal --type=merge -p '{"spec":{"source":{"partitions":8}}}'
settled
kubectl -n "$NS" get eop minimal -o jsonpath='{.status.lastRebalance}'; echo
wait "$load"
# The topics the pipeline writes carry its namespace and name (status.topics).
run e2e-verify verify --bootstrap "$BOOTSTRAP" --source events --output "$NS.minimal.deduped" --dlq "$NS.minimal.dlq"
