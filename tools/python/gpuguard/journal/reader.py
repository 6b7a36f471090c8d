"""One journal file read line by line into its bounded summary (leniently: a
truncated last line, non-UTF-8 text, unknown events and fields, wrong shapes
are counted and skipped), its identity from the file name and the `start`
event; reading several paths and directories; the (journal, device) sections
in report order and the count of unused devices left out.
"""

import json
import os
import re
from collections import OrderedDict

from .arch import runs_only_by_jit
from .device import Device
from .limits import ARCH_MAX, ERRORS_MAX, NOTES_MAX, NOTE_CHARS
from .pytorch import TorchLog
from .values import as_int, as_str, num

NAME_RE = re.compile(r"^gpuguard\.(?P<comm>.+?)(?:\.rank(?P<rank>\d+))?\.(?P<pid>\d+)\.jsonl$")
# What read_journals says of a file none of whose lines is a journal line
# (the report's command exits 2 for it: a wrong argument, not a journal).
NOT_A_JOURNAL = "not a gpuguard journal: "
NOTE_SEQ_RE = re.compile(r"advice #(\d+)")


class Journal(object):
    def __init__(self, path, nframes=4, native=False):
        self.path = path
        self.nframes = nframes
        self.native = native         # stacks as the shim took them (--native)
        self.pt = TorchLog(native)   # the `torch` and `backward` lines; stacks in PyTorch's terms
        self.start = None
        self.pid = None
        self.comm = None
        self.host = None
        self.rank = None
        self.version = None
        self.mode = None
        self.wall = None
        self.devices = OrderedDict()
        self.notes = []              # (t, text) not answering an advice
        self.notes_dropped = 0
        self.errors = OrderedDict()  # message -> [first t, count]
        self.errors_dropped = 0
        self.summary = None
        self.last_t = 0.0
        self.lines = 0
        self.truncated = False
        self.bad_lines = 0
        self.unknown = {}
        self.read_error = None
        self.last_run = None         # the latest advice run, for notes without a seq
        self.max_seq = None
        self.arch = OrderedDict()    # (module, cc) -> the module's verdict on that GPU model
        self.arch_dropped = 0
        self.suppressed = {}         # kind of line -> lines the shim's budgets left out
        self.lost_lines = 0          # lines the shim could not write (a full disk)
        self.partial = None          # why the summary is incomplete, when it is
        self.text_lines = 0          # lines that are not blank, readable or not
        self.journal_lines = 0       # of them, JSON objects with an "ev": the journal's
        self.status = None           # the exit status (the summary's)
        self.uncaught = None         # the error the program died of, when it said
        self.backward_calls = None   # every .backward() (the summary's)
        self.killed = None           # a `killed` line: {t, signal, step}
        m = NAME_RE.match(os.path.basename(path))
        if m:
            self.comm = m.group("comm")
            self.pid = int(m.group("pid"))
            if m.group("rank") is not None:
                self.rank = int(m.group("rank"))

    def device(self, dev):
        if type(dev) is not int:
            dev = as_int(dev, 0)
        d = self.devices.get(dev)
        if d is None:
            d = self.devices[dev] = Device(dev, self.nframes)
        return d

    @property
    def finished(self):
        return self.summary is not None

    @property
    def duration(self):
        if self.summary is not None:
            d = num(self.summary.get("duration"))
            if d is not None:
                return max(d, self.last_t)
        return self.last_t

    @property
    def ident(self):
        rank = "-" if self.rank is None else str(self.rank)
        return "host %s rank %s pid %s (%s)" % (
            self.host or "?", rank, "?" if self.pid is None else self.pid,
            self.comm or "?")

    @property
    def who(self):
        """How the verdict names the process: its rank, else its pid."""
        if self.rank is not None:
            return "rank %d" % self.rank
        return "pid %s (%s)" % ("?" if self.pid is None else self.pid, self.comm or "?")

    def sort_key(self):
        return (self.host or "", self.rank if self.rank is not None else 1 << 62,
                self.pid if self.pid is not None else 0, self.path)

    def used_devices(self):
        return [self.devices[k] for k in sorted(self.devices) if self.devices[k].used]

    # reading

    def read(self):
        try:
            f = open(self.path, "rb")
        except OSError as e:
            self.read_error = e.strerror or str(e)
            return self
        handlers = {
            "sample": self._ev_sample, "near_miss": self._ev_incident,
            "refused": self._ev_incident, "oom": self._ev_incident, "step": self._ev_step,
            "advice": self._ev_advice, "batch": self._ev_batch, "start": self._ev_start,
            "mode": self._ev_mode, "arch": self._ev_arch, "leak": self._ev_leak,
            "note": self._ev_note, "error": self._ev_error, "summary": self._ev_summary,
            "suppressed": self._ev_suppressed,
            "torch": self._ev_torch, "backward": self._ev_backward,
            "peak": self._ev_peak, "killed": self._ev_killed,
        }
        loads = json.loads
        last_t = 0.0
        lines = bad = text = events = 0
        try:
            with f:
                for raw in f:
                    text += 1
                    try:
                        ev = loads(raw)
                    except ValueError:
                        ev = self._unreadable(raw)
                        if ev is None:
                            if not raw.strip():
                                text -= 1
                            continue
                    if not isinstance(ev, dict):
                        bad += 1
                        continue
                    lines += 1
                    if isinstance(ev.get("ev"), str):
                        events += 1
                    t = ev.get("t")
                    if (type(t) is float or type(t) is int) and 0 <= t < 1e12:
                        if t > last_t:
                            last_t = t
                    else:
                        t = last_t
                    h = handlers.get(ev.get("ev"))
                    if h is None:
                        kind = as_str(ev.get("ev"), "")
                        self.unknown[kind] = self.unknown.get(kind, 0) + 1
                        continue
                    try:
                        h(ev, t)
                    except (TypeError, ValueError, AttributeError, KeyError):
                        bad += 1    # a known event with fields of the wrong shape
        except OSError as e:
            self.read_error = e.strerror or str(e)
        self.last_t = last_t
        self.lines = lines
        self.text_lines = text
        self.journal_lines = events
        self.bad_lines += bad
        for d in self.devices.values():
            d.phases.finish(d)
        return self

    def _unreadable(self, raw):
        """A line json.loads refused: blank, cut by a kill (the last line, no
        newline), not UTF-8, or garbage."""
        if not raw.strip():
            return None
        try:
            return json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            pass
        if not raw.endswith(b"\n"):
            self.truncated = True
        else:
            self.bad_lines += 1
        return None

    def _ev_start(self, ev, t):
        if self.start is not None:
            return
        self.start = True
        self.pid = as_int(ev.get("pid"), self.pid)
        self.comm = as_str(ev.get("comm"), self.comm)
        self.host = as_str(ev.get("host"), self.host)
        rank = ev.get("rank")
        if num(rank) is not None:
            self.rank = int(rank)
        elif isinstance(rank, str) and rank.isdigit():
            self.rank = int(rank)
        self.version = as_str(ev.get("version"))
        self.mode = as_str(ev.get("mode"))
        self.wall = num(ev.get("wall"))
        devs = ev.get("devices")
        for d in devs if isinstance(devs, list) else []:
            if isinstance(d, dict) and as_int(d.get("dev")) is not None:
                self.device(as_int(d.get("dev"))).update(d)

    def _ev_sample(self, ev, t):
        cur, used = ev.get("current"), ev.get("used")
        if type(cur) is not int:
            cur = num(cur)
        if type(used) is not int:
            used = num(used)
        if cur is None and used is None:
            return
        dev = ev.get("dev", 0)
        d = self.devices.get(dev) if type(dev) is int else None
        if d is None:
            d = self.device(dev)
        d.timeline.add(t, cur, used)
        d.last = (t, cur, used)
        if cur is not None:
            if d.peak_cur is None or cur > d.peak_cur:
                d.peak_cur, d.peak_t = cur, t
            if d.phases.cur is not None or d.phases.before is not None:
                d.phases.sample(cur)
            if used is not None:
                other = used - cur
                if d.other_max is None or other > d.other_max:
                    d.other_max = other
        if used is not None and (d.max_used is None or used > d.max_used):
            d.max_used = used

    def _ev_incident(self, ev, t):
        d = self.device(ev.get("dev", 0))
        kind = ev["ev"]
        step = d.last_step[0] if d.last_step else None
        d.events[kind].add(ev, t, step, self.pt)
        if kind != "near_miss":
            d.recent_failures.append(dict(ev, t=t, step=step))
            d.work.failure(ev, t)
        else:
            d.work.want(as_int(ev.get("step")))
        used = num(ev.get("used"))
        if used is not None and (d.max_used is None or used > d.max_used):
            d.max_used = used
        peers = num(ev.get("peers"))  # a shared GPU: the other guarded processes' share
        if peers and (d.peers_peak is None or peers > d.peers_peak):
            d.peers_peak = peers
            d.peers = max(d.peers, 1)
        if kind != "near_miss":
            d.phases.failed(used, num(ev.get("bytes")))

    def _ev_step(self, ev, t):
        d = self.device(ev.get("dev", 0))
        step = as_int(ev.get("step"))
        d.steps += 1
        peak, live = num(ev.get("peak")), num(ev.get("live"))
        if step is not None:
            if d.first_step is None:
                d.first_step = (step, t)
            d.last_step = (step, t)
            if step >= 0:
                s = (step, peak, live, t, num(ev.get("needed")))
                d.step_series.put(s)
                d.recent.append(s)
        if peak is not None:
            if d.step_peak is None or peak > d.step_peak:
                d.step_peak = peak
        d.phases.step(step, peak)
        d.work.step(ev, step, peak)
        d.sizing.step(ev, step, d.near_line)
        pu = num(ev.get("peak_used"))
        if pu is not None and (d.max_used is None or pu > d.max_used):
            d.max_used = pu

    def _ev_advice(self, ev, t):
        d = self.device(ev.get("dev", 0))
        step = d.last_step[0] if d.last_step else None
        self.last_run = d.advice.add(ev, t, step)
        d.phases.advised(step, as_int(ev.get("batch_size")))
        seq = as_int(ev.get("seq"))
        if seq is not None and (self.max_seq is None or seq > self.max_seq):
            self.max_seq = seq

    def _ev_batch(self, ev, t):
        d = self.device(ev.get("dev", 0))
        d.phases.batch(t, as_int(ev.get("batch_size")), as_int(ev.get("grad_accum")),
                       num(ev.get("peak")), d, as_int(ev.get("was_batch_size")),
                       as_int(ev.get("was_grad_accum")), ev.get("reason"))

    def _ev_mode(self, ev, t):
        d = self.device(ev.get("dev", 0))
        if len(d.modes) < 20:
            d.modes.append((t, as_str(ev.get("mode"), "?"), as_str(ev.get("why"), "")))
        else:
            d.modes_dropped += 1

    def _ev_arch(self, ev, t):
        """One module's device code judged against one compute capability
        (the shim writes one per module and distinct capability, with the
        devices that have it)."""
        module = as_str(ev.get("module"), "?")
        cc = as_str(ev.get("cc"), "?")
        devs = ev.get("devs")
        devs = [v for v in devs if type(v) is int] if isinstance(devs, list) else []
        dev = as_int(ev.get("dev"))
        if not devs and dev is not None:
            devs = [dev]
        key = (module, cc)
        if key not in self.arch and len(self.arch) >= ARCH_MAX:
            self.arch_dropped += 1
            return
        ok = ev.get("ok") is not False
        message = as_str(ev.get("message"), "")
        self.arch[key] = {"t": t, "module": module, "cc": cc, "ok": ok, "message": message,
                          "devs": devs, "jit": ok and runs_only_by_jit(ev, cc, message)}

    def _ev_leak(self, ev, t):
        d = self.device(ev.get("dev", 0))
        d.leaks += 1
        e = dict(ev)
        e["t"] = t
        if d.first_leak is None:
            d.first_leak = e
        d.last_leak = e
        if d.leak_marks.want():
            d.leak_marks.add({"t": t, "step": as_int(ev.get("step")), "rate": num(ev.get("rate")),
                              "live": num(ev.get("live")), "since": as_int(ev.get("since_step")),
                              "projected": as_int(ev.get("projected_step"))})

    def _ev_note(self, ev, t):
        text = as_str(ev.get("text"))
        if text is None:
            return
        text = text[:NOTE_CHARS]
        m = NOTE_SEQ_RE.search(text)
        if m:
            seq = int(m.group(1))
            for d in self.devices.values():
                run = d.advice.run_of(seq)
                if run is not None:
                    if run["note"] is None:
                        run["note"] = text
                    return
            if self.max_seq is not None and seq <= self.max_seq:
                return              # answers an advice in a run not kept
        elif self.last_run is not None and self.last_run["note"] is None:
            self.last_run["note"] = text
            return
        if len(self.notes) < NOTES_MAX:
            self.notes.append((t, text))
        else:
            self.notes_dropped += 1

    def _ev_error(self, ev, t):
        msg = as_str(ev.get("message"))
        if msg is None:
            return
        e = self.errors.get(msg)
        if e is not None:
            e[1] += 1
        elif len(self.errors) < ERRORS_MAX:
            self.errors[msg] = [t, 1]
        else:
            self.errors_dropped += 1

    def _counts(self, counts):
        """A {kind: lines} object of the shim's budgets, as the lines left out."""
        if isinstance(counts, dict):
            got = {as_str(k): as_int(v) for k, v in counts.items()}
            self.suppressed = {k: v for k, v in got.items() if v and v > 0}

    def _ev_suppressed(self, ev, t):
        # total: since the start, so the last one stands for a killed process
        self._counts(ev.get("total"))

    def _ev_torch(self, ev, t):
        """PyTorch's caching allocator at a refusal, an OOM, a near miss or a
        forecast (gpuguard.journal.pytorch keeps it)."""
        self.pt.torch(ev, t, self.device(ev.get("dev", 0)))

    def _ev_backward(self, ev, t):
        """Where `.backward()` was called: autograd's threads work for it
        until the next one."""
        self.pt.backward.add(ev, t)

    def _ev_peak(self, ev, t):
        """The peak so far and its sites (for a process killed before its
        summary)."""
        d = self.device(ev.get("dev", 0))
        if num(ev.get("peak")) is not None:
            d.work.peak_line = dict(ev, t=t)
            d.work.peak_line_step = as_int(ev.get("step"))
            sites = ev.get("sites")
            d.work.peak_line["sites"] = [
                {"stack": x.get("stack"), "pystack": x.get("pystack"), "thread": x.get("thread"),
                 "bytes": x.get("bytes"), "allocs": x.get("allocs")}
                for x in (sites if isinstance(sites, list) else []) if isinstance(x, dict)]
            pu = num(ev.get("peak_used"))
            if pu is not None and (d.max_used is None or pu > d.max_used):
                d.max_used = pu

    def _ev_killed(self, ev, t):
        self.killed = {"t": t, "signal": as_str(ev.get("signal"), "a signal"),
                       "step": as_int(ev.get("step"))}

    def _ev_summary(self, ev, t):
        self.summary = ev
        self.status = as_int(ev.get("status"))
        self.uncaught = as_str(ev.get("uncaught"))
        self.backward_calls = as_int(ev.get("backward_calls"))
        self._counts(ev.get("suppressed"))
        self.lost_lines = max(as_int(ev.get("lost_lines"), 0), 0)
        self.partial = as_str(ev.get("partial"))
        devs = ev.get("devices")
        for d in devs if isinstance(devs, list) else []:
            if isinstance(d, dict) and as_int(d.get("dev")) is not None:
                dv = self.device(as_int(d.get("dev")))
                dv.update(d, Device.SUMMARY_TEXT, Device.SUMMARY_NUMBERS)
                dv.summary = d
                dv.peers = max(as_int(d.get("peers"), 0), dv.peers, 0)
                peak = num(d.get("peers_peak"))
                if peak is not None:
                    dv.peers_peak = max(peak, dv.peers_peak or 0)


