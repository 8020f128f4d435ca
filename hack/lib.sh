# Shared by the hack/ scripts: where heavy downloads and builds are cached, and progress output.
# Everything lands under $EOPIPE_CACHE (default ~/.cache/eopipe), keyed by version, never in the repo.
set -euo pipefail
EOPIPE_CACHE="${EOPIPE_CACHE:-$HOME/.cache/eopipe}"
export EOPIPE_CACHE
# Go's compiler spends a fifth to a quarter of a build from an empty cache collecting garbage
# (helm, 2026-12-05: 192 s by default, 158 s at GOGC=400, 142 s with it off). Off, with a soft
# limit per process: the collector runs only near it, so two compiles stay within a few GiB.
export GOGC="${GOGC:-off}" GOMEMLIMIT="${GOMEMLIMIT:-3GiB}"
mkdir -p "$EOPIPE_CACHE"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

step() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
note() { printf '    %s\n' "$*" >&2; }

# The Maven-resolved caches (fetch-kafka.sh, fetch-spark-jars.sh): a version read from a pom,
# a folder marked .complete once filled, filled through "$dest.tmp" so an interrupted run
# never leaves something that counts as cached.
pom_property() { sed -n "s:.*<$2>\(.*\)</$2>.*:\1:p" "$1"; }
# exit_if_cached DEST LABEL SUBDIR: prints DEST/SUBDIR and exits when DEST is complete.
exit_if_cached() {
  if [[ -f "$1/.complete" ]]; then note "$2: cached in $1"; echo "$1/$3"; exit 0; fi
  rm -rf "$1.tmp" && mkdir -p "$1.tmp"
}
# maven_runtime_deps POM OUTDIR [-Dprop=value...]: the POM's runtime dependencies copied into OUTDIR.
maven_runtime_deps() {
  local pom="$1" out="$2"; shift 2
  mvn -B -q -f "$pom" "$@" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$out" >&2
}
# drop_shipped DIR PYSPARK_JARS: removes from DIR the jars whose artifact pyspark already ships
# (any version), so Spark never sees two versions of one library.
drop_shipped() {
  local jar artifact shipped
  for jar in "$1"/*.jar; do
    [[ -e "$jar" ]] || continue
    artifact="$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$//')"
    shipped=("$2/$artifact"-[0-9]*.jar)
    [[ -e "${shipped[0]:-}" ]] && rm "$jar"
  done
  return 0
}
mark_complete() { rm -rf "$1" && mv "$1.tmp" "$1" && touch "$1/.complete"; }
