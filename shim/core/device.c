/* device.c - layer 4: the GPUs and their policies (see device.h). */
#include "device.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "driver.h"
#include "runtime.h"

struct gg_device gg_devices[GG_MAX_DEVICES];
int gg_device_count;
static struct gg_policy policies[GG_MAX_DEVICES];

const struct gg_policy *gg_device_policy(int dev)
{
    return (unsigned)dev < GG_MAX_DEVICES ? &policies[dev] : NULL;
}

__attribute__((format(printf, 3, 4))) static void say(gg_report_fn report, void *ctx,
                                                      const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    report(ctx, "", 0, msg);
}

/* The driver the runtime uses: the first call may come through the runtime
 * before it has loaded its driver (it does so on its first call, from a
 * path of its own), so let it, then take the same libcuda. */
static bool open_driver(gg_report_fn report, void *ctx)
{
    char why[256];
    if (gg_driver_open(false, why, sizeof why) == 0)
        return true;
    gg_runtime_touch();
    if (gg_driver_open(true, why, sizeof why) == 0)
        return true;
    say(report, ctx, "%s; passing through", why);
    return false;
}

/* Apply device i's policy; true when its problems leave it observing. */
/* The environment's problems, passed on, with the first variable named
 * and counted: a device demoted for them alone is said to be so. */
struct env_sink {
    gg_report_fn report;
    void *ctx;
    char first[64];
    int vars;
};

static void env_problem(void *ctx, const char *file, int line, const char *msg)
{
    struct env_sink *e = ctx;
    if (!e->vars++)
        snprintf(e->first, sizeof e->first, "%s", file ? file : "");
    if (e->report)
        e->report(e->ctx, file, line, msg);
}

static bool apply_policy(int i, struct gg_device *d, struct env_sink *env, bool *env_only)
{
    struct gg_policy *p = &policies[i];
    gg_report_fn report = env->report;
    void *ctx = env->ctx;
    bool file_broken = p->broken;
    struct env_sink quiet = {NULL, NULL, "", 0};
    int problems = gg_policy_apply_env(p, env_problem, i == 0 ? (void *)env : (void *)&quiet);
    d->mode = (uint8_t)p->s.mode;
    d->enforce = (uint8_t)p->s.enforce;
    d->stacks = (uint8_t)p->s.stacks;
    d->depth = (uint8_t)p->s.depth;
    d->virtualize_meminfo = p->s.virtualize_meminfo;
    d->never_refuse = p->s.never_refuse;
    if (d->total) {
        d->limit = gg_policy_limit(p, d->total, report, ctx);
        d->near = gg_policy_near_miss(p, d->total);
        d->sample_step = d->total / 100;
        d->claim_slack = d->total / 64 < (256ull << 20) ? d->total / 64 : 256ull << 20;
        if (d->limit == d->total && gg_size_bytes(p->s.headroom, d->total) > d->total)
            problems++;
    } else {
        /* Its total memory is unknown, so it cannot be held to a line: it
         * is observed (counted and journaled), never refused, never a near
         * miss. Said when the query failed. */
        d->limit = UINT64_MAX;
        d->near = 0;
        if (d->mode != GG_MODE_OFF)
            d->mode = GG_MODE_OBSERVE;
    }
    bool demoted = (problems || p->broken) &&
                   (d->mode == GG_MODE_ENFORCE || d->mode == GG_MODE_AUTO);
    *env_only = !file_broken && p->broken && problems == (i == 0 ? env->vars : quiet.vars);
    if (demoted)
        d->mode = GG_MODE_OBSERVE;
    atomic_store(&d->enforcing, d->mode == GG_MODE_ENFORCE);
    return demoted;
}

/* "0-3,5,7-8": the devices set in `on`, as ranges. */
static void ranges(const bool *on, int n, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (!on[i])
            continue;
        int j = i;
        while (j + 1 < n && on[j + 1])
            j++;
        int w = j > i ? snprintf(out + len, cap - len, "%s%d-%d", len ? "," : "", i, j)
                      : snprintf(out + len, cap - len, "%s%d", len ? "," : "", i);
        if (w < 0 || (size_t)w >= cap - len)
            return;
        len += (size_t)w;
        i = j;
    }
}

