"""The layered shim: the bugs its layers gave a home,
each reproduced end to end under a real LD_PRELOAD, and the layout's own
checks (layers without circles, one row per hook and per setting)."""
import os
import re
import subprocess
import sys
import time

from gg import (BUILD, FAKE, PROGS, ROOT, SCRIPT, SHIM, GiB, MiB, Case, base_env)

HOST = os.path.join(PROGS, "host")
TWO_GPUS = "NVIDIA GeForce RTX 3090,24GiB,8.6;NVIDIA GeForce RTX 3090,24GiB,8.6"
ENFORCE = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 10%
near_miss = 5%
mode = enforce
"""


class Runtimes(Case):
    """Bug 1: real functions cached with no reference on their library, and
    every caller forwarded to the first runtime found."""

    def test_a_reloaded_runtime_is_still_reached(self):
        # The plugin (and its runtime) is dlclosed and its address range
        # taken: a shim that did not pin the runtime would call into it.
        run = self.run_prog([HOST, "reload"], GG_FAKE_DIR=FAKE)
        self.assertEqual(run.rc, 0, run.err + run.out)
        self.assertIn("first 0 0", run.out)
        self.assertIn("again 0 0", run.out)
        s = run.summary()
        self.assertEqual((s["allocs"], s["frees"]), (2, 2))

    def test_each_extension_reaches_its_own_runtime(self):
        run = self.run_prog([HOST, "apart"], devices=TWO_GPUS, GG_FAKE_DIR=FAKE)
        self.assertEqual(run.rc, 0, run.err + run.out)
        self.assertIn("versions 13000 12080", run.out)
        # the CUDA 12 extension's failure is its own runtime's last error
        self.assertIn("last12 2 last13 0", run.out)
        # and its 2 GiB went to the device its runtime had set: GPU 1
        summary = run.one("summary")["devices"]
        self.assertEqual(summary[0]["peak"], GiB)
        self.assertEqual(summary[1]["peak"], 2 * GiB)

    def test_the_shim_exports_a_copy_per_runtime_version(self):
        out = subprocess.run(["objdump", "-T", SHIM], stdout=subprocess.PIPE, text=True).stdout
        versions = set(re.findall(r"\(?(libcudart\.so\.[\d.]+|GPUGUARD_CUDART)\)?\s+cudaMalloc$",
                                  out, re.M))
        self.assertEqual(versions, {"GPUGUARD_CUDART", "libcudart.so.11.0", "libcudart.so.12",
                                    "libcudart.so.13", "libcudart.so.14", "libcudart.so.15"})


class Readings(Case):
    def policy(self):
        return self.write_policy("enforce.ini", ENFORCE)

    def test_first_decision_reads_the_device(self):
        """Bug 2: with 20 GiB held elsewhere, the first 2 GiB crossed a
        21.6 GiB line because nothing had read the device yet."""
        state = os.path.join(self.tmp, "state")
        env = base_env(FAKECUDA_STATE=state, GPUGUARD_POLICY=self.policy())
        holder = subprocess.Popen([SCRIPT, "alloc:20G", "print:held", "sleep:5000", "freeall"],
                                  env=env, stdout=subprocess.PIPE, text=True, cwd=self.tmp)
        self.addCleanup(holder.kill)
        self.assertEqual(holder.stdout.readline().strip(), "held")
        run = self.script("alloc:2G", "lasterror", env=env)
        self.assertIn("alloc 2G: error 2", run.out)
        refused = run.one("refused")
        self.assertEqual(refused["used"], 20 * GiB)
        holder.kill()

    def test_no_reading_per_allocation_in_the_band(self):
        """Bug 3: 10 000 allocations in the near-miss band cost 10 001
        device readings (an ioctl each on a real GPU)."""
        calls = os.path.join(self.tmp, "calls")
        run = self.script("alloc:20.6G", "threads:1:10000:1M", "freeall",
                          policy=self.policy(), FAKECUDA_CALLS=calls)
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("threads: 1 x 10000 ok", run.out)
        self.assertGreaterEqual(run.summary()["near_misses"], 10000)
        with open(calls) as f:
            readings = int(f.read().split()[-1])
        self.assertLessEqual(readings, 5)

    def test_a_refusal_sets_the_last_error(self):
        """Bug 4: a refusal left cudaGetLastError() at success."""
        run = self.script("alloc:23G", "lasterror", "lasterror", policy=self.policy())
        self.assertIn("alloc 23G: error 2", run.out)
        self.assertEqual(run.out.count("lasterror: 2"), 1)  # read once, then cleared
        self.assertIn("lasterror: 0", run.out)
        self.assertEqual(len(run.of("refused")), 1)
        self.assertEqual(len(run.of("oom")), 0)  # the shim's own call is not an OOM

    def test_failed_device_query_observes_that_device(self):
        """Bug 8: a failed total-memory query gave limit 0: every allocation
        refused."""
        run = self.script("alloc:1G", "alloc:1G", "freeall", policy=self.policy(),
                          FAKECUDA_FAIL_TOTALMEM="1")
        self.assertEqual(run.rc, 0, run.err)
        self.assertNotIn("error", run.out)
        self.assertIn("cuDeviceTotalMem failed", run.err)
        self.assertIn("observing it only", run.err)
        s = run.summary()
        self.assertEqual((s["allocs"], s["refusals"], s["near_misses"]), (2, 0, 0))
        self.assertEqual(run.of("sample"), [])


class Off(Case):
    """Bug 5: off only when spelled GPUGUARD_MODE=off."""

    def assert_invisible(self, run):
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(run.files, [])
        self.assertEqual(run.err, "")
        self.assertIn("dlsym cuMemAlloc_v2: libcuda.so.1", run.out)

    def test_any_spelling(self):
        for spelling in ("OFF", "Off", " off "):
            with self.subTest(spelling=spelling):
                self.assert_invisible(self.script("alloc:1G", "dlsym:cuMemAlloc_v2", "freeall",
                                                  GPUGUARD_MODE=spelling))

    def test_from_a_policy(self):
        path = self.write_policy("off.ini", ENFORCE.replace("mode = enforce", "mode = off"))
        self.assert_invisible(self.script("alloc:1G", "dlsym:cuMemAlloc_v2", "freeall",
                                          policy=path))

    def test_on_hands_out_hooks(self):
        run = self.script("alloc:1G", "dlsym:cuMemAlloc_v2", "freeall")
        self.assertIn("dlsym cuMemAlloc_v2: libgpuguard.so", run.out)


class Names(Case):
    def test_journal_is_named_after_the_process_not_the_thread(self):
        """Bug 6: gpuguard.pt_autograd_0.<pid>.jsonl."""
        code = (
            "import ctypes, os, threading\n"
            f"tl = ctypes.CDLL(os.path.join({FAKE!r}, 'libtorchlike.so'))\n"
            "libc = ctypes.CDLL(None)\n"
            "def work():\n"
            "    libc.prctl(15, b'pt_autograd_0', 0, 0, 0)\n"
            "    p = ctypes.c_void_p()\n"
            "    assert tl.tl_malloc(ctypes.c_size_t(1 << 20), ctypes.byref(p)) == 0\n"
            "t = threading.Thread(target=work); t.start(); t.join()\n")
        run = self.python(code)
        self.assertEqual(run.rc, 0, run.err)
        (path,) = run.files
        name = os.path.basename(path)
        self.assertNotIn("pt_autograd", name)
        with open(f"/proc/{os.getpid()}/comm") as f:
            pass
        self.assertRegex(name, r"^gpuguard\.python[\w.]*\.\d+\.jsonl$")
        self.assertEqual(run.one("start")["comm"], name.split(".")[1] if name.count(".") == 3
                         else run.one("start")["comm"])


class Vmm(Case):
    def test_released_while_mapped_is_still_counted(self):
        """Bug 7: cuMemRelease of a mapped handle took it out of the ledger,
        though the memory lives until cuMemUnmap."""
        run = self.script("api:vmmrel:1G", "print:mapped")
        s = run.summary()
        self.assertEqual((s["live_bytes"], s["live_allocs"]), (GiB, 1))
        run = self.script("api:vmmrel:1G", "free:0")
        s = run.summary()
        self.assertEqual((s["peak"], s["live_bytes"], s["live_allocs"]), (GiB, 0, 0))
        self.assertEqual((s["allocs"], s["frees"]), (1, 1))

    def test_unmap_then_release(self):
        run = self.script("api:vmm:1G", "api:vmm:512M", "free:0", "free:1")
        s = run.summary()
        self.assertEqual((s["peak"], s["live_bytes"]), (GiB + 512 * MiB, 0))


class Descriptors(Case):
    def test_journal_descriptor_taken_over(self):
        """Bug 9: a program that closes every descriptor and opens its own
        file got the journal's lines in it."""
        own = os.path.join(self.tmp, "own.txt")
        run = self.script("alloc:1G", "closefds", f"openfile:{own}", "alloc:19.5G", "freeall",
                          policy=self.write_policy("e.ini", ENFORCE))
        self.assertEqual(run.rc, 0, run.err)
        with open(own) as f:
            self.assertEqual(f.read(), "")
        self.assertEqual(len(run.of("near_miss")), 1)
        self.assertEqual(len(run.of("summary")), 1)

    def test_advice_signal_never_waits_on_its_own_thread(self):
        """Bug 9: the advice signal could land on the thread holding the
        advice lock, whose handler then waited for itself forever."""
        run = self.api("advice-storm", "300", "4G", timeout=60,
                       policy=self.write_policy("e.ini", ENFORCE))
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("storm: 300 refused", run.out)


