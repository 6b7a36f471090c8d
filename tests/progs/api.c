/* api.c - a CUDA program that talks to the guard through its C API, the way a
 * trainer would: the gpuguard_* functions are looked up at run time, so the
 * same binary runs with and without the shim.
 *
 *   api stats                   allocate 1 GiB + 512 MiB, free 512 MiB, print gpuguard_stats(0)
 *   api sites                   two call sites: site_a holds 2 x 1 GiB, site_b 512 MiB, then free
 *   api repeat N                the same call site allocates and frees 1 MiB N times
 *   api fill SIZE [handler] [batch B A]
 *                               allocate SIZE from fill_step until the first failure; print
 *                               how many succeeded, the error, and the advice waiting;
 *                               `handler` installs a SIGUSR2 handler first, `batch` tells the
 *                               guard the trainer's batch and accumulation
 *   api ack-cycle SIZE          fill until refused; ack the advice; fill again: a second advice
 *   api advice-threads N SIZE   N threads fill at once; print the pending advice's seq
 *   api note TEXT               attach TEXT to the journal
 *   api advice-storm N SIZE     the main thread reads the advice without pause while a
 *                               worker is refused N times, each refusal signalling a
 *                               SIGUSR2 handler that reads the advice too: the signal
 *                               must never find a thread waiting on itself
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuguard.h"

static int (*stats_fn)(int, struct gpuguard_stats *);
static int (*advice_fn)(struct gpuguard_advice *);
static void (*ack_fn)(unsigned);
static void (*set_batch_fn)(int, int);
static void (*note_fn)(const char *);

static volatile sig_atomic_t signals;

static void on_usr2(int sig)
{
    (void)sig;
    signals++;
}

static void lookup(void)
{
    *(void **)&stats_fn = dlsym(RTLD_DEFAULT, "gpuguard_stats");
    *(void **)&advice_fn = dlsym(RTLD_DEFAULT, "gpuguard_advice");
    *(void **)&ack_fn = dlsym(RTLD_DEFAULT, "gpuguard_ack");
    *(void **)&set_batch_fn = dlsym(RTLD_DEFAULT, "gpuguard_set_batch");
    *(void **)&note_fn = dlsym(RTLD_DEFAULT, "gpuguard_note");
}

static unsigned long long parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': v *= 1024.0; break;
    case 'M': v *= 1024.0 * 1024; break;
    case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (unsigned long long)v;
}

static void print_stats(void)
{
    struct gpuguard_stats s;
    if (!stats_fn) {
        printf("stats: no shim\n");
        return;
    }
    if (stats_fn(0, &s) != 0) {
        printf("stats: inactive\n");
        return;
    }
    printf("stats: dev=%d name=%s total=%llu limit=%llu current=%llu peak=%llu allocs=%llu "
           "frees=%llu near_misses=%llu refusals=%llu ooms=%llu\n",
           s.dev, s.name, s.total, s.limit, s.current, s.peak, s.allocs, s.frees, s.near_misses,
           s.refusals, s.ooms);
    printf("stats(7): %d\n", stats_fn(7, &s));
}

static void print_advice(void)
{
    struct gpuguard_advice a;
    if (!advice_fn) {
        printf("advice: no shim\n");
        return;
    }
    if (!advice_fn(&a)) {
        printf("advice: none\n");
        return;
    }
    printf("advice: seq=%u dev=%d batch=%d accum=%d reason=%s\n", a.seq, a.dev, a.batch_size,
           a.grad_accum, a.reason);
}

/* Named call sites: the journal's stacks must name these, so the compiler may
 * neither inline them nor rename a specialised copy (site_b.isra.0). */
#if defined(__clang__)
#define SITE __attribute__((noinline))
#else
#define SITE __attribute__((noipa))
#endif
/* Each keeps its call a call, not a tail jump that would leave no frame. */
SITE static cudaError_t site_a(void **p)
{
    cudaError_t r = cudaMalloc(p, 1ull << 30);
    __asm__ volatile("" ::: "memory");
    return r;
}

SITE static cudaError_t site_b(void **p)
{
    cudaError_t r = cudaMalloc(p, 512ull << 20);
    __asm__ volatile("" ::: "memory");
    return r;
}

SITE static cudaError_t fill_step(void **p, unsigned long long size)
{
    cudaError_t r = cudaMalloc(p, size);
    __asm__ volatile("" ::: "memory");
    return r;
}

SITE static cudaError_t repeat_step(void **p)
{
    cudaError_t r = cudaMalloc(p, 1 << 20);
    __asm__ volatile("" ::: "memory");
    return r;
}

#define MAXP 4096
static void *ptrs[MAXP];

static int fill(unsigned long long size)
{
    int n = 0;
    cudaError_t r = cudaSuccess;
    for (; n < MAXP; n++) {
        ptrs[n] = (void *)1; /* a failed call must leave NULL, as the runtime does */
        if ((r = fill_step(&ptrs[n], size)) != cudaSuccess)
            break;
    }
    printf("fill: %d ok, then error %d\n", n, (int)r);
    if (n < MAXP)
        printf("fill: failed pointer %s\n", ptrs[n] ? "set" : "NULL");
    return n;
}

