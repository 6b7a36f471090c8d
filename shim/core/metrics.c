/* metrics.c - layer 4: the process's figures in Prometheus's text format,
 * written by the shim's thread (see metrics.h, docs/metrics.md). */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "advice.h"
#include "device.h"
#include "events.h"
#include "policy.h"
#include "prim.h"
#include "react.h"
#include "steps.h"
#include "torch.h"

/* ---- the rows of metrics.def ------------------------------------------------------ */

enum scope { SCOPE_PROCESS, SCOPE_DEVICE, SCOPE_ADVICE };

enum metric_id {
#define METRIC(id, name, type, labels, help) M_##id,
#include "metrics.def"
#undef METRIC
    METRICS
};

static const struct {
    const char *name, *type, *help;
    enum scope scope;
} metric[METRICS] = {
#define METRIC(id, name, type, labels, help) [M_##id] = {#name, #type, help, SCOPE_##labels},
#include "metrics.def"
#undef METRIC
};

/* The `reason` label of gpuguard_advice_total: the journal's names of the
 * causes (advice.h). */
static const char *const reason_label[GG_REASON_FORECAST + 1] = {
    [GG_REASON_NEAR_MISS] = "near_miss", [GG_REASON_REFUSED] = "refused",
    [GG_REASON_OOM] = "oom", [GG_REASON_FORECAST] = "forecast"};

/* ---- state: set by open (before the shim's thread starts), then read ------------- */

#define PROC_LABELS 1700 /* Hostname (255), comm (63), hpc_job (255), escaped, and the rest */
#define DEV_LABELS 700   /* gpu, UUID, modelName (255, escaped) */
#define JOB_MAX 256

enum { GATE_OPEN, GATE_RENAMING, GATE_CLOSED };

static struct {
    bool on;
    char dir[GG_PATH_MAX];
    char setting[GG_PATH_MAX + 16];
    char name[320], tmp[360];
    char instance[24];                   /* the instance id: in the file name and a label */
    struct stat file;                    /* the file this process last put in place */
    bool placed;
    bool squat_said;                     /* a file this process did not write was said */
    char path[GG_PATH_MAX + 340];
    uint64_t interval_ns, next_ns;
    double start_wall;
    char proc[PROC_LABELS];              /* Hostname="...",...,job="..." */
    char dev[GG_MAX_DEVICES][DEV_LABELS]; /* gpu="0",UUID="...",modelName="..." */
    int ndev;
    char *buf;                           /* the file's text: pages, sized at open */
    size_t cap;
    bool said;                           /* a failure was said */
} m;

/* The exit closes the gate: a write under way then renames nothing, and
 * the exit waits for a rename already started. */
static _Atomic int gate = GATE_OPEN;

/* ---- text -------------------------------------------------------------------------- */

struct out {
    char *p;
    size_t len, cap;
    bool full;
};

static void put(struct out *o, const char *s, size_t n)
{
    if (o->full || n > o->cap - o->len) {
        o->full = true;
        return;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void put_str(struct out *o, const char *s)
{
    put(o, s, strlen(s));
}

static void put_u64(struct out *o, uint64_t v)
{
    char t[24];
    size_t i = sizeof t;
    do
        t[--i] = (char)('0' + v % 10);
    while (v /= 10);
    put(o, t + i, sizeof t - i);
}

static void put_real(struct out *o, double v)
{
    char t[48];
    int n = snprintf(t, sizeof t, "%.3f", v);
    if (n > 0 && (size_t)n < sizeof t)
        put(o, t, (size_t)n);
}

/* The length of a valid UTF-8 sequence at s (1-4), or 0. */
static size_t utf8_len(const unsigned char *s)
{
    if (s[0] < 0x80)
        return 1;
    size_t n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    for (size_t k = 1; k < n; k++)
        if ((s[k] & 0xc0) != 0x80)
            return 0;
    if (n == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0)))
        return 0; /* overlong, surrogate */
    if (n == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90)))
        return 0; /* overlong, past U+10FFFF */
    return n;
}

/* Label values and help: \ " and newline escaped (help keeps its quotes, as
 * the format asks), bytes that are not UTF-8 made '?', which Prometheus
 * would refuse. */
