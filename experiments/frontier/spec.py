"""A frontier sweep file (deploy/experiments/frontier.json):

  {
    "name": "frontier",
    "threads": 1,                 # CPU GEMM threads per training process
    "parallel": 2,                # training processes at once (they share the cores)
    "hardware": {"link_gbps": 100, "latency_us": 5},   # the cost model's interconnect
    "models": [{
      "job": "../jobs/fashion_mlp8.textproto",
      "targets": [0.86, 0.88],    # accuracy (higher is better) or bits per byte (lower)
      "batch_sizes": [32, 128, 512, 2048, 8192],
      "device_batch": 32,         # examples one device computes per step (the cost model)
      "device_batches": [16, 32, 64],   # the summary's sensitivity to device_batch
      "lr": {"base": 1e-3, "base_batch": 128, "factors": [0.5, 1, 2, 4]},
      "schedule": {"kind": "COSINE", "warmup_examples": 10000, "min_lr_fraction": 0.1,
                   "lengths": [600000, 1800000]},   # each run's length (the cosine's)
      "max_examples": 1800000,    # the budget (without a schedule: every run's length)
      "eval_every_examples": 4096, "hold": 2,  # reached when held 2 evaluations in a row
      "tune_seeds": [1],          # the seeds that choose each point's setting (default: seeds)
      "seeds": [2, 3, 4], "summary_seeds": [2, 3, 4, 5, 6],   # the seeds each point reports
      "equal_devices": 16,        # the summary's equal-device comparison
      "extend_edges": 2,          # a point that reaches its target at a setting on an edge
                                  # of the grid tries the next ones past it, up to 2 steps
      "reference_batch": 128,     # where the per-depth head plot and the depth check are
      "depth_check": true,        # the whole network and its first block, trained to the end
      "depth_only": false         # true: the depth check alone (targets that need no depth)
    }],
    "methods": [
      {"label": "data parallel", "rule": "BACKPROP", "stages": 1, "cost": "data_parallel"},
      {"label": "first block alone", "rule": "BACKPROP", "stages": 1, "first_stages": 1,
       "cost": "data_parallel"},                  # the shallow baseline
      {"label": "pipelined backprop K=8", "rule": "BACKPROP", "stages": 8,
       "cost": "pipelined_backprop", "train_stages": 1},
      {"label": "GREEDY K=4", "rule": "GREEDY", "stages": 4, "cost": "local"}, ...
      # More batch sizes for one method, and schedule lengths of its own at some of them:
      {"label": "data parallel", ..., "extra_batch_sizes": [2048],
       "lengths_at": {"1024": [786432, 1572864], "2048": [1572864]}}
    ],
    "profile_occasions": 5,       # each profile measured by this many runs of the sweep,
    "profile_gap_hours": 1,       # each at least this long after the last,
    "profile_tag": "depth",       # under keys of its own (not a borrowed sweep's profiles)
    "cluster_checks": [{"model": "fashion_mlp8", "method": "GREEDY K=4", "batch": 128,
                        "steps": 300, "stages": 2, "replicas": 1, "pin": false}]
  }
"""

import dataclasses
import os
from typing import Optional

from experiments import specfile as sf
from experiments.common import fail
from experiments.matrix.spec import RULES

COSTS = ("data_parallel", "pipelined_backprop", "local", "overlap")
LOCAL_RULES = ("GREEDY", "CHUNKED", "OVERLAP")
POSITIVE = "a positive integer is required"
POSITIVE_LIST = "a non-empty list of positive integers is required"


@dataclasses.dataclass
class LrGrid:
    base: float = sf.setting("a positive number", sf.positive_number)
    base_batch: float = sf.setting("a positive number", sf.positive_number)
    factors: list = sf.setting("a non-empty list of positive numbers", sf.positive_numbers)


@dataclasses.dataclass
class Schedule:
    kind: str = sf.setting("COSINE or CONSTANT", sf.one_of("COSINE", "CONSTANT"), "COSINE")
    warmup_examples: int = sf.setting("a number of examples >= 0", sf.whole, 0)
    min_lr_fraction: float = sf.setting(
        "a fraction of lr in [0, 1]",
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1, 0.0)
    lengths: Optional[list] = sf.setting(
        "a non-empty list of example counts is required", sf.positive_ints, None)


