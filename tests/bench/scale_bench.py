#!/usr/bin/env python3
"""A transformer past 2 GiB, end to end, on this machine (not in CI).

  tests/bench/scale_bench.py [BUILD_DIR] [--dim=2048] [--blocks=16] [--steps=6] [--keep]

The job: tiny Shakespeare's characters, an embedding and `blocks` pre-norm transformer blocks
of width `dim` (16 heads) over 4 stages, GREEDY, AdamW, batch 2, context 16. At the
defaults that is 806 M parameters, 3.2 GB of float32: every whole-model path goes past
protobuf's 2 GiB. In order:
  1. `localpar train` of `steps` steps: the reference, whose final weights go to shards
     (past 1.5 GiB they would anyway; --weights_pb_limit_mib=1 makes a small trial alike);
  2. `localpar run` of the same steps on 4 local workers, checkpointing every 2 steps; once
     the first checkpoint commits, stage 1's worker is SIGKILLed; the launcher restarts it
     and the coordinator rolls back to the checkpoint. Its final weights must be bitwise
     those of 1 (every tensor of every shard);
  3. `localpar train --stages=2 --init_from=` the run's shards, one step: the same layers
     regrouped, two heads left out; then `localpar train --stages=2 --resume=` the run's
     last checkpoint: regrouped, every tensor equal to the run's final one of that name;
  4. `localpar export` to ONNX with external data, run by ONNX Runtime (npm's
     onnxruntime-node in tests/onnx/node_modules) on one batch and compared with
     `localpar predict --logits`.
It reports each worker's peak resident memory (VmHWM, polled from /proc) against its
stage's training state (parameters, gradients and AdamW's two moments, from report.json),
and the size, time and MB/s of each whole-model operation as the programs print them.
Run it beside nothing else: it needs about 20 GB of memory at the defaults.
"""
import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHAKESPEARE = os.path.join(os.path.dirname(SOURCE), "shared", "data", "tinyshakespeare.txt")
ORT = os.path.join(SOURCE, "tests", "onnx", "node_modules", "onnxruntime-node")
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


def job_text(dim, blocks, steps):
    per = blocks // 4
    stages = []
    for k in range(4):
        layers = ""
        if k == 0:
            layers += f"layers {{ embedding {{ vocab: 256 dim: {dim} }} }} " \
                      "layers { position_embedding {} } "
        layers += " ".join("layers { transformer_block { heads: 16 } }" for _ in range(per))
        stages.append(f'stages {{ name: "s{k}" {layers} head {{ kind: LANGUAGE_MODEL }} }}')
    return f"""name: "scale" rule: GREEDY seed: 11 batch_size: 2 epochs: 1 max_steps: {steps}
eval_batch_size: 2 eval_limit: 2
data {{ text {{ paths: "{SHAKESPEARE}" seq_len: 16 holdout_fraction: 0.1 windows: RANDOM_OFFSETS }} }}
optimizer {{ adamw {{ beta1: 0.9 beta2: 0.99 weight_decay: 0.1 }} }}
schedule {{ lr: 1e-4 }}
""" + "\n".join(stages) + "\n"


class Watch:
    """Runs argv, polling the peak resident memory of it and its descendants by pid."""

    def __init__(self, argv, log):
        self.peaks, self.comm, self.args = {}, {}, {}
        self.log = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=ENV)
        self.start = time.time()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def descendants(self):
        out, frontier = set(), {self.proc.pid}
        while frontier:
            out |= frontier
            found = set()
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open(f"/proc/{pid}/stat") as f:
                            if int(f.read().rsplit(")", 1)[1].split()[1]) in frontier:
                                found.add(int(pid))
                    except (OSError, ValueError, IndexError):
                        pass
            frontier = found - out
        return out

    def poll(self):
        while self.proc.poll() is None:
            for pid in self.descendants():
                try:
                    with open(f"/proc/{pid}/status") as f:
                        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
                    if pid not in self.comm:
                        self.comm[pid] = open(f"/proc/{pid}/comm").read().strip()
                        self.args[pid] = open(f"/proc/{pid}/cmdline").read().split("\0")
                    self.peaks[pid] = max(self.peaks.get(pid, 0), hwm * 1024)
                except (OSError, StopIteration, ValueError):
                    pass
            time.sleep(0.2)

    def pids(self, comm):
        return sorted(p for p, c in self.comm.items() if c == comm)

    def stage_of(self, pid):
        """A local worker's stage, from the --checkpoint_dir=DIR/stage-K `run` gives it."""
        m = re.search(r"/stage-(\d+)$", " ".join(a for a in self.args.get(pid, [])
                                                 if a.startswith("--checkpoint_dir=")))
        return int(m.group(1)) if m else None

    def wait(self, what):
        rc = self.proc.wait()
        self.thread.join()
        self.seconds = time.time() - self.start
        self.log.close()
        text = open(self.log.name).read()
        if rc != 0:
            raise SystemExit(f"scale_bench: {what} exited {rc}:\n{text[-3000:]}")
        return text