static void put_escaped(struct out *o, const char *s, bool label)
{
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        size_t n = utf8_len(u);
        if (*u == '\\')
            put(o, "\\\\", 2);
        else if (*u == '\n')
            put(o, "\\n", 2);
        else if (*u == '"' && label)
            put(o, "\\\"", 2);
        else if (n == 0)
            put(o, "?", 1);
        else {
            put(o, (const char *)u, n);
            u += n;
            continue;
        }
        u++;
    }
}

#ifdef GG_TESTING
size_t gg_metrics_escape(char *out, size_t cap, const char *s)
{
    struct out o = {out, 0, cap ? cap - 1 : 0, cap == 0};
    put_escaped(&o, s, true);
    if (o.full || !cap) {
        if (cap)
            out[0] = '\0';
        return 0;
    }
    out[o.len] = '\0';
    return o.len;
}
#endif

/* `key="value"` into o, with a comma before all but the first. */
static void label(struct out *o, const char *key, const char *value)
{
    if (o->len)
        put(o, ",", 1);
    put_str(o, key);
    put(o, "=\"", 2);
    put_escaped(o, value, true);
    put(o, "\"", 1);
}

/* ---- values ------------------------------------------------------------------------ */

struct value {
    bool ok, real;
    uint64_t u;
    double f;
};

static struct value whole(uint64_t u)
{
    return (struct value){true, false, u, 0};
}

static struct value process_value(enum metric_id id, double now_wall)
{
    struct value none = {0};
    int batch, accum;
    switch (id) {
    case M_start_time:
        return (struct value){true, true, 0, m.start_wall};
    case M_write_time:
        return (struct value){true, true, 0, now_wall};
    case M_batch_size:
    case M_grad_accum:
        if (!gg_advice_current(&batch, &accum) || batch <= 0)
            return none;
        return whole((uint64_t)(id == M_batch_size ? batch : (accum > 0 ? accum : 1)));
    default:
        return none;
    }
}

static struct value device_value(enum metric_id id, int dev, const struct gg_device *d)
{
    struct value none = {0};
    struct gg_steps_now s;
    switch (id) {
    case M_memory_used:
        return whole(atomic_load_explicit(&d->current, memory_order_relaxed));
    case M_memory_peak:
        return whole(gg_device_peak(d));
    case M_memory_limit:
        return d->total ? whole(d->limit) : none;
    case M_near_miss_line:
        return d->total ? whole(gg_device_line(d)) : none;
    case M_device_used:
        return whole(gg_device_estimate(d));
    case M_device_peak:
        return whole(gg_device_peak_used(d));
    case M_device_memory:
        return d->total ? whole(d->total) : none;
    case M_enforcing:
        return whole(atomic_load_explicit(&d->enforcing, memory_order_relaxed) ? 1 : 0);
    case M_allocations:
        return whole(gg_ledger_allocs(dev));
    case M_frees:
        return whole(gg_ledger_frees(dev));
    case M_near_misses:
        return whole(atomic_load_explicit(&d->near_misses, memory_order_relaxed));
    case M_refusals:
        return whole(atomic_load_explicit(&d->refusals, memory_order_relaxed));
    case M_ooms:
        return whole(atomic_load_explicit(&d->ooms, memory_order_relaxed));
    case M_step:
    case M_forecast_step:
    case M_forecast_peak:
    case M_leak_rate:
    case M_leak_projected:
        gg_steps_now(dev, &s);
        return whole(id == M_step            ? s.step
                     : id == M_forecast_step ? s.fc_step
                     : id == M_forecast_peak ? s.fc_bytes
                     : id == M_leak_rate     ? s.leak_rate
                                             : s.leak_projected);
    case M_torch_unalloc:
    case M_torch_largest: {
        uint64_t unallocated, largest;
        if (!gg_torch_last_view(dev, &unallocated, &largest))
            return none;
        return whole(id == M_torch_unalloc ? unallocated : largest);
    }
    default:
        return none;
    }
}

