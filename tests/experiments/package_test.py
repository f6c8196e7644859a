#!/usr/bin/python3
"""Unit tests of the experiment runner's modules (experiments/): the run cache, job
derivation and hashing through protobuf, spec files into dataclasses, and the statistics;
then, given a localpar binary, that the committed caches still answer for every run the
shipped sweeps ask for (a job or a default that changed would otherwise send a sweep back
to days of training, or mix old results with new).

Usage: package_test.py SOURCE_DIR [LOCALPAR_BINARY]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.getcwd()
LOCALPAR = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else None
sys.path.insert(0, SOURCE)

from experiments import cache, common, jobs, specfile, stats  # noqa: E402
from experiments.frontier import spec as fspec  # noqa: E402
from experiments.matrix import spec as mspec  # noqa: E402
from experiments.testbed import spec as tspec  # noqa: E402


class CacheTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="localpar_cache_test.")
        self.path = os.path.join(self.dir.name, "sub", "sweep.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def test_put_then_read_back_in_a_new_process_view(self):
        c = cache.RunCache(self.path)
        self.assertFalse(os.path.exists(self.path), "nothing is written before a result")
        c.put("run", "a", {"config": {"x": 1}, "v": 1})
        c.put("profile", "a", {"key": {}, "profile": 2})
        again = cache.RunCache(self.path)
        self.assertEqual(again.get("run", "a"), {"config": {"x": 1}, "v": 1})
        self.assertEqual(again.get("profile", "a")["profile"], 2)
        self.assertIsNone(again.get("run", "b"))

    def test_a_later_line_replaces_an_earlier_one_and_compact_keeps_one(self):
        c = cache.RunCache(self.path)
        c.put("run", "b", {"v": 1})
        c.put("run", "a", {"v": 1})
        c.put("run", "b", {"v": 2})
        self.assertEqual(cache.RunCache(self.path).get("run", "b"), {"v": 2})
        c.compact()
        lines = open(self.path).read().splitlines()
        self.assertEqual([json.loads(x)["key"] for x in lines], ["a", "b"])
        self.assertEqual(cache.RunCache(self.path).get("run", "b"), {"v": 2})

    def test_a_line_cut_short_is_skipped_and_the_rest_kept(self):
        c = cache.RunCache(self.path)
        c.put("run", "a", {"v": 1})
        with open(self.path, "a") as f:
            f.write('{"kind": "run", "key": "b", "val')  # a crash mid-write
        again = cache.RunCache(self.path)
        self.assertEqual(again.skipped, 1)
        self.assertEqual(again.keys("run"), ["a"])
        again.put("run", "c", {"v": 3})  # appends after the torn line, on a line of its own
        self.assertEqual(cache.RunCache(self.path).keys("run"), ["a", "c"])
        self.assertNotIn("\n\n", open(self.path).read(), "no blank lines between whole ones")

    def test_stale_entries_are_those_no_configuration_accepts_and_drop_removes_them(self):
        c = cache.RunCache(self.path)
        for key, lr in (("a", 1), ("b", 2), ("c", 3)):
            c.put("run", key, {"config": {"lr": lr}})
        wanted = {"a": lambda v: v["config"]["lr"] == 1, "b": lambda v: v["config"]["lr"] == 9}
        self.assertEqual(c.stale("run", wanted), ["b", "c"])
        c.drop("run", ["b", "c"])
        self.assertEqual(cache.RunCache(self.path).keys("run"), ["a"])

    def test_a_directory_is_refused_by_name(self):
        with self.assertRaisesRegex(common.Failure, "one file per sweep"):
            cache.RunCache(self.dir.name)


JOB = '''name: "t"  # a comment
data { synthetic { shape: [4] classes: 2 } }
schedule { kind: COSINE lr: 0.01 min_lr: 0.001 }
stages { name: "one" layers { linear { out_features: 4 } } }
stages { name: "two{" layers { linear { out_features: 2 } } }
'''


class JobsTest(unittest.TestCase):
    def test_hash_ignores_layout_and_comments_but_not_settings(self):
        a = jobs.parse_job(JOB, "a")
        b = jobs.parse_job(JOB.replace("  # a comment", "").replace(" } }", "}}"), "b")
        self.assertEqual(jobs.message_hash(a), jobs.message_hash(b))
        c = jobs.parse_job(JOB.replace("out_features: 2", "out_features: 3"), "c")
        self.assertNotEqual(jobs.message_hash(a), jobs.message_hash(c))

    def test_derive_replaces_the_schedule_and_cuts_the_stages(self):
        job = jobs.parse_job(JOB, "job")
        sched = jobs.warmup_cosine("CONSTANT", 640, 0.5, 64)
        out = jobs.derive_job(job, sched, 1)
        self.assertEqual([s.name for s in out.stages], ["one"])
        self.assertEqual((out.schedule.kind, out.schedule.lr, out.schedule.warmup_steps,
                          out.schedule.min_lr), (0, 1.0, 10, 0.0))
        self.assertEqual(len(job.stages), 2, "the original is not changed")
        text = jobs.job_text(jobs.derive_job(job, None, None))
        self.assertEqual(jobs.parse_job(text, "again"), job, "text round-trips")

    def test_a_bad_job_names_its_place(self):
        with self.assertRaisesRegex(common.Failure, "where.job:1:"):
            jobs.parse_job("stages { bogus: 1 }", "where.job")

    def test_write_job_leaves_an_identical_file_alone(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "j.textproto")
            jobs.write_job(path, jobs.parse_job(JOB, "j"))
            before = os.stat(path).st_mtime_ns
            os.utime(path, ns=(before - 10**9, before - 10**9))
            jobs.write_job(path, jobs.parse_job(JOB, "j"))
            self.assertEqual(os.stat(path).st_mtime_ns, before - 10**9)


class SpecTest(unittest.TestCase):
    def write(self, d, data, name="spec.json"):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            json.dump(data, f)
        return path

    def test_unknown_and_wrong_fields_are_named(self):
        with tempfile.TemporaryDirectory() as d:
            job = os.path.join(d, "j.textproto")
            open(job, "w").write(JOB)
            bad = self.write(d, {"models": [{"job": "j.textproto", "epoch": 2}],
                                 "arms": [{"rule": "GREEDY"}]})
            with self.assertRaisesRegex(common.Failure, r"models\[0\]\.epoch: not a setting"):
                mspec.load_spec(bad)
            bad = self.write(d, {"models": [{"job": "j.textproto", "epochs": "2"}],
                                 "arms": [{"rule": "GREEDY"}]})
            with self.assertRaisesRegex(common.Failure, r"models\[0\]\.epochs: must be a pos"):
                mspec.load_spec(bad)
            ok = mspec.load_spec(self.write(d, {"models": [{"job": "j.textproto"}],
                                                "arms": [{"rule": "CHUNKED", "stages": 2}]}))
            self.assertEqual((ok.name, ok.trainer, ok.arms[0].name, ok.models[0].job),
                             ("spec", "cluster", "CHUNKED/2", job))

    def test_frontier_defaults_follow_each_other(self):
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "j.textproto"), "w").write(JOB)
            s = fspec.load_spec(self.write(d, {
                "models": [{"job": "j.textproto", "targets": [0.5], "batch_sizes": [32, 64],
                            "device_batch": 16, "max_examples": 100, "eval_every_examples": 10,
                            "lr": {"base": 1, "base_batch": 32, "factors": [1]},
                            "seeds": [2], "schedule": {"lengths": [300, 200]}}],
                "methods": [{"rule": "GREEDY", "stages": 2, "cost": "local"}]}))
            m = s.models[0]
            self.assertEqual((m.summary_seeds, m.tune_seeds, m.device_batches, m.lengths,
                              m.max_examples, m.reference_batch),
                             ([2], [2], [16], [200, 300], 300, 32))
            self.assertEqual((s.methods[0].label, s.methods[0].train_stages), ("GREEDY K=2", 2))
            self.assertEqual(s.hardware.link_bytes_per_s, 100e9 / 8)

    def test_every_shipped_spec_loads_with_its_own_runner(self):
        shipped = os.path.join(SOURCE, "deploy", "experiments")
        loaders = {"frontier.json": fspec.load_spec, "testbed.json": tspec.load_spec}
        names = sorted(n for n in os.listdir(shipped) if n.endswith(".json"))
        self.assertIn("paper.json", names)
        for name in names:
            with self.subTest(name=name):
                loader = tspec.load_spec if name.startswith("testbed") else \
                    fspec.load_spec if name.startswith("frontier") else \
                    loaders.get(name, mspec.load_spec)
                loader(os.path.join(shipped, name))

    def test_checks_hold_their_types(self):
        self.assertTrue(specfile.positive_ints([1, 2]))
        self.assertFalse(specfile.positive_ints([1, True]))
        self.assertFalse(specfile.positive_ints([]))
        self.assertTrue(specfile.seeds([0]))
        self.assertFalse(specfile.learning_rate(10))


class StatsTest(unittest.TestCase):
    def test_paired_gap_and_t(self):
        gap, ci, n = stats.paired_gap({1: 3.0, 2: 5.0, 3: 9.0}, {1: 1.0, 2: 2.0})
        self.assertEqual((gap, n), (2.5, 2))
        self.assertAlmostEqual(ci[1] - gap, 12.706 * (0.5 ** 0.5) / (2 ** 0.5))
        self.assertEqual(stats.t95(40), 1.96)
        self.assertEqual(stats.mean_sd([2.0]), (2.0, 0.0))


class CalibrationTest(unittest.TestCase):
    """The testbed's calibrated cost model recovers the parameters that made synthetic runs,
    and predicts runs it was not fitted on."""

    def runs(self, params, evaluation=None):
        from experiments.testbed import calibrate
        from experiments.testbed.cluster import Config
        prof = {1: [{"seconds": 0.008, "head_seconds": 0.001, "parameter_bytes": 4e5}],
                2: [{"seconds": 0.004, "head_seconds": 0.0005, "hop_bytes": 6e4,
                     "parameter_bytes": 2e5, "input_grad_seconds": 0.001},
                    {"seconds": 0.004, "head_seconds": 0.0005, "hop_bytes": 0,
                     "parameter_bytes": 2e5, "input_grad_seconds": 0.001}]}
        out = []
        for seed in (2, 3):
            for link in (0, 1000, 100, 10):
                for method, stages, replicas in (("data_parallel", 1, 2), ("gpipe", 2, 1),
                                                 ("CHUNKED", 2, 1), ("OVERLAP", 2, 1)):
                    cfg = Config(job="j", job_hash="h", method=method, rule="r", stages=stages,
                                 replicas=replicas, batch=16, lr=0.1, seed=seed, max_steps=1,
                                 eval_every_steps=64, hold=1, strictest=1, text=True,
                                 devices=2, link_mbit=link, worker_cpu=None,
                                 coordinator_cpu=0.25)
                    f = calibrate.features(cfg, prof[1 if method == "data_parallel" else 2],
                                           0.9, evaluation)
                    step = calibrate.predict(params, f) * (1.01 if seed == 3 else 1.0)
                    points = [{"step": k, "wall_seconds": 1.0 + k * step} for k in range(0, 50, 10)]
                    out.append((cfg, {"points": points, "cpu_fractions": {"d0": 0.9}}))
        return out, prof

    def test_the_fit_recovers_the_parameters_and_predicts_held_out_runs(self):
        from experiments.testbed import calibrate
        truth = [1.2, 2e-3, 5e-4, 3e-9, 1.1]
        runs, prof = self.runs(truth)
        cal = calibrate.Calibration(runs, prof, lambda cfg: cfg.seed == 2)
        for got, want in zip(cal.params, truth):
            self.assertAlmostEqual(got / want, 1.0, places=2)
        held = cal.held_out()
        self.assertEqual(len(held), 16)
        for *_, err in held:  # the held-out runs are 1% slower than the truth
            self.assertAlmostEqual(err, 1 / 1.01 - 1, places=3)

    def test_the_fit_with_evaluations_recovers_the_parameters(self):
        from experiments.testbed import calibrate
        truth = [1.2, 2e-3, 5e-4, 3e-9, 1.1]
        ev = calibrate.Evaluation(limit=2048, batch=512, profile_batch=16)
        runs, prof = self.runs(truth, ev)
        cal = calibrate.Calibration(runs, prof, lambda cfg: cfg.seed == 2, ev)
        for got, want in zip(cal.params, truth):
            self.assertAlmostEqual(got / want, 1.0, places=2)
        self.assertIn("evaluations of 2048 examples in batches of 512 modelled", cal.describe())

    def test_an_evaluation_is_a_pipeline_of_forwards_and_transfers(self):
        from experiments.testbed import calibrate
        from types import SimpleNamespace
        ev = calibrate.Evaluation(limit=2048, batch=512, profile_batch=16)
        # 4 stages of 3 ms a training step each at 16 rows (1 ms forward), 64 KiB of
        # activations a hop, on 10 Mbit/s links and a whole core.
        stage = {"seconds": 0.003, "head_seconds": 0.0, "hop_bytes": 65536.0,
                 "parameter_bytes": 1e5}
        cfg = SimpleNamespace(method="CHUNKED", rule="CHUNKED", stages=4, replicas=1,
                              devices=4, link_mbit=10, eval_every_steps=256)
        f = calibrate.features(cfg, [stage] * 4, 1.0, ev)
        self.assertEqual((f["eval_batches"], f["eval_stages"]), (4, 4))
        fwd, hop = 0.001 * 512 / 16, 65536 * 512 / 16 / 1.25e6  # one batch: 32 ms, 1.68 s
        self.assertAlmostEqual(f["eval_compute"], fwd)
        self.assertAlmostEqual(f["eval_wire"], hop)
        ideal = [1.0, 0.0, 0.0, 0.0, 1.0]
        one = 4 * fwd + 3 * hop + 3 * hop  # 4 forwards, 3 hops, then 3 more batches' hops
        self.assertAlmostEqual(calibrate.predict(ideal, f) - calibrate.predict(ideal, f, False),
                               one / 256)
        # Data parallelism: each replica scores half of every batch and sends nothing.
        cfg = SimpleNamespace(method="data_parallel", rule="BACKPROP", stages=1, replicas=2,
                              devices=2, link_mbit=10, eval_every_steps=64)
        whole = {"seconds": 0.012, "head_seconds": 0.0, "parameter_bytes": 4e5}
        f = calibrate.features(cfg, [whole], 1.0, ev)
        self.assertEqual((f["eval_wire"], f["eval_stages"]), (0.0, 1))
        self.assertAlmostEqual(calibrate.predict(ideal, f) - calibrate.predict(ideal, f, False),
                               4 * 0.004 * 256 / 16 / 64)
        # OVERLAP waits for the round trip: activations there, their gradient back.
        cfg = SimpleNamespace(method="OVERLAP", rule="OVERLAP", stages=2, replicas=1,
                              devices=2, link_mbit=100, eval_every_steps=256)
        f = calibrate.features(cfg, [stage, {**stage, "hop_bytes": 0.0}], 1.0)
        self.assertTrue(f["synchronous"])
        self.assertAlmostEqual(f["wire"], 2 * 65536 / 12.5e6)

    def test_the_frontier_points_map_onto_the_calibrated_models_runs(self):
        from experiments.testbed import recompute
        row = {"cost_kind": "pipelined_backprop", "rule": "BACKPROP", "stages": 8,
               "batch": 64, "devices": 8}
        cfg = recompute.as_run(row, 16, 100000)
        self.assertEqual((cfg.method, cfg.replicas, cfg.micro_batches), ("gpipe", 1, 4))
        self.assertTrue(recompute.beyond(row))  # 8 stages: more than the testbed measured
        row = {"cost_kind": "local", "rule": "CHUNKED", "stages": 2, "batch": 64, "devices": 8}
        cfg = recompute.as_run(row, 16, 100000)
        self.assertEqual((cfg.method, cfg.stages, cfg.replicas), ("CHUNKED", 2, 4))
        self.assertFalse(recompute.beyond(row))
        self.assertTrue(recompute.beyond({**row, "devices": 16}))  # 8 replicas a stage
        self.assertTrue(recompute.beyond({"cost_kind": "data_parallel", "rule": "BACKPROP",
                                          "stages": 1, "batch": 16, "devices": 1}))
        # A local stage with replicas sends its hop and its share of their exchange.
        from experiments.testbed import calibrate
        self.assertEqual(calibrate.traffic(cfg, [{"hop_bytes": 10.0, "parameter_bytes": 100.0}]
                                           * 2), (1 + 6, 10.0 + 150.0))

    def test_the_transfer_check_names_each_held_out_run_by_method(self):
        from experiments.testbed import calibrate, report
        truth = [1.2, 2e-3, 5e-4, 3e-9, 1.1]
        runs, prof = self.runs(truth)
        cal = calibrate.Calibration(runs, prof, lambda cfg: cfg.seed == 2)
        md = report.transfer_markdown(cal, 2)
        self.assertIn("largest error of 1.0% (0 beyond 15%)", md)  # seed 3 is 1% slower
        self.assertIn("| 2 | 10 Mbit/s | gpipe | 1 | -1.0% |", md)
        empty = calibrate.Calibration(runs[:3], prof, lambda cfg: True)
        self.assertIn("too few runs", report.transfer_markdown(empty, 2))
        # 1F1B and ZB send what GPipe sends.
        from types import SimpleNamespace
        for method in ("1f1b", "zb"):
            cfg = SimpleNamespace(method=method, replicas=1, stages=4, devices=4)
            self.assertEqual(calibrate.traffic(cfg, [{"hop_bytes": 10.0}] * 4), (8, 80.0))

    def test_the_mesh_sends_what_its_exchange_sends(self):
        from experiments.testbed import calibrate
        from types import SimpleNamespace
        # Runs cached before the reduce-scatter: every other replica got the whole bucket.
        cfg = SimpleNamespace(method="data_parallel", replicas=4, stages=1, devices=4)
        self.assertEqual(calibrate.traffic(cfg, [{"parameter_bytes": 100.0}]), (3, 300.0))
        # The reduce-scatter and all-gather: 2 (R - 1) / R of it, in 2 (R - 1) messages.
        cfg = SimpleNamespace(method="data_parallel", replicas=4, stages=1, devices=4,
                              exchange="reduce_scatter")
        self.assertEqual(calibrate.traffic(cfg, [{"parameter_bytes": 100.0}]), (6, 150.0))
        cfg = SimpleNamespace(method="gpipe", replicas=1, stages=4, devices=4)
        self.assertEqual(calibrate.traffic(cfg, [{"hop_bytes": 10.0}] * 4), (8, 80.0))

    def test_a_target_reached_after_the_budget_is_a_miss(self):
        from experiments.testbed import report
        from types import SimpleNamespace
        runs, prof = self.runs([1.2, 2e-3, 5e-4, 3e-9, 1.1])
        cfg, res = runs[0]
        # An evaluation every 100 s: 2.80 holds from 200 s, 2.65 from 400 s.
        values = [3.0, 2.9, 2.79, 2.7, 2.64, 2.6, 2.5, 2.4]
        res = {**res, "points": [{"step": 10 * k, "wall_seconds": 100.0 * k, "metrics": [v]}
                                 for k, v in enumerate(values)]}
        model = SimpleNamespace(targets=[2.8, 2.65], text=True, hold=1)
        def measured(max_seconds):
            rows = report.rows([(cfg, res)], model, prof, 16, None, max_seconds)
            return {r["target"]: r["measured_s"] for r in rows}
        self.assertEqual(measured(None), {2.8: "200.00", 2.65: "400.00"})
        self.assertEqual(measured(400), {2.8: "200.00", 2.65: "400.00"})
        self.assertEqual(measured(399), {2.8: "200.00", 2.65: ""})
        md = report.markdown(report.rows([(cfg, res)], model, prof, 16, None, 300), True, 300)
        self.assertIn("| 200 (1/1) | > 300 s (0/1) |", md)


class CrossoverTest(unittest.TestCase):
    """Where local parallelism overtakes backprop: the measured table names the fastest method
    of each side at each link, and the calibrated model's bands are where the two swap."""

    def test_the_bands_are_where_the_fastest_of_each_side_swap(self):
        from experiments.stats import median
        from experiments.testbed import calibrate, crossover
        truth = [1.2, 2e-3, 5e-4, 3e-9, 1.1]
        runs, prof = CalibrationTest().runs(truth)
        cal = calibrate.Calibration(runs, prof, lambda cfg: cfg.seed == 2)
        # Data parallelism and GPipe need 60 steps, the local rules 150 (and a fill of 1).
        steps = {"data_parallel": 60, "gpipe": 60, "CHUNKED": 150, "OVERLAP": 150}
        rows = []
        for cfg, _ in runs:
            fill = 1 if cfg.method in crossover.LOCAL else 0
            t = (steps[cfg.method] + fill) * calibrate.predict(
                truth, calibrate.features(cfg, prof[cfg.stages], 0.9))
            rows.append({"devices": 2, "link_mbit": cfg.link_mbit, "method": cfg.method,
                         "target": 2.0, "seed": cfg.seed, "measured_s": f"{t:.2f}",
                         "steps": steps[cfg.method]})
        md = crossover.markdown(rows, runs, cal, prof, True)
        times = crossover.ModelTimes(rows, runs, cal, prof, 2, 2.0)
        for link in (0, 1000, 100, 10):
            med = {m: median([float(r["measured_s"]) for r in rows
                              if r["link_mbit"] == link and r["method"] == m]) for m in steps}
            bp = min(("data_parallel", "gpipe"), key=med.get)
            lo = min(("CHUNKED", "OVERLAP"), key=med.get)
            ratio = med[bp] / med[lo]
            names = {"data_parallel": "data parallelism", "gpipe": "GPipe"}
            self.assertIn(f"| 2 | 2.00 bits/byte | {crossover.link_text(link)} | {names[bp]} "
                          f"{med[bp]:.0f} s | {lo} {med[lo]:.0f} s | {ratio:.2f}x: "
                          + ("local" if ratio > 1 else "backprop") + " |", md)
            # The model fitted on seed 2 gives back the measured times.
            for m in steps:
                self.assertAlmostEqual(times.seconds(m, link) / med[m], 1.0, places=2)
        ratios = [times.ratio(m) for m in crossover.GRID_MBIT]
        wins = crossover.runs_of(crossover.GRID_MBIT, [r > 1 for r in ratios])
        self.assertTrue(wins and wins != [(crossover.GRID_MBIT[0], crossover.GRID_MBIT[-1])],
                        f"no crossover to check: {ratios}")
        grid = crossover.GRID_MBIT
        for lo, hi in wins:  # each band's ends: local ahead inside, behind just outside
            i, j = grid.index(lo), grid.index(hi)
            self.assertTrue(ratios[i] > 1 and ratios[j] > 1)
            self.assertTrue(i == 0 or ratios[i - 1] <= 1)
            self.assertTrue(j == len(grid) - 1 or ratios[j + 1] <= 1)
        self.assertIn("- 2 devices, to 2.00 bits/byte: local parallelism is faster "
                      + crossover.band_text(wins), md)


