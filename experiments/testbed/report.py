"""The testbed's tables: one CSV row per measured run and target (docs/results/testbed.csv),
the frontier's cost model for the same run beside it, and a Markdown table of median
measured seconds to each target with the seeds that reached it."""

import math
import os

from experiments.common import write_csv
from experiments.frontier.model import first_reaching, pipeline_fill, step_seconds
from experiments.stats import median

COLUMNS = ["devices", "link_mbit", "method", "stages", "replicas", "batch", "seed", "target",
           "measured_s", "measured_eval_s", "steps", "model_s", "calibrated_model_s",
           "measured_step_ms", "model_step_ms", "calibrated_step_ms", "calibration",
           "worker_cpu"]
COST = {"data_parallel": "data_parallel", "gpipe": "pipelined_backprop",
        "1f1b": "pipelined_backprop", "zb": "pipelined_backprop", "CHUNKED": "local",
        "GREEDY": "local", "OVERLAP": "overlap"}
UNSHAPED_BYTES_PER_S = 100e9 / 8  # the frontier's ideal link, for unshaped veths


def link_text(mbit):
    """A rate to two significant figures: "unshaped", "1 Gbit/s", "32 Mbit/s"."""
    if not mbit:
        return "unshaped"
    two = float(f"{mbit:.2g}")
    return f"{two / 1000:g} Gbit/s" if two >= 1000 else f"{two:g} Mbit/s"


def scaled(stages, share):
    """A profile's stage times on a device with `share` of a core."""
    keys = ("seconds", "head_seconds", "input_grad_seconds")
    return [{**s, **{k: s.get(k, 0.0) / share for k in keys}} for s in stages]


def model_step(cfg, profile_stages, share, latency_s=5e-6):
    """The frontier's cost model of one step of this run on the testbed's devices (None for
    DiLoCo's methods: the frontier models no synchronisation every few steps)."""
    if cfg.method not in COST:
        return None
    link = cfg.link_mbit * 1e6 / 8 if cfg.link_mbit else UNSHAPED_BYTES_PER_S
    cost = COST[cfg.method]
    micro = cfg.devices if cost == "pipelined_backprop" else 1
    return step_seconds(cost, scaled(profile_stages, share), cfg.replicas, micro, link, latency_s)


def rows(results, model, profiles, device_batch, calibration=None, max_seconds=None):
    """One row per run and target. `profiles` maps a stage count to the frontier profile's
    stages at `device_batch` rows; `calibration` (calibrate.Calibration), when given, adds
    the calibrated model's step and time, and whether the run was fitted or held out. The
    measured step is the slope of wall time over steps (evaluations included). A target
    first reached after `max_seconds` is a miss, as for a run that never reached it: a run
    stopped at its budget goes on while the steps already fed drain (minutes on a 10 Mbit/s
    link, in runs cached before the sweep killed them), and what it reaches then would make
    budgets differ between runs. `measured_eval_s` is how much of `measured_s` the
    evaluations took, where the run's metrics time every one of them (runs cached before
    they were timed, and evaluations too short to be seen, leave it empty)."""
    from experiments.testbed.calibrate import measured_step_seconds
    out = []
    fitted = {id(c): used for c, _, _, used in (calibration.rows if calibration else [])}
    for cfg, res in results:
        share = min(v for k, v in res["cpu_fractions"].items() if k != "coordinator")
        prof = profiles[cfg.stages]
        step_s = model_step(cfg, prof, share)
        points = res["points"]
        measured_step = measured_step_seconds(points)
        cal_step = calibration.step_seconds(cfg, prof, share) if calibration else None
        for target in sorted(model.targets, reverse=model.text):
            hit = first_reaching([(p["step"], p["metrics"][-1]) for p in points], target,
                                 not model.text, model.hold)
            row = {"devices": cfg.devices, "link_mbit": cfg.link_mbit, "method": cfg.method,
                   "stages": cfg.stages, "replicas": cfg.replicas, "batch": cfg.batch,
                   "seed": cfg.seed, "target": target, "measured_s": "",
                   "measured_eval_s": "", "steps": "",
                   "model_s": "", "calibrated_model_s": "",
                   "measured_step_ms": f"{1e3 * measured_step:.3f}" if measured_step else "",
                   "model_step_ms": f"{1e3 * step_s:.3f}" if step_s else "",
                   "calibrated_step_ms": f"{1e3 * cal_step:.3f}" if cal_step else "",
                   "calibration": ("fit" if fitted.get(id(cfg)) else "held out")
                   if id(cfg) in fitted else "",
                   "worker_cpu": f"{share:.3f}"}
            wall = None if hit is None else next(p["wall_seconds"] for p in points
                                                  if p["step"] == hit[0])
            if wall is not None and (max_seconds is None or wall <= max_seconds):
                steps = hit[0]
                fill = pipeline_fill(COST.get(cfg.method, "local"), cfg.stages)
                row.update(measured_s=f"{wall:.2f}", steps=steps,
                           model_s=f"{(steps + fill) * step_s:.2f}" if step_s else "")
                evals = [p.get("eval_seconds") for p in points if p["step"] <= steps]
                if None not in evals:
                    row["measured_eval_s"] = f"{sum(max(0.0, e) for e in evals):.2f}"
                if cal_step:
                    row["calibrated_model_s"] = f"{(steps + fill) * cal_step:.2f}"
            out.append(row)
    return out