/* One line: name{labels} value. */
static void sample(struct out *o, enum metric_id id, int dev, const char *reason, struct value v)
{
    put_str(o, metric[id].name);
    put(o, "{", 1);
    if (dev >= 0) {
        put_str(o, m.dev[dev]);
        put(o, ",", 1);
    }
    put_str(o, m.proc);
    if (reason) {
        put(o, ",reason=\"", 9);
        put_str(o, reason);
        put(o, "\"", 1);
    }
    put(o, "} ", 2);
    if (v.real)
        put_real(o, v.f);
    else
        put_u64(o, v.u);
    put(o, "\n", 1);
}

/* A metric's # HELP, # TYPE and series; nothing at all when it has none. */
static void family(struct out *o, enum metric_id id, double now_wall)
{
    size_t at = o->len;
    int n = 0;
    put(o, "# HELP ", 7);
    put_str(o, metric[id].name);
    put(o, " ", 1);
    put_escaped(o, metric[id].help, false);
    put(o, "\n# TYPE ", 8);
    put_str(o, metric[id].name);
    put(o, " ", 1);
    put_str(o, metric[id].type);
    put(o, "\n", 1);
    if (metric[id].scope == SCOPE_PROCESS) {
        struct value v = process_value(id, now_wall);
        if (v.ok) {
            sample(o, id, -1, NULL, v);
            n++;
        }
    }
    for (int i = 0; metric[id].scope != SCOPE_PROCESS && i < m.ndev; i++) {
        const struct gg_device *d = gg_device(i);
        if (!d || !gg_device_in_use(d, i))
            continue;
        if (metric[id].scope == SCOPE_ADVICE) {
            for (int r = 0; r <= GG_REASON_FORECAST; r++, n++)
                sample(o, id, i, reason_label[r], whole(gg_react_advised(i, r)));
            continue;
        }
        struct value v = device_value(id, i, d);
        if (v.ok) {
            sample(o, id, i, NULL, v);
            n++;
        }
    }
    if (!n)
        o->len = at;
}

size_t gg_metrics_render(char *buf, size_t cap)
{
    struct out o = {buf, 0, cap, false};
    double now_wall = gg_wall_s();
    for (int id = 0; id < METRICS; id++)
        family(&o, (enum metric_id)id, now_wall);
    if (o.full)
        return 0;
    if (o.len < cap)
        buf[o.len] = '\0'; /* not counted: a family without series left its text behind */
    return o.len;
}

/* The most the text can take: every series of every metric. */
static size_t capacity(void)
{
    size_t cap = 64, proc = strlen(m.proc);
    for (int id = 0; id < METRICS; id++) {
        size_t name = strlen(metric[id].name), line = name + proc + 2 + 1 + 32 + 1;
        cap += 2 * name + 2 * strlen(metric[id].help) + strlen(metric[id].type) + 20;
        if (metric[id].scope == SCOPE_PROCESS) {
            cap += line;
            continue;
        }
        for (int i = 0; i < m.ndev; i++)
            cap += (line + strlen(m.dev[i]) + 1 + 24) *
                   (metric[id].scope == SCOPE_ADVICE ? GG_REASON_FORECAST + 1 : 1);
    }
    return (cap + 4095) & ~(size_t)4095;
}

/* ---- the file ------------------------------------------------------------------------ */

/* A problem with the directory: said once (stderr and an `error` line). */
static void fail(const char *what, int err)
{
    if (m.said)
        return;
    m.said = true;
    gg_events_error("%s: cannot write metrics in %s: %s%s%s; tried again every %llu s (said once)",
                    m.setting, m.dir, what, err ? ": " : "", err ? strerror(err) : "",
                    (unsigned long long)(m.interval_ns / 1000000000ull));
}

static int open_dir(void)
{
    return open(m.dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* 64 unpredictable bits: the temporary file's name, which another user of a
 * shared directory must not be able to take first. */
static uint64_t unpredictable(void)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return gg_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ gg_now_ns() ^
                    ((uint64_t)getpid() << 16) ^ (uintptr_t)&r);
}

/* A temporary file of this process's own, in the directory: a name no one
 * can guess (another user may write the directory), created O_EXCL, never
 * through a link. Its name in m.tmp; -1 when none could be made. */
