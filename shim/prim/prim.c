/* prim.c - layer 0: operating-system primitives (see prim.h). */
#include "prim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---- clocks --------------------------------------------------------------- */

uint64_t gg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double gg_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static _Atomic uint64_t start_ns;

void gg_clock_start(void)
{
    atomic_store_explicit(&start_ns, gg_now_ns(), memory_order_relaxed);
}

double gg_clock_at(uint64_t ns)
{
    uint64_t zero = atomic_load_explicit(&start_ns, memory_order_relaxed);
    return zero && ns > zero ? (double)(ns - zero) / 1e9 : 0.0;
}

double gg_clock_since_start(void)
{
    return gg_clock_at(gg_now_ns());
}

/* ---- output ----------------------------------------------------------------- */

bool gg_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

void gg_vsay(const char *fmt, va_list ap)
{
    char line[1024];
    int saved = errno;
    int n = snprintf(line, sizeof line, "gpuguard: ");
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    gg_write_all(2, line, len);
    errno = saved;
}

void gg_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gg_vsay(fmt, ap);
    va_end(ap);
}

void gg_fmt_bytes(char *out, size_t size, uint64_t bytes)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(out, size, "%llu B", (unsigned long long)bytes);
    else
        snprintf(out, size, "%.1f %s", v, units[u]);
}

/* ---- the process -------------------------------------------------------------- */

void gg_proc_name(char *out, size_t size)
{
    char name[64] = "";
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, name, sizeof name - 1);
        close(fd);
        name[n > 0 ? n : 0] = '\0';
    }
    size_t len = strcspn(name, "\n");
    name[len] = '\0';
    if (!name[0])
        strcpy(name, "unknown");
    size_t j = 0;
    for (size_t i = 0; name[i] && j + 1 < size; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.';
        out[j++] = ok ? c : '_';
    }
    out[j] = '\0';
}

bool gg_secure(void)
{
    return getauxval(AT_SECURE) != 0;
}

const char *gg_env_copy(const char *name, char *out, size_t size, bool *too_long)
{
    const char *v = getenv(name);
    if (too_long)
        *too_long = false;
    if (!v || !*v || size == 0)
        return NULL;
    size_t n = strlen(v);
    if (n >= size) {
        if (too_long)
            *too_long = true;
        return NULL;
    }
    memcpy(out, v, n + 1);
    return out;
}

int gg_file_create(const char *path)
{
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
}

/* ---- memory ------------------------------------------------------------------- */

void *gg_pages(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void gg_pages_free(void *p, size_t size)
{
    if (p && size)
        munmap(p, size);
}

/* ---- progress --------------------------------------------------------------------- */

static _Atomic uint64_t progress;

void gg_progress(void)
{
    atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
}

uint64_t gg_progress_count(void)
{
    return atomic_load_explicit(&progress, memory_order_relaxed);
}

/* ---- the side stack ------------------------------------------------------------- */

static GG_TLS char *side_base;
static GG_TLS size_t side_used;
static pthread_key_t side_key;
static pthread_once_t side_once = PTHREAD_ONCE_INIT;
static bool side_key_ok;

static void side_free(void *base)
{
    gg_pages_free(base, GG_SIDE_BYTES);
    side_base = NULL;
    side_used = 0;
}

static void side_key_make(void)
{
    side_key_ok = pthread_key_create(&side_key, side_free) == 0;
}

void *gg_side_push(size_t n)
{
    if (gg_unlikely(!side_base)) {
        pthread_once(&side_once, side_key_make);
        /* Without a key nothing would unmap it at thread exit: do without. */
        if (!side_key_ok)
            return NULL;
        char *b = gg_pages(GG_SIDE_BYTES);
        if (!b)
            return NULL;
        if (pthread_setspecific(side_key, b) != 0) {
            gg_pages_free(b, GG_SIDE_BYTES);
            return NULL;
        }
        side_base = b;
    }
    size_t at = side_used, need = (n + 15) & ~(size_t)15;
    if (need < n || need > GG_SIDE_BYTES - at)
        return NULL;
    side_used = at + need;
    return side_base + at;
}

void gg_side_pop(void *p)
{
    char *c = p;
    if (c && side_base && c >= side_base && c <= side_base + side_used)
        side_used = (size_t)(c - side_base);
}

#ifdef GG_TESTING
size_t gg_side_used(void)
{
    return side_used;
}
#endif

/* ---- one lock --------------------------------------------------------------- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

void gg_spin_lock_slow(gg_spin *s)
{
    for (unsigned spins = 0;; spins++) {
        if (!atomic_flag_test_and_set_explicit(&s->f, memory_order_acquire))
            return;
        if (spins > 64)
            sched_yield();
        else
            cpu_relax();
    }
}

bool gg_spin_trylock(gg_spin *s, unsigned tries)
{
    for (unsigned i = 0; i <= tries; i++) {
        if (!atomic_flag_test_and_set_explicit(&s->f, memory_order_acquire))
            return true;
        if (i > 64)
            sched_yield();
        else
            cpu_relax();
    }
    return false;
}

/* ---- dlsym ------------------------------------------------------------------ */

typedef void *(*dlsym_fn)(void *, const char *);
/* Read by the trampoline (trampoline.c); hidden, so it is reached PC-relative. */
GG_HIDDEN void *_Atomic gg_real_dlsym_fn;

GG_HIDDEN GG_NO_SANITIZE void *gg_real_dlsym_resolve(void);
GG_NO_SANITIZE void *gg_real_dlsym_resolve(void)
{
    void *p = atomic_load_explicit(&gg_real_dlsym_fn, memory_order_acquire);
    if (gg_likely(p))
        return p;
    /* glibc 2.34 moved dlsym into libc with a new version; older ones have
     * only the first. dlvsym is not interposed, so this finds the next dlsym
     * after the shim, which may be another interposer's: that is right. */
    p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!p)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!p)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"); /* aarch64's first */
    atomic_store_explicit(&gg_real_dlsym_fn, p, memory_order_release);
    return p;
}

void *gg_real_dlsym(void *handle, const char *name)
{
    dlsym_fn f = (dlsym_fn)gg_real_dlsym_resolve();
    return f ? f(handle, name) : NULL;
}
