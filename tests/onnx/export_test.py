"""`localpar export` and `localpar predict` against outside references.

  export_test.py BUILD_DIR SOURCE_DIR

For fashion_mlp, fashion_resnet, fortunes_charlm, tests/onnx/every_layer.textproto (every
image layer and head kind) and tests/onnx/every_sequence_layer.textproto (a learned position
embedding and a tied output on tiny Shakespeare), a short training run's weights are exported to ONNX, run in ONNX
Runtime (npm's onnxruntime-node, tests/onnx/node_modules) and compared with `localpar predict
--logits` on the same raw examples: max |difference| <= 1e-4, the same argmax on >= 99.9%.
For every stage of the ResNet too. The MLP's safetensors file is read with NumPy alone (its
JSON header and raw bytes) and its logits reproduced from the readable names and PyTorch
layouts. Then --init_from (weights.pb and safetensors, `train` and `run` bitwise equal) and the
errors: a job that does not match its weights, a corrupt .npy, labels out of range.
"""
import glob
import gzip
import json
import re
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

BUILD, SOURCE = sys.argv[1], sys.argv[2]
LOCALPAR = os.path.join(BUILD, "localpar")
FASHION = "/usr/share/datasets/fashion-mnist"
ORT = os.path.join(SOURCE, "tests", "onnx", "node_modules", "onnxruntime-node")
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


class Failure(Exception):
    pass


def lp(*args, expect=0, timeout=600):
    p = subprocess.run([LOCALPAR, *args], capture_output=True, text=True, env=ENV, timeout=timeout)
    if p.returncode != expect:
        raise Failure(f"localpar {' '.join(args)}: exit {p.returncode}, wanted {expect}\n"
                      f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def job(name):
    if name.startswith("every_"):
        return os.path.join(SOURCE, "tests", "onnx", f"{name}.textproto")
    return os.path.join(SOURCE, "deploy", "jobs", f"{name}.textproto")


def fashion_test_images(n):
    raw = gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")).read()
    return np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28, 1)[:n].astype(np.float32)


