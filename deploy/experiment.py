#!/usr/bin/python3
"""Runs a matrix of localpar training runs and writes a results table, CSV files and plots.

The matrix is models x arms x seeds, read from a JSON file (deploy/experiments/*.json; the
fields are in experiments/matrix/spec.py):

  {
    "name": "paper",
    "threads": 1,                                   # CPU GEMM threads per process
    "models": [{"job": "../jobs/fashion_resnet.textproto", "epochs": 2}, ...],
    "arms": [{"rule": "BACKPROP"}, {"rule": "CHUNKED", "stages": 2}, ...],
    "seeds": [1],
    "trainer": "cluster",                           # or "reference"
    "parallel": 1                                   # runs at once
  }

Each run is a real local cluster: `localpar run JOB --rule R --stages K --seed S --out DIR`
(one worker process per stage plus the coordinator, over gRPC on loopback). With
"trainer": "reference" a run is `localpar train` instead: every stage in one process, one
core per run, and the same weights bit for bit (clusters on CPU are bitwise equal to the
reference trainer), for long sweeps where only the figures matter. An arm's
`stages` regroups the job's stages into that many (CHUNKED with 2 chunks is CHUNKED with
stages 2); without it the job's own stages are used. Model-level `epochs` and `max_steps`
override the job's budget.

Outputs under --out: runs/<run>/ (report.json, the run's log, its training curve),
results.csv (one row per run), stages.csv (every stage head's test figures), curves.csv
(per-stage training loss against wall time), plots/*.svg (gnuplot) and RESULTS.md.
With --reuse, runs whose report.json already exists are read back instead of rerun.
With --cache FILE, each finished run's report and curve are also kept in FILE (one JSON
line a run; experiments/cache/*.jsonl are committed) under its whole configuration (the
job's contents, rule, stages, seed, budget, threads, device, trainer), so a sweep spread
over sessions resumes from a committed cache; --done_only then writes the tables from the
runs finished so far and names the ones still missing.

Over several seeds, each arm's gap to BACKPROP is paired by seed and given with a 95%
confidence interval (Student's t over the per-seed differences).

The code is the package experiments/ (experiments/matrix/); run this with /usr/bin/python3.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import cli  # noqa: E402
from experiments.cache import RunCache  # noqa: E402
from experiments.common import say  # noqa: E402
from experiments.matrix import report, spec as specs, sweep  # noqa: E402


def main():
    p = cli.parser(__doc__, "experiment file (JSON)",
                   "also write the Markdown report to this path",
                   "read back runs that already have a report instead of rerunning them")
    p.add_argument("--verbose", action="store_true", help="echo every progress line")
    p.add_argument("--cache", help="also keep each finished run in this file (JSON lines), "
                   "by its whole configuration, and read runs back from it (a file to commit)")
    p.add_argument("--done_only", action="store_true",
                   help="run nothing: write the tables from the runs already done (in "
                   "--cache or, with --reuse, in --out) and name the missing ones")
    args = p.parse_args()

    def body():
        cli.check_localpar(args)
        spec = specs.load_spec(args.spec)
        cache = RunCache(args.cache) if args.cache else None
        os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
        outcome = sweep.sweep(args, cache, spec)
        report.write_report(args, spec, outcome, args.command or cli.this_command())
        say(f"experiment: {len(outcome.rows)} runs; {os.path.join(args.out, 'RESULTS.md')}")

    cli.main_of("experiment", body)


if __name__ == "__main__":
    main()
