"""What the frontier measures and trains: profiles (`localpar project --json`), training
runs of the reference trainer stopped at their target, and real clusters for the checks;
each result kept in the sweep's cache."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
from typing import Optional

from experiments import jobs
from experiments.cache import RunCache
from experiments.common import fail
from experiments.frontier.model import covers, examples_seen, first_reaching, run_id


@dataclasses.dataclass
class Context:
    localpar: str
    out: str
    threads: int
    cache: Optional[RunCache] = None
    reuse: bool = False
    # Set when the sweep stops (Ctrl-C, a failed run): runs under way are killed.
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)


def localpar_version(ctx):
    """`localpar --version`: the build that measures (kept with each profile)."""
    out = subprocess.run([ctx.localpar, "--version"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else "?"


def profile(ctx, job, name, stages, batch, job_key, measure=True, occasions=1, gap_s=0.0,
            invocation="", tag=None, version=None):
    """`localpar project --json` of `job` regrouped into `stages` at `batch` rows: its
    measurements, oldest first, as (list, whether one was measured now), each also saved
    under --out as profiles/NAME.json. With a cache, a profile is measured on `occasions`
    separate occasions and read back after, so a rerun picks the same summary points (which
    compare measured step times) and trains nothing new: one run of the sweep (its
    `invocation`) measures it at most once, at least `gap_s` seconds after the last time.
    With `measure` false, only what was measured before (None when nothing was). With a
    `tag` the measurements are kept under keys of their own, apart from another sweep's;
    each records the `version` of the build that measured it."""
    path = os.path.join(ctx.out, "profiles", name + ".json")
    if ctx.reuse and os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        return saved.get("occasions", [saved]), False
    key = {"job_hash": job_key, "stages": stages, "batch": batch, "threads": ctx.threads}
    keys = [f"{name}-t{ctx.threads}" + (f"-{tag}" if tag else "") + (f"-o{n}" if n > 1 else "")
            for n in range(1, occasions + 1)]
    found = []
    for cache_key in keys:
        cached = ctx.cache.get("profile", cache_key) if ctx.cache else None
        if cached is None or cached.get("key") != key:
            break
        found.append(cached)
    due = (len(found) < occasions and all(c.get("invocation") != invocation for c in found)
           and time.time() - max((c.get("measured_at", 0) for c in found), default=0) >= gap_s)
    measured = False
    if measure and due:
        cmd = [ctx.localpar, "project", job, "--json", f"--stages={stages}",
               f"--batch_size={batch}", "--project_stages=1", f"--threads={ctx.threads}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"profile failed (exit {out.returncode}): {' '.join(cmd)}: "
                 f"{out.stderr.strip()}")
        entry = {"key": key, "profile": json.loads(out.stdout), "measured_at": time.time(),
                 "invocation": invocation, "version": version}
        if ctx.cache:
            ctx.cache.put("profile", keys[len(found)], entry)
        found.append(entry)
        measured = True
    if not found:
        return None, False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"occasions": [c["profile"] for c in found]}, f, indent=1)
    return [dict(c["profile"], version=c.get("version")) for c in found], measured


class EvalPoints:
    """The evaluations in a run's metrics.jsonl as it grows: each update() reads only the
    lines written since the last one and returns {step: [metric of each stage]} as
    (step, metrics) pairs in step order, for the steps every stage has reported."""

    def __init__(self, path, stages, text):
        self.path, self.stages, self.text = path, stages, text
        self.offset, self.partial, self.points = 0, "", {}

    def update(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        lines = (self.partial + chunk).split("\n")
        self.partial = lines.pop()  # a line still being written, or "" after a newline
        for line in lines:
            try:
                p = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the stop
            if p.get("kind") not in ("eval", "test", "validation"):
                continue
            value = p["bits_per_byte"] if self.text else p["accuracy"]
            self.points.setdefault(p["step"], [None] * self.stages)[p["stage"]] = value
        return [(s, v) for s, v in sorted(self.points.items()) if None not in v]


def cached_run(ctx, cfg, run_dir):
    """The run.json of a finished run that answers for `cfg`, from its run directory or from
    the cache, or None."""
    candidates = []
    path = os.path.join(run_dir, "run.json")
    if os.path.exists(path):
        with open(path) as f:
            candidates.append(json.load(f))
    if ctx.cache:
        candidates.append(ctx.cache.get("run", run_id(cfg)))
    for done in candidates:
        if done is not None and covers(done, cfg):
            return dict(done, cached=True)  # said on the console, never written
    return None


def train_command(ctx, cfg, run_dir):
    batch = cfg["batch"]
    return [ctx.localpar, "train", os.path.join(ctx.out, cfg["job"]), f"--rule={cfg['rule']}",
            f"--stages={cfg['stages']}", f"--batch_size={batch}", f"--lr={cfg['lr']:.6g}",
            f"--seed={cfg['seed']}", "--epochs=1000",
            f"--max_steps={max(1, cfg['length'] // batch)}",
            f"--eval_every_steps={cfg['eval_every_steps']}", f"--threads={ctx.threads}",
            "--quiet", f"--out={run_dir}"]


def train_run(ctx, cfg, run_dir):
    """One run of the reference trainer (`cfg` says which), stopped once its strictest target
    has held for `hold` evaluations in a row. Returns run.json. A run whose run.json was
    written for the same configuration is read back, so a sweep resumes where it stopped."""
    done = cached_run(ctx, cfg, run_dir)
    if done is not None:
        return done
    os.makedirs(run_dir, exist_ok=True)
    cmd = train_command(ctx, cfg, run_dir)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    text, strictest, batch = cfg["text"], cfg["strictest"], cfg["batch"]
    start = time.monotonic()
    stopped = False
    with open(os.path.join(run_dir, "run.log"), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        evals = EvalPoints(metrics, cfg["stages"], text)
        try:
            while True:
                # Reaped here, not by proc.poll(), for the run's own CPU time.
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                time.sleep(0.5)
                if ctx.stop.is_set():
                    raise KeyboardInterrupt  # the sweep stops: so does this run (below)
                points = evals.update()
                if not stopped and strictest is not None and first_reaching(
                        [(s, v[-1]) for s, v in points], strictest, not text, cfg["hold"]):
                    proc.send_signal(signal.SIGTERM)  # reached: the rest would be wasted
                    stopped = True
        except BaseException:
            proc.kill()  # the sweep stops (Ctrl-C, another run failed): so does this run
            proc.wait()
            raise
    if proc.returncode != 0 and not stopped:
        fail(f"run failed (exit {proc.returncode}): {' '.join(cmd)}; see {run_dir}/run.log")
    points = evals.update()
    result = {
        "config": cfg,
        "rule": cfg["rule"], "stages": cfg["stages"], "batch": batch, "lr": cfg["lr"],
        "seed": cfg["seed"], "length": cfg["length"], "stopped_at_target": stopped,
        "budget_steps": max(1, cfg["length"] // batch),
        "seconds": time.monotonic() - start,
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "points": [{"step": s, "examples": examples_seen(s, batch, cfg["train_examples"]),
                    "metrics": v} for s, v in points],
    }
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump(result, f, indent=1)
    if ctx.cache:
        ctx.cache.put("run", run_id(cfg), result)
    return result


def cluster_check(ctx, model, method, check, stages, lr):
    """A real `localpar run` cluster for check.steps steps (with check.replicas replicas of
    each of `stages` stages, each worker pinned to a CPU of its own with check.pin): its
    report, with the measured training throughput (the cache keeps what the tables use, so a
    check measured once is read back)."""
    batch, replicas = check.batch, check.replicas
    name = (f"{model.name}-{method.rule}-K{stages}-R{replicas}-b{batch}"
            + ("-pinned" if check.pin else ""))
    run_dir = os.path.join(ctx.out, "checks", name)
    report_path = os.path.join(run_dir, "report.json")
    key = {"job_hash": jobs.job_hash(model.job), "steps": check.steps, "lr": f"{lr:.6g}",
           "threads": ctx.threads}
    cached = ctx.cache.get("check", f"{name}-t{ctx.threads}") if ctx.cache else None
    if cached is not None and cached.get("key") == key:
        return cached
    if not (ctx.reuse and os.path.exists(report_path)):
        os.makedirs(run_dir, exist_ok=True)
        cmd = [ctx.localpar, "run", model.job, f"--rule={method.rule}",
               f"--stages={stages}", f"--replicas={replicas}", f"--batch_size={batch}",
               f"--lr={lr:.6g}", f"--seed={model.seed}", f"--max_steps={check.steps}",
               "--epochs=1000", f"--threads={ctx.threads}", "--quiet",
               f"--out={run_dir}"] + (["--pin_workers"] if check.pin else [])
        with open(os.path.join(run_dir, "run.log"), "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            fail(f"cluster check failed (exit {code}): {' '.join(cmd)}; see {run_dir}/run.log")
    with open(report_path) as f:
        report = json.load(f)
    if ctx.cache:  # what the tables use, so that they are written again without a cluster
        ctx.cache.put("check", f"{name}-t{ctx.threads}", {
            "key": key, "steps": report["steps"],
            "examples_per_second": report["examples_per_second"],
            "measured_at": time.time()})
    return report


def mesh_exchange_rate(ctx, replicas):
    """Seconds per byte of the replicas' gradient exchange on this machine: the mesh's
    reduce-scatter and all-gather with the sum in replica order, as allreduce_bench measures
    it for a 16 MiB bucket on loopback (run once per replica count)."""
    cached = ctx.cache.get("mesh_rate", f"R{replicas}") if ctx.cache else None
    if cached is not None:
        return cached["seconds_per_byte"]
    bench = os.path.join(os.path.dirname(os.path.abspath(ctx.localpar)), "bench",
                         "allreduce_bench")
    if not os.path.exists(bench):
        fail(f"{bench}: needed for the replicas' checks (build the benchmarks)")
    out = subprocess.run([bench, "--mib=16", f"--replicas={replicas}", "--rounds=5"],
                         capture_output=True, text=True)
    reduced = re.search(r"mesh allreduce \([^)]*\):\s+([0-9.]+) ms", out.stdout)
    if out.returncode != 0 or not reduced:
        fail(f"allreduce_bench failed (exit {out.returncode}): {out.stdout}{out.stderr}")
    rate = float(reduced.group(1)) * 1e-3 / (16 << 20)
    if ctx.cache:
        ctx.cache.put("mesh_rate", f"R{replicas}", {"seconds_per_byte": rate,
                                                    "measured_at": time.time()})
    return rate
