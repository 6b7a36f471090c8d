#!/usr/bin/env python3
"""Run gpuguard's tests, independent ones in parallel, and end with the line CI
reads, alone on the last line: "N passed, N failed" (", N skipped" when some were).

  tests/run.py            every test: C unit tests, end-to-end tests, the Python
                          package's tests, and the real-PyTorch tests (tests/torch;
                          counted as skipped, saying why, where the rig is not built)
  tests/run.py --quick    the quick tier (make check): the unit tests and the Python
                          tests not listed in tests/slow.txt; never the rig's
  tests/run.py --unit     only the C unit tests
  tests/run.py --e2e      only the end-to-end and Python package tests
  tests/run.py --torch    only the real-PyTorch tests
  tests/run.py -k NAME    only tests whose name contains NAME (a glob, as unittest's -k)
  tests/run.py -j N       N tests at once (default: the cores this process may use)

Each unit test binary is one job; each Python test class is one job, run in one
of N worker processes (a test may set variables, change directory or preload
a library: a process keeps that to itself, and a worker puts its environment
and directory back after each class). A line per test says its time as its
class finishes; failures are printed whole at the end, with what the test
printed. Every run records each test's time in $GG_BUILD/test-times.json,
which orders the next run longest first.

The quick tier: tests/slow.txt lists the Python tests (or whole classes, where
setUpClass is what costs) that take longer than the tier's budget (1 s each);
everything else is quick, so a new test is quick until it is measured. A test
outside that list that takes longer than the budget is named in a warning at
the end of every run; `make timings` (--write-slow) measures the whole suite and
writes the list again.

The build directory comes from GG_BUILD (default build); GG_SANITIZE=1 means
the shim and the fakes were built with ASan+UBSan, so end-to-end runs preload
the sanitizer runtime ahead of the shim. --plain-rerun DIR: after a sanitized
run, the tests that skipped under the sanitizers run again against the plain
build in DIR, and the closing line counts their outcome there.
"""
import argparse
import fnmatch
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_BUDGET = 1.0     # seconds a quick-tier test may take (a class's setUpClass too)
JOB_TIMEOUT = 1500     # seconds one job (a unit binary, a test class) may take
CLOSING = re.compile(r"\d+ passed, \d+ failed(, \d+ skipped)?$")
USUAL = {"unit": 0.5, "e2e": 0.3, "pkg": 0.3, "torch": 8.0}   # seconds a test takes, unmeasured
SPLIT_OVER = 10.0      # seconds: a class that takes longer is a job per test (split_long)

# Where the Python tests are: (area, directory, top-level directory for discovery).
AREAS = (("e2e", ("tests", "e2e"), ("tests", "e2e")),
         ("pkg", ("tools", "python", "tests"), ("tools", "python")),
         ("torch", ("tests", "torch"), ("tests", "torch")))


def setup_path(root):
    """sys.path as every test module expects it (the old single-process runner's)."""
    for parts in (("tests", "torch"), ("tools", "python"), ("tests", "e2e")):
        p = os.path.join(root, *parts)
        if p not in sys.path:
            sys.path.insert(0, p)


