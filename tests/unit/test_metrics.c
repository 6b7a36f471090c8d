/* test_metrics.c - the metrics file (metrics.c): label values escaped as
 * the exposition format asks, every series of a used device and none of an
 * unused one, # HELP and # TYPE only for metrics with series, the file
 * written whole through a temporary name of its own at mode 0644 whatever
 * the umask, never through a symbolic link, named and labelled with the
 * process's instance id, a file another planted at its name replaced and
 * said once, at its interval, removed at exit (only when it is the file
 * this process put there) but not by a forked child, and never left behind
 * by a write racing the exit.
 *
 *   test_metrics                     the tests
 *   test_metrics rewrite DIR N US    rewrite DIR's file N times, US
 *                                    microseconds apart, gpuguard_step i and
 *                                    gpuguard_memory_used_bytes i MiB in the
 *                                    i-th (tests/e2e/test_metrics.py reads
 *                                    them through node_exporter meanwhile)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "advice.h"
#include "device.h"
#include "metrics.h"
#include "react.h"
#include "steps.h"
#include "torch.h"
#include "unit.h"

#define GiB (1ULL << 30)
#define MiB (1ULL << 20)

static char dir[] = "/tmp/gg_metrics_XXXXXX";
static char text[1 << 16];
static char instance[24];
/* The last of a process's labels: the job (SLURM_JOB_ID's), then the
 * instance id, as the file has them. */
static char LBL[160];

static void setup_devices(void)
{
    gg_devices_reset();
    for (int i = 0; i < 2; i++) {
        struct gg_device *d = &gg_devices[i];
        d->present = true;
        d->total = 24 * GiB;
        d->limit = 22 * GiB;
        d->near = GiB;
        snprintf(d->name, sizeof d->name, "NVIDIA \"Quoted\" GPU");
        snprintf(d->uuid, sizeof d->uuid, "GPU-0123abcd-%04d-4000-8000-00000000cafe", i);
    }
    gg_device_count = 2;
    /* device 0 is used (a refusal counts), device 1 never */
    atomic_store(&gg_devices[0].refusals, 2);
    atomic_store(&gg_devices[0].near_misses, 5);
    atomic_store(&gg_devices[0].current, 3 * GiB);
    atomic_store(&gg_devices[0].window_peak, 7 * GiB);
    atomic_store(&gg_devices[0].enforcing, true);
}

static struct gg_metrics_config config(const char *where, unsigned interval)
{
    return (struct gg_metrics_config){where, "GPUGUARD_METRICS_DIR", interval, "trainer",
                                      "host\"1", 3, -1, "job\\1\n"};
}

/* Names in dir (not . and ..), joined by spaces, sorted by readdir order. */
static int listing(const char *where, char *out, size_t cap)
{
    DIR *d = opendir(where);
    int n = 0;
    out[0] = '\0';
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        n++;
        strncat(out, e->d_name, cap - strlen(out) - 2);
        strncat(out, " ", cap - strlen(out) - 1);
    }
    if (d)
        closedir(d);
    return n;
}

static void test_escape(void)
{
    char out[64];
    CHECK(gg_metrics_escape(out, sizeof out, "a\\b\"c\nd") == 10);
    CHECK_STR(out, "a\\\\b\\\"c\\nd");
    /* UTF-8 kept, a byte that is not UTF-8 made '?' (Prometheus refuses it) */
    CHECK(gg_metrics_escape(out, sizeof out, "caf\xc3\xa9 \xff\xc3") == 8);
    CHECK_STR(out, "caf\xc3\xa9 ??");
    CHECK(gg_metrics_escape(out, sizeof out, "\xed\xa0\x80") == 3); /* a surrogate */
    CHECK_STR(out, "???");
    CHECK(gg_metrics_escape(out, 4, "abcd") == 0); /* no room: nothing, not half */
    CHECK_STR(out, "");
}

