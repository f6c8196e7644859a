"""`deploy/testbed.py run`: one configuration on a fresh testbed, optionally checked bitwise
against the reference trainer."""

import filecmp
import json
import os
import subprocess

from experiments import jobs
from experiments.common import data_figures, fail, say
from experiments.testbed import cluster, devices, methods
from experiments.testbed.report import link_text


def derived_job(localpar, job_path, lay, out_dir, micro_batches=None):
    """The job as the cluster and the reference both train it: normalised by `localpar
    validate` (paths resolved), with the method's rule, micro-batches (or `micro_batches`)
    and pipeline schedule."""
    job = jobs.normalized_job(localpar, job_path)
    methods.apply(job, lay, micro_batches)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "job.textproto")
    jobs.write_job(path, job)
    return path, jobs.job_hash(path)


def reference_weights(localpar, cfg, out_dir):
    """`localpar train` of the same job and settings: its weights.pb."""
    cmd = [localpar, "train", cfg.job, f"--rule={cfg.rule}", f"--stages={cfg.stages}",
           f"--replicas={cfg.replicas}", f"--batch_size={cfg.batch}", f"--lr={cfg.lr:.6g}",
           f"--seed={cfg.seed}", f"--max_steps={cfg.max_steps}", "--epochs=1000",
           f"--eval_every_steps={cfg.eval_every_steps}", f"--threads={cfg.threads}", "--quiet",
           f"--out={out_dir}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"the reference run failed (exit {r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return os.path.join(out_dir, "weights.pb")


def run_one(args):
    localpar = os.path.abspath(args.localpar)
    lay = methods.layout(args.method, args.devices)
    if args.micro_batches and lay.rule != "BACKPROP":
        fail(f"--micro_batches: {args.method} has none (only gpipe, 1f1b and zb split batches)")
    job, digest = derived_job(localpar, args.job, lay, args.out, args.micro_batches)
    data = data_figures(localpar, job)
    text = data["labels_per_example"] > 1
    if args.check_reference and (args.target is not None or args.max_seconds is not None):
        fail("--check_reference compares whole runs: leave --target and --max_seconds out")
    cfg = cluster.Config(job=job, job_hash=digest, method=args.method, rule=lay.rule,
                         stages=lay.stages, replicas=lay.replicas, batch=args.batch_size,
                         lr=args.lr, seed=args.seed, max_steps=args.max_steps,
                         eval_every_steps=args.eval_every_steps, hold=args.hold,
                         strictest=args.target, text=text, devices=args.devices,
                         link_mbit=args.link_mbit, worker_cpu=args.worker_cpu,
                         coordinator_cpu=args.coordinator_cpu,
                         exchange="reduce_scatter" if lay.replicas > 1 else None,
                         sync_every=lay.sync_every if lay.sync_every > 1 else None)
    with devices.Testbed(args.devices, args.link_mbit, args.worker_cpu,
                         args.coordinator_cpu) as bed:
        result = cluster.run(os.path.dirname(localpar), cfg, bed, os.path.join(args.out, "run"),
                             max_seconds=args.max_seconds, drain_seconds=args.drain_seconds)
    line = (f"testbed: {args.method} on {args.devices} devices, "
            + (link_text(args.link_mbit) if args.link_mbit else "unshaped links")
            + f": {cluster.steps_done(result)} steps in {result['seconds']:.1f} s (measured)"
            + (f", {result['examples_per_second']:.0f} examples/s"
               if result["examples_per_second"] else "")
            + ("" if result["drained"] else
               f"; killed {args.drain_seconds:g} s after its stop (no weights or report)"))
    evals = [p.get("eval_seconds") for p in result["points"]]
    timed = [e for e in evals if e is not None]
    if timed:  # the end of an epoch's test is not timed (no training line comes before it)
        line += (f"; evaluations took {sum(timed):.1f} s of it"
                 + (f" ({len(timed)} of {len(evals)} timed)" if len(timed) < len(evals) else ""))
    if args.target is not None:
        t = cluster.seconds_to(result["points"], args.target, text, args.hold)
        line += (f"; to {args.target:g}: {t:.1f} s" if t is not None
                 else f"; {args.target:g} not reached")
    say(line)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"config": cfg.key(), **{k: v for k, v in result.items() if k != "weights"}},
                  f, indent=1)
    if args.check_reference:
        ref = reference_weights(localpar, cfg, os.path.join(args.out, "reference"))
        if not filecmp.cmp(ref, result["weights"], shallow=False):
            fail(f"the cluster's weights differ from `localpar train`'s ({result['weights']} "
                 f"against {ref})")
        say("testbed: the weights are bitwise equal to `localpar train` of the same job and seed")
    return 0
