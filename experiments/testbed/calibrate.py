"""The calibrated cost model: the frontier's model of a step plus what it leaves out, fitted
on some measured testbed runs and checked on the others.

A step of run r is modelled from what the run sends and computes:
  compute   the frontier model's compute time of a step on the device's share of a core
            (its profile, scaled by 1 / share, the link taken as infinitely fast);
  messages  messages the busiest device sends a step;
  bytes     bytes the busiest device sends a step (its egress is what `tc tbf` shapes);
  wire      bytes / the link's rate (0 on unshaped links).
What each method sends, per step, from the busiest device:
  data parallelism, R replicas: the replica mesh's reduce-scatter and all-gather, 2 (R - 1) / R
    x the parameters in 2 (R - 1) messages (as the frontier model's ring all-reduce); runs
    measured before it (Config.exchange unset) gathered every replica's gradient bucket at
    every other replica, (R - 1) x the parameters in R - 1 messages;
  GPipe, K stages, M micro-batches: M activations forward and M gradients back, a middle
    stage sending both (K = 2: one direction each);
  CHUNKED and GREEDY: one batch of activations forward;
  OVERLAP: activations forward and gradients back, as GPipe with M = 1;
  and a local rule's stage with R replicas (the frontier's points) also its exchange.
Fitted parameters (all >= 0): a (compute scale), b (seconds a step), c (seconds a message),
e (seconds a byte of CPU work: serialising, copying), d (wire time scale). Synchronous methods
(data parallelism, GPipe) wait for their transfers: step = a compute + b + c messages +
e bytes + d wire. So does OVERLAP, whose stage waits for the next stage's gradient of the
batch it sent: its wire time is the round trip, a batch of activations one way and its
gradient back (measured at 2 devices and 100 Mbit/s: 20.3 ms a step against 11.4 unshaped,
the 2 x 5.2 ms of the round trip). The local rules overlap the next step's compute with the
transfer: step = max(a compute + b + c messages + e bytes, d wire).
Evaluations are part of the measured time, so the model adds theirs, spread over the steps
between two of them (Evaluation): the job scores `limit` held-out examples in batches of
`batch`, forward only (taken as a third of a training step's compute a row). A run of K >= 2
stages sends each batch's activations over each of its K - 1 hops: a pipeline of K forwards
(C each) and K - 1 transfers (W each) that takes K C + (K - 1) W + (batches - 1) max(C, W)
(on a 10 Mbit/s link, 4 CHUNKED stages spend 9 s on each evaluation of 2,048 windows, 31% of
the run); data parallelism splits each batch between its replicas and sends nothing between
them: batches x C. The fit minimises the relative error of the measured seconds per step (the
slope of wall time over steps, the evaluations included).
"""

import dataclasses
import math

from experiments.frontier.model import step_seconds

SYNCHRONOUS = ("data_parallel", "gpipe", "1f1b", "zb")
PIPELINED = ("gpipe", "1f1b", "zb")


def measured_step_seconds(points):
    """Seconds a step: the least-squares slope of wall time over steps, after the first
    point (start-up)."""
    pts = [(p["step"], p["wall_seconds"]) for p in points[1:]]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(s for s, _ in pts) / n
    my = sum(w for _, w in pts) / n
    sxx = sum((s - mx) ** 2 for s, _ in pts)
    if sxx == 0:
        return None
    return sum((s - mx) * (w - my) for s, w in pts) / sxx


def replica_traffic(cfg, parameter_bytes):
    """(messages, bytes) a replica sends its stage's other replicas a step: every step, or
    (DiLoCo) one synchronisation every cfg.sync_every steps."""
    if cfg.replicas < 2:
        return 0, 0.0
    if getattr(cfg, "exchange", None) == "reduce_scatter":
        messages, bytes_ = 2 * (cfg.replicas - 1), 2.0 * (cfg.replicas - 1) / cfg.replicas
    else:
        messages, bytes_ = cfg.replicas - 1, float(cfg.replicas - 1)
    every = getattr(cfg, "sync_every", None) or 1
    return messages / every, bytes_ * parameter_bytes / every


