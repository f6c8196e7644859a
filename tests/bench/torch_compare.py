#!/usr/bin/env python3
"""localpar against PyTorch on the same network, batch, optimizer, data shape and threads.

  tests/bench/torch_compare.py [BUILD_DIR] [--rounds=N] [--cases=mlp,resnet,charlm]

For fashion_mlp, fashion_resnet and shakespeare_char (deploy/jobs), GREEDY and BACKPROP
(shakespeare_char's BACKPROP on one core as one stage: nanoGPT's own model):
  - one core: `localpar train --threads=1` against a PyTorch twin, with both thread pools
    pinned (torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1: the first alone leaves
    OpenBLAS's own pool on every core);
  - two cores: `localpar run` (a local cluster, one worker per stage; wall time from the
    coordinator's start, its final evaluation included; the fastest of the settings in
    `two_core_settings`: the job's 4 stages or --stages=2, and for BACKPROP micro-batches
    under 1F1B and ZB) against PyTorch's best two-core setting of the three tried.
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
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT))),
                                    "python"))
    import localpar_torch  # noqa: E402

    # The data's shape and classes: token windows for a language model, images otherwise.
    source = job.data.WhichOneof("source")
    if source in ("text", "tokens"):
        seq = getattr(job.data, source).seq_len or 64
        classes = 256 if source == "text" else job.data.tokens.vocab
        input_shape = (seq,)
    else:
        classes, input_shape = 10, (28, 28, 1)
    # The twin needs the head sizes localpar fills in when the job leaves them out.
    for st in job.stages:
        if st.head.kind == job_pb2.Head.MLP and not st.head.hidden:
            st.head.hidden = 256
        if st.head.kind == job_pb2.Head.CONV_POOL_LINEAR and not st.head.channels:
            st.head.channels = 32
    twin, sequence = localpar_torch.build(torch, job, classes, input_shape, job_pb2)
    stages, heads = twin.stage_modules(), twin.head_modules()
    params = [p for m in stages + heads for p in m.parameters()]
    # localpar counts batch norm's running statistics among a stage's parameters; PyTorch
    # keeps them as buffers.
    counted = sum(p.numel() for p in params) + sum(
        b.numel() for m in stages + heads for name, b in m.named_buffers()
        if name.endswith(("running_mean", "running_var")))
    adamw = job.optimizer.adamw
    if adamw.decay_matrices_only:  # nanoGPT's groups: matrices decay, vectors do not
        groups = [{"params": [p for p in params if p.dim() >= 2],
                   "weight_decay": adamw.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": adamw.weight_decay}]
    opt = torch.optim.AdamW(groups, lr=job.schedule.lr or 1e-3,
                            betas=(adamw.beta1 or 0.9, adamw.beta2 or 0.999), eps=adamw.eps or 1e-8)
    clip = job.optimizer.clip_norm
    ce = nn.CrossEntropyLoss()
    batch = job.batch_size or 128
    if sequence:
        x = torch.randint(0, classes, (batch, seq))
        y = torch.randint(0, classes, (batch, seq))

        def xent(logits, labels):
            return ce(logits.reshape(-1, classes), labels.reshape(-1))
    else:
        x = torch.randn(batch, 1, 28, 28)
        y = torch.randint(0, 10, (batch,))
        xent = ce
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
        if clip > 0:
            if greedy:  # localpar clips each stage over what it updates
                for stage, hd in zip(stages, heads):
                    nn.utils.clip_grad_norm_(list(stage.parameters()) + list(hd.parameters()), clip)
            else:
                nn.utils.clip_grad_norm_(params, clip)
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


def bench_job(job_pb2, text, single):
    """The job for the benchmark: one small evaluation at the end, not thousands of
    examples, and 400 batches an epoch; with `single`, its network as one stage (every
    layer, the last stage's head)."""
    from google.protobuf import text_format
    job = job_pb2.Job()
    text_format.Parse(text, job)
    job.eval_limit = 128
    job.eval_every_steps = 0
    # A whole number of batches an epoch (400, more than any case runs), so that no short
    # last batch is too small to split into micro-batches.
    job.data.train_limit = 400 * job.batch_size
    if not single:
        return text_format.MessageToString(job)
    merged = job_pb2.Stage()
    merged.name = "all"
    for st in job.stages:
        merged.layers.extend(st.layers)
    merged.head.CopyFrom(job.stages[-1].head)
    del job.stages[:]
    job.stages.append(merged)
    return text_format.MessageToString(job)


# What each case runs: its job file, its steps, and for each rule the network the one-core
# comparison trains (the job's stages, or all of them as one stage).
CASES = {
    "mlp": ("fashion_mlp", 60, {"GREEDY": False, "BACKPROP": False}),
    "resnet": ("fashion_resnet", 12, {"GREEDY": False, "BACKPROP": False}),
    # nanoGPT's baby GPT: BACKPROP as one stage is nanoGPT's own model, step for step.
    "charlm": ("shakespeare_char", 40, {"BACKPROP": True, "GREEDY": False}),
}


def two_core_settings(rule):
    """The cluster settings tried on two cores: the job's 4 stages, or regrouped into 2 (one
    worker per core); BACKPROP also splits each batch into micro-batches, so that a stage
    computes one while the other computes the next, under 1F1B and ZB. The gradients add up
    to the whole batch's, so the work per example is the same (with batch norm, a
    micro-batch's statistics replace the batch's, as in GPipe)."""
    settings = [(), ("--stages=2",)]
    if rule == "BACKPROP":
        for micro in (4, 8):
            for schedule in ("1f1b", "zb"):
                settings.append(("--stages=2", f"--micro_batches={micro}",
                                 f"--schedule={schedule}"))
        settings.append(("--micro_batches=8", "--schedule=1f1b"))
    return settings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default="build/ci",
                    help="the build directory with localpar (default build/ci)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating rounds of both sides; each figure is the best (default 2)")
    ap.add_argument("--cases", default="mlp,resnet,charlm",
                    help="comma-separated networks: " + ", ".join(sorted(CASES)))
    # The PyTorch side runs in a child of this script, one per setting, so that each starts
    # with its own thread pools: these say what it trains, and for how many steps.
    ap.add_argument("--steps", type=int, default=30, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--torch_threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gen", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--rule", help=argparse.SUPPRESS)
    args = ap.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        ap.error(f"--cases: {', '.join(unknown)}: not one of {', '.join(sorted(CASES))}")
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
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
        job_pb2 = job_module(gen, generate=False)
        for case in args.cases.split(","):
            name, steps, rules = CASES[case]
            with open(os.path.join(SOURCE, "deploy", "jobs", f"{name}.textproto")) as f:
                text = f.read()
            # Data paths made absolute: the copies live elsewhere.
            text = text.replace('"../../../shared/', f'"{os.path.dirname(SOURCE)}/shared/')
            job = os.path.join(work, f"{name}.textproto")
            with open(job, "w") as f:
                f.write(bench_job(job_pb2, text, False))
            single = os.path.join(work, f"{name}.one_stage.textproto")
            with open(single, "w") as f:
                f.write(bench_job(job_pb2, text, True))
            for rule, as_one_stage in rules.items():
                core_job = single if as_one_stage else job
                best = {"lp1": 0, "pt1": 0, "lp2": 0, "pt2": 0}
                best_setting, lp_setting = "", ""
                for _ in range(args.rounds):
                    lp = localpar_rate(build, work, core_job, rule, steps, "train")
                    pt = torch_rate(gen, core_job, rule, steps, 1, 1)
                    if lp["parameters"] != pt["parameters"]:
                        raise SystemExit(f"torch_compare: the PyTorch twin of {case} has "
                                         f"{pt['parameters']} parameters, localpar's network "
                                         f"{lp['parameters']:.0f}: not the same network")
                    best["lp1"] = max(best["lp1"], lp["examples_per_second"])
                    best["pt1"] = max(best["pt1"], pt["examples_per_second"])
                    for extra in two_core_settings(rule):
                        setting = " ".join(extra) if extra else "4 workers"
                        r = localpar_rate(build, work, job, rule, 3 * steps, "run",
                                          extra)["examples_per_second"]
                        if r > best["lp2"]:
                            best["lp2"], lp_setting = r, setting
                    for threads, openblas, setting in (
                            (1, 2, "1 torch thread, OpenBLAS's default pool"),
                            (2, 1, "2 torch threads, 1 OpenBLAS thread"),
                            (2, 2, "2 threads each")):
                        r = torch_rate(gen, core_job, rule, steps, threads,
                                       openblas)["examples_per_second"]
                        if r > best["pt2"]:
                            best["pt2"], best_setting = r, setting
                label = f"{name}{' (1 stage)' if as_one_stage else ''}"
                rows.append((label, rule, best, best_setting, lp_setting))
                print(f"torch_compare: {label} {rule}: one core localpar "
                      f"{best['lp1']:.0f} / PyTorch {best['pt1']:.0f} ex/s = "
                      f"{best['lp1'] / best['pt1']:.2f}x; two cores localpar run "
                      f"{best['lp2']:.0f} ({lp_setting}) / PyTorch {best['pt2']:.0f} "
                      f"({best_setting}) = {best['lp2'] / best['pt2']:.2f}x", flush=True)
        print("\n| network | rule | 1 core: localpar | PyTorch | ratio | 2 cores: localpar run "
              "| PyTorch best | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for case, rule, b, setting, lp_setting in rows:
            print(f"| {case} | {rule} | {b['lp1']:.0f} | {b['pt1']:.0f} | "
                  f"**{b['lp1'] / b['pt1']:.2f}×** | {b['lp2']:.0f} ({lp_setting}) | "
                  f"{b['pt2']:.0f} ({setting}) | **{b['lp2'] / b['pt2']:.2f}×** |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
