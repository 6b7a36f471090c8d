/*
 * script.c - an ordinary CUDA program driven by its arguments, for e2e tests.
 *
 *   script alloc:1G alloc:512M free:0 meminfo freeall
 *
 * One command per argument; every line it prints is deterministic.  Commands
 * are listed in tests/fake/README.md.  Linked against libcudart.so.13 like any
 * CUDA application; the driver is reached only through the runtime's entry
 * points, never linked.
 */
#define CUDA_ENABLE_DEPRECATED 1 /* cudaGetDriverEntryPoint */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The per-thread-default-stream variants, called by name. */
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);

enum kind { S_MALLOC, S_ASYNC, S_ASYNC_PTSZ, S_POOL, S_MANAGED, S_PITCH, S_DRV, S_VMM, S_VMMREL };

struct slot {
    enum kind kind;
    int live;
    void *p;
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle handle;
};

static struct slot *g_slots;
static size_t g_nslots, g_cap;

static void *dlsym_nccl_init, *dlsym_nccl_destroy;

static void die(const char *msg, const char *arg)
{
    fprintf(stderr, "script: %s: %s\n", msg, arg);
    exit(2);
}

/* "1G", "1.5G", "512M", "4096", "2KiB": binary multiples. */
static int parse_size(const char *str, size_t *out)
{
    char *end;
    if (*str < '0' || *str > '9')
        return -1;
    unsigned long long ip = strtoull(str, &end, 10);
    long double frac = 0;
    if (*end == '.') {
        long double scale = 0.1L;
        for (end++; *end >= '0' && *end <= '9'; end++, scale /= 10)
            frac += (*end - '0') * scale;
    }
    unsigned long long mult = 1;
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
    *out = (size_t)(ip * mult + (unsigned long long)(frac * mult + 0.5L));
    return 0;
}

static size_t need_size(const char *s)
{
    size_t v;
    if (parse_size(s, &v) != 0)
        die("bad size", s);
    return v;
}

static long need_int(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end)
        die("bad number", s);
    return v;
}

static struct slot *new_slot(void)
{
    if (g_nslots == g_cap) {
        g_cap = g_cap ? g_cap * 2 : 64;
        g_slots = realloc(g_slots, g_cap * sizeof *g_slots);
        if (!g_slots)
            die("out of memory", "slots");
    }
    struct slot *s = &g_slots[g_nslots++];
    memset(s, 0, sizeof *s);
    return s;
}

static void *entry(const char *name, int by_version)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = by_version
                        ? cudaGetDriverEntryPointByVersion(name, &fn, 13000, cudaEnableDefault, &st)
                        : cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &st);
    if (e != cudaSuccess || st != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

/* The runtime's current device, with its primary context current. */
static int current_device(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess)
        (void)cudaSetDevice(dev);
    return dev;
}

static int alloc_drv(struct slot *s)
{
    CUresult (*fn)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))entry("cuMemAlloc", 0);
    if (!fn)
        return CUDA_ERROR_NOT_FOUND;
    current_device();
    return (int)fn(&s->va, s->size);
}

struct vmm {
    CUresult (*Create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*Release)(CUmemGenericAllocationHandle);
    CUresult (*Reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*AddrFree)(CUdeviceptr, size_t);
    CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*Unmap)(CUdeviceptr, size_t);
    CUresult (*SetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
};

static int get_vmm(struct vmm *v)
{
    v->Create = (__typeof__(v->Create))entry("cuMemCreate", 1);
    v->Release = (__typeof__(v->Release))entry("cuMemRelease", 1);
    v->Reserve = (__typeof__(v->Reserve))entry("cuMemAddressReserve", 1);
    v->AddrFree = (__typeof__(v->AddrFree))entry("cuMemAddressFree", 1);
    v->Map = (__typeof__(v->Map))entry("cuMemMap", 1);
    v->Unmap = (__typeof__(v->Unmap))entry("cuMemUnmap", 1);
    v->SetAccess = (__typeof__(v->SetAccess))entry("cuMemSetAccess", 1);
    if (!v->Create || !v->Release || !v->Reserve || !v->AddrFree || !v->Map || !v->Unmap ||
        !v->SetAccess)
        return CUDA_ERROR_NOT_FOUND;
    return 0;
}

