#!/usr/bin/env python3
"""`localpar sample` against outside references, on shakespeare_char trained briefly.

  tests/onnx/sample_test.py BUILD_DIR SOURCE_DIR

- The same --seed prints the same text twice: the prompt, then exactly --tokens new bytes;
  another seed prints other text.
- The key-value cache changes the cost, not the tokens: --cache=false prints the same text,
  and its time per token is at least 4 times the cached one at context 64 (the issue's bound;
  the ratio is printed).
- Greedy decoding (--temperature=0, and --top_k=1 at any temperature) picks, at every new
  token, the arg-max of the logits that the PyTorch twin (python/localpar_torch.py, on the
  safetensors export) computes for the same window, the window starting again from its last
  half when the sequence outgrows the context, as docs/models.md says.
- A vocabulary pickled by Python's own pickle (nanoGPT's meta.pkl layout) gives the same text.
- A prompt longer than the context is continued from its last 64 tokens, and stderr says so.
- Refused, each with its exit code and the field named: a network that is no language model,
  a negative temperature, a missing vocabulary file, a prompt the vocabulary cannot spell.
PyTorch is Debian's python3-torch; where it is missing that part says so and is skipped.
"""
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/ci")
SOURCE = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else ".")
JOB = os.path.join(SOURCE, "deploy", "jobs", "shakespeare_char.textproto")
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")
PROMPT = "ROMEO:"


class Failure(Exception):
    pass


def lp(*args, expect=0):
    p = subprocess.run([os.path.join(BUILD, "localpar"), *args], capture_output=True, env=ENV,
                       timeout=600)
    if p.returncode != expect:
        raise Failure(f"localpar {' '.join(args)}: exit {p.returncode}, wanted {expect}\n"
                      f"{p.stdout[-2000:]!r}\n{p.stderr.decode(errors='replace')[-3000:]}")
    return p.stdout, p.stderr.decode(errors="replace")


def ms_per_token(err):
    m = re.search(r"([0-9.]+) ms per token \((key-value cache|whole window per token)", err)
    if not m:
        raise Failure(f"no time per token in: {err}")
    return float(m.group(1)), m.group(2)


def check_greedy(work, weights, out):
    try:
        import torch
    except ImportError:
        print("sample_test: PyTorch missing: the greedy check against the twin is skipped")
        return
    sys.path.insert(0, os.path.join(SOURCE, "python"))
    import localpar_torch
    torch.set_num_threads(1)
    export = os.path.join(work, "model.safetensors")
    lp("export", JOB, weights, f"--out={export}")
    model = localpar_torch.load(export)
    context = 64
    seq = list(out)
    prompt = len(PROMPT.encode())
    start = max(0, prompt - context)
    with torch.no_grad():
        for n in range(prompt, len(seq)):
            if n - start > context:
                start = n - context // 2
            window = seq[start:n] + [0] * (context - (n - start))
            logits = model(torch.tensor([window]))[0, n - 1 - start]
            chosen = float(logits[seq[n]])
            best = float(logits.max())
            if chosen < best - 1e-4:
                raise Failure(f"new token {n - prompt}: localpar chose {seq[n]} (logit {chosen:.6f})"
                              f", PyTorch's arg-max is {int(logits.argmax())} ({best:.6f})")
    print(f"sample_test: greedy, {len(seq) - prompt} tokens: each the arg-max of PyTorch's logits")