/* The ledgers shared with this user's other guarded processes on the same
 * GPUs (peers.h): one per GPU with a UUID and a size, in /dev/shm (or /tmp
 * where there is none). A problem is said once; that GPU is then decided
 * alone, from the device's readings. */
static void join_peers(int n, gg_report_fn report, void *ctx)
{
    static const char *const bases[] = {"/dev/shm", "/tmp"};
    char dir[256], why[512] = "";
    bool have_dir = false;
    for (size_t b = 0; b < GG_COUNT(bases) && !have_dir; b++) {
        struct stat st;
        if (stat(bases[b], &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        have_dir = gg_peers_dir(bases[b], dir, sizeof dir, why, sizeof why) == 0;
        break;
    }
    for (int i = 0; i < n; i++) {
        struct gg_device *d = &gg_devices[i];
        d->peers.self = NULL;
        if (!d->present || !d->total || !d->uuid[0] || d->mode == GG_MODE_OFF ||
            !policies[i].s.share)
            continue; /* [memory] share = no: decided alone, from the device's readings */
        if (have_dir && gg_peers_join(&d->peers, dir, d->uuid, why, sizeof why) == 0)
            continue;
        if (why[0])
            say(report, ctx, "GPU%d: not shared with this user's other guarded processes (%s): "
                "it is decided from its own readings alone", i, why);
        why[0] = '\0';
    }
}

int gg_devices_init(const struct gg_process *proc, gg_report_fn report, void *ctx)
{
    int n = 0;
    const char *call = "";
    if (!open_driver(report, ctx))
        return 0;
    int r = gg_driver_init(&n, &call);
    if (r != 0) {
        say(report, ctx, "%s failed (%s, %d); passing through", call, gg_driver_error_name(r), r);
        return 0;
    }
    if (n > GG_MAX_DEVICES) {
        say(report, ctx, "%d CUDA devices; only the first %d are guarded", n, GG_MAX_DEVICES);
        n = GG_MAX_DEVICES;
    }
    const char *names[GG_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        struct gg_device *d = &gg_devices[i];
        struct gg_gpu g;
        r = gg_driver_gpu(i, &g, &call);
        gg_progress();
        snprintf(d->name, sizeof d->name, "%s", g.name[0] ? g.name : "unknown GPU");
        names[i] = d->name;
        d->cc_major = g.cc_major;
        d->cc_minor = g.cc_minor;
        memcpy(d->uuid, g.uuid, sizeof d->uuid);
        d->total = g.total;
        if (r != 0) {
            d->total = 0;
            say(report, ctx, "GPU%d: %s failed (%s, %d); its memory is unknown: observing it only",
                i, call, gg_driver_error_name(r), r);
        }
        d->present = true;
    }
    gg_policy_select(proc->policy, names, n, policies, report, ctx);
    bool demoted[GG_MAX_DEVICES] = {false}, any = false, env_only = true;
    struct env_sink env = {report, ctx, "", 0};
    for (int i = 0; i < n; i++) {
        bool only;
        any |= demoted[i] = apply_policy(i, &gg_devices[i], &env, &only);
        if (demoted[i])
            env_only &= only;
    }
    if (any) { /* one line for them all, however many GPUs */
        char which[256];
        ranges(demoted, n, which, sizeof which);
        if (env_only && env.vars == 1) /* the variable is to blame, not a policy */
            say(report, ctx, "GPU%s: %s is not valid (above); observing only, nothing will be "
                "refused", which, env.first);
        else if (env_only && env.vars)
            say(report, ctx, "GPU%s: %s and %d more GPUGUARD_* values are not valid (above); "
                "observing only, nothing will be refused", which, env.first, env.vars - 1);
        else
            say(report, ctx, "GPU%s: policy problems above; observing only, nothing will be "
                "refused", which);
    }
    gg_device_count = n;
    join_peers(n, report, ctx);
    return n;
}

static void seen_peers(struct gg_device *d, const struct gg_peers_sum *s);

/* What the others did since the reading: the estimate follows it. */
static void note_peers(struct gg_device *d, const struct gg_peers_sum *s)
{
    uint64_t at = atomic_load_explicit(&d->peers_at_reading, memory_order_relaxed);
    int64_t delta = (int64_t)s->cur - (int64_t)at;
    int64_t was = atomic_exchange_explicit(&d->peers_delta, delta, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->used_offset, delta - was, memory_order_relaxed);
    seen_peers(d, s);
}

/* The most the others held and claimed, and the most of them, as seen. */
static void seen_peers(struct gg_device *d, const struct gg_peers_sum *s)
{
    gg_atomic_max(&d->peers_peak, s->cur + s->extra);
    int most = atomic_load_explicit(&d->peers_most, memory_order_relaxed);
    while (s->members > most &&
           !atomic_compare_exchange_weak_explicit(&d->peers_most, &most, s->members,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

void gg_device_peers(struct gg_device *d, struct gg_peers_sum *out)
{
    gg_peers_sum(&d->peers, out);
    if (gg_peers_on(&d->peers))
        note_peers(d, out);
}

uint64_t gg_device_refresh(struct gg_device *d, int dev, bool may_retain)
{
    uint64_t used;
    struct gg_peers_sum s;
    /* The others first: what they hold is in the reading, and what they do
     * after it follows (an allocation landing in between is counted twice,
     * never missed). */
    gg_peers_sum(&d->peers, &s);
    if (!gg_driver_read_used(dev, may_retain, &used))
        return gg_device_estimate(d);
    if (gg_peers_on(&d->peers)) { /* the others are in the reading: no delta from here */
        atomic_store_explicit(&d->peers_at_reading, s.cur, memory_order_relaxed);
        atomic_store_explicit(&d->peers_delta, 0, memory_order_relaxed);
        seen_peers(d, &s);
    }
    atomic_store_explicit(&d->last_reading_ns, gg_now_ns(), memory_order_relaxed);
    atomic_store_explicit(&d->used_offset,
                          (int64_t)used - (int64_t)atomic_load_explicit(&d->current,
                                                                        memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&d->read_once, true, memory_order_release);
    gg_atomic_max(&d->window_used, used);
    return used;
}

void gg_device_close_window(struct gg_device *d, struct gg_window *out)
{
    uint64_t cur = atomic_load(&d->current), used = gg_device_estimate(d);
    /* An allocation racing the boundary lands in one window or the next:
     * either way a real value, in order. */
    uint64_t peak = atomic_exchange(&d->window_peak, cur);
    uint64_t peak_used = atomic_exchange(&d->window_used, used);
    out->peak = peak > cur ? peak : cur;
    out->peak_used = peak_used > used ? peak_used : used;
    out->live = cur;
    gg_atomic_max(&d->peak_before, out->peak);
    gg_atomic_max(&d->used_before, out->peak_used);
    gg_atomic_max(&d->phase_peak, out->peak);
    gg_atomic_max(&d->phase_used, out->peak_used);
}

void gg_device_close_phase(struct gg_device *d, struct gg_window *out)
{
    gg_device_close_window(d, out);
    uint64_t peak = atomic_exchange(&d->phase_peak, out->live);
    uint64_t peak_used = atomic_exchange(&d->phase_used, gg_device_estimate(d));
    out->peak = peak > out->peak ? peak : out->peak;
    out->peak_used = peak_used > out->peak_used ? peak_used : out->peak_used;
}

void gg_devices_leave(void)
{
    for (int i = 0; i < gg_device_count; i++)
        gg_peers_leave(&gg_devices[i].peers);
}

void gg_devices_after_fork(void)
{
    for (int i = 0; i < GG_MAX_DEVICES; i++)
        gg_peers_after_fork(&gg_devices[i].peers);
}

#ifdef GG_TESTING
void gg_devices_reset(void)
{
    memset(gg_devices, 0, sizeof gg_devices);
    gg_device_count = 0;
}
#endif