/* release_early: release the handle right after mapping it, as NVIDIA's
 * samples do; the memory lives until the unmap. */
static int alloc_vmm(struct slot *s, int release_early)
{
    struct vmm v;
    int r = get_vmm(&v);
    if (r)
        return r;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = current_device();
    if ((r = (int)v.Create(&s->handle, s->size, &prop, 0)))
        return r;
    if ((r = (int)v.Reserve(&s->va, s->size, 0, 0, 0))) {
        v.Release(s->handle);
        return r;
    }
    if ((r = (int)v.Map(s->va, s->size, 0, s->handle, 0))) {
        v.AddrFree(s->va, s->size);
        v.Release(s->handle);
        return r;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = (int)v.SetAccess(s->va, s->size, &acc, 1))) {
        v.Unmap(s->va, s->size);
        v.AddrFree(s->va, s->size);
        v.Release(s->handle);
        return r;
    }
    if (release_early && (r = (int)v.Release(s->handle)))
        return r;
    return 0;
}

static int do_alloc(enum kind k, size_t size, struct slot *s)
{
    s->kind = k;
    s->size = size;
    switch (k) {
    case S_MALLOC: return (int)cudaMalloc(&s->p, size);
    case S_ASYNC: return (int)cudaMallocAsync(&s->p, size, 0);
    case S_ASYNC_PTSZ: return (int)cudaMallocAsync_ptsz(&s->p, size, 0);
    case S_POOL: {
        cudaMemPool_t pool = NULL;
        int dev = current_device();
        cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, dev);
        if (e != cudaSuccess)
            return (int)e;
        return (int)cudaMallocFromPoolAsync(&s->p, size, pool, 0);
    }
    case S_MANAGED: return (int)cudaMallocManaged(&s->p, size, cudaMemAttachGlobal);
    case S_PITCH: {
        size_t pitch = 0;
        return (int)cudaMallocPitch(&s->p, &pitch, size, 1);
    }
    case S_DRV: return alloc_drv(s);
    case S_VMM: return alloc_vmm(s, 0);
    case S_VMMREL: return alloc_vmm(s, 1);
    }
    return 1;
}

static int do_free(struct slot *s)
{
    switch (s->kind) {
    case S_MALLOC:
    case S_MANAGED:
    case S_PITCH: return (int)cudaFree(s->p);
    case S_ASYNC:
    case S_POOL: return (int)cudaFreeAsync(s->p, 0);
    case S_ASYNC_PTSZ: return (int)cudaFreeAsync_ptsz(s->p, 0);
    case S_DRV: {
        CUresult (*fn)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))entry("cuMemFree", 0);
        return fn ? (int)fn(s->va) : CUDA_ERROR_NOT_FOUND;
    }
    case S_VMM:
    case S_VMMREL: {
        struct vmm v;
        int r = get_vmm(&v);
        if (r)
            return r;
        if ((r = (int)v.Unmap(s->va, s->size)))
            return r;
        if (s->kind == S_VMM && (r = (int)v.Release(s->handle)))
            return r;
        return (int)v.AddrFree(s->va, s->size);
    }
    }
    return 1;
}

static void free_slot(size_t i)
{
    if (i >= g_nslots) {
        printf("free %zu: no such slot\n", i);
        return;
    }
    int r = do_free(&g_slots[i]);
    g_slots[i].live = 0;
    if (r)
        printf("free %zu: error %d\n", i, r);
}

/* ------------------------------------------------------------------------ */
/* threads:N:OPS:SIZE                                                        */

struct tharg {
    int dev;
    long ops;
    size_t size;
    void *keep;
    int err;
};

static void *thread_main(void *arg)
{
    struct tharg *a = arg;
    cudaError_t e = cudaSetDevice(a->dev);
    for (long i = 0; e == cudaSuccess && i < a->ops; i++) {
        void *p = NULL;
        if ((e = cudaMalloc(&p, a->size)) == cudaSuccess)
            e = cudaFree(p);
    }
    if (e == cudaSuccess)
        e = cudaMalloc(&a->keep, a->size);
    a->err = (int)e;
    return NULL;
}

