/* test_stack.c - stacks captured as sites (stack.c over unwind.c and sites.c):
 * the caller first, the shim's frames dropped, depth, threads, fork.
 *
 * stack.c is linked into this binary, so the "shim object" whose frames a
 * capture drops would be the whole test. The tests instead declare the
 * functions of the section gg_test_hook to be the shim (gg_stack_test_self):
 * they play the CUDA hooks, and the first frame kept must be their caller.
 */
#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sites.h"
#include "stack.h"
#include "symbolize.h"
#include "unwind.h"
#include "unit.h"

#define NOINLINE __attribute__((noipa))
#define HOOK __attribute__((noipa, section("gg_test_hook")))
#define BARRIER() __asm__ volatile("" ::: "memory")   /* no tail call past this */

extern char __start_gg_test_hook[], __stop_gg_test_hook[];

/* Declared for -Wmissing-prototypes; not static so that dladdr can name
 * them when the test is linked with -rdynamic. */
gg_site gg_test_named_caller(int dev, uintptr_t *ret);
gg_site gg_test_site_a(int dev);
gg_site gg_test_site_b(int dev);

static void use_hook_ranges(void)
{
    uintptr_t lo = (uintptr_t)__start_gg_test_hook, hi = (uintptr_t)__stop_gg_test_hook;
    gg_unwind_test_self(&lo, &hi, 1);
}

/* ---- the pretend shim ------------------------------------------------------ */

static int hook_depth = 32;

/* The innermost hook: records where it returns to in its caller. */
HOOK static gg_site hook_inner(int dev, uintptr_t *ret)
{
    if (ret)
        *ret = (uintptr_t)__builtin_return_address(0);
    gg_site s = gg_stack_capture(dev, hook_depth);
    BARRIER();
    return s;
}

/* Plays cudaMalloc: a hook that calls another hook that captures. */
HOOK static gg_site hook_cuda_malloc(int dev, uintptr_t *ret)
{
    if (ret)
        *ret = (uintptr_t)__builtin_return_address(0);
    gg_site s = hook_inner(dev, NULL);
    BARRIER();
    return s;
}

/* ---- the pretend application ---------------------------------------------- */

NOINLINE gg_site gg_test_named_caller(int dev, uintptr_t *ret)
{
    gg_site s = hook_cuda_malloc(dev, ret);
    BARRIER();
    return s;
}

NOINLINE gg_site gg_test_site_a(int dev)
{
    gg_site s = hook_cuda_malloc(dev, NULL);
    BARRIER();
    return s;
}

NOINLINE gg_site gg_test_site_b(int dev)
{
    gg_site s = hook_cuda_malloc(dev, NULL);
    BARRIER();
    return s;
}

/* A stack `levels` frames deeper than the caller's. */
NOINLINE static gg_site recurse(int levels, int dev, uintptr_t *ret)
{
    gg_site s = levels > 0 ? recurse(levels - 1, dev, ret) : hook_cuda_malloc(dev, ret);
    BARRIER();
    return s;
}

/* fn's stack cut to two frames (fn, via): the same from wherever via is
 * called, even when the compiler copies a call in a loop. */
NOINLINE static gg_site via(gg_site (*fn)(int), int dev)
{
    int saved = hook_depth;
    hook_depth = 2;
    gg_site s = fn(dev);
    BARRIER();
    hook_depth = saved;
    return s;
}

/* ---- helpers ------------------------------------------------------------------ */

struct main_map { uintptr_t load, first_vaddr, text_lo, text_hi; };

static int main_map_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct main_map *m = arg;
    bool first = true;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        if (first)
            m->first_vaddr = ph->p_vaddr;
        first = false;
        if ((ph->p_flags & PF_X) && !m->text_lo) {
            m->text_lo = info->dlpi_addr + ph->p_vaddr;
            m->text_hi = m->text_lo + ph->p_memsz;
        }
    }
    m->load = info->dlpi_addr;
    return 1;   /* the first object is the main program */
}

