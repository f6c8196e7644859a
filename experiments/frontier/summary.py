"""The frontier's summary: which points it compares, the speed-ups with their intervals,
and the sentences that state where local parallelism stands."""

from experiments.frontier.model import stops_paying_off
from experiments.frontier.spec import LOCAL_RULES
import math

from experiments.stats import log_ratio_interval


def fmt_flops(x):
    return f"{x:.2e}"


def fmt_target(t, text):
    return f"{t:.2f} bits/byte" if text else f"{100 * t:.0f}%"


def summary_points(trows, equal_devices=None):
    """The points a target's summary compares, from (row, setting) pairs of one model and
    target: the fastest backprop point and the fastest local point on ideal hardware, then
    the fastest of each with at most `equal_devices` devices (default: the ideal backprop
    point's). A backprop point is a network of any depth trained by backprop, the shallow
    ones included: the fastest that reaches the target is the baseline. Points rank by their
    median time over seeds, a seed that missed counting as infinitely long, so one missed
    seed of five does not send a point behind every other."""
    def fastest_of(pairs):
        return min(pairs, key=rank) if pairs else None
    backprop = [p for p in trows if p[0]["rule"] == "BACKPROP"]
    local = [p for p in trows if p[0]["rule"] in LOCAL_RULES]
    bp, lo = fastest_of(backprop), fastest_of(local)
    cap = equal_devices or (bp[0]["devices"] if bp else None)
    bp_eq = fastest_of([p for p in backprop if cap and p[0]["devices"] <= cap])
    lo_eq = fastest_of([p for p in local if cap and p[0]["devices"] <= cap])
    return {"backprop": bp, "local": lo, "backprop_equal": bp_eq, "local_equal": lo_eq,
            "cap": cap}


def rank(pair):
    """A (row, setting) pair's place: its median time (a miss as +infinity), then its mean."""
    r = pair[0]
    return (r.get("median_seconds", math.inf), r["time_seconds"])


def reliability(r):
    """"5/5": the seeds in which the point reached its target, of those it ran."""
    return f"{r['seeds'] - r['missed']}/{r['seeds']}"


def fastest(rows, rules):
    rows = [r for r in rows if r["reached"] and r["rule"] in rules]
    return min(rows, key=lambda r: r["time_seconds"]) if rows else None


def profile_spread(bp, lo, low, high):
    """A speed-up's interval over seeds widened by the profiles' spread over the occasions
    they were measured on: each time is steps x a step time, so the interval on log times
    moves with the step times' ratio, and the widened one holds every pairing of the two
    points' occasions."""
    for r in (bp, lo):
        if "step_range" not in r:
            return low, high
    (b_lo, b_hi), (l_lo, l_hi) = bp["step_range"], lo["step_range"]
    mid = bp["step_seconds"] / lo["step_seconds"]
    return low * (b_lo / l_hi) / mid, high * (b_hi / l_lo) / mid


def interval(bp, lo):
    """`lo`'s speed-up over `bp` and its 95% interval, with the profiles' spread."""
    ratio, low, high = log_ratio_interval(bp["times"], lo["times"])
    return (ratio,) + profile_spread(bp, lo, low, high)


def ratio_text(bp, lo, db=None):
    """The speed-up of `lo` over `bp`: the ratio of their geometric-mean times over seeds,
    with a 95% BCa bootstrap interval on log times, widened by the profiles' spread over
    their occasions; a bound when either side missed its target in some seed (its times
    then count at the budget)."""
    if db is not None:
        if db not in bp["by_device_batch"] or db not in lo["by_device_batch"]:
            return "n/a"
        a, b = bp["by_device_batch"][db]["times"], lo["by_device_batch"][db]["times"]
    else:
        a, b = bp["times"], lo["times"]
    # One bootstrap a ratio: the interval is only given at the main device batch.
    ratio, low, high = interval(bp, lo) if db is None else (
        log_ratio_interval(a, b)[0], None, None)
    sign = ">" if bp["bound"] and not lo["bound"] else "<" if lo["bound"] and not bp[
        "bound"] else "~" if bp["bound"] else ""
    if db is not None:
        return f"{sign}{ratio:.2f}x"
    return f"{sign}**{ratio:.2f}x** [{low:.2f}, {high:.2f}]"


