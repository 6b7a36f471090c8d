/*
 * rtcmds.h - the commands of a program that uses the CUDA runtime API and
 * brings its runtime with it (nvccprog.cu: NVIDIA's static libcudart;
 * srtlike.c: a stand-in), one per argument, as in script:
 *
 *   alloc:SIZE     cudaMalloc into the next slot
 *   async:SIZE     cudaMallocAsync on the legacy stream (freed with cudaFreeAsync)
 *   host:SIZE      cudaMallocHost (freed with cudaFreeHost)
 *   free:I         frees slot I with its matching call; freeall: every live one
 *   meminfo        cudaMemGetInfo: `meminfo free=F total=T`
 *   sync           cudaDeviceSynchronize
 *   lasterror      `lasterror: N` (cudaGetLastError)
 *
 * On failure `CMD ARG: error N NAME` (cudaError_t and its cudaGetErrorName);
 * at the end `PROG: done`. A bad command exits 2. C and C++ alike.
 */
#ifndef GG_RTCMDS_H
#define GG_RTCMDS_H

#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "size.h"

enum rt_kind { RT_ALLOC, RT_ASYNC, RT_HOST };

struct rt_slot {
    enum rt_kind kind;
    int live;
    void *p;
};

#define RT_MAXSLOTS 4096
static struct rt_slot rt_slots[RT_MAXSLOTS];
static size_t rt_nslots;
static const char *rt_prog = "rtcmds";

static void rt_die(const char *msg, const char *arg)
{
    fprintf(stderr, "%s: %s: %s\n", rt_prog, msg, arg);
    exit(2);
}

static size_t rt_size(const char *str)
{
    size_t v;
    if (prog_parse_size(str, &v) != 0)
        rt_die("bad size", str);
    return v;
}

static void rt_fail(const char *cmd, const char *arg, cudaError_t e)
{
    printf("%s%s%s: error %d %s\n", cmd, arg ? " " : "", arg ? arg : "", (int)e,
           cudaGetErrorName(e));
}

static void rt_free(size_t i)
{
    if (i >= rt_nslots) {
        printf("free %zu: no such slot\n", i);
        return;
    }
    struct rt_slot *s = &rt_slots[i];
    cudaError_t e = s->kind == RT_ASYNC  ? cudaFreeAsync(s->p, 0)
                    : s->kind == RT_HOST ? cudaFreeHost(s->p)
                                         : cudaFree(s->p);
    s->live = 0;
    if (e) {
        char arg[32];
        snprintf(arg, sizeof arg, "%zu", i);
        rt_fail("free", arg, e);
    }
}

static void rt_cmd(char *cmd)
{
    char *arg = strchr(cmd, ':');
    if (arg)
        *arg++ = 0;
    int kind = !strcmp(cmd, "alloc") ? RT_ALLOC
               : !strcmp(cmd, "async") ? RT_ASYNC
               : !strcmp(cmd, "host")  ? RT_HOST
                                       : -1;
    if (kind >= 0 && arg) {
        if (rt_nslots == RT_MAXSLOTS)
            rt_die("too many slots", cmd);
        size_t size = rt_size(arg);
        struct rt_slot *s = &rt_slots[rt_nslots++];
        s->kind = (enum rt_kind)kind;
        cudaError_t e = kind == RT_ASYNC  ? cudaMallocAsync(&s->p, size, 0)
                        : kind == RT_HOST ? cudaMallocHost(&s->p, size)
                                          : cudaMalloc(&s->p, size);
        s->live = e == cudaSuccess;
        if (e)
            rt_fail(cmd, arg, e);
    } else if (!strcmp(cmd, "free") && arg) {
        rt_free((size_t)strtoul(arg, NULL, 10));
    } else if (!strcmp(cmd, "freeall")) {
        for (size_t i = 0; i < rt_nslots; i++)
            if (rt_slots[i].live)
                rt_free(i);
    } else if (!strcmp(cmd, "meminfo")) {
        size_t f = 0, t = 0;
        cudaError_t e = cudaMemGetInfo(&f, &t);
        if (e)
            rt_fail(cmd, NULL, e);
        else
            printf("meminfo free=%zu total=%zu\n", f, t);
    } else if (!strcmp(cmd, "sync")) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e)
            rt_fail(cmd, NULL, e);
    } else if (!strcmp(cmd, "lasterror")) {
        printf("lasterror: %d\n", (int)cudaGetLastError());
    } else {
        rt_die("unknown command", cmd);
    }
}

static int rt_main(const char *prog, int argc, char **argv)
{
    rt_prog = prog;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++)
        rt_cmd(argv[i]);
    printf("%s: done\n", prog);
    return 0;
}

#endif
