"""Checks shim/probe/pyframes.c against what this script knows of itself.

  python3 frames_check.py build/tests/pyframes/libpyprobe.so

Run by tests/e2e/test_pyframes.py under every CPython 3.10-3.13 present.
Each check captures this thread's frames through libpyprobe.so (ctypes
releases the GIL for the call) and compares file, line and function with
sys._getframe() taken on the same line. Prints one line per failure and a
last line "pyframes: ..."; exit status 0 when everything matched.
GG_PYFRAMES_SOAK=N multiplies the churn (N * 1800 captures).
"""
import asyncio
import ctypes
import functools
import gc
import os
import random
import sys
import threading

LIB = ctypes.CDLL(sys.argv[1])
LIB.pyprobe_capture.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
LIB.pyprobe_keep.argtypes = [ctypes.c_int]
LIB.pyprobe_resolve_kept.argtypes = [ctypes.c_char_p, ctypes.c_int]
LIB.pyprobe_line.argtypes = [ctypes.c_size_t, ctypes.c_int]
LIB.pyprobe_status.restype = ctypes.c_char_p
LIB.pyprobe_take_error.restype = ctypes.c_char_p
BUF = 1 << 18
FAILURES = []


def funcname(code):
    return getattr(code, "co_qualname", code.co_name)


def stack_of(frame):
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno or 0, funcname(frame.f_code)))
        frame = frame.f_back
    return out


def parse(buf, n):
    if n < 0:
        return "error %d" % n
    lines = buf.raw.split(b"\0", 1)[0].decode("utf-8").splitlines()
    frames = []
    for line in lines:
        file, lineno, func = line.split("\x1f")
        frames.append((file, int(lineno), func))
    assert len(frames) == n, (n, frames)
    return frames


def capture(depth=128):
    """(what pyframes saw, what sys._getframe says), both innermost first."""
    buf = ctypes.create_string_buffer(BUF)
    n, want = LIB.pyprobe_capture(buf, BUF, depth), stack_of(sys._getframe())
    return parse(buf, n), want[:depth]


def expect(name, pair):
    got, want = pair
    if got != want:
        FAILURES.append(name)
        print("FAIL %s (%s):\n  got  %s\n  want %s" % (name, threading.current_thread().name,
                                                      got, want))
    return got == want


# ---- the shapes a stack takes ----------------------------------------------

def nested_a():
    return nested_b()


def nested_b():
    return nested_c()


def nested_c():
    return capture()


class Widget:
    def meth(self):
        return capture()

    @staticmethod
    def static():
        return capture()

    @classmethod
    def klass(cls):
        return capture()

    @property
    def prop(self):
        return capture()

    def __init__(self, sink=None):
        if sink is not None:
            sink.append(capture())


def closure():
    def inner():
        return capture()
    return inner()


def lambdas():
    return (lambda: capture())()


def generator():
    def gen():
        yield capture()
    return next(gen())


async def coroutine():
    await asyncio.sleep(0)
    return capture()


def comprehension():
    return [capture() for _ in range(1)][0]


def genexpr():
    return next(capture() for _ in range(1))


def through_c():
    # sorted() is C calling back into Python: a new eval loop, an entry frame
    got = []
    sorted([2, 1], key=lambda x: got.append(capture()) or x)
    return got[0]


def through_partial():
    return functools.partial(capture)()


def in_except():
    try:
        raise ValueError("x")
    except ValueError:
        return capture()


def recursion(n, depth):
    if n == 0:
        return capture(depth)
    return recursion(n - 1, depth)


def unicode_names():
    src = "def f\u00fcnc_\u540d\u524d():\n    return capture()\n"
    ns = {"capture": capture}
    exec(compile(src, "/tmp/\u00fcn\u00efc\u00f8d\u00e9/\u6587\u4ef6\U0001f600.py", "exec"), ns)
    return ns["f\u00fcnc_\u540d\u524d"]()


