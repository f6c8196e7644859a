"""The frontier's report: FRONTIER.md (and the section of RESULTS.md), its tables and its
plots."""

import math
import os

from experiments import plots
from experiments.frontier.checks import checks_markdown
from experiments.frontier.model import PROFILE_TOLERANCE, pareto
from experiments.frontier.summary import (claim_text, fmt_flops, fmt_target, overlap_text,
                                          reliability, summary_markdown)


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
    q, t = plots.quote, plots.text
    lines = []
    for i, (label, _) in enumerate(series):
        lines.append(f"{q(data)} index {i} using 1:2 with linespoints lc {i + 1} pt {i + 1} "
                     f"title {t(label)}")
        lines.append(f"{q(data)} index {i} using 1:2:(sprintf('%d', $3)) with labels "
                     f"offset 0.6,0.6 font ',8' tc lt {i + 1} notitle")
    lines.append(f"{q(data)} index {len(series)} using 1:2 with lines dt 2 lc rgb 'black' "
                 f"title 'the front (all methods)'")
    out = f"{stem}.svg"
    plots.gnuplot(f"""set terminal svg size 760,460 dynamic enhanced background rgb 'white'
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
plot {", ".join(lines)}
""", plots_dir)
    return out


def depth_markdown(depth_rows, models):
    """Which targets need depth: the best each depth of the data-parallel network held."""
    md = ["\n## Targets that need depth\n",
          "Data parallelism with the whole network and with its first blocks alone, at the "
          "reference batch, every learning rate of the grid, trained over the longest length "
          "to its end: the best value each held for `hold` evaluations in a row, at its best "
          "learning rate (mean over the tune seeds; *edge*: at an end of the grid). A target "
          "the first block reaches does not need depth, and a frontier on it says nothing "
          "about deep networks; *half the depth* is how far the network of half the blocks "
          "stays behind the whole one.\n"]

    def better(a, b, text):
        return a < b if text else a > b
    notes = []
    for m in models:
        rows = sorted((r for r in depth_rows if r["model"] == m.name),
                      key=lambda r: r["blocks"])
        whole = next((r for r in rows if not r["shallow"]), None)
        shallow = [r for r in rows if r["shallow"]]
        if not whole or not shallow:
            continue
        text = m.text
        fmt = (lambda v: f"{v:.3f}") if text else (lambda v: f"{100 * v:.2f}%")
        first = shallow[0]
        need = [t for t in m.targets if better(t, first["best"], text)]
        half = next((r for r in rows if 2 * r["blocks"] == whole["blocks"]), None)
        gap = ("not run" if half is None else
               f"{half['best'] - whole['best']:+.3f} bits/byte" if text else
               f"{100 * (half['best'] - whole['best']):+.2f} points")
        md += [f"{m.name} ({'held-out bits per byte, lower is better' if text else 'test accuracy'}"
               f"; B = {whole['batch']}, {whole['length']} examples; targets "
               f"{', '.join(fmt_target(t, text) for t in m.targets)}: {len(need)} of "
               f"{len(m.targets)} need more than the first "
               + (f"{first['blocks']} blocks" if first["blocks"] > 1 else "block")
               + f"; half the depth: {gap}):\n",
               "| blocks | method | best held | lr |", "|---|---|---|---|"]
        md += [f"| {r['blocks']} | {r['method']} | {fmt(r['best'])} | {r['lr']:.2g}"
               f"{' (edge)' if r['lr_edge'] else ''} |" for r in rows]
        md.append("")
        if not better(whole["best"], first["best"], text):
            notes.append(f"\n**{m.name}: depth does not pay.** The first block alone holds a "
                         f"value at least as good as the whole network's, so no target needs "
                         f"the deep network"
                         + (", and the model is not swept." if m.depth_only else ".") + "\n")
        elif m.depth_only:
            notes.append(f"\n{m.name} is marked depth_only: not swept.\n")
    return "\n".join(md + notes) + "\n"


def sweep_cost(runs):
    """The training runs' count and CPU core-hours: each run's own CPU time where it was
    recorded, else its wall time (one thread, a core of its own)."""
    runs = list(runs)
    seconds = sum(r.get("cpu_seconds", r["seconds"]) for r in runs)
    measured = sum(1 for r in runs if "cpu_seconds" in r)
    return len(runs), seconds / 3600, measured


