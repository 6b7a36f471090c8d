/* guard.c - the decisions and the events they journal (see guard.h). */
#include "guard.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "advice.h"
#include "init.h"
#include "journal.h"
#include "options.h"
#include "os.h"
#include "resolve.h"
#include "stack.h"

struct gg_device gg_devices[GG_MAX_DEVICES];
int gg_device_count;

/* The driver functions the guard itself calls, never through a hook. */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*device_total_mem)(size_t *, CUdevice);
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*mem_get_info)(size_t *, size_t *);
} drv;

static void *_Atomic rt_get_device, *_Atomic rt_mem_get_info;

/* A fresh reading at most this often on the near-miss path. */
#define READING_INTERVAL_NS 1000000ull

/* ---- devices --------------------------------------------------------------- */

/* Says each problem, and counts them in *ctx. */
static void report_policy(void *ctx, const char *file, int line, const char *msg)
{
    ++*(int *)ctx;
    if (line > 0)
        gg_journal_error("%s:%d: %s", file, line, msg);
    else
        gg_journal_error("%s: %s", file, msg);
}

static void *_Atomic rt_get_device_count;

static bool load_driver(void)
{
    /* The first call may come through the runtime before it has loaded its
     * driver (it does so on its first call, from a path of its own): let it,
     * so the shim uses the very libcuda the runtime uses. */
    if (!gg_resolve_driver("cuInit", false)) {
        cudaError_t (*count)(int *) = (cudaError_t(*)(int *))gg_resolve_runtime(
            &rt_get_device_count, "cudaGetDeviceCount");
        int n;
        if (count)
            (void)count(&n);
    }
#define DRV(field, name) \
    (*(void **)&drv.field = gg_resolve_driver(name, true)) != NULL
    return DRV(init, "cuInit") && DRV(device_get_count, "cuDeviceGetCount") &&
           DRV(device_get, "cuDeviceGet") && DRV(device_get_name, "cuDeviceGetName") &&
           DRV(device_total_mem, "cuDeviceTotalMem_v2") &&
           DRV(device_get_attribute, "cuDeviceGetAttribute") &&
           DRV(ctx_get_device, "cuCtxGetDevice") && DRV(mem_get_info, "cuMemGetInfo_v2");
#undef DRV
}

static void init_device(int i)
{
    struct gg_device *d = &gg_devices[i];
    CUdevice cu;
    size_t total = 0;
    if (drv.device_get(&cu, i) != CUDA_SUCCESS)
        return;
    if (drv.device_get_name(d->name, (int)sizeof d->name, cu) != CUDA_SUCCESS)
        snprintf(d->name, sizeof d->name, "CUDA device %d", i);
    drv.device_total_mem(&total, cu);
    drv.device_get_attribute(&d->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu);
    drv.device_get_attribute(&d->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu);
    d->total = total;

    struct gg_policy_env env = gg_options_policy_env();
    int problems = 0;
    if (env.policy)
        gg_policy_select(env.policy, d->name, &d->policy, report_policy, &problems);
    else
        gg_policy_defaults(&d->policy);
    gg_policy_apply_env(&d->policy, &env, report_policy, &problems);
    d->limit = gg_policy_limit(&d->policy, total, report_policy, &problems);
    d->near = gg_policy_near_miss(&d->policy, total);
    d->mode = d->policy.mode;
    if (problems && (d->mode == GG_MODE_ENFORCE || d->mode == GG_MODE_AUTO)) {
        d->mode = GG_MODE_OBSERVE;
        gg_journal_error("GPU%d: policy problems above; observing only, nothing will be refused", i);
    }
    atomic_store(&d->enforcing, d->mode == GG_MODE_ENFORCE);
    d->present = true;
}

void gg_guard_init_devices(void)
{
    if (!load_driver()) {
        gg_journal_error("cannot find the CUDA driver (libcuda.so.1); passing through");
        return;
    }
    CUresult r = drv.init(0);
    if (r != CUDA_SUCCESS) {
        gg_journal_error("cuInit failed (error %d); passing through", (int)r);
        return;
    }
    int n = 0;
    if (drv.device_get_count(&n) != CUDA_SUCCESS)
        n = 0;
    if (n > GG_MAX_DEVICES) {
        gg_journal_error("%d CUDA devices; only the first %d are guarded", n, GG_MAX_DEVICES);
        n = GG_MAX_DEVICES;
    }
    for (int i = 0; i < n; i++)
        init_device(i);
    gg_device_count = n;
}

