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
  OVERLAP: activations forward and gradients back, as GPipe with M = 1.
Fitted parameters (all >= 0): a (compute scale), b (seconds a step), c (seconds a message),
e (seconds a byte of CPU work: serialising, copying), d (wire time scale). Synchronous methods
(data parallelism, GPipe) wait for their transfers: step = a compute + b + c messages +
e bytes + d wire. The local rules and OVERLAP overlap the next step's compute with the
transfer: step = max(a compute + b + c messages + e bytes, d wire). The fit minimises the
relative error of the measured seconds per step (the slope of wall time over steps, the
evaluations included).
"""

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
        m = cfg.devices
        return m * both, m * both * hop
    if cfg.method == "OVERLAP":
        return both, both * hop
    return 1, hop


def features(cfg, profile_stages, share):
    """The run's step as the model sees it: compute, messages, bytes, wire seconds."""
    keys = ("seconds", "head_seconds", "input_grad_seconds")
    scaled = [{**s, **{k: s.get(k, 0.0) / share for k in keys}} for s in profile_stages]
    cost = "pipelined_backprop" if cfg.method in PIPELINED else {
        "data_parallel": "data_parallel", "diloco_dp": "data_parallel",
        "OVERLAP": "overlap"}.get(cfg.method, "local")
    micro = cfg.devices if cfg.method in PIPELINED else 1
    compute = step_seconds(cost, scaled, 1, micro, math.inf, 0.0)
    messages, bytes_ = traffic(cfg, profile_stages)
    wire = bytes_ / (cfg.link_mbit * 1e6 / 8) if cfg.link_mbit else 0.0
    return {"compute": compute, "messages": messages, "bytes": bytes_, "wire": wire,
            "synchronous": cfg.method in SYNCHRONOUS}


def predict(params, f):
    a, b, c, e, d = params
    cpu = a * f["compute"] + b + c * f["messages"] + e * f["bytes"]
    return cpu + d * f["wire"] if f["synchronous"] else max(cpu, d * f["wire"])


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

    def __init__(self, results, profiles, in_fit):
        self.rows = []  # (cfg, features, measured step s, fitted?)
        for cfg, res in results:
            share = min(v for k, v in res["cpu_fractions"].items() if k != "coordinator")
            prof = profiles[cfg.stages]
            m = measured_step_seconds(res["points"])
            if m is None or m <= 0:
                continue
            self.rows.append((cfg, features(cfg, prof, share), m, bool(in_fit(cfg))))
        fitted = [(f, m) for _, f, m, used in self.rows if used]
        self.params = fit(fitted) if len(fitted) >= 5 else None

    def step_seconds(self, cfg, profile_stages, share):
        if self.params is None:
            return None
        return predict(self.params, features(cfg, profile_stages, share))

    def held_out(self):
        """[(cfg, measured step s, calibrated step s, relative error)] of the runs not fitted."""
        if self.params is None:
            return []
        return [(cfg, m, predict(self.params, f), predict(self.params, f) / m - 1.0)
                for cfg, f, m, used in self.rows if not used]

    def describe(self):
        if self.params is None:
            return "not fitted: fewer than 5 runs to fit"
        a, b, c, e, d = self.params
        return (f"compute x {a:.3f}, {1e3 * b:.3f} ms a step, {1e3 * c:.3f} ms a message, "
                f"{1e9 * e:.3f} ns a byte sent (CPU), wire time x {d:.3f}")