def scenarios():
    """Every shape, named."""
    yield "nested", nested_a
    yield "method", Widget().meth
    yield "staticmethod", Widget.static
    yield "classmethod", Widget.klass
    yield "property", lambda: Widget().prop
    yield "closure", closure
    yield "lambda", lambdas
    yield "generator", generator
    yield "coroutine", lambda: asyncio.run(coroutine())
    yield "comprehension", comprehension
    yield "genexpr", genexpr
    yield "through C", through_c
    yield "partial", through_partial
    yield "except", in_except
    yield "unicode names", unicode_names


def run_scenarios():
    for name, fn in scenarios():
        expect(name, fn())
    sink = []
    for _ in range(100):                  # specialised: 3.12+ push an __init__ shim frame
        Widget(sink)
    for i, pair in enumerate(sink):
        if not expect("__init__ #%d" % i, pair):
            break
    # deeper than the cap: the innermost frames, cut at the cap
    for depth in (1, 16, 128):
        got, want = recursion(200, depth)
        expect("recursion cap %d" % depth, (got, want))
        if len(got) != depth:
            FAILURES.append("recursion cap %d: %d frames" % (depth, len(got)))
    got, want = recursion(300, 500)       # max above GG_PY_MAX_DEPTH: 128
    expect("recursion cap 500", (got, want[:128]))


def in_thread(fn, *args):
    err = []

    def body():
        try:
            fn(*args)
        except BaseException as e:  # reported, never swallowed
            err.append(e)
    t = threading.Thread(target=body, name="worker")
    t.start()
    t.join()
    if err:
        raise err[0]


# ---- churn: many captures while other threads run Python -------------------

def churn(captures_per_thread=600, busy_threads=3, capturing_threads=2):
    stop = threading.Event()
    counts = {"captures": 0, "mismatches": 0}
    lock = threading.Lock()

    def busy(seed):
        rnd = random.Random(seed)
        while not stop.is_set():
            deep_work(rnd, rnd.randint(0, 60))

    def deep_work(rnd, n):
        if n == 0:
            x = [str(i) for i in range(rnd.randint(1, 50))]
            return sum(1 for _ in (y for y in x))
        kind = rnd.random()
        if kind < 0.3:
            return next(gen_level(rnd, n))
        if kind < 0.4:
            try:
                raise KeyError(n)
            except KeyError:
                return deep_work(rnd, n - 1)
        return deep_work(rnd, n - 1)

    def gen_level(rnd, n):
        yield deep_work(rnd, n - 1)

    def capturing(seed):
        rnd = random.Random(seed)
        for _ in range(captures_per_thread):
            got, want = capture_at(rnd, rnd.randint(0, 40))
            with lock:
                counts["captures"] += 1
                if got != want:
                    counts["mismatches"] += 1
                    if counts["mismatches"] <= 3:
                        print("FAIL churn:\n  got  %s\n  want %s" % (got[:4], want[:4]))

    def capture_at(rnd, n):
        if n == 0:
            return capture(rnd.choice((8, 32, 128)))
        if rnd.random() < 0.3:
            return next(capture_gen(rnd, n))
        return capture_at(rnd, n - 1)

    def capture_gen(rnd, n):
        yield capture_at(rnd, n - 1)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)            # switch often: more interleavings, less waiting
    busy_t = [threading.Thread(target=busy, args=(i,), name="busy%d" % i)
              for i in range(busy_threads)]
    cap_t = [threading.Thread(target=capturing, args=(100 + i,), name="cap%d" % i)
             for i in range(capturing_threads)]
    for t in busy_t + cap_t:
        t.start()
    capturing(7)                           # and the main thread
    for t in cap_t:
        t.join()
    stop.set()
    for t in busy_t:
        t.join()
    sys.setswitchinterval(old_interval)
    if counts["mismatches"]:
        FAILURES.append("churn: %d mismatches" % counts["mismatches"])
    return counts


# ---- line tables, every instruction of many code objects ------------------

