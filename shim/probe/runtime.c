/* runtime.c - layer 3: the real CUDA runtimes, kept apart and pinned (see
 * runtime.h). */
#include "runtime.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "prim.h"

static const char *const version_names[GG_RT_COUNT] = {
    NULL,
#define GG_RT_NAME(id, name) name,
    GG_RUNTIME_VERSIONED(GG_RT_NAME)
#undef GG_RT_NAME
};

const char *gg_runtime_version_name(enum gg_rt rt)
{
    return (unsigned)rt < GG_RT_COUNT ? version_names[rt] : NULL;
}

/* ---- pinning ------------------------------------------------------------------ */

#define MAX_PINNED 16
static gg_spin pin_lock = GG_SPIN_INIT;
static uintptr_t pinned_base[MAX_PINNED];
static _Atomic int npinned;

static bool is_pinned(uintptr_t base)
{
    int n = atomic_load_explicit(&npinned, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (pinned_base[i] == base)
            return true;
    return false;
}

/* Keep the object holding fn loaded for good: the reference from dlopen
 * (RTLD_NOLOAD) is never dropped. */
static void pin(void *fn)
{
    Dl_info info;
    if (!dladdr(fn, &info) || !info.dli_fname || is_pinned((uintptr_t)info.dli_fbase))
        return;
    /* The loader's lock, not ours: no spin lock is held across dlopen. */
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return;
    bool dup = true;
    gg_spin_lock(&pin_lock);
    int n = atomic_load_explicit(&npinned, memory_order_relaxed);
    if (!is_pinned((uintptr_t)info.dli_fbase) && n < MAX_PINNED) {
        pinned_base[n] = (uintptr_t)info.dli_fbase;
        atomic_store_explicit(&npinned, n + 1, memory_order_release);
        dup = false;
    }
    gg_spin_unlock(&pin_lock);
    if (dup)
        dlclose(h); /* already held (or no room to remember it: then not pinned twice) */
}

#ifdef GG_TESTING
int gg_runtime_pinned(void)
{
    return atomic_load_explicit(&npinned, memory_order_acquire);
}
#endif

/* ---- finding a function --------------------------------------------------------- */

/* The loaded libcudart objects' paths. The callback only copies: it runs
 * under the loader's lock, and a dlopen inside it would deadlock against a
 * dlopen in another thread. */
#define MAX_RUNTIMES 8
struct runtimes {
    int n;
    char path[MAX_RUNTIMES][512];
};

static int list_runtime(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    struct runtimes *r = ctx;
    const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    base = base ? base + 1 : info->dlpi_name;
    /* libcudart.so.12, and vendored copies such as libcudart-9335f6a2.so.13 */
    if (!base || strncmp(base, "libcudart", 9) != 0 || r->n == MAX_RUNTIMES ||
        strlen(info->dlpi_name) >= sizeof r->path[0])
        return 0;
    strcpy(r->path[r->n++], info->dlpi_name);
    return 0;
}

/* Does a file name carry the version's soname suffix (".so.13")? */
static bool has_suffix(const char *path, const char *vname)
{
    const char *so = strstr(vname, ".so.");
    size_t n = strlen(path), m = so ? strlen(so) : 0;
    return so && n >= m && strcmp(path + n - m, so) == 0;
}

static void *search_loaded(enum gg_rt rt, const char *name)
{
    struct runtimes *r = gg_side_push(sizeof *r); /* paths: kilobytes, off the thread's stack */
    void *p = NULL;
    if (!r)
        return NULL;
    r->n = 0;
    dl_iterate_phdr(list_runtime, r);
    for (int i = 0; i < r->n && !p; i++) {
        void *h = dlopen(r->path[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        if (rt == GG_RT_ANY)
            p = gg_real_dlsym(h, name);
        else if (!(p = dlvsym(h, name, version_names[rt])) &&
                 has_suffix(r->path[i], version_names[rt]))
            p = gg_real_dlsym(h, name); /* an unversioned build of that runtime */
        dlclose(h);
    }
    gg_side_pop(r);
    return p;
}

void *gg_runtime_resolve(enum gg_rt rt, const char *name)
{
    void *p = rt == GG_RT_ANY ? gg_real_dlsym(RTLD_NEXT, name)
                              : dlvsym(RTLD_NEXT, name, version_names[rt]);
    if (!p)
        p = search_loaded(rt, name);
    if (p)
        pin(p);
    return p;
}

/* ---- helpers the shim calls ------------------------------------------------------ */

static void *_Atomic get_device[GG_RT_COUNT], *_Atomic malloc_[GG_RT_COUNT];
static _Atomic int version_[GG_RT_COUNT];

static void *cached(void *_Atomic *slot, enum gg_rt rt, const char *name)
{
    void *p = atomic_load_explicit(slot, memory_order_acquire);
    if (gg_unlikely(!p)) {
        p = gg_runtime_resolve(rt, name);
        if (p)
            atomic_store_explicit(slot, p, memory_order_release);
    }
    return p;
}

int gg_runtime_device(enum gg_rt rt)
{
    cudaError_t (*get)(int *) = (cudaError_t(*)(int *))cached(&get_device[rt], rt, "cudaGetDevice");
    int dev;
    return get && get(&dev) == cudaSuccess ? dev : -1;
}

int gg_runtime_version(enum gg_rt rt)
{
    int v = atomic_load_explicit(&version_[rt], memory_order_relaxed);
    if (v > 0)
        return v;
    cudaError_t (*get)(int *) =
        (cudaError_t(*)(int *))gg_runtime_resolve(rt, "cudaRuntimeGetVersion");
    if (!get || get(&v) != cudaSuccess || v <= 0)
        return 0;
    atomic_store_explicit(&version_[rt], v, memory_order_relaxed);
    return v;
}

bool gg_runtime_touch(void)
{
    cudaError_t (*count)(int *) =
        (cudaError_t(*)(int *))gg_runtime_resolve(GG_RT_ANY, "cudaGetDeviceCount");
    int n;
    if (!count)
        return false;
    (void)count(&n);
    return true;
}

void gg_runtime_set_oom(enum gg_rt rt)
{
    cudaError_t (*alloc)(void **, size_t) =
        (cudaError_t(*)(void **, size_t))cached(&malloc_[rt], rt, "cudaMalloc");
    void *p = NULL;
    /* 4 EiB: no device has it, and no size rounding can overflow it. */
    if (alloc && alloc(&p, (size_t)1 << 62) == cudaSuccess && p) {
        cudaError_t (*f)(void *) = (cudaError_t(*)(void *))gg_runtime_resolve(rt, "cudaFree");
        if (f)
            f(p);
    }
}
