#!/usr/bin/python3
"""The frontier sweep (deploy/frontier.py, experiments/frontier/): its logic against
hand-computed values, FLOP counting from a real job against counts worked out by hand, and a
small sweep end to end.

Usage: frontier_test.py LOCALPAR_BINARY SOURCE_DIR
"""

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import types


def check(cond, message):
    if not cond:
        print(f"FAIL: {message}", file=sys.stderr)
        sys.exit(1)


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def test_logic(fr):
    # Target detection: the first evaluation that meets the target, either direction.
    pts = [(10, 0.5), (20, 0.79), (30, 0.81), (40, 0.9)]
    check(fr.first_reaching(pts, 0.8, True) == (30, 0.81), "first accuracy >= 0.8")
    check(fr.first_reaching(pts, 0.95, True) is None, "an accuracy never reached")
    bpb = [(10, 4.2), (20, 3.9), (30, 3.7), (40, 3.75)]
    check(fr.first_reaching(bpb, 3.8, False) == (30, 3.7), "first bits/byte <= 3.8")
    check(fr.first_reaching(bpb, 3.9, False) == (20, 3.9), "a target met exactly counts")
    # The run cache: a run stopped at a stricter target (or at its budget) answers for a
    # laxer one; a run stopped at a laxer target, or any other setting changed, does not.
    cfg = {"lr": 0.1, "strictest": 0.88, "text": False}
    check(fr.covers({"config": dict(cfg), "stopped_at_target": True}, cfg), "the same run")
    check(fr.covers({"config": dict(cfg, strictest=0.9), "stopped_at_target": True}, cfg),
          "stopped at a stricter accuracy")
    check(not fr.covers({"config": dict(cfg, strictest=0.87), "stopped_at_target": True}, cfg),
          "stopped at a laxer accuracy")
    check(fr.covers({"config": dict(cfg, strictest=0.87), "stopped_at_target": False}, cfg),
          "a whole budget")
    check(not fr.covers({"config": dict(cfg, lr=0.2), "stopped_at_target": False}, cfg),
          "another learning rate")
    loss = {"lr": 0.1, "strictest": 3.7, "text": True}
    check(fr.covers({"config": dict(loss, strictest=3.6), "stopped_at_target": True}, loss)
          and not fr.covers({"config": dict(loss, strictest=3.8), "stopped_at_target": True},
                            loss), "a loss target: lower is stricter")
    # Examples seen: 100 examples in batches of 32 are 4 steps an epoch (the last one 4 rows),
    # so 10 steps are 2 whole epochs and 2 batches.
    check(fr.examples_seen(10, 32, 100) == 2 * 100 + 2 * 32, "examples after 10 steps")
    check(fr.examples_seen(8, 32, 100) == 200, "examples after 2 epochs")
    # Profiles measured under load: the whole network against the sum of its stages.
    def prof(*ms):
        return {"stages": [{"seconds": x / 1e3} for x in ms]}
    profs = {("m", 1, 0, 16): prof(8.0), ("m", 4, 0, 16): prof(2.1, 2.0, 2.0, 2.1),
             ("m", 1, 0, 32): prof(13.0), ("m", 8, 0, 32): prof(*[1.35] * 8)}
    off = fr.profile_disagreements(profs)
    check(len(off) == 1 and off[0].startswith("m at 32 rows"),
          f"a profile 20% off its stages is flagged, one 2% off is not: {off}")
    # Training FLOPs: 3 x forward; local rules train every head, backprop only the last.
    stages = [{"forward_flops": 100, "head_forward_flops": 10},
              {"forward_flops": 200, "head_forward_flops": 20}]
    check(fr.training_flops_per_example(stages, "local") == 3 * (100 + 10 + 200 + 20), "local")
    check(fr.training_flops_per_example(stages, "overlap") == 990, "overlap")
    check(fr.training_flops_per_example(stages, "data_parallel") == 3 * (300 + 20), "dp")
    check(fr.training_flops_per_example(stages, "pipelined_backprop") == 960, "pipelined")
    # A ring all-reduce of 1 MB over 4 replicas at 1 GB/s and 10 us: 1.5 ms + 60 us.
    check(close(fr.allreduce_seconds(1e6, 4, 1e9, 1e-5), 1.5e-3 + 6e-5), "all-reduce")
    check(fr.allreduce_seconds(1e6, 1, 1e9, 1e-5) == 0, "no all-reduce without replicas")
    # Step times: stage 0 takes 1 s + a 0.1 s head, stage 1 2 s + 0.2 s, and 0.3 s more for
    # the gradient of its input where a rule sends it upstream (stage 0's 0.5 never counts).
    st = [{"seconds": 1.0, "head_seconds": 0.1, "parameter_bytes": 0, "input_grad_seconds": 0.5},
          {"seconds": 2.0, "head_seconds": 0.2, "parameter_bytes": 0, "input_grad_seconds": 0.3}]
    check(close(fr.step_seconds("local", st, 1, 1, 1e9, 0), 2.2), "local: the slowest stage")
    check(close(fr.step_seconds("overlap", st, 1, 1, 1e9, 0), 1.1 + 2.5),
          "overlap: the slowest pair, with the gradient sent upstream")
    check(close(fr.step_seconds("data_parallel", st, 1, 1, 1e9, 0), 1 + 2.3 + 0.2),
          "data parallel: every layer, the inner input gradient and the last head")
    check(close(fr.step_seconds("pipelined_backprop", st, 1, 4, 1e9, 0), (4 + 2 - 1) * 2.5),
          "GPipe: (M + K - 1) slots of the slowest stage")
    check(close(fr.step_seconds("local", st, 1, 1, 1e9, 0, cores=1), 3.3),
          "two stages on one core take their sum")
    st[1]["parameter_bytes"] = 4e6  # 2 replicas: (2 - 1) / 2 x 2 x 4 MB at 1 GB/s = 4 ms
    check(close(fr.step_seconds("local", st, 2, 1, 1e9, 0), 2.2 + 4e-3), "local + all-reduce")
    check(fr.pipeline_fill("local", 4) == 3 and fr.pipeline_fill("data_parallel", 4) == 0,
          "pipeline fill")
    # Heads against depth at the last evaluation every run reached (step 20 here), at the
    # learning rate whose last head is best there.
    def run(lr, pts):
        return {"lr": lr, "points": [{"step": s, "metrics": m} for s, m in pts]}
    runs = {"A": [run(1, [(10, [0.5, 0.4]), (20, [0.6, 0.5]), (30, [0.7, 0.9])]),
                  run(2, [(10, [0.5, 0.6]), (20, [0.6, 0.55])])],
            "B": [run(1, [(10, [0.3]), (20, [0.7]), (30, [0.8])]), run(2, [])]}
    got = fr.heads_at_common_step(runs, False)
    check(got == {"A": (20, 2, [0.6, 0.55]), "B": (20, 1, [0.7])}, f"heads at step 20: {got}")
    check(fr.heads_at_common_step(runs, True)["A"] == (20, 1, [0.6, 0.5]), "lower is better")


