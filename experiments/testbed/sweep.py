"""The testbed sweep: tune each method's learning rate with the reference trainer (untimed),
then run every (devices, link, method, seed) as a real cluster on a fresh testbed, one at a
time and beside nothing else, each cached by its configuration so the sweep resumes. Runs go
link by link in the spec's order (the fast links first), every device count at each, so that
a sweep cut short has whole links measured."""

import os
import sys

from experiments import jobs
from experiments.common import say
from experiments.frontier import spec as fspecs
from experiments.frontier.model import choose_setting, first_reaching, lr_grid
from experiments.frontier.runs import Context
from experiments.frontier.spec import Method
from experiments.frontier.sweep import Plan, Sweep
from experiments.testbed import cluster, devices, methods

# A measured run stopped at its target or its budget is killed this long after the stop:
# its time to target comes from the evaluations already written, and on a 10 Mbit/s link
# waiting for the steps already fed took minutes (data parallelism at 4 devices: 319 s).
DRAIN_SECONDS = 20


class TestbedSweep:
    def __init__(self, args, spec, cache):
        self.args, self.spec, self.cache = args, spec, cache
        fspec = fspecs.load_spec(spec.frontier)
        ctx = Context(args.localpar, args.out, fspec.threads, cache, False)
        self.frontier = Sweep(ctx, fspec, plan=args.plan)
        self.frontier.prepare()
        found = [m for m in fspec.models if m.name == spec.model]
        if not found:
            from experiments.common import fail
            fail(f"{args.spec}: model: {spec.model} is no model of {spec.frontier}")
        self.model = found[0]
        self.length = spec.length or max(self.model.lengths)
        self.strictest = (min if self.model.text else max)(self.model.targets)
        self.chosen = {}  # (method, devices) -> lr

    def length_for(self, batch):
        """The schedule length (and budget), in examples, of a run at `batch`."""
        return self.spec.length_by_batch.get(batch, self.length)

    # --- what each method trains -----------------------------------------------------------

    def batch(self, method, n):
        """The batch `method` trains at `n` devices: every device computes device_batch rows."""
        lay = methods.layout(method, n)
        return self.spec.device_batch * (lay.replicas if lay.rule != "BACKPROP" else n)

    def trained(self, method, n):
        """(frontier Method, batch): the update the reference trainer computes for `method`
        at `n` devices (backprop's is the same however it is split). DiLoCo's methods are
        tuned as the method their inner steps are (methods.tuned_as)."""
        method, n = methods.tuned_as(method, n)
        lay = methods.layout(method, n)
        batch = self.batch(method, n)
        if lay.rule == "BACKPROP":
            a = Method(rule="BACKPROP", cost="data_parallel", stages=1, train_stages=1,
                       label="data parallel")
        else:
            cost = "overlap" if lay.rule == "OVERLAP" else "local"
            a = Method(rule=lay.rule, cost=cost, stages=lay.stages, train_stages=lay.stages,
                       label=f"{lay.rule} K={lay.stages}")
        return a, batch

    def pairs(self):
        return [(meth, n) for n in self.spec.devices for meth in self.spec.methods
                if methods.fits(meth, n)]

    # --- tuning -----------------------------------------------------------------------------

    def tune(self):
        m, fs = self.model, self.frontier
        configs = []
        tuned = sorted({methods.tuned_as(meth, n) for meth, n in self.pairs()},
                       key=lambda p: (p[1], p[0]))
        for meth, n in tuned:
            a, b = self.trained(meth, n)
            configs += [fs.config(m, a, b, lr, self.length_for(b), seed)
                        for lr in lr_grid(m.lr, b) for seed in self.spec.tune_seeds]
        fs.run_all(configs, "testbed tuning (the reference trainer, untimed)")
        for meth, n in self.pairs():
            if methods.tuned_as(meth, n) != (meth, n):
                continue
            a, b = self.trained(meth, n)
            grid = lr_grid(m.lr, b)
            candidates = [(lr, {s: fs.hit(m, a, b, lr, self.length_for(b), s,
                                             self.strictest)
                                for s in self.spec.tune_seeds}) for lr in grid]
            index, lr, steps = choose_setting(candidates)
            self.chosen[(meth, n)] = lr
            edge = " (edge of the grid)" if index in (0, len(grid) - 1) else ""
            if all(v is None for v in steps.values()):
                edge += (f"; no learning rate reached {self.strictest:g} within "
                         f"{self.length_for(b)} examples (raise length_by_batch[{b}])")
            say(f"tuned: {meth} at {n} devices, B = {b}: lr {lr:.3g}{edge}")
        for meth, n in tuned:
            if (meth, n) not in self.chosen:  # a base no pair of the spec measures itself
                a, b = self.trained(meth, n)
                _, self.chosen[(meth, n)], _ = choose_setting(
                    [(lr, {s: fs.hit(m, a, b, lr, self.length_for(b), s, self.strictest)
                           for s in self.spec.tune_seeds}) for lr in lr_grid(m.lr, b)])
        for meth, n in self.pairs():
            base = methods.tuned_as(meth, n)
            if base != (meth, n):
                self.chosen[(meth, n)] = self.chosen[base]
                say(f"tuned: {meth} at {n} devices borrows {base[0]} at {base[1]} "
                    f"device(s)'s lr {self.chosen[base]:.3g}")

    # --- the measured runs ------------------------------------------------------------------

    def job(self, meth, n):
        """The job a testbed run trains: the frontier's derived job at this batch (its
        warm-up in steps), with pipelined backprop's micro-batches and schedule."""
        b = self.batch(meth, n)
        path, _ = self.frontier.job_for(self.model, None, b)
        lay = methods.layout(meth, n)
        if lay.micro_batches == 1 and lay.sync_every == 1:
            return path
        job = jobs.read_job(path)
        methods.apply(job, lay)
        tail = "" if lay.schedule == "gpipe" else f"-{lay.schedule}"
        tail += f"-H{lay.sync_every}" if lay.sync_every > 1 else ""
        out = os.path.join(self.args.out, "jobs", f"{self.model.name}-b{b}-m{lay.micro_batches}"
                           f"{tail}.textproto")
        return jobs.write_job(out, job)

    def evaluation(self):
        """What each evaluation scores, for the calibrated model (None when the job scores the
        whole held-out split, whose size the model does not know)."""
        from experiments.testbed.calibrate import Evaluation
        path, _ = self.frontier.job_for(self.model, None, self.spec.device_batch)
        job = jobs.read_job(path)
        if job.eval_limit <= 0:
            return None
        return Evaluation(job.eval_limit, job.eval_batch_size or 1000, self.spec.device_batch)

    def config(self, meth, n, link, seed):
        lay = methods.layout(meth, n)
        b = self.batch(meth, n)
        job = self.job(meth, n)
        return cluster.Config(
            job=os.path.relpath(job, self.args.out), job_hash=jobs.job_hash(job), method=meth,
            rule=lay.rule, stages=lay.stages, replicas=lay.replicas, batch=b,
            lr=self.chosen[(meth, n)], seed=seed, max_steps=max(1, self.length_for(b) // b),
            eval_every_steps=max(1, self.model.eval_every_examples // b), hold=self.model.hold,
            strictest=self.strictest, text=self.model.text, devices=n, link_mbit=link,
            worker_cpu=None, coordinator_cpu=self.spec.coordinator_cpu,
            exchange="reduce_scatter" if lay.replicas > 1 else None,
            sync_every=lay.sync_every if lay.sync_every > 1 else None)

    def key(self, cfg):
        return (f"{self.model.name}-{cfg.method}-N{cfg.devices}-L{cfg.link_mbit:g}"
                f"-lr{cfg.lr:.6g}-s{cfg.seed}")

    def measured(self):
        todo = []
        for link in self.spec.links_mbit:
            for n in self.spec.devices:
                for seed in self.spec.seeds:
                    for meth in self.spec.methods:
                        if not methods.fits(meth, n):
                            continue
                        cfg = self.config(meth, n, link, seed)
                        done = self.cache.get("measured", self.key(cfg))
                        if done is None or done.get("config") != cfg.key():
                            todo.append(cfg)
        total = self.total()
        print(f"measured runs: {total - len(todo)} of {total} done")
        if self.args.plan:
            for cfg in todo:
                print(f"  {self.key(cfg)}")
            raise Plan()
        pause = os.path.join(self.args.out, "PAUSE")
        for i, cfg in enumerate(todo, 1):
            if os.path.exists(pause):
                say(f"{pause} exists: stopping before run {i} of {len(todo)} (remove it and "
                    "start the sweep again to go on)")
                return
            say(f"[{i}/{len(todo)}] {self.key(cfg)}")
            self.run(cfg)

    def run(self, cfg):
        run_dir = os.path.join(self.args.out, "runs", self.key(cfg))
        full = cluster.Config(**{**cfg.__dict__, "job": os.path.join(self.args.out, cfg.job)})
        with devices.Testbed(cfg.devices, cfg.link_mbit, cfg.worker_cpu,
                             cfg.coordinator_cpu) as bed:
            shares = {d.name: d.cpu_fraction for d in bed.devices}
            result = cluster.run(os.path.dirname(self.args.localpar), full, bed, run_dir,
                                 max_seconds=self.spec.max_seconds,
                                 drain_seconds=DRAIN_SECONDS)
        result.pop("weights", None)
        result["cpu_fractions"] = shares
        self.cache.put("measured", self.key(cfg), {"config": cfg.key(), **result})
        hit = first_reaching([(p["step"], p["metrics"][-1]) for p in result["points"]],
                             cfg.strictest, not cfg.text, cfg.hold)
        say(f"    {cluster.steps_done(result)} steps, {result['seconds']:.0f} s, "
            + ("reached" if hit else "missed") + f" {cfg.strictest:g}"
            + ("" if result["drained"] else f" (killed {DRAIN_SECONDS} s after its stop: the "
               "steps already fed were not waited for)"))

    def results(self):
        """Every measured run's config and result, in sweep order."""
        out = []
        for link in self.spec.links_mbit:
            for n in self.spec.devices:
                for seed in self.spec.seeds:
                    for meth in self.spec.methods:
                        if not methods.fits(meth, n):
                            continue
                        cfg = self.config(meth, n, link, seed)
                        done = self.cache.get("measured", self.key(cfg))
                        if done is not None and done.get("config") == cfg.key():
                            out.append((cfg, done))
        return out

    def total(self):
        """Measured runs in the whole sweep."""
        return len(self.spec.links_mbit) * len(self.spec.seeds) * len(self.pairs())

    def stage_counts(self):
        """Every stage count a measured run has (for the profiles its model needs)."""
        return sorted({1} | {methods.layout(meth, n).stages for meth, n in self.pairs()})


def main_sweep(args, spec, cache):
    sweep = TestbedSweep(args, spec, cache)
    try:
        sweep.tune()
        sweep.measured()
    except Plan:
        return sweep, False
    sys.stderr.flush()
    return sweep, True
