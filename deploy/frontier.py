#!/usr/bin/python3
"""The compute/time frontier: time to a target against compute to it, for data parallelism,
pipelined backprop and local parallelism (GREEDY, CHUNKED, OVERLAP with K stages), over
seeds, with bounds for points that ran out of budget and bootstrap intervals on the
summary's speed-ups.

The sweep is read from a JSON file (deploy/experiments/frontier.json; every field is in
experiments/frontier/spec.py): models (a job, its targets, batch sizes, learning-rate grid,
schedule lengths, budget and seeds) and methods (a rule, a stage count and a cost kind).

Every training run is the in-process reference trainer (`localpar train`), which is bitwise
equal to a `localpar run` cluster with the same job and seed, of a job derived from the
model's through protobuf's text format (its schedule replaced, or its network cut after
`first_stages`). A run evaluates every `eval_every_examples` training examples and stops once
the last stage has met the model's strictest target `hold` times in a row (or at its length).
Each point is a method at one batch size B at its best (learning rate, length) over the tune
seeds, reported over the seeds (fresh ones when tune_seeds differ, so the choice does not
flatter the figure); lr = base x sqrt(B / base_batch) x factor. Runs are cached by their
whole configuration (in their run directory, and with --cache in a JSON-lines file to
commit), so a sweep resumes where it stopped.

Cost model (ideal hardware: as many devices as the batch needs, each computing
`device_batch` examples per step, times measured on this machine by `localpar project --json`
for that many examples; see RESULTS.md for its statement). Compute to the target counts
3 x the forward FLOPs of every layer and of every head the method trains, per example seen.

Outputs under --out: jobs/, profiles/, runs/<run>/ (run.json, metrics.jsonl, run.log),
frontier.csv, heads.csv, checks.csv, plots/*.svg and FRONTIER.md; with --results, the
Markdown also replaces the frontier section of that file and the plots are copied next to it.

deploy/experiments/frontier_depth.json revises that sweep: backprop at 1, 2, 4, 6 and 8 blocks,
data parallelism at B = 1024 and 2048 with schedules long enough to reach the targets, the
grid extended past any edge a reaching point chose, and profiles measured on five occasions.
It keeps its own cache and borrows the first sweep's runs:

  deploy/frontier.py deploy/experiments/frontier_depth.json --out build/experiments/depth \\
      --localpar build/ci/localpar --cache experiments/cache/frontier_depth.jsonl \\
      --borrow experiments/cache/frontier.jsonl

The code is the package experiments/ (experiments/frontier/); run this with /usr/bin/python3.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import cli  # noqa: E402
from experiments.common import fail  # noqa: E402
from experiments.cache import RunCache  # noqa: E402
from experiments.frontier import driver, runs, spec as specs  # noqa: E402


def main():
    p = cli.parser(
        __doc__, "sweep file (JSON)", "replace the frontier section of this Markdown file",
        "read back profiles and cluster checks that already exist instead of redoing them "
        "(training runs are always read back when their configuration matches)")
    p.add_argument("--cache", help="also keep each training run's result and each profile in "
                   "this file (JSON lines), by its configuration (a file to commit, so that a "
                   "sweep spans sessions and machines)")
    p.add_argument("--borrow", action="append", default=[], metavar="CACHE",
                   help="also read results from this cache file (another sweep's, never "
                   "written), where --cache has none: a revised sweep reuses the runs, "
                   "profiles and checks of the one it revises; repeatable")
    p.add_argument("--checks_only", action="store_true", help="run only the cluster checks: "
                   "checks.csv and CHECKS.md under --out (minutes, where the sweep takes days)")
    p.add_argument("--plan", action="store_true", help="run and measure nothing: say which "
                   "stage the sweep is at, how many of its runs are done (in --cache, or under "
                   "--out), and name the runs left; later stages depend on earlier results, so "
                   "only the first unfinished stage is listed. Beside a running sweep, give it "
                   "another --out")
    p.add_argument("--prune_cache", action="store_true", help="once every stage's runs are "
                   "known, remove from --cache the runs that no configuration of this sweep "
                   "asks for (a changed job, grid or budget), and compact the file")
    args = p.parse_args()

    def body():
        cli.check_localpar(args)
        spec = specs.load_spec(args.spec)
        # --plan writes nothing to the cache, so it may read one a running sweep appends to.
        for path in args.borrow:
            if not os.path.isfile(path):
                fail(f"--borrow: {path}: no such cache file")
        if args.borrow and not args.cache:
            fail("--borrow: needs --cache (the file this sweep's own results go to)")
        cache = RunCache(args.cache, also=args.borrow) if args.cache else None
        ctx = runs.Context(args.localpar, args.out, spec.threads, cache, args.reuse)
        driver.run(args, ctx, spec, args.command or cli.this_command())

    cli.main_of("frontier", body)


if __name__ == "__main__":
    main()