def test_choices(fr):
    """How points, settings, edges and intervals are chosen, against values by hand."""
    # The Pareto front of (compute, time) points.
    check(fr.pareto([(1, 5), (2, 2), (3, 3), (5, 1), (2, 2)]) == [0, 1, 3, 4], "pareto front")
    # Two evaluations in a row: a lucky one alone does not count; the first of the two does.
    wobbly = [(10, 0.5), (20, 0.81), (30, 0.79), (40, 0.82), (50, 0.83)]
    check(fr.first_reaching(wobbly, 0.8, True, 2) == (40, 0.82), "held twice from step 40")
    check(fr.first_reaching(wobbly, 0.8, True, 1) == (20, 0.81), "once: step 20")
    check(fr.first_reaching([(10, 0.9)], 0.8, True, 2) is None, "one evaluation is not two")
    # Settings: the most seeds reaching, then the fewest mean steps; a grid's ends are edges.
    got = fr.choose_setting([("a", {1: 10, 2: None}), ("b", {1: 12, 2: 14}),
                             ("c", {1: 9, 2: 13})])
    check(got == (2, "c", {1: 9, 2: 13}), f"choose_setting {got}")
    check(fr.at_edge(0, 4) and fr.at_edge(3, 4) and not fr.at_edge(1, 4)
          and not fr.at_edge(0, 1), "grid edges")
    check(fr.median([3, 1, 2]) == 2 and fr.median([4, 1, 2, 3]) == 2.5, "median")
    # A grid continued past its ends by the ratio of the values nearest each end.
    check(fr.continued_axis([1, 2, 4, 8], 2) == [0.25, 0.5, 1, 2, 4, 8, 16, 32]
          and fr.continued_axis([3], 1) == [1.5, 3, 6] and fr.continued_axis([2, 1], 0) == [1, 2],
          "continued axes")
    check(fr.neighbours([1, 2, 4], 1) == (None, 2) and fr.neighbours([1, 2, 4], 2) == (1, 4),
          "neighbours on an axis")
    # A setting is on an edge while a neighbour along either axis is untried; one past the
    # continued axis stays an edge for good; an axis of one value has no edge.
    lrs, lengths = [0.5, 1, 2, 4], [100, 200, 400]
    full = {(f, n) for f in (1, 2) for n in (100, 200, 400)}
    got = fr.untried_neighbours(full, lrs, lengths, (2, 200))
    check(got == [("lr", (4, 200))], f"an untried lr above: {got}")
    got = fr.untried_neighbours(full | {(4, n) for n in lengths}, lrs, lengths, (4, 200))
    check(got == [("lr", None)], f"past the continued axis: {got}")
    check(fr.untried_neighbours(full | {(0.5, 200)}, lrs, lengths, (1, 200)) == [],
          "a local optimum of what was tried")
    got = fr.untried_neighbours(full, lrs, lengths, (1, 400))
    check(got == [("lr", (0.5, 400)), ("length", None)], f"two edges: {got}")
    check(fr.untried_neighbours({(1, 100)}, [1], [100], (1, 100)) == [], "a one-value grid")
    # Profiles measured on several occasions: each stage's times the median, the rest kept.
    occ = [{"batch": 8, "stages": [{"seconds": s, "head_seconds": h, "forward_flops": 7}]}
           for s, h in ((3.0, 0.3), (1.0, 0.2), (2.0, 0.1))]
    med = fr.median_profile(occ)
    check(med["stages"] == [{"seconds": 2.0, "head_seconds": 0.2, "forward_flops": 7}]
          and med["occasions"] == occ and med["batch"] == 8, f"median profile {med}")
    # A speed-up's interval widened by the two points' step times over their occasions:
    # backprop's step 1.0 (0.9 to 1.2), the local point's 0.5 (0.4 to 0.5), so the ratio of
    # steps, 2 at the medians, ranges over 1.8 to 3: the interval [1.5, 2.5] becomes
    # [1.5 x 1.8 / 2, 2.5 x 3 / 2].
    bp = {"step_seconds": 1.0, "step_range": (0.9, 1.2)}
    lo = {"step_seconds": 0.5, "step_range": (0.4, 0.5)}
    got = fr.profile_spread(bp, lo, 1.5, 2.5)
    check(close(got[0], 1.35) and close(got[1], 3.75), f"profile spread {got}")
    check(fr.profile_spread({"step_seconds": 1.0}, lo, 1.5, 2.5) == (1.5, 2.5),
          "no spread without occasions")
    # The bootstrap interval of a ratio of means holds the ratio, is deterministic, and is a
    # point when every seed agrees.
    low, high = fr.bootstrap_ratio([10, 11, 12], [2, 2.2, 1.8])
    check(low < 11 / 2 < high and (low, high) == fr.bootstrap_ratio([10, 11, 12], [2, 2.2, 1.8]),
          f"bootstrap [{low}, {high}]")
    check(fr.bootstrap_ratio([6, 6], [2, 2]) == (3.0, 3.0), "no spread, no interval")
    # On log times: the ratio of geometric means, its BCa interval around it, deterministic.
    got = fr.log_ratio_interval([10, 11, 12], [2, 2.2, 1.8])
    check(abs(got[0] - (10 * 11 * 12) ** (1 / 3) / (2 * 2.2 * 1.8) ** (1 / 3)) < 1e-9
          and got[1] < got[0] < got[2]
          and got == fr.log_ratio_interval([10, 11, 12], [2, 2.2, 1.8]), f"log ratio {got}")
    check(fr.log_ratio_interval([6, 6], [2, 2])[1] == fr.log_ratio_interval([6, 6], [2, 2])[2],
          "no spread, no interval on log times")
    # Ranking: by the median over seeds, a miss as +infinity, so one missed seed of five does
    # not put a point behind a slower one that always reaches.
    fast = {"median_seconds": 9.8, "time_seconds": 11.0, "seeds": 5, "missed": 1}
    slow = {"median_seconds": 17.7, "time_seconds": 17.9, "seeds": 5, "missed": 0}
    check(min([(slow, None), (fast, None)], key=fr.rank)[0] is fast, "median ranking")
    check(fr.reliability(fast) == "4/5", "reliability")
    # Data parallelism stops paying off where the next B is not 1.1x faster, or misses.
    check(fr.stops_paying_off([(32, 10, False), (128, 4, False), (512, 3.8, False)]) == 128,
          "flat past 128")
    check(fr.stops_paying_off([(32, 10, False), (128, 4, False), (512, 1, True)]) == 128,
          "a miss past 128")
    check(fr.stops_paying_off([(32, 10, False), (128, 4, False)]) is None, "still gaining")
    # Derived jobs (protobuf's text format): the schedule replaced, the network cut after its
    # first stages, braces in strings left alone.
    job = 'name: "a{b"\nschedule {\n  lr: 0.001\n}\nstages {\n  name: "s}"\n}\nstages {\n}\nseed: 3\n'
    sched = fr.warmup_cosine("COSINE", 1000, 0.1, 128)
    cut = fr.derive_job(fr.parse_job(job, "job"), sched, 1)
    want = fr.parse_job('name: "a{b" stages { name: "s}" } seed: 3 schedule { kind: COSINE '
                        'lr: 1 warmup_steps: 8 min_lr: 0.1 }', "want")
    check(cut == want, f"derived {fr.job_text(cut)!r}")
    check(fr.derive_job(fr.parse_job(job, "job")) == fr.parse_job(job, "job"),
          "deriving nothing changes nothing")
    # A job's hash is its message's: comments and layout do not change it, a setting does.
    relaid = "# a comment\n" + job.replace("\n", "  \n")
    check(fr.message_hash(fr.parse_job(relaid, "j")) == fr.message_hash(fr.parse_job(job, "j"))
          and fr.message_hash(fr.parse_job(job.replace("seed: 3", "seed: 4"), "j"))
          != fr.message_hash(fr.parse_job(job, "j")), "job hashes")
    # Learning rates: base x sqrt(B / base_batch) x factor.
    grid = fr.lr_grid(fr.LrGrid(base=1e-3, base_batch=128, factors=[1, 2]), 512)
    check(all(close(a, b) for a, b in zip(grid, [2e-3, 4e-3])), f"lr grid {grid}")


