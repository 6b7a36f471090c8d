/* test_trace.c - the call trace (trace.c): the file it makes, one line per
 * call in the format tests/traces/tracefmt.py reads, and when it writes
 * nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pools.h"
#include "trace.h"
#include "unit.h"

static char dir[] = "/tmp/gg_trace_XXXXXX";

/* Line k (from 0) of text, into out. */
static const char *line_of(const char *text, int k, char *out, size_t cap)
{
    const char *p = text;
    while (k-- > 0 && (p = strchr(p, '\n')))
        p++;
    if (!p || !*p)
        return "";
    size_t n = strcspn(p, "\n");
    snprintf(out, cap, "%.*s", (int)n, p);
    return out;
}

static void test_off_until_opened(void)
{
    CHECK(!gg_tracing());
    gg_trace_alloc("cudaMalloc", 0, 1, 0x10, 0, false, GG_POOL_NONE); /* goes nowhere */
    CHECK(!gg_tracing());
}

/* Lookups before the trace opens are kept (GPUGUARD_TRACE asks for a
 * trace) and written right after the header, before anything else. */
static void test_early_lookups_come_first(void)
{
    char pattern[300], path[300], buf[4096], l[256], want[256];
    setenv("GPUGUARD_TRACE", "x", 1);
    CHECK(gg_trace_early());
    gg_trace_lookup("getproc", "cuMemAlloc", 12080, 0, 0);
    snprintf(pattern, sizeof pattern, "%s/early.%%p", dir);
    snprintf(path, sizeof path, "%s/early.%d", dir, (int)getpid());
    gg_trace_open(pattern);
    CHECK(!gg_trace_early());
    gg_trace_lookup("dlsym", "cuMemCreate", -1, 0, 0);
    unit_slurp(path, buf, sizeof buf);
    snprintf(want, sizeof want, "gpuguard-trace 1 pid=%d", (int)getpid());
    CHECK_STR(line_of(buf, 0, l, sizeof l), want);
    CHECK_STR(line_of(buf, 1, l, sizeof l), "lookup getproc cuMemAlloc 12080 0 ?");
    CHECK_STR(line_of(buf, 2, l, sizeof l), "lookup dlsym cuMemCreate -1 0 ?");
    gg_trace_after_fork(); /* back to no trace, for the next test */
}

