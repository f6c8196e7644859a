"""Where local parallelism overtakes backprop, by link rate, at each device count and target.

Measured: at each link of the sweep, the fastest local rule (CHUNKED, GREEDY, OVERLAP, and
local x DiLoCo) against the fastest backprop method (data parallelism, pipelined backprop,
and DiLoCo's data parallelism), each by its median time over seeds (a miss counts as longer
than any), and the ratio of the two.

Model: between and beyond the links that were measured, the calibrated model (calibrate.py)
times each method at any rate: its steps to the target (the median over the seeds that reached
it, on any link: a deterministic rule trains the same steps whatever the link) plus the
pipeline's fill, times the calibrated step at that rate, evaluations included. On a
logarithmic grid of rates it finds where the fastest local rule is faster than the fastest
backprop method, where it is faster by more than the model's largest held-out error, and
where backprop is faster by as much: between those bands the model cannot call it.
"""

import dataclasses
import math

from experiments.frontier.model import pipeline_fill
from experiments.stats import median
from experiments.testbed.report import COST, link_text

LOCAL = ("CHUNKED", "GREEDY", "OVERLAP", "local_diloco")
BACKPROP = ("data_parallel", "gpipe", "1f1b", "zb", "diloco_dp")
NAMES = {"data_parallel": "data parallelism", "gpipe": "GPipe", "1f1b": "1F1B", "zb": "ZB",
         "diloco_dp": "DiLoCo data parallelism", "local_diloco": "local x DiLoCo"}
GRID_MBIT = [10 ** (i / 40) for i in range(0, 161)]  # 1 Mbit/s to 10 Gbit/s


def measured_medians(rows_, n, target):
    """{link: {method: median measured seconds (inf: the median seed missed)}}."""
    out = {}
    for r in rows_:
        if r["devices"] != n or r["target"] != target:
            continue
        t = float(r["measured_s"]) if r["measured_s"] != "" else math.inf
        out.setdefault(r["link_mbit"], {}).setdefault(r["method"], []).append(t)
    return {link: {m: median(ts) for m, ts in by.items()} for link, by in out.items()}


def fastest(times, side):
    """(method, seconds) of the fastest method of `side` among `times`, or None."""
    there = [(t, m) for m, t in times.items() if m in side]
    if not there:
        return None
    t, m = min(there)
    return m, t


class ModelTimes:
    """Each method's calibrated time to a target at any link rate, at `n` devices."""

    def __init__(self, rows_, results, calibration, profiles, n, target):
        self.cal, self.profiles, self.by_method = calibration, profiles, {}
        steps = {}
        for r in rows_:
            if r["devices"] == n and r["target"] == target and r["steps"] != "":
                steps.setdefault(r["method"], []).append(int(r["steps"]))
        for cfg, res in results:
            if cfg.devices != n or cfg.method not in steps or cfg.method in self.by_method:
                continue
            share = min(v for k, v in res["cpu_fractions"].items() if k != "coordinator")
            self.by_method[cfg.method] = (cfg, share, median(steps[cfg.method]))

    def seconds(self, method, mbit):
        if method not in self.by_method:
            return math.inf
        cfg, share, steps = self.by_method[method]
        step = self.cal.step_seconds(dataclasses.replace(cfg, link_mbit=mbit),
                                     self.profiles[cfg.stages], share)
        if step is None:
            return math.inf
        return (steps + pipeline_fill(COST.get(cfg.method, "local"), cfg.stages)) * step

    def ratio(self, mbit):
        """The fastest backprop method's time over the fastest local rule's at `mbit`."""
        local = min(self.seconds(m, mbit) for m in LOCAL)
        backprop = min(self.seconds(m, mbit) for m in BACKPROP)
        if math.isinf(local) or math.isinf(backprop):
            return None
        return backprop / local


def runs_of(grid, flags):
    """[(first, last)] of the runs of consecutive grid values whose flag is set."""
    out, start = [], None
    for i, (x, f) in enumerate(zip(grid, flags)):
        if f and start is None:
            start = x
        if start is not None and (not f or i == len(grid) - 1):
            out.append((start, x if f else grid[i - 1]))
            start = None
    return out


