/*
 * replay.c - make the calls of a golden trace (tests/traces/NAME.trace) again,
 * through the same paths, on the fake CUDA stack, and check that each one
 * comes back as it did when the trace was recorded.
 *
 *   replay12 TRACE      (built against libcudart.so.12; replay13 against .13)
 *
 * A golden trace is what real PyTorch did (tests/traces/README.md): which
 * driver functions it looked up and how, every allocation with its size and
 * result (a refusal included), every free, map, unmap and release, the
 * pools' trims and attributes, what cudaMemGetInfo told it, and the C API
 * calls of its trainer (steps, batches, acks). Pointers, handles, address
 * ranges and pools are names there (p12, h3, v+0x1400000, d0, m1); this
 * program gives each name the value its own calls return. Run it under the
 * shim with the trace's device and policy (tests/e2e/test_traces.py), and
 * the shim sees the same program again: its journal must say what the
 * recorded run's said.
 *
 * Lines it does not make calls for: comments (#) and the header (source,
 * runtime, device, context, policy, env, expect, torch, vaspan) are the
 * harness's. Prints one line per mismatch and "replay: N calls, M
 * mismatches"; exit 0 only with none, 2 for a trace it cannot read.
 */
#define CUDA_ENABLE_DEPRECATED 1 /* cudaGetDriverEntryPoint */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXTOK 12

/* ---- names and their values ----------------------------------------------------------- */

struct name {
    char key[32];
    uint64_t value;
};

static struct name *g_names;
static size_t g_nnames, g_capnames;

static uint64_t *slot(const char *key)
{
    for (size_t i = 0; i < g_nnames; i++)
        if (!strcmp(g_names[i].key, key))
            return &g_names[i].value;
    if (g_nnames == g_capnames) {
        g_capnames = g_capnames ? 2 * g_capnames : 1024;
        g_names = realloc(g_names, g_capnames * sizeof *g_names);
        if (!g_names) {
            fprintf(stderr, "replay: out of memory\n");
            exit(2);
        }
    }
    struct name *n = &g_names[g_nnames++];
    snprintf(n->key, sizeof n->key, "%s", key);
    n->value = 0;
    return &n->value;
}

/* ---- the driver, as the recorded program reached it --------------------------------- */

static void *g_cuda;   /* libcuda.so.1's handle */
static int g_runtime = 12; /* the trace's runtime major */

/* Driver functions by base name, from the trace's lookups (the hook the
 * shim handed out then, as it hands it out now), else by dlsym. */
struct fn {
    char name[64];
    void *fn;
};
static struct fn g_fns[256];
static int g_nfns;

static void **fn_slot(const char *name)
{
    for (int i = 0; i < g_nfns; i++)
        if (!strcmp(g_fns[i].name, name))
            return &g_fns[i].fn;
    if (g_nfns == (int)(sizeof g_fns / sizeof g_fns[0]))
        return NULL;
    snprintf(g_fns[g_nfns].name, sizeof g_fns[g_nfns].name, "%s", name);
    g_fns[g_nfns].fn = NULL;
    return &g_fns[g_nfns++].fn;
}

static void *cuda_handle(void)
{
    if (!g_cuda) {
        int n;
        cudaGetDeviceCount(&n); /* the runtime loads its driver */
        g_cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!g_cuda)
            g_cuda = dlopen("libcuda.so.1", RTLD_NOW);
    }
    return g_cuda;
}

/* A driver function the trace uses: the one its lookup gave, else the
 * export of its current ABI. */
static void *driver_fn(const char *name, const char *export)
{
    void **s = fn_slot(name);
    if (s && *s)
        return *s;
    void *f = cuda_handle() ? dlsym(cuda_handle(), export) : NULL;
    if (s)
        *s = f;
    return f;
}

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

