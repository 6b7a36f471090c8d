/* test_ledger.c - the ledger against a reference, and exact under threads. */
#include <pthread.h>
#include <stdlib.h>

#include "ledger.h"
#include "unit.h"

/* Charges nothing: the site table is stack.c's, tested there. */
static struct gg_alloc mk(uintptr_t p, uint64_t size, int dev)
{
    struct gg_alloc a = {.ptr = p, .size = size, .dev = (int16_t)dev};
    return a;
}

static void test_add_remove_peak(void)
{
    gg_ledger_reset();
    uint64_t cur;
    bool peak;
    struct gg_alloc a = mk(0x1000, 1 << 30, 0), out;
    CHECK(gg_ledger_add(&a, &cur, &peak));
    CHECK_EQ_U64(cur, 1 << 30);
    CHECK(peak);
    a = mk(0x2000, 1 << 30, 0);
    CHECK(gg_ledger_add(&a, &cur, &peak));
    CHECK(gg_ledger_remove(0x1000, &out));
    CHECK_EQ_U64(out.size, 1 << 30);
    CHECK(!gg_ledger_remove(0x1000, &out)); /* twice: unknown */
    CHECK(!gg_ledger_remove(0x9999, &out));
    a = mk(0x3000, 2ull << 30, 0);
    CHECK(gg_ledger_add(&a, &cur, &peak));
    CHECK(peak);
    CHECK_EQ_U64(cur, 3ull << 30);
    struct gg_counters *c = &gg_ledger_counters[0];
    CHECK_EQ_U64(c->peak, 3ull << 30);
    CHECK_EQ_U64(gg_ledger_allocs(0), 3);
    CHECK_EQ_U64(gg_ledger_frees(0), 1);
}

static void test_devices_are_separate(void)
{
    gg_ledger_reset();
    uint64_t cur;
    bool peak;
    struct gg_alloc a = mk(0x10, 100, 0), b = mk(0x20, 200, 3), out;
    gg_ledger_add(&a, &cur, &peak);
    gg_ledger_add(&b, &cur, &peak);
    CHECK_EQ_U64(gg_ledger_counters[0].current, 100);
    CHECK_EQ_U64(gg_ledger_counters[3].current, 200);
    CHECK(gg_ledger_remove(0x20, &out));
    CHECK_EQ_U64(out.dev, 3);
    CHECK_EQ_U64(gg_ledger_counters[3].current, 0);
    CHECK_EQ_U64(gg_ledger_counters[3].peak, 200);
}

/* A pointer seen twice without a free in between replaces the old entry. */
static void test_reused_pointer_replaces(void)
{
    gg_ledger_reset();
    uint64_t cur;
    bool peak;
    struct gg_alloc a = mk(0x40, 100, 0), b = mk(0x40, 300, 0), out;
    gg_ledger_add(&a, &cur, &peak);
    gg_ledger_add(&b, &cur, &peak);
    CHECK_EQ_U64(cur, 300);
    CHECK_EQ_U64(gg_ledger_allocs(0) - gg_ledger_frees(0), 1);
    CHECK(gg_ledger_find(0x40, &out));
    CHECK_EQ_U64(out.size, 300);
}

/* Many keys through growth and backward-shift deletion, against a reference. */
static void test_restore(void)
{
    gg_ledger_reset();
    uint64_t cur;
    bool peak;
    struct gg_alloc a = mk(0x80, 1000, 2), out;
    gg_ledger_add(&a, &cur, &peak);
    CHECK(gg_ledger_remove(0x80, &out));
    gg_ledger_restore(&out); /* the real free failed */
    CHECK(gg_ledger_find(0x80, &out));
    CHECK_EQ_U64(gg_ledger_counters[2].current, 1000);
    CHECK_EQ_U64(gg_ledger_allocs(2), 1);
    CHECK_EQ_U64(gg_ledger_frees(2), 0);
}

static void test_against_reference(void)
{
    gg_ledger_reset();
    enum { N = 200000 };
    static unsigned char live[N];
    memset(live, 0, sizeof live);
    uint64_t cur, expect = 0;
    bool peak;
    unsigned seed = 12345;
    for (int step = 0; step < 3 * N; step++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % N);
        uintptr_t p = 0x700000000000ull + (uintptr_t)k * 512;
        struct gg_alloc out;
        if (live[k]) {
            CHECK(gg_ledger_remove(p, &out));
            CHECK_EQ_U64(out.size, (uint64_t)k + 1);
            live[k] = 0;
            expect -= (uint64_t)k + 1;
        } else {
            struct gg_alloc a = mk(p, (uint64_t)k + 1, 0);
            CHECK(gg_ledger_add(&a, &cur, &peak));
            live[k] = 1;
            expect += (uint64_t)k + 1;
        }
    }
    CHECK_EQ_U64(gg_ledger_counters[0].current, expect);
    uint64_t n = 0;
    for (int k = 0; k < N; k++) {
        struct gg_alloc out;
        bool found = gg_ledger_find(0x700000000000ull + (uintptr_t)k * 512, &out);
        CHECK(found == (bool)live[k]);
        n += live[k];
    }
    CHECK_EQ_U64(gg_ledger_allocs(0) - gg_ledger_frees(0), n);
    /* 24-byte entries at a load of 3/8..3/4, plus the empty shards */
    CHECK(gg_ledger_footprint() < n * 64 + (1 << 20));
}

enum { THREADS = 16, OPS = 20000 };

static void *worker(void *arg)
{
    uintptr_t base = 0x100000000ull * (1 + (uintptr_t)arg);
    for (int i = 0; i < OPS; i++) {
        uint64_t cur;
        bool peak;
        struct gg_alloc a = mk(base + (uintptr_t)(i % 64) * 4096, 4096, 1), out;
        if (!gg_ledger_add(&a, &cur, &peak))
            abort();
        if (!gg_ledger_remove(a.ptr, &out))
            abort();
    }
    /* one stays live per thread */
    uint64_t cur;
    bool peak;
    struct gg_alloc keep = mk(base + 1, 1 << 20, 1);
    gg_ledger_add(&keep, &cur, &peak);
    return NULL;
}

static void test_threads_exact(void)
{
    gg_ledger_reset();
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    struct gg_counters *c = &gg_ledger_counters[1];
    CHECK_EQ_U64(gg_ledger_allocs(1), THREADS * (OPS + 1));
    CHECK_EQ_U64(gg_ledger_frees(1), THREADS * OPS);
    CHECK_EQ_U64(c->current, THREADS * (1 << 20));
    CHECK(c->peak >= THREADS * (1 << 20));
    CHECK(c->peak <= THREADS * ((1 << 20) + 4096));
}

int main(void)
{
    RUN(test_add_remove_peak);
    RUN(test_devices_are_separate);
    RUN(test_reused_pointer_replaces);
    RUN(test_restore);
    RUN(test_against_reference);
    RUN(test_threads_exact);
    return unit_done();
}
