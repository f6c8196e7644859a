"""The whole frontier sweep, from a spec to its tables, plots and report."""

import os
import shutil
import sys

from experiments.common import rewrite, replace_frontier_section, say, write_csv
from experiments.frontier import checks, points, report, runs
from experiments.frontier.sweep import Plan, Sweep

FRONTIER_COLUMNS = ["model", "method", "rule", "blocks", "stages", "batch", "target", "reached",
                    "bound", "lr", "lr_edge", "length", "length_edge", "seeds", "missed",
                    "steps", "steps_sd", "examples", "flops_per_example", "compute_flops",
                    "step_seconds", "step_seconds_low", "step_seconds_high",
                    "profile_occasions", "time_seconds", "median_seconds", "devices"]


def checks_only(sweep):
    ctx = sweep.ctx
    rows = checks.run_checks(ctx, sweep.spec, sweep.all_models, check_profile(sweep))
    write_csv(os.path.join(ctx.out, "checks.csv"), rows, checks.CHECK_COLUMNS)
    with open(os.path.join(ctx.out, "CHECKS.md"), "w") as f:
        f.write(checks.checks_markdown(rows) if rows else "No cluster checks in the sweep file.\n")
    say(f"frontier: {len(rows)} cluster checks; {os.path.join(ctx.out, 'CHECKS.md')}")


def check_profile(sweep):
    return lambda m, stages, rows: sweep.profile(m, stages, rows)["stages"]


def stale_runs(sweep, wanted):
    """Cached runs that no configuration of this sweep asks for (`wanted`: the configurations
    of every stage), said on the console: a job, a grid or a budget that changed."""
    cache = sweep.ctx.cache
    if cache is None:
        return []
    by_id = {}
    for cfg in wanted:
        by_id.setdefault(runs.run_id(cfg), []).append(cfg)
    accept = {rid: (lambda done, cfgs=cfgs: any(runs.covers(done, c) for c in cfgs))
              for rid, cfgs in by_id.items()}
    return cache.stale("run", accept)


def write_outputs(args, sweep, rows, head_rows, check_rows, depth_rows, command):
    out = args.out
    plots_dir = os.path.join(out, "plots")
    write_csv(os.path.join(out, "frontier.csv"), rows, FRONTIER_COLUMNS)
    write_csv(os.path.join(out, "heads.csv"), head_rows,
              ["model", "method", "stages", "stage", "step", "examples", "lr", "metric"])
    write_csv(os.path.join(out, "checks.csv"), check_rows, checks.CHECK_COLUMNS)
    write_csv(os.path.join(out, "depth.csv"), depth_rows,
              ["model", "method", "shallow", "blocks", "batch", "length", "lr", "lr_edge",
               "seeds", "best"])
    md = report.report_markdown(command, sweep.spec, sweep.models, rows, head_rows, check_rows,
                                plots_dir, depth_rows, sweep.all_models,
                                cost=report.sweep_cost(sweep.results.values()),
                                disagreements=sweep.disagreements,
                                profile_counts=[len(p.get("occasions", [p]))
                                                for p in sweep.profiles.values()],
                                builds=sweep.builds)
    with open(os.path.join(out, "FRONTIER.md"), "w") as f:
        f.write(md)
    if not args.results:
        return
    dest = os.path.abspath(args.results_plots or os.path.join(
        os.path.dirname(os.path.abspath(args.results)), "results"))
    os.makedirs(dest, exist_ok=True)
    for fname in os.listdir(plots_dir):
        if fname.endswith(".svg"):
            shutil.copy(os.path.join(plots_dir, fname), dest)
    for fname in ("frontier.csv", "heads.csv", "checks.csv", "depth.csv"):
        shutil.copy(os.path.join(out, fname),
                    os.path.join(dest, fname if fname == "frontier.csv" else f"frontier_{fname}"))
    link_dir = os.path.relpath(dest, os.path.dirname(os.path.abspath(args.results)))
    rewrite(args.results,
            lambda old: replace_frontier_section(old, md.replace("](plots/", f"]({link_dir}/")))


def run(args, ctx, spec, command):
    """Every stage of the sweep (with --plan, up to the first with runs left), then the
    tables, plots and report; with --checks_only, the cluster checks alone."""
    os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
    sweep = Sweep(ctx, spec, plan=args.plan)
    sweep.prepare()
    if args.checks_only:
        return checks_only(sweep)
    try:
        depth_rows = sweep.depth()
        sweep.measure_profiles()
        sweep.tune_and_seed()
        if sweep.unmeasured:  # only with --plan: the summary points compare measured times
            print("summary seeds: not yet known; the summary points need these profiles, "
                  "which the sweep measures first:")
            for u in sweep.unmeasured:
                print(f"  {u}")
            return
        # The summary's points get the summary seeds too: run them, then score again.
        first_pass = points.all_rows(sweep)
        wanted, more_runs = points.summary_runs(sweep, first_pass)
        sweep.run_all(more_runs, "summary seeds (the summary's points)")
    except Plan:
        return
    stale = stale_runs(sweep, sweep.asked)
    if stale and args.prune_cache:
        ctx.cache.drop("run", stale)
        say(f"frontier: removed {len(stale)} cached runs that match no configuration of this "
            f"sweep from {ctx.cache.path}")
    elif stale:
        print(f"warning: {len(stale)} cached runs match no configuration of this sweep (a "
              f"changed job, grid or budget; --prune_cache removes them): "
              f"{', '.join(stale[:5])}" + (", ..." if len(stale) > 5 else ""), file=sys.stderr)
    if args.plan:
        print("every run is done: run it without --plan to write the tables")
        return
    rows = [r for r, _ in points.all_rows(sweep, wanted)]
    head_rows = points.head_rows(sweep)
    check_rows = checks.run_checks(ctx, spec, sweep.all_models, check_profile(sweep))
    write_outputs(args, sweep, rows, head_rows, check_rows, depth_rows, command)
    say(f"frontier: {len(sweep.results)} runs, {len(rows)} points; "
        f"{os.path.join(args.out, 'FRONTIER.md')}")
