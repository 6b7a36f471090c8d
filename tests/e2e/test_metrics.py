"""Metrics end to end: the metrics file under a real LD_PRELOAD, read by the
real node_exporter (its textfile collector) and scraped by the real Prometheus,
both started here on loopback with their own configuration and data in a
temporary directory. Two ranks of one job train on the fake GPU (one whose
steps grow: a forecast, near misses, refusals; one that leaks); node_exporter
carries their series with the journal's values; Prometheus joins them with a
DCGM-shaped series on UUID and answers every query of the dashboard. 1 000
rewrites while node_exporter reads never show half a file; a killed process
leaves its last file, a clean exit removes it, a forked child leaves it be; a
directory that is a symbolic link or cannot be written is said once and
changes nothing else. Without node_exporter and Prometheus (Debian's
prometheus and prometheus-node-exporter: .ci/run installs them) those tests
skip and say why; the ones that need neither always run."""
import json
import os
import queue
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from gg import (BUILD, FAKE, ROOT, SCRIPT, SHIM, GiB, MiB, Case, base_env, sanitizer_preload)

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PROMETHEUS = shutil.which("prometheus")
NEEDS = ("needs the real node_exporter and Prometheus on PATH (Debian: apt-get install "
         "prometheus prometheus-node-exporter; .ci/run installs them)")
UNIT = os.path.join(BUILD, "tests", "unit", "test_metrics")
METRICS_DEF = os.path.join(ROOT, "shim", "core", "metrics.def")
DASHBOARD = os.path.join(ROOT, "dashboards", "gpuguard.json")
DOC = os.path.join(ROOT, "docs", "metrics.md")
DEVICE_LABELS = ["gpu", "UUID", "modelName", "Hostname", "pid", "comm", "rank", "local_rank", "hpc_job",
                 "instance_id"]
JOB = 'fleet "7" \\ é'  # quotes, a backslash and UTF-8: escaped on the way, whole at the end
DCGM_FB_USED_MIB = 20480

POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 10%
near_miss = 5%
mode = auto
[trainer]
signal = none
batch_size = 32
grad_accum = 1
[journal]
stacks = near_miss
"""

# A trainer: registers its batch (auto -> enforce), runs its steps through the
# PyTorch-like allocator, tells the shim where each ends, then waits for a
# line on stdin. "grow": each step's activations 512 MiB larger (a forecast,
# then near misses and refusals); "leak": 64 MiB kept for good every step.
TRAINER = r'''
import ctypes, os, sys
fake, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
tl = ctypes.CDLL(os.path.join(fake, "libtorchlike.so"))
me = ctypes.CDLL(None)
me.gpuguard_step.argtypes = [ctypes.c_ulonglong]
me.gpuguard_set_batch.argtypes = [ctypes.c_int, ctypes.c_int]
GiB, MiB = 1 << 30, 1 << 20
kept = []

def alloc(n):
    p = ctypes.c_void_p()
    return p if tl.tl_malloc(ctypes.c_size_t(int(n)), ctypes.byref(p)) == 0 else None

me.gpuguard_set_batch(32, 1)
for n in range(1, steps + 1):
    work = 8 * GiB + n * 512 * MiB if mode == "grow" else 3 * GiB
    acts = [alloc(work / 8) for _ in range(8)]
    if mode == "leak":
        kept.append(alloc(64 * MiB))
    for a in acts:
        if a:
            tl.tl_free(a)
    tl.tl_empty_cache()
    me.gpuguard_step(n)
# what gpuguard-run's instrumentation hands the shim when PyTorch answers
# (gpuguard_torch_view): PyTorch's cache, 2.5 GiB of it free, 640 MiB at most in one block
sys.path.insert(0, os.environ["GG_PYHELPER"])
from gpuguard import _native
view = _native.TorchView(dev=0, why=b"near_miss", reserved=10 * GiB, allocated=7 * GiB + 512 * MiB,
                         largest_free=640 * MiB)
me.gpuguard_torch_view(ctypes.byref(view))
print("ready", flush=True)
sys.stdin.readline()
'''


def metric_rows():
    """metrics.def: name -> (type, labels)."""
    with open(METRICS_DEF) as f:
        text = f.read()
    rows = re.findall(r"^METRIC\(\s*\w+,\s*(\w+),\s*(\w+),\s*(\w+),", text, re.M)
    return {name: (kind, labels) for name, kind, labels in rows}


def parse_labels(text):
    labels, i = {}, 0
    while i < len(text):
        m = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"').match(text, i)
        if not m:
            raise ValueError(f"bad labels: {text!r}")
        i, value = m.end(), []
        while text[i] != '"':
            if text[i] == "\\":
                value.append({"n": "\n", "\\": "\\", '"': '"'}[text[i + 1]])
                i += 2
            else:
                value.append(text[i])
                i += 1
        labels[m.group(1)] = "".join(value)
        i = re.compile(r"\s*,?\s*").match(text, i + 1).end()
    return labels


def parse_exposition(text):
    """Prometheus's text format: ([(name, labels, value)], {name: help}, {name: type})."""
    samples, helps, types = [], {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            helps[name] = doc.replace("\\n", "\n").replace("\\\\", "\\")
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$", line)
            if not m:
                raise ValueError(f"bad line: {line!r}")
            samples.append((m.group(1), parse_labels(m.group(2) or ""), float(m.group(3))))
    return samples, helps, types


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what, probe, timeout=60, every=0.1):
    """probe() until it returns something true; its value."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except (OSError, ValueError, urllib.error.URLError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


class Daemon:
    """A server started on a free loopback port, stopped at cleanup."""

    def __init__(self, case, name, argv_for_port, ready_path, log_dir):
        for attempt in range(5):
            self.port = free_port()
            self.log = os.path.join(log_dir, f"{name}.{attempt}.log")
            with open(self.log, "w") as log:
                self.proc = subprocess.Popen(argv_for_port(self.port), stdout=log,
                                             stderr=subprocess.STDOUT, cwd=log_dir)
            case.addCleanup(self.stop)
            self.url = f"http://127.0.0.1:{self.port}"

            def up():
                if self.proc.poll() is not None:
                    raise AssertionError(f"{name} exited")
                return http_get(self.url + ready_path, 2)
            try:
                wait_for(f"{name} on port {self.port}", up, timeout=60)
                return
            except AssertionError:
                self.stop()  # the port was taken between the probe and the bind: another
        with open(self.log) as f:
            raise AssertionError(f"{name} did not start: {f.read()[-2000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class NodeExporter(Daemon):
    def __init__(self, case, textfile_dir, log_dir):
        super().__init__(case, "node_exporter", lambda port: [
            NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults", "--collector.textfile",
            f"--collector.textfile.directory={textfile_dir}"], "/metrics", log_dir)

    def scrape(self):
        return parse_exposition(http_get(self.url + "/metrics"))


class Prometheus(Daemon):
    def __init__(self, case, target_port, work):
        config = os.path.join(work, "prometheus.yml")
        # no honor_labels: the training job is hpc_job, and `job` is the
        # scrape's own (docs/metrics.md)
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: node\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n")
        super().__init__(case, "prometheus", lambda port: [
            PROMETHEUS, f"--config.file={config}",
            f"--storage.tsdb.path={os.path.join(work, 'data')}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], "/-/ready", work)

    def query(self, expr):
        body = json.loads(http_get(self.url + "/api/v1/query?" +
                                   urllib.parse.urlencode({"query": expr})))
        if body.get("status") != "success":
            raise AssertionError(f"{expr}: {body}")
        return body["data"]["result"]


class Lines:
    """A process's stdout, line by line, with a timeout."""

    def __init__(self, proc):
        self.q = queue.Queue()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, f):
        for line in f:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def until(self, want, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            line = self.q.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None or line == want:
                return line


def read_journal(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


class MetricsCase(Case):
    def shim_env(self, **extra):
        env = base_env(**extra)
        env["LD_PRELOAD"] = ":".join(sanitizer_preload() + [SHIM])
        return env

    def metrics_env(self, textfile_dir, **extra):
        return self.shim_env(GPUGUARD_METRICS_DIR=textfile_dir, GPUGUARD_METRICS_INTERVAL=1, **extra)

    def start(self, argv, env, umask=None):
        run_dir = tempfile.mkdtemp(prefix="run-", dir=self.tmp)
        proc = subprocess.Popen(argv, env=env, cwd=run_dir, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        return proc, run_dir, Lines(proc)

    def prom_files(self, where):
        return sorted(n for n in os.listdir(where) if n.startswith("gpuguard_"))


@unittest.skipUnless(NODE_EXPORTER and PROMETHEUS, NEEDS)
class Fleet(MetricsCase):
    def test_two_ranks_in_node_exporter_and_prometheus_beside_dcgm(self):
        textfile = os.path.join(self.tmp, "textfile")
        os.makedirs(textfile)
        host = socket.gethostname()
        node = NodeExporter(self, textfile, self.tmp)
        prom = Prometheus(self, node.port, self.tmp)
        policy = self.write_policy("p.ini", POLICY)
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write(TRAINER)
        ranks = {}
        for rank, (mode, steps) in enumerate((("grow", 30), ("leak", 70))):
            journal = os.path.join(self.tmp, f"journal{rank}")
            os.makedirs(journal)
            env = self.metrics_env(textfile, GPUGUARD_POLICY=policy, GPUGUARD_JOURNAL_DIR=journal,
                                   RANK=rank, LOCAL_RANK=rank, SLURM_JOB_ID=JOB,
                                   GG_PYHELPER=os.path.join(ROOT, "tools", "python"))
            proc, _, lines = self.start([sys.executable, script, FAKE, mode, str(steps)], env,
                                        umask=0o077)
            ranks[rank] = {"proc": proc, "lines": lines, "journal": journal, "mode": mode}
        for r in ranks.values():
            self.assertEqual(r["lines"].until("ready"), "ready", r["proc"].stderr)
        t_ready = time.time()
        pids = {str(r["proc"].pid): rank for rank, r in ranks.items()}
        # each rank on a fake GPU of its own (no FAKECUDA_STATE: its UUID is
        # its own, as the journal's start says); what dcgm-exporter says of
        # those two GPUs, as a textfile: its labels
        uuids = {}
        for rank, r in ranks.items():
            (path,) = [os.path.join(r["journal"], n) for n in os.listdir(r["journal"])]
            uuids[rank] = read_journal(path)[0]["devices"][0]["uuid"]
            self.assertRegex(uuids[rank], r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
        self.assertNotEqual(uuids[0], uuids[1])
        with open(os.path.join(textfile, ".dcgm.tmp"), "w") as f:
            f.write("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"
                    "# TYPE DCGM_FI_DEV_FB_USED gauge\n")
            for rank, uuid in uuids.items():
                f.write(f'DCGM_FI_DEV_FB_USED{{gpu="{rank}",UUID="{uuid}",pci_bus_id="00000000:0{rank + 1}:00.0",'
                        f'device="nvidia{rank}",modelName="NVIDIA GeForce RTX 3090",Hostname="{host}"}} '
                        f"{DCGM_FB_USED_MIB}\n")
        os.rename(os.path.join(textfile, ".dcgm.tmp"), os.path.join(textfile, "dcgm.prom"))

        # node_exporter: both files, written after the work, at mode 0644 (umask 077)
        def written():
            samples, helps, types = node.scrape()
            ts = {s[1]["pid"]: s[2] for s in samples if s[0] == "gpuguard_write_timestamp_seconds"}
            return (samples, helps, types) if all(ts.get(p, 0) > t_ready for p in pids) else None
        samples, helps, types = wait_for("both ranks' files rewritten", written, timeout=30)
        files = self.prom_files(textfile)
        self.assertEqual(len(files), 2)
        for p in pids:
            self.assertEqual(len([n for n in files if re.fullmatch(
                rf"gpuguard_{re.escape(host)}_{p}_[0-9a-f]{{16}}\.prom", n)]), 1, files)
        for name in files:
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(textfile, name)).st_mode), 0o644)
        errors = [s for s in samples if s[0] == "node_textfile_scrape_error"]
        self.assertEqual([s[2] for s in errors], [0.0])
        rows = metric_rows()
        mine = [s for s in samples if s[0].startswith("gpuguard_")]
        # every metric of metrics.def, with its HELP (escaped on the way) and TYPE
        self.assertEqual({s[0] for s in mine}, set(rows))
        for name, (kind, _) in rows.items():
            self.assertEqual(types.get(name), kind, name)
            self.assertTrue(helps.get(name), name)
        by = {}
        for name, labels, value in mine:
            rank = pids[labels["pid"]]
            key = (name, labels.get("reason"))
            self.assertNotIn(key, by.setdefault(rank, {}), f"{name}: one series per rank")
            by[rank][key] = value
            want = (DEVICE_LABELS if rows[name][1] != "PROCESS" else DEVICE_LABELS[3:]) + \
                (["reason"] if rows[name][1] == "ADVICE" else [])
            self.assertEqual(sorted(labels), sorted(want), name)
            self.assertEqual(labels["Hostname"], host)
            self.assertEqual(labels["rank"], str(rank))
            self.assertEqual(labels["local_rank"], str(rank))
            self.assertEqual(labels["hpc_job"], JOB)
            self.assertIn(f"_{labels['pid']}_{labels['instance_id']}.prom", " ".join(files))
            ranks[rank]["labels"] = labels
            if "UUID" in labels:
                self.assertEqual((labels["gpu"], labels["UUID"], labels["modelName"]),
                                 ("0", uuids[rank], "NVIDIA GeForce RTX 3090"))

        # Prometheus: the series, and a join with DCGM's on UUID
        def scraped():
            res = prom.query("gpuguard_write_timestamp_seconds")
            ok = {r["metric"]["pid"] for r in res if float(r["value"][1]) > t_ready} == set(pids)
            return res if ok else None
        wait_for("Prometheus to scrape both ranks", scraped, timeout=60)
        joined = prom.query("gpuguard_memory_used_bytes / on(UUID) group_left(device) "
                            "(DCGM_FI_DEV_FB_USED * 1048576)")
        self.assertEqual(sorted(r["metric"]["pid"] for r in joined), sorted(pids))
        for r in joined:
            m = r["metric"]
            rank = pids[m["pid"]]
            # hpc_job is the training job's, `job` the scrape's: no honor_labels needed
            self.assertEqual((m["device"], m["UUID"], m["hpc_job"], m["job"]),
                             (f"nvidia{rank}", uuids[rank], JOB, "node"))
            used = by[pids[m["pid"]]][("gpuguard_memory_used_bytes", None)]
            self.assertAlmostEqual(float(r["value"][1]), used / (DCGM_FB_USED_MIB * MiB), places=9)
        # the dashboard's every query answers (its variables: everything)
        time.sleep(3)  # a few scrapes: increase() needs two points
        for expr in dashboard_exprs():
            concrete = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
            concrete = re.sub(r"\$\{?\w+\}?", ".*", concrete)
            self.assertTrue(prom.query(concrete), f"no series: {concrete}")

        # a clean exit removes each file; node_exporter stops carrying them
        for r in ranks.values():
            r["proc"].stdin.write("\n")
            r["proc"].stdin.flush()
        for r in ranks.values():
            _, err = r["proc"].communicate(timeout=120)
            self.assertEqual(r["proc"].returncode, 0, err)
            self.assertNotIn("ERROR: AddressSanitizer", err)
        self.assertEqual(self.prom_files(textfile), [])
        samples, _, _ = node.scrape()
        self.assertFalse([s for s in samples if s[0].startswith("gpuguard_")])

        # the values are the journal's
        for rank, r in ranks.items():
            (path,) = [os.path.join(r["journal"], n) for n in os.listdir(r["journal"])]
            events = read_journal(path)
            summary = [e for e in events if e["ev"] == "summary"][0]
            s, got = summary["devices"][0], by[rank]
            start = events[0]
            self.assertEqual((r["labels"]["pid"], r["labels"]["comm"], r["labels"]["Hostname"]),
                             (str(start["pid"]), start["comm"], start["host"]))
            for metric, field in (("gpuguard_memory_peak_bytes", "peak"),
                                  ("gpuguard_device_peak_used_bytes", "peak_used"),
                                  ("gpuguard_memory_used_bytes", "live_bytes"),
                                  ("gpuguard_memory_limit_bytes", "limit"),
                                  ("gpuguard_device_memory_bytes", "total"),
                                  ("gpuguard_allocations_total", "allocs"),
                                  ("gpuguard_frees_total", "frees"),
                                  ("gpuguard_near_misses_total", "near_misses"),
                                  ("gpuguard_refusals_total", "refusals"),
                                  ("gpuguard_ooms_total", "ooms")):
                self.assertEqual(got[(metric, None)], s[field], f"rank {rank} {metric}")
            (view,) = [e for e in events if e["ev"] == "torch"]
            self.assertEqual(got[("gpuguard_torch_unallocated_bytes", None)], view["unallocated"])
            self.assertEqual(got[("gpuguard_torch_largest_free_bytes", None)], view["largest_free"])
            dev = start["devices"][0]
            self.assertEqual(got[("gpuguard_near_miss_line_bytes", None)],
                             dev["limit"] - dev["near_miss"])
            steps = [e for e in events if e["ev"] == "step"]
            self.assertEqual(got[("gpuguard_step", None)], steps[-1]["step"])
            advice = [e for e in events if e["ev"] == "advice"]
            total = sum(v for (name, _), v in got.items() if name == "gpuguard_advice_total")
            self.assertEqual(total, len(advice) + summary["suppressed"].get("advice", 0))
            self.assertEqual((got[("gpuguard_batch_size", None)], got[("gpuguard_grad_accum", None)]),
                             (32, 1))
            self.assertEqual(got[("gpuguard_enforcing", None)], 1)  # auto, a trainer registered
            if r["mode"] == "grow":
                forecasts = [a for a in advice if a["reason"] == "forecast"]
                self.assertTrue(forecasts and s["near_misses"] and s["refusals"], s)
                self.assertEqual(got[("gpuguard_advice_total", "forecast")], len(forecasts))
                self.assertEqual(got[("gpuguard_forecast_step", None)], forecasts[-1]["forecast"]["step"])
                self.assertEqual(got[("gpuguard_forecast_peak_bytes", None)],
                                 forecasts[-1]["forecast"]["bytes"])
                self.assertEqual(got[("gpuguard_leak_bytes_per_step", None)], 0)
            else:
                leaks = [e for e in events if e["ev"] == "leak"]
                self.assertTrue(leaks, r["mode"])
                self.assertEqual(got[("gpuguard_leak_bytes_per_step", None)], leaks[-1]["rate"])
                self.assertEqual(got[("gpuguard_leak_projected_step", None)],
                                 leaks[-1]["projected_step"])
                self.assertEqual(got[("gpuguard_forecast_step", None)], 0)


@unittest.skipUnless(NODE_EXPORTER, NEEDS)
class Files(MetricsCase):
    def test_a_thousand_rewrites_never_show_half_a_file(self):
        if not os.path.exists(UNIT):
            self.skipTest(f"{UNIT} is not built (make test-unit builds it)")
        textfile = os.path.join(self.tmp, "textfile")
        os.makedirs(textfile)
        node = NodeExporter(self, textfile, self.tmp)
        every = set(metric_rows()) - {"gpuguard_batch_size", "gpuguard_grad_accum"}
        writer = subprocess.Popen([UNIT, "rewrite", textfile, "1000", "2000"], env=base_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: writer.poll() is None and writer.kill())
        scrapes, last = 0, 0
        while writer.poll() is None:
            samples, _, _ = node.scrape()
            (error,) = [s[2] for s in samples if s[0] == "node_textfile_scrape_error"]
            self.assertEqual(error, 0.0)
            mine = [s for s in samples if s[0].startswith("gpuguard_")]
            if not mine:
                self.assertEqual(scrapes, 0, "the file went away")  # before the first write
                continue
            scrapes += 1
            self.assertEqual({s[0] for s in mine}, every)  # whole: every series
            values = {s[0]: s[2] for s in mine if "reason" not in s[1]}
            step = values["gpuguard_step"]
            self.assertEqual(values["gpuguard_memory_used_bytes"], step * MiB)  # one write's
            self.assertGreaterEqual(step, last)
            last = step
        out, err = writer.communicate()
        self.assertEqual(writer.returncode, 0, err)
        self.assertIn("rewrote 1000", out)
        self.assertGreaterEqual(scrapes, 10, "node_exporter read too rarely to tell")
        (name,) = os.listdir(textfile)
        self.assertRegex(name, rf"^gpuguard_host_1_{writer.pid}_[0-9a-f]{{16}}\.prom$")

    def test_a_killed_process_leaves_its_last_file_which_grows_stale(self):
        textfile = os.path.join(self.tmp, "textfile")
        os.makedirs(textfile)
        node = NodeExporter(self, textfile, self.tmp)
        proc, _, lines = self.start([SCRIPT, "alloc:1G", "print:holding", "sleep:60000"],
                                    self.metrics_env(textfile))
        self.assertEqual(lines.until("holding"), "holding")
        name = wait_for("the file", lambda: self.prom_files(textfile), timeout=30)[0]
        self.assertTrue(name.startswith(f"gpuguard_{socket.gethostname()}_{proc.pid}_"), name)
        path = os.path.join(textfile, name)
        time.sleep(1.5)  # a rewrite or two
        proc.kill()
        proc.wait()
        with open(path) as f:
            samples, _, _ = parse_exposition(f.read())
        used = [s[2] for s in samples if s[0] == "gpuguard_memory_used_bytes"]
        self.assertEqual(used, [GiB])
        killed_at = time.time()
        time.sleep(2.5)  # more than two intervals: no one rewrites it
        self.assertLess(os.stat(path).st_mtime, killed_at)
        samples, _, _ = node.scrape()
        (mtime,) = [s[2] for s in samples
                    if s[0] == "node_textfile_mtime_seconds" and s[1]["file"].endswith(name)]
        written = [s[2] for s in samples if s[0] == "gpuguard_write_timestamp_seconds"]
        self.assertLess(mtime, killed_at)
        self.assertEqual(len(written), 1)
        self.assertLess(written[0], killed_at)  # what a staleness alert compares with time()

    def test_a_clean_exit_removes_it_a_forked_child_does_not(self):
        textfile = os.path.join(self.tmp, "textfile")
        os.makedirs(textfile)
        proc, _, lines = self.start([SCRIPT, "alloc:1G", "print:holding", "sleep:1500",
                                     "forkexit", "print:forked", "sleep:1500", "exit:3"],
                                    self.metrics_env(textfile))
        self.assertEqual(lines.until("holding"), "holding")
        name = wait_for("the file", lambda: self.prom_files(textfile), timeout=30)[0]
        path = os.path.join(textfile, name)
        self.assertEqual(lines.until("forked"), "forked")
        # the child ran exit(): its atexit handlers, the shim's too
        self.assertTrue(os.path.exists(path), "a forked child removed its parent's file")
        proc.wait(60)
        self.assertEqual(proc.returncode, 3)  # exit(3) is a clean exit all the same
        self.assertEqual(os.listdir(textfile), [])


class Said(MetricsCase):
    """A directory the shim cannot use: one line, and nothing else changes."""

    def world(self):
        """The program, the shim and the fake CUDA stack copied where a user
        other than root can read them: the checkout may sit in a directory
        only root can enter (a clone in `mktemp -d`'s 0700 directory).
        (the program's path, the shim's, the fakes' directory)"""
        w = os.path.join(self.tmp, "world")
        if not os.path.isdir(w):
            os.makedirs(os.path.join(w, "tests", "progs"))
            shutil.copytree(FAKE, os.path.join(w, "fake"), symlinks=True)
            shutil.copy2(SCRIPT, os.path.join(w, "tests", "progs", "script"))
            shutil.copy2(SHIM, os.path.join(w, "libgpuguard.so"))
            for d, _, files in os.walk(w):
                os.chmod(d, 0o755)
                for n in files:
                    p = os.path.join(d, n)
                    if not os.path.islink(p):
                        os.chmod(p, os.stat(p).st_mode | 0o444 | (0o111 if os.stat(p).st_mode & 0o100 else 0))
            os.chmod(self.tmp, 0o755)
        return (os.path.join(w, "tests", "progs", "script"), os.path.join(w, "libgpuguard.so"),
                os.path.join(w, "fake"))

    def run_script(self, env, drop=False):
        script = SCRIPT
        if drop:
            script, shim, fake = self.world()
            env = dict(env, LD_PRELOAD=env["LD_PRELOAD"].replace(SHIM, shim),
                       LD_LIBRARY_PATH=env["LD_LIBRARY_PATH"].replace(FAKE, fake))
        cmds = [script, "alloc:1G", "sleep:1200", "freeall", "print:end"]
        run_dir = tempfile.mkdtemp(prefix="run-", dir=self.tmp)
        os.chmod(run_dir, 0o777)
        env = dict(env, GPUGUARD_JOURNAL_DIR=run_dir)

        def as_nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        proc = subprocess.run(cmds, env=env, cwd=run_dir, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              preexec_fn=as_nobody if drop else None)
        journals = [n for n in os.listdir(run_dir) if n.endswith(".jsonl")]
        self.assertEqual(len(journals), 1, proc.stderr)
        return proc, read_journal(os.path.join(run_dir, journals[0]))

    def check_said_once(self, where, words, drop=False):
        base_proc, base = self.run_script(self.shim_env(), drop)
        proc, events = self.run_script(self.metrics_env(where), drop)
        self.assertEqual((proc.returncode, proc.stdout), (base_proc.returncode, base_proc.stdout))
        said = [l for l in proc.stderr.splitlines() if "GPUGUARD_METRICS_DIR" in l]
        self.assertEqual(len(said), 1, proc.stderr)
        self.assertTrue(said[0].startswith("gpuguard: GPUGUARD_METRICS_DIR: "), said)
        for w in words:
            self.assertIn(w, said[0])
        self.assertEqual(len(proc.stderr.splitlines()), len(base_proc.stderr.splitlines()) + 1)
        errors = [e for e in events if e["ev"] == "error"]
        self.assertEqual([e["message"] for e in errors], [said[0][len("gpuguard: "):]])
        kinds = lambda evs: sorted({e["ev"] for e in evs} - {"error"})
        self.assertEqual(kinds(events), kinds(base))
        self.assertEqual(events[-1]["devices"][0]["peak"], base[-1]["devices"][0]["peak"])
        for marker in ("ERROR: AddressSanitizer", "runtime error:", "ThreadSanitizer"):
            self.assertNotIn(marker, proc.stderr)

    def test_a_symlinked_directory_is_said_once(self):
        real = os.path.join(self.tmp, "real")
        os.makedirs(real)
        link = os.path.join(self.tmp, "link")
        os.symlink(real, link)
        self.check_said_once(link, ["symbolic link", link])
        self.assertEqual(os.listdir(real), [])  # never through the link

    def test_an_unwritable_directory_is_said_once(self):
        where = os.path.join(self.tmp, "readonly")
        os.makedirs(where)
        os.chmod(where, 0o555)
        os.chmod(self.tmp, 0o755)
        # root writes anywhere: the guarded program runs as nobody then
        self.check_said_once(where, ["cannot write metrics in " + where, "Permission denied"],
                             drop=os.geteuid() == 0)
        self.assertEqual(os.listdir(where), [])

    def squatter_run(self, where, plant, written=None):
        """A guarded program run as nobody in `where`, in which another user
        (uid 65533) plants, before the program's first CUDA call, the files
        plant(pid, name) names; (the process, its output, its journal)."""
        script, shim, fake = self.world()
        env = self.metrics_env(where)
        env = dict(env, LD_PRELOAD=env["LD_PRELOAD"].replace(SHIM, shim),
                   LD_LIBRARY_PATH=env["LD_LIBRARY_PATH"].replace(FAKE, fake))
        run_dir = tempfile.mkdtemp(prefix="run-", dir=self.tmp)
        os.chmod(run_dir, 0o777)
        env["GPUGUARD_JOURNAL_DIR"] = run_dir

        def as_nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        proc = subprocess.Popen([script, "sleep:1500", "alloc:1G", "print:holding", "sleep:2500"],
                                env=env, cwd=run_dir, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=as_nobody)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        name = f"gpuguard_{socket.gethostname()}_{proc.pid}_{instance_id(proc.pid)}.prom"
        planted = plant(proc.pid, name)
        for path, text in planted.items():
            with open(path, "w") as f:
                f.write(text)
            os.chown(path, 65533, 65533)
            os.chmod(path, 0o644)
        if written is not None:  # the process's own file, while it holds its memory
            path = os.path.join(where, name)
            text = wait_for("its file", lambda: os.path.exists(path) and open(path).read(),
                            timeout=30)
            written.append(parse_exposition(text)[0])
        out, err = proc.communicate(timeout=120)
        journals = [n for n in os.listdir(run_dir) if n.endswith(".jsonl")]
        self.assertEqual(len(journals), 1, err)
        return proc, out, err, read_journal(os.path.join(run_dir, journals[0])), planted, name

    def shared_dir(self):
        where = os.path.join(self.tmp, "shared")
        os.makedirs(where)
        os.chmod(where, 0o1777)  # anyone may create files, as in /tmp
        os.chmod(self.tmp, 0o755)
        return where

    def test_a_planted_file_at_its_name_is_never_served_as_its_own(self):
        """Another user who computed the name plants the
        file first, in a sticky directory others can write: the process
        cannot replace it, says so once naming it and its owner, never
        writes through it, and leaves it as it was."""
        if os.geteuid() != 0:
            self.skipTest("needs root to run as two other users (CI runs as root)")
        where = self.shared_dir()
        fake = 'gpuguard_memory_used_bytes{pid="1"} 12345\n'
        proc, out, err, events, planted, name = self.squatter_run(
            where, lambda pid, name: {os.path.join(where, name): fake})
        self.assertEqual(proc.returncode, 0, err)
        said = [l for l in err.splitlines() if "GPUGUARD_METRICS_DIR" in l]
        self.assertEqual(len(said), 1, err)
        self.assertIn(f"{name} belongs to uid 65533, not to this process, and cannot be replaced",
                      said[0])
        self.assertEqual([e["message"] for e in events if e["ev"] == "error"],
                         [said[0][len("gpuguard: "):]])
        with open(os.path.join(where, name)) as f:
            self.assertEqual(f.read(), fake)          # never written through
        self.assertEqual(os.listdir(where), [name])   # no temporary file left

    def test_a_planted_temporary_name_does_not_stop_it(self):
        """The temporary name is the process's own and unguessable: another
        user who plants the names it could guess stops nothing, and those
        files are left as they were."""
        if os.geteuid() != 0:
            self.skipTest("needs root to run as two other users (CI runs as root)")
        where = self.shared_dir()
        host = socket.gethostname()

        def plant(pid, name):
            return {os.path.join(where, f".gpuguard_{host}_{pid}.prom.tmp"): "x\n",
                    os.path.join(where, f".{name}.tmp"): "x\n"}
        seen = []
        proc, out, err, events, planted, name = self.squatter_run(where, plant, seen)
        (used,) = [x for x in seen[0] if x[0] == "gpuguard_memory_used_bytes"]
        self.assertEqual(used[2], GiB)
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual([l for l in err.splitlines() if "GPUGUARD_METRICS_DIR" in l], [], err)
        self.assertEqual([e for e in events if e["ev"] == "error"], [])
        for path in planted:
            with open(path) as f:
                self.assertEqual(f.read(), "x\n")
        # it wrote its file (and removed it at its clean exit): its journal
        # says nothing was wrong; while it held its gigabyte the file was there
        self.assertEqual(sorted(os.listdir(where)), sorted(os.path.basename(p) for p in planted))

    def test_a_bad_interval_is_one_line_naming_it(self):
        textfile = os.path.join(self.tmp, "textfile")
        os.makedirs(textfile)
        env = self.metrics_env(textfile)
        env["GPUGUARD_METRICS_INTERVAL"] = "0"
        run = self.run_prog([SCRIPT, "alloc:1M", "freeall"], env=env, preload=False)
        self.assertEqual(run.rc, 0, run.err)
        said = [l for l in self.shim_lines(run) if l.startswith("gpuguard: GPUGUARD_METRICS_INTERVAL")]
        self.assertEqual(len(said), 1, run.err)
        self.assertIn("'0'", said[0])
        # and why the guard only observes: the variable, not a policy
        self.assertIn("gpuguard: GPU0: GPUGUARD_METRICS_INTERVAL is not valid (above); observing "
                      "only, nothing will be refused", self.shim_lines(run))


def instance_id(pid):
    """A process's instance_id as the shim makes it (docs/metrics.md): what
    another user of the host can compute too, so that a squatter is tried
    against the real name."""
    def mix(h):
        h ^= h >> 33
        h = (h * 0xff51afd7ed558ccd) & (2**64 - 1)
        h ^= h >> 33
        h = (h * 0xc4ceb9fe1a85ec53) & (2**64 - 1)
        return h ^ (h >> 33)
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    h = 0xcbf29ce484222325
    for c in boot.encode():
        h = ((h ^ c) * 0x100000001b3) & (2**64 - 1)
    h = mix(h ^ os.stat(f"/proc/{pid}/ns/pid").st_ino)
    with open(f"/proc/{pid}/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19])
    h = mix(h ^ started)
    return "%016x" % mix(h ^ pid)


@unittest.skipUnless(NODE_EXPORTER and PROMETHEUS, NEEDS)
class Containers(MetricsCase):
    """Containers with host networking share the host's
    name and each runs its job as pid 1."""

    def test_one_host_name_and_pid_in_two_pid_namespaces_are_two_series(self):
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root and unshare(1) for PID and UTS namespaces (CI runs as root)")
        textfile = os.path.join(self.tmp, "textfile")
        os.makedirs(textfile)
        node = NodeExporter(self, textfile, self.tmp)
        prom = Prometheus(self, node.port, self.tmp)
        procs = []
        for hold, ms in (("1G", 20000), ("2G", 600000)):
            # a PID namespace (the program is its pid 1) and a UTS one with
            # the same host name, as two hostNetwork pods on one node
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--",
                    "sh", "-c", 'hostname gpu-node-7 && exec "$0" "$@"', SCRIPT, "alloc:" + hold,
                    "print:holding", "sleep:%d" % ms]
            proc, _, lines = self.start(argv, self.metrics_env(textfile))
            self.assertEqual(lines.until("holding"), "holding", proc.stderr)
            procs.append(proc)

        def both():
            files = self.prom_files(textfile)
            return files if len(files) == 2 else None
        files = wait_for("two files", both, timeout=30)
        for name in files:
            self.assertRegex(name, r"^gpuguard_gpu-node-7_1_[0-9a-f]{16}\.prom$")
        # each file holds its own process's figures, none the other's
        held = {}
        for name in files:
            with open(os.path.join(textfile, name)) as f:
                samples, _, _ = parse_exposition(f.read())
            (used,) = [s for s in samples if s[0] == "gpuguard_memory_used_bytes"]
            self.assertEqual((used[1]["pid"], used[1]["Hostname"]), ("1", "gpu-node-7"))
            self.assertIn(used[1]["instance_id"], name)
            held[used[1]["instance_id"]] = used[2]
        self.assertEqual(sorted(held.values()), [GiB, 2 * GiB])
        # two series in node_exporter and in Prometheus
        samples, _, _ = node.scrape()
        used = [s for s in samples if s[0] == "gpuguard_memory_used_bytes"]
        self.assertEqual(len(used), 2)
        self.assertEqual([s[2] for s in sorted(used, key=lambda s: s[2])], [GiB, 2 * GiB])

        def scraped():
            res = prom.query('gpuguard_memory_used_bytes{Hostname="gpu-node-7",pid="1"}')
            return res if len(res) == 2 else None
        res = wait_for("two series in Prometheus", scraped, timeout=60)
        self.assertEqual(len({r["metric"]["instance_id"] for r in res}), 2)
        # the first exits cleanly: its file goes, the other's stays, its own
        procs[0].wait(60)
        self.assertEqual(procs[0].returncode, 0, procs[0].stderr.read())
        (left,) = self.prom_files(textfile)
        with open(os.path.join(textfile, left)) as f:
            samples, _, _ = parse_exposition(f.read())
        (used,) = [s for s in samples if s[0] == "gpuguard_memory_used_bytes"]
        self.assertEqual(used[2], 2 * GiB)
        self.assertIn(used[1]["instance_id"], left)
        procs[1].kill()


def dashboard_exprs():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"label_values\((.*),\s*\w+\)$", q or "")
        if m:
            exprs.append(m.group(1))
    return exprs


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan"}


