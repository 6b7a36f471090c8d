"""A CPython whose layout pyframes.c does not know (3.9 and older, 3.14+):
no frames, one error message handed out once, the state says failed, and
nothing crashes, from the main thread or a worker.

  python3 frames_unsupported.py build/tests/pyframes/libpyprobe.so

Written for Python 3.6 and later.
"""
import ctypes
import sys
import threading

LIB = ctypes.CDLL(sys.argv[1])
LIB.pyprobe_capture.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
LIB.pyprobe_status.restype = ctypes.c_char_p
LIB.pyprobe_take_error.restype = ctypes.c_char_p
GG_PY_FAILED = 4
failures = []


def capture():
    buf = ctypes.create_string_buffer(1 << 16)
    return LIB.pyprobe_capture(buf, len(buf), 64)


def worker():
    for _ in range(100):
        if capture() != 0:
            failures.append("frames from a worker")
            return


n = capture()
if n != 0:
    failures.append("capture gave %d frames" % n)
t = threading.Thread(target=worker)
t.start()
t.join()
first = LIB.pyprobe_take_error()
second = LIB.pyprobe_take_error()
status = LIB.pyprobe_status().decode()
version = "%d.%d.%d" % sys.version_info[:3]
if first is None or b"not supported" not in first or second is not None:
    failures.append("error said %r, then %r" % (first, second))
if "CPython %s" % version not in status or LIB.pyprobe_state() != GG_PY_FAILED:
    failures.append("status %r, state %d" % (status, LIB.pyprobe_state()))
print("unsupported: CPython %s: %s; %d failures" % (version, status, len(failures)))
for f in failures:
    print("  failed: %s" % f)
sys.exit(1 if failures else 0)
