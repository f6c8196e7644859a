"""The frontier's stages, in order: the depth check, the profiles, the tuning runs, each
point's seeds and the summary's seeds. Later stages depend on earlier results; every run is
cached by its configuration, so a sweep stopped anywhere resumes where it stopped."""

import itertools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from experiments import jobs
from experiments.common import data_figures, model_name
from experiments.frontier import runs
from experiments.frontier.model import (PROFILE_TOLERANCE, at_edge, best_held, choose_setting,
                                        continued_axis, first_reaching, lr_at, lr_grid, median_profile,
                                        profile_disagreements, run_id, untried_neighbours)


class Plan(Exception):
    """--plan stops at the first stage with runs left (they are listed)."""


class Sweep:
    def __init__(self, ctx, spec, plan=False):
        self.ctx, self.spec, self.plan = ctx, spec, plan
        self.results = {}  # run id -> run.json
        self.asked = []  # every configuration a stage asked for
        self.profiles = {}  # (model, K, first, rows) -> `localpar project --json`
        self.extra = {}  # (model, method, B) -> [(lr factor, length)] the edge stage added
        self.invocation = f"{os.getpid()}-{time.time():.0f}"  # this run of the sweep
        self.version = None  # `localpar --version`, once something is measured
        self.builds = set()  # the builds that measured the profiles used
        self.unmeasured = []
        self.disagreements = []
        self.job_cache = {}
        self.all_models = spec.models
        self.models = [m for m in spec.models if not m.depth_only]

    # --- the models' jobs ----------------------------------------------------------------

    def prepare(self):
        """Each model's figures and its job as the runs see it: normalised, with the sweep's
        schedule (warm-up in examples, so its steps depend on B) and cut after
        `first_stages` for shallow baselines."""
        jobs_dir = os.path.join(self.ctx.out, "jobs")
        os.makedirs(jobs_dir, exist_ok=True)
        firsts = sorted({a.first_stages for a in self.spec.methods} - {None})
        for m in self.spec.models:
            m.name = m.label or model_name(m.job)
            m.data = data_figures(self.ctx.localpar, m.job)
            m.text = m.data["labels_per_example"] > 1
            m.normalized = jobs.normalized_job(self.ctx.localpar, m.job)
            for first in firsts:
                path = os.path.join(jobs_dir, f"{m.name}-first{first}.textproto")
                m.jobs[first] = jobs.write_job(path, jobs.derive_job(m.normalized, None, first))

    def job_for(self, m, first, batch):
        """(path, hash) of the job a run of `m` at `batch` trains, cut after `first`."""
        key = (m.name, first or 0, batch if m.schedule else 0)
        if key not in self.job_cache:
            if not m.schedule:
                path = m.jobs[first] if first else m.job
            else:
                s = m.schedule
                sched = jobs.warmup_cosine(s.kind, s.warmup_examples, s.min_lr_fraction, batch)
                path = jobs.write_job(
                    os.path.join(self.ctx.out, "jobs",
                                 f"{m.name}-first{first or 0}-b{batch}.textproto"),
                    jobs.derive_job(m.normalized, sched, first))
            self.job_cache[key] = (path, jobs.job_hash(path))
        return self.job_cache[key]

    def config(self, m, a, b, lr, length, seed, whole=False):
        """A run's configuration; `whole`: trained to its length, never stopped early."""
        path, digest = self.job_for(m, a.first_stages, b)
        return {"model": m.name, "job": os.path.relpath(path, self.ctx.out), "job_hash": digest,
                "rule": a.rule, "stages": a.train_stages, "first_stages": a.first_stages or 0,
                "batch": b, "lr": lr, "length": length, "seed": seed,
                "eval_every_steps": max(1, m.eval_every_examples // b), "hold": m.hold,
                "strictest": None if whole else min(m.targets) if m.text else max(m.targets),
                "text": m.text, "train_examples": m.data["train_examples"]}

    def grid(self, m, a, b):
        """The settings ((lr factor, length)) method `a` tries at `b`: the spec's grid, then
        those the edge stage added."""
        base = [(f, length) for length in a.lengths(m, b) for f in m.lr.factors]
        return base + self.extra.get((m.name, a.label, b), [])

    def settings(self, m, a, b):
        return [(lr_at(m.lr, b, f), length) for f, length in self.grid(m, a, b)]

    def axes(self, m, a, b):
        """The grid's axes (lr factors, lengths) continued `extend_edges` steps past each
        end (lengths only with the sweep's schedule); lengths shorter than a step or than
        `hold` evaluations are left off."""
        lengths = a.lengths(m, b)
        floor = max(b, m.eval_every_examples * m.hold)
        # Without a schedule of the sweep's, a length is only a budget: nothing to tune.
        steps = m.extend_edges if m.schedule else 0
        length_axis = [x for x in (round(v) for v in continued_axis(lengths, steps))
                       if x >= floor or x in lengths]
        return continued_axis(m.lr.factors, m.extend_edges), length_axis

    def edges(self, m, a, b, index):
        """Whether the grid setting `index` of `a` at `b` is on an edge of what was tried:
        (an lr next to it untried, a length next to it untried)."""
        grid = self.grid(m, a, b)
        missing = untried_neighbours(set(grid), *self.axes(m, a, b), grid[index])
        return (any(w == "lr" for w, _ in missing), any(w == "length" for w, _ in missing))

    # --- running -------------------------------------------------------------------------

    def run_all(self, configs, stage):
        self.asked.extend(configs)
        todo = {run_id(c): c for c in configs if run_id(c) not in self.results}
        total, done = len(todo), [0]
        run_dir = lambda rid: os.path.join(self.ctx.out, "runs", rid)  # noqa: E731
        if self.plan:
            left = []
            for rid, cfg in todo.items():
                r = runs.cached_run(self.ctx, cfg, run_dir(rid))
                if r is None:
                    left.append(rid)
                else:
                    self.results[rid] = r
            print(f"{stage}: {total - len(left)} of {total} runs done")
            if left:
                print(f"left ({len(left)}; the stages after this one depend on their results):")
                for rid in left:
                    print(f"  {rid}")
                raise Plan()
            return

        def work(item):
            if self.ctx.stop.is_set():
                raise KeyboardInterrupt  # picked up as the sweep stopped: not started
            rid, cfg = item
            r = runs.train_run(self.ctx, cfg, run_dir(rid))
            done[0] += 1
            reached = "reached" if r["stopped_at_target"] else "budget"
            cached = r.pop("cached", False)
            # One write per line: runs finish on several threads at once.
            sys.stderr.write(f"[{done[0]}/{total}] {rid}: {len(r['points'])} evaluations, "
                             f"{reached}, " + ("cached" if cached else f"{r['seconds']:.0f} s")
                             + "\n")
            return rid, r

        pool = ThreadPoolExecutor(max_workers=max(1, self.spec.parallel))
        futures = [pool.submit(work, item) for item in todo.items()]
        try:
            for f in futures:
                rid, r = f.result()
                self.results[rid] = r
        except BaseException:
            # Ctrl-C or a failed run: start nothing more, stop the runs under way (their
            # threads see the flag within half a second), then go.
            self.ctx.stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()

    def result(self, m, a, b, lr, length, seed, whole=False):
        return self.results[run_id(self.config(m, a, b, lr, length, seed, whole))]

    def has_run(self, m, a, b, lr, length, seed):
        return run_id(self.config(m, a, b, lr, length, seed)) in self.results

    def profile(self, m, k, rows, first=None, measure=True):
        """`m`'s profile with `k` stages at `rows` rows (with `first`: of its network cut
        after that many stages): the median over the occasions it was measured on, those
        under "occasions", and "measured" when this run of the sweep measured it; None when
        it was never measured and `measure` is false."""
        tag = f"-first{first}" if first else ""
        job = m.jobs[first] if first else m.job
        if self.version is None and measure:
            self.version = runs.localpar_version(self.ctx)
        found, measured = runs.profile(
            self.ctx, job, f"{m.name}{tag}-K{k}-b{rows}", k, rows, jobs.job_hash(job), measure,
            self.spec.profile_occasions, 3600 * self.spec.profile_gap_hours, self.invocation,
            self.spec.profile_tag, self.version)
        return None if found is None else dict(median_profile(found), measured=measured)

    # --- the stages ----------------------------------------------------------------------

    def depth(self):
        """The whole network and its first block alone (the data-parallel methods) at the
        reference batch, at every learning rate, trained over the longest length to the end.
        The best each holds says which targets need depth; a model marked depth_only stops
        here (a sweep of targets the first block reaches tests nothing)."""
        rows = []
        for m in self.all_models:
            dp = [a for a in self.spec.methods if a.cost == "data_parallel"]
            if not m.depth_check or not any(a.first_stages for a in dp):
                continue
            b, length = m.reference_batch, max(m.lengths)
            grid = lr_grid(m.lr, b)
            self.run_all([self.config(m, a, b, lr, length, seed, whole=True) for a in dp
                          for lr in grid for seed in m.tune_seeds], f"depth check ({m.name})")
            for a in dp:
                best = None
                for lr in grid:
                    held = [best_held([p["metrics"][-1] for p in self.result(
                        m, a, b, lr, length, seed, whole=True)["points"]], not m.text, m.hold)
                            for seed in m.tune_seeds]
                    value = sum(held) / len(held)
                    if best is None or m.better(value, best[0]):
                        best = (value, lr)
                rows.append({"model": m.name, "method": a.label, "shallow": bool(a.first_stages),
                             "blocks": a.first_stages or len(m.normalized.stages),
                             "batch": b, "length": length, "lr": best[1], "best": best[0],
                             "lr_edge": at_edge(grid.index(best[1]), len(grid)),
                             "seeds": len(m.tune_seeds)})
        return rows

    def measure_profiles(self):
        """Profiles first, one at a time, while nothing else runs: every device batch of the
        sensitivity check, for every stage count (and shallow cut) the methods use, each
        measured once more while it has fewer than `profile_occasions` measurements and the
        last is `profile_gap_hours` old (separate occasions: runs of the sweep). With
        --plan only profiles already measured: measuring beside a running sweep would skew
        the step times. A profile measured under load disagrees with the others (said here
        and in the report)."""
        for m in self.models:
            for db in m.device_batches:
                for k, first in sorted({(a.stages, a.first_stages or 0)
                                        for a in self.spec.methods}):
                    what = f"{m.name} K={k}{f' first {first}' if first else ''} at {db} rows"
                    prof = self.profile(m, k, db, first or None, measure=not self.plan)
                    if prof is None:
                        self.unmeasured.append(what)
                        continue
                    measured = prof.pop("measured")
                    self.profiles[(m.name, k, first, db)] = prof
                    print(f"profiled {what}{'' if measured else ', cached'} ("
                          f"{len(prof['occasions'])} of {self.spec.profile_occasions} "
                          "occasions)", file=sys.stderr)
        builds = {o.get("version") for p in self.profiles.values() for o in p["occasions"]}
        # Profiles from before builds were recorded say nothing, unless beside recorded ones.
        self.builds = ({b or "not recorded" for b in builds} if len(builds) > 1
                       else builds - {None})
        if len(self.builds) > 1:
            print(f"warning: the profiles were measured by {len(self.builds)} builds "
                  f"({'; '.join(sorted(self.builds))}): their step times compare unlike with "
                  "unlike", file=sys.stderr)
        self.disagreements = profile_disagreements(self.profiles)
        for line in self.disagreements:
            print(f"warning: profiles disagree by more than {PROFILE_TOLERANCE:.0%} (measured "
                  f"under load? delete them from --cache and measure again): {line}",
                  file=sys.stderr)

    def hit(self, m, a, b, lr, length, seed, target):
        r = self.result(m, a, b, lr, length, seed)
        hit = first_reaching([(p["step"], p["metrics"][-1]) for p in r["points"]],
                             target, not m.text, m.hold)
        return hit[0] if hit else None

    def choose(self, m, a, b, target, hits=False):
        """The setting (lr, length) of a point, chosen on the tune seeds: (index into the
        grid, setting), with `hits` also the steps to target by tune seed (None: missed)."""
        candidates = [((lr, length), {seed: self.hit(m, a, b, lr, length, seed, target)
                                      for seed in m.tune_seeds})
                      for lr, length in self.settings(m, a, b)]
        index, setting, steps = choose_setting(candidates)
        return (index, setting, steps) if hits else (index, setting)

    def points(self):
        return [(m, a, b) for m in self.models for a in self.spec.methods
                for b in a.batch_sizes(m)]

    def tune_and_seed(self):
        """Every setting on the tune seeds, the settings past an edge, then each point's
        chosen setting on its seeds."""
        self.run_all([self.config(m, a, b, lr, length, seed) for m, a, b in self.points()
                      for lr, length in self.settings(m, a, b) for seed in m.tune_seeds],
                     "tuning (every setting, on the tune seeds)")
        self.extend_edges()
        self.run_all([self.config(m, a, b, *self.choose(m, a, b, target)[1], seed)
                      for m, a, b in self.points() for target in m.targets
                      for seed in m.seeds],
                     "seeds (each point's chosen setting)")

    def extend_edges(self):
        """A point that reaches its target on every tune seed at a setting on an edge of the
        grid (an lr or length next to it untried) gets those neighbours on the tune seeds;
        rounds go on until every such point is a local optimum of what was tried or its
        neighbour lies past the `extend_edges` steps its model allows. A point that missed
        says nothing about which way is better and is left as it is."""
        for n in itertools.count(1):
            added, configs = {}, []  # the grids stay as they are until the round is known
            for m, a, b in self.points():
                if not m.extend_edges:
                    continue
                grid = self.grid(m, a, b)
                mine = added.setdefault((m.name, a.label, b), [])
                for target in m.targets:
                    index, _, steps = self.choose(m, a, b, target, hits=True)
                    if any(v is None for v in steps.values()):
                        continue
                    for _, cand in untried_neighbours(set(grid), *self.axes(m, a, b),
                                                      grid[index]):
                        if cand is None or cand in mine:
                            continue
                        mine.append(cand)
                        configs += [self.config(m, a, b, lr_at(m.lr, b, cand[0]), cand[1],
                                                seed) for seed in m.tune_seeds]
            if not configs:
                return
            for key, cands in added.items():
                self.extra.setdefault(key, []).extend(cands)
            self.run_all(configs, f"edges, round {n} (past a reaching point's edge, on the "
                         "tune seeds)")