/* A lookup the trace says handed out one of the shim's hooks, made again the
 * same way: 0 when it hands out the shim's hook again (a function inside
 * the preloaded shim), 1 when it finds something else, -1 for a bad line. */
static int lookup(char **t, int n)
{
    if (n < 5)
        return -1;
    const char *via = t[1], *name = t[2];
    int version = atoi(t[3]);
    unsigned long long flags = strtoull(t[4], NULL, 0);
    void *f = NULL;
    if (!strcmp(via, "dlsym") && !strncmp(name, "cuda", 4)) {
        /* a runtime function taken from the runtime's own handle (ctypes) */
        char lib[32];
        snprintf(lib, sizeof lib, "libcudart.so.%d", g_runtime);
        void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
        f = h ? dlsym(h, name) : NULL;
    } else if (!strcmp(via, "dlsym")) {
        f = cuda_handle() ? dlsym(cuda_handle(), name) : NULL;
    } else if (!strcmp(via, "getproc")) {
        getproc_fn gp = cuda_handle() ? (getproc_fn)dlsym(cuda_handle(), "cuGetProcAddress_v2") : NULL;
        CUdriverProcAddressQueryResult st;
        if (!gp || gp(name, &f, version, flags, &st) != CUDA_SUCCESS)
            f = NULL;
    } else if (!strcmp(via, "entry")) {
        enum cudaDriverEntryPointQueryResult st;
        if (cudaGetDriverEntryPoint(name, &f, flags, &st) != cudaSuccess)
            f = NULL;
    } else if (!strcmp(via, "entry_v")) {
        enum cudaDriverEntryPointQueryResult st;
        if (cudaGetDriverEntryPointByVersion(name, &f, (unsigned)version, flags, &st) != cudaSuccess)
            f = NULL;
    } else {
        return -1;
    }
    if (strncmp(name, "cuda", 4) != 0) {
        void **s = fn_slot(name);
        if (!s)
            return -1;
        *s = f;
    }
    Dl_info di;
    return f && dladdr(f, &di) && di.dli_fname && strstr(di.dli_fname, "libgpuguard") ? 0 : 1;
}

/* ---- the calls ------------------------------------------------------------------------- */

static int g_dev = -1;

static void use_device(int dev)
{
    if (dev != g_dev && cudaSetDevice(dev) == cudaSuccess)
        g_dev = dev;
}

/* "refused" is the allocator's out-of-memory code (2 for the runtime and
 * the driver alike); the journal says it was a refusal. */
static int expected_code(const char *tok)
{
    return !strcmp(tok, "refused") ? 2 : atoi(tok);
}

static cudaMemPool_t pool_of(const char *tok)
{
    if (tok[0] == 'd') {
        cudaMemPool_t p = NULL;
        cudaDeviceGetDefaultMemPool(&p, atoi(tok + 1));
        return p;
    }
    return (cudaMemPool_t)(uintptr_t)*slot(tok);
}

static const char *option(char **t, int n, const char *key)
{
    size_t k = strlen(key);
    for (int i = 0; i < n; i++)
        if (!strncmp(t[i], key, k) && t[i][k] == '=')
            return t[i] + k + 1;
    return NULL;
}