def write_job(path, train_examples):
    with open(path, "w") as f:
        f.write(f'''name: "tiny"
rule: GREEDY
batch_size: 16
seed: 2
data {{ synthetic {{ train_examples: {train_examples} test_examples: 128 shape: [16] classes: 4
                    seed: 3 noise: 0.5 }} }}
optimizer {{ sgd {{ momentum: 0.9 }} }}
schedule {{ lr: 0.05 }}
stages {{ layers {{ linear {{ out_features: 32 }} }} layers {{ relu {{}} }} head {{ kind: LINEAR }} }}
stages {{ layers {{ linear {{ out_features: 8 }} }} layers {{ relu {{}} }}
         head {{ kind: MLP hidden: 16 }} }}
''')


# The methods of the first sweep, the others take some of them.
METHODS = [
    {"label": "data parallel", "rule": "BACKPROP", "stages": 1, "cost": "data_parallel"},
    {"label": "first block alone", "rule": "BACKPROP", "stages": 1, "first_stages": 1,
     "cost": "data_parallel"},
    {"label": "pipelined K=2", "rule": "BACKPROP", "stages": 2, "train_stages": 1,
     "cost": "pipelined_backprop"},
    {"label": "GREEDY K=2", "rule": "GREEDY", "stages": 2, "cost": "local"},
    {"label": "OVERLAP K=2", "rule": "OVERLAP", "stages": 2, "cost": "overlap"},
]


