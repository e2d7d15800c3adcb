#!/usr/bin/env bash
# Run a Sluice Spark job on Kubernetes with plain spark-submit (cluster mode).
#
#   deploy/spark/submit.sh tag_counts.py --topic orders --checkpoint /tmp/ckpt
#
# Environment: K8S_API (default: the current kubectl context's server), NAMESPACE (default: default),
# IMAGE (default: sluice-spark:latest), EXECUTORS (default: 2), BOOTSTRAP (default: sluice-coordinator:7600).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
job="${1:?usage: submit.sh <job.py> [job args...]}"; shift
K8S_API="${K8S_API:-$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')}"
NAMESPACE="${NAMESPACE:-default}"
IMAGE="${IMAGE:-sluice-spark:latest}"
EXECUTORS="${EXECUTORS:-2}"
BOOTSTRAP="${BOOTSTRAP:-sluice-coordinator:7600}"
exec spark-submit \
  --master "k8s://${K8S_API}" \
  --deploy-mode cluster \
  --name "sluice-${job%.py}" \
  --conf spark.kubernetes.namespace="${NAMESPACE}" \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=sluice-spark \
  --conf spark.kubernetes.driver.podTemplateFile="${here}/pod-template.yaml" \
  --conf spark.kubernetes.executor.podTemplateFile="${here}/pod-template.yaml" \
  --conf spark.executor.instances="${EXECUTORS}" \
  --conf spark.sql.session.timeZone=UTC \
  --py-files local:///opt/sluice/jobs/_common.py \
  "local:///opt/sluice/jobs/${job}" --bootstrap "${BOOTSTRAP}" "$@"