/* alloc API DEV BYTES KEY RESULT THREAD [pool=P]: the result's code, or -1. */
static int alloc(char **t, int n)
{
    if (n < 7)
        return -1;
    const char *api = t[1];
    int dev = atoi(t[2]);
    size_t bytes = strtoull(t[3], NULL, 10);
    use_device(dev);
    void *p = NULL;
    int r;
    if (!strcmp(api, "cudaMalloc")) {
        r = cudaMalloc(&p, bytes);
    } else if (!strcmp(api, "cudaMallocAsync")) {
        r = cudaMallocAsync(&p, bytes, 0);
    } else if (!strcmp(api, "cudaMallocFromPoolAsync")) {
        const char *pool = option(t, n, "pool");
        r = pool ? (int)cudaMallocFromPoolAsync(&p, bytes, pool_of(pool), 0) : -1;
    } else if (!strcmp(api, "cudaMallocManaged")) {
        r = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
    } else if (!strcmp(api, "cuMemAlloc")) {
        CUresult (*f)(CUdeviceptr *, size_t) = driver_fn("cuMemAlloc", "cuMemAlloc_v2");
        CUdeviceptr d = 0;
        r = f ? (int)f(&d, bytes) : -1;
        p = (void *)(uintptr_t)d;
    } else if (!strcmp(api, "cuMemAllocAsync")) {
        CUresult (*f)(CUdeviceptr *, size_t, CUstream) = driver_fn("cuMemAllocAsync", "cuMemAllocAsync");
        CUdeviceptr d = 0;
        r = f ? (int)f(&d, bytes, NULL) : -1;
        p = (void *)(uintptr_t)d;
    } else if (!strcmp(api, "cuMemCreate")) {
        CUresult (*f)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                      unsigned long long) = driver_fn("cuMemCreate", "cuMemCreate");
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        CUmemGenericAllocationHandle h = 0;
        r = f ? (int)f(&h, bytes, &prop, 0) : -1;
        p = (void *)(uintptr_t)h;
    } else {
        fprintf(stderr, "replay: cannot make %s calls\n", api);
        return -1;
    }
    if (r == 0 && strcmp(t[4], "-") != 0)
        *slot(t[4]) = (uint64_t)(uintptr_t)p;
    return r;
}

/* free API KEY RESULT THREAD (an unknown KEY is 0: a free of NULL, which
 * succeeds; the allocation it names has already been counted a mismatch). */
static int release_ptr(char **t, int n)
{
    if (n < 5)
        return -1;
    const char *api = t[1];
    uint64_t v = *slot(t[2]);
    void *p = (void *)(uintptr_t)v;
    if (!strcmp(api, "cudaFree"))
        return cudaFree(p);
    if (!strcmp(api, "cudaFreeAsync"))
        return cudaFreeAsync(p, 0);
    if (!strcmp(api, "cuMemFree")) {
        CUresult (*f)(CUdeviceptr) = driver_fn("cuMemFree", "cuMemFree_v2");
        return f ? (int)f((CUdeviceptr)v) : -1;
    }
    if (!strcmp(api, "cuMemFreeAsync")) {
        CUresult (*f)(CUdeviceptr, CUstream) = driver_fn("cuMemFreeAsync", "cuMemFreeAsync");
        return f ? (int)f((CUdeviceptr)v, NULL) : -1;
    }
    fprintf(stderr, "replay: cannot make %s calls\n", api);
    return -1;
}

/* Address ranges: v+OFFSET inside one reservation of the trace's vaspan. */
static CUdeviceptr g_va;
static uint64_t g_vaspan;

static CUdeviceptr va_of(const char *tok)
{
    if (strncmp(tok, "v+", 2) != 0)
        return 0;
    if (!g_va) {
        CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) =
            cuda_handle() ? dlsym(cuda_handle(), "cuMemAddressReserve") : NULL;
        if (!reserve || reserve(&g_va, g_vaspan ? g_vaspan : (1ULL << 40), 0, 0, 0) != CUDA_SUCCESS)
            return 0;
    }
    return g_va + strtoull(tok + 2, NULL, 0);
}

static int vmm(char **t, int n)
{
    if (!strcmp(t[0], "map") && n >= 5) {
        CUresult (*f)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) =
            driver_fn("cuMemMap", "cuMemMap");
        CUdeviceptr va = va_of(t[1]);
        return f && va ? (int)f(va, strtoull(t[2], NULL, 10), 0, *slot(t[3]), 0) : -1;
    }
    if (!strcmp(t[0], "unmap") && n >= 4) { /* unmap VA SIZE RESULT */
        CUresult (*f)(CUdeviceptr, size_t) = driver_fn("cuMemUnmap", "cuMemUnmap");
        CUdeviceptr va = va_of(t[1]);
        return f && va ? (int)f(va, strtoull(t[2], NULL, 10)) : -1;
    }
    if (!strcmp(t[0], "release") && n >= 3) {
        CUresult (*f)(CUmemGenericAllocationHandle) = driver_fn("cuMemRelease", "cuMemRelease");
        return f ? (int)f(*slot(t[1])) : -1;
    }
    return -1;
}

