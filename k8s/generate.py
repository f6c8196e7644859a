#!/usr/bin/python3
"""Writes each Kubernetes overlay from its layout.yaml, the one place that sets the overlay's
stage count, replicas, job, image and device.

  k8s/generate.py                   # every overlay under k8s/overlays
  k8s/generate.py k8s/overlays/cpu  # one overlay
  k8s/generate.py --check           # exit 1 if a generated file is out of date

layout.yaml is a YAML mapping with exactly these keys, each once:
  workload: statefulset | jobset
  stages:   K, the worker stages
  replicas: R, the replicas of every stage (K x R worker pods, at most 256)
  regroup:  true passes --stages=K to the coordinator (the job file has another stage count)
  job:      the job file, relative to the repository root and inside it (copied into the
            overlay)
  image:    NAME:TAG of the localpar image (a registry host and path may lead the name)
  device:   cpu (one core per worker) | cuda (one GPU per worker)
and optionally
  data:     where the job's data comes from, mounted in the coordinator (the one pod that
            reads data). Each file or folder the job reads is the volume's entry of the
            same last name: a relative path moves under `path` (default /data), where the
            volume is mounted; an absolute one stays, with that entry mounted there:
              {claim: NAME, size: 20Gi, path: /data}  a PersistentVolumeClaim (default: the
                  base's localpar-data, 1Gi; size resizes it; another name gets a claim of
                  its own, 1Gi unless size says); copy the files and folders the generated
                  job.textproto lists into its root before the run
              {configmap: NAME, path: /data}  the job's data files themselves, copied into
                  the overlay's data/ and served as a ConfigMap (at most 1 MiB in all)
            A job without data files (synthetic) mounts none.

It writes into the overlay kustomization.yaml, job.textproto (the job, for the job
ConfigMap) and:
  - statefulset: layout-patch.yaml (the StatefulSet's replicas = K x R, the workers'
    arguments, the coordinator's --workers in pod order: pod I holds replica I % R of stage
    I / R) and networkpolicy.yaml (one policy per worker pod);
  - jobset: jobset.yaml (one replicated job per stage, R Indexed pods each, then the
    coordinator) and networkpolicy-jobset.yaml.
The policies let the coordinator and the same replica of the stage before reach a worker's
gRPC port, a stage's replicas reach each other on any port (their mesh listens on an
ephemeral one) and the coordinator's Rendezvous (its status port, open in the base), and
Prometheus every metrics port. deploy/check-deploy.sh runs --check and renders every overlay.

Every file is built as data and written by PyYAML (Debian's python3-yaml), so no value of
layout.yaml can become YAML syntax in the output; values that are not plain names, paths or
tags are refused anyway, naming the key. The job is read and written through protobuf's
text format with proto/job.proto (python3-protobuf and protoc, as the experiment runner
does), so its data paths are fields, not text to search.
"""
import argparse
import os
import re
import sys

import yaml

K8S = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(K8S)
sys.path.insert(0, ROOT)
from experiments import jobs  # noqa: E402  (the job through protobuf's text format)
from experiments.common import Failure  # noqa: E402
JOBSET = "localpar"
GRPC, METRICS, STATUS = 50051, 9100, 50052
MAX_PODS = 256
KEYS = {"workload": ("statefulset", "jobset"), "stages": int, "replicas": int,
        "regroup": bool, "job": str, "image": str, "device": ("cpu", "cuda"), "data": dict}
