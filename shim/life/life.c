/* life.c - layer 5: the shim's life: lazy start, the gate, fork, exit
 * (see life.h). */
#include "life.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "advice.h"
#include "arch.h"
#include "backward.h"
#include "device.h"
#include "events.h"
#include "guard.h"
#include "journal.h"
#include "ledger.h"
#include "maps.h"
#include "metrics.h"
#include "react.h"
#include "retry.h"
#include "settings.h"
#include "sites.h"
#include "elfsym.h"
#include "pyframes.h"
#include "pysite.h"
#include "stack.h"
#include "steps.h"
#include "symbolize.h"
#include "ticker.h"
#include "torch.h"
#include "trace.h"

_Atomic int gg_state = GG_STATE_UNSTARTED;
GG_TLS int gg_depth;

static struct gg_process proc;
static pid_t start_pid;      /* the process that started; its children never finish */
static _Atomic bool finished;

/* ---- problems while starting --------------------------------------------------- */

/* Each problem of a policy file is one line on stderr and one `error`
 * event, bounded however broken the input: a file says at most PER_FILE,
 * all files together at most TOTAL, and then one line each says how many
 * more there were (the first FILES files by name, the rest together).
 * Problems that name no file are the shim's own, one per cause: said. */
#define PER_FILE 10
#define TOTAL 30
#define FILES 16
static struct {
    char file[GG_PATH_MAX];
    int count, told;
} said[FILES];
static int nsaid, told_all;
static long more_problems, more_files;
static char more_last[GG_PATH_MAX];

static void report(void *ctx, const char *file, int line, const char *msg)
{
    (void)ctx;
    if (!*file) {
        gg_events_error("%s", msg);
        return;
    }
    int k = 0;
    while (k < nsaid && strcmp(said[k].file, file) != 0)
        k++;
    if (k == nsaid && nsaid < FILES)
        snprintf(said[nsaid++].file, GG_PATH_MAX, "%s", file);
    if (k < FILES)
        said[k].count++;
    if (k >= FILES || said[k].told >= PER_FILE || told_all >= TOTAL) {
        if (k >= FILES) {
            more_problems++;
            if (strcmp(more_last, file) != 0) { /* a file's problems come together */
                more_files++;
                snprintf(more_last, sizeof more_last, "%s", file);
            }
        }
        return;
    }
    said[k].told++;
    told_all++;
    if (line > 0)
        gg_events_error("%s:%d: %s", file, line, msg);
    else
        gg_events_error("%s: %s", file, msg);
}

static void report_more(void)
{
    for (int k = 0; k < nsaid; k++) {
        int more = said[k].count - said[k].told;
        if (more > 0)
            gg_events_error("%s: ...and %d more problem%s (gpuguard-check --lint %s lists them)",
                            said[k].file, more, more == 1 ? "" : "s", said[k].file);
    }
    if (more_problems)
        gg_events_error("...and %ld more problem%s in %ld more policy file%s (gpuguard-check "
                        "--lint lists them)", more_problems, more_problems == 1 ? "" : "s",
                        more_files, more_files == 1 ? "" : "s");
    nsaid = told_all = 0;
    more_problems = more_files = 0;
    more_last[0] = '\0';
}

/* ---- start ------------------------------------------------------------------------ */

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The policies installed beside the library (<libdir>/../share/gpuguard/
 * policy), or the source tree's policy/ when the library runs from build/:
 * resolved, as every path gpuguard finds itself is (no "lib/../share" in
 * what it prints). */
static void default_policy_dir(char *out, size_t cap)
{
    Dl_info info;
    static char lib[PATH_MAX]; /* start runs once, on one thread: not 8 KiB of its stack */
    static char real[PATH_MAX];
    static const char *const tries[] = {"../share/gpuguard/policy", "../policy", "../../policy"};
    out[0] = '\0';
    if (!dladdr((void *)&default_policy_dir, &info) || !info.dli_fname ||
        !realpath(info.dli_fname, lib))
        return;
    char *slash = strrchr(lib, '/');
    if (!slash)
        return;
    *slash = '\0';
    for (size_t i = 0; i < GG_COUNT(tries); i++) {
        static char cand[PATH_MAX + 32];
        int n = snprintf(cand, sizeof cand, "%s/%s", lib, tries[i]);
        if (n <= 0 || (size_t)n >= sizeof cand || !is_dir(cand) || !realpath(cand, real))
            continue;
        size_t len = strlen(real);
        if (len < cap) {
            memcpy(out, real, len + 1);
            return;
        }
    }
}

/* The one fork story, for every lock of the shim. A child of a started
 * process passes through for good: its CUDA state is not the parent's (CUDA
 * does not survive fork) and the summary is the parent's to write. So the
 * child never reads the shim's tables again, and their consistency there
 * does not matter; only a lock that a parent thread held at the fork must
 * not stay held, since the C API may still be called. */
