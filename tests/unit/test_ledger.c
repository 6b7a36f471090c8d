/* test_ledger.c - the ledger against a reference, exact under threads, its
 * restore after a racing free, and VMM handles that live while mapped. */
#include <pthread.h>
#include <stdlib.h>

#include "ledger.h"
#include "unit.h"

static struct gg_entry mk(uintptr_t key, uint64_t size, int dev)
{
    struct gg_entry e = {.key = key, .size = size, .dev = (uint8_t)dev};
    return e;
}

static void test_add_remove(void)
{
    gg_ledger_reset();
    struct gg_entry a = mk(0x1000, 1 << 30, 0), out, old;
    uint32_t ticket;
    CHECK(gg_ledger_add(&a, &old) == GG_LEDGER_ADDED);
    a = mk(0x2000, 1 << 30, 0);
    CHECK(gg_ledger_add(&a, &old) == GG_LEDGER_ADDED);
    CHECK(gg_ledger_remove(0x1000, &out, &ticket));
    CHECK_EQ_U64(out.size, 1 << 30);
    CHECK(!gg_ledger_remove(0x1000, &out, &ticket)); /* twice: unknown */
    CHECK(!gg_ledger_remove(0x9999, &out, &ticket));
    CHECK_EQ_U64(gg_ledger_allocs(0), 2);
    CHECK_EQ_U64(gg_ledger_frees(0), 1);
}

static void test_devices_are_separate(void)
{
    gg_ledger_reset();
    struct gg_entry a = mk(0x10, 100, 0), b = mk(0x20, 200, 3), out, old;
    gg_ledger_add(&a, &old);
    gg_ledger_add(&b, &old);
    CHECK(gg_ledger_remove(0x20, &out, NULL));
    CHECK_EQ_U64(out.dev, 3);
    CHECK_EQ_U64(gg_ledger_allocs(3) - gg_ledger_frees(3), 0);
    CHECK_EQ_U64(gg_ledger_allocs(0) - gg_ledger_frees(0), 1);
    /* memory of no device (a host pool's) is known, and in no device's counts */
    struct gg_entry h = mk(0x30, 0, GG_LEDGER_NO_DEVICE);
    gg_ledger_add(&h, &old);
    CHECK(gg_ledger_find(0x30, &out) && out.dev == GG_LEDGER_NO_DEVICE);
    CHECK(gg_ledger_remove(0x30, &out, NULL));
    CHECK_EQ_U64(gg_ledger_allocs(GG_LEDGER_NO_DEVICE), 1);
    CHECK_EQ_U64(gg_ledger_frees(GG_LEDGER_NO_DEVICE), 1);
    for (int d = 0; d < GG_MAX_DEVICES; d++)
        CHECK_EQ_U64(gg_ledger_allocs(d), d == 0 || d == 3 ? 1 : 0);
    CHECK_EQ_U64(gg_ledger_allocs(GG_LEDGER_NO_DEVICE + 1), 0);
}

/* A key seen twice without a free in between replaces the old entry, and
 * the caller is told what was evicted. */
static void test_reused_key_replaces(void)
{
    gg_ledger_reset();
    struct gg_entry a = mk(0x40, 100, 0), b = mk(0x40, 300, 0), out, old;
    CHECK(gg_ledger_add(&a, &old) == GG_LEDGER_ADDED);
    CHECK(gg_ledger_add(&b, &old) == GG_LEDGER_REPLACED);
    CHECK_EQ_U64(old.size, 100);
    CHECK_EQ_U64(gg_ledger_allocs(0) - gg_ledger_frees(0), 1);
    CHECK(gg_ledger_find(0x40, &out));
    CHECK_EQ_U64(out.size, 300);
}

static void test_restore(void)
{
    gg_ledger_reset();
    struct gg_entry a = mk(0x80, 1000, 2), out, old;
    uint32_t ticket;
    gg_ledger_add(&a, &old);
    CHECK(gg_ledger_remove(0x80, &out, &ticket));
    CHECK(gg_ledger_restore(&out, ticket)); /* the real free failed */
    CHECK(gg_ledger_find(0x80, &out));
    CHECK_EQ_U64(gg_ledger_allocs(2), 1);
    CHECK_EQ_U64(gg_ledger_frees(2), 0);
}

/* Two threads free the same pointer: one removes it, the other finds it
 * unknown and its real free succeeds; then the first one's real free fails.
 * Putting the entry back would leave a phantom allocation. */
static void test_no_phantom_after_a_racing_free(void)
{
    gg_ledger_reset();
    struct gg_entry a = mk(0x8000, 4096, 0), out, old;
    uint32_t ticket;
    gg_ledger_add(&a, &old);
    CHECK(gg_ledger_remove(0x8000, &out, &ticket)); /* thread A */
    CHECK(!gg_ledger_remove(0x8000, &old, NULL));   /* thread B: unknown... */
    gg_ledger_unknown_freed(0x8000);                /* ...and its free worked */
    CHECK(!gg_ledger_restore(&out, ticket));        /* A's free failed: not put back */
    CHECK(!gg_ledger_find(0x8000, &old));
    /* an unrelated unknown free in the same shard does not stop a restore */
    struct gg_entry b = mk(0x9000, 10, 0);
    gg_ledger_add(&b, &old);
    CHECK(gg_ledger_remove(0x9000, &out, &ticket));
    gg_ledger_unknown_freed(0x1234500);
    CHECK(gg_ledger_restore(&out, ticket));
}