class ShippedCacheTest(unittest.TestCase):
    """The committed caches answer for every run the shipped sweeps ask for."""

    @unittest.skipIf(LOCALPAR is None, "needs the localpar binary")
    def test_frontier_cache_answers_every_run_and_holds_nothing_stale(self):
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run(
                [sys.executable, os.path.join(SOURCE, "deploy", "frontier.py"),
                 os.path.join(SOURCE, "deploy", "experiments", "frontier.json"), "--out", out,
                 "--localpar", LOCALPAR, "--plan", "--cache",
                 os.path.join(SOURCE, "experiments", "cache", "frontier.jsonl")],
                capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("every run is done", r.stdout, r.stdout + r.stderr)
        self.assertNotIn("match no configuration", r.stderr)
        self.assertNotIn("profile", r.stdout, "a profile the sweep needs is not cached")

    @unittest.skipIf(LOCALPAR is None, "needs the localpar binary")
    def test_matrix_cache_answers_every_run_of_paper_and_lm_gap(self):
        for name in ("paper", "lm_gap"):
            with tempfile.TemporaryDirectory() as out:
                # A copy: what the runner adds (a job's FLOP count, say) stays out of the tree.
                cache = os.path.join(out, "matrix.jsonl")
                shutil.copy(os.path.join(SOURCE, "experiments", "cache", "matrix.jsonl"), cache)
                r = subprocess.run(
                    [sys.executable, os.path.join(SOURCE, "deploy", "experiment.py"),
                     os.path.join(SOURCE, "deploy", "experiments", f"{name}.json"), "--out",
                     out, "--localpar", LOCALPAR, "--done_only", "--cache", cache],
                    capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                md = open(os.path.join(out, "RESULTS.md")).read()
                self.assertNotIn("Not run yet", md, f"{name}: runs missing from the cache")


if __name__ == "__main__":
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    ok = result.wasSuccessful()
    print("package_test: ok" if ok else "package_test: FAILED")
    sys.exit(0 if ok else 1)