static void test_render(void)
{
    char want[1024];
    setup_devices();
    struct gg_device *d = &gg_devices[0];
    struct gg_metrics_config c = config(dir, 15);
    CHECK(gg_metrics_open(&c));
    /* steps whose peaks climb 400 MiB each: a forecast, and its advice,
     * which no trainer hears here (none registered, no handler): journaled,
     * not counted as advice given */
    uint64_t unheard = gg_react_unheard(0);
    struct gg_step_verdict v = {0};
    uint64_t step = 0, peak = 0;
    gg_steps_reset(0);
    while (!v.forecast && step < 40) {
        step++;
        peak = 12 * GiB + step * 400 * MiB;
        atomic_store(&d->current, peak);
        gg_atomic_max(&d->window_peak, peak);
        gg_atomic_max(&d->window_used, peak);
        atomic_store(&d->current, 3 * GiB);
        gg_steps_boundary(d, 0, step, true, NULL, &v);
        gg_react_step(0, step, &v);
    }
    CHECK(v.forecast && v.fc_step == step + 1);
    CHECK_EQ_U64(gg_react_unheard(0), unheard + 1);
    size_t n = gg_metrics_render(text, sizeof text);
    CHECK(n > 0 && n == strlen(text) && text[n - 1] == '\n');
    /* the labels, escaped, in DCGM's names and order first */
    snprintf(want, sizeof want,
             "\ngpuguard_memory_limit_bytes{gpu=\"0\",UUID=\"GPU-0123abcd-0000-4000-8000-"
             "00000000cafe\",modelName=\"NVIDIA \\\"Quoted\\\" GPU\",Hostname=\"host\\\"1\","
             "pid=\"%d\",comm=\"trainer\",rank=\"3\",local_rank=\"\",%s} %llu\n",
             (int)getpid(), LBL, 22 * GiB);
    CHECK(strstr(text, want) != NULL);
    CHECK(strstr(text, "\n# HELP gpuguard_memory_limit_bytes The policy's limit") != NULL);
    CHECK(strstr(text, "\n# TYPE gpuguard_memory_limit_bytes gauge\n") != NULL);
    CHECK(strstr(text, "\n# TYPE gpuguard_refusals_total counter\n") != NULL);
    CHECK(strstr(text, "} 2\n") != NULL);
    /* values from the counters */
    CHECK(strstr(text, "gpuguard_memory_used_bytes{gpu=\"0\"") != NULL);
    snprintf(want, sizeof want, "%s} %llu\n# HELP gpuguard_memory_peak_bytes", LBL,
             3 * GiB);
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s} %llu\n# HELP gpuguard_memory_limit_bytes", LBL,
             (unsigned long long)peak);
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s} %llu\n# HELP gpuguard_device_used_bytes", LBL,
             21 * GiB); /* the near-miss line: limit - margin */
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s} 1\n# HELP gpuguard_allocations_total", LBL);
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s} %llu\n# HELP gpuguard_forecast_step", LBL,
             (unsigned long long)step);
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s} %llu\n# HELP gpuguard_forecast_peak_bytes", LBL,
             (unsigned long long)step + 1);
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s} %llu\n# HELP gpuguard_leak_bytes_per_step", LBL,
             (unsigned long long)v.fc_bytes);
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s,reason=\"forecast\"} 0\n", LBL); /* not heard */
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s,reason=\"oom\"} 0\n", LBL);
    CHECK(strstr(text, want) != NULL);
    /* a process-wide metric: the process's labels only */
    CHECK(strstr(text, "\ngpuguard_start_time_seconds{Hostname=\"host\\\"1\",pid=") != NULL);
    /* the unused device has no series; a metric without any has no help */
    CHECK(strstr(text, "gpu=\"1\"") == NULL);
    CHECK(strstr(text, "gpuguard_batch_size") == NULL);
    CHECK(strstr(text, "gpuguard_torch_unallocated_bytes") == NULL); /* no view yet */
    CHECK(strstr(text, "gpuguard_torch_largest_free_bytes") == NULL);
    /* every line: a comment or a series; each metric's HELP, then TYPE */
    int helps = 0, types = 0;
    for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        if (!strncmp(line, "# HELP ", 7))
            helps++;
        else if (!strncmp(line, "# TYPE ", 7))
            types++;
        else
            CHECK(!strncmp(line, "gpuguard_", 9) && memchr(line, '}', (size_t)(nl - line)));
    }
    CHECK(helps == types && helps >= 18);
    /* too small a buffer: nothing, never half a file */
    CHECK(gg_metrics_render(text, n - 1) == 0);
    /* PyTorch's view (the instrumentation's answer): its free bytes and largest block */
    struct gpuguard_torch_view tv;
    memset(&tv, 0, sizeof tv);
    tv.dev = 0;
    snprintf(tv.why, sizeof tv.why, "oom");
    tv.reserved = 8 * GiB;
    tv.allocated = 5 * GiB;
    tv.largest_free = 512 * MiB;
    gg_torch_answer(&tv);
    CHECK(gg_metrics_render(text, sizeof text) > 0);
    snprintf(want, sizeof want, "%s} %llu\n# HELP gpuguard_torch_largest_free_bytes", LBL,
             3 * GiB);
    CHECK(strstr(text, want) != NULL);
    snprintf(want, sizeof want, "%s} %llu\n", LBL, 512 * MiB);
    CHECK(strstr(strstr(text, "\ngpuguard_torch_largest_free_bytes{"), want) != NULL);
    CHECK(strstr(text, "\n# TYPE gpuguard_torch_unallocated_bytes gauge\n") != NULL);
    gg_torch_reset();
}

