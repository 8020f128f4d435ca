# Shared by the hack/ scripts: where heavy downloads and builds are cached, and progress output.
# Everything lands under $EOPIPE_CACHE (default ~/.cache/eopipe), keyed by version, never in the repo.
set -euo pipefail
EOPIPE_CACHE="${EOPIPE_CACHE:-$HOME/.cache/eopipe}"
export EOPIPE_CACHE
mkdir -p "$EOPIPE_CACHE"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

step() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
note() { printf '    %s\n' "$*" >&2; }