def fortunes_windows(n, t=64):
    files = [f for f in sorted(glob.glob("/usr/share/games/fortunes/*"))
             if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat")]
    text = np.frombuffer(b"".join(open(f, "rb").read() for f in files), np.uint8)
    # The last tenth: windows the job's held-out split draws from, and the rest.
    starts = len(text) * 9 // 10 + np.arange(n) * ((len(text) // 10 - t) // n)
    return np.stack([text[s:s + t] for s in starts]).astype(np.int64)


def shakespeare_windows(n, t=32):
    path = os.path.join(SOURCE, "..", "shared", "data", "tinyshakespeare.txt")
    text = np.frombuffer(open(path, "rb").read(), np.uint8)
    # From the last tenth, the job's validation text.
    starts = len(text) * 9 // 10 + np.arange(n) * ((len(text) // 10 - t) // n)
    return np.stack([text[s:s + t] for s in starts]).astype(np.int64)


def run_ort(model, inputs, expected, labels=None):
    p = subprocess.run(["node", os.path.join(SOURCE, "tests", "onnx", "run_onnx.js"), model,
                        inputs, expected, *([labels] if labels else [])], capture_output=True, text=True, timeout=600,
                       env=dict(ENV, NODE_PATH=os.path.dirname(ORT)))
    if p.returncode != 0:
        raise Failure(f"ONNX Runtime on {model}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    figures = json.loads(p.stdout.strip().splitlines()[-1])
    return figures


def check_onnx(work, name, steps, inputs, stages=None, pixels=False, labels=None, external=False):
    """ONNX Runtime against predict. Images go to predict as the files hold them ([N, H, W,
    C], pixel bytes 0..255) and to ONNX Runtime as a PyTorch user holds them: [N, C, H, W],
    pixels scaled to [0, 1]. With labels, both must score the same accuracy. With external,
    each export is also written with --external_data (the weights in MODEL.data beside a
    small graph), and ONNX Runtime must give the same figures from it."""
    out = os.path.join(work, name)
    lp("train", job(name), f"--max_steps={steps}", f"--out={out}", "--quiet")
    weights = os.path.join(out, "weights.pb")
    x = os.path.join(work, f"{name}.input.npy")
    np.save(x, inputs)
    xo = x
    if inputs.ndim == 4:
        scaled = inputs * (np.float32(1) / np.float32(255)) if pixels else inputs
        xo = os.path.join(work, f"{name}.nchw.npy")
        np.save(xo, scaled.astype(np.float32).transpose(0, 3, 1, 2).copy())
    y = None
    if labels is not None:
        y = os.path.join(work, f"{name}.labels.npy")
        np.save(y, labels)
    for stage in stages or [None]:
        flag = [] if stage is None else [f"--stage={stage}"]
        model = os.path.join(work, f"{name}{'' if stage is None else stage}.onnx")
        logits = os.path.join(work, f"{name}{'' if stage is None else stage}.logits.npy")
        lp("export", job(name), weights, f"--out={model}", *flag)
        said = lp("predict", job(name), weights, f"--input={x}", "--logits", f"--out={logits}",
                  *flag, *([f"--labels={y}"] if y else []))
        f = run_ort(model, xo, logits, y)
        print(f"export_test: {name} stage {'last' if stage is None else stage}: {f['rows']} rows, "
              f"max |diff| {f['max_abs_diff']:.2e}, argmax agreement {f['argmax_agreement']:.4f}")
        if external:
            ext = model[:-len(".onnx")] + ".external.onnx"
            told = lp("export", job(name), weights, f"--out={ext}", "--external_data", *flag)
            if f"weights in {ext}.data" not in told:
                raise Failure(f"export --external_data did not say where the weights went: {told}")
            graph, data = os.path.getsize(ext), os.path.getsize(ext + ".data")
            if not graph * 4 < os.path.getsize(model) <= data + graph:
                raise Failure(f"{ext}: graph {graph} bytes, data {data}; inline "
                              f"{os.path.getsize(model)}")
            g = run_ort(ext, xo, logits, y)
            g.pop("model"), f.pop("model")
            if g != f:
                raise Failure(f"{name}: ONNX Runtime on the external-data export: {g}, inline {f}")
            print(f"export_test: {name} stage {'last' if stage is None else stage}: external data "
                  f"({graph} bytes of graph, {data} of weights): the same figures")
        if y:
            m = re.search(r"accuracy: ([0-9.]+)% \((\d+) of", said)
            if not m or int(m.group(2)) != f["correct"]:
                raise Failure(f"{name}: ONNX Runtime gets {f['correct']} of {f['rows']} right, "
                              f"predict said: {said}")
            print(f"export_test: {name}: ONNX Runtime on [N, C, H, W] in [0, 1] scores "
                  f"{m.group(1)}% ({f['correct']} of {f['rows']}), as predict does")
    return weights


def check_shorter_windows(work, name, lengths):
    """A sequence model's export takes any length T up to the context: ONNX Runtime on the
    first T positions of each window gives the logits predict gave those positions of the
    whole window (attention is causal)."""
    x = np.load(os.path.join(work, f"{name}.input.npy"))
    logits = np.load(os.path.join(work, f"{name}.logits.npy"))
    for t in lengths:
        xs, ls = os.path.join(work, f"{name}.t{t}.npy"), os.path.join(work, f"{name}.t{t}.logits.npy")
        np.save(xs, np.ascontiguousarray(x[:, :t]))
        np.save(ls, np.ascontiguousarray(logits[:, :t]))
        f = run_ort(os.path.join(work, f"{name}.onnx"), xs, ls)
        print(f"export_test: {name} at T = {t} of {x.shape[1]}: {f['rows']} rows, max |diff| "
              f"{f['max_abs_diff']:.2e} against the whole windows' first {t} positions")


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":  # batch norm's num_batches_tracked (int64)
            continue
        b, e = info["data_offsets"]
        tensors[name] = np.frombuffer(body[b:e], np.float32).reshape(info["shape"])
    return header["__metadata__"], tensors


def check_safetensors(work, weights):
    st = os.path.join(work, "mlp.safetensors")
    lp("export", job("fashion_mlp"), weights, f"--out={st}")
    meta, t = read_safetensors(st)
    if "fashion_mlp" not in meta["job"] or meta["classes"] != "10":
        raise Failure(f"safetensors metadata: {meta}")
    raw = fashion_test_images(2000)
    x = ((raw * np.float32(meta["input_scale"]) - np.float32(meta["input_mean"])) *
         np.float32(meta["input_inv_std"])).reshape(len(raw), -1)
    for i in (0, 2, 4, 6):  # linear + relu, PyTorch [out, in]
        x = np.maximum(x @ t[f"layers.{i}.weight"].T + t[f"layers.{i}.bias"], 0)
    logits = x @ t["heads.7.0.weight"].T + t["heads.7.0.bias"]
    xin = os.path.join(work, "mlp_st.input.npy")
    ref = os.path.join(work, "mlp_st.logits.npy")
    np.save(xin, raw)
    lp("predict", job("fashion_mlp"), weights, f"--input={xin}", "--logits", f"--out={ref}")
    want = np.load(ref)
    diff = float(np.abs(logits - want).max())
    agree = float((logits.argmax(1) == want.argmax(1)).mean())
    print(f"export_test: safetensors read by NumPy: {len(t)} tensors, MLP logits max |diff| "
          f"{diff:.2e}, argmax agreement {agree:.4f}")
    if diff > 1e-4 or agree < 0.999:
        raise Failure("NumPy's MLP from the safetensors file disagrees with localpar")
    return st


def same_params(a, b):
    sys.path.insert(0, os.path.join(SOURCE, "tests", "containers"))
    from compose_test import weight_stages  # noqa: E402 (a protobuf field walk, no protoc)
    return weight_stages(a) == weight_stages(b)


def check_init_from(work, weights, st):
    j = job("fashion_mlp")
    a, b, c = (os.path.join(work, d) for d in ("init_train", "init_run", "init_st"))
    lp("train", j, "--max_steps=20", f"--init_from={weights}", f"--out={a}", "--quiet")
    lp("run", j, "--max_steps=20", f"--init_from={weights}", f"--out={b}", "--quiet")
    lp("train", j, "--max_steps=20", f"--init_from={st}", f"--out={c}", "--quiet")
    if not same_params(f"{a}/weights.pb", f"{b}/weights.pb"):
        raise Failure("--init_from: run and train differ")
    if not same_params(f"{a}/weights.pb", f"{c}/weights.pb"):
        raise Failure("--init_from: weights.pb and its safetensors export start differently")
    fresh = os.path.join(work, "fresh")
    lp("train", j, "--max_steps=20", f"--out={fresh}", "--quiet")
    if same_params(f"{a}/weights.pb", f"{fresh}/weights.pb"):
        raise Failure("--init_from changed nothing")
    print("export_test: --init_from: train and run bitwise equal, from weights.pb and safetensors")
    # Another split of the same network (the issue's example): the 4-stage weights, as
    # shards, start a 2-stage job; train and run agree bitwise, weights.pb and the shards
    # start it the same, and both say which heads were left out.
    shards = os.path.join(work, "init_shards")
    lp("export", j, weights, f"--out={shards}", "--shard_mib=1")
    outs = {}
    for cmd, src in (("train", shards), ("run", shards), ("train", weights)):
        out = os.path.join(work, f"regroup_{cmd}_{os.path.basename(src)}")
        # run moves the weights both ways in pieces of 64 KiB: dozens per stage.
        pieces = ["--transfer_chunk_kib=64"] if cmd == "run" else []
        said = lp(cmd, j, "--stages=2", "--max_steps=10", f"--init_from={src}", f"--out={out}",
                  "--quiet", *pieces)
        if "the file has 4 stages, the job 2; every layer carries over; left out: heads.1, " \
                "heads.5" not in said:
            raise Failure(f"{cmd} --init_from={src} --stages=2 did not say what changed:\n{said}")
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
        if report.get("init_unused_heads") != ["heads.1", "heads.5"]:
            raise Failure(f"{out}/report.json: init_unused_heads {report.get('init_unused_heads')}")
        outs[(cmd, src)] = f"{out}/weights.pb"
    if not same_params(outs[("train", shards)], outs[("run", shards)]):
        raise Failure("--init_from shards --stages=2: run and train differ")
    if not same_params(outs[("train", shards)], outs[("train", weights)]):
        raise Failure("--init_from --stages=2: the shards and weights.pb start differently")
    # ...and back: the 2-stage weights start the 4-stage job, the two new heads fresh.
    back = os.path.join(work, "regroup_back")
    said = lp("train", j, "--max_steps=5", f"--init_from={outs[('train', weights)]}",
              f"--out={back}", "--quiet")
    if "starting fresh (seeded): heads.1, heads.5" not in said:
        raise Failure(f"--init_from of 2 stages into 4 did not name the fresh heads:\n{said}")
    # The weights carry their split: the 2-stage weights with the 4-stage job file and no
    # --stages predict as 2 stages (said), exactly as with --stages=2; asking for 4 is refused
    # naming the heads they never trained, never answered by fresh heads.
    two = outs[("train", weights)]
    x = os.path.join(work, "split_x.npy")
    np.save(x, fashion_test_images(20).astype(np.uint8))
    taken = lp("predict", j, two, f"--input={x}", f"--out={work}/taken.csv")
    if "was trained as 2 stages: using that split (the job file has 4)" not in taken:
        raise Failure(f"predict did not take the weights' own split:\n{taken}")
    lp("predict", j, two, f"--input={x}", f"--out={work}/asked.csv", "--stages=2")
    if open(f"{work}/taken.csv").read() != open(f"{work}/asked.csv").read():
        raise Failure("predict with the weights' own split differs from --stages=2")
    refused = lp("export", j, two, f"--out={work}/x.safetensors", "--stages=4", expect=3)
    if "heads heads.1, heads.5 that these weights never trained (they were trained as 2 " \
            "stages: pass --stages=2" not in refused:
        raise Failure(f"export --stages=4 of 2-stage weights was not refused:\n{refused}")
    print("export_test: --init_from across splits: 4 stages (shards or weights.pb) into 2, "
          "train and run (weights in 64 KiB pieces) bitwise equal, and 2 into 4 with heads.1 and "
          "heads.5 fresh")


def check_large_model_path(work):
    """Past --weights_pb_limit_mib, train and run write the final weights as shards with the
    index in OUT/weights/ (the path a model over 2 GiB takes), bitwise the same, and predict,
    export and --init_from take that directory."""
    j = job("fashion_mlp")
    outs = []
    for cmd in ("train", "run"):
        out = os.path.join(work, f"large_{cmd}")
        said = lp(cmd, j, "--max_steps=5", "--weights_pb_limit_mib=1", f"--out={out}", "--quiet")
        if f"weights: {out}/weights" not in said or os.path.exists(f"{out}/weights.pb"):
            raise Failure(f"{cmd} --weights_pb_limit_mib=1 did not write {out}/weights/:\n{said}")
        outs.append(f"{out}/weights")
    shards = sorted(os.listdir(outs[0]))
    if shards != sorted(os.listdir(outs[1])) or len(shards) != 5:
        raise Failure(f"train and run wrote other shards: {shards} / {os.listdir(outs[1])}")
    for name in shards:
        if open(f"{outs[0]}/{name}", "rb").read() != open(f"{outs[1]}/{name}", "rb").read():
            raise Failure(f"{name}: train's and run's differ")
    x = os.path.join(work, "large.npy")
    np.save(x, fashion_test_images(100))
    lp("predict", j, outs[0], f"--input={x}")
    lp("export", j, outs[0], f"--out={work}/large.safetensors")
    lp("train", j, "--max_steps=2", f"--init_from={outs[0]}/model.safetensors.index.json",
       f"--out={work}/large_again", "--quiet")
    print(f"export_test: past --weights_pb_limit_mib: train and run wrote the same "
          f"{len(shards) - 1} shards and index, which predict, export and --init_from read")


def labels_of_test_set(n):
    raw = gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")).read()
    return np.frombuffer(raw, np.uint8, offset=8)[:n].astype(np.int64)


def check_input_range(work, weights):
    """Images already scaled to [0, 1] (torchvision's ToTensor()) are refused unless
    --input_scaled says so; with it, the accuracy is that of the raw 0..255 images."""
    raw = fashion_test_images(2000)
    x255 = os.path.join(work, "x255.npy")
    x01 = os.path.join(work, "x01.npy")
    y = os.path.join(work, "y.npy")
    np.save(x255, raw)
    np.save(x01, raw / np.float32(255))
    np.save(y, labels_of_test_set(2000))
    want = lp("predict", job("fashion_mlp"), weights, f"--input={x255}", f"--labels={y}")
    out = lp("predict", job("fashion_mlp"), weights, f"--input={x01}", f"--labels={y}", expect=4)
    if "--input_scaled" not in out or "0..255" not in out or "x01.npy" not in out:
        raise Failure(f"inputs in [0, 1] are not refused with the way out:\n{out}")
    got = lp("predict", job("fashion_mlp"), weights, f"--input={x01}", f"--labels={y}",
             "--input_scaled")
    accuracy = [line for line in want.splitlines() if line.startswith("accuracy")]
    if not accuracy or accuracy[0] not in got:
        raise Failure(f"--input_scaled does not give the raw images' accuracy:\n{want}\n{got}")
    out = lp("predict", job("fashion_mlp"), weights, f"--input={x255}", "--input_scaled",
             expect=4)
    if "outside [0, 1]" not in out:
        raise Failure(f"--input_scaled with raw pixels is not refused:\n{out}")
    print(f"export_test: inputs in [0, 1] refused without --input_scaled; with it, {accuracy[0]}")


def chunk(kind, data):
    return (struct.pack(">I", len(data)) + kind + data +
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def png(path, pixels):
    """Writes uint8 pixels [H, W] (grey) or [H, W, 3] (colour) as a PNG."""
    h, w = pixels.shape[:2]
    colour = pixels.ndim == 3
    rows = b"".join(b"\0" + pixels[r].tobytes() for r in range(h))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n"
                + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2 if colour else 0, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def check_own_images(work, weights, every_layer):
    """What people have: a flat folder of PNGs (no labels) predicts as the same pixels in an
    array; class folders may be named safely (T-shirt_top) or by number and score as the
    labels do; channels-first arrays ([N, C, H, W]) give the channels-last predictions."""
    n = 30
    images = fashion_test_images(n).astype(np.uint8)  # [n, 28, 28, 1]
    labels = labels_of_test_set(n)
    flat = os.path.join(work, "flat")
    os.makedirs(flat)
    for i in range(n):
        png(os.path.join(flat, f"img{i:03d}.png"), images[i, :, :, 0])
    x, y = os.path.join(work, "own.npy"), os.path.join(work, "own_labels.npy")
    np.save(x, images)
    np.save(y, labels)
    lp("predict", job("fashion_mlp"), weights, f"--input={flat}", f"--out={work}/flat.csv")
    want = lp("predict", job("fashion_mlp"), weights, f"--input={x}", f"--labels={y}",
              f"--out={work}/own.csv")
    got, ref = (open(f"{work}/{k}.csv").read().splitlines()[1:] for k in ("flat", "own"))
    if len(got) != n or [r.split(",")[-11:] for r in got] != [r.split(",")[-11:] for r in ref]:
        raise Failure(f"a flat folder of PNGs predicts otherwise than its pixels:\n{got}\n{ref}")
    # Class folders under safe names, and one by its number (9: Ankle boot).
    names = {0: "T-shirt_top", 1: "Trouser", 9: "9"}
    named = os.path.join(work, "named")
    keep = [i for i in range(n) if labels[i] in names]
    for i in keep:
        os.makedirs(os.path.join(named, names[labels[i]]), exist_ok=True)
        png(os.path.join(named, names[labels[i]], f"img{i:03d}.png"), images[i, :, :, 0])
    np.save(x, images[keep])
    np.save(y, labels[keep])
    said = lp("predict", job("fashion_mlp"), weights, f"--input={named}")
    want = lp("predict", job("fashion_mlp"), weights, f"--input={x}", f"--labels={y}")
    acc = [line for line in want.splitlines() if line.startswith("accuracy")]
    if not acc or acc[0] not in said:
        raise Failure(f"safely named class folders do not score as their labels:\n{said}\n{want}")
    os.makedirs(os.path.join(named, "T-shirt"))
    png(os.path.join(named, "T-shirt", "a.png"), images[0, :, :, 0])
    out = lp("predict", job("fashion_mlp"), weights, f"--input={named}", expect=4)
    if "class folder T-shirt is not one of the model's classes (T-shirt_top, Trouser" not in out:
        raise Failure(f"an unknown class folder is not refused with the safe names:\n{out}")
    # Channels first: PyTorch's [N, 1, 28, 28] pixels, and [N, 2, 8, 8] floats for a two-channel
    # network, give the channels-last logits, saying so.
    np.save(x, images.transpose(0, 3, 1, 2).copy())
    out = lp("predict", job("fashion_mlp"), weights, f"--input={x}", f"--out={work}/nchw.csv")
    if "read [N, 1, 28, 28] as channels first" not in out:
        raise Failure(f"a channels-first array is not said to be transposed:\n{out}")
    got, ref = (open(f"{work}/{k}.csv").read().splitlines()[1:] for k in ("nchw", "own"))
    if [r.split(",")[-11:] for r in got] != [r.split(",")[-11:] for r in ref]:
        raise Failure("[N, 1, 28, 28] predicts otherwise than [N, 28, 28, 1]")
    xo = os.path.join(work, "every_layer.nchw.npy")
    lp("predict", job("every_layer"), every_layer, f"--input={xo}", "--logits",
       f"--out={work}/el_nchw.npy")
    a, b = np.load(f"{work}/el_nchw.npy"), np.load(os.path.join(work, "every_layer.logits.npy"))
    if a.shape != b.shape or not np.array_equal(a, b):
        raise Failure("[N, 2, 8, 8] does not give the logits of [N, 8, 8, 2]")
    print(f"export_test: a flat folder of {n} PNGs, class folders named T-shirt_top and 9, and "
          "channels-first arrays predict as the channels-last arrays do")


def check_errors(work, weights):
    cnn = job("fashion_cnn")
    out = lp("export", cnn, weights, f"--out={work}/x.onnx", expect=3)
    if "layers.0.weight" not in out:
        raise Failure(f"a mismatched export does not name the parameter:\n{out}")
    out = lp("train", cnn, "--max_steps=1", f"--init_from={weights}", "--quiet", expect=3)
    if "--init_from" not in out or "layers.0.weight" not in out:
        raise Failure(f"a mismatched --init_from does not name the parameter:\n{out}")
    bad = os.path.join(work, "bad.npy")
    with open(bad, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'}          ")
    out = lp("predict", job("fashion_mlp"), weights, f"--input={bad}", expect=4)
    if "bad.npy" not in out:
        raise Failure(f"a corrupt .npy is not named:\n{out}")
    x = os.path.join(work, "few.npy")
    y = os.path.join(work, "few_labels.npy")
    np.save(x, fashion_test_images(5).astype(np.uint8))
    np.save(y, np.array([1, 2, 3, 4, 12], np.int64))
    out = lp("predict", job("fashion_mlp"), weights, f"--input={x}", f"--labels={y}", expect=4)
    if "few_labels.npy: label 4 is 12" not in out:
        raise Failure(f"a label out of range is not named by index:\n{out}")
    np.save(y, np.array([1, 2, 3], np.int64))
    out = lp("predict", job("fashion_mlp"), weights, f"--input={x}", f"--labels={y}", expect=4)
    if "3 labels for 5 examples" not in out:
        raise Failure(f"labels of another length are not refused:\n{out}")
    np.save(y, np.zeros((5, 1000), np.int64))
    out = lp("predict", job("fashion_mlp"), weights, f"--input={x}", f"--labels={y}", expect=4)
    if "its shape is [5,1000], one label per example is [5]" not in out:
        raise Failure(f"a table of labels is not refused:\n{out}")
    # Headers are checked before anything is decoded: an IDX file whose header promises
    # 65535 x 65535 images (4 GiB of them) and a PNG of 9000 x 9000 pixels (a few kilobytes
    # of file each).
    huge = os.path.join(work, "huge-images-idx3-ubyte.gz")
    with gzip.open(huge, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 1, 65535, 65535) + b"\0" * 1000)
    out = lp("predict", job("fashion_mlp"), weights, f"--input={huge}", expect=4)
    if "its header says examples of 4294836225 values each" not in out or \
            "nothing was decoded" not in out:
        raise Failure(f"a huge IDX header is not refused before decoding:\n{out}")
    big = os.path.join(work, "big")
    for c in ("a", "b"):
        os.makedirs(os.path.join(big, c))
    w = h = 9000
    raw = zlib.compress(b"\0" * ((w + 1) * h), 9)

    with open(os.path.join(big, "a", "big.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", raw) + chunk(b"IEND", b""))
    out = lp("predict", job("fashion_mlp"), weights, f"--input={big}", expect=4)
    if "big.png: is 9000x9000, over the 67108864 pixels an example may have" not in out:
        raise Failure(f"a 9000 x 9000 PNG is not refused from its header:\n{out}")
    # One PNG of your own (found by its signature, whatever its name) predicts exactly as the
    # same pixels in an array; one of another size or colour is refused saying what fits.
    image = fashion_test_images(1).astype(np.uint8)  # [1, 28, 28, 1]
    one = os.path.join(work, "my_shoe")  # no extension: the signature says PNG
    png(one, image[0, :, :, 0])
    lp("predict", job("fashion_mlp"), weights, f"--input={one}", f"--out={work}/png.csv")
    np.save(os.path.join(work, "one.npy"), image)
    lp("predict", job("fashion_mlp"), weights, f"--input={work}/one.npy", f"--out={work}/npy.csv")
    got, want = (open(f"{work}/{n}.csv").read().splitlines()[1:] for n in ("png", "npy"))
    if [r.split(",")[-10:] for r in got] != [r.split(",")[-10:] for r in want]:
        raise Failure(f"one PNG predicts otherwise than its pixels as an array:\n{got}\n{want}")
    png(os.path.join(work, "colour.png"), np.repeat(image[0], 3, axis=2))
    out = lp("predict", job("fashion_mlp"), weights, f"--input={work}/colour.png", expect=4)
    if "colour.png: a 28x28 colour image; the network takes 28x28 grey images [28,28,1]" \
            not in out:
        raise Failure(f"a colour PNG for a grey network is not refused saying why:\n{out}")
    none = os.path.join(work, "none.npy")
    np.save(none, np.zeros((0, 28, 28, 1), np.float32))
    out = lp("predict", job("fashion_mlp"), weights, f"--input={none}", f"--out={work}/n.npy",
             expect=4)
    if "none.npy: holds no examples" not in out:
        raise Failure(f"an .npy of 0 examples is not refused:\n{out}")
    print("export_test: mismatched weights, corrupt .npy, 0 examples and bad labels refused, "
          "naming them")


def main():
    if not os.path.isdir(ORT):
        print(f"export_test: {ORT} is missing: run `npm ci --ignore-scripts --prefix tests/onnx`")
        return 1
    work = tempfile.mkdtemp(prefix="localpar-export-")
    try:
        images = fashion_test_images(10000)
        mlp = check_onnx(work, "fashion_mlp", 200, images, pixels=True,
                         labels=labels_of_test_set(10000))
        check_onnx(work, "fashion_resnet", 20, images[:3000], stages=[0, 1, 2, None], pixels=True,
                   labels=labels_of_test_set(3000), external=True)
        check_onnx(work, "fortunes_charlm", 20, fortunes_windows(1000), external=True)
        check_shorter_windows(work, "fortunes_charlm", [1, 17])
        rng = np.random.default_rng(7)
        every = check_onnx(work, "every_layer", 0,
                           rng.normal(0, 1, (500, 8, 8, 2)).astype(np.float32),
                           stages=[0, 1, 2, None])
        check_onnx(work, "every_sequence_layer", 30, shakespeare_windows(500), stages=[0, None])
        check_shorter_windows(work, "every_sequence_layer", [5, 31])
        st = check_safetensors(work, mlp)
        check_init_from(work, mlp, st)
        check_large_model_path(work)
        check_input_range(work, mlp)
        check_errors(work, mlp)
        check_own_images(work, mlp, every)
    except Failure as e:
        print(f"export_test: FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("export_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
