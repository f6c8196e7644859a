"""An experiment matrix (deploy/experiments/paper.json, lm_gap.json): models x arms x seeds.

  {
    "name": "paper",
    "threads": 1,                                   # CPU GEMM threads per process
    "models": [{"job": "../jobs/fashion_resnet.textproto", "epochs": 2}, ...],
    "arms": [{"rule": "BACKPROP"}, {"rule": "CHUNKED", "stages": 2}, ...],
    "seeds": [1],
    "trainer": "cluster",                           # or "reference"
    "parallel": 1,                                  # runs at once
    "tune": {"lrs": [0.001, 0.002], "seeds": [1]}   # optional: a learning-rate grid
  }
"""

import dataclasses
import os
import re
from typing import Optional

from experiments import specfile as sf
from experiments.common import fail

RULES = ("BACKPROP", "GREEDY", "CHUNKED", "OVERLAP")
LR = "a learning rate between 0 and 10"


@dataclasses.dataclass
class Model:
    job: str = sf.setting("a job file path", sf.text)
    epochs: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    max_steps: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    # The peak learning rate (`--lr`) of every arm on this model that sets none of its own
    # (a rate tuned once, in another experiment, reused here).
    lr: Optional[float] = sf.setting(LR, sf.learning_rate, None)
    seeds: Optional[list] = sf.setting("a non-empty list of integers >= 0", sf.seeds, None)
    label: Optional[str] = sf.setting("a name", sf.text, None)
    # The batch (`--batch_size`) and stage replicas (`--replicas`) of every run on it.
    batch_size: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    replicas: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    name: str = sf.derived("")  # the label, else the job's name
    data: dict = sf.derived(factory=dict)  # `localpar data`'s figures
    text: bool = sf.derived(False)  # a language model (bits per byte, lower is better)

    def budget_flags(self):
        return [f"--{k}={getattr(self, k)}"
                for k in ("epochs", "max_steps", "batch_size", "replicas")
                if getattr(self, k) is not None]


@dataclasses.dataclass
class Arm:
    rule: str = sf.setting(f"must be one of {', '.join(RULES)}", sf.one_of(*RULES))
    stages: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    # A variant of the model's job (its own heads, learning rates per stage), under a label.
    job: Optional[str] = sf.setting("a job file path", sf.text, None)
    lr: Optional[float] = sf.setting(LR, sf.learning_rate, None)
    # Replicas that synchronise every N steps (`--sync_every`, DiLoCo); the model sets
    # the replicas.
    sync_every: Optional[int] = sf.setting("must be a positive integer", sf.positive_int, None)
    # With sync_every: the pseudo-gradients cross as bfloat16 (`--sync_bf16`).
    sync_bf16: Optional[bool] = sf.setting("true or false", sf.boolean, None)
    label: Optional[str] = sf.setting(
        "letters, digits and _.+/=- only",
        lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.+/=-]+", v) is not None,
        None)

    @property
    def name(self):
        if self.label is not None:
            return self.label
        return self.rule + (f"/{self.stages}" if self.stages is not None else "")


@dataclasses.dataclass
class Tune:
    lrs: list = sf.setting("a list of at least 2 learning rates between 0 and 10",
                           lambda v: isinstance(v, list) and len(v) >= 2
                           and all(sf.learning_rate(x) for x in v))
    seeds: list = sf.setting("a non-empty list of integers >= 0", sf.seeds, factory=lambda: [1])


@dataclasses.dataclass
class Spec:
    models: list = sf.setting("a non-empty list is required",
                              lambda v: isinstance(v, list) and bool(v))
    arms: list = sf.setting("a non-empty list is required",
                            lambda v: isinstance(v, list) and bool(v))
    name: str = sf.setting("a name", sf.text, "")
    threads: int = sf.setting("a positive integer", sf.positive_int, 1)
    device: str = sf.setting("a device name (cpu, cuda)", sf.text, "cpu")
    trainer: str = sf.setting("must be cluster or reference",
                              sf.one_of("cluster", "reference"), "cluster")
    parallel: int = sf.setting("must be a positive integer", sf.positive_int, 1)
    seeds: list = sf.setting("a non-empty list of integers >= 0", sf.seeds,
                             factory=lambda: [1])
    tune: Optional[dict] = sf.setting("an object with lrs (and seeds)",
                                      lambda v: isinstance(v, dict), None)

    def model_seeds(self, model):
        return model.seeds if model.seeds is not None else self.seeds


def load_spec(path):
    data, base = sf.load(path)
    spec = sf.build(Spec, data, path)
    spec.models = [sf.build(Model, m, f"{path}: models[{i}]") for i, m in enumerate(spec.models)]
    spec.arms = [sf.build(Arm, a, f"{path}: arms[{i}]") for i, a in enumerate(spec.arms)]
    if spec.tune is not None:
        spec.tune = sf.build(Tune, spec.tune, f"{path}: tune")
        spec.tune.lrs = sorted(spec.tune.lrs)
    for i, m in enumerate(spec.models):
        m.job = sf.job_path(base, m.job, f"{path}: models[{i}].job")
        if m.lr is not None and spec.tune is not None:
            fail(f"{path}: models[{i}].lr: a fixed rate and tune exclude each other")
    for i, a in enumerate(spec.arms):
        where = f"{path}: arms[{i}]"
        if a.job is not None:
            if a.label is None:
                fail(f"{where}: an arm's job needs a label")
            if len(spec.models) != 1:
                fail(f"{where}.job: a variant job needs a spec with one model")
            a.job = sf.job_path(base, a.job, f"{where}.job")
        if a.lr is not None and a.label is None:
            fail(f"{where}: an arm's lr needs a label")
        if a.sync_every is not None and a.label is None:
            fail(f"{where}: an arm's sync_every needs a label")
        if a.sync_bf16 and a.sync_every is None:
            fail(f"{where}.sync_bf16: applies only with sync_every")
    if not spec.name:
        spec.name = os.path.splitext(os.path.basename(path))[0]
    return spec
