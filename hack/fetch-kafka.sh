#!/usr/bin/env bash
# Resolves the Kafka broker jars with Maven (runtime scope) into $EOPIPE_CACHE/kafka-<version>/libs.
# Idempotent: a finished copy is marked with .complete and skipped on the next run.
source "$(dirname "$0")/lib.sh"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$REPO_ROOT/hack/kafka/pom.xml")"
dest="$EOPIPE_CACHE/kafka-$KAFKA_VERSION"
if [[ -f "$dest/.complete" ]]; then
  note "kafka $KAFKA_VERSION: cached in $dest"
  echo "$dest/libs"
  exit 0
fi
step "Resolving Apache Kafka $KAFKA_VERSION jars with Maven (first run only)"
start=$SECONDS
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
mvn -B -q -f "$REPO_ROOT/hack/kafka/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$dest.tmp/libs" >&2
rm -rf "$dest" && mv "$dest.tmp" "$dest" && touch "$dest/.complete"
note "kafka $KAFKA_VERSION: $(ls "$dest/libs" | wc -l) jars in $((SECONDS - start))s"
echo "$dest/libs"
