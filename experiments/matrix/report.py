"""The matrix's report: results.csv, stages.csv, curves.csv, three SVGs per model and a
Markdown section (with per-seed rows, means over seeds and paired gaps to BACKPROP)."""

import csv
import os
import shutil

from experiments import plots
from experiments.common import replace_experiment_section, rewrite, write_csv
from experiments.stats import mean_sd, paired_gap


def fmt_metric(value, text):
    return f"{value:.3f}" if text else f"{100 * value:.2f}%"


def write_tables(out_dir, outcome):
    write_csv(os.path.join(out_dir, "results.csv"), outcome.rows,
              ["model", "arm", "rule", "lr", "stages", "seed", "metric_name", "metric",
               "wall_seconds", "examples_per_second", "steps", "sequential_steps", "baseline",
               "train_flops"])
    write_csv(os.path.join(out_dir, "stages.csv"), outcome.stage_rows,
              ["model", "arm", "seed", "stage", "test_loss", "test_accuracy", "metric"])
    with open(os.path.join(out_dir, "curves.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seconds", "stage", "train_loss"])
        for rid, c in outcome.curves.items():
            for t, k, loss in c:
                w.writerow([rid, t, k, loss])


def plot_model(name, rows, curves, text, plots_dir):
    """Three SVG plots for one model; returns their file names."""
    metric = "held-out bits per byte" if text else "test accuracy (%)"
    scale = 1 if text else 100

    def label(r):
        return f"{r['arm']} seed {r['seed']}"
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
        plots.line_plot(plots_dir, f"{name}_metric_vs_time", timeline,
                        f"{name}: {metric} against wall time", "wall time (s)", metric,
                        "linespoints"),
        plots.line_plot(plots_dir, f"{name}_stage_heads", heads,
                        f"{name}: each stage head, {metric}", "stage", metric, "linespoints",
                        "set xtics 1"),
        plots.line_plot(plots_dir, f"{name}_training_curves", train,
                        f"{name}: last stage training loss (nats), recent batches",
                        "wall time (s)", "training loss", "linespoints pointsize 0.4"),
    ]


def header(spec, outcome, command):
    md = [f"# Results: {spec.name}\n", "Produced by the experiment runner; regenerate with\n",
          f"```\n{command}\n```\n"]
    if spec.trainer == "reference":
        how = ("Every run is the in-process reference trainer (`localpar train`: every stage in "
               "one process, one run per core, {} at once), which gives a local cluster's "
               "weights bit for bit on CPU".format(spec.parallel))
    else:
        how = ("Every run is a real local cluster (`localpar run`: one worker process per "
               "stage and a coordinator over gRPC on loopback)")
    md.append(f"{how}, device `{spec.device}`, "
              f"{spec.threads} GEMM thread(s) per process; seeds per model below. Wall "
              f"time includes the per-epoch "
              f"evaluations. *Sequential steps* counts dependent stage computations on the "
              f"critical path: BACKPROP 2 x stages per update (forward and backward visit every "
              f"stage before the next update); GREEDY and CHUNKED one per update once the "
              f"pipeline is full; OVERLAP two.\n")
    # What the section cost: each reference run holds one core (its threads) for its wall time.
    usage = [r["cpu"] for r in outcome.rows] + outcome.tune_usage
    hours = sum(c for c, _ in usage) / 3600
    measured = sum(1 for _, known in usage if known)
    how = ("their CPU time" if measured == len(usage) else
           f"CPU time for {measured}, wall time for the {len(usage) - measured} runs "
           f"recorded before CPU time was")
    md.append(f"Cost: {len(usage)} runs, {hours:.1f} CPU core-hours ({how}).\n")
    return md


