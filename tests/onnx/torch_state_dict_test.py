#!/usr/bin/env python3
"""The safetensors export is a PyTorch state_dict as is.

  tests/onnx/torch_state_dict_test.py BUILD_DIR SOURCE_DIR

For the MLP, the CNN and the ResNet of deploy/jobs (and tests/onnx/every_layer.textproto,
which has a linear reading an image and a flatten before a linear): a few training steps
with `localpar train`, `localpar export --format=safetensors`, then the PyTorch twin that
tests/bench/torch_compare.py also uses, built from the job the file carries, takes the file
with load_state_dict(strict=True). In eval mode, on [N, C, H, W] images scaled to [0, 1]
(what torchvision's ToTensor() gives), its logits must agree with `localpar predict
--logits` within 1e-5. The names must not depend on the split: the MLP trained as 2 stages
exports the same layer names as trained as 4. The module is the shipped loader,
python/localpar_torch.py (`localpar_torch.load(path)`, three lines in docs/models.md), also
on shakespeare_char's token windows. Each export is also written as shards of at
most 1 MiB (`--shard_mib=1`) and read back through model.safetensors.index.json by a reader
written here: the tensors are the single file's, bit for bit.
PyTorch is Debian's python3-torch; where it is missing the test says so and passes skipped.
"""
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import shutil

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/ci")
SOURCE = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else ".")
FASHION = "/usr/share/datasets/fashion-mnist"
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


class Failure(Exception):
    pass


def lp(*args, expect=0):
    p = subprocess.run([os.path.join(BUILD, "localpar"), *args], capture_output=True, text=True,
                       env=ENV, timeout=900)
    if p.returncode != expect:
        raise Failure(f"localpar {' '.join(args)}: exit {p.returncode}, wanted {expect}\n"
                      f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def read_safetensors(torch, path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[b:e]), dtype=dtypes[info["dtype"]])
        tensors[name] = t.reshape(info["shape"])
    return header["__metadata__"], tensors


def read_sharded(torch, directory):
    """A reader of Hugging Face's sharded layout, written here: model.safetensors.index.json's
    weight_map names each tensor's shard; every shard is a safetensors file."""
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    meta, tensors, total = None, {}, 0
    for shard in shards:
        m, t = read_safetensors(torch, os.path.join(directory, shard))
        meta = meta or m
        for name, value in t.items():
            if weight_map.get(name) != shard:
                raise Failure(f"{directory}: {shard} holds {name}, the index says "
                              f"{weight_map.get(name)}")
            tensors[name] = value
            total += value.numel() * value.element_size()
    if set(tensors) != set(weight_map) or total != index["metadata"]["total_size"]:
        raise Failure(f"{directory}: the index's weight_map or total_size disagree with the shards")
    return meta, tensors, len(shards)


def job_path(name):
    if name.startswith("every_"):
        return os.path.join(SOURCE, "tests", "onnx", f"{name}.textproto")
    return os.path.join(SOURCE, "deploy", "jobs", f"{name}.textproto")


