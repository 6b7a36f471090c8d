/* test_pycall.c - pycall.c: adds go to the interpreter's queue only while
 * it is open and not finalizing, and closing waits for an add in flight. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "prim.h"
#include "pycall.h"
#include "unit.h"

static _Atomic int added, finalizing;
static _Atomic int hold;      /* an add parks here while set */
static _Atomic int parked;
static gg_pycall_fn last_fn;
static void *last_arg;

static int fake_add(gg_pycall_fn fn, void *arg)
{
    atomic_store(&parked, 1);
    while (atomic_load(&hold))
        sched_yield();
    last_fn = fn;
    last_arg = arg;
    atomic_fetch_add(&added, 1);
    return 0;
}

static int fake_full(gg_pycall_fn fn, void *arg)
{
    (void)fn;
    (void)arg;
    return -1; /* the queue's 32 slots are taken */
}

static int fake_finalizing(void)
{
    return atomic_load(&finalizing);
}

static int job(void *arg)
{
    (void)arg;
    return 0;
}

static void test_adds_only_while_open(void)
{
    gg_pycall_test_use(fake_add, fake_finalizing);
    CHECK(!gg_pycall_add(job, NULL)); /* never opened */
    CHECK_EQ_U64(atomic_load(&added), 0);
    CHECK(gg_pycall_open());
    CHECK(gg_pycall_is_open());
    int token;
    CHECK(gg_pycall_add(job, &token));
    CHECK_EQ_U64(atomic_load(&added), 1);
    CHECK(last_fn == job && last_arg == &token);
    atomic_store(&finalizing, 1); /* the interpreter is going: nothing is added */
    CHECK(!gg_pycall_add(job, NULL));
    atomic_store(&finalizing, 0);
    gg_pycall_close();
    CHECK(!gg_pycall_is_open());
    CHECK(!gg_pycall_add(job, NULL));
    CHECK_EQ_U64(atomic_load(&added), 1);
}

static void test_a_full_queue_is_no_add(void)
{
    gg_pycall_test_use(fake_full, NULL);
    CHECK(gg_pycall_open());
    CHECK(!gg_pycall_add(job, NULL));
    gg_pycall_close();
}

static void *adder(void *arg)
{
    *(bool *)arg = gg_pycall_add(job, NULL);
    return NULL;
}

static _Atomic uint64_t released_ns;

static void *releaser(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 20000000}; /* 20 ms */
    nanosleep(&ts, NULL);
    atomic_store(&released_ns, gg_now_ns());
    atomic_store(&hold, 0);
    return NULL;
}

/* close() returns after the add another thread has in flight, never
 * before: after it, the interpreter may be torn down. */
static void test_close_waits_for_an_add_in_flight(void)
{
    gg_pycall_test_use(fake_add, fake_finalizing);
    atomic_store(&added, 0);
    atomic_store(&parked, 0);
    CHECK(gg_pycall_open());
    atomic_store(&hold, 1);
    bool ok = false;
    pthread_t t, r;
    CHECK(pthread_create(&t, NULL, adder, &ok) == 0);
    while (!atomic_load(&parked))
        sched_yield(); /* the add is in flight, parked inside the interpreter's function */
    CHECK(pthread_create(&r, NULL, releaser, NULL) == 0);
    gg_pycall_close();
    uint64_t closed = gg_now_ns();
    CHECK(atomic_load(&released_ns) != 0 && closed >= atomic_load(&released_ns)); /* it waited */
    CHECK_EQ_U64(atomic_load(&added), 1);   /* the add was done before close returned */
    CHECK(!gg_pycall_add(job, NULL));
    pthread_join(t, NULL);
    pthread_join(r, NULL);
    CHECK(ok);
}

int main(void)
{
    RUN(test_adds_only_while_open);
    RUN(test_a_full_queue_is_no_add);
    RUN(test_close_waits_for_an_add_in_flight);
    return unit_done();
}
