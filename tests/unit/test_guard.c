/* test_guard.c - the decisions (guard.c) on devices set up by hand: no
 * driver is loaded, so readings fail and the estimate is what counts. */
#include <gnu/libc-version.h>
#include <string.h>

#include "device.h"
#include "guard.h"
#include "ledger.h"
#include "maps.h"
#include "pools.h"
#include "unit.h"

#define GiB (1ULL << 30)
#define MiB (1ULL << 20)

/* An address inside libc itself: a function of libc's own that no
 * sanitizer intercepts. */
static uintptr_t libc_ip(void)
{
    return (uintptr_t)&gnu_get_libc_version + 4;
}

static struct gg_device *setup(uint8_t mode, uint8_t enforce)
{
    gg_devices_reset();
    gg_ledger_reset();
    gg_maps_reset();
    gg_pools_reset();
    struct gg_device *d = &gg_devices[0];
    d->present = true;
    d->mode = mode;
    d->enforce = enforce;
    d->stacks = GG_STACKS_OFF;
    d->depth = 32;
    d->virtualize_meminfo = true;
    d->total = 24 * GiB;
    d->limit = 22 * GiB;
    d->near = 1 * GiB;
    atomic_store(&d->enforcing, mode == GG_MODE_ENFORCE);
    atomic_store(&d->read_once, true);
    gg_device_count = 1;
    return d;
}

static struct gg_call call(uint64_t bytes, uint8_t refusable)
{
    struct gg_call c = {.dev = 0, .api = 1, .refusable = refusable, .api_name = "cudaMalloc",
                        .bytes = bytes};
    return c;
}

static bool alloc(uintptr_t p, uint64_t bytes, struct gg_verdict *v)
{
    struct gg_call c = call(bytes, GG_REFUSABLE);
    if (!gg_guard_admit(&c, v))
        return false;
    gg_guard_allocated(&c, p, v);
    return true;
}

static void test_line(void)
{
    struct gg_device *d = setup(GG_MODE_ENFORCE, GG_ENFORCE_RUNTIME);
    struct gg_verdict v;
    CHECK(alloc(0x1000, 20 * GiB, &v));
    CHECK(v.incident == GG_INCIDENT_NONE);
    CHECK(alloc(0x2000, 1536 * MiB, &v)); /* 21.5 GiB: past limit - near */
    CHECK(v.incident == GG_INCIDENT_NEAR_MISS && v.journal && v.count == 1);
    CHECK(!alloc(0x3000, 1 * GiB, &v)); /* 22.5 GiB: refused */
    CHECK(v.incident == GG_INCIDENT_REFUSED && v.used == 21 * GiB + 512 * MiB);
    CHECK_EQ_U64(atomic_load(&d->refusals), 1);
    CHECK_EQ_U64(atomic_load(&d->near_misses), 1);
    /* another process's 1 GiB (the last reading): refused earlier */
    atomic_store(&d->used_offset, (int64_t)GiB);
    CHECK(!alloc(0x3000, 512 * MiB, &v));
    /* a size near the top of the range cannot wrap past the line */
    atomic_store(&d->used_offset, 0);
    CHECK(!alloc(0x4000, UINT64_MAX - 10, &v));
    CHECK(v.incident == GG_INCIDENT_REFUSED);
}

/* A call whose return address lies in libc, and one from this test. */
static struct gg_call from(uintptr_t ra, uint64_t bytes, uint8_t refusable)
{
    struct gg_call c = call(bytes, refusable);
    c.caller = ra;
    return c;
}

