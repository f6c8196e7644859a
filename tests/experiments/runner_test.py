#!/usr/bin/python3
"""The experiment runner end to end: a small matrix on real local clusters.

Checks that every run of the matrix happened with the arm's rule and stage count, that the
CSV and Markdown figures are the ones in each run's report.json (accuracy, or held-out loss
converted to bits per byte), that the three plots exist, that --reuse reads runs back
without rerunning them, and that a bad experiment file is refused naming the field.
Usage: runner_test.py LOCALPAR_BINARY SOURCE_DIR
"""

import csv
import json
import math
import os
import subprocess
import sys
import tempfile


def check(cond, message):
    if not cond:
        print(f"FAIL: {message}", file=sys.stderr)
        sys.exit(1)


def check_shipped_local(localpar, source, tmp):
    # The shipped best local configuration of the language-model gap is the arm it names,
    # bit for bit: the same held-out and training losses after a few steps.
    jobs = os.path.join(source, "deploy", "jobs")
    losses = []
    for args in (["shakespeare_char_local2.textproto"],
                 ["shakespeare_char_headblock2_lrscale.textproto", "--rule=OVERLAP",
                  "--stages=2", "--lr=0.002"],
                 ["shakespeare_char_local4.textproto"],
                 ["shakespeare_char_headblock4.textproto", "--rule=OVERLAP",
                  "--lr=0.004"]):
        d = os.path.join(tmp, f"local_{len(losses)}")
        r = subprocess.run([localpar, "train", os.path.join(jobs, args[0]), *args[1:],
                            "--max_steps=6", "--eval_every_steps=0", "--quiet",
                            f"--out={d}"], capture_output=True, text=True)
        check(r.returncode == 0, f"{args}: {r.stderr}")
        report = json.load(open(os.path.join(d, "report.json")))
        e = report["epochs"][-1]
        losses.append(([s["loss"] for s in e["validation"]], [s["loss"] for s in e["train"]],
                       report["rule"], report["stages"]))
    check(losses[0] == losses[1], f"shakespeare_char_local2 is not its arm: {losses}")
    check(losses[2] == losses[3], f"shakespeare_char_local4 is not its arm: {losses}")


def write_lm(tmp):
    """A tiny language model of two transformer blocks, on a corpus of its own."""
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        for i in range(120):
            f.write(f"fortune {i * 37 % 100}: a watched pot never boils.\n%\n")
    lm = os.path.join(tmp, "lm.textproto")
    with open(lm, "w") as f:
        f.write(f'''name: "tiny_lm"
rule: GREEDY
batch_size: 16
seed: 2
data {{ text {{ paths: "{corpus}" seq_len: 8 holdout_fraction: 0.2 }} }}
schedule {{ lr: 0.003 }}
stages {{ layers {{ embedding {{ vocab: 256 dim: 16 }} }} layers {{ positional_encoding {{}} }}
     layers {{ transformer_block {{ heads: 2 }} }} head {{ kind: LANGUAGE_MODEL }} }}
stages {{ layers {{ transformer_block {{ heads: 2 }} }} head {{ kind: LANGUAGE_MODEL }} }}
''')
    return lm


def run_matrix(localpar, source, runner, tmp, lm):
    """Four arms on two models over local clusters, with RESULTS.md."""
    spec = os.path.join(tmp, "spec.json")
    with open(spec, "w") as f:
        json.dump({
            "name": "runner_test",
            "models": [
                {"job": os.path.join(source, "deploy/jobs/synthetic_smoke.textproto"),
                 "epochs": 2},
                {"job": lm, "max_steps": 12, "seeds": [3]},  # its own seed list
            ],
            "arms": [{"rule": "BACKPROP"}, {"rule": "GREEDY"},
                     {"rule": "CHUNKED", "stages": 1}, {"rule": "OVERLAP"}],
            "seeds": [1, 2],
        }, f)
    out = os.path.join(tmp, "out")
    results = os.path.join(tmp, "report", "RESULTS.md")
    cmd = [sys.executable, runner, spec, "--out", out, "--localpar", localpar,
           "--results", results]
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, f"runner failed:\n{r.stdout}\n{r.stderr}")
    return spec, out, results, cmd