def write(rows_, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_csv(path, rows_, COLUMNS)


def markdown(rows_, text, max_seconds=None):
    """Median measured seconds to each target over seeds, per device count, link and method,
    with the seeds that reached it; a miss counts as infinitely long in the median."""
    over = f"> {max_seconds:g} s" if max_seconds else "> budget"
    fmt = (lambda t: f"{t:.2f} bits/byte") if text else (lambda t: f"{100 * t:.0f}%")
    keys = sorted({(r["devices"], r["link_mbit"], r["method"]) for r in rows_},
                  key=lambda k: (k[0], -k[1] if k[1] else -1e9, k[2]))
    targets = sorted({r["target"] for r in rows_}, reverse=text)
    md = ["| devices | link | method | " + " | ".join(f"to {fmt(t)}: measured s (reached)"
                                                     for t in targets) + " |",
          "|---|---|---|" + "---|" * len(targets)]
    for n, link, meth in keys:
        cells = []
        for t in targets:
            rs = [r for r in rows_ if (r["devices"], r["link_mbit"], r["method"], r["target"])
                  == (n, link, meth, t)]
            times = [float(r["measured_s"]) if r["measured_s"] != "" else math.inf for r in rs]
            reached = sum(1 for x in times if x != math.inf)
            med = median(times) if times else math.inf
            cells.append((over if med == math.inf else f"{med:.0f}")
                         + f" ({reached}/{len(rs)})")
        md.append(f"| {n} | {link_text(link)} | {meth} | "
                  + " | ".join(cells) + " |")
    return "\n".join(md) + "\n"


def calibration_markdown(calibration, fit_seed):
    """The calibrated model's parameters and every held-out run's error."""
    md = [f"Calibrated on the seed-{fit_seed} runs: {calibration.describe()}.", ""]
    held = calibration.held_out()
    if not held:
        return "\n".join(md + ["No held-out runs yet.", ""])
    worst = max(abs(e) for *_, e in held)
    over = [h for h in held if abs(h[3]) > 0.15]
    md += [f"Held out: {len(held)} runs; largest error {100 * worst:.1f}%; "
           f"{len(over)} beyond 15%.", "",
           "| devices | link | method | seed | measured ms a step | calibrated | error |",
           "|---|---|---|---|---|---|---|"]
    for cfg, m, c, e in sorted(held, key=lambda h: (h[0].devices, h[0].link_mbit,
                                                     h[0].method, h[0].seed)):
        link = link_text(cfg.link_mbit)
        md.append(f"| {cfg.devices} | {link} | {cfg.method} | {cfg.seed} | {1e3 * m:.2f} | "
                  f"{1e3 * c:.2f} | {100 * e:+.1f}% |")
    return "\n".join(md) + "\n"


def transfer_markdown(calibration, fit_devices):
    """The harder check: the model fitted on the runs with `fit_devices` devices only (every
    seed and link), its error on the runs with more devices, by method."""
    held = calibration.held_out()
    if calibration.params is None or not held:
        return f"Fitted on {fit_devices} devices only: too few runs yet to say.\n"
    worst = max(abs(e) for *_, e in held)
    over = sum(1 for *_, e in held if abs(e) > 0.15)
    md = [f"**A harder check: fitted on the {fit_devices}-device runs only** "
          f"({calibration.describe()}), it predicts the {len(held)} runs on more devices "
          f"with a largest error of {100 * worst:.1f}% ({over} beyond 15%):", "",
          "| devices | link | method | runs | errors (each run) |", "|---|---|---|---|---|"]
    groups = {}
    for cfg, _, _, e in held:
        groups.setdefault((cfg.devices, cfg.link_mbit, cfg.method), []).append(e)
    for (n, link, meth), errors in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1],
                                                                         g[0][2])):
        where = link_text(link)
        md.append(f"| {n} | {where} | {meth} | {len(errors)} | "
                  + ", ".join(f"{100 * e:+.1f}%" for e in sorted(errors)) + " |")
    return "\n".join(md) + "\n"