OPTIONAL = {"data"}
BASE_CLAIM = "localpar-data"
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a Kubernetes object name
SIZE = re.compile(r"^[1-9][0-9]{0,5}(Mi|Gi|Ti)$")
MOUNT = re.compile(r"^/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
CONFIGMAP_BYTES = 1000000  # a ConfigMap holds at most 1 MiB, keys included
# An image reference NAME:TAG: an optional registry host (with a port), path components of
# lower-case letters, digits and separators, and a tag of at most 128 word characters.
COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{COMPONENT}(?:/{COMPONENT})*"
                   r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class LayoutError(Exception):
    pass


class _Loader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice (PyYAML keeps the last one silently)."""


def _mapping(loader, node):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise LayoutError(f"line {key_node.start_mark.line + 1}: {key} is given twice "
                              f"(first on line {seen[key]})")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_layout(path):
    try:
        with open(path) as f:
            layout = yaml.load(f, Loader=_Loader)
    except yaml.YAMLError as e:
        raise LayoutError(f"{path}: not YAML: {e}")
    except LayoutError as e:
        raise LayoutError(f"{path}: {e}")
    if not isinstance(layout, dict):
        raise LayoutError(f"{path}: a mapping of {', '.join(KEYS)} is required")
    for key, value in layout.items():
        kind = KEYS.get(key)
        if kind is None:
            raise LayoutError(f"{path}: {key}: not a key (one of {', '.join(KEYS)})")
        if kind is int:
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1024:
                raise LayoutError(f"{path}: {key} must be a whole number from 1 to 1024, "
                                  f"not {value!r}")
        elif kind is bool:
            if not isinstance(value, bool):
                raise LayoutError(f"{path}: {key} must be true or false, not {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                raise LayoutError(f"{path}: {key} must be a string, not {value!r}")
        elif kind is dict:
            if not isinstance(value, dict):
                raise LayoutError(f"{path}: {key} must be a mapping, not {value!r}")
        elif value not in kind:
            raise LayoutError(f"{path}: {key} must be one of {', '.join(kind)}, not {value!r}")
    missing = [k for k in KEYS if k not in layout and k not in OPTIONAL]
    if missing:
        raise LayoutError(f"{path}: missing {', '.join(missing)}")
    if layout["stages"] * layout["replicas"] > MAX_PODS:
        raise LayoutError(f"{path}: stages x replicas is {layout['stages'] * layout['replicas']} "
                          f"worker pods; at most {MAX_PODS}")
    if not IMAGE.match(layout["image"]):
        raise LayoutError(f"{path}: image must be NAME:TAG (a registry host and path may lead "
                          f"the name; letters, digits, . _ - only), not {layout['image']!r}")
    layout["job_path"] = job_path(path, layout["job"])
    layout["data"] = data_setting(path, layout.get("data"))
    return layout


def data_setting(path, data):
    """layout.yaml's data, checked, with its defaults."""
    data = dict(data or {"claim": BASE_CLAIM})
    for key in data:
        if key not in ("claim", "configmap", "size", "path"):
            raise LayoutError(f"{path}: data.{key}: not a key (claim, configmap, size, path)")
    if ("claim" in data) == ("configmap" in data):
        raise LayoutError(f"{path}: data needs one of claim (a PersistentVolumeClaim) or "
                          "configmap (small files, served from the overlay)")
    for key in ("claim", "configmap"):
        if key in data and not (isinstance(data[key], str) and NAME.match(data[key])):
            raise LayoutError(f"{path}: data.{key} must be a Kubernetes name (lower-case "
                              f"letters, digits, -), not {data[key]!r}")
    if "size" in data and ("claim" not in data or not isinstance(data["size"], str)
                           or not SIZE.match(data["size"])):
        raise LayoutError(f"{path}: data.size is a claim's size, such as 20Gi (Mi, Gi or Ti), "
                          f"not {data['size']!r}")
    data.setdefault("path", "/data")
    mount = data["path"]
    if not isinstance(mount, str) or not MOUNT.match(mount) or ".." in mount.split("/"):
        raise LayoutError(f"{path}: data.path must be an absolute path (letters, digits, "
                          f"_ . -), not {mount!r}")
    for taken in ("/etc/localpar/job", "/checkpoints"):
        if mount == taken or mount.startswith(taken + "/") or taken.startswith(mount + "/"):
            raise LayoutError(f"{path}: data.path {mount} overlaps {taken}, where the "
                              "coordinator has another volume")
    return data


def job_data(overlay, layout):
    """(the job's text for the ConfigMap, {overlay file: bytes} of a data ConfigMap, the
    coordinator's data mounts). Each data file or folder is named in the volume by its last
    part: a relative path (from the job file) moves under data.path, where the volume is
    mounted whole; an absolute one stays as it is and gets that entry of the volume mounted
    there (subPath), so a source's default folder keeps its meaning."""
    data, where = layout["data"], os.path.join(overlay, "layout.yaml")
    try:
        job = jobs.read_job(layout["job_path"])
    except Failure as e:
        raise LayoutError(f"{where}: job {layout['job']}: {e}")
    here = os.path.dirname(layout["job_path"])
    files, names, lines, mounts = {}, {}, [], []
    for field, path, _ in jobs.data_paths(job):
        name = os.path.basename(path.rstrip("/"))
        if name in names:
            raise LayoutError(f"{where}: {field} and {names[name]} are both named {name}; in "
                              "the data volume one would hide the other")
        names[name] = field
        if os.path.isabs(path):
            at = os.path.normpath(path)
            for taken in ("/etc/localpar/job", "/checkpoints", data["path"]):
                if at == taken or at.startswith(taken + "/") or taken.startswith(at + "/"):
                    raise LayoutError(f"{where}: {field} is {path}, which overlaps {taken}, "
                                      "where the coordinator has another volume")
            mounts.append({"name": "data", "mountPath": at, "subPath": name, "readOnly": True})
        else:
            at = f"{data['path']}/{name}"
            jobs.set_data_path(job, field, at)
            if not any("subPath" not in m for m in mounts):
                mounts.append({"name": "data", "mountPath": data["path"], "readOnly": True})
        lines.append(f"#   {name}: at {at} ({field}; the job file has {path})")
        if "configmap" in data:
            source = os.path.join(here, path)
            if not os.path.isfile(source):
                raise LayoutError(f"{where}: data.configmap: {field} is {path}, which is no "
                                  "file: a ConfigMap holds files; use a claim for a folder")
            with open(source, "rb") as f:
                files[f"data/{name}"] = f.read()
    total = sum(len(b) for b in files.values())
    if total > CONFIGMAP_BYTES:
        raise LayoutError(f"{where}: data.configmap: the job's data is {total} bytes, over the "
                          f"{CONFIGMAP_BYTES} a ConfigMap holds: use a claim")
    head = [f"# The job {layout['job']}, generated by k8s/generate.py from "
            f"{overlay}/layout.yaml."]
    if lines and "claim" in data:
        head.append(f"# Before the run, copy into the root of the claim {data['claim']}:")
    elif lines:
        head.append(f"# The ConfigMap {data['configmap']} (this overlay's data/) holds:")
    return "\n".join(head + lines) + "\n" + jobs.job_text(job), files, mounts


def data_volume(layout):
    """The coordinator's data volume."""
    data = layout["data"]
    if "claim" in data:
        return {"name": "data", "persistentVolumeClaim": {"claimName": data["claim"],
                                                          "readOnly": True}}
    return {"name": "data", "configMap": {"name": data["configmap"]}}


def data_objects(layout, files):
    """What the overlay adds for its data: (resources, kustomization fields)."""
    data = layout["data"]
    if "configmap" in data:
        return {}, {"configMapGenerator": [{"name": data["configmap"],
                                            "files": sorted(files)}]}
    if data["claim"] == BASE_CLAIM:
        if "size" not in data:
            return {}, {}
        patch = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": BASE_CLAIM},
                 "spec": {"resources": {"requests": {"storage": data["size"]}}}}
        return {}, {"patches": [{"target": {"kind": "PersistentVolumeClaim", "name": BASE_CLAIM},
                                 "patch": yaml.dump(patch, Dumper=_Dumper,
                                                    sort_keys=False).rstrip()}]}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": data["claim"]},
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": data.get("size", "1Gi")}}}}
    return {"data-pvc.yaml": claim}, {}


