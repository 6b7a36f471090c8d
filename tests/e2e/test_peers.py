"""Guarded processes of one user that share a GPU share
one ledger per GPU (its UUID), so the limit holds for their sum. Two
processes started in the same instant in enforce, 11 and 12 GiB against a
21.6 GiB limit, never hold more than the limit between them (the fake
device's high-water mark, 100 times); a member killed mid-run leaves no
share behind; observing processes see each other's bytes in their figures;
processes on different GPUs (fake devices of their own) do not meet; and the
report merges their journals by the GPU's UUID and says who shared it."""
import glob
import json
import os
import signal
import subprocess
import sys

from gg import ROOT, GiB, SCRIPT, SHIM, Case, base_env, sanitizer_preload

LIMIT = int(24 * GiB * 0.9)  # an RTX 3090 under the default 10% headroom
REPORT = os.path.join(ROOT, "tools", "bin", "gpuguard-report")


def high_water(state, dev=0):
    """The fake device's high-water mark: the most it ever held at once
    (tests/fake/README.md: FAKECUDA_STATE's layout)."""
    with open(state, "rb") as f:
        f.seek(512 + 8 * dev)
        return int.from_bytes(f.read(8), "little")


def used_now(state, dev=0):
    with open(state, "rb") as f:
        f.seek(8 * dev)
        return int.from_bytes(f.read(8), "little")


