/* guard.h - the decisions: per device, what may be allocated, what is a
 * near miss, what gets journaled (DESIGN.md sections 1, 2.3, 2.4).
 *
 * The hooks describe each call in a gg_call and ask the guard before and
 * tell it after. Far from the headroom line the guard works from a cheap
 * estimate of the device's use (the last cudaMemGetInfo reading plus what
 * this process did since); near it, it takes a fresh reading.
 */
#ifndef GG_GUARD_H
#define GG_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "ledger.h"
#include "policy.h"

struct gg_device {
    bool present;
    char name[256];
    uint64_t total;
    int cc_major, cc_minor;
    struct gg_policy policy;
    uint64_t limit;            /* total - headroom */
    uint64_t near;             /* the near-miss margin in bytes */
    enum gg_mode mode;         /* as configured; after a broken policy: observe */
    _Atomic bool enforcing;    /* refuses and virtualizes now: enforce, or auto once a
                                  trainer registered */
    _Atomic int64_t used_offset;      /* device-wide use minus this process's, at the last reading */
    _Atomic uint64_t peak_used;       /* most device-wide use seen */
    _Atomic uint64_t last_reading_ns;
    _Atomic uint64_t sample_current;  /* `current` at the last sample event */
    _Atomic gg_site peak_site;        /* the allocation that set the peak */
};

extern struct gg_device gg_devices[GG_MAX_DEVICES];
extern int gg_device_count;

/* One intercepted allocation. */
struct gg_call {
    int dev;
    enum gg_api api;
    uint64_t bytes;
    bool enforceable;  /* may be refused: runtime API or entry points (2.3) */
    bool current;      /* dev is the calling thread's current device */
    gg_site site;      /* filled by the guard when it captures a stack */
};

/* Read device properties and policies; called once at start. */
void gg_guard_init_devices(void);

/* Before the real allocation: false means refuse it (the hook then returns
 * the allocator's out-of-memory code without calling it). */
bool gg_guard_admit(struct gg_call *c);

/* After the real allocation succeeded with ptr. */
void gg_guard_allocated(struct gg_call *c, uintptr_t ptr);

/* After the real allocation failed; oom: with the out-of-memory code. */
void gg_guard_failed(struct gg_call *c, bool oom);

/* Before the real free of ptr: forget it. False when ptr is unknown (the
 * hook forwards it untouched). *out says what it was. */
bool gg_guard_release(uintptr_t ptr, struct gg_alloc *out);

/* The real free failed after gg_guard_release: put the entry back. */
void gg_guard_unrelease(const struct gg_alloc *a);

/* Device-wide use now, as the guard sees it (estimate). */
uint64_t gg_guard_used(int dev);

/* cudaMemGetInfo as the policy wants it answered: rewrites free and total for
 * device dev when virtualize_meminfo is on. */
void gg_guard_meminfo(int dev, size_t *free_b, size_t *total_b);

/* The sites that held device dev's memory at its peak, largest first. */
size_t gg_guard_peak_sites(int dev, struct gg_site_usage *out, size_t max);

/* A trainer registered (gpuguard_set_batch): every device in mode auto
 * enforces from now on, each switch journaled as a `mode` event. */
void gg_guard_trainer_registered(void);

/* The device of the calling thread (runtime or driver), -1 when unknown. */
int gg_guard_current_device(void);

#endif /* GG_GUARD_H */