@dataclasses.dataclass
class Model:
    job: str = sf.setting("a job file path is required", sf.text)
    targets: list = sf.setting("a non-empty list of positive numbers is required",
                               sf.positive_numbers)
    batch_sizes: list = sf.setting(POSITIVE_LIST, sf.positive_ints)
    device_batch: int = sf.setting(POSITIVE, sf.positive_int)
    max_examples: int = sf.setting(POSITIVE, sf.positive_int)
    eval_every_examples: int = sf.setting(POSITIVE, sf.positive_int)
    lr: dict = sf.setting("needs base, base_batch and a non-empty factors list",
                          lambda v: isinstance(v, dict))
    schedule: Optional[dict] = sf.setting("an object (kind, warmup_examples, min_lr_fraction, "
                                          "lengths)", lambda v: isinstance(v, dict), None)
    seed: int = sf.setting(POSITIVE, sf.positive_int, 1)
    seeds: Optional[list] = sf.setting(POSITIVE_LIST, sf.positive_ints, None)
    summary_seeds: Optional[list] = sf.setting(POSITIVE_LIST, sf.positive_ints, None)
    tune_seeds: Optional[list] = sf.setting(POSITIVE_LIST, sf.positive_ints, None)
    hold: int = sf.setting(POSITIVE, sf.positive_int, 2)
    device_batches: Optional[list] = sf.setting(POSITIVE_LIST, sf.positive_ints, None)
    equal_devices: Optional[int] = sf.setting(POSITIVE, sf.positive_int, None)
    reference_batch: Optional[int] = sf.setting(POSITIVE, sf.positive_int, None)
    depth_check: bool = sf.setting("true or false", sf.boolean, True)
    depth_only: bool = sf.setting("true or false", sf.boolean, False)
    extend_edges: int = sf.setting("a number of grid steps >= 0", sf.whole, 0)
    label: Optional[str] = sf.setting("a name", sf.text, None)
    lengths: list = sf.derived(factory=list)  # every run length, in examples, sorted
    name: str = sf.derived("")
    data: dict = sf.derived(factory=dict)
    text: bool = sf.derived(False)
    normalized: object = sf.derived(None)  # the job as `localpar validate` fills it in
    jobs: dict = sf.derived(factory=dict)  # first_stages -> the cut job's path

    def better(self, a, b):
        """Whether metric `a` beats `b` (bits per byte: lower; accuracy: higher)."""
        return a < b if self.text else a > b


@dataclasses.dataclass
class Method:
    rule: str = sf.setting(f"must be one of {', '.join(RULES)}", sf.one_of(*RULES))
    cost: str = sf.setting(f"must be one of {', '.join(COSTS)}", sf.one_of(*COSTS))
    stages: int = sf.setting("must be a positive integer", sf.positive_int)
    train_stages: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    first_stages: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    label: Optional[str] = sf.setting("a name", sf.text, None)
    extra_batch_sizes: list = sf.setting(
        "a list of positive integers", lambda v: v == [] or sf.positive_ints(v), factory=list)
    lengths_at: dict = sf.setting(
        "an object from batch sizes (\"1024\") to non-empty lists of example counts",
        lambda v: isinstance(v, dict) and all(
            k.isdigit() and int(k) > 0 and sf.positive_ints(x) for k, x in v.items()),
        factory=dict)

    def batch_sizes(self, m):
        """The batch sizes this method runs on model `m`: the model's and its own."""
        return sorted(set(m.batch_sizes) | set(self.extra_batch_sizes))

    def lengths(self, m, batch):
        """The schedule lengths this method tries at `batch` (its own there, or the model's)."""
        own = self.lengths_at.get(str(batch))
        return sorted(own) if own else m.lengths


@dataclasses.dataclass
class Check:
    model: str = sf.setting("a model's name", sf.text)
    method: str = sf.setting("one of the methods' labels", sf.text)
    batch: int = sf.setting("batch and steps are required integers", sf.positive_int)
    steps: int = sf.setting("batch and steps are required integers", sf.positive_int)
    replicas: int = sf.setting(POSITIVE, sf.positive_int, 1)
    stages: Optional[int] = sf.setting(POSITIVE, sf.positive_int, None)
    pin: bool = sf.setting("true or false", sf.boolean, False)


@dataclasses.dataclass
class Hardware:
    link_gbps: float = sf.setting("a positive number", sf.positive_number, 100)
    latency_us: float = sf.setting("a number >= 0", lambda v: isinstance(
        v, (int, float)) and not isinstance(v, bool) and v >= 0, 5)

    @property
    def link_bytes_per_s(self):
        return self.link_gbps * 1e9 / 8

    @property
    def latency_s(self):
        return self.latency_us * 1e-6