def check_project(localpar, job):
    """`localpar project --json`: FLOPs, bytes and times per stage of the tiny job."""
    # FLOPs from the job's shapes, by hand: 16 -> 32 (1024), head 32 -> 4 (256);
    # 32 -> 8 (512), MLP head 8 -> 16 -> 4 (256 + 128).
    out = subprocess.run([localpar, "project", job, "--json", "--project_stages=1,2"],
                         capture_output=True, text=True)
    check(out.returncode == 0, f"project --json: {out.stderr}")
    prof = json.loads(out.stdout)
    got = [(s["forward_flops"], s["head_forward_flops"]) for s in prof["stages"]]
    check(got == [(1024, 256), (512, 384)], f"forward FLOPs {got}")
    check(prof["stages"][0]["parameter_bytes"] == 4 * ((16 + 1) * 32 + (32 + 1) * 4),
          "parameter bytes")
    check(prof["stages"][0]["hop_bytes"] == 4 * 16 * 32, "hop bytes of a batch of 16")
    check(all(s["seconds"] > 0 and s["head_seconds"] > 0 for s in prof["stages"]), "times")
    check(prof["stages"][0]["input_grad_seconds"] == 0 and
          prof["stages"][1]["input_grad_seconds"] > 0,
          "the input gradient is timed for every stage but the first")
    merged = json.loads(subprocess.run([localpar, "project", job, "--json", "--stages=1",
                                        "--project_stages=1"],
                                       capture_output=True, text=True).stdout)
    check(len(merged["stages"]) == 1 and merged["stages"][0]["forward_flops"] == 1536
          and merged["stages"][0]["head_forward_flops"] == 384, "--stages=1 merges")


def run_first_sweep(source, localpar, tmp, job):
    """The first sweep: every method, two batch sizes, two learning rates, two seeds."""
    spec = os.path.join(tmp, "spec.json")
    with open(spec, "w") as f:
        json.dump({"name": "t", "parallel": 2,
                   "models": [{"job": job, "targets": [0.5, 0.9], "batch_sizes": [16, 64],
                               "device_batch": 16, "device_batches": [16, 32],
                               "seeds": [1, 2], "summary_seeds": [1, 2, 3],
                               "depth_check": False,
                               "schedule": {"kind": "COSINE", "warmup_examples": 64,
                                            "min_lr_fraction": 0.1,
                                            "lengths": [4000000]},
                               "lr": {"base": 0.05, "base_batch": 32, "factors": [1, 2]},
                               "max_examples": 4000000, "eval_every_examples": 256}],
                   "methods": METHODS,
                   "cluster_checks": [{"model": "tiny", "method": "GREEDY K=2", "batch": 64,
                                       "steps": 20},
                                      {"model": "tiny", "method": "data parallel",
                                       "batch": 64, "steps": 20, "replicas": 2,
                                       "pin": True}]}, f)
    out = os.path.join(tmp, "out")
    results = os.path.join(tmp, "doc", "RESULTS.md")
    os.makedirs(os.path.dirname(results))
    with open(results, "w") as f:
        f.write("# Results\n\nkept above\n")
    cache = os.path.join(tmp, "cache.jsonl")
    cmd = [sys.executable, os.path.join(source, "deploy", "frontier.py"), spec, "--out", out,
           "--localpar", localpar, "--results", results, "--cache", cache]
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, f"frontier failed:\n{r.stderr}")
    return spec, out, cmd, results, cache