def check_rows(localpar, out, lm):
    """Each row of results.csv against its run's report."""
    with open(os.path.join(out, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    check(len(rows) == 4 * 2 + 4 * 1, f"{len(rows)} result rows, want 12")
    check({r["seed"] for r in rows if r["model"] == "tiny_lm"} == {"3"}, "model seeds")
    stage_rows = list(csv.DictReader(open(os.path.join(out, "stages.csv"))))
    check(len(stage_rows) == sum(int(r["stages"]) for r in rows), "stages.csv row count")
    for row in rows:
        arm = row["arm"].replace("/", "-")
        run = os.path.join(out, "runs", f"{row['model']}-{arm}-seed{row['seed']}")
        report = json.load(open(os.path.join(run, "report.json")))
        check(report["rule"] == row["rule"], f"{run}: rule {report['rule']}")
        want_stages = 1 if row["arm"] == "CHUNKED/1" else 2
        check(report["stages"] == want_stages == int(row["stages"]),
              f"{run}: {report['stages']} stages")
        last = (report["epochs"][-1].get("test") or report["epochs"][-1]["validation"])[-1]
        if row["model"] == "tiny_lm":
            check(row["metric_name"] == "bits_per_byte", "metric name for text")
            want = last["loss"] / math.log(2)
            check(report["steps"] == 12, f"{run}: max_steps override ignored")
            baseline = float(row["baseline"])
            check(3.0 < baseline < 8.0, f"unigram baseline {baseline}")
        else:
            check(row["metric_name"] == "accuracy", "metric name for images")
            want = last["accuracy"]
            check(len(report["epochs"]) == 2, f"{run}: epochs override ignored")
        check(abs(float(row["metric"]) - want) < 1e-5,
              f"{run}: csv metric {row['metric']} != report {want}")
        steps = int(row["steps"])
        seq = {"BACKPROP": steps * 2 * want_stages, "OVERLAP": 2 * steps + 2 * (want_stages - 1)}
        check(int(row["sequential_steps"]) == seq.get(row["rule"], steps + want_stages - 1),
              f"{run}: sequential steps {row['sequential_steps']}")
    # Training FLOPs: 3 x the forward FLOPs of the layers and of the heads the rule
    # trains, per example trained; BACKPROP trains the last head, GREEDY both.
    proj = subprocess.run([localpar, "project", lm, "--json", "--stages=2",
                           "--project_stages=1"], capture_output=True, text=True)
    check(proj.returncode == 0, f"project: {proj.stderr}")
    st = json.loads(proj.stdout)["stages"]
    layers = sum(x["forward_flops"] for x in st)
    lm_rows = {r["arm"]: r for r in rows if r["model"] == "tiny_lm"}
    for arm, heads in (("BACKPROP", st[1]["head_forward_flops"]),
                       ("GREEDY", st[0]["head_forward_flops"] + st[1]["head_forward_flops"])):
        report = json.load(open(os.path.join(out, "runs", f"tiny_lm-{arm}-seed3",
                                             "report.json")))
        want = 3 * (layers + heads) * report["train_examples"]
        check(layers > 0 and abs(float(lm_rows[arm]["train_flops"]) - want) <= 1e-9 * want,
              f"{arm}: training FLOPs {lm_rows[arm]['train_flops']}, want {want}")
    # Different seeds are different runs.
    a = [r["metric"] for r in rows if r["seed"] == "1"]
    b = [r["metric"] for r in rows if r["seed"] == "2"]
    check(a != b, "seed 1 and seed 2 gave identical results")
    return rows


def check_report(rows, results):
    """RESULTS.md: its rows, means over seeds, gaps with intervals, plots."""
    md = open(results).read()
    check("python3" in md and "--out" in md, "RESULTS.md lacks the regenerate command")
    for arm in ("BACKPROP", "GREEDY", "CHUNKED/1", "OVERLAP"):
        check(f"| {arm} |" in md, f"RESULTS.md lacks a row for {arm}")
    check("Unigram baseline" in md, "RESULTS.md lacks the unigram baseline")
    # Two seeds on the smoke model: a mean-over-seeds table whose BACKPROP mean is right.
    smoke_bp = [float(r["metric"]) for r in rows
                if r["model"] == "synthetic_smoke" and r["arm"] == "BACKPROP"]
    mean = sum(smoke_bp) / len(smoke_bp)
    check(f"| BACKPROP | 2 | **{100 * mean:.2f}%** ± " in md, "mean over seeds missing or wrong")
    # GREEDY's gap to BACKPROP, paired by seed, with its t interval over the two seeds.
    smoke = {(r["arm"], r["seed"]): float(r["metric"]) for r in rows
             if r["model"] == "synthetic_smoke"}
    gaps = [smoke[("GREEDY", s)] - smoke[("BACKPROP", s)] for s in ("1", "2")]
    gap = sum(gaps) / 2
    half = 12.706 * abs(gaps[0] - gaps[1]) / 2  # t(1) x sd / sqrt(2); sd = |a - b| / sqrt(2)
    line = next(l for l in md.splitlines() if l.startswith("| GREEDY | 2 | **"))
    check(f"| {100 * gap:+.2f} pt | [{100 * (gap - half):+.2f} pt, {100 * (gap + half):+.2f} pt] |"
          in line, f"GREEDY's gap or its interval: {line}")
    for model in ("synthetic_smoke", "tiny_lm"):
        for plot in ("metric_vs_time", "stage_heads", "training_curves"):
            name = f"runner_test_{model}_{plot}.svg"  # the experiment's name, the model's
            path = os.path.join(os.path.dirname(results), "results", name)
            check(os.path.exists(path) and "<svg" in open(path).read(), f"no plot {path}")
            check(f"results/{name}" in md, f"RESULTS.md does not show {plot}")


def check_reuse(out, results, cmd, rows):
    # --reuse reads the runs back instead of training again.
    logs = [os.path.join(out, "runs", d, "run.log") for d in os.listdir(os.path.join(out, "runs"))]
    before = {p: os.path.getmtime(p) for p in logs}
    # The frontier sweep's section of the results file survives a rewrite.
    block = ("<!-- frontier: begin (written by deploy/frontier.py) -->\nthe frontier\n"
             "<!-- frontier: end -->\n")
    with open(results, "a") as f:
        f.write("\n" + block)
    r = subprocess.run(cmd + ["--reuse"], capture_output=True, text=True)
    check(open(results).read().count(block) == 1, "the frontier section was lost")
    check(r.returncode == 0, f"--reuse failed: {r.stderr}")
    check(all(os.path.getmtime(p) == t for p, t in before.items()), "--reuse reran runs")
    check(list(csv.DictReader(open(os.path.join(out, "results.csv")))) == rows,
          "--reuse changed the results")


def check_variant(localpar, runner, tmp, lm, spec, cmd):
    # An arm may train a variant of the model's job under its own label: here a head with
    # a transformer block and a learning rate per stage.
    variant = os.path.join(tmp, "variant.textproto")
    with open(lm) as f:
        text = f.read()
    with open(variant, "w") as f:
        f.write(text.replace("head { kind: LANGUAGE_MODEL } }",
                             "head { kind: LANGUAGE_MODEL layers { transformer_block "
                             "{ heads: 2 } } } lr_scale: 0.5 }", 1))
    check("lr_scale: 0.5" in open(variant).read(), "the variant job")
    with open(spec, "w") as f:
        json.dump({"models": [{"job": lm, "max_steps": 4}], "seeds": [1],
                   "arms": [{"rule": "GREEDY", "job": variant, "label": "GREEDY+var"},
                            {"rule": "GREEDY", "lr": 0.01, "label": "GREEDY+lr"}]}, f)
    r = subprocess.run([sys.executable, runner, spec, "--out", os.path.join(tmp, "var"),
                        "--localpar", localpar], capture_output=True, text=True)
    check(r.returncode == 0, f"variant arm failed:\n{r.stderr}")
    rows = list(csv.DictReader(open(os.path.join(tmp, "var", "results.csv"))))
    check([r["arm"] for r in rows] == ["GREEDY+var", "GREEDY+lr"], f"variant rows: {rows}")
    log = open(os.path.join(tmp, "var", "runs", "tiny_lm-GREEDY+lr-seed1", "run.log")).read()
    check("--lr=0.01" in log.splitlines()[0], "the arm's learning rate was not passed")
    log = open(os.path.join(tmp, "var", "runs", "tiny_lm-GREEDY+var-seed1", "run.log")).read()
    check("variant.textproto" in log, "the arm trained its own job")
    with open(spec, "w") as f:
        json.dump({"models": [{"job": lm}, {"job": lm}],
                   "arms": [{"rule": "GREEDY", "job": variant, "label": "v"}]}, f)
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 2 and "arms[0].job" in r.stderr, f"job arm, two models: {r.stderr}")


def check_reference(localpar, runner, tmp, lm, spec, first_rows):
    # The reference trainer gives a cluster's figures exactly; runs go two at a time, each
    # kept in a cache by its configuration and read back from it by a fresh output dir.
    cache = os.path.join(tmp, "cache.jsonl")
    ref_spec = {"models": [{"job": lm, "max_steps": 12, "seeds": [3]}],
                "arms": [{"rule": "BACKPROP"}, {"rule": "GREEDY"}, {"rule": "OVERLAP"}],
                "trainer": "reference", "parallel": 2, "name": "ref"}
    with open(spec, "w") as f:
        json.dump(ref_spec, f)
    ref_cmd = [sys.executable, runner, spec, "--localpar", localpar, "--cache", cache]
    r = subprocess.run(ref_cmd + ["--out", os.path.join(tmp, "ref1")], capture_output=True,
                       text=True)
    check(r.returncode == 0, f"reference runs failed:\n{r.stderr}")
    ref_rows = list(csv.DictReader(open(os.path.join(tmp, "ref1", "results.csv"))))
    cluster = {r["arm"]: r["metric"] for r in first_rows if r["model"] == "tiny_lm"}
    for row in ref_rows:
        check(row["metric"] == cluster[row["arm"]],
              f"{row['arm']}: reference {row['metric']} != cluster {cluster[row['arm']]}")
    log = open(os.path.join(tmp, "ref1", "runs", "tiny_lm-GREEDY-seed3", "run.log")).read()
    check(" train " in log.splitlines()[0], "the reference arm ran `localpar train`")
    entries = [json.loads(line)["key"] for line in open(cache)
               if json.loads(line)["kind"] == "run"]
    check(len(entries) == 3, f"cache entries: {entries}")
    r = subprocess.run(ref_cmd + ["--out", os.path.join(tmp, "ref2")], capture_output=True,
                       text=True)
    check(r.returncode == 0 and r.stderr.count("done before") == 3,
          f"the cache was not read back:\n{r.stderr}")
    check(not os.path.exists(os.path.join(tmp, "ref2", "runs", "tiny_lm-GREEDY-seed3",
                                          "run.log")), "a cached run was trained again")
    check(list(csv.DictReader(open(os.path.join(tmp, "ref2", "results.csv")))) == ref_rows,
          "the cached runs' figures changed")
    # A changed configuration (another budget) is not answered from the cache; with
    # --done_only the tables name what is missing, and nothing runs.
    ref_spec["models"][0].update(seeds=[3, 4])
    with open(spec, "w") as f:
        json.dump(ref_spec, f)
    r = subprocess.run(ref_cmd + ["--out", os.path.join(tmp, "ref3"), "--done_only"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"--done_only failed:\n{r.stderr}")
    md = open(os.path.join(tmp, "ref3", "RESULTS.md")).read()
    check("Not run yet (3 of 6)" in md and "tiny_lm-GREEDY-seed4" in md,
          "--done_only does not name the missing runs")
    check(len(list(csv.DictReader(open(os.path.join(tmp, "ref3", "results.csv"))))) == 3,
          "--done_only rows")
    ref_spec["models"][0].update(seeds=[3], max_steps=11)
    with open(spec, "w") as f:
        json.dump(ref_spec, f)
    r = subprocess.run(ref_cmd + ["--out", os.path.join(tmp, "ref4"), "--done_only"],
                       capture_output=True, text=True)
    check("Not run yet (3 of 3)" in open(os.path.join(tmp, "ref4", "RESULTS.md")).read(),
          "a run with another budget was answered from the cache")


def check_tuning(localpar, runner, tmp, lm, spec):
    # Tuning: each arm without a rate of its own trains at every rate of the grid on the
    # tune seed, then its seeds at the rate that was best there.
    with open(spec, "w") as f:
        json.dump({"models": [{"job": lm, "max_steps": 10, "seeds": [2, 3]}],
                   "arms": [{"rule": "BACKPROP"}, {"rule": "GREEDY"},
                            {"rule": "GREEDY", "lr": 0.02, "label": "GREEDY+fixed"}],
                   "tune": {"lrs": [0.03, 0.001], "seeds": [1]},
                   "trainer": "reference", "parallel": 2, "name": "tuned"}, f)
    tuned_out = os.path.join(tmp, "tuned")
    r = subprocess.run([sys.executable, runner, spec, "--out", tuned_out, "--localpar",
                        localpar], capture_output=True, text=True)
    check(r.returncode == 0, f"tuned runs failed:\n{r.stderr}")
    runs = sorted(os.listdir(os.path.join(tuned_out, "runs")))
    check(len(runs) == 2 * 2 + 3 * 2, f"tuned runs: {runs}")
    rows = list(csv.DictReader(open(os.path.join(tuned_out, "results.csv"))))
    md = open(os.path.join(tuned_out, "RESULTS.md")).read()
    for arm in ("BACKPROP", "GREEDY"):
        tuned_bits = {}
        for lr in (0.001, 0.03):
            report = json.load(open(os.path.join(tuned_out, "runs",
                                                 f"tiny_lm-{arm}-lr{lr:g}-seed1",
                                                 "report.json")))
            tuned_bits[lr] = report["epochs"][-1]["validation"][-1]["loss"]
        best = min(tuned_bits, key=tuned_bits.get)
        got = {float(r["lr"]) for r in rows if r["arm"] == arm}
        check(got == {best}, f"{arm}: seeds ran at {got}, tuning chose {best}")
        check(any(l.startswith(f"| {arm} | ") and f"| {best:g} (*edge*) |" in l
                  for l in md.splitlines()), f"{arm}: no tuning row naming {best:g}")
    check({r["lr"] for r in rows if r["arm"] == "GREEDY+fixed"} == {"0.02"},
          "an arm with its own rate was tuned")
    check({r["seed"] for r in rows} == {"2", "3"}, "the seeds after tuning")
    # A model's own rate: every arm on it trains at that rate, under the same run id as a
    # tuned run at it, and reproduces that run.
    best = float(next(r["lr"] for r in rows if r["arm"] == "BACKPROP"))
    with open(spec, "w") as f:
        json.dump({"models": [{"job": lm, "max_steps": 10, "seeds": [2], "lr": best}],
                   "arms": [{"rule": "BACKPROP"}], "trainer": "reference",
                   "name": "fixed"}, f)
    fixed_out = os.path.join(tmp, "fixed")
    r = subprocess.run([sys.executable, runner, spec, "--out", fixed_out, "--localpar",
                        localpar], capture_output=True, text=True)
    check(r.returncode == 0, f"a model's own rate failed:\n{r.stderr}")
    rid = f"tiny_lm-BACKPROP-lr{best:g}-seed2"
    check(os.listdir(os.path.join(fixed_out, "runs")) == [rid], "a model's own rate: run id")
    reports = [json.load(open(os.path.join(d, "runs", rid, "report.json")))["epochs"][-1]
               for d in (fixed_out, tuned_out)]
    check(reports[0]["validation"] == reports[1]["validation"],
          "a model's own rate did not reproduce the tuned run at that rate")
    # The cost line adds up every run's own CPU time, the tuning runs' included.
    cpu = 0.0
    for run in runs:
        with open(os.path.join(tuned_out, "runs", run, "usage.json")) as f:
            cpu += json.load(f)["cpu_seconds"]
    check(f"Cost: 10 runs, {cpu / 3600:.1f} CPU core-hours (their CPU time)" in md,
          "the cost line")


def check_bad_specs(cmd, spec, lm):
    # A bad experiment file names the field.
    for arm, field in (({"rule": "SIDEWAYS"}, "arms[0].rule"),
                       ({"rule": "GREEDY", "lr": -1, "label": "x"}, "arms[0].lr"),
                       ({"rule": "GREEDY", "lr": 0.1}, "lr needs a label")):
        with open(spec, "w") as f:
            json.dump({"models": [{"job": lm}], "arms": [arm]}, f)
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode == 2 and field in r.stderr, f"bad spec {arm}: {r.stderr}")
    for extra, field in (({"trainer": "remote"}, "trainer"),
                         ({"tune": {"lrs": [0.1]}}, "tune.lrs"),
                         ({"tune": {"lrs": [0.1, 0.2], "seeds": []}}, "tune.seeds"),
                         ({"parallel": 0}, "parallel"),
                         ({"models": [{"job": lm, "lr": 0}]}, "models[0].lr"),
                         ({"models": [{"job": lm, "lr": 0.1}], "tune": {"lrs": [0.1, 0.2]}},
                          "models[0].lr")):
        with open(spec, "w") as f:
            json.dump({"models": [{"job": lm}], "arms": [{"rule": "GREEDY"}], **extra}, f)
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode == 2 and field in r.stderr, f"bad {extra}: {r.stderr}")


