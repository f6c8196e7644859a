"""The run cache: one JSON-lines file per sweep, meant to be committed, so that a sweep spans
sessions and machines.

Each line is one finished result, `{"kind": ..., "key": ..., "value": ...}`: a training
run under its run id, a profile under its name. A result is appended (and flushed to disk)
the moment it exists, so a sweep stopped at any point keeps everything it finished; a line
cut short by a crash is skipped, and said, on the next load. A later line for the same kind
and key replaces an earlier one. `compact()` rewrites the file sorted, one line per key.

Every value carries the configuration it was made with; the runners look a result up by
key and then compare configurations, so a result whose configuration changed (another job,
another budget) is never answered from the cache. `stale()` lists the entries that no
configuration of a sweep asks for any more."""

import json
import os
import threading

from experiments.common import fail, say


class RunCache:
    """`path`: the sweep's own file, read and appended to. `also`: other sweeps' files, read
    only, whose entries answer when this file has none for a key (a tuning run two sweeps
    share trains once)."""

    def __init__(self, path, also=()):
        self.path = path
        self.entries = {}  # (kind, key) -> value
        self.borrowed = {}  # (kind, key) -> value, from `also`
        self.lock = threading.Lock()
        self.skipped = 0
        if os.path.isdir(path):
            fail(f"{path}: a directory; the cache is one file per sweep (a .jsonl file)")
        if os.path.exists(path):
            self.entries = self._load(path)
        for other in also:
            if os.path.exists(other):
                self.borrowed.update(self._load(other))

    def _load(self, path):
        entries = {}
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                    entries[(item["kind"], item["key"])] = item["value"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    self.skipped += 1
                    say(f"warning: {path}:{number}: not a whole cache entry; skipped "
                        f"(a run cut short while it was written?)")
        return entries

    def get(self, kind, key):
        with self.lock:
            found = self.entries.get((kind, key))
            return found if found is not None else self.borrowed.get((kind, key))

    def keys(self, kind):
        with self.lock:
            return sorted(k for t, k in self.entries if t == kind)

    def put(self, kind, key, value):
        line = json.dumps({"kind": kind, "key": key, "value": value}, separators=(",", ":"))
        with self.lock:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            with open(self.path, "a+b") as f:
                # After a line cut short, start a line of our own.
                torn = False
                if f.seek(0, os.SEEK_END) > 0:
                    f.seek(-1, os.SEEK_END)
                    torn = f.read(1) != b"\n"
                f.write((b"\n" if torn else b"") + line.encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            self.entries[(kind, key)] = value

    def compact(self):
        """Rewrites the file with one line per entry, sorted by kind and key."""
        with self.lock:
            lines = [json.dumps({"kind": k, "key": key, "value": v}, separators=(",", ":"))
                     for (k, key), v in sorted(self.entries.items())]
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                f.write("".join(line + "\n" for line in lines))
            os.replace(tmp, self.path)

    def drop(self, kind, keys):
        """Removes these entries and rewrites the file (compacted)."""
        with self.lock:
            for key in keys:
                self.entries.pop((kind, key), None)
        self.compact()

    def stale(self, kind, wanted):
        """The keys of `kind` whose entries no configuration in `wanted` (key -> predicate on
        the cached value) accepts: results the sweep would never read back."""
        out = []
        for key in self.keys(kind):
            accept = wanted.get(key)
            if accept is None or not accept(self.get(kind, key)):
                out.append(key)
        return out
