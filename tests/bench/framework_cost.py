#!/usr/bin/env python3
"""The framework's own cost: the CPU a cluster spends outside the layers' compute.

  tests/bench/framework_cost.py [BUILD_DIR] [--jobs=fashion_mlp,fashion_resnet,shakespeare_char]
      [--stages=2,4] [--steps=60] [--check]

For each shipped job (its own rule) and stage count K, one `localpar run JOB --stages=K
--max_steps=N --threads=1`, its evaluation cut to one small batch at the end. From the run's
report.json, per stage and per training step:
  - compute: the worker's compute thread's CPU inside the layers, heads and optimizer
    updates (timed around each of those actions with the thread's own CPU clock);
  - framework: the rest of the worker process's CPU over its training steps (its own CPU
    clock, all threads): receiving and decoding, encoding and sending, copies, queue
    hand-offs, gRPC's threads, metrics;
  - their ratio;
and the coordinator's CPU per step (its own CPU clock from the first step it fed: reading and
batching the data, sending, collecting the results). CPU time, not wall time, so the
figures hold on a busy machine too; with --threads=1 the layers compute on the compute
thread, so nothing of theirs is counted as the framework's.

--check (CI, on a short job): exits 1 unless every stage reports compute and framework CPU
and the coordinator its own, each positive and the framework's below the process's whole.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, SOURCE)
from experiments.cli import int_list  # noqa: E402
SHAKESPEARE = os.path.join(os.path.dirname(SOURCE), "shared", "data", "tinyshakespeare.txt")
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


def run_job(build, name, stages, steps, out):
    path = os.path.join(SOURCE, "deploy", "jobs", f"{name}.textproto")
    if not os.path.exists(path):
        sys.exit(f"framework_cost: no job {path}")
    with open(path) as f:
        text = f.read()
    job = os.path.join(out, f"{name}.textproto")
    with open(job, "w") as f:
        f.write(text + "\neval_limit: 64\n")  # one small evaluation at the end
    cmd = [os.path.join(build, "localpar"), "run", job, f"--stages={stages}",
           f"--max_steps={steps}", "--threads=1", "--quiet", f"--out={out}/{name}-K{stages}"]
    if name.startswith("shakespeare"):
        if not os.path.exists(SHAKESPEARE):
            return None
        cmd.append(f"--data_path={SHAKESPEARE}")
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if r.returncode != 0:
        sys.exit(f"framework_cost: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    with open(os.path.join(out, f"{name}-K{stages}", "report.json")) as f:
        return json.load(f)


def rows_of(report):
    steps = max(1, report.get("steps", 0))
    out = []
    for s in report.get("stage_reports", []):
        cpu, compute = s.get("cpu_seconds", 0.0), s.get("compute_cpu_seconds", 0.0)
        out.append({"stage": s.get("stage", 0), "compute_ms": 1e3 * compute / steps,
                    "framework_ms": 1e3 * (cpu - compute) / steps,
                    "ratio": (cpu - compute) / compute if compute > 0 else float("nan")})
    coordinator_ms = 1e3 * report.get("process_cpu_seconds", 0.0) / steps
    return out, coordinator_ms


def check(name, stages, rows, coordinator_ms):
    bad = []
    if len(rows) != stages:
        bad.append(f"{len(rows)} stage reports for {stages} stages")
    for r in rows:
        if not r["compute_ms"] > 0:
            bad.append(f"stage {r['stage']}: no compute CPU")
        if not r["framework_ms"] > 0:
            bad.append(f"stage {r['stage']}: framework CPU {r['framework_ms']:.3f} ms, not > 0")
    if not coordinator_ms > 0:
        bad.append("the coordinator reported no CPU")
    for b in bad:
        print(f"framework_cost: {name} K={stages}: {b}", file=sys.stderr)
    return not bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(SOURCE, "build", "ci"),
                    help="the build directory with localpar (default build/ci)")
    ap.add_argument("--jobs", default="fashion_mlp,fashion_resnet,shakespeare_char",
                    help="comma-separated jobs of deploy/jobs, without .textproto")
    ap.add_argument("--stages", type=int_list, default=[2, 4],
                    help="comma-separated stage counts of each cluster (default 2,4)")
    ap.add_argument("--steps", type=int, default=60,
                    help="training steps of each cluster (default 60)")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every figure is there")
    args = ap.parse_args()
    ok = True
    print("| job | K | stage | compute ms/step | framework ms/step | framework / compute |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="framework_cost.") as out:
        for name in args.jobs.split(","):
            for stages in args.stages:
                report = run_job(args.build, name, stages, args.steps, out)
                if report is None:
                    print(f"| {name} | {stages} | skipped: {SHAKESPEARE} is not here | | | |")
                    continue
                rows, coordinator_ms = rows_of(report)
                for r in rows:
                    print(f"| {name} | {stages} | {r['stage']} | {r['compute_ms']:.2f} | "
                          f"{r['framework_ms']:.2f} | {r['ratio']:.1%} |")
                print(f"| {name} | {stages} | coordinator | – | {coordinator_ms:.2f} | – |",
                      flush=True)
                if args.check:
                    ok = check(name, stages, rows, coordinator_ms) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
