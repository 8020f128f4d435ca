#!/bin/sh
# Prints the Spark release of the project: the pyspark pin of the `spark` extra in
# pyproject.toml, the one place it is written. fetch-spark-jars.sh resolves the Kafka connector
# of that release and the Spark image installs that pyspark; the operator reads the same pin
# (control/builders/spark.py). Usage: spark-version.sh [PYPROJECT]
set -eu
pyproject="${1:-$(dirname "$0")/../pyproject.toml}"
version="$(sed -n 's/^spark = \["pyspark==\([0-9][0-9.]*\)"\]$/\1/p' "$pyproject")"
if [ -z "$version" ]; then
  echo "spark-version.sh: no line 'spark = [\"pyspark==<version>\"]' in $pyproject" >&2
  exit 1
fi
echo "$version"
