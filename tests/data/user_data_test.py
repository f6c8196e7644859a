"""Users' own data: NumPy arrays (written by NumPy itself) and PNG image folders.

  user_data_test.py LOCALPAR

Fashion-MNIST's first three classes at 14x14 become an .npz (uint8, with a test split), a
deflated .npz of float32 without one (scored on data.holdout_fraction), four .npy files, and
an image folder of PNGs (written here with zlib, not by localpar). Each trains with `run` and
`train`; `localpar data` reports 3 classes; `predict` on the image folder reproduces the
run's final test accuracy. Then the bad inputs, each refused with exit 4 and the file named:
a corrupt .npy header, a PNG that does not decode, inputs and labels of different lengths,
classes declared wrongly, an image of another size, and no test split without a holdout.
"""
import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

LOCALPAR = sys.argv[1]
FASHION = "/usr/share/datasets/fashion-mnist"
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


class Failure(Exception):
    pass


def lp(*args, expect=0):
    p = subprocess.run([LOCALPAR, *args], capture_output=True, text=True, env=ENV, timeout=600)
    if p.returncode != expect:
        raise Failure(f"localpar {' '.join(args)}: exit {p.returncode}, wanted {expect}\n"
                      f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr


def idx(name, offset):
    return np.frombuffer(gzip.open(os.path.join(FASHION, name + ".gz")).read(), np.uint8,
                         offset=offset)


def png(path, img):
    h, w = img.shape[:2]
    colour = img.ndim == 3
    kind = (6 if img.shape[2] == 4 else 2) if colour else 0  # RGBA, RGB or grey
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" +
                chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, kind, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


JOB = """name: "{name}"
rule: GREEDY
batch_size: 32
epochs: 2
seed: 3
data {{ {data} }}
stages {{ layers {{ conv2d {{ out_channels: 8 padding: 1 }} }} layers {{ relu {{}} }} head {{ kind: POOL_LINEAR }} }}
stages {{ layers {{ flatten {{}} }} layers {{ linear {{ out_features: 32 }} }} layers {{ relu {{}} }} head {{ kind: LINEAR }} }}
"""


def write_job(work, name, data):
    path = os.path.join(work, f"{name}.textproto")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=data))
    return path


def final_test_accuracy(out):
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    last = report["epochs"][-1]
    return (last.get("test") or last["validation"])[-1]["accuracy"]


def fashion_subset():
    """The first 1500 training and 300 test images of three classes, at 14x14."""
    x = idx("train-images-idx3-ubyte", 16).reshape(-1, 28, 28)[:, ::2, ::2]
    y = idx("train-labels-idx1-ubyte", 8)
    xt = idx("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28)[:, ::2, ::2]
    yt = idx("t10k-labels-idx1-ubyte", 8)
    x, y = x[y < 3][:1500], y[y < 3][:1500].astype(np.int64)
    xt, yt = xt[yt < 3][:300], yt[yt < 3][:300].astype(np.int64)
    return x, y, xt, yt


def check_npz(work, x, y, xt, yt):
    npz = os.path.join(work, "fm3.npz")
    np.savez(npz, x_train=x, y_train=y, x_test=xt, y_test=yt)
    job = write_job(work, "npz", f'numpy {{ npz: "{npz}" }}')
    figures = json.loads(lp("data", job))
    if figures["classes"] != 3 or figures["train_examples"] != 1500:
        raise Failure(f"localpar data on the .npz: {figures}")
    lp("run", job, "--quiet")
    lp("train", job, "--quiet")
    print("user_data_test: .npz (uint8, 14x14, 3 classes): run and train ok")
    with open(job) as f:
        limited = f.read().replace("seed: 3", "seed: 3\neval_limit: 100")
    with open(job, "w") as f:
        f.write(limited)
    for how in ("run", "train"):
        out = os.path.join(work, f"limited_{how}")
        lp(how, job, "--quiet", f"--out={out}")
        with open(os.path.join(out, "report.json")) as f:
            scored = [t["examples"] for e in json.load(f)["epochs"]
                      for t in e.get("test") or e["validation"]]
        if set(scored) != {100}:
            raise Failure(f"eval_limit 100 ({how}): evaluations scored {scored}")
    print("user_data_test: eval_limit 100 scores 100 examples per evaluation (run and train)")
    return npz


def check_npz_holdout(work, x, y):
    npzc = os.path.join(work, "fm3c.npz")
    np.savez_compressed(npzc, x_train=x.astype(np.float32) / 255, y_train=y.astype(np.int32))
    job = write_job(work, "npzc", f'numpy {{ npz: "{npzc}" }} holdout_fraction: 0.2')
    out = lp("train", job, "--quiet", f"--out={work}/holdout_train")
    if "1200 train / 300 validation" not in out:
        raise Failure(f"holdout_fraction 0.2 of 1500 should leave 1200 / 300:\n{out}")
    lp("run", job, "--quiet", f"--out={work}/holdout_run")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "containers"))
    from compose_test import weight_stages  # a protobuf field walk, no protoc
    if (weight_stages(f"{work}/holdout_train/weights.pb") !=
            weight_stages(f"{work}/holdout_run/weights.pb")):
        raise Failure("holdout_fraction: run and train weights differ")
    print("user_data_test: deflated .npz of float32 with holdout_fraction 0.2: 1200 / 300, "
          "run and train bitwise equal")
    return npzc


