#!/usr/bin/env python3
"""Runs every localpar container's command line, as the deployment files give it, through
the program's own flag parser (`--check_flags`: parse and check as a run would, without
reading files or opening ports).

  python3 deploy/check_container_flags.py BIN_DIR [--image=NAME[:TAG]]... [--layout=FILE] FILE...

Each FILE is YAML: rendered Kubernetes manifests (`kubectl kustomize` output) or a Compose
project (`docker-compose config` output). A container's program and arguments follow the
image's ENTRYPOINT from deploy/Dockerfile, overridden as Kubernetes (command, args) or
Compose (entrypoint, command) override it; Kubernetes' $(VAR) references become 0.
Our containers are those of an image named localpar (any registry path and tag before and
after it), of each --image, and of the image a k8s/ layout.yaml names (--layout): an overlay
renamed to a registry image is checked too. Containers of other images, and of our image
running another program (the files pod's sleep), are left out. Exits 1 naming each container
whose flags are refused, with the program's message, and 1 with the reason when no container
of our image was found at all.
"""
import json
import os
import re
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))


def entrypoint():
    for line in open(os.path.join(HERE, "Dockerfile")):
        if line.strip().startswith("ENTRYPOINT"):
            return json.loads(line.strip()[len("ENTRYPOINT"):])
    raise SystemExit("deploy/Dockerfile has no ENTRYPOINT")


def pod_specs(doc):
    """(where, pod spec) for every pod template in a Kubernetes object."""
    kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
    spec = doc.get("spec") or {}
    if kind == "Pod":
        yield f"Pod {name}", spec
    elif kind in ("Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"):
        yield f"{kind} {name}", spec["template"]["spec"]
    elif kind == "JobSet":
        for rj in spec.get("replicatedJobs", []):
            yield f"JobSet {name}/{rj['name']}", rj["template"]["spec"]["template"]["spec"]


def repository(image):
    """The image's name without registry host, path, tag or digest: "localpar" for
    "registry.example.com:5000/team/localpar:1.2"."""
    name = str(image).split("@")[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":")[0]


def ours(image, names):
    """Whether a container of `image` runs our programs: named localpar, or one of `names`
    (NAME:TAG exactly, or NAME with any tag)."""
    image = str(image)
    return (repository(image) == "localpar" or image in names
            or image.rsplit(":", 1)[0] in names)


def command_lines(doc, image_entrypoint, names=()):
    """(where, argv) for every container of our image in one YAML document."""
    if "services" in doc and "kind" not in doc:  # a Compose project
        for name, svc in doc["services"].items():
            if not ours(svc.get("image", ""), names):
                continue
            ep = svc.get("entrypoint")
            ep = ep.split() if isinstance(ep, str) else ep
            cmd = svc.get("command") or []
            cmd = cmd.split() if isinstance(cmd, str) else cmd
            yield f"compose service {name}", (ep if ep else image_entrypoint) + list(cmd)
        return
    for where, spec in pod_specs(doc):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if not ours(c.get("image", ""), names):
                continue
            argv = (c["command"] if c.get("command") else image_entrypoint) + c.get("args", [])
            argv = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", "0", a) for a in argv]
            yield f"{where} container {c['name']}", argv


def main():
    names, files = set(), []
    for arg in sys.argv[2:]:
        if arg.startswith("--image="):
            names.add(arg[len("--image="):])
        elif arg.startswith("--layout="):
            layout = yaml.safe_load(open(arg[len("--layout="):])) or {}
            if not isinstance(layout, dict) or not layout.get("image"):
                print(f"{arg[len('--layout='):]}: names no image")
                return 2
            names.add(str(layout["image"]))
        else:
            files.append(arg)
    if len(sys.argv) < 3 or not files:
        print(__doc__)
        return 2
    bin_dir = sys.argv[1]
    image_entrypoint = entrypoint()
    failures = checked = 0
    for path in files:
        for doc in yaml.safe_load_all(open(path)):
            if not doc:
                continue
            for where, argv in command_lines(doc, image_entrypoint, names):
                program = argv[0]
                if not program.startswith("localpar_"):
                    continue
                binary = os.path.join(bin_dir, program)
                if not os.access(binary, os.X_OK):
                    print(f"{path}: {where}: no program {binary} (build first, or set "
                          "LOCALPAR_BIN_DIR)")
                    failures += 1
                    continue
                r = subprocess.run([binary, "--check_flags"] + argv[1:], capture_output=True,
                                   text=True, timeout=30)
                checked += 1
                if r.returncode != 0 or "flags ok" not in r.stdout:
                    print(f"{path}: {where}: {' '.join(argv)}\n  refused (exit {r.returncode}): "
                          f"{(r.stderr or r.stdout).strip()}")
                    failures += 1
    print(f"check_container_flags: {checked} command lines checked, {failures} refused")
    if checked == 0:
        known = ", ".join(sorted(names | {"localpar"}))
        print(f"check_container_flags: no container of our image ({known}) runs a localpar "
              "program in these files: name the image with --image=NAME or --layout=layout.yaml")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
