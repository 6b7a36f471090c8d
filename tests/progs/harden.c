/*
 * harden.c - a CUDA program that treats the shim badly, for the hardening
 * tests (tests/e2e/test_hardening.py). One command per argument:
 *
 *   alloc:SIZE            cudaMalloc, kept
 *   freeall               free what alloc kept
 *   fsize:BYTES|inf       the file size limit (RLIMIT_FSIZE; SIGXFSZ ignored):
 *                         what a full disk does to a write, without a disk
 *   nearmiss:N            N allocations in the near-miss zone, each freed,
 *                         from one call site (policy: near_miss zone must be
 *                         reached by 1 GiB over what is held)
 *   sites:N               N near misses from N different call sites
 *   refuse:N              N refused retries of one too-large request
 *   oscillate:MS          alloc/free across a sample step (1% of the
 *                         device) for MS milliseconds
 *   execself:ARGS         exec this program again (same pid) with ARGS
 *                         (comma separated)
 *   huge                  cudaMalloc(SIZE_MAX - 4095): refused, not an OOM
 *   pitch                 cudaMallocPitch whose width x height overflows
 *   sigexit:MS            a thread allocates (near misses from ever new
 *                         sites, so lines, stacks, symbols); after MS ms a
 *                         signal lands on it and its handler calls exit()
 *   peakexit:MS           the same with a thread that sets a new peak at
 *                         every allocation (each takes the peak's snapshot
 *                         of the sites), from ever new sites
 *   smallstack:KIB        near misses, a refusal and an OOM on a thread with
 *                         a KIB KiB stack (a guard page below); prints
 *                         "stack used N" (bytes of that stack ever touched)
 */
#include <cuda_runtime_api.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "size.h"

#define GiB (1ull << 30)
#define MiB (1ull << 20)

static void *kept[4096];
static int nkept;
static volatile int sink;
static char **g_argv;

static void die(const char *what, const char *arg)
{
    fprintf(stderr, "harden: %s: %s\n", what, arg);
    exit(2);
}