class SharedGpu(Case):
    def env(self, state, journal, mode="enforce", **extra):
        e = base_env(FAKECUDA_STATE=state, GPUGUARD_JOURNAL_DIR=journal, GPUGUARD_QUIET="1",
                     **extra)
        if mode:
            e["GPUGUARD_MODE"] = mode
        e["LD_PRELOAD"] = ":".join(sanitizer_preload() + [SHIM])
        return e

    def start(self, env, *cmds):
        return subprocess.Popen([SCRIPT, *cmds], env=env, cwd=self.tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def together(self, state, journal, sizes, mode="enforce", after=("sleep:200",)):
        """Processes allocating sizes[i] at the same instant: each, its CUDA
        and the shim started, spins until a file exists, which is made once
        all of them are there (whatever their start-up takes: a sanitizer's)."""
        env = self.env(state, journal, mode)
        go = os.path.join(os.path.dirname(state), "go." + os.path.basename(state))
        procs = [self.start(env, "meminfo", "print:ready", "until:" + go, "alloc:%d" % s, *after)
                 for s in sizes]
        for p in procs:
            while p.stdout.readline().strip() != "ready":
                self.assertIsNone(p.poll(), "a process ended before it was ready")
        with open(go, "w"):
            pass
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
            self.assertNotIn("AddressSanitizer", err)
        return [out for out, _ in outs]

    def journals(self, journal):
        out = []
        for path in sorted(glob.glob(os.path.join(journal, "gpuguard.*.jsonl"))):
            with open(path) as f:
                out.append([json.loads(l) for l in f if l.strip()])
        return out

    def test_started_together_they_never_pass_the_limit(self):
        """100 times: 11 and 12 GiB at the same instant against a 21.6 GiB
        limit. Without the shared ledger both pass (each read the device
        before the other's allocation landed); with it, the device never
        holds more than the limit, and one of them gets its memory."""
        outcomes = {"one": 0, "none": 0}
        highs, refusals = [], []
        for i in range(100):
            state = os.path.join(self.tmp, "state%d" % i)
            journal = os.path.join(self.tmp, "j%d" % i)
            os.mkdir(journal)
            outs = self.together(state, journal, [11 * GiB, 12 * GiB])
            refused = sum("alloc" in o and "error 2" in o for o in outs)
            high = high_water(state)
            highs.append(high)
            self.assertLessEqual(high, LIMIT, "round %d: the device held %d > limit %d; %s"
                                 % (i, high, LIMIT, outs))
            self.assertIn(refused, (1, 2), outs)
            outcomes["one" if refused == 1 else "none"] += 1
            refusals += [e for events in self.journals(journal) for e in events
                         if e["ev"] == "refused"]
        # the refused one says what the other held or claimed
        for e in refusals:
            self.assertGreaterEqual(e.get("peers", 0), 11 * GiB)
            self.assertGreater(e["used"] + e["bytes"], LIMIT)
        print("\n  100 rounds: high-water mark %.2f-%.2f GiB (limit %.2f GiB); one admitted %d, "
              "none %d" % (min(highs) / GiB, max(highs) / GiB, LIMIT / GiB, outcomes["one"],
                           outcomes["none"]), file=sys.stderr)
        # the one that decides first gets it: none at all would be a guard
        # that is safe by refusing everyone
        self.assertGreaterEqual(outcomes["one"], 95, outcomes)

    def test_a_killed_member_leaves_no_share_behind(self):
        """A member holding 15 GiB is killed (SIGKILL: no exit handler); the
        fake driver gives its memory back, as a real one does, and the
        ledger drops its share: the next process gets its 15 GiB."""
        state = os.path.join(self.tmp, "state")
        journal = os.path.join(self.tmp, "j")
        os.mkdir(journal)
        env = self.env(state, journal)
        a = self.start(env, "alloc:15G", "print:holding", "sleep:60000")
        self.assertEqual(a.stdout.readline().strip(), "holding")
        self.assertEqual(used_now(state), 15 * GiB)
        # while it lives, its share counts
        held = self.start(env, "alloc:15G")
        out, _ = held.communicate(timeout=60)
        self.assertIn("alloc 15G: error 2", out)
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=60)
        b = self.start(env, "alloc:15G", "meminfo")
        out, err = b.communicate(timeout=60)
        self.assertEqual(b.returncode, 0, err)
        self.assertNotIn("error", out)
        for events in self.journals(journal):
            refused = [e for e in events if e["ev"] == "refused"]
            if events[0]["pid"] == b.pid:
                self.assertEqual(refused, [])

    def test_observers_see_each_other(self):
        """Observing, nothing is refused, and each process's figures count
        the other's bytes: the second near miss says the device held both."""
        state = os.path.join(self.tmp, "state")
        journal = os.path.join(self.tmp, "j")
        os.mkdir(journal)
        env = self.env(state, journal, mode="observe")
        a = self.start(env, "alloc:11G", "print:holding", "sleep:60000")
        self.assertEqual(a.stdout.readline().strip(), "holding")
        b = self.start(env, "alloc:10G", "alloc:1G")
        out, err = b.communicate(timeout=60)
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=60)
        self.assertNotIn("error", out)
        mine = [ev for ev in self.journals(journal) if ev[0]["pid"] == b.pid][0]
        near = [e for e in mine if e["ev"] == "near_miss"]
        self.assertTrue(near, mine)
        self.assertGreaterEqual(near[-1]["used"], 22 * GiB)
        self.assertGreaterEqual(near[-1]["peers"], 11 * GiB)
        start = mine[0]["devices"][0]
        self.assertTrue(start["shared"])
        self.assertRegex(start["uuid"], r"^GPU-[0-9a-f-]{36}$")
        summary = [e for e in mine if e["ev"] == "summary"][0]["devices"][0]
        self.assertEqual(summary["peers"], 1)
        self.assertGreaterEqual(summary["peers_peak"], 11 * GiB)

    def test_different_gpus_do_not_meet(self):
        """Without a shared FAKECUDA_STATE each process has a fake GPU of its
        own, with a UUID of its own: 11 and 12 GiB both fit."""
        journal = os.path.join(self.tmp, "j")
        os.mkdir(journal)
        outs = []
        for i, size in enumerate((11, 12)):
            env = self.env("", journal)
            del env["FAKECUDA_STATE"]
            outs.append(self.start(env, "alloc:%dG" % size, "sleep:300"))
        for p in outs:
            out, err = p.communicate(timeout=60)
            self.assertNotIn("error", out)
        uuids = {ev[0]["devices"][0]["uuid"] for ev in self.journals(journal)}
        self.assertEqual(len(uuids), 2)

    def test_the_report_says_who_shared_the_gpu(self):
        state = os.path.join(self.tmp, "state")
        journal = os.path.join(self.tmp, "j")
        os.mkdir(journal)
        self.together(state, journal, [11 * GiB, 12 * GiB], after=("sleep:300",))
        p = subprocess.run([sys.executable, REPORT, journal], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONPATH=""))
        self.assertEqual(p.returncode, 0, p.stderr)
        uuid = self.journals(journal)[0][0]["devices"][0]["uuid"]
        line = [l for l in p.stdout.splitlines() if uuid in l]
        self.assertTrue(line, p.stdout)
        self.assertIn("was shared by 2 processes", line[0])
        self.assertIn("of it by this user's other guarded processes on the GPU", p.stdout)
