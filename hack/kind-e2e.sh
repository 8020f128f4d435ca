#!/usr/bin/env bash
# `make kind-e2e`: the end-to-end run on a kind cluster, for machines with Docker.
# NOT run in our CI (no Docker engine there); the same flow runs there on the local control
# plane (tests/test_operator.py, make demo). Needs: docker, kind, kubectl, helm on PATH.
#
#   1. a kind cluster `eopipe-e2e`; the operator image built from this repo and loaded into it
#   2. a single-node Kafka in namespace eopipe-e2e (hack/kind/kafka.yaml)
#   3. the Helm chart, watching eopipe-e2e; examples/minimal.yaml applied and awaited Ready
#   4. `eopipe load` with duplicates while a dedup pod is deleted, then `eopipe verify`
#      (both run in a pod next to Kafka); exit status is verify's
source "$(dirname "$0")/lib.sh"
NS=eopipe-e2e
CLUSTER="${KIND_CLUSTER:-eopipe-e2e}"
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-e2e needs $tool on PATH" >&2; exit 2; }
done

step "kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
step "operator image"
docker build --target operator -t eopipe:e2e "$REPO_ROOT"
kind load docker-image eopipe:e2e --name "$CLUSTER"

step "Kafka"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f "$REPO_ROOT/hack/kind/kafka.yaml"
kubectl -n "$NS" rollout status statefulset/kafka --timeout=300s
BOOTSTRAP=kafka.$NS.svc:9092

step "operator (Helm)"
helm upgrade --install eopipe "$REPO_ROOT/charts/eopipe" -n eopipe-system --create-namespace \
  --set image.repository=eopipe --set image.tag=e2e --set image.pullPolicy=Never \
  --set "watchNamespaces={$NS}" --wait --timeout 300s

step "pipeline"
sed "s/bootstrapServers: .*/bootstrapServers: $BOOTSTRAP/" "$REPO_ROOT/examples/minimal.yaml" \
  | kubectl -n "$NS" apply -f -
kubectl -n "$NS" wait eop/minimal --for=condition=Ready --timeout=300s
kubectl -n "$NS" get eop

step "load with duplicates, a dedup pod deleted mid-run, then verify"
run() { kubectl -n "$NS" run "$1" --rm -i --restart=Never --image=eopipe:e2e --image-pull-policy=Never -- "${@:2}"; }
run e2e-load load --bootstrap "$BOOTSTRAP" --topic events --count 50000 --rate 2000 --poison 10 &
load=$!
sleep 10
kubectl -n "$NS" delete pod minimal-dedup-0 --wait=false
wait "$load"
run e2e-verify verify --bootstrap "$BOOTSTRAP" --source events --output events.deduped --dlq events.dlq