/* pool OP POOL ARG RESULT */
static int pool(char **t, int n)
{
    if (n < 5)
        return -1;
    const char *op = t[1];
    if (!strcmp(op, "sync"))
        return cudaDeviceSynchronize();
    if (!strcmp(op, "create")) {
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        int dev = atoi(t[3]);
        props.location.type = dev >= 0 ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
        props.location.id = dev >= 0 ? dev : 0;
        cudaMemPool_t p = NULL;
        int r = cudaMemPoolCreate(&p, &props);
        if (r == 0)
            *slot(t[2]) = (uint64_t)(uintptr_t)p;
        return r;
    }
    cudaMemPool_t p = pool_of(t[2]);
    if (!strcmp(op, "destroy"))
        return cudaMemPoolDestroy(p);
    if (!strcmp(op, "trim"))
        return cudaMemPoolTrimTo(p, strtoull(t[3], NULL, 10));
    if (!strcmp(op, "current"))
        return cudaDeviceSetMemPool(atoi(t[3]), p);
    if (!strcmp(op, "attr")) {
        int attr = atoi(t[3]);
        const char *eq = strchr(t[3], '=');
        unsigned long long value = eq ? strtoull(eq + 1, NULL, 10) : 0;
        int small = (int)value;
        int wide = attr == cudaMemPoolAttrReleaseThreshold || attr == cudaMemPoolAttrReservedMemHigh ||
                   attr == cudaMemPoolAttrUsedMemHigh;
        return cudaMemPoolSetAttribute(p, (enum cudaMemPoolAttr)attr, wide ? (void *)&value : &small);
    }
    return -1;
}

/* meminfo API DEV FREE TOTAL: what the program is told now. */
static int meminfo(char **t, int n, char *why, size_t cap)
{
    if (n < 5)
        return -1;
    use_device(atoi(t[2]));
    size_t f = 0, tot = 0;
    int r;
    if (!strcmp(t[1], "cudaMemGetInfo")) {
        r = cudaMemGetInfo(&f, &tot);
    } else {
        CUresult (*fn)(size_t *, size_t *) = driver_fn("cuMemGetInfo", "cuMemGetInfo_v2");
        r = fn ? (int)fn(&f, &tot) : -1;
    }
    if (r != 0)
        return r;
    unsigned long long ef = strtoull(t[3], NULL, 10), et = strtoull(t[4], NULL, 10);
    if (f != ef || tot != et) {
        snprintf(why, cap, "told free=%zu total=%zu, recorded free=%llu total=%llu", f, tot, ef, et);
        return -2;
    }
    return 0;
}

