#!/usr/bin/env python3
"""Bytes each replica sends the others per training step, measured on a local cluster
(`localpar run`, report.json's stage_reports), for the per-step gradient exchange and for
replicas that synchronise every H steps (DiLoCo, --sync_every=H), with float32 or bfloat16
pseudo-gradients (--sync_bf16).

  /usr/bin/python3 tests/bench/replica_bytes.py [BUILD_DIR] [--steps N] [--check]

fortunes_charlm8 as 2 CHUNKED stages, R = 2 and 4 replicas of each (a share of 16 rows per
replica), H = 1, 10, 50 and 100, and H = 10, 50 and 100 in bfloat16. Prints one row per
(R, H): the bytes replica 0 of each stage sent per step, and their ratio to H = 1's.
Expected: 2 (R - 1) / R x the stage's bucket per exchange (the mesh's reduce-scatter and
all-gather), one exchange every step at H = 1 and ceil(steps / H) (the last step
synchronises too) at H > 1, half of that in bfloat16 (this model has no running
statistics). --check fails (exit 1) when a ratio differs from that by more than 1%.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "deploy/jobs/fortunes_charlm8.textproto")


def run(localpar, out, replicas, sync_every, steps, bf16=False):
    cmd = [localpar, "run", JOB, "--quiet", "--rule=CHUNKED", "--stages=2",
           f"--replicas={replicas}", f"--batch_size={16 * replicas}", f"--max_steps={steps}",
           f"--out={out}"]
    if sync_every > 1:
        cmd.append(f"--sync_every={sync_every}")
    if bf16:
        cmd.append("--sync_bf16")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"replica_bytes: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stdout}")
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    return [s["replica_exchange_bytes_sent"] for s in report["stage_reports"]]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build", nargs="?", default=os.path.join(ROOT, "build/ci"))
    p.add_argument("--steps", type=int, default=200, help="training steps of each run")
    p.add_argument("--check", action="store_true", help="fail if a ratio is off by > 1%%")
    args = p.parse_args()
    localpar = os.path.join(args.build, "localpar")
    bad = []
    print("| replicas | H | stage 0 bytes/step | stage 1 bytes/step | ratio to H = 1 "
          "| expected |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in (2, 4):
            base = None
            for h, bf16 in ((1, False), (10, False), (50, False), (100, False), (10, True),
                            (50, True), (100, True)):
                sent = run(localpar, os.path.join(tmp, f"r{replicas}h{h}{bf16}"), replicas, h,
                           args.steps, bf16)
                per_step = [s[0] / args.steps for s in sent]
                if base is None:
                    base = per_step
                ratio = per_step[0] / base[0]
                expected = 1.0 if h == 1 else math.ceil(args.steps / h) / args.steps
                expected *= 0.5 if bf16 else 1.0
                if abs(ratio - expected) > 0.01 * expected or \
                        abs(per_step[1] / base[1] - expected) > 0.01 * expected:
                    bad.append(f"R={replicas} H={h}: ratio {ratio:.4f}, expected {expected:.4f}")
                print(f"| {replicas} | {h}{' bf16' if bf16 else ''} | {per_step[0]:,.0f} | {per_step[1]:,.0f} | "
                      f"{ratio:.4f} | {expected:.4f} |", flush=True)
    if args.check and bad:
        sys.exit("replica_bytes: " + "; ".join(bad))


if __name__ == "__main__":
    main()