def main():
    localpar, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    runner = os.path.join(source, "deploy", "experiment.py")
    # Every shipped experiment file is valid (its jobs exist, its arms are well formed).
    sys.path.insert(0, source)
    from experiments.matrix.spec import load_spec
    shipped = os.path.join(source, "deploy", "experiments")
    for name in sorted(os.listdir(shipped)):
        # frontier*.json and testbed*.json are frontier.py's and testbed.py's own formats.
        if name.endswith(".json") and not name.startswith(("frontier", "testbed")):
            check(load_spec(os.path.join(shipped, name)).arms, name)
    with tempfile.TemporaryDirectory(prefix="localpar_experiment_") as tmp:
        check_shipped_local(localpar, source, tmp)
        lm = write_lm(tmp)
        spec, out, results, cmd = run_matrix(localpar, source, runner, tmp, lm)
        rows = check_rows(localpar, out, lm)
        check_report(rows, results)
        check_reuse(out, results, cmd, rows)
        check_variant(localpar, runner, tmp, lm, spec, cmd)
        check_reference(localpar, runner, tmp, lm, spec, rows)
        check_tuning(localpar, runner, tmp, lm, spec)
        check_bad_specs(cmd, spec, lm)
    print("runner_test: ok")


if __name__ == "__main__":
    main()
