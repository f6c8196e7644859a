#!/usr/bin/python3
"""deploy/check_container_flags.py finds our containers whatever the image is called: an
overlay renamed to a registry image (registry host, port, path and tag around "localpar"),
and one renamed to another name when --image or --layout names it. A file where it finds
none fails with the reason, never silently with "0 command lines checked".

usage: check_container_flags_test.py BUILD_DIR SOURCE_DIR
"""

import os
import subprocess
import sys
import tempfile

BUILD, SOURCE = sys.argv[1], sys.argv[2]
CHECK = os.path.join(SOURCE, "deploy", "check_container_flags.py")
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"  FAIL: {what}", flush=True)


def manifest(image, flag="--upstream_stall_s=60"):
    return f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: worker}}
spec:
  template:
    spec:
      containers:
      - name: worker
        image: {image}
        command: [localpar_worker]
        args: ["--listen=0.0.0.0:50051", "{flag}"]
"""


def run(*args):
    r = subprocess.run(["/usr/bin/python3", CHECK, BUILD, *args], capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout + r.stderr


with tempfile.TemporaryDirectory() as work:
    def write(name, text):
        path = os.path.join(work, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    registry = write("registry.yaml", manifest("registry.example.com:5000/team/localpar:1.2"))
    code, out = run(registry)
    check(code == 0 and "1 command lines checked, 0 refused" in out,
          f"a registry image named localpar is checked: exit {code}\n{out}")
    misspelt = write("misspelt.yaml", manifest("registry.example.com/localpar:1.2",
                                               "--upstream-stall-s=60"))
    code, out = run(misspelt)
    check(code == 1 and "refused" in out and "upstream-stall-s" in out,
          f"a misspelt flag in a registry image is refused: exit {code}\n{out}")

    renamed = write("renamed.yaml", manifest("myregistry/trainer:7"))
    code, out = run(renamed)
    check(code == 1 and "no container of our image (localpar) runs a localpar program" in out
          and "--layout=layout.yaml" in out,
          f"a file with none of our containers fails saying why: exit {code}\n{out}")
    code, out = run("--image=myregistry/trainer:7", renamed)
    check(code == 0 and "1 command lines checked" in out,
          f"--image names the overlay's image: exit {code}\n{out}")
    layout = write("layout.yaml", "stages: 2\nreplicas: 1\nimage: myregistry/trainer:7\n")
    code, out = run(f"--layout={layout}", renamed)
    check(code == 0 and "1 command lines checked" in out,
          f"--layout reads the overlay's image: exit {code}\n{out}")

if FAILURES:
    print(f"check_container_flags_test: {len(FAILURES)} failure(s)")
    sys.exit(1)
print("check_container_flags_test: ok")
