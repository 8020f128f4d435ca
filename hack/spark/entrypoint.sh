#!/usr/bin/env bash
# Entrypoint of the eopipe Spark image (Dockerfile target `spark`).
#
# Spark on Kubernetes (what the Spark Operator's SparkApplication starts) runs the image with
# the first argument `driver` or `executor` and describes the rest in arguments and SPARK_*
# environment variables; `cds-dump` (the image build) makes the class data sharing archive;
# anything else is run as a command (`python3 -m spark_app.main ...`).
set -euo pipefail
export LC_ALL=C  # the glob below sorts bytewise, the same at build and at run time

# Class data sharing (docs/design.md#spark-start): drivers and executors map the classes that a
# training run at image build loaded (hack/spark/cds-train.py), instead of loading and
# verifying them again: a third less CPU to start. The archive holds only for a class path that
# begins with the one it was made with, so Spark's jars are named one by one, in sorted order:
# the JVM expands jars/* in directory order, which differs between filesystems. Where the class
# path differs, the JVM says "Unable to use shared archive" and starts as without it.
# EOPIPE_SPARK_CDS_ARCHIVE names another archive; a path that is not there turns it off.
CDS_ARCHIVE=${EOPIPE_SPARK_CDS_ARCHIVE:-/opt/eopipe/spark.jsa}
jars=("${SPARK_HOME}"/jars/*.jar)
jars_cp=$(IFS=:; echo "${jars[*]}")

# Java options Spark hands over one per variable: SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
java_opts=()
while IFS= read -r name; do
  java_opts+=("${!name}")
done < <(compgen -e | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n || true)

# Whether the submission's arguments set Spark setting $1 (a --conf, or its --properties-file).
sets() {
  local key=$1
  shift
  while (($#)); do
    case $1 in
      --conf) [[ ${2:-} == "$key="* ]] && return 0 ;;
      --properties-file) grep -q "^${key//./\\.}[=: ]" "${2:-/dev/null}" 2>/dev/null && return 0 ;;
    esac
    shift
  done
  return 1
}

case "${1:-}" in
  driver)
    shift
    # The driver runs in spark-submit's JVM: the archive through SPARK_SUBMIT_OPTS, the jars
    # first on its class path through spark.driver.extraClassPath (unless an admin let the
    # pipeline set that itself: then it starts without the archive).
    cds=()
    if [[ -r $CDS_ARCHIVE ]] && ! sets spark.driver.extraClassPath "$@"; then
      export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:+$SPARK_SUBMIT_OPTS }-XX:SharedArchiveFile=$CDS_ARCHIVE"
      cds=(--conf "spark.driver.extraClassPath=$jars_cp")
    fi
    exec "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" "${cds[@]}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    classpath=$jars_cp
    if [[ -n "${SPARK_CLASSPATH:-}" ]]; then classpath="${SPARK_CLASSPATH}:${classpath}"; fi
    if [[ -n "${SPARK_EXTRA_CLASSPATH:-}" ]]; then classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"; fi
    cds=()
    if [[ -r $CDS_ARCHIVE ]]; then cds=("-XX:SharedArchiveFile=$CDS_ARCHIVE"); fi
    exec java "${java_opts[@]}" "${cds[@]}" \
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
  cds-dump)
    # The image build: a driver's launch, as above, running the training script ($2) on
    # loopback; the JVM writes the archive of every class it loaded when it exits.
    shift
    SPARK_SUBMIT_OPTS="-XX:ArchiveClassesAtExit=$CDS_ARCHIVE -Xlog:cds=error" SPARK_LOCAL_IP=127.0.0.1 \
      "${SPARK_HOME}/bin/spark-submit" --conf "spark.driver.extraClassPath=$jars_cp" "$@"
    test -s "$CDS_ARCHIVE"
    ;;
  *)
    exec "$@"
    ;;
esac