def traffic(cfg, profile_stages):
    """(messages, bytes) the busiest device sends a step."""
    if cfg.method in ("data_parallel", "diloco_dp"):
        return replica_traffic(cfg, sum(s["parameter_bytes"] for s in profile_stages))
    if cfg.method == "local_diloco":  # each stage's hop, and its replicas' synchronisation
        hop = max(s.get("hop_bytes", 0.0) for s in profile_stages)
        m, b = replica_traffic(cfg, max(s["parameter_bytes"] for s in profile_stages))
        return 1 + m, hop + b
    hop = max(s.get("hop_bytes", 0.0) for s in profile_stages)
    k = cfg.stages
    both = 2 if k > 2 else 1  # a middle stage sends both ways
    if cfg.method in PIPELINED:
        m = micro_batches(cfg)
        return m * both, m * both * hop
    # A local rule's or OVERLAP's stage with replicas also averages them every step.
    m, b = replica_traffic(cfg, max(s["parameter_bytes"] for s in profile_stages))
    if cfg.method == "OVERLAP":
        return both + m, both * hop + b
    return 1 + m, hop + b


def micro_batches(cfg):
    """A pipeline's micro-batches: the testbed's runs cut the batch into one per device."""
    return getattr(cfg, "micro_batches", None) or cfg.devices


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What one evaluation scores: `limit` held-out examples in batches of `batch`; profiles
    are measured at `profile_batch` rows."""
    limit: int
    batch: int
    profile_batch: int


def evaluation_features(cfg, profile_stages, share, ev):
    """One evaluation as the model sees it: its batches and the devices each batch passes,
    and a device's forward seconds, bytes sent and wire seconds for one batch."""
    reps = cfg.replicas or 1
    rows = ev.batch / reps  # a replica's share of each batch
    per_row = [(s["seconds"] + s["head_seconds"]) / 3 / share / ev.profile_batch
               for s in profile_stages]
    batches = math.ceil(ev.limit / ev.batch)
    if cfg.method in ("data_parallel", "diloco_dp") or cfg.stages < 2:
        passes, compute, bytes_ = 1, sum(per_row) * rows, 0.0
    else:
        hop = max(s.get("hop_bytes", 0.0) for s in profile_stages) / ev.profile_batch
        passes, compute, bytes_ = cfg.stages, max(per_row) * rows, hop * rows
    wire = bytes_ / (cfg.link_mbit * 1e6 / 8) if cfg.link_mbit else 0.0
    return {"eval_batches": batches, "eval_stages": passes, "eval_compute": compute,
            "eval_bytes": bytes_, "eval_wire": wire, "eval_every": cfg.eval_every_steps}


def features(cfg, profile_stages, share, evaluation=None):
    """The run's step as the model sees it: compute, messages, bytes, wire seconds, and (with
    `evaluation`) its evaluations'."""
    keys = ("seconds", "head_seconds", "input_grad_seconds")
    scaled = [{**s, **{k: s.get(k, 0.0) / share for k in keys}} for s in profile_stages]
    cost = "pipelined_backprop" if cfg.method in PIPELINED else {
        "data_parallel": "data_parallel", "diloco_dp": "data_parallel",
        "OVERLAP": "overlap"}.get(cfg.method, "local")
    micro = micro_batches(cfg) if cfg.method in PIPELINED else 1
    compute = step_seconds(cost, scaled, 1, micro, math.inf, 0.0)
    messages, bytes_ = traffic(cfg, profile_stages)
    rate = cfg.link_mbit * 1e6 / 8 if cfg.link_mbit else math.inf
    wire = bytes_ / rate
    if cfg.method == "OVERLAP":  # the round trip (activations there, their gradient back)
        hop = max(s.get("hop_bytes", 0.0) for s in profile_stages)  # and any exchange
        exchange = replica_traffic(cfg, max(s["parameter_bytes"] for s in profile_stages))[1]
        wire = (2 * hop + exchange) / rate
    f = {"compute": compute, "messages": messages, "bytes": bytes_, "wire": wire,
         "synchronous": cfg.method in SYNCHRONOUS or cfg.method == "OVERLAP"}
    if evaluation is not None and cfg.eval_every_steps:
        f.update(evaluation_features(cfg, profile_stages, share, evaluation))
    return f


