/* host.c - a program that loads CUDA extensions at run time, the way Python
 * loads extension modules: it links no CUDA runtime itself.
 *
 *   host apart       libplugin13.so and libplugin12.so side by side: each
 *                    allocates through its own runtime, on its own device,
 *                    and each runtime keeps its own last error
 *   host reload      libplugin13.so loaded RTLD_GLOBAL, used, dlclosed (its
 *                    runtime with it, unless something holds it), the old
 *                    address range occupied, then loaded and used again
 *
 * Prints what it sees, one line per step; exits 0 when it got to the end.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct plugin {
    void *h;
    int (*alloc)(size_t, void **);
    int (*free_)(void *);
    int (*setdev)(int);
    int (*lasterror)(void);
    int (*version)(void);
};

static char dir[4096];

static int load(struct plugin *p, const char *name, int flags)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    p->h = dlopen(path, flags);
    if (!p->h) {
        printf("cannot load %s: %s\n", name, dlerror());
        return -1;
    }
    *(void **)&p->alloc = dlsym(p->h, "plugin_alloc");
    *(void **)&p->free_ = dlsym(p->h, "plugin_free");
    *(void **)&p->setdev = dlsym(p->h, "plugin_setdev");
    *(void **)&p->lasterror = dlsym(p->h, "plugin_lasterror");
    *(void **)&p->version = dlsym(p->h, "plugin_runtime_version");
    return 0;
}

static int apart(void)
{
    struct plugin p13, p12;
    void *a = NULL, *b = NULL, *c = NULL;
    if (load(&p13, "libplugin13.so", RTLD_NOW | RTLD_LOCAL) ||
        load(&p12, "libplugin12.so", RTLD_NOW | RTLD_LOCAL))
        return 1;
    printf("versions %d %d\n", p13.version(), p12.version());
    printf("setdev12 %d\n", p12.setdev(1));
    printf("alloc13 %d\n", p13.alloc((size_t)1 << 30, &a));
    printf("alloc12 %d\n", p12.alloc((size_t)2 << 30, &b));
    /* more than the device has: each runtime's own out-of-memory */
    printf("huge12 %d\n", p12.alloc((size_t)1 << 40, &c));
    int l12 = p12.lasterror(), l13 = p13.lasterror();
    printf("last12 %d last13 %d\n", l12, l13);
    int f13 = p13.free_(a), f12 = p12.free_(b);
    printf("free %d %d\n", f13, f12);
    return 0;
}

struct range { uintptr_t lo, hi; };

static int find_runtime(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct range *r = arg;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libcudart.so.13"))
        return 0;
    r->lo = UINTPTR_MAX;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < r->lo)
            r->lo = a;
        if (a + ph->p_memsz > r->hi)
            r->hi = a + ph->p_memsz;
    }
    return 1;
}

static int reload(void)
{
    struct plugin p;
    struct range r = {0, 0};
    void *a = NULL;
    if (load(&p, "libplugin13.so", RTLD_NOW | RTLD_GLOBAL))
        return 1;
    int r1 = p.alloc((size_t)1 << 20, &a), r2 = p.free_(a);
    printf("first %d %d\n", r1, r2);
    dl_iterate_phdr(find_runtime, &r);
    dlclose(p.h);
    /* Whatever was at the runtime's old addresses is gone unless someone
     * holds it: take them, so a runtime loaded again lands elsewhere. */
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = r.lo & ~(uintptr_t)(page - 1);
    void *m = r.lo ? mmap((void *)lo, r.hi - lo, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
                   : MAP_FAILED;
    printf("old range %s\n", m == (void *)lo ? "taken" : "still mapped");
    if (load(&p, "libplugin13.so", RTLD_NOW | RTLD_GLOBAL))
        return 1;
    r1 = p.alloc((size_t)1 << 20, &a);
    r2 = p.free_(a);
    printf("again %d %d\n", r1, r2);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *fake = getenv("GG_FAKE_DIR");
    snprintf(dir, sizeof dir, "%s", fake ? fake : ".");
    if (argc < 2) {
        fprintf(stderr, "usage: host apart|reload\n");
        return 2;
    }
    int rc = !strcmp(argv[1], "apart") ? apart() : !strcmp(argv[1], "reload") ? reload() : 2;
    printf("host: done\n");
    return rc;
}
