/* test_callers.c - the module behind a return address (callers.c): named by
 * its file, cached, and forgotten when a library is unloaded. */
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "callers.h"
#include "unit.h"

/* An address inside libc itself: a function of libc's own that no
 * sanitizer intercepts. */
static uintptr_t libc_ip(void)
{
    return (uintptr_t)&gnu_get_libc_version + 4;
}

static void test_names(void)
{
    char m[64];
    CHECK(gg_callers_module(libc_ip(), m, sizeof m));
    CHECK_STR(m, "libc.so.6");
    CHECK(gg_callers_module((uintptr_t)&test_names + 4, m, sizeof m));
    CHECK_STR(m, "test_callers"); /* the executable, by the name it was run as */
    CHECK(gg_callers_module(libc_ip(), m, sizeof m)); /* from the cache */
    CHECK_STR(m, "libc.so.6");
    CHECK(!gg_callers_module(0, m, sizeof m));
    CHECK_STR(m, "");
    static char data[64]; /* this program's data: its module too */
    CHECK(gg_callers_module((uintptr_t)data + 8, m, sizeof m));
    CHECK_STR(m, "test_callers");
    CHECK(!gg_callers_module(8, m, sizeof m)); /* nothing is loaded there */
    char small[5];
    CHECK(gg_callers_module(libc_ip(), small, sizeof small));
    CHECK_STR(small, "libc"); /* cut to fit */
}

static void test_unloaded(void)
{
    void *h = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("  (libz.so.1 cannot be loaded: %s; the unload case is not run)\n", dlerror());
        return;
    }
    uintptr_t ip = (uintptr_t)dlsym(h, "zlibVersion") + 4;
    char m[64];
    CHECK(gg_callers_module(ip, m, sizeof m));
    CHECK_STR(m, "libz.so.1");
    CHECK(dlclose(h) == 0);
    /* The cached answer must not outlive the library: the address is not
     * libz's any more (here: nobody's). */
    if (!dlopen("libz.so.1", RTLD_NOW | RTLD_NOLOAD)) {
        Dl_info info;
        bool mapped = dladdr((void *)(ip - 1), &info) && info.dli_fname;
        CHECK(gg_callers_module(ip, m, sizeof m) == mapped);
        CHECK(!mapped || strcmp(m, "libz.so.1") != 0);
    }
}

/* Threads asking at once: every answer right (the cache is shared). */
static _Atomic int wrong;
static uintptr_t libc;
static void *ask(void *arg)
{
    (void)arg;
    char m[64];
    for (int i = 0; i < 2000; i++) {
        uintptr_t ip = (i & 1) ? libc + (i & 63) : (uintptr_t)&ask + (i & 31);
        if (!gg_callers_module(ip, m, sizeof m) ||
            strcmp(m, (i & 1) ? "libc.so.6" : "test_callers") != 0)
            atomic_fetch_add(&wrong, 1);
    }
    return NULL;
}

static void test_threads(void)
{
    pthread_t t[4];
    libc = libc_ip();
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, ask, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_U64(atomic_load(&wrong), 0);
}

int main(void)
{
    RUN(test_names);
    RUN(test_unloaded);
    RUN(test_threads);
    return unit_done();
}
