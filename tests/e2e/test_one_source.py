"""One fact, one place: what two languages or two files both need is written
once and derived, or held to its one source here.

  - the version: include/gpuguard.h's GPUGUARD_VERSION; the Python package's
    __version__ is the same (gpuguard.pc takes it from the header at
    `make install`: test_capi_client);
  - the C API's structures: the ctypes mirror in gpuguard/_native.py has
    every structure of include/gpuguard.h, every field in its order with
    its type, at the offset and of the size a C compiler gives it.
"""
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import unittest

from gg import PYHELPER, ROOT

HEADER = os.path.join(ROOT, "include", "gpuguard.h")

sys.path.insert(0, PYHELPER)
import gpuguard  # noqa: E402
from gpuguard import _native  # noqa: E402

# The mirror of each structure of the header.
MIRRORS = {
    "gpuguard_stats": _native.GpuguardStats,
    "gpuguard_advice": _native.GpuguardAdvice,
    "gpuguard_policy": _native.GpuguardPolicy,
    "gpuguard_prediction": _native.GpuguardPrediction,
    "gpuguard_pyframe": _native.PyFrame,
    "gpuguard_torch_request": _native.TorchRequest,
    "gpuguard_torch_tensor": _native.TorchTensor,
    "gpuguard_torch_view": _native.TorchView,
}

# C types as the header spells them -> ctypes (pointers to a structure by its
# mirror).
SCALARS = {
    "int": ctypes.c_int,
    "unsigned": ctypes.c_uint,
    "unsigned int": ctypes.c_uint,
    "unsigned long long": ctypes.c_ulonglong,
    "const char *": ctypes.c_char_p,
    "char *": ctypes.c_char_p,
}


def header_text():
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_structs():
    """{struct name: [(field, C type, array length or None)]}, in order."""
    structs = {}
    for name, body in re.findall(r"\bstruct\s+(gpuguard_\w+)\s*\{(.*?)\}\s*;", header_text(),
                                 flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            # "unsigned long long allocs, frees", "const struct x *frames", "char name[256]"
            m = re.match(r"((?:const\s+)?(?:struct\s+\w+|unsigned long long|unsigned int|"
                         r"unsigned|int|char))\s*(.*)$", decl)
            if not m:
                raise AssertionError(f"struct {name}: cannot read the field {decl!r}")
            base, rest = m.group(1), m.group(2)
            for d in rest.split(","):
                d = d.strip()
                dm = re.match(r"(\**)\s*(\w+)\s*(?:\[(\d+)\])?$", d)
                if not dm:
                    raise AssertionError(f"struct {name}: cannot read {d!r} of {decl!r}")
                ctype = base + (" " + dm.group(1) if dm.group(1) else "")
                fields.append((dm.group(2), ctype, int(dm.group(3)) if dm.group(3) else None))
        structs[name] = fields
    return structs


def expected_ctype(ctype, length):
    if length is not None:
        assert ctype == "char", ctype
        return ctypes.c_char * length
    m = re.match(r"(?:const )?struct (\w+) \*$", ctype)
    if m:
        return ctypes.POINTER(MIRRORS[m.group(1)])
    return SCALARS[ctype]


class Version(unittest.TestCase):
    def test_the_python_package_has_the_headers_version(self):
        with open(HEADER) as f:
            m = re.search(r'^#define GPUGUARD_VERSION "([^"]+)"$', f.read(), re.M)
        self.assertIsNotNone(m, "include/gpuguard.h has no GPUGUARD_VERSION")
        self.assertEqual(gpuguard.__version__, m.group(1))


class NativeMirror(unittest.TestCase):
    def test_every_structure_is_mirrored_field_by_field(self):
        structs = header_structs()
        self.assertEqual(sorted(structs), sorted(MIRRORS))
        for name, fields in structs.items():
            mirror = MIRRORS[name]
            self.assertEqual([f for f, _, _ in fields], [f for f, _ in mirror._fields_],
                             f"struct {name}: the fields of {mirror.__name__}")
            for (field, ctype, length), (_, pytype) in zip(fields, mirror._fields_):
                want = expected_ctype(ctype, length)
                if issubclass(want, ctypes.Array):
                    same = (issubclass(pytype, ctypes.Array) and pytype._type_ is want._type_
                            and pytype._length_ == want._length_)
                elif hasattr(want, "_type_") and issubclass(want, ctypes._Pointer):
                    same = issubclass(pytype, ctypes._Pointer) and pytype._type_ is want._type_
                else:
                    same = pytype is want
                self.assertTrue(same, f"struct {name}.{field}: {ctype}"
                                      f"{'[%d]' % length if length else ''} is not "
                                      f"{pytype.__name__} in {mirror.__name__}")

    def test_offsets_and_sizes_are_the_compilers(self):
        lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "gpuguard.h"',
                 "int main(void) {"]
        for name, mirror in MIRRORS.items():
            lines.append(f'    printf("{name} - %zu\\n", sizeof(struct {name}));')
            for field, _ in mirror._fields_:
                lines.append(f'    printf("{name} {field} %zu\\n", '
                             f'offsetof(struct {name}, {field}));')
        lines += ["    return 0;", "}"]
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I",
                                 os.path.join(ROOT, "include"), src, "-o", exe],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.assertEqual(cc.returncode, 0, cc.stdout)
            out = subprocess.run([exe], stdout=subprocess.PIPE, text=True, check=True).stdout
        c = {}
        for line in out.splitlines():
            name, field, n = line.split()
            c[name, field] = int(n)
        for name, mirror in MIRRORS.items():
            self.assertEqual(ctypes.sizeof(mirror), c[name, "-"], f"sizeof(struct {name})")
            for field, _ in mirror._fields_:
                self.assertEqual(getattr(mirror, field).offset, c[name, field],
                                 f"offsetof(struct {name}, {field})")


if __name__ == "__main__":
    unittest.main()