int gg_guard_current_device(void)
{
    CUdevice cu;
    if (drv.ctx_get_device && drv.ctx_get_device(&cu) == CUDA_SUCCESS)
        return (int)cu;
    cudaError_t (*get)(int *) =
        (cudaError_t(*)(int *))gg_resolve_runtime(&rt_get_device, "cudaGetDevice");
    int dev;
    if (get && get(&dev) == cudaSuccess)
        return dev;
    return -1;
}

static inline struct gg_device *device(int dev)
{
    if ((unsigned)dev >= (unsigned)gg_device_count || !gg_devices[dev].present)
        return NULL;
    return &gg_devices[dev];
}

/* ---- device-wide use --------------------------------------------------- */

static inline uint64_t current_of(int dev)
{
    return atomic_load_explicit(&gg_ledger_counters[dev].current, memory_order_relaxed);
}

static inline uint64_t estimate(struct gg_device *d, int dev)
{
    int64_t u = (int64_t)current_of(dev) +
                atomic_load_explicit(&d->used_offset, memory_order_relaxed);
    return u > 0 ? (uint64_t)u : 0;
}

/* Ask the device. Only the calling thread's current device can be read. */
static bool read_used(int dev, uint64_t *used)
{
    size_t free_b = 0, total_b = 0;
    CUdevice cu;
    bool ok = false;
    if (drv.ctx_get_device && drv.ctx_get_device(&cu) == CUDA_SUCCESS) {
        ok = (int)cu == dev && drv.mem_get_info(&free_b, &total_b) == CUDA_SUCCESS;
    } else {
        cudaError_t (*get)(size_t *, size_t *) = (cudaError_t(*)(size_t *, size_t *))
            gg_resolve_runtime(&rt_mem_get_info, "cudaMemGetInfo");
        int cur = gg_guard_current_device();
        ok = get && cur == dev && get(&free_b, &total_b) == cudaSuccess;
    }
    if (!ok || total_b < free_b)
        return false;
    *used = total_b - free_b;
    return true;
}

/* Take a reading and re-anchor the estimate; returns the device's use. */
static uint64_t refresh(struct gg_device *d, int dev, bool force)
{
    uint64_t now = gg_now_ns();
    if (!force && now - atomic_load_explicit(&d->last_reading_ns, memory_order_relaxed) <
                      READING_INTERVAL_NS)
        return estimate(d, dev);
    uint64_t used;
    if (!read_used(dev, &used))
        return estimate(d, dev);
    atomic_store_explicit(&d->last_reading_ns, now, memory_order_relaxed);
    atomic_store_explicit(&d->used_offset, (int64_t)used - (int64_t)current_of(dev),
                          memory_order_relaxed);
    gg_atomic_max(&d->peak_used, used);
    return used;
}

uint64_t gg_guard_used(int dev)
{
    struct gg_device *d = device(dev);
    return d ? estimate(d, dev) : 0;
}

/* ---- events ------------------------------------------------------------- */

static bool want_stack(const struct gg_device *d, bool incident)
{
    if (d->policy.stacks == GG_STACKS_ALL)
        return true;
    return incident && d->policy.stacks == GG_STACKS_NEAR_MISS;
}

static gg_site capture(struct gg_device *d, int dev)
{
    return gg_stack_capture(dev, d->policy.depth);
}

/* near_miss, refused, oom: DESIGN.md's fields, and the stack. */
static void incident(const char *ev, struct gg_device *d, const struct gg_call *c, uint64_t used,
                     uint64_t count)
{
    char buf[4096];
    struct gg_json j;
    gg_journal_begin(&j, buf, sizeof buf, ev);
    gg_json_ki64(&j, "dev", c->dev);
    gg_json_kstr(&j, "api", gg_api_name(c->api));
    gg_json_ku64(&j, "bytes", c->bytes);
    gg_json_ku64(&j, "used", used);
    gg_json_ku64(&j, "limit", d->limit);
    gg_json_ku64(&j, "total", d->total);
    if (count)
        gg_json_ku64(&j, "count", count);
    if (used > d->limit && !strcmp(ev, "near_miss"))
        gg_json_kbool(&j, "over_limit", true);
    gg_json_key(&j, "stack");
    gg_stack_json(&j, c->site);
    gg_journal_end(&j);
}

