#!/usr/bin/env python3
"""The compute/time frontier: time to a target against compute to it, for data parallelism,
pipelined backprop and local parallelism (GREEDY, CHUNKED, OVERLAP with K stages), over
seeds, with bounds for points that ran out of budget and bootstrap intervals on the
summary's speed-ups.

The sweep is read from a JSON file (deploy/experiments/frontier.json):

  {
    "name": "frontier",
    "threads": 1,                 # CPU GEMM threads per training process
    "parallel": 2,                # training processes at once (they share the cores)
    "hardware": {"link_gbps": 100, "latency_us": 5},   # the cost model's interconnect
    "models": [{
      "job": "../jobs/fashion_mlp8.textproto",
      "targets": [0.86, 0.88],    # accuracy (higher is better) or bits per byte (lower)
      "batch_sizes": [32, 128, 512, 2048, 8192],
      "device_batch": 32,         # examples one device computes per step (the cost model)
      "device_batches": [16, 32, 64],   # the summary's sensitivity to device_batch
      "lr": {"base": 1e-3, "base_batch": 128, "factors": [0.5, 1, 2, 4]},
      "schedule": {"kind": "COSINE", "warmup_examples": 10000, "min_lr_fraction": 0.1,
                   "lengths": [600000, 1800000]},   # each run's length (the cosine's)
      "max_examples": 1800000,    # the budget (without a schedule: every run's length)
      "eval_every_examples": 4096, "hold": 2,  # reached when held 2 evaluations in a row
      "tune_seeds": [1],          # the seeds that choose each point's setting (default: seeds)
      "seeds": [2, 3, 4], "summary_seeds": [2, 3, 4, 5, 6],   # the seeds each point reports
      "equal_devices": 16,        # the summary's equal-device comparison
      "reference_batch": 128,     # where the per-depth head plot and the depth check are
      "depth_check": true,        # the whole network and its first block, trained to the end
      "depth_only": false         # true: the depth check alone (targets that need no depth)
    }],
    "methods": [
      {"label": "data parallel", "rule": "BACKPROP", "stages": 1, "cost": "data_parallel"},
      {"label": "first block alone", "rule": "BACKPROP", "stages": 1, "first_stages": 1,
       "cost": "data_parallel"},                  # the shallow baseline
      {"label": "pipelined backprop K=8", "rule": "BACKPROP", "stages": 8,
       "cost": "pipelined_backprop", "train_stages": 1},
      {"label": "GREEDY K=4", "rule": "GREEDY", "stages": 4, "cost": "local"}, ...
    ],
    "cluster_checks": [{"model": "fashion_mlp8", "method": "GREEDY K=4", "batch": 128,
                        "steps": 300}]
  }

Every training run is the in-process reference trainer (`localpar train`), which is bitwise
equal to a `localpar run` cluster with the same job and seed, of a job derived from the
model's (its schedule replaced, or its network cut after `first_stages`). A run evaluates
every `eval_every_examples` training examples and stops once the last stage has met the
model's strictest target `hold` times in a row (or at its length). Each point is a method at
one batch size B at its best (learning rate, length) over the tune seeds, reported over the
seeds (fresh ones when tune_seeds differ, so the choice does not flatter the figure);
lr = base x sqrt(B / base_batch) x factor. Runs are cached by their whole configuration (in their run directory,
and with --cache in a directory to commit), so a sweep resumes where it stopped.

Cost model (ideal hardware: as many devices as the batch needs, each computing
`device_batch` examples per step, times measured on this machine by `localpar project --json`
for that many examples; see RESULTS.md for its statement). Compute to the target counts
3 x the forward FLOPs of every layer and of every head the method trains, per example seen.

Outputs under --out: jobs/, profiles/, runs/<run>/ (run.json, metrics.jsonl, run.log),
frontier.csv, heads.csv, checks.csv, plots/*.svg and FRONTIER.md; with --results, the
Markdown also replaces the frontier section of that file and the plots are copied next to it.
"""

import csv
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiment  # noqa: E402  (shared helpers: fail, data figures, gnuplot)

experiment.PROGRAM = "frontier"

COSTS = ("data_parallel", "pipelined_backprop", "local", "overlap")
LOCAL_RULES = ("GREEDY", "CHUNKED", "OVERLAP")
SECTION_BEGIN = experiment.FRONTIER_BEGIN
SECTION_END = experiment.FRONTIER_END


def fail(message):
    experiment.fail(message)


# ---------------------------------------------------------------------------------------
# The sweep logic: pure functions, tested by tests/experiments/frontier_test.py.


def lr_grid(lr, batch):
    """The learning rates tried at `batch`: base x sqrt(batch / base_batch) x each factor."""
    scale = math.sqrt(batch / lr["base_batch"])
    return [lr["base"] * scale * f for f in lr["factors"]]


def steps_per_epoch(train_examples, batch):
    return -(-train_examples // batch)


def examples_seen(step, batch, train_examples):
    """Training examples of the first `step` steps: every epoch ends with a short batch."""
    per_epoch = steps_per_epoch(train_examples, batch)
    epochs, rest = divmod(step, per_epoch)
    return epochs * train_examples + rest * batch


def first_reaching(points, target, higher_is_better, hold=1):
    """The first (step, value) of `points` (in step order) from which `target` holds for
    `hold` evaluations in a row, or None: with hold = 2 a lucky evaluation alone does not
    count, and the step reported is the first of the two."""
    run = 0
    for i, (step, value) in enumerate(points):
        run = run + 1 if ((value >= target) if higher_is_better else (value <= target)) else 0
        if run >= hold:
            return points[i - hold + 1]
    return None


def best_held(values, higher_is_better, hold=1):
    """The best value that held for `hold` evaluations in a row (each window's worst)."""
    if len(values) < hold:
        return -math.inf if higher_is_better else math.inf
    windows = [values[i:i + hold] for i in range(len(values) - hold + 1)]
    if higher_is_better:
        return max(min(w) for w in windows)
    return min(max(w) for w in windows)


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def choose_setting(candidates):
    """The best of a method's settings at one batch size and target. `candidates` is a list
    of (setting, {seed: steps, or None when the target was not reached}); the best reaches it
    in the most seeds, then in the fewest median steps (a miss counted as infinitely many).
    Returns (index, setting, steps by seed)."""
    def score(item):
        hits = item[1][1]
        missed = sum(1 for v in hits.values() if v is None)
        reached = [v for v in hits.values() if v is not None]
        return (missed, median(reached) if reached else math.inf)
    best = min(enumerate(candidates), key=score)
    return best[0], best[1][0], best[1][1]


def at_edge(index, count):
    """Whether the choice `index` of a grid of `count` values is at either end of it (an
    optimum that may lie outside the grid); a grid of one value has no interior."""
    return count > 1 and index in (0, count - 1)


def bootstrap_ratio(numerator, denominator, draws=4000, seed=20261204):
    """A 95% percentile-bootstrap interval of mean(numerator) / mean(denominator), each list
    (one value per seed) resampled with replacement on its own. Deterministic."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        a = [rng.choice(numerator) for _ in numerator]
        b = [rng.choice(denominator) for _ in denominator]
        ratios.append((sum(a) / len(a)) / (sum(b) / len(b)))
    ratios.sort()
    return ratios[int(0.025 * (draws - 1))], ratios[int(round(0.975 * (draws - 1)))]


def stops_paying_off(points, gain=0.9):
    """The batch size past which data parallelism stops gaining: `points` are (B, time,
    bound) in B order (bound: the time is a lower bound, the target was not reached); the
    first B whose next larger B is not at least 1 / gain x faster. None when every step up
    in B still gains."""
    for (b, t, _), (_, t2, bound2) in zip(points, points[1:]):
        if bound2 or t2 > gain * t:
            return b
    return None


def training_flops_per_example(stages, cost):
    """3 x the forward FLOPs (forward, then a backward pass of about twice its cost) of every
    layer, and of the heads the method trains: every stage's for local rules, the last one's
    for backprop (whose side heads are detached probes, not part of the method)."""
    layers = sum(s["forward_flops"] for s in stages)
    if cost in ("data_parallel", "pipelined_backprop"):
        heads = stages[-1]["head_forward_flops"]
    else:
        heads = sum(s["head_forward_flops"] for s in stages)
    return 3.0 * (layers + heads)


def allreduce_seconds(bytes_, replicas, link_bytes_per_s, latency_s):
    """A ring all-reduce of `bytes_` over `replicas` devices: 2 (R - 1) / R of the bytes
    over each link, and 2 (R - 1) message latencies."""
    if replicas <= 1:
        return 0.0
    return (2.0 * (replicas - 1) / replicas * bytes_ / link_bytes_per_s
            + 2.0 * (replicas - 1) * latency_s)


def step_seconds(cost, stages, replicas, micro_batches, link_bytes_per_s, latency_s, cores=0):
    """One training step under the cost model.

    `stages` are the profile's stages for the per-device batch (seconds: forward, backward
    and update of the layers; head_seconds: the head's; input_grad_seconds: the gradient for
    the stage's input, which rules that send gradients upstream add to every stage but the
    first). One device per stage and replica, unless `cores` > 0: then the K stages share
    that many cores (the measured cluster).

    data_parallel: one stage of everything, `replicas` devices each on its share, then an
      all-reduce of all parameters.
    pipelined_backprop: K stages, the batch cut into `micro_batches`; GPipe's schedule takes
      (M + K - 1) slots of the slowest stage, forward and backward.
    local (GREEDY, CHUNKED): each stage works on its own batch at once; a step costs the
      slowest stage with its head, then its replicas' all-reduce.
    overlap (synchronous OVERLAP): a stage waits for the next stage's gradient of the same
      batch, so a step costs the slowest pair of neighbouring stages.
    """
    upstream = cost in ("data_parallel", "pipelined_backprop", "overlap")
    own = [s["seconds"] + (s.get("input_grad_seconds", 0.0) if upstream and k else 0.0)
           for k, s in enumerate(stages)]
    t = [o + s["head_seconds"] for o, s in zip(own, stages)]
    exchange = max(allreduce_seconds(s["parameter_bytes"], replicas, link_bytes_per_s, latency_s)
                   for s in stages)
    if cost in ("data_parallel", "pipelined_backprop"):
        body = list(own)
        body[-1] += stages[-1]["head_seconds"]  # backprop trains the last head only
        if cost == "data_parallel":
            return sum(body) + exchange
        if cores > 0:
            return max(max(body), sum(body) / cores) * micro_batches
        return (micro_batches + len(stages) - 1) * max(body) + exchange
    if cost == "overlap":
        pairs = [t[k] + t[k + 1] for k in range(len(t) - 1)] or t
        slowest = max(pairs)
    elif cost == "local":
        slowest = max(t)
    else:
        raise ValueError(cost)
    if cores > 0:
        slowest = max(slowest, sum(t) / cores)
    return slowest + exchange


def pipeline_fill(cost, stages):
    """Steps before a pipeline's first update reaches its last stage."""
    return stages - 1 if cost in ("local", "overlap") else 0


