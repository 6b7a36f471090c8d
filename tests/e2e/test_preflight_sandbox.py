"""gpuguard-preflight's throwaway layer (tools/python/gpuguard/preflight/
sandbox.py), on this machine: a command's writes never reach the real files
and are said, it has no network but loopback, nothing it starts outlives
it, a time limit stops it; as root and as another user (a user namespace).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from gg import PYHELPER, Case

SANDBOX = os.path.join(PYHELPER, "gpuguard", "preflight", "sandbox.py")
sys.path.insert(0, os.path.dirname(SANDBOX))
import sandbox  # noqa: E402

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def need_root(case):
    if os.getuid() != 0:
        case.skipTest("the layer's root path is tested as root (CI runs as root); "
                      "the user-namespace path by test_as_another_user")


class Layer(Case):
    def setUp(self):
        super().setUp()
        need_root(self)
        self.data = os.path.join(self.tmp, "data")
        self.results = os.path.join(self.tmp, "results")
        os.makedirs(self.data)
        os.makedirs(self.results)
        for name, text in (("ckpt.pt", "real weights"), ("log.txt", "line 1\n"),
                           ("gone.txt", "keep me")):
            with open(os.path.join(self.data, name), "w") as f:
                f.write(text)

    def sh(self, script, timeout=None, argv=None):
        out = os.path.join(self.results, "out")
        err = os.path.join(self.results, "err")
        outcome = sandbox.run(argv or ["/bin/sh", "-c", script], dict(os.environ, HOME=self.data),
                              self.data, self.results, out, err, timeout=timeout)
        with open(out) as f:
            self.out = f.read()
        with open(err) as f:
            self.err = f.read()
        return outcome

    def read(self, name):
        with open(os.path.join(self.data, name)) as f:
            return f.read()

    def test_writes_go_to_the_layer_and_are_said(self):
        o = self.sh("echo zeros > ckpt.pt && echo line 2 >> log.txt && rm gone.txt && "
                    "mkdir -p runs/1 && echo x > runs/1/w.bin && echo ok > %s/mine && "
                    "cat ckpt.pt log.txt" % self.results)
        self.assertIsNone(o.refused, o.refused)
        self.assertEqual(o.status, 0, self.err)
        # inside, the writes were seen
        self.assertEqual(self.out, "zeros\nline 1\nline 2\n")
        # outside, nothing changed
        self.assertEqual(self.read("ckpt.pt"), "real weights")
        self.assertEqual(self.read("log.txt"), "line 1\n")
        self.assertEqual(self.read("gone.txt"), "keep me")
        self.assertFalse(os.path.exists(os.path.join(self.data, "runs")))
        # and said, by the paths they would have had
        said = {(w["path"], w["what"]) for w in o.written}
        for item in (("ckpt.pt", "file"), ("log.txt", "file"), ("gone.txt", "deleted"),
                     ("runs/", "dir made"), ("runs/1/w.bin", "file")):
            self.assertIn((os.path.join(self.data, item[0]), item[1]), said)
        sizes = {w["path"]: w["bytes"] for w in o.written}
        self.assertEqual(sizes[os.path.join(self.data, "ckpt.pt")], 6)
        # the results directory is the one place it writes for real
        with open(os.path.join(self.results, "mine")) as f:
            self.assertEqual(f.read(), "ok\n")
        self.assertFalse(any(w["path"].startswith(self.results) for w in o.written))

    def test_no_network_but_loopback(self):
        code = ("import socket, errno\n"
                "s = socket.socket(); s.settimeout(5)\n"
                "try:\n    s.connect(('192.0.2.1', 9)); print('reached')\n"
                "except OSError as e:\n    print('outside', errno.errorcode.get(e.errno))\n"
                "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n"
                "c = socket.create_connection(srv.getsockname(), timeout=5)\n"
                "a, _ = srv.accept(); c.sendall(b'hi'); print('loopback', a.recv(2).decode())\n")
        o = self.sh(None, argv=[PYTHON, "-c", code])
        self.assertEqual(o.status, 0, self.err)
        self.assertIn("outside ENETUNREACH", self.out)
        self.assertIn("loopback hi", self.out)

    def test_nothing_it_starts_outlives_it(self):
        marker = "300.%d" % os.getpid()
        o = self.sh("setsid sleep %s >/dev/null 2>&1 & echo started; echo $$" % marker)
        self.assertEqual(o.status, 0, self.err)
        self.assertEqual(self.out.split(), ["started", "1"])   # the first of its PID namespace
        left = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        if marker.encode() in f.read():
                            left.append(pid)
                except OSError:
                    pass
        self.assertEqual(left, [])

    def test_a_time_limit_stops_it(self):
        o = self.sh("trap 'echo interrupted; exit 130' INT; sleep 60 & wait", timeout=1)
        self.assertTrue(o.timed_out)
        self.assertLess(o.seconds, 1 + sandbox.STOP_GRACE + 5)

    def test_a_command_that_cannot_start_is_said(self):
        out = os.path.join(self.results, "out")
        o = sandbox.run(["/nonexistent/tool"], dict(os.environ), self.data, self.results, out,
                        out + ".err")
        self.assertEqual(o.status, 127)
        self.assertIn("/nonexistent/tool", o.exec_failed)


class AnotherUser(Case):
    """A user who is not root: the same layer, made in a user namespace
    (or refused, saying why, where the kernel or the distribution does not
    allow one)."""

    def test_as_another_user(self):
        need_root(self)
        if shutil.which("setpriv") is None:
            self.skipTest("setpriv (util-linux) is needed to run as nobody")
        base = tempfile.mkdtemp(prefix="gg-sbx-")
        self.addCleanup(shutil.rmtree, base, True)
        os.chmod(base, 0o755)
        shutil.copy(SANDBOX, base)
        home = os.path.join(base, "home")
        res = os.path.join(home, "results")
        os.makedirs(res)
        with open(os.path.join(home, "ckpt.pt"), "w") as f:
            f.write("real weights")
        subprocess.run(["chown", "-R", "nobody:nogroup", home], check=True)
        os.chmod(base, 0o755)
        driver = os.path.join(base, "drive.py")
        with open(driver, "w") as f:
            f.write("import json, os, sys\nsys.path.insert(0, %r)\nimport sandbox\n"
                    "h = %r; r = %r\n"
                    "o = sandbox.run(['/bin/sh', '-c', 'echo zeros > ckpt.pt; id -u; cat ckpt.pt'],"
                    " {'PATH': '/usr/bin:/bin', 'HOME': h}, h, r, r + '/out', r + '/err')\n"
                    "print(json.dumps(vars(o)))\n" % (base, home, res))
        os.chmod(driver, 0o644)
        proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               PYTHON, driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, cwd="/", timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        o = json.loads(proc.stdout.strip().splitlines()[-1])
        with open(os.path.join(home, "ckpt.pt")) as f:
            self.assertEqual(f.read(), "real weights")       # either way, untouched
        if o["refused"]:
            # a kernel or distribution without unprivileged user namespaces
            self.assertIn("user namespace", o["refused"])
            self.assertFalse(os.path.exists(os.path.join(res, "out")))
            print("\n    refused as nobody: %s" % o["refused"])
            return
        with open(os.path.join(res, "out")) as f:
            self.assertEqual(f.read().split(), ["65534", "zeros"])  # as the user, the write seen
        self.assertIn({"path": os.path.join(home, "ckpt.pt"), "what": "file", "bytes": 6},
                      o["written"])


if __name__ == "__main__":
    unittest.main()
