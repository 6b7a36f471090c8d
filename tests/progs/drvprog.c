/*
 * drvprog.c - a program linked directly with -lcuda, no runtime at all: its
 * driver calls bind to libcuda.so.1's exports at load time (what a
 * preloaded library exporting the same names would take over).
 *
 *   drvprog alloc:1G v1:512M meminfo free:0 freeall
 *
 * Commands, one per argument (sizes as in script: 1G, 1.5G, 512M, 4096):
 *   alloc:SIZE         cuMemAlloc_v2 into the next slot
 *   pitch:W:H          cuMemAllocPitch_v2 (element size 16)
 *   async:SIZE         cuMemAllocAsync on the legacy stream (freed with cuMemFreeAsync)
 *   array:W[:H]        cuArrayCreate_v2, one 8-bit channel (freed with cuArrayDestroy)
 *   v1:SIZE            cuMemAlloc, the legacy export (32-bit pointer and size; says
 *                      `v1 SIZE: a 64-bit pointer was written` if the function
 *                      it reached wrote a _v2 pointer)
 *   host:SIZE          cuMemHostAlloc (freed with cuMemFreeHost)
 *   free:I / freeall   frees slot I / every live slot with its matching call
 *   setdev:N           retains device N's primary context and makes it current
 *   meminfo            cuMemGetInfo_v2
 *   sync               cuCtxSynchronize
 * Prints `CMD ARG: error N` (a CUresult) on failure, `meminfo free=F total=T`,
 * and `drvprog: done` at the end. A bad command exits 2.
 */
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "size.h"

/* The legacy export, by its own name (cuda.h maps cuMemAlloc to _v2). */
CUresult cuMemAlloc_v1(unsigned int *dptr, unsigned int bytesize) __asm__("cuMemAlloc");
CUresult cuMemFree_v1(unsigned int dptr) __asm__("cuMemFree");

enum kind { D_ALLOC, D_PITCH, D_ASYNC, D_ARRAY, D_V1, D_HOST };

struct slot {
    enum kind kind;
    int live;
    CUdeviceptr p;
    CUarray array;
    void *host;
};

#define MAXSLOTS 4096
static struct slot g_slots[MAXSLOTS];
static size_t g_nslots;

static void die(const char *msg, const char *arg)
{
    fprintf(stderr, "drvprog: %s: %s\n", msg, arg);
    exit(2);
}

static size_t need_size(const char *str)
{
    size_t v;
    if (prog_parse_size(str, &v) != 0)
        die("bad size", str);
    return v;
}

static CUresult set_device(int n)
{
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuDeviceGet(&dev, n);
    if (r == CUDA_SUCCESS)
        r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS)
        r = cuCtxSetCurrent(ctx);
    return r;
}

static CUresult alloc(enum kind k, char *arg, struct slot *s)
{
    s->kind = k;
    switch (k) {
    case D_ALLOC: return cuMemAlloc(&s->p, need_size(arg));
    case D_ASYNC: return cuMemAllocAsync(&s->p, need_size(arg), CU_STREAM_LEGACY);
    case D_HOST: return cuMemHostAlloc(&s->host, need_size(arg), 0);
    case D_V1: {
        size_t size = need_size(arg);
        unsigned int p[2] = {0, 0}; /* the second cell catches a 64-bit write */
        if (size > UINT32_MAX)
            die("a v1 size must fit 32 bits", arg);
        CUresult r = cuMemAlloc_v1(p, (unsigned int)size);
        if (p[1])
            printf("v1 %s: a 64-bit pointer was written\n", arg);
        s->p = p[0];
        return r;
    }
    case D_PITCH:
    case D_ARRAY: {
        char *h = strchr(arg, ':');
        if (h)
            *h++ = 0;
        else if (k == D_PITCH)
            die("need W:H", arg);
        size_t width = need_size(arg), height = h ? need_size(h) : 0;
        if (k == D_PITCH) {
            size_t pitch;
            return cuMemAllocPitch(&s->p, &pitch, width, height, 16);
        }
        CUDA_ARRAY_DESCRIPTOR d = {width, height, CU_AD_FORMAT_UNSIGNED_INT8, 1};
        return cuArrayCreate(&s->array, &d);
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static void free_slot(size_t i)
{
    if (i >= g_nslots) {
        printf("free %zu: no such slot\n", i);
        return;
    }
    struct slot *s = &g_slots[i];
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    switch (s->kind) {
    case D_ALLOC:
    case D_PITCH: r = cuMemFree(s->p); break;
    case D_ASYNC: r = cuMemFreeAsync(s->p, CU_STREAM_LEGACY); break;
    case D_ARRAY: r = cuArrayDestroy(s->array); break;
    case D_V1: r = cuMemFree_v1((unsigned int)s->p); break;
    case D_HOST: r = cuMemFreeHost(s->host); break;
    }
    s->live = 0;
    if (r)
        printf("free %zu: error %d\n", i, (int)r);
}

static void run(char *cmd)
{
    static const struct {
        const char *name;
        enum kind kind;
    } kinds[] = {{"alloc", D_ALLOC}, {"pitch", D_PITCH}, {"async", D_ASYNC},
                 {"array", D_ARRAY}, {"v1", D_V1},       {"host", D_HOST}};
    char *arg = strchr(cmd, ':');
    if (arg)
        *arg++ = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(cmd, kinds[i].name) != 0 || !arg)
            continue;
        if (g_nslots == MAXSLOTS)
            die("too many slots", cmd);
        char shown[256];
        snprintf(shown, sizeof shown, "%s", arg);
        struct slot *s = &g_slots[g_nslots++];
        CUresult r = alloc(kinds[i].kind, arg, s);
        s->live = r == CUDA_SUCCESS;
        if (r)
            printf("%s %s: error %d\n", cmd, shown, (int)r);
        return;
    }
    if (strcmp(cmd, "free") == 0 && arg) {
        free_slot((size_t)strtoul(arg, NULL, 10));
    } else if (strcmp(cmd, "freeall") == 0) {
        for (size_t i = 0; i < g_nslots; i++)
            if (g_slots[i].live)
                free_slot(i);
    } else if (strcmp(cmd, "setdev") == 0 && arg) {
        CUresult r = set_device(atoi(arg));
        if (r)
            printf("setdev %s: error %d\n", arg, (int)r);
    } else if (strcmp(cmd, "meminfo") == 0) {
        size_t f = 0, t = 0;
        CUresult r = cuMemGetInfo(&f, &t);
        if (r)
            printf("meminfo: error %d\n", (int)r);
        else
            printf("meminfo free=%zu total=%zu\n", f, t);
    } else if (strcmp(cmd, "sync") == 0) {
        CUresult r = cuCtxSynchronize();
        if (r)
            printf("sync: error %d\n", (int)r);
    } else {
        die("unknown command", cmd);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = set_device(0);
    if (r) {
        printf("init: error %d\n", (int)r);
        return 1;
    }
    for (int i = 1; i < argc; i++)
        run(argv[i]);
    printf("drvprog: done\n");
    return 0;
}
