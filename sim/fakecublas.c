/*
 * fakecublas.c - stand-ins for cuBLAS (libcublas.so.12) and cuBLASLt
 * (libcublasLt.so.12) on the fake GPU: one source, built once per library
 * (FAKE_LT selects cuBLASLt).
 *
 * The real libraries carry NVIDIA's static runtime, which cannot start
 * without NVIDIA's private driver tables, so their first call would fail.
 * PyTorch's torch.nn.Linear, matmul and attention go through them: a handle
 * per stream, a workspace from PyTorch's own allocator, math and pointer
 * modes, and gemm (cuBLAS) or matmul with heuristics (cuBLASLt). These
 * stand-ins keep that state and succeed, computing nothing: results live
 * in device memory, which the fake GPU does not back. The functions that
 * only compute are in cublas.def.
 *
 * FAKECUDA_CUBLAS_WORKSPACE=BYTES (K/M/G binary suffixes; default 0): each
 * cuBLAS handle allocates that much device memory at cublasCreate through
 * the driver (cuMemAlloc_v2, looked up in the global scope: the shim's when
 * it is preloaded), as the real cuBLAS 13 does (64 MiB on an H200 under
 * PyTorch 2.11), and fails with CUBLAS_STATUS_ALLOC_FAILED when the driver
 * says no: the RuntimeError PyTorch raises then is not an OutOfMemoryError.
 *
 * FAKECUDA_CUBLAS_LOG=FILE: each cublasCreate_v2 that succeeds appends the
 * line "cublasCreate BYTES" (the memory the handle took itself) to FILE:
 * how many handles a program made (gpuguard-preflight counts them: one per
 * thread that multiplies matrices, autograd's included).
 *
 * Types are defined here, not taken from cublas_api.h, whose prototypes the
 * stubs of cublas.def do not follow (each takes whatever it is given and
 * returns success, which the x86-64 calling convention allows).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS         0
#define CUBLAS_STATUS_NOT_INITIALIZED 1
#define CUBLAS_STATUS_ALLOC_FAILED    3
#define CUBLAS_STATUS_INVALID_VALUE   7

#define EXPORT __attribute__((visibility("default")))

#define STUB_DEFINE(name)                 \
    EXPORT cublasStatus_t name(void);     \
    EXPORT cublasStatus_t name(void)      \
    {                                     \
        return CUBLAS_STATUS_SUCCESS;     \
    }

#ifdef FAKE_LT
#define STUB_LT(name) STUB_DEFINE(name)
#define STUB_BLAS(name)
#else
#define STUB_LT(name)
#define STUB_BLAS(name) STUB_DEFINE(name)
#endif
#define STUB(lib, name) STUB_##lib(name)
#include "cublas.def"
#undef STUB

/* Every object a create hands out: a magic word, then its state. */
struct object {
    uint32_t magic;
    void *stream;
    int math_mode, pointer_mode, atomics_mode;
    void *workspace;
    size_t workspace_size;
    unsigned long long own; /* device memory the handle allocated itself (FAKECUDA_CUBLAS_WORKSPACE) */
};

static cublasStatus_t create(void **out, uint32_t magic)
{
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct object *o = calloc(1, sizeof *o);
    if (!o)
        return CUBLAS_STATUS_ALLOC_FAILED;
    o->magic = magic;
    *out = o;
    return CUBLAS_STATUS_SUCCESS;
}

static struct object *object_of(void *h, uint32_t magic)
{
    struct object *o = h;
    return o && o->magic == magic ? o : NULL;
}

static cublasStatus_t destroy(void *h, uint32_t magic)
{
    struct object *o = object_of(h, magic);
    if (!o)
        return magic == 0xb1a5b1a5u ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_INVALID_VALUE;
    o->magic = 0;
    free(o);
    return CUBLAS_STATUS_SUCCESS;
}

#ifndef FAKE_LT

#define HANDLE 0xb1a5b1a5u /* BLAS_HANDLE of the cuBLASLt build */

