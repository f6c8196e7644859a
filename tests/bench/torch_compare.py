#!/usr/bin/env python3
"""localpar against PyTorch on the same network, batch, optimizer, data shape and threads.

  tests/bench/torch_compare.py [BUILD_DIR] [--rounds=N] [--cases=mlp,resnet]

For fashion_mlp and fashion_resnet (deploy/jobs), GREEDY and BACKPROP:
  - one core: `localpar train --threads=1` against a PyTorch twin, with both thread pools
    pinned (torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1: the first alone leaves
    OpenBLAS's own pool on every core);
  - two cores: `localpar run` (a local cluster, one worker per stage; wall time from the
    coordinator's start, its final evaluation included; the job's 4 stages or --stages=2,
    whichever is faster) against PyTorch's best two-core setting of the three tried.
Both sides must count the same parameters (batch norm's running statistics included), or
the benchmark stops: the twin is checked, not trusted.
The twin is built from the job file itself (proto/job.proto, parsed with protobuf), so it has
the job's layers and heads: GREEDY detaches each stage's output and trains every head on
its own stage; BACKPROP backpropagates the last head through everything and trains the
other heads on detached features, as localpar's BACKPROP does. Both sides run in turn,
`--rounds` times, on random data of the job's shape; each figure is the best round.
PyTorch is a benchmark-only dependency: Debian's python3-torch, installed here with apt when
missing (when that is impossible the benchmark says so and exits 0, skipped).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.abspath(__file__)


def ensure_torch():
    probe = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        return True
    print("torch_compare: installing Debian's python3-torch (a benchmark-only dependency)")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    inst = subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                                  "python3-torch"], env=dict(os.environ,
                                                             DEBIAN_FRONTEND="noninteractive"))
    return inst.returncode == 0 and subprocess.run(
        ["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0


def job_module(gen, generate=True):
    if generate:
        subprocess.run(["protoc", "-I", SOURCE, "--python_out", gen,
                        os.path.join(SOURCE, "proto", "job.proto"),
                        os.path.join(SOURCE, "proto", "options.proto")], check=True)
    sys.path.insert(0, gen)
    from proto import job_pb2  # noqa: E402
    return job_pb2


# ---- the PyTorch side (run in a child process, with its thread settings) ------------------

def torch_child(args):
    import torch
    from google.protobuf import text_format
    torch.set_num_threads(args.torch_threads)
    job_pb2 = job_module(args.gen, generate=False)
    job = job_pb2.Job()
    with open(args.job) as f:
        text_format.Parse(f.read(), job)
    nn = torch.nn

    def layer(spec, shape):  # shape: (C, H, W) or (F,)
        kind = spec.WhichOneof("kind")
        if kind == "linear":
            n = 1
            for d in shape:
                n *= d
            return nn.Sequential(nn.Flatten(), nn.Linear(n, spec.linear.out_features)), \
                (spec.linear.out_features,)
        if kind == "relu":
            return nn.ReLU(), shape
        if kind == "gelu":
            return nn.GELU(approximate="tanh"), shape
        if kind == "dropout":
            return nn.Dropout(spec.dropout.rate), shape
        if kind == "flatten":
            n = 1
            for d in shape:
                n *= d
            return nn.Flatten(), (n,)
        if kind == "conv2d":
            c = spec.conv2d
            k, s, p = c.kernel or 3, c.stride or 1, c.padding
            h = (shape[1] + 2 * p - k) // s + 1
            w = (shape[2] + 2 * p - k) // s + 1
            return nn.Conv2d(shape[0], c.out_channels, k, s, p), (c.out_channels, h, w)
        if kind == "batch_norm":
            return (nn.BatchNorm2d(shape[0]) if len(shape) == 3 else nn.BatchNorm1d(shape[0])), shape
        if kind == "layer_norm":
            return nn.LayerNorm(shape[-1]), shape
        if kind in ("max_pool", "avg_pool"):
            c = getattr(spec, kind)
            k = c.kernel or 2
            s = c.stride or k
            pool = (nn.MaxPool2d(k, s, c.padding) if kind == "max_pool"
                    else nn.AvgPool2d(k, s, c.padding, count_include_pad=True))
            return pool, (shape[0], (shape[1] + 2 * c.padding - k) // s + 1,
                          (shape[2] + 2 * c.padding - k) // s + 1)
        if kind == "global_avg_pool":
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), (shape[0],)
        if kind == "residual":
            body, cur = [], shape
            for b in spec.residual.body:
                m, cur = layer(b, cur)
                body.append(m)

            class Residual(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = nn.Sequential(*body)

                def forward(self, x):
                    return x + self.body(x)
            return Residual(), shape
        raise SystemExit(f"torch_compare: no twin for layer kind {kind}")

    def head(spec, shape, classes):
        kind = job_pb2.Head.Kind.Name(spec.kind)
        mods = []
        if kind == "POOL_LINEAR" and len(shape) == 3:
            mods, shape = [nn.AdaptiveAvgPool2d(1), nn.Flatten()], (shape[0],)
        elif kind == "MLP":
            n = 1
            for d in shape:
                n *= d
            mods, shape = [nn.Flatten(), nn.Linear(n, spec.hidden or 256), nn.ReLU()], \
                (spec.hidden or 256,)
        elif kind == "CONV_POOL_LINEAR":
            ch = spec.channels or 32
            mods = [nn.Conv2d(shape[0], ch, 3, 1, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten()]
            shape = (ch,)
        n = 1
        for d in shape:
            n *= d
        return nn.Sequential(*mods, nn.Flatten(), nn.Linear(n, classes))

    shape = (1, 28, 28)
    stages, heads = [], []
    for st in job.stages:
        mods = []
        for spec in st.layers:
            m, shape = layer(spec, shape)
            mods.append(m)
        stages.append(nn.Sequential(*mods))
        heads.append(head(st.head, shape, 10))
    params = [p for m in stages + heads for p in m.parameters()]
    # localpar counts batch norm's running statistics among a stage's parameters; PyTorch
    # keeps them as buffers.
    counted = sum(p.numel() for p in params) + sum(
        b.numel() for m in stages + heads for name, b in m.named_buffers()
        if name.endswith(("running_mean", "running_var")))
    adamw = job.optimizer.adamw
    opt = torch.optim.AdamW(params, lr=job.schedule.lr or 1e-3,
                            weight_decay=adamw.weight_decay, betas=(0.9, 0.999), eps=1e-8)
    xent = nn.CrossEntropyLoss()
    batch = job.batch_size or 128
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    greedy = args.rule == "GREEDY"

    def step():
        opt.zero_grad(set_to_none=True)
        h, loss = x, 0
        for k, (stage, hd) in enumerate(zip(stages, heads)):
            h = stage(h)
            last = k == len(stages) - 1
            if greedy:
                loss = loss + xent(hd(h), y)
                h = h.detach()
            else:  # BACKPROP: the last head through everything, the others as probes
                loss = loss + xent(hd(h if last else h.detach()), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    t = time.perf_counter()
    for _ in range(args.steps):
        step()
    print(json.dumps({"examples_per_second": args.steps * batch / (time.perf_counter() - t),
                      "parameters": counted}))


def torch_rate(gen, job, rule, steps, threads, openblas):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(openblas), OMP_NUM_THREADS=str(threads))
    p = subprocess.run(["/usr/bin/python3", SCRIPT, "--child", f"--gen={gen}", f"--job={job}",
                        f"--rule={rule}", f"--steps={steps}", f"--torch_threads={threads}"],
                       capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"torch_compare: PyTorch failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- the localpar side --------------------------------------------------------------------

def localpar_rate(build, work, job, rule, steps, command, extra=()):
    out = os.path.join(work, f"lp-{command}-{rule}-{time.time_ns()}")
    args = [os.path.join(build, "localpar"), command, job, f"--rule={rule}",
            f"--max_steps={steps}", f"--out={out}", "--quiet", "--threads=1", *extra]
    p = subprocess.run(args, capture_output=True, text=True,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"torch_compare: {' '.join(args)} exited {p.returncode}:\n"
                         f"{p.stderr[-3000:]}")
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build/ci")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default="mlp,resnet")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--gen"), ap.add_argument("--job"), ap.add_argument("--rule")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--torch_threads", type=int, default=1)
    args = ap.parse_args()
    if args.child:
        torch_child(args)
        return 0
    if not ensure_torch():
        print("torch_compare: skipped: PyTorch (python3-torch) is not installed and could not be")
        return 0
    build = os.path.abspath(args.build)
    work = tempfile.mkdtemp(prefix="localpar-torch-")
    try:
        gen = os.path.join(work, "gen")
        os.makedirs(gen)
        job_module(gen)
        rows = []
        for case in args.cases.split(","):
            src = os.path.join(SOURCE, "deploy", "jobs", f"fashion_{case}.textproto")
            job = os.path.join(work, f"fashion_{case}.textproto")
            with open(src) as f:  # one small evaluation at the end, not 10,000 examples
                text = f.read()
            with open(job, "w") as f:
                f.write(text + "\neval_limit: 128\n")
            steps = 60 if case == "mlp" else 12
            for rule in ("GREEDY", "BACKPROP"):
                best = {"lp1": 0, "pt1": 0, "lp2": 0, "pt2": 0}
                best_setting, lp_setting = "", ""
                for _ in range(args.rounds):
                    lp = localpar_rate(build, work, job, rule, steps, "train")
                    pt = torch_rate(gen, job, rule, steps, 1, 1)
                    if lp["parameters"] != pt["parameters"]:
                        raise SystemExit(f"torch_compare: the PyTorch twin of {case} has "
                                         f"{pt['parameters']} parameters, localpar's network "
                                         f"{lp['parameters']:.0f}: not the same network")
                    best["lp1"] = max(best["lp1"], lp["examples_per_second"])
                    best["pt1"] = max(best["pt1"], pt["examples_per_second"])
                    # The job's 4 stages, or regrouped into 2 (one worker per core).
                    for extra, name in (((), "4 workers"), (("--stages=2",), "--stages=2")):
                        r = localpar_rate(build, work, job, rule, 3 * steps, "run",
                                          extra)["examples_per_second"]
                        if r > best["lp2"]:
                            best["lp2"], lp_setting = r, name
                    for threads, openblas, name in (
                            (1, 2, "1 torch thread, OpenBLAS's default pool"),
                            (2, 1, "2 torch threads, 1 OpenBLAS thread"),
                            (2, 2, "2 threads each")):
                        r = torch_rate(gen, job, rule, steps, threads,
                                       openblas)["examples_per_second"]
                        if r > best["pt2"]:
                            best["pt2"], best_setting = r, name
                rows.append((case, rule, best, best_setting, lp_setting))
                print(f"torch_compare: fashion_{case} {rule}: one core localpar "
                      f"{best['lp1']:.0f} / PyTorch {best['pt1']:.0f} ex/s = "
                      f"{best['lp1'] / best['pt1']:.2f}x; two cores localpar run "
                      f"{best['lp2']:.0f} ({lp_setting}) / PyTorch {best['pt2']:.0f} "
                      f"({best_setting}) = {best['lp2'] / best['pt2']:.2f}x", flush=True)
        print("\n| network | rule | 1 core: localpar | PyTorch | ratio | 2 cores: localpar run "
              "| PyTorch best | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for case, rule, b, setting, lp_setting in rows:
            print(f"| fashion_{case} | {rule} | {b['lp1']:.0f} | {b['pt1']:.0f} | "
                  f"**{b['lp1'] / b['pt1']:.2f}×** | {b['lp2']:.0f} ({lp_setting}) | "
                  f"{b['pt2']:.0f} ({setting}) | **{b['lp2'] / b['pt2']:.2f}×** |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
