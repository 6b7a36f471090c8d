/*
 * fakecuda.c - a fake CUDA driver (libcuda.so.1) for GPU-free tests.
 *
 * Built from the toolkit's cuda.h, so the exported names and signatures are
 * the real ones (cuMemAlloc_v2, cuGetProcAddress_v2, ...).  It simulates one or
 * more devices whose memory usage may be shared between processes through a
 * file.  Nothing is ever dereferenced: device addresses are unique numbers.
 *
 * Environment (read once, at the first cuInit):
 *   FAKECUDA_DEVICES       "NAME,TOTAL,CC;NAME,TOTAL,CC" (default one RTX 3090,
 *                          24GiB, 8.6); set but empty: no device at all
 *   FAKECUDA_STATE         file holding the per-device used bytes, shared by
 *                          every process that names it (mmap MAP_SHARED)
 *   FAKECUDA_CONTEXT_BYTES bytes charged when the process first creates a
 *                          context on a device (released at exit)
 *   FAKECUDA_FAIL_ALLOC    "3,7": the 3rd and 7th allocation calls fail
 *   FAKECUDA_FAIL_ERROR    the CUresult they fail with (default 2, OOM)
 *   FAKECUDA_INIT_MARK     file that gets one line per process that runs cuInit
 *   FAKECUDA_TRACE         file that gets one line per cuGetProcAddress and
 *                          cuGetExportTable call (read at each call: callable
 *                          before cuInit)
 *
 * Besides the current ABI it exports the legacy (v1) entry points the real
 * library keeps for old binaries (cuMemAlloc with 32-bit pointers and sizes,
 * ...), stream-ordered memory pools that keep freed memory until trimmed,
 * CUDA arrays, and host memory that is never charged to a device.
 *
 * See tests/fake/README.md.
 */
/* Declares the legacy names too (cuMemAlloc, with the v1 types), and both
 * foo and foo_ptsz, as for the real library's own build. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

/* Exported names cuda.h does not declare in this mode (the current ABIs
 * behind legacy names, and the legacy cuGetProcAddress). */
#undef cuGetProcAddress
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags);
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream);
CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent);
CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags);
CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags);
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options,
                                 void **optionValues, CUlinkState *stateOut);
CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                  const char *name, unsigned int numOptions, CUjit_option *options,
                                  void **optionValues);

/* Test hook: the bytes charged to a device now (every process sharing
 * FAKECUDA_STATE included); UINT64_MAX for no such device or before cuInit. */
unsigned long long fakecuda_used(int dev);
/* Test hook: the most bytes ever charged to a device at once. */
unsigned long long fakecuda_high_water(int dev);

#define FAKE_DRIVER_VERSION 13000 /* FAKECUDA_DRIVER_VERSION overrides it */
#define MAXDEV              64
#define STATE_FILE_SIZE     8192
#define STATE_PROCS         64 /* processes whose memory a dead one's leaves behind */
#define PROC_DEVS           8  /* the devices followed per process */
#define NSHARD              64
#define ADDR_BASE           0x700000000000ULL
/* The legacy (v1) entry points hand out 32-bit device pointers: they come
 * from their own window below 4 GiB, never reused either. */
#define ADDR_V1_BASE        0x100000ULL
#define ADDR_V1_END         0x100000000ULL
#define GRANULARITY         (2ULL << 20)

/* ------------------------------------------------------------------------ */
/* Devices and usage                                                         */


/* A process sharing the state: what it holds per device, so that its
 * memory goes back when it dies, as a real driver's does. */
struct fproc {
    _Atomic int32_t pid;
    int32_t reserved;
    _Atomic uint64_t start; /* its start time (/proc/PID/stat), against pid reuse */
    _Atomic uint64_t used[PROC_DEVS];
};

struct fstate {
    _Atomic uint64_t used[MAXDEV];
    _Atomic uint64_t high[MAXDEV]; /* the most ever used at once (the high-water mark) */
    struct fproc procs[STATE_PROCS];
};
_Static_assert(sizeof(struct fstate) <= STATE_FILE_SIZE, "the state fits its file");

struct fctx {
    uint32_t magic;
    int dev;
};
#define CTX_MAGIC 0xfac7c0deu

static struct fk_device g_dev[MAXDEV];
static int g_ndev;
static struct fstate g_local_state;
static struct fstate *g_st = &g_local_state;
static struct fproc *g_me;     /* this process's entry in a shared state */
static uint64_t g_uuid_salt;   /* the devices' UUIDs: the state's (shared) or the process's */

static struct fctx g_ctx[MAXDEV];
static _Atomic int g_ctx_refs[MAXDEV];
static int g_ctx_charged[MAXDEV];
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_ctx_bytes;

static __thread struct fctx *t_cur;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CUresult g_init_res = CUDA_ERROR_NOT_INITIALIZED;
static _Atomic int g_ready;  /* cuInit succeeded in this process */
static _Atomic int g_forked; /* we are a fork child of an initialised process */

/* Fault injection. */
#define MAXFAIL 256
static uint64_t g_fail_at[MAXFAIL];
static int g_nfail;
static CUresult g_fail_err = CUDA_ERROR_OUT_OF_MEMORY;
static _Atomic uint64_t g_nalloc;

static _Atomic uint64_t g_next_addr = ADDR_BASE;
static _Atomic uint64_t g_next_v1 = ADDR_V1_BASE;

/* ------------------------------------------------------------------------ */
/* Live allocations: key -> (size, dev, kind, owner), sharded               */

/* What a key names. dev < 0: host memory, charged to no device. */
enum {
    K_ALLOC = 1,  /* cuMemAlloc*, cuMemAllocManaged: charged per allocation */
    K_HANDLE = 2, /* cuMemCreate handle */
    K_VA = 3,     /* cuMemAddressReserve range: charges nothing */
    K_POOL = 4,   /* allocation from a memory pool (owner): the pool is charged */
    K_ARRAY = 5,  /* CUarray */
    K_MIPMAP = 6, /* CUmipmappedArray */
    K_HOST = 7,   /* cuMemHostAlloc / cuMemAllocHost: host pages, never charged */
};

struct ent {
    uint64_t key, size;
    int32_t dev, kind;
    void *owner;
    struct ent *next;
};

struct shard {
    pthread_mutex_t mu;
    struct ent **b;
    size_t mask, n;
    struct ent *freelist;
} __attribute__((aligned(64)));

static struct shard g_sh[NSHARD];

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int shard_grow(struct shard *s)
{
    size_t nb = s->b ? (s->mask + 1) * 2 : 256;
    struct ent **b = calloc(nb, sizeof *b);
    if (!b)
        return -1;
    if (s->b) {
        for (size_t i = 0; i <= s->mask; i++) {
            struct ent *e = s->b[i];
            while (e) {
                struct ent *nx = e->next;
                size_t j = (mix64(e->key) >> 6) & (nb - 1);
                e->next = b[j];
                b[j] = e;
                e = nx;
            }
        }
        free(s->b);
    }
    s->b = b;
    s->mask = nb - 1;
    return 0;
}

