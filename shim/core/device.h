/* device.h - layer 4: the GPUs as the guard sees them.
 *
 * One record per device: what it is and what its policy says (set once at
 * start, then only read), and its counters. Each group of fields that
 * threads write sits on its own cache line, so a thread allocating reads
 * the policy values without fetching a line that another thread's
 * allocation has just written.
 *
 * Device-wide use is kept as an estimate: the last reading of the device
 * (other processes, the CUDA context) plus what this process did since,
 * `current + used_offset`. A reading is taken before a device's first
 * decision and whenever the estimate says a request could be refused, never
 * on every allocation (docs/how-it-works.md, "The headroom line").
 */
#ifndef GG_DEVICE_H
#define GG_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "ledger.h"
#include "peers.h"
#include "policy.h"
#include "prim.h"
#include "sites.h"

struct gg_device {
    /* Read-mostly: set at start. */
    _Alignas(64) bool present;
    uint8_t mode;              /* enum gg_mode as configured; broken policy: observe */
    uint8_t enforce;           /* enum gg_enforce */
    uint8_t stacks;            /* enum gg_stacks */
    uint8_t depth;             /* [journal] depth */
    bool virtualize_meminfo;
    const char *never_refuse;  /* [memory] never_refuse: globs on a module's file name */
    _Atomic bool enforcing;    /* refuses and virtualizes now (enforce, or auto once a
                                  trainer registered); written once */
    _Atomic bool read_once;    /* a reading was taken: decisions need no first one */
    uint64_t total, limit;     /* limit = total - headroom */
    uint64_t near;             /* the near-miss margin */
    uint64_t sample_step;      /* total / 100: how far `current` moves between timeline points */
    uint64_t claim_slack;      /* shared GPU: what a claim holds beyond the request (peers.h) */
    int cc_major, cc_minor;
    char name[256];
    char uuid[48];             /* as DCGM labels it (driver.h), or "" */

    /* This process's bytes on the device: every allocation and free, and
     * what its stream-ordered pools hold (pools.h) in place of the bytes they
     * handed out: the device's view. Of them, pool_reserved are the pools'
     * and pool_used of those handed out (allocated = current - pool_reserved
     * + pool_used, PyTorch's allocated beside its reserved). */
    _Alignas(64) _Atomic uint64_t current;
    _Atomic uint64_t pool_reserved, pool_used, peak_pool_reserved;
    /* The exact peak of `current` in the window since the last boundary (a
     * training step, a batch): read by every allocation, written at a peak.
     * A boundary closes the window in O(1) (gg_device_close_window), so the
     * allocation path does exactly what an all-time peak would cost. */
    _Alignas(64) _Atomic uint64_t window_peak;
    _Atomic uint64_t peak_before;      /* the largest of the closed windows */
    _Atomic uint64_t phase_peak;       /* the largest of the windows since the last batch */
    /* Device-wide: written at readings and device-wide peaks. */
    _Alignas(64) _Atomic int64_t used_offset; /* device use minus this process's, at the last reading */
    _Atomic uint64_t window_used;      /* the window's device-wide peak */
    _Atomic uint64_t used_before, phase_used;
    _Atomic uint64_t last_reading_ns;
    /* Shared GPU (peers.h): what the other guarded processes held at the
     * last reading, and what they held beyond that at the last look (in
     * used_offset too), with the most they held and claimed. */
    _Atomic uint64_t peers_at_reading;
    _Atomic int64_t peers_delta;
    _Atomic uint64_t peers_peak;
    _Atomic int peers_most;            /* the most other members seen at once */
    /* Incidents and events: written rarely. */
    _Alignas(64) _Atomic uint64_t near_misses, refusals, ooms, unknown_frees;
    _Atomic uint64_t refusals_recovered, ooms_recovered; /* the caller's retry worked (retry.h) */
    _Atomic uint64_t sample_current;   /* `current` when it last moved by a sample step */
    /* The extremes of those moves since the last timeline tick (react.c):
     * the highest, and the lowest as its complement (0: none), and when. */
    _Atomic uint64_t sample_high, sample_low_inv;
    _Atomic uint64_t sample_high_ns, sample_low_ns;
    _Atomic gg_site peak_site;         /* the allocation that set the peak */
    /* The ledger shared with the other guarded processes of this user on
     * this GPU (peers.h): joined at start, read-mostly. */
    _Alignas(64) struct gg_peers peers;
};