def tensor_places(directory):
    """{name: (shard path, file offset, bytes)} of every tensor, through the index."""
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    places = {}
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(directory, shard)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                b, e = info["data_offsets"]
                places[name] = (path, 8 + n + b, e - b)
    return places


def same_tensors(a, b, subset=False):
    """Every tensor of shard directory a bitwise equal to b's of the same name, read one at a
    time; the same names in both, or with `subset` a's among b's."""
    pa, pb = tensor_places(a), tensor_places(b)
    if not pa or not (set(pa) <= set(pb) if subset else pa.keys() == pb.keys()):
        return False
    for name, (path, at, size) in pa.items():
        qpath, qat, qsize = pb[name]
        if size != qsize:
            return False
        with open(path, "rb") as f, open(qpath, "rb") as g:
            f.seek(at)
            g.seek(qat)
            if f.read(size) != g.read(size):
                return False
    return True


def figures(text, prefix):
    m = re.search(prefix + r"[^\n]*?(\d+) MB in ([0-9.]+) s, (\d+) MB/s", text)
    return f"{m.group(1)} MB in {m.group(2)} s, {m.group(3)} MB/s" if m else "(not printed)"


def make_job(lp, work, a):
    """The job file, validated; prints its size."""
    job = os.path.join(work, "scale.textproto")
    with open(job, "w") as f:
        f.write(job_text(a.dim, a.blocks, a.steps))
    said = subprocess.run([lp, "validate", job, "--memory_limit_mib=1000000"],
                          capture_output=True, text=True, env=ENV)
    if said.returncode != 0:
        raise SystemExit(f"scale_bench: validate: {said.stdout}{said.stderr}")
    params = sum(float(n) for n in re.findall(r"\(([0-9.e+]+) parameters:",
                                               said.stdout + said.stderr))
    print(f"scale_bench: {params / 1e6:.0f} M parameters ({params * 4 / 2**30:.2f} GiB), "
          f"dim {a.dim}, {a.blocks} blocks over 4 stages, {a.steps} steps", flush=True)
    return job


def reference(lp, job, work, rows):
    # 1. The reference.
    ref = os.path.join(work, "train")
    w = Watch([lp, "train", job, f"--out={ref}", "--quiet", "--memory_limit_mib=1000000",
               "--weights_pb_limit_mib=1"],
              os.path.join(work, "train.log"))
    text = w.wait("train")
    rows.append(("train (reference), whole model in one process", f"{w.seconds:.0f} s",
                 f"peak {max(w.peaks.values()) / 2**30:.2f} GiB"))
    rows.append(("  save (train's final weights, shards)", figures(text, "weights:"), ""))
    print(f"scale_bench: train: {w.seconds:.0f} s", flush=True)
    return ref


def cluster(lp, job, work, rows, ref):
    # 2. The cluster, with a worker killed after the first checkpoint.
    run = os.path.join(work, "run")
    ckpt = os.path.join(work, "ckpt")
    w = Watch([lp, "run", job, f"--out={run}", f"--checkpoint_dir={ckpt}",
               "--checkpoint_every_steps=2", "--quiet", "--weights_pb_limit_mib=1"],
              os.path.join(work, "run.log"))
    killed = None
    while w.proc.poll() is None and killed is None:
        if os.path.isdir(ckpt) and any(os.path.exists(os.path.join(ckpt, n, "MANIFEST"))
                                       for n in os.listdir(ckpt) if n.startswith("ckpt-")):
            stage1 = [p for p in w.pids("localpar_worker") if w.stage_of(p) == 1]
            if stage1:
                killed = stage1[0]
                os.kill(killed, signal.SIGKILL)
                print(f"scale_bench: killed worker pid {killed} after the first checkpoint",
                      flush=True)
        time.sleep(0.2)
    text = w.wait("run")
    if killed is None:
        raise SystemExit("scale_bench: no checkpoint committed before the run ended")
    with open(os.path.join(run, "report.json")) as f:
        report = json.load(f)
    same = same_tensors(os.path.join(run, "weights"), os.path.join(ref, "weights"))
    rows.append(("run, 4 workers, one SIGKILLed and recovered", f"{w.seconds:.0f} s",
                 "bitwise equal to train" if same else "DIFFERS from train"))
    stage_state = [s.get("state_bytes", 0) for s in report.get("stage_reports", [])]
    act = [s.get("activation_bytes_per_example", 0) * 2 for s in report.get("stage_reports", [])]
    for k in range(4):
        peak = max((w.peaks[p] for p in w.pids("localpar_worker") if w.stage_of(p) == k),
                   default=0)
        state = stage_state[k] if k < len(stage_state) else 0
        rows.append((f"  stage {k}'s worker, peak resident", f"{peak / 2**30:.2f} GiB",
                     f"state {state / 2**30:.2f} GiB: {peak / max(state, 1):.2f}x "
                     f"(+ {act[k] / 2**20 if k < len(act) else 0:.0f} MiB activations)"))
    coords = w.pids("localpar_coordi")
    if coords:
        rows.append(("  coordinator peak resident",
                     f"{max(w.peaks[p] for p in coords) / 2**30:.2f} GiB", ""))
    rows.append(("  collect from the workers (StreamWeights)", figures(text, "after"), ""))
    rows.append(("  save (the run's final weights, shards)", figures(text, "weights:"), ""))
    if not same:
        raise SystemExit("scale_bench: the recovered run's weights differ from train's")
    return run, ckpt


