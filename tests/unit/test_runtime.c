/* test_runtime.c - the real runtimes found per version and pinned
 * (runtime.c), with the fake libcudart.so.12 and .13 loaded RTLD_LOCAL by
 * two extensions, as Python loads them. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "unit.h"

static char fake[4096];

static void *load(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", fake, name);
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static const char *module_of(void *fn)
{
    Dl_info di;
    if (!fn || !dladdr(fn, &di) || !di.dli_fname)
        return "";
    const char *slash = strrchr(di.dli_fname, '/');
    return slash ? slash + 1 : di.dli_fname;
}

static void test_each_version_its_own(void)
{
    void *p13 = load("libplugin13.so"), *p12 = load("libplugin12.so");
    CHECK(p13 && p12);
    CHECK_STR(module_of(gg_runtime_resolve(GG_RT_13, "cudaMalloc")), "libcudart.so.13");
    CHECK_STR(module_of(gg_runtime_resolve(GG_RT_12, "cudaMalloc")), "libcudart.so.12");
    CHECK(gg_runtime_resolve(GG_RT_11, "cudaMalloc") == NULL); /* none loaded */
    CHECK(gg_runtime_resolve(GG_RT_ANY, "cudaMalloc") != NULL);
    CHECK(gg_runtime_resolve(GG_RT_13, "cudaNoSuchFunction") == NULL);
    CHECK_STR(gg_runtime_version_name(GG_RT_12), "libcudart.so.12");
    CHECK(gg_runtime_version_name(GG_RT_ANY) == NULL);
}

/* A runtime a function was found in stays loaded after its extension goes. */
static void test_pinned(void)
{
    void *p12 = load("libplugin12.so");
    CHECK(p12 != NULL);
    if (!p12)
        return;
    void *fn = gg_runtime_resolve(GG_RT_12, "cudaFree");
    CHECK(fn != NULL);
    CHECK(gg_runtime_pinned() >= 1);
    dlclose(p12); /* this test's handle and the one before: nothing holds it now */
    dlclose(p12);
    Dl_info di;
    CHECK(dladdr(fn, &di) != 0); /* still mapped */
}

int main(void)
{
    const char *build = getenv("GG_BUILD");
    snprintf(fake, sizeof fake, "%s/fake", build ? build : "build");
    RUN(test_each_version_its_own);
    RUN(test_pinned);
    return unit_done();
}