static int tab_insert(uint64_t key, uint64_t size, int dev, int kind, void *owner)
{
    uint64_t h = mix64(key);
    struct shard *s = &g_sh[h & (NSHARD - 1)];
    pthread_mutex_lock(&s->mu);
    if ((!s->b || s->n >= 2 * (s->mask + 1)) && shard_grow(s) != 0 && !s->b) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    struct ent *e = s->freelist;
    if (e)
        s->freelist = e->next;
    else if (!(e = malloc(sizeof *e))) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    e->key = key;
    e->size = size;
    e->dev = dev;
    e->kind = kind;
    e->owner = owner;
    size_t j = (h >> 6) & s->mask;
    e->next = s->b[j];
    s->b[j] = e;
    s->n++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

#define KIND(k) (1u << (k))

/* Removes key if it is live with one of the kinds in mask (KIND bits): its
 * kind, or 0 when not found; *out gets a copy of the entry. */
static int tab_remove(uint64_t key, unsigned mask, struct ent *out)
{
    uint64_t h = mix64(key);
    struct shard *s = &g_sh[h & (NSHARD - 1)];
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->b) {
        struct ent **pp = &s->b[(h >> 6) & s->mask];
        for (struct ent *e = *pp; e; pp = &e->next, e = e->next) {
            if (e->key != key)
                continue;
            if (mask & KIND(e->kind)) {
                *out = *e;
                *pp = e->next;
                e->next = s->freelist;
                s->freelist = e;
                s->n--;
                rc = out->kind;
            }
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int tab_contains(uint64_t key, int kind)
{
    uint64_t h = mix64(key);
    struct shard *s = &g_sh[h & (NSHARD - 1)];
    int found = 0;
    pthread_mutex_lock(&s->mu);
    if (s->b) {
        for (struct ent *e = s->b[(h >> 6) & s->mask]; e; e = e->next) {
            if (e->key == key) {
                found = e->kind == kind;
                break;
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

/* ------------------------------------------------------------------------ */
/* Charging                                                                  */

static void sub_sat(_Atomic uint64_t *u, uint64_t size)
{
    uint64_t cur = atomic_load_explicit(u, memory_order_relaxed);
    uint64_t nv;
    do {
        nv = cur > size ? cur - size : 0;
    } while (!atomic_compare_exchange_weak_explicit(u, &cur, nv, memory_order_relaxed,
                                                    memory_order_relaxed));
}

static CUresult charge(int dev, uint64_t size)
{
    _Atomic uint64_t *u = &g_st->used[dev];
    uint64_t total = g_dev[dev].total;
    uint64_t cur = atomic_load_explicit(u, memory_order_relaxed);
    do {
        if (size > total || cur > total - size)
            return CUDA_ERROR_OUT_OF_MEMORY;
    } while (!atomic_compare_exchange_weak_explicit(u, &cur, cur + size, memory_order_relaxed,
                                                    memory_order_relaxed));
    uint64_t high = atomic_load_explicit(&g_st->high[dev], memory_order_relaxed);
    while (cur + size > high &&
           !atomic_compare_exchange_weak_explicit(&g_st->high[dev], &high, cur + size,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    if (g_me && dev < PROC_DEVS)
        atomic_fetch_add_explicit(&g_me->used[dev], size, memory_order_relaxed);
    return CUDA_SUCCESS;
}

static void uncharge(int dev, uint64_t size)
{
    sub_sat(&g_st->used[dev], size);
    if (g_me && dev < PROC_DEVS)
        sub_sat(&g_me->used[dev], size);
}

/* A process's start time in clock ticks since boot (0: unknown). */
static uint64_t proc_start(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may hold spaces */
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* Processes that shared the state and died without giving back what they
 * held (killed): their memory goes back, as a real driver's does when a
 * process ends. Looked at by cuInit and cuMemGetInfo. */
static void reap(bool check_start)
{
    if (g_st == &g_local_state)
        return;
    for (int i = 0; i < STATE_PROCS; i++) {
        struct fproc *p = &g_st->procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (pid <= 0 || p == g_me)
            continue;
        uint64_t start = atomic_load(&p->start);
        bool gone = kill(pid, 0) != 0 && errno == ESRCH;
        if (!gone && check_start && start && proc_start(pid) != start)
            gone = true; /* the pid is another process's now */
        if (!gone || !atomic_compare_exchange_strong(&p->pid, &pid, -1))
            continue;
        for (int d = 0; d < PROC_DEVS && d < MAXDEV; d++)
            sub_sat(&g_st->used[d], atomic_exchange(&p->used[d], 0));
        atomic_store(&p->start, 0);
        atomic_store(&p->pid, 0);
    }
}

/* This process's entry in a shared state (none when all are taken: its
 * memory then stays charged should it be killed). */
static void join_state(void)
{
    int32_t me = (int32_t)getpid();
    uint64_t start = proc_start(me);
    reap(true);
    for (int i = 0; i < STATE_PROCS; i++) {
        struct fproc *p = &g_st->procs[i];
        int32_t none = 0;
        if (!atomic_compare_exchange_strong(&p->pid, &none, me))
            continue;
        for (int d = 0; d < PROC_DEVS; d++)
            atomic_store(&p->used[d], 0);
        atomic_store(&p->start, start);
        g_me = p;
        return;
    }
}

static uint64_t new_addr(uint64_t size, uint64_t align)
{
    uint64_t step = (size + 255) & ~255ULL;
    if (step == 0)
        step = 256;
    if (align > 256 && (align & (align - 1)) == 0) {
        uint64_t a = atomic_fetch_add(&g_next_addr, step + align);
        return (a + align - 1) & ~(align - 1);
    }
    return atomic_fetch_add(&g_next_addr, step);
}

/* A v1 (32-bit) device address, or 0 when the window below 4 GiB is used up. */
static uint64_t new_addr_v1(uint64_t size)
{
    uint64_t step = (size + 255) & ~255ULL;
    if (step == 0)
        step = 256;
    uint64_t cur = atomic_load(&g_next_v1);
    do {
        if (step > ADDR_V1_END - cur)
            return 0;
    } while (!atomic_compare_exchange_weak(&g_next_v1, &cur, cur + step));
    return cur;
}

/* ------------------------------------------------------------------------ */
/* Stream-ordered memory pools                                               */
/*
 * A pool holds `reserved` bytes (charged to its device; a host pool charges
 * nothing) of which `used` are handed out. A free gives the bytes back to the
 * pool, not to the device; an allocation is served from the pool's free bytes
 * first and grows the pool (charges the device) only by what is missing.
 * Memory leaves the pool by cuMemPoolTrimTo, or at a synchronisation: every
 * cuStreamSynchronize / cuCtxSynchronize trims every pool down to its release
 * threshold (default 0, as CUDA's; the fake runs no work, so every free is
 * complete by then). Free bytes are fungible (no fragmentation) and counted
 * exactly (no chunk granularity).
 */

#define POOL_MAGIC 0xfac7b001u

struct fpool {
    uint32_t magic;
    int dev;      /* device ordinal; -1: host memory */
    int dflt;     /* a device's default pool: never destroyed */
    int dead;     /* destroyed, allocations still outstanding */
    uint64_t max; /* CUmemPoolProps.maxSize; 0: the device's size */
    uint64_t reserved, reserved_high, used, used_high, threshold;
    int reuse[3]; /* the three CU_MEMPOOL_ATTR_REUSE_* flags */
    struct fpool *next;
};

static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fpool g_defpool[MAXDEV];  /* cuDeviceGetDefaultMemPool */
static struct fpool *g_curpool[MAXDEV]; /* cuDeviceSetMemPool; NULL: the default */
static struct fpool *g_pools;           /* created by cuMemPoolCreate (and dead ones) */

static void pool_init(struct fpool *p, int dev)
{
    memset(p, 0, sizeof *p);
    p->magic = POOL_MAGIC;
    p->dev = dev;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
}

/* g_pool_mu held: the pool a handle names, NULL for none (or a dead one). */
static struct fpool *pool_live(CUmemoryPool h, int ndev)
{
    uintptr_t a = (uintptr_t)(void *)h, base = (uintptr_t)&g_defpool[0];
    if (a >= base && a < base + (uintptr_t)ndev * sizeof g_defpool[0] &&
        (a - base) % sizeof g_defpool[0] == 0)
        return &g_defpool[(a - base) / sizeof g_defpool[0]];
    for (struct fpool *q = g_pools; q; q = q->next)
        if ((uintptr_t)q == a && !q->dead)
            return q;
    return NULL;
}

/* g_pool_mu held: gives the device everything above keep (never what is in use). */
static void pool_release_to(struct fpool *p, uint64_t keep)
{
    if (keep < p->used)
        keep = p->used;
    if (p->reserved > keep) {
        if (p->dev >= 0)
            uncharge(p->dev, p->reserved - keep);
        p->reserved = keep;
    }
}

/* g_pool_mu held: a destroyed pool goes once nothing of it is in use. */
static void pool_reap(struct fpool *p)
{
    if (!p->dead || p->used)
        return;
    pool_release_to(p, 0);
    for (struct fpool **pp = &g_pools; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    p->magic = 0;
    free(p);
}

static int tab_insert(uint64_t key, uint64_t size, int dev, int kind, void *owner);

/* From pool h, or (h NULL) from device dev's current pool. */
static CUresult pool_alloc(CUmemoryPool h, int dev, uint64_t size, CUdeviceptr *dptr)
{
    /* g_pool_mu, then a shard lock in tab_insert; a free takes them one
     * after the other, never nested the other way. */
    pthread_mutex_lock(&g_pool_mu);
    struct fpool *p = h ? pool_live(h, g_ndev) : g_curpool[dev] ? g_curpool[dev] : &g_defpool[dev];
    if (!p) {
        pthread_mutex_unlock(&g_pool_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t spare = p->reserved - p->used;
    uint64_t grow = size > spare ? size - spare : 0;
    if (grow) {
        if (p->max && (grow > p->max || p->reserved > p->max - grow)) {
            pthread_mutex_unlock(&g_pool_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        CUresult r = p->dev >= 0 ? charge(p->dev, grow) : CUDA_SUCCESS;
        if (r) {
            pthread_mutex_unlock(&g_pool_mu);
            return r;
        }
    }
    uint64_t a = new_addr(size, 256);
    if (tab_insert(a, size, p->dev, K_POOL, p) != 0) {
        if (grow && p->dev >= 0)
            uncharge(p->dev, grow);
        pthread_mutex_unlock(&g_pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->reserved += grow;
    p->used += size;
    if (p->reserved > p->reserved_high)
        p->reserved_high = p->reserved;
    if (p->used > p->used_high)
        p->used_high = p->used;
    pthread_mutex_unlock(&g_pool_mu);
    *dptr = (CUdeviceptr)a;
    return CUDA_SUCCESS;
}

static void pool_free(struct fpool *p, uint64_t size)
{
    pthread_mutex_lock(&g_pool_mu);
    p->used -= size;
    if (p->dead) {
        pool_release_to(p, 0);
        pool_reap(p);
    }
    pthread_mutex_unlock(&g_pool_mu);
}

/* A synchronisation: every pool keeps at most its release threshold free. */
static void pools_sync(int ndev)
{
    pthread_mutex_lock(&g_pool_mu);
    for (int d = 0; d < ndev; d++)
        pool_release_to(&g_defpool[d], g_defpool[d].threshold);
    for (struct fpool *p = g_pools; p; p = p->next)
        pool_release_to(p, p->threshold);
    pthread_mutex_unlock(&g_pool_mu);
}

/* ------------------------------------------------------------------------ */
/* Environment parsing                                                       */

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n'))
        s[--n] = 0;
    return s;
}

/* "24GiB", "1.5G", "512MiB", "1000": binary multiples; 0 on success. */
static int parse_size(const char *str, uint64_t *out)
{
    char *end;
    errno = 0;
    while (*str == ' ')
        str++;
    if (*str < '0' || *str > '9')
        return -1;
    unsigned long long ip = strtoull(str, &end, 10);
    if (errno)
        return -1;
    long double frac = 0;
    if (*end == '.') {
        const char *f = end + 1;
        long double scale = 0.1L;
        while (*f >= '0' && *f <= '9') {
            frac += (*f - '0') * scale;
            scale /= 10;
            f++;
        }
        end = (char *)f;
    }
    while (*end == ' ')
        end++;
    uint64_t mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1ULL << 10; end++; break;
    case 'm': case 'M': mult = 1ULL << 20; end++; break;
    case 'g': case 'G': mult = 1ULL << 30; end++; break;
    case 't': case 'T': mult = 1ULL << 40; end++; break;
    default: break;
    }
    if (mult > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end)
        return -1;
    *out = (uint64_t)ip * mult + (uint64_t)(frac * mult + 0.5L);
    return 0;
}

static int add_device(char *entry)
{
    char *c2 = strrchr(entry, ',');
    if (!c2)
        return -1;
    *c2 = 0;
    char *c1 = strrchr(entry, ',');
    if (!c1)
        return -1;
    *c1 = 0;
    char *name = trim(entry), *tot = trim(c1 + 1), *cc = trim(c2 + 1);
    struct fk_device d;
    memset(&d, 0, sizeof d);
    if (!*name || parse_size(tot, &d.total) != 0 || sscanf(cc, "%d.%d", &d.major, &d.minor) != 2)
        return -1;
    snprintf(d.name, sizeof d.name, "%s", name);
    if (g_ndev >= MAXDEV)
        return -1;
    g_dev[g_ndev++] = d;
    return 0;
}

static void parse_devices(void)
{
    const char *env = getenv("FAKECUDA_DEVICES");
    char *copy = strdup(env ? env : "NVIDIA GeForce RTX 3090,24GiB,8.6");
    if (!copy)
        return;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        char *t = trim(tok);
        if (!*t)
            continue;
        char *dup = strdup(t);
        if (dup && add_device(t) != 0)
            fprintf(stderr, "fakecuda: ignoring bad FAKECUDA_DEVICES entry '%s'\n", dup);
        free(dup);
    }
    free(copy);
}

static void parse_fail(void)
{
    const char *env = getenv("FAKECUDA_FAIL_ALLOC");
    if (env) {
        const char *p = env;
        while (*p && g_nfail < MAXFAIL) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p) {
                p++;
                continue;
            }
            if (v)
                g_fail_at[g_nfail++] = v;
            p = end;
        }
    }
    const char *err = getenv("FAKECUDA_FAIL_ERROR");
    if (err && *err)
        g_fail_err = (CUresult)atoi(err);
}

static int open_state(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return -1;
    struct stat st;
    /* Extending to the same size from several processes at once is harmless:
     * ftruncate never shrinks here and the new bytes read as zero. */
    if (fstat(fd, &st) != 0 || (st.st_size < STATE_FILE_SIZE && ftruncate(fd, STATE_FILE_SIZE) != 0)) {
        close(fd);
        return -1;
    }
    void *m = mmap(NULL, STATE_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    g_st = m;
    /* Processes sharing the state share its devices: their UUIDs are the
     * state file's. */
    g_uuid_salt = ((uint64_t)st.st_dev << 32) ^ (uint64_t)st.st_ino;
    join_state();
    return 0;
}

/* FAKECUDA_FAIL_TOTALMEM=1 (cuDeviceTotalMem fails: a driver
 * query error), FAKECUDA_CALLS=FILE (at exit, "cuMemGetInfo N" is appended:
 * how often the process read the device). Read once, at cuInit.
 * (FAKECUDA_DRIVER_VERSION, e.g. 12080 for a 12.8 driver too old for a CUDA
 * 13 runtime, is read by cuDriverGetVersion itself.) */
static int g_fail_totalmem;
static const char *g_calls_file;
static _Atomic unsigned long long g_meminfo_calls;

/* FAKECUDA_QUERY_DELAY_MS=N: each cuDeviceTotalMem takes N ms, as a
 * driver without persistence mode may on a node of many GPUs. */
static long g_query_delay_ms;

static void parse_misc(void)
{
    const char *v = getenv("FAKECUDA_FAIL_TOTALMEM");
    g_fail_totalmem = v && *v == '1';
    v = getenv("FAKECUDA_QUERY_DELAY_MS");
    g_query_delay_ms = v ? atol(v) : 0;
    g_calls_file = getenv("FAKECUDA_CALLS");
}

static void write_calls(void)
{
    if (!g_calls_file || !*g_calls_file)
        return;
    int fd = open(g_calls_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0)
        return;
    char line[64];
    int n = snprintf(line, sizeof line, "cuMemGetInfo %llu\n",
                     (unsigned long long)atomic_load(&g_meminfo_calls));
    if (write(fd, line, (size_t)n) < 0) {
        /* nothing to do */
    }
    close(fd);
}

static void mark_init(void)
{
    const char *path = getenv("FAKECUDA_INIT_MARK");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0)
        return;
    char line[64];
    int n = snprintf(line, sizeof line, "cuInit pid=%d\n", (int)getpid());
    if (write(fd, line, (size_t)n) < 0) {
        /* nothing to do */
    }
    close(fd);
}

/* At exit the driver gives back what this process held, like a real one does
 * when a process ends.  A fork child owns nothing and gives nothing back. */
static void at_exit(void)
{
    if (atomic_load(&g_forked) || !atomic_load(&g_ready))
        return;
    write_calls();
    for (int i = 0; i < NSHARD; i++) {
        struct shard *s = &g_sh[i];
        /* exit() from a signal handler may interrupt a thread of this very
         * process inside a shard: what it holds then stays charged. */
        if (pthread_mutex_trylock(&s->mu) != 0)
            continue;
        if (s->b) {
            for (size_t j = 0; j <= s->mask; j++) {
                struct ent *e = s->b[j];
                while (e) {
                    struct ent *nx = e->next;
                    /* a pool's allocations are charged through the pool */
                    if (e->kind != K_VA && e->kind != K_POOL && e->dev >= 0)
                        uncharge(e->dev, e->size);
                    e->next = s->freelist;
                    s->freelist = e;
                    e = nx;
                }
                s->b[j] = NULL;
            }
            s->n = 0;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (pthread_mutex_trylock(&g_pool_mu) == 0) {
        for (int d = 0; d < g_ndev; d++) {
            g_defpool[d].used = 0;
            pool_release_to(&g_defpool[d], 0);
        }
        for (struct fpool *p = g_pools; p; p = p->next) {
            p->used = 0;
            pool_release_to(p, 0);
        }
        pthread_mutex_unlock(&g_pool_mu);
    }
    if (pthread_mutex_trylock(&g_ctx_mu) == 0) {
        for (int d = 0; d < g_ndev; d++) {
            if (g_ctx_charged[d]) {
                uncharge(d, g_ctx_bytes);
                g_ctx_charged[d] = 0;
            }
        }
        pthread_mutex_unlock(&g_ctx_mu);
    }
    if (g_me) { /* what could not be given back stays charged, as before */
        struct fproc *me = g_me;
        g_me = NULL;
        atomic_store(&me->start, 0);
        atomic_store(&me->pid, 0);
    }
}

static void on_fork_child(void)
{
    atomic_store(&g_forked, 1);
    atomic_store(&g_ready, 0);
    t_cur = NULL;
}

static void do_init(void)
{
    for (int i = 0; i < NSHARD; i++)
        pthread_mutex_init(&g_sh[i].mu, NULL);
    parse_devices();
    parse_fail();
    parse_misc();
    const char *cb = getenv("FAKECUDA_CONTEXT_BYTES");
    if (cb && *cb && parse_size(cb, &g_ctx_bytes) != 0) {
        fprintf(stderr, "fakecuda: bad FAKECUDA_CONTEXT_BYTES '%s'\n", cb);
        g_ctx_bytes = 0;
    }
    for (int d = 0; d < MAXDEV; d++) {
        g_ctx[d].magic = CTX_MAGIC;
        g_ctx[d].dev = d;
        pool_init(&g_defpool[d], d);
        g_defpool[d].dflt = 1;
    }
    mark_init();
    if (g_ndev == 0) {
        g_init_res = CUDA_ERROR_NO_DEVICE;
        return;
    }
    /* A device of this process alone, unless the state is shared: a UUID of
     * its own. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    g_uuid_salt = ((uint64_t)getpid() << 40) ^ (uint64_t)now.tv_sec * 1000000000ull ^
                  (uint64_t)now.tv_nsec;
    const char *state = getenv("FAKECUDA_STATE");
    if (state && *state && open_state(state) != 0) {
        fprintf(stderr, "fakecuda: cannot use FAKECUDA_STATE=%s: %s\n", state, strerror(errno));
        g_init_res = CUDA_ERROR_OPERATING_SYSTEM;
        return;
    }
    pthread_atfork(NULL, NULL, on_fork_child);
    atexit(at_exit);
    g_init_res = CUDA_SUCCESS;
    atomic_store_explicit(&g_ready, 1, memory_order_release);
}

static inline CUresult ready(void)
{
    return atomic_load_explicit(&g_ready, memory_order_acquire) ? CUDA_SUCCESS
                                                                : CUDA_ERROR_NOT_INITIALIZED;
}

static inline int valid_dev(CUdevice d)
{
    return d >= 0 && d < g_ndev;
}

/* ---- what the other parts of the driver use (fakecuda.h) ---- */

CUresult fk_ready(void)
{
    return ready();
}

int fk_device_count(void)
{
    return ready() == CUDA_SUCCESS ? g_ndev : 0;
}

const struct fk_device *fk_device(int dev)
{
    return valid_dev(dev) ? &g_dev[dev] : NULL;
}

int fk_current_device(void)
{
    return t_cur ? t_cur->dev : -1;
}

int fk_is_device_address(uint64_t p)
{
    return (p >= ADDR_BASE && p < atomic_load_explicit(&g_next_addr, memory_order_relaxed)) ||
           (p >= ADDR_V1_BASE && p < atomic_load_explicit(&g_next_v1, memory_order_relaxed));
}

/* Counts an allocation call; non-zero when this one must fail. */
static CUresult injected(void)
{
    if (g_nfail == 0)
        return CUDA_SUCCESS;
    uint64_t n = atomic_fetch_add(&g_nalloc, 1) + 1;
    for (int i = 0; i < g_nfail; i++)
        if (g_fail_at[i] == n)
            return g_fail_err;
    return CUDA_SUCCESS;
}

/* Charges dev and records a new key of that kind: a device address (v1: one
 * below 4 GiB) or an opaque handle. dev < 0: host memory, nothing charged. */
static CUresult record(uint64_t *key, uint64_t size, int dev, int kind, int v1)
{
    CUresult r = dev >= 0 ? charge(dev, size) : CUDA_SUCCESS;
    if (r)
        return r;
    uint64_t a = v1 ? new_addr_v1(size) : new_addr(kind == K_ALLOC ? size : 1, 256);
    if (!a || tab_insert(a, size, dev, kind, NULL) != 0) {
        if (dev >= 0)
            uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *key = a;
    return CUDA_SUCCESS;
}

static CUresult alloc_common(CUdeviceptr *dptr, uint64_t size, int dev)
{
    uint64_t a;
    CUresult r = record(&a, size, dev, K_ALLOC, 0);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)a;
    return r;
}

/* The usual prologue of an allocation on the current context's device. */
static CUresult alloc_on_current(CUdeviceptr *dptr, size_t size)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = injected()))
        return r;
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_common(dptr, size, t_cur->dev);
}

/* cuMemFree and cuMemFreeAsync alike: memory from a pool goes back to its
 * pool, the rest back to the device. */
static CUresult free_ptr(CUdeviceptr p)
{
    CUresult r = ready();
    if (r)
        return r;
    if (p == 0)
        return CUDA_SUCCESS;
    struct ent e;
    switch (tab_remove((uint64_t)p, KIND(K_ALLOC) | KIND(K_POOL), &e)) {
    case K_ALLOC: uncharge(e.dev, e.size); return CUDA_SUCCESS;
    case K_POOL: pool_free(e.owner, e.size); return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/* ------------------------------------------------------------------------ */
/* Initialisation, version, devices                                         */

CUresult CUDAAPI cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(&g_forked))
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_once(&g_once, do_init);
    return g_init_res;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    const char *v = getenv("FAKECUDA_DRIVER_VERSION"); /* callable before cuInit */
    *driverVersion = v && *v ? atoi(v) : FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", g_dev[dev].name);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (g_fail_totalmem)
        return CUDA_ERROR_UNKNOWN;
    if (g_query_delay_ms > 0) {
        struct timespec ts = {g_query_delay_ms / 1000, (g_query_delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    *bytes = g_dev[dev].total;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pi = fk_attribute(dev, attrib); /* fakecuda_props.c */
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = (CUmemoryPool)(void *)&g_defpool[dev];
    return CUDA_SUCCESS;
}

/* The pool cuMemAllocAsync uses on a device. */
static struct fpool *current_pool(int dev)
{
    pthread_mutex_lock(&g_pool_mu);
    struct fpool *p = g_curpool[dev] ? g_curpool[dev] : &g_defpool[dev];
    pthread_mutex_unlock(&g_pool_mu);
    return p;
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = (CUmemoryPool)(void *)current_pool(dev);
    return CUDA_SUCCESS;
}

/* The pool must be located on that device. */
CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_pool_mu);
    struct fpool *p = pool_live(pool, g_ndev);
    if (!p || p->dev != dev)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        g_curpool[dev] = p == &g_defpool[dev] ? NULL : p;
    pthread_mutex_unlock(&g_pool_mu);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                  */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_ctx_mu);
    if (!g_ctx_charged[dev]) {
        if (g_ctx_bytes && (r = charge(dev, g_ctx_bytes)) != CUDA_SUCCESS) {
            pthread_mutex_unlock(&g_ctx_mu);
            return r;
        }
        g_ctx_charged[dev] = 1;
    }
    pthread_mutex_unlock(&g_ctx_mu);
    atomic_fetch_add(&g_ctx_refs[dev], 1);
    *pctx = (CUcontext)(void *)&g_ctx[dev];
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    int cur = atomic_load(&g_ctx_refs[dev]);
    while (cur > 0 && !atomic_compare_exchange_weak(&g_ctx_refs[dev], &cur, cur - 1)) {
    }
    return CUDA_SUCCESS;
}

/* Flags are kept, never acted on (nothing is scheduled). */
static _Atomic unsigned g_ctx_flags[MAXDEV];

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = atomic_load(&g_ctx_flags[dev]);
    *active = atomic_load(&g_ctx_refs[dev]) > 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    atomic_store(&g_ctx_flags[dev], flags);
    return CUDA_SUCCESS;
}

static struct fctx *as_ctx(CUcontext c)
{
    struct fctx *f = (struct fctx *)(void *)c;
    if (f < &g_ctx[0] || f >= &g_ctx[MAXDEV] || f->magic != CTX_MAGIC || !valid_dev(f->dev))
        return NULL;
    return f;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!ctx) {
        t_cur = NULL;
        return CUDA_SUCCESS;
    }
    struct fctx *f = as_ctx(ctx);
    if (!f)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_cur = f;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)(void *)t_cur;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = t_cur->dev;
    return CUDA_SUCCESS;
}

/* CUDA 13's cuCtxGetDevice: ctx NULL means the current one. */
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    if (!ctx)
        return cuCtxGetDevice(device);
    CUresult r = ready();
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    struct fctx *f = as_ctx(ctx);
    if (!f)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = f->dev;
    return CUDA_SUCCESS;
}

/* Synchronisation: nothing runs on the fake device, so all that happens is
 * what the pools do at a synchronize (see pools_sync). */
CUresult CUDAAPI cuCtxSynchronize(void)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    pools_sync(g_ndev);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    CUresult r = ready();
    if (r)
        return r;
    if (ctx ? !as_ctx(ctx) : !t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    pools_sync(g_ndev);
    return CUDA_SUCCESS;
}

/* The fake has no stream objects: every handle is the current context's. */
static CUresult stream_sync(CUstream hStream)
{
    (void)hStream;
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    pools_sync(g_ndev);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    return stream_sync(hStream);
}

CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream)
{
    return stream_sync(hStream);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

CUresult CUDAAPI cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    atomic_fetch_add(&g_meminfo_calls, 1);
    reap(false);
    int d = t_cur->dev;
    uint64_t used = atomic_load_explicit(&g_st->used[d], memory_order_relaxed);
    *total = g_dev[d].total;
    *free_bytes = used < g_dev[d].total ? g_dev[d].total - used : 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return alloc_on_current(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    return alloc_on_current(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = injected()))
        return r;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = ((uint64_t)WidthInBytes + 511) & ~511ULL;
    if (Height > UINT64_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = alloc_common(dptr, pitch * Height, t_cur->dev);
    if (r == CUDA_SUCCESS)
        *pPitch = (size_t)pitch;
    return r;
}

/* Stream-ordered allocation: from the given pool, or (pool NULL) from the
 * current pool of the stream's device, i.e. the current context's. The
 * pool's own device is charged, whatever the caller's current device. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, int from_pool)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = injected()))
        return r;
    if (!dptr || size == 0 || (from_pool && !pool))
        return CUDA_ERROR_INVALID_VALUE;
    return pool_alloc(from_pool ? pool : NULL, t_cur->dev, size, dptr);
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return alloc_async(dptr, bytesize, NULL, 0);
}

CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return alloc_async(dptr, bytesize, NULL, 0);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream)
{
    (void)hStream;
    return alloc_async(dptr, bytesize, pool, 1);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream)
{
    (void)hStream;
    return alloc_async(dptr, bytesize, pool, 1);
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    return free_ptr(dptr);
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    (void)hStream;
    return free_ptr(dptr);
}

CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    (void)hStream;
    return free_ptr(dptr);
}

/* Virtual memory management: only cuMemCreate of device memory charges; a
 * handle located on the host (HOST, HOST_NUMA, HOST_NUMA_CURRENT) charges
 * nothing. */

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    (void)flags;
    CUresult r = ready();
    if (r)
        return r;
    if ((r = injected()))
        return r;
    if (!handle || !prop || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!valid_dev(prop->location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        dev = prop->location.id;
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: dev = -1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t h;
    if ((r = record(&h, size, dev, K_HANDLE, 0)) == CUDA_SUCCESS)
        *handle = (CUmemGenericAllocationHandle)h;
    return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = ready();
    if (r)
        return r;
    struct ent e;
    if (tab_remove((uint64_t)handle, KIND(K_HANDLE), &e) != K_HANDLE)
        return CUDA_ERROR_INVALID_VALUE;
    if (e.dev >= 0)
        uncharge(e.dev, e.size);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags)
{
    (void)addr;
    (void)flags;
    CUresult r = ready();
    if (r)
        return r;
    if (!ptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a = new_addr(size, alignment ? alignment : GRANULARITY);
    if (tab_insert(a, size, -1, K_VA, NULL) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)a;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    (void)size;
    CUresult r = ready();
    if (r)
        return r;
    struct ent e;
    if (tab_remove((uint64_t)ptr, KIND(K_VA), &e) != K_VA)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    (void)offset;
    (void)flags;
    CUresult r = ready();
    if (r)
        return r;
    if (ptr == 0 || size == 0 || !tab_contains((uint64_t)handle, K_HANDLE))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = ready();
    if (r)
        return r;
    if (ptr == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count)
{
    CUresult r = ready();
    if (r)
        return r;
    if (ptr == 0 || size == 0 || (!desc && count))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity,
                                               const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option)
{
    (void)option;
    CUresult r = ready();
    if (r)
        return r;
    if (!granularity || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Memory pools                                                              */

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    switch (poolProps->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!valid_dev(poolProps->location.id))
            return CUDA_ERROR_INVALID_VALUE;
        dev = poolProps->location.id;
        break;
    case CU_MEM_LOCATION_TYPE_HOST: /* not IPC capable */
        if (poolProps->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
            return CUDA_ERROR_INVALID_VALUE;
        dev = -1;
        break;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA: /* the id is a NUMA node */
        if (poolProps->location.id < 0)
            return CUDA_ERROR_INVALID_VALUE;
        dev = -1;
        break;
    default: /* HOST_NUMA_CURRENT included, as documented */
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fpool *p = malloc(sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pool_init(p, dev);
    p->max = poolProps->maxSize;
    pthread_mutex_lock(&g_pool_mu);
    p->next = g_pools;
    g_pools = p;
    pthread_mutex_unlock(&g_pool_mu);
    *pool = (CUmemoryPool)(void *)p;
    return CUDA_SUCCESS;
}

/* A device's default pool cannot be destroyed. A pool with allocations still
 * out is released once the last of them is freed; destroying a device's
 * current pool makes the default one current again. */
CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult r = ready();
    if (r)
        return r;
    pthread_mutex_lock(&g_pool_mu);
    struct fpool *p = pool_live(pool, g_ndev);
    if (!p || p->dflt) {
        pthread_mutex_unlock(&g_pool_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (p->dev >= 0 && g_curpool[p->dev] == p)
        g_curpool[p->dev] = NULL;
    p->dead = 1;
    pool_release_to(p, 0);
    pool_reap(p);
    pthread_mutex_unlock(&g_pool_mu);
    return CUDA_SUCCESS;
}

/* Keeps at least minBytesToKeep reserved, and never what is in use. */
CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CUresult r = ready();
    if (r)
        return r;
    pthread_mutex_lock(&g_pool_mu);
    struct fpool *p = pool_live(pool, g_ndev);
    if (p)
        pool_release_to(p, minBytesToKeep);
    pthread_mutex_unlock(&g_pool_mu);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_pool_mu);
    struct fpool *p = pool_live(pool, g_ndev);
    cuuint64_t v64;
    if (!p) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(int *)value != 0;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            memcpy(&v64, value, sizeof v64);
            p->threshold = v64;
            break;
        /* the high watermarks can only be reset (to the current value) */
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            memcpy(&v64, value, sizeof v64);
            if (v64)
                r = CUDA_ERROR_INVALID_VALUE;
            else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
                p->reserved_high = p->reserved;
            else
                p->used_high = p->used;
            break;
        default: r = CUDA_ERROR_INVALID_VALUE; break; /* the current values are read-only */
        }
    }
    pthread_mutex_unlock(&g_pool_mu);
    return r;
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_pool_mu);
    struct fpool *p = pool_live(pool, g_ndev);
    cuuint64_t v64 = 0;
    if (!p) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            *(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v64 = p->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v64 = p->reserved; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v64 = p->reserved_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v64 = p->used; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v64 = p->used_high; break;
        default: r = CUDA_ERROR_INVALID_VALUE; break;
        }
        if (r == CUDA_SUCCESS && attr >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
            memcpy(value, &v64, sizeof v64); /* a known cuuint64_t attribute */
    }
    pthread_mutex_unlock(&g_pool_mu);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Arrays                                                                    */
/*
 * Charged width x max(height,1) x max(depth,1) x the element's bytes, summed
 * over the mip levels (each halves width, height and, unless layered or a
 * cubemap, depth, down to 1), the total rounded up to 512 B. Sparse and
 * deferred-mapping arrays have no memory of their own (it comes from
 * cuMemCreate when mapped): charged nothing. Any overflow, a zero width, a
 * depth without a height (unless layered) or a format the fake does not size
 * (block-compressed, YUV): CUDA_ERROR_INVALID_VALUE.
 */

/* Bytes of one element: the classic formats have 1, 2 or 4 channels of the
 * format's size; the normalized ones say their channels in their name. */
static int element_bytes(CUarray_format f, unsigned ch, uint64_t *out)
{
    unsigned size = 0, fixed = 0;
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: size = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: size = 2; break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: size = 4; break;
    case CU_AD_FORMAT_UNORM_INT8X1: case CU_AD_FORMAT_SNORM_INT8X1: size = 1, fixed = 1; break;
    case CU_AD_FORMAT_UNORM_INT8X2: case CU_AD_FORMAT_SNORM_INT8X2: size = 1, fixed = 2; break;
    case CU_AD_FORMAT_UNORM_INT8X4: case CU_AD_FORMAT_SNORM_INT8X4: size = 1, fixed = 4; break;
    case CU_AD_FORMAT_UNORM_INT16X1: case CU_AD_FORMAT_SNORM_INT16X1: size = 2, fixed = 1; break;
    case CU_AD_FORMAT_UNORM_INT16X2: case CU_AD_FORMAT_SNORM_INT16X2: size = 2, fixed = 2; break;
    case CU_AD_FORMAT_UNORM_INT16X4: case CU_AD_FORMAT_SNORM_INT16X4: size = 2, fixed = 4; break;
    default: return -1;
    }
    if ((ch != 1 && ch != 2 && ch != 4) || (fixed && ch != fixed))
        return -1;
    *out = (uint64_t)size * ch;
    return 0;
}

static CUresult array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format fmt, unsigned ch,
                            unsigned flags, unsigned levels, uint64_t *out)
{
    uint64_t elem;
    if (w == 0 || levels == 0 || element_bytes(fmt, ch, &elem) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int layered = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    if (h == 0 && d != 0 && !(flags & CUDA_ARRAY3D_LAYERED))
        return CUDA_ERROR_INVALID_VALUE;
    if ((flags & CUDA_ARRAY3D_CUBEMAP) &&
        (w != h || d == 0 || ((flags & CUDA_ARRAY3D_LAYERED) ? d % 6 : d != 6)))
        return CUDA_ERROR_INVALID_VALUE;
    /* no more levels than halvings of the largest extent that is halved */
    uint64_t big = w > h ? w : h;
    if (!layered && d > big)
        big = d;
    unsigned maxlev = 1;
    while (big >>= 1)
        maxlev++;
    if (levels > maxlev)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t lw = w >> l, lh = h >> l, ld = layered ? d : d >> l, b;
        lw = lw ? lw : 1;
        lh = h == 0 ? 1 : lh ? lh : 1;
        ld = d == 0 ? 1 : ld ? ld : 1;
        if (__builtin_mul_overflow(lw, lh, &b) || __builtin_mul_overflow(b, ld, &b) ||
            __builtin_mul_overflow(b, elem, &b) || __builtin_add_overflow(total, b, &total))
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (total > UINT64_MAX - 511)
        return CUDA_ERROR_INVALID_VALUE;
    *out = flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) ? 0
                                                                         : (total + 511) & ~511ULL;
    return CUDA_SUCCESS;
}

/* An array's extent and format, whichever descriptor it came in. */
struct adesc {
    uint64_t w, h, d;
    CUarray_format fmt;
    unsigned ch, flags;
};

/* An array (kind K_ARRAY or K_MIPMAP) on the current context's device; a
 * NULL handle or descriptor is CUDA_ERROR_INVALID_VALUE. */
static CUresult array_create(void *handle_out, const struct adesc *a, unsigned levels, int kind)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = injected()))
        return r;
    uint64_t bytes, h;
    if (!handle_out || !a)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = array_bytes(a->w, a->h, a->d, a->fmt, a->ch, a->flags, levels, &bytes)) ||
        (r = record(&h, bytes, t_cur->dev, kind, 0)))
        return r;
    void *p = (void *)(uintptr_t)h; /* CUarray and CUmipmappedArray are opaque pointers */
    memcpy(handle_out, &p, sizeof p);
    return CUDA_SUCCESS;
}

static CUresult array_destroy(void *handle, int kind)
{
    CUresult r = ready();
    if (r)
        return r;
    struct ent e;
    if (tab_remove((uint64_t)(uintptr_t)handle, KIND(kind), &e) != kind)
        return CUDA_ERROR_INVALID_HANDLE;
    uncharge(e.dev, e.size);
    return CUDA_SUCCESS;
}

#define ADESC2(x) ((struct adesc){(x)->Width, (x)->Height, 0, (x)->Format, (x)->NumChannels, 0})
#define ADESC3(x)                                                                          \
    ((struct adesc){(x)->Width, (x)->Height, (x)->Depth, (x)->Format, (x)->NumChannels, (x)->Flags})

CUresult CUDAAPI cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    struct adesc a = pAllocateArray ? ADESC2(pAllocateArray) : (struct adesc){0};
    return array_create(pHandle, pAllocateArray ? &a : NULL, 1, K_ARRAY);
}

CUresult CUDAAPI cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    struct adesc a = pAllocateArray ? ADESC3(pAllocateArray) : (struct adesc){0};
    return array_create(pHandle, pAllocateArray ? &a : NULL, 1, K_ARRAY);
}

CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                        const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                        unsigned int numMipmapLevels)
{
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    struct adesc a = d ? ADESC3(d) : (struct adesc){0};
    return array_create(pHandle, d ? &a : NULL, numMipmapLevels, K_MIPMAP);
}

CUresult CUDAAPI cuArrayDestroy(CUarray hArray)
{
    return array_destroy(hArray, K_ARRAY);
}

CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return array_destroy(hMipmappedArray, K_MIPMAP);
}