def check_first_runs(tmp, cmd, out):
    rows = list(csv.DictReader(open(os.path.join(out, "frontier.csv"))))
    check(len(rows) == 5 * 2 * 2, f"{len(rows)} points, want 20")
    runs = {}
    for d in os.listdir(os.path.join(out, "runs")):
        runs[d] = json.load(open(os.path.join(out, "runs", d, "run.json")))
    # 4 trainings (pipelined backprop shares backprop's) x 2 B x 2 lr x 2 seeds, and the
    # summary's points a third seed each.
    base = [r for r in runs.values() if r["seed"] in (1, 2)]
    check(len(base) == 4 * 2 * 2 * 2, f"{len(base)} runs with seeds 1 and 2")
    check(any(r["seed"] == 3 for r in runs.values()), "the summary's points get seed 3")
    for run in runs.values():
        # A target that is met stops the run long before its 4000000 examples.
        check(run["stopped_at_target"], f"run not stopped at its target: {run}")
        check(run["points"][-1]["step"] < 4000000 // run["batch"], "ran to the end")
        # Warm-up and cosine decay, in the job the run trained.
        job_text = open(os.path.join(out, run["config"]["job"])).read()
        check(f"warmup_steps: {round(64 / run['batch'])}" in job_text and "COSINE" in job_text,
              f"the run's schedule: {run['config']['job']}")
    shallow = [r for r in runs.values() if r["config"]["first_stages"] == 1]
    check(shallow and all(len(r["points"][0]["metrics"]) == 1 for r in shallow),
          "the shallow baseline trains the first stage alone")
    # A second invocation, elsewhere, finds every run in the cache by its configuration.
    again = [a if a != out else os.path.join(tmp, "out2") for a in cmd]
    r2 = subprocess.run(again, capture_output=True, text=True)
    check(r2.returncode == 0 and "cached" in r2.stderr
          and not re.search(r"evaluations, (reached|budget), [0-9]+ s", r2.stderr)
          and not re.search(r"rows \(", r2.stderr)
          and not os.path.exists(os.path.join(tmp, "out2", "checks")),
          f"a rerun trained, profiled or ran a cluster again:\n{r2.stderr}")
    return rows, runs


def check_plan(source, localpar, tmp, spec, cache):
    # --plan trains and measures nothing. With every run cached it says so; with an empty
    # cache it counts the first stage's runs and names every one.
    plan = [sys.executable, os.path.join(source, "deploy", "frontier.py"), spec, "--localpar",
            localpar, "--plan"]
    p1 = subprocess.run(plan + ["--out", os.path.join(tmp, "plan1"), "--cache", cache],
                        capture_output=True, text=True)
    check(p1.returncode == 0 and "seeds (each point's chosen setting): " in p1.stdout
          and "every run is done" in p1.stdout, f"a plan of a finished sweep:\n{p1.stdout}")
    p2 = subprocess.run(plan + ["--out", os.path.join(tmp, "plan2"), "--cache",
                                os.path.join(tmp, "empty")], capture_output=True, text=True)
    listed = re.findall(r"^  (tiny-\S+-s[12])$", p2.stdout, re.M)
    check(p2.returncode == 0
          and "tuning (every setting, on the tune seeds): 0 of 32 runs done" in p2.stdout
          and len(listed) == 32 and "every run is done" not in p2.stdout
          and not os.path.exists(os.path.join(tmp, "plan2", "runs"))
          and not os.path.exists(os.path.join(tmp, "empty")),
          f"a plan with nothing done:\n{p2.stdout}\n{p2.stderr}")


def check_points(fr, rows, runs):
    """Each point of frontier.csv against its runs, worked out again here."""
    for row in rows:
        if row["reached"] != "True":
            continue
        b, target = int(row["batch"]), float(row["target"])
        rule = row["rule"]
        k = 1 if rule == "BACKPROP" else 2
        first = "-first1" if row["method"] == "first block alone" else ""
        # The best learning rate over both seeds: the fewest mean steps to two evaluations
        # in a row at the target.
        best = None
        for lr in fr.lr_grid(fr.LrGrid(base=0.05, base_batch=32, factors=[1, 2]), b):
            steps = []
            for seed in (1, 2):
                run = runs[f"tiny-{rule}-K{k}{first}-b{b}-lr{lr:.6g}-n4000000-s{seed}"]
                hit = fr.first_reaching([(p["step"], p["metrics"][-1]) for p in run["points"]],
                                        target, True, 2)
                steps.append(hit[0])
            if best is None or sum(steps) / 2 < best[0]:
                best = (sum(steps) / 2, lr)
        if int(row["seeds"]) == 2:
            check(close(float(row["steps"]), best[0]),
                  f"{row['method']} B={b}: steps {row['steps']}, want {best[0]}")
        check(close(float(row["lr"]), best[1]), f"{row['method']} B={b}: lr")
        per = {"BACKPROP": 3 * (1536 + 384), "GREEDY": 3 * (1536 + 256 + 384),
               "OVERLAP": 3 * (1536 + 256 + 384)}[rule]
        if first:
            per = 3 * (1024 + 256)
        check(float(row["flops_per_example"]) == per, f"{row['method']}: FLOPs per example")
        check(close(float(row["compute_flops"]), int(row["examples"]) * per),
              "compute = examples x FLOPs per example")
        fill = 1 if rule in ("GREEDY", "OVERLAP") else 0
        check(close(float(row["time_seconds"]),
                    (float(row["steps"]) + fill) * float(row["step_seconds"])),
              "time = (mean steps + fill) x step")
        devices = {"data parallel": b // 16, "first block alone": b // 16,
                   "pipelined K=2": 2}.get(row["method"], 2 * b // 16)
        check(int(row["devices"]) == devices, f"{row['method']} B={b}: devices")


def check_report(tmp, out, results, runs, cmd):
    """The cluster checks, RESULTS.md's section and its plots, and --reuse."""
    checks = list(csv.DictReader(open(os.path.join(out, "checks.csv"))))
    check(len(checks) == 2 and all(float(c["measured_step_ms"]) > 0 for c in checks),
          "cluster checks")
    # The pinned check with replicas: two workers, a core each, and an exchange term.
    check(checks[1]["pinned"] == "True" and checks[1]["replicas"] == "2"
          and float(checks[1]["predicted_exchange_ms"]) > 0, f"pinned check: {checks[1]}")
    check(checks[0]["pinned"] == "False"
          and float(checks[0]["predicted_exchange_ms"]) == 0, f"shared check: {checks[0]}")
    md = open(results).read()
    check(md.startswith("# Results\n\nkept above\n"), "the rest of RESULTS.md was lost")
    # The section's cost: every training run's own CPU time, added up.
    cpu = sum(r["cpu_seconds"] for r in runs.values())
    check(all(0 < r["cpu_seconds"] < 4 * r["seconds"] + 1 for r in runs.values()),
          "each run's CPU time")
    check(f"Cost: {len(runs)} training runs, {cpu / 3600:.1f} CPU core-hours (their CPU "
          f"time;" in md, "the cost line")
    for t in ("50%", "90%"):
        check(f"### To {t}" in md, f"no table for the {t} target")
    for said in ("speed-up, ideal hardware", "speed-up, equal devices", "x** [",
                 "data parallelism", "Verdict for this model", "first block alone"):
        check(said in md, f"the summary lacks {said!r}")
    for plot in ("tiny_frontier_0_5.svg", "tiny_frontier_0_9.svg", "tiny_heads_by_depth.svg"):
        path = os.path.join(tmp, "doc", "results", plot)
        check(os.path.exists(path) and "<svg" in open(path).read(), f"no plot {plot}")
        check(f"](results/{plot})" in md, f"RESULTS.md does not show {plot}")

    # Again with --reuse: nothing reruns, and the section is replaced, not appended.
    before = {d: os.path.getmtime(os.path.join(out, "runs", d, "run.json")) for d in runs}
    r = subprocess.run(cmd + ["--reuse"], capture_output=True, text=True)
    check(r.returncode == 0, f"--reuse failed: {r.stderr}")
    check(all(os.path.getmtime(os.path.join(out, "runs", d, "run.json")) == t
              for d, t in before.items()), "--reuse reran runs")
    check(open(results).read().count("frontier: begin") == 1, "section appended twice")


def run_tuned_sweep(source, localpar, tmp, job):
    # Tune seeds: each point's learning rate is chosen on seed 1 alone, and the point is
    # reported over fresh seeds 2 and 3, which train only the chosen setting.
    # The edge stage: the point reaches 0.9 at both rates on seed 1, so whichever end of
    # the grid wins, the rate past it (factor 0.5 or 4) is tried too. Data parallelism
    # also runs B = 32, with a budget of its own there. Profiles are wanted on 2
    # occasions, with no gap between them.
    dp_more = dict(METHODS[0], extra_batch_sizes=[32], lengths_at={"32": [3200000]})
    tuned = os.path.join(tmp, "tuned.json")
    with open(tuned, "w") as f:
        json.dump({"name": "t", "parallel": 2, "profile_occasions": 2,
                   "profile_gap_hours": 0, "profile_tag": "tb",
                   "models": [{"job": job, "targets": [0.9, 0.85], "batch_sizes": [16],
                               "device_batch": 16, "tune_seeds": [1], "seeds": [2, 3],
                               "lr": {"base": 0.05, "base_batch": 32, "factors": [1, 2]},
                               "max_examples": 4000000, "eval_every_examples": 256,
                               "depth_check": False, "extend_edges": 1},
                              # The depth check alone: both data-parallel methods over
                              # 12800 examples each, to the end.
                              {"job": job, "label": "tinydepth", "targets": [0.9],
                               "batch_sizes": [16], "device_batch": 16, "tune_seeds": [1],
                               "lr": {"base": 0.05, "base_batch": 32, "factors": [1]},
                               "max_examples": 12800, "eval_every_examples": 256,
                               "depth_only": True}],
                   "methods": [dp_more, METHODS[1]],
                   # A model that is not swept still gets its cluster checks.
                   "cluster_checks": [{"model": "tinydepth", "method": "data parallel",
                                       "batch": 16, "steps": 20}]}, f)
    out3 = os.path.join(tmp, "out3")
    tuned_cmd = [sys.executable, os.path.join(source, "deploy", "frontier.py"), tuned,
                 "--localpar", localpar, "--cache", os.path.join(tmp, "cache3.jsonl")]
    r = subprocess.run(tuned_cmd + ["--out", out3], capture_output=True, text=True)
    check(r.returncode == 0, f"tuned sweep failed:\n{r.stderr}")
    every = {d: json.load(open(os.path.join(out3, "runs", d, "run.json")))
             for d in os.listdir(os.path.join(out3, "runs"))}
    return tuned_cmd, out3, every


def check_tuning(fr, every, out3):
    """The tuned sweep's learning rates, its fresh seeds and its edges."""
    trained = {d: r for d, r in every.items() if d.startswith("tiny-BACKPROP-K1-b16-")}
    tune = {r["lr"]: r for r in trained.values() if r["seed"] == 1}
    base = [0.05 * math.sqrt(16 / 32) * f for f in (1, 2)]
    hits = {lr: fr.first_reaching([(p["step"], p["metrics"][-1]) for p in r["points"]],
                                  0.9, True, 2) for lr, r in tune.items()}
    steps = {lr: hit[0] if hit else math.inf for lr, hit in hits.items()}
    won = min(base, key=lambda lr: (steps[lr], base.index(lr)))
    past = won / 2 if won == base[0] else won * 2
    # (0.85 may choose the other end, and add the rate past that one.)
    check(len(tune) in (3, 4) and any(close(lr, past) for lr in tune)
          and all(lr in base or close(lr, base[0] / 2) or close(lr, base[1] * 2)
                  for lr in tune),
          f"seed 1 tunes both rates and the one past the winner's end: {sorted(trained)}")
    # The grid in its order (ties go to the first): the spec's rates, the one past 0.9's
    # winner, then any that 0.85 added.
    order = base + [lr for lr in tune if close(lr, past)] + [
        lr for lr in tune if lr not in base and not close(lr, past)]
    best = min(order, key=lambda lr: (steps[lr], order.index(lr)))
    fresh = [r for r in trained.values() if r["seed"] != 1 and r["lr"] == best]
    check(sorted(r["seed"] for r in fresh) == [2, 3]
          and all(r["lr"] in tune for r in trained.values()),
          f"seeds 2 and 3 train the chosen lr {best}: {sorted(trained)}")
    row = list(csv.DictReader(open(os.path.join(out3, "frontier.csv"))))[0]
    want = sum(fr.first_reaching([(p["step"], p["metrics"][-1]) for p in r["points"]],
                                 0.9, True, 2)[0] for r in fresh) / 2
    check(int(row["seeds"]) == 2 and close(float(row["steps"]), want),
          f"the point reports the fresh seeds: {row}")
    # The rate past the grid is at the end of the axis continued one step: an edge for
    # good if it won, and the winner inside the grid has both neighbours tried.
    check(row["lr_edge"] == str(best not in base) and row["length_edge"] == "False",
          f"edges after the edge stage: {row}")
    rows3 = list(csv.DictReader(open(os.path.join(out3, "frontier.csv"))))
    check([(r["method"], r["batch"], r["length"]) for r in rows3 if r["batch"] == "32"]
          == [("data parallel", "32", "3200000")] * 2 and rows3[0]["blocks"] == "2"
          and rows3[-1]["blocks"] == "1", f"a method's own batch size and budget: {rows3}")


def check_occasions(localpar, tmp, tuned_cmd, out3):
    # The profiles' second occasion: a second run of the sweep measures each once more
    # and trains nothing; a third measures nothing. The step is the median of the two.
    out4 = os.path.join(tmp, "out4")
    r = subprocess.run(tuned_cmd + ["--out", out4], capture_output=True, text=True)
    profiled = re.findall(r"^profiled .*$", r.stderr, re.M)
    check(r.returncode == 0 and profiled and all("cached" not in p and "(2 of 2" in p
                                                  for p in profiled)
          and not re.search(r"evaluations, (reached|budget), [0-9]+ s", r.stderr),
          f"the second occasion:\n{r.stderr}")
    again4 = list(csv.DictReader(open(os.path.join(out4, "frontier.csv"))))[0]
    check(again4["profile_occasions"] == "2"
          and float(again4["step_seconds_low"]) <= float(again4["step_seconds"])
          <= float(again4["step_seconds_high"]), f"a step over two occasions: {again4}")
    version = subprocess.run([localpar, "--version"], capture_output=True,
                             text=True).stdout.splitlines()[0]
    check(f"so far 2 each) by {version}" in open(os.path.join(out4, "FRONTIER.md")).read(),
          "FRONTIER.md counts the occasions and names the build")
    # Under keys of the sweep's own (its tag), each with the build that measured it.
    profs = [json.loads(line) for line in open(os.path.join(tmp, "cache3.jsonl"))]
    profs = [p for p in profs if p["kind"] == "profile"]
    check(len(profs) >= 4 and all("-t1-tb" in p["key"] and p["value"]["version"] == version
                                  for p in profs), f"the tagged profiles: {profs}")
    r = subprocess.run(tuned_cmd + ["--out", os.path.join(tmp, "out5")], capture_output=True,
                       text=True)
    profiled = re.findall(r"^profiled .*$", r.stderr, re.M)
    check(r.returncode == 0 and profiled and all(", cached (2 of 2" in p for p in profiled),
          f"a third run measures nothing:\n{r.stderr}")
    md3 = open(os.path.join(out3, "FRONTIER.md")).read()
    check("chosen on seed 1, reported over fresh seeds 2, 3" in md3,
          "FRONTIER.md states the tuning")


def check_depth(every, out3):
    md3 = open(os.path.join(out3, "FRONTIER.md")).read()
    # The depth check: both methods trained to the end of their 12800 examples (800
    # steps), never stopped at the target, and the best value each held 2 evaluations
    # in a row; a depth_only model gets no frontier points.
    depth = {r["method"]: r for r in csv.DictReader(open(os.path.join(out3, "depth.csv")))
             if r["model"] == "tinydepth"}
    check(sorted(depth) == ["data parallel", "first block alone"], f"depth rows: {depth}")
    for method, first in (("data parallel", ""), ("first block alone", "-first1")):
        run = every[f"tinydepth-BACKPROP-K1{first}-b16-lr0.0353553-n12800-s1"]
        acc = [p["metrics"][-1] for p in run["points"]]
        check(not run["stopped_at_target"] and run["points"][-1]["step"] == 800,
              f"{method}: the depth run trains to its end")
        check(close(float(depth[method]["best"]),
                    max(min(a, b) for a, b in zip(acc, acc[1:]))),
              f"{method}: the best value held twice in a row")
    check("## Targets that need depth" in md3
          and "tinydepth (test accuracy; B = 16, 12800 examples;" in md3
          and "| 2 | data parallel |" in md3 and "| 1 | first block alone |" in md3,
          "FRONTIER.md has the depth table")
    check(not any(r["model"] == "tinydepth"
                  for r in csv.DictReader(open(os.path.join(out3, "frontier.csv")))),
          "a depth_only model is not swept")
    checked = list(csv.DictReader(open(os.path.join(out3, "checks.csv"))))
    check([(r["model"], r["method"]) for r in checked] == [("tinydepth", "data parallel")],
          f"the depth_only model's cluster check ran: {checked}")


def check_stops(source, localpar, tmp, job, sig, code):
    """Ctrl-C (SIGINT to the sweep alone, as from `kill -INT`) and SIGTERM stop it at once:
    the runs under way are killed, the ones queued never start, exit 130 or 143."""
    slow = os.path.join(tmp, f"slow{sig}.json")
    with open(slow, "w") as f:
        json.dump({"name": "slow", "parallel": 2,
                   "models": [{"job": job, "targets": [0.999], "batch_sizes": [16, 32],
                               "device_batch": 16, "depth_check": False,
                               "lr": {"base": 0.05, "base_batch": 32, "factors": [1, 2]},
                               "max_examples": 40000000, "eval_every_examples": 4096}],
                   "methods": METHODS[:1]}, f)
    slow_out = os.path.join(tmp, f"slow_out{sig}")
    proc = subprocess.Popen([sys.executable, os.path.join(source, "deploy", "frontier.py"),
                             slow, "--out", slow_out, "--localpar", localpar],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            os.path.isdir(os.path.join(slow_out, "runs"))
            and len(os.listdir(os.path.join(slow_out, "runs"))) >= 2):
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        check(False, f"signal {sig} did not stop the sweep within 20 s")
    left = subprocess.run(["pgrep", "-f", "--", f"--out={slow_out}"], capture_output=True,
                          text=True).stdout.split()
    started = os.listdir(os.path.join(slow_out, "runs"))
    check(proc.returncode == code and not left and len(started) == 2
          and not any(os.path.exists(os.path.join(slow_out, "runs", d, "run.json"))
                      for d in started),
          f"signal {sig}: exit {proc.returncode}, runs left {left}, started {started}:\n{err}")


def check_bad_spec(cmd, spec, job):
    """A bad sweep file names the field."""
    with open(spec, "w") as f:
        json.dump({"models": [{"job": job, "targets": [0.5], "batch_sizes": [24],
                               "device_batch": 16, "max_examples": 10,
                               "eval_every_examples": 10,
                               "lr": {"base": 1, "base_batch": 1, "factors": [1]}}],
                   "methods": METHODS}, f)
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 2 and "models[0].batch_sizes" in r.stderr, f"bad spec: {r.stderr}")
print("frontier_test: ok")


def main():
    localpar, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    sys.path.insert(0, source)
    from experiments import jobs, stats
    from experiments.frontier import model, spec as fspec, summary
    # The runner's modules, as one namespace for the checks below.
    fr = types.SimpleNamespace(**{k: v for mod in (stats, jobs, model, fspec, summary)
                                  for k, v in vars(mod).items() if not k.startswith("_")})
    test_logic(fr)
    test_choices(fr)
    # The shipped sweep file is valid (a mistake there would surface hours into a sweep).
    for name in ("frontier.json", "frontier_depth.json"):
        spec = fr.load_spec(os.path.join(source, "deploy", "experiments", name))
        check(spec.models and spec.methods, f"deploy/experiments/{name}")

    with tempfile.TemporaryDirectory(prefix="localpar_frontier_") as tmp:
        job = os.path.join(tmp, "tiny.textproto")
        write_job(job, 2048)
        check_project(localpar, job)
        spec, out, cmd, results, cache = run_first_sweep(source, localpar, tmp, job)
        rows, runs = check_first_runs(tmp, cmd, out)
        check_plan(source, localpar, tmp, spec, cache)
        check_points(fr, rows, runs)
        check_report(tmp, out, results, runs, cmd)
        tuned_cmd, out3, every = run_tuned_sweep(source, localpar, tmp, job)
        check_tuning(fr, every, out3)
        check_occasions(localpar, tmp, tuned_cmd, out3)
        check_depth(every, out3)
        for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            check_stops(source, localpar, tmp, job, sig, code)
        check_bad_spec(cmd, spec, job)
    print("frontier_test: ok")


if __name__ == "__main__":
    main()