#define GET(h)                                          \
    struct object *o = object_of(h, HANDLE);            \
    if (!o)                                             \
        return CUBLAS_STATUS_NOT_INITIALIZED

/* FAKECUDA_CUBLAS_WORKSPACE, in bytes. */
static size_t handle_bytes(void)
{
    const char *s = getenv("FAKECUDA_CUBLAS_WORKSPACE");
    if (!s || !*s)
        return 0;
    char *end;
    double v = strtod(s, &end);
    size_t unit = 1;
    switch (*end) {
    case 'K': unit = 1ull << 10; break;
    case 'M': unit = 1ull << 20; break;
    case 'G': unit = 1ull << 30; break;
    default: break;
    }
    return v > 0 ? (size_t)(v * (double)unit) : 0;
}

/* FAKECUDA_CUBLAS_LOG: one line per handle made, in one write. */
static void log_handle(size_t bytes)
{
    const char *path = getenv("FAKECUDA_CUBLAS_LOG");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    char line[64];
    int n = snprintf(line, sizeof line, "cublasCreate %zu\n", bytes);
    if (n > 0 && write(fd, line, (size_t)n) < 0) {
        /* nothing to do: the count is lost, the handle is not */
    }
    close(fd);
}

typedef int (*mem_alloc_fn)(unsigned long long *, size_t);
typedef int (*mem_free_fn)(unsigned long long);

