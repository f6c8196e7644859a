#!/usr/bin/env bash
# Validates the deployment files offline (tests/containers runs the Compose cluster itself;
# there is no Kubernetes cluster here): every kustomize overlay renders and passes the
# Kubernetes and Prometheus Operator schemas, the JobSet overlay its CRD's schema (release
# v0.12.0, from ../shared/k8s-schemas), every overlay's generated files match its layout.yaml, and every overlay the
# connection check (deploy/check_k8s_connections.py); the Compose file parses; the
# dashboards are JSON and match Grafana's schema.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d deploy/validate/node_modules ]; then
  npm ci --prefix deploy/validate --no-audit --no-fund --silent
fi
cmp -s dashboards/localpar.json k8s/base/grafana-dashboard.json || {
  echo "k8s/base/grafana-dashboard.json differs from dashboards/localpar.json (copy it over)"
  exit 1
}
jobset_crd=${LOCALPAR_JOBSET_CRD:-../shared/k8s-schemas/jobset.x-k8s.io_jobsets.yaml}
[ -f "$jobset_crd" ] || { echo "no JobSet CRD at $jobset_crd (LOCALPAR_JOBSET_CRD)"; exit 1; }
# The programs whose flag parsers check every container's command line.
bin_dir=${LOCALPAR_BIN_DIR:-build/ci}
[ -x "$bin_dir/localpar_worker" ] && [ -x "$bin_dir/localpar_coordinator" ] || {
  echo "no localpar_worker and localpar_coordinator in $bin_dir: build first, or set LOCALPAR_BIN_DIR"
  exit 1
}
renders=$(mktemp -d)
schema_dir=""
trap 'rm -rf "$renders" ${schema_dir:+"$schema_dir"}' EXIT
# Every overlay's generated files are what its layout.yaml gives (k8s/generate.py).
/usr/bin/python3 k8s/generate.py --check
# Two other layouts, generated in a copy: a JobSet of 2 stages x 2 replicas and a
# StatefulSet of 2 stages x 3 replicas, both regrouped; their replicas' connections, pod
# counts and flags pass the same checks as the committed overlays.
mkdir -p "$renders/layout/deploy" && cp -r k8s experiments proto "$renders/layout/" && cp -r deploy/jobs "$renders/layout/deploy/"
relayout() {  # OVERLAY STAGES REPLICAS
  sed -i -e "s/^stages: .*/stages: $2/" -e "s/^replicas: .*/replicas: $3/" \
    -e "s/^regroup: .*/regroup: true/" "$renders/layout/k8s/overlays/$1/layout.yaml"
  /usr/bin/python3 "$renders/layout/k8s/generate.py" "$renders/layout/k8s/overlays/$1" > /dev/null
}
relayout jobset 2 2
relayout cpu 2 3
for overlay in k8s/overlays/*/ "$renders/layout/k8s/overlays/jobset/" "$renders/layout/k8s/overlays/cpu/"; do
  name=$(basename "$overlay")
  case "$overlay" in "$renders"/*) name=$name-relayout ;; esac
  echo "k8s: $name ($overlay)"
  kubectl kustomize "$overlay" > "$renders/$name.yaml"
  node deploy/validate/validate-k8s.mjs --crd="$jobset_crd" < "$renders/$name.yaml"
  # The connections the programs make, from the coordinator's own arguments, against the
  # NetworkPolicies; names, probes, ports and volumes resolve; the coordinator runs to
  # completion with its status port declared.
  /usr/bin/python3 deploy/check_k8s_connections.py "$name" < "$renders/$name.yaml"
done
for tool in k8s/tools/*.yaml; do
  echo "k8s: $tool"
  node deploy/validate/validate-k8s.mjs < "$tool"
  cp "$tool" "$renders/tool-$(basename "$tool")"
done
docker-compose -f deploy/compose/docker-compose.yml config > "$renders/compose.yaml"
echo "compose: deploy/compose/docker-compose.yml ok"
docker-compose -f deploy/compose/docker-compose.yml -f deploy/compose/docker-compose.replicas.yml \
  config > "$renders/compose-replicas.yaml"
echo "compose: deploy/compose/docker-compose.replicas.yml (over the first) ok"
# Every container's command line, in every overlay and Compose file, through the program's
# own flag parser; and the check itself refuses a misspelt flag.
/usr/bin/python3 deploy/check_container_flags.py "$bin_dir" "$renders"/*.yaml
sed 's/--checkpoint_dir=/--checkpoint-dir=/' "$renders/cpu.yaml" > "$renders/misspelt.bad"
if /usr/bin/python3 deploy/check_container_flags.py "$bin_dir" "$renders/misspelt.bad" \
    > "$renders/misspelt.log"; then
  echo "check_container_flags.py passed a misspelt flag:"; cat "$renders/misspelt.log"; exit 1
fi
echo "flags: a misspelt --checkpoint-dir is refused"
# Each dashboard against Grafana's published schema: @grafana/schema (the version of the
# Grafana image in the Compose file) ships the dashboard model as TypeScript types generated
# from Grafana's schema, so the JSON, as a typed literal, must type-check (unknown fields,
# wrong types and missing required fields are errors). The export wrapper's top-level
# "__inputs" and "__requires" (what Grafana's import asks for) are not part of the model and
# are left out of the check.
schema_dir=$(mktemp -d deploy/validate/.dashboard-check.XXXXXX)
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
