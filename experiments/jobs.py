"""Job files through protobuf's text format (python3-protobuf and Debian's protoc): parsed
into `localpar.v1.Job` messages from proto/job.proto, changed as messages, written back as
text. A job's hash is the hash of its message, not of its text, so comments and layout do
not change a configuration."""

import atexit
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from experiments.common import fail

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LOCK = threading.Lock()
_MODULES = {}


def _protobuf():
    """(job_pb2, text_format), generated from proto/ on first use."""
    with _LOCK:
        if not _MODULES:
            try:
                from google.protobuf import text_format
            except ImportError:
                fail("needs protobuf for Python (Debian's python3-protobuf): run it with "
                     f"/usr/bin/python3, not {sys.executable}")
            protoc = shutil.which("protoc")
            if protoc is None:
                fail("needs protoc (Debian package protobuf-compiler)")
            gen = tempfile.mkdtemp(prefix="localpar_experiments_pb.")
            atexit.register(shutil.rmtree, gen, True)
            out = subprocess.run([protoc, "-I", SOURCE, "--python_out", gen,
                                  "proto/job.proto", "proto/options.proto"],
                                 capture_output=True, text=True, cwd=SOURCE)
            if out.returncode != 0:
                fail(f"protoc failed on proto/job.proto: {out.stderr.strip()}")
            sys.path.insert(0, gen)
            _MODULES["job_pb2"] = importlib.import_module("proto.job_pb2")
            _MODULES["text_format"] = text_format
        return _MODULES["job_pb2"], _MODULES["text_format"]


def parse_job(text, where):
    """A Job message from text-format `text`; a Failure naming `where` when it is not one."""
    job_pb2, text_format = _protobuf()
    job = job_pb2.Job()
    try:
        text_format.Parse(text, job)
    except text_format.ParseError as e:
        message = str(e).split(" : ", 1)[-1]
        if e.GetLine() is not None:
            fail(f"{where}:{e.GetLine()}:{e.GetColumn()}: {message}")
        fail(f"{where}: {message}")
    return job


def read_job(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    return parse_job(text, path)


def job_text(job):
    return _protobuf()[1].MessageToString(job)


def message_hash(job):
    """A job message's content hash (its deterministic wire bytes), part of every cache key
    that depends on the job."""
    return hashlib.sha256(job.SerializeToString(deterministic=True)).hexdigest()[:16]


def job_hash(path):
    """The content hash of the job in the file at `path`."""
    return message_hash(read_job(path))


def normalized_job(localpar, path):
    """The job with every default filled in and its data paths resolved, as `localpar
    validate` prints it."""
    out = subprocess.run([localpar, "validate", path], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{path}: {out.stderr.strip()}")
    lines = out.stdout.split("\n")[1:]  # after "JOB: ok"
    return parse_job("\n".join(line for line in lines if not line.startswith("#")),
                     f"{path} (as `localpar validate` prints it)")


def warmup_cosine(kind, warmup_examples, min_lr_fraction, batch):
    """The schedule of one sweep run: a linear warm-up over `warmup_examples` (in steps at
    this batch size), then `kind` (COSINE: down to min_lr_fraction x lr over the run's
    max_steps). lr is 1 here: --lr sets it, and min_lr scales with it."""
    job_pb2, _ = _protobuf()
    s = job_pb2.Schedule()
    s.kind = job_pb2.Schedule.Kind.Value(kind)
    s.lr = 1
    s.warmup_steps = max(0, round(warmup_examples / batch))
    if kind == "COSINE":
        s.min_lr = min_lr_fraction
    return s


def derive_job(job, schedule=None, first_stages=None):
    """A copy of `job` with its schedule replaced by `schedule` (a Schedule message) and only
    its first `first_stages` stages kept (the network cut after them, the last kept stage's
    head the output)."""
    out = type(job)()
    out.CopyFrom(job)
    if schedule is not None:
        out.schedule.CopyFrom(schedule)
    if first_stages is not None:
        del out.stages[first_stages:]
    return out


def set_rule(job, name):
    """Sets the job's update rule by its name in job.proto ("BACKPROP")."""
    field = job.DESCRIPTOR.fields_by_name["rule"]
    job.rule = field.enum_type.values_by_name[name].number


def set_pipeline_schedule(job, schedule):
    """Sets BACKPROP's pipeline schedule by its flag name ("gpipe", "1f1b"); GPipe, the
    default, leaves the field unset so that the job's text (and its hash) do not change."""
    field = job.DESCRIPTOR.fields_by_name["pipeline_schedule"]
    job.pipeline_schedule = field.enum_type.values_by_name[f"PIPELINE_{schedule.upper()}"].number


def write_job(path, job):
    """Writes `job` as text to `path` unless the file already says exactly that."""
    text = job_text(job)
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return path
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path


# Where each data source reads from (common/job/sources/): its path fields, each a file or a
# folder, and the default a source falls back to when the job names none.
_DATA_PATHS = {
    "fashion_mnist": [("dir", True)],
    "cifar10": [("dir", True)],
    "text": [("paths", None), ("validation_paths", None)],
    "tokens": [("train_paths", False), ("validation_paths", False)],
    "numpy": [("npz", False), ("x_train", False), ("y_train", False), ("x_test", False),
              ("y_test", False)],
    "image_folder": [("train_dir", True), ("test_dir", True)],
}
_DATA_DEFAULTS = {("fashion_mnist", "dir"): "/usr/share/datasets/fashion-mnist",
                  ("text", "paths"): "/usr/share/games/fortunes"}


def data_paths(job):
    """[(field, path, folder)] for every file or folder the job's data reads, defaults
    filled in: field as `data.text.paths[0]`, folder True/False (None: either, as a text
    corpus path may be). A synthetic source reads none."""
    source = job.data.WhichOneof("source") or "fashion_mnist"
    message = getattr(job.data, source)
    out = []
    for name, folder in _DATA_PATHS.get(source, []):
        value = getattr(message, name)
        values = list(value) if not isinstance(value, str) else ([value] if value else [])
        if not values and (source, name) in _DATA_DEFAULTS:
            values = [_DATA_DEFAULTS[(source, name)]]
        repeated = not isinstance(value, str)
        for i, v in enumerate(values):
            out.append((f"data.{source}.{name}" + (f"[{i}]" if repeated else ""), v, folder))
    return out


def set_data_path(job, field, path):
    """Sets the data field `field` (as data_paths names it) to `path`."""
    source, name = field.split(".")[1:3]
    message = getattr(job.data, source)
    if "[" in name:
        name, index = name[:-1].split("[")
        values = getattr(message, name)
        while len(values) <= int(index):
            values.append("")
        values[int(index)] = path
    else:
        setattr(message, name, path)