EXPORT cublasStatus_t cublasCreate_v2(void **handle);
EXPORT cublasStatus_t cublasCreate_v2(void **handle)
{
    cublasStatus_t st = create(handle, HANDLE);
    size_t bytes = handle_bytes();
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!bytes) {
        log_handle(0);
        return st;
    }
    mem_alloc_fn alloc;
    void *sym = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    memcpy(&alloc, &sym, sizeof sym);
    unsigned long long dptr = 0;
    if (!alloc || alloc(&dptr, bytes) != 0) {
        destroy(*handle, HANDLE);
        *handle = NULL;
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    ((struct object *)*handle)->own = dptr;
    log_handle(bytes);
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasDestroy_v2(void *handle);
EXPORT cublasStatus_t cublasDestroy_v2(void *handle)
{
    struct object *o = object_of(handle, HANDLE);
    if (o && o->own) {
        mem_free_fn release;
        void *sym = dlsym(RTLD_DEFAULT, "cuMemFree_v2");
        memcpy(&release, &sym, sizeof sym);
        if (release)
            release(o->own);
    }
    return destroy(handle, HANDLE);
}

EXPORT cublasStatus_t cublasSetStream_v2(void *handle, void *stream);
EXPORT cublasStatus_t cublasSetStream_v2(void *handle, void *stream)
{
    GET(handle);
    o->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetStream_v2(void *handle, void **stream);
EXPORT cublasStatus_t cublasGetStream_v2(void *handle, void **stream)
{
    GET(handle);
    if (!stream)
        return CUBLAS_STATUS_INVALID_VALUE;
    *stream = o->stream;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetMathMode(void *handle, int mode);
EXPORT cublasStatus_t cublasSetMathMode(void *handle, int mode)
{
    GET(handle);
    o->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetMathMode(void *handle, int *mode);
EXPORT cublasStatus_t cublasGetMathMode(void *handle, int *mode)
{
    GET(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = o->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetPointerMode_v2(void *handle, int mode);
EXPORT cublasStatus_t cublasSetPointerMode_v2(void *handle, int mode)
{
    GET(handle);
    o->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetPointerMode_v2(void *handle, int *mode);
EXPORT cublasStatus_t cublasGetPointerMode_v2(void *handle, int *mode)
{
    GET(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = o->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetAtomicsMode(void *handle, int mode);
EXPORT cublasStatus_t cublasSetAtomicsMode(void *handle, int mode)
{
    GET(handle);
    o->atomics_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* The workspace is the caller's memory (PyTorch takes it from its caching
 * allocator, so it is in the ledger): kept, never touched. */
EXPORT cublasStatus_t cublasSetWorkspace_v2(void *handle, void *workspace, size_t size);
EXPORT cublasStatus_t cublasSetWorkspace_v2(void *handle, void *workspace, size_t size)
{
    GET(handle);
    if (size && !workspace)
        return CUBLAS_STATUS_INVALID_VALUE;
    o->workspace = workspace;
    o->workspace_size = size;
    return CUBLAS_STATUS_SUCCESS;
}

#else /* FAKE_LT */

#define LT_HANDLE     0x17a5b1a5u
#define LT_MATMUL     0x17a5d35cu
#define LT_LAYOUT     0x17a51a70u
#define LT_PREFERENCE 0x17a5f4e7u

/* A cuBLAS handle is a cuBLASLt handle too (PyTorch 2.6 passes its cuBLAS
 * handle to cublasLt calls, as the real libraries allow). */
#define BLAS_HANDLE 0xb1a5b1a5u
static int lt_handle(void *h)
{
    return object_of(h, LT_HANDLE) || object_of(h, BLAS_HANDLE);
}

EXPORT cublasStatus_t cublasLtCreate(void **handle);
EXPORT cublasStatus_t cublasLtCreate(void **handle)
{
    return create(handle, LT_HANDLE);
}

EXPORT cublasStatus_t cublasLtDestroy(void *handle);
EXPORT cublasStatus_t cublasLtDestroy(void *handle)
{
    return object_of(handle, LT_HANDLE) ? destroy(handle, LT_HANDLE) : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* Descriptors: created with their arguments (ignored), destroyed. */
EXPORT cublasStatus_t cublasLtMatmulDescCreate(void **desc, int compute_type, int scale_type);
EXPORT cublasStatus_t cublasLtMatmulDescCreate(void **desc, int compute_type, int scale_type)
{
    (void)compute_type, (void)scale_type;
    return create(desc, LT_MATMUL);
}

EXPORT cublasStatus_t cublasLtMatmulDescDestroy(void *desc);
EXPORT cublasStatus_t cublasLtMatmulDescDestroy(void *desc)
{
    return destroy(desc, LT_MATMUL);
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(void **layout, int type, uint64_t rows, uint64_t cols,
                                                 int64_t ld);
EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(void **layout, int type, uint64_t rows, uint64_t cols,
                                                 int64_t ld)
{
    (void)type, (void)rows, (void)cols, (void)ld;
    return create(layout, LT_LAYOUT);
}

EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(void *layout);
EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(void *layout)
{
    return destroy(layout, LT_LAYOUT);
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(void **pref);
EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(void **pref)
{
    return create(pref, LT_PREFERENCE);
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(void *pref);
EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(void *pref)
{
    return destroy(pref, LT_PREFERENCE);
}

/* cublasLtMatmulHeuristicResult_t (cublasLt.h): an opaque algorithm, the
 * workspace it needs, its state, its waves. */
struct heuristic {
    uint64_t algo[8];
    size_t workspace_size;
    cublasStatus_t state;
    float waves;
    int reserved[4];
};
_Static_assert(sizeof(struct heuristic) == 96, "cublasLtMatmulHeuristicResult_t is 96 bytes");

/* One algorithm that needs no workspace: PyTorch takes the first and
 * refuses to go on with none. */
EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(void *handle, void *op, void *a, void *b, void *c,
                                                     void *d, void *pref, int requested,
                                                     struct heuristic *results, int *returned);
EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(void *handle, void *op, void *a, void *b, void *c,
                                                     void *d, void *pref, int requested,
                                                     struct heuristic *results, int *returned)
{
    if (!lt_handle(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!object_of(op, LT_MATMUL) || !object_of(a, LT_LAYOUT) || !object_of(b, LT_LAYOUT) ||
        !object_of(c, LT_LAYOUT) || !object_of(d, LT_LAYOUT) || !object_of(pref, LT_PREFERENCE) ||
        requested <= 0 || !results || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(&results[0], 0, sizeof results[0]);
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].waves = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

#endif /* FAKE_LT */