/* The trainer's calls, through the C API of the preloaded shim. */
static int capi(char **t, int n)
{
    if (!strcmp(t[0], "step") && n >= 2) {
        void (*f)(unsigned long long) = dlsym(RTLD_DEFAULT, "gpuguard_step");
        if (f)
            f(strtoull(t[1], NULL, 10));
        return f ? 0 : -1;
    }
    if (!strcmp(t[0], "batch") && n >= 3) {
        void (*f)(int, int) = dlsym(RTLD_DEFAULT, "gpuguard_set_batch");
        if (f)
            f(atoi(t[1]), atoi(t[2]));
        return f ? 0 : -1;
    }
    if (!strcmp(t[0], "ack") && n >= 2) {
        void (*f)(unsigned) = dlsym(RTLD_DEFAULT, "gpuguard_ack");
        if (f)
            f((unsigned)strtoul(t[1], NULL, 10));
        return f ? 0 : -1;
    }
    if (!strcmp(t[0], "shape") && n >= 3) { /* shape D0,D1,... BATCH_DIM ("-": none) */
        void (*f)(const long long *, int, int) = dlsym(RTLD_DEFAULT, "gpuguard_step_shape");
        long long dims[8];
        int nd = 0;
        for (char *p = t[1]; *p && *p != '-' && nd < 8; nd++) {
            dims[nd] = strtoll(p, &p, 10);
            if (*p == ',')
                p++;
        }
        if (f)
            f(dims, nd, atoi(t[2]));
        return f ? 0 : -1;
    }
    if (!strcmp(t[0], "needed") && n >= 3) {
        void (*f)(int, unsigned long long) = dlsym(RTLD_DEFAULT, "gpuguard_step_needed");
        if (f)
            f(atoi(t[1]), strtoull(t[2], NULL, 10));
        return f ? 0 : -1;
    }
    return -1;
}

/* ---- the trace ------------------------------------------------------------------------- */

static const char *const g_header[] = {"source", "runtime", "device", "context", "policy",
                                       "env",    "expect",  "torch",  "vaspan"};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s TRACE\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    char line[4096];
    unsigned long lineno = 0, calls = 0, mismatches = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\n")] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        char copy[4096], *t[MAXTOK], *save = NULL;
        snprintf(copy, sizeof copy, "%s", line);
        int n = 0;
        for (char *tok = strtok_r(copy, " ", &save); tok && n < MAXTOK; tok = strtok_r(NULL, " ", &save))
            t[n++] = tok;
        if (n == 0)
            continue;
        int header = 0;
        for (size_t i = 0; i < sizeof g_header / sizeof g_header[0]; i++)
            header |= !strcmp(t[0], g_header[i]);
        if (header) {
            if (!strcmp(t[0], "vaspan") && n >= 2)
                g_vaspan = strtoull(t[1], NULL, 0);
            if (!strcmp(t[0], "runtime") && n >= 2)
                g_runtime = atoi(t[1]);
            continue;
        }
        calls++;
        int got, want = 0;
        char why[256] = "";
        if (!strcmp(t[0], "lookup")) {
            got = lookup(t, n);
        } else if (!strcmp(t[0], "alloc")) {
            got = alloc(t, n);
            want = n >= 6 ? expected_code(t[5]) : 0;
        } else if (!strcmp(t[0], "free")) {
            got = release_ptr(t, n);
            want = n >= 4 ? atoi(t[3]) : 0;
        } else if (!strcmp(t[0], "map") || !strcmp(t[0], "unmap") || !strcmp(t[0], "release")) {
            got = vmm(t, n);
            want = atoi(t[n - 1]);
        } else if (!strcmp(t[0], "pool")) {
            got = pool(t, n);
            want = atoi(t[n - 1]);
        } else if (!strcmp(t[0], "meminfo")) {
            got = meminfo(t, n, why, sizeof why);
        } else if (!strcmp(t[0], "step") || !strcmp(t[0], "batch") || !strcmp(t[0], "ack") ||
                   !strcmp(t[0], "shape") || !strcmp(t[0], "needed")) {
            got = capi(t, n);
        } else {
            fprintf(stderr, "replay: %s:%lu: unknown line: %s\n", argv[1], lineno, line);
            fclose(f);
            return 2;
        }
        if (got != want) {
            mismatches++;
            if (why[0])
                printf("replay: line %lu: %s: %s\n", lineno, line, why);
            else
                printf("replay: line %lu: %s: got %d, recorded %d\n", lineno, line, got, want);
        }
    }
    fclose(f);
    printf("replay: %lu calls, %lu mismatches\n", calls, mismatches);
    return mismatches ? 1 : 0;
}
