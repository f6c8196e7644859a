// Validates rendered Kubernetes manifests (kubectl kustomize output on stdin) against the
// Kubernetes and Prometheus Operator schemas, offline. Exits 1 naming each invalid object.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const text = readFileSync(0, "utf8");
let failures = 0;
let checked = 0;
for (const doc of parseAllDocuments(text)) {
  const obj = doc.toJS();
  if (!obj) continue;
  const { apiVersion, kind } = obj;
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const module =
    group === "monitoring.coreos.com"
      ? `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`
      : `kubernetes-models/${group ? group + "/" : ""}${version}/${kind}`;
  const where = `${kind} ${obj.metadata?.name}`;
  let Model;
  try {
    Model = (await import(module))[kind];
  } catch (e) {
    console.error(`${where}: no schema for ${apiVersion} ${kind}`);
    failures++;
    continue;
  }
  try {
    new Model(obj).validate();
    checked++;
  } catch (e) {
    console.error(`${where}: ${e.message}`);
    failures++;
  }
}
console.log(`validate-k8s: ${checked} objects valid, ${failures} invalid`);
process.exit(failures || checked === 0 ? 1 : 0);