class Layout(Case):
    LAYERS_PY = os.path.join(ROOT, "tools", "build-aux", "layers.py")

    def layers(self, layers_file, *objs):
        return subprocess.run([sys.executable, self.LAYERS_PY, layers_file, *objs],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def test_no_circle_and_layers_hold(self):
        """The shim's modules keep to their layers, by includes and by the
        symbols their objects call, and form no circle."""
        shim = os.path.join(ROOT, "shim")
        objs = [os.path.join(BUILD, "shim", layer, f[:-2] + ".o")
                for layer in sorted(os.listdir(shim)) if os.path.isdir(os.path.join(shim, layer))
                for f in sorted(os.listdir(os.path.join(shim, layer))) if f.endswith(".c")]
        self.assertGreater(len(objs), 40)
        out = self.layers(os.path.join(shim, "LAYERS"), *objs)
        self.assertEqual(out.returncode, 0, out.stdout)

    def test_a_folder_per_layer(self):
        """shim/ is a folder per layer of shim/LAYERS, in its order, and
        every module's files are in one; nothing else but LAYERS and the
        export map lies at the top."""
        shim = os.path.join(ROOT, "shim")
        with open(os.path.join(shim, "LAYERS")) as f:
            rows = [l.split("#", 1)[0].split() for l in f]
        rows = [r for r in rows if r]
        self.assertEqual([int(r[0]) for r in rows], list(range(len(rows))))
        self.assertEqual([r[1] for r in rows],
                         ["prim", "base", "config", "probe", "core", "life", "intercept"])
        entries = sorted(os.listdir(shim))
        self.assertEqual(sorted(e for e in entries if os.path.isdir(os.path.join(shim, e))),
                         sorted(r[1] for r in rows))
        self.assertEqual(sorted(e for e in entries if not os.path.isdir(os.path.join(shim, e))),
                         ["LAYERS", "gpuguard.map"])

    def test_checker_finds_an_upward_include_and_a_circle(self):
        """The layer check fails on an include upward, a circle, a folder
        that is no layer and a module outside any folder."""
        shim = os.path.join(self.tmp, "shim")
        for d in ("low", "high", "other"):
            os.makedirs(os.path.join(shim, d))
        with open(os.path.join(shim, "LAYERS"), "w") as f:
            f.write("0 low\n1 high\n")
        files = {"low/a.c": '#include "b.h"\n', "low/a.h": "", "high/b.c": '#include "c.h"\n',
                 "high/b.h": "", "high/c.c": '#include "b.h"\n', "high/c.h": "",
                 "other/d.c": "", "e.c": ""}
        for name, text in files.items():
            with open(os.path.join(shim, name), "w") as f:
                f.write(text)
        out = self.layers(os.path.join(shim, "LAYERS"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("layer 0 module a includes b.h of layer 1", out.stdout)
        self.assertIn("a circle among the shim's modules: b -> c -> b", out.stdout)
        self.assertIn("shim/other/: a folder that shim/LAYERS does not name", out.stdout)
        self.assertIn("shim/e.c: in no layer's folder", out.stdout)

    def test_hooks_return_in_sight(self):
        """No statement macro in the hook layer: every return of a hook is
        written in its body (hook_body.h's steps are functions)."""
        intercept = os.path.join(ROOT, "shim", "intercept")
        for name in sorted(os.listdir(intercept)):
            with open(os.path.join(intercept, name)) as f:
                text = f.read()
            macros = re.findall(r"^#define\s+(\w+)(\([^)]*\))?((?:.*\\\n)*.*)$", text, re.M)
            for macro, _params, body in macros:
                self.assertNotRegex(body, r"\bdo\s*\{", f"{name}: {macro} is a statement")
                if re.search(r"\breturn\b", body):  # only in a function it defines
                    self.assertRegex(body.split("return")[0], r"\{", f"{name}: {macro} returns")
                self.assertFalse(macro.startswith("GG_HOOK_") and macro != "GG_HOOK_BODY_H",
                                 f"{name}: {macro}")

    def test_life_lists_no_module_by_hand(self):
        """A forked child's resets come from shim/life/modules.def, in its
        order: life.c calls no module's after-fork itself, and every
        after-fork a module declares has its row."""
        with open(os.path.join(ROOT, "shim", "life", "life.c")) as f:
            life = f.read()
        self.assertNotRegex(life, r"\bgg_\w+_after_fork\s*\(\s*\)\s*;")
        self.assertIn('#include "modules.def"', life)
        with open(os.path.join(ROOT, "shim", "life", "modules.def")) as f:
            rows = re.findall(r"^MODULE\((\w+),\s*(\w+)\)", f.read(), re.M)
        declared, code = set(), ""
        for layer in os.listdir(os.path.join(ROOT, "shim")):
            folder = os.path.join(ROOT, "shim", layer)
            if os.path.isdir(folder):
                for name in os.listdir(folder):
                    with open(os.path.join(folder, name)) as f:
                        text = f.read()
                    if name.endswith(".h"):
                        declared |= set(re.findall(r"\bvoid (gg_\w+_after_fork)\(void\);", text))
                    elif name.endswith(".c"):
                        code += text
        self.assertGreater(len(declared), 10)
        in_table = {fn for _m, fn in rows}
        self.assertLessEqual(in_table - {"gg_journal_drop"}, declared)
        for fn in sorted(declared - in_table):  # a module's own part of another's reset
            self.assertRegex(code, r"\n\s+%s\(\);" % fn, f"{fn} is never called")
        self.assertEqual(rows[-1], ("journal", "gg_journal_drop"))

    def test_the_fakes_export_every_hook(self):
        rows = []
        with open(os.path.join(ROOT, "shim", "intercept", "hooks.def")) as f:
            for line in f:
                m = re.match(r"HOOK\((\w+),\s*(RT|DRV),\s*(\w+),\s*[\w-]+,\s*\d+,\s*\d+,\s*(\d)", line)
                if m:
                    rows.append((m.group(2), m.group(3), m.group(4) == "1"))
        self.assertGreater(len(rows), 20)

        def exports(lib):
            out = subprocess.run(["nm", "-D", "--defined-only", lib], stdout=subprocess.PIPE,
                                 text=True).stdout
            return {line.split()[-1].split("@")[0] for line in out.splitlines()}
        rt = exports(os.path.join(FAKE, "libcudart.so.13"))
        drv = exports(os.path.join(FAKE, "libcuda.so.1"))
        for family, name, ptsz in rows:
            self.assertIn(name, rt if family == "RT" else drv)
            if ptsz:
                self.assertIn(name + "_ptsz", drv)
