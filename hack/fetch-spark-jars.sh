#!/usr/bin/env bash
# Resolves spark-sql-kafka-0-10 and its runtime dependencies with Maven into
# $EOPIPE_CACHE/spark-kafka-<version>/jars, leaving out jars that pyspark already ships
# (same artifact in its jars/ folder), so Spark never sees two versions of one library.
# Usage: fetch-spark-jars.sh [PYSPARK_JARS_DIR]. Idempotent; prints the jars folder.
source "$(dirname "$0")/lib.sh"
SPARK_VERSION="$(pom_property "$REPO_ROOT/hack/spark/pom.xml" spark.version)"
dest="$EOPIPE_CACHE/spark-kafka-$SPARK_VERSION"
exit_if_cached "$dest" "spark-sql-kafka $SPARK_VERSION" jars
pyspark_jars="${1:-$("$REPO_ROOT/.venv/bin/python" -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')}"
step "Resolving spark-sql-kafka-0-10_2.13 $SPARK_VERSION with Maven (first run only)"
maven_runtime_deps "$REPO_ROOT/hack/spark/pom.xml" "$dest.tmp/jars"
shopt -s nullglob
for jar in "$dest.tmp/jars"/*.jar; do
  artifact="$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$//')"
  shipped=("$pyspark_jars/$artifact"-[0-9]*.jar)
  if (( ${#shipped[@]} )); then rm "$jar"; fi
done
mark_complete "$dest"
note "spark-sql-kafka $SPARK_VERSION: $(ls "$dest/jars" | tr '\n' ' ')"
echo "$dest/jars"
