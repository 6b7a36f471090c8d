/* os.c - operating-system primitives (see os.h). */
#include "os.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

uint64_t gg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
    int n = snprintf(line, sizeof line, "gpuguard: ");
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    int saved = errno;
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

void gg_comm(char *out, size_t size)
{
    char name[17] = {0};
    if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0 || !name[0])
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

void *gg_os_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void gg_os_free(void *p, size_t size)
{
    if (p)
        munmap(p, size);
}

void gg_spin_lock_slow(gg_spin *s)
{
    for (unsigned spins = 0;; spins++) {
        if (!atomic_flag_test_and_set_explicit(&s->f, memory_order_acquire))
            return;
        if (spins > 64)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#endif
    }
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