/* ------------------------------------------------------------------------ */
/* Host memory: real, page-aligned pages of this process, charged to no     */
/* device (mmap, so that a size larger than the machine's memory works as    */
/* long as it is not touched).                                               */

#define HOST_FLAGS (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = injected()))
        return r;
    if (!pp || bytesize == 0 || (Flags & ~(unsigned)HOST_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (tab_insert((uint64_t)(uintptr_t)p, bytesize, -1, K_HOST, NULL) != 0) {
        munmap(p, bytesize);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fk_host_range_add(p, bytesize, 0); /* for pointer queries */
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    CUresult r = ready();
    if (r)
        return r;
    struct ent e;
    if (tab_remove((uint64_t)(uintptr_t)p, KIND(K_HOST), &e) != K_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    fk_host_range_remove(p);
    munmap(p, e.size);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Legacy (v1) entry points                                                  */
/*
 * What the real library keeps for binaries built before CUDA 3.2, with the
 * ABI cuda.h gives them: 32-bit device pointers (CUdeviceptr_v1) and 32-bit
 * sizes. Device pointers come from a window below 4 GiB so that they fit
 * (and are freed by cuMemFree_v2 too); sizes read back (cuMemGetInfo,
 * cuDeviceTotalMem) are clamped to 4 GiB - 1, as the real library does.
 */

static unsigned int clamp32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (unsigned int)v;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = injected()))
        return r;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a;
    if ((r = record(&a, bytesize, t_cur->dev, K_ALLOC, 1)) == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)a;
    return r;
}

CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                 unsigned int Height, unsigned int ElementSizeBytes)
{
    CUresult r = ready();
    if (r)
        return r;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = injected()))
        return r;
    uint64_t pitch = ((uint64_t)WidthInBytes + 511) & ~511ULL;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 || pitch > UINT32_MAX ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a;
    if ((r = record(&a, pitch * Height, t_cur->dev, K_ALLOC, 1)) == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)a;
        *pPitch = (unsigned int)pitch;
    }
    return r;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr)
{
    return free_ptr((CUdeviceptr)dptr);
}