def cpu_now():
    """CPU seconds of this process and the children it has waited for."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


# ---------------------------------------------------------------- the worker

class Recorder(unittest.TestResult):
    """Streams one JSON line per test to the parent: its outcome, wall and CPU
    time, and for a failure the traceback and what the test printed."""

    def __init__(self, send, log):
        super().__init__()
        self.send = send
        self.log = log
        self.cur = None

    def _offset(self):
        sys.stdout.flush()
        sys.stderr.flush()
        return os.lseek(1, 0, os.SEEK_CUR)

    def startTest(self, test):
        super().startTest(test)
        self.cur = {"id": test.id(), "status": "ok", "details": [], "reason": "",
                    "t0": time.monotonic(), "c0": cpu_now(), "o0": self._offset()}
        self.send({"start": test.id()})

    def stopTest(self, test):
        super().stopTest(test)
        r = self.cur
        self.cur = None
        if r is None:
            return
        r["time"] = time.monotonic() - r.pop("t0")
        r["cpu"] = cpu_now() - r.pop("c0")
        o0 = r.pop("o0")
        if r["status"] in ("FAIL", "ERROR"):
            r["output"] = self._read(o0, self._offset())
        self.send({"test": r})

    def _read(self, start, end):
        if end <= start:
            return ""
        with open(self.log, "rb") as f:
            f.seek(start)
            data = f.read(min(end - start, 200000))
        return data.decode("utf-8", "replace")

    def _fail(self, test, status, err):
        text = self._exc_info_to_string(err, test)
        if self.cur is not None and self.cur["id"] == getattr(test, "id", lambda: "")():
            if self.cur["status"] != "ERROR":
                self.cur["status"] = status
            self.cur["details"].append(text)
        else:
            # setUpClass, tearDownClass, a module's import: no startTest
            self.send({"test": {"id": str(test), "status": status, "details": [text], "time": 0.0,
                                "cpu": 0.0, "reason": "", "holder": True}})

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._fail(test, "FAIL", err)

    def addError(self, test, err):
        super().addError(test, err)
        self._fail(test, "ERROR", err)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None and self.cur is not None:
            status = "FAIL" if issubclass(err[0], test.failureException) else "ERROR"
            if self.cur["status"] != "ERROR":
                self.cur["status"] = status
            self.cur["details"].append(str(subtest) + "\n" + self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        if self.cur is not None and self.cur["id"] == test.id():
            self.cur["status"] = "skip"
            self.cur["reason"] = reason
        else:
            self.send({"test": {"id": str(test), "status": "skip", "reason": reason, "time": 0.0,
                                "cpu": 0.0, "details": [], "holder": True}})

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        if self.cur is not None:
            self.cur["status"] = "FAIL"
            self.cur["details"].append("unexpected success")


def worker(log):
    """Run the jobs the parent sends on stdin (a JSON line each: test names),
    answering on the original stdout; the tests' own output (and their
    children's) goes to the log file, stdin is /dev/null."""
    proto_in = os.fdopen(os.dup(0), "r")
    proto_out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    setup_path(ROOT)

    def send(msg):
        proto_out.write(json.dumps(msg) + "\n")
        proto_out.flush()

    loader = unittest.TestLoader()
    for line in proto_in:
        job = json.loads(line)
        env, cwd = dict(os.environ), os.getcwd()
        c0, t0 = cpu_now(), time.monotonic()
        try:
            suite = loader.loadTestsFromNames(job["names"])
            suite.run(Recorder(send, log))
        except BaseException:  # the runner's own failure, said as the job's
            send({"test": {"id": job["job"], "status": "ERROR", "details": [traceback.format_exc()],
                           "time": 0.0, "cpu": 0.0, "reason": "", "holder": True}})
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
        send({"done": job["job"], "time": time.monotonic() - t0, "cpu": cpu_now() - c0})


# ---------------------------------------------------------------- the parent

class Job:
    def __init__(self, area, name, tests, names=None):
        self.area = area       # unit, e2e, pkg, torch
        self.name = name       # unit/test_x, or module.Class
        self.tests = tests     # test ids (Python) or [name] (unit)
        self.load = names      # what the worker loads, when not the tests' ids
        self.expect = 0.0

    @property
    def names(self):
        return self.load or self.tests