static void captured(void (*fn)(void *), void *arg, char *out, size_t cap);
static void write_again(void *arg);

static void test_atomic_write(void)
{
    char names[1024], path[2048], victim[2048], buf[4096];
    struct stat st;
    setup_devices();
    struct gg_metrics_config c = config(dir, 15);
    CHECK(gg_metrics_open(&c));
    snprintf(path, sizeof path, "%s/gpuguard_host_1_%d_%s.prom", dir, (int)getpid(), instance);
    CHECK_STR(gg_metrics_path(), path);
    mode_t old = umask(077);
    CHECK(gg_metrics_write());
    umask(old);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644);
    CHECK(unit_slurp(path, text, sizeof text) > 0 && strstr(text, "# HELP gpuguard_") == text);
    /* the temporary file is gone: only the .prom is left */
    CHECK(listing(dir, names, sizeof names) == 1);
    /* a file at a name another could guess (the temporary name of old) is
     * not this process's: left alone, never written through */
    char planted[2048];
    snprintf(planted, sizeof planted, "%s/.gpuguard_host_1_%d_%s.prom.tmp", dir, (int)getpid(),
             instance);
    snprintf(victim, sizeof victim, "%s.victim", dir);
    FILE *f = fopen(victim, "w");
    fputs("precious\n", f);
    fclose(f);
    CHECK(symlink(victim, planted) == 0);
    CHECK(gg_metrics_write());
    CHECK(listing(dir, names, sizeof names) == 2);
    unit_slurp(victim, buf, sizeof buf);
    CHECK_STR(buf, "precious\n");
    unlink(planted);
    /* a symbolic link at the file's name is never followed, only replaced
     * (and said: this process did not put it there) */
    unlink(path);
    CHECK(symlink(victim, path) == 0);
    char said[4096];
    captured(write_again, NULL, said, sizeof said);
    CHECK(strstr(said, "a file this process did not write (uid 0), was in the way") != NULL);
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    unit_slurp(victim, buf, sizeof buf);
    CHECK_STR(buf, "precious\n");
    CHECK(listing(dir, names, sizeof names) == 1);
    unlink(victim);
    /* a clean exit removes it, and nothing is written after */
    gg_metrics_exit();
    CHECK(listing(dir, names, sizeof names) == 0);
    CHECK(!gg_metrics_write() && !gg_metrics_on());
    CHECK(listing(dir, names, sizeof names) == 0);
}

/* The instance id: 16 hex digits, the same for the process whenever asked,
 * and what the file and the labels carry. */
static void test_instance(void)
{
    char again[24];
    CHECK(strlen(instance) == 16 && strspn(instance, "0123456789abcdef") == 16);
    gg_metrics_instance(again, sizeof again);
    CHECK_STR(again, instance);
    /* another process (a forked child: its pid and start time) has another */
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char child[24];
        gg_metrics_instance(child, sizeof child);
        _exit(write(fds[1], child, 17) == 17 ? 0 : 1);
    }
    char child[24] = "";
    CHECK(read(fds[0], child, 17) == 17);
    waitpid(pid, NULL, 0);
    close(fds[0]);
    close(fds[1]);
    CHECK(strlen(child) == 16 && strcmp(child, instance) != 0);
}