def job_path(path, job):
    """The job file: relative to the repository root, and inside it after every link."""
    if os.path.isabs(job) or not re.fullmatch(r"[A-Za-z0-9_./-]+", job):
        raise LayoutError(f"{path}: job must be a path relative to the repository root "
                          f"(letters, digits, _ . / -), not {job!r}")
    real = os.path.realpath(os.path.join(ROOT, job))
    if os.path.commonpath([real, os.path.realpath(ROOT)]) != os.path.realpath(ROOT):
        raise LayoutError(f"{path}: job {job} is outside the repository ({ROOT})")
    if not os.path.isfile(real):
        raise LayoutError(f"{path}: job {job} is no file under {ROOT}")
    return real


# ---- Writing: dicts and lists through PyYAML, block style, keys in the order given.

class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def dump(overlay, *documents):
    header = f"# Generated by k8s/generate.py from {overlay}/layout.yaml: edit that, not this.\n"
    return header + yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=4096,
                                  default_flow_style=False, explicit_start=len(documents) > 1)


def worker_args(layout, checkpoint_dir):
    device = "--device=cuda" if layout["device"] == "cuda" else "--threads=1"
    return [f"--listen=0.0.0.0:{GRPC}", f"--metrics_listen=0.0.0.0:{METRICS}", device,
            f"--checkpoint_dir={checkpoint_dir}"]


