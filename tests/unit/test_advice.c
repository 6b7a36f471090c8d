/* test_advice.c - the advice protocol's arithmetic and state, without a
 * journal: halve the batch, keep batch x accumulation, re-arm on ack. */
#include <pthread.h>
#include <signal.h>

#include "advice.h"
#include "gpuguard.h"
#include "guard.h"
#include "unit.h"

static struct gpuguard_advice last(void)
{
    struct gpuguard_advice a;
    memset(&a, 0, sizeof a);
    gg_advice_pending(&a);
    return a;
}

static void setup(int batch, int accum, int min)
{
    gg_device_count = 1;
    gg_devices[0].present = true;
    gg_policy_defaults(&gg_devices[0].policy);
    gg_devices[0].policy.signal = 0;
    gg_devices[0].policy.min_batch_size = min;
    struct gpuguard_advice a;
    if (gg_advice_pending(&a))
        gg_advice_ack(a.seq); /* clear what an earlier test left */
    gg_advice_set_batch(batch, accum);
}

static void test_halve_and_keep_effective(void)
{
    setup(32, 1, 1);
    gg_advice_raise(0, GG_REASON_NEAR_MISS);
    struct gpuguard_advice a = last();
    CHECK_EQ_U64(a.batch_size, 16);
    CHECK_EQ_U64(a.grad_accum, 2);
    CHECK_STR(a.reason, "near_miss");
    setup(5, 3, 1);
    gg_advice_raise(0, GG_REASON_OOM);
    a = last();
    CHECK_EQ_U64(a.batch_size, 2);
    CHECK_EQ_U64(a.grad_accum, 8); /* 2 x 8 >= 5 x 3 */
    CHECK_STR(a.reason, "oom");
}

static void test_zone_once_per_ack(void)
{
    setup(32, 1, 1);
    gg_advice_raise(0, GG_REASON_NEAR_MISS);
    unsigned first = last().seq;
    gg_advice_raise(0, GG_REASON_NEAR_MISS);
    CHECK_EQ_U64(last().seq, first); /* no second zone advice */
    gg_advice_raise(0, GG_REASON_REFUSED);
    CHECK_EQ_U64(last().seq, first + 1); /* a refusal always advises */
    gg_advice_ack(first + 1);
    CHECK(!gg_advice_pending(NULL));
    gg_advice_raise(0, GG_REASON_NEAR_MISS); /* re-armed, from the new batch */
    struct gpuguard_advice a = last();
    CHECK_EQ_U64(a.batch_size, 8);
    CHECK_EQ_U64(a.grad_accum, 4);
}

static void test_at_min(void)
{
    setup(6, 1, 4);
    gg_advice_raise(0, GG_REASON_REFUSED);
    struct gpuguard_advice a = last();
    CHECK_EQ_U64(a.batch_size, 4);
    CHECK_EQ_U64(a.grad_accum, 2);
    gg_advice_ack(a.seq);
    gg_advice_raise(0, GG_REASON_REFUSED);
    a = last();
    CHECK_EQ_U64(a.batch_size, 4);
    CHECK_STR(a.reason, "at_min");
}

static void test_unknown_batch(void)
{
    setup(0, 0, 1);
    gg_advice_raise(0, GG_REASON_OOM);
    struct gpuguard_advice a = last();
    CHECK_EQ_U64(a.batch_size, 0);
    CHECK_EQ_U64(a.grad_accum, 0);
}

static void *raiser(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        gg_advice_raise(0, GG_REASON_REFUSED);
    return NULL;
}

static void test_threads_one_pending(void)
{
    setup(64, 1, 1);
    gg_advice_raise(0, GG_REASON_REFUSED);
    unsigned before = last().seq;
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, raiser, NULL);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    struct gpuguard_advice a = last();
    CHECK_EQ_U64(a.seq, before + 8000);
    CHECK_EQ_U64(a.batch_size, 32);
}

int main(void)
{
    RUN(test_halve_and_keep_effective);
    RUN(test_zone_once_per_ack);
    RUN(test_at_min);
    RUN(test_unknown_batch);
    RUN(test_threads_one_pending);
    return unit_done();
}
