#!/usr/bin/env bash
# Validates the deployment files offline (tests/containers runs the Compose cluster itself;
# there is no Kubernetes cluster here): every kustomize overlay renders and passes the
# Kubernetes and Prometheus Operator schemas and the connection check; the Compose file
# parses; the dashboards are JSON.
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
  # The connections the programs make, from the coordinator's own arguments, against the
  # NetworkPolicies; the coordinator a Job with its status port declared.
  kubectl kustomize "$overlay" | /usr/bin/python3 deploy/check_k8s_connections.py "$overlay"
done
for tool in k8s/tools/*.yaml; do
  echo "k8s: $tool"
  node deploy/validate/validate-k8s.mjs < "$tool"
done
docker-compose -f deploy/compose/docker-compose.yml config --quiet
echo "compose: deploy/compose/docker-compose.yml ok"
docker-compose -f deploy/compose/docker-compose.yml -f deploy/compose/docker-compose.replicas.yml \
  config --quiet
echo "compose: deploy/compose/docker-compose.replicas.yml (over the first) ok"
# Each dashboard against Grafana's published schema: @grafana/schema (the version of the
# Grafana image in the Compose file) ships the dashboard model as TypeScript types generated
# from Grafana's schema, so the JSON, as a typed literal, must type-check (unknown fields,
# wrong types and missing required fields are errors). The export wrapper's top-level
# "__inputs" and "__requires" (what Grafana's import asks for) are not part of the model and
# are left out of the check.
schema_dir=$(mktemp -d deploy/validate/.dashboard-check.XXXXXX)
trap 'rm -rf "$schema_dir"' EXIT
for f in dashboards/*.json; do
  python3 -m json.tool "$f" >/dev/null
  grep -q '"uid": "${DS_PROMETHEUS}"' "$f" || { echo "$f: datasource is not templated"; exit 1; }
  ts="$schema_dir/$(basename "$f" .json).ts"
  { echo "import type { Dashboard } from '@grafana/schema';"
    printf 'const dashboard: Dashboard = '
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({k: v for k, v in d.items() if not k.startswith("__")}, indent=1))' "$f"
    echo ';'
    echo 'export default dashboard;'; } > "$ts"
  if ! deploy/validate/node_modules/.bin/tsc --noEmit --strict --moduleResolution bundler \
      --module esnext --target es2020 "$ts" > "$schema_dir/tsc.log"; then
    echo "$f does not match Grafana's dashboard schema (@grafana/schema):"
    cat "$schema_dir/tsc.log"
    exit 1
  fi
  echo "dashboard: $f ok (JSON, templated datasource, Grafana's schema)"
done