static void test_who_may_be_refused(void)
{
    struct gg_device *d = setup(GG_MODE_ENFORCE, GG_ENFORCE_RUNTIME);
    d->never_refuse = "libnccl*,libc.so*";
    struct gg_verdict v;
    struct gg_call managed = call(30 * GiB, GG_REFUSABLE_NEVER);
    struct gg_call libc = from(libc_ip(), 30 * GiB, GG_REFUSABLE);
    struct gg_call mine = from((uintptr_t)&test_line + 4, 30 * GiB, GG_REFUSABLE);
    struct gg_call nowhere = from(0, 30 * GiB, GG_REFUSABLE);
    CHECK(gg_guard_admit(&managed, &v));
    CHECK(!v.spared);
    CHECK(gg_guard_admit(&libc, &v)); /* the module that asked is never refused */
    CHECK(v.spared);
    gg_guard_allocated(&libc, 0x100, &v); /* counted: a near miss past the limit */
    CHECK(v.incident == GG_INCIDENT_NEAR_MISS && v.over_limit && v.spared);
    CHECK_EQ_U64(atomic_load(&d->current), 30 * GiB);
    CHECK(!gg_guard_admit(&mine, &v)); /* this program may be refused */
    CHECK(v.incident == GG_INCIDENT_REFUSED && !v.spared);
    CHECK(!gg_guard_admit(&nowhere, &v)); /* no module: refusable */
    d->never_refuse = "test_guard";
    CHECK(gg_guard_admit(&mine, &v) && v.spared);
    d = setup(GG_MODE_ENFORCE, GG_ENFORCE_ALL);
    d->never_refuse = "libnccl*,libc.so*";
    CHECK(gg_guard_admit(&managed, &v)); /* never, even under enforce = all */
    CHECK(!gg_guard_admit(&libc, &v));   /* all: every module */
    CHECK(!gg_guard_admit(&mine, &v));
}

static void test_observe_and_auto(void)
{
    struct gg_device *d = setup(GG_MODE_AUTO, GG_ENFORCE_RUNTIME);
    struct gg_verdict v;
    size_t f = 1 * GiB, t = 24 * GiB;
    CHECK(alloc(0x1000, 23 * GiB, &v)); /* past the line: observed */
    CHECK(v.incident == GG_INCIDENT_NEAR_MISS && v.over_limit);
    gg_guard_meminfo(0, &f, &t);
    CHECK_EQ_U64(t, 24 * GiB); /* untouched until enforcing */
    CHECK_EQ_U64(gg_guard_trainer_registered(), 1);
    CHECK_EQ_U64(gg_guard_trainer_registered(), 0); /* once */
    CHECK(atomic_load(&d->enforcing));
    CHECK(!alloc(0x2000, GiB, &v));
    gg_guard_meminfo(0, &f, &t);
    CHECK_EQ_U64(t, 22 * GiB);
    CHECK_EQ_U64(f, 0); /* never wraps */
    setup(GG_MODE_OBSERVE, GG_ENFORCE_RUNTIME);
    CHECK_EQ_U64(gg_guard_trainer_registered(), 0); /* observe stays observe */
}

static void test_near_miss_sampling(void)
{
    setup(GG_MODE_OBSERVE, GG_ENFORCE_RUNTIME);
    struct gg_verdict v;
    CHECK(alloc(0x1, 21 * GiB + 512 * MiB, &v));
    int written = 0, expect = 0;
    for (uintptr_t i = 0; i < 100; i++) {
        CHECK(alloc(0x1000 + i * 16, MiB, &v));
        CHECK(v.incident == GG_INCIDENT_NEAR_MISS);
        written += v.journal;
        expect += v.count <= 8 || (v.count & (v.count - 1)) == 0;
        struct gg_entry e;
        uint32_t ticket;
        CHECK(gg_guard_release(0x1000 + i * 16, &e, &ticket, &v));
    }
    /* per site the first 8 near misses are written, then the 16th, 32nd... */
    CHECK_EQ_U64(written, expect);
    CHECK(expect >= 3 && expect <= 10);
}

