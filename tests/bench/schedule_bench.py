#!/usr/bin/env python3
"""BACKPROP's pipeline schedules measured against theory, on emulated devices (root).

  sudo tests/bench/schedule_bench.py [BUILD_DIR] [--job=JOB] [--steps=30] [--batch_size=256]
      [--stages=2,4] [--micro_batches=4,8] [--out=DIR]

For each K stages, M micro-batches and schedule (gpipe, 1f1b, zb), one `deploy/testbed.py run`:
K workers, each on a device of its own (its own network namespace and CPU share, as the
testbed gives them), training JOB under BACKPROP for --steps steps. From the run's report it
prints, per stage:
  - the measured idle share: the worker's waits (for its input, for returned gradients, to
    hand its output on) over all its training time, from its phase figures;
  - theory's bubble with equal stages and free links: (K - 1) / (M + K - 1) for GPipe and
    1F1B; for ZB-H1 with a forward, an input-gradient and a weight-gradient pass of equal
    length (Qi et al.'s assumption) (K - 1) / (3M + K - 1), a third of 1F1B's idle time;
  - the worker's peak resident memory (VmHWM, the worker reads it from /proc/self/status),
    and its training state (parameters, gradients, optimizer moments); evaluation batches
    are made no larger than a micro-batch, so the peak is training's;
  - the measured seconds per training step (the slowest stage's phases, waits included,
    over the steps: the start and the final evaluation left out).
The schedules train the same weights, so only time and memory differ. Run it beside nothing
else; each run takes a few tens of seconds.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, SOURCE)
from experiments import jobs  # noqa: E402
from experiments.cli import int_list  # noqa: E402
PHASES = ("receive_wait", "forward", "backward", "gradient_wait", "update", "send_wait",
          "allreduce")
WAITS = ("receive_wait", "gradient_wait", "send_wait")


def bench_job(args, out):
    """JOB with evaluation batches no larger than the smallest micro-batch, on a few hundred
    examples: the workers' peak memory is then training's, not the final evaluation's."""
    job = jobs.normalized_job(os.path.join(args.build, "localpar"), args.job)
    job.eval_batch_size = max(1, args.batch_size // max(args.micro_batches))
    job.eval_limit = 256
    os.makedirs(out, exist_ok=True)
    return jobs.write_job(os.path.join(out, "job.textproto"), job)


def one_run(args, job, stages, micro, schedule, out):
    cmd = [sys.executable, os.path.join(SOURCE, "deploy", "testbed.py"), "run", job,
           f"--devices={stages}", f"--method={schedule}", f"--micro_batches={micro}",
           f"--batch_size={args.batch_size}", f"--max_steps={args.steps}",
           "--eval_every_steps=0", f"--out={out}",
           f"--localpar={os.path.join(args.build, 'localpar')}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"schedule_bench: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    with open(os.path.join(out, "run", "out", "report.json")) as f:
        return json.load(f)


def theory(stages, micro, schedule):
    if schedule == "zb":
        return (stages - 1) / (3 * micro + stages - 1)
    return (stages - 1) / (micro + stages - 1)


def stage_rows(report, stages, micro, schedule):
    rows = []
    # Training time per step: the slowest stage's phases (its waits included) over the steps.
    per_step = max(sum(s.get("phase_seconds", {}).get(k, 0.0) for k in PHASES)
                   for s in report["stage_reports"]) / max(1, report["steps"])
    for s in report["stage_reports"]:
        p = s.get("phase_seconds", {})
        total = sum(p.get(k, 0.0) for k in PHASES)
        idle = sum(p.get(k, 0.0) for k in WAITS) / total if total > 0 else float("nan")
        rows.append({"stage": s.get("stage", 0), "idle": idle,
                     "theory": theory(stages, micro, schedule),
                     "peak_mib": s.get("peak_resident_bytes", 0) / 2**20,
                     "state_mib": s.get("state_bytes", 0) / 2**20, "step_s": per_step})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(SOURCE, "build", "ci"))
    ap.add_argument("--job", default=os.path.join(SOURCE, "deploy", "jobs",
                                                  "fashion_resnet.textproto"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--stages", type=int_list, default=[2, 4])
    ap.add_argument("--micro_batches", type=int_list, default=[4, 8])
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary "
                    "folder, removed)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("schedule_bench: the testbed makes network namespaces and CPU quotas: run it "
                 "as root")
    out = args.out or tempfile.mkdtemp(prefix="schedule_bench.")
    job = bench_job(args, out)
    print(f"# {os.path.basename(args.job)}, BACKPROP, batch {args.batch_size}, {args.steps} "
          "steps a run, every worker on its own emulated device (measured)")
    print("| K | M | schedule | stage | idle share (measured) | bubble (theory) | "
          "peak resident MiB (measured) | training state MiB | s per step (measured) |")
    print("|---|---|---|---|---|---|---|---|---|")
    table = []
    for stages in args.stages:
        for micro in args.micro_batches:
            for schedule in ("gpipe", "1f1b", "zb"):
                run_dir = os.path.join(out, f"K{stages}-M{micro}-{schedule}")
                report = one_run(args, job, stages, micro, schedule, run_dir)
                for row in stage_rows(report, stages, micro, schedule):
                    row.update(K=stages, M=micro, schedule=schedule)
                    table.append(row)
                    print(f"| {stages} | {micro} | {schedule} | {row['stage']} | "
                          f"{row['idle']:.2f} | {row['theory']:.2f} | {row['peak_mib']:.0f} | "
                          f"{row['state_mib']:.1f} | {row['step_s']:.3f} |", flush=True)
    with open(os.path.join(out, "schedule_bench.json"), "w") as f:
        json.dump(table, f, indent=1)
    if not args.out:
        subprocess.run(["rm", "-rf", out])


if __name__ == "__main__":
    main()
