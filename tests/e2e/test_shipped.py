"""What the shipped library holds: libgpuguard.so carries no test-only entry
point (a module's reset, a probe of its state: declared under
`#ifdef GG_TESTING` in the shim's headers, built only into the unit tests'
core archive), and exports the C API of include/gpuguard.h, whatever the
unit tests link."""
import os
import re
import subprocess
import unittest

from gg import BUILD, ROOT, SHIM


def testing_functions():
    """{function: header} declared under #ifdef GG_TESTING in shim/."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "shim")):
        for name in files:
            if not name.endswith(".h"):
                continue
            path = os.path.join(dirpath, name)
            with open(path) as f:
                text = f.read()
            for block in re.findall(r"^#ifdef GG_TESTING\n(.*?)^#endif", text, re.M | re.S):
                block = re.sub(r"/\*.*?\*/", " ", block, flags=re.S)
                for fn in re.findall(r"\b(gg_\w+)\s*\(", block):
                    out[fn] = os.path.relpath(path, ROOT)
    return out


def symbols(path, *flags):
    out = subprocess.run(["nm", *flags, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


class Shipped(unittest.TestCase):
    def test_no_test_only_entry_point_in_the_library(self):
        fns = testing_functions()
        self.assertGreater(len(fns), 10, "no test-only function found under #ifdef GG_TESTING")
        shipped = symbols(SHIM)
        inside = sorted(f"{fn} ({h})" for fn, h in fns.items() if fn in shipped)
        self.assertEqual(inside, [], "test-only functions in " + SHIM)
        # ... and the unit tests' archive has every one of them
        core = symbols(os.path.join(BUILD, "libggcore.a"), "--defined-only")
        self.assertEqual(sorted(fn for fn in fns if fn not in core), [])

    def test_the_library_exports_the_c_api(self):
        with open(os.path.join(ROOT, "include", "gpuguard.h")) as f:
            header = f.read()
        # the shim's own declarations (a trainer gets inline wrappers instead)
        shim = header.split("#ifdef GPUGUARD_SHIM", 1)[1].split("#else", 1)[0]
        api = set(re.findall(r"^\w[\w *]*?\b(gpuguard_\w+)\(", shim, re.M))
        self.assertGreater(len(api), 10)
        exported = {s for s in symbols(SHIM, "-D", "--defined-only") if s.startswith("gpuguard_")}
        self.assertEqual(exported, api)


if __name__ == "__main__":
    unittest.main()
