/* test_pools.c - stream-ordered pools as the device sees them (pools.c): the
 * rig's driver model (tests/fake/README.md, "Stream-ordered pools") step by
 * step, slots and handles, and threads sharing a pool. */
#include <pthread.h>
#include <stdatomic.h>

#include "pools.h"
#include "unit.h"

#define GiB (1ULL << 30)
#define MiB (1ULL << 20)

static struct gg_pool_figures fig(unsigned s)
{
    struct gg_pool_figures f = {0};
    CHECK(gg_pools_figures(s, &f));
    return f;
}

static void test_served_from_what_it_holds(void)
{
    gg_pools_reset();
    unsigned s = gg_pools_get(0x7000, 1, false);
    CHECK(s != GG_POOL_NONE);
    CHECK_EQ_U64(gg_pools_get(0x7000, 0, true), s); /* known: the first registration holds */
    CHECK_EQ_U64(gg_pools_find(0x7000), s);
    int dev;
    bool host;
    CHECK(gg_pools_where(s, &dev, &host) && dev == 1 && !host);
    CHECK_EQ_U64(gg_pools_growth(s, 4 * GiB), 4 * GiB);
    CHECK_EQ_U64(gg_pools_allocated(s, 4 * GiB), 4 * GiB); /* grew */
    CHECK_EQ_U64(gg_pools_freed(s, 4 * GiB), 0);           /* back to the pool, not the device */
    CHECK_EQ_U64(fig(s).reserved, 4 * GiB);
    CHECK_EQ_U64(fig(s).used, 0);
    CHECK_EQ_U64(gg_pools_growth(s, 3 * GiB), 0);          /* served from what it holds */
    CHECK_EQ_U64(gg_pools_allocated(s, 3 * GiB), 0);
    CHECK_EQ_U64(gg_pools_growth(s, 2 * GiB), GiB);        /* only what is missing */
    CHECK_EQ_U64(gg_pools_allocated(s, 2 * GiB), GiB);
    CHECK_EQ_U64(fig(s).reserved, 5 * GiB);
    CHECK_EQ_U64(fig(s).used, 5 * GiB);
    CHECK_EQ_U64(fig(s).peak_reserved, 5 * GiB);
}

static void test_trim_sync_and_readings(void)
{
    gg_pools_reset();
    unsigned s = gg_pools_get(0x7000, 0, false);
    gg_pools_allocated(s, 3 * GiB);
    gg_pools_freed(s, 3 * GiB);
    gg_pools_allocated(s, 256 * MiB);
    /* trimmed to 512 MiB: down to max(keep, used) */
    CHECK_EQ_U64(gg_pools_trimmed(s, 512 * MiB), -(int64_t)(3 * GiB - 512 * MiB));
    CHECK_EQ_U64(gg_pools_trimmed(s, 0), -(int64_t)(256 * MiB));
    CHECK_EQ_U64(fig(s).reserved, 256 * MiB);
    CHECK_EQ_U64(gg_pools_trimmed(s, 4 * GiB), 0); /* a trim never grows it */
    /* what the driver says is believed (its granularity), but never below
     * what was handed out */
    CHECK_EQ_U64(gg_pools_observed(s, 2 * GiB), 2 * GiB - 256 * MiB);
    CHECK_EQ_U64(gg_pools_observed(s, 0), -(int64_t)(2 * GiB - 256 * MiB));
    CHECK_EQ_U64(fig(s).reserved, 256 * MiB);
    CHECK_EQ_U64(fig(s).peak_reserved, 3 * GiB);
}

static void test_destroyed_with_allocations_out(void)
{
    gg_pools_reset();
    unsigned s = gg_pools_get(0x7000, 0, false), again;
    gg_pools_allocated(s, 2 * GiB);
    gg_pools_allocated(s, GiB);
    gg_pools_freed(s, GiB); /* 3 GiB held, 2 GiB out */
    CHECK_EQ_U64(gg_pools_destroyed(0x7000, &again), -(int64_t)GiB); /* its free bytes, now */
    CHECK_EQ_U64(again, s);
    CHECK_EQ_U64(gg_pools_find(0x7000), GG_POOL_NONE); /* the handle is dead at once */
    CHECK(fig(s).destroyed);
    /* a new pool may get the old handle while the old one drains */
    unsigned t = gg_pools_get(0x7000, 1, false);
    CHECK(t != GG_POOL_NONE && t != s);
    CHECK_EQ_U64(gg_pools_freed(s, GiB), GiB); /* the rest leaves with its allocations */
    CHECK_EQ_U64(gg_pools_freed(s, GiB), GiB);
    struct gg_pool_figures f;
    CHECK(!gg_pools_figures(s, &f)); /* drained: the slot is free */
    CHECK_EQ_U64(gg_pools_find(0x7000), t);
    unsigned u;
    CHECK_EQ_U64(gg_pools_destroyed(0x9999, &u), 0);
    CHECK_EQ_U64(u, GG_POOL_NONE);
}

static void test_host_and_table(void)
{
    gg_pools_reset();
    unsigned h = gg_pools_get(0x8000, 0, true);
    int dev;
    bool host;
    CHECK(gg_pools_where(h, &dev, &host) && host && dev == -1);
    CHECK_EQ_U64(gg_pools_get(0, 0, false), GG_POOL_NONE); /* no handle */
    CHECK_EQ_U64(gg_pools_find(1), GG_POOL_NONE);
    /* the table fills, then says so; a destroyed, drained slot is taken again */
    unsigned n = 1;
    for (uint64_t p = 0x10000; gg_pools_get(p, 0, false) != GG_POOL_NONE; p += 0x100)
        n++;
    CHECK_EQ_U64(n, GG_POOLS);
    unsigned s;
    gg_pools_destroyed(0x10000, &s);
    CHECK(s != GG_POOL_NONE);
    CHECK_EQ_U64(gg_pools_get(0xfff000, 0, false), s);
    unsigned live = 0;
    for (unsigned k = gg_pools_next(GG_POOL_NONE); k != GG_POOL_NONE; k = gg_pools_next(k))
        live++;
    CHECK_EQ_U64(live, GG_POOLS);
}

/* Threads allocating and freeing from one pool: whatever the order, the
 * pool ends holding its high-water mark and nothing handed out, and the
 * growth it reported adds up to what it holds. */
#define THREADS 4
#define ROUNDS 20000
static unsigned shared;
static _Atomic int64_t grown;

static void *worker(void *arg)
{
    uint64_t size = (uintptr_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        atomic_fetch_add(&grown, (int64_t)gg_pools_allocated(shared, size));
        atomic_fetch_add(&grown, -(int64_t)gg_pools_freed(shared, size));
    }
    return NULL;
}

static void test_threads(void)
{
    gg_pools_reset();
    shared = gg_pools_get(0x7000, 0, false);
    atomic_store(&grown, 0);
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)((i + 1) * MiB));
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    struct gg_pool_figures f = fig(shared);
    CHECK_EQ_U64(f.used, 0);
    CHECK_EQ_U64(f.reserved, (uint64_t)atomic_load(&grown));
    CHECK(f.reserved <= 10 * MiB); /* never more than all of them at once */
    CHECK(f.reserved >= 4 * MiB);
}

int main(void)
{
    RUN(test_served_from_what_it_holds);
    RUN(test_trim_sync_and_readings);
    RUN(test_destroyed_with_allocations_out);
    RUN(test_host_and_table);
    RUN(test_threads);
    return unit_done();
}
