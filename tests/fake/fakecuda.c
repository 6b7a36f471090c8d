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
 *
 * See tests/fake/README.md.
 */
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Exported names cuda.h does not declare in this mode. */
#undef cuGetProcAddress
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags);
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream);

#define FAKE_DRIVER_VERSION 13000 /* FAKECUDA_DRIVER_VERSION overrides it */
#define MAXDEV              64
#define STATE_FILE_SIZE     4096
#define NSHARD              64
#define ADDR_BASE           0x700000000000ULL
#define GRANULARITY         (2ULL << 20)

/* ------------------------------------------------------------------------ */
/* Devices and usage                                                         */

struct fdev {
    char name[256];
    uint64_t total;
    int major, minor;
};

struct fstate {
    _Atomic uint64_t used[MAXDEV];
};

struct fctx {
    uint32_t magic;
    int dev;
};
#define CTX_MAGIC 0xfac7c0deu

static struct fdev g_dev[MAXDEV];
static int g_ndev;
static struct fstate g_local_state;
static struct fstate *g_st = &g_local_state;

static struct fctx g_ctx[MAXDEV];
static char g_pool[MAXDEV]; /* default memory pool handles: &g_pool[dev] */
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

/* ------------------------------------------------------------------------ */
/* Live allocations: key -> (size, dev, kind), sharded                       */

enum { K_ALLOC = 1, K_HANDLE = 2, K_VA = 3 };

