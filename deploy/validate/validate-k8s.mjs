// Validates rendered Kubernetes manifests (kubectl kustomize output on stdin) against the
// Kubernetes and Prometheus Operator schemas, offline, and custom resources against the
// CustomResourceDefinitions named on the command line:
//
//   kubectl kustomize DIR | node validate-k8s.mjs [--crd=FILE ...]
//
// A CRD's openAPIV3Schema is checked as a cluster would (ajv, with the x-kubernetes-*
// extensions as annotations and formats not checked), plus what `kubectl apply
// --validate=strict` adds: a field the schema does not declare (which the API server would
// silently drop) is an error. Exits 1 naming each invalid object.
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import { parse, parseAllDocuments } from "yaml";

const crds = new Map();  // "group/version/Kind" -> openAPIV3Schema
for (const arg of process.argv.slice(2)) {
  if (!arg.startsWith("--crd=")) {
    console.error(`validate-k8s: unknown argument ${arg}`);
    process.exit(2);
  }
  const file = arg.slice("--crd=".length);
  const crd = parse(readFileSync(file, "utf8"));
  for (const v of crd.spec.versions) {
    crds.set(`${crd.spec.group}/${v.name}/${crd.spec.names.kind}`, v.schema.openAPIV3Schema);
  }
}
const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false });
const compiled = new Map();

// Fields that `schema` does not declare, as paths (a schema with properties and no
// additionalProperties and no x-kubernetes-preserve-unknown-fields prunes the rest).
function unknownFields(value, schema, path, out) {
  if (!schema || value === null || typeof value !== "object") return out;
  if (Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, schema.items, `${path}[${i}]`, out));
    return out;
  }
  if (schema["x-kubernetes-preserve-unknown-fields"]) return out;
  if (schema.properties) {
    for (const [k, v] of Object.entries(value)) {
      if (k in schema.properties) {
        unknownFields(v, schema.properties[k], `${path}.${k}`, out);
      } else if (typeof schema.additionalProperties === "object") {
        unknownFields(v, schema.additionalProperties, `${path}.${k}`, out);
      } else if (!schema.additionalProperties) {
        out.push(`${path}.${k}`);
      }
    }
  } else if (typeof schema.additionalProperties === "object") {
    for (const [k, v] of Object.entries(value)) {
      unknownFields(v, schema.additionalProperties, `${path}.${k}`, out);
    }
  }
  return out;
}

const text = readFileSync(0, "utf8");
let failures = 0;
let checked = 0;
for (const doc of parseAllDocuments(text)) {
  const obj = doc.toJS();
  if (!obj) continue;
  const { apiVersion, kind } = obj;
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const where = `${kind} ${obj.metadata?.name}`;
  const crdSchema = crds.get(`${group}/${version}/${kind}`);
  if (crdSchema) {
    const key = `${group}/${version}/${kind}`;
    if (!compiled.has(key)) compiled.set(key, ajv.compile(crdSchema));
    const validate = compiled.get(key);
    const problems = [];
    if (!validate(obj)) {
      for (const e of validate.errors) problems.push(`${e.instancePath || "/"} ${e.message}`);
    }
    for (const f of unknownFields(obj, crdSchema, "", [])) {
      problems.push(`${f}: unknown field (the API server would drop it)`);
    }
    if (problems.length) {
      console.error(`${where} (against its CRD):\n  ${problems.join("\n  ")}`);
      failures++;
    } else {
      checked++;
    }
    continue;
  }
  const module =
    group === "monitoring.coreos.com"
      ? `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`
      : `kubernetes-models/${group ? group + "/" : ""}${version}/${kind}`;
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
