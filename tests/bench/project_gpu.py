#!/usr/bin/env python3
"""Projected pipeline throughput for 8 to 64 GPU stages over 25, 100 and 400 Gbit/s links.

The same model as `localpar project` (PredictExamplesPerSecond in common/job/plan.cc): a
batch leaves the pipeline every max over stages of max(compute, latency + bytes/bandwidth),
because each worker sends on its own thread while it computes the next batch. Stages are
identical wide blocks (4 x Linear WIDTH, batch BATCH, activations sent as bf16), so the
answer per stage count K is the speedup over one GPU running all K blocks in turn:
K * compute / period. The per-stage compute time is an input: measure it with
`tests/gpu/run.sh` (step_bench --device=cuda --width=8192 --batch=1024) and pass it with
--stage_ms; the default assumes the H200 sustains 700 TFLOP/s bf16 on these GEMMs.
"""

import argparse


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4, help="Linear layers per stage")
    p.add_argument("--tflops", type=float, default=700.0, help="sustained GEMM rate, TFLOP/s")
    p.add_argument("--stage_ms", type=float, default=0.0,
                   help="measured per-stage step time in ms (overrides --tflops)")
    p.add_argument("--latency_us", type=float, default=10.0, help="per-hop latency")
    p.add_argument("--bytes_per_value", type=float, default=2.0, help="2 for bf16 on the wire")
    a = p.parse_args()
    flops = 3 * 2 * a.batch * a.width * a.width * a.layers  # forward + two backward GEMMs
    compute = a.stage_ms / 1e3 if a.stage_ms > 0 else flops / (a.tflops * 1e12)
    hop = a.batch * a.width * a.bytes_per_value
    print(f"stage: {a.layers} x Linear {a.width}, batch {a.batch}; compute {1e3 * compute:.2f} ms "
          f"per batch; {hop / 2**20:.0f} MiB per hop; latency {a.latency_us:.0f} us")
    print("link Gbit/s  transfer ms  " + "  ".join(f"K={k:<3d}" for k in (8, 16, 32, 64)) +
          "  (speedup over one GPU; efficiency = speedup / K)")
    for gbps in (25, 100, 400):
        transfer = a.latency_us * 1e-6 + hop / (gbps * 1e9 / 8)
        period = max(compute, transfer)
        cells = "  ".join(f"{k * compute / period:5.1f}" for k in (8, 16, 32, 64))
        print(f"{gbps:11d}  {1e3 * transfer:11.2f}  {cells}  efficiency {compute / period:.2f}")


if __name__ == "__main__":
    main()