static void (*const after_fork[])(void) = {
#define MODULE(module, fn) fn,
#include "modules.def"
#undef MODULE
};

static void child_after_fork(void)
{
    atomic_store(&gg_state, GG_STATE_PASSTHROUGH);
    for (size_t i = 0; i < sizeof after_fork / sizeof after_fork[0]; i++)
        after_fork[i]();
}

static void catch_term(void);
static void set_exit_status(int status);

/* An on_exit handler (glibc): told the status exit() was called with,
 * also when libc calls it as main returns (Python's Py_BytesMain returns 1
 * for an uncaught exception, a SystemExit's code). */
static void at_exit(int status, void *arg)
{
    (void)arg;
    set_exit_status(status);
    gg_life_finish();
}

static bool all_off(int n)
{
    for (int i = 0; i < n; i++)
        if (gg_devices[i].mode != GG_MODE_OFF)
            return false;
    return true;
}

/* Is another copy of the shim the process's (preloaded twice, from two
 * paths)? The copy whose API the process finds first is the one callers
 * reach; every other copy is reached only through it (its calls to the
 * real functions land here) and stands aside: passes everything through,
 * writes nothing. */
static bool another_copy_first(void)
{
    Dl_info first, self;
    void *p = gg_real_dlsym(RTLD_DEFAULT, "gpuguard_stats");
    return p && dladdr(p, &first) && dladdr((void *)&another_copy_first, &self) &&
           first.dli_fbase != self.dli_fbase;
}

/* What the start says once, in the journal (and on stderr): secure-execution
 * mode, and a Python instrumentation that the library could not use. */
static void said_at_start(void)
{
    if (gg_secure()) {
        char ignored[512];
        gg_settings_secure_ignored(ignored, sizeof ignored);
        gg_events_error("secure-execution mode (a set-user-ID program, or one that gained "
                        "capabilities): no setting that names a file is read from the environment "
                        "(%s%s), and the environment is not changed", ignored[0] ? ignored : "none was set",
                        ignored[0] ? " set and not used" : "");
    }
    const char *why = gg_pysite_problem();
    if (why)
        gg_events_error("%s", why);
}

static bool start(void)
{
    char dir[GG_PATH_MAX];
    /* Off is off, however it is spelled: not a trace of the shim. */
    if (gg_settings_env_off() || another_copy_first())
        return false;
    gg_clock_start();
    start_pid = getpid();
    gg_journal_hold(); /* problems found before the journal opens wait for it */
    gg_process_defaults(&proc);
    gg_process_from_env(&proc, report, NULL);
    if (!proc.policy[0]) {
        default_policy_dir(dir, sizeof dir);
        snprintf(proc.policy, sizeof proc.policy, "%s", dir);
    }
    int n = gg_devices_init(&proc, report, NULL);
    report_more();
    said_at_start();
    if (!n || all_off(n)) {
        gg_journal_release(false);
        return false;
    }
    gg_stack_warmup(gg_device_policy(0)->s.python);
    char comm[64], host[256] = "";
    gg_proc_name(comm, sizeof comm);
    gethostname(host, sizeof host - 1);
    bool open = gg_journal_open(gg_device_policy(0)->s.journal_dir, comm, proc.rank);
    gg_events_start(comm, host, proc.rank);
    gg_metrics_start(&proc, comm, host); /* docs/metrics.md */
    if (proc.trace[0]) { /* GPUGUARD_TRACE: every call, for golden traces (trace.h) */
        gg_trace_open(proc.trace);
        for (int i = 0; i < n; i++)
            if (gg_device(i))
                gg_trace_device(i, gg_devices[i].name, gg_devices[i].total,
                                gg_devices[i].cc_major, gg_devices[i].cc_minor);
    }
    gg_react_python();
    gg_journal_release(open);
    if (open || gg_metrics_on())
        (void)gg_ticker_start(); /* else the timeline is written inline, as rarely */
    gg_arch_start(); /* the loaded modules' device code against the GPUs */
    on_exit(at_exit, NULL);
    catch_term();
    return true;
}

