/* trace.c - layer 4: the call trace (see trace.h). */
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "callers.h"
#include "pools.h"
#include "settings.h"

_Atomic int gg_trace_fd = -1;

/* Lookups made before the shim starts (a runtime resolving its driver when
 * it loads, a framework taking its driver functions at import): kept here,
 * when a trace is asked for, and written first when it opens. */
#define EARLY 128
#define LINE_EARLY 320
static gg_spin early_lock = GG_SPIN_INIT;
static char early[EARLY][LINE_EARLY];
static int nearly, early_lost;
static _Atomic int early_state; /* 0: not asked yet; 1: keep them; 2: do not */

/* "%p" in the path becomes the pid. */
static bool expand(const char *path, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = path; *p; p++) {
        char pid[24];
        const char *piece = p;
        size_t len = 1;
        if (p[0] == '%' && p[1] == 'p') {
            len = (size_t)snprintf(pid, sizeof pid, "%d", (int)getpid());
            piece = pid;
            p++;
        }
        if (n + len >= cap)
            return false;
        memcpy(out + n, piece, len);
        n += len;
    }
    out[n] = '\0';
    return true;
}

/* One whole line (with its newline) to fd. A trace with a hole would replay
 * wrong: on a failed write tracing stops, said once. The descriptor stays
 * open: another thread may be writing to it now, and a number closed under
 * it could become one of the program's files. */
static void write_line(int fd, const char *line, size_t n)
{
    if (!gg_write_all(fd, line, n)) {
        int err = errno;
        if (atomic_exchange(&gg_trace_fd, -1) >= 0)
            gg_say("cannot write the trace (%s); tracing stops", strerror(err));
    }
}

/* Format a line into out (room for the newline kept): its length, or 0 when
 * it does not fit (a line cut short would replay wrong). */
static size_t format(char *out, size_t cap, const char *fmt, va_list ap)
{
    int n = vsnprintf(out, cap - 1, fmt, ap);
    if (n <= 0 || (size_t)n >= cap - 1)
        return 0;
    out[n] = '\n';
    return (size_t)n + 1;
}

#define LINE 512