static struct main_map main_map(void)
{
    struct main_map m;
    memset(&m, 0, sizeof m);
    dl_iterate_phdr(main_map_cb, &m);
    return m;
}

/* ---- tests --------------------------------------------------------------------- */

static void test_none_and_junk(void)
{
    const uintptr_t *ips = (const uintptr_t *)1;
    CHECK_EQ_U64(gg_sites_native(GG_SITE_NONE, &ips), 0);
    CHECK(ips == NULL);
    CHECK_EQ_U64(gg_sites_native(0xfffffff0u, &ips), 0);
    gg_sites_charge(GG_SITE_NONE, 100, 1);
    gg_sites_charge(0xfffffff0u, 100, 1);
    CHECK(gg_sites_device(GG_SITE_NONE) == -1);
    CHECK_EQ_U64(gg_stack_capture(0, 0), GG_SITE_NONE);
    CHECK_EQ_U64(gg_stack_capture(0, -3), GG_SITE_NONE);
    gg_stack_warmup(true);
    gg_stack_warmup(true);
}

static void test_same_site(void)
{
    size_t before = gg_sites_count();
    gg_site first = GG_SITE_NONE;
    int same = 0;
    for (int i = 0; i < 1000; i++) {
        gg_site s = via(gg_test_site_a, 0);
        if (i == 0)
            first = s;
        same += s == first;
    }
    CHECK(first != GG_SITE_NONE);
    CHECK_EQ_U64(same, 1000);
    CHECK_EQ_U64(gg_sites_count(), before + 1);
    CHECK(gg_sites_device(first) == 0);
}

/* A call made from the same line each time: the whole stack is the same. */
static void test_two_sites(void)
{
    size_t before = gg_sites_count();
    gg_site a[2], b[2];
    for (int i = 0; i < 2; i++) {
        a[i] = via(gg_test_site_a, 3);
        b[i] = via(gg_test_site_b, 3);
    }
    CHECK(a[0] != GG_SITE_NONE && b[0] != GG_SITE_NONE);
    CHECK(a[0] != b[0]);
    CHECK_EQ_U64(a[1], a[0]);
    CHECK_EQ_U64(b[1], b[0]);
    CHECK_EQ_U64(gg_sites_count(), before + 2);
}

static void test_two_devices(void)
{
    gg_site d[2];
    for (int dev = 0; dev < 2; dev++)
        d[dev] = via(gg_test_site_a, dev);
    CHECK(d[0] != GG_SITE_NONE && d[1] != GG_SITE_NONE);
    CHECK(d[0] != d[1]);
    CHECK(gg_sites_device(d[0]) == 0);
    CHECK(gg_sites_device(d[1]) == 1);
    const uintptr_t *f0, *f1;
    size_t n0 = gg_sites_native(d[0], &f0), n1 = gg_sites_native(d[1], &f1);
    CHECK_EQ_U64(n0, n1);
    CHECK(n0 > 0 && memcmp(f0, f1, n0 * sizeof *f0) == 0);
}

static void test_first_frame_is_caller(void)
{
    uintptr_t ret = 0;
    gg_site s = gg_test_named_caller(0, &ret);
    const uintptr_t *ips;
    size_t n = gg_sites_native(s, &ips);
    CHECK(n >= 2);
    /* Frame 0: where the outer hook returns to, in gg_test_named_caller;
     * neither the hooks nor gg_stack_capture nor libunwind show. */
    CHECK(n > 0 && ips[0] == ret);
    for (size_t i = 0; i < n; i++)
        CHECK(ips[i] < (uintptr_t)__start_gg_test_hook ||
              ips[i] >= (uintptr_t)__stop_gg_test_hook);
    /* Frame 1 is in this test function. */
    Dl_info di;
    CHECK(n > 1 && dladdr((void *)(ips[1] - 1), &di));
}

