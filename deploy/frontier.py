#!/usr/bin/env python3
"""The compute/time frontier: time to a target against compute to it, for data parallelism,
pipelined backprop and local parallelism (GREEDY, CHUNKED, OVERLAP with K stages).

The sweep is read from a JSON file (deploy/experiments/frontier.json):

  {
    "name": "frontier",
    "threads": 1,                 # CPU GEMM threads per training process
    "parallel": 2,                # training processes at once (they share the cores)
    "hardware": {"link_gbps": 100, "latency_us": 5},   # the cost model's interconnect
    "models": [{
      "job": "../jobs/fashion_mlp8.textproto",
      "targets": [0.83, 0.85],    # accuracy (higher is better) or bits per byte (lower)
      "batch_sizes": [32, 128, 512, 2048],
      "device_batch": 32,         # examples one device computes per step (the cost model)
      "lr": {"base": 1e-3, "base_batch": 128, "factors": [1, 2]},
      "max_examples": 300000, "eval_every_examples": 20000, "seed": 1,
      "reference_batch": 128      # where the per-depth head plot is drawn
    }],
    "methods": [
      {"label": "data parallel", "rule": "BACKPROP", "stages": 1, "cost": "data_parallel"},
      {"label": "pipelined backprop K=8", "rule": "BACKPROP", "stages": 8,
       "cost": "pipelined_backprop", "train_stages": 1},
      {"label": "GREEDY K=4", "rule": "GREEDY", "stages": 4, "cost": "local"}, ...
    ],
    "cluster_checks": [{"model": "fashion_mlp8", "method": "GREEDY K=4", "batch": 128,
                        "steps": 300}]
  }

Every training run is the in-process reference trainer (`localpar train`), which is bitwise
equal to a `localpar run` cluster with the same job and seed. A run evaluates every
`eval_every_examples` training examples and stops once the last stage reaches the model's
strictest target (or after max_examples training examples). Each learning rate of the grid
lr = base x sqrt(B / base_batch) x factor is run for each batch size B, and each method's
point at B is its fastest learning rate to the target.

Cost model (ideal hardware: as many devices as the batch needs, each computing
`device_batch` examples per step, times measured on this machine by `localpar project --json`
for that many examples; see RESULTS.md for its statement). Compute to the target counts
3 x the forward FLOPs of every layer and of every head the method trains, per example seen.

Outputs under --out: profiles/, runs/<run>/ (run.json, metrics.jsonl, run.log),
frontier.csv, heads.csv, checks.csv, plots/*.svg and FRONTIER.md; with --results, the
Markdown also replaces the frontier section of that file and the plots are copied next to it.
"""

import csv
import json
import math
import os
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


def first_reaching(points, target, higher_is_better):
    """The first (step, value) of `points` (in step order) that meets `target`, or None."""
    for step, value in points:
        if (value >= target) if higher_is_better else (value <= target):
            return step, value
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
        m.setdefault("reference_batch", m["batch_sizes"][0])
        if m["reference_batch"] not in m["batch_sizes"]:
            fail(f"{where}.reference_batch: must be one of batch_sizes")
    labels = set()
    for i, a in enumerate(spec["methods"]):
        where = f"{path}: methods[{i}]"
        if not isinstance(a, dict) or a.get("rule") not in experiment.RULES:
            fail(f"{where}.rule: must be one of {', '.join(experiment.RULES)}")
        if a.get("cost") not in COSTS:
            fail(f"{where}.cost: must be one of {', '.join(COSTS)}")
        for key in ("stages", "train_stages"):
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
    spec.setdefault("name", "frontier")
    spec.setdefault("threads", 1)
    spec.setdefault("parallel", 1)
    hw = spec.setdefault("hardware", {})
    hw.setdefault("link_gbps", 100)
    hw.setdefault("latency_us", 5)
    return spec


