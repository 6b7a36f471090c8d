# Run by tests/pyframes/embed inside an interpreter it loaded RTLD_LOCAL:
# sys.gg_probe() is pyframes.c naming this thread's frames. Builtins and
# pure-Python modules only (extension modules cannot link against a local
# libpython).
import sys
import threading

failures = []


def funcname(code):
    return getattr(code, "co_qualname", code.co_name)


def stack_of(frame):
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno or 0, funcname(frame.f_code)))
        frame = frame.f_back
    return out


def capture():
    text, want = sys.gg_probe(), stack_of(sys._getframe())
    got = [(f, int(n), fn) for f, n, fn in (line.split("\x1f") for line in text.splitlines())]
    return got, want


def check(name, pair):
    got, want = pair
    if not got or got != want:
        failures.append(name)
        print("FAIL %s:\n  got  %s\n  want %s" % (name, got, want))


def outer():
    return inner()


def inner():
    return capture()


class Model:
    def forward(self):
        return capture()


def gen():
    yield capture()


def all_checks():
    check("nested", outer())
    check("method", Model().forward())
    check("generator", next(gen()))
    check("lambda", (lambda: capture())())


all_checks()
t = threading.Thread(target=all_checks)
t.start()
t.join()
print("embed: CPython %d.%d.%d: %d failures" % (sys.version_info[:3] + (len(failures),)))
if failures:
    raise SystemExit(1)
