#!/usr/bin/python3
"""A testbed of emulated devices on this machine: real localpar clusters in which the
coordinator and every worker is its own device, with its own network namespace (joined to a
bridge by a veth pair, its egress rate-limited by `tc tbf`; `tc netem` is not on this kernel,
so links have a rate and no added delay) and its own CPU share (a core each where the devices
fit the cores, else a cgroup CPU quota). Times are measured by the wall clock.

  deploy/testbed.py run JOB --devices=2 --method=GREEDY --link_mbit=100 --out=DIR
        [--check_reference]          # one run; with --check_reference, compared bitwise with
                                     # `localpar train` of the same job and seed
  deploy/testbed.py sweep deploy/experiments/testbed.json --out=DIR [--plan]
                                     # the measurement sweep: every method, device count,
                                     # link and seed, cached in experiments/cache/testbed.jsonl
  deploy/testbed.py clean            # remove what a killed testbed left behind

Needs root. Every namespace, qdisc and cgroup a testbed makes is removed when it ends, on
Ctrl-C and SIGTERM too; `clean` (which every testbed also runs first) removes what a SIGKILL
left. The code is experiments/testbed/; run this with /usr/bin/python3.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import cli  # noqa: E402
from experiments.testbed import devices, methods, runner  # noqa: E402


def positive_int(v):
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v}: must be >= 1")
    return n


def positive_float(v):
    x = float(v)
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{v}: a positive number of seconds")
    return x


def fraction(v):
    x = float(v)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"{v}: a fraction of a core in (0, 1]")
    return x


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="one run of a job on a fresh testbed",
                       description="One run of JOB on a testbed of --devices devices (plus the "
                       "coordinator's), every worker on a device of its own.")
    r.add_argument("job", help="the job file")
    r.add_argument("--devices", type=positive_int, default=2, help="worker devices (default 2)")
    r.add_argument("--method", choices=methods.METHODS, default="GREEDY",
                   help="data_parallel (N replicas), gpipe, 1f1b or zb (BACKPROP as N stages, N "
                   "micro-batches, in that schedule) or a local rule with N stages (default "
                   "GREEDY)")
    r.add_argument("--link_mbit", type=float, default=0,
                   help="each device's egress rate in Mbit/s (0: unshaped, default)")
    r.add_argument("--worker_cpu", type=fraction, default=None,
                   help="each worker device's share of a core (default: a core each where they "
                   "fit, else an equal share of what the coordinator leaves)")
    r.add_argument("--coordinator_cpu", type=fraction, default=0.25,
                   help="the coordinator's share of a core where quotas apply (default 0.25)")
    r.add_argument("--batch_size", type=positive_int, default=64)
    r.add_argument("--lr", type=float, default=1e-3, help="the schedule's peak learning rate")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--max_steps", type=positive_int, default=200)
    r.add_argument("--micro_batches", type=positive_int, default=None,
                   help="gpipe, 1f1b and zb: micro-batches a batch (default: one per device)")
    r.add_argument("--eval_every_steps", type=int, default=50)
    r.add_argument("--target", type=float, default=None,
                   help="stop once the last stage's held-out metric has met this `--hold` "
                   "evaluations in a row (bits per byte, or accuracy)")
    r.add_argument("--hold", type=positive_int, default=2)
    r.add_argument("--max_seconds", type=positive_float, default=None,
                   help="stop the run after this many seconds (default: none)")
    r.add_argument("--drain_seconds", type=positive_float, default=None,
                   help="once stopped (at --target or --max_seconds), kill the coordinator "
                   "after this many seconds instead of waiting for every step already fed "
                   "(then no weights or report; default: wait)")
    r.add_argument("--check_reference", action="store_true",
                   help="compare the final weights bitwise with `localpar train` (a "
                   "deterministic rule; no --target)")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--localpar", default="build/ci/localpar", help="the localpar binary (its "
                   "folder holds localpar_worker and localpar_coordinator)")
    w = sub.add_parser("sweep", help="the measurement sweep (resumes from its cache)",
                       description="Tunes each method's learning rate with the reference "
                       "trainer, then runs every (devices, link, method, seed) of SPEC on a "
                       "fresh testbed, one at a time, and writes the tables.")
    w.add_argument("spec", help="the sweep file (deploy/experiments/testbed.json)")
    w.add_argument("--out", required=True, help="output directory")
    w.add_argument("--cache", default="experiments/cache/testbed.jsonl",
                   help="the sweep's cache (JSON lines, committed); the frontier's cache "
                   "answers for its own tuning runs")
    w.add_argument("--frontier_cache", default="experiments/cache/frontier.jsonl")
    w.add_argument("--plan", action="store_true", help="run nothing: count what is done and "
                   "name what is left")
    w.add_argument("--csv", default=None, help="also write the per-run table here "
                   "(docs/results/testbed.csv)")
    w.add_argument("--results", default=None, help="also write the testbed's section of this "
                   "results file (RESULTS.md), between its markers")
    w.add_argument("--localpar", default="build/ci/localpar")
    sub.add_parser("clean", help="remove what killed testbeds left behind",
                   description="Removes the namespaces and cgroups of testbeds whose process is "
                   "gone (every testbed does this first).")
    return p


def sweep_command(args):
    from experiments.cache import RunCache
    from experiments.testbed import calibrate, report, spec as specs, sweep
    spec = specs.load_spec(args.spec)
    if not args.plan:
        devices.require_root()
    cache = RunCache(args.cache, also=[args.frontier_cache])
    run, finished = sweep.main_sweep(args, spec, cache)
    if not finished and not args.plan:
        return 0
    # The tables of every run done so far (all of them once the sweep has finished).
    profiles = {k: run.frontier.profile(run.model, k, spec.device_batch)["stages"]
                for k in run.stage_counts()}
    results = run.results()
    fit_seed = min(spec.seeds)
    ev = run.evaluation()
    cal = calibrate.Calibration(results, profiles, lambda cfg: cfg.seed == fit_seed, ev)
    fewest = min(spec.devices)
    transfer = calibrate.Calibration(results, profiles, lambda cfg: cfg.devices == fewest, ev)
    rows = report.rows(results, run.model, profiles, spec.device_batch, cal, spec.max_seconds)
    report.write(rows, os.path.join(args.out, "testbed.csv"))
    if args.csv:
        report.write(rows, args.csv)
    md = report.section(rows, cal, fit_seed, run.model.text, len(results), run.total(),
                        args.spec, transfer, fewest, spec.max_seconds)
    from experiments.testbed import crossover
    cross = crossover.markdown(rows, results, cal, profiles, run.model.text)
    if cross:
        md += "\n" + cross
    if spec.recompute_frontier:
        from experiments.testbed import recompute

        def profile_stages(k):  # the frontier's stage counts too (8), from its cache
            if k not in profiles:
                profiles[k] = run.frontier.profile(run.model, k, spec.device_batch,
                                                   measure=False)["stages"]
            return profiles[k]
        link = run.frontier.spec.hardware.link_gbps * 1000
        md += "\n" + recompute.markdown(run, cal, profile_stages, link)
    with open(os.path.join(args.out, "TESTBED.md"), "w") as f:
        f.write(md)
    if args.results:
        from experiments.common import replace_testbed_section, rewrite
        rewrite(args.results, lambda old: replace_testbed_section(old, md, spec.name))
    print(f"testbed: {len(rows)} rows from {len(results)} runs; "
          f"{os.path.join(args.out, 'TESTBED.md')}")
    return 0


def main():
    args = parser().parse_args()

    def body():
        if args.command == "clean":
            devices.require_root()
            devices.clean_stale()
            print("testbed: nothing of a killed testbed is left")
            return 0
        cli.check_localpar(args)
        if args.command == "sweep":
            return sweep_command(args)
        return runner.run_one(args)

    return cli.main_of("testbed", body)


if __name__ == "__main__":
    sys.exit(main() or 0)
