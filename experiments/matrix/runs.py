"""One run of an experiment matrix: its configuration (the cache key's contents), training
it (`localpar run`, or `localpar train` for the reference trainer) and reading it back."""

import csv
import dataclasses
import json
import math
import os
import subprocess
from typing import Optional

from experiments.common import fail, say
from experiments.frontier.model import training_flops_per_example
from experiments.jobs import job_hash

CACHED = ("report.json", "curve.csv")
USAGE = "usage.json"  # the run's CPU seconds (kept beside, optional: older entries lack it)


@dataclasses.dataclass
class Run:
    model: object  # spec.Model
    arm: object  # spec.Arm
    seed: int
    lr: Optional[float]  # the peak learning rate passed as --lr (None: the job's)
    id: str
    dir: str

    @property
    def job(self):
        return self.arm.job or self.model.job


def run_id(model, arm, seed, lr=None):
    tag = f"-lr{lr:g}" if lr is not None else ""
    return f"{model.name}-{arm.name.replace('/', '-')}{tag}-seed{seed}"


def run_config(spec, run):
    """Every setting that changes a run's result, for the cache."""
    m = run.model
    return {"job": os.path.basename(run.job), "job_hash": job_hash(run.job),
            "rule": run.arm.rule, "stages": run.arm.stages or 0, "seed": run.seed,
            "epochs": m.epochs or 0, "max_steps": m.max_steps or 0,
            "threads": spec.threads, "device": spec.device, "trainer": spec.trainer,
            **({"lr": run.lr} if run.lr is not None else {}),
            # Set only where a spec sets them, so that earlier cached runs still match.
            **{k: v for k, v in (("batch_size", m.batch_size), ("replicas", m.replicas),
                                 ("sync_every", run.arm.sync_every),
                                 ("sync_bf16", run.arm.sync_bf16 or None)) if v is not None}}


def from_cache(cache, run, config):
    """Writes a cached run with this configuration into its run directory; whether there
    was one."""
    entry = cache.get("run", run.id) if cache else None
    if entry is None or entry.get("config") != config:
        return False
    os.makedirs(run.dir, exist_ok=True)
    with open(os.path.join(run.dir, "report.json"), "w") as f:
        json.dump(entry["report"], f, indent=1)
    with open(os.path.join(run.dir, "curve.csv"), "w", newline="") as f:
        f.write(entry["curve_csv"])
    if "cpu_seconds" in entry:
        with open(os.path.join(run.dir, USAGE), "w") as f:
            json.dump({"cpu_seconds": entry["cpu_seconds"]}, f)
    return True


def is_done(args, cache, spec, run):
    if from_cache(cache, run, run_config(spec, run)):
        return True
    return args.reuse and all(os.path.exists(os.path.join(run.dir, f)) for f in CACHED)


def command(args, spec, run):
    verb = "train" if spec.trainer == "reference" else "run"
    cmd = [args.localpar, verb, run.job, f"--rule={run.arm.rule}", f"--seed={run.seed}",
           f"--out={run.dir}", f"--threads={spec.threads}", f"--device={spec.device}"]
    if run.arm.stages is not None:
        cmd.append(f"--stages={run.arm.stages}")
    if run.lr is not None:
        cmd.append(f"--lr={run.lr:.6g}")
    if run.arm.sync_every is not None:
        cmd.append(f"--sync_every={run.arm.sync_every}")
    if run.arm.sync_bf16:
        cmd.append("--sync_bf16")
    return cmd + run.model.budget_flags()


