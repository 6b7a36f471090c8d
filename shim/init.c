/* init.c - lazy start, the hook gate, fork and exit (see init.h). */
#include "init.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpuguard.h"
#include "advice.h"
#include "arch.h"
#include "guard.h"
#include "journal.h"
#include "options.h"
#include "stack.h"

_Atomic int gg_state = GG_STATE_UNSTARTED;
GG_TLS int gg_depth;

static pid_t start_pid;           /* the process that started; its children never finish */
static uint64_t start_ns;
static _Atomic bool finished;

/* ---- start -------------------------------------------------------------- */

static void child_after_fork(void)
{
    /* The child's CUDA state is not the parent's (CUDA does not survive
     * fork), and the summary is the parent's to write. A lock another
     * parent thread held at the fork stays held in the child: the child
     * passes through and never takes the shim's locks again, but the C API
     * can still be called, so its lock is made free. */
    atomic_store(&gg_state, GG_STATE_PASSTHROUGH);
    gg_advice_after_fork();
    gg_journal_drop();
}

static void at_exit(void)
{
    gg_finish();
}

static void write_start(void)
{
    char buf[8192];
    struct gg_json j;
    char comm[32], host[256] = "";
    gg_comm(comm, sizeof comm);
    gethostname(host, sizeof host - 1);
    gg_journal_begin(&j, buf, sizeof buf, "start");
    gg_json_ki64(&j, "pid", (int64_t)getpid());
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    gg_json_kf64(&j, "wall", (double)wall.tv_sec + wall.tv_nsec / 1e9); /* aligns journals */
    gg_json_kstr(&j, "comm", comm);
    gg_json_kstr(&j, "host", host);
    gg_json_key(&j, "rank");
    if (gg_opt.rank)
        gg_json_i64(&j, strtol(gg_opt.rank, NULL, 10));
    else
        gg_json_null(&j);
    gg_json_kstr(&j, "version", GPUGUARD_VERSION);
    gg_json_kstr(&j, "mode", gg_device_count ? gg_mode_name(gg_devices[0].mode)
                                             : (gg_opt.mode ? gg_opt.mode : "auto"));
    gg_json_key(&j, "devices");
    gg_json_arr(&j);
    for (int i = 0; i < gg_device_count; i++) {
        const struct gg_device *d = &gg_devices[i];
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
        gg_json_obj(&j);
        gg_json_ki64(&j, "dev", i);
        gg_json_kstr(&j, "name", d->name);
        gg_json_ku64(&j, "total", d->total);
        gg_json_kstr(&j, "cc", cc);
        gg_json_kstr(&j, "policy", d->policy.file[0] ? d->policy.file : "(built-in)");
        gg_json_ku64(&j, "limit", d->limit);
        gg_json_kstr(&j, "mode", gg_mode_name(d->mode));
        gg_json_ku64(&j, "headroom", d->total - d->limit);
        gg_json_ku64(&j, "near_miss", d->near);
        gg_json_obj_end(&j);
    }
    gg_json_arr_end(&j);
    gg_journal_end(&j);
}

/* The journal directory: GPUGUARD_JOURNAL_DIR, else the first device's
 * policy ([journal] dir), else the working directory. */
static const char *journal_dir(void)
{
    if (gg_opt.journal_dir)
        return gg_opt.journal_dir;
    if (gg_device_count && gg_devices[0].policy.journal_dir[0])
        return gg_devices[0].policy.journal_dir;
    return ".";
}

static bool start(void)
{
    gg_options_read();
    if (gg_opt.off)
        return false; /* GPUGUARD_MODE=off: not a trace of the shim */
    start_pid = getpid();
    start_ns = gg_now_ns();
    gg_journal_hold(); /* problems found before the journal opens wait for it */
    gg_guard_init_devices();
    if (!gg_device_count) {
        gg_journal_release(false);
        return false;
    }
    gg_stack_warmup();
    bool open = gg_journal_open(journal_dir(), gg_opt.rank);
    write_start();
    gg_journal_release(open);
    gg_arch_start(); /* the loaded modules' device code against the GPUs */
    atexit(at_exit);
    return true;
}

bool gg_enter_slow(void)
{
    int s = atomic_load(&gg_state);
    if (s == GG_STATE_UNSTARTED) {
        int expected = GG_STATE_UNSTARTED;
        if (atomic_compare_exchange_strong(&gg_state, &expected, GG_STATE_STARTING)) {
            /* Before anything else: a child forked while this thread starts
             * must not wait for a start that will never finish there. */
            pthread_atfork(NULL, NULL, child_after_fork);
            gg_depth = 1; /* whatever the start calls passes through */
            bool ok = start();
            atomic_store(&gg_state, ok ? GG_STATE_ACTIVE : GG_STATE_PASSTHROUGH);
            if (!ok)
                gg_depth = 0;
            else if (gg_advice_registered())
                gg_guard_trainer_registered(); /* told before the first CUDA call */
            return ok;
        }
        s = expected;
    }
    /* Another thread is starting: wait for it, but never for long. */
    for (int i = 0; s == GG_STATE_STARTING && i < 20000; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        s = atomic_load(&gg_state);
    }
    if (s == GG_STATE_ACTIVE) {
        gg_depth = 1;
        return true;
    }
    return false;
}

void gg_passthrough(void)
{
    atomic_store(&gg_state, GG_STATE_PASSTHROUGH);
}

