#!/usr/bin/env bash
# Resolves the Kafka broker jars with Maven (runtime scope) into $EOPIPE_CACHE/kafka-<version>/libs.
# Idempotent: a finished copy is marked with .complete and skipped on the next run.
source "$(dirname "$0")/lib.sh"
KAFKA_VERSION="$(pom_property "$REPO_ROOT/hack/kafka/pom.xml" kafka.version)"
dest="$EOPIPE_CACHE/kafka-$KAFKA_VERSION"
exit_if_cached "$dest" "kafka $KAFKA_VERSION" libs
step "Resolving Apache Kafka $KAFKA_VERSION jars with Maven (first run only)"
start=$SECONDS
maven_runtime_deps "$REPO_ROOT/hack/kafka/pom.xml" "$dest.tmp/libs"
mark_complete "$dest"
note "kafka $KAFKA_VERSION: $(ls "$dest/libs" | wc -l) jars in $((SECONDS - start))s"
echo "$dest/libs"