def discover(root, areas, pattern):
    """The Python tests, grouped by class: a Job per class. Tests of a module
    that cannot be imported are one job that reports its error."""
    setup_path(root)
    loader = unittest.TestLoader()
    jobs = []
    for area, parts, top in AREAS:
        if area not in areas:
            continue
        d = os.path.join(root, *parts)
        if not os.path.isdir(d):
            continue
        suite = loader.discover(d, top_level_dir=os.path.join(root, *top))
        by_class = {}
        order = []
        for t in flatten(suite):
            if type(t).__name__ == "_FailedTest":
                name = t._testMethodName
                jobs.append(Job(area, name, [t.id()], names=[name]))
                continue
            tid = t.id()
            if pattern and not fnmatch.fnmatchcase(tid, "*%s*" % pattern):
                continue
            cls = tid.rsplit(".", 1)[0]
            if cls not in by_class:
                by_class[cls] = []
                order.append(cls)
            by_class[cls].append(tid)
        jobs += [Job(area, cls, by_class[cls]) for cls in order]
    return jobs


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def read_slow(path):
    """tests/slow.txt: 'SECONDS  ID' lines (a test, or a class for its
    setUpClass); '#' starts a comment."""
    slow = {}
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0].split()
                if len(line) >= 2:
                    try:
                        slow[line[1]] = float(line[0].rstrip("s"))
                    except ValueError:
                        slow[line[1]] = 0.0
    return slow


def is_slow(tid, slow):
    """A test is slow when it, its class or its module is listed."""
    parts = tid.split(".")
    return any(".".join(parts[:i]) in slow for i in range(1, len(parts) + 1))


