"""The journal's schema, shim/core/events.def, against both of its sides.

The shim's side: events.c writes every event through EV() and every key
through F() (a key without a row does not compile), and here every row is
written somewhere, and no other key is.

The report's side: a journal holding every event with every field of its row
(values of the row's type) is read and reported (text, HTML, trace,
recommend) with each JSON object wrapped so that the keys read are
recorded. An event the reader has no handler for, a field marked R that
nothing read, a key read that has no row: each fails, naming the row or the
key. docs/journal.md is what events.def makes.
"""
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
import unittest
from contextlib import redirect_stdout, redirect_stderr
from unittest import mock

from gg import PYHELPER, ROOT

spec = importlib.util.spec_from_file_location(
    "journal_doc", os.path.join(ROOT, "tools", "build-aux", "journal_doc.py"))
journal_doc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(journal_doc)

if PYHELPER not in sys.path:
    sys.path.insert(0, PYHELPER)
import gpuguard.journal.reader as reader  # noqa: E402
from gpuguard.report import cli  # noqa: E402

SCHEMA = journal_doc.parse()


def fields_of(owner):
    return [f for f in SCHEMA["fields"] if f["of"] == owner]


class Reads(object):
    """Where each key was read: {(path, key)}; a path is the event, then
    ".key" into an object and ".key[]" into a list's objects."""

    def __init__(self):
        self.seen = set()