static void test_default_self_range(void)
{
    /* Without the test's ranges the whole test binary is "the shim": every
     * frame of it is dropped and the first kept is the C library's. */
    gg_unwind_test_self(NULL, NULL, 0);
    gg_site s = gg_test_named_caller(0, NULL);
    use_hook_ranges();
    struct main_map m = main_map();
    const uintptr_t *ips;
    size_t n = gg_sites_native(s, &ips);
    CHECK(s != GG_SITE_NONE);
    CHECK(n >= 1);
    if (n >= 1) {
        CHECK(ips[0] < m.text_lo || ips[0] >= m.text_hi);
        Dl_info di;
        CHECK(dladdr((void *)(ips[0] - 1), &di) && di.dli_fname && strstr(di.dli_fname, "libc"));
    }
}

static void test_depth(void)
{
    int saved = hook_depth;
    uintptr_t ret;
    const uintptr_t *ips;

    hook_depth = 5;
    gg_site s = recurse(60, 0, &ret);
    CHECK_EQ_U64(gg_sites_native(s, &ips), 5);
    CHECK(ips[0] == ret);
    for (int i = 1; i < 5; i++)   /* all inside recurse: one return address */
        CHECK(ips[i] == ips[1]);

    hook_depth = 40;
    s = recurse(60, 0, &ret);
    CHECK_EQ_U64(gg_sites_native(s, &ips), 40);
    CHECK(ips[0] == ret);

    /* More than GG_UNWIND_MAX asked: that many kept. */
    hook_depth = 1000;
    s = recurse(200, 0, &ret);
    CHECK_EQ_U64(gg_sites_native(s, &ips), GG_UNWIND_MAX);
    CHECK(ips[0] == ret);

    /* A shallow stack: all of it, fewer than asked. */
    hook_depth = 100;
    s = recurse(0, 0, &ret);
    size_t n = gg_sites_native(s, &ips);
    CHECK(n > 2 && n < 20);

    /* Depth 1: the caller alone; the same for any caller in recurse. */
    hook_depth = 1;
    gg_site a = recurse(3, 0, &ret), b = recurse(10, 0, NULL);
    CHECK_EQ_U64(gg_sites_native(a, &ips), 1);
    CHECK(ips[0] == ret);
    CHECK_EQ_U64(a, b);
    hook_depth = saved;
}

/* Many frames of "shim" above the caller: more than the spare frames a
 * capture first asks for. */
HOOK static gg_site hook_deep(int levels, int dev, uintptr_t *ret)
{
    gg_site s = levels > 0 ? hook_deep(levels - 1, dev, ret) : gg_stack_capture(dev, 4);
    BARRIER();
    return s;
}

NOINLINE static gg_site deep_shim_caller(uintptr_t *ret)
{
    *ret = (uintptr_t)__builtin_return_address(0);
    gg_site s = hook_deep(30, 0, NULL);
    BARRIER();
    return s;
}

static void test_deep_shim(void)
{
    uintptr_t ret;
    gg_site s = deep_shim_caller(&ret);
    const uintptr_t *ips;
    CHECK_EQ_U64(gg_sites_native(s, &ips), 4);
    Dl_info di;
    CHECK(dladdr((void *)(ips[0] - 1), &di));
    /* Frame 0 is in deep_shim_caller, frame 1 here. */
    CHECK(ips[1] == ret);
}

/* ---- threads ----------------------------------------------------------------- */

#define THREADS 16
#define ROUNDS 500
#define SHARED_STACKS 300

/* The workers never exit: libunwind frees its per-thread cache in the last
 * round of thread-specific destructors, after ThreadSanitizer has retired
 * the thread, and TSan crashes in the pthread_mutex_lock that libunwind
 * takes there. Parked threads end with the process, destructors unrun. */
static pthread_barrier_t workers_done;

