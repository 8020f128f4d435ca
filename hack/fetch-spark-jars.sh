#!/usr/bin/env bash
# Resolves spark-sql-kafka-0-10 and its runtime dependencies with Maven into
# $EOPIPE_CACHE/spark-kafka-<version>/jars, leaving out jars that pyspark already ships
# (same artifact in its jars/ folder), so Spark never sees two versions of one library.
# The Spark release is the pyspark pin of pyproject.toml (hack/spark-version.sh).
# Usage: fetch-spark-jars.sh [PYSPARK_JARS_DIR]. Idempotent; prints the jars folder.
source "$(dirname "$0")/lib.sh"
SPARK_VERSION="$(sh "$REPO_ROOT/hack/spark-version.sh" "$REPO_ROOT/pyproject.toml")"
POM="$REPO_ROOT/hack/spark/pom.xml"
dest="$EOPIPE_CACHE/spark-kafka-$SPARK_VERSION"
exit_if_cached "$dest" "spark-sql-kafka $SPARK_VERSION" jars
pyspark_jars="${1:-$("$REPO_ROOT/.venv/bin/python" -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')}"
step "Resolving spark-sql-kafka-0-10_2.13 $SPARK_VERSION with Maven (first run only)"
maven_runtime_deps "$POM" "$dest.tmp/jars" -Dspark.version="$SPARK_VERSION"
# The pom lists the connector's dependencies without transitives (see its comment), so their
# versions are written there: check them against what this release's own POM names.
mvn -B -q dependency:copy -Dartifact="org.apache.spark:spark-sql-kafka-0-10_2.13:$SPARK_VERSION:pom" \
  -DoutputDirectory="$dest.tmp/pom" >&2
# dep_version POM ARTIFACT: the <version> that follows <artifactId>ARTIFACT</artifactId>.
dep_version() { awk -v a="<artifactId>$2</artifactId>" 'index($0, a) {f=1} f && /<version>/ {
  sub(/.*<version>/, ""); sub(/<\/version>.*/, ""); print; exit}' "$1"; }
for artifact in kafka-clients commons-pool2 scala-parallel-collections_2.13; do
  want="$(dep_version "$dest.tmp/pom/spark-sql-kafka-0-10_2.13-$SPARK_VERSION.pom" "$artifact")"
  have="$(dep_version "$POM" "$artifact")"
  [[ "$have" == '${'*'}' ]] && have="$(pom_property "$POM" "${have:2:${#have}-3}")"
  if [[ -z "$want" || "$want" != "$have" ]]; then
    echo "hack/spark/pom.xml: $artifact is ${have:-missing}, spark-sql-kafka $SPARK_VERSION names ${want:-none}: update the pom" >&2
    exit 1
  fi
done
rm -rf "$dest.tmp/pom"
drop_shipped "$dest.tmp/jars" "$pyspark_jars"
mark_complete "$dest"
note "spark-sql-kafka $SPARK_VERSION: $(ls "$dest/jars" | tr '\n' ' ')"
echo "$dest/jars"