def check_npy(work, x, y, xt, yt):
    files = {}
    for k, v in {"x_train": x[..., None], "y_train": y, "x_test": xt[..., None],
                 "y_test": yt}.items():
        files[k] = os.path.join(work, f"{k}.npy")
        np.save(files[k], v)
    job = write_job(work, "npy", "numpy { " + " ".join(f'{k}: "{v}"' for k, v in
                                                      files.items()) + " }")
    lp("train", job, "--quiet")
    print("user_data_test: four .npy files ([count, 14, 14, 1]): train ok")
    return files


def check_folders(work, x, y, xt, yt):
    """An image folder of PNGs: a cluster trains on it and predict scores it the same."""
    names = ["pullover", "trouser", "tshirt"]  # sorted: label 0 is "pullover"
    order = {0: "tshirt", 1: "trouser", 2: "pullover"}  # Fashion-MNIST's names
    for split, (xs, ys) in {"train": (x, y), "test": (xt, yt)}.items():
        for n in names:
            os.makedirs(os.path.join(work, "folders", split, n))
        for i, (img, label) in enumerate(zip(xs, ys)):
            png(os.path.join(work, "folders", split, order[int(label)], f"{i:05d}.png"), img)
    folders = os.path.join(work, "folders")
    job = write_job(work, "folders", f'image_folder {{ train_dir: "{folders}/train" '
                                     f'test_dir: "{folders}/test" }}')
    run_out = os.path.join(work, "folders_run")
    lp("run", job, "--quiet", f"--out={run_out}")
    got = lp("predict", job, f"{run_out}/weights.pb", f"--input={folders}/test")
    want = final_test_accuracy(run_out)
    line = [l for l in got.splitlines() if l.startswith("accuracy:")][0]
    if f"{100 * want:.2f}%" not in line:
        raise Failure(f"predict on the test folder says {line!r}, the run {want:.4f}")
    print(f"user_data_test: image folder of PNGs: run, then predict agrees ({line})")
    return names, job, folders, run_out, got


def check_class_names(work, names, job, folders, run_out, got):
    # Class names travel with the weights: predict names each image's file and class,
    # the CSV has a column per class name, and the exports carry them.
    if not re.search(r"test/(pullover|trouser|tshirt)/\d{5}\.png: (pullover|trouser|tshirt) "
                     r"\(\d+\.\d%\)", got):
        raise Failure(f"predict does not name the files and classes:\n{got}")
    csv_out = os.path.join(work, "preds.csv")
    lp("predict", job, f"{run_out}/weights.pb", f"--input={folders}/test", f"--out={csv_out}")
    with open(csv_out) as f:
        header, first = f.readline().strip(), f.readline().strip().split(",")
    if header != "example,file,predicted,pullover,trouser,tshirt" or \
            not first[1].endswith(".png") or first[2] not in names:
        raise Failure(f"predict's CSV: {header} / {first}")
    st = os.path.join(work, "folders.safetensors")
    lp("export", job, f"{run_out}/weights.pb", f"--out={st}")
    with open(st, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))["__metadata__"]
    if json.loads(meta["class_names"]) != names:
        raise Failure(f"safetensors metadata class_names: {meta.get('class_names')}")
    onnx = os.path.join(work, "folders.onnx")
    lp("export", job, f"{run_out}/weights.pb", f"--out={onnx}")
    if b'localpar.class_names' not in open(onnx, "rb").read() or \
            b'["pullover","trouser","tshirt"]' not in open(onnx, "rb").read():
        raise Failure("the ONNX metadata has no class names")
    # A folder with some of the classes, in another order, is scored by name; a class
    # the model does not know is refused, naming it.
    part = os.path.join(work, "part")
    shutil.copytree(os.path.join(folders, "test", "tshirt"), os.path.join(part, "a_tshirt"))
    shutil.copytree(os.path.join(folders, "test", "trouser"), os.path.join(part, "trouser"))
    out = lp("predict", job, f"{run_out}/weights.pb", f"--input={part}", expect=4)
    if "class folder a_tshirt is not one of the model's classes" not in out:
        raise Failure(f"an unknown class folder is not refused by name:\n{out}")
    os.rename(os.path.join(part, "a_tshirt"), os.path.join(part, "tshirt"))
    out = lp("predict", job, f"{run_out}/weights.pb", f"--input={part}")
    if "accuracy:" not in out:
        raise Failure(f"a folder with 2 of the 3 classes is not scored:\n{out}")
    print("user_data_test: class names in predict's lines and CSV, safetensors and ONNX; "
          "a folder of some classes scored by name")


