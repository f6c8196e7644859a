#!/usr/bin/python3
"""k8s/generate.py against layouts a careless or hostile edit could write: each is refused
(exit 2) naming its key, and nothing of it reaches the overlay; a registry image with a host,
port and path goes through as data. Runs on a copy of k8s/ and deploy/jobs/.

Usage: k8s_generate_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

SOURCE = os.path.abspath(sys.argv[1])
FAILURES = []

GOOD = {"workload": "jobset", "stages": 2, "replicas": 2, "regroup": True,
        "job": "deploy/jobs/fashion_mlp.textproto", "image": "localpar:cpu", "device": "cpu"}


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


def generate(root, text):
    overlay = os.path.join(root, "k8s", "overlays", "jobset")
    with open(os.path.join(overlay, "layout.yaml"), "w") as f:
        f.write(text)
    return subprocess.run([sys.executable, os.path.join(root, "k8s", "generate.py"), overlay],
                          capture_output=True, text=True)


def layout(**changes):
    return yaml.safe_dump({**GOOD, **changes}, sort_keys=False)


def main():
    with tempfile.TemporaryDirectory(prefix="localpar_k8s_gen.") as root:
        shutil.copytree(os.path.join(SOURCE, "k8s"), os.path.join(root, "k8s"))
        shutil.copytree(os.path.join(SOURCE, "deploy", "jobs"),
                        os.path.join(root, "deploy", "jobs"))
        for d in ("experiments", "proto"):  # the generator reads jobs with proto/job.proto
            shutil.copytree(os.path.join(SOURCE, d), os.path.join(root, d))
        os.symlink("/etc/hostname", os.path.join(root, "deploy", "jobs", "escape.textproto"))
        with open(os.path.join(root, "deploy", "jobs", "big_corpus.textproto"), "w") as f:
            big = os.path.join(root, "big.txt")
            with open(big, "w") as b:
                b.write("to be or not to be\n" * 60000)  # 1.1 MB
            f.write(f'rule: GREEDY data {{ text {{ paths: "{big}" }} }}\n'
                    'stages { layers { embedding { vocab: 256 dim: 8 } } }\n')
        kust = os.path.join(root, "k8s", "overlays", "jobset", "kustomization.yaml")
        before = open(kust).read()
        cases = [
            ("image with YAML flow syntax",
             layout(image="a, newTag: x}, {name: other, newName: evil:1"), "image"),
            ("image with a newline", layout(image="localpar:cpu\nnewTag: evil"), "image"),
            ("image without a tag", layout(image="localpar"), "image"),
            ("job climbing out", layout(job="../../../../etc/hostname"), "outside the repository"),
            ("job absolute", layout(job="/etc/hostname"), "job must be a path relative"),
            ("job through a link out", layout(job="deploy/jobs/escape.textproto"),
             "outside the repository"),
            ("a million pods", layout(stages=1024, replicas=1024), "at most 256"),
            ("a key twice", layout() + "stages: 3\n", "stages is given twice"),
            ("an unknown key", layout() + "stage: 3\n", "stage: not a key"),
            ("regroup as text", layout(regroup="yes please"), "regroup must be true or false"),
            ("stages as text", layout(stages="4"), "stages must be a whole number"),
            ("not a mapping", "- a\n- b\n", "a mapping of"),
            ("not YAML", "stages: [\n", "not YAML"),
            ("a key missing", yaml.safe_dump({k: v for k, v in GOOD.items() if k != "image"}),
             "missing image"),
            ("data from a claim and a ConfigMap", layout(data={"claim": "a", "configmap": "b"}),
             "data needs one of claim"),
            ("data mounted over the checkpoints", layout(data={"claim": "a",
                                                               "path": "/checkpoints/x"}),
             "overlaps /checkpoints"),
            ("a claim named in YAML", layout(data={"claim": "a: {b"}),
             "data.claim must be a Kubernetes name"),
            ("a claim sized in apples", layout(data={"claim": "a", "size": "3 apples"}),
             "data.size is a claim's size"),
            ("a data path up and out", layout(data={"claim": "a", "path": "/data/../etc"}),
             "data.path must be an absolute path"),
            ("an unknown data key", layout(data={"claim": "a", "mount": "/x"}),
             "data.mount: not a key"),
            ("a corpus over a ConfigMap's 1 MiB",
             layout(job="deploy/jobs/big_corpus.textproto", data={"configmap": "corpus"}),
             "over the 1000000 a ConfigMap holds"),
            ("a folder in a ConfigMap", layout(data={"configmap": "images"}),
             "a ConfigMap holds files"),
        ]
        for what, text, said in cases:
            r = generate(root, text)
            check(r.returncode == 2 and said in r.stderr,
                  f"{what}: exit {r.returncode}, {r.stderr.strip()!r} (want {said!r})")
            check(open(kust).read() == before, f"{what}: the overlay was written")
        # A registry image with a host, a port and a path is data in the kustomization.
        r = generate(root, layout(image="registry.example.com:5000/team/localpar:v1.2-cpu"))
        check(r.returncode == 0, f"a registry image: {r.stderr}")
        images = yaml.safe_load(open(kust).read())["images"]
        check(images == [{"name": "localpar", "newName": "registry.example.com:5000/team/localpar",
                          "newTag": "v1.2-cpu"}], f"images: {images}")
        # --check finds the overlay out of date against the shipped layout.
        r = generate(root, layout(stages=3))
        check(r.returncode == 0, "stages: 3")
        shutil.copy(os.path.join(SOURCE, "k8s", "overlays", "jobset", "layout.yaml"),
                    os.path.join(root, "k8s", "overlays", "jobset", "layout.yaml"))
        r = subprocess.run([sys.executable, os.path.join(root, "k8s", "generate.py"), "--check"],
                           capture_output=True, text=True)
        check(r.returncode == 1 and "jobset.yaml is out of date" in r.stdout,
              f"--check: {r.returncode} {r.stdout}")
    print("k8s_generate_test: " + ("ok" if not FAILURES else f"{len(FAILURES)} failed"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