static void put_to(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_to(int fd, const char *fmt, ...)
{
    char line[LINE];
    va_list ap;
    va_start(ap, fmt);
    size_t n = format(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n)
        write_line(fd, line, n);
    else
        write_line(fd, "# a line too long for the trace was left out\n", 46);
}

#define put(...)                                                                     \
    do {                                                                             \
        int fd_ = atomic_load_explicit(&gg_trace_fd, memory_order_relaxed);          \
        if (fd_ >= 0)                                                                \
            put_to(fd_, __VA_ARGS__);                                                \
    } while (0)

/* Is a trace asked for (GPUGUARD_TRACE, read once)? Before the start only. */
static bool early_wanted(void)
{
    int st = atomic_load_explicit(&early_state, memory_order_acquire);
    if (st == 0) {
        char v[8];
        bool too_long = false;
        const char *env = gg_setting_info[GG_SET_trace].env;
        st = gg_env_copy(env, v, sizeof v, &too_long) || too_long ? 1 : 2;
        int expected = 0;
        atomic_compare_exchange_strong(&early_state, &expected, st);
        st = atomic_load(&early_state);
    }
    return st == 1;
}

/* A lookup line before the trace is open: kept while that is wanted, else
 * (the trace opened meanwhile) written. */
static void keep_early(const char *line, size_t n)
{
    gg_spin_lock(&early_lock);
    if (atomic_load(&early_state) == 1) {
        if (nearly < EARLY && n <= sizeof early[0])
            memcpy(early[nearly++], line, n - 1), early[nearly - 1][n - 1] = '\0';
        else
            early_lost++;
        gg_spin_unlock(&early_lock);
        return;
    }
    gg_spin_unlock(&early_lock);
    int fd = atomic_load_explicit(&gg_trace_fd, memory_order_relaxed);
    if (fd >= 0)
        write_line(fd, line, n);
}

/* No more lines are kept for a trace that will not open. */
static void early_done(void)
{
    gg_spin_lock(&early_lock);
    atomic_store(&early_state, 2);
    nearly = early_lost = 0;
    gg_spin_unlock(&early_lock);
}

void gg_trace_open(const char *path)
{
    char name[GG_PATH_MAX];
    if (!path || !*path) {
        early_done();
        return;
    }
    if (!expand(path, name, sizeof name)) {
        early_done();
        gg_say("GPUGUARD_TRACE: the file name is too long; no trace");
        return;
    }
    int fd = gg_file_create(name);
    if (fd < 0) {
        early_done();
        gg_say("GPUGUARD_TRACE: cannot create %s (%s); no trace", name, strerror(errno));
        return;
    }
    /* The header and the lookups kept so far first; then the descriptor is
     * published, under the lock a lookup keeps or writes its line with. */
    gg_spin_lock(&early_lock);
    put_to(fd, "gpuguard-trace 1 pid=%d", (int)getpid());
    for (int i = 0; i < nearly; i++)
        put_to(fd, "%s", early[i]);
    if (early_lost)
        put_to(fd, "# %d lookups before the start were not kept", early_lost);
    nearly = early_lost = 0;
    atomic_store(&early_state, 2);
    atomic_store(&gg_trace_fd, fd);
    gg_spin_unlock(&early_lock);
}

void gg_trace_started(void)
{
    if (atomic_load(&early_state) != 2 && atomic_load(&gg_trace_fd) < 0)
        early_done();
}

void gg_trace_device(int dev, const char *name, uint64_t total, int cc_major, int cc_minor)
{
    put("device %d %llu %d.%d %s", dev, (unsigned long long)total, cc_major, cc_minor, name);
}

static long tid(void)
{
    return syscall(SYS_gettid); /* gettid() needs glibc 2.30 */
}

void gg_trace_alloc(const char *api, int dev, uint64_t bytes, uintptr_t key, int result,
                    bool refused, unsigned pool)
{
    char res[16], extra[40] = "";
    struct gg_pool_figures f;
    if (refused)
        snprintf(res, sizeof res, "refused");
    else
        snprintf(res, sizeof res, "%d", result);
    if (pool != GG_POOL_NONE && gg_pools_figures(pool, &f))
        snprintf(extra, sizeof extra, " pool=%#llx", (unsigned long long)f.handle);
    put("alloc %s %d %llu %#llx %s t=%ld%s", api, dev, (unsigned long long)bytes,
        (unsigned long long)key, res, tid(), extra);
}

void gg_trace_free(const char *api, uintptr_t key)
{
    put("free %s %#llx t=%ld", api, (unsigned long long)key, tid());
}

void gg_trace_failed(const char *what, const char *api, uint64_t key, int result)
{
    put("fail %s %s %#llx %d t=%ld", what, api, (unsigned long long)key, result, tid());
}

void gg_trace_map(uintptr_t va, uint64_t size, uint64_t handle, int result)
{
    put("map %#llx %llu %#llx %d", (unsigned long long)va, (unsigned long long)size,
        (unsigned long long)handle, result);
}

void gg_trace_unmap(uintptr_t va, uint64_t size)
{
    put("unmap %#llx %llu t=%ld", (unsigned long long)va, (unsigned long long)size, tid());
}

void gg_trace_release(uint64_t handle)
{
    put("release %#llx t=%ld", (unsigned long long)handle, tid());
}

void gg_trace_pool(const char *op, uint64_t pool, long long arg, int result)
{
    put("pool %s %#llx %lld %d", op, (unsigned long long)pool, arg, result);
}

void gg_trace_pool_attr(uint64_t pool, int attr, unsigned long long value, int result)
{
    put("pool attr %#llx %d=%llu %d", (unsigned long long)pool, attr, value, result);
}

void gg_trace_meminfo(const char *api, int dev, uint64_t free_b, uint64_t total_b)
{
    put("meminfo %s %d %llu %llu", api, dev, (unsigned long long)free_b,
        (unsigned long long)total_b);
}

void gg_trace_lookup(const char *via, const char *name, int version, unsigned long long flags,
                     uintptr_t caller)
{
    char module[160], line[LINE_EARLY];
    if (!gg_callers_module(caller, module, sizeof module))
        snprintf(module, sizeof module, "?");
    for (char *c = module; *c; c++)
        if (*c == ' ')
            *c = '_';
    int n = snprintf(line, sizeof line, "lookup %s %s %d %llu %s\n", via, name, version, flags,
                     module);
    if (n <= 0 || (size_t)n >= sizeof line) {
        snprintf(line, sizeof line, "# a lookup of %.64s too long for the trace was left out\n", name);
        n = (int)strlen(line);
    }
    int fd = atomic_load_explicit(&gg_trace_fd, memory_order_relaxed);
    if (fd >= 0)
        write_line(fd, line, (size_t)n);
    else
        keep_early(line, (size_t)n);
}

bool gg_trace_early(void)
{
    return atomic_load_explicit(&early_state, memory_order_relaxed) != 2 && early_wanted();
}

void gg_trace_api(const char *what, long long a, long long b)
{
    if (!strcmp(what, "batch") || !strcmp(what, "needed"))
        put("%s %lld %lld", what, a, b);
    else
        put("%s %lld", what, a);
}

void gg_trace_shape(const long long *dims, int ndims, int batch_dim)
{
    char text[8 * 24] = "";
    size_t at = 0;
    for (int i = 0; dims && i < ndims && i < 8; i++) {
        int n = snprintf(text + at, sizeof text - at, "%s%lld", i ? "," : "", dims[i]);
        if (n < 0 || (size_t)n >= sizeof text - at)
            break;
        at += (size_t)n;
    }
    put("shape %s %d", at ? text : "-", batch_dim);
}

void gg_trace_after_fork(void)
{
    atomic_store(&gg_trace_fd, -1); /* close-on-exec: gone at the child's exec */
    atomic_store(&early_state, 2);
    gg_spin_reset(&early_lock);
}
