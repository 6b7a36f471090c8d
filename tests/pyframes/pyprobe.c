/* pyprobe.c - a test library that Python loads with ctypes to see what
 * pyframes.c makes of its frames. ctypes releases the GIL around the call,
 * as PyTorch does around an operator that allocates: the real situation.
 *
 *   pyprobe_capture(buf, size, max)  this thread's frames, resolved on the
 *                                    spot, as lines "file\x1fline\x1ffunc\n";
 *                                    returns the count, -1 when one could not
 *                                    be named, -2 when buf is too small
 *   pyprobe_keep(max)                capture and keep the raw frames ...
 *   pyprobe_resolve_kept(buf, size)  ... and name them later, after Python
 *                                    ran on (live = false: checked reads)
 *   pyprobe_line(code, addr)         the line of id(code) at byte offset addr
 *                                    (0: no line, -2: not a code object)
 *   pyprobe_bench(iters, out[7])     costs in ns (see bench_pyframes.py)
 */
#include "pyframes.h"
#include "prim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

GG_EXPORT int pyprobe_capture(char *buf, int size, int max);
GG_EXPORT int pyprobe_keep(int max);
GG_EXPORT int pyprobe_resolve_kept(char *buf, int size);
GG_EXPORT int pyprobe_line(uintptr_t code, int addr);
GG_EXPORT int pyprobe_state(void);
GG_EXPORT const char *pyprobe_status(void);
GG_EXPORT const char *pyprobe_take_error(void);
GG_EXPORT void pyprobe_disable(void);
GG_EXPORT int pyprobe_bench(int iters, double *out);

static int format(const struct gg_py_raw *raw, int n, bool live, char *buf, int size)
{
    struct gg_py_frame f[GG_PY_MAX_DEPTH];
    int named = gg_py_resolve(raw, n, live, f), used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        int w = snprintf(buf + used, (size_t)(size - used), "%s\x1f%d\x1f%s\n", f[i].file,
                         f[i].line, f[i].func);
        if (w < 0 || w >= size - used)
            return -2;
        used += w;
    }
    return named < n ? -1 : n;
}

GG_EXPORT int pyprobe_capture(char *buf, int size, int max)
{
    struct gg_py_raw raw[GG_PY_MAX_DEPTH];
    int n = gg_py_capture(raw, max);
    return format(raw, n, true, buf, size);
}

static struct gg_py_raw kept[GG_PY_MAX_DEPTH];
static int nkept;

GG_EXPORT int pyprobe_keep(int max)
{
    nkept = gg_py_capture(kept, max);
    return nkept;
}

GG_EXPORT int pyprobe_resolve_kept(char *buf, int size)
{
    gg_py_test_forget(NULL);               /* make it read the code objects again */
    return format(kept, nkept, false, buf, size);
}

GG_EXPORT int pyprobe_line(uintptr_t code, int addr)
{
    struct gg_py_raw raw;
    struct gg_py_frame f;
    if (!gg_py_test_raw(code, addr, &raw))
        return -2;
    return gg_py_resolve(&raw, 1, true, &f) == 1 ? f.line : -3;
}

GG_EXPORT int pyprobe_state(void)
{
    return (int)gg_py_state();
}

GG_EXPORT const char *pyprobe_status(void)
{
    return gg_py_status();
}

GG_EXPORT const char *pyprobe_take_error(void)
{
    return gg_py_take_error();
}

GG_EXPORT void pyprobe_disable(void)
{
    gg_py_disable();
}

/* ---- costs -------------------------------------------------------------- */

static int (*unw_backtrace_fn)(void **, int);

/* out: [0] Python frames seen, [1] capture ns, [2] resolve ns a frame from
 * the cache, [3] uncached (live reads), [4] uncached (checked reads),
 * [5] native capture depth 32 (unw_backtrace) + Python capture ns (0
 * without libunwind), [6] the native capture alone. */
GG_EXPORT int pyprobe_bench(int iters, double *out)
{
    struct gg_py_raw raw[GG_PY_MAX_DEPTH];
    int n = gg_py_capture(raw, GG_PY_MAX_DEPTH);
    if (n <= 0 || iters <= 0)
        return -1;
    out[0] = n;
    uint64_t t0 = gg_now_ns();
    for (int i = 0; i < iters; i++)
        gg_py_capture(raw, GG_PY_MAX_DEPTH);
    out[1] = (double)(gg_now_ns() - t0) / iters;

    struct gg_py_frame f[GG_PY_MAX_DEPTH];
    gg_py_resolve(raw, n, true, f);
    t0 = gg_now_ns();
    for (int i = 0; i < iters; i++)
        gg_py_resolve(raw, n, true, f);
    out[2] = (double)(gg_now_ns() - t0) / ((double)iters * n);

    int rounds = iters / 10 + 1;
    for (int k = 0; k < 2; k++) {
        uint64_t spent = 0;
        for (int i = 0; i < rounds; i++) {
            for (int j = 0; j < n; j++)
                gg_py_test_forget(&raw[j]);
            t0 = gg_now_ns();
            gg_py_resolve(raw, n, k == 0, f);
            spent += gg_now_ns() - t0;
        }
        out[3 + k] = (double)spent / ((double)rounds * n);
    }

    out[5] = out[6] = 0;
    if (!unw_backtrace_fn) {
        void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
        if (h)
            *(void **)&unw_backtrace_fn = dlsym(h, "unw_backtrace");
    }
    if (unw_backtrace_fn) {
        void *ips[32];   /* under ctypes and the eval loop: always 32 deep */
        t0 = gg_now_ns();
        for (int i = 0; i < iters; i++) {
            unw_backtrace_fn(ips, 32);
            gg_py_capture(raw, GG_PY_MAX_DEPTH);
        }
        out[5] = (double)(gg_now_ns() - t0) / iters;
        t0 = gg_now_ns();
        for (int i = 0; i < iters; i++)
            unw_backtrace_fn(ips, 32);
        out[6] = (double)(gg_now_ns() - t0) / iters;
    }
    return n;
}