struct ent {
    uint64_t key, size;
    int32_t dev, kind;
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

static int tab_insert(uint64_t key, uint64_t size, int dev, int kind)
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
    size_t j = (h >> 6) & s->mask;
    e->next = s->b[j];
    s->b[j] = e;
    s->n++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Removes key if it is live with that kind; 0 when found. */
static int tab_remove(uint64_t key, int kind, uint64_t *size, int *dev)
{
    uint64_t h = mix64(key);
    struct shard *s = &g_sh[h & (NSHARD - 1)];
    int rc = -1;
    pthread_mutex_lock(&s->mu);
    if (s->b) {
        struct ent **pp = &s->b[(h >> 6) & s->mask];
        for (struct ent *e = *pp; e; pp = &e->next, e = e->next) {
            if (e->key != key)
                continue;
            if (e->kind == kind) {
                *size = e->size;
                *dev = e->dev;
                *pp = e->next;
                e->next = s->freelist;
                s->freelist = e;
                s->n--;
                rc = 0;
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
    return CUDA_SUCCESS;
}

static void uncharge(int dev, uint64_t size)
{
    _Atomic uint64_t *u = &g_st->used[dev];
    uint64_t cur = atomic_load_explicit(u, memory_order_relaxed);
    uint64_t nv;
    do {
        nv = cur > size ? cur - size : 0;
    } while (!atomic_compare_exchange_weak_explicit(u, &cur, nv, memory_order_relaxed,
                                                    memory_order_relaxed));
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
    struct fdev d;
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

static void parse_misc(void)
{
    const char *v = getenv("FAKECUDA_FAIL_TOTALMEM");
    g_fail_totalmem = v && *v == '1';
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
        pthread_mutex_lock(&s->mu);
        if (s->b) {
            for (size_t j = 0; j <= s->mask; j++) {
                struct ent *e = s->b[j];
                while (e) {
                    struct ent *nx = e->next;
                    if (e->kind != K_VA)
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
    pthread_mutex_lock(&g_ctx_mu);
    for (int d = 0; d < g_ndev; d++) {
        if (g_ctx_charged[d]) {
            uncharge(d, g_ctx_bytes);
            g_ctx_charged[d] = 0;
        }
    }
    pthread_mutex_unlock(&g_ctx_mu);
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
    }
    mark_init();
    if (g_ndev == 0) {
        g_init_res = CUDA_ERROR_NO_DEVICE;
        return;
    }
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

static CUresult alloc_common(CUdeviceptr *dptr, uint64_t size, int dev)
{
    CUresult r = charge(dev, size);
    if (r)
        return r;
    uint64_t a = new_addr(size, 256);
    if (tab_insert(a, size, dev, K_ALLOC) != 0) {
        uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = (CUdeviceptr)a;
    return CUDA_SUCCESS;
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

static CUresult free_ptr(CUdeviceptr p)
{
    CUresult r = ready();
    if (r)
        return r;
    if (p == 0)
        return CUDA_SUCCESS;
    uint64_t size;
    int dev;
    if (tab_remove((uint64_t)p, K_ALLOC, &size, &dev) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    uncharge(dev, size);
    return CUDA_SUCCESS;
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
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = g_dev[dev].major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = g_dev[dev].minor; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *pi = 1; break;
    default: *pi = 0; break;
    }
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
    *pool_out = (CUmemoryPool)(void *)&g_pool[dev];
    return CUDA_SUCCESS;
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

CUresult CUDAAPI cuCtxSynchronize(void)
{
    CUresult r = ready();
    if (r)
        return r;
    return t_cur ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
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

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return alloc_on_current(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return alloc_on_current(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream)
{
    (void)pool;
    (void)hStream;
    return alloc_on_current(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream)
{
    (void)pool;
    (void)hStream;
    return alloc_on_current(dptr, bytesize);
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

/* Virtual memory management: only cuMemCreate charges. */

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    (void)flags;
    CUresult r = ready();
    if (r)
        return r;
    if ((r = injected()))
        return r;
    if (!handle || !prop || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if ((r = charge(dev, size)))
        return r;
    uint64_t h = new_addr(1, 256);
    if (tab_insert(h, size, dev, K_HANDLE) != 0) {
        uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)h;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = ready();
    if (r)
        return r;
    uint64_t size;
    int dev;
    if (tab_remove((uint64_t)handle, K_HANDLE, &size, &dev) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    uncharge(dev, size);
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
    if (tab_insert(a, size, -1, K_VA) != 0)
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
    uint64_t sz;
    int dev;
    if (tab_remove((uint64_t)ptr, K_VA, &sz, &dev) != 0)
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

struct sym {
    const char *name;
    int version; /* first CUDA version with this ABI */
    void *fn;
    void *ptsz;  /* per-thread-default-stream variant, if any */
};

#define S(n, v, f)     {n, v, (void *)(f), NULL}
#define SP(n, v, f, p) {n, v, (void *)(f), (void *)(p)}

static const struct sym g_syms[] = {
    S("cuInit", 2000, cuInit),
    S("cuDriverGetVersion", 2020, cuDriverGetVersion),
    S("cuDeviceGetCount", 2000, cuDeviceGetCount),
    S("cuDeviceGet", 2000, cuDeviceGet),
    S("cuDeviceGetName", 2000, cuDeviceGetName),
    S("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    S("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    S("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    S("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    S("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    S("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    S("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    S("cuCtxGetDevice", 2000, cuCtxGetDevice),
    S("cuCtxSynchronize", 2000, cuCtxSynchronize),
    S("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    S("cuMemAlloc", 3020, cuMemAlloc_v2),
    S("cuMemFree", 3020, cuMemFree_v2),
    S("cuMemAllocManaged", 6000, cuMemAllocManaged),
    S("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    SP("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    SP("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    SP("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    S("cuMemCreate", 10020, cuMemCreate),
    S("cuMemRelease", 10020, cuMemRelease),
    S("cuMemAddressReserve", 10020, cuMemAddressReserve),
    S("cuMemAddressFree", 10020, cuMemAddressFree),
    S("cuMemMap", 10020, cuMemMap),
    S("cuMemUnmap", 10020, cuMemUnmap),
    S("cuMemSetAccess", 10020, cuMemSetAccess),
    S("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    S("cuGetErrorString", 6000, cuGetErrorString),
    S("cuGetErrorName", 6000, cuGetErrorName),
    S("cuGetProcAddress", 11030, cuGetProcAddress),
    S("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
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

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