def run_one(args, cache, spec, run):
    """Trains `run` unless it is done (cached, or with --reuse in its directory); keeps its
    report, training curve and CPU time in its directory and in the cache."""
    config = run_config(spec, run)
    if is_done(args, cache, spec, run):
        say(f"  {run.id}: done before, read back")
        return
    os.makedirs(run.dir, exist_ok=True)
    cmd = command(args, spec, run)
    metrics_path = os.path.join(run.dir, "metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)  # a run appends to it: start this one afresh
    with open(os.path.join(run.dir, "run.log"), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if args.verbose or line.startswith("epoch") and " accuracy" in line:
                say(f"    {run.id}: {line.rstrip()}")
        # Reaped here rather than by proc.wait(), for the run's own CPU time (its wall time
        # says little when runs share the machine).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
    cpu = round(usage.ru_utime + usage.ru_stime, 2)
    with open(os.path.join(run.dir, USAGE), "w") as f:
        json.dump({"cpu_seconds": cpu}, f)
    if code != 0:
        fail(f"run failed (exit {code}): {' '.join(cmd)}; see {run.dir}/run.log")
    # The training curve: every stage's loss over the epoch so far, from metrics.jsonl.
    with open(os.path.join(run.dir, "curve.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "stage", "train_loss"])
        with open(metrics_path) as m:
            for line in m:
                point = json.loads(line)
                if point["kind"] in ("train", "epoch") and point["loss"] is not None:
                    w.writerow([f"{point['wall_seconds']:.2f}", point["stage"], point["loss"]])
    if cache:
        with open(os.path.join(run.dir, "report.json")) as f:
            report = json.load(f)
        with open(os.path.join(run.dir, "curve.csv")) as f:
            curve = f.read()
        cache.put("run", run.id, {"config": config, "report": report, "curve_csv": curve,
                                  "cpu_seconds": cpu})


def flops_per_example(args, cache, run, stages):
    """Training FLOPs one example of `run` costs with `stages` stages: 3 x the forward FLOPs
    `localpar project` counts from the shapes, of every layer and of the heads its rule
    trains (every stage's under a local rule, the last one's under BACKPROP, whose side
    heads are detached probes), as the frontier counts them. Kept in the cache by the job
    and stage count."""
    key = f"{job_hash(run.job)}-K{stages}"
    entry = cache.get("flops", key) if cache else None
    if entry is None:
        cmd = [args.localpar, "project", run.job, "--json", f"--stages={stages}",
               "--project_stages=1"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"{' '.join(cmd)} failed (exit {out.returncode}): {out.stderr.strip()}")
        entry = {"stages": [{k: s[k] for k in ("forward_flops", "head_forward_flops")}
                            for s in json.loads(out.stdout)["stages"]]}
        if cache:
            cache.put("flops", key, entry)
    return training_flops_per_example(
        entry["stages"], "data_parallel" if run.arm.rule == "BACKPROP" else "local")


def cpu_seconds(run_dir, wall):
    """A run's CPU seconds where they were recorded, else its wall time."""
    path = os.path.join(run_dir, USAGE)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["cpu_seconds"], True
    return wall, False


def read_run(run_dir):
    """A finished run's report and its training curve: (seconds, stage, loss) in order."""
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    curve = []
    with open(os.path.join(run_dir, "curve.csv")) as f:
        for row in csv.DictReader(f):
            if float(row["train_loss"]) != 0:  # logs written before idle lines were dropped
                curve.append((float(row["seconds"]), int(row["stage"]), float(row["train_loss"])))
    # Each epoch's mean training loss at its end as well, so short runs still have a curve.
    elapsed = 0.0
    for e in report["epochs"]:
        elapsed += e["seconds"]
        for k, s in enumerate(e["train"]):
            curve.append((elapsed, k, s["loss"]))
    curve.sort()
    return report, curve


def sequential_steps(rule, stages, steps):
    """Dependent stage computations on the critical path of `steps` updates.

    BACKPROP: every batch goes forward through all stages and back before its update.
    GREEDY and CHUNKED: stages work on different batches at once, so after the pipeline
    fills, one stage step per batch. OVERLAP: the same plus the gradient returned one
    stage back, so one extra stage of latency per batch.
    """
    if rule == "BACKPROP":
        return steps * 2 * stages
    if rule == "OVERLAP":
        return 2 * steps + 2 * (stages - 1)
    return steps + stages - 1


def metric_of(stat, text):
    """The test metric of one head: accuracy, or bits per byte for language models."""
    return stat["loss"] / math.log(2) if text else stat["accuracy"]


def held_out(figures):
    """An epoch's held-out figures: its test split's, or its validation split's (reports
    name the split they scored)."""
    return figures.get("test") or figures.get("validation") or []