def occasions_text(wanted, gap_hours, counts, builds=()):
    """How often the profiles were measured: `counts` has each one's number of occasions;
    `builds` the `localpar --version` of what measured them."""
    by = (f" by {'; '.join(sorted(builds))}" + (" (**several builds: unlike with unlike**)"
                                                 if len(builds) > 1 else "")) if builds else ""
    if wanted == 1:
        return "one occasion" + by
    have = (f"{min(counts)}" if min(counts) == max(counts) else
            f"{min(counts)} to {max(counts)}") if counts else "none"
    return (f"up to {wanted} separate occasions (runs of the sweep at least {gap_hours:g} h "
            f"apart; so far {have} each){by}")


def header(command, hw, cost, disagreements, profiles=(1, 0, [], ())):
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
        f"{hw.link_gbps} Gbit/s with {hw.latency_us} us latency. Each profile is "
        f"measured one at a time on {occasions_text(*profiles)}, and kept with --cache, so a "
        "rerun chooses the same points; a stage's time is its median over the occasions, and "
        "the summary's intervals carry their spread.\n"
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
        "target, then the fewest mean steps); a chosen learning rate or length with an untried "
        "neighbour on the grid is marked *(edge)*. Each point says in how many of its seeds it "
        "reached the target and ranks by its median time over them, a miss counting as "
        "infinitely long; its mean counts a miss at the budget and is then a lower bound (>). Pipelined backprop computes the same update as backprop, so it "
        "shares data parallelism's runs and differs only in cost. Runs are cached by their "
        "configuration, so the sweep resumes where it stopped.\n")
    return md


def method_grids(spec, m):
    """What some methods try beyond the model's grid, and how far the edge stage may go."""
    out = []
    for a in spec.methods:
        extra = [b for b in a.batch_sizes(m) if b not in m.batch_sizes]
        parts = [f"also B = {', '.join(map(str, extra))}"] if extra else []
        parts += [f"lengths of {', '.join(map(str, a.lengths(m, b)))} examples at B = {b}"
                  for b in a.batch_sizes(m) if str(b) in a.lengths_at]
        if parts:
            out.append(f"{a.label}: {'; '.join(parts)}")
    text = f" Beyond that grid: {'; '.join(out)}." if out else ""
    if m.extend_edges:
        text += (f" A point that reaches its target on every tune seed at a setting with an "
                 f"untried neighbour (the next learning rate or length along the grid) tries "
                 f"that neighbour too, up to {m.extend_edges} steps past each end of the grid, "
                 "until its choice is a local optimum of what was tried.")
    return text


def model_intro(m, spec):
    text, lr, sched = m.text, m.lr, m.schedule
    sched_text = (f"warm-up over {sched.warmup_examples} examples, then "
                  f"{sched.kind.lower()} to {sched.min_lr_fraction:g} x lr over lengths of "
                  f"{', '.join(map(str, m.lengths))} examples" if sched else
                  "the job's own schedule")
    held = m.data.get("validation_examples", m.data.get("test_examples"))
    others = ", ".join(str(d) for d in m.device_batches if d != m.device_batch) or "no other"
    tuned = (f"each point's setting chosen on seed{'s' if len(m.tune_seeds) > 1 else ''} "
             f"{', '.join(map(str, m.tune_seeds))}, reported over fresh "
             if set(m.tune_seeds) != set(m.seeds) else "")
    more = ", ".join(str(x) for x in m.summary_seeds if x not in m.seeds) or "no more"
    return (
        f"Job `{os.path.relpath(m.job)}`; {m.data['train_examples']} training / {held} "
        f"held-out examples; batch sizes {', '.join(map(str, m.batch_sizes))}; device batch "
        f"{m.device_batch} (also {others}); "
        f"lr grid {lr.base:g} x sqrt(B / {lr.base_batch}) x "
        f"{{{', '.join(f'{f:g}' for f in lr.factors)}}}; {sched_text}; budget "
        f"{m.max_examples} training examples"
        + (" (a run's own length where a method or the edge stage gives it a longer one)"
           if m.extend_edges or any(a.lengths_at for a in spec.methods) else "") + "; "
        f"evaluated every {m.eval_every_examples} "
        f"examples; reached when {m.hold} evaluations in a row meet the target; "
        + tuned + f"seeds {', '.join(map(str, m.seeds))} (the summary's points also {more}). "
        f"Target{'s' if len(m.targets) > 1 else ''}: "
        f"{', '.join(fmt_target(t, text) for t in m.targets)} "
        f"({'held-out bits per byte, lower is better' if text else 'test accuracy'})."
        + method_grids(spec, m) + "\n")


