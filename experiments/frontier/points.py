"""Each point of the frontier: a method at one batch size and target, at its best setting,
over the seeds it reports, with its compute and its time under the cost model; and each
stage's head against depth."""

from experiments.frontier.model import (examples_seen, heads_at_common_step,
                                        pipeline_fill, step_seconds, training_flops_per_example)
from experiments.frontier.summary import summary_points
import math

from experiments.stats import mean_sd, median


def timing(sweep, m, a, steps):
    """The point's step time, devices and times to target at every device batch."""
    hw = sweep.spec.hardware
    out = {}
    for db in m.device_batches:
        if steps["batch"] % db:
            continue
        prof = sweep.profiles[(m.name, a.stages, a.first_stages or 0, db)]
        replicas = steps["batch"] // db
        micro = replicas if a.cost == "pipelined_backprop" else 1
        if a.cost == "pipelined_backprop":
            replicas = 1

        def step(stages):
            return step_seconds(a.cost, stages, replicas, micro, hw.link_bytes_per_s,
                                hw.latency_s)
        step_s = step(prof["stages"])
        # The step on each occasion its profile was measured: the spread the summary's
        # intervals carry.
        each = [step(o["stages"]) for o in prof.get("occasions", [prof])]
        devices = a.stages if a.cost == "pipelined_backprop" else a.stages * replicas
        times = [(v + pipeline_fill(a.cost, a.stages)) * step_s for v in steps["by_seed"].values()]
        # The median over seeds with a miss as infinitely long: what points are ranked by.
        ranked = [math.inf if s in steps["missed"] else t
                  for s, t in zip(steps["by_seed"], times)]
        out[db] = {"step_seconds": step_s, "devices": devices, "times": times,
                   "time_seconds": sum(times) / len(times), "median_seconds": median(ranked),
                   "step_range": (min(each), max(each)), "occasions": len(each)}
    return out


def point(sweep, m, a, b, target, extra_seeds=()):
    """A method's point at one batch size and target: at its best setting (learning rate and
    schedule length) on the tune seeds, over the seeds it reports; a seed that missed counts
    at its budget and makes the point's time a lower bound. Returns (row, (method, B, lr,
    length))."""
    prof = sweep.profiles[(m.name, a.stages, a.first_stages or 0, m.device_batch)]["stages"]
    flops_per_example = training_flops_per_example(prof, a.cost)
    index, (lr, length) = sweep.choose(m, a, b, target)
    lr_edge, length_edge = sweep.edges(m, a, b, index)
    hits = {}
    for seed in list(m.seeds) + [s for s in extra_seeds if s not in m.seeds]:
        if sweep.has_run(m, a, b, lr, length, seed):
            hits[seed] = sweep.hit(m, a, b, lr, length, seed, target)
    budget = max(1, length // b)
    steps = {s: (v if v is not None else budget) for s, v in hits.items()}
    row = {"model": m.name, "method": a.label, "rule": a.rule, "cost_kind": a.cost,
           "shallow": bool(a.first_stages), "blocks": a.first_stages or len(m.normalized.stages),
           "stages": a.stages, "batch": b, "target": target,
           "flops_per_example": flops_per_example, "lr": lr, "length": length,
           "lr_edge": lr_edge, "length_edge": length_edge, "seeds": len(hits),
           "missed": sum(1 for v in hits.values() if v is None), "steps_by_seed": steps}
    row["reached"] = row["missed"] == 0
    row["bound"] = not row["reached"]
    mean_steps = sum(steps.values()) / len(steps)
    row["steps"] = mean_steps
    row["steps_sd"] = mean_sd(list(steps.values()))[1]
    row["examples"] = examples_seen(round(mean_steps), b, m.data["train_examples"])
    row["compute_flops"] = row["examples"] * flops_per_example
    missed = {s for s, v in hits.items() if v is None}
    row["by_device_batch"] = timing(sweep, m, a, {"batch": b, "by_seed": steps, "missed": missed})
    main = row["by_device_batch"][m.device_batch]
    row.update({"step_seconds": main["step_seconds"], "devices": main["devices"],
                "time_seconds": main["time_seconds"], "times": main["times"],
                "median_seconds": main["median_seconds"], "step_range": main["step_range"],
                "step_seconds_low": main["step_range"][0],
                "step_seconds_high": main["step_range"][1],
                "profile_occasions": main["occasions"]})
    return row, (a, b, lr, length)


def all_rows(sweep, extra=None):
    """Every point; those in `extra` ((model, method, B, target)) over the summary seeds."""
    out = []
    for m in sweep.models:
        for a in sweep.spec.methods:
            for b in a.batch_sizes(m):
                for target in m.targets:
                    more = m.summary_seeds if extra and (m.name, a.label, b, target) in extra \
                        else ()
                    out.append(point(sweep, m, a, b, target, more))
    return out


def summary_runs(sweep, first_pass):
    """The summary's points ((model, method, B, target)) and the runs of their summary
    seeds."""
    wanted, more = set(), []
    for m in sweep.models:
        for target in m.targets:
            trows = [(r, s) for r, s in first_pass
                     if r["model"] == m.name and r["target"] == target]
            chosen = summary_points(trows, m.equal_devices)
            for key in ("backprop", "local", "backprop_equal", "local_equal"):
                if chosen[key] is None:
                    continue
                a, b, lr, length = chosen[key][1]
                wanted.add((m.name, a.label, b, target))
                more += [sweep.config(m, a, b, lr, length, seed) for seed in m.summary_seeds]
    return wanted, more


def head_rows(sweep):
    """Per-depth heads at each model's reference batch, all at one step every run reached."""
    rows = []
    for m in sweep.models:
        b = m.reference_batch
        by_method = {a.label: [sweep.result(m, a, b, lr, length, m.tune_seeds[0])
                               for lr, length in sweep.settings(m, a, b)]
                     for a in sweep.spec.methods if a.cost != "pipelined_backprop"}
        for method, (step, lr, metrics) in heads_at_common_step(by_method, m.text).items():
            for k, v in enumerate(metrics):
                rows.append({"model": m.name, "method": method, "stage": k + 1,
                             "stages": len(metrics), "step": step, "lr": lr, "metric": v,
                             "examples": examples_seen(step, b, m.data["train_examples"])})
    return rows
