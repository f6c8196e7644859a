#!/usr/bin/env python3
"""Runs a matrix of localpar training runs and writes a results table, CSV files and plots.

The matrix is models x arms x seeds, read from a JSON file (see deploy/experiments/):

  {
    "name": "paper",
    "threads": 1,                                   # CPU GEMM threads per process
    "models": [{"job": "../jobs/fashion_resnet.textproto", "epochs": 2}, ...],
    "arms": [{"rule": "BACKPROP"}, {"rule": "CHUNKED", "stages": 2}, ...],
    "seeds": [1],
    "trainer": "cluster",                           # or "reference"
    "parallel": 1                                   # runs at once
  }

Each run is a real local cluster: `localpar run JOB --rule R --stages K --seed S --out DIR`
(one worker process per stage plus the coordinator, over gRPC on loopback). With
"trainer": "reference" a run is `localpar train` instead: every stage in one process, one
core per run, and the same weights bit for bit (clusters on CPU are bitwise equal to the
reference trainer), for long sweeps where only the figures matter. An arm's
`stages` regroups the job's stages into that many (CHUNKED with 2 chunks is CHUNKED with
stages 2); without it the job's own stages are used. Model-level `epochs` and `max_steps`
override the job's budget.

Outputs under --out: runs/<run>/ (report.json, the run's log, its training curve),
results.csv (one row per run), stages.csv (every stage head's test figures), curves.csv
(per-stage training loss against wall time), plots/*.svg (gnuplot) and RESULTS.md.
With --reuse, runs whose report.json already exists are read back instead of rerun.
With --cache DIR, each finished run's report and curve are also kept in DIR under its whole
configuration (the job file's contents, rule, stages, seed, budget, threads, device,
trainer), so a sweep spread over sessions resumes from a committed cache; --done_only then
writes the tables from the runs finished so far and names the ones still missing.

Over several seeds, each arm's gap to BACKPROP is paired by seed and given with a 95%
confidence interval (Student's t over the per-seed differences).
"""

import argparse
import concurrent.futures
import csv
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading

RULES = ("BACKPROP", "GREEDY", "CHUNKED", "OVERLAP")
# deploy/frontier.py owns the part of the results file between these markers; a rewrite of
# the file here keeps it.
FRONTIER_BEGIN = "<!-- frontier: begin (written by deploy/frontier.py) -->"
FRONTIER_END = "<!-- frontier: end -->"


PROGRAM = "experiment"  # the name errors start with (deploy/frontier.py sets its own)


def section_markers(name):
    return (f"<!-- experiment {name}: begin (written by deploy/experiment.py) -->",
            f"<!-- experiment {name}: end -->")


def replace_section(old, name, text):
    """The results file with experiment `name`'s section (between its markers) replaced by
    `text`, or added before the frontier's section (or at the end) when it has none yet.
    Every other experiment's section and the frontier's are kept as they are."""
    begin, end = section_markers(name)
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    if begin in old and end in old:
        start = old.index(begin)
        stop = old.index(end, start) + len(end)
        return old[:start] + block.rstrip("\n") + old[stop:]
    if FRONTIER_BEGIN in old:
        at = old.index(FRONTIER_BEGIN)
        return old[:at] + block + "\n" + old[at:]
    return (old.rstrip("\n") + "\n\n" if old.strip() else "") + block


SAY = threading.Lock()