static void test_release_and_windows(void)
{
    struct gg_device *d = setup(GG_MODE_ENFORCE, GG_ENFORCE_RUNTIME);
    struct gg_verdict v;
    struct gg_entry e;
    uint32_t ticket;
    CHECK(alloc(0x10, 3 * GiB, &v));
    CHECK(alloc(0x20, 2 * GiB, &v));
    CHECK(gg_guard_release(0x10, &e, &ticket, &v));
    CHECK_EQ_U64(atomic_load(&d->current), 2 * GiB);
    CHECK(!gg_guard_release(0x10, &e, &ticket, &v)); /* unknown now */
    CHECK(gg_guard_release(0x20, &e, &ticket, &v));
    gg_guard_unrelease(&e, ticket); /* its real free failed */
    CHECK_EQ_U64(atomic_load(&d->current), 2 * GiB);
    struct gg_window w;
    gg_device_close_window(d, &w);
    CHECK_EQ_U64(w.peak, 5 * GiB);
    CHECK_EQ_U64(w.live, 2 * GiB);
    CHECK(alloc(0x30, GiB, &v));
    gg_device_close_window(d, &w);
    CHECK_EQ_U64(w.peak, 3 * GiB); /* this window's, not the all-time one */
    CHECK_EQ_U64(gg_device_peak(d), 5 * GiB);
    gg_device_close_phase(d, &w);
    CHECK_EQ_U64(w.peak, 5 * GiB); /* the phase holds both windows */
    gg_device_close_phase(d, &w);
    CHECK_EQ_U64(w.peak, 3 * GiB); /* a new phase starts from what is live */
}

static void test_vmm(void)
{
    struct gg_device *d = setup(GG_MODE_ENFORCE, GG_ENFORCE_RUNTIME);
    struct gg_verdict v;
    uintptr_t key = gg_ledger_handle_key(42);
    CHECK(alloc(key, 2 * GiB, &v));
    gg_guard_mapped(0x7f0000000000, GiB, key);
    gg_guard_mapped(0x7f0040000000, GiB, key);
    CHECK(gg_guard_release_handle(key, &v));
    CHECK_EQ_U64(atomic_load(&d->current), 2 * GiB); /* still mapped */
    gg_guard_unmapped(0x7f0000000000, 2 * GiB, &v); /* one unmap over both */
    CHECK_EQ_U64(atomic_load(&d->current), 0);
    CHECK(!gg_guard_release_handle(key, &v));
}

static void test_peak_sites(void)
{
    struct gg_device *d = setup(GG_MODE_ENFORCE, GG_ENFORCE_RUNTIME);
    d->stacks = GG_STACKS_ALL;
    struct gg_verdict v;
    CHECK(alloc(0x10, GiB, &v));
    CHECK(atomic_load(&d->peak_site) != GG_SITE_NONE);
    struct gg_site_usage top[4];
    size_t n = gg_guard_peak_sites(0, top, 4);
    CHECK_EQ_U64(n, 1);
    CHECK_EQ_U64(top[0].bytes, GiB);
}

/* A pool's request (no driver here: the shim's own figures are all there
 * is). */
static bool pool_alloc(uint64_t pool, uintptr_t p, uint64_t bytes, struct gg_verdict *v)
{
    struct gg_call c = call(bytes, GG_REFUSABLE);
    CHECK(gg_guard_pool(&c, pool, 0, true));
    if (!gg_guard_admit(&c, v))
        return false;
    gg_guard_allocated(&c, p, v);
    return true;
}

