#!/usr/bin/env bash
# Resolves hadoop-aws (the s3a:// filesystem) and the parts of the AWS SDK v2 it needs with Maven
# into $EOPIPE_CACHE/hadoop-aws-<version>/jars, for the Hadoop client that pyspark ships (its
# jars/hadoop-client-api-<version>.jar), leaving out jars pyspark already ships.
# Usage: fetch-hadoop-aws.sh [PYSPARK_JARS_DIR]. Idempotent; prints the jars folder.
source "$(dirname "$0")/lib.sh"
POM="$REPO_ROOT/hack/spark/hadoop-aws-pom.xml"
pyspark_jars="${1:-$("$REPO_ROOT/.venv/bin/python" -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')}"
shopt -s nullglob
client=("$pyspark_jars"/hadoop-client-api-[0-9]*.jar)
if (( ${#client[@]} != 1 )); then
  echo "fetch-hadoop-aws.sh: no single hadoop-client-api jar in $pyspark_jars" >&2
  exit 1
fi
HADOOP_VERSION="$(basename "${client[0]}" .jar)"
HADOOP_VERSION="${HADOOP_VERSION#hadoop-client-api-}"
dest="$EOPIPE_CACHE/hadoop-aws-$HADOOP_VERSION"
exit_if_cached "$dest" "hadoop-aws $HADOOP_VERSION" jars
step "Resolving hadoop-aws $HADOOP_VERSION and the AWS SDK's S3 client with Maven (first run only)"
maven_runtime_deps "$POM" "$dest.tmp/jars" -Dhadoop.version="$HADOOP_VERSION"
# The SDK versions are written in the pom (see its comment): check them against the ones this
# Hadoop release was built with.
mvn -B -q dependency:copy -Dartifact="org.apache.hadoop:hadoop-project:$HADOOP_VERSION:pom" \
  -DoutputDirectory="$dest.tmp/pom" >&2
for prop in aws-java-sdk-v2.version:aws-sdk-v2.version \
            amazon-s3-analyticsaccelerator-s3.version:analyticsaccelerator-s3.version; do
  want="$(pom_property "$dest.tmp/pom/hadoop-project-$HADOOP_VERSION.pom" "${prop%%:*}")"
  have="$(pom_property "$POM" "${prop##*:}")"
  if [[ -z "$want" || "$want" != "$have" ]]; then
    echo "hack/spark/hadoop-aws-pom.xml: ${prop##*:} is ${have:-missing}, Hadoop $HADOOP_VERSION names ${want:-none}: update the pom" >&2
    exit 1
  fi
done
rm -rf "$dest.tmp/pom"
drop_shipped "$dest.tmp/jars" "$pyspark_jars"
mark_complete "$dest"
note "hadoop-aws $HADOOP_VERSION: $(ls "$dest/jars" | wc -l) jars, $(du -sh "$dest/jars" | cut -f1)"
echo "$dest/jars"
