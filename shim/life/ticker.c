/* ticker.c - layer 5: the shim's thread (see ticker.h). */
#include "ticker.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "arch.h"
#include "metrics.h"
#include "prim.h"
#include "react.h"

#define REPORT_NS 60000000000ull /* suppressed lines are reported once a minute */
#define STACK_BYTES (256u << 10)

static _Atomic bool running, stopping;
static _Atomic int busy;

static void *tick_loop(void *arg)
{
    (void)arg;
    uint64_t report_at = gg_now_ns() + REPORT_NS;
    for (;;) {
        struct timespec ts = {(time_t)(GG_TICK_NS / 1000000000ull),
                              (long)(GG_TICK_NS % 1000000000ull)};
        while (nanosleep(&ts, &ts) != 0 && !atomic_load(&stopping)) {
        }
        atomic_store(&busy, 1);
        if (atomic_load(&stopping)) {
            atomic_store(&busy, 0);
            break;
        }
        uint64_t now = gg_now_ns();
        bool report = now >= report_at;
        if (report)
            report_at = now + REPORT_NS;
        gg_react_tick(report, true);
        gg_metrics_tick(now); /* when its interval has passed */
        gg_arch_poll();       /* libraries loaded since: judged here, off the callers' threads */
        atomic_store(&busy, 0);
    }
    return NULL;
}

bool gg_ticker_start(void)
{
    pthread_attr_t attr;
    pthread_t t;
    sigset_t all, old;
    if (pthread_attr_init(&attr) != 0)
        return false;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, STACK_BYTES);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread inherits: it takes no signal */
    int e = pthread_create(&t, &attr, tick_loop, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (e != 0)
        return false;
    pthread_setname_np(t, "gpuguard");
    atomic_store(&running, true);
    gg_react_ticking(true);
    return true;
}

void gg_ticker_stop(bool with_stacks)
{
    if (atomic_exchange(&running, false)) {
        atomic_store(&stopping, true);
        /* A tick under way finishes (a sample line or two); a tick stuck on
         * a stalled disk is not waited for past 200 ms. */
        for (int i = 0; i < 2000 && atomic_load(&busy); i++) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        gg_react_ticking(false);
    }
    gg_react_tick(true, with_stacks);
}

void gg_ticker_after_fork(void)
{
    atomic_store(&running, false);
    atomic_store(&busy, 0);
    gg_react_ticking(false);
}