static int create_tmp(int dir)
{
    for (int tries = 0; tries < 8; tries++) {
        snprintf(m.tmp, sizeof m.tmp, ".%s.%016llx.tmp", m.name,
                 (unsigned long long)unpredictable());
        int fd = openat(dir, m.tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    return -1;
}

/* Is st the file this process put at the name last (its inode, as the
 * rename left it: an inode number reused since has another change time)? */
static bool same_file(const struct stat *st)
{
    return m.placed && st->st_dev == m.file.st_dev && st->st_ino == m.file.st_ino &&
           st->st_ctim.tv_sec == m.file.st_ctim.tv_sec &&
           st->st_ctim.tv_nsec == m.file.st_ctim.tv_nsec && st->st_uid == m.file.st_uid;
}

static bool ours(int dir)
{
    struct stat st;
    return fstatat(dir, m.name, &st, AT_SYMLINK_NOFOLLOW) == 0 && same_file(&st);
}

/* A file at the name that this process did not write (another user's, in a
 * directory others can write; its owner: uid): said once, with what was
 * done about it. */
static void squatted(unsigned uid, bool replaced, int err)
{
    if (m.squat_said)
        return;
    m.squat_said = true;
    if (replaced)
        gg_events_error("%s: %s/%s, a file this process did not write (uid %u), was in the way; "
                        "replaced by this process's own (said once)", m.setting, m.dir, m.name,
                        uid);
    else
        gg_events_error("%s: %s/%s belongs to uid %u, not to this process, and cannot be "
                        "replaced (%s): no metrics from this process while it is there; it is "
                        "never written through nor served as this process's (said once)",
                        m.setting, m.dir, m.name, uid, strerror(err));
}

static bool write_file(const char *text, size_t len)
{
    int dir = open_dir();
    if (dir < 0) {
        fail(errno == ENOTDIR || errno == ELOOP ? "not a directory (or a symbolic link, never "
                                                  "followed)" : "cannot open it", errno);
        return false;
    }
    int fd = create_tmp(dir);
    if (fd < 0) {
        fail("cannot create a file", errno);
        close(dir);
        return false;
    }
    /* 0644 whatever the umask: node_exporter reads it as its own user. */
    struct stat st;
    bool ok = fchmod(fd, 0644) == 0 && gg_write_all(fd, text, len) && fstat(fd, &st) == 0;
    int err = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        unlinkat(dir, m.tmp, 0);
        fail("cannot write a file", err);
        close(dir);
        return false;
    }
    int expected = GATE_OPEN;
    if (!atomic_compare_exchange_strong(&gate, &expected, GATE_RENAMING)) {
        unlinkat(dir, m.tmp, 0); /* closed by the exit meanwhile */
        close(dir);
        return false;
    }
    struct stat there;
    bool foreign = fstatat(dir, m.name, &there, AT_SYMLINK_NOFOLLOW) == 0 && !same_file(&there);
    ok = renameat(dir, m.tmp, dir, m.name) == 0;
    err = errno;
    struct stat placed;
    m.placed = false; /* until the name holds the file just written (st: its inode) */
    if (ok && fstatat(dir, m.name, &placed, AT_SYMLINK_NOFOLLOW) == 0 &&
        placed.st_dev == st.st_dev && placed.st_ino == st.st_ino) {
        m.file = placed; /* with the change time the rename gave it */
        m.placed = true;
    }
    expected = GATE_RENAMING; /* an exit that gave up waiting closed it: it stays closed */
    atomic_compare_exchange_strong(&gate, &expected, GATE_OPEN);
    if (!ok) {
        unlinkat(dir, m.tmp, 0);
        if (foreign && (err == EPERM || err == EACCES || err == EBUSY || err == EISDIR ||
                        err == ENOTEMPTY))
            squatted((unsigned)there.st_uid, false, err); /* another's, in a sticky directory */
        else
            fail("cannot rename a file into place", err);
    } else if (foreign) {
        squatted((unsigned)there.st_uid, true, 0);
    }
    close(dir);
    return ok;
}

bool gg_metrics_write(void)
{
    if (!gg_metrics_on())
        return false;
    int saved = errno;
    size_t len = gg_metrics_render(m.buf, m.cap);
    bool ok = len && write_file(m.buf, len);
    if (!len)
        fail("the metrics did not fit their buffer", 0);
    errno = saved;
    return ok;
}

void gg_metrics_tick(uint64_t now_ns)
{
    if (!gg_metrics_on() || now_ns < m.next_ns)
        return;
    m.next_ns = now_ns + m.interval_ns;
    (void)gg_metrics_write();
}

bool gg_metrics_on(void)
{
    return m.on && atomic_load(&gate) != GATE_CLOSED;
}

#ifdef GG_TESTING
const char *gg_metrics_path(void)
{
    return m.on ? m.path : "";
}
#endif

void gg_metrics_exit(void)
{
    if (!m.on)
        return;
    /* Close the gate; a rename under way is waited for (it is one system
     * call), at most 200 ms on a stalled file system. */
    for (int i = 0; i < 2000; i++) {
        int expected = GATE_OPEN;
        if (atomic_compare_exchange_strong(&gate, &expected, GATE_CLOSED))
            break;
        if (expected == GATE_CLOSED)
            return; /* a forked child, or closed already: not ours to remove */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&gate, GATE_CLOSED);
    int saved = errno, dir = open_dir();
    if (dir >= 0) {
        if (ours(dir)) /* never a file this process did not put there */
            unlinkat(dir, m.name, 0);
        close(dir);
    }
    errno = saved;
}

void gg_metrics_after_fork(void)
{
    atomic_store(&gate, GATE_CLOSED);
}

/* ---- opening --------------------------------------------------------------------------- */

/* A host name as part of a file name: letters, digits, '.', '-', '_'. */
static void file_safe(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 1 < cap; s++) {
        char c = *s;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '-' || c == '_';
        out[n++] = ok ? c : '_';
    }
    out[n] = '\0';
    if (!n || out[0] == '.')
        out[0] = n ? '_' : '\0';
}