/* A hot loop in the near-miss zone must not flood the journal: per call site
 * the first 8 near misses are written, then the 16th, 32nd, 64th... each with
 * its running count. The table is small and lossy: a collision only resets
 * a count. */
#define NM_SLOTS 256
static struct {
    _Atomic uint64_t key; /* site << 8 | dev + 1 */
    _Atomic uint64_t count;
} nm_seen[NM_SLOTS];

static uint64_t near_miss_count(gg_site site, int dev)
{
    uint64_t key = ((uint64_t)site << 8 | (uint64_t)dev) + 1;
    unsigned i = (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 56) % NM_SLOTS;
    uint64_t old = atomic_load_explicit(&nm_seen[i].key, memory_order_relaxed);
    if (old != key) {
        atomic_store_explicit(&nm_seen[i].key, key, memory_order_relaxed);
        atomic_store_explicit(&nm_seen[i].count, 0, memory_order_relaxed);
    }
    return atomic_fetch_add_explicit(&nm_seen[i].count, 1, memory_order_relaxed) + 1;
}

/* A timeline point when the process's use moved by 1% of total. `read`:
 * take a fresh device reading for it; not on the free path, where the real
 * free has not happened yet and the reading would still hold the bytes. */
static void sample(struct gg_device *d, int dev, uint64_t cur, bool read)
{
    uint64_t step = d->total / 100;
    uint64_t last = atomic_load_explicit(&d->sample_current, memory_order_relaxed);
    uint64_t moved = cur > last ? cur - last : last - cur;
    if (gg_likely(moved <= step))
        return;
    /* One thread writes this sample; the others carry on. */
    if (!atomic_compare_exchange_strong_explicit(&d->sample_current, &last, cur,
                                                 memory_order_relaxed, memory_order_relaxed))
        return;
    uint64_t used = read ? refresh(d, dev, false) : estimate(d, dev);
    char buf[256];
    struct gg_json j;
    gg_journal_begin(&j, buf, sizeof buf, "sample");
    gg_json_ki64(&j, "dev", dev);
    gg_json_ku64(&j, "current", cur);
    gg_json_ku64(&j, "used", used);
    gg_journal_end(&j);
}

/* ---- the peak ------------------------------------------------------------ */

/* Which sites held the memory when each device's peak was set. Taken again at
 * every new peak; the table's entries are few and this is off the hot path
 * (a peak is set only while the process grows). */
#define PEAK_SITES 32
static struct {
    gg_spin lock;
    uint64_t peak;
    size_t n;
    struct gg_site_usage top[PEAK_SITES];
} peak_snap[GG_MAX_DEVICES];

static GG_COLD void peak_snapshot(int dev)
{
    uint64_t peak = atomic_load_explicit(&gg_ledger_counters[dev].peak, memory_order_relaxed);
    gg_spin_lock(&peak_snap[dev].lock);
    if (peak >= peak_snap[dev].peak) {
        peak_snap[dev].peak = peak;
        peak_snap[dev].n = gg_site_top(dev, peak_snap[dev].top, PEAK_SITES);
    }
    gg_spin_unlock(&peak_snap[dev].lock);
}

size_t gg_guard_peak_sites(int dev, struct gg_site_usage *out, size_t max)
{
    if ((unsigned)dev >= GG_MAX_DEVICES)
        return 0;
    gg_spin_lock(&peak_snap[dev].lock);
    size_t n = peak_snap[dev].n < max ? peak_snap[dev].n : max;
    memcpy(out, peak_snap[dev].top, n * sizeof *out);
    gg_spin_unlock(&peak_snap[dev].lock);
    return n;
}

/* ---- the hooks' questions ------------------------------------------------ */

