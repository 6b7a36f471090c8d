/* test_retry.c - a failure and its caller's next move (retry.c): the retry
 * of the same request that works is a recovery, with what was freed before
 * it (PyTorch's cache flush); the one that fails is the same request, raised;
 * another request, a quarter of a second's wait or the exit close it unretried; each
 * thread has its own; with every slot taken a failure is said at once. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "retry.h"
#include "unit.h"

#define MiB (1ULL << 20)

static struct gg_episode failure(int dev, uint64_t bytes, uint64_t reserved)
{
    struct gg_episode e;
    memset(&e, 0, sizeof e);
    e.call.dev = dev;
    e.call.bytes = bytes;
    e.verdict.incident = GG_INCIDENT_OOM;
    e.verdict.journal = true;
    e.ns = gg_now_ns();
    e.reserved = reserved;
    return e;
}

static void test_recovered_after_a_flush(void)
{
    gg_retry_reset();
    struct gg_episode now = failure(0, 296 * MiB, 20 * 1024 * MiB), e;
    bool retry, opened;
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e)); /* nothing to say yet */
    CHECK(opened && !retry);
    /* the guard marks this thread's retry of the same request */
    CHECK(gg_guard_retrying && gg_guard_retry_dev == 0 && gg_guard_retry_bytes == 296 * MiB);
    gg_retry_freed(20 * MiB);
    gg_retry_freed(200 * MiB);
    gg_retry_freed(2 * MiB);
    CHECK(gg_retry_allocated(&now.call, &e));
    CHECK(e.retried == GG_RETRY_RECOVERED);
    CHECK_EQ_U64(e.freed, 222 * MiB);
    CHECK_EQ_U64(e.freed_count, 3);
    CHECK_EQ_U64(e.freed_largest, 200 * MiB); /* smaller than the request: blocks too small */
    CHECK_EQ_U64(e.reserved, 20 * 1024 * MiB);
    CHECK(!gg_guard_retrying);
    CHECK(!gg_retry_allocated(&now.call, &e)); /* closed */
}

static void test_raised_and_unretried(void)
{
    gg_retry_reset();
    struct gg_episode now = failure(0, 64 * MiB, 0), e;
    bool retry, opened;
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e));
    gg_retry_freed(MiB);
    /* the same request fails again: that is the retry, and the episode is raised */
    CHECK(gg_retry_failed(&now, &retry, &opened, &e));
    CHECK(retry && !opened);
    CHECK(e.retried == GG_RETRY_RAISED && e.freed == MiB);
    CHECK(!gg_guard_retrying);
    /* a failure, then another request: the first was never retried */
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e));
    struct gg_call other = now.call;
    other.bytes = 2 * MiB;
    CHECK(gg_retry_allocated(&other, &e));
    CHECK(e.retried == GG_RETRY_NONE && e.call.bytes == 64 * MiB);
    /* a failure superseded by another failure: the first said, the second open */
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e));
    struct gg_episode second = failure(1, 8 * MiB, 0);
    CHECK(gg_retry_failed(&second, &retry, &opened, &e));
    CHECK(!retry && opened && e.retried == GG_RETRY_NONE && e.call.dev == 0);
    CHECK(gg_guard_retry_dev == 1);
    /* stale: none younger than a second is taken; the exit takes all */
    CHECK(!gg_retry_stale(gg_now_ns(), 1000000000ull, &e));
    CHECK(gg_retry_stale(gg_now_ns(), 0, &e));
    CHECK(e.retried == GG_RETRY_NONE && e.call.dev == 1);
    CHECK(!gg_retry_stale(gg_now_ns(), 0, &e));
    /* this thread's mark goes at its next look */
    CHECK(!gg_retry_allocated(&second.call, &e));
    CHECK(!gg_guard_retrying);
}

/* Expandable segments: the retry is a run of handles of the failed one's
 * size, then their mappings. It worked once they are mapped; one of the run
 * refused is the same request raised. */
static void test_a_vmm_retry(void)
{
    gg_retry_reset();
    struct gg_episode now = failure(0, 20 * MiB, 0), e;
    now.call.api_name = "cuMemCreate";
    bool retry, opened;
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e));
    gg_retry_freed(4 * 20 * MiB); /* the flush: mapped chunks the cache held */
    CHECK(!gg_retry_allocated(&now.call, &e)); /* the retry's first handles: not yet */
    CHECK(!gg_retry_allocated(&now.call, &e));
    CHECK(gg_guard_retrying);
    CHECK(gg_retry_mapped(&e));
    CHECK(e.retried == GG_RETRY_RECOVERED && e.freed == 80 * MiB);
    CHECK(!gg_guard_retrying);
    /* its run fails midway: raised */
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e));
    CHECK(!gg_retry_allocated(&now.call, &e));
    CHECK(gg_retry_failed(&now, &retry, &opened, &e));
    CHECK(retry && e.retried == GG_RETRY_RAISED);
    /* a run made and never mapped (the exit came first): it went on */
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e));
    CHECK(!gg_retry_allocated(&now.call, &e));
    CHECK(gg_retry_stale(gg_now_ns(), 0, &e));
    CHECK(e.retried == GG_RETRY_RECOVERED);
    CHECK(!gg_retry_mapped(&e));
}

/* Threads keep their own: one's retry is not another's. */
static _Atomic int thread_said;

static void *other_thread(void *arg)
{
    (void)arg;
    struct gg_episode now = failure(0, 64 * MiB, 0), e;
    bool retry, opened;
    if (gg_retry_failed(&now, &retry, &opened, &e))
        atomic_fetch_add(&thread_said, 1);
    gg_retry_freed(4 * MiB);
    return NULL; /* left open: the exit closes it */
}

static void test_threads_and_full_slots(void)
{
    gg_retry_reset();
    struct gg_episode now = failure(0, 64 * MiB, 0), e;
    bool retry, opened;
    CHECK(!gg_retry_failed(&now, &retry, &opened, &e));
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    CHECK(!atomic_load(&thread_said));
    gg_retry_freed(MiB);
    CHECK(gg_retry_allocated(&now.call, &e));
    CHECK(e.retried == GG_RETRY_RECOVERED && e.freed == MiB); /* not the other's 4 MiB */
    CHECK(gg_retry_stale(gg_now_ns(), 0, &e));
    CHECK(e.freed == 4 * MiB && e.retried == GG_RETRY_NONE);
    /* every slot taken (16 threads' failures): a failure is said at once */
    gg_retry_reset();
    pthread_t ts[16];
    for (int i = 0; i < 16; i++)
        pthread_create(&ts[i], NULL, other_thread, NULL);
    for (int i = 0; i < 16; i++)
        pthread_join(ts[i], NULL);
    CHECK(!atomic_load(&thread_said)); /* each had a slot */
    CHECK(gg_retry_failed(&now, &retry, &opened, &e));
    CHECK(!opened && e.retried == GG_RETRY_UNKNOWN);
    int closed = 0;
    while (gg_retry_stale(gg_now_ns(), 0, &e))
        closed++;
    CHECK_EQ_U64(closed, 16);
    gg_retry_reset();
}

int main(void)
{
    RUN(test_recovered_after_a_flush);
    RUN(test_raised_and_unretried);
    RUN(test_a_vmm_retry);
    RUN(test_threads_and_full_slots);
    return unit_done();
}
