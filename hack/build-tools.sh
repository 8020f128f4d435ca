#!/usr/bin/env bash
# Builds the chart tooling from the Go module proxy (nothing else is reachable): helm
# (helm.sh/helm/v3), kubeconform (github.com/yannh/kubeconform) and promtool (the alert
# rules' checker and unit-test runner, github.com/prometheus/prometheus) and toxiproxy (the TCP
# fault proxy of the Kafka network fault tests, github.com/Shopify/toxiproxy/v2), pinned below,
# and argocd-health (hack/argocd-health: argocd/health.lua run by Argo CD's own code, its module
# pinned in hack/argocd-health/go.mod), and argocd (hack/argocd: Argo CD's own application
# controller and repo server, the same Argo CD, run as processes by localenv/argocd.py); and for
# the node tier's cluster add-ons, CoreDNS (github.com/coredns/coredns) and local-path-provisioner
# (github.com/rancher/local-path-provisioner, the dynamic PV provisioner kind ships), and kube-network-policies (sigs.k8s.io/kube-network-policies,
# the NetworkPolicy agent kind's kindnetd embeds), each run there as a pod from a one-binary image;
# and spark-operator (github.com/kubeflow/spark-operator/v2, cmd/operator: the Kubeflow Spark
# Operator's controller and webhook, run on the node tier from its own Helm chart).
#
# Idempotent: each tool lands in $EOPIPE_CACHE/tools-<name>-<version>/bin/<name> (for
# argocd-health and argocd the version is a hash of hack/<name>/, so an edit there rebuilds it);
# when it is there already the script does nothing for it. A binary is linked under a
# temporary name and renamed into place, so an interrupted build never leaves something that
# counts as cached.
# One go build at a time per call (the machines are small; `make test` may run two calls at once). Prints the bin directories on stdout (one
# per line, in the order asked: helm, kubeconform, promtool, toxiproxy, argocd-health, argocd by
# default), progress on stderr.
#
# Usage: hack/build-tools.sh [helm|kubeconform|promtool|toxiproxy|argocd-health|argocd|coredns|local-path-provisioner|kube-network-policies|spark-operator ...]
#   (default: the first six; the node tier asks for the add-ons)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

HELM_VERSION="${HELM_VERSION:-v3.21.4}"
KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-v0.8.0}"
# Prometheus tags its Go module v0.3MM.P for release 3.MM.P (v0.316.0 is Prometheus 3.16.0):
# `go list -m -versions github.com/prometheus/prometheus` lists them.
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"
# The proxy lists v2.3.0 and v2.5.0 for the /v2 module (`go list -m -versions`); v2.5.0 is @latest.
TOXIPROXY_VERSION="${TOXIPROXY_VERSION:-v2.5.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}"
# The version kind v0.28.0 to v0.31.0 build into kindnetd (images/kindnetd/go.mod there). The proxy
# may refuse version lists: name an exact version.
KUBE_NETWORK_POLICIES_VERSION="${KUBE_NETWORK_POLICIES_VERSION:-v0.8.0}"
# The Kubeflow Spark Operator eopipe is tested against (docs/install.md). Exact version only: the
# proxy refuses this module's version list. Its chart and CRDs are read from the same module
# (localenv/node/sparkoperator.py), never copied into this repository.
SPARK_OPERATOR_VERSION="${SPARK_OPERATOR_VERSION:-v2.5.2}"
SPARK_OPERATOR_MODULE="github.com/kubeflow/spark-operator/v2"

tool_version() {
  case "$1" in
    helm) echo "$HELM_VERSION" ;;
    kubeconform) echo "$KUBECONFORM_VERSION" ;;
    promtool) echo "$PROMTOOL_VERSION" ;;
    toxiproxy) echo "$TOXIPROXY_VERSION" ;;
    argocd-health | argocd) echo "src-$(source_hash "$REPO_ROOT/hack/$1")" ;;
    coredns) echo "$COREDNS_VERSION" ;;
    local-path-provisioner) echo "$LOCAL_PATH_VERSION" ;;
    kube-network-policies) echo "$KUBE_NETWORK_POLICIES_VERSION" ;;
    spark-operator) echo "$SPARK_OPERATOR_VERSION" ;;
    *) echo "build-tools.sh: unknown tool $1 (helm, kubeconform, promtool, toxiproxy, argocd-health, argocd, coredns, local-path-provisioner, kube-network-policies, spark-operator)" >&2; exit 2 ;;
  esac
}

# source_hash DIR: a hash of the Go sources and module files under DIR (names and contents),
# the cache key of a tool built from this repository.
source_hash() {
  (cd "$1" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

tool_package() {
  case "$1" in
    helm) echo "helm.sh/helm/v3/cmd/helm" ;;
    kubeconform) echo "github.com/yannh/kubeconform/cmd/kubeconform" ;;
    promtool) echo "github.com/prometheus/prometheus/cmd/promtool" ;;
    # The server only (its HTTP API is driven by localenv/toxiproxy.py); the binary is named
    # after its package directory, so it is renamed to toxiproxy below.
    toxiproxy) echo "github.com/Shopify/toxiproxy/v2/cmd/server" ;;
    argocd-health) echo "./hack/argocd-health" ;;
    argocd) echo "./hack/argocd" ;;
    coredns) echo "github.com/coredns/coredns" ;;
    local-path-provisioner) echo "github.com/rancher/local-path-provisioner" ;;
    # The agent's main package is its cmd/ directory (upstream's Dockerfile: go build ./cmd),
    # so the binary is renamed below.
    kube-network-policies) echo "sigs.k8s.io/kube-network-policies/cmd" ;;
    # Upstream's image names the binary spark-operator (its Makefile: go build cmd/operator/main.go).
    spark-operator) echo "$SPARK_OPERATOR_MODULE/cmd/operator" ;;
  esac
}