def heads_at_common_step(runs, text):
    """Each method's heads at the last evaluation every run (all methods, all learning rates)
    reached, since runs stop at the target at different steps: {method: (step, lr, metrics)},
    at the learning rate whose last head is best there."""
    runs = {k: [r for r in v if r["points"]] for k, v in runs.items()}
    lasts = [r["points"][-1]["step"] for v in runs.values() for r in v]
    if not lasts:
        return {}
    common = min(lasts)
    out = {}
    for method, candidates in runs.items():
        best = None
        for r in candidates:
            pt = [p for p in r["points"] if p["step"] <= common][-1:]
            if not pt:
                continue
            v = pt[0]["metrics"][-1]
            if best is None or (v < best[2][-1] if text else v > best[2][-1]):
                best = (pt[0]["step"], r["lr"], pt[0]["metrics"])
        if best:
            out[method] = best
    return out


def pareto(points):
    """Indices of `points` ((compute, time), lower is better in both) that no other point
    beats in both coordinates."""
    keep = []
    for i, (c, t) in enumerate(points):
        if not any((c2 <= c and t2 <= t) and (c2 < c or t2 < t)
                   for j, (c2, t2) in enumerate(points) if j != i):
            keep.append(i)
    return keep


# ---------------------------------------------------------------------------------------
# The spec, the runs and the report.


def load_spec(path):
    spec = experiment.read_json(path)
    if not isinstance(spec, dict):
        fail(f"{path}: a JSON object is required")
    base = os.path.dirname(os.path.abspath(path))
    for key in ("models", "methods"):
        if not isinstance(spec.get(key), list) or not spec[key]:
            fail(f"{path}: {key}: a non-empty list is required")
    for i, m in enumerate(spec["models"]):
        where = f"{path}: models[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("job"), str):
            fail(f"{where}.job: a job file path is required")
        m["job"] = os.path.normpath(os.path.join(base, m["job"]))
        if not os.path.exists(m["job"]):
            fail(f"{where}.job: {m['job']} does not exist")
        if not isinstance(m.get("targets"), list) or not m["targets"] or not all(
                isinstance(t, (int, float)) and t > 0 for t in m["targets"]):
            fail(f"{where}.targets: a non-empty list of positive numbers is required")
        for key in ("batch_sizes",):
            if not isinstance(m.get(key), list) or not m[key] or not all(
                    isinstance(b, int) and b > 0 for b in m[key]):
                fail(f"{where}.{key}: a non-empty list of positive integers is required")
        for key in ("device_batch", "max_examples", "eval_every_examples"):
            if not isinstance(m.get(key), int) or m[key] < 1:
                fail(f"{where}.{key}: a positive integer is required")
        if any(b % m["device_batch"] for b in m["batch_sizes"]):
            fail(f"{where}.batch_sizes: each must be a multiple of device_batch "
                 f"({m['device_batch']})")
        lr = m.get("lr")
        if not isinstance(lr, dict) or not all(
                isinstance(lr.get(k), (int, float)) and lr[k] > 0 for k in ("base", "base_batch")) \
                or not isinstance(lr.get("factors"), list) or not lr["factors"]:
            fail(f"{where}.lr: needs base, base_batch and a non-empty factors list")
        m.setdefault("seed", 1)
        m.setdefault("seeds", [m["seed"]])
        m.setdefault("summary_seeds", m["seeds"])
        m.setdefault("tune_seeds", m["seeds"])
        m.setdefault("hold", 2)
        m.setdefault("device_batches", [m["device_batch"]])
        if m["device_batch"] not in m["device_batches"]:
            m["device_batches"] = [m["device_batch"]] + m["device_batches"]
        for key in ("seeds", "summary_seeds", "tune_seeds", "device_batches"):
            if not isinstance(m[key], list) or not m[key] or not all(
                    isinstance(v, int) and v > 0 for v in m[key]):
                fail(f"{where}.{key}: a non-empty list of positive integers is required")
        if not set(m["seeds"]) <= set(m["summary_seeds"]):
            fail(f"{where}.summary_seeds: must include every seed of seeds")
        if not isinstance(m["hold"], int) or m["hold"] < 1:
            fail(f"{where}.hold: a positive integer is required")
        sched = m.get("schedule")
        if sched is not None:
            if not isinstance(sched, dict) or sched.get("kind", "COSINE") not in (
                    "COSINE", "CONSTANT"):
                fail(f"{where}.schedule.kind: COSINE or CONSTANT")
            lengths = sched.get("lengths", [m["max_examples"]])
            if not isinstance(lengths, list) or not lengths or not all(
                    isinstance(v, int) and v > 0 for v in lengths):
                fail(f"{where}.schedule.lengths: a non-empty list of example counts is required")
            m["lengths"] = sorted(lengths)
            m["max_examples"] = max(lengths)
        else:
            m["lengths"] = [m["max_examples"]]
        m.setdefault("reference_batch", m["batch_sizes"][0])
        m.setdefault("depth_check", True)
        m.setdefault("depth_only", False)
        for key in ("depth_check", "depth_only"):
            if not isinstance(m[key], bool):
                fail(f"{where}.{key}: true or false")
        if m["depth_only"] and not m["depth_check"]:
            fail(f"{where}.depth_only: needs depth_check")
        if m["reference_batch"] not in m["batch_sizes"]:
            fail(f"{where}.reference_batch: must be one of batch_sizes")
    labels = set()
    for i, a in enumerate(spec["methods"]):
        where = f"{path}: methods[{i}]"
        if not isinstance(a, dict) or a.get("rule") not in experiment.RULES:
            fail(f"{where}.rule: must be one of {', '.join(experiment.RULES)}")
        if a.get("cost") not in COSTS:
            fail(f"{where}.cost: must be one of {', '.join(COSTS)}")
        for key in ("stages", "train_stages", "first_stages"):
            if key in a and (not isinstance(a[key], int) or a[key] < 1):
                fail(f"{where}.{key}: must be a positive integer")
        if "stages" not in a:
            fail(f"{where}.stages: required")
        a.setdefault("train_stages", a["stages"])
        a.setdefault("label", f"{a['rule']} K={a['stages']}")
        if a["label"] in labels:
            fail(f"{where}.label: {a['label']} appears twice")
        labels.add(a["label"])
    for i, c in enumerate(spec.get("cluster_checks", [])):
        where = f"{path}: cluster_checks[{i}]"
        if c.get("method") not in labels:
            fail(f"{where}.method: not one of the methods' labels")
        if not isinstance(c.get("batch"), int) or not isinstance(c.get("steps"), int):
            fail(f"{where}: batch and steps are required integers")
        c.setdefault("replicas", 1)
        c.setdefault("pin", False)
        for key in ("replicas", "stages"):
            if key in c and (not isinstance(c[key], int) or c[key] < 1):
                fail(f"{where}.{key}: a positive integer is required")
        if c["batch"] % c["replicas"]:
            fail(f"{where}.batch: must be a multiple of replicas ({c['replicas']})")
        if not isinstance(c["pin"], bool):
            fail(f"{where}.pin: true or false")
    spec.setdefault("name", "frontier")
    spec.setdefault("threads", 1)
    spec.setdefault("parallel", 1)
    hw = spec.setdefault("hardware", {})
    hw.setdefault("link_gbps", 100)
    hw.setdefault("latency_us", 5)
    return spec


