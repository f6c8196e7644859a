#!/usr/bin/env python3
"""Checks a rendered kustomize overlay (YAML on stdin) against what the programs do.

  kubectl kustomize k8s/overlays/cpu | python3 deploy/check_k8s_connections.py NAME

The pods come from the workloads (a StatefulSet's ordinals, a JobSet's replicated jobs and
their Indexed pods, the coordinator's Job), with the labels Kubernetes and JobSet give them.
From the coordinator's own arguments (--workers, --replicas, --status_listen) it derives the
connections the programs make and checks, for each:
  - the address resolves: HOST.SUBDOMAIN names a pod of a StatefulSet whose headless Service
    is SUBDOMAIN, or of a JobSet with DNS hostnames on that subdomain;
  - the NetworkPolicies selecting the target pod admit it: the coordinator to every worker's
    gRPC port (Configure, statistics, GetWeights); replica r of stage s to replica r of stage
    s + 1; with replicas, every replica of a stage to the others on any port (their mesh
    listens on an ephemeral one) and to the coordinator's Rendezvous (its status port);
    Prometheus, from anywhere, to every metrics port;
and that:
  - the coordinator runs to completion (a Job, or a JobSet's replicated job, with
    restartPolicy OnFailure or Never): a Deployment restarts a finished run for ever;
  - a JobSet ends when its coordinator does (successPolicy on it), and a crashed worker
    restarts alone, in place (restartPolicy OnFailure or Always on workers);
  - the status port is declared on the coordinator's container and its Service;
  - every probe's port, every metrics port, every volume mount, claim and ConfigMap
    resolves;
  - --workers names every worker pod once, and K x R of them (K from --stages if given);
  - every file or folder the job reads (its data paths, from the job ConfigMap, defaults
    filled in, relative ones from the job file's folder) lies under a volume mounted in the
    coordinator, the one pod that reads data: a claim, or a ConfigMap holding that file.
Exits 1 naming each connection or object that fails.
"""
import os
import posixpath
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import jobs  # noqa: E402  (job files through protobuf's text format)
from experiments.common import Failure  # noqa: E402

EPHEMERAL = 40000  # a port the replicas' mesh might listen on


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def port_matches(rule_ports, port):
    if not rule_ports:
        return True
    for q in rule_ports:
        if q.get("port") is None:
            return True
        if q.get("port") == port or (q.get("endPort") and q["port"] <= port <= q["endPort"]):
            return True
    return False


def admits(policies, pod_labels, peer_labels, port):
    """True when the policies selecting the pod (none: open) let the peer reach the port;
    peer_labels None: a client outside the job (Prometheus), admitted only by a rule with no
    `from`."""
    selecting = [p for p in policies if labels_match(p["spec"].get("podSelector", {}), pod_labels)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            if not port_matches(rule.get("ports"), port):
                continue
            sources = rule.get("from")
            if not sources:
                return True
            if peer_labels is None:
                continue
            for src in sources:
                if "podSelector" in src and labels_match(src["podSelector"], peer_labels):
                    return True
    return False


def flag(args, name, default=None):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}":
            return ""
    return default


def port_of(listen):
    return int(listen.rsplit(":", 1)[1]) if listen else None


class Pod:
    def __init__(self, name, subdomain, labels, spec, owner):
        self.name, self.subdomain, self.labels, self.spec, self.owner = (
            name, subdomain, labels, spec, owner)
        self.container = spec["containers"][0]
        self.args = self.container.get("args", [])