/* stderr into a file while fn runs: what the shim said. *//* stderr into a file while fn runs: what the shim said. */
static void captured(void (*fn)(void *), void *arg, char *out, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "%s.err", dir);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
    fn(arg);
    dup2(saved, 2);
    close(saved);
    unit_slurp(path, out, cap);
    unlink(path);
}

static void open_and_write_twice(void *arg)
{
    struct gg_metrics_config c = config(arg, 15);
    gg_metrics_open(&c);
    gg_metrics_write();
    gg_metrics_write();
}

static void test_unusable_dir_is_said_once(void)
{
    char link[64], said[4096], names[256], sub[64];
    setup_devices();
    snprintf(link, sizeof link, "%s.link", dir);
    CHECK(symlink(dir, link) == 0);
    captured(open_and_write_twice, link, said, sizeof said);
    CHECK(strstr(said, "gpuguard: GPUGUARD_METRICS_DIR: ") == said);
    CHECK(strstr(said, "is a symbolic link, which the shim never follows") != NULL);
    CHECK(strchr(said, '\n') == said + strlen(said) - 1); /* one line */
    CHECK(listing(dir, names, sizeof names) == 0);        /* nothing through the link */
    strcat(link, "//"); /* which a trailing slash would follow */
    captured(open_and_write_twice, link, said, sizeof said);
    CHECK(strstr(said, "is a symbolic link, which the shim never follows") != NULL);
    CHECK(listing(dir, names, sizeof names) == 0);
    link[strlen(link) - 2] = '\0';
    unlink(link);
    /* a directory that is not there: one line, whatever the writes do */
    snprintf(sub, sizeof sub, "%s/not/there", dir);
    captured(open_and_write_twice, sub, said, sizeof said);
    CHECK(strstr(said, "cannot write metrics in ") != NULL);
    CHECK(strstr(said, "No such file or directory") != NULL);
    CHECK(strchr(said, '\n') == said + strlen(said) - 1);
    gg_metrics_reset();
}

static void open_and_write(void *arg)
{
    struct gg_metrics_config c = config(arg, 15);
    gg_metrics_open(&c);
    gg_metrics_write();
    gg_metrics_write();
}

static void write_again(void *arg)
{
    (void)arg;
    gg_metrics_write();
    gg_metrics_write();
}

/* A file at the name that this process did not write (another user planted
 * it, guessing the name): replaced by this process's own, said once; and
 * one put there after the last write is not this process's to remove. */
static void test_a_planted_file_is_replaced_and_said_once(void)
{
    char path[2048], said[4096], names[1024];
    setup_devices();
    snprintf(path, sizeof path, "%s/gpuguard_host_1_%d_%s.prom", dir, (int)getpid(), instance);
    FILE *f = fopen(path, "w");
    fputs("gpuguard_memory_used_bytes{pid=\"1\"} 9e99\n", f);
    fclose(f);
    CHECK(chown(path, 65534, 65534) == 0 || geteuid() != 0);
    captured(open_and_write, dir, said, sizeof said);
    CHECK(strstr(said, "gpuguard: GPUGUARD_METRICS_DIR: ") == said);
    CHECK(strstr(said, "a file this process did not write") != NULL);
    CHECK(strstr(said, "replaced by this process's own (said once)") != NULL);
    CHECK(strchr(said, '\n') == said + strlen(said) - 1); /* one line for two writes */
    CHECK(unit_slurp(path, text, sizeof text) > 0 && strstr(text, "9e99") == NULL);
    CHECK(strstr(text, "# HELP gpuguard_") == text);
    /* planted again after the last write: the exit leaves it (not ours) */
    unlink(path);
    f = fopen(path, "w");
    fputs("another's\n", f);
    fclose(f);
    gg_metrics_exit();
    CHECK(listing(dir, names, sizeof names) == 1);
    unit_slurp(path, text, sizeof text);
    CHECK_STR(text, "another's\n");
    unlink(path);
    /* and a write that finds its own file in place says nothing */
    setup_devices();
    captured(open_and_write, dir, said, sizeof said);
    captured(write_again, NULL, said, sizeof said);
    CHECK_STR(said, "");
    gg_metrics_exit();
    CHECK(listing(dir, names, sizeof names) == 0);
}

