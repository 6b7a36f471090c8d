/* test_symbolize.c - naming return addresses (symbolize.c), and a site's
 * frames as the journal writes them (events.c).
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

#include "events.h"
#include "json.h"
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

NOINLINE static gg_site static_caller(int dev, uintptr_t *ret)
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

/* ---- helpers ------------------------------------------------------------------ */

static char exe_path[PATH_MAX];

static const char *exe(void)
{
    if (!exe_path[0]) {
        ssize_t n = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
        exe_path[n > 0 ? n : 0] = '\0';
    }
    return exe_path;
}

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

static void test_symbolize(void)
{
    uintptr_t ret;
    gg_site s = gg_test_named_caller(0, &ret);
    const uintptr_t *ips;
    CHECK(gg_sites_native(s, &ips) >= 1);
    struct gg_frame_info fi, again;
    CHECK(gg_symbolize(ips[0], &fi));
    CHECK_STR(fi.sym, "gg_test_named_caller");
    CHECK_STR(fi.module, exe());
    CHECK(fi.has_off);
    CHECK_EQ_U64(fi.off, ips[0] - (uintptr_t)&gg_test_named_caller);
    /* Cached: the same strings come back. */
    CHECK(gg_symbolize(ips[0], &again));
    CHECK(again.sym == fi.sym && again.module == fi.module && again.off == fi.off);

    /* A static function: not in the dynamic symbol table, named from the
     * ELF symbol table by libunwind. */
    s = static_caller(0, &ret);
    CHECK(gg_sites_native(s, &ips) >= 1);
    CHECK(gg_symbolize(ips[0], &fi));
    CHECK_STR(fi.sym, "static_caller");
    CHECK(fi.has_off);
    CHECK_EQ_U64(fi.off, ips[0] - (uintptr_t)&static_caller);

    /* No symbol covers the ELF header: module and offset from its base. */
    struct main_map m = main_map();
    uintptr_t header = m.load + m.first_vaddr + 0x10;
    CHECK(gg_symbolize(header, &fi));
    CHECK(fi.sym == NULL);
    CHECK_STR(fi.module, exe());
    CHECK(fi.has_off);
    CHECK_EQ_U64(fi.off, m.first_vaddr + 0x10);

    /* No module at all (anonymous memory, like JIT code). */
    char *anon = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(anon != MAP_FAILED);
    CHECK(gg_symbolize((uintptr_t)anon + 64, &fi));
    CHECK(fi.module == NULL && fi.sym == NULL && !fi.has_off);

    /* A library function, named through dladdr (libc's, or a sanitizer's
     * interceptor of the same name). dlsym is not used: the shim's core
     * archive defines its own. */
    CHECK(gg_symbolize((uintptr_t)&getppid + 4, &fi));
    CHECK(fi.module != NULL);
    CHECK_STR(fi.sym, "getppid");
    CHECK_EQ_U64(fi.off, 4);
    munmap(anon, 4096);
}

static void test_json(void)
{
    uintptr_t ret;
    gg_test_named_caller(0, &ret);
    struct main_map m = main_map();
    uintptr_t f[3] = { ret, m.load + m.first_vaddr + 0x10, 0 };
    char *anon = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    f[2] = (uintptr_t)anon + 8;
    gg_site s = gg_sites_intern(0, f, 3, NULL, 0);
    CHECK(s != GG_SITE_NONE);
    int failed_before = unit_checks_failed;

    char buf[256], want[PATH_MAX + 256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_obj(&j);
    gg_json_key(&j, "stack");
    gg_events_stack(&j, s);
    gg_json_obj_end(&j);
    CHECK(!j.failed);
    CHECK(j.buf && j.buf[0] == '{');

    snprintf(want, sizeof want, "{\"stack\":[{\"ip\":\"0x%llx\",\"module\":\"%s\",\"sym\":\"gg_test_named_caller\",\"off\":%llu},",
             (unsigned long long)ret, exe(),
             (unsigned long long)(ret - (uintptr_t)&gg_test_named_caller));
    CHECK(j.buf && strncmp(j.buf, want, strlen(want)) == 0);
    snprintf(want, sizeof want, "{\"ip\":\"0x%llx\",\"module\":\"%s\",\"sym\":null,\"off\":%llu},",
             (unsigned long long)f[1], exe(), (unsigned long long)(m.first_vaddr + 0x10));
    CHECK(j.buf && strstr(j.buf, want));
    snprintf(want, sizeof want, "{\"ip\":\"0x%llx\",\"module\":null,\"sym\":null,\"off\":null}]}",
             (unsigned long long)f[2]);
    CHECK(j.buf && strstr(j.buf, want));
    if (unit_checks_failed != failed_before)
        printf("  json: %s\n", j.buf ? j.buf : "(null)");
    gg_json_free(&j);

    /* No site: an empty array. */
    gg_json_init(&j, buf, sizeof buf);
    gg_events_stack(&j, GG_SITE_NONE);
    CHECK_STR(j.buf, "[]");
    gg_json_free(&j);
    munmap(anon, 4096);
}

int main(void)
{
    use_hook_ranges();
    RUN(test_symbolize);
    RUN(test_json);
    return unit_done();
}
