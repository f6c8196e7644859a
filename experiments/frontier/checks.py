"""The cost model against real `localpar run` clusters on this machine (`cluster_checks`)."""

import os

from experiments.common import fail
from experiments.frontier import runs
from experiments.frontier.model import lr_grid, step_seconds
from experiments.stats import median

CHECK_COLUMNS = ["model", "method", "rule", "stages", "replicas", "batch", "pinned", "cores",
                 "steps", "predicted_step_ms", "predicted_exchange_ms", "measured_step_ms",
                 "error"]


def run_checks(ctx, spec, models, profile_of):
    """Each check's predicted and measured step. An unpinned check's processes share every
    core (the model's summed compute over the cores); a pinned one gives each worker a core
    of its own, so the model's slowest-stage and exchange terms are tested as on separate
    machines (the exchange at this machine's measured mesh rate). `profile_of(model, stages,
    rows)` gives a profile's stages."""
    rows = []
    cores = os.cpu_count() or 1
    rates = {}
    hw = spec.hardware
    by_name = {m.name: m for m in models}
    for c in spec.cluster_checks:
        m = by_name.get(c.model)
        if m is None:
            fail(f"cluster check of {c.model}: no model of that name "
                 f"(one of {', '.join(sorted(by_name))})")
        a = spec.method(c.method)
        stages, replicas = c.stages or a.train_stages, c.replicas
        lr = lr_grid(m.lr, c.batch)[0]
        prof = profile_of(m, stages, c.batch // replicas)
        # BACKPROP without micro-batches: each batch forward through every stage and back.
        cost = "data_parallel" if a.rule == "BACKPROP" else a.cost
        own_cores = c.pin and stages * replicas <= cores
        compute = step_seconds(cost, prof, 1, 1, hw.link_bytes_per_s, hw.latency_s,
                               cores=0 if own_cores else cores)
        exchange = 0.0
        if replicas > 1:
            if replicas not in rates:
                rates[replicas] = runs.mesh_exchange_rate(ctx, replicas)
            # Each stage's replicas exchange at once, on their own cores: the largest stage.
            exchange = max(s["parameter_bytes"] for s in prof) * rates[replicas]
        predicted = compute + exchange
        report = runs.cluster_check(ctx, m, a, c, stages, lr)
        measured = c.batch / report["examples_per_second"]
        rows.append({"model": m.name, "method": a.label, "rule": a.rule,
                     "stages": stages, "replicas": replicas, "batch": c.batch,
                     "pinned": c.pin, "cores": cores, "steps": report["steps"],
                     "predicted_step_ms": 1e3 * predicted,
                     "predicted_exchange_ms": 1e3 * exchange,
                     "measured_step_ms": 1e3 * measured, "error": measured / predicted - 1})
    return rows


def checks_markdown(check_rows):
    """The cluster-check table and what it shows."""
    cores = check_rows[0]["cores"]
    md = ["\n## The cost model against real clusters\n",
          f"The cost model with this machine's hardware ({cores} cores) against `localpar run` "
          f"clusters over gRPC on loopback; measured is the report's training throughput "
          f"(evaluations excluded), stage times are `localpar project`'s at each worker's rows. "
          f"**Pinned** runs give each worker a core of its own (`--pin_workers`), as separate "
          f"machines would: they test the model's slowest-stage term (and OVERLAP's wait for "
          f"the next stage's gradient) and, with replicas, its exchange term at this machine's "
          f"loopback rate (`allreduce_bench`'s mesh all-gather and sum). **Shared** runs put "
          f"every worker on all {cores} cores, where the model falls back to summed compute "
          f"over the cores. BACKPROP is predicted as one pass through every stage per step.\n",
          "| model | method | K × R | B | workers on | steps | predicted step (ms) "
          "| of it, exchange (ms) | measured step (ms) | error |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for c in check_rows:
        on = "a core each" if c["pinned"] else f"{c['cores']} shared cores"
        md.append(f"| {c['model']} | {c['rule']} | {c['stages']} × {c['replicas']} | "
                  f"{c['batch']} | {on} | {c['steps']} | {c['predicted_step_ms']:.2f} | "
                  f"{c['predicted_exchange_ms']:.2f} | {c['measured_step_ms']:.2f} | "
                  f"{100 * c['error']:+.0f}% |")
    for pinned in (True, False):
        errs = [abs(c["error"]) for c in check_rows if c["pinned"] == pinned]
        if errs:
            md.append(f"\n{'Pinned' if pinned else 'Shared'}: largest error "
                      f"{100 * max(errs):.0f}%, median {100 * median(errs):.0f}%.")
    md.append("\nThe model counts the stages' compute and the replicas' exchange. A cluster "
              "adds activation transfers over gRPC, the coordinator's work (data and "
              "evaluations) on the same cores, and the hand-offs between each worker's "
              "threads.\n")
    return "\n".join(md) + "\n"