static void test_every_line(void)
{
    char pattern[300], path[300], buf[8192], l[256], want[256];
    snprintf(pattern, sizeof pattern, "%s/trace.%%p", dir);
    snprintf(path, sizeof path, "%s/trace.%d", dir, (int)getpid());
    gg_trace_open(pattern);
    CHECK(gg_tracing());
    gg_trace_device(0, "NVIDIA GeForce RTX 3090", 25769803776ull, 8, 6);
    gg_trace_alloc("cudaMalloc", 0, 2097152, 0x700000000000ull, 0, false, GG_POOL_NONE);
    gg_trace_alloc("cuMemCreate", 1, 20971520, 0, 2, true, GG_POOL_NONE);
    unsigned slot = gg_pools_get(0xabc0, 0, false);
    gg_trace_alloc("cudaMallocAsync", 0, 4096, 0x700000200000ull, 0, false, slot);
    gg_trace_free("cudaFree", 0x700000000000ull);
    gg_trace_failed("free", "cudaFree", 0x1234, 1);
    gg_trace_map(0x710000000000ull, 20971520, 0xffff00ff, 0);
    gg_trace_unmap(0x710000000000ull, 20971520);
    gg_trace_release(0xffff00ff);
    gg_trace_pool("trim", 0xabc0, 0, 0);
    gg_trace_pool_attr(0xabc0, 4, 18446744073709551615ull, 0);
    gg_trace_meminfo("cudaMemGetInfo", 0, 100, 200);
    gg_trace_lookup("dlsym", "cuMemCreate", -1, 0, (uintptr_t)&test_every_line);
    gg_trace_lookup("getproc", "cuMemAlloc", 12080, 0, 0);
    gg_trace_api("step", 7, 0);
    gg_trace_api("batch", 16, 2);
    gg_trace_api("ack", 3, 0);
    unit_slurp(path, buf, sizeof buf);
    long tid = (long)syscall(SYS_gettid);
    snprintf(want, sizeof want, "gpuguard-trace 1 pid=%d", (int)getpid());
    CHECK_STR(line_of(buf, 0, l, sizeof l), want);
    CHECK_STR(line_of(buf, 1, l, sizeof l), "device 0 25769803776 8.6 NVIDIA GeForce RTX 3090");
    snprintf(want, sizeof want, "alloc cudaMalloc 0 2097152 0x700000000000 0 t=%ld", tid);
    CHECK_STR(line_of(buf, 2, l, sizeof l), want);
    snprintf(want, sizeof want, "alloc cuMemCreate 1 20971520 0 refused t=%ld", tid);
    CHECK_STR(line_of(buf, 3, l, sizeof l), want);
    snprintf(want, sizeof want, "alloc cudaMallocAsync 0 4096 0x700000200000 0 t=%ld pool=0xabc0", tid);
    CHECK_STR(line_of(buf, 4, l, sizeof l), want);
    snprintf(want, sizeof want, "free cudaFree 0x700000000000 t=%ld", tid);
    CHECK_STR(line_of(buf, 5, l, sizeof l), want);
    snprintf(want, sizeof want, "fail free cudaFree 0x1234 1 t=%ld", tid);
    CHECK_STR(line_of(buf, 6, l, sizeof l), want);
    CHECK_STR(line_of(buf, 7, l, sizeof l), "map 0x710000000000 20971520 0xffff00ff 0");
    snprintf(want, sizeof want, "unmap 0x710000000000 20971520 t=%ld", tid);
    CHECK_STR(line_of(buf, 8, l, sizeof l), want);
    snprintf(want, sizeof want, "release 0xffff00ff t=%ld", tid);
    CHECK_STR(line_of(buf, 9, l, sizeof l), want);
    CHECK_STR(line_of(buf, 10, l, sizeof l), "pool trim 0xabc0 0 0");
    CHECK_STR(line_of(buf, 11, l, sizeof l), "pool attr 0xabc0 4=18446744073709551615 0");
    CHECK_STR(line_of(buf, 12, l, sizeof l), "meminfo cudaMemGetInfo 0 100 200");
    CHECK_STR(line_of(buf, 13, l, sizeof l), "lookup dlsym cuMemCreate -1 0 test_trace");
    CHECK_STR(line_of(buf, 14, l, sizeof l), "lookup getproc cuMemAlloc 12080 0 ?");
    CHECK_STR(line_of(buf, 15, l, sizeof l), "step 7");
    CHECK_STR(line_of(buf, 16, l, sizeof l), "batch 16 2");
    CHECK_STR(line_of(buf, 17, l, sizeof l), "ack 3");
    CHECK_STR(line_of(buf, 18, l, sizeof l), "");
    gg_pools_reset();
}

/* A forked child passes through: it writes nothing into its parent's
 * trace; and a trace never replaces a file that exists. */
static void test_child_and_existing_file(void)
{
    char path[300], before[8192], after[8192];
    snprintf(path, sizeof path, "%s/trace.%d", dir, (int)getpid());
    unit_slurp(path, before, sizeof before);
    gg_trace_after_fork();
    CHECK(!gg_tracing());
    gg_trace_api("step", 8, 0);
    gg_trace_open(path); /* exists: said on stderr, no trace */
    CHECK(!gg_tracing());
    unit_slurp(path, after, sizeof after);
    CHECK_STR(after, before);
}

int main(void)
{
    if (!unit_tmpdir(dir))
        return 1;
    RUN(test_off_until_opened);
    RUN(test_early_lookups_come_first);
    RUN(test_every_line);
    RUN(test_child_and_existing_file);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return unit_done();
}