def coordinator_args(layout, workers):
    args = ["--job=/etc/localpar/job/job.textproto"]
    if layout["regroup"]:
        args.append(f"--stages={layout['stages']}")
    if layout["replicas"] > 1:
        args.append(f"--replicas={layout['replicas']}")
    return args + [f"--workers={','.join(workers)}", "--out=/checkpoints/run",
                   f"--metrics_listen=0.0.0.0:{METRICS}", f"--status_listen=0.0.0.0:{STATUS}",
                   f"--advertise=localpar-coordinator:{STATUS}",
                   "--checkpoint_dir=/checkpoints/ckpt", "--checkpoint_every_seconds=300",
                   "--resume_if_present"]


GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def kustomization(layout, resources, extra, data_extra):
    name, _, tag = layout["image"].rpartition(":")
    out = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": resources,
           "images": [{"name": "localpar", "newName": name, "newTag": tag}],
           "configMapGenerator": [{"name": "localpar-job", "behavior": "replace",
                                   "files": ["job.textproto"]}], **extra}
    for key, value in data_extra.items():
        out[key] = out.get(key, []) + value
    return out


def ingress_policy(name, pod_labels, sources, peers):
    """A worker's NetworkPolicy: `sources` (pod selectors) to its gRPC port, `peers` to any
    port, anyone to its metrics port."""
    ingress = [{"from": [{"podSelector": {"matchLabels": s}} for s in sources],
                "ports": [{"port": GRPC, "protocol": "TCP"}]}]
    ingress += [{"from": [{"podSelector": {"matchLabels": p}}]} for p in peers]
    ingress.append({"ports": [{"port": METRICS, "protocol": "TCP"}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name},
            "spec": {"podSelector": {"matchLabels": pod_labels}, "policyTypes": ["Ingress"],
                     "ingress": ingress}}


COORDINATOR_LABELS = {"app.kubernetes.io/name": "localpar-coordinator"}


# ---- StatefulSet: pod localpar-worker-I holds replica I % R of stage I / R.

def sts_pod(layout, stage, replica):
    return f"localpar-worker-{stage * layout['replicas'] + replica}"


def sts_patch(layout, mounts):
    k, r = layout["stages"], layout["replicas"]
    workers = [f"{sts_pod(layout, s, q)}.localpar-worker:{GRPC}"
               for s in range(k) for q in range(r)]
    worker = {"name": "worker", "args": worker_args(layout, "/checkpoints/stage")}
    pod = {"containers": [worker]}
    if layout["device"] == "cuda":
        pod = {"tolerations": GPU_TOLERATIONS, **pod}
        worker["resources"] = {"limits": {"nvidia.com/gpu": 1, "memory": "4Gi"}}
    workers_set = {"apiVersion": "apps/v1", "kind": "StatefulSet",
                   "metadata": {"name": "localpar-worker"},
                   "spec": {"replicas": k * r, "template": {"spec": pod}}}
    container = {"name": "coordinator", "args": coordinator_args(layout, workers)}
    pod = {"containers": [container]}
    if mounts:
        container["volumeMounts"] = mounts
        pod["volumes"] = [data_volume(layout)]
    coordinator = {"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": "localpar-coordinator"},
                   "spec": {"template": {"spec": pod}}}
    return workers_set, coordinator


def sts_policies(layout):
    k, r = layout["stages"], layout["replicas"]

    def pod(name):
        return {"statefulset.kubernetes.io/pod-name": name}

    out = []
    for s in range(k):
        for q in range(r):
            sources = [COORDINATOR_LABELS] + ([pod(sts_pod(layout, s - 1, q))] if s else [])
            peers = [pod(sts_pod(layout, s, o)) for o in range(r) if o != q]
            out.append(ingress_policy(f"localpar-stage-{s}-replica-{q}",
                                      pod(sts_pod(layout, s, q)), sources, peers))
    return out


def statefulset_files(overlay, layout, mounts, data_files):
    k, r = layout["stages"], layout["replicas"]
    patch = dump(overlay, *sts_patch(layout, mounts))
    added, data_extra = data_objects(layout, data_files) if mounts else ({}, {})
    return {
        **{name: dump(overlay, doc) for name, doc in added.items()},
        "kustomization.yaml": dump(overlay, kustomization(
            layout, ["../../base", "networkpolicy.yaml", *added],
            {"patches": [{"path": "layout-patch.yaml"}]}, data_extra)),
        "layout-patch.yaml": patch.replace(
            "\n", f"\n# {k} stage(s) x {r} replica(s): {k * r} worker pods.\n", 1),
        "networkpolicy.yaml": dump(overlay, *sts_policies(layout)),
    }