def say(line):
    """One progress line on stderr, whole even when runs go in parallel."""
    with SAY:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def fail(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def read_json(path):
    """A JSON file, or exit 2 naming the file and, for bad JSON, the line and column."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{path}:{e.lineno}:{e.colno}: {e.msg}")


def is_lr(x):
    """Whether a spec's value is a usable peak learning rate (a number in (0, 10))."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 10


def load_spec(path):
    spec = read_json(path)
    base = os.path.dirname(os.path.abspath(path))
    if not isinstance(spec.get("models"), list) or not spec["models"]:
        fail(f"{path}: models: a non-empty list is required")
    if not isinstance(spec.get("arms"), list) or not spec["arms"]:
        fail(f"{path}: arms: a non-empty list is required")
    for i, m in enumerate(spec["models"]):
        if not isinstance(m, dict) or not isinstance(m.get("job"), str):
            fail(f"{path}: models[{i}].job: a job file path is required")
        m["job"] = os.path.normpath(os.path.join(base, m["job"]))
        if not os.path.exists(m["job"]):
            fail(f"{path}: models[{i}].job: {m['job']} does not exist")
        for key in ("epochs", "max_steps"):
            if key in m and (not isinstance(m[key], int) or m[key] < 1):
                fail(f"{path}: models[{i}].{key}: must be a positive integer")
        # A model may set the peak learning rate (`--lr`) of every arm on it that sets none
        # of its own (a rate tuned once, in another experiment, reused here).
        if "lr" in m and not is_lr(m["lr"]):
            fail(f"{path}: models[{i}].lr: a learning rate between 0 and 10")
    for i, a in enumerate(spec["arms"]):
        if not isinstance(a, dict) or a.get("rule") not in RULES:
            fail(f"{path}: arms[{i}].rule: must be one of {', '.join(RULES)}")
        if "stages" in a and (not isinstance(a["stages"], int) or a["stages"] < 1):
            fail(f"{path}: arms[{i}].stages: must be a positive integer")
        # An arm may train a variant of the model's job (its own heads, learning rates per
        # stage): that job file, under a label of its own.
        if "job" in a:
            if not isinstance(a["job"], str) or not isinstance(a.get("label"), str):
                fail(f"{path}: arms[{i}]: an arm's job needs a label")
            if len(spec["models"]) != 1:
                fail(f"{path}: arms[{i}].job: a variant job needs a spec with one model")
            a["job"] = os.path.normpath(os.path.join(base, a["job"]))
            if not os.path.exists(a["job"]):
                fail(f"{path}: arms[{i}].job: {a['job']} does not exist")
        # An arm may set the schedule's peak learning rate (`--lr`), under a label of its own.
        if "lr" in a:
            if not is_lr(a["lr"]):
                fail(f"{path}: arms[{i}].lr: a learning rate between 0 and 10")
            if not isinstance(a.get("label"), str):
                fail(f"{path}: arms[{i}]: an arm's lr needs a label")
        if "label" in a and (not isinstance(a["label"], str) or not a["label"]
                             or not re.fullmatch(r"[A-Za-z0-9_.+/=-]+", a["label"])):
            fail(f"{path}: arms[{i}].label: letters, digits and _.+/=- only")
    def check_seeds(seeds, where):
        if not isinstance(seeds, list) or not seeds or not all(
                isinstance(s, int) and s >= 0 for s in seeds):
            fail(f"{path}: {where}: a non-empty list of integers >= 0")
        return seeds

    spec["seeds"] = check_seeds(spec.get("seeds", [1]), "seeds")
    for i, m in enumerate(spec["models"]):
        m["seeds"] = check_seeds(m.get("seeds", spec["seeds"]), f"models[{i}].seeds")
    spec.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    spec.setdefault("trainer", "cluster")
    if spec["trainer"] not in ("cluster", "reference"):
        fail(f"{path}: trainer: must be cluster or reference")
    spec.setdefault("parallel", 1)
    if not isinstance(spec["parallel"], int) or spec["parallel"] < 1:
        fail(f"{path}: parallel: must be a positive integer")
    if "tune" in spec:
        t = spec["tune"]
        if not isinstance(t, dict) or not isinstance(t.get("lrs"), list) or len(t["lrs"]) < 2 \
                or not all(is_lr(x) for x in t["lrs"]):
            fail(f"{path}: tune.lrs: a list of at least 2 learning rates between 0 and 10")
        t["lrs"] = sorted(t["lrs"])
        t["seeds"] = check_seeds(t.get("seeds", [1]), "tune.seeds")
        for i, m in enumerate(spec["models"]):
            if "lr" in m:
                fail(f"{path}: models[{i}].lr: a fixed rate and tune exclude each other")
    spec.setdefault("threads", 1)
    spec.setdefault("device", "cpu")
    return spec


def model_name(job_path):
    with open(job_path) as f:
        m = re.search(r'^\s*name:\s*"([^"]+)"', f.read(), re.M)
    return m.group(1) if m else os.path.splitext(os.path.basename(job_path))[0]


def data_figures(localpar, job):
    out = subprocess.run([localpar, "data", job], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{job}: cannot load its data: {out.stderr.strip()}")
    return json.loads(out.stdout)


def mean_sd(values):
    """The mean and the sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# Student's t for a two-sided 95% interval, by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    if df > 30:
        return 1.96
    return T95[max(k for k in T95 if k <= df)]


def paired_gap(values, reference):
    """Mean of the per-seed differences values[s] - reference[s] over the seeds both have,
    its 95% interval (Student's t; None under two seeds) and the seed count."""
    d = [values[s] - reference[s] for s in values if s in reference]
    if not d:
        return None, None, 0
    mean = sum(d) / len(d)
    if len(d) < 2:
        return mean, None, len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = t95(len(d) - 1) * sd / math.sqrt(len(d))
    return mean, (mean - half, mean + half), len(d)


def arm_label(arm):
    if "label" in arm:
        return arm["label"]
    return arm["rule"] + (f"/{arm['stages']}" if "stages" in arm else "")


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


def job_hash(path):
    """A job file's content hash, part of every cache key that depends on the job."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def run_config(spec, model, arm, seed):
    """Every setting that changes a run's result, for the cache."""
    job = arm.get("job", model["job"])
    return {"job": os.path.basename(job), "job_hash": job_hash(job), "rule": arm["rule"],
            "stages": arm.get("stages", 0), "seed": seed,
            "epochs": model.get("epochs", 0), "max_steps": model.get("max_steps", 0),
            "threads": spec["threads"], "device": spec["device"], "trainer": spec["trainer"],
            **({"lr": arm["lr"]} if "lr" in arm else {})}


CACHED = ("report.json", "curve.csv")
USAGE = "usage.json"  # the run's CPU seconds (kept beside, optional: older entries lack it)


def cache_dir(args, rid):
    return os.path.join(args.cache, rid) if args.cache else None


def from_cache(args, rid, config, run_dir):
    """Copies a cached run with this configuration into run_dir; whether there was one."""
    where = cache_dir(args, rid)
    if not where or not all(os.path.exists(os.path.join(where, f))
                            for f in CACHED + ("config.json",)):
        return False
    with open(os.path.join(where, "config.json")) as f:
        if json.load(f) != config:
            return False
    os.makedirs(run_dir, exist_ok=True)
    for name in CACHED + (USAGE,):
        if os.path.exists(os.path.join(where, name)):
            shutil.copy(os.path.join(where, name), os.path.join(run_dir, name))
    return True


def is_done(args, rid, config, run_dir):
    if from_cache(args, rid, config, run_dir):
        return True
    return args.reuse and all(os.path.exists(os.path.join(run_dir, f)) for f in CACHED)


def run_one(args, spec, model, arm, seed, run_dir, rid):
    config = run_config(spec, model, arm, seed)
    if is_done(args, rid, config, run_dir):
        say(f"  {rid}: done before, read back")
        return
    os.makedirs(run_dir, exist_ok=True)
    verb = "train" if spec["trainer"] == "reference" else "run"
    cmd = [args.localpar, verb, arm.get("job", model["job"]), f"--rule={arm['rule']}",
           f"--seed={seed}",
           f"--out={run_dir}", f"--threads={spec['threads']}", f"--device={spec['device']}"]
    if "stages" in arm:
        cmd.append(f"--stages={arm['stages']}")
    if "lr" in arm:
        cmd.append(f"--lr={arm['lr']:.6g}")
    for key in ("epochs", "max_steps"):
        if key in model:
            cmd.append(f"--{key}={model[key]}")
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)  # a run appends to it: start this one afresh
    with open(os.path.join(run_dir, "run.log"), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if args.verbose or line.startswith("epoch") and " accuracy" in line:
                say(f"    {rid}: {line.rstrip()}")
        # Reaped here rather than by proc.wait(), for the run's own CPU time (its wall time
        # says little when runs share the machine).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
    with open(os.path.join(run_dir, USAGE), "w") as f:
        json.dump({"cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2)}, f)
    if code != 0:
        fail(f"run failed (exit {code}): {' '.join(cmd)}; see {run_dir}/run.log")
    # The training curve: every stage's loss over the epoch so far, from metrics.jsonl.
    with open(os.path.join(run_dir, "curve.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "stage", "train_loss"])
        with open(metrics_path) as m:
            for line in m:
                point = json.loads(line)
                if point["kind"] in ("train", "epoch") and point["loss"] is not None:
                    w.writerow([f"{point['wall_seconds']:.2f}", point["stage"], point["loss"]])
    where = cache_dir(args, rid)
    if where:
        # Written whole or not at all: config.json last, so a half-copied entry never counts.
        os.makedirs(where, exist_ok=True)
        for name in CACHED + (USAGE,):
            shutil.copy(os.path.join(run_dir, name), os.path.join(where, name + ".tmp"))
            os.replace(os.path.join(where, name + ".tmp"), os.path.join(where, name))
        with open(os.path.join(where, "config.json.tmp"), "w") as f:
            json.dump(config, f, indent=1)
        os.replace(os.path.join(where, "config.json.tmp"), os.path.join(where, "config.json"))


def cpu_seconds(run_dir, wall):
    """A run's CPU seconds where they were recorded, else its wall time."""
    path = os.path.join(run_dir, USAGE)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["cpu_seconds"], True
    return wall, False


def read_run(run_dir):
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


def metric_of(stat, text):
    """The test metric of one head: accuracy, or bits per byte for language models."""
    return stat["loss"] / math.log(2) if text else stat["accuracy"]


def held_out(figures):
    """An epoch's held-out figures: its test split's, or its validation split's (reports
    name the split they scored)."""
    return figures.get("test") or figures.get("validation") or []


def fmt_metric(value, text):
    return f"{value:.3f}" if text else f"{100 * value:.2f}%"


def gnuplot(script, plots_dir):
    if shutil.which("gnuplot") is None:
        fail("gnuplot is not installed (Debian package gnuplot-nox)")
    out = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True,
                         cwd=plots_dir)
    if out.returncode != 0:
        fail(f"gnuplot failed: {out.stderr.strip()}")


def quote(s):
    return '"' + s.replace('"', "'") + '"'


def text(s):
    """A title or label for gnuplot's enhanced text mode: underscores stay underscores."""
    return quote(s.replace("\\", "/").replace("_", "\\\\_"))


def line_plot(plots_dir, name, series, title, xlabel, ylabel, style, extra=""):
    """One SVG: a line per (label, points) in `series`; returns its file name."""
    data = f"{name}.dat"
    with open(os.path.join(plots_dir, data), "w") as f:
        for label, points in series:
            f.write(f"# {label}\n")
            for x, y in points or [(0, "NaN")]:
                f.write(f"{x} {y}\n")
            f.write("\n\n")
    plots = ", ".join(f"{quote(data)} index {i} using 1:2 with {style} title {text(label)}"
                      for i, (label, _) in enumerate(series))
    out = f"{name}.svg"
    gnuplot(f"""set terminal svg size 720,420 dynamic background rgb 'white'
set output {quote(out)}
set title {text(title)}
set xlabel {text(xlabel)}
set ylabel {text(ylabel)}
set key outside right
set grid
{extra}
plot {plots}
""", plots_dir)
    return out


def plot_model(name, rows, curves, text, plots_dir):
    """Three SVG plots for one model; returns their file names."""
    metric = "held-out bits per byte" if text else "test accuracy (%)"
    scale = 1 if text else 100
    label = lambda r: f"{r['arm']} seed {r['seed']}"
    # Test metric against wall time (per-epoch evaluations), one line per arm.
    timeline = [(label(r), [(f"{t:.2f}", f"{scale * v:.5f}") for t, v in r["timeline"]])
                for r in rows]
    # Every stage head's test metric, one line per arm.
    heads = [(label(r), [(k, f"{scale * v:.5f}") for k, v in enumerate(r["stage_metrics"])])
             for r in rows]
    # Training curves: the last stage's recent training loss against wall time.
    train = []
    for r in rows:
        last = max((k for _, k, _ in curves[r["id"]]), default=0)
        train.append((label(r), [(f"{t:.2f}", f"{loss:.5f}")
                                 for t, k, loss in curves[r["id"]] if k == last]))
    return [
        line_plot(plots_dir, f"{name}_metric_vs_time", timeline,
                  f"{name}: {metric} against wall time", "wall time (s)", metric, "linespoints"),
        line_plot(plots_dir, f"{name}_stage_heads", heads, f"{name}: each stage head, {metric}",
                  "stage", metric, "linespoints", "set xtics 1"),
        line_plot(plots_dir, f"{name}_training_curves", train,
                  f"{name}: last stage training loss (nats), recent batches", "wall time (s)",
                  "training loss", "linespoints pointsize 0.4"),
    ]


def parse_args(doc, spec_help, results_help, reuse_help, extra=None):
    """The command line both runners share; `extra` adds a runner's own flags."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=spec_help)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--localpar", default="build/ci/localpar", help="the localpar binary")
    p.add_argument("--results", help=results_help)
    p.add_argument("--results_plots", help="where --results' plots are copied "
                   "(default: results/ next to it)")
    p.add_argument("--reuse", action="store_true", help=reuse_help)
    p.add_argument("--command", default=None,
                   help="the command line to print in the report (default: this one)")
    if extra:
        extra(p)
    args = p.parse_args()
    if not os.access(args.localpar, os.X_OK):
        fail(f"{args.localpar}: not an executable; build first or pass --localpar")
    args.localpar = os.path.abspath(args.localpar)
    return args


def extra_flags(p):
    p.add_argument("--verbose", action="store_true", help="echo every progress line")
    p.add_argument("--cache", help="also keep each finished run here, by its whole "
                   "configuration, and read runs back from it (a directory to commit)")
    p.add_argument("--done_only", action="store_true",
                   help="run nothing: write the tables from the runs already done (in "
                   "--cache or, with --reuse, in --out) and name the missing ones")


def main():
    args = parse_args(
        __doc__, "experiment file (JSON)", "also write the Markdown report to this path",
        "read back runs that already have a report instead of rerunning them",
        extra_flags)
    spec = load_spec(args.spec)
    os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
    results_plots = None
    if args.results:
        results_plots = os.path.abspath(args.results_plots or os.path.join(
            os.path.dirname(os.path.abspath(args.results)), "results"))

    models = []
    for m in spec["models"]:
        m = dict(m)
        m["name"] = m.get("label") or model_name(m["job"])
        m["data"] = data_figures(args.localpar, m["job"])
        m["text"] = m["data"]["labels_per_example"] > 1
        models.append(m)

    def rid_of(m, arm, seed, lr=None):
        tag = f"-lr{lr:g}" if lr is not None else ""
        return f"{m['name']}-{arm_label(arm).replace('/', '-')}{tag}-seed{seed}"

    def execute(items):
        """Runs `items` (model, arm, seed, run id, run dir), up to `parallel` at once; with
        --done_only runs nothing. Returns the ids of the runs that are not done."""
        missing = set()
        if args.done_only:
            for m, arm, seed, rid, run_dir in items:
                if not is_done(args, rid, run_config(spec, m, arm, seed), run_dir):
                    missing.add(rid)
            return missing
        counter = itertools.count(1)  # next() on it is atomic

        def start(item):
            m, arm, seed, rid, run_dir = item
            say(f"[{next(counter)}/{len(items)}] {rid}")
            run_one(args, spec, m, arm, seed, run_dir, rid)

        pool = concurrent.futures.ThreadPoolExecutor(spec["parallel"])
        futures = [pool.submit(start, item) for item in items]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()  # a failed run stops the sweep: start nothing more
            raise
        finally:
            pool.shutdown(wait=True)
        return missing

    def item(m, arm, seed, lr=None):
        rid = rid_of(m, arm, seed, lr)
        return (m, arm if lr is None else dict(arm, lr=lr), seed, rid,
                os.path.join(args.out, "runs", rid))

    tune_usage = []

    def tune_result(run_dir, text):
        """A tuning run's final metric and its CPU seconds."""
        with open(os.path.join(run_dir, "report.json")) as f:
            report = json.load(f)
        return (metric_of(held_out(report["epochs"][-1])[-1], text),
                cpu_seconds(run_dir, report["wall_seconds"]))

    # With "tune", every arm that sets no learning rate of its own first trains at each of
    # the grid's rates on the tune seeds; it then trains the model's seeds at the rate whose
    # mean final metric was best there (fresh seeds, so the choice does not flatter them).
    tune = spec.get("tune")
    tuned = lambda arm: tune is not None and "lr" not in arm
    chosen, tune_rows = {}, []
    if tune:
        items = [item(m, arm, seed, lr) for seed in tune["seeds"] for m in models
                 for arm in spec["arms"] if tuned(arm) for lr in tune["lrs"]]
        say(f"tuning: {len(items)} runs")
        tune_missing = execute(items)
        for m in models:
            for arm in spec["arms"]:
                if not tuned(arm):
                    continue
                means = {}
                for lr in tune["lrs"]:
                    done = [tune_result(os.path.join(args.out, "runs", rid), m["text"])
                            for rid in (rid_of(m, arm, s, lr) for s in tune["seeds"])
                            if rid not in tune_missing]
                    tune_usage.extend(usage for _, usage in done)
                    vals = [metric for metric, _ in done]
                    if len(vals) == len(tune["seeds"]):
                        means[lr] = sum(vals) / len(vals)
                if len(means) == len(tune["lrs"]):
                    pick = min if m["text"] else max
                    chosen[(m["name"], arm_label(arm))] = pick(means, key=means.get)
                tune_rows.append((m["name"], arm_label(arm), means))

    # Then every run, seed by seed (so that a sweep cut short has whole seeds).
    plan, missing = [], set()
    for si in range(max(len(m["seeds"]) for m in models)):
        for m in models:
            for arm in spec["arms"]:
                if si < len(m["seeds"]):
                    seed = m["seeds"][si]
                    if not tuned(arm):
                        plan.append(item(m, arm, seed, None if "lr" in arm else m.get("lr")))
                    elif (m["name"], arm_label(arm)) in chosen:
                        plan.append(item(m, arm, seed, chosen[(m["name"], arm_label(arm))]))
                    else:
                        missing.add(rid_of(m, arm, seed) + " (its learning rate is not tuned yet)")
    missing |= execute(plan)
    run_of = {(it[0]["name"], arm_label(it[1]), it[2]): it for it in plan}

    rows, stage_rows, curves = [], [], {}
    for m in models:
        for arm in spec["arms"]:
            for seed in m["seeds"]:
                if (m["name"], arm_label(arm), seed) not in run_of:
                    continue
                _, run_arm, _, rid, run_dir = run_of[(m["name"], arm_label(arm), seed)]
                if rid in missing:
                    continue
                report, curve = read_run(run_dir)
                curves[rid] = curve
                last = held_out(report["epochs"][-1])
                text = m["text"]
                elapsed, timeline = 0.0, []
                for e in report["epochs"]:
                    elapsed += e["seconds"]
                    timeline.append((elapsed, metric_of(held_out(e)[-1], text)))
                row = {
                    "id": rid, "model": m["name"], "arm": arm_label(arm), "rule": arm["rule"],
                    "lr": run_arm.get("lr", ""),
                    "stages": report["stages"], "seed": seed,
                    "metric_name": "bits_per_byte" if text else "accuracy",
                    "metric": metric_of(last[-1], text),
                    "stage_metrics": [metric_of(s, text) for s in last],
                    "wall_seconds": report["wall_seconds"],
                    "cpu": cpu_seconds(run_dir, report["wall_seconds"]),
                    "examples_per_second": report["examples_per_second"],
                    "steps": report["steps"],
                    "sequential_steps": sequential_steps(arm["rule"], report["stages"],
                                                         report["steps"]),
                    "baseline": m["data"]["unigram_bits_per_label"] if text else "",
                    "timeline": timeline,
                }
                rows.append(row)
                for k, s in enumerate(last):
                    stage_rows.append({"model": m["name"], "arm": row["arm"], "seed": seed,
                                       "stage": k, "test_loss": s["loss"],
                                       "test_accuracy": s["accuracy"],
                                       "metric": metric_of(s, text)})

    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        cols = ["model", "arm", "rule", "lr", "stages", "seed", "metric_name", "metric",
                "wall_seconds", "examples_per_second", "steps", "sequential_steps", "baseline"]
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(args.out, "stages.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "arm", "seed", "stage", "test_loss",
                                          "test_accuracy", "metric"])
        w.writeheader()
        w.writerows(stage_rows)
    with open(os.path.join(args.out, "curves.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seconds", "stage", "train_loss"])
        for rid, c in curves.items():
            for t, k, loss in c:
                w.writerow([rid, t, k, loss])

    plots_dir = os.path.join(args.out, "plots")
    md = []
    command = args.command or "python3 " + " ".join(sys.argv)
    md.append(f"# Results: {spec['name']}\n")
    md.append("Produced by the experiment runner; regenerate with\n")
    md.append(f"```\n{command}\n```\n")
    if spec["trainer"] == "reference":
        how = ("Every run is the in-process reference trainer (`localpar train`: every stage in "
               "one process, one run per core, {} at once), which gives a local cluster's "
               "weights bit for bit on CPU".format(spec["parallel"]))
    else:
        how = ("Every run is a real local cluster (`localpar run`: one worker process per "
               "stage and a coordinator over gRPC on loopback)")
    md.append(f"{how}, device `{spec['device']}`, "
              f"{spec['threads']} GEMM thread(s) per process; seeds per model below. Wall "
              f"time includes the per-epoch "
              f"evaluations. *Sequential steps* counts dependent stage computations on the "
              f"critical path: BACKPROP 2 x stages per update (forward and backward visit every "
              f"stage before the next update); GREEDY and CHUNKED one per update once the "
              f"pipeline is full; OVERLAP two.\n")
    # What the section cost: each reference run holds one core (its threads) for its wall time.
    usage = [r["cpu"] for r in rows] + tune_usage
    hours = sum(c for c, _ in usage) / 3600
    measured = sum(1 for _, known in usage if known)
    how = ("their CPU time" if measured == len(usage) else
           f"CPU time for {measured}, wall time for the {len(usage) - measured} runs "
           f"recorded before CPU time was")
    md.append(f"Cost: {len(usage)} runs, {hours:.1f} CPU core-hours ({how}).\n")
    made = []
    for m in models:
        mrows = [r for r in rows if r["model"] == m["name"]]
        text = m["text"]
        metric = "held-out bits/byte (lower is better)" if text else "test accuracy"
        budget = ", ".join(f"{k} {m[k]}" for k in ("epochs", "max_steps") if k in m)
        md.append(f"\n## {m['name']}\n")
        md.append(f"Job `{os.path.relpath(m['job'])}`; budget: "
                  f"{budget or 'as in the job file'}; seeds {', '.join(map(str, m['seeds']))}; "
                  f"{m['data']['train_examples']} training / "
                  f"{m['data'].get('validation_examples', m['data'].get('test_examples'))} held-out examples.\n")
        if text:
            md.append(f"Unigram baseline (a model that ignores context, fitted on the training "
                      f"split): **{m['data']['unigram_bits_per_label']:.3f} bits per byte** on the "
                      f"held-out split.\n")
        trows = [t for t in tune_rows if t[0] == m["name"]]
        if trows:
            seeds = ", ".join(map(str, tune["seeds"]))
            md.append(f"Learning rates, tuned on seed(s) {seeds}: the final {metric} at each "
                      f"peak rate of the grid (the schedule's floor scales with it). Each arm "
                      f"then trains the seeds below at its best rate, in bold; *edge* marks a "
                      f"best rate at the end of the grid, where a wider grid might do better.\n")
            md.append("| arm | " + " | ".join(f"lr {lr:g}" for lr in tune["lrs"]) + " | best |")
            md.append("|---|" + "---|" * (len(tune["lrs"]) + 1))
            for _, label, means in trows:
                best = chosen.get((m["name"], label))
                cells = [(f"**{fmt_metric(means[lr], text)}**" if lr == best
                          else fmt_metric(means[lr], text)) if lr in means else "not run"
                         for lr in tune["lrs"]]
                edge = best in (tune["lrs"][0], tune["lrs"][-1])
                verdict = "" if best is None else f"{best:g}" + (" (*edge*)" if edge else "")
                md.append(f"| {label} | " + " | ".join(cells) + f" | {verdict} |")
            md.append("")
        md.append(f"| arm | stages | seed | last stage: {metric} | vs BACKPROP | each stage's head "
                  f"| wall s | examples/s | updates | sequential steps |")
        md.append("|---|---|---|---|---|---|---|---|---|---|")
        ref = {r["seed"]: r["metric"] for r in mrows if r["arm"] == "BACKPROP"}
        for r in mrows:
            delta = ""
            if r["seed"] in ref and r["arm"] != "BACKPROP":
                d = r["metric"] - ref[r["seed"]]
                delta = f"{d:+.3f}" if text else f"{100 * d:+.2f} pt"
            heads = " / ".join(fmt_metric(v, text) for v in r["stage_metrics"])
            md.append(f"| {r['arm']} | {r['stages']} | {r['seed']} | "
                      f"**{fmt_metric(r['metric'], text)}** | {delta} | {heads} | "
                      f"{r['wall_seconds']:.0f} | {r['examples_per_second']:.0f} | {r['steps']} | "
                      f"{r['sequential_steps']} |")
        gone = [rid for rid in missing if rid.startswith(m["name"] + "-")]
        if gone:
            md.append("")
            md.append(f"Not run yet ({len(gone)} of {len(m['seeds']) * len(spec['arms'])}): "
                      + ", ".join(sorted(gone)) + ". The summary below is over the seeds "
                      "each arm has.")
        if not mrows:
            continue
        if len(m["seeds"]) > 1:
            md.append("")
            md.append(f"Over the seeds (mean ± sample standard deviation, and min to max); the "
                      f"gap to BACKPROP is paired by seed, with a 95% confidence interval "
                      f"(Student's t over the per-seed gaps)"
                      f"{'; perplexity is 2^(bits/byte), so its ratio to BACKPROP is 2^gap' if text else ''}"
                      f":\n")
            ppl = " | perplexity vs BACKPROP" if text else ""
            with_lr = any(r["lr"] != "" for r in mrows)
            md.append(f"| arm |{' lr |' if with_lr else ''} seeds | mean {metric} | min to max "
                      f"| mean gap to BACKPROP | 95% CI of the gap{ppl} |")
            md.append("|---|---|---|---|---|---|" + ("---|" if text else "")
                      + ("---|" if with_lr else ""))
            arms = list(dict.fromkeys(r["arm"] for r in mrows))
            by_seed = {arm: {r["seed"]: r["metric"] for r in mrows if r["arm"] == arm}
                       for arm in arms}
            unit = (lambda d: f"{d:+.3f}") if text else (lambda d: f"{100 * d:+.2f} pt")
            for arm in arms:
                vals = list(by_seed[arm].values())
                mean, sd = mean_sd(vals) if len(vals) > 1 else (vals[0], float("nan"))
                gap, ci, _ = (None, None, 0)
                if "BACKPROP" in by_seed and arm != "BACKPROP":
                    gap, ci, _ = paired_gap(by_seed[arm], by_seed["BACKPROP"])
                spread = ("" if len(vals) < 2 else f" ± {sd:.3f}" if text
                          else f" ± {100 * sd:.2f}")
                lrs = {r["lr"] for r in mrows if r["arm"] == arm}
                cells = [arm] + ([" ".join(f"{x:g}" if x != "" else "job's" for x in lrs)]
                                 if with_lr else []) + [
                         str(len(vals)), f"**{fmt_metric(mean, text)}**{spread}",
                         f"{fmt_metric(min(vals), text)} to {fmt_metric(max(vals), text)}",
                         unit(gap) if gap is not None else "",
                         f"[{unit(ci[0])}, {unit(ci[1])}]" if ci else ""]
                if text:
                    cells.append(f"{100 * (2 ** gap - 1):+.1f}%" if gap is not None else "")
                md.append("| " + " | ".join(cells) + " |")
        losses = []
        for r in mrows:
            if r["seed"] not in ref or r["rule"] == "BACKPROP":
                continue
            d = r["metric"] - ref[r["seed"]]
            worse = d > 0 if text else d < 0
            if worse:
                amount = f"{d:+.3f} bits/byte" if text else f"{100 * d:+.2f} points"
                losses.append(f"{r['arm']} (seed {r['seed']}): {amount}")
        md.append("")
        if losses:
            md.append("Where local rules lose to BACKPROP here: " + "; ".join(losses) + ".\n")
        elif ref:
            md.append("No local rule scored below BACKPROP here.\n")
        # Named by the experiment too: two experiments on one model keep their own plots.
        files = plot_model(f"{spec['name']}_{m['name']}", mrows, curves, text, plots_dir)
        made.extend(files)
        link_dir = "plots"
        if args.results:
            link_dir = os.path.relpath(results_plots, os.path.dirname(os.path.abspath(args.results)))
        for fname in files:
            md.append(f"![{fname}]({link_dir}/{fname})\n")
    text_md = "\n".join(md) + "\n"
    with open(os.path.join(args.out, "RESULTS.md"), "w") as f:
        f.write(text_md)
    if args.results:
        dest = results_plots
        os.makedirs(dest, exist_ok=True)
        for fname in made:  # this run's plots only, not older ones left in --out
            shutil.copy(os.path.join(plots_dir, fname), dest)
        old = ""
        if os.path.exists(args.results):
            with open(args.results) as f:
                old = f.read()
        with open(args.results, "w") as f:
            f.write(replace_section(old, spec["name"], text_md))
    print(f"experiment: {len(rows)} runs; {os.path.join(args.out, 'RESULTS.md')}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