CUresult CUDAAPI cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(free_bytes ? &f : NULL, total ? &t : NULL);
    if (r == CUDA_SUCCESS) {
        *free_bytes = clamp32(f);
        *total = clamp32(t);
    }
    return r;
}

CUresult CUDAAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t t;
    CUresult r = cuDeviceTotalMem_v2(bytes ? &t : NULL, dev);
    if (r == CUDA_SUCCESS)
        *bytes = clamp32(t);
    return r;
}

CUresult CUDAAPI cuMemAllocHost(void **pp, unsigned int bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

CUresult CUDAAPI cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray)
{
    struct adesc a = pAllocateArray ? ADESC2(pAllocateArray) : (struct adesc){0};
    return array_create(pHandle, pAllocateArray ? &a : NULL, 1, K_ARRAY);
}

CUresult CUDAAPI cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray)
{
    struct adesc a = pAllocateArray ? ADESC3(pAllocateArray) : (struct adesc){0};
    return array_create(pHandle, pAllocateArray ? &a : NULL, 1, K_ARRAY);
}

/* The same as _v2 (the v2 only changed what happens to the context). */
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

/* ------------------------------------------------------------------------ */
/* Test hook                                                                 */

unsigned long long fakecuda_used(int dev)
{
    if (ready() || !valid_dev(dev))
        return UINT64_MAX;
    return atomic_load_explicit(&g_st->used[dev], memory_order_relaxed);
}