#define STALL_NS 30000000000ull /* 30 s: longer than any single step of a start */

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
            gg_trace_started(); /* a trace that did not open keeps no more lookups */
            atomic_store(&gg_state, ok ? GG_STATE_ACTIVE : GG_STATE_PASSTHROUGH);
            if (!ok)
                gg_depth = 0;
            else if (gg_advice_registered())
                gg_react_registered(gg_guard_trainer_registered()); /* told before CUDA */
            return ok;
        }
        s = expected;
    }
    /* Another thread is starting: wait for it (nothing may go uncounted) as
     * long as it moves; a start that has not moved for STALL_NS is stuck
     * (on a lock this thread holds, maybe) and this call passes through. */
    uint64_t seen = gg_progress_count(), moved = gg_now_ns();
    while (s == GG_STATE_STARTING) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        s = atomic_load(&gg_state);
        uint64_t now = gg_now_ns(), p = gg_progress_count();
        if (p != seen) {
            seen = p;
            moved = now;
        } else if (now - moved > STALL_NS) {
            break;
        }
    }
    if (s == GG_STATE_ACTIVE) {
        gg_depth = 1;
        return true;
    }
    return false;
}

void gg_life_registered(void)
{
    if (gg_active())
        gg_react_registered(gg_guard_trainer_registered());
}

static bool device_used(const struct gg_device *d, int dev)
{
    return gg_device_in_use(d, dev);
}

static void batch_events(struct gg_batch now, struct gg_batch was, bool final, const char *why)
{
    gg_react_flush();
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_device *d = gg_device(i);
        struct gg_window w;
        if (!d || !device_used(d, i))
            continue;
        gg_device_close_phase(d, &w);
        gg_events_batch(i, now, was, &w, final, why);
    }
}

void gg_life_batch(struct gg_batch now, struct gg_batch was, const char *why)
{
    if (!gg_active())
        return;
    batch_events(now, was, false, why);
    if (why && !strcmp(why, "shape"))
        return; /* sized by its own input: the steps by their tokens still hold */
    for (int i = 0; i < gg_device_count; i++)
        gg_steps_reset(i); /* another batch: the old trend says nothing of it */
}

/* The step a shape's forecast was made for, per device (+ 1: 0 none), so a
 * step told its shape several times is forecast once. */
static _Atomic uint64_t shape_forecast1[GG_MAX_DEVICES];

void gg_life_step(uint64_t step)
{
    if (!gg_active())
        return;
    struct gg_shape input;
    bool told = gg_steps_take_shape(&input);
    gg_torch_boundary(step); /* before the forecasts: history of the step that ended goes off */
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_device *d = gg_device(i);
        struct gg_step_verdict v;
        if (!d || !device_used(d, i))
            continue;
        gg_steps_boundary(d, i, step, gg_device_policy(i)->s.forecast, told ? &input : NULL, &v);
        gg_react_step(i, step, &v);
    }
}

void gg_life_shape(const long long *dims, int ndims, int batch_dim)
{
    if (!gg_active() || !dims || ndims <= 0)
        return;
    struct gg_shape s = {.ndims = ndims < GG_SHAPE_DIMS ? ndims : GG_SHAPE_DIMS,
                         .batch_dim = batch_dim >= 0 && batch_dim < ndims ? batch_dim : -1};
    uint64_t tokens = 1;
    for (int i = 0; i < ndims; i++) {
        uint64_t v = dims[i] > 0 ? (uint64_t)dims[i] : 0, t;
        if (i < GG_SHAPE_DIMS)
            s.dims[i] = dims[i];
        tokens = __builtin_mul_overflow(tokens, v, &t) ? UINT64_MAX : t;
    }
    s.tokens = tokens;
    gg_steps_shape(&s);
    /* The step this input is for: its tokens beyond the run's, and the
     * run's line through (tokens, need) says it crosses the near-miss line:
     * a forecast before it allocates. */
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_device *d = gg_device(i);
        struct gg_steps_now now;
        uint64_t bytes, most;
        bool beyond;
        if (!d || !device_used(d, i) || !gg_device_policy(i)->s.forecast)
            continue;
        gg_steps_now(i, &now);
        uint64_t line = gg_device_line(d), step = now.step + 1;
        /* the first input to cross: the run's largest so far did not */
        if (!now.steps || atomic_load(&shape_forecast1[i]) == step + 1 ||
            !gg_steps_predict(d, i, tokens, &bytes, &beyond, &most) || !beyond ||
            bytes <= line || most > line)
            continue;
        atomic_store(&shape_forecast1[i], step + 1);
        gg_react_shape_forecast(i, step, bytes);
    }
}

void gg_life_needed(int dev, unsigned long long bytes)
{
    if (gg_active())
        gg_steps_needed(dev, bytes);
}

/* ---- how the process ends ------------------------------------------------------- */

static _Atomic int exit_status1; /* + 1; 0: not seen */
static char uncaught[512];
static _Atomic bool has_uncaught;

/* The program's exit status: what exit() was called with (by the
 * program, or by libc as main returned); the summary carries it. */
static void set_exit_status(int status)
{
    atomic_store(&exit_status1, (status & 0xff) + 1);
}