@dataclasses.dataclass
class Spec:
    models: list = sf.setting("a non-empty list is required",
                              lambda v: isinstance(v, list) and bool(v))
    methods: list = sf.setting("a non-empty list is required",
                               lambda v: isinstance(v, list) and bool(v))
    name: str = sf.setting("a name", sf.text, "frontier")
    threads: int = sf.setting(POSITIVE, sf.positive_int, 1)
    parallel: int = sf.setting(POSITIVE, sf.positive_int, 1)
    hardware: dict = sf.setting("an object (link_gbps, latency_us)",
                                lambda v: isinstance(v, dict), factory=dict)
    cluster_checks: list = sf.setting("a list", lambda v: isinstance(v, list), factory=list)
    profile_occasions: int = sf.setting(POSITIVE, sf.positive_int, 1)
    profile_gap_hours: float = sf.setting("a number of hours >= 0", lambda v: isinstance(
        v, (int, float)) and not isinstance(v, bool) and v >= 0, 1)
    profile_tag: Optional[str] = sf.setting(
        "a name of letters, digits and _ (this sweep's own profiles, apart from a borrowed "
        "cache's)", lambda v: isinstance(v, str) and v.replace("_", "").isalnum(), None)

    def method(self, label):
        return next(a for a in self.methods if a.label == label)


def _model(data, base, where):
    m = sf.build(Model, data, where)
    m.job = sf.job_path(base, m.job, f"{where}.job")
    if any(b % m.device_batch for b in m.batch_sizes):
        fail(f"{where}.batch_sizes: each must be a multiple of device_batch ({m.device_batch})")
    m.lr = sf.build(LrGrid, m.lr, f"{where}.lr")
    m.seeds = m.seeds or [m.seed]
    m.summary_seeds = m.summary_seeds or m.seeds
    m.tune_seeds = m.tune_seeds or m.seeds
    m.device_batches = m.device_batches or [m.device_batch]
    if m.device_batch not in m.device_batches:
        m.device_batches = [m.device_batch] + m.device_batches
    if not set(m.seeds) <= set(m.summary_seeds):
        fail(f"{where}.summary_seeds: must include every seed of seeds")
    if m.schedule is not None:
        m.schedule = sf.build(Schedule, m.schedule, f"{where}.schedule")
        m.lengths = sorted(m.schedule.lengths or [m.max_examples])
        m.max_examples = max(m.lengths)
    else:
        m.lengths = [m.max_examples]
    if m.reference_batch is None:
        m.reference_batch = m.batch_sizes[0]
    if m.depth_only and not m.depth_check:
        fail(f"{where}.depth_only: needs depth_check")
    if m.reference_batch not in m.batch_sizes:
        fail(f"{where}.reference_batch: must be one of batch_sizes")
    return m


def load_spec(path):
    data, base = sf.load(path)
    spec = sf.build(Spec, data, path)
    spec.models = [_model(m, base, f"{path}: models[{i}]") for i, m in enumerate(spec.models)]
    spec.hardware = sf.build(Hardware, spec.hardware, f"{path}: hardware")
    labels = set()
    methods = []
    for i, data in enumerate(spec.methods):
        a = sf.build(Method, data, f"{path}: methods[{i}]")
        a.train_stages = a.train_stages or a.stages
        a.label = a.label or f"{a.rule} K={a.stages}"
        if a.label in labels:
            fail(f"{path}: methods[{i}].label: {a.label} appears twice")
        labels.add(a.label)
        for m in spec.models:
            if any(b % m.device_batch for b in a.extra_batch_sizes):
                fail(f"{path}: methods[{i}].extra_batch_sizes: each must be a multiple of "
                     f"{m.name or os.path.basename(m.job)}'s device_batch ({m.device_batch})")
        methods.append(a)
    spec.methods = methods
    checks = []
    for i, data in enumerate(spec.cluster_checks):
        where = f"{path}: cluster_checks[{i}]"
        c = sf.build(Check, data, where)
        if c.method not in labels:
            fail(f"{where}.method: not one of the methods' labels")
        if c.batch % c.replicas:
            fail(f"{where}.batch: must be a multiple of replicas ({c.replicas})")
        checks.append(c)
    spec.cluster_checks = checks
    return spec
