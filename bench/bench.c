/*
 * bench.c - the measuring half of `make bench` (docs/costs.md).
 *
 * An ordinary CUDA program, linked against the (fake) runtime like the test
 * programs. It measures one thing per run and prints one JSON line per
 * result; bench/run.py runs it with and without LD_PRELOAD=libgpuguard.so,
 * interleaves the repetitions, keeps the best and prints the table.
 * Nothing here asserts: a figure is printed, never judged.
 *
 *   bench pairs N THREADS DEPTH REPS SIZE
 *       THREADS threads share N cudaMalloc(SIZE)+cudaFree pairs (N/THREADS
 *       each), from a call stack DEPTH frames deeper than the thread's own
 *       (so a captured stack is as deep as the policy lets it be). Each
 *       thread warms up first (context, shim start, first peak). REPS timed
 *       repetitions; each prints wall time over all threads.
 *   bench live N SIZE
 *       resident memory with N live cudaMalloc(SIZE) allocations against
 *       none (after a warm-up pair), then frees them.
 *   bench startup RUNS SHIM CMD [ARGS...]
 *       spawns CMD RUNS times without and RUNS times with LD_PRELOAD=SHIM,
 *       interleaved (ABBA), and prints the wall time of each run.
 *   bench soak SECONDS SIZE
 *       cudaMalloc(SIZE)+cudaFree pairs for SECONDS: memory oscillating across
 *       the timeline's sample step when SIZE is over 1% of the device. Prints
 *       the pairs done; run.py weighs the journal it left.
 *   bench steps SITES STEPS LEAK
 *       SITES allocations held live, each from a call stack of its own (so
 *       as many sites), then STEPS training steps: 8 allocation pairs and
 *       gpuguard_step(n), which is timed; with LEAK 1 every step also keeps
 *       32 MiB for good, so the leak check and its site scan run too. Prints
 *       the time of each gpuguard_step, or "absent" without the shim.
 */
#include <cuda_runtime_api.h>

#include "gpuguard.h" /* gpuguard_step: found at run time, absent without the shim */

#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fail(const char *what, int code)
{
    fprintf(stderr, "bench: %s: error %d\n", what, code);
    exit(1);
}

static long arg_long(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0) {
        fprintf(stderr, "bench: bad %s: %s\n", what, s);
        exit(2);
    }
    return v;
}

/* ---- pairs ------------------------------------------------------------------ */

struct job {
    long n;              /* pairs per repetition */
    size_t size;
    int depth;
    int reps;
    uint64_t t0, t1;     /* this repetition */
    int err;
};

static pthread_barrier_t g_start, g_done;
static volatile int g_sink;

static __attribute__((noinline)) int pair_loop(long n, size_t size)
{
    for (long i = 0; i < n; i++) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, size);
        if (e != cudaSuccess)
            return (int)e;
        if ((e = cudaFree(p)) != cudaSuccess)
            return (int)e;
    }
    return 0;
}

/* DEPTH frames of its own, then the loop: not a tail call (the store after
 * the call), so each level stays on the stack. */
static __attribute__((noinline)) int deep(int d, long n, size_t size)
{
    if (d <= 0)
        return pair_loop(n, size);
    int r = deep(d - 1, n, size);
    g_sink = d;
    return r;
}

static void *pair_thread(void *arg)
{
    struct job *j = arg;
    /* Warm-up: the thread's context, the shim's start, the device's peak. */
    j->err = deep(j->depth, j->n / 10 + 100, j->size);
    for (int r = 0; r < j->reps; r++) {
        pthread_barrier_wait(&g_start);
        j->t0 = now_ns();
        int e = j->err ? j->err : deep(j->depth, j->n, j->size);
        j->t1 = now_ns();
        if (e && !j->err)
            j->err = e;
        pthread_barrier_wait(&g_done);
    }
    return NULL;
}

static int run_pairs(long n, int threads, int depth, int reps, size_t size)
{
    if (threads < 1 || threads > 1024 || reps < 1 || n < threads) {
        fprintf(stderr, "bench: pairs N THREADS DEPTH REPS SIZE: bad arguments\n");
        return 2;
    }
    long per = n / threads;
    struct job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!jobs || !th)
        fail("out of memory", 0);
    pthread_barrier_init(&g_start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&g_done, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        jobs[i] = (struct job){.n = per, .size = size, .depth = depth, .reps = reps};
        int e = pthread_create(&th[i], NULL, pair_thread, &jobs[i]);
        if (e)
            fail("pthread_create", e);
    }
    printf("{\"mode\":\"pairs\",\"threads\":%d,\"pairs\":%ld,\"depth\":%d,\"size\":%zu,\"ns\":[",
           threads, per * threads, depth, size);
    for (int r = 0; r < reps; r++) {
        pthread_barrier_wait(&g_start);
        pthread_barrier_wait(&g_done);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < threads; i++) {
            if (jobs[i].t0 < lo)
                lo = jobs[i].t0;
            if (jobs[i].t1 > hi)
                hi = jobs[i].t1;
        }
        printf("%s%llu", r ? "," : "", (unsigned long long)(hi - lo));
    }
    int err = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].err && !err)
            err = jobs[i].err;
    }
    printf("],\"err\":%d}\n", err);
    pthread_barrier_destroy(&g_start);
    pthread_barrier_destroy(&g_done);
    free(jobs);
    free(th);
    return err ? 1 : 0;
}

