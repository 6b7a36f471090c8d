/* resolve.c - finding the real CUDA functions (see resolve.h). */
#include "resolve.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "hooks_driver.h"
#include "options.h"
#include "os.h"

/* ---- the real dlsym ---------------------------------------------------- */

typedef void *(*dlsym_fn)(void *, const char *);
/* Read by the trampoline below; hidden, so it is reached PC-relative. */
__attribute__((visibility("hidden"))) void *_Atomic gg_real_dlsym_fn;

static GG_NO_SANITIZE dlsym_fn real_dlsym(void)
{
    void *p = atomic_load_explicit(&gg_real_dlsym_fn, memory_order_acquire);
    if (gg_likely(p))
        return (dlsym_fn)p;
    /* glibc 2.34 moved dlsym into libc with a new version; older ones have
     * only the first. dlvsym is not interposed, so this finds the next dlsym
     * after the shim, which may be another interposer's: that is right. */
    p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!p)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!p)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"); /* aarch64's first */
    atomic_store_explicit(&gg_real_dlsym_fn, p, memory_order_release);
    return (dlsym_fn)p;
}

void *gg_real_dlsym(void *handle, const char *name)
{
    dlsym_fn f = real_dlsym();
    return f ? f(handle, name) : NULL;
}

/* The filter behind the trampoline: the shim's hook when `name` is a hooked
 * driver function that the real lookup finds in libcuda, else NULL (the
 * trampoline then jumps to the real dlsym with the caller's own frame). */
__attribute__((visibility("hidden"))) void *gg_dlsym_filter(void *handle, const char *name);
GG_NO_SANITIZE void *gg_dlsym_filter(void *handle, const char *name)
{
    (void)real_dlsym(); /* the trampoline jumps through it */
    if (!name || name[0] != 'c' || name[1] != 'u' || handle == RTLD_NEXT)
        return NULL;
    if (!gg_hooks_driver_enabled() || !gg_hooks_driver_wanted(name))
        return NULL;
    void *real = gg_real_dlsym(handle, name);
    if (!real || !gg_resolve_in_driver(real))
        return NULL;
    return gg_hooks_driver_lookup(name, real, GG_ORIGIN_DRIVER, 0, -1);
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        ".cfi_startproc\n"
        "    endbr64\n" /* a landing pad under CET; a no-op elsewhere */
        "    pushq %rdi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    pushq %rsi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    subq $8, %rsp\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    call gg_dlsym_filter\n"
        "    addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    popq %rsi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    popq %rdi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    ret\n"
        "1:  jmp *gg_real_dlsym_fn(%rip)\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,%function\n"
        "dlsym:\n"
        ".cfi_startproc\n"
        "    stp x29, x30, [sp, #-32]!\n"
        ".cfi_def_cfa_offset 32\n"
        ".cfi_offset 29, -32\n"
        ".cfi_offset 30, -24\n"
        "    mov x29, sp\n"
        "    stp x0, x1, [sp, #16]\n"
        "    bl gg_dlsym_filter\n"
        "    mov x2, x0\n"
        "    ldp x0, x1, [sp, #16]\n"
        "    ldp x29, x30, [sp], #32\n"
        ".cfi_def_cfa_offset 0\n"
        "    cbz x2, 1f\n"
        "    mov x0, x2\n"
        "    ret\n"
        "1:  adrp x16, gg_real_dlsym_fn\n"
        "    ldr x16, [x16, :lo12:gg_real_dlsym_fn]\n"
        "    br x16\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
/* No trampoline: driver lookups are not intercepted on this platform. */
#endif

/* ---- the runtime -------------------------------------------------------- */

static bool basename_starts(const char *path, const char *prefix)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strncmp(base, prefix, strlen(prefix)) == 0;
}

/* The loaded runtimes' paths. The callback only copies: dl_iterate_phdr holds
 * the loader's lock, and a dlopen inside it deadlocks against a dlopen in
 * another thread. */
#define MAX_RUNTIMES 8
struct runtimes {
    int n;
    char path[MAX_RUNTIMES][512];
};

static int list_runtime(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    struct runtimes *r = ctx;
    /* libcudart.so.12, and vendored copies such as libcudart-9335f6a2.so.13 */
    if (!info->dlpi_name || !basename_starts(info->dlpi_name, "libcudart") ||
        r->n == MAX_RUNTIMES || strlen(info->dlpi_name) >= sizeof r->path[0])
        return 0;
    strcpy(r->path[r->n++], info->dlpi_name);
    return 0;
}

void *gg_resolve_runtime_slow(void *_Atomic *slot, const char *name)
{
    void *p = gg_real_dlsym(RTLD_NEXT, name);
    if (!p) {
        struct runtimes r = {0};
        dl_iterate_phdr(list_runtime, &r);
        for (int i = 0; i < r.n && !p; i++) {
            /* The handle keeps the runtime loaded while the shim uses it. */
            void *h = dlopen(r.path[i], RTLD_LAZY | RTLD_NOLOAD);
            if (h)
                p = gg_real_dlsym(h, name);
        }
    }
    if (p)
        atomic_store_explicit(slot, p, memory_order_release);
    return p;
}

/* ---- the driver ---------------------------------------------------------- */

static void *_Atomic driver_handle;
static uintptr_t driver_lo, driver_hi;

static int find_driver_range(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    (void)ctx;
    if (!info->dlpi_name || !basename_starts(info->dlpi_name, "libcuda.so"))
        return 0;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < lo)
            lo = a;
        if (a + ph->p_memsz > hi)
            hi = a + ph->p_memsz;
    }
    driver_lo = lo;
    driver_hi = hi;
    return 1;
}

static void *driver(bool load)
{
    void *h = atomic_load_explicit(&driver_handle, memory_order_acquire);
    if (h)
        return h;
    h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h && load)
        h = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!h)
        return NULL;
    dl_iterate_phdr(find_driver_range, NULL);
    void *expected = NULL;
    if (!atomic_compare_exchange_strong(&driver_handle, &expected, h)) {
        dlclose(h); /* another thread won; its handle holds the same object */
        h = expected;
    }
    return h;
}

void *gg_resolve_driver(const char *name, bool load)
{
    void *h = driver(load);
    return h ? gg_real_dlsym(h, name) : NULL;
}

bool gg_resolve_in_driver(const void *ip)
{
    if (!driver(false))
        return false;
    uintptr_t a = (uintptr_t)ip;
    return a >= driver_lo && a < driver_hi;
}

bool gg_resolve_in_self(const void *ip)
{
    static void *_Atomic self_base;
    void *base = atomic_load_explicit(&self_base, memory_order_relaxed);
    Dl_info info;
    if (!base) {
        if (!dladdr((void *)&gg_resolve_in_self, &info))
            return false;
        base = info.dli_fbase;
        atomic_store_explicit(&self_base, base, memory_order_relaxed);
    }
    return dladdr(ip, &info) && info.dli_fbase == base;
}