static unsigned long long num(const char *s)
{
    size_t v;
    if (prog_parse_size(s, &v) != 0)
        die("bad number", s);
    return v;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- call sites ------------------------------------------------------------ */

/* Site number `bits`: LEVELS frames, each entered from one of two call
 * sites, so every number has a call stack of its own. */
#define LEVELS 14
static int site_a(int k, unsigned bits, void **out, size_t size);
static int site_b(int k, unsigned bits, void **out, size_t size);

static __attribute__((noinline)) int site_walk(int k, unsigned bits, void **out, size_t size)
{
    if (k == 0)
        return (int)cudaMalloc(out, size);
    int r = (bits & 1) ? site_a(k - 1, bits >> 1, out, size) : site_b(k - 1, bits >> 1, out, size);
    sink = k;
    return r;
}

static __attribute__((noinline)) int site_a(int k, unsigned bits, void **out, size_t size)
{
    int r = site_walk(k, bits, out, size);
    sink += 1;
    return r;
}

static __attribute__((noinline)) int site_b(int k, unsigned bits, void **out, size_t size)
{
    int r = site_walk(k, bits, out, size);
    sink += 2;
    return r;
}

/* One allocation of `size` from site `bits`, freed at once. */
static int touch(unsigned bits, size_t size)
{
    void *p = NULL;
    int r = site_walk(LEVELS, bits, &p, size);
    if (r == 0)
        (void)cudaFree(p);
    return r;
}

/* ---- threads ---------------------------------------------------------------- */

static void on_signal_exit(int sig)
{
    (void)sig;
    exit(0); /* not async-signal-safe, and programs do it: the shim must cope */
}

static void *churn(void *arg)
{
    (void)arg;
    for (unsigned i = 0;; i++)
        (void)touch(i & ((1u << LEVELS) - 1), 1 * GiB);
    return NULL;
}

static void *climb(void *arg)
{
    (void)arg;
    for (unsigned i = 0;; i++) {
        void *p;
        if (site_walk(LEVELS, i & ((1u << LEVELS) - 1), &p, 1 * MiB) != 0)
            break;
    }
    pause();
    return NULL;
}

static void sigexit(long ms, void *(*work)(void *))
{
    pthread_t t;
    /* The shim starts first (its first intercepted call), so the exit lands
     * on work in the hooks, not in the start: an exit during the start
     * writes no summary, by design (nothing to summarize, and the start's
     * locks are the interrupted thread's). Under load the timer could
     * otherwise fire before the start is over. */
    void *p = NULL;
    if (cudaMalloc(&p, 1 << 20) == cudaSuccess)
        cudaFree(p);
    signal(SIGUSR1, on_signal_exit);
    if (pthread_create(&t, NULL, work, NULL) != 0)
        die("pthread_create", "sigexit");
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    pthread_kill(t, SIGUSR1);
    pause(); /* the handler exits the process */
}

struct small {
    size_t used;
    int near, refused, oom;
};

static void *small_main(void *arg)
{
    struct small *s = arg;
    void *p = NULL;
    s->near = touch(1, 1 * GiB);       /* near miss (the program holds the rest) */
    s->refused = touch(2, 8 * GiB);    /* over the limit: refused (enforce), or an OOM */
    s->oom = (int)cudaMalloc(&p, 64 * GiB); /* more than the device: refused, or an OOM */
    return NULL;
}

static void smallstack(size_t kib)
{
    size_t size = kib << 10, page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *map = mmap(NULL, size + page, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (map == MAP_FAILED)
        die("mmap", "smallstack");
    mprotect(map, page, PROT_NONE); /* an overflow faults, never corrupts */
    unsigned char *stack = map + page;
    memset(stack, 0xA5, size);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstack(&attr, stack, size) != 0)
        die("pthread_attr_setstack", "smallstack");
    struct small s = {0, 0, 0, 0};
    pthread_t t;
    if (pthread_create(&t, &attr, small_main, &s) != 0)
        die("pthread_create", "smallstack");
    pthread_join(t, NULL);
    size_t untouched = 0;
    while (untouched < size && stack[untouched] == 0xA5)
        untouched++;
    printf("smallstack: near %d refused %d oom %d\n", s.near, s.refused, s.oom);
    printf("stack used %zu of %zu\n", size - untouched, size);
}

/* ---- main ------------------------------------------------------------------- */

static void run(char *cmd)
{
    char *arg = strchr(cmd, ':');
    if (arg)
        *arg++ = 0;
    if (!strcmp(cmd, "alloc") && arg) {
        if (nkept >= 4096)
            die("too many", cmd);
        int r = (int)cudaMalloc(&kept[nkept], (size_t)num(arg));
        if (r)
            printf("alloc %s: error %d\n", arg, r);
        else
            nkept++;
    } else if (!strcmp(cmd, "freeall")) {
        while (nkept > 0)
            (void)cudaFree(kept[--nkept]);
    } else if (!strcmp(cmd, "fsize") && arg) {
        struct rlimit rl;
        getrlimit(RLIMIT_FSIZE, &rl);
        signal(SIGXFSZ, SIG_IGN);
        rl.rlim_cur = !strcmp(arg, "inf") ? rl.rlim_max : (rlim_t)num(arg);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            die("setrlimit", arg);
    } else if (!strcmp(cmd, "nearmiss") && arg) {
        unsigned long long n = num(arg), bad = 0;
        for (unsigned long long i = 0; i < n; i++)
            bad += touch(0, 1 * GiB) != 0;
        printf("nearmiss: %llu, %llu failed\n", n, bad);
    } else if (!strcmp(cmd, "sites") && arg) {
        unsigned long long n = num(arg), bad = 0;
        for (unsigned long long i = 0; i < n; i++)
            bad += touch((unsigned)i, 1 * GiB) != 0;
        printf("sites: %llu, %llu failed\n", n, bad);
    } else if (!strcmp(cmd, "refuse") && arg) {
        unsigned long long n = num(arg), refused = 0;
        for (unsigned long long i = 0; i < n; i++)
            refused += touch(3, 30 * GiB) == (int)cudaErrorMemoryAllocation;
        printf("refuse: %llu of %llu refused\n", refused, n);
    } else if (!strcmp(cmd, "oscillate") && arg) {
        uint64_t until = now_ms() + num(arg);
        unsigned long long pairs = 0;
        while (now_ms() < until) {
            for (int i = 0; i < 1000; i++) {
                void *p;
                if (cudaMalloc(&p, 512 * MiB) == cudaSuccess)
                    (void)cudaFree(p);
                pairs++;
            }
        }
        printf("oscillate: %llu pairs\n", pairs);
    } else if (!strcmp(cmd, "execself") && arg) {
        char *args[64];
        int n = 0;
        args[n++] = g_argv[0];
        for (char *tok = strtok(arg, ","); tok && n < 63; tok = strtok(NULL, ","))
            args[n++] = tok;
        args[n] = NULL;
        fflush(stdout);
        execv(g_argv[0], args); /* by its path: the process keeps its name */
        die("execv", strerror(errno));
    } else if (!strcmp(cmd, "huge")) {
        void *p = NULL;
        printf("huge: %d\n", (int)cudaMalloc(&p, SIZE_MAX - 4095));
    } else if (!strcmp(cmd, "pitch")) {
        void *p = NULL;
        size_t pitch = 0;
        printf("pitch: %d\n", (int)cudaMallocPitch(&p, &pitch, (size_t)1 << 40, (size_t)1 << 40));
    } else if (!strcmp(cmd, "sigexit") && arg) {
        sigexit((long)num(arg), churn);
    } else if (!strcmp(cmd, "peakexit") && arg) {
        sigexit((long)num(arg), climb);
    } else if (!strcmp(cmd, "smallstack") && arg) {
        smallstack((size_t)num(arg));
    } else if (!strcmp(cmd, "pid")) {
        printf("pid %d\n", (int)getpid());
    } else {
        die("unknown command", cmd);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_argv = argv;
    for (int i = 1; i < argc; i++)
        run(argv[i]);
    printf("harden: done\n");
    return 0;
}