/* ---- live ------------------------------------------------------------------- */

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, resident = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%llu %llu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int run_live(long n, size_t size)
{
    void **ptrs = malloc((size_t)n * sizeof *ptrs);
    if (!ptrs)
        fail("out of memory", 0);
    memset(ptrs, 0, (size_t)n * sizeof *ptrs); /* resident before the baseline */
    void *p;
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess || (e = cudaFree(p)) != cudaSuccess)
        fail("warm-up", (int)e);
    uint64_t before = rss_bytes();
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
        if ((e = cudaMalloc(&ptrs[i], size)) != cudaSuccess)
            fail("cudaMalloc", (int)e);
    uint64_t t1 = now_ns();
    uint64_t after = rss_bytes();
    for (long i = 0; i < n; i++)
        if ((e = cudaFree(ptrs[i])) != cudaSuccess)
            fail("cudaFree", (int)e);
    uint64_t t2 = now_ns();
    printf("{\"mode\":\"live\",\"allocs\":%ld,\"size\":%zu,\"rss_before\":%llu,"
           "\"rss_after\":%llu,\"alloc_ns\":%llu,\"free_ns\":%llu}\n",
           n, size, (unsigned long long)before, (unsigned long long)after,
           (unsigned long long)(t1 - t0), (unsigned long long)(t2 - t1));
    free(ptrs);
    return 0;
}

/* ---- startup ---------------------------------------------------------------- */

static uint64_t spawn_once(char **argv, char **envp)
{
    pid_t pid;
    int st;
    uint64_t t0 = now_ns();
    int e = posix_spawnp(&pid, argv[0], NULL, NULL, argv, envp);
    if (e)
        fail("posix_spawn", e);
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            fail("waitpid", errno);
    uint64_t t1 = now_ns();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail("child exit status", st);
    return t1 - t0;
}

static int run_startup(long runs, const char *shim, char **argv)
{
    /* The same environment twice: once without any LD_PRELOAD, once with
     * only the shim. */
    size_t n = 0;
    while (environ[n])
        n++;
    char **plain = calloc(n + 1, sizeof *plain), **pre = calloc(n + 2, sizeof *pre);
    uint64_t *a = calloc((size_t)runs, sizeof *a), *b = calloc((size_t)runs, sizeof *b);
    size_t k = 0;
    if (!plain || !pre || !a || !b)
        fail("out of memory", 0);
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11)) {
            plain[k] = pre[k] = environ[i];
            k++;
        }
    size_t len = strlen(shim) + sizeof "LD_PRELOAD=";
    pre[k] = malloc(len);
    if (!pre[k])
        fail("out of memory", 0);
    snprintf(pre[k], len, "LD_PRELOAD=%s", shim);

    /* A few unmeasured runs of each, so the page cache is warm for both. */
    for (int w = 0; w < 5; w++) {
        (void)spawn_once(argv, plain);
        (void)spawn_once(argv, pre);
    }
    for (long r = 0; r < runs; r++) {
        if (r & 1) {
            b[r] = spawn_once(argv, pre);
            a[r] = spawn_once(argv, plain);
        } else {
            a[r] = spawn_once(argv, plain);
            b[r] = spawn_once(argv, pre);
        }
    }
    printf("{\"mode\":\"startup\",\"runs\":%ld,\"without\":[", runs);
    for (long r = 0; r < runs; r++)
        printf("%s%llu", r ? "," : "", (unsigned long long)a[r]);
    printf("],\"with\":[");
    for (long r = 0; r < runs; r++)
        printf("%s%llu", r ? "," : "", (unsigned long long)b[r]);
    printf("]}\n");
    free(pre[k]);
    free(plain);
    free(pre);
    free(a);
    free(b);
    return 0;
}

/* ---- steps ------------------------------------------------------------------ */

/* Site number `bits` (< 2^SITE_LEVELS): SITE_LEVELS frames, each entered
 * from one of two call sites, so every number has a call stack (a site) of
 * its own. */
#define SITE_LEVELS 10
static int site_a(int k, unsigned bits, void **out, size_t size);
static int site_b(int k, unsigned bits, void **out, size_t size);

