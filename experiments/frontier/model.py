"""The frontier's logic, pure functions of their arguments (tests/experiments/frontier_test.py
checks them against values worked out by hand): learning-rate grids, examples seen, when a
target is reached, which setting a point takes, the cost model's step times, the Pareto
front, and which cached run answers for a configuration."""

import math

from experiments.stats import median


def lr_at(lr, batch, factor):
    """The learning rate of grid factor `factor` at `batch`: base x sqrt(batch / base_batch)
    x factor."""
    return lr.base * math.sqrt(batch / lr.base_batch) * factor


def lr_grid(lr, batch):
    """The learning rates tried at `batch`, one for each factor of the grid."""
    return [lr_at(lr, batch, f) for f in lr.factors]


def steps_per_epoch(train_examples, batch):
    return -(-train_examples // batch)


def examples_seen(step, batch, train_examples):
    """Training examples of the first `step` steps: every epoch ends with a short batch."""
    per_epoch = steps_per_epoch(train_examples, batch)
    epochs, rest = divmod(step, per_epoch)
    return epochs * train_examples + rest * batch


def first_reaching(points, target, higher_is_better, hold=1):
    """The first (step, value) of `points` (in step order) from which `target` holds for
    `hold` evaluations in a row, or None: with hold = 2 a lucky evaluation alone does not
    count, and the step reported is the first of the two."""
    run = 0
    for i, (step, value) in enumerate(points):
        run = run + 1 if ((value >= target) if higher_is_better else (value <= target)) else 0
        if run >= hold:
            return points[i - hold + 1]
    return None


def best_held(values, higher_is_better, hold=1):
    """The best value that held for `hold` evaluations in a row (each window's worst)."""
    if len(values) < hold:
        return -math.inf if higher_is_better else math.inf
    windows = [values[i:i + hold] for i in range(len(values) - hold + 1)]
    if higher_is_better:
        return max(min(w) for w in windows)
    return min(max(w) for w in windows)


def choose_setting(candidates):
    """The best of a method's settings at one batch size and target. `candidates` is a list
    of (setting, {seed: steps, or None when the target was not reached}); the best reaches it
    in the most seeds, then in the fewest median steps (a miss counted as infinitely many).
    Returns (index, setting, steps by seed)."""
    def score(item):
        hits = item[1][1]
        missed = sum(1 for v in hits.values() if v is None)
        reached = [v for v in hits.values() if v is not None]
        return (missed, median(reached) if reached else math.inf)
    best = min(enumerate(candidates), key=score)
    return best[0], best[1][0], best[1][1]


def at_edge(index, count):
    """Whether the choice `index` of a grid of `count` values is at either end of it (an
    optimum that may lie outside the grid); a grid of one value has no interior."""
    return count > 1 and index in (0, count - 1)


def continued_axis(values, steps):
    """A grid axis (its values, sorted) continued `steps` values past each end, each step the
    ratio of the two values nearest that end (2 for an axis of one value)."""
    v = sorted(values)
    up = v[-1] / v[-2] if len(v) > 1 else 2.0
    down = v[1] / v[0] if len(v) > 1 else 2.0
    return ([v[0] / down ** i for i in range(steps, 0, -1)] + v
            + [v[-1] * up ** i for i in range(1, steps + 1)])


def neighbours(axis, value):
    """The values on either side of `value` on `axis`, None past an end."""
    i = axis.index(value)
    return (axis[i - 1] if i > 0 else None, axis[i + 1] if i + 1 < len(axis) else None)


def untried_neighbours(tried, lr_axis, length_axis, setting):
    """The settings next to `setting` ((lr factor, length)) on the continued grid that are not
    in `tried`: [(which, neighbour)], `which` "lr" or "length", the neighbour None past the
    end of its continued axis. A setting none of whose neighbours is missing is a local
    optimum of the grid; one with a neighbour missing is on an edge of what was tried. An
    axis of one value, not continued, has no edge."""
    factor, length = setting
    out = []
    for which, axis, value in (("lr", lr_axis, factor), ("length", length_axis, length)):
        if len(axis) < 2:
            continue
        for n in neighbours(axis, value):
            cand = (n, length) if which == "lr" else (factor, n)
            if n is None or cand not in tried:
                out.append((which, None if n is None else cand))
    return out


def stops_paying_off(points, gain=0.9):
    """The batch size past which data parallelism stops gaining: `points` are (B, time,
    bound) in B order (bound: the time is a lower bound, the target was not reached); the
    first B whose next larger B is not at least 1 / gain x faster. None when every step up
    in B still gains."""
    for (b, t, _), (_, t2, bound2) in zip(points, points[1:]):
        if bound2 or t2 > gain * t:
            return b
    return None


def training_flops_per_example(stages, cost):
    """3 x the forward FLOPs (forward, then a backward pass of about twice its cost) of every
    layer, and of the heads the method trains: every stage's for local rules, the last one's
    for backprop (whose side heads are detached probes, not part of the method)."""
    layers = sum(s["forward_flops"] for s in stages)
    if cost in ("data_parallel", "pipelined_backprop"):
        heads = stages[-1]["head_forward_flops"]
    else:
        heads = sum(s["head_forward_flops"] for s in stages)
    return 3.0 * (layers + heads)


def allreduce_seconds(bytes_, replicas, link_bytes_per_s, latency_s):
    """A ring all-reduce of `bytes_` over `replicas` devices: 2 (R - 1) / R of the bytes
    over each link, and 2 (R - 1) message latencies."""
    if replicas <= 1:
        return 0.0
    return (2.0 * (replicas - 1) / replicas * bytes_ / link_bytes_per_s
            + 2.0 * (replicas - 1) * latency_s)


def step_seconds(cost, stages, replicas, micro_batches, link_bytes_per_s, latency_s, cores=0):
    """One training step under the cost model.

    `stages` are the profile's stages for the per-device batch (seconds: forward, backward
    and update of the layers; head_seconds: the head's; input_grad_seconds: the gradient for
    the stage's input, which rules that send gradients upstream add to every stage but the
    first). One device per stage and replica, unless `cores` > 0: then the K stages share
    that many cores (the measured cluster).

    data_parallel: one stage of everything, `replicas` devices each on its share, then an
      all-reduce of all parameters.
    pipelined_backprop: K stages, the batch cut into `micro_batches`; GPipe's schedule takes
      (M + K - 1) slots of the slowest stage, forward and backward.
    local (GREEDY, CHUNKED): each stage works on its own batch at once; a step costs the
      slowest stage with its head, then its replicas' all-reduce.
    overlap (synchronous OVERLAP): a stage waits for the next stage's gradient of the same
      batch, so a step costs the slowest pair of neighbouring stages.
    """
    upstream = cost in ("data_parallel", "pipelined_backprop", "overlap")
    own = [s["seconds"] + (s.get("input_grad_seconds", 0.0) if upstream and k else 0.0)
           for k, s in enumerate(stages)]
    t = [o + s["head_seconds"] for o, s in zip(own, stages)]
    exchange = max(allreduce_seconds(s["parameter_bytes"], replicas, link_bytes_per_s, latency_s)
                   for s in stages)
    if cost in ("data_parallel", "pipelined_backprop"):
        body = list(own)
        body[-1] += stages[-1]["head_seconds"]  # backprop trains the last head only
        if cost == "data_parallel":
            return sum(body) + exchange
        if cores > 0:
            return max(max(body), sum(body) / cores) * micro_batches
        return (micro_batches + len(stages) - 1) * max(body) + exchange
    if cost == "overlap":
        pairs = [t[k] + t[k + 1] for k in range(len(t) - 1)] or t
        slowest = max(pairs)
    elif cost == "local":
        slowest = max(t)
    else:
        raise ValueError(cost)
    if cores > 0:
        slowest = max(slowest, sum(t) / cores)
    return slowest + exchange


def pipeline_fill(cost, stages):
    """Steps before a pipeline's first update reaches its last stage."""
    return stages - 1 if cost in ("local", "overlap") else 0


def heads_at_common_step(runs, text):
    """Each method's heads at the last evaluation every run (all methods, all learning rates)
    reached, since runs stop at the target at different steps: {method: (step, lr, metrics)},
    at the learning rate whose last head is best there."""
    runs = {k: [r for r in v if r["points"]] for k, v in runs.items()}
    lasts = [r["points"][-1]["step"] for v in runs.values() for r in v]
    if not lasts:
        return {}
    common = min(lasts)
    out = {}
    for method, candidates in runs.items():
        best = None
        for r in candidates:
            pt = [p for p in r["points"] if p["step"] <= common][-1:]
            if not pt:
                continue
            v = pt[0]["metrics"][-1]
            if best is None or (v < best[2][-1] if text else v > best[2][-1]):
                best = (pt[0]["step"], r["lr"], pt[0]["metrics"])
        if best:
            out[method] = best
    return out


def pareto(points):
    """Indices of `points` ((compute, time), lower is better in both) that no other point
    beats in both coordinates."""
    keep = []
    for i, (c, t) in enumerate(points):
        if not any((c2 <= c and t2 <= t) and (c2 < c or t2 < t)
                   for j, (c2, t2) in enumerate(points) if j != i):
            keep.append(i)
    return keep


def run_id(cfg):
    """A run's directory name: every setting that changes its result."""
    first = f"-first{cfg['first_stages']}" if cfg.get("first_stages") else ""
    return (f"{cfg['model']}-{cfg['rule']}-K{cfg['stages']}{first}-b{cfg['batch']}"
            f"-lr{cfg['lr']:.6g}-n{cfg['length']}-s{cfg['seed']}")


def covers(done, cfg):
    """Whether the finished run `done` answers for configuration `cfg`: the same
    configuration, except that its stopping target may be stricter than cfg's (or it ran its
    whole budget), since a run stopped later holds every evaluation an earlier stop would."""
    old = dict(done.get("config") or {})
    if old == cfg:
        return True
    if "strictest" not in old or {**old, "strictest": cfg["strictest"]} != cfg:
        return False
    if not done.get("stopped_at_target"):
        return True
    if cfg["strictest"] is None:
        return False  # wants the whole length
    if cfg["text"]:
        return old["strictest"] <= cfg["strictest"]  # a loss: lower is stricter
    return old["strictest"] >= cfg["strictest"]


TIMED = ("seconds", "head_seconds", "input_grad_seconds")


def median_profile(occasions):
    """One profile from several measurements of it: each stage's times the median over the
    occasions (its FLOPs and bytes are the same on every one), with the occasions kept
    under "occasions"."""
    out = dict(occasions[0], occasions=list(occasions))
    out["stages"] = []
    for k, stage in enumerate(occasions[0]["stages"]):
        merged = dict(stage)
        for field in TIMED:
            if field in stage:
                merged[field] = median([o["stages"][k][field] for o in occasions])
        out["stages"].append(merged)
    return out


# How far the whole network's profiled step may stray from the sum of its stages' before
# the profiles count as measured under load.
PROFILE_TOLERANCE = 0.15


def profile_disagreements(profiles, tolerance=PROFILE_TOLERANCE):
    """Profiles measured under load disagree with each other: the whole network's step
    (one stage) against the sum of its K stages' steps (heads excluded) at the same rows.
    `profiles` maps (model, K, first, rows) to `localpar project --json`; returns one line
    per pair off by more than `tolerance`."""
    out = []
    for (name, k, first, rows), prof in sorted(profiles.items()):
        whole = profiles.get((name, 1, first, rows))
        if k == 1 or whole is None:
            continue
        one = sum(s["seconds"] for s in whole["stages"])
        split = sum(s["seconds"] for s in prof["stages"])
        if abs(split / one - 1) > tolerance:
            out.append(f"{name} at {rows} rows: the whole network {1e3 * one:.2f} ms a step, "
                       f"its {k} stages {1e3 * split:.2f} ms together")
    return out
