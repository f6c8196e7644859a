"""Spec files (JSON) into dataclasses. Every field says what it accepts; a wrong or unknown
field is refused naming its place in the file (`spec.json: models[0].batch_sizes: ...`)."""

import dataclasses
import os

from experiments.common import fail, is_lr, read_json


def setting(want, check=None, default=dataclasses.MISSING, factory=dataclasses.MISSING):
    """A dataclass field read from the spec: `check(value)` must hold, `want` says what it
    takes. Without a default, the field is required."""
    return dataclasses.field(default=default, default_factory=factory,
                             metadata={"want": want, "check": check})


def derived(default=None, factory=dataclasses.MISSING):
    """A field the runner fills in, never read from the spec."""
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={"derived": True})
    return dataclasses.field(default=default, metadata={"derived": True})


def build(cls, data, where):
    """A `cls` from the JSON object `data`, each field checked; `where` names it in errors."""
    if not isinstance(data, dict):
        fail(f"{where}: a JSON object is required")
    fields = [f for f in dataclasses.fields(cls) if not f.metadata.get("derived")]
    known = {f.name for f in fields}
    for key in data:
        if key not in known:
            fail(f"{where}.{key}: not a setting here (one of {', '.join(sorted(known))})")
    values = {}
    for f in fields:
        if f.name in data:
            value = data[f.name]
            check = f.metadata.get("check")
            if check is not None and not check(value):
                fail(f"{where}.{f.name}: {f.metadata['want']}")
            values[f.name] = value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            fail(f"{where}.{f.name}: required ({f.metadata['want']})")
    return cls(**values)


def load(path):
    """A spec file's JSON object and the directory its relative paths start from."""
    data = read_json(path)
    if not isinstance(data, dict):
        fail(f"{path}: a JSON object is required")
    return data, os.path.dirname(os.path.abspath(path))


def job_path(base, value, where):
    """A job file named by a spec, relative to the spec; it must exist."""
    path = os.path.normpath(os.path.join(base, value))
    if not os.path.exists(path):
        fail(f"{where}: {path} does not exist")
    return path


# The checks the specs use.
def positive_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def whole(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def positive_ints(v):
    return isinstance(v, list) and bool(v) and all(positive_int(x) for x in v)


def seeds(v):
    return isinstance(v, list) and bool(v) and all(whole(x) for x in v)


def positive_numbers(v):
    return isinstance(v, list) and bool(v) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in v)


def positive_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def learning_rate(v):
    return is_lr(v)


def boolean(v):
    return isinstance(v, bool)


def text(v):
    return isinstance(v, str) and bool(v)


def one_of(*choices):
    return lambda v: v in choices
