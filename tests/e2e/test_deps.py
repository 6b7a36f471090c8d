"""What `make test` and `make demo` install as root (tools/build-aux/deps.sh),
with a stand-in `apt-get` (and `id`, and the /usr/bin/python3 it asks for torch)
first on the PATH: nothing is installed. `make test` says what it installs,
why and how large before it does, and afterwards what happened, judged by
whether torch imports, not by apt-get's status; `make demo`, which needs no
PyTorch on the host, installs none."""
import os
import stat
import subprocess

from gg import ROOT, Case

DEPS = os.path.join(ROOT, "tools", "build-aux", "deps.sh")

APT_GET = r"""#!/bin/sh
# a stand-in apt-get: logs its arguments, installs nothing real
state=$GG_STANDIN_STATE
echo "$*" >> "$state/log"
case " $* " in
    *" update "*) touch "$state/updated"; exit 0 ;;
    *" --assume-no "*)
        if [ -f "$state/stale-lists" ] && [ ! -f "$state/updated" ]; then
            echo "E: Unable to locate package python3-torch" >&2; exit 100
        fi
        printf 'Reading package lists...\n'
        printf 'The following NEW packages will be installed:\n  libqt5core5t64 python3-torch\n'
        printf '0 upgraded, 181 newly installed, 0 to remove and 3 not upgraded.\n'
        printf 'Need to get 0 B/263 MB of archives.\n'
        printf 'After this operation, 1,204 MB of additional disk space will be used.\n'
        printf 'Abort.\n'
        exit 1 ;;
    *" install "*)
        [ ! -f "$state/installs" ] || touch "$state/torch"
        rc=$(cat "$state/rc")
        [ "$rc" = 0 ] || echo "E: Sub-process /usr/bin/dpkg returned an error code (1)"
        exit "$rc" ;;
esac
exit 0
"""

PYTHON = """#!/bin/sh
# /usr/bin/python3 as deps.sh asks it: does torch import?
[ -f "$GG_STANDIN_STATE/torch" ]
"""

ID = """#!/bin/sh
[ "$1" = -u ] && { echo 0; exit 0; }
exec /usr/bin/id "$@"
"""


class TorchInstall(Case):
    def setUp(self):
        super().setUp()
        self.bin = os.path.join(self.tmp, "bin")
        self.state = os.path.join(self.tmp, "state")
        os.makedirs(self.bin)
        os.makedirs(self.state)
        for name, text in (("apt-get", APT_GET), ("python3-standin", PYTHON), ("id", ID)):
            path = os.path.join(self.bin, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        # the CUDA headers deps.sh checks for, as files
        self.cuda = os.path.join(self.tmp, "cuda")
        os.makedirs(os.path.join(self.cuda, "include"))
        for h in ("cuda.h", "cuda_runtime_api.h"):
            open(os.path.join(self.cuda, "include", h), "w").close()

    def deps(self, mode, rc=0, installs=True, stale=False):
        with open(os.path.join(self.state, "rc"), "w") as f:
            f.write(str(rc))
        for flag, on in (("installs", installs), ("stale-lists", stale)):
            path = os.path.join(self.state, flag)
            if on:
                open(path, "w").close()
            elif os.path.exists(path):
                os.unlink(path)
        env = dict(os.environ, PATH=self.bin + os.pathsep + os.environ["PATH"],
                   GG_STANDIN_STATE=self.state,
                   GG_DEPS_PYTHON=os.path.join(self.bin, "python3-standin"))
        out = subprocess.run(["sh", DEPS, mode, self.cuda], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out

    def log(self):
        path = os.path.join(self.state, "log")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return f.read().splitlines()

    def installs(self):
        return [l for l in self.log() if " install " in " %s " % l and "--assume-no" not in l]

    SAID = ("gpuguard: installing python3-torch, Debian's PyTorch for %s, which the Python "
            "helper's tests use (real PyTorch on the CPU): 181 packages (263 MB), 1,204 MB on "
            "disk; without it they skip\n")

    def test_said_before_with_its_size_and_after_as_it_is(self):
        out = self.deps("install-test")
        python = os.path.join(self.bin, "python3-standin")
        self.assertTrue(out.stdout.startswith(self.SAID % python), out.stdout)
        self.assertRegex(out.stdout, r"\ngpuguard: installed python3-torch in \d+ s\n$")
        self.assertEqual(out.stderr, "")
        # the size was asked before the install, which then ran once
        log = self.log()
        self.assertIn("--assume-no", log[0])
        self.assertEqual(len(self.installs()), 1, log)

    def test_an_install_apt_get_calls_failed_is_not_said_to_have_failed(self):
        # dpkg's error on some other package: apt-get exits 100 twice, but
        # torch imports afterwards, so the tests will run
        out = self.deps("install-test", rc=100)
        self.assertNotIn("could not install", out.stdout + out.stderr)
        self.assertRegex(out.stdout, r"\ngpuguard: python3-torch is installed \(\d+ s; apt-get "
                                     r"exited 100: E: Sub-process /usr/bin/dpkg returned an error "
                                     r"code \(1\)\); the tests with real PyTorch will run\n$")

    def test_a_failed_install_is_said_with_apt_gets_words(self):
        out = self.deps("install-test", rc=100, installs=False)
        self.assertEqual(out.stderr, "gpuguard: could not install python3-torch (apt-get exited "
                                     "100: E: Sub-process /usr/bin/dpkg returned an error code "
                                     "(1)); the tests with real PyTorch will skip\n")
        self.assertNotIn("installed", out.stdout)

    def test_stale_package_lists_are_updated_for_the_size(self):
        out = self.deps("install-test", stale=True)
        self.assertIn("181 packages (263 MB), 1,204 MB on disk", out.stdout)
        self.assertEqual([l.split()[0] for l in self.log()][:3], ["install", "update", "install"])

    def test_nothing_when_torch_imports(self):
        open(os.path.join(self.state, "torch"), "w").close()
        out = self.deps("install-test")
        self.assertEqual((out.stdout, out.stderr, self.log()), ("", "", []))

    def test_make_demo_installs_no_pytorch(self):
        out = self.deps("install")
        self.assertEqual((out.stdout, out.stderr, self.log()), ("", "", []))
        # what the make targets run (-n: nothing is run; not the make this
        # test may be running under)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
        demo = subprocess.run(["make", "-n", "--no-print-directory", "-C", ROOT, "demo"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertIn("deps.sh install ", demo.stdout)
        self.assertNotIn("install-test", demo.stdout)
        test = subprocess.run(["make", "-n", "--no-print-directory", "-C", ROOT, "test"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertIn("deps.sh install-test ", test.stdout)