def summary_markdown(mrows, targets, text, device_batch=None, device_batches=(),
                     equal_devices=None):
    """Per target: the fastest backprop and local points, the speed-up on ideal hardware and
    at equal device counts with 95% bootstrap intervals over seeds, the shallow baseline, and
    how the speed-ups move with the cost model's device batch."""
    others = [d for d in device_batches if d != device_batch]
    out = ["\n### Summary: where local parallelism is on the frontier\n",
           "Points are ranked by their median time over seeds, a missed seed counting as "
           "infinitely long; each time is that median (model), with the seeds that reached the "
           "target. The backprop points are networks of every depth trained by backprop; the "
           "fastest that reaches the target is the baseline. Speed-up = the backprop point's "
           "geometric-mean time to the target / the local point's, with a 95% BCa bootstrap "
           "interval on log times over seeds in brackets, widened to hold every pairing of the "
           "two points' profile occasions; a point whose chosen setting has an untried "
           "neighbour says which (*lr* or *length on an edge*); > or < when one side missed the "
           "target in some seed within its budget "
           "(its time there counts at the budget, so the ratio is a bound). *Equal "
           "devices*: the fastest point of each with at most "
           + (f"{equal_devices} devices" if equal_devices else
              "as many devices as the fastest backprop point uses") + ".\n",
           "| target | fastest backprop point | median s (reached) | fastest local point "
           "| median s (reached) "
           "| speed-up, ideal hardware | equal devices: backprop point | local point "
           "| speed-up, equal devices | shallow baseline (first block alone) |"
           + "".join(f" speed-ups at device batch {d} (ideal / equal) |" for d in others),
           "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(others)]
    verdicts = []

    def cell(r):
        if r is None:
            return "none", ""
        devices = f"{r['devices']} device{'s' if r['devices'] != 1 else ''}"
        med = r.get("median_seconds", math.inf)
        edge = [w for w, on in (("lr", r["lr_edge"]), ("length", r.get("length_edge")))
                if on]
        return (f"{r['method']}, B = {r['batch']} ({devices}"
                + (f"; {' and '.join(edge)} on an edge" if edge else "") + ")",
                ("missed" if med == math.inf else f"{med:.3g}") + f" ({reliability(r)})")

    for target in sorted(targets, reverse=text):  # loosest first
        trows = [r for r in mrows if r["target"] == target]
        chosen = summary_points([(r, None) for r in trows], equal_devices)
        bp, lo, bpe, loe = (chosen[k] and chosen[k][0] for k in
                            ("backprop", "local", "backprop_equal", "local_equal"))
        shallow = [r for r in trows if r["shallow"]]
        shallow = [r for r in shallow if r["blocks"] == min(x["blocks"] for x in shallow)]
        shallow_best = min(shallow, key=lambda r: rank((r, None)), default=None)
        shallow_text = ("not run" if shallow_best is None else
                        ("missed, > " if shallow_best["bound"] else "")
                        + f"{shallow_best['time_seconds']:.3g} s (B = {shallow_best['batch']})")
        ideal = ratio_text(bp, lo) if bp and lo else "n/a"
        equal = ratio_text(bpe, loe) if bpe and loe else "n/a"
        sens = "".join(
            f" {ratio_text(bp, lo, d) if bp and lo else 'n/a'} / "
            f"{ratio_text(bpe, loe, d) if bpe and loe else 'n/a'} |" for d in others)
        out.append(f"| {fmt_target(target, text)} | {cell(bp)[0]} | {cell(bp)[1]} | "
                   f"{cell(lo)[0]} | {cell(lo)[1]} | {ideal} | {cell(bpe)[0]} | "
                   f"{cell(loe)[0]} | {equal} | {shallow_text} |{sens}")
        if bp and lo:
            low_ideal = interval(bp, lo)[1]
            low_equal = interval(bpe, loe)[1] if bpe and loe else None
            verdicts.append((target, low_ideal, low_equal))
    out.append("")
    # Where data parallelism stops paying off, from its points' medians; a larger batch that
    # missed within its budget is censored, not observed to stop paying off.
    for target in sorted(targets, reverse=text):
        dp = sorted((r for r in mrows if r["target"] == target
                     and r["cost_kind"] == "data_parallel" and not r["shallow"]),
                    key=lambda r: r["batch"])
        if dp:
            med = [r.get("median_seconds", math.inf) for r in dp]
            b = stops_paying_off([(r["batch"], m, m == math.inf) for r, m in zip(dp, med)])
            line = f"- To {fmt_target(target, text)}: data parallelism "
            if b is None:
                line += "still gains at the largest batch size tried."
            else:
                nxt = next(r for r in dp if r["batch"] > b)
                if nxt.get("median_seconds", math.inf) == math.inf:
                    line += (f"gains up to B = {b}; B = {nxt['batch']} missed the target in "
                             f"{nxt['missed']} of {nxt['seeds']} seeds within its budget of "
                             f"{nxt['length'] // nxt['batch']} steps, so whether it stops "
                             "paying off there is not observed (censored).")
                else:
                    line += (f"stops paying off past B = {b}: B = {nxt['batch']} is less than "
                             "1.1x faster (medians over seeds).")
            out.append(line)
    out.append(edge_text(mrows))
    out.append("")
    if verdicts:
        both = [v for v in verdicts if v[1] > 1 and v[2] is not None and v[2] > 1]
        ideal_only = [v for v in verdicts if v[1] > 1]
        parts = []
        for t, a, e in verdicts:
            parts.append(f"{fmt_target(t, text)}: lower end {a:.2f}x on ideal hardware"
                         + (f", {e:.2f}x at equal devices" if e is not None else
                            ", no equal-device comparison"))
        out.append(
            "Verdict for this model: local parallelism is faster with the whole 95% interval "
            f"above 1x at {len(ideal_only)} of {len(verdicts)} targets on ideal hardware, and "
            f"at {len(both)} of {len(verdicts)} at equal device counts ("
            + "; ".join(parts) + ").\n")
    return "\n".join(out)


def edge_text(mrows):
    """How many of the points that reach a target were tuned on an edge of the grid."""
    reached = [r for r in mrows if r["reached"]]
    if not reached:
        return ""
    lr = sum(1 for r in reached if r["lr_edge"])
    length = sum(1 for r in reached if r.get("length_edge"))
    return (f"- Edges: of the {len(reached)} points that reach a target, {lr} "
            f"({100 * lr / len(reached):.0f}%) have an untried learning rate next to their "
            f"chosen one and {length} ({100 * length / len(reached):.0f}%) an untried schedule "
            "length.")


def claim_text(trows, reached, front, target, text):
    """Where local parallelism stands on this target's frontier, with the numbers."""
    # Ranked as the summary ranks: the median over seeds, a missed seed as +infinity.
    finite = [r for r in trows if r.get("median_seconds", math.inf) < math.inf]
    local = [r for r in finite if r["rule"] in ("GREEDY", "CHUNKED", "OVERLAP")]
    dp = [r for r in finite if r["rule"] == "BACKPROP"]
    missing = sorted({r["method"] for r in trows if not r["reached"]})
    out = []
    if local and dp:
        fl = min(local, key=lambda r: rank((r, None)))
        fd = min(dp, key=lambda r: rank((r, None)))
        speed = fd["median_seconds"] / fl["median_seconds"]
        verdict = (f"**{speed:.2f}x faster**" if speed >= 1 else f"**{1 / speed:.2f}x slower**")
        out.append(
            f"Fastest local point: {fl['method']} at B = {fl['batch']}, "
            f"{fl['median_seconds']:.3g} s (median, reached in {reliability(fl)} seeds) with "
            f"{fmt_flops(fl['compute_flops'])} FLOPs; fastest backprop point: {fd['method']} at "
            f"B = {fd['batch']}, {fd['median_seconds']:.3g} s ({reliability(fd)}) with "
            f"{fmt_flops(fd['compute_flops'])} FLOPs. Local parallelism is {verdict}, "
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