def check(torch, np, work, name, steps, images, extra=()):
    out = os.path.join(work, name)
    lp("train", job_path(name), f"--max_steps={steps}", f"--out={out}", "--quiet", *extra)
    st = os.path.join(work, f"{name}.safetensors")
    lp("export", job_path(name), os.path.join(out, "weights.pb"), f"--out={st}", *extra)
    meta, tensors = read_safetensors(torch, st)
    # The same weights as shards of at most 1 MiB (a stage over 1 MiB spans several), read
    # through the index: every tensor identical to the single file's.
    shards = os.path.join(work, f"{name}.shards")
    lp("export", job_path(name), os.path.join(out, "weights.pb"), f"--out={shards}",
       "--shard_mib=1", *extra)
    _, sharded, count = read_sharded(torch, shards)
    if set(sharded) != set(tensors) or any(not torch.equal(sharded[k], tensors[k]) for k in tensors):
        raise Failure(f"{name}: the shards' tensors differ from the single file's")
    # The shipped loader, as a user calls it: builds the job's network, strict=True.
    sys.path.insert(0, os.path.join(SOURCE, "python"))
    import localpar_torch
    twin = localpar_torch.load(st)
    if set(twin.state_dict()) != set(tensors):
        raise Failure(f"{name}: names differ from the module's state_dict")
    from_shards = localpar_torch.load(shards).state_dict()
    if any(not torch.equal(from_shards[k], v) for k, v in twin.state_dict().items()):
        raise Failure(f"{name}: the loader reads other tensors from the shards")
    # The reference: localpar predict on the raw pixels.
    xin = os.path.join(work, f"{name}.x.npy")
    ref = os.path.join(work, f"{name}.logits.npy")
    np.save(xin, images)
    lp("predict", job_path(name), os.path.join(out, "weights.pb"), f"--input={xin}", "--logits",
       f"--out={ref}", *extra)
    want = np.load(ref)
    # What a PyTorch user holds: [N, C, H, W] in [0, 1] (ToTensor()), or token ids [N, T];
    # the loaded module applies the training's normalisation itself.
    if meta["input_tokens"] == "true":
        x = torch.from_numpy(images.astype(np.int64))
    else:
        x = torch.from_numpy((images * np.float32(meta["input_scale"])).transpose(0, 3, 1, 2)
                             .copy())
    with torch.no_grad():
        got = twin(x).numpy()
    diff = float(np.abs(got - want).max())
    print(f"torch_state_dict_test: {name}: {len(tensors)} tensors (also as {count} shards through "
          f"the index, identical), load_state_dict(strict=True), logits max |diff| {diff:.2e} "
          f"over {len(images)} examples")
    if not diff <= 1e-5:
        raise Failure(f"{name}: the twin's logits differ from predict's by {diff}")
    return tensors


def main():
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        print("torch_state_dict_test: skipped: PyTorch is not installed (Debian's python3-torch)")
        print("torch_state_dict_test: ok")
        return 0
    import numpy as np
    import torch
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="localpar-torch-")
    try:
        raw = gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")).read()
        images = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28, 1)[:1000]
        images = images.astype(np.float32)
        four = check(torch, np, work, "fashion_mlp", 30, images)
        # An export of stages 0..1 only loads as those stages, scoring as predict --stage=1.
        sys.path.insert(0, os.path.join(SOURCE, "python"))
        import localpar_torch
        weights = os.path.join(work, "fashion_mlp", "weights.pb")
        part = os.path.join(work, "stage1.safetensors")
        lp("export", job_path("fashion_mlp"), weights, f"--out={part}", "--stage=1")
        lp("predict", job_path("fashion_mlp"), weights, f"--input={work}/fashion_mlp.x.npy",
           "--logits", "--stage=1", f"--out={work}/stage1.npy")
        model = localpar_torch.load(part)
        x = torch.from_numpy((images / np.float32(255)).transpose(0, 3, 1, 2).copy())
        with torch.no_grad():
            diff = float(np.abs(model(x).numpy() - np.load(f"{work}/stage1.npy")).max())
        if not diff <= 1e-5 or len(model.bounds) != 2:
            raise Failure(f"an export of stages 0..1 loads as {len(model.bounds)} stages, "
                          f"|diff| {diff}")
        print(f"torch_state_dict_test: an export of stages 0..1 loads as 2 stages, logits max "
              f"|diff| {diff:.2e} against predict --stage=1")
        check(torch, np, work, "fashion_cnn", 10, images[:300])
        check(torch, np, work, "fashion_resnet", 10, images[:300])
        rng = np.random.default_rng(7)
        check(torch, np, work, "every_layer", 20,
              rng.normal(0, 1, (200, 8, 8, 2)).astype(np.float32))
        text = open(os.path.join(SOURCE, "..", "shared", "data", "tinyshakespeare.txt"),
                    "rb").read()
        starts = rng.integers(0, len(text) - 64, 40)
        windows = np.array([list(text[s:s + 64]) for s in starts], np.int32)
        check(torch, np, work, "shakespeare_char", 10, windows)
        two = check(torch, np, work, "fashion_mlp", 30, images[:200], ["--stages=2"])
        layers4 = sorted(k for k in four if k.startswith("layers."))
        layers2 = sorted(k for k in two if k.startswith("layers."))
        if layers4 != layers2:
            raise Failure(f"layer names depend on the split: {layers4} vs {layers2}")
        print(f"torch_state_dict_test: the MLP as 4 and as 2 stages: the same {len(layers4)} "
              f"layer names; heads {sorted(k for k in two if k.startswith('heads.'))}")
    except Failure as e:
        print(f"torch_state_dict_test: FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("torch_state_dict_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