/* A handle released while mapped keeps its memory until the last unmap. */
static void test_vmm_handle_lives_while_mapped(void)
{
    gg_ledger_reset();
    uintptr_t key = gg_ledger_handle_key(7);
    struct gg_entry h = mk(key, 2 << 20, 1), out, old;
    gg_ledger_add(&h, &old);
    CHECK(!gg_ledger_map(key, +1, &out));
    CHECK(!gg_ledger_map(key, +1, &out)); /* mapped twice */
    CHECK(gg_ledger_release(key, &out) == GG_LEDGER_KEPT);
    CHECK(gg_ledger_find(key, &out));
    CHECK(out.flags & GG_ENTRY_RELEASED);
    CHECK(!gg_ledger_map(key, -1, &out)); /* one mapping left */
    CHECK(gg_ledger_map(key, -1, &out));  /* the last: gone */
    CHECK_EQ_U64(out.size, 2 << 20);
    CHECK(!gg_ledger_find(key, &out));
    CHECK_EQ_U64(gg_ledger_allocs(1) - gg_ledger_frees(1), 0);
    /* unmapped first, then released: gone at the release */
    gg_ledger_add(&h, &old);
    gg_ledger_map(key, +1, &out);
    CHECK(!gg_ledger_map(key, -1, &out));
    CHECK(gg_ledger_release(key, &out) == GG_LEDGER_GONE);
    CHECK(gg_ledger_release(key, &out) == GG_LEDGER_UNKNOWN);
}

/* Many keys through growth and backward-shift deletion, against a reference. */
static void test_against_reference(void)
{
    gg_ledger_reset();
    enum { N = 200000 };
    static unsigned char live[N];
    memset(live, 0, sizeof live);
    uint64_t expect = 0, held = 0;
    unsigned seed = 12345;
    for (int step = 0; step < 3 * N; step++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % N);
        uintptr_t p = 0x700000000000ull + (uintptr_t)k * 512;
        struct gg_entry out, old;
        if (live[k]) {
            CHECK(gg_ledger_remove(p, &out, NULL));
            CHECK_EQ_U64(out.size, (uint64_t)k + 1);
            live[k] = 0;
            expect -= (uint64_t)k + 1;
        } else {
            struct gg_entry a = mk(p, (uint64_t)k + 1, 0);
            CHECK(gg_ledger_add(&a, &old) == GG_LEDGER_ADDED);
            live[k] = 1;
            expect += (uint64_t)k + 1;
        }
    }
    uint64_t n = 0;
    for (int k = 0; k < N; k++) {
        struct gg_entry out;
        bool found = gg_ledger_find(0x700000000000ull + (uintptr_t)k * 512, &out);
        CHECK(found == (bool)live[k]);
        n += live[k];
        held += found ? out.size : 0;
    }
    CHECK_EQ_U64(held, expect);
    CHECK_EQ_U64(gg_ledger_allocs(0) - gg_ledger_frees(0), n);
    /* 24-byte entries at a load of 3/8..3/4, plus the empty shards */
    CHECK(gg_ledger_footprint() < n * 64 + (1 << 20));
}

enum { THREADS = 16, OPS = 20000 };

static void *worker(void *arg)
{
    uintptr_t base = 0x100000000ull * (1 + (uintptr_t)arg);
    for (int i = 0; i < OPS; i++) {
        struct gg_entry a = mk(base + (uintptr_t)(i % 64) * 4096, 4096, 1), out, old;
        if (gg_ledger_add(&a, &old) != GG_LEDGER_ADDED)
            abort();
        if (!gg_ledger_remove(a.key, &out, NULL))
            abort();
    }
    /* one stays live per thread */
    struct gg_entry keep = mk(base + 1, 1 << 20, 1), old;
    gg_ledger_add(&keep, &old);
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
    CHECK_EQ_U64(gg_ledger_allocs(1), THREADS * (OPS + 1));
    CHECK_EQ_U64(gg_ledger_frees(1), THREADS * OPS);
    for (long i = 0; i < THREADS; i++) {
        struct gg_entry out;
        CHECK(gg_ledger_find(0x100000000ull * (1 + (uintptr_t)i) + 1, &out));
    }
}

int main(void)
{
    RUN(test_add_remove);
    RUN(test_devices_are_separate);
    RUN(test_reused_key_replaces);
    RUN(test_restore);
    RUN(test_no_phantom_after_a_racing_free);
    RUN(test_vmm_handle_lives_while_mapped);
    RUN(test_against_reference);
    RUN(test_threads_exact);
    return unit_done();
}