struct worker {
    pthread_t tid;
    int index;
    gg_site same, own, shared[SHARED_STACKS];
    int bad;
    const char *sym;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    /* Distinct stacks for threads of different index mod 4. */
    int levels = w->index % 4;
    for (int r = 0; r < ROUNDS; r++) {
        gg_site s = gg_test_site_b(2);
        gg_site o = recurse(levels, 2, NULL);
        if (r == 0) {
            w->same = s;
            w->own = o;
        }
        w->bad += s != w->same || o != w->own || s == GG_SITE_NONE || o == GG_SITE_NONE;
        gg_sites_charge(s, 10, 1);
        gg_sites_charge(s, -10, -1);
    }
    /* Everyone interns the same synthetic stacks, in different orders. */
    uintptr_t f[3] = { 0xabc000, 0, 0xdef000 };
    for (int k = 0; k < SHARED_STACKS; k++) {
        int i = (k * 7 + w->index * 13) % SHARED_STACKS;
        f[1] = (uintptr_t)i + 1;
        w->shared[i] = gg_sites_intern(5, f, 3, NULL, 0);
    }
    /* And symbolizes the same frames. */
    const uintptr_t *ips;
    size_t n = gg_sites_native(w->same, &ips);
    struct gg_frame_info fi;
    w->sym = n && gg_symbolize(ips[0], &fi) ? fi.sym : NULL;
    for (size_t i = 0; i < n; i++)
        w->bad += !gg_symbolize(ips[i], &fi);
    pthread_barrier_wait(&workers_done);
    for (;;)
        pause();
    return NULL;
}

static void test_threads(void)
{
    static struct worker w[THREADS];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_barrier_init(&workers_done, NULL, THREADS + 1);
    int started = 0;
    for (int i = 0; i < THREADS; i++) {
        w[i].index = i;
        started += pthread_create(&w[i].tid, &attr, worker_main, &w[i]) == 0;
    }
    pthread_attr_destroy(&attr);
    CHECK_EQ_U64(started, THREADS);
    if (started != THREADS)
        return;   /* the barrier would never open */
    pthread_barrier_wait(&workers_done);
    for (int i = 0; i < THREADS; i++) {
        CHECK_EQ_U64(w[i].bad, 0);
        CHECK_EQ_U64(w[i].same, w[0].same);
        CHECK(w[i].sym == w[0].sym);
        for (int k = 0; k < THREADS; k++) {
            if (i % 4 == k % 4)
                CHECK_EQ_U64(w[i].own, w[k].own);
            else
                CHECK(w[i].own != w[k].own);
        }
        for (int k = 0; k < SHARED_STACKS; k++)
            CHECK_EQ_U64(w[i].shared[k], w[0].shared[k]);
    }
    CHECK_STR(w[0].sym, "gg_test_site_b");
    for (int k = 0; k < SHARED_STACKS; k++) {
        CHECK(w[0].shared[k] != GG_SITE_NONE);
        for (int l = k + 1; l < SHARED_STACKS; l++)
            if (w[0].shared[k] == w[0].shared[l]) {
                CHECK(w[0].shared[k] != w[0].shared[l]);
                break;
            }
    }
    struct gg_site_usage top[4];
    CHECK_EQ_U64(gg_sites_top(2, top, 4), 0);   /* every charge was undone */
}

static void test_fork(void)
{
    gg_site before = via(gg_test_site_a, 0);
    pid_t pid = fork();
    if (pid == 0) {
        uintptr_t f[1] = { 0x4242000 };
        int ok = before != GG_SITE_NONE && via(gg_test_site_a, 0) == before &&
                 gg_sites_intern(0, f, 1, NULL, 0) != GG_SITE_NONE && gg_test_site_b(4) != GG_SITE_NONE;
        _exit(ok ? 0 : 1);
    }
    CHECK(pid > 0);
    int status = -1;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    use_hook_ranges();
    RUN(test_none_and_junk);
    RUN(test_same_site);
    RUN(test_two_sites);
    RUN(test_two_devices);
    RUN(test_first_frame_is_caller);
    RUN(test_default_self_range);
    RUN(test_depth);
    RUN(test_deep_shim);
    RUN(test_threads);
    RUN(test_fork);
    return unit_done();
}
