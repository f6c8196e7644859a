#!/usr/bin/env python3
"""Checks a rendered kustomize overlay (YAML on stdin) against what the programs do.

  kubectl kustomize k8s/overlays/cpu | python3 deploy/check_k8s_connections.py NAME

From the coordinator's own arguments (--workers, --replicas, --status_listen):
  - the coordinator runs to completion (a Job with restartPolicy OnFailure or Never), since a
    Deployment restarts a finished run for ever;
  - its status port is declared on its container and its Service, so `localpar status`
    can reach it;
  - every connection the programs make to a worker's gRPC port is admitted by the
    NetworkPolicies that select that worker's pod: the coordinator to every worker
    (Configure, statistics, GetWeights), and replica r of stage s to replica r of stage s+1.
Exits 1 naming each connection or object that fails.
"""
import sys

import yaml


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def admits(policies, pod_labels, peer_labels, port):
    """True when the policies selecting the pod (none: open) let the peer reach the port."""
    selecting = [p for p in policies if labels_match(p["spec"].get("podSelector", {}), pod_labels)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(q.get("port") == port for q in ports):
                continue
            sources = rule.get("from")
            if not sources:
                return True
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


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "overlay"
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    problems = []
    coordinators = [d for d in docs if d["metadata"]["name"] == "localpar-coordinator"
                    and d["kind"] in ("Job", "Deployment", "StatefulSet", "Pod")]
    if len(coordinators) != 1:
        print(f"{name}: expected one coordinator workload, found {len(coordinators)}")
        return 1
    coord = coordinators[0]
    template = coord["spec"]["template"]
    spec = template["spec"]
    if coord["kind"] != "Job" or spec.get("restartPolicy") not in ("OnFailure", "Never"):
        problems.append(f"the coordinator is a {coord['kind']} with restartPolicy "
                        f"{spec.get('restartPolicy', 'Always')}: a finished run would start again")
    container = spec["containers"][0]
    args = container.get("args", [])
    status = flag(args, "status_listen")
    declared = {p.get("containerPort") for p in container.get("ports", [])}
    if not status:
        problems.append("the coordinator has no --status_listen: `localpar status` cannot reach it")
    else:
        port = int(status.rsplit(":", 1)[1])
        if port not in declared:
            problems.append(f"the coordinator's status port {port} is not declared on its container")
        services = [d for d in docs if d["kind"] == "Service"
                    and labels_match({"matchLabels": d["spec"].get("selector", {})},
                                     template["metadata"]["labels"])]
        if not any(q.get("port") == port for s in services for q in s["spec"].get("ports", [])):
            problems.append(f"no Service of the coordinator exposes its status port {port}")
    workers = (flag(args, "workers", "") or "").split(",")
    replicas = int(flag(args, "replicas", "1") or 1)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    coord_labels = template["metadata"]["labels"]

    def pod_labels(address):
        host = address.rsplit(":", 1)[0]
        pod, _, service = host.partition(".")
        ordinal = pod.rsplit("-", 1)
        labels = dict(sets.get(ordinal[0], {}).get("spec", {}).get("template", {})
                      .get("metadata", {}).get("labels", {}))
        labels["statefulset.kubernetes.io/pod-name"] = pod
        return pod, labels, int(address.rsplit(":", 1)[1])

    checked = 0
    for i, w in enumerate(workers):
        pod, labels, port = pod_labels(w)
        checked += 1
        if not admits(policies, labels, coord_labels, port):
            problems.append(f"the coordinator cannot reach {pod}:{port} (the NetworkPolicies "
                            f"selecting {pod} do not admit it)")
        stage, replica = divmod(i, replicas)
        if stage > 0:
            up_pod, up_labels, _ = pod_labels(workers[(stage - 1) * replicas + replica])
            checked += 1
            if not admits(policies, labels, up_labels, port):
                problems.append(f"{up_pod} (stage {stage - 1}) cannot reach {pod}:{port} "
                                f"(stage {stage})")
    for p in problems:
        print(f"{name}: {p}")
    if problems:
        return 1
    print(f"{name}: {checked} connections to workers admitted; the coordinator is a Job with "
          f"its status port declared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