bool gg_guard_admit(struct gg_call *c)
{
    struct gg_device *d = device(c->dev);
    c->site = GG_SITE_NONE;
    if (!d || d->mode == GG_MODE_OFF)
        return true;
    if (want_stack(d, false))
        c->site = capture(d, c->dev);
    if (!atomic_load_explicit(&d->enforcing, memory_order_relaxed) ||
        !(c->enforceable || d->policy.enforce == GG_ENFORCE_ALL))
        return true;
    uint64_t after = estimate(d, c->dev) + c->bytes;
    if (gg_likely(after + d->near <= d->limit))
        return true; /* far from the line: the estimate is enough */
    if (c->current)
        after = refresh(d, c->dev, true) + c->bytes;
    if (after <= d->limit)
        return true;
    atomic_fetch_add_explicit(&gg_ledger_counters[c->dev].refusals, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        c->site = capture(d, c->dev);
    incident("refused", d, c, after - c->bytes, 0);
    gg_advice_raise(c->dev, GG_REASON_REFUSED);
    return false;
}

void gg_guard_allocated(struct gg_call *c, uintptr_t ptr)
{
    struct gg_device *d = device(c->dev);
    if (!d || d->mode == GG_MODE_OFF || !ptr)
        return;
    struct gg_alloc a = {.ptr = ptr, .size = c->bytes, .site = c->site,
                         .dev = (int16_t)c->dev, .api = (uint8_t)c->api};
    uint64_t cur;
    bool new_peak;
    if (gg_unlikely(!gg_ledger_add(&a, &cur, &new_peak))) {
        gg_journal_error("out of memory for the ledger; counting stops, passing through");
        gg_passthrough();
        return;
    }
    if (c->site != GG_SITE_NONE)
        gg_site_charge(c->site, (int64_t)c->bytes, 1);
    uint64_t used = estimate(d, c->dev);
    gg_atomic_max(&d->peak_used, used);

    if (gg_unlikely(used + d->near > d->limit)) {
        if (c->current)
            used = refresh(d, c->dev, false);
        if (used + d->near > d->limit) {
            atomic_fetch_add_explicit(&gg_ledger_counters[c->dev].near_misses, 1,
                                      memory_order_relaxed);
            if (c->site == GG_SITE_NONE && want_stack(d, true))
                c->site = capture(d, c->dev);
            uint64_t n = near_miss_count(c->site, c->dev);
            if (n <= 8 || (n & (n - 1)) == 0)
                incident("near_miss", d, c, used, n);
            gg_advice_raise(c->dev, GG_REASON_NEAR_MISS);
        }
    }
    if (gg_unlikely(new_peak) && d->policy.stacks != GG_STACKS_OFF) {
        gg_site s = c->site != GG_SITE_NONE ? c->site : capture(d, c->dev);
        atomic_store_explicit(&d->peak_site, s, memory_order_relaxed);
        peak_snapshot(c->dev);
    }
    sample(d, c->dev, cur, c->current);
}

void gg_guard_failed(struct gg_call *c, bool oom)
{
    struct gg_device *d = device(c->dev);
    if (!d || d->mode == GG_MODE_OFF || !oom)
        return;
    atomic_fetch_add_explicit(&gg_ledger_counters[c->dev].ooms, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        c->site = capture(d, c->dev);
    uint64_t used = c->current ? refresh(d, c->dev, true) : estimate(d, c->dev);
    incident("oom", d, c, used, 0);
    gg_advice_raise(c->dev, GG_REASON_OOM);
}

bool gg_guard_release(uintptr_t ptr, struct gg_alloc *out)
{
    if (!ptr || !gg_ledger_remove(ptr, out))
        return false;
    if (out->site != GG_SITE_NONE)
        gg_site_charge(out->site, -(int64_t)out->size, -1);
    struct gg_device *d = device(out->dev);
    if (d)
        sample(d, out->dev, current_of(out->dev), false);
    return true;
}

void gg_guard_unrelease(const struct gg_alloc *a)
{
    gg_ledger_restore(a);
    if (a->site != GG_SITE_NONE)
        gg_site_charge(a->site, (int64_t)a->size, 1);
}

void gg_guard_meminfo(int dev, size_t *free_b, size_t *total_b)
{
    struct gg_device *d = device(dev);
    /* Only an enforcing device moves the line: observe changes nothing the
     * process sees. */
    if (!d || !atomic_load_explicit(&d->enforcing, memory_order_relaxed) ||
        !d->policy.virtualize_meminfo || !free_b || !total_b)
        return;
    if (*total_b < *free_b)
        return;
    uint64_t used = *total_b - *free_b;
    *total_b = d->limit;
    *free_b = d->limit > used ? d->limit - used : 0;
}

void gg_guard_trainer_registered(void)
{
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_device *d = device(i);
        bool no = false;
        if (!d || d->mode != GG_MODE_AUTO ||
            !atomic_compare_exchange_strong(&d->enforcing, &no, true))
            continue;
        char buf[256];
        struct gg_json j;
        gg_journal_begin(&j, buf, sizeof buf, "mode");
        gg_json_ki64(&j, "dev", i);
        gg_json_kstr(&j, "mode", "enforce");
        gg_json_kstr(&j, "why", "trainer registered");
        gg_journal_end(&j);
    }
}
