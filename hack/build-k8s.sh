#!/usr/bin/env bash
# Builds the local Kubernetes control plane used by the tests and the demo (docs/design.md#the-local-environment):
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from the k8s.io/kubernetes
# Go module (wrapper module hack/k8s), and etcd from go.etcd.io/etcd/server/v3 (hack/etcd).
# With --node it also builds kubelet and kube-proxy (same module and version) for the node tier
# (localenv/node/); without it they are neither built nor required.
#
# Idempotent: binaries land in $EOPIPE_CACHE/k8s-<version>/bin and $EOPIPE_CACHE/etcd-<version>/bin;
# when they all exist the script prints "cached" and does nothing. Each binary is linked under a
# temporary name and renamed into place, so an interrupted build never leaves a binary that
# counts as cached. Prints the two bin directories on stdout (one per line), progress on stderr.
#
# Versions: keep these in step with hack/k8s/go.mod and hack/etcd/go.mod (checked below).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"

K8S_DIR="$EOPIPE_CACHE/k8s-$K8S_VERSION"
ETCD_DIR="$EOPIPE_CACHE/etcd-$ETCD_VERSION"
K8S_BIN="$K8S_DIR/bin"
ETCD_BIN="$ETCD_DIR/bin"
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
[[ "${1:-}" == "--node" ]] && K8S_CMDS+=(kubelet kube-proxy)

all_present() {
  local c
  for c in "${K8S_CMDS[@]}"; do [[ -x "$K8S_BIN/$c" ]] || return 1; done
  [[ -x "$ETCD_BIN/etcd" ]]
}

if all_present; then
  echo "cached: kubernetes $K8S_VERSION ($K8S_BIN), etcd $ETCD_VERSION ($ETCD_BIN)" >&2
  printf '%s\n%s\n' "$K8S_BIN" "$ETCD_BIN"
  exit 0
fi

command -v go >/dev/null || { echo "build-k8s.sh: the go toolchain is required (go >= 1.25)" >&2; exit 1; }

# The wrapper modules must pin what this script claims to build.
grep -Eq "^(require )?\s*k8s\.io/kubernetes $K8S_VERSION( |\$)" "$REPO_ROOT/hack/k8s/go.mod" \
  || { echo "build-k8s.sh: hack/k8s/go.mod does not require k8s.io/kubernetes $K8S_VERSION" >&2; exit 1; }
staging_version="v0.${K8S_VERSION#v1.}"
if grep -E '^\s+k8s\.io/[a-z-]+ => ' "$REPO_ROOT/hack/k8s/go.mod" | grep -vq " $staging_version\$"; then
  echo "build-k8s.sh: a k8s.io staging module in hack/k8s/go.mod is not pinned to $staging_version" >&2
  exit 1
fi
grep -Eq "^(require )?\s*go\.etcd\.io/etcd/server/v3 $ETCD_VERSION( |\$)" "$REPO_ROOT/hack/etcd/go.mod" \
  || { echo "build-k8s.sh: hack/etcd/go.mod does not require go.etcd.io/etcd/server/v3 $ETCD_VERSION" >&2; exit 1; }

# Sane, explicit Go settings: static binaries, no VCS stamping of this repo, go.mod/go.sum
# are never rewritten by a build.
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"

# Version stamping, as the upstream build does it (hack/lib/version.sh there): both the
# component-base and the client-go copies, so the apiserver's /version and `kubectl version`
# report the real release instead of v0.0.0-master.
major="${K8S_VERSION#v}"; major="${major%%.*}"
minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done

t0=$SECONDS
mkdir -p "$K8S_BIN" "$ETCD_BIN"

# Build into a scratch directory next to bin/ (same file system, so mv is an atomic rename).
tmp="$(mktemp -d "$K8S_DIR/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

built=()
missing=()
for c in "${K8S_CMDS[@]}"; do [[ -x "$K8S_BIN/$c" ]] || missing+=("$c"); done
if ((${#missing[@]})); then
  step "building kubernetes $K8S_VERSION: ${missing[*]} (one go build; the first time takes many minutes)"
  pkgs=()
  for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  t=$SECONDS
  (cd "$REPO_ROOT/hack/k8s" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
  for c in "${missing[@]}"; do
    [[ -x "$tmp/$c" ]] || { echo "build-k8s.sh: go build produced no $c" >&2; exit 1; }
    mv -f "$tmp/$c" "$K8S_BIN/$c"
    note "$c $K8S_VERSION -> $K8S_BIN/$c ($(du -h "$K8S_BIN/$c" | cut -f1))"
  done
  built+=("${missing[@]}")
  note "kubernetes binaries built in $((SECONDS - t))s"
fi

if [[ ! -x "$ETCD_BIN/etcd" ]]; then
  step "building etcd $ETCD_VERSION"
  t=$SECONDS
  (cd "$REPO_ROOT/hack/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" .)
  mv -f "$tmp/etcd" "$ETCD_BIN/etcd"
  built+=(etcd)
  note "etcd $ETCD_VERSION -> $ETCD_BIN/etcd ($(du -h "$ETCD_BIN/etcd" | cut -f1)) in $((SECONDS - t))s"
fi

elapsed=$((SECONDS - t0))
printf 'built %s on %s in %ss (go %s, %s cores)\n' \
  "${built[*]}" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$elapsed" "$(go env GOVERSION)" "$(nproc)" \
  >>"$K8S_DIR/build-times.log"
step "control-plane binaries ready in ${elapsed}s (first build; later runs print \"cached\")"
printf '%s\n%s\n' "$K8S_BIN" "$ETCD_BIN"