def check_folder_hygiene(job, folders):
    # Folder hygiene: a stray file is skipped with a warning; an RGBA image in a grey
    # folder and an empty class folder are refused, naming them.
    notes = os.path.join(folders, "train", "trouser", "notes.txt")
    with open(notes, "w") as f:
        f.write("not an image\n")
    out = lp("data", job)
    if "warning" not in out or "skipped 1 file(s) that are not .png (notes.txt)" not in out:
        raise Failure(f"a non-PNG file is skipped silently:\n{out}")
    os.remove(notes)
    rgba = os.path.join(folders, "train", "trouser", "zz_rgba.png")
    png(rgba, np.zeros((14, 14, 4), np.uint8))
    out = lp("data", job, expect=4)
    if "zz_rgba.png: is colour with alpha (RGBA)" not in out or "grey" not in out:
        raise Failure(f"an RGBA image in a grey folder is not refused:\n{out}")
    os.remove(rgba)
    os.makedirs(os.path.join(folders, "train", "zempty"))
    out = lp("data", job, expect=4)
    if "zempty: class folder holds no .png files" not in out:
        raise Failure(f"an empty class folder is not refused:\n{out}")
    os.rmdir(os.path.join(folders, "train", "zempty"))
    print("user_data_test: a stray file warned about; RGBA in a grey folder and an empty class "
          "folder refused, naming them")


def check_bad_input(work, y, files, npz, npzc, job, folders):
    # Bad input: exit 4, naming the file.
    bad = os.path.join(work, "bad.npy")
    with open(bad, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (3,}\n" + b"\0" * 12)
    out = lp("train", write_job(work, "b1", f'numpy {{ x_train: "{bad}" y_train: '
                                          f'"{files["y_train"]}" }}'), expect=4)
    assert "bad.npy" in out, out
    short = os.path.join(work, "short.npy")
    np.save(short, y[:10])
    out = lp("train", write_job(work, "b2", f'numpy {{ x_train: "{files["x_train"]}" '
                                          f'y_train: "{short}" x_test: "{files["x_test"]}" '
                                          f'y_test: "{files["y_test"]}" }}'), expect=4)
    assert "1500 examples" in out and "10 labels" in out, out
    out = lp("train", write_job(work, "b3", f'numpy {{ npz: "{npz}" classes: 5 }}'), expect=4)
    assert "data.numpy.classes: 5" in out, out
    out = lp("train", write_job(work, "b4", f'numpy {{ npz: "{npzc}" }}'), expect=4)
    assert "holdout_fraction" in out, out
    with open(os.path.join(folders, "test", "trouser", "zz_broken.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + b"not an image")
    out = lp("train", job, "--quiet", expect=4)
    assert "zz_broken.png" in out, out
    os.remove(os.path.join(folders, "test", "trouser", "zz_broken.png"))
    png(os.path.join(folders, "test", "trouser", "zz_big.png"), np.zeros((20, 20), np.uint8))
    out = lp("train", job, "--quiet", expect=4)
    assert "zz_big.png" in out and "20x20" in out, out
    print("user_data_test: corrupt .npy, undecodable PNG, length mismatch, wrong classes, "
          "another image size and a missing test split: exit 4, file named")


def main():
    work = tempfile.mkdtemp(prefix="localpar-userdata-")
    try:
        x, y, xt, yt = fashion_subset()
        npz = check_npz(work, x, y, xt, yt)
        npzc = check_npz_holdout(work, x, y)
        files = check_npy(work, x, y, xt, yt)
        names, job, folders, run_out, got = check_folders(work, x, y, xt, yt)
        check_class_names(work, names, job, folders, run_out, got)
        check_folder_hygiene(job, folders)
        check_bad_input(work, y, files, npz, npzc, job, folders)
    except (Failure, AssertionError) as e:
        print(f"user_data_test: FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("user_data_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