static void labels(const struct gg_metrics_config *c)
{
    char num[32], rank[32] = "", local[32] = "";
    struct out o = {m.proc, 0, sizeof m.proc - 1, false};
    snprintf(num, sizeof num, "%d", (int)getpid());
    if (c->rank >= 0)
        snprintf(rank, sizeof rank, "%ld", c->rank);
    if (c->local_rank >= 0)
        snprintf(local, sizeof local, "%ld", c->local_rank);
    label(&o, "Hostname", c->host ? c->host : "");
    label(&o, "pid", num);
    label(&o, "comm", c->comm ? c->comm : "");
    label(&o, "rank", rank);
    label(&o, "local_rank", local);
    label(&o, "hpc_job", c->job ? c->job : "");
    label(&o, "instance_id", m.instance);
    m.proc[o.full ? 0 : o.len] = '\0';
    m.ndev = gg_device_count < GG_MAX_DEVICES ? gg_device_count : GG_MAX_DEVICES;
    for (int i = 0; i < m.ndev; i++) {
        struct out d = {m.dev[i], 0, sizeof m.dev[i] - 1, false};
        snprintf(num, sizeof num, "%d", i);
        label(&d, "gpu", num);
        label(&d, "UUID", gg_devices[i].uuid);
        label(&d, "modelName", gg_devices[i].name);
        m.dev[i][d.full ? 0 : d.len] = '\0';
    }
}

/* The first line of a small file under /proc, without its newline ("" when
 * unreadable). */
static void read_line(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    out[n > 0 ? n : 0] = '\0';
    char *nl = strchr(out, '\n');
    if (nl)
        *nl = '\0';
}