def main():
    work = tempfile.mkdtemp(prefix="localpar_sample_")
    try:
        lp("train", JOB, "--max_steps=150", f"--out={work}/run")
        weights = os.path.join(work, "run", "weights.pb")
        a, err_a = lp("sample", JOB, weights, f"--prompt={PROMPT}", "--tokens=200", "--seed=1")
        b, _ = lp("sample", JOB, weights, f"--prompt={PROMPT}", "--tokens=200", "--seed=1")
        if a != b:
            raise Failure(f"the same seed printed different text:\n{a!r}\n{b!r}")
        if not a.startswith(PROMPT.encode()) or len(a) != len(PROMPT) + 200 + 1:
            raise Failure(f"wanted the prompt, 200 new bytes and a line break; got {len(a)} "
                          f"bytes: {a!r}")
        other, _ = lp("sample", JOB, weights, f"--prompt={PROMPT}", "--tokens=200", "--seed=2")
        if other == a:
            raise Failure("seeds 1 and 2 printed the same text")
        print(f"sample_test: 200 new bytes, the same twice: {a[:60]!r}...")

        # The cache: the same tokens, and the time per token.
        times = {"key-value cache": [], "whole window per token": []}
        for _ in range(2):
            for cache in ("true", "false"):
                out, err = lp("sample", JOB, weights, f"--prompt={PROMPT}", "--tokens=600",
                              "--seed=1", f"--cache={cache}")
                ms, how = ms_per_token(err)
                times[how].append(ms)
                if out[:len(a) - 1] != a[:-1]:
                    raise Failure(f"--cache={cache} printed other tokens:\n"
                                  f"{out[:len(a) - 1]!r}\n{a[:-1]!r}")
        cached, whole = min(times["key-value cache"]), min(times["whole window per token"])
        ratio = cached / whole
        print(f"sample_test: 600 tokens at context 64: {cached:.3f} ms per token with the cache, "
              f"{whole:.3f} without: {ratio:.3f} of it (measured; bound 0.25)")
        if ratio > 0.25:
            raise Failure(f"the cache's time per token is {ratio:.3f} of the whole window's")

        # Greedy: the arg-max, at temperature 0 and with top_k 1.
        greedy, _ = lp("sample", JOB, weights, f"--prompt={PROMPT}", "--tokens=100",
                       "--temperature=0")
        top1, _ = lp("sample", JOB, weights, f"--prompt={PROMPT}", "--tokens=100", "--top_k=1",
                     "--temperature=1.5", "--seed=9")
        if greedy != top1:
            raise Failure("--top_k=1 and --temperature=0 printed different text")
        check_greedy(work, weights, greedy.rstrip(b"\n"))

        # nanoGPT's meta.pkl, written by Python's pickle: bytes 0..255 as their characters.
        meta = os.path.join(work, "meta.pkl")
        with open(meta, "wb") as f:
            pickle.dump({"vocab_size": 256, "itos": {i: chr(i) for i in range(256)},
                         "stoi": {chr(i): i for i in range(256)}}, f)
        via, _ = lp("sample", JOB, weights, f"--prompt={PROMPT}", "--tokens=200", "--seed=1",
                    f"--vocabulary={meta}")
        if max(a) < 128 and via != a:
            raise Failure(f"with --vocabulary=meta.pkl:\n{via!r}\nwithout:\n{a!r}")

        # A prompt past the context: the network sees its last 64 tokens, and says so.
        long_prompt = "ROMEO: " * 15
        out, err = lp("sample", JOB, weights, f"--prompt={long_prompt}", "--tokens=10")
        if "more than the network's context (64)" not in err or \
                not out.startswith(long_prompt.encode()) or len(out) != len(long_prompt) + 11:
            raise Failure(f"a {len(long_prompt)}-byte prompt: {out!r}\n{err}")

        # Refusals.
        lp("train", os.path.join(SOURCE, "deploy", "jobs", "fashion_mlp.textproto"),
           "--max_steps=2", f"--out={work}/mlp")
        _, err = lp("sample", os.path.join(SOURCE, "deploy", "jobs", "fashion_mlp.textproto"),
                    f"{work}/mlp/weights.pb", expect=3)
        if "language model" not in err:
            raise Failure(f"a classifier: {err}")
        _, err = lp("sample", JOB, weights, "--temperature=-1", expect=2)
        if "--temperature" not in err:
            raise Failure(err)
        _, err = lp("sample", JOB, weights, f"--vocabulary={work}/none.pkl", expect=2)
        if "--vocabulary" not in err:
            raise Failure(err)
        with open(os.path.join(work, "small.txt"), "w") as f:
            f.write("R\nO\n")
        _, err = lp("sample", JOB, weights, "--prompt=ROMEO", f"--vocabulary={work}/small.txt",
                    expect=2)
        if "--prompt" not in err or "byte 2" not in err:
            raise Failure(err)
        print("sample_test: a classifier, a negative temperature, a missing vocabulary and an "
              "unspellable prompt refused")
    except Failure as e:
        print(f"sample_test: FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("sample_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