def other_split(lp, job, work, rows, run):
    # 3. The shards into another split.
    two = os.path.join(work, "two")
    w = Watch([lp, "train", job, "--stages=2", f"--init_from={run}/weights", "--max_steps=1",
               f"--out={two}", "--quiet", "--memory_limit_mib=1000000"],
              os.path.join(work, "two.log"))
    text = w.wait("train --stages=2")
    if "left out: heads." not in text:
        raise SystemExit(f"scale_bench: --stages=2 did not say which heads it left out:\n{text}")
    rows.append(("load (--init_from the shards, --stages=2)", figures(text, "--init_from: /"),
                 "every layer carried over"))


def regrouped(lp, job, work, rows, run, ckpt):
    # 3b. The run's last checkpoint resumed as 2 stages by the reference: regrouped.
    regroup = os.path.join(work, "regroup")
    w = Watch([lp, "train", job, "--stages=2", f"--resume={ckpt}", f"--out={regroup}",
               "--quiet", "--memory_limit_mib=1000000", "--weights_pb_limit_mib=1"],
              os.path.join(work, "regroup.log"))
    text = w.wait("train --stages=2 --resume")
    if "regrouping the checkpoint" not in text:
        raise SystemExit(f"scale_bench: the resume as 2 stages did not regroup:\n{text}")
    same = same_tensors(os.path.join(regroup, "weights"), os.path.join(run, "weights"), True)
    rows.append(("resume the last checkpoint as 2 stages (reference)", f"{w.seconds:.0f} s",
                 f"peak {max(w.peaks.values()) / 2**30:.2f} GiB; "
                 + ("every tensor equal to the run's" if same else "DIFFERS from the run")))
    if not same:
        raise SystemExit("scale_bench: the regrouped weights differ from the run's")


def onnx_export(lp, job, work, rows, run):
    # 4. ONNX with external data, against predict.
    onnx = os.path.join(work, "scale.onnx")
    w = Watch([lp, "export", job, f"{run}/weights", f"--out={onnx}", "--external_data"],
              os.path.join(work, "export.log"))
    text = w.wait("export")
    if "weights in" not in text:
        raise SystemExit(f"scale_bench: the export did not use external data:\n{text}")
    rows.append(("export ONNX (graph + external data)", figures(text, "written:"),
                 f"graph {os.path.getsize(onnx) / 2**20:.1f} MiB, data "
                 f"{os.path.getsize(onnx + '.data') / 2**30:.2f} GiB"))
    import numpy as np
    text_bytes = np.frombuffer(open(SHAKESPEARE, "rb").read(), np.uint8)
    x = np.stack([text_bytes[-1000 + 16 * i:-1000 + 16 * i + 16] for i in range(2)])
    xin, logits = os.path.join(work, "x.npy"), os.path.join(work, "logits.npy")
    np.save(xin, x.astype(np.int64))
    subprocess.run([lp, "predict", job, f"{run}/weights", f"--input={xin}", "--logits",
                    f"--out={logits}"], check=True, capture_output=True, env=ENV)
    p = subprocess.run(["node", os.path.join(SOURCE, "tests", "onnx", "run_onnx.js"), onnx,
                        xin, logits], capture_output=True, text=True,
                       env=dict(ENV, NODE_PATH=os.path.dirname(ORT)))
    if p.returncode != 0:
        raise SystemExit(f"scale_bench: ONNX Runtime: {p.stdout}{p.stderr}")
    ort = json.loads(p.stdout.strip().splitlines()[-1])
    rows.append(("ONNX Runtime on one batch vs predict",
                 f"max |diff| {ort['max_abs_diff']:.1e}",
                 f"same argmax {ort['argmax_agreement'] * 100:.1f}%"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default="build/ci")
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--blocks", type=int, default=16, help="a multiple of 4")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = ap.parse_args()
    lp = os.path.join(os.path.abspath(a.build), "localpar")
    work = tempfile.mkdtemp(prefix="localpar-scale-", dir=os.environ.get("TMPDIR", "/tmp"))
    rows = []
    try:
        job = make_job(lp, work, a)
        ref = reference(lp, job, work, rows)
        run, ckpt = cluster(lp, job, work, rows, ref)
        other_split(lp, job, work, rows, run)
        regrouped(lp, job, work, rows, run, ckpt)
        onnx_export(lp, job, work, rows, run)
    finally:
        width = max((len(r[0]) for r in rows), default=10)
        print()
        for r in rows:
            print(f"{r[0]:<{width}}  {r[1]:<28}  {r[2]}")
        if a.keep:
            print(f"scale_bench: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("scale_bench: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