static void test_interval(void)
{
    struct stat st;
    setup_devices();
    struct gg_metrics_config c = config(dir, 5);
    CHECK(gg_metrics_open(&c));
    uint64_t t0 = 1000000000ull;
    gg_metrics_tick(t0); /* the first tick writes */
    CHECK(stat(gg_metrics_path(), &st) == 0);
    unlink(gg_metrics_path());
    gg_metrics_tick(t0 + 4900000000ull);
    CHECK(stat(gg_metrics_path(), &st) != 0);
    gg_metrics_tick(t0 + 5000000000ull);
    CHECK(stat(gg_metrics_path(), &st) == 0);
    gg_metrics_exit();
    CHECK(stat(gg_metrics_path(), &st) != 0);
}

static void test_forked_child_leaves_the_file(void)
{
    struct stat st;
    setup_devices();
    struct gg_metrics_config c = config(dir, 15);
    CHECK(gg_metrics_open(&c));
    CHECK(gg_metrics_write());
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        gg_metrics_after_fork();
        bool wrote = gg_metrics_write();
        gg_metrics_exit();
        _exit(wrote ? 1 : 0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(stat(gg_metrics_path(), &st) == 0);
    gg_metrics_exit();
    CHECK(stat(gg_metrics_path(), &st) != 0);
}

/* The shim's thread writes while the exit runs: never a file left after. */
static _Atomic bool stop_writing;

static void *writer(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_writing))
        gg_metrics_write();
    return NULL;
}

static void test_exit_racing_a_write(void)
{
    char names[1024];
    setup_devices();
    for (int round = 0; round < 20; round++) {
        struct gg_metrics_config c = config(dir, 15);
        CHECK(gg_metrics_open(&c));
        pthread_t t;
        atomic_store(&stop_writing, false);
        pthread_create(&t, NULL, writer, NULL);
        struct timespec ts = {0, 200000 + round * 50000};
        nanosleep(&ts, NULL);
        gg_metrics_exit();
        atomic_store(&stop_writing, true);
        pthread_join(t, NULL);
        CHECK(listing(dir, names, sizeof names) == 0);
    }
    gg_metrics_reset();
}

/* For the end-to-end test: N rewrites, each consistent in itself. */
static int rewrite(const char *where, long n, long pause_us)
{
    setup_devices();
    struct gg_metrics_config c = config(where, 15);
    if (!gg_metrics_open(&c))
        return 1;
    struct gpuguard_torch_view tv;
    memset(&tv, 0, sizeof tv);
    snprintf(tv.why, sizeof tv.why, "near_miss");
    tv.reserved = 2 * GiB;
    tv.allocated = GiB;
    tv.largest_free = 256 * MiB;
    gg_torch_answer(&tv); /* PyTorch's view: its metrics have series too */
    for (long i = 1; i <= n; i++) {
        struct gg_step_verdict v;
        gg_steps_boundary(&gg_devices[0], 0, (uint64_t)i, false, NULL, &v);
        atomic_store(&gg_devices[0].current, (uint64_t)i * MiB);
        atomic_store(&gg_devices[0].window_peak, (uint64_t)i * MiB);
        if (!gg_metrics_write())
            return 1;
        struct timespec ts = {pause_us / 1000000, (pause_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    printf("rewrote %ld\n", n);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "rewrite"))
        return rewrite(argv[2], atol(argv[3]), atol(argv[4]));
    if (!unit_tmpdir(dir)) {
        perror("mkdtemp");
        return 1;
    }
    gg_metrics_instance(instance, sizeof instance);
    snprintf(LBL, sizeof LBL, "hpc_job=\"job\\\\1\\n\",instance_id=\"%s\"", instance);
    RUN(test_escape);
    RUN(test_instance);
    RUN(test_render);
    RUN(test_atomic_write);
    RUN(test_unusable_dir_is_said_once);
    RUN(test_a_planted_file_is_replaced_and_said_once);
    RUN(test_interval);
    RUN(test_forked_child_leaves_the_file);
    RUN(test_exit_racing_a_write);
    rmdir(dir);
    return unit_done();
}