def band_text(bands):
    parts = []
    for lo, hi in bands:
        if lo == GRID_MBIT[0] and hi == GRID_MBIT[-1]:
            parts.append("at every rate from 1 Mbit/s to 10 Gbit/s")
        elif lo == GRID_MBIT[0]:
            parts.append(f"below {link_text(hi)}")
        elif hi == GRID_MBIT[-1]:
            parts.append(f"above {link_text(lo)}")
        else:
            parts.append(f"from {link_text(lo)} to {link_text(hi)}")
    return " and ".join(parts)


def model_sentence(times, spread):
    ratios = [times.ratio(m) for m in GRID_MBIT]
    if any(r is None for r in ratios):
        return "the model cannot say (a side has no run that reached the target)"
    wins = runs_of(GRID_MBIT, [r > 1 for r in ratios])
    if not wins:
        said = "local parallelism is never faster between 1 Mbit/s and 10 Gbit/s"
    else:
        said = f"local parallelism is faster {band_text(wins)}"
    margin = f"by more than the model's largest held-out error ({100 * spread:.0f}%)"
    clear = runs_of(GRID_MBIT, [r > 1 + spread for r in ratios])
    said += f", {margin} {band_text(clear)}" if clear else f", nowhere {margin}"
    lose = runs_of(GRID_MBIT, [r < 1 / (1 + spread) for r in ratios])
    if lose:
        said += f"; backprop is faster by as much {band_text(lose)}"
    return said


def _one_row(n, target_text, link, times):
    bp, lo = fastest(times, BACKPROP), fastest(times, LOCAL)
    if bp is None or lo is None:
        return None
    cell = lambda m_t: (f"{NAMES.get(m_t[0], m_t[0])} "  # noqa: E731
                        + ("missed" if math.isinf(m_t[1]) else f"{m_t[1]:.0f} s"))
    if math.isinf(bp[1]) and math.isinf(lo[1]):
        verdict = "neither reached it"
    elif math.isinf(lo[1]):
        verdict = "backprop (local missed)"
    elif math.isinf(bp[1]):
        verdict = "local (backprop missed)"
    else:
        ratio = bp[1] / lo[1]
        verdict = f"{ratio:.2f}x: " + ("local" if ratio > 1 else "backprop")
    return f"| {n} | {target_text} | {link_text(link)} | {cell(bp)} | {cell(lo)} | {verdict} |"


def markdown(rows_, results, calibration, profiles, text):
    """The crossover table (measured) and, per device count and target, where the calibrated
    model puts local parallelism ahead."""
    held = calibration.held_out()
    if calibration.params is None or not held:
        return ""
    spread = max(abs(e) for *_, e in held)
    fmt = (lambda t: f"{t:.2f} bits/byte") if text else (lambda t: f"{100 * t:.0f}%")
    md = ["## Where local parallelism overtakes backprop", "",
          "At each device count, target and link: the fastest backprop method (data "
          "parallelism, pipelined backprop, and DiLoCo's data parallelism where it was "
          "swept) against the fastest local rule, each by its "
          "**measured** median over seeds; the ratio is backprop's time over the local "
          "rule's (above 1: local parallelism is faster).", "",
          "| devices | target | link | fastest backprop | fastest local rule | "
          "local's speed-up |", "|---|---|---|---|---|---|"]
    sentences = []
    for n in sorted({r["devices"] for r in rows_}):
        for target in sorted({r["target"] for r in rows_}, reverse=text):
            by_link = measured_medians(rows_, n, target)
            for link in sorted(by_link, key=lambda x: -x if x else -math.inf):
                line = _one_row(n, fmt(target), link, by_link[link])
                if line:
                    md.append(line)
            if not any(line.startswith(f"| {n} | {fmt(target)} |") for line in md):
                continue  # no local rule or no backprop method at this device count
            times = ModelTimes(rows_, results, calibration, profiles, n, target)
            sentences.append(f"- {n} devices, to {fmt(target)}: "
                             + model_sentence(times, spread) + ".")
    if not sentences:
        return ""
    md += ["", "Between and beyond those links, the calibrated model (*model*: each method's "
           "measured steps to the target times its calibrated step at each rate, on a "
           "logarithmic grid from 1 Mbit/s to 10 Gbit/s; unshaped links are faster than "
           "any rate of the grid):", ""] + sentences
    return "\n".join(md) + "\n"
