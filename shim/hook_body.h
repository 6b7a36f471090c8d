/* hook_body.h - layer 6: the one body of every hook that allocates or frees,
 * for the runtime's hooks (hook_runtime.c) and the driver's (hook_driver.c).
 *
 * A hook describes its call (the device, the API, the module that asked),
 * asks the guard before the real call and tells it after; a free makes the
 * guard forget first (the address may be handed out again the moment the
 * real free returns) and puts back what a failed free did not free. What
 * differs between the runtime and the driver is a hook's `side`: the
 * runtime's version (enum gg_rt), or GG_SIDE_DRIVER:
 *   - which device a call is on when it does not say: the runtime's current
 *     device, or the current context's;
 *   - the gate: a driver hook also passes through with
 *     GPUGUARD_DRIVER_HOOKS=0 (it may be reached all the same, bound to an
 *     export);
 *   - a refusal is also the runtime's last error (code that checks only
 *     cudaGetLastError() sees the runtime's own out-of-memory) and clears
 *     the caller's pointer, as the runtime does;
 *   - a runtime free of memory the shim never saw allocated is said once
 *     (driver frees of such memory are routine: handles, static runtimes).
 * The codes are the same numbers on both sides: 0 for success and 2 for out
 * of memory (cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY), the one
 * code PyTorch's allocator answers by freeing its cache and retrying.
 */
#ifndef GG_HOOK_BODY_H
#define GG_HOOK_BODY_H

#include <stdbool.h>
#include <stdint.h>

#include "arrays.h"
#include "device.h"
#include "driver.h"
#include "events.h"
#include "guard.h"
#include "hooks.h"
#include "life.h"
#include "pools.h"
#include "prim.h"
#include "react.h"
#include "runtime.h"
#include "trace.h"

#define GG_SIDE_DRIVER (-1)
#define GG_OK 0
#define GG_OOM 2

/* Is this call the guard's to count (it must then gg_leave())? */
static inline bool gg_hook_enter(int side)
{
    if (!gg_enter())
        return false;
    if (side != GG_SIDE_DRIVER || gg_likely(gg_hooks_driver_enabled()))
        return true;
    gg_leave();
    return false;
}

/* The device of a call that says none (dev < 0). */
static inline int gg_hook_device(int side, int dev)
{
    if (dev >= 0)
        return dev;
    if (side == GG_SIDE_DRIVER)
        return gg_driver_current_device();
    return gg_device_count == 1 ? 0 : gg_runtime_device((enum gg_rt)side);
}

/* Describe an allocation of `bytes` on dev (-1: the side's current one);
 * ra: the caller's return address (the module that asked). False: not the
 * guard's to count, make the real call alone. */
static inline bool gg_hook_begin(struct gg_call *c, int side, enum gg_hook h, uintptr_t ra,
                                 uint64_t bytes, int dev, uint8_t refusable)
{
    if (!bytes || !gg_hook_enter(side))
        return false;
    c->dev = gg_hook_device(side, dev);
    c->api = (uint8_t)h;
    c->api_name = gg_hooks[h].journal;
    c->refusable = refusable;
    c->pool = GG_POOL_NONE;
    c->runtime = side != GG_SIDE_DRIVER;
    c->bytes = bytes;
    c->caller = ra;
    return true;
}

/* The guard said no: the allocator's own out-of-memory. p: the caller's
 * pointer to clear (the runtime's side), or NULL. */
static GG_COLD int gg_hook_refuse(int side, const struct gg_call *c, const struct gg_verdict *v,
                                  void **p)
{
    gg_react(c, v);
    if (side != GG_SIDE_DRIVER)
        gg_runtime_set_oom((enum gg_rt)side);
    if (p)
        *p = NULL;
    if (gg_tracing())
        gg_trace_alloc(c->api_name, c->dev, c->bytes, 0, GG_OOM, true, c->pool);
    gg_leave();
    return GG_OOM;
}

/* The real allocation returned r (key: what it made, when r is 0). */
static inline int gg_hook_end(struct gg_call *c, struct gg_verdict *v, int r, uintptr_t key)
{
    if (r == GG_OK)
        gg_guard_allocated(c, key, v);
    else
        gg_guard_failed(c, r == GG_OOM, v);
    if (gg_unlikely(gg_verdict_any(v)))
        gg_react(c, v);
    if (gg_tracing())
        gg_trace_alloc(c->api_name, c->dev, c->bytes, key, r, false, c->pool);
    gg_leave();
    return r;
}

/* A free the runtime accepted of memory the shim never saw allocated (made
 * through a path it does not hook): counted, said once. */
static GG_COLD void gg_hook_unknown_free(int side, uintptr_t key)
{
    if (gg_guard_unknown_free(key, gg_hook_device(side, -1)))
        gg_events_error("freed %p, which gpuguard did not see allocated; forwarded untouched "
                        "(said once, counted in the summary)", (void *)key);
}

/* The real free of key returned r; `report`: a free of memory the shim
 * never saw is said (the runtime's side). */
static inline int gg_hook_free_end(int side, enum gg_hook h, uintptr_t key, bool known,
                                   bool report, const struct gg_entry *e, uint32_t ticket,
                                   const struct gg_verdict *v, int r)
{
    if (r != GG_OK && gg_tracing())
        gg_trace_failed("free", gg_hooks[h].journal, key, r);
    if (!known) {
        if (report && r == GG_OK)
            gg_hook_unknown_free(side, key);
    } else if (r != GG_OK) {
        gg_guard_unrelease(e, ticket);
    } else if (gg_unlikely(gg_verdict_any(v))) {
        gg_react_free(v);
    }
    gg_leave();
    return r;
}