def tuning_table(spec, m, outcome, metric):
    trows = [t for t in outcome.tune_rows if t[0] == m.name]
    if not trows:
        return []
    lrs, text = spec.tune.lrs, m.text
    md = [f"Learning rates, tuned on seed(s) {', '.join(map(str, spec.tune.seeds))}: the final "
          f"{metric} at each peak rate of the grid (the schedule's floor scales with it). Each "
          f"arm then trains the seeds below at its best rate, in bold; *edge* marks a best rate "
          f"at the end of the grid, where a wider grid might do better.\n",
          "| arm | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best |",
          "|---|" + "---|" * (len(lrs) + 1)]
    for _, label, means in trows:
        best = outcome.chosen.get((m.name, label))
        cells = [(f"**{fmt_metric(means[lr], text)}**" if lr == best
                  else fmt_metric(means[lr], text)) if lr in means else "not run" for lr in lrs]
        edge = best in (lrs[0], lrs[-1])
        verdict = "" if best is None else f"{best:g}" + (" (*edge*)" if edge else "")
        md.append(f"| {label} | " + " | ".join(cells) + f" | {verdict} |")
    return md + [""]


def run_table(mrows, text, metric):
    md = [f"| arm | stages | seed | last stage: {metric} | vs BACKPROP | each stage's head "
          f"| wall s | examples/s | updates | sequential steps |",
          "|---|---|---|---|---|---|---|---|---|---|"]
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
    return md


def seeds_table(mrows, text, metric):
    ppl_note = "; perplexity is 2^(bits/byte), so its ratio to BACKPROP is 2^gap" if text else ""
    md = ["", f"Over the seeds (mean ± sample standard deviation, and min to max); the gap to "
          f"BACKPROP is paired by seed, with a 95% confidence interval (Student's t over the "
          f"per-seed gaps){ppl_note}:\n"]
    ppl = " | perplexity vs BACKPROP" if text else ""
    with_lr = any(r["lr"] != "" for r in mrows)
    flops = {arm: [r["train_flops"] for r in mrows if r["arm"] == arm and r["train_flops"] != ""]
             for arm in dict.fromkeys(r["arm"] for r in mrows)}
    ref_flops = (sum(flops["BACKPROP"]) / len(flops["BACKPROP"])
                 if flops.get("BACKPROP") else None)
    md[-1] = md[-1].rstrip(":\n") + (
        "; training FLOPs are 3 x the forward FLOPs of the layers and of the heads a rule "
        "trains (every stage's under a local rule, the last one's under BACKPROP) per "
        "example trained, mean over seeds, and their ratio to BACKPROP's:\n")
    md.append(f"| arm |{' lr |' if with_lr else ''} seeds | mean {metric} | min to max "
              f"| mean gap to BACKPROP | 95% CI of the gap{ppl} | training FLOPs |")
    md.append("|---|---|---|---|---|---|---|" + ("---|" if text else "")
              + ("---|" if with_lr else ""))
    arms = list(dict.fromkeys(r["arm"] for r in mrows))
    by_seed = {arm: {r["seed"]: r["metric"] for r in mrows if r["arm"] == arm} for arm in arms}
    unit = (lambda d: f"{d:+.3f}") if text else (lambda d: f"{100 * d:+.2f} pt")
    for arm in arms:
        vals = list(by_seed[arm].values())
        mean, sd = mean_sd(vals) if len(vals) > 1 else (vals[0], float("nan"))
        gap, ci = None, None
        if "BACKPROP" in by_seed and arm != "BACKPROP":
            gap, ci, _ = paired_gap(by_seed[arm], by_seed["BACKPROP"])
        spread = "" if len(vals) < 2 else f" ± {sd:.3f}" if text else f" ± {100 * sd:.2f}"
        lrs = {r["lr"] for r in mrows if r["arm"] == arm}
        cells = [arm] + ([" ".join(f"{x:g}" if x != "" else "job's" for x in lrs)]
                         if with_lr else []) + [
                 str(len(vals)), f"**{fmt_metric(mean, text)}**{spread}",
                 f"{fmt_metric(min(vals), text)} to {fmt_metric(max(vals), text)}",
                 unit(gap) if gap is not None else "",
                 f"[{unit(ci[0])}, {unit(ci[1])}]" if ci else ""]
        if text:
            cells.append(f"{100 * (2 ** gap - 1):+.1f}%" if gap is not None else "")
        mine = flops.get(arm)
        cells.append("" if not mine else f"{sum(mine) / len(mine):.3g}" + (
            f" ({sum(mine) / len(mine) / ref_flops:.2f}x)" if ref_flops else ""))
        md.append("| " + " | ".join(cells) + " |")
    return md


