"""The frontier's points recomputed with the calibrated model: the same runs (steps to each
target, per seed, from the frontier's cache), each step timed by the model fitted on the
testbed instead of the frontier's ideal one, with the held-out runs' spread of measured
over calibrated time carried into an interval.

The frontier's devices get a whole core each and its link (100 Gbit/s); evaluations are left
out, as the frontier leaves them out. The calibrated model was fitted on 2 and 4 devices
(at most 4 stages, 4 replicas): the frontier's 8 stages and its replicas by the dozen are
outside what was measured, and the table says so."""

import contextlib
import io
import math
from types import SimpleNamespace

from experiments.frontier import points
from experiments.frontier.sweep import Plan, Sweep
from experiments.frontier.spec import LOCAL_RULES

FITTED_STAGES, FITTED_REPLICAS = 4, 4


def frontier_points(run):
    """Every (non-shallow) point of the testbed's model, as the frontier's report has them
    (its summary points over the summary seeds), from the caches alone: nothing is trained or
    measured here. Raises frontier.sweep.Plan where a run or profile is not cached."""
    fr = Sweep(run.frontier.ctx, run.frontier.spec, plan=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        fr.prepare()
        fr.depth()
        fr.measure_profiles()
        fr.tune_and_seed()
        if fr.unmeasured:
            raise Plan()
        wanted, more = points.summary_runs(fr, points.all_rows(fr))
        fr.run_all(more, "summary seeds")
    return [r for r, _ in points.all_rows(fr, wanted)
            if r["model"] == run.model.name and not r["shallow"]]


def as_run(row, device_batch, link_mbit):
    """The frontier point as the calibrated model's configuration."""
    kind, k, b = row["cost_kind"], row["stages"], row["batch"]
    method = {"data_parallel": "data_parallel", "pipelined_backprop": "gpipe",
              "overlap": "OVERLAP"}.get(kind, row["rule"])
    replicas = 1 if kind == "pipelined_backprop" else row["devices"] // k
    return SimpleNamespace(method=method, stages=k, replicas=replicas, devices=row["devices"],
                           micro_batches=b // device_batch if kind == "pipelined_backprop"
                           else None, link_mbit=link_mbit, eval_every_steps=None,
                           exchange="reduce_scatter", sync_every=None)


def spread(calibration):
    """(lowest, highest) measured over calibrated step time of the held-out runs."""
    ratios = [m / c for _, m, c, _ in calibration.held_out() if c > 0]
    return (min(ratios), max(ratios)) if ratios else (1.0, 1.0)


def recompute(run, calibration, profiles_of, link_mbit):
    """[(row, calibrated step s, calibrated median seconds)] for every frontier point;
    `profiles_of(k)` gives the profile stages of k stages at the frontier's device batch."""
    m = run.model
    rows = frontier_points(run)
    out = []
    for row in rows:
        cfg = as_run(row, m.device_batch, link_mbit)
        step = calibration.step_seconds(cfg, profiles_of(row["stages"]), 1.0, evaluations=False)
        if step is None:
            continue
        # Every seed's time is (its steps + the pipeline's fill) x the step, so the median
        # (a missed seed as infinitely long) scales with the step.
        t = row["median_seconds"] * step / row["step_seconds"]
        out.append((row, step, t))
    return out


def markdown(run, calibration, profiles_of, link_mbit):
    """RESULTS.md's table: per target, each method's fastest point under the calibrated model
    against the frontier's model, and the fastest local against the fastest backprop point,
    overall and at the frontier's equal devices."""
    if calibration.params is None:
        return ""
    try:
        points_ = recompute(run, calibration, profiles_of, link_mbit)
    except Plan:
        return ("**The frontier recomputed with the calibrated model**: not yet, some of the "
                "frontier's runs or profiles are not cached.\n")
    lo, hi = spread(calibration)
    m = run.model
    md = ["**The frontier recomputed with the calibrated model** (*model*, evaluations left "
          "out as in the frontier): the frontier's runs, the same steps to each target, each "
          "step timed by the model fitted on the seed-2 testbed runs, on devices with a core "
          "each and the frontier's link. The interval multiplies the median by the lowest and "
          f"highest measured / calibrated ratio of the held-out runs ({lo:.2f} to {hi:.2f}); "
          "a ratio's interval sets the two ends against each other. "
          f"Points on one device, or with more than {FITTED_STAGES} stages or "
          f"{FITTED_REPLICAS} replicas a stage (marked †), are beyond what the testbed "
          "measured (2 and 4 devices): there the model extrapolates its fitted costs a step, "
          "a message and a byte.", ""]
    fmt = (lambda t: f"{t:.2f} bits/byte") if m.text else (lambda t: f"{100 * t:.0f}%")
    for target in sorted(m.targets, reverse=m.text):
        here = [p for p in points_ if p[0]["target"] == target]
        md += [f"To {fmt(target)}:", "",
               "| method | B | devices | frontier model s | calibrated model s [interval] |",
               "|---|---|---|---|---|"]
        by_method = {}
        for p in here:
            best = by_method.get(p[0]["method"])
            if best is None or p[2] < best[2]:
                by_method[p[0]["method"]] = p
        for label, (row, _, t) in by_method.items():
            md.append(f"| {label}{mark(row)} | {row['batch']} | {row['devices']} | "
                      f"{cell(row['median_seconds'])} | {cell(t, lo, hi)} |")
        md += ["", verdict(here, m.equal_devices, lo, hi), ""]
    return "\n".join(md) + "\n"


def beyond(row):
    """Whether the point lies outside what the testbed measured: one device, more than
    FITTED_STAGES stages, or more than FITTED_REPLICAS replicas of a stage."""
    replicas = 1 if row["cost_kind"] == "pipelined_backprop" else row["devices"] // row["stages"]
    return row["devices"] < 2 or row["stages"] > FITTED_STAGES or replicas > FITTED_REPLICAS


def mark(row):
    return " †" if beyond(row) else ""


def cell(t, lo=None, hi=None):
    if t == math.inf:
        return "missed"
    if lo is None:
        return f"{t:.3g}"
    return f"{t:.3g} [{t * lo:.3g}, {t * hi:.3g}]"


def verdict(here, equal_devices, lo, hi):
    """The fastest local point against the fastest backprop point, overall and at equal
    devices; the ratio's interval takes the two ends of the spread against each other."""
    def fastest(rows_):
        reached = [p for p in rows_ if p[2] != math.inf]
        return min(reached, key=lambda p: p[2]) if reached else None

    lines = []
    for where, keep in (("overall", lambda r: True),
                        (f"at {equal_devices} devices or fewer",
                         lambda r: r["devices"] <= equal_devices),
                        ("within what the testbed measured", lambda r: not beyond(r))):
        pool = [p for p in here if keep(p[0])]
        bp = fastest([p for p in pool if p[0]["rule"] == "BACKPROP"])
        loc = fastest([p for p in pool if p[0]["rule"] in LOCAL_RULES])
        if bp is None or loc is None:
            lines.append(f"{where}: no comparison (a side reached the target at no point)")
            continue
        r = bp[2] / loc[2]
        lines.append(f"{where}: fastest local {loc[0]['method']}{mark(loc[0])} at B = "
                     f"{loc[0]['batch']} ({loc[0]['devices']} devices), {loc[2]:.3g} s, against "
                     f"{bp[0]['method']}{mark(bp[0])} at B = {bp[0]['batch']} "
                     f"({bp[0]['devices']} devices), {bp[2]:.3g} s: local **{r:.2f}x** as fast "
                     f"[{r * lo / hi:.2f}, {r * hi / lo:.2f}]")
    return "Calibrated, " + "; ".join(lines) + "."