def predict(params, f, evaluations=True):
    """Seconds a step; with `evaluations`, the step's share of the evaluations too."""
    a, b, c, e, d = params
    cpu = a * f["compute"] + b + c * f["messages"] + e * f["bytes"]
    step = cpu + d * f["wire"] if f["synchronous"] else max(cpu, d * f["wire"])
    if evaluations and "eval_batches" in f:
        fwd, hop, k = a * f["eval_compute"] + c + e * f["eval_bytes"], d * f["eval_wire"], \
            f["eval_stages"]
        one = k * fwd + (k - 1) * hop + (f["eval_batches"] - 1) * max(fwd, hop)
        step += one / f["eval_every"]
    return step


def fit(samples):
    """Fits (a, b, c, e, d) to [(features, measured seconds a step)]; returns them."""
    from scipy.optimize import least_squares

    def residuals(p):
        return [predict(p, f) / m - 1.0 for f, m in samples]
    start = [1.0, 1e-3, 1e-4, 1e-9, 1.0]
    scale = [1.0, 1e-3, 1e-4, 1e-9, 1.0]
    r = least_squares(residuals, start, bounds=([0] * 5, [math.inf] * 5), x_scale=scale)
    return list(r.x)


class Calibration:
    """Fitted on the runs `in_fit(cfg)` picks, checked on the rest."""

    def __init__(self, results, profiles, in_fit, evaluation=None):
        self.evaluation = evaluation
        self.rows = []  # (cfg, features, measured step s, fitted?)
        for cfg, res in results:
            share = min(v for k, v in res["cpu_fractions"].items() if k != "coordinator")
            prof = profiles[cfg.stages]
            m = measured_step_seconds(res["points"])
            if m is None or m <= 0:
                continue
            self.rows.append((cfg, features(cfg, prof, share, evaluation), m,
                              bool(in_fit(cfg))))
        fitted = [(f, m) for _, f, m, used in self.rows if used]
        self.params = fit(fitted) if len(fitted) >= 5 else None

    def step_seconds(self, cfg, profile_stages, share, evaluations=True):
        """Seconds a step of `cfg`, its evaluations' share included unless `evaluations` is
        False."""
        if self.params is None:
            return None
        f = features(cfg, profile_stages, share, self.evaluation)
        return predict(self.params, f, evaluations)

    def held_out(self):
        """[(cfg, measured step s, calibrated step s, relative error)] of the runs not fitted."""
        if self.params is None:
            return []
        return [(cfg, m, predict(self.params, f), predict(self.params, f) / m - 1.0)
                for cfg, f, m, used in self.rows if not used]

    def evaluation_shares(self):
        """[(cfg, the share of its time the model gives its evaluations)] for every run."""
        if self.params is None or self.evaluation is None:
            return []
        return [(cfg, 1.0 - predict(self.params, f, False) / predict(self.params, f))
                for cfg, f, _, _ in self.rows]

    def describe(self):
        if self.params is None:
            return "not fitted: fewer than 5 runs to fit"
        a, b, c, e, d = self.params
        ev = self.evaluation
        evals = (f"evaluations of {ev.limit} examples in batches of {ev.batch} modelled"
                 if ev else "evaluations not modelled")
        return (f"compute x {a:.3f}, {1e3 * b:.3f} ms a step, {1e3 * c:.3f} ms a message, "
                f"{1e9 * e:.3f} ns a byte sent (CPU), wire time x {d:.3f}; {evals}")
