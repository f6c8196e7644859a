"""A testbed sweep (deploy/experiments/testbed.json): measured time to target at equal
devices, on the frontier's model, for every method, device count, link and seed.

  {
    "name": "testbed",
    "frontier": "frontier.json",      # the model's job, targets, schedule, evaluation cadence
    "model": "fortunes_charlm8",      # and learning-rate grid come from this frontier sweep
    "devices": [2, 4],
    "links_mbit": [0, 1000, 100, 10], # 0: unshaped
    "methods": ["data_parallel", "gpipe", "CHUNKED", "GREEDY", "OVERLAP"],
    "device_batch": 16,               # rows one device computes per step (the frontier's)
    "tune_seeds": [1], "seeds": [2, 3, 4],
    "length": 393216,                 # each run's schedule length and budget, in examples
    "length_by_batch": {"64": 786432},# a longer one at the batches that need it
    "coordinator_cpu": 0.25,          # the coordinator's share of a core where quotas apply
    "max_seconds": 1800,              # a run still short of its target then is a miss
    "recompute_frontier": true        # RESULTS.md's section also times the frontier's
  }                                   # points with the calibrated model

At N devices every method keeps each device at `device_batch` rows a step: data parallelism
and GPipe train batches of N x device_batch, a local rule with N stages batches of
device_batch. Larger batches take more examples to reach a target: `length_by_batch` gives
the batches that need it a longer schedule (and budget), so that no baseline misses for want of
examples. Each method's learning rate is tuned on the tune seeds with the reference
trainer (untimed; the frontier's own tuning runs answer where they are the same run), for the
strictest target, over the frontier model's grid.
"""

import dataclasses
from typing import Optional

from experiments import specfile as sf
from experiments.testbed.methods import METHODS


@dataclasses.dataclass
class Spec:
    frontier: str = sf.setting("the frontier sweep file that holds the model", sf.text)
    model: str = sf.setting("the name of a model of that frontier sweep", sf.text)
    devices: list = sf.setting("a non-empty list of positive integers", sf.positive_ints)
    links_mbit: list = sf.setting(
        "a non-empty list of rates in Mbit/s (0: unshaped)",
        lambda v: isinstance(v, list) and bool(v) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in v))
    methods: list = sf.setting(f"a list of {', '.join(METHODS)}",
                               lambda v: isinstance(v, list) and bool(v)
                               and all(m in METHODS for m in v))
    name: str = sf.setting("a name", sf.text, "testbed")
    device_batch: int = sf.setting("a positive integer", sf.positive_int, 16)
    tune_seeds: list = sf.setting("a non-empty list of positive integers", sf.positive_ints,
                                  factory=lambda: [1])
    seeds: list = sf.setting("a non-empty list of positive integers", sf.positive_ints,
                             factory=lambda: [2, 3, 4])
    length: Optional[int] = sf.setting("a number of examples", sf.positive_int, None)
    length_by_batch: dict = sf.setting(
        "an object from batch sizes (as strings) to numbers of examples",
        lambda v: isinstance(v, dict) and all(
            k.isdigit() and int(k) > 0 and sf.positive_int(x) for k, x in v.items()),
        factory=dict)
    coordinator_cpu: float = sf.setting("a fraction of a core in (0, 1]",
                                        lambda v: isinstance(v, (int, float)) and 0 < v <= 1, 0.25)
    max_seconds: float = sf.setting("a positive number of seconds", sf.positive_number, 1800)
    recompute_frontier: bool = sf.setting("true or false", sf.boolean, False)


def load_spec(path):
    data, base = sf.load(path)
    spec = sf.build(Spec, data, path)
    spec.frontier = sf.job_path(base, spec.frontier, f"{path}: frontier")
    spec.length_by_batch = {int(k): x for k, x in spec.length_by_batch.items()}
    if set(spec.tune_seeds) & set(spec.seeds):
        from experiments.common import fail
        fail(f"{path}: seeds: must be fresh, none of tune_seeds {spec.tune_seeds}")
    return spec
