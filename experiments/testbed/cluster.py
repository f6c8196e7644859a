"""One run of a real cluster on a testbed: a `localpar_worker` on each device and the
`localpar_coordinator` on its own, over the emulated links; stopped once the strictest
target has held, measured by the wall clock."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from typing import Optional

from experiments.common import fail
from experiments.frontier.model import first_reaching
from experiments.frontier.runs import EvalPoints

WORKER_PORT = 50051
STATUS_PORT = 50052


@dataclasses.dataclass
class Config:
    """What a testbed run trains: every field is part of its cache key."""
    job: str  # the job file (already derived: schedule, micro-batches)
    job_hash: str
    method: str
    rule: str
    stages: int
    replicas: int
    batch: int
    lr: float
    seed: int
    max_steps: int
    eval_every_steps: int
    hold: int
    strictest: Optional[float]  # stop once held (None: run to max_steps)
    text: bool  # bits per byte (lower is better), else accuracy
    devices: int
    link_mbit: float
    worker_cpu: Optional[float]
    coordinator_cpu: float
    threads: int = 1
    # How a stage's replicas exchange gradients: "reduce_scatter" (each sends 2 (R - 1) / R of
    # the bucket) for runs with replicas measured since it replaced the gather; None for runs
    # without replicas, and in runs cached before (the gather, (R - 1) x).
    exchange: Optional[str] = None
    # Replicas that synchronise every this many steps (DiLoCo; the job says so too).
    sync_every: Optional[int] = None

    def key(self):
        """The fields as cached: `exchange` and `sync_every` only where they are set, so that
        runs cached before they existed keep their keys."""
        return {k: v for k, v in self.__dict__.items()
                if not (k in ("exchange", "sync_every") and v is None)}


def coordinator_argv(localpar_dir, cfg, bed, out_dir):
    workers = ",".join(f"{d.ip}:{WORKER_PORT}" for d in bed.devices if d.name != "coordinator")
    c = bed.device("coordinator")
    return [os.path.join(localpar_dir, "localpar_coordinator"), f"--job={cfg.job}",
            f"--workers={workers}", f"--rule={cfg.rule}", f"--stages={cfg.stages}",
            f"--replicas={cfg.replicas}", f"--batch_size={cfg.batch}", f"--lr={cfg.lr:.6g}",
            f"--seed={cfg.seed}", f"--max_steps={cfg.max_steps}", "--epochs=1000",
            f"--eval_every_steps={cfg.eval_every_steps}", f"--out={out_dir}", "--quiet",
            f"--status_listen={c.ip}:{STATUS_PORT}", f"--advertise={c.ip}:{STATUS_PORT}",
            "--metrics_listen="]


def worker_argv(localpar_dir, cfg, device, run_dir):
    return [os.path.join(localpar_dir, "localpar_worker"), f"--listen={device.ip}:{WORKER_PORT}",
            f"--port_file={run_dir}/{device.name}.port", "--metrics_listen=",
            f"--threads={cfg.threads}", "--device=cpu"]


def wait_for_ports(run_dir, devices, procs, timeout=30):
    deadline = time.monotonic() + timeout
    for d in devices:
        path = os.path.join(run_dir, f"{d.name}.port")
        while not os.path.exists(path):
            for p in procs:
                if p.poll() is not None:
                    fail(f"a worker exited (code {p.returncode}) before serving; see {run_dir}")
            if time.monotonic() > deadline:
                fail(f"{d.name} did not serve within {timeout} s; see {run_dir}")
            time.sleep(0.05)


def run(localpar_dir, cfg, bed, run_dir, max_seconds=None, drain_seconds=None):
    """Trains `cfg` on the testbed `bed` (cfg.stages x cfg.replicas devices), stopped once the
    strictest target has held (or after `max_seconds`). Returns the measurement: the wall
    seconds, every evaluation with the wall time it was written at, the report's training
    throughput and steps, and how the run ended.
    A stopped coordinator first finishes every step already fed, which on a slow link is
    minutes of steps nobody reads. `drain_seconds` set, it gets that long after the stop and
    is then killed (no weights, report or further evaluations; `drained` is False)."""
    workers = [d for d in bed.devices if d.name != "coordinator"]
    if len(workers) != cfg.stages * cfg.replicas:
        fail(f"{cfg.method}: {cfg.stages} x {cfg.replicas} workers on {len(workers)} devices")
    os.makedirs(run_dir, exist_ok=True)
    out_dir = os.path.join(run_dir, "out")
    # A run measured again (data parallelism after its exchange changed) starts afresh: the
    # coordinator appends to metrics.jsonl, and the earlier run's evaluations would read as
    # this one's, ending it at its first step.
    shutil.rmtree(out_dir, ignore_errors=True)
    procs = []
    try:
        for d in workers:
            procs.append(bed.popen(d, worker_argv(localpar_dir, cfg, d, run_dir),
                                   os.path.join(run_dir, f"{d.name}.log")))
        wait_for_ports(run_dir, workers, procs)
        start = time.monotonic()
        coordinator = bed.popen(bed.device("coordinator"),
                                coordinator_argv(localpar_dir, cfg, bed, out_dir),
                                os.path.join(run_dir, "coordinator.log"))
        procs.append(coordinator)
        evals = EvalPoints(os.path.join(out_dir, "metrics.jsonl"), cfg.stages, cfg.text)
        stopped = out_of_time = killed = False
        signalled = None
        while coordinator.poll() is None:
            time.sleep(0.25)
            points = evals.update()
            if (not stopped and cfg.strictest is not None and first_reaching(
                    [(s, v[-1]) for s, v in points], cfg.strictest, not cfg.text, cfg.hold)):
                coordinator.send_signal(signal.SIGINT)  # stop at the next step, write the rest
                stopped = True
            elif (not stopped and not out_of_time and max_seconds is not None
                  and time.monotonic() - start > max_seconds):
                coordinator.send_signal(signal.SIGINT)
                out_of_time = True
            if (stopped or out_of_time) and signalled is None:
                signalled = time.monotonic()
            if (signalled is not None and drain_seconds is not None
                    and time.monotonic() - signalled > drain_seconds):
                coordinator.kill()
                coordinator.wait()
                killed = True
        seconds = time.monotonic() - start
        code = coordinator.returncode
        if not killed and (code not in (0, 130) or (code == 130 and not (stopped or out_of_time))):
            fail(f"{cfg.method}: the coordinator exited {code}; see {run_dir}/coordinator.log")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    report = {}
    report_path = os.path.join(out_dir, "report.json")
    if os.path.exists(report_path):
        with open(report_path) as f:
            report = json.load(f)
    return {"seconds": seconds, "stopped_at_target": stopped, "out_of_time": out_of_time,
            "drained": not killed,
            "points": _points_with_time(os.path.join(out_dir, "metrics.jsonl"), cfg),
            "examples_per_second": report.get("examples_per_second"),
            "steps": report.get("steps"), "weights": os.path.join(out_dir, "weights.pb")}


def steps_done(result):
    """Training steps a run took: its report's, or for a run killed after its stop (no
    report) the last evaluated step."""
    if result.get("steps"):
        return result["steps"]
    return result["points"][-1]["step"] if result["points"] else 0


def _points_with_time(path, cfg):
    """Every evaluation with every stage's metric, the wall seconds it was written at, and
    how long it took (`eval_seconds`: from the training line of its step, which the
    coordinator writes when the last stage has trained it, to the evaluation's; None where no
    such line came before it)."""
    by_step, trained = {}, {}
    if not os.path.exists(path):
        return []
    with open(path) as f:
        for line in f:
            try:
                p = json.loads(line)
            except json.JSONDecodeError:
                continue
            if p.get("kind") == "train":
                trained.setdefault(p["step"], p.get("wall_seconds") or 0.0)
                continue
            if p.get("kind") not in ("eval", "test", "validation"):
                continue
            value = p["bits_per_byte"] if cfg.text else p["accuracy"]
            entry = by_step.setdefault(p["step"], {"metrics": [None] * cfg.stages, "wall": 0.0,
                                                   "trained": trained.get(p["step"])})
            entry["metrics"][p["stage"]] = value
            entry["wall"] = max(entry["wall"], p.get("wall_seconds") or 0.0)
    return [{"step": s, "wall_seconds": e["wall"], "metrics": e["metrics"],
             "eval_seconds": None if e["trained"] is None else e["wall"] - e["trained"]}
            for s, e in sorted(by_step.items()) if None not in e["metrics"]]


def seconds_to(points, target, text, hold):
    """Wall seconds (as metrics.jsonl records them) at the first of `hold` evaluations in a
    row that meet `target`; None when it was never held."""
    hit = first_reaching([(p["step"], p["metrics"][-1]) for p in points], target, not text, hold)
    if hit is None:
        return None
    return next(p["wall_seconds"] for p in points if p["step"] == hit[0])
