#!/usr/bin/env bash
# Entrypoint of the eopipe Spark image (Dockerfile target `spark`).
#
# Spark on Kubernetes (what the Spark Operator's SparkApplication starts) runs the image with
# the first argument `driver` or `executor` and describes the rest in arguments and SPARK_*
# environment variables; anything else is run as a command (`python3 -m spark_app.main ...`).
set -euo pipefail

# Java options Spark hands over one per variable: SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
java_opts=()
while IFS= read -r name; do
  java_opts+=("${!name}")
done < <(compgen -e | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n || true)

classpath="${SPARK_HOME}/jars/*"
if [[ -n "${SPARK_CLASSPATH:-}" ]]; then classpath="${SPARK_CLASSPATH}:${classpath}"; fi
if [[ -n "${SPARK_EXTRA_CLASSPATH:-}" ]]; then classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"; fi

case "${1:-}" in
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    exec java "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${classpath}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-}" \
      "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
