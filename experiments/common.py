"""What every part of the runner shares: errors, progress lines, JSON and CSV files, the
data figures `localpar data` prints, and the sections the runners own in a results file."""

import csv
import json
import os
import re
import subprocess
import sys
import threading


class Failure(Exception):
    """A run, a spec or a file that stops the sweep; the front end prints it and exits 2."""


def fail(message):
    raise Failure(message)


_SAY = threading.Lock()


def say(line):
    """One progress line on stderr, whole even when runs go in parallel."""
    with _SAY:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def read_json(path):
    """A JSON file, or a Failure naming the file and, for bad JSON, the line and column."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{path}:{e.lineno}:{e.colno}: {e.msg}")


def write_json(path, value, indent=1):
    """Written whole or not at all (a temporary file renamed over it)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=indent)
    os.replace(tmp, path)


def write_csv(path, rows, cols):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def model_name(job_path):
    """A job's `name`, or its file name without the extension."""
    with open(job_path) as f:
        m = re.search(r'^\s*name:\s*"([^"]+)"', f.read(), re.M)
    return m.group(1) if m else os.path.splitext(os.path.basename(job_path))[0]


def data_figures(localpar, job):
    """`localpar data JOB`: the data's example counts, labels per example and, for text, the
    unigram baseline."""
    out = subprocess.run([localpar, "data", job], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{job}: cannot load its data: {out.stderr.strip()}")
    return json.loads(out.stdout)


def is_lr(x):
    """Whether a spec's value is a usable peak learning rate (a number in (0, 10))."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 10


# deploy/frontier.py owns the part of a results file between these markers; each matrix
# experiment owns its own pair; a rewrite of one section keeps the others.
FRONTIER_BEGIN = "<!-- frontier: begin (written by deploy/frontier.py) -->"
FRONTIER_END = "<!-- frontier: end -->"


def experiment_markers(name):
    return (f"<!-- experiment {name}: begin (written by deploy/experiment.py) -->",
            f"<!-- experiment {name}: end -->")


def replace_experiment_section(old, name, text):
    """The results file with experiment `name`'s section (between its markers) replaced by
    `text`, or added before the frontier's section (or at the end) when it has none yet.
    Every other experiment's section and the frontier's are kept as they are."""
    begin, end = experiment_markers(name)
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    if begin in old and end in old:
        start = old.index(begin)
        stop = old.index(end, start) + len(end)
        return old[:start] + block.rstrip("\n") + old[stop:]
    if FRONTIER_BEGIN in old:
        at = old.index(FRONTIER_BEGIN)
        return old[:at] + block + "\n" + old[at:]
    return (old.rstrip("\n") + "\n\n" if old.strip() else "") + block


TESTBED_BEGIN = "<!-- testbed: begin (written by deploy/testbed.py) -->"
TESTBED_END = "<!-- testbed: end -->"


def replace_testbed_section(old, md, name="testbed"):
    """The results file with `md` between the markers of testbed sweep `name`; absent, the
    section goes before the first experiment's (the measured results lead)."""
    begin = TESTBED_BEGIN.replace("testbed:", f"{name}:", 1)
    end = TESTBED_END.replace("testbed:", f"{name}:", 1)
    block = f"{begin}\n{md.rstrip()}\n{end}\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        return head + block + "\n" + tail
    first = old.find("<!-- experiment ")
    if first < 0:
        first = old.find(FRONTIER_BEGIN)
    if first < 0:
        return old.rstrip("\n") + ("\n\n" if old else "") + block
    return old[:first] + block + "\n" + old[first:]


def replace_frontier_section(old, md):
    """The results file with `md` between the frontier markers (appended when absent)."""
    block = f"{FRONTIER_BEGIN}\n{md}\n{FRONTIER_END}\n"
    if FRONTIER_BEGIN in old and FRONTIER_END in old:
        head, rest = old.split(FRONTIER_BEGIN, 1)
        tail = rest.split(FRONTIER_END, 1)[1].lstrip("\n")
        return head + block + tail
    return old.rstrip("\n") + ("\n\n" if old else "") + block


def rewrite(path, change):
    """Applies `change` (old text -> new text) to the file at `path` (empty when absent)."""
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    with open(path, "w") as f:
        f.write(change(old))