def losses_line(mrows, text):
    ref = {r["seed"]: r["metric"] for r in mrows if r["arm"] == "BACKPROP"}
    losses = []
    for r in mrows:
        if r["seed"] not in ref or r["rule"] == "BACKPROP":
            continue
        d = r["metric"] - ref[r["seed"]]
        if (d > 0) if text else (d < 0):
            amount = f"{d:+.3f} bits/byte" if text else f"{100 * d:+.2f} points"
            losses.append(f"{r['arm']} (seed {r['seed']}): {amount}")
    if losses:
        return ["", "Where local rules lose to BACKPROP here: " + "; ".join(losses) + ".\n"]
    return ["", "No local rule scored below BACKPROP here.\n"] if ref else [""]


def model_section(args, spec, m, outcome, plots_dir, link_dir, made):
    mrows = [r for r in outcome.rows if r["model"] == m.name]
    text = m.text
    metric = "held-out bits/byte (lower is better)" if text else "test accuracy"
    budget = ", ".join(f"{k} {getattr(m, k)}" for k in ("epochs", "max_steps")
                       if getattr(m, k) is not None)
    seeds = spec.model_seeds(m)
    held = m.data.get("validation_examples", m.data.get("test_examples"))
    md = [f"\n## {m.name}\n",
          f"Job `{os.path.relpath(m.job)}`; budget: {budget or 'as in the job file'}; seeds "
          f"{', '.join(map(str, seeds))}; {m.data['train_examples']} training / {held} "
          f"held-out examples.\n"]
    if text:
        md.append(f"Unigram baseline (a model that ignores context, fitted on the training "
                  f"split): **{m.data['unigram_bits_per_label']:.3f} bits per byte** on the "
                  f"held-out split.\n")
    md += tuning_table(spec, m, outcome, metric)
    md += run_table(mrows, text, metric)
    gone = [rid for rid in outcome.missing if rid.startswith(m.name + "-")]
    if gone:
        md.append("")
        md.append(f"Not run yet ({len(gone)} of {len(seeds) * len(spec.arms)}): "
                  + ", ".join(sorted(gone)) + ". The summary below is over the seeds "
                  "each arm has.")
    if not mrows:
        return md
    if len(seeds) > 1:
        md += seeds_table(mrows, text, metric)
    md += losses_line(mrows, text)
    # Named by the experiment too: two experiments on one model keep their own plots.
    files = plot_model(f"{spec.name}_{m.name}", mrows, outcome.curves, text, plots_dir)
    made.extend(files)
    for fname in files:
        md.append(f"![{fname}]({link_dir}/{fname})\n")
    return md


def write_report(args, spec, outcome, command):
    """The tables, the plots and RESULTS.md under --out; with --results, the experiment's
    section of that file replaced and its plots copied beside it."""
    write_tables(args.out, outcome)
    plots_dir = os.path.join(args.out, "plots")
    results_plots = None
    link_dir = "plots"
    if args.results:
        results_plots = os.path.abspath(args.results_plots or os.path.join(
            os.path.dirname(os.path.abspath(args.results)), "results"))
        link_dir = os.path.relpath(results_plots, os.path.dirname(os.path.abspath(args.results)))
    md, made = header(spec, outcome, command), []
    for m in spec.models:
        md += model_section(args, spec, m, outcome, plots_dir, link_dir, made)
    text_md = "\n".join(md) + "\n"
    with open(os.path.join(args.out, "RESULTS.md"), "w") as f:
        f.write(text_md)
    if args.results:
        os.makedirs(results_plots, exist_ok=True)
        for fname in made:  # this run's plots only, not older ones left in --out
            shutil.copy(os.path.join(plots_dir, fname), results_plots)
        rewrite(args.results, lambda old: replace_experiment_section(old, spec.name, text_md))