/* ---- the summary ------------------------------------------------------- */

static bool device_used(int dev)
{
    const struct gg_counters *c = &gg_ledger_counters[dev];
    return gg_ledger_allocs(dev) || atomic_load(&c->ooms) || atomic_load(&c->refusals);
}

static void write_summary(double duration)
{
    struct gg_json j;
    char buf[16384];
    gg_journal_begin(&j, buf, sizeof buf, "summary");
    gg_json_kf64(&j, "duration", duration);
    gg_json_ku64(&j, "sites", gg_stack_sites()); /* distinct stacks stored */
    gg_json_key(&j, "devices");
    gg_json_arr(&j);
    for (int i = 0; i < gg_device_count; i++) {
        const struct gg_device *d = &gg_devices[i];
        struct gg_counters *c = &gg_ledger_counters[i];
        gg_json_obj(&j);
        gg_json_ki64(&j, "dev", i);
        gg_json_kstr(&j, "name", d->name);
        gg_json_ku64(&j, "total", d->total);
        gg_json_ku64(&j, "limit", d->limit);
        gg_json_ku64(&j, "peak", atomic_load(&c->peak));
        gg_json_ku64(&j, "peak_used", atomic_load(&d->peak_used));
        uint64_t allocs = gg_ledger_allocs(i), frees = gg_ledger_frees(i);
        gg_json_ku64(&j, "allocs", allocs);
        gg_json_ku64(&j, "frees", frees);
        gg_json_ku64(&j, "near_misses", atomic_load(&c->near_misses));
        gg_json_ku64(&j, "refusals", atomic_load(&c->refusals));
        gg_json_ku64(&j, "ooms", atomic_load(&c->ooms));
        gg_json_ku64(&j, "live_bytes", atomic_load(&c->current));
        gg_json_ku64(&j, "live_allocs", allocs - frees);
        gg_json_ku64(&j, "unknown_frees", atomic_load(&c->unknown_frees));
        gg_json_key(&j, "peak_stack");
        gg_stack_json(&j, atomic_load(&d->peak_site));
        gg_json_key(&j, "peak_sites");
        gg_json_arr(&j);
        struct gg_site_usage top[32];
        size_t n = gg_guard_peak_sites(i, top, 32);
        uint64_t attributed = 0, peak = atomic_load(&c->peak);
        for (size_t k = 0; k < n; k++)
            attributed += top[k].bytes;
        /* What no listed site holds (allocations made without a stack, or
         * below the 32 largest) is one entry with an empty stack, in its
         * place by size. */
        uint64_t rest = peak > attributed ? peak - attributed : 0;
        for (size_t k = 0; k <= n; k++) {
            if (rest && (k == n || top[k].bytes < rest)) {
                gg_json_obj(&j);
                gg_json_key(&j, "stack");
                gg_json_arr(&j);
                gg_json_arr_end(&j);
                gg_json_ku64(&j, "bytes", rest);
                gg_json_key(&j, "allocs");
                gg_json_null(&j);
                gg_json_obj_end(&j);
                rest = 0;
            }
            if (k == n)
                break;
            gg_json_obj(&j);
            gg_json_key(&j, "stack");
            gg_stack_json(&j, top[k].site);
            gg_json_ku64(&j, "bytes", top[k].bytes);
            gg_json_ku64(&j, "allocs", top[k].allocs);
            gg_json_obj_end(&j);
        }
        gg_json_arr_end(&j);
        gg_json_obj_end(&j);
    }
    gg_json_arr_end(&j);
    gg_journal_end(&j);
}

static void say_summary(void)
{
    const char *path = gg_journal_path();
    bool any = false;
    for (int i = 0; i < gg_device_count; i++) {
        if (!device_used(i))
            continue;
        any = true;
        const struct gg_device *d = &gg_devices[i];
        const struct gg_counters *c = &gg_ledger_counters[i];
        char peak[32], used[32], total[32], limit[32];
        gg_fmt_bytes(peak, sizeof peak, atomic_load(&c->peak));
        gg_fmt_bytes(used, sizeof used, atomic_load(&d->peak_used));
        gg_fmt_bytes(total, sizeof total, d->total);
        gg_fmt_bytes(limit, sizeof limit, d->limit);
        unsigned long long nm = atomic_load(&c->near_misses), rf = atomic_load(&c->refusals),
                           oo = atomic_load(&c->ooms);
        char extra[64] = "";
        if (oo)
            snprintf(extra, sizeof extra, ", %llu OOM%s", oo, oo == 1 ? "" : "s");
        gg_say("GPU%d %s: peak %s (device %s) of %s, limit %s; %llu near miss%s, %llu refused%s; "
               "journal %s",
               i, d->name, peak, used, total, limit, nm, nm == 1 ? "" : "es", rf, extra,
               path ? path : "(none)");
    }
    if (!any)
        gg_say("no device memory allocated; journal %s", path ? path : "(none)");
}

void gg_finish(void)
{
    if (getpid() != start_pid || atomic_exchange(&finished, true))
        return;
    int s = atomic_load(&gg_state);
    if (s != GG_STATE_ACTIVE && s != GG_STATE_PASSTHROUGH)
        return;
    double duration = (double)(gg_now_ns() - start_ns) / 1e9;
    write_summary(duration);
    if (!gg_opt.quiet)
        say_summary();
}