unsigned long long fakecuda_high_water(int dev)
{
    if (ready() || !valid_dev(dev))
        return UINT64_MAX;
    return atomic_load_explicit(&g_st->high[dev], memory_order_relaxed);
}

uint64_t fk_uuid_salt(void)
{
    return g_uuid_salt;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

static const struct {
    CUresult code;
    const char *name, *str;
} g_errs[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++) {
        if (g_errs[i].code == error) {
            *pStr = g_errs[i].str;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++) {
        if (g_errs[i].code == error) {
            *pStr = g_errs[i].name;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------------ */
/* Entry points                                                              */

/* FAKECUDA_TRACE: one line per lookup, so that a test can tell what a
 * caller (a static runtime, say) asked the driver for. */
static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...)
{
    const char *path = getenv("FAKECUDA_TRACE");
    if (!path || !*path)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    if ((size_t)n >= sizeof line)
        n = sizeof line - 1;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)n) < 0) {
        /* nothing to do */
    }
    close(fd);
}

/* The driver's private interface: function tables by UUID that NVIDIA's own
 * runtime (libcudart, and the static libcudart_static.a in every program
 * nvcc builds) needs before its first call. Their contents are undocumented,
 * so the fake has none: every table is CUDA_ERROR_NOT_SUPPORTED, and such a
 * runtime's first call fails with cudaErrorNotSupported (801). */