def evaluation_markdown(rows_, calibration):
    """How much of each method's time its evaluations take: the calibrated model's share, and
    the measured one where the run's metrics time every evaluation (at the strictest target
    each run reached)."""
    model = {}
    for cfg, share in calibration.evaluation_shares():
        model.setdefault((cfg.devices, cfg.link_mbit, cfg.method), []).append(share)
    if not model:
        return ""
    measured = {}
    for r in rows_:
        if r["measured_eval_s"] != "" and r["measured_s"] != "":
            key = (r["devices"], r["link_mbit"], r["method"], r["seed"])
            measured[key] = float(r["measured_eval_s"]) / float(r["measured_s"])
    ev, cfg = calibration.evaluation, calibration.rows[0][0]
    md = ["**Evaluations are part of every measured time.** Each run scores "
          f"{ev.limit:,} held-out examples, in batches of {ev.batch}, after every "
          f"{cfg.eval_every_steps * cfg.batch:,} training examples, as the frontier does; a "
          "pipeline sends every evaluation batch's activations over each of its links, data "
          "parallelism sends none. The share of each method's time they take (*model*: the calibrated "
          "model with and without them; *measured*: from the training line the coordinator "
          "writes when the last stage has trained the step before an evaluation, to the "
          "evaluation's, in runs whose metrics time every evaluation):", "",
          "| devices | link | method | evaluations' share: model | measured (runs) |",
          "|---|---|---|---|---|"]
    for (n, link, meth), shares in sorted(model.items(), key=lambda g: (g[0][0], g[0][1],
                                                                        g[0][2])):
        got = [v for k, v in measured.items() if k[:3] == (n, link, meth)]
        where = link_text(link)
        md.append(f"| {n} | {where} | {meth} | {100 * median(shares):.0f}% | "
                  + (f"{100 * median(got):.0f}% ({len(got)})" if got else "not timed")
                  + " |")
    return "\n".join(md) + "\n"


def section(rows_, calibration, fit_seed, text, done, total, spec_path, transfer=None,
            transfer_devices=None, max_seconds=None):
    """The testbed's section of RESULTS.md: how it was made, the measured table, the
    calibrated model against the held-out runs."""
    head = [
        "# The testbed: measured time to target at equal devices",
        "",
        f"Written by `deploy/testbed.py sweep {spec_path} --out OUT --results RESULTS.md "
        f"--csv docs/results/{os.path.splitext(os.path.basename(spec_path))[0]}.csv` from "
        "`experiments/cache/testbed.jsonl` "
        f"({done} of {total} runs measured so far; `--plan` lists the rest). Each run is a real "
        "`localpar run` cluster on emulated devices: every worker and the coordinator in its own "
        "network namespace, a `tc tbf` rate on each device's egress, a CPU share each "
        "(docs/experiments.md). Every time in this section is **measured** wall-clock time "
        "on the testbed unless it says *model*; a method's seconds are the median over its "
        "seeds, with how many of them reached the target (a miss counts as longer than any"
        + (f"; a run still short of a target after {max_seconds:g} s misses it" if max_seconds
           else "") + ").",
        "",
    ]
    out = "\n".join(head) + markdown(rows_, text, max_seconds) + "\n" + \
        calibration_markdown(calibration, fit_seed)
    evals = evaluation_markdown(rows_, calibration)
    if evals:
        out += "\n" + evals
    if transfer is not None:
        out += "\n" + transfer_markdown(transfer, transfer_devices)
    return out