def pods_of(docs, problems):
    """Every pod the workloads make, by hostname."""
    pods = {}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind == "StatefulSet":
            t = d["spec"]["template"]
            svc = d["spec"].get("serviceName")
            if svc not in services or services[svc]["spec"].get("clusterIP") != "None":
                problems.append(f"StatefulSet {name}: its serviceName {svc} is not a headless "
                                "Service here, so its pods' names do not resolve")
            for i in range(d["spec"].get("replicas", 1)):
                labels = dict(t["metadata"].get("labels", {}))
                labels["statefulset.kubernetes.io/pod-name"] = f"{name}-{i}"
                pods[f"{name}-{i}"] = Pod(f"{name}-{i}", svc, labels, t["spec"], d)
        elif kind == "Job":
            t = d["spec"]["template"]
            pods[name] = Pod(name, None, dict(t["metadata"].get("labels", {})), t["spec"], d)
        elif kind in ("Deployment", "Pod"):
            t = d["spec"]["template"] if kind == "Deployment" else d
            pods[name] = Pod(name, None, dict(t["metadata"].get("labels", {})), t["spec"], d)
        elif kind == "JobSet":
            net = d["spec"].get("network", {})
            sub = net.get("subdomain", name) if net.get("enableDNSHostnames") else None
            for rj in d["spec"]["replicatedJobs"]:
                job = rj["template"]["spec"]
                t = job["template"]
                indexed = job.get("completionMode") == "Indexed"
                for j in range(rj.get("replicas", 1)):
                    for p in range(job.get("parallelism", 1)):
                        labels = dict(t["metadata"].get("labels", {}))
                        labels.update({"jobset.sigs.k8s.io/jobset-name": name,
                                       "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                                       "jobset.sigs.k8s.io/job-index": str(j)})
                        if indexed:
                            labels["batch.kubernetes.io/job-completion-index"] = str(p)
                        host = f"{name}-{rj['name']}-{j}-{p}"
                        pods[host] = Pod(host, sub if indexed else None, labels, t["spec"],
                                         (d, rj))
    return pods


def check_resources(docs, pod, problems):
    """Probes, metrics port, volumes, claims and ConfigMaps of one pod resolve."""
    c = pod.container
    declared = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    numbers = set(declared.values())
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(probe_name)
        if not probe:
            continue
        for kind in ("grpc", "tcpSocket", "httpGet"):
            if kind in probe:
                port = probe[kind]["port"]
                if isinstance(port, str) and port not in declared:
                    problems.append(f"{pod.name}: {probe_name} names port '{port}', which the "
                                    "container does not declare")
                elif isinstance(port, int) and port not in numbers:
                    problems.append(f"{pod.name}: {probe_name} probes port {port}, which the "
                                    "container does not declare")
                if kind == "grpc" and isinstance(port, int):
                    listen = port_of(flag(pod.args, "listen"))
                    if listen and listen != port:
                        problems.append(f"{pod.name}: {probe_name} probes gRPC on {port}, but "
                                        f"the program listens on {listen}")
    metrics = port_of(flag(pod.args, "metrics_listen"))
    if metrics and declared.get("metrics") != metrics:
        problems.append(f"{pod.name}: --metrics_listen port {metrics} is not the container's "
                        "port named metrics")
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    owner = pod.owner
    if isinstance(owner, tuple):  # a JobSet's claims are added to the pods by its controller
        for policy in owner[0]["spec"].get("volumeClaimPolicies", []):
            for t in policy.get("templates", []):
                volumes.setdefault(t["metadata"]["name"], {"persistentVolumeClaim": {}})
    elif owner["kind"] == "StatefulSet":
        for t in owner["spec"].get("volumeClaimTemplates", []):
            volumes.setdefault(t["metadata"]["name"], {"persistentVolumeClaim": {}})
    for m in c.get("volumeMounts", []):
        if m["name"] not in volumes:
            problems.append(f"{pod.name}: volume mount '{m['name']}' has no volume")
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for v in volumes.values():
        claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and claim not in claims:
            problems.append(f"{pod.name}: claim {claim} is not in the overlay")
        cm = (v.get("configMap") or {}).get("name")
        if cm and cm not in maps:
            problems.append(f"{pod.name}: ConfigMap {cm} is not in the overlay")


def check_data(docs, coord, problems):
    """Every data path of the coordinator's job lies in a volume that can hold it."""
    job_file = flag(coord.args, "job")
    if not job_file:
        problems.append("the coordinator has no --job")
        return
    volumes = {v["name"]: v for v in coord.spec.get("volumes", [])}
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    mounts = coord.container.get("volumeMounts", [])

    def mount_of(path):
        """(mount, the rest of the path below it), the deepest mount holding `path`."""
        best = None
        for m in mounts:
            at = m["mountPath"].rstrip("/")
            if (path == at or path.startswith(at + "/")) and (
                    best is None or len(at) > len(best[0]["mountPath"].rstrip("/"))):
                best = (m, path[len(at):].lstrip("/"))
        return best

    def configmap_file(m, rest):
        """The ConfigMap file a path under mount `m` names, or None (not a ConfigMap)."""
        cm = (volumes.get(m["name"], {}).get("configMap") or {}).get("name")
        if cm is None:
            return None, None
        sub = m.get("subPath", "")
        key = posixpath.join(sub, rest) if sub and rest else (sub or rest)
        held = maps.get(cm, {})
        return cm, key if key in (held.get("data") or {}) or key in (
            held.get("binaryData") or {}) else ""

    found = mount_of(job_file)
    cm, key = configmap_file(*found) if found else (None, None)
    if not key:
        problems.append(f"the coordinator's --job={job_file} is in no ConfigMap it mounts")
        return
    text = maps[cm].get("data", {}).get(key)
    try:
        job = jobs.parse_job(text, f"ConfigMap {cm} {key}")
    except Failure as e:
        problems.append(f"the job does not parse: {e}")
        return
    for field, path, _ in jobs.data_paths(job):
        where = posixpath.normpath(posixpath.join(posixpath.dirname(job_file), path))
        what = f"the coordinator reads {field} at {where}"
        found = mount_of(where)
        if found is None:
            problems.append(f"{what}, which no volume of its pod mounts (mounts: "
                            f"{', '.join(m['mountPath'] for m in mounts)})")
            continue
        m, rest = found
        volume = volumes.get(m["name"], {})
        cm, key = configmap_file(m, rest)
        if cm is not None and not key:
            problems.append(f"{what}, in ConfigMap {cm}, which holds no such file")
        elif cm is None and "persistentVolumeClaim" not in volume:
            problems.append(f"{what}, on volume {m['name']}, which is neither a claim nor a "
                            "ConfigMap: nothing would be there")


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "overlay"
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    problems = []
    pods = pods_of(docs, problems)
    coordinators = [p for p in pods.values()
                    if p.labels.get("app.kubernetes.io/component") == "coordinator"]
    if len(coordinators) != 1:
        print(f"{name}: expected one coordinator pod, found {len(coordinators)}")
        return 1
    coord = coordinators[0]
    owner = coord.owner
    restart = coord.spec.get("restartPolicy", "Always")
    if isinstance(owner, tuple):
        jobset, rj = owner
        if restart not in ("OnFailure", "Never"):
            problems.append(f"the coordinator's pods have restartPolicy {restart}")
        success = jobset["spec"].get("successPolicy", {})
        if rj["name"] not in success.get("targetReplicatedJobs", []):
            problems.append("the JobSet's successPolicy does not target the coordinator: a "
                            "finished run would not end the JobSet")
    elif owner["kind"] != "Job" or restart not in ("OnFailure", "Never"):
        problems.append(f"the coordinator is a {owner['kind']} with restartPolicy {restart}: a "
                        "finished run would start again")
    args = coord.args
    status = port_of(flag(args, "status_listen"))
    coord_ports = {p.get("containerPort") for p in coord.container.get("ports", [])}
    if not status:
        problems.append("the coordinator has no --status_listen: `localpar status` cannot reach it")
    else:
        if status not in coord_ports:
            problems.append(f"the coordinator's status port {status} is not declared on its "
                            "container")
        services = [d for d in docs if d["kind"] == "Service"
                    and labels_match({"matchLabels": d["spec"].get("selector", {})}, coord.labels)]
        if not any(q.get("port") == status for s in services for q in s["spec"].get("ports", [])):
            problems.append(f"no Service of the coordinator exposes its status port {status}")
    workers = [w for w in (flag(args, "workers", "") or "").split(",") if w]
    replicas = int(flag(args, "replicas", "1") or 1)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]

    def resolve(address):
        host, port = address.rsplit(":", 1)
        pod_name, _, sub = host.partition(".")
        pod = pods.get(pod_name)
        if pod is None or pod.subdomain is None or (sub and sub != pod.subdomain):
            problems.append(f"--workers names {host}, which is no pod's DNS name here")
            return None, int(port)
        return pod, int(port)

    checked = 0

    def need(target, source_labels, port, what):
        nonlocal checked
        checked += 1
        if not admits(policies, target.labels, source_labels, port):
            problems.append(f"{what} cannot reach {target.name}:{port} (the NetworkPolicies "
                            f"selecting {target.name} do not admit it)")

    resolved = [resolve(w) for w in workers]
    # The layout: K x R addresses, every worker pod named once (a pod left out would sit
    # idle, and a StatefulSet or JobSet sized for another layout leaves pods out).
    stages = flag(args, "stages")
    if len(workers) % replicas:
        problems.append(f"--workers names {len(workers)} workers, not a multiple of --replicas "
                        f"{replicas}")
    elif stages and stages.isdigit() and len(workers) != int(stages) * replicas:
        problems.append(f"--workers names {len(workers)} workers, but --stages={stages} x "
                        f"--replicas={replicas} needs {int(stages) * replicas}")
    named = [p.name for p, _ in resolved if p is not None]
    for n in sorted({n for n in named if named.count(n) > 1}):
        problems.append(f"--workers names {n} more than once")
    for pod in pods.values():
        if (pod.labels.get("app.kubernetes.io/component") == "worker"
                and pod.name not in named):
            problems.append(f"worker pod {pod.name} is not in the coordinator's --workers: the "
                            "workload is sized for another layout")
    for i, (pod, port) in enumerate(resolved):
        if pod is None:
            continue
        listen = port_of(flag(pod.args, "listen"))
        if listen and listen != port:
            problems.append(f"--workers dials {pod.name}:{port}, but it listens on {listen}")
        if pod.spec.get("restartPolicy", "Always") not in ("Always", "OnFailure"):
            problems.append(f"{pod.name} has restartPolicy {pod.spec.get('restartPolicy')}: a "
                            "crashed worker would not restart in place")
        need(pod, coord.labels, port, "the coordinator")
        stage, replica = divmod(i, replicas)
        if stage > 0:
            up, _ = resolved[(stage - 1) * replicas + replica]
            if up is not None:
                need(pod, up.labels, port, f"{up.name} (stage {stage - 1})")
        for other in range(replicas):
            peer, _ = resolved[stage * replicas + other]
            if other != replica and peer is not None and replicas > 1:
                need(pod, peer.labels, EPHEMERAL, f"replica {other} of stage {stage} ({peer.name})")
        if replicas > 1 and status:
            need(coord, pod.labels, status, f"{pod.name} (the Rendezvous)")
    for pod in [coord] + [p for p, _ in resolved if p is not None]:
        metrics = port_of(flag(pod.args, "metrics_listen"))
        if metrics:
            need(pod, None, metrics, "Prometheus")
        check_resources(docs, pod, problems)
    check_data(docs, coord, problems)
    for p in problems:
        print(f"{name}: {p}")
    if problems:
        return 1
    print(f"{name}: {checked} connections admitted ({len(workers)} workers, replicas {replicas}); "
          "names, probes, ports, volumes resolve; the coordinator runs to completion and its "
          "volumes hold the job's data paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
