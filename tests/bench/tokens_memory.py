#!/usr/bin/env python3
"""Resident memory against the size of a token file: 4 MiB and 4 GiB.

  tests/bench/tokens_memory.py [BUILD_DIR] [--gib=4] [--keep]

Makes nanoGPT-style token files (raw uint16) by repeating tiny Shakespeare's bytes as ids
(../shared/data/tinyshakespeare.txt), a small one and a large one, in a scratch directory
(removed at the end unless --keep), and trains the same small GPT on each for a few dozen
steps, twice: `localpar train` (the process that reads the data), and `localpar run` (whose
coordinator reads it and whose workers never do). It reports each process's peak resident
memory (VmHWM, polled from /proc), the large file's minus the small one's, and the time
the vocabulary scan and the run took. Memory must not grow with the corpus: the token
files are mapped and read a window at a time, and every window's pages are dropped from
the process as soon as they are copied.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHAKESPEARE = os.path.join(os.path.dirname(SOURCE), "shared", "data", "tinyshakespeare.txt")

JOB = """name: "tokens_memory" rule: GREEDY seed: 1 batch_size: 16 epochs: 1 max_steps: 60
eval_batch_size: 64 eval_limit: 64
data {{ tokens {{ train_paths: "{train}" validation_paths: "{val}" seq_len: 64 }} }}
stages {{ layers {{ embedding {{ vocab: 256 dim: 64 }} }} layers {{ position_embedding {{}} }}
         layers {{ transformer_block {{ heads: 4 }} }} head {{ kind: LANGUAGE_MODEL }} }}
stages {{ layers {{ transformer_block {{ heads: 4 }} }} head {{ kind: LANGUAGE_MODEL }} }}
"""


def make_tokens(path, size_bytes, text):
    ids = bytearray()
    for b in text:  # a byte per char, as uint16 little-endian
        ids += bytes((b, 0))
    with open(path, "wb") as f:
        written = 0
        while written < size_bytes:
            chunk = ids[:size_bytes - written]
            f.write(chunk)
            written += len(chunk)


def peak_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(argv, names):
    """Runs argv; returns {process name: peak KiB} over it and its descendants, and seconds."""
    start = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    peaks = {}
    while p.poll() is None:
        pids = [p.pid]
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().split()
                if int(fields[3]) in pids or int(fields[3]) == p.pid:
                    pids.append(int(pid))
            except OSError:
                continue
        for pid in set(pids):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm in names:
                peaks[comm] = max(peaks.get(comm, 0), peak_kib(pid))
        time.sleep(0.05)
    err = p.stderr.read()
    if p.returncode != 0:
        raise SystemExit(f"tokens_memory: {' '.join(argv)} exited {p.returncode}:\n{err[-2000:]}")
    return peaks, time.time() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build/ci")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    localpar = os.path.join(os.path.abspath(args.build), "localpar")
    with open(SHAKESPEARE, "rb") as f:
        text = f.read()
    work = tempfile.mkdtemp(prefix="localpar-tokens-", dir=os.environ.get("TMPDIR", "/tmp"))
    try:
        val = os.path.join(work, "val.bin")
        make_tokens(val, 200_000, text[-100_000:])
        rows = []
        for label, size in (("4 MiB", 4 << 20), (f"{args.gib:g} GiB", int(args.gib * (1 << 30)))):
            train = os.path.join(work, f"train-{size}.bin")
            t = time.time()
            make_tokens(train, size, text)
            made = time.time() - t
            job = os.path.join(work, f"job-{size}.textproto")
            with open(job, "w") as f:
                f.write(JOB.format(train=train, val=val))
            t = time.time()
            subprocess.run([localpar, "validate", job], check=True, capture_output=True)
            scan = time.time() - t  # reading the vocabulary: every token once
            peaks_train, secs_train = measure([localpar, "train", job, "--quiet"], {"localpar"})
            peaks_run, secs_run = measure([localpar, "run", job, "--quiet"],
                                          {"localpar_coordi", "localpar_worker"})
            rows.append((label, made, scan, peaks_train.get("localpar", 0), secs_train,
                         peaks_run.get("localpar_coordi", 0), peaks_run.get("localpar_worker", 0),
                         secs_run))
            os.remove(train)
            print(f"tokens_memory: {label}: file made in {made:.1f} s, vocabulary scan "
                  f"{scan:.1f} s; train peak {rows[-1][3] / 1024:.1f} MiB ({secs_train:.1f} s); "
                  f"run: coordinator peak {rows[-1][5] / 1024:.1f} MiB, worker peak "
                  f"{rows[-1][6] / 1024:.1f} MiB ({secs_run:.1f} s)", flush=True)
        small, large = rows
        print("\n| token file | `train` peak RSS | coordinator peak RSS | worker peak RSS | "
              "vocabulary scan |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[3] / 1024:.1f} MiB | {r[5] / 1024:.1f} MiB | "
                  f"{r[6] / 1024:.1f} MiB | {r[2]:.1f} s |")
        print(f"\ntokens_memory: the large file adds {(large[3] - small[3]) / 1024:+.1f} MiB to "
              f"`train`, {(large[5] - small[5]) / 1024:+.1f} MiB to the coordinator and "
              f"{(large[6] - small[6]) / 1024:+.1f} MiB to the worker")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
