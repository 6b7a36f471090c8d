/* test_advice.c - the advice protocol's arithmetic and state, without a
 * journal: halve the batch, keep batch x accumulation, re-arm on ack. */
#include <pthread.h>
#include <signal.h>

#include "advice.h"
#include "unit.h"

static struct gg_trainer_policy policy;

static struct gg_advice last(void)
{
    struct gg_advice a;
    memset(&a, 0, sizeof a);
    gg_advice_pending(&a);
    return a;
}

static void raise_(enum gg_reason why)
{
    struct gg_advice a;
    gg_advice_raise(0, why, &policy, &a);
}

static void ack(unsigned seq)
{
    struct gg_batch now, was;
    gg_advice_ack(seq, &now, &was);
}

static void setup(int batch, int accum, int min)
{
    policy = (struct gg_trainer_policy){0, 0, min, 0, 0, true};
    struct gg_advice a;
    if (gg_advice_pending(&a))
        ack(a.seq); /* clear what an earlier test left */
    struct gg_batch was;
    gg_advice_set_batch((struct gg_batch){batch, accum}, &was);
}

static void test_halve_and_keep_effective(void)
{
    setup(32, 1, 1);
    raise_(GG_REASON_NEAR_MISS);
    struct gg_advice a = last();
    CHECK_EQ_U64(a.batch_size, 16);
    CHECK_EQ_U64(a.grad_accum, 2);
    CHECK_STR(a.reason, "near_miss");
    setup(5, 3, 1);
    raise_(GG_REASON_OOM);
    a = last();
    CHECK_EQ_U64(a.batch_size, 2);
    CHECK_EQ_U64(a.grad_accum, 8); /* 2 x 8 >= 5 x 3 */
    CHECK_STR(a.reason, "oom");
}

static void test_zone_once_per_ack(void)
{
    setup(32, 1, 1);
    raise_(GG_REASON_NEAR_MISS);
    unsigned first = last().seq;
    raise_(GG_REASON_NEAR_MISS);
    CHECK_EQ_U64(last().seq, first); /* no second zone advice */
    raise_(GG_REASON_REFUSED);
    CHECK_EQ_U64(last().seq, first + 1); /* a refusal always advises */
    ack(first + 1);
    CHECK(!gg_advice_pending(NULL));
    raise_(GG_REASON_NEAR_MISS); /* re-armed, from the new batch */
    struct gg_advice a = last();
    CHECK_EQ_U64(a.batch_size, 8);
    CHECK_EQ_U64(a.grad_accum, 4);
}

static void test_at_min(void)
{
    setup(6, 1, 4);
    raise_(GG_REASON_REFUSED);
    struct gg_advice a = last();
    CHECK_EQ_U64(a.batch_size, 4);
    CHECK_EQ_U64(a.grad_accum, 2);
    ack(a.seq);
    raise_(GG_REASON_REFUSED);
    a = last();
    CHECK_EQ_U64(a.batch_size, 4);
    CHECK_STR(a.reason, "at_min");
}

static void test_unknown_batch(void)
{
    setup(0, 0, 1);
    raise_(GG_REASON_OOM);
    struct gg_advice a = last();
    CHECK_EQ_U64(a.batch_size, 0);
    CHECK_EQ_U64(a.grad_accum, 0);
}

/* The policy's batch counts until the trainer tells its own; a raise that
 * is not made (a zone entry while disarmed) says so. */
static void test_policy_batch_and_raise_result(void)
{
    struct gg_advice a;
    setup(32, 1, 1);
    CHECK(gg_advice_raise(0, GG_REASON_NEAR_MISS, &policy, &a));
    CHECK(!gg_advice_raise(0, GG_REASON_NEAR_MISS, &policy, &a));
    CHECK(gg_advice_registered());
    /* an ack makes the advised batch the current one, and says so, with
     * the batch it replaces */
    struct gg_batch now = {0, 0}, was = {0, 0};
    int b = 0, acc = 0;
    CHECK(gg_advice_pending(&a));
    CHECK(gg_advice_ack(a.seq, &now, &was));
    CHECK_EQ_U64(now.batch_size, 16);
    CHECK_EQ_U64(now.grad_accum, 2);
    CHECK_EQ_U64(was.batch_size, 32);
    CHECK_EQ_U64(was.grad_accum, 1);
    CHECK(gg_advice_current(&b, &acc) && b == 16 && acc == 2);
    CHECK(!gg_advice_ack(a.seq, &now, &was)); /* twice: nothing new */
    /* setting the batch it runs already changes nothing; another does */
    CHECK(!gg_advice_set_batch((struct gg_batch){16, 2}, &was));
    CHECK(gg_advice_set_batch((struct gg_batch){8, 4}, &was));
    CHECK(was.batch_size == 16 && was.grad_accum == 2);
}

/* Advice no trainer can hear is never acknowledged: a zone entry and a
 * forecast are each said once (what would have been advised), and do not
 * stop one another; a refusal or an OOM always advises. */
static void test_unheard_advice_once_per_kind(void)
{
    struct gg_advice a;
    setup(32, 1, 1);
    policy.heard = false;
    CHECK(gg_advice_raise(0, GG_REASON_NEAR_MISS, &policy, &a));
    CHECK(!gg_advice_raise(0, GG_REASON_NEAR_MISS, &policy, &a));
    CHECK(gg_advice_raise(0, GG_REASON_FORECAST, &policy, &a));
    CHECK(!gg_advice_raise(0, GG_REASON_FORECAST, &policy, &a));
    CHECK(gg_advice_raise(0, GG_REASON_OOM, &policy, &a));
    CHECK(gg_advice_raise(0, GG_REASON_OOM, &policy, &a));
    CHECK_EQ_U64(a.batch_size, 16);
    /* heard, the zone is armed until the ack as before */
    policy.heard = true;
    CHECK(gg_advice_raise(0, GG_REASON_NEAR_MISS, &policy, &a));
    CHECK(!gg_advice_raise(0, GG_REASON_FORECAST, &policy, &a));
    ack(a.seq);
}

/* A signal handler on the thread that holds the lock never runs inside it:
 * the lock's holder blocks signals. Raised from a handler, advice still
 * works (the handler is not re-entered into a held lock). */
static volatile sig_atomic_t in_handler_seq;
static void on_usr1(int sig)
{
    (void)sig;
    struct gg_advice a;
    if (gg_advice_pending(&a))
        in_handler_seq = (sig_atomic_t)a.seq;
}

static void test_signal_handler_reads_advice(void)
{
    setup(16, 1, 1);
    signal(SIGUSR1, on_usr1);
    raise_(GG_REASON_REFUSED);
    gg_advice_signal(SIGUSR1);
    CHECK_EQ_U64((unsigned)in_handler_seq, last().seq);
    CHECK(gg_advice_handled(SIGUSR1));
    signal(SIGUSR1, SIG_DFL);
    CHECK(!gg_advice_handled(SIGUSR1));
}

static void *raiser(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        raise_(GG_REASON_REFUSED);
    return NULL;
}

static void test_threads_one_pending(void)
{
    setup(64, 1, 1);
    raise_(GG_REASON_REFUSED);
    unsigned before = last().seq;
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, raiser, NULL);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    struct gg_advice a = last();
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
    RUN(test_policy_batch_and_raise_result);
    RUN(test_unheard_advice_once_per_kind);
    RUN(test_signal_handler_reads_advice);
    return unit_done();
}