tool_tags() {
  case "$1" in
    # Rules need no service discovery: remove_all_sd leaves out its ~25 SD plugins and their
    # cloud SDKs (`promtool check config` then knows only the static, file and HTTP ones).
    promtool) echo "netgo,remove_all_sd" ;;
    *) echo "" ;;
  esac
}

tool_ldflags() {
  case "$1" in
    helm)
      # As helm's own Makefile stamps it: the version (`helm version`), and the Kubernetes
      # version that `helm template` and `helm lint` assume (Capabilities.KubeVersion), taken
      # from the client-go that this helm release builds with (v0.X.Y -> 1.X); unstamped,
      # helm assumes Kubernetes 1.20.
      local gomod client_go k8s_minor
      gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*$/\1/p')"
      client_go="$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")"
      k8s_minor="$(echo "$client_go" | cut -d. -f2)"
      [[ -n "$k8s_minor" ]] || { echo "build-tools.sh: no k8s.io/client-go in $gomod" >&2; exit 1; }
      local x=""
      for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        x+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
      done
      echo "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean$x"
      ;;
    kubeconform) echo "-s -w -X main.version=$KUBECONFORM_VERSION" ;;
    toxiproxy) echo "-s -w -X github.com/Shopify/toxiproxy/v2.Version=$TOXIPROXY_VERSION" ;;
    argocd-health | argocd | coredns | local-path-provisioner | kube-network-policies) echo "-s -w" ;;
    # As upstream's Makefile stamps it (`spark-operator version`).
    spark-operator) echo "-s -w -X k8s.io/component-base/version.gitVersion=$SPARK_OPERATOR_VERSION -X k8s.io/component-base/version.gitTreeState=clean" ;;
    promtool)
      # `promtool --version` shows the release (v0.316.0 -> 3.16.0), as Prometheus's .promu.yml stamps it.
      local minor patch release
      minor="$(echo "$PROMTOOL_VERSION" | cut -d. -f2)"
      patch="$(echo "$PROMTOOL_VERSION" | cut -d. -f3)"
      release="$((10#$minor / 100)).$((10#$minor % 100)).$patch"
      echo "-s -w -X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Branch=HEAD"
      ;;
  esac
}

build_tool() {
  local name="$1" version pkg dir bin tmp t
  version="$(tool_version "$name")"
  pkg="$(tool_package "$name")"
  dir="$EOPIPE_CACHE/tools-$name-$version"
  bin="$dir/bin"
  if [[ -x "$bin/$name" ]]; then
    note "$name $version: cached in $bin"
    echo "$bin"
    return 0
  fi
  command -v go >/dev/null || { echo "build-tools.sh: the go toolchain is required" >&2; exit 1; }
  step "building $name $version from the Go module proxy (first run only)"
  mkdir -p "$bin"
  tmp="$(mktemp -d "$dir/.build.XXXXXX")"
  t=$SECONDS
  local ldflags
  ldflags="$(tool_ldflags "$name")"
  if [[ "$pkg" == ./* ]]; then
    # A module of this repository: built from its own go.mod/go.sum, which must be complete
    # (-mod=readonly: a go.mod that needs `go mod tidy` fails here, not silently changes).
    (cd "$REPO_ROOT/$pkg" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" \
      go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" .)
  elif [[ "$name" == spark-operator ]]; then
    # Its go.mod pins k8s.io/* with replace directives, which `go install pkg@version` refuses:
    # build inside the downloaded module (read-only in the module cache; -o writes elsewhere),
    # from its own go.mod/go.sum.
    local moddir
    moddir="$(go mod download -json "$SPARK_OPERATOR_MODULE@$version" | sed -n 's/.*"Dir": "\(.*\)",*$/\1/p')"
    [[ -d "$moddir" ]] || { echo "build-tools.sh: go mod download gave no Dir for $SPARK_OPERATOR_MODULE@$version" >&2; rm -rf "$tmp"; exit 1; }
    (cd "$moddir" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" \
      go build -trimpath -ldflags "$ldflags" -o "$tmp/$(basename "$pkg")" ./cmd/operator)
  else
    # `go install pkg@version` builds in module mode from the module's own go.mod/go.sum
    # (checked against the checksum database), independent of this repository.
    GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS="-buildvcs=false" \
      go install -trimpath -tags "$(tool_tags "$name")" -ldflags "$ldflags" "$pkg@$version"
  fi
  local built="$tmp/$(basename "$pkg")"
  [[ -x "$built" ]] || { echo "build-tools.sh: go install produced no $name" >&2; rm -rf "$tmp"; exit 1; }
  [[ "$built" == "$tmp/$name" ]] || mv -f "$built" "$tmp/$name"
  mv -f "$tmp/$name" "$bin/$name"
  rm -rf "$tmp"
  printf 'built %s %s on %s in %ss (go %s)\n' "$name" "$version" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((SECONDS - t))" "$(go env GOVERSION)" >>"$dir/build-times.log"
  note "$name $version -> $bin/$name ($(du -h "$bin/$name" | cut -f1)) in $((SECONDS - t))s"
  echo "$bin"
}

tools=("$@")
((${#tools[@]})) || tools=(helm kubeconform promtool toxiproxy argocd-health argocd)
for t in "${tools[@]}"; do build_tool "$t"; done
