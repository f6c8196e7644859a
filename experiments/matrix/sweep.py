"""The matrix's runs in order: the learning-rate grid on the tune seeds (with "tune"), then
every model, arm and seed, seed by seed, so that a sweep cut short has whole seeds; and the
rows the report is made of."""

import concurrent.futures
import dataclasses
import itertools
import os

from experiments.common import data_figures, model_name, say
from experiments.matrix import runs as R


@dataclasses.dataclass
class Outcome:
    rows: list  # one dict per finished run
    stage_rows: list  # every stage head's figures
    curves: dict  # run id -> [(seconds, stage, loss)]
    missing: set  # run ids (with a reason) not done
    tune_rows: list  # (model, arm, {lr: mean metric})
    chosen: dict  # (model, arm) -> tuned lr
    tune_usage: list  # (cpu seconds, measured) of the tuning runs


def prepare_models(args, spec):
    for m in spec.models:
        m.name = m.label or model_name(m.job)
        m.data = data_figures(args.localpar, m.job)
        m.text = m.data["labels_per_example"] > 1


def make_run(args, model, arm, seed, lr=None):
    """The run of `arm` on `model` with `seed`; `lr` a rate from tuning or the model (an
    arm's own rate wins)."""
    if arm.lr is not None:
        lr = None  # the arm's label names its rate: the run id has no tag for it
    rid = R.run_id(model, arm, seed, lr)
    return R.Run(model, arm, seed, arm.lr if arm.lr is not None else lr, rid,
                 os.path.join(args.out, "runs", rid))


def execute(args, cache, spec, items):
    """Runs `items` (Run), up to `parallel` at once; with --done_only runs nothing. Returns
    the ids of the runs that are not done."""
    if args.done_only:
        return {r.id for r in items if not R.is_done(args, cache, spec, r)}
    counter = itertools.count(1)  # next() on it is atomic

    def start(run):
        say(f"[{next(counter)}/{len(items)}] {run.id}")
        R.run_one(args, cache, spec, run)

    pool = concurrent.futures.ThreadPoolExecutor(spec.parallel)
    futures = [pool.submit(start, run) for run in items]
    try:
        for f in futures:
            f.result()
    except BaseException:
        for f in futures:
            f.cancel()  # a failed run stops the sweep: start nothing more
        raise
    finally:
        pool.shutdown(wait=True)
    return set()


def tune_result(run_dir, text):
    """A tuning run's final metric and its CPU seconds."""
    report, _ = R.read_run(run_dir)
    return (R.metric_of(R.held_out(report["epochs"][-1])[-1], text),
            R.cpu_seconds(run_dir, report["wall_seconds"]))


def tune(args, cache, spec, out):
    """With "tune", every arm that sets no learning rate of its own first trains at each of
    the grid's rates on the tune seeds; it then trains the model's seeds at the rate whose
    mean final metric was best there (fresh seeds, so the choice does not flatter them)."""
    t = spec.tune
    items = [make_run(args, m, arm, seed, lr) for seed in t.seeds for m in spec.models
             for arm in spec.arms if arm.lr is None for lr in t.lrs]
    say(f"tuning: {len(items)} runs")
    missing = execute(args, cache, spec, items)
    for m in spec.models:
        for arm in spec.arms:
            if arm.lr is not None:
                continue
            means = {}
            for lr in t.lrs:
                done = [tune_result(r.dir, m.text)
                        for r in (make_run(args, m, arm, s, lr) for s in t.seeds)
                        if r.id not in missing]
                out.tune_usage.extend(usage for _, usage in done)
                vals = [metric for metric, _ in done]
                if len(vals) == len(t.seeds):
                    means[lr] = sum(vals) / len(vals)
            if len(means) == len(t.lrs):
                pick = min if m.text else max
                out.chosen[(m.name, arm.name)] = pick(means, key=means.get)
            out.tune_rows.append((m.name, arm.name, means))


def plan(args, spec, out):
    """Every run of the matrix, seed by seed; those whose rate is not tuned yet go to
    `out.missing`."""
    items = []
    for si in range(max(len(spec.model_seeds(m)) for m in spec.models)):
        for m in spec.models:
            seeds = spec.model_seeds(m)
            if si >= len(seeds):
                continue
            for arm in spec.arms:
                if spec.tune is None or arm.lr is not None:
                    items.append(make_run(args, m, arm, seeds[si], m.lr))
                elif (m.name, arm.name) in out.chosen:
                    items.append(make_run(args, m, arm, seeds[si], out.chosen[(m.name, arm.name)]))
                else:
                    out.missing.add(R.run_id(m, arm, seeds[si])
                                    + " (its learning rate is not tuned yet)")
    return items


def row_of(run, report, flops_per_example=None):
    m, text = run.model, run.model.text
    last = R.held_out(report["epochs"][-1])
    elapsed, timeline = 0.0, []
    for e in report["epochs"]:
        elapsed += e["seconds"]
        timeline.append((elapsed, R.metric_of(R.held_out(e)[-1], text)))
    return {
        "id": run.id, "model": m.name, "arm": run.arm.name, "rule": run.arm.rule,
        "lr": run.lr if run.lr is not None else "", "stages": report["stages"],
        "seed": run.seed, "metric_name": "bits_per_byte" if text else "accuracy",
        "metric": R.metric_of(last[-1], text),
        "stage_metrics": [R.metric_of(s, text) for s in last],
        "wall_seconds": report["wall_seconds"],
        "cpu": R.cpu_seconds(run.dir, report["wall_seconds"]),
        "examples_per_second": report["examples_per_second"], "steps": report["steps"],
        "sequential_steps": R.sequential_steps(run.arm.rule, report["stages"], report["steps"]),
        "baseline": m.data["unigram_bits_per_label"] if text else "",
        "train_flops": (flops_per_example * report["train_examples"]
                        if flops_per_example is not None else ""),
        "timeline": timeline,
    }


def sweep(args, cache, spec):
    """Trains (or reads back) every run of the matrix; the figures of those done."""
    prepare_models(args, spec)
    out = Outcome([], [], {}, set(), [], {}, [])
    if spec.tune is not None:
        tune(args, cache, spec, out)
    items = plan(args, spec, out)
    out.missing |= execute(args, cache, spec, items)
    by_key = {(r.model.name, r.arm.name, r.seed): r for r in items}
    for m in spec.models:
        for arm in spec.arms:
            for seed in spec.model_seeds(m):
                run = by_key.get((m.name, arm.name, seed))
                if run is None or run.id in out.missing:
                    continue
                report, curve = R.read_run(run.dir)
                out.curves[run.id] = curve
                row = row_of(run, report, R.flops_per_example(args, cache, run,
                                                              report["stages"]))
                out.rows.append(row)
                for k, s in enumerate(R.held_out(report["epochs"][-1])):
                    out.stage_rows.append({"model": m.name, "arm": row["arm"], "seed": seed,
                                           "stage": k, "test_loss": s["loss"],
                                           "test_accuracy": s["accuracy"],
                                           "metric": R.metric_of(s, m.text)})
    return out
