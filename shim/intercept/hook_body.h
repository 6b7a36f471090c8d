/* hook_body.h - layer 6: the steps of every hook that allocates or frees,
 * for the runtime's hooks (hook_runtime.c) and the driver's (hook_driver.c).
 *
 * Each body (one per shape, hook_shapes.def) makes its real call itself,
 * between the steps, and returns where it can be seen. An allocation:
 *     if (!gg_hook_begin(&c, ...))          not the guard's to count:
 *         return real(...);                 the real call alone
 *     if (!gg_guard_admit(&c, &v))          the guard said no:
 *         return gg_hook_refuse(...);       the allocator's own OOM
 *     r = real(...);
 *     return gg_hook_end(&c, &v, r, key);   the guard told what it made
 * A free: gg_hook_free_begin(), the real free, gg_hook_free_done().
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

/* A stream-ordered request is charged to the device of the pool that
 * serves it and judged by how much that pool must grow (gg_guard_pool); a
 * host pool's passes by, known but never counted: its real call returned
 * r (key: what it made). */
static inline int gg_hook_host_end(int r, uintptr_t key)
{
    if (r == GG_OK && key)
        gg_guard_host_allocated(key);
    gg_leave();
    return r;
}

/* Pitched memory is judged by what was asked (w x hgt; a product that
 * overflows cannot be had: the guard refuses or the call fails) ... */
static inline uint64_t gg_hook_pitch_bytes(uint64_t w, uint64_t hgt)
{
    uint64_t bytes;
    return __builtin_mul_overflow(w, hgt, &bytes) ? UINT64_MAX : bytes;
}

/* ... and counted by what the device gave (pitch x hgt), once it said. */
static inline void gg_hook_pitched(struct gg_call *c, uint64_t pitch, uint64_t hgt)
{
    uint64_t bytes;
    if (!__builtin_mul_overflow(pitch, hgt, &bytes))
        c->bytes = bytes;
}

/* A free, between its two steps. */
struct gg_hook_free {
    uintptr_t key;
    bool known; /* the guard counted it */
    uint32_t ticket;
    struct gg_entry e;
    struct gg_verdict v;
};

/* A free of key (0: nothing to free): false when not the guard's to count
 * (the real free alone, returned); else the guard forgets it first (the
 * address may be handed out again the moment the real free returns) and
 * the trace says so, before the real free. */
static inline bool gg_hook_free_begin(struct gg_hook_free *f, int side, enum gg_hook h,
                                      uintptr_t key)
{
    if (!key || !gg_hook_enter(side))
        return false;
    f->key = key;
    f->known = gg_guard_release(key, &f->e, &f->ticket, &f->v);
    if (gg_tracing())
        gg_trace_free(gg_hooks[h].journal, key);
    return true;
}

/* The real free returned r; `report`: a free of memory the shim never saw
 * is said (the runtime's side). */
static inline int gg_hook_free_done(const struct gg_hook_free *f, int side, enum gg_hook h,
                                    bool report, int r)
{
    if (r != GG_OK && gg_tracing())
        gg_trace_failed("free", gg_hooks[h].journal, f->key, r);
    if (!f->known) {
        if (report && r == GG_OK)
            gg_hook_unknown_free(side, f->key);
    } else if (r != GG_OK) {
        gg_guard_unrelease(&f->e, f->ticket);
    } else if (gg_unlikely(gg_verdict_any(&f->v))) {
        gg_react_free(&f->v);
    }
    gg_leave();
    return r;
}

#endif /* GG_HOOK_BODY_H */