static void free_all(int n)
{
    for (int i = 0; i < n; i++)
        cudaFree(ptrs[i]);
}

struct fill_arg { unsigned long long size; int ok; };

static void *fill_thread(void *v)
{
    struct fill_arg *a = v;
    void *mine[256];
    int n = 0;
    while (n < 256 && fill_step(&mine[n], a->size) == cudaSuccess)
        n++;
    a->ok = n;
    for (int i = 0; i < n; i++)
        cudaFree(mine[i]);
    return NULL;
}

static volatile sig_atomic_t storm_reads;
static _Atomic int storm_stop;

static void on_usr2_read(int sig)
{
    (void)sig;
    struct gpuguard_advice a;
    if (advice_fn && advice_fn(&a))
        storm_reads++;
}

struct storm_arg { int rounds, refused; unsigned long long size; };

static void *storm_filler(void *v)
{
    struct storm_arg *a = v;
    void *mine[64];
    for (int r = 0; r < a->rounds; r++) {
        int n = 0;
        while (n < 64 && fill_step(&mine[n], a->size) == cudaSuccess)
            n++;
        a->refused += n < 64;
        for (int i = 0; i < n; i++)
            cudaFree(mine[i]);
    }
    atomic_store(&storm_stop, 1);
    return NULL;
}

int main(int argc, char **argv)
{
    lookup();
    if (argc < 2) {
        fprintf(stderr, "usage: api stats|sites|repeat|fill|ack-cycle|advice-threads|note ...\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "stats")) {
        void *a, *b;
        cudaMalloc(&a, 1ull << 30);
        cudaMalloc(&b, 512ull << 20);
        cudaFree(b);
        print_stats();
        cudaFree(a);
    } else if (!strcmp(cmd, "sites")) {
        /* site_a twice from one line (one stack), then site_b */
        void *a[2], *b1;
        volatile int two = 2;
        for (int i = 0; i < two; i++)
            site_a(&a[i]);
        site_b(&b1);
        cudaFree(a[0]);
        cudaFree(a[1]);
        cudaFree(b1);
        printf("sites: done\n");
    } else if (!strcmp(cmd, "repeat") && argc > 2) {
        int n = atoi(argv[2]);
        for (int i = 0; i < n; i++) {
            void *p;
            if (repeat_step(&p) == cudaSuccess)
                cudaFree(p);
        }
        printf("repeat: %d\n", n);
    } else if (!strcmp(cmd, "fill") && argc > 2) {
        for (int i = 3; i < argc; i++) {
            if (!strcmp(argv[i], "handler"))
                signal(SIGUSR2, on_usr2);
            if (!strcmp(argv[i], "batch") && i + 2 < argc && set_batch_fn)
                set_batch_fn(atoi(argv[i + 1]), atoi(argv[i + 2]));
        }
        int n = fill(parse_size(argv[2]));
        print_advice();
        printf("signals: %d\n", (int)signals);
        free_all(n);
    } else if (!strcmp(cmd, "ack-cycle") && argc > 2) {
        unsigned long long size = parse_size(argv[2]);
        if (set_batch_fn)
            set_batch_fn(32, 1);
        int n = fill(size);
        print_advice();
        struct gpuguard_advice a;
        if (advice_fn && advice_fn(&a)) {
            ack_fn(a.seq);
            printf("acked %u\n", a.seq);
        }
        print_advice();
        free_all(n);
        n = fill(size);
        print_advice();
        free_all(n);
    } else if (!strcmp(cmd, "advice-threads") && argc > 3) {
        int nt = atoi(argv[2]);
        pthread_t t[64];
        struct fill_arg args[64];
        if (nt > 64)
            nt = 64;
        if (set_batch_fn)
            set_batch_fn(64, 1);
        for (int i = 0; i < nt; i++) {
            args[i].size = parse_size(argv[3]);
            pthread_create(&t[i], NULL, fill_thread, &args[i]);
        }
        for (int i = 0; i < nt; i++)
            pthread_join(t[i], NULL);
        print_advice();
    } else if (!strcmp(cmd, "advice-storm") && argc > 3) {
        /* The main thread, which a process-directed signal goes to first,
         * reads the advice without pause; a worker is refused again and
         * again, each refusal signalling the handler. */
        static struct storm_arg a;
        a.rounds = atoi(argv[2]);
        a.size = parse_size(argv[3]);
        pthread_t t;
        struct gpuguard_advice adv;
        signal(SIGUSR2, on_usr2_read);
        if (set_batch_fn)
            set_batch_fn(64, 1);
        pthread_create(&t, NULL, storm_filler, &a);
        while (!atomic_load(&storm_stop))
            if (advice_fn)
                advice_fn(&adv);
        pthread_join(t, NULL);
        printf("storm: %d refused, %d read in the handler\n", a.refused, (int)storm_reads);
    } else if (!strcmp(cmd, "note") && argc > 2) {
        void *p;
        cudaMalloc(&p, 1 << 20);
        if (note_fn)
            note_fn(argv[2]);
        cudaFree(p);
        printf("note: done\n");
    } else {
        fprintf(stderr, "api: unknown command %s\n", cmd);
        return 2;
    }
    return 0;
}