class Tracked(dict):
    """A JSON object that says which of its keys are read, and keys asked for
    that it does not have."""
    __slots__ = ("_path", "_reads")

    def _note(self, key):
        self._reads.seen.add((self._path, key))

    def __getitem__(self, key):
        self._note(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._note(key)
        return dict.get(self, key, default)

    def __contains__(self, key):
        self._note(key)
        return dict.__contains__(self, key)

    def _all(self):
        for k in dict.keys(self):
            self._note(k)

    def items(self):
        self._all()
        return dict.items(self)

    def values(self):
        self._all()
        return dict.values(self)

    def __iter__(self):
        self._all()
        return dict.__iter__(self)

    def copy(self):
        return wrap(dict(dict.items(self)), self._path, self._reads)


def wrap(value, path, reads):
    if isinstance(value, dict):
        t = Tracked()
        t._path, t._reads = path, reads
        for k, v in value.items():
            dict.__setitem__(t, k, wrap(v, path + "." + k, reads))
        return t
    if isinstance(value, list):
        return [wrap(v, path + "[]", reads) for v in value]
    return value


def sample_value(field, ev, n):
    """A value of the row's type, plausible enough for the report to use."""
    t = field["type"].split("|")[0]
    key = field["key"]
    if t == "frames":
        return [{f["key"]: sample_value(f, ev, n) for f in fields_of("frame")}]
    if t == "pyframes":
        return [{f["key"]: sample_value(f, ev, n) for f in fields_of("pyframe")}]
    if t == "counts":
        return {"near_miss": 3 + n, "sample": 5}
    if t == "hex":
        return "0x7f00001234%02x" % n
    if t == "bool":
        return True
    if t == "float":
        return 1.5 + n
    if t.startswith("list(int"):
        return [0]
    if t.startswith("list(str"):
        return ["sm_86"]
    if t in ("int", "uint"):
        if key in ("dev", "rank"):
            return 0
        if key in ("batch_size", "grad_accum", "step", "since_step", "projected_step", "seq",
                   "count", "line", "pid", "allocs", "frees", "near_misses", "refusals",
                   "ooms", "live_allocs", "sites", "lost", "lost_lines", "off", "fatbins",
                   "read_us", "unknown_frees"):
            return 4 + n
        return (1 << 30) + n * (1 << 20)  # bytes
    if key == "cc":
        return "8.6"
    if key in ("mode", "dev_mode"):
        return "enforce"
    if key == "reason":
        return "forecast" if ev == "advice" else "near_miss"
    if key == "api":
        return "cudaMalloc"
    if key == "text":
        return "advice #4: batch 8 -> 4"
    return "%s-%d" % (key, n)


def build_line(ev, n):
    """The event ev with every field of its row, nested where the row says."""
    line = {"t": 1.0 + n, "ev": ev["ev"]}
    for f in fields_of(ev["fields"]):
        if f["type"] in ("list", "object") and f["parent"] == "":
            line[f["key"]] = [] if f["type"] == "list" else {}
    for f in fields_of(ev["fields"]):
        if f["type"] in ("list", "object") and f["parent"] == "":
            continue
        where = line
        for part in [p for p in f["parent"].split(".") if p]:
            if part.endswith("[]"):
                lst = where.setdefault(part[:-2], [])
                if not lst:
                    lst.append({})
                where = lst[0]
            else:
                where = where.setdefault(part, {})
        if f["type"] == "list":
            where.setdefault(f["key"], [{}])
        elif f["type"] == "object":
            where.setdefault(f["key"], {})
        else:
            where[f["key"]] = sample_value(f, ev["ev"], n)
    return line


def expected():
    """(path, key) -> row, for every field of every event."""
    want = {}

    def add(owner, base, ev):
        for f in fields_of(owner):
            path = base + ("." + f["parent"] if f["parent"] else "")
            want[(path, f["key"])] = f
            if f["type"].split("|")[0] in ("frames", "pyframes"):
                part = f["type"].split("|")[0][:-1]
                add(part, path + "." + f["key"] + "[]", ev)
    for ev in SCHEMA["events"]:
        add(ev["fields"], ev["ev"], ev)
    return want


class Schema(unittest.TestCase):
    def test_events_def_parses_and_every_event_has_fields(self):
        self.assertTrue(SCHEMA["events"])
        owners = {f["of"] for f in SCHEMA["fields"]}
        for e in SCHEMA["events"]:
            self.assertIn(e["fields"], owners, e["line"])

    def test_events_c_writes_every_row_and_only_rows(self):
        with open(os.path.join(ROOT, "shim", "core", "events.c")) as f:
            src = "".join(l for l in f if not l.lstrip().startswith("#define"))
        src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
        used_f = set(re.findall(r"\bF\((\w+),\s*(\w+)\)", src))
        used_ev = set(re.findall(r"\bEV\((\w+)\)", src))
        rows = {(f["of"], f["id"]) for f in SCHEMA["fields"]}
        self.assertEqual(sorted(rows - used_f), [],
                         "rows of events.def that events.c never writes")
        self.assertEqual(sorted(used_f - rows), [])
        self.assertEqual(sorted({e["ev"] for e in SCHEMA["events"]} - used_ev), [],
                         "events events.c never writes")
        # every key goes through F(): the line's own "t" and "ev" aside
        raw = re.findall(r'gg_json_k\w*\(\s*&?j,\s*"(\w+)"', src)
        self.assertEqual(sorted(set(raw)), ["ev", "t"])

    def test_the_report_reads_what_the_shim_writes_and_nothing_else(self):
        lines = [build_line(ev, n) for n, ev in enumerate(SCHEMA["events"])]
        reads = Reads()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "gpuguard.python3.4242.jsonl")
            with open(path, "w") as f:
                for line in lines:
                    f.write(json.dumps(line) + "\n")

            def loads(raw):
                ev = json.loads(raw)
                return wrap(ev, ev.get("ev", "?"), reads)
            fake_json = mock.Mock(loads=loads)
            out, err = io.StringIO(), io.StringIO()
            with mock.patch.object(reader, "json", fake_json), redirect_stdout(out), \
                    redirect_stderr(err):
                rc = cli.main([path, "--recommend", "--html", os.path.join(tmp, "r.html"),
                               "--trace", os.path.join(tmp, "r.json")])
        self.assertEqual(rc, 0, err.getvalue())
        self.assertNotIn("unknown events", out.getvalue(),
                         "an event the reader has no handler for")
        want = expected()
        unread = sorted("%s (%s): %s" % (k[1], k[0], f["line"]) for k, f in want.items()
                        if f["use"] == "R" and k not in reads.seen
                        and not self._read_elsewhere(f, reads))
        self.maxDiff = None
        self.assertEqual(unread, [], "fields events.def marks R that the report never reads")
        counts = {p + "." + f["key"] for (p, _), f in want.items() if f["type"] == "counts"}
        unknown = sorted("%s in %s" % (k[1], k[0]) for k in reads.seen
                         if k not in want and k[1] not in ("t", "ev")
                         and k[0] not in counts)  # a count's key is a kind of line
        self.assertEqual(unknown, [], "keys the report reads that events.def has no row for")

    @staticmethod
    def _read_elsewhere(f, reads):
        """A part's field (a frame's, an incident's) counts as read when any
        event that holds the part had it read."""
        if f["of"] in {e["ev"] for e in SCHEMA["events"]}:
            return False
        want = expected()
        return any(k in reads.seen for k, g in want.items() if g is f)

    def test_docs_journal_md_is_what_events_def_makes(self):
        with open(journal_doc.JOURNAL_MD) as f:
            page = f.read()
        self.assertEqual(journal_doc.rewrite(page, journal_doc.render(SCHEMA, journal_doc.budgets())),
                         page, "run tools/build-aux/journal_doc.py")
        for e in SCHEMA["events"]:
            self.assertIn("[`%s`]" % e["ev"], page)


if __name__ == "__main__":
    unittest.main()