# ---- JobSet: one replicated job per stage, its R Indexed pods (pod index = replica).

SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}


def replicated_job(name, completions, labels, pod, indexed):
    spec = {"completionMode": "Indexed", "completions": completions,
            "parallelism": completions} if indexed else {}
    spec["backoffLimit"] = 6
    spec["template"] = {"metadata": {"labels": labels}, "spec": pod}
    return {"name": name, "replicas": 1, "template": {"spec": spec}}


def worker_job(layout, stage):
    gpu = layout["device"] == "cuda"
    grpc_probe = {"grpc": {"port": GRPC}}
    container = {
        "name": "worker", "image": "localpar:cpu",
        "env": [{"name": "REPLICA", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}],
        "args": worker_args(layout, f"/snapshots/stage-{stage}-replica-$(REPLICA)"),
        "ports": [{"name": "grpc", "containerPort": GRPC},
                  {"name": "metrics", "containerPort": METRICS}],
        "startupProbe": {**grpc_probe, "periodSeconds": 2, "failureThreshold": 30},
        "readinessProbe": {**grpc_probe, "periodSeconds": 5},
        "livenessProbe": {**grpc_probe, "periodSeconds": 10, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                      "limits": {**({"nvidia.com/gpu": 1} if gpu else {}), "memory": "4Gi"}},
        "volumeMounts": [{"name": "snapshots", "mountPath": "/snapshots"}]}
    pod = {"restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 30,
           "securityContext": SECURITY, **({"tolerations": GPU_TOLERATIONS} if gpu else {}),
           "containers": [container]}
    labels = {"app.kubernetes.io/name": "localpar-worker",
              "app.kubernetes.io/component": "worker"}
    return replicated_job(f"stage-{stage}", layout["replicas"], labels, pod, indexed=True)


def coordinator_job(layout, mounts):
    workers = [f"{JOBSET}-stage-{s}-0-{q}.{JOBSET}:{GRPC}"
               for s in range(layout["stages"]) for q in range(layout["replicas"])]
    container = {
        "name": "coordinator", "image": "localpar:cpu", "command": ["localpar_coordinator"],
        "args": coordinator_args(layout, workers),
        "ports": [{"name": "metrics", "containerPort": METRICS},
                  {"name": "status", "containerPort": STATUS}],
        "livenessProbe": {"tcpSocket": {"port": "metrics"}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [
            {"name": "job", "mountPath": "/etc/localpar/job", "readOnly": True},
            {"name": "checkpoints", "mountPath": "/checkpoints"}]}
    pod = {"restartPolicy": "OnFailure", "securityContext": SECURITY, "containers": [container],
           "volumes": [
               {"name": "job", "configMap": {"name": "localpar-job"}},
               {"name": "checkpoints",
                "persistentVolumeClaim": {"claimName": "localpar-checkpoints"}}]}
    if mounts:
        container["volumeMounts"] += mounts
        pod["volumes"].append(data_volume(layout))
    labels = {"app.kubernetes.io/name": "localpar-coordinator",
              "app.kubernetes.io/component": "coordinator"}
    return replicated_job("coordinator", 1, labels, pod, indexed=False)


def jobset(layout, mounts):
    snapshots = {"metadata": {"name": "snapshots"},
                 "spec": {"accessModes": ["ReadWriteMany"],
                          "resources": {"requests": {"storage": "20Gi"}}}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": JOBSET},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": JOBSET},
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["coordinator"]},
            "failurePolicy": {"maxRestarts": 3, "rules": [
                {"name": "restart-only-the-failed-job", "action": "RestartJob"}]},
            "volumeClaimPolicies": [{"templates": [snapshots],
                                     "retentionPolicy": {"whenDeleted": "Retain"}}],
            "replicatedJobs": [worker_job(layout, s) for s in range(layout["stages"])]
            + [coordinator_job(layout, mounts)]}}


