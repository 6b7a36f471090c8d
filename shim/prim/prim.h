/* prim.h - layer 0: the few operating-system primitives the shim uses.
 *
 * Everything here is safe to call from a hook: no locks shared with the host
 * program, no stdio, no malloc (memory comes from mmap). Nothing in this
 * layer knows CUDA, policies or the journal's contents; every other layer
 * builds on it (docs/how-it-works.md, "Layers").
 */
#ifndef GG_PRIM_H
#define GG_PRIM_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_EXPORT __attribute__((visibility("default")))
#define GG_HIDDEN __attribute__((visibility("hidden")))
#define GG_COLD __attribute__((cold, noinline))
#define GG_TLS __thread __attribute__((tls_model("initial-exec")))
/* For code that runs before a sanitizer's runtime is ready (the dlsym
 * override is called by ASan's own start-up). */
#define GG_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
#define gg_likely(x) __builtin_expect(!!(x), 1)
#define gg_unlikely(x) __builtin_expect(!!(x), 0)
#define GG_COUNT(a) (sizeof(a) / sizeof((a)[0]))

#define GG_PATH_MAX 1024

/* ---- clocks --------------------------------------------------------------- */

/* Monotonic nanoseconds. */
uint64_t gg_now_ns(void);
/* Wall-clock seconds since the epoch (aligns journals of several ranks). */
double gg_wall_s(void);
/* The one clock for "seconds since the shim started": gg_clock_start() sets
 * its zero (once per life; again in a forked child that starts its own). */
void gg_clock_start(void);
double gg_clock_since_start(void);
/* The same for a moment gg_now_ns() gave earlier. */
double gg_clock_at(uint64_t ns);

/* ---- output ----------------------------------------------------------------- */

/* write(2) until done or a real error; false on error (errno kept). */
bool gg_write_all(int fd, const void *buf, size_t len);

/* One line "gpuguard: ..." on stderr with a single write(2). */
void gg_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void gg_vsay(const char *fmt, va_list ap);

/* Format bytes as "21.4 GiB". */
void gg_fmt_bytes(char *out, size_t size, uint64_t bytes);

/* ---- the process -------------------------------------------------------------- */

/* The process's name (/proc/self/comm: the main thread's, never the calling
 * thread's), made safe for a file name. */
void gg_proc_name(char *out, size_t size);

/* A copy of environment variable `name` in `out` (NULL when unset, empty, or
 * longer than `size` - 1: then *too_long is set). Nothing keeps pointing into
 * the live environment, so a later setenv() in the host changes nothing. */
const char *gg_env_copy(const char *name, char *out, size_t size, bool *too_long);

/* Secure-execution mode (getauxval(AT_SECURE)): a set-user-ID or
 * set-group-ID program, or one that gained capabilities, whose environment
 * its caller controls. Then no setting that names a file is read from the
 * environment, and the environment is never changed. */
bool gg_secure(void);

/* Create a file that did not exist: O_WRONLY|O_CREAT|O_EXCL|O_APPEND|
 * O_NOFOLLOW|O_CLOEXEC, mode 0600. -1 with errno set on failure. */
int gg_file_create(const char *path);

/* ---- memory ------------------------------------------------------------------- */

/* Zeroed pages (MAP_NORESERVE), and their return. NULL on failure. */
void *gg_pages(size_t size);
void gg_pages_free(void *p, size_t size);

/* ---- one lock --------------------------------------------------------------- */

/* A spin lock that yields: for short critical sections. Never held across a
 * call out of the shim. */
typedef struct { atomic_flag f; } gg_spin;
#define GG_SPIN_INIT { ATOMIC_FLAG_INIT }
void gg_spin_lock_slow(gg_spin *s);
static inline void gg_spin_lock(gg_spin *s)
{
    if (gg_unlikely(atomic_flag_test_and_set_explicit(&s->f, memory_order_acquire)))
        gg_spin_lock_slow(s);
}
/* Take it within a bounded number of tries: false when another holder (or
 * this thread, interrupted by a signal) keeps it. For paths that a signal
 * handler or an exit handler can re-enter. */
bool gg_spin_trylock(gg_spin *s, unsigned tries);
static inline void gg_spin_unlock(gg_spin *s)
{
    atomic_flag_clear_explicit(&s->f, memory_order_release);
}
/* After fork: the child's copy may have been held by a parent thread. */
static inline void gg_spin_reset(gg_spin *s)
{
    atomic_flag_clear_explicit(&s->f, memory_order_relaxed);
}

/* ---- progress ------------------------------------------------------------------- */

/* The start bumps this as it goes (a policy file read, a device queried, a
 * module checked): threads waiting for it wait as long as it moves, so a
 * slow start (a directory of thousands of policies, 16 GPUs) leaves nothing
 * uncounted, while one that stopped moving (blocked on a lock the waiter
 * holds: the loader's, say) lets them go. */
void gg_progress(void);
uint64_t gg_progress_count(void);

/* ---- the side stack ------------------------------------------------------------ */

/* Big buffers of the cold paths (a journal line, a symbol's name, a captured
 * stack) live on a per-thread side stack on the heap, not on the thread's
 * own stack, which may be 16 KiB (user threads, some runtimes' workers):
 * GG_SIDE_BYTES mapped at a thread's first use, unmapped when it exits.
 * push(n) returns n bytes (16-aligned) or NULL (no room, no memory: the
 * caller does without); pop(p) gives back p and everything pushed after
 * it. Strictly last in, first out, which a signal handler interrupting a
 * user also keeps. */
#define GG_SIDE_BYTES (256u << 10)
void *gg_side_push(size_t n);
void gg_side_pop(void *p);
#ifdef GG_TESTING
/* Bytes of this thread's side stack in use (tests). */
size_t gg_side_used(void);
#endif

/* ---- numbers ----------------------------------------------------------------- */

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

/* A strong 64-bit mix (murmur3's finalizer). */
static inline uint64_t gg_mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* FNV-1a over bytes, for strings. */
static inline uint64_t gg_hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ULL;
    return h;
}

/* ---- dlsym ------------------------------------------------------------------ */

/* The real dlsym (the next definition after the shim's), whatever interposes
 * it; NULL if none can be found. */
void *gg_real_dlsym(void *handle, const char *name);

/* The filter behind the shim's dlsym trampoline (trampoline.c): called with
 * the lookup's arguments and the caller's return address, it returns the
 * pointer to hand out instead, or NULL to let the real dlsym answer with the
 * caller's own frame. Registered by the layer that knows what to hook; NULL
 * until then. */
typedef void *(*gg_dlsym_filter_fn)(void *handle, const char *name, uintptr_t caller);
void gg_dlsym_set_filter(gg_dlsym_filter_fn fn);

#endif /* GG_PRIM_H */