def target_section(spec, m, mrows, target, plots_dir):
    text = m.text
    trows = [r for r in mrows if r["target"] == target]
    md = [f"\n### To {fmt_target(target, text)}\n",
          "| method | B | devices | lr | length (examples) | reached in (seeds) "
          "| steps (mean ± sd) | compute (FLOPs) | step (ms) "
          "| time to target (s): median (mean) | on the frontier |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    reached = [r for r in trows if r["reached"]]
    front = {id(reached[i]) for i in pareto(
        [(r["compute_flops"], r["time_seconds"]) for r in reached])}
    for r in trows:
        edge = " (edge)" if r["lr_edge"] else ""
        length_edge = " (edge)" if r.get("length_edge") else ""
        seeds = reliability(r)
        # Ranked by the median, a missed seed counting as infinitely long; the mean counts
        # a miss at its budget, so it is a bound (>) then.
        med = r.get("median_seconds", math.inf)
        time_s = (f"{med:.3g}" if med < math.inf else "missed") + (
            f" ({'>' if r['bound'] else ''}{r['time_seconds']:.3g})")
        md.append(f"| {r['method']} | {r['batch']} | {r['devices']} | {r['lr']:.2g}{edge} "
                  f"| {r['length']}{length_edge} | {seeds} "
                  f"| {r['steps']:.0f} ± {r['steps_sd']:.0f} "
                  f"| {('>' if r['bound'] else '') + fmt_flops(r['compute_flops'])} "
                  f"| {1e3 * r['step_seconds']:.3g} | {time_s} | "
                  f"{'**yes**' if id(r) in front else ''} |")
    md.append("")
    md.append(claim_text(trows, reached, front, target, text))
    series = []
    for a in spec.methods:
        pts = sorted((r["batch"], r["compute_flops"], r["time_seconds"]) for r in reached
                     if r["method"] == a.label)
        series.append((a.label, [(c, t, b) for b, c, t in pts]))
    if reached:
        fname = plot_frontier(plots_dir, m.name, target, series, text)
        md.append(f"![{fname}](plots/{fname})\n")
    else:
        md.append("No method reached this target at any batch size: no plot.\n")
    return md


def heads_section(spec, m, hrows, plots_dir):
    """Each stage's head against depth at the reference batch."""
    text = m.text
    series = []
    for a in spec.methods:
        pts = [(h["stage"] / h["stages"], h["metric"] * (1 if text else 100))
               for h in hrows if h["method"] == a.label]
        if pts:
            series.append((a.label, [(f"{x:.4f}", f"{y:.4f}") for x, y in pts]))
    metric = "held-out bits per byte" if text else "test accuracy (%)"
    seen = hrows[0]["examples"]
    fname = plots.line_plot(
        plots_dir, f"{m.name}_heads_by_depth", series,
        f"{m.name}: each stage's head after {seen} examples, B = {m.reference_batch}",
        "depth (stage / stages)", metric, "linespoints", "set xrange [0:1.05]")
    return [f"\nEach stage's head against depth at B = {m.reference_batch}, after "
            f"{seen} training examples (step {hrows[0]['step']}: the last evaluation "
            f"that every run reached, since runs stop at the target), at each "
            f"method's best learning rate there:\n",
            f"![{fname}](plots/{fname})\n", overlap_text(hrows, text)]


def report_markdown(command, spec, models, rows, head_rows, check_rows, plots_dir,
                    depth_rows=(), all_models=(), cost=None, disagreements=(),
                    profile_counts=(), builds=()):
    md = header(command, spec.hardware, cost, disagreements,
                (spec.profile_occasions, spec.profile_gap_hours, list(profile_counts), builds))
    if depth_rows:
        md.append(depth_markdown(depth_rows, all_models or models))
    for m in models:
        mrows = [r for r in rows if r["model"] == m.name]
        md.append(f"\n## {m.name}\n")
        md.append(model_intro(m, spec))
        for target in m.targets:
            md += target_section(spec, m, mrows, target, plots_dir)
        md.append(summary_markdown(mrows, m.targets, m.text, m.device_batch,
                                   m.device_batches, m.equal_devices))
        hrows = [h for h in head_rows if h["model"] == m.name]
        if hrows:
            md += heads_section(spec, m, hrows, plots_dir)
    if check_rows:
        md.append(checks_markdown(check_rows))
    return "\n".join(md) + "\n"