extern struct gg_device gg_devices[GG_MAX_DEVICES];
extern int gg_device_count;

/* Device dev, or NULL when there is none or it is not guarded. */
static inline struct gg_device *gg_device(int dev)
{
    if ((unsigned)dev >= (unsigned)gg_device_count || !gg_devices[dev].present)
        return NULL;
    return &gg_devices[dev];
}

/* Has this process used device dev (allocated on it, or been refused or
 * out of memory there)? Only such devices are summarized and exported. */
static inline bool gg_device_in_use(const struct gg_device *d, int dev)
{
    return gg_ledger_allocs(dev) || atomic_load(&d->ooms) || atomic_load(&d->refusals);
}

/* The policy a device runs under. */
const struct gg_policy *gg_device_policy(int dev);

/* Read the devices from the driver and give each its policy, with the
 * process settings p; problems go to report (the file and line of each,
 * capped per file). Returns the number of devices (0: no driver, no device;
 * said through report). */
int gg_devices_init(const struct gg_process *p, gg_report_fn report, void *ctx);

/* The near-miss line: the limit less the near-miss margin, the device-wide
 * use past which an allocation is a near miss (0 when the margin is all). */
static inline uint64_t gg_device_line(const struct gg_device *d)
{
    return d->limit > d->near ? d->limit - d->near : 0;
}

/* Device-wide use as estimated now: the last reading, what this process
 * did since, and what the other guarded processes on the GPU did since, as
 * their slots said at the last look (folded into used_offset). */
static inline uint64_t gg_device_estimate(const struct gg_device *d)
{
    int64_t u = (int64_t)atomic_load_explicit(&d->current, memory_order_relaxed) +
                atomic_load_explicit(&d->used_offset, memory_order_relaxed);
    return u > 0 ? (uint64_t)u : 0;
}

/* The other guarded processes on a shared GPU, as their slots say now
 * (out: their figures; zero when the GPU is not shared): the estimate
 * follows what they did since the last reading. */
void gg_device_peers(struct gg_device *d, struct gg_peers_sum *out);

/* At exit: leave the shared ledgers. */
void gg_devices_leave(void);
/* A forked child: not a member of its parent's ledgers. */
void gg_devices_after_fork(void);

/* The all-time peaks: this process's bytes, and device-wide. */
static inline uint64_t gg_device_peak(const struct gg_device *d)
{
    uint64_t a = atomic_load(&d->peak_before), b = atomic_load(&d->window_peak);
    return a > b ? a : b;
}
static inline uint64_t gg_device_peak_used(const struct gg_device *d)
{
    uint64_t a = atomic_load(&d->used_before), b = atomic_load(&d->window_used);
    return a > b ? a : b;
}

/* What a window (a step) or a phase (a batch) of the training saw. */
struct gg_window {
    uint64_t peak;       /* the most bytes this process held */
    uint64_t peak_used;  /* the most device-wide use seen */
    uint64_t live;       /* this process's bytes at its end */
};
/* Close the current window: its peaks, and a new window from now. */
void gg_device_close_window(struct gg_device *d, struct gg_window *out);
/* Close the current phase (its windows, the current one too). */
void gg_device_close_phase(struct gg_device *d, struct gg_window *out);

/* Take a reading (re-anchoring the estimate) and return the device's use;
 * the estimate when no reading can be taken. may_retain: a runtime call,
 * whose runtime is about to make the device's primary context anyway. */
uint64_t gg_device_refresh(struct gg_device *d, int dev, bool may_retain);

#ifdef GG_TESTING
/* For tests: forget every device. */
void gg_devices_reset(void);
#endif

#endif /* GG_DEVICE_H */