static void run_threads(long n, long ops, size_t size)
{
    if (n <= 0 || n > 4096 || ops < 0)
        die("bad threads command", "N:OPS:SIZE");
    int dev = 0;
    (void)cudaGetDevice(&dev);
    struct tharg *args = calloc((size_t)n, sizeof *args);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!args || !th)
        die("out of memory", "threads");
    for (long i = 0; i < n; i++) {
        args[i].dev = dev;
        args[i].ops = ops;
        args[i].size = size;
        if (pthread_create(&th[i], NULL, thread_main, &args[i]) != 0)
            die("pthread_create failed", "threads");
    }
    for (long i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    int first = 0;
    for (long i = 0; i < n; i++) {
        if (args[i].err && !first)
            first = args[i].err;
        if (args[i].keep)
            (void)cudaFree(args[i].keep);
    }
    if (first)
        printf("threads: error %d\n", first);
    else
        printf("threads: %ld x %ld ok\n", n, ops);
    free(args);
    free(th);
}

/* ------------------------------------------------------------------------ */
/* nccl:DEV:SIZE                                                             */

static void *load_nccl(void)
{
    static void *h;
    if (h)
        return h;
    char dir[PATH_MAX + 64] = "";
    void *rt = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
    if (rt) {
        if (dlinfo(rt, RTLD_DI_ORIGIN, dir) != 0)
            dir[0] = 0;
        dlclose(rt);
    }
    char path[sizeof dir + 64];
    if (dir[0]) {
        snprintf(path, sizeof path, "%s/libnccllike.so", dir);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        ssize_t n = readlink("/proc/self/exe", dir, PATH_MAX);
        if (n > 0) {
            dir[n] = 0;
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = 0;
            snprintf(path, sizeof path, "%s/../../fake/libnccllike.so", dir);
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!h) {
        fprintf(stderr, "script: %s\n", dlerror());
        return NULL;
    }
    dlsym_nccl_init = dlsym(h, "nl_init");
    dlsym_nccl_destroy = dlsym(h, "nl_destroy");
    return h;
}

/* ------------------------------------------------------------------------ */

static int api_kind(const char *name, enum kind *k)
{
    static const struct {
        const char *name;
        enum kind kind;
    } t[] = {
        {"malloc", S_MALLOC}, {"async", S_ASYNC},     {"async_ptsz", S_ASYNC_PTSZ},
        {"pool", S_POOL},     {"managed", S_MANAGED}, {"pitch", S_PITCH},
        {"drv", S_DRV},       {"vmm", S_VMM},         {"vmmrel", S_VMMREL},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (strcmp(t[i].name, name) == 0) {
            *k = t[i].kind;
            return 0;
        }
    }
    return -1;
}

static void run(char *cmd)
{
    char *arg = strchr(cmd, ':');
    if (arg)
        *arg++ = 0;

    if (strcmp(cmd, "alloc") == 0 && arg) {
        size_t size = need_size(arg);
        struct slot *s = new_slot();
        int r = do_alloc(S_MALLOC, size, s);
        s->live = r == 0;
        if (r)
            printf("alloc %s: error %d\n", arg, r);
    } else if (strcmp(cmd, "api") == 0 && arg) {
        char *sz = strchr(arg, ':');
        enum kind k;
        if (!sz)
            die("bad api command", arg);
        *sz++ = 0;
        if (api_kind(arg, &k) != 0)
            die("unknown api", arg);
        size_t size = need_size(sz);
        struct slot *s = new_slot();
        int r = do_alloc(k, size, s);
        s->live = r == 0;
        if (r)
            printf("api %s %s: error %d\n", arg, sz, r);
    } else if (strcmp(cmd, "free") == 0 && arg) {
        free_slot((size_t)need_int(arg));
    } else if (strcmp(cmd, "freeall") == 0) {
        for (size_t i = 0; i < g_nslots; i++)
            if (g_slots[i].live)
                free_slot(i);
    } else if (strcmp(cmd, "free0") == 0) {
        printf("free0: %d\n", (int)cudaFree(NULL));
    } else if (strcmp(cmd, "bogusfree") == 0) {
        printf("bogusfree: %d\n", (int)cudaFree((void *)(uintptr_t)0x1234500));
    } else if (strcmp(cmd, "setdev") == 0 && arg) {
        cudaError_t e = cudaSetDevice((int)need_int(arg));
        if (e)
            printf("setdev %s: error %d\n", arg, (int)e);
    } else if (strcmp(cmd, "lasterror") == 0) {
        printf("lasterror: %d\n", (int)cudaGetLastError());
    } else if (strcmp(cmd, "dlsym") == 0 && arg) {
        /* Whose function does a lookup on libcuda's handle hand out? */
        int n;
        cudaGetDeviceCount(&n); /* the runtime loads its driver */
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        void *fn = h ? dlsym(h, arg) : NULL;
        Dl_info di;
        const char *mod = fn && dladdr(fn, &di) && di.dli_fname ? di.dli_fname : "(none)";
        const char *base = strrchr(mod, '/');
        printf("dlsym %s: %s\n", arg, base ? base + 1 : mod);
    } else if (strcmp(cmd, "closefds") == 0) {
        /* What a daemon does: close every descriptor past stderr. */
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    } else if (strcmp(cmd, "openfile") == 0 && arg) {
        int fd = open(arg, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        printf("openfile: fd %d\n", fd);
    } else if (strcmp(cmd, "meminfo") == 0) {
        size_t f = 0, t = 0;
        cudaError_t e = cudaMemGetInfo(&f, &t);
        if (e)
            printf("meminfo: error %d\n", (int)e);
        else
            printf("meminfo free=%zu total=%zu\n", f, t);
    } else if (strcmp(cmd, "sleep") == 0 && arg) {
        long ms = need_int(arg);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    } else if (strcmp(cmd, "print") == 0) {
        printf("%s\n", arg ? arg : "");
    } else if (strcmp(cmd, "threads") == 0 && arg) {
        char *a2 = strchr(arg, ':'), *a3 = a2 ? strchr(a2 + 1, ':') : NULL;
        if (!a2 || !a3)
            die("bad threads command", arg);
        *a2++ = 0;
        *a3++ = 0;
        run_threads(need_int(arg), need_int(a2), need_size(a3));
    } else if (strcmp(cmd, "fork") == 0 || strcmp(cmd, "forkexit") == 0) {
        int normal = strcmp(cmd, "forkexit") == 0;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0)
            die("fork failed", cmd);
        if (pid == 0) {
            if (normal)
                exit(0);
            _exit(0);
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0) {
        }
        printf("%s: child exited %d\n", cmd, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    } else if (strcmp(cmd, "exit") == 0 && arg) {
        fflush(stdout);
        exit((int)need_int(arg));
    } else if (strcmp(cmd, "nccl") == 0 && arg) {
        char *sz = strchr(arg, ':');
        if (!sz)
            die("bad nccl command", arg);
        *sz++ = 0;
        int dev = (int)need_int(arg);
        size_t size = need_size(sz);
        if (!load_nccl() || !dlsym_nccl_init) {
            printf("nccl: cannot load libnccllike.so\n");
            return;
        }
        int (*init)(int, size_t) = (int (*)(int, size_t))dlsym_nccl_init;
        int r = init(dev, size);
        if (r)
            printf("nccl %s %s: error %d\n", arg, sz, r);
    } else if (strcmp(cmd, "ncclfree") == 0) {
        if (!load_nccl() || !dlsym_nccl_destroy) {
            printf("nccl: cannot load libnccllike.so\n");
            return;
        }
        int (*destroy)(void) = (int (*)(void))dlsym_nccl_destroy;
        int r = destroy();
        if (r)
            printf("ncclfree: error %d\n", r);
    } else {
        die("unknown command", cmd);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++)
        run(argv[i]);
    printf("script: done\n");
    free(g_slots);
    return 0;
}