def jobset_policies(layout):
    def job(name):
        return {"jobset.sigs.k8s.io/replicatedjob-name": name}

    out = []
    for s in range(layout["stages"]):
        sources = [job("coordinator")] + ([job(f"stage-{s - 1}")] if s else [])
        peers = [job(f"stage-{s}")] if layout["replicas"] > 1 else []
        out.append(ingress_policy(
            f"localpar-stage-{s}",
            {"jobset.sigs.k8s.io/jobset-name": JOBSET, **job(f"stage-{s}")}, sources, peers))
    return out


def delete_patch(kind, api_version):
    """A kustomize patch that deletes the base's workload of `kind` (the JobSet replaces it)."""
    return yaml.dump({"$patch": "delete", "apiVersion": api_version, "kind": kind,
                      "metadata": {"name": "any"}}, Dumper=_Dumper, sort_keys=False).rstrip()


# kustomize does not know a JobSet: where its images and the names it refers to are.
JOBSET_KUSTOMIZECONFIG = """# Where kustomize's `images` finds the containers of a JobSet (a custom resource it does not
# know): under every replicated job's pod template.
images:
  - path: spec/replicatedJobs/template/spec/template/spec/containers/image
    kind: JobSet
# ...and the names its pod templates refer to, so that the job ConfigMap's generated name
# (with its content hash) and any name prefix reach them.
nameReference:
  - kind: ConfigMap
    version: v1
    fieldSpecs:
      - path: spec/replicatedJobs/template/spec/template/spec/volumes/configMap/name
        kind: JobSet
  - kind: PersistentVolumeClaim
    version: v1
    fieldSpecs:
      - path: spec/replicatedJobs/template/spec/template/spec/volumes/persistentVolumeClaim/claimName
        kind: JobSet
"""


def jobset_files(overlay, layout, mounts, data_files):
    added, data_extra = data_objects(layout, data_files) if mounts else ({}, {})
    extra = {"configurations": ["kustomizeconfig.yaml"], "patches": [
        {"target": {"kind": "StatefulSet", "name": "localpar-worker"},
         "patch": delete_patch("StatefulSet", "apps/v1")},
        {"target": {"kind": "Job", "name": "localpar-coordinator"},
         "patch": delete_patch("Job", "batch/v1")}]}
    return {
        **{name: dump(overlay, doc) for name, doc in added.items()},
        "kustomization.yaml": dump(overlay, kustomization(
            layout, ["../../base", "jobset.yaml", "networkpolicy-jobset.yaml", *added], extra,
            data_extra)),
        "jobset.yaml": dump(overlay, jobset(layout, mounts)),
        "kustomizeconfig.yaml": JOBSET_KUSTOMIZECONFIG,
        "networkpolicy-jobset.yaml": dump(overlay, *jobset_policies(layout)),
    }


def generate(directory, check):
    """Writes (or, with check, compares) one overlay's files; returns the stale ones."""
    overlay = os.path.relpath(os.path.abspath(directory), ROOT)
    layout = read_layout(os.path.join(directory, "layout.yaml"))
    job_text, data_files, mounts = job_data(overlay, layout)
    files = (statefulset_files if layout["workload"] == "statefulset" else jobset_files)(
        overlay, layout, mounts, data_files)
    files["job.textproto"] = job_text
    files.update(data_files)
    stale = []
    for name, content in files.items():
        path = os.path.join(directory, name)
        data = content.encode() if isinstance(content, str) else content
        if check:
            if not os.path.exists(path) or open(path, "rb").read() != data:
                stale.append(path)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
    return stale


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("overlays", nargs="*",
                   help="overlay directories (default: every k8s/overlays/* with a layout.yaml)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming each generated file that is out of date")
    a = p.parse_args()
    overlays = a.overlays or sorted(
        os.path.join(K8S, "overlays", d) for d in os.listdir(os.path.join(K8S, "overlays"))
        if os.path.isfile(os.path.join(K8S, "overlays", d, "layout.yaml")))
    stale = []
    for d in overlays:
        if not os.path.isfile(os.path.join(d, "layout.yaml")):
            print(f"generate.py: {d} has no layout.yaml", file=sys.stderr)
            return 2
        try:
            stale += generate(d, a.check)
        except LayoutError as e:
            print(f"generate.py: {e}", file=sys.stderr)
            return 2
    for path in stale:
        print(f"{os.path.relpath(path, ROOT)} is out of date: run k8s/generate.py")
    if not a.check:
        print(f"wrote {len(overlays)} overlay(s): "
              f"{', '.join(os.path.relpath(d, ROOT) for d in overlays)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