void gg_metrics_instance(char *out, size_t cap)
{
    char boot[64], stat_line[1024];
    struct stat ns;
    read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    uint64_t pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
    /* the process's start time: field 22 of its stat line, after its name's ')' */
    read_line("/proc/self/stat", stat_line, sizeof stat_line);
    uint64_t started = 0;
    char *p = strrchr(stat_line, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (p)
        started = strtoull(p + 1, NULL, 10);
    uint64_t h = gg_hash_bytes(boot, strlen(boot));
    h = gg_mix64(h ^ pidns);
    h = gg_mix64(h ^ started);
    h = gg_mix64(h ^ (uint64_t)getpid());
    snprintf(out, cap, "%016llx", (unsigned long long)h);
}

/* Said at the start: a directory the writes will not get through. */
static void check_dir(void)
{
    struct stat st;
    if (lstat(m.dir, &st) == 0 && S_ISLNK(st.st_mode)) {
        m.said = true;
        gg_events_error("%s: %s is a symbolic link, which the shim never follows; no metrics there",
                        m.setting, m.dir);
        return;
    }
    int dir = open_dir();
    if (dir < 0) {
        fail("cannot open it", errno);
        return;
    }
    if (faccessat(dir, ".", W_OK | X_OK, AT_EACCESS) != 0)
        fail("not writable", errno);
    close(dir);
}

bool gg_metrics_open(const struct gg_metrics_config *c)
{
    char host[256];
    gg_metrics_reset();
    if (!c->dir || !c->dir[0])
        return false;
    snprintf(m.dir, sizeof m.dir, "%s", c->dir);
    /* "dir/" would follow a symbolic link named dir: not a trailing slash */
    for (size_t n = strlen(m.dir); n > 1 && m.dir[n - 1] == '/'; n--)
        m.dir[n - 1] = '\0';
    snprintf(m.setting, sizeof m.setting, "%s", c->setting ? c->setting : "GPUGUARD_METRICS_DIR");
    m.interval_ns = (uint64_t)(c->interval_s ? c->interval_s : 15) * 1000000000ull;
    m.start_wall = gg_wall_s() - gg_clock_since_start();
    file_safe(host, sizeof host, c->host ? c->host : "");
    gg_metrics_instance(m.instance, sizeof m.instance);
    snprintf(m.name, sizeof m.name, "gpuguard_%s_%d_%s.prom", host, (int)getpid(), m.instance);
    m.tmp[0] = '\0';
    snprintf(m.path, sizeof m.path, "%s/%s", m.dir, m.name);
    labels(c);
    m.cap = capacity();
    m.buf = gg_pages(m.cap);
    if (!m.buf) {
        gg_events_error("%s: no memory for the metrics (%zu bytes); no metrics", m.setting, m.cap);
        return false;
    }
    m.on = true;
    check_dir();
    return true;
}

void gg_metrics_start(const struct gg_process *p, const char *comm, const char *host)
{
    const struct gg_policy *pol = gg_device_policy(0);
    char setting[GG_PATH_MAX + 16], job[JOB_MAX] = "";
    bool too_long = false;
    if (!pol || !pol->s.metrics_dir[0])
        return;
    if (pol->from_env[GG_SET_metrics_dir])
        snprintf(setting, sizeof setting, "%s", gg_setting_info[GG_SET_metrics_dir].env);
    else if (pol->line[GG_SET_metrics_dir])
        snprintf(setting, sizeof setting, "%s:%d", pol->file, pol->line[GG_SET_metrics_dir]);
    else
        snprintf(setting, sizeof setting, "[journal] metrics_dir");
    /* The job: Slurm's, else torchrun's (elastic) run id. */
    static const char *const job_env[] = {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"};
    for (size_t k = 0; k < GG_COUNT(job_env) && !job[0]; k++) {
        if (!gg_env_copy(job_env[k], job, sizeof job, &too_long) && too_long)
            gg_events_error("%s: longer than %d characters; not a job label", job_env[k],
                            JOB_MAX - 1);
    }
    struct gg_metrics_config c = {pol->s.metrics_dir, setting, (unsigned)pol->s.metrics_interval,
                                  comm, host, p->rank, p->local_rank, job};
    (void)gg_metrics_open(&c);
}

void gg_metrics_reset(void)
{
    /* Not a memset of the whole: the label tables are pages of their own
     * that a process using one GPU never touches past the first. */
    if (m.buf)
        gg_pages_free(m.buf, m.cap);
    m.buf = NULL;
    m.cap = 0;
    m.on = m.said = m.placed = m.squat_said = false;
    m.next_ns = 0;
    m.ndev = 0;
    m.proc[0] = m.dir[0] = '\0';
    atomic_store(&gate, GATE_OPEN);
}
