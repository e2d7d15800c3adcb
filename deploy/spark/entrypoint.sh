#!/usr/bin/env bash
# Entry point for Spark on Kubernetes, for an image built from pip's pyspark.
# Spark's Kubernetes backend starts driver pods with the argument "driver" and
# executor pods with "executor", passing everything else through environment
# variables (SPARK_DRIVER_BIND_ADDRESS, SPARK_EXECUTOR_* ...). Anything else is
# run as a plain command, so the image also works for `docker run ... python job.py`.
set -euo pipefail
SPARK_CLASSPATH="${SPARK_HOME}/jars/*"
case "${1:-}" in
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    exec java -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CLASSPATH}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec "$@"
    ;;
esac