void gg_life_uncaught(const char *what)
{
    if (!what || !gg_active() || atomic_exchange(&has_uncaught, true))
        return;
    size_t n = strnlen(what, sizeof uncaught - 1);
    while (n > 0 && ((unsigned char)what[n] & 0xC0) == 0x80)
        n--; /* cut at a character boundary */
    memcpy(uncaught, what, n);
    uncaught[n] = '\0';
}

/* SIGTERM (what schedulers and `kill` send) kills a process without its
 * summary. Where its action is the default one when the shim starts, the
 * shim's handler writes one line (`killed`: the signal and the last step)
 * and dies of the same signal, as it would have: the default action back,
 * the signal raised again. The program's own handler, set before or
 * after, takes precedence (ours is then never called, or replaced). */
static void on_term(int sig)
{
    int saved = errno;
    if (getpid() == start_pid && !atomic_exchange(&finished, true)) {
        gg_journal_final(); /* written even if this thread was writing */
        gg_events_killed(sig);
    }
    signal(sig, SIG_DFL);
    raise(sig);
    errno = saved;
}

static void catch_term(void)
{
    struct sigaction old, sa;
    if (sigaction(SIGTERM, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL)
        return; /* the program's own, or ignored */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- exit ---------------------------------------------------------------------------- */

static void say_summary(void)
{
    const char *path = gg_journal_path();
    bool any = false;
    for (int i = 0; i < gg_device_count; i++) {
        const struct gg_device *d = &gg_devices[i];
        if (!device_used(d, i))
            continue;
        any = true;
        char peak[32], used[32], total[32], limit[32];
        gg_fmt_bytes(peak, sizeof peak, gg_device_peak(d));
        gg_fmt_bytes(used, sizeof used, gg_device_peak_used(d));
        gg_fmt_bytes(total, sizeof total, d->total);
        gg_fmt_bytes(limit, sizeof limit, d->limit);
        unsigned long long nm = atomic_load(&d->near_misses), rf = atomic_load(&d->refusals),
                           oo = atomic_load(&d->ooms);
        char extra[64] = "";
        if (oo)
            snprintf(extra, sizeof extra, ", %llu OOM%s", oo, oo == 1 ? "" : "s");
        gg_say("GPU%d %s: peak %s (device %s) of %s, limit %s; %llu near miss%s, %llu refused%s; "
               "journal %s",
               i, d->name, peak, used, total, d->total ? limit : "none", nm,
               nm == 1 ? "" : "es", rf, extra, path ? path : "(none)");
    }
    if (!any)
        gg_say("no device memory allocated; journal %s", path ? path : "(none)");
    uint64_t lost = gg_journal_lost();
    if (lost)
        gg_say("%llu journal line%s lost: the journal could not be written", (unsigned long long)lost,
               lost == 1 ? "" : "s");
}

void gg_life_finish(void)
{
    if (getpid() != start_pid || atomic_exchange(&finished, true))
        return;
    int s = atomic_load(&gg_state);
    if (s != GG_STATE_ACTIVE && s != GG_STATE_PASSTHROUGH)
        return;
    /* exit() from a signal handler that interrupted this thread inside the
     * shim (a hook, the C API): a lock of the shim's may be this thread's
     * own. The summary is then written from counters alone: no stacks, no
     * sites, no names, nothing that takes a lock it could wait on forever. */
    bool inside = gg_depth != 0;
    int batch, accum;
    if (inside)
        gg_journal_final();
    gg_ticker_stop(!inside); /* and the last tick: the timeline to now, what was left out */
    if (!inside)
        gg_arch_poll(); /* libraries loaded since the last look, before the summary */
    gg_metrics_exit(); /* a clean exit: Prometheus stops seeing this process */
    gg_react_python();
    if (!inside)
        gg_react_settle(0); /* failures still waiting for a retry: none will come */
    if (!inside && gg_advice_current(&batch, &accum)) /* the phase the process ended in */
        batch_events((struct gg_batch){batch, accum}, (struct gg_batch){batch, accum}, true,
                     NULL);
    static struct gg_exit how; /* 1 KiB: not on a thread's stack that may be small */
    int status1 = atomic_load(&exit_status1);
    how.has_status = status1 != 0;
    how.status = status1 - 1;
    how.uncaught = atomic_load(&has_uncaught) ? uncaught : NULL;
    how.backward_calls = gg_backward_calls();
    for (int i = 0; i < gg_device_count && i < GG_MAX_DEVICES; i++) {
        for (int why = GG_REASON_NEAR_MISS; why <= GG_REASON_FORECAST; why++)
            how.advice[i] += gg_react_advised(i, why);
        how.unheard[i] = gg_react_unheard(i);
    }
    gg_events_summary(gg_clock_since_start(), !inside, &how);
    if (!proc.quiet)
        say_summary();
    gg_devices_leave(); /* a shared GPU: this process's share goes */
}