def all_code(limit):
    import dis
    import inspect
    import json.decoder
    import typing
    seen, todo, out = set(), [], []
    for mod in (sys.modules[__name__], inspect, dis, threading, json.decoder, typing,
                asyncio.base_events, random):
        for obj in vars(mod).values():
            fn = getattr(obj, "__func__", obj)
            if hasattr(fn, "__code__"):
                todo.append(fn.__code__)
            elif isinstance(obj, type):
                todo.extend(getattr(v, "__code__") for v in vars(obj).values()
                            if hasattr(v, "__code__"))
    while todo and len(out) < limit:
        co = todo.pop()
        if id(co) in seen:
            continue
        seen.add(id(co))
        out.append(co)
        todo.extend(c for c in co.co_consts if hasattr(c, "co_lines"))
    return out


def line_tables(limit=2500):
    offsets = mismatches = 0
    for co in all_code(limit):
        want = {}
        for start, end, line in co.co_lines():
            for off in range(start, end, 2):
                want[off] = line or 0
        for off in range(0, len(co.co_code), 2):
            got = LIB.pyprobe_line(id(co), off)
            offsets += 1
            if got != want.get(off, 0):
                mismatches += 1
                if mismatches <= 3:
                    print("FAIL line table: %s offset %d: got %d, want %d"
                          % (co, off, got, want.get(off, 0)))
        if LIB.pyprobe_line(id(co), -2) != co.co_firstlineno:
            mismatches += 1
    if mismatches:
        FAILURES.append("line tables: %d mismatches" % mismatches)
    return offsets


# ---- late resolution: names read after the code may be gone ----------------

def late_resolution():
    ns = {"keep": LIB.pyprobe_keep}
    exec(compile("def doomed():\n    return keep(8)\n", "/tmp/doomed.py", "exec"), ns)
    line = sys._getframe().f_lineno + 1
    n = ns["doomed"]()
    if n < 2:
        FAILURES.append("late: %d frames kept" % n)
        return
    buf = ctypes.create_string_buffer(BUF)
    got = parse(buf, LIB.pyprobe_resolve_kept(buf, BUF))
    want = [("/tmp/doomed.py", 2, "doomed"), (__file__, line, funcname(sys._getframe().f_code))]
    expect("late, alive", (got[:2], want))
    del ns
    gc.collect()
    keep = []                              # new code objects where the old one was
    for i in range(2000):
        src = "def other_%d():\n    return %d\n" % (i, i)
        keep.append(compile(src, "/tmp/other.py", "exec"))
    k = LIB.pyprobe_resolve_kept(buf, BUF)
    first = buf.raw.split(b"\n", 1)[0].decode()
    # gone: unnamed (-1, "?"); still there: its own name; never another's
    if first.split("\x1f")[2] not in ("doomed", "?") or k not in (n, -1):
        FAILURES.append("late, freed: %r (%d)" % (first, k))
        print("FAIL late, freed: %r" % first)


def main():
    version = "%d.%d.%d" % sys.version_info[:3]
    status = LIB.pyprobe_status().decode()
    if not status.startswith("CPython %s" % version) or "frames on" not in status:
        FAILURES.append("status: %s" % status)
    run_scenarios()
    in_thread(run_scenarios)
    counts = churn(600 * int(os.environ.get("GG_PYFRAMES_SOAK", "1")))
    offsets = line_tables()
    late_resolution()
    error = LIB.pyprobe_take_error()
    if error is not None:
        FAILURES.append("error said: %s" % error.decode())
    LIB.pyprobe_disable()                  # GPUGUARD_PYTHON=0: nothing from now on
    got, _ = capture()
    if got != [] or "turned off" not in LIB.pyprobe_status().decode():
        FAILURES.append("disable: %s" % (got,))
    print("pyframes: CPython %s (%s): %d failures; churn %d captures, %d mismatches; "
          "%d line-table offsets" % (version, os.path.realpath(sys.executable), len(FAILURES),
                                      counts["captures"], counts["mismatches"], offsets))
    for f in FAILURES:
        print("  failed: %s" % f)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