static void test_pools_as_the_device_sees_them(void)
{
    struct gg_device *d = setup(GG_MODE_ENFORCE, GG_ENFORCE_RUNTIME);
    struct gg_verdict v;
    struct gg_entry e;
    uint32_t ticket;
    uint64_t pool = 0x5000;
    CHECK(alloc(0x10, 11 * GiB, &v));
    CHECK(pool_alloc(pool, 0x20, 10 * GiB, &v)); /* the pool grows: 21 GiB on the device */
    CHECK_EQ_U64(atomic_load(&d->current), 21 * GiB);
    CHECK(gg_guard_release(0x20, &e, &ticket, &v)); /* back to the pool: still on the device */
    CHECK_EQ_U64(atomic_load(&d->current), 21 * GiB);
    CHECK_EQ_U64(atomic_load(&d->pool_reserved), 10 * GiB);
    CHECK_EQ_U64(atomic_load(&d->pool_used), 0);
    CHECK(!alloc(0x30, 2 * GiB, &v)); /* 23 GiB: refused */
    atomic_store(&d->used_offset, (int64_t)(2 * GiB)); /* others push the device past the line */
    CHECK(pool_alloc(pool, 0x40, 10 * GiB, &v)); /* served from what the pool holds */
    CHECK(v.incident == GG_INCIDENT_NONE);       /* and no near miss: nothing grew */
    CHECK(gg_guard_release(0x40, &e, &ticket, &v));
    CHECK(pool_alloc(pool, 0x50, 4 * GiB, &v));
    CHECK(!pool_alloc(pool, 0x60, 7 * GiB, &v)); /* needs 1 GiB more than it holds: refused */
    CHECK(v.incident == GG_INCIDENT_REFUSED);
    /* a trim without the driver's word: down to what is handed out */
    gg_guard_pool_trimmed(pool, 0, &v);
    CHECK_EQ_U64(atomic_load(&d->current), 15 * GiB);
    CHECK_EQ_U64(atomic_load(&d->pool_reserved), 4 * GiB);
    /* destroyed with 4 GiB out: it leaves the device with its allocation */
    CHECK(pool_alloc(pool, 0x70, GiB, &v));
    CHECK(gg_guard_release(0x70, &e, &ticket, &v));
    gg_guard_pool_destroyed(pool, &v);
    CHECK_EQ_U64(atomic_load(&d->current), 15 * GiB);
    CHECK(gg_guard_release(0x50, &e, &ticket, &v));
    CHECK_EQ_U64(atomic_load(&d->current), 11 * GiB);
    CHECK_EQ_U64(atomic_load(&d->pool_reserved), 0);
    CHECK_EQ_U64(atomic_load(&d->peak_pool_reserved), 10 * GiB);
    /* a host pool is passed by: never counted, and its free is no surprise */
    gg_guard_pool_created(0x6000, 0, true);
    struct gg_call h = call(100 * GiB, GG_REFUSABLE);
    CHECK(!gg_guard_pool(&h, 0x6000, 0, true));
    uint64_t allocs = gg_ledger_allocs(0);
    gg_guard_host_allocated(0x80);
    CHECK(gg_guard_release(0x80, &e, &ticket, &v));
    CHECK_EQ_U64(gg_ledger_allocs(0), allocs);
    CHECK_EQ_U64(atomic_load(&d->current), 11 * GiB);
}

/* A pool made on device 1 holds device 1's memory, whoever allocates. */
static void test_pool_device(void)
{
    setup(GG_MODE_ENFORCE, GG_ENFORCE_RUNTIME);
    gg_devices[1] = gg_devices[0];
    gg_device_count = 2;
    gg_guard_pool_created(0x9000, 1, false);
    struct gg_call c = call(3 * GiB, GG_REFUSABLE);
    CHECK(gg_guard_pool(&c, 0x9000, 0, true));
    CHECK_EQ_U64(c.dev, 1);
    struct gg_verdict v;
    CHECK(gg_guard_admit(&c, &v));
    gg_guard_allocated(&c, 0x10, &v);
    CHECK_EQ_U64(atomic_load(&gg_devices[1].current), 3 * GiB);
    CHECK_EQ_U64(atomic_load(&gg_devices[0].current), 0);
    /* an allocation's device is the pool's, whatever the current pool cache says */
    gg_guard_current_pool(0, 0x9000);
    struct gg_call a = call(GiB, GG_REFUSABLE);
    CHECK(gg_guard_pool(&a, 0, 0, true) && a.dev == 1);
}

int main(void)
{
    RUN(test_line);
    RUN(test_who_may_be_refused);
    RUN(test_observe_and_auto);
    RUN(test_near_miss_sampling);
    RUN(test_release_and_windows);
    RUN(test_vmm);
    RUN(test_peak_sites);
    RUN(test_pools_as_the_device_sees_them);
    RUN(test_pool_device);
    return unit_done();
}