CUresult CUDAAPI cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *u = (const unsigned char *)pExportTableId->bytes;
    trace("cuGetExportTable %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
          u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
          u[14], u[15]);
    *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

struct sym {
    const char *name;
    int version; /* first CUDA version with this ABI (cudaTypedefs.h's PFN_name_vVERSION) */
    void *fn;
    void *ptsz;  /* per-thread-default-stream variant, if any */
};

#define S(n, v, f)     {n, v, (void *)(f), NULL}
#define SP(n, v, f, p) {n, v, (void *)(f), (void *)(p)}

/* One row per ABI: a request for a version gets the newest ABI not newer. */
static const struct sym g_syms[] = {
    S("cuInit", 2000, cuInit),
    S("cuDriverGetVersion", 2020, cuDriverGetVersion),
    S("cuDeviceGetCount", 2000, cuDeviceGetCount),
    S("cuDeviceGet", 2000, cuDeviceGet),
    S("cuDeviceGetName", 2000, cuDeviceGetName),
    S("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    S("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    S("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    S("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    S("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    S("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    S("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    S("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    S("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    S("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    S("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    S("cuCtxGetDevice", 2000, cuCtxGetDevice),
    S("cuCtxGetDevice", 13000, cuCtxGetDevice_v2),
    S("cuCtxSynchronize", 2000, cuCtxSynchronize),
    S("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
    SP("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    S("cuMemGetInfo", 2000, cuMemGetInfo),
    S("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    S("cuMemAlloc", 2000, cuMemAlloc),
    S("cuMemAlloc", 3020, cuMemAlloc_v2),
    S("cuMemFree", 2000, cuMemFree),
    S("cuMemFree", 3020, cuMemFree_v2),
    S("cuMemAllocManaged", 6000, cuMemAllocManaged),
    S("cuMemAllocPitch", 2000, cuMemAllocPitch),
    S("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    S("cuMemAllocHost", 2000, cuMemAllocHost),
    S("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    S("cuMemHostAlloc", 2020, cuMemHostAlloc),
    S("cuMemFreeHost", 2000, cuMemFreeHost),
    SP("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    SP("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    SP("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    S("cuMemPoolCreate", 11020, cuMemPoolCreate),
    S("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    S("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    S("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    S("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    S("cuArrayCreate", 2000, cuArrayCreate),
    S("cuArrayCreate", 3020, cuArrayCreate_v2),
    S("cuArray3DCreate", 2000, cuArray3DCreate),
    S("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    S("cuArrayDestroy", 2000, cuArrayDestroy),
    S("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    S("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    S("cuMemCreate", 10020, cuMemCreate),
    S("cuMemRelease", 10020, cuMemRelease),
    S("cuMemAddressReserve", 10020, cuMemAddressReserve),
    S("cuMemAddressFree", 10020, cuMemAddressFree),
    S("cuMemMap", 10020, cuMemMap),
    S("cuMemUnmap", 10020, cuMemUnmap),
    S("cuMemSetAccess", 10020, cuMemSetAccess),
    S("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    /* fakecuda_exec.c: streams, events, copies, modules, launches, ... */
    S("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    S("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    S("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange),
    S("cuStreamCreate", 2000, cuStreamCreate),
    S("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    S("cuStreamDestroy", 2000, cuStreamDestroy_v2),
    SP("cuStreamGetPriority", 5050, cuStreamGetPriority, cuStreamGetPriority),
    SP("cuStreamGetFlags", 5050, cuStreamGetFlags, cuStreamGetFlags),
    SP("cuStreamGetCtx", 9020, cuStreamGetCtx, cuStreamGetCtx),
    SP("cuStreamGetId", 12000, cuStreamGetId, cuStreamGetId),
    SP("cuStreamGetDevice", 12080, cuStreamGetDevice, cuStreamGetDevice),
    SP("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery),
    SP("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent),
    SP("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2),
    SP("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture),
    SP("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing),
    SP("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2),
    SP("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3),
    S("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    SP("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc),
    SP("cuStreamAddCallback", 5000, cuStreamAddCallback, cuStreamAddCallback),
    SP("cuStreamWriteValue32", 8000, cuStreamWriteValue32_v2, cuStreamWriteValue32_v2),
    SP("cuStreamWaitValue32", 8000, cuStreamWaitValue32_v2, cuStreamWaitValue32_v2),
    S("cuEventCreate", 2000, cuEventCreate),
    S("cuEventDestroy", 2000, cuEventDestroy_v2),
    SP("cuEventRecord", 2000, cuEventRecord, cuEventRecord),
    SP("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags, cuEventRecordWithFlags),
    S("cuEventQuery", 2000, cuEventQuery),
    S("cuEventSynchronize", 2000, cuEventSynchronize),
    S("cuEventElapsedTime", 2000, cuEventElapsedTime_v2),
    S("cuMemHostRegister", 4000, cuMemHostRegister_v2),
    S("cuMemHostUnregister", 4000, cuMemHostUnregister),
    S("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    S("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    S("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    SP("cuMemcpy", 4000, cuMemcpy, cuMemcpy),
    SP("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync),
    SP("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2),
    SP("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2),
    SP("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2),
    SP("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2),
    SP("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2),
    SP("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2),
    SP("cuMemcpyPeer", 4000, cuMemcpyPeer, cuMemcpyPeer),
    SP("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync, cuMemcpyPeerAsync),
    SP("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2),
    SP("cuMemsetD16", 3020, cuMemsetD16_v2, cuMemsetD16_v2),
    SP("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2),
    SP("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async),
    SP("cuMemsetD16Async", 3020, cuMemsetD16Async, cuMemsetD16Async),
    SP("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async),
    S("cuModuleLoadData", 2000, cuModuleLoadData),
    S("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx),
    S("cuModuleUnload", 2000, cuModuleUnload),
    S("cuModuleGetFunction", 2000, cuModuleGetFunction),
    SP("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel),
    SP("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel),
    S("cuFuncGetAttribute", 2020, cuFuncGetAttribute),
    S("cuFuncSetAttribute", 9000, cuFuncSetAttribute),
    S("cuFuncSetCacheConfig", 3000, cuFuncSetCacheConfig),
    S("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, cuOccupancyMaxActiveBlocksPerMultiprocessor),
    S("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000,
      cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags),
    S("cuLinkCreate", 6050, cuLinkCreate_v2),
    S("cuLinkAddData", 6050, cuLinkAddData_v2),
    S("cuLinkComplete", 5050, cuLinkComplete),
    S("cuLinkDestroy", 5050, cuLinkDestroy),
    S("cuTensorMapEncodeTiled", 12000, cuTensorMapEncodeTiled),
    S("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    S("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
    S("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess),
    S("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
    S("cuDeviceGetByPCIBusId", 4010, cuDeviceGetByPCIBusId),
    S("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    S("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    S("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    S("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    S("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    S("cuIpcGetEventHandle", 4010, cuIpcGetEventHandle),
    S("cuIpcOpenEventHandle", 4010, cuIpcOpenEventHandle),
    S("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    S("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    S("cuMulticastCreate", 12010, cuMulticastCreate),
    S("cuMulticastAddDevice", 12010, cuMulticastAddDevice),
    S("cuMulticastBindMem", 12010, cuMulticastBindMem),
    S("cuMulticastGetGranularity", 12010, cuMulticastGetGranularity),
    S("cuGetErrorString", 6000, cuGetErrorString),
    S("cuGetErrorName", 6000, cuGetErrorName),
    S("cuGetExportTable", 3000, cuGetExportTable),
    S("cuGetProcAddress", 11030, cuGetProcAddress),
    S("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

/* Both ABIs of cuGetProcAddress; the trace says which one was called. */
static CUresult getproc(const char *via, const char *symbol, void **pfn, int cudaVersion,
                        cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sym *best = NULL;
    int named = 0;
    for (size_t i = 0; i < sizeof g_syms / sizeof g_syms[0]; i++) {
        if (strcmp(g_syms[i].name, symbol) != 0)
            continue;
        named = 1;
        if (g_syms[i].version <= cudaVersion && (!best || g_syms[i].version > best->version))
            best = &g_syms[i];
    }
    trace("%s %s %d %llu %s\n", via, symbol, cudaVersion, (unsigned long long)flags,
          best ? "found" : named ? "version_not_sufficient" : "not_found");
    if (!best) {
        *pfn = NULL;
        if (symbolStatus)
            *symbolStatus = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                  : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz ? best->ptsz
                                                                               : best->fn;
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    return getproc("cuGetProcAddress_v2", symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags)
{
    return getproc("cuGetProcAddress", symbol, pfn, cudaVersion, flags, NULL);
}
