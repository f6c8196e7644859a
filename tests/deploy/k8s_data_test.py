#!/usr/bin/python3
"""The connection check against a job whose data the coordinator's pod does not hold.

Renders the shipped shakespeare overlay (the corpus on the localpar-data claim) and a
ConfigMap layout generated in a copy (a small corpus served from the overlay), and checks that
deploy/check_k8s_connections.py passes both as rendered, then fails, naming the field and the
path, on each of: the coordinator's data mount removed, the job's data path left relative to
the job file (as it is in deploy/jobs), and the ConfigMap without the file.

Usage: k8s_data_test.py SOURCE_DIR (needs kubectl for kustomize)
"""
import copy
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

SOURCE = os.path.abspath(sys.argv[1])
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


def render(overlay):
    return [d for d in yaml.safe_load_all(subprocess.run(
        ["kubectl", "kustomize", overlay], capture_output=True, text=True, check=True).stdout) if d]


def connections(docs):
    return subprocess.run(
        ["/usr/bin/python3", os.path.join(SOURCE, "deploy", "check_k8s_connections.py"), "t"],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True)


def coordinator(docs):
    jobset = next(d for d in docs if d["kind"] == "JobSet")
    rj = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "coordinator")
    return rj["template"]["spec"]["template"]["spec"]


def job_map(docs):
    return next(d for d in docs if d["kind"] == "ConfigMap"
                and d["metadata"]["name"].startswith("localpar-job"))


def expect(docs, what, said):
    r = connections(docs)
    check(r.returncode == 1 and said in r.stdout, f"{what}: exit {r.returncode}, {r.stdout!r} "
          f"(want {said!r})")
    if r.returncode == 1:
        print(f"k8s_data_test: {what}: refused: {r.stdout.strip().splitlines()[0]}")


def main():
    docs = render(os.path.join(SOURCE, "k8s", "overlays", "shakespeare"))
    r = connections(docs)
    check(r.returncode == 0, f"the shakespeare overlay as rendered: {r.stdout}")
    # No data mount in the coordinator.
    gone = copy.deepcopy(docs)
    pod = coordinator(gone)
    pod["containers"][0]["volumeMounts"] = [
        m for m in pod["containers"][0]["volumeMounts"] if m["name"] != "data"]
    expect(gone, "the data mount removed",
           "reads data.text.paths[0] at /data/tinyshakespeare.txt, which no volume of its pod "
           "mounts")
    # The job's path as deploy/jobs has it: relative to the job file, so under the job's
    # ConfigMap, which has no such file.
    relative = copy.deepcopy(docs)
    cm = job_map(relative)
    cm["data"]["job.textproto"] = cm["data"]["job.textproto"].replace(
        '"/data/tinyshakespeare.txt"', '"tinyshakespeare.txt"')
    expect(relative, "a data path relative to the job file",
           "reads data.text.paths[0] at /etc/localpar/job/tinyshakespeare.txt, in ConfigMap "
           f"{cm['metadata']['name']}, which holds no such file")
    # A ConfigMap of small files, generated in a copy: passes; without the file, refused.
    with tempfile.TemporaryDirectory(prefix="localpar_k8s_data.") as root:
        for d in ("k8s", "experiments", "proto"):
            shutil.copytree(os.path.join(SOURCE, d), os.path.join(root, d))
        os.makedirs(os.path.join(root, "deploy", "jobs"))
        with open(os.path.join(root, "deploy", "jobs", "small.txt"), "w") as f:
            f.write("to be or not to be\n" * 500)
        with open(os.path.join(root, "deploy", "jobs", "small.textproto"), "w") as f:
            f.write('name: "small" rule: GREEDY data { text { paths: "small.txt" seq_len: 16 } }\n'
                    'stages { layers { embedding { vocab: 256 dim: 8 } } '
                    'head { kind: LANGUAGE_MODEL } }\n')
        overlay = os.path.join(root, "k8s", "overlays", "shakespeare")
        with open(os.path.join(overlay, "layout.yaml"), "w") as f:
            yaml.safe_dump({"workload": "jobset", "stages": 1, "replicas": 1, "regroup": False,
                            "job": "deploy/jobs/small.textproto", "image": "localpar:cpu",
                            "device": "cpu", "data": {"configmap": "localpar-small"}}, f)
        g = subprocess.run(["/usr/bin/python3", os.path.join(root, "k8s", "generate.py"), overlay],
                           capture_output=True, text=True)
        check(g.returncode == 0, f"generating the ConfigMap layout: {g.stderr}")
        if g.returncode == 0:
            small = render(overlay)
            r = connections(small)
            check(r.returncode == 0, f"the ConfigMap layout as rendered: {r.stdout}")
            held = next(d for d in small if d["kind"] == "ConfigMap"
                        and d["metadata"]["name"].startswith("localpar-small"))
            check(held["data"].get("small.txt") == "to be or not to be\n" * 500,
                  "the ConfigMap does not hold the corpus as the job file's folder has it")
            del held["data"]["small.txt"]
            expect(small, "the ConfigMap without the file",
                   f"reads data.text.paths[0] at /data/small.txt, in ConfigMap "
                   f"{held['metadata']['name']}, which holds no such file")
    print("k8s_data_test: " + ("ok" if not FAILURES else f"{len(FAILURES)} failed"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