static __attribute__((noinline)) int site_walk(int k, unsigned bits, void **out, size_t size)
{
    if (k == 0)
        return (int)cudaMalloc(out, size);
    int r = (bits & 1) ? site_a(k - 1, bits >> 1, out, size) : site_b(k - 1, bits >> 1, out, size);
    g_sink = k;
    return r;
}

static __attribute__((noinline)) int site_a(int k, unsigned bits, void **out, size_t size)
{
    int r = site_walk(k, bits, out, size);
    g_sink += 1;
    return r;
}

static __attribute__((noinline)) int site_b(int k, unsigned bits, void **out, size_t size)
{
    int r = site_walk(k, bits, out, size);
    g_sink += 2;
    return r;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int run_steps(long sites, long steps, int leak)
{
    if (sites < 1 || sites > (1L << SITE_LEVELS) || steps < 1) {
        fprintf(stderr, "bench: steps SITES STEPS LEAK: SITES 1..%ld\n", 1L << SITE_LEVELS);
        return 2;
    }
    void **held = calloc((size_t)sites, sizeof *held);
    void **kept = calloc((size_t)steps, sizeof *kept);
    uint64_t *ns = calloc((size_t)steps, sizeof *ns);
    if (!held || !kept || !ns)
        fail("out of memory", 0);
    int e;
    for (long i = 0; i < sites; i++)
        if ((e = site_walk(SITE_LEVELS, (unsigned)i, &held[i], 4096)))
            fail("cudaMalloc (sites)", e);
    for (long n = 1; n <= steps; n++) {
        for (int i = 0; i < 8; i++) {
            void *p;
            if ((e = (int)cudaMalloc(&p, 64u << 20)) || (e = (int)cudaFree(p)))
                fail("pair", e);
        }
        if (leak && (e = site_walk(SITE_LEVELS, 7, &kept[n - 1], 32u << 20)))
            fail("cudaMalloc (leak)", e);
        uint64_t t0 = now_ns();
        gpuguard_step((unsigned long long)n);
        ns[n - 1] = now_ns() - t0;
    }
    int present = gpuguard_active();
    printf("{\"mode\":\"steps\",\"sites\":%ld,\"steps\":%ld,\"leak\":%d,\"present\":%s,"
           "\"ns\":[", sites, steps, leak, present ? "true" : "false");
    for (long n = 0; n < steps; n++)
        printf("%s%llu", n ? "," : "", (unsigned long long)ns[n]);
    printf("]}\n");
    qsort(ns, (size_t)steps, sizeof *ns, cmp_u64);
    for (long i = 0; i < sites; i++)
        (void)cudaFree(held[i]);
    for (long n = 0; n < steps; n++)
        if (kept[n])
            (void)cudaFree(kept[n]);
    free(held);
    free(kept);
    free(ns);
    return 0;
}

/* ---- soak ------------------------------------------------------------------- */

static int run_soak(long seconds, size_t size)
{
    uint64_t until = now_ns() + (uint64_t)seconds * 1000000000ull;
    unsigned long long pairs = 0;
    while (now_ns() < until) {
        for (int i = 0; i < 1000; i++, pairs++) {
            void *p;
            cudaError_t e = cudaMalloc(&p, size);
            if (e != cudaSuccess || (e = cudaFree(p)) != cudaSuccess)
                fail("soak pair", (int)e);
        }
    }
    printf("{\"mode\":\"soak\",\"seconds\":%ld,\"size\":%zu,\"pairs\":%llu}\n", seconds, size,
           pairs);
    return 0;
}

/* ---- main ------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: bench pairs N THREADS DEPTH REPS SIZE\n"
                    "       bench live N SIZE\n"
                    "       bench startup RUNS SHIM CMD [ARGS...]\n"
                    "       bench steps SITES STEPS LEAK\n"
                    "       bench soak SECONDS SIZE\n");
    exit(2);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 7 && !strcmp(argv[1], "pairs"))
        return run_pairs(arg_long(argv[2], "N"), (int)arg_long(argv[3], "THREADS"),
                         (int)arg_long(argv[4], "DEPTH"), (int)arg_long(argv[5], "REPS"),
                         (size_t)arg_long(argv[6], "SIZE"));
    if (argc >= 4 && !strcmp(argv[1], "live"))
        return run_live(arg_long(argv[2], "N"), (size_t)arg_long(argv[3], "SIZE"));
    if (argc >= 5 && !strcmp(argv[1], "startup"))
        return run_startup(arg_long(argv[2], "RUNS"), argv[3], argv + 4);
    if (argc >= 4 && !strcmp(argv[1], "soak"))
        return run_soak(arg_long(argv[2], "SECONDS"), (size_t)arg_long(argv[3], "SIZE"));
    if (argc >= 5 && !strcmp(argv[1], "steps"))
        return run_steps(arg_long(argv[2], "SITES"), arg_long(argv[3], "STEPS"),
                         (int)arg_long(argv[4], "LEAK"));
    usage();
    return 2;
}