def metric_names(expr):
    """The metric names a PromQL expression reads."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)       # strings
    e = re.sub(r"\{[^}]*\}", "", e)                    # matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                   # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)                  # Grafana's variables
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if (m.group(0).lower() in PROMQL_WORDS or rest.startswith("(") or
                re.match(r"(by|without)\b", rest)):
            continue                                   # keywords, functions, aggregations
        if re.fullmatch(r"\d", e[m.start() - 1:m.start()] or " "):
            continue                                   # 1e6, 5m
        names.add(m.group(0))
    return names


class Dashboard(unittest.TestCase):
    def test_every_query_names_only_what_is_written(self):
        written = set(metric_rows())
        exprs = dashboard_exprs()
        self.assertGreater(len(exprs), 10)
        used = set()
        for expr in exprs:
            names = metric_names(expr)
            self.assertTrue(names, expr)
            for n in names:
                self.assertTrue(n in written or n.startswith("DCGM_FI_"), f"{n} in {expr}")
            used |= names
        self.assertIn("DCGM_FI_DEV_FB_USED", used)  # DCGM beside gpuguard
        # memory against the limit, margins, advice, forecasts, leaks
        for n in ("gpuguard_memory_used_bytes", "gpuguard_memory_limit_bytes",
                  "gpuguard_near_miss_line_bytes", "gpuguard_advice_total",
                  "gpuguard_forecast_step", "gpuguard_leak_bytes_per_step"):
            self.assertIn(n, used)
        with open(DASHBOARD) as f:
            dash = json.load(f)
        variables = {v["name"] for v in dash["templating"]["list"]}
        self.assertLessEqual({"datasource", "hpc_job", "rank"}, variables)

    def test_the_checker_sees_a_wrong_name(self):
        self.assertEqual(metric_names('sum by (rank) (increase(gpuguard_x_total{hpc_job=~"$hpc_job"}'
                                      '[$__rate_interval])) / on(UUID) group_left() '
                                      "(DCGM_FI_DEV_FB_USED * 1048576) > 1e6"),
                         {"gpuguard_x_total", "DCGM_FI_DEV_FB_USED"})

    def test_every_metric_is_documented(self):
        with open(DOC) as f:
            doc = f.read()
        for name, (kind, _) in metric_rows().items():  # a row of its table, with its type
            self.assertRegex(doc, rf"\n\| `{name}` \| {kind} \|")
        with open(os.path.join(ROOT, "include", "gpuguard.h")) as f:
            api = set(re.findall(r"\b(gpuguard_\w+)", f.read()))  # the C API's names
        documented = set(re.findall(r"`(gpuguard_[a-z_]+)`", doc))
        self.assertEqual(documented - set(metric_rows()) - api,
                         set(), "docs/metrics.md names a metric metrics.def does not have")


if __name__ == "__main__":
    unittest.main()