def read_journals(paths, nframes=4, native=False):
    journals, failed = [], []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(os.path.join(p, n) for n in os.listdir(p)
                           if n.startswith("gpuguard.") and n.endswith(".jsonl"))
            if not found:
                failed.append((p, "no gpuguard.*.jsonl journal in this directory"))
            for q in found:
                journals.append(Journal(q, nframes, native).read())
        else:
            journals.append(Journal(p, nframes, native).read())
    ok = []
    for j in journals:
        why = j.read_error or not_a_journal(j)
        if why:
            failed.append((j.path, why))
        else:
            ok.append(j)
    ok.sort(key=lambda j: j.sort_key())
    return ok, failed


def not_a_journal(j):
    """Why a file read without error is no journal (None when it is one): it
    has no journal line. A journal with some bad lines is one (its report
    counts them); so is an empty file named as the shim names its journals
    (a process killed before its first line)."""
    if j.journal_lines:
        return None
    if not j.text_lines:
        if NAME_RE.match(os.path.basename(j.path)):
            return None
        return NOT_A_JOURNAL + "the file is empty"
    if j.text_lines == 1:
        return NOT_A_JOURNAL + "its only line is not a journal line"
    return NOT_A_JOURNAL + "none of its %d lines is a journal line" % j.text_lines


def sections(journals):
    """(journal, device) pairs of the devices a process used, in report
    order: host, rank, pid, device."""
    return [(j, d) for j in journals for d in j.used_devices()]


def shared_gpus(journals):
    """The GPUs that several of the journals' processes used, by UUID (a
    GPU's UUID names it on every host): [(uuid, [(journal, device)])], the
    processes in report order; and, for the devices whose journals say other
    guarded processes were on the GPU but whose journals were not given,
    [(journal, device)]."""
    by_uuid = OrderedDict()
    for j, d in sections(journals):
        if d.uuid:
            by_uuid.setdefault(d.uuid, []).append((j, d))
    shared = [(u, jd) for u, jd in by_uuid.items() if len(jd) > 1]
    alone = [(j, d) for jd in by_uuid.values() if len(jd) == 1 for j, d in jd if d.peers]
    return shared, alone


def left_out(journals):
    return sum(1 for j in journals for d in j.devices.values() if not d.used)
