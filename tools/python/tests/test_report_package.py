"""The shape of the gpuguard.journal and gpuguard.report packages (what
tools/bin/gpuguard-report runs): each imports on its own, journal never needs
report, no module is over 1,000 lines, and `import gpuguard` (what a
trainer does) loads neither."""

import ast
import glob
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)                      # tools/python
PKG = os.path.join(PYDIR, "gpuguard")
SUBPACKAGES = ("journal", "report")
MAX_LINES = 1000


def modules(sub):
    """(dotted name, path) of each module of gpuguard.<sub>."""
    out = []
    for path in sorted(glob.glob(os.path.join(PKG, sub, "*.py"))):
        name = os.path.splitext(os.path.basename(path))[0]
        dotted = "gpuguard." + sub + ("" if name == "__init__" else "." + name)
        out.append((dotted, path))
    return out


def run(code):
    """Runs code in a fresh interpreter that finds the source tree's
    package; its stdout."""
    env = dict(os.environ, PYTHONPATH=PYDIR)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    return out.stdout


def imports(path):
    """(level, module, names) of each import statement of a file."""
    out = []
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(0, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", tuple(a.name for a in node.names)))
    return out


class PackageShapeTest(unittest.TestCase):
    def test_both_subpackages_have_modules(self):
        for sub in SUBPACKAGES:
            names = [d for d, _ in modules(sub)]
            self.assertIn("gpuguard." + sub, names)
            self.assertGreater(len(names), 2, sub)

    def test_no_module_over_the_limit(self):
        for sub in SUBPACKAGES:
            for dotted, path in modules(sub):
                with open(path, encoding="utf-8") as f:
                    n = sum(1 for _ in f)
                self.assertLessEqual(n, MAX_LINES, "%s: %d lines" % (dotted, n))

    def test_journal_alone(self):
        out = run("import sys\n"
                  "import gpuguard.journal as j\n"
                  "assert all(hasattr(j, n) for n in j.__all__), j.__all__\n"
                  "print(sorted(m for m in sys.modules if m.startswith('gpuguard.report')))\n")
        self.assertEqual(out.strip(), "[]")

    def test_report_first(self):
        out = run("import sys\n"
                  "import gpuguard.report as r\n"
                  "assert all(hasattr(r, n) for n in r.__all__), r.__all__\n"
                  "import gpuguard.journal as j\n"
                  "assert r.Journal is j.Journal and r.figures is j.figures\n"
                  "print(r.VERSION == sys.modules['gpuguard'].__version__)\n")
        self.assertEqual(out.strip(), "True")

    def test_each_module_imports_first(self):
        """Every module of both packages imports into an interpreter that
        has loaded none of them (no import cycle, whatever the order)."""
        names = [d for sub in SUBPACKAGES for d, _ in modules(sub)
                 if not d.endswith("__main__")]
        out = run("import importlib, sys\n"
                  "for name in %r:\n"
                  "    for m in [m for m in sys.modules if m.startswith('gpuguard')]:\n"
                  "        del sys.modules[m]\n"
                  "    importlib.import_module(name)\n"
                  "print('ok')\n" % (names,))
        self.assertEqual(out.strip(), "ok")

    def test_journal_never_imports_report(self):
        for dotted, path in modules("journal"):
            for level, mod, names in imports(path):
                if level == 0:
                    self.assertFalse(mod.startswith("gpuguard"), (dotted, mod))
                else:
                    self.assertEqual(level, 1, (dotted, level, mod))

    def test_report_modules_skip_the_facade(self):
        """report's modules import from the module that defines a name,
        never from the gpuguard.report facade (which imports them all)."""
        for dotted, path in modules("report"):
            if dotted == "gpuguard.report":
                continue
            for level, mod, names in imports(path):
                if level == 0:
                    self.assertFalse(mod.startswith("gpuguard"), (dotted, mod))
                elif level == 1:
                    self.assertTrue(mod, (dotted, names))
                else:
                    self.assertEqual(level, 2, (dotted, level))
                    if not mod:
                        self.assertEqual(names, ("__version__",), dotted)
                    else:
                        self.assertTrue(mod.startswith("journal."), (dotted, mod))

    def test_report_and_journal_never_load_the_helper(self):
        """The package root is thin: the report (what gpuguard-report runs)
        and the journal reader load neither gpuguard.trainer nor
        gpuguard._native; `import gpuguard` alone loads no helper either,
        and gpuguard.Guard is the helper's."""
        out = run("import sys\n"
                  "import gpuguard.report, gpuguard.journal\n"
                  "print(sorted(m for m in sys.modules if m in\n"
                  "             ('gpuguard.trainer', 'gpuguard._native', 'gpuguard._split')))\n")
        self.assertEqual(out.strip(), "[]")
        out = run("import sys, gpuguard\n"
                  "print('gpuguard.trainer' in sys.modules)\n"
                  "from gpuguard import Guard, UsageError\n"
                  "import gpuguard.trainer as t\n"
                  "print(Guard is t.Guard, gpuguard.MicroBatches is t.MicroBatches,\n"
                  "      UsageError is t.UsageError, t.__version__ == gpuguard.__version__)\n")
        self.assertEqual(out.split(), ["False", "True", "True", "True", "True"])

    def test_helper_imports_neither(self):
        for level, mod, names in imports(os.path.join(PKG, "trainer.py")) + \
                imports(os.path.join(PKG, "__init__.py")):
            where = mod.split(".") + list(names)
            for sub in SUBPACKAGES:
                self.assertNotIn(sub, where, (level, mod, names))
        out = run("import sys, gpuguard\n"
                  "print(sorted(m for m in sys.modules\n"
                  "             if m.startswith(('gpuguard.journal', 'gpuguard.report'))))\n")
        self.assertEqual(out.strip(), "[]")


if __name__ == "__main__":
    unittest.main()
