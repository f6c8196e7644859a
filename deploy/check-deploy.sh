#!/usr/bin/env bash
# Validates the deployment files offline (tests/containers runs the Compose cluster itself;
# there is no Kubernetes cluster here): every kustomize overlay renders and passes the
# Kubernetes and Prometheus Operator schemas; the Compose file parses; the dashboards are JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d deploy/validate/node_modules ]; then
  npm ci --prefix deploy/validate --no-audit --no-fund --silent
fi
cmp -s dashboards/localpar.json k8s/base/grafana-dashboard.json || {
  echo "k8s/base/grafana-dashboard.json differs from dashboards/localpar.json (copy it over)"
  exit 1
}
for overlay in k8s/overlays/*/; do
  echo "k8s: $overlay"
  kubectl kustomize "$overlay" | node deploy/validate/validate-k8s.mjs
done
docker-compose -f deploy/compose/docker-compose.yml config --quiet
echo "compose: deploy/compose/docker-compose.yml ok"
for f in dashboards/*.json; do
  python3 -m json.tool "$f" >/dev/null
  grep -q '"uid": "${DS_PROMETHEUS}"' "$f" || { echo "$f: datasource is not templated"; exit 1; }
  echo "dashboard: $f ok"
done