def profile(args, model, stages, batch, out_dir):
    """`localpar project --json` of the job regrouped into `stages` at `batch` rows."""
    path = os.path.join(out_dir, "profiles", f"{model['name']}-K{stages}-b{batch}.json")
    if args.reuse and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cmd = [args.localpar, "project", model["job"], "--json", f"--stages={stages}",
           f"--batch_size={batch}", "--project_stages=1", f"--threads={args.spec['threads']}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"profile failed (exit {out.returncode}): {' '.join(cmd)}: {out.stderr.strip()}")
    with open(path, "w") as f:
        f.write(out.stdout)
    return json.loads(out.stdout)


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


def train_run(args, model, method, batch, lr, run_dir):
    """One run of the reference trainer, stopped at the strictest target. Returns run.json."""
    result_path = os.path.join(run_dir, "run.json")
    if args.reuse and os.path.exists(result_path):
        with open(result_path) as f:
            return json.load(f)
    os.makedirs(run_dir, exist_ok=True)
    train_n = model["data"]["train_examples"]
    every = max(1, model["eval_every_examples"] // batch)
    cmd = [args.localpar, "train", model["job"], f"--rule={method['rule']}",
           f"--stages={method['train_stages']}", f"--batch_size={batch}", f"--lr={lr:.6g}",
           f"--seed={model['seed']}", "--epochs=1000",
           f"--max_steps={max(1, model['max_examples'] // batch)}",
           f"--eval_every_steps={every}", f"--threads={args.spec['threads']}", "--quiet",
           f"--out={run_dir}"]
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    text = model["text"]
    strictest = min(model["targets"]) if text else max(model["targets"])
    start = time.monotonic()
    stopped = False
    with open(os.path.join(run_dir, "run.log"), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        evals = EvalPoints(metrics, method["train_stages"], text)
        while proc.poll() is None:
            time.sleep(0.5)
            points = evals.update()
            if first_reaching([(s, v[-1]) for s, v in points], strictest, not text):
                proc.send_signal(signal.SIGTERM)  # reached: the rest would be wasted compute
                stopped = True
                proc.wait()
    code = proc.returncode
    if code != 0 and not stopped:
        fail(f"run failed (exit {code}): {' '.join(cmd)}; see {run_dir}/run.log")
    points = evals.update()
    result = {
        "rule": method["rule"], "stages": method["train_stages"], "batch": batch, "lr": lr,
        "seed": model["seed"], "stopped_at_target": stopped,
        "seconds": time.monotonic() - start,
        "points": [{"step": s, "examples": examples_seen(s, batch, train_n), "metrics": v}
                   for s, v in points],
    }
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)
    return result


def cluster_check(args, model, method, batch, lr, steps, out_dir):
    """A real `localpar run` cluster for `steps` steps: its measured training throughput."""
    run_dir = os.path.join(out_dir, "checks",
                           f"{model['name']}-{method['label'].replace(' ', '_')}-b{batch}")
    report_path = os.path.join(run_dir, "report.json")
    if not (args.reuse and os.path.exists(report_path)):
        os.makedirs(run_dir, exist_ok=True)
        cmd = [args.localpar, "run", model["job"], f"--rule={method['rule']}",
               f"--stages={method['train_stages']}", f"--batch_size={batch}", f"--lr={lr:.6g}",
               f"--seed={model['seed']}", f"--max_steps={steps}", "--epochs=1000",
               f"--threads={args.spec['threads']}", "--quiet", f"--out={run_dir}"]
        with open(os.path.join(run_dir, "run.log"), "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            fail(f"cluster check failed (exit {code}): {' '.join(cmd)}; see {run_dir}/run.log")
    with open(report_path) as f:
        return json.load(f)


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


def main():
    args = experiment.parse_args(
        __doc__, "sweep file (JSON)", "replace the frontier section of this Markdown file",
        "read back runs and profiles that already exist instead of redoing them")
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

    # 1. Profiles first, one at a time, while nothing else runs.
    profiles = {}
    for m in models:
        ks = sorted({a["stages"] for a in spec["methods"]})
        for k in ks:
            profiles[(m["name"], k)] = profile(args, m, k, m["device_batch"], args.out)
            print(f"profiled {m['name']} K={k} at {m['device_batch']} rows", file=sys.stderr)

    # 2. The training runs: (model, rule, train stages, batch, lr), shared between methods.
    jobs = {}
    for m in models:
        for a in spec["methods"]:
            for b in m["batch_sizes"]:
                for lr in lr_grid(m["lr"], b):
                    key = (m["name"], a["rule"], a["train_stages"], b, f"{lr:.6g}")
                    jobs.setdefault(key, (m, a, b, lr))
    total = len(jobs)
    results = {}
    done = [0]

    def work(item):
        key, (m, a, b, lr) = item
        rid = f"{m['name']}-{a['rule']}-K{a['train_stages']}-b{b}-lr{key[4]}"
        r = train_run(args, m, a, b, lr, os.path.join(args.out, "runs", rid))
        done[0] += 1
        reached = "reached" if r["stopped_at_target"] else "budget"
        print(f"[{done[0]}/{total}] {rid}: {len(r['points'])} evaluations, {reached}, "
              f"{r['seconds']:.0f} s", file=sys.stderr)
        return key, r

    with ThreadPoolExecutor(max_workers=max(1, spec["parallel"])) as pool:
        for key, r in pool.map(work, jobs.items()):
            results[key] = r

    # 3. Points: each method, batch size and target, at its fastest learning rate.
    rows, head_rows = [], []
    for m in models:
        text = m["text"]
        for a in spec["methods"]:
            prof = profiles[(m["name"], a["stages"])]["stages"]
            flops_per_example = training_flops_per_example(prof, a["cost"])
            for b in m["batch_sizes"]:
                replicas = b // m["device_batch"]
                micro = replicas if a["cost"] == "pipelined_backprop" else 1
                if a["cost"] == "pipelined_backprop":
                    replicas = 1
                step_s = step_seconds(a["cost"], prof, replicas, micro, link, latency)
                devices = (a["stages"] if a["cost"] == "pipelined_backprop"
                           else a["stages"] * replicas)
                for target in m["targets"]:
                    best = None
                    for lr in lr_grid(m["lr"], b):
                        r = results[(m["name"], a["rule"], a["train_stages"], b, f"{lr:.6g}")]
                        hit = first_reaching([(pt["step"], pt["metrics"][-1]) for pt in r["points"]],
                                             target, not text)
                        if hit and (best is None or hit[0] < best[0]):
                            best = (hit[0], lr, r)
                    row = {"model": m["name"], "method": a["label"], "rule": a["rule"],
                           "stages": a["stages"], "batch": b, "target": target,
                           "devices": devices, "step_seconds": step_s,
                           "flops_per_example": flops_per_example, "reached": best is not None}
                    if best:
                        steps, lr, r = best
                        ex = examples_seen(steps, b, m["data"]["train_examples"])
                        row.update({"lr": lr, "steps": steps, "examples": ex,
                                    "compute_flops": ex * flops_per_example,
                                    "time_seconds": (steps + pipeline_fill(a["cost"], a["stages"]))
                                    * step_s})
                    rows.append(row)
        # Per-depth heads at the reference batch, all at one step that every run reached.
        b = m["reference_batch"]
        runs = {a["label"]: [results[(m["name"], a["rule"], a["train_stages"], b, f"{lr:.6g}")]
                             for lr in lr_grid(m["lr"], b)]
                for a in spec["methods"] if a["cost"] != "pipelined_backprop"}
        for method, (step, lr, metrics) in heads_at_common_step(runs, text).items():
            for k, v in enumerate(metrics):
                head_rows.append({"model": m["name"], "method": method, "stage": k + 1,
                                  "stages": len(metrics), "step": step, "lr": lr, "metric": v,
                                  "examples": examples_seen(step, b,
                                                            m["data"]["train_examples"])})

    # 4. The cluster checks: the cost model on this machine against real clusters.
    check_rows = []
    cores = os.cpu_count() or 1
    for c in spec.get("cluster_checks", []):
        m = next(x for x in models if x["name"] == c["model"])
        a = next(x for x in spec["methods"] if x["label"] == c["method"])
        lr = lr_grid(m["lr"], c["batch"])[0]
        prof = profile(args, m, a["train_stages"], c["batch"], args.out)["stages"]
        # BACKPROP without micro-batches: each batch forward through every stage and back.
        cost = "data_parallel" if a["rule"] == "BACKPROP" else a["cost"]
        predicted = step_seconds(cost, prof, 1, 1, link, latency, cores=cores)
        report = cluster_check(args, m, a, c["batch"], lr, c["steps"], args.out)
        measured = c["batch"] / report["examples_per_second"]
        check_rows.append({"model": m["name"], "method": a["label"], "batch": c["batch"],
                           "steps": report["steps"], "predicted_step_ms": 1e3 * predicted,
                           "measured_step_ms": 1e3 * measured,
                           "error": measured / predicted - 1})

    write_csv(os.path.join(args.out, "frontier.csv"), rows,
              ["model", "method", "rule", "stages", "batch", "target", "reached", "lr", "steps",
               "examples", "flops_per_example", "compute_flops", "step_seconds", "time_seconds",
               "devices"])
    write_csv(os.path.join(args.out, "heads.csv"), head_rows,
              ["model", "method", "stages", "stage", "step", "examples", "lr", "metric"])
    write_csv(os.path.join(args.out, "checks.csv"), check_rows,
              ["model", "method", "batch", "steps", "predicted_step_ms", "measured_step_ms",
               "error"])

    md = report_markdown(args, spec, models, rows, head_rows, check_rows, plots_dir, cores)
    with open(os.path.join(args.out, "FRONTIER.md"), "w") as f:
        f.write(md)
    if args.results:
        dest = os.path.abspath(args.results_plots or os.path.join(
            os.path.dirname(os.path.abspath(args.results)), "results"))
        os.makedirs(dest, exist_ok=True)
        for fname in os.listdir(plots_dir):
            if fname.endswith(".svg"):
                shutil.copy(os.path.join(plots_dir, fname), dest)
        for fname in ("frontier.csv", "heads.csv", "checks.csv"):
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


def report_markdown(args, spec, models, rows, head_rows, check_rows, plots_dir, cores):
    hw = spec["hardware"]
    command = args.command or "python3 " + " ".join(sys.argv)
    md = ["# The compute/time frontier\n",
          "Regenerate with\n", f"```\n{command}\n```\n",
          "Every point is in [frontier.csv](plots/frontier.csv), the heads against depth in "
          "[frontier_heads.csv](plots/frontier_heads.csv) and the cluster checks in "
          "[frontier_checks.csv](plots/frontier_checks.csv).\n"]
    md.append(
        "**The claim** (Laskin, Metz et al.): local parallelism keeps turning compute into "
        "speed after data parallelism (ever larger batches) stops paying off, and it is at its "
        "best in the high-compute regime. Each point below is one method at one batch size B, "
        "at the fastest learning rate of its grid; its x is the training compute it needed "
        "to reach the target, its y the time that took under the cost model.\n")
    md.append(
        "**Cost model** (ideal hardware: as many devices as the batch needs). Every device "
        "computes `device_batch` examples per step; stage times are the medians `localpar "
        "project --json` measured on this machine for that many rows (forward, backward and "
        "update, plus the gradient for the stage's input under backprop and OVERLAP, which "
        "send one upstream from every stage but the first), and links carry "
        f"{hw['link_gbps']} Gbit/s with {hw['latency_us']} us latency.\n"
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
        "seed. It evaluates every `eval_every_examples` training examples and stops at the "
        "strictest target, so steps to a target are resolved to one evaluation interval. "
        "Learning rates: lr = base x sqrt(B / base_batch) x factor for each factor of the "
        "grid, for every method alike (constant schedule, AdamW). Pipelined backprop computes "
        "the same update as backprop (its micro-batch gradients add up to the batch's), so it "
        "shares data parallelism's runs and differs only in cost. One seed per point.\n")
    for m in models:
        text = m["text"]
        mrows = [r for r in rows if r["model"] == m["name"]]
        md.append(f"\n## {m['name']}\n")
        lr = m["lr"]
        md.append(
            f"Job `{os.path.relpath(m['job'])}`; {m['data']['train_examples']} training / "
            f"{m['data'].get('validation_examples', m['data'].get('test_examples'))} held-out examples; batch sizes "
            f"{', '.join(map(str, m['batch_sizes']))}; device batch {m['device_batch']}; "
            f"lr grid {lr['base']:g} x sqrt(B / {lr['base_batch']}) x "
            f"{{{', '.join(f'{f:g}' for f in lr['factors'])}}}; at most {m['max_examples']} "
            f"training examples; evaluated every {m['eval_every_examples']} examples; seed {m['seed']}. "
            f"Target{'s' if len(m['targets']) > 1 else ''}: "
            f"{', '.join(fmt_target(t, text) for t in m['targets'])} "
            f"({'held-out bits per byte, lower is better' if text else 'test accuracy'}).\n")
        for target in m["targets"]:
            trows = [r for r in mrows if r["target"] == target]
            md.append(f"\n### To {fmt_target(target, text)}\n")
            md.append("| method | B | devices | lr | steps | examples | compute (FLOPs) "
                      "| step (ms) | time to target (s) | on the frontier |")
            md.append("|---|---|---|---|---|---|---|---|---|---|")
            reached = [r for r in trows if r["reached"]]
            front = {id(reached[i]) for i in pareto(
                [(r["compute_flops"], r["time_seconds"]) for r in reached])}
            for r in trows:
                if r["reached"]:
                    md.append(f"| {r['method']} | {r['batch']} | {r['devices']} | {r['lr']:.2g} "
                              f"| {r['steps']} | {r['examples']} | {fmt_flops(r['compute_flops'])} "
                              f"| {1e3 * r['step_seconds']:.3g} | {r['time_seconds']:.3g} | "
                              f"{'**yes**' if id(r) in front else ''} |")
                else:
                    md.append(f"| {r['method']} | {r['batch']} | {r['devices']} | | not reached "
                              f"in {m['max_examples']} examples | | | "
                              f"{1e3 * r['step_seconds']:.3g} | | |")
            md.append("")
            md.append(claim_text(trows, reached, front, target, text))
            series = []
            for a in spec["methods"]:
                pts = sorted((r["batch"], r["compute_flops"], r["time_seconds"]) for r in reached
                             if r["method"] == a["label"])
                series.append((a["label"], [(c, t, b) for b, c, t in pts]))
            fname = plot_frontier(plots_dir, m["name"], target, series, text)
            md.append(f"![{fname}](plots/{fname})\n")
        md.append(summary_markdown(mrows, m["targets"], text))
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
        md.append("\n## The cost model against real clusters\n")
        md.append(
            f"The same model with this machine's hardware ({cores} cores shared by the K "
            f"workers, one device per stage, no replicas, stage times measured at the run's "
            f"batch) against `localpar run` clusters over gRPC on loopback; measured is the "
            f"report's training throughput (evaluations excluded). BACKPROP is predicted as "
            f"one pass through every stage per step.\n")
        md.append("| model | method | B | steps | predicted step (ms) | measured step (ms) "
                  "| error |")
        md.append("|---|---|---|---|---|---|---|")
        for c in check_rows:
            md.append(f"| {c['model']} | {c['method']} | {c['batch']} | {c['steps']} | "
                      f"{c['predicted_step_ms']:.2f} | {c['measured_step_ms']:.2f} | "
                      f"{100 * c['error']:+.0f}% |")
        worst = max(abs(c["error"]) for c in check_rows)
        plain = [abs(c["error"]) for c in check_rows if not c["method"].startswith("OVERLAP")]
        md.append(f"\nLargest error: {100 * worst:.0f}%"
                  + (f"; {100 * max(plain):.0f}% without OVERLAP" if plain else "") + ". "
                  "The model counts the stages' compute only. A cluster adds activation "
                  "transfers over gRPC, the coordinator's work and the thread hand-offs of K "
                  "workers that share the cores; synchronous OVERLAP also waits for the next "
                  "stage's gradient to come back every step, a round trip "
                  "the profile's median stage times do not include.\n")
    return "\n".join(md) + "\n"


def fastest(rows, rules):
    rows = [r for r in rows if r["reached"] and r["rule"] in rules]
    return min(rows, key=lambda r: r["time_seconds"]) if rows else None


def summary_markdown(mrows, targets, text):
    """One line per target: the fastest backprop and local points, and the ratios."""
    out = ["\n### Summary: where local parallelism is on the frontier\n",
           "| target | fastest backprop point | time (s) | compute | fastest local point "
           "| time (s) | compute | local speed-up | compute, local / backprop "
           "| local arms that miss the target at some B |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    speedups = []
    for target in sorted(targets, reverse=text):  # loosest first
        trows = [r for r in mrows if r["target"] == target]
        bp = fastest(trows, ("BACKPROP",))
        lo = fastest(trows, ("GREEDY", "CHUNKED", "OVERLAP"))
        missing = sorted({f"{r['method']} (B = {r['batch']})" for r in trows
                          if not r["reached"] and r["rule"] != "BACKPROP"})
        if not bp or not lo:
            out.append(f"| {fmt_target(target, text)} | {bp and bp['method'] or 'none'} | | | "
                       f"{lo and lo['method'] or 'none'} | | | | | {', '.join(missing)} |")
            continue
        speed = bp["time_seconds"] / lo["time_seconds"]
        speedups.append((target, speed, lo["compute_flops"] / bp["compute_flops"]))
        out.append(f"| {fmt_target(target, text)} | {bp['method']}, B = {bp['batch']} | "
                   f"{bp['time_seconds']:.3g} | {fmt_flops(bp['compute_flops'])} | "
                   f"{lo['method']}, B = {lo['batch']} | {lo['time_seconds']:.3g} | "
                   f"{fmt_flops(lo['compute_flops'])} | **{speed:.2f}x** | "
                   f"{lo['compute_flops'] / bp['compute_flops']:.2f}x | "
                   f"{', '.join(missing) or 'none'} |")
    out.append("")
    # By method (stage count), the fastest point at each target: where more stages help
    # and where they stop reaching the target.
    ordered = sorted(targets, reverse=text)
    methods = list(dict.fromkeys(r["method"] for r in mrows))
    out.append("Each method's fastest point per target (time to target in s, and its compute "
               "in FLOPs; *missed*: no batch size reached it):\n")
    out.append("| method | " + " | ".join(fmt_target(t, text) for t in ordered) + " |")
    out.append("|---|" + "---|" * len(ordered))
    for method in methods:
        cells = []
        for t in ordered:
            f = fastest([r for r in mrows if r["method"] == method and r["target"] == t],
                        ("BACKPROP", "GREEDY", "CHUNKED", "OVERLAP"))
            cells.append(f"{f['time_seconds']:.3g} s, {fmt_flops(f['compute_flops'])} (B = "
                         f"{f['batch']})" if f else "*missed*")
        out.append(f"| {method} | " + " | ".join(cells) + " |")
    out.append("")
    if speedups:
        lo_s, hi_s = min(s for _, s, _ in speedups), max(s for _, s, _ in speedups)
        first, last = speedups[0], speedups[-1]
        verdict = ("supports the claim" if lo_s > 1 else
                   "does not support the claim at every target")
        out.append(
            f"Verdict for this model: at every target the fastest point is "
            f"{'a local rule' if lo_s > 1 else 'not always a local rule'}, "
            f"{lo_s:.2f}x to {hi_s:.2f}x sooner than the fastest backprop point (data "
            f"parallelism or pipelined backprop), which {verdict}. The lead goes from "
            f"{first[1]:.2f}x at {fmt_target(first[0], text)} to {last[1]:.2f}x at "
            f"{fmt_target(last[0], text)}, for {first[2]:.2f}x and {last[2]:.2f}x the "
            f"compute.\n")
    return "\n".join(out)


def claim_text(trows, reached, front, target, text):
    """Where local parallelism stands on this target's frontier, with the numbers."""
    local = [r for r in reached if r["rule"] in ("GREEDY", "CHUNKED", "OVERLAP")]
    dp = [r for r in reached if r["rule"] == "BACKPROP"]
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