def profile(args, model, stages, batch, out_dir, first_stages=None, measure=True):
    """`localpar project --json` of the job regrouped into `stages` at `batch` rows (with
    `first_stages`: of its network cut after that many stages). With `measure` false, only
    a profile already measured (None when there is none)."""
    first = f"-first{first_stages}" if first_stages else ""
    name = f"{model['name']}{first}-K{stages}-b{batch}"
    path = os.path.join(out_dir, "profiles", name + ".json")
    job = model["jobs"][first_stages] if first_stages else model["job"]
    if args.reuse and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    # With a cache, a profile is measured once per configuration and read back after, so a
    # rerun picks the same summary points (which compare measured step times) and trains
    # nothing new.
    key = {"job_hash": experiment.job_hash(job), "stages": stages, "batch": batch,
           "threads": args.spec["threads"]}
    cache_path = (os.path.join(args.cache, "profiles", f"{name}-t{key['threads']}.json")
                  if args.cache else None)
    if cache_path and os.path.exists(cache_path):
        with open(cache_path) as f:
            cached = json.load(f)
        if cached.get("key") == key:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(cached["profile"], f, indent=1)
            return dict(cached["profile"], cached=True)
    if not measure:
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cmd = [args.localpar, "project", job, "--json", f"--stages={stages}",
           f"--batch_size={batch}", "--project_stages=1", f"--threads={args.spec['threads']}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"profile failed (exit {out.returncode}): {' '.join(cmd)}: {out.stderr.strip()}")
    with open(path, "w") as f:
        f.write(out.stdout)
    result = json.loads(out.stdout)
    if cache_path:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        with open(cache_path + ".tmp", "w") as f:
            json.dump({"key": key, "profile": result}, f, separators=(",", ":"))
        os.replace(cache_path + ".tmp", cache_path)
    return result


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


def split_top_level(text):
    """A text-format message's top-level fields, in order, each as its whole text ("seed: 1",
    or "stages {...}" with everything inside): braces inside quoted strings do not count."""
    fields, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, c in enumerate(text):
        if quoted:
            escaped = not escaped and c == "\\"
            if c == '"' and not escaped:
                quoted = False
            continue
        if c == '"':
            quoted = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                fields.append(text[start:i + 1].strip())
                start = i + 1
        elif c == "\n" and depth == 0:
            if text[start:i].strip():
                fields.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        fields.append(text[start:].strip())
    return fields


def field_name(field):
    return field.split("{", 1)[0].split(":", 1)[0].strip()


def derive_job(text, schedule=None, first_stages=None):
    """The normalised job `text` with its schedule replaced by `schedule` (text inside the
    braces) and only its first `first_stages` stages kept (the network cut after them, its
    last kept stage's head the output)."""
    out, stages = [], 0
    for f in split_top_level(text):
        name = field_name(f)
        if name == "schedule" and schedule is not None:
            continue
        if name == "stages":
            stages += 1
            if first_stages is not None and stages > first_stages:
                continue
        out.append(f)
    if schedule is not None:
        out.append(f"schedule {{ {schedule} }}")
    return "\n".join(out) + "\n"


def normalized_job(localpar, job):
    """The job with every default filled in and its data paths resolved, as `localpar
    validate` prints it."""
    out = subprocess.run([localpar, "validate", job], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{job}: {out.stderr.strip()}")
    lines = out.stdout.split("\n")[1:]  # after "JOB: ok"
    return "\n".join(line for line in lines if not line.startswith("#"))


def schedule_text(sched, batch, length):
    """A warm-up then cosine schedule for one run: `warmup_examples` become steps at this
    batch size, and the cosine decays to min_lr_fraction x lr over the run's `length`
    examples (its max_steps). lr is 1 here: --lr sets it, and min_lr scales with it."""
    warm = max(0, round(sched.get("warmup_examples", 0) / batch))
    kind = sched.get("kind", "COSINE")
    text = f"kind: {kind} lr: 1 warmup_steps: {warm}"
    if kind == "COSINE":
        text += f" min_lr: {sched.get('min_lr_fraction', 0.0):g}"
    return text


def run_id(cfg):
    """A run's directory name: every setting that changes its result."""
    first = f"-first{cfg['first_stages']}" if cfg.get("first_stages") else ""
    return (f"{cfg['model']}-{cfg['rule']}-K{cfg['stages']}{first}-b{cfg['batch']}"
            f"-lr{cfg['lr']:.6g}-n{cfg['length']}-s{cfg['seed']}")


def covers(done, cfg):
    """Whether the finished run `done` answers for configuration `cfg`: the same
    configuration, except that its stopping target may be stricter than cfg's (or it ran its
    whole budget), since a run stopped later holds every evaluation an earlier stop would."""
    old = dict(done.get("config") or {})
    if old == cfg:
        return True
    if "strictest" not in old or {**old, "strictest": cfg["strictest"]} != cfg:
        return False
    if not done.get("stopped_at_target"):
        return True
    if cfg["strictest"] is None:
        return False  # wants the whole length
    if cfg["text"]:
        return old["strictest"] <= cfg["strictest"]  # a loss: lower is stricter
    return old["strictest"] >= cfg["strictest"]


def cache_file(args, cfg):
    """Where --cache keeps the result of configuration `cfg` (None without --cache)."""
    return os.path.join(args.cache, run_id(cfg) + ".json") if args.cache else None


def cached_run(args, cfg, run_dir):
    """The run.json of a finished run that answers for `cfg`, from its run directory or from
    --cache, or None."""
    for path in (os.path.join(run_dir, "run.json"), cache_file(args, cfg)):
        if path and os.path.exists(path):
            with open(path) as f:
                done = json.load(f)
            if covers(done, cfg):
                done["cached"] = True  # said on the console, never written
                return done
    return None


def train_run(args, cfg, run_dir):
    """One run of the reference trainer (`cfg` says which), stopped once its strictest target
    has held for `hold` evaluations in a row. Returns run.json. A run whose run.json was
    written for the same configuration is read back, so a sweep resumes where it stopped."""
    done = cached_run(args, cfg, run_dir)
    if done is not None:
        return done
    result_path = os.path.join(run_dir, "run.json")
    cache_path = cache_file(args, cfg)
    os.makedirs(run_dir, exist_ok=True)
    batch = cfg["batch"]
    cmd = [args.localpar, "train", os.path.join(args.out, cfg["job"]), f"--rule={cfg['rule']}",
           f"--stages={cfg['stages']}", f"--batch_size={batch}", f"--lr={cfg['lr']:.6g}",
           f"--seed={cfg['seed']}", "--epochs=1000",
           f"--max_steps={max(1, cfg['length'] // batch)}",
           f"--eval_every_steps={cfg['eval_every_steps']}", f"--threads={args.spec['threads']}",
           "--quiet", f"--out={run_dir}"]
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    text = cfg["text"]
    strictest = cfg["strictest"]
    start = time.monotonic()
    stopped = False
    with open(os.path.join(run_dir, "run.log"), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        evals = EvalPoints(metrics, cfg["stages"], text)
        while True:
            # Reaped here, not by proc.poll(), for the run's own CPU time.
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.5)
            points = evals.update()
            if not stopped and strictest is not None and first_reaching(
                    [(s, v[-1]) for s, v in points], strictest, not text, cfg["hold"]):
                proc.send_signal(signal.SIGTERM)  # reached: the rest would be wasted compute
                stopped = True
    code = proc.returncode
    if code != 0 and not stopped:
        fail(f"run failed (exit {code}): {' '.join(cmd)}; see {run_dir}/run.log")
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
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)
    if cache_path:
        os.makedirs(args.cache, exist_ok=True)
        with open(cache_path + ".tmp", "w") as f:
            json.dump(result, f, separators=(",", ":"))
        os.replace(cache_path + ".tmp", cache_path)
    return result


def cluster_check(args, model, method, check, lr, out_dir):
    """A real `localpar run` cluster for check["steps"] steps (with check["replicas"] replicas
    of each of check["stages"] stages, each worker pinned to a CPU of its own with
    check["pin"]): its measured training throughput."""
    batch, stages, replicas = check["batch"], check["stages"], check["replicas"]
    name = (f"{model['name']}-{method['rule']}-K{stages}-R{replicas}-b{batch}"
            + ("-pinned" if check["pin"] else ""))
    run_dir = os.path.join(out_dir, "checks", name)
    report_path = os.path.join(run_dir, "report.json")
    if not (args.reuse and os.path.exists(report_path)):
        os.makedirs(run_dir, exist_ok=True)
        cmd = [args.localpar, "run", model["job"], f"--rule={method['rule']}",
               f"--stages={stages}", f"--replicas={replicas}", f"--batch_size={batch}",
               f"--lr={lr:.6g}", f"--seed={model['seed']}", f"--max_steps={check['steps']}",
               "--epochs=1000", f"--threads={args.spec['threads']}", "--quiet",
               f"--out={run_dir}"] + (["--pin_workers"] if check["pin"] else [])
        with open(os.path.join(run_dir, "run.log"), "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            fail(f"cluster check failed (exit {code}): {' '.join(cmd)}; see {run_dir}/run.log")
    with open(report_path) as f:
        return json.load(f)


def mesh_exchange_rate(args, replicas):
    """Seconds per byte of the replicas' gradient exchange on this machine: the mesh
    all-gather and the sum in replica order, as allreduce_bench measures them for a 16 MiB
    bucket on loopback (run once per replica count)."""
    bench = os.path.join(os.path.dirname(os.path.abspath(args.localpar)), "bench",
                         "allreduce_bench")
    if not os.path.exists(bench):
        fail(f"{bench}: needed for the replicas' checks (build the benchmarks)")
    out = subprocess.run([bench, "--mib=16", f"--replicas={replicas}", "--rounds=5"],
                         capture_output=True, text=True)
    gather = re.search(r"mesh allgather:\s+([0-9.]+) ms", out.stdout)
    summed = re.search(r"sum in replica order:\s+([0-9.]+) ms", out.stdout)
    if out.returncode != 0 or not gather or not summed:
        fail(f"allreduce_bench failed (exit {out.returncode}): {out.stdout}{out.stderr}")
    return (float(gather.group(1)) + float(summed.group(1))) * 1e-3 / (16 << 20)


CHECK_COLUMNS = ["model", "method", "rule", "stages", "replicas", "batch", "pinned", "cores",
                 "steps", "predicted_step_ms", "predicted_exchange_ms", "measured_step_ms",
                 "error"]


def run_checks(args, spec, models, link, latency):
    """The cost model against real `localpar run` clusters on this machine. An unpinned
    check's processes share every core (the model's summed compute over the cores); a pinned
    one gives each worker a core of its own, so the model's slowest-stage and exchange terms
    are tested as on separate machines (the exchange at this machine's measured mesh rate)."""
    rows = []
    cores = os.cpu_count() or 1
    rates = {}
    for c in spec.get("cluster_checks", []):
        m = next(x for x in models if x["name"] == c["model"])
        a = next(x for x in spec["methods"] if x["label"] == c["method"])
        c.setdefault("stages", a["train_stages"])
        replicas = c["replicas"]
        lr = lr_grid(m["lr"], c["batch"])[0]
        prof = profile(args, m, c["stages"], c["batch"] // replicas, args.out)["stages"]
        # BACKPROP without micro-batches: each batch forward through every stage and back.
        cost = "data_parallel" if a["rule"] == "BACKPROP" else a["cost"]
        workers = c["stages"] * replicas
        own_cores = c["pin"] and workers <= cores
        compute = step_seconds(cost, prof, 1, 1, link, latency, cores=0 if own_cores else cores)
        exchange = 0.0
        if replicas > 1:
            if replicas not in rates:
                rates[replicas] = mesh_exchange_rate(args, replicas)
            # Each stage's replicas exchange at once, on their own cores: the largest stage.
            exchange = max(s["parameter_bytes"] for s in prof) * rates[replicas]
        predicted = compute + exchange
        report = cluster_check(args, m, a, c, lr, args.out)
        measured = c["batch"] / report["examples_per_second"]
        rows.append({"model": m["name"], "method": a["label"], "rule": a["rule"],
                     "stages": c["stages"], "replicas": replicas, "batch": c["batch"],
                     "pinned": c["pin"], "cores": cores, "steps": report["steps"],
                     "predicted_step_ms": 1e3 * predicted,
                     "predicted_exchange_ms": 1e3 * exchange,
                     "measured_step_ms": 1e3 * measured, "error": measured / predicted - 1})
    return rows


# How far the whole network's profiled step may stray from the sum of its stages' before
# the profiles count as measured under load.
PROFILE_TOLERANCE = 0.15


def profile_disagreements(profiles, tolerance=PROFILE_TOLERANCE):
    """Profiles measured under load disagree with each other: the whole network's step
    (one stage) against the sum of its K stages' steps (heads excluded) at the same rows.
    `profiles` maps (model, K, first, rows) to `localpar project --json`; returns one line
    per pair off by more than `tolerance`."""
    out = []
    for (name, k, first, rows), prof in sorted(profiles.items()):
        whole = profiles.get((name, 1, first, rows))
        if k == 1 or whole is None:
            continue
        one = sum(s["seconds"] for s in whole["stages"])
        split = sum(s["seconds"] for s in prof["stages"])
        if abs(split / one - 1) > tolerance:
            out.append(f"{name} at {rows} rows: the whole network {1e3 * one:.2f} ms a step, "
                       f"its {k} stages {1e3 * split:.2f} ms together")
    return out


def fmt_flops(x):
    return f"{x:.2e}"


def fmt_target(t, text):
    return f"{t:.2f} bits/byte" if text else f"{100 * t:.0f}%"


def plot_frontier(plots_dir, name, target, series, text):
    """Time to target against compute to target, log-log: a line per method through its
    batch sizes (each point labelled with its B), and the front over all methods dashed."""
    stem = f"{name}_frontier_{str(target).replace('.', '_')}"
    data = f"{stem}.dat"
    everything = []
    with open(os.path.join(plots_dir, data), "w") as f:
        for label, points in series:
            f.write(f"# {label}\n")
            for c, t, b in points or [("NaN", "NaN", "")]:
                f.write(f"{c} {t} {b}\n")
            f.write("\n\n")
            everything += [(c, t) for c, t, _ in points]
        front = sorted(everything[i] for i in pareto(everything))
        f.write("# front\n")
        for c, t in front or [("NaN", "NaN")]:
            f.write(f"{c} {t} -\n")
        f.write("\n\n")
    q, t = experiment.quote, experiment.text
    plots = []
    for i, (label, _) in enumerate(series):
        plots.append(f"{q(data)} index {i} using 1:2 with linespoints lc {i + 1} pt {i + 1} "
                     f"title {t(label)}")
        plots.append(f"{q(data)} index {i} using 1:2:(sprintf('%d', $3)) with labels "
                     f"offset 0.6,0.6 font ',8' tc lt {i + 1} notitle")
    plots.append(f"{q(data)} index {len(series)} using 1:2 with lines dt 2 lc rgb 'black' "
                 f"title 'the front (all methods)'")
    out = f"{stem}.svg"
    experiment.gnuplot(f"""set terminal svg size 760,460 dynamic enhanced background rgb 'white'
set output {q(out)}
set title {t(f"{name}: to {fmt_target(target, text)}; points labelled with the batch size")}
set xlabel 'compute to target (training FLOPs, log scale)'
set ylabel 'time to target (s under the cost model, log scale)'
set logscale xy
set format x '10^{{%L}}'
set format y '10^{{%L}}'
set mxtics 10
set mytics 10
set key outside right
set grid xtics ytics mxtics mytics lw 0.5, lw 0.2
plot {", ".join(plots)}
""", plots_dir)
    return out


def summary_points(trows, equal_devices=None):
    """The points a target's summary compares, from (row, setting) pairs of one model and
    target: the fastest backprop point and the fastest local point on ideal hardware, then
    the fastest of each with at most `equal_devices` devices (default: the ideal backprop
    point's). Shallow baselines are not backprop points here."""
    def fastest_of(pairs):
        return min(pairs, key=lambda p: (p[0]["bound"], p[0]["time_seconds"])) if pairs else None
    backprop = [p for p in trows if p[0]["rule"] == "BACKPROP" and not p[0]["shallow"]]
    local = [p for p in trows if p[0]["rule"] in LOCAL_RULES]
    bp, lo = fastest_of(backprop), fastest_of(local)
    cap = equal_devices or (bp[0]["devices"] if bp else None)
    bp_eq = fastest_of([p for p in backprop if cap and p[0]["devices"] <= cap])
    lo_eq = fastest_of([p for p in local if cap and p[0]["devices"] <= cap])
    return {"backprop": bp, "local": lo, "backprop_equal": bp_eq, "local_equal": lo_eq,
            "cap": cap}


def main():
    args = experiment.parse_args(
        __doc__, "sweep file (JSON)", "replace the frontier section of this Markdown file",
        "read back profiles and cluster checks that already exist instead of redoing them "
        "(training runs are always read back when their configuration matches)",
        lambda p: (p.add_argument(
            "--cache", help="also keep each training run's result here, by its configuration "
            "(a directory to commit, so that a sweep spans sessions and machines)"),
                   p.add_argument(
            "--checks_only", action="store_true", help="run only the cluster checks: "
            "checks.csv and CHECKS.md under --out (minutes, where the sweep takes days)"),
                   p.add_argument(
            "--plan", action="store_true", help="run and measure nothing: say which stage the "
            "sweep is at, how many of its runs are done (in --cache, or under --out), and name "
            "the runs left; later stages depend on earlier results, so only the first "
            "unfinished stage is listed. Beside a running sweep, give it another --out")))
    spec = load_spec(args.spec)
    args.spec = spec
    hw = spec["hardware"]
    link = hw["link_gbps"] * 1e9 / 8
    latency = hw["latency_us"] * 1e-6
    plots_dir = os.path.join(args.out, "plots")
    os.makedirs(plots_dir, exist_ok=True)

    models = []
    for m in spec["models"]:
        m = dict(m)
        m["name"] = m.get("label") or experiment.model_name(m["job"])
        m["data"] = experiment.data_figures(args.localpar, m["job"])
        m["text"] = m["data"]["labels_per_example"] > 1
        models.append(m)

    # Each model's job as the runs see it: normalised, with the sweep's schedule (warm-up in
    # examples, so its steps depend on B) and cut after `first_stages` for shallow baselines.
    for m in models:
        m["normalized"] = normalized_job(args.localpar, m["job"])
        m["jobs"] = {}
        jobs_dir = os.path.join(args.out, "jobs")
        os.makedirs(jobs_dir, exist_ok=True)
        for first in sorted({a.get("first_stages") for a in spec["methods"]} - {None}):
            path = os.path.join(jobs_dir, f"{m['name']}-first{first}.textproto")
            with open(path, "w") as f:
                f.write(derive_job(m["normalized"], None, first))
            m["jobs"][first] = path

    def job_for(m, first, batch):
        sched = m.get("schedule")
        if not sched:
            return m["jobs"][first] if first else m["job"]
        path = os.path.join(args.out, "jobs", f"{m['name']}-first{first or 0}-b{batch}.textproto")
        text = derive_job(m["normalized"], schedule_text(sched, batch, 0), first)
        if not os.path.exists(path) or open(path).read() != text:
            with open(path, "w") as f:
                f.write(text)
        return path

    if args.checks_only:
        rows = run_checks(args, spec, models, link, latency)
        write_csv(os.path.join(args.out, "checks.csv"), rows, CHECK_COLUMNS)
        with open(os.path.join(args.out, "CHECKS.md"), "w") as f:
            f.write(checks_markdown(rows) if rows else "No cluster checks in the sweep file.\n")
        print(f"frontier: {len(rows)} cluster checks; {os.path.join(args.out, 'CHECKS.md')}",
              file=sys.stderr)
        return

    # The training runs, one per configuration (shared between methods that train alike),
    # each cached by its configuration so that a sweep resumes where it stopped.
    def config(m, a, b, lr, length, seed, whole=False):
        """A run's configuration; `whole`: trained to its length, never stopped early."""
        text = m["text"]
        job = job_for(m, a.get("first_stages"), b)
        return {"model": m["name"], "job": os.path.relpath(job, args.out),
                "job_hash": experiment.job_hash(job),
                "rule": a["rule"], "stages": a["train_stages"],
                "first_stages": a.get("first_stages") or 0, "batch": b, "lr": lr,
                "length": length, "seed": seed,
                "eval_every_steps": max(1, m["eval_every_examples"] // b), "hold": m["hold"],
                "strictest": None if whole else min(m["targets"]) if text else max(m["targets"]),
                "text": text,
                "train_examples": m["data"]["train_examples"]}

    results = {}

    def run_all(configs, stage):
        todo = {run_id(c): c for c in configs if run_id(c) not in results}
        total, done = len(todo), [0]
        if args.plan:
            left = []
            for rid, cfg in todo.items():
                r = cached_run(args, cfg, os.path.join(args.out, "runs", rid))
                if r is None:
                    left.append(rid)
                else:
                    results[rid] = r
            print(f"{stage}: {total - len(left)} of {total} runs done")
            if left:
                print(f"left ({len(left)}; the stages after this one depend on their results):")
                for rid in left:
                    print(f"  {rid}")
                sys.exit(0)
            return

        def work(item):
            rid, cfg = item
            r = train_run(args, cfg, os.path.join(args.out, "runs", rid))
            done[0] += 1
            reached = "reached" if r["stopped_at_target"] else "budget"
            cached = r.pop("cached", False)
            # One write per line: runs finish on several threads at once.
            sys.stderr.write(f"[{done[0]}/{total}] {rid}: {len(r['points'])} evaluations, "
                             f"{reached}, " + ("cached" if cached else f"{r['seconds']:.0f} s")
                             + "\n")
            return rid, r

        with ThreadPoolExecutor(max_workers=max(1, spec["parallel"])) as pool:
            for rid, r in pool.map(work, todo.items()):
                results[rid] = r

    def settings(m, b):
        return [(lr, length) for length in m["lengths"] for lr in lr_grid(m["lr"], b)]

    # 1. Depth: the whole network and its first block alone (the data-parallel methods) at
    # the reference batch, at every learning rate, trained over the longest length to the
    # end. The best each holds says which targets need depth; a model marked depth_only
    # stops here (a sweep of targets the first block reaches tests nothing).
    depth_rows = []
    for m in models:
        dp = [a for a in spec["methods"] if a["cost"] == "data_parallel"]
        if not m["depth_check"] or not any(a.get("first_stages") for a in dp):
            continue
        b, length = m["reference_batch"], max(m["lengths"])
        grid = lr_grid(m["lr"], b)
        run_all([config(m, a, b, lr, length, seed, whole=True) for a in dp for lr in grid
                 for seed in m["tune_seeds"]], f"depth check ({m['name']})")
        for a in dp:
            best = None
            for lr in grid:
                held = []
                for seed in m["tune_seeds"]:
                    r = results[run_id(config(m, a, b, lr, length, seed, whole=True))]
                    held.append(best_held([p["metrics"][-1] for p in r["points"]],
                                          not m["text"], m["hold"]))
                value = sum(held) / len(held)
                if best is None or (value < best[0] if m["text"] else value > best[0]):
                    best = (value, lr)
            depth_rows.append({"model": m["name"], "method": a["label"],
                               "shallow": bool(a.get("first_stages")), "batch": b,
                               "length": length, "lr": best[1], "best": best[0],
                               "lr_edge": at_edge(grid.index(best[1]), len(grid)),
                               "seeds": len(m["tune_seeds"])})
    all_models, models = models, [m for m in models if not m.get("depth_only")]

    # 2. Profiles first, one at a time, while nothing else runs: every device batch of the
    # sensitivity check, for every stage count (and shallow cut) the methods use.
    # With --plan only profiles already measured: measuring beside a running sweep would skew
    # the step times.
    profiles, unmeasured = {}, []
    for m in models:
        for db in m["device_batches"]:
            for k, first in sorted({(a["stages"], a.get("first_stages") or 0)
                                    for a in spec["methods"]}):
                prof = profile(args, m, k, db, args.out, first or None, measure=not args.plan)
                if prof is None:
                    unmeasured.append(f"{m['name']} K={k}{f' first {first}' if first else ''} "
                                      f"at {db} rows")
                    continue
                cached = prof.pop("cached", False)
                profiles[(m["name"], k, first, db)] = prof
                print(f"profiled {m['name']} K={k}{f' first {first}' if first else ''} at "
                      f"{db} rows{', cached' if cached else ''}", file=sys.stderr)
    # A profile measured while something else ran is slower than the others: the whole
    # network then disagrees with the sum of its stages. Said here and in the report.
    disagreements = profile_disagreements(profiles)
    for line in disagreements:
        print(f"warning: profiles disagree by more than {PROFILE_TOLERANCE:.0%} (measured "
              f"under load? delete them from --cache and measure again): {line}",
              file=sys.stderr)

    # 3. The sweep: every setting on the tune seeds.
    run_all([config(m, a, b, lr, length, seed) for m in models for a in spec["methods"]
             for b in m["batch_sizes"] for lr, length in settings(m, b)
             for seed in m["tune_seeds"]], "tuning (every setting, on the tune seeds)")

    def hit_of(m, a, b, lr, length, seed, target):
        r = results[run_id(config(m, a, b, lr, length, seed))]
        hit = first_reaching([(p["step"], p["metrics"][-1]) for p in r["points"]],
                             target, not m["text"], m["hold"])
        return hit[0] if hit else None

    def choose(m, a, b, target):
        """The setting (lr, length) of a point, chosen on the tune seeds: (index, setting)."""
        candidates = [((lr, length), {seed: hit_of(m, a, b, lr, length, seed, target)
                                      for seed in m["tune_seeds"]})
                      for lr, length in settings(m, b)]
        index, setting, _ = choose_setting(candidates)
        return index, setting

    # Then each point's chosen setting over the seeds it reports.
    run_all([config(m, a, b, *choose(m, a, b, target)[1], seed) for m in models
             for a in spec["methods"] for b in m["batch_sizes"] for target in m["targets"]
             for seed in m["seeds"]], "seeds (each point's chosen setting)")
    if unmeasured:  # only with --plan: the summary points compare measured step times
        print("summary seeds: not yet known; the summary points need these profiles, which "
              "the sweep measures first:")
        for u in unmeasured:
            print(f"  {u}")
        return

    # 4. Points: each method, batch size and target at its best setting (learning rate and
    # schedule length) on the tune seeds, over the seeds it reports; a seed that missed counts
    # at its budget, and makes the point's time a lower bound.
    def point(m, a, b, target, extra_seeds=()):
        prof = profiles[(m["name"], a["stages"], a.get("first_stages") or 0,
                         m["device_batch"])]["stages"]
        flops_per_example = training_flops_per_example(prof, a["cost"])
        index, (lr, length) = choose(m, a, b, target)
        hits = {}
        for seed in list(m["seeds"]) + [s for s in extra_seeds if s not in m["seeds"]]:
            if run_id(config(m, a, b, lr, length, seed)) in results:
                hits[seed] = hit_of(m, a, b, lr, length, seed, target)
        budget = max(1, length // b)
        steps = {s: (v if v is not None else budget) for s, v in hits.items()}
        factors = len(m["lr"]["factors"])
        row = {"model": m["name"], "method": a["label"], "rule": a["rule"],
               "cost_kind": a["cost"], "shallow": bool(a.get("first_stages")),
               "stages": a["stages"], "batch": b, "target": target,
               "flops_per_example": flops_per_example, "lr": lr, "length": length,
               "lr_edge": at_edge(index % factors, factors),
               "seeds": len(hits), "missed": sum(1 for v in hits.values() if v is None),
               "steps_by_seed": steps}
        row["reached"] = row["missed"] == 0
        row["bound"] = not row["reached"]
        mean_steps = sum(steps.values()) / len(steps)
        row["steps"] = mean_steps
        row["steps_sd"] = experiment.mean_sd(list(steps.values()))[1]
        row["examples"] = examples_seen(round(mean_steps), b, m["data"]["train_examples"])
        row["compute_flops"] = row["examples"] * flops_per_example
        for db in m["device_batches"]:
            if b % db:
                continue
            p = profiles[(m["name"], a["stages"], a.get("first_stages") or 0, db)]["stages"]
            replicas = b // db
            micro = replicas if a["cost"] == "pipelined_backprop" else 1
            if a["cost"] == "pipelined_backprop":
                replicas = 1
            step_s = step_seconds(a["cost"], p, replicas, micro, link, latency)
            devices = (a["stages"] if a["cost"] == "pipelined_backprop"
                       else a["stages"] * replicas)
            times = [(v + pipeline_fill(a["cost"], a["stages"])) * step_s
                     for v in steps.values()]
            row.setdefault("by_device_batch", {})[db] = {
                "step_seconds": step_s, "devices": devices, "times": times,
                "time_seconds": sum(times) / len(times)}
        main = row["by_device_batch"][m["device_batch"]]
        row.update({"step_seconds": main["step_seconds"], "devices": main["devices"],
                    "time_seconds": main["time_seconds"], "times": main["times"]})
        return row, (a, b, lr, length)

    def all_rows(extra=None):
        out = []
        for m in models:
            for a in spec["methods"]:
                for b in m["batch_sizes"]:
                    for target in m["targets"]:
                        key = (m["name"], a["label"], b, target)
                        more = m["summary_seeds"] if extra and key in extra else ()
                        out.append(point(m, a, b, target, more))
        return out

    # The summary's points get the summary seeds too: run them, then score again.
    first_pass = all_rows()
    wanted, more_runs = set(), []
    for m in models:
        for target in m["targets"]:
            trows = [(r, s) for r, s in first_pass
                     if r["model"] == m["name"] and r["target"] == target]
            chosen = summary_points(trows, m.get("equal_devices"))
            for pair in (chosen[k] for k in ("backprop", "local", "backprop_equal",
                                              "local_equal")):
                if pair is None:
                    continue
                a, b, lr, length = pair[1]
                wanted.add((m["name"], a["label"], b, target))
                more_runs += [config(m, a, b, lr, length, seed) for seed in m["summary_seeds"]]
    run_all(more_runs, "summary seeds (the summary's points)")
    if args.plan:
        print("every run is done: run it without --plan to write the tables")
        return
    rows = [r for r, _ in all_rows(wanted)]
    head_rows = []
    for m in models:
        text = m["text"]
        # Per-depth heads at the reference batch, all at one step that every run reached.
        b = m["reference_batch"]
        runs = {a["label"]: [results[run_id(config(m, a, b, lr, length, m["tune_seeds"][0]))]
                             for lr, length in settings(m, b)]
                for a in spec["methods"] if a["cost"] != "pipelined_backprop"}
        for method, (step, lr, metrics) in heads_at_common_step(runs, text).items():
            for k, v in enumerate(metrics):
                head_rows.append({"model": m["name"], "method": method, "stage": k + 1,
                                  "stages": len(metrics), "step": step, "lr": lr, "metric": v,
                                  "examples": examples_seen(step, b,
                                                            m["data"]["train_examples"])})

    # 5. The cluster checks: the cost model on this machine against real clusters.
    check_rows = run_checks(args, spec, all_models, link, latency)

    write_csv(os.path.join(args.out, "frontier.csv"), rows,
              ["model", "method", "rule", "stages", "batch", "target", "reached", "bound", "lr",
               "lr_edge", "length", "seeds", "missed", "steps", "steps_sd", "examples",
               "flops_per_example", "compute_flops", "step_seconds", "time_seconds", "devices"])
    write_csv(os.path.join(args.out, "heads.csv"), head_rows,
              ["model", "method", "stages", "stage", "step", "examples", "lr", "metric"])
    write_csv(os.path.join(args.out, "checks.csv"), check_rows,
              CHECK_COLUMNS)

    write_csv(os.path.join(args.out, "depth.csv"), depth_rows,
              ["model", "method", "shallow", "batch", "length", "lr", "lr_edge", "seeds", "best"])
    md = report_markdown(args, spec, models, rows, head_rows, check_rows, plots_dir,
                         os.cpu_count() or 1, depth_rows, all_models,
                         cost=sweep_cost(results.values()), disagreements=disagreements)
    with open(os.path.join(args.out, "FRONTIER.md"), "w") as f:
        f.write(md)
    if args.results:
        dest = os.path.abspath(args.results_plots or os.path.join(
            os.path.dirname(os.path.abspath(args.results)), "results"))
        os.makedirs(dest, exist_ok=True)
        for fname in os.listdir(plots_dir):
            if fname.endswith(".svg"):
                shutil.copy(os.path.join(plots_dir, fname), dest)
        for fname in ("frontier.csv", "heads.csv", "checks.csv", "depth.csv"):
            shutil.copy(os.path.join(args.out, fname),
                        os.path.join(dest, "frontier.csv" if fname == "frontier.csv"
                                     else f"frontier_{fname}"))
        link_dir = os.path.relpath(dest, os.path.dirname(os.path.abspath(args.results)))
        replace_section(args.results, md.replace("](plots/", f"]({link_dir}/"))
    print(f"frontier: {len(results)} runs, {len(rows)} points; "
          f"{os.path.join(args.out, 'FRONTIER.md')}", file=sys.stderr)


def write_csv(path, rows, cols):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def replace_section(path, md):
    """Puts `md` between the frontier markers of `path` (appended when they are absent)."""
    old = open(path).read() if os.path.exists(path) else ""
    block = f"{SECTION_BEGIN}\n{md}\n{SECTION_END}\n"
    if SECTION_BEGIN in old and SECTION_END in old:
        head, rest = old.split(SECTION_BEGIN, 1)
        tail = rest.split(SECTION_END, 1)[1].lstrip("\n")
        new = head + block + tail
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + block
    with open(path, "w") as f:
        f.write(new)


def depth_markdown(depth_rows, models):
    """Which targets need depth: the best the first block alone and the whole network held."""
    md = ["\n## Targets that need depth\n",
          "Data parallelism with the whole network and with its first block alone, at the "
          "reference batch, every learning rate of the grid, trained over the longest length "
          "to its end: the best value each held for `hold` evaluations in a row, at its best "
          "learning rate (mean over the tune seeds; *edge*: at an end of the grid). A target "
          "the first block reaches does not need depth, and a frontier on it says nothing "
          "about deep networks.\n",
          "| model | B | examples | first block alone | whole network | targets | need depth |",
          "|---|---|---|---|---|---|---|"]
    pairs = []  # (model, first block's row, whole network's row)
    for m in models:
        rows = [r for r in depth_rows if r["model"] == m["name"]]
        shallow = next((r for r in rows if r["shallow"]), None)
        whole = next((r for r in rows if not r["shallow"]), None)
        if shallow and whole:
            pairs.append((m, shallow, whole))

    def better(a, b, text):
        return a < b if text else a > b

    def at(r):
        return f"(lr {r['lr']:.2g}{', edge' if r['lr_edge'] else ''})"
    for m, shallow, whole in pairs:
        text = m["text"]
        need = [t for t in m["targets"] if better(t, shallow["best"], text)]
        fmt = (lambda v: f"{v:.3f} bits/byte") if text else (lambda v: f"{100 * v:.2f}%")
        md.append(f"| {m['name']} | {whole['batch']} | {whole['length']} | "
                  f"{fmt(shallow['best'])} {at(shallow)} | {fmt(whole['best'])} {at(whole)} | "
                  f"{', '.join(fmt_target(t, text) for t in m['targets'])} | "
                  f"{len(need)} of {len(m['targets'])} |")
    for m, shallow, whole in pairs:
        if not better(whole["best"], shallow["best"], m["text"]):
            md.append(f"\n**{m['name']}: depth does not pay.** The first block alone holds a "
                      f"value at least as good as the whole network's, so no target needs the "
                      f"deep network"
                      + (", and the model is not swept." if m.get("depth_only") else ".")
                      + "\n")
        elif m.get("depth_only"):
            md.append(f"\n{m['name']} is marked depth_only: not swept.\n")
    return "\n".join(md) + "\n"


def sweep_cost(runs):
    """The training runs' count and CPU core-hours: each run's own CPU time where it was
    recorded, else its wall time (one thread, a core of its own)."""
    runs = list(runs)
    seconds = sum(r.get("cpu_seconds", r["seconds"]) for r in runs)
    measured = sum(1 for r in runs if "cpu_seconds" in r)
    return len(runs), seconds / 3600, measured


def report_markdown(args, spec, models, rows, head_rows, check_rows, plots_dir, cores,
                    depth_rows=(), all_models=(), cost=None, disagreements=()):
    hw = spec["hardware"]
    command = args.command or "python3 " + " ".join(sys.argv)
    md = ["# The compute/time frontier\n",
          "Regenerate with\n", f"```\n{command}\n```\n",
          "Every point is in [frontier.csv](plots/frontier.csv), the heads against depth in "
          "[frontier_heads.csv](plots/frontier_heads.csv) and the cluster checks in "
          "[frontier_checks.csv](plots/frontier_checks.csv).\n"]
    if cost:
        n, hours, measured = cost
        md.append(f"Cost: {n} training runs, {hours:.1f} CPU core-hours ("
                  + ("their CPU time" if measured == n else
                     f"CPU time for {measured}, wall time for the {n - measured} recorded "
                     f"before CPU time was") + "; profiles and cluster checks not counted).\n")
    if disagreements:
        md.append("**Warning: the profiles disagree** (the whole network against the sum of "
                  f"its stages, by more than {PROFILE_TOLERANCE:.0%}), as when they are "
                  "measured while something else runs, so the step times below are suspect: "
                  + "; ".join(disagreements) + ".\n")
    md.append(
        "**The claim** (Laskin, Metz et al.): local parallelism keeps turning compute into "
        "speed after data parallelism (ever larger batches) stops paying off, and it is at its "
        "best in the high-compute regime. Each point below is one method at one batch size B, "
        "at its best setting (learning rate and schedule length); its x is the training "
        "compute it needed to reach the target, its y the time that took under the cost "
        "model.\n")
    md.append(
        "**Cost model** (ideal hardware: as many devices as the batch needs). Every device "
        "computes `device_batch` examples per step; stage times are the medians `localpar "
        "project --json` measured on this machine for that many rows (forward, backward and "
        "update, plus the gradient for the stage's input under backprop and OVERLAP, which "
        "send one upstream from every stage but the first), and links carry "
        f"{hw['link_gbps']} Gbit/s with {hw['latency_us']} us latency. Each profile is "
        "measured once, one at a time, and kept with --cache, so a rerun chooses the same "
        "points; delete the cached profiles to measure them again.\n"
        "- *data parallel*: R = B / device_batch replicas of the whole network; a step is one "
        "replica's pass plus a ring all-reduce of every parameter, 2 (R - 1) / R x the bytes.\n"
        "- *pipelined backprop* (GPipe): K stages, M = B / device_batch micro-batches; a step "
        "is (M + K - 1) slots of the slowest stage, forward and back.\n"
        "- *local* (GREEDY, CHUNKED): K stages x R replicas; stages work on different batches "
        "at once, so a step costs the slowest stage with its head plus that stage's "
        "all-reduce, and the first update reaches the last stage after K - 1 steps.\n"
        "- *OVERLAP* (synchronous): a stage waits for the next stage's gradient of the same "
        "batch, so a step costs the slowest pair of neighbouring stages.\n"
        "- *Compute* is 3 x the forward FLOPs (2 per multiply-add of linear, convolution and "
        "attention layers, counted from the shapes) of the layers and of the heads a method "
        "trains, times the training examples seen. BACKPROP's side heads are detached probes "
        "and are not counted.\n")
    md.append(
        "**Procedure.** Every training run is the in-process reference trainer "
        "(`localpar train`), bitwise equal to a `localpar run` cluster of the same job and "
        "seed. It evaluates every `eval_every_examples` training examples; a target counts as "
        "reached at the first of `hold` evaluations in a row that meet it, and the run stops "
        "there. Settings: lr = base x sqrt(B / base_batch) x factor for each factor of the grid, "
        "and, with a schedule, a linear warm-up over `warmup_examples` then a cosine decay "
        "over the run's length (a sweep dimension: the budget is the longest). Each point is "
        "a method at one B at its best setting over the seeds (the most seeds reaching the "
        "target, then the fewest mean steps); a learning rate at either end of the grid is "
        "marked *(edge)*. A seed that missed counts at its budget and makes the point's time a "
        "lower bound (>). Pipelined backprop computes the same update as backprop, so it "
        "shares data parallelism's runs and differs only in cost. Runs are cached by their "
        "configuration, so the sweep resumes where it stopped.\n")
    if depth_rows:
        md.append(depth_markdown(depth_rows, all_models or models))
    for m in models:
        text = m["text"]
        mrows = [r for r in rows if r["model"] == m["name"]]
        md.append(f"\n## {m['name']}\n")
        lr = m["lr"]
        sched = m.get("schedule")
        sched_text = (f"warm-up over {sched.get('warmup_examples', 0)} examples, then "
                      f"{sched.get('kind', 'COSINE').lower()} to "
                      f"{sched.get('min_lr_fraction', 0):g} x lr over lengths of "
                      f"{', '.join(map(str, m['lengths']))} examples" if sched else
                      "the job's own schedule")
        md.append(
            f"Job `{os.path.relpath(m['job'])}`; {m['data']['train_examples']} training / "
            f"{m['data'].get('validation_examples', m['data'].get('test_examples'))} held-out "
            f"examples; batch sizes {', '.join(map(str, m['batch_sizes']))}; device batch "
            f"{m['device_batch']} (also {', '.join(str(d) for d in m['device_batches'] if d != m['device_batch']) or 'no other'}); "
            f"lr grid {lr['base']:g} x sqrt(B / {lr['base_batch']}) x "
            f"{{{', '.join(f'{f:g}' for f in lr['factors'])}}}; {sched_text}; budget "
            f"{m['max_examples']} training examples; evaluated every {m['eval_every_examples']} "
            f"examples; reached when {m['hold']} evaluations in a row meet the target; "
            + (f"each point's setting chosen on seed{'s' if len(m['tune_seeds']) > 1 else ''} "
               f"{', '.join(map(str, m['tune_seeds']))}, reported over fresh "
               if set(m["tune_seeds"]) != set(m["seeds"]) else "")
            + f"seeds {', '.join(map(str, m['seeds']))} (the summary's points also "
            f"{', '.join(str(x) for x in m['summary_seeds'] if x not in m['seeds']) or 'no more'}). "
            f"Target{'s' if len(m['targets']) > 1 else ''}: "
            f"{', '.join(fmt_target(t, text) for t in m['targets'])} "
            f"({'held-out bits per byte, lower is better' if text else 'test accuracy'}).\n")
        for target in m["targets"]:
            trows = [r for r in mrows if r["target"] == target]
            md.append(f"\n### To {fmt_target(target, text)}\n")
            md.append("| method | B | devices | lr | length (examples) | seeds | steps (mean ± sd) "
                      "| compute (FLOPs) | step (ms) | time to target (s) | on the frontier |")
            md.append("|---|---|---|---|---|---|---|---|---|---|---|")
            reached = [r for r in trows if r["reached"]]
            front = {id(reached[i]) for i in pareto(
                [(r["compute_flops"], r["time_seconds"]) for r in reached])}
            for r in trows:
                edge = " (edge)" if r["lr_edge"] else ""
                seeds = f"{r['seeds']}" + (f", {r['missed']} missed" if r["missed"] else "")
                time_s = (">" if r["bound"] else "") + f"{r['time_seconds']:.3g}"
                md.append(f"| {r['method']} | {r['batch']} | {r['devices']} | {r['lr']:.2g}{edge} "
                          f"| {r['length']} | {seeds} | {r['steps']:.0f} ± {r['steps_sd']:.0f} "
                          f"| {('>' if r['bound'] else '') + fmt_flops(r['compute_flops'])} "
                          f"| {1e3 * r['step_seconds']:.3g} | {time_s} | "
                          f"{'**yes**' if id(r) in front else ''} |")
            md.append("")
            md.append(claim_text(trows, reached, front, target, text))
            series = []
            for a in spec["methods"]:
                pts = sorted((r["batch"], r["compute_flops"], r["time_seconds"]) for r in reached
                             if r["method"] == a["label"])
                series.append((a["label"], [(c, t, b) for b, c, t in pts]))
            if reached:
                fname = plot_frontier(plots_dir, m["name"], target, series, text)
                md.append(f"![{fname}](plots/{fname})\n")
            else:
                md.append("No method reached this target at any batch size: no plot.\n")
        md.append(summary_markdown(mrows, m["targets"], text, m["device_batch"],
                                   m["device_batches"], m.get("equal_devices")))
        # Heads against depth at the reference batch.
        hrows = [h for h in head_rows if h["model"] == m["name"]]
        if hrows:
            series = []
            for a in spec["methods"]:
                pts = [(h["stage"] / h["stages"], h["metric"] * (1 if text else 100))
                       for h in hrows if h["method"] == a["label"]]
                if pts:
                    series.append((a["label"], [(f"{x:.4f}", f"{y:.4f}") for x, y in pts]))
            metric = "held-out bits per byte" if text else "test accuracy (%)"
            seen = hrows[0]["examples"]
            fname = experiment.line_plot(
                plots_dir, f"{m['name']}_heads_by_depth", series,
                f"{m['name']}: each stage's head after {seen} examples, B = "
                f"{m['reference_batch']}", "depth (stage / stages)", metric, "linespoints",
                "set xrange [0:1.05]")
            md.append(f"\nEach stage's head against depth at B = {m['reference_batch']}, after "
                      f"{seen} training examples (step {hrows[0]['step']}: the last evaluation "
                      f"that every run reached, since runs stop at the target), at each "
                      f"method's best learning rate there:\n")
            md.append(f"![{fname}](plots/{fname})\n")
            md.append(overlap_text(hrows, text))
    if check_rows:
        md.append(checks_markdown(check_rows))
    return "\n".join(md) + "\n"


def checks_markdown(check_rows):
    """The cluster-check table and what it shows."""
    cores = check_rows[0]["cores"]
    md = ["\n## The cost model against real clusters\n",
          f"The cost model with this machine's hardware ({cores} cores) against `localpar run` "
          f"clusters over gRPC on loopback; measured is the report's training throughput "
          f"(evaluations excluded), stage times are `localpar project`'s at each worker's rows. "
          f"**Pinned** runs give each worker a core of its own (`--pin_workers`), as separate "
          f"machines would: they test the model's slowest-stage term (and OVERLAP's wait for "
          f"the next stage's gradient) and, with replicas, its exchange term at this machine's "
          f"loopback rate (`allreduce_bench`'s mesh all-gather and sum). **Shared** runs put "
          f"every worker on all {cores} cores, where the model falls back to summed compute "
          f"over the cores. BACKPROP is predicted as one pass through every stage per step.\n",
          "| model | method | K × R | B | workers on | steps | predicted step (ms) "
          "| of it, exchange (ms) | measured step (ms) | error |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for c in check_rows:
        on = "a core each" if c["pinned"] else f"{c['cores']} shared cores"
        md.append(f"| {c['model']} | {c['rule']} | {c['stages']} × {c['replicas']} | "
                  f"{c['batch']} | {on} | {c['steps']} | {c['predicted_step_ms']:.2f} | "
                  f"{c['predicted_exchange_ms']:.2f} | {c['measured_step_ms']:.2f} | "
                  f"{100 * c['error']:+.0f}% |")
    for pinned in (True, False):
        errs = [abs(c["error"]) for c in check_rows if c["pinned"] == pinned]
        if errs:
            md.append(f"\n{'Pinned' if pinned else 'Shared'}: largest error "
                      f"{100 * max(errs):.0f}%, median {100 * median(errs):.0f}%.")
    md.append("\nThe model counts the stages' compute and the replicas' exchange. A cluster "
              "adds activation transfers over gRPC, the coordinator's work (data and "
              "evaluations) on the same cores, and the hand-offs between each worker's "
              "threads.\n")
    return "\n".join(md) + "\n"


def fastest(rows, rules):
    rows = [r for r in rows if r["reached"] and r["rule"] in rules]
    return min(rows, key=lambda r: r["time_seconds"]) if rows else None


def ratio_text(bp, lo, db=None):
    """The speed-up of `lo` over `bp` (time of bp / time of lo) with its bootstrap interval
    over seeds; a bound when either side missed its target in some seed."""
    if db is not None:
        if db not in bp["by_device_batch"] or db not in lo["by_device_batch"]:
            return "n/a"
        a, b = bp["by_device_batch"][db]["times"], lo["by_device_batch"][db]["times"]
    else:
        a, b = bp["times"], lo["times"]
    ratio = (sum(a) / len(a)) / (sum(b) / len(b))
    sign = ">" if bp["bound"] and not lo["bound"] else "<" if lo["bound"] and not bp[
        "bound"] else "~" if bp["bound"] else ""
    if db is not None:
        return f"{sign}{ratio:.2f}x"
    low, high = bootstrap_ratio(a, b)
    return f"{sign}**{ratio:.2f}x** [{low:.2f}, {high:.2f}]"


def summary_markdown(mrows, targets, text, device_batch=None, device_batches=(),
                     equal_devices=None):
    """Per target: the fastest backprop and local points, the speed-up on ideal hardware and
    at equal device counts with 95% bootstrap intervals over seeds, the shallow baseline, and
    how the speed-ups move with the cost model's device batch."""
    others = [d for d in device_batches if d != device_batch]
    out = ["\n### Summary: where local parallelism is on the frontier\n",
           "Speed-up = the backprop point's mean time to the target / the local point's, with a "
           "95% bootstrap interval over seeds in brackets; > or < when one side missed the "
           "target in some seed within its budget (its time is then a lower bound). *Equal "
           "devices*: the fastest point of each with at most "
           + (f"{equal_devices} devices" if equal_devices else
              "as many devices as the fastest backprop point uses") + ".\n",
           "| target | fastest backprop point | time (s) | fastest local point | time (s) "
           "| speed-up, ideal hardware | equal devices: backprop point | local point "
           "| speed-up, equal devices | shallow baseline (first block alone) |"
           + "".join(f" speed-ups at device batch {d} (ideal / equal) |" for d in others),
           "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(others)]
    verdicts = []

    def cell(r):
        if r is None:
            return "none", ""
        devices = f"{r['devices']} device{'s' if r['devices'] != 1 else ''}"
        return (f"{r['method']}, B = {r['batch']} ({devices})",
                ("> " if r["bound"] else "") + f"{r['time_seconds']:.3g}")

    for target in sorted(targets, reverse=text):  # loosest first
        trows = [r for r in mrows if r["target"] == target]
        chosen = summary_points([(r, None) for r in trows], equal_devices)
        bp, lo, bpe, loe = (chosen[k] and chosen[k][0] for k in
                            ("backprop", "local", "backprop_equal", "local_equal"))
        shallow = [r for r in trows if r["shallow"]]
        shallow_best = min(shallow, key=lambda r: (r["bound"], r["time_seconds"]), default=None)
        shallow_text = ("not run" if shallow_best is None else
                        ("missed, > " if shallow_best["bound"] else "")
                        + f"{shallow_best['time_seconds']:.3g} s (B = {shallow_best['batch']})")
        ideal = ratio_text(bp, lo) if bp and lo else "n/a"
        equal = ratio_text(bpe, loe) if bpe and loe else "n/a"
        sens = "".join(
            f" {ratio_text(bp, lo, d) if bp and lo else 'n/a'} / "
            f"{ratio_text(bpe, loe, d) if bpe and loe else 'n/a'} |" for d in others)
        out.append(f"| {fmt_target(target, text)} | {cell(bp)[0]} | {cell(bp)[1]} | "
                   f"{cell(lo)[0]} | {cell(lo)[1]} | {ideal} | {cell(bpe)[0]} | "
                   f"{cell(loe)[0]} | {equal} | {shallow_text} |{sens}")
        if bp and lo:
            low_ideal = bootstrap_ratio(bp["times"], lo["times"])[0]
            low_equal = bootstrap_ratio(bpe["times"], loe["times"])[0] if bpe and loe else None
            verdicts.append((target, low_ideal, low_equal))
    out.append("")
    # Where data parallelism stops paying off, from its points.
    for target in sorted(targets, reverse=text):
        dp = sorted((r for r in mrows if r["target"] == target
                     and r["cost_kind"] == "data_parallel" and not r["shallow"]),
                    key=lambda r: r["batch"])
        if dp:
            b = stops_paying_off([(r["batch"], r["time_seconds"], r["bound"]) for r in dp])
            out.append(f"- To {fmt_target(target, text)}: data parallelism "
                       + (f"stops paying off past B = {b} (the next larger batch is less than "
                          f"1.1x faster, or misses the target)" if b else
                          "still gains at the largest batch size tried")
                       + ".")
    out.append("")
    if verdicts:
        both = [v for v in verdicts if v[1] > 1 and v[2] is not None and v[2] > 1]
        ideal_only = [v for v in verdicts if v[1] > 1]
        parts = []
        for t, a, e in verdicts:
            parts.append(f"{fmt_target(t, text)}: lower end {a:.2f}x on ideal hardware"
                         + (f", {e:.2f}x at equal devices" if e is not None else
                            ", no equal-device comparison"))
        out.append(
            "Verdict for this model: local parallelism is faster with the whole 95% interval "
            f"above 1x at {len(ideal_only)} of {len(verdicts)} targets on ideal hardware, and "
            f"at {len(both)} of {len(verdicts)} at equal device counts ("
            + "; ".join(parts) + ").\n")
    return "\n".join(out)


def claim_text(trows, reached, front, target, text):
    """Where local parallelism stands on this target's frontier, with the numbers."""
    local = [r for r in reached if r["rule"] in ("GREEDY", "CHUNKED", "OVERLAP")]
    dp = [r for r in reached if r["rule"] == "BACKPROP" and not r["shallow"]]
    missing = sorted({r["method"] for r in trows if not r["reached"]})
    out = []
    if local and dp:
        fl = min(local, key=lambda r: r["time_seconds"])
        fd = min(dp, key=lambda r: r["time_seconds"])
        speed = fd["time_seconds"] / fl["time_seconds"]
        verdict = (f"**{speed:.2f}x faster**" if speed >= 1 else f"**{1 / speed:.2f}x slower**")
        out.append(
            f"Fastest local point: {fl['method']} at B = {fl['batch']}, "
            f"{fl['time_seconds']:.3g} s with {fmt_flops(fl['compute_flops'])} FLOPs; fastest "
            f"backprop point: {fd['method']} at B = {fd['batch']}, {fd['time_seconds']:.3g} s "
            f"with {fmt_flops(fd['compute_flops'])} FLOPs. Local parallelism is {verdict}, "
            f"for {fl['compute_flops'] / fd['compute_flops']:.2f}x the compute.")
        cheapest = min(reached, key=lambda r: r["compute_flops"])
        out.append(f"Least compute: {cheapest['method']} at B = {cheapest['batch']} "
                   f"({fmt_flops(cheapest['compute_flops'])} FLOPs).")
        on = sorted({r["method"] for r in reached if id(r) in front})
        out.append(f"On the frontier: {', '.join(on)}.")
    elif dp:
        out.append("No local method reached this target within the budget.")
    if missing:
        out.append(f"Not reached at some batch size: {', '.join(missing)}.")
    return " ".join(out) + "\n"


def overlap_text(hrows, text):
    by = {}
    for h in hrows:
        if h["stage"] == h["stages"]:
            by[h["method"]] = h["metric"]
    parts = [f"{k}: {v:.3f}" if text else f"{k}: {100 * v:.2f}%" for k, v in by.items()]
    out = "Last head: " + "; ".join(parts) + "."
    overlap = {k: v for k, v in by.items() if k.startswith("OVERLAP")}
    for k, v in overlap.items():
        greedy = by.get(k.replace("OVERLAP", "GREEDY"))
        if greedy is not None:
            d = v - greedy
            out += (f" OVERLAP against GREEDY with as many stages: {d:+.3f} bits/byte"
                    if text else
                    f" OVERLAP against GREEDY with as many stages: {100 * d:+.2f} points")
            out += f" ({'better' if (d < 0 if text else d > 0) else 'worse'})."
    return out + "\n"


if __name__ == "__main__":
    main()
