/* os.h - the few operating-system primitives the shim uses, in one place.
 *
 * Everything here is safe to call from a hook: no locks shared with the
 * host program, no stdio, memory from mmap rather than malloc where a table
 * must outlive a call.
 */
#ifndef GG_OS_H
#define GG_OS_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_EXPORT __attribute__((visibility("default")))
#define GG_COLD __attribute__((cold, noinline))
#define GG_TLS __thread __attribute__((tls_model("initial-exec")))
/* For code that runs before a sanitizer's runtime is ready (the dlsym
 * override is called by ASan's own start-up). */
#define GG_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
#define gg_likely(x) __builtin_expect(!!(x), 1)
#define gg_unlikely(x) __builtin_expect(!!(x), 0)

/* Monotonic clock in nanoseconds. */
uint64_t gg_now_ns(void);

/* write(2) until done or a real error; false on error. */
bool gg_write_all(int fd, const void *buf, size_t len);

/* One line "gpuguard: ..." on stderr with a single write(2). */
void gg_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void gg_vsay(const char *fmt, va_list ap);

/* The process name (/proc/self/comm), made safe for a file name. */
void gg_comm(char *out, size_t size);

/* Zeroed pages, and their return. NULL on failure. */
void *gg_os_alloc(size_t size);
void gg_os_free(void *p, size_t size);

/* A spin lock that yields: for short critical sections off the fast path
 * of other threads. Never held across a call out of the shim. */
typedef struct { atomic_flag f; } gg_spin;
#define GG_SPIN_INIT { ATOMIC_FLAG_INIT }
void gg_spin_lock_slow(gg_spin *s);
static inline void gg_spin_lock(gg_spin *s)
{
    if (gg_unlikely(atomic_flag_test_and_set_explicit(&s->f, memory_order_acquire)))
        gg_spin_lock_slow(s);
}
static inline void gg_spin_unlock(gg_spin *s)
{
    atomic_flag_clear_explicit(&s->f, memory_order_release);
}

/* Atomically raise *max to v if v is larger; true if it was raised. */
static inline bool gg_atomic_max(_Atomic uint64_t *max, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(max, memory_order_relaxed);
    while (v > cur) {
        if (atomic_compare_exchange_weak_explicit(max, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed))
            return true;
    }
    return false;
}

/* Format bytes as "21.4 GiB" into out. */
void gg_fmt_bytes(char *out, size_t size, uint64_t bytes);

#endif /* GG_OS_H */