class Runner:
    def __init__(self, args, root, build):
        self.args = args
        self.root = root
        self.build = build
        self.lock = threading.Lock()
        self.results = {}      # test id -> record
        self.jobtimes = {}     # job name -> (wall, CPU seconds, fixture: time outside its tests)
        self.tmp = tempfile.mkdtemp(prefix="gg-run-")
        self.procs = []        # every worker started

    # -- output

    def say(self, text):
        with self.lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    # -- unit binaries

    def run_unit(self, job):
        path = os.path.join(self.build, "tests", "unit", job.name.split("/", 1)[1])
        env = dict(os.environ, GG_ROOT=self.root)
        if os.environ.get("GG_SANITIZE") == "1":
            # Leaks are still checked, but not through thread-local storage:
            # the stack test parks threads whose dynamic TLS (libunwind's,
            # dlopen'd) LeakSanitizer's tracer cannot walk (it faults).
            supp = os.path.join(self.root, "tests", "unit", "lsan.supp")
            env["LSAN_OPTIONS"] = f"use_tls=0:suppressions={supp}"
        out = tempfile.TemporaryFile(dir=self.tmp)
        start = time.monotonic()
        proc = subprocess.Popen([path], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env)
        timer = threading.Timer(self.args.timeout, proc.kill)
        timer.start()
        _, status, ru = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        took = time.monotonic() - start
        cpu = ru.ru_utime + ru.ru_stime
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
        out.close()
        m = None
        for line in text.splitlines():
            m = re.fullmatch(r"(\d+) passed, (\d+) failed", line.strip()) or m
        p, f = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        why = ""
        if m is None:
            why = f"exit {proc.returncode}, no result line"
            f = max(f, 1)
        elif proc.returncode != 0 and f == 0:
            why = f"exit {proc.returncode}"
            f = 1
        rec = {"id": job.name, "status": "FAIL" if f else "ok", "time": took, "cpu": cpu,
               "passed": p, "failed": f, "reason": "",
               "details": [text + ("\n" + why if why else "")] if f else []}
        with self.lock:
            self.results[job.name] = rec
            self.jobtimes[job.name] = (took, cpu, 0.0)
        self.say("%-5s %6.2fs  %s: %d passed, %d failed%s" % (
            "ok" if not f else "FAIL", took, job.name, p, f, " (%s)" % why if why else ""))

    # -- Python tests, in worker processes

    def start_worker(self, slot):
        log = os.path.join(self.tmp, "worker%d.log" % slot)
        env = dict(os.environ)
        # its own process group: at a timeout, the worker and what it started go
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", log],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd=os.getcwd(), env=env, start_new_session=True)
        with self.lock:
            self.procs.append(proc)
        return proc, log

    def kill(self, proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def kill_all(self):
        with self.lock:
            procs = list(self.procs)
        for p in procs:
            if p.poll() is None:
                self.kill(p)

    def run_python(self, job, slot, workers):
        if slot not in workers or workers[slot][0].poll() is not None:
            workers[slot] = self.start_worker(slot)
        proc, log = workers[slot]
        logpos = os.path.getsize(log) if os.path.exists(log) else 0
        got = {}
        started = None
        timer = threading.Timer(self.args.timeout, self.kill, (proc,))
        timer.start()
        try:
            proc.stdin.write(json.dumps({"job": job.name, "names": job.names}) + "\n")
            proc.stdin.flush()
            done = None
            for line in proc.stdout:
                msg = json.loads(line)
                if "start" in msg:
                    started = msg["start"]
                elif "test" in msg:
                    got[msg["test"]["id"]] = msg["test"]
                    started = None
                elif "done" in msg:
                    done = msg
                    break
        except (BrokenPipeError, ValueError):
            done = None
        finally:
            timer.cancel()
        if done is None:
            # The worker died (or was killed at the timeout) inside a test.
            self.kill(proc)
            proc.wait()
            with open(log, "rb") as f:
                f.seek(logpos)
                tail = f.read().decode("utf-8", "replace")[-20000:]
            what = ("killed after %d s (--timeout)" % self.args.timeout
                    if proc.returncode == -9 else "its process exited %s" % proc.returncode)
            victim = started or next((t for t in job.tests if t not in got), job.name)
            got[victim] = {"id": victim, "status": "ERROR", "time": 0.0, "cpu": 0.0, "reason": "",
                           "details": ["%s: %s\n--- its output:\n%s" % (victim, what, tail)]}
            del workers[slot]
            rest = [t for t in job.tests if t not in got]
            if rest:
                # the tests after it run again in a fresh worker
                self.queue_again(Job(job.area, job.name, rest))
        self.collect(job, got, done)

    def collect(self, job, got, done):
        lines = []
        holder = [r for r in got.values() if r.get("holder")]
        with self.lock:
            for tid in job.tests:
                r = got.get(tid)
                if r is None:
                    if holder:
                        # setUpClass raised (or skipped): its tests say so
                        h = holder[0]
                        r = {"id": tid, "status": h["status"], "reason": h["reason"], "time": 0.0,
                             "cpu": 0.0, "details": h["details"] if h["status"] != "skip" else []}
                    else:
                        continue  # queued again after a crash
                self.results[tid] = r
                if r["status"] == "skip":
                    lines.append("skip  %6.2fs  %s (%s)" % (r["time"], tid, r["reason"]))
                else:
                    lines.append("%-5s %6.2fs  %s" % (r["status"], r["time"], tid))
            for h in holder:
                if h["status"] != "skip" and all(t in got for t in job.tests):
                    # a tearDownClass error after its tests ran: one more failure
                    self.results[h["id"]] = h
                    lines.append("%-5s %6.2fs  %s" % (h["status"], 0.0, h["id"]))
            if done:
                # summed over the jobs of a class split in several (split_long);
                # its fixture: what the longest-paying job spent outside its tests
                ran = sum(got[t]["time"] for t in job.tests if t in got)
                w, c, f = self.jobtimes.get(job.name, (0.0, 0.0, 0.0))
                self.jobtimes[job.name] = (w + done["time"], c + done["cpu"],
                                           max(f, done["time"] - ran))
        self.say("\n".join(lines))

    # -- scheduling

    def queue_again(self, job):
        with self.lock:
            self.queue.insert(0, job)

    def run(self, jobs):
        self.queue = list(jobs)
        nslots = max(1, self.args.jobs)
        threads = []
        for slot in range(nslots):
            t = threading.Thread(target=self.slot_loop, args=(slot,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()

    def slot_loop(self, slot):
        workers = {}
        try:
            while True:
                with self.lock:
                    if not self.queue:
                        break
                    job = self.queue.pop(0)
                try:
                    if job.area == "unit":
                        self.run_unit(job)
                    else:
                        self.run_python(job, slot, workers)
                except Exception:
                    rec = {"id": job.name, "status": "ERROR", "time": 0.0, "cpu": 0.0, "reason": "",
                           "details": ["the runner failed on %s:\n%s" % (job.name, traceback.format_exc())]}
                    with self.lock:
                        self.results[job.name] = rec
                    self.say("ERROR          %s (the runner failed)" % job.name)
        finally:
            for proc, _ in workers.values():
                try:
                    proc.stdin.close()
                    proc.wait(timeout=30)
                except Exception:
                    proc.kill()


def unit_jobs(build, pattern):
    d = os.path.join(build, "tests", "unit")
    names = sorted(n for n in os.listdir(d) if n.startswith("test_") and "." not in n
                   and os.access(os.path.join(d, n), os.X_OK)) if os.path.isdir(d) else []
    return [Job("unit", "unit/" + n, ["unit/" + n]) for n in names if not pattern or pattern in n]


def split_long(jobs, tests_t, jobs_t):
    """A long class whose setUpClass costs nothing (as last measured) is a job
    per test, so that N workers share it; the rest stay a job per class."""
    out = []
    for j in jobs:
        fixture = jobs_t.get(j.name, [0, 0, None])[-1] if j.name in jobs_t else None
        if (j.area != "unit" and j.load is None and len(j.tests) > 1 and j.expect > SPLIT_OVER
                and fixture is not None and fixture < 0.25):
            for t in j.tests:
                one = Job(j.area, j.name, [t])
                one.expect = tests_t.get(t) or USUAL[j.area]
                out.append(one)
        else:
            out.append(j)
    return out


def load_times(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--unit", action="store_true", help="the C unit tests")
    ap.add_argument("--e2e", action="store_true", help="the end-to-end and Python package tests")
    ap.add_argument("--torch", action="store_true", help="the real-PyTorch tests (the rig)")
    ap.add_argument("--quick", action="store_true", help="the quick tier (make check)")
    ap.add_argument("-k", dest="pattern", help="only tests whose name contains NAME")
    ap.add_argument("-j", dest="jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="tests at once (default: the cores this process may use)")
    ap.add_argument("--timeout", type=int, default=JOB_TIMEOUT, help="seconds a job may take")
    ap.add_argument("--write-slow", action="store_true",
                    help="write tests/slow.txt from this run's times (make timings)")
    ap.add_argument("--plain-rerun", metavar="BUILD",
                    help="run the tests that skipped under the sanitizers again on this plain build")
    ap.add_argument("--only", metavar="FILE", help=argparse.SUPPRESS)   # test ids, a line each
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", metavar="LOG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0

    t_start, load_start = time.monotonic(), os.getloadavg()[0]
    build = os.path.join(ROOT, os.environ.get("GG_BUILD", "build"))
    os.environ["GG_BUILD"] = build
    every = not (args.unit or args.e2e or args.torch or args.quick)
    areas = set()
    if args.unit or args.quick or every:
        areas.add("unit")
    if args.e2e or args.quick or every:
        areas |= {"e2e", "pkg"}
    if args.torch or every:
        areas.add("torch")

    jobs = unit_jobs(build, args.pattern) if "unit" in areas else []
    jobs += discover(ROOT, areas, args.pattern)
    slow_path = os.path.join(ROOT, "tests", "slow.txt")
    slow = read_slow(slow_path)
    if args.only:
        with open(args.only) as f:
            only = set(f.read().split())
        for j in jobs:
            j.tests = [t for t in j.tests if t in only]
        jobs = [j for j in jobs if j.tests]
    if args.quick:
        for j in jobs:
            if j.area in ("e2e", "pkg"):
                j.tests = [t for t in j.tests if not is_slow(t, slow)]
        jobs = [j for j in jobs if j.tests]

    # The rig's tests where there is no rig: skipped, and said just above the
    # closing line (not run: each would only find the rig missing).
    notes = []
    unrun = []
    if any(j.area == "torch" for j in jobs):
        setup_path(ROOT)
        import torchrig
        if not torchrig.rig_root():
            unrun = [t for j in jobs if j.area == "torch" for t in j.tests]
            jobs = [j for j in jobs if j.area != "torch"]
            notes.append("real-PyTorch tests (tests/torch): %d not run, %s" % (len(unrun), torchrig.HOW))

    # Longest first, from the last run's times; a test this build never ran
    # (a fresh clone): its time in tests/slow.txt, else its area's usual.
    times_path = os.path.join(build, "test-times.json")
    times = load_times(times_path)
    tests_t, jobs_t = times.get("tests", {}), times.get("jobs", {})
    for j in jobs:
        j.expect = sum(tests_t.get(t) or slow.get(t) or USUAL[j.area] for t in j.tests) + \
            jobs_t.get(j.name, [0, 0, 0])[-1]
    jobs = split_long(jobs, tests_t, jobs_t)
    jobs.sort(key=lambda j: -j.expect)

    runner = Runner(args, ROOT, build)
    print("running %d tests in %d jobs, %d at once (%s)" % (
        sum(len(j.tests) for j in jobs), len(jobs), args.jobs,
        "quick tier" if args.quick else ", ".join(sorted(areas))), flush=True)
    try:
        runner.run(jobs)
    except KeyboardInterrupt:
        runner.kill_all()
        print("interrupted", flush=True)
        return 130
    finally:
        shutil.rmtree(runner.tmp, ignore_errors=True)   # the workers' logs: read by now
    results = runner.results
    for t in unrun:
        results[t] = {"id": t, "status": "skip", "reason": "no rig", "time": 0.0, "cpu": 0.0,
                      "details": [], "norig": True}

    if args.plain_rerun:
        plain_rerun(args, results, jobs, notes)

    # Times for the next run's order (and for --write-slow).
    ran = {t: r["time"] for t, r in results.items() if not r.get("norig") and not r.get("holder")}
    tests_t.update(ran)
    jobs_t.update({k: list(v) for k, v in runner.jobtimes.items()})
    try:
        with open(times_path + ".tmp", "w") as f:
            json.dump({"tests": tests_t, "jobs": jobs_t}, f, indent=0, sort_keys=True)
        os.replace(times_path + ".tmp", times_path)
    except OSError:
        pass
    if args.write_slow:
        write_slow(slow_path, slow, jobs, results, runner.jobtimes)

    return summarize(args, results, jobs, runner, slow, notes, t_start, load_start)


def plain_rerun(args, results, jobs, notes):
    """Tests skipped under the sanitizers (a plain build's figure, the demo's
    plain shim) run on the plain build, in one fresh run of this script."""
    if os.environ.get("GG_SANITIZE") != "1":
        return
    skipped = [t for t, r in results.items() if r["status"] == "skip" and not r.get("norig")
               and not r["id"].startswith("unit/")]
    if not skipped:
        return
    build = os.path.join(ROOT, args.plain_rerun)
    if not os.path.exists(os.path.join(build, "libgpuguard.so")):
        notes.append("%d tests skipped under the sanitizers not run on a plain build: none in %s "
                     "(make check builds it)" % (len(skipped), args.plain_rerun))
        return
    listfile = tempfile.NamedTemporaryFile("w", prefix="gg-rerun-", suffix=".txt", delete=False)
    listfile.write("\n".join(skipped) + "\n")
    listfile.close()
    env = dict(os.environ, GG_BUILD=build, GG_SANITIZE="")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--only", listfile.name,
                           "--json", "-j", str(args.jobs)], env=env, stdout=subprocess.PIPE,
                          text=True)
    os.unlink(listfile.name)
    again = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            again = json.loads(line)
        elif not CLOSING.match(line):
            print("plain: " + line)
    changed = 0
    for t, r in again.items():
        if t in results and r["status"] != "skip":
            r["plain"] = True
            results[t] = r
            changed += 1
    notes.append("%d tests skipped under the sanitizers ran on the plain build (%s): %d passed" % (
        changed, args.plain_rerun, sum(1 for r in again.values() if r["status"] == "ok")))


def write_slow(path, old, jobs, results, jobtimes):
    """tests/slow.txt from this run: every Python test over the budget, and
    every class whose setUpClass/tearDownClass is; a listed test stays
    listed unless it now takes under half the budget (times wobble)."""
    entries = {}
    for j in jobs:
        if j.area not in ("e2e", "pkg"):
            continue
        fixture = jobtimes.get(j.name, (0, 0, 0))[-1]
        if fixture > QUICK_BUDGET or (j.name in old and fixture > QUICK_BUDGET / 2):
            entries[j.name] = fixture
        for t in j.tests:
            r = results.get(t)
            if r is None or r.get("norig"):
                if t in old:
                    entries[t] = old[t]
                continue
            if r["time"] > QUICK_BUDGET or (t in old and r["time"] > QUICK_BUDGET / 2):
                entries[t] = r["time"]
    covered = {e for j in jobs for e in [j.name] + j.tests}
    for k, v in old.items():
        if k in entries or k not in covered:
            # a listed test keeps its line as it was (the file changes only
            # when what it lists does: fewer conflicts between branches),
            # and one this run did not see (-k, another area) stays
            entries[k] = v
    with open(path, "w") as f:
        f.write("# The Python tests outside the quick tier (make check): each takes more than\n"
                "# %g s, or its class's setUpClass does. Written by `make timings` (tests/run.py\n"
                "# --write-slow) from a full run's times; seconds as first measured.\n" % QUICK_BUDGET)
        for k in sorted(entries):
            f.write("%6.1f  %s\n" % (entries[k], k))
    print("wrote %s: %d entries" % (os.path.relpath(path, ROOT), len(entries)))


def summarize(args, results, jobs, runner, slow, notes, t_start, load_start):
    failed_recs = [r for r in results.values() if r["status"] in ("FAIL", "ERROR")]
    passed = failed = skipped = 0
    for r in results.values():
        if "passed" in r:   # a unit binary: its own counts
            passed += r.get("passed", 0)
            failed += r.get("failed", 0)
        elif r["status"] == "ok":
            passed += 1
        elif r["status"] == "skip":
            skipped += 1
        else:
            failed += 1
    for r in sorted(failed_recs, key=lambda r: r["id"]):
        print("=" * 70)
        print("%s: %s" % (r["status"], r["id"]))
        print("-" * 70)
        for d in r["details"]:
            print(d.rstrip())
        if r.get("output", "").strip():
            print("--- what it printed:")
            print(r["output"].rstrip())
    if failed_recs:
        print("=" * 70)
    # A quick-tier test over its budget: said every run, so it is seen.
    over = []
    for j in jobs:
        if j.area not in ("e2e", "pkg"):
            continue
        jt = runner.jobtimes.get(j.name)
        if jt and jt[-1] > QUICK_BUDGET and not is_slow(j.name, slow):
            over.append((jt[-1], j.name + " (setUpClass/tearDownClass)"))
        for t in j.tests:
            r = results.get(t)
            if r and r["time"] > QUICK_BUDGET and not is_slow(t, slow):
                over.append((r["time"], t))
    if over:
        print("quick-tier tests over the %g s budget (list them in tests/slow.txt with `make timings`, "
              "or make them faster):" % QUICK_BUDGET)
        for took, name in sorted(over, reverse=True):
            print("  %6.2fs  %s" % (took, name))
    reasons = {}
    for r in results.values():
        if r["status"] == "skip" and not r.get("norig"):
            reasons.setdefault(r["reason"], []).append(r["id"])
    for reason, ids in sorted(reasons.items()):
        print("skipped %d: %s (%s)" % (len(ids), reason, ", ".join(sorted(ids)[:3]) +
                                       (", ..." if len(ids) > 3 else "")))
    cpu = sum(v[1] for v in runner.jobtimes.values())
    print("%d jobs in %.1f s, %.1f CPU-s, -j%d; load %.2f at the start, %.2f at the end" % (
        len(jobs), time.monotonic() - t_start, cpu, args.jobs, load_start, os.getloadavg()[0]))
    for n in notes:
        print(n)
    if args.json:
        print(json.dumps({t: {k: r.get(k) for k in ("id", "status", "time", "cpu", "reason", "details")}
                          for t, r in results.items()}))
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line, flush=True)
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