/* The guard's decision on a described call c, then the real call `CALL`
 * and what it made: `KEY` (read after the call). P: the caller's pointer a
 * refusal clears (NULL: none). */
#define GG_HOOK_ADMIT(side, c, P, CALL, KEY)                              \
    do {                                                                  \
        struct gg_verdict v_;                                             \
        if (!gg_guard_admit(&(c), &v_))                                   \
            return gg_hook_refuse(side, &(c), &v_, (void **)(P));         \
        int r_ = (int)(CALL);                                             \
        return gg_hook_end(&(c), &v_, r_, r_ == GG_OK ? (KEY) : 0);       \
    } while (0)

/* An allocation of `bytes` on dev (-1: the side's current one). */
#define GG_HOOK_ALLOC(side, h, ra, bytes, dev, refusable, P, CALL, KEY)   \
    do {                                                                  \
        struct gg_call c_;                                                \
        if (!gg_hook_begin(&c_, side, h, ra, bytes, dev, refusable))      \
            return CALL;                                                  \
        GG_HOOK_ADMIT(side, c_, P, CALL, KEY);                            \
    } while (0)

/* A stream-ordered request: charged to the device of the pool that serves
 * it (POOL; 0: the current pool of DEV's device), judged by how much that
 * pool must grow; a host pool's passes by, known but never counted.
 * trust: the shim sees every change of a device's current pool. */
#define GG_HOOK_POOL(side, h, ra, n, POOL, DEV, trust, P, CALL, KEYP)                     \
    do {                                                                              \
        struct gg_call c_;                                                            \
        if (!gg_hook_begin(&c_, side, h, ra, n, DEV, GG_REFUSABLE))                   \
            return CALL;                                                              \
        if (!gg_guard_pool(&c_, POOL, c_.dev, trust)) {                               \
            int r_ = (int)(CALL);                                                     \
            if (r_ == GG_OK && (KEYP))                                                \
                gg_guard_host_allocated((uintptr_t) * (KEYP));                        \
            gg_leave();                                                               \
            return r_;                                                                \
        }                                                                             \
        GG_HOOK_ADMIT(side, c_, P, CALL, (KEYP) ? (uintptr_t) * (KEYP) : 0);          \
    } while (0)

/* Pitched memory: judged by what was asked (w x hgt), counted by what the
 * device gave (pitch x hgt). P: the caller's pointer (its new key), PITCH:
 * where the pitch comes back, CLEAR: what a refusal clears (NULL: none). */
#define GG_HOOK_PITCH(side, h, ra, w, hgt, P, PITCH, CLEAR, CALL)                         \
    do {                                                                              \
        uint64_t bytes_;                                                              \
        if (__builtin_mul_overflow((uint64_t)(w), (uint64_t)(hgt), &bytes_))          \
            bytes_ = UINT64_MAX; /* cannot be had: the guard refuses or the call fails */ \
        struct gg_call c_;                                                            \
        struct gg_verdict v_;                                                         \
        if (!gg_hook_begin(&c_, side, h, ra, bytes_, -1, GG_REFUSABLE))               \
            return CALL;                                                              \
        if (!gg_guard_admit(&c_, &v_))                                                \
            return gg_hook_refuse(side, &c_, &v_, (void **)(CLEAR));                  \
        int r_ = (int)(CALL);                                                         \
        if (r_ == GG_OK && (PITCH) &&                                                 \
            !__builtin_mul_overflow((uint64_t) * (PITCH), (uint64_t)(hgt), &bytes_))  \
            c_.bytes = bytes_; /* what the device really gave */                      \
        return gg_hook_end(&c_, &v_, r_, r_ == GG_OK && (P) ? (uintptr_t) * (P) : 0); \
    } while (0)

/* An array: the bytes its extent and element size hold (arrays.h); one the
 * side will reject passes through uncounted, its error the side's. */
#define GG_HOOK_ARRAY(side, h, ra, W, H, D, ELEM, FLAGS, LEVELS, P, CALL, KEYP)           \
    do {                                                                              \
        uint64_t bytes_;                                                              \
        if (!gg_array_bytes(W, H, D, ELEM, FLAGS, LEVELS, &bytes_))                   \
            return CALL;                                                              \
        GG_HOOK_ALLOC(side, h, ra, bytes_, -1, GG_REFUSABLE, P, CALL,                 \
                      (KEYP) ? (uintptr_t) * (KEYP) : 0);                             \
    } while (0)

/* A free of key `KEY` (0: nothing to free) whose real call is `CALL`;
 * `report`: a free of memory the shim never saw is said. Traced before the
 * real free, as the guard forgets before it. */
#define GG_HOOK_FREE(side, h, KEY, report, CALL)                                          \
    do {                                                                              \
        uintptr_t k_ = (uintptr_t)(KEY);                                              \
        if (!k_ || !gg_hook_enter(side))                                              \
            return CALL;                                                              \
        struct gg_entry e_;                                                           \
        struct gg_verdict v_;                                                         \
        uint32_t ticket_;                                                             \
        bool known_ = gg_guard_release(k_, &e_, &ticket_, &v_);                       \
        if (gg_tracing())                                                             \
            gg_trace_free(gg_hooks[h].journal, k_);                                   \
        return gg_hook_free_end(side, h, k_, known_, report, &e_, ticket_, &v_,       \
                                (int)(CALL));                                         \
    } while (0)

#endif /* GG_HOOK_BODY_H */
