/* gpuguard.h - the C API of libgpuguard.so.
 *
 * The functions are exported by the preloaded library. A C or C++ trainer
 * includes this header and builds with `pkg-config --cflags --libs gpuguard`:
 * it does not link against the shim. Each function below is a static inline
 * wrapper that finds the shim's function at its first call
 * (dlsym(RTLD_DEFAULT, "gpuguard_stats"), ...). So the same binary runs
 *
 *   - under LD_PRELOAD=libgpuguard.so: the calls reach the guard;
 *   - without it: gpuguard_active() is 0, gpuguard_stats() returns -1,
 *     gpuguard_advice() returns 0, and the other functions do nothing.
 *
 * A function the running shim does not export (an older shim without
 * gpuguard_step, say) is treated the same way. Every function is callable
 * from any thread. From Python: ctypes.CDLL(None).gpuguard_stats and so on.
 *
 * Inside the shim (built with -DGPUGUARD_SHIM) the same names are the
 * exported definitions of shim/intercept/api.c.
 */
#ifndef GPUGUARD_H
#define GPUGUARD_H

#define GPUGUARD_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* One GPU as the guard sees it. Sizes in bytes. */
struct gpuguard_stats {
    int dev;                       /* CUDA device ordinal */
    char name[256];                /* CUDA device name */
    unsigned long long total;      /* device memory */
    unsigned long long limit;      /* total - headroom */
    unsigned long long used;       /* device-wide use, last reading + this process since */
    unsigned long long current;    /* bytes this process holds */
    unsigned long long peak;       /* most bytes this process held */
    unsigned long long peak_used;  /* most device-wide use seen */
    unsigned long long allocs, frees, near_misses, refusals, ooms;
};

/* What the guard advises the trainer to run. */
struct gpuguard_advice {
    unsigned seq;                  /* increases with every advice */
    int dev;                       /* the device that asked */
    int batch_size, grad_accum;    /* advised values */
    char reason[32];               /* near_miss, refused, oom, at_min, forecast */
};

/* What a device's policy says of the trainer ([trainer] keys; 0: not
 * given) and which file it is ("" for the built-in defaults). */
struct gpuguard_policy {
    int batch_size, grad_accum;    /* the batch to start from */
    int min_batch_size;            /* advice never goes below it */
    int apply_batch;               /* 1: start from batch_size when the trainer's is larger */
    char file[4096];
};


/* One Python frame, innermost first where a list of them is passed. */
struct gpuguard_pyframe {
    const char *file;              /* the code's file */
    const char *func;              /* its function (qualified name where known) */
    int line;                      /* the line being run */
};

/* What an input of a given size will need (gpuguard_predict): the shim's
 * model of the run, fitted from its steps' (tokens, peak) pairs. Bytes are
 * device-wide, as the near-miss line is. */
struct gpuguard_prediction {
    unsigned long long bytes;      /* the predicted peak of a step with that input */
    unsigned long long margin;     /* what to add before comparing with the line: 2
                                      sigma of the fit, and beyond the largest input
                                      seen 15% of the growth predicted past it */
    unsigned long long line;       /* the device's near-miss line */
    unsigned long long steps;      /* steps the model was fitted from */
    unsigned long long most_tokens; /* the largest input (elements) of those steps */
    int beyond;                    /* 1: the input is larger than any seen */
    int quadratic;                 /* 1: the fit has a quadratic term (the data said so) */
    unsigned long long max_tokens; /* the policy's [trainer] max_tokens: the largest input
                                      per micro-batch known to fit (0: none); filled with
                                      line, also when there is no model yet */
};

/* What the shim asks of PyTorch's instrumentation (gpuguard_torch_attach):
 * PyTorch's view of its memory (why set), and/or its allocation history
 * turned on or off. */
struct gpuguard_torch_request {
    unsigned seq;                  /* the request's number: the answer names it */
    int dev;                       /* the device; -1 when only the history changes */
    char why[16];                  /* near_miss, refused, oom, forecast, leak; "": history only */
    unsigned long long request;    /* bytes of the allocation that came near or failed; 0: none */
    int history;                   /* 1: turn allocation history on first; -1: off after the
                                      view; 0: leave it */
};

/* The callback gpuguard_torch_attach registers. The shim calls it only in
 * the main thread of the main Python interpreter, with the GIL held (a
 * pending call, Py_AddPendingCall) and the process's signals blocked in that
 * thread, never waits for it, and never after gpuguard_torch_detach. What a
 * signal handler raised meanwhile it hands back (gpuguard_torch_raise). */
typedef void (*gpuguard_torch_fn)(const struct gpuguard_torch_request *req);

/* Live blocks of PyTorch's cache allocated from one Python line while its
 * allocation history was on. */
struct gpuguard_torch_tensor {
    unsigned long long bytes;      /* what they hold */
    unsigned long long count;      /* how many */
    const char *op;                /* the op or module that allocated them, or NULL */
    const struct gpuguard_pyframe *frames; /* their Python stack, innermost first */
    int nframes;
};

/* PyTorch's caching allocator on one device, as the instrumentation read it
 * (gpuguard_torch_view). Sizes in bytes. */
struct gpuguard_torch_view {
    unsigned seq;                  /* the request answered; 0: unasked (PyTorch's OOM observer) */
    int dev;                       /* the device */
    char why[16];                  /* "": the request's (unasked: the device's last failure) */
    unsigned long long reserved;   /* memory_stats: reserved_bytes.all.current */
    unsigned long long allocated;  /* allocated_bytes.all.current */
    unsigned long long inactive_split; /* inactive_split_bytes.all.current */
    unsigned long long largest_free;   /* the largest inactive block of the cache */
    unsigned long long request;    /* the failed request's bytes (the OOM observer's); 0: the
                                      request's, or unknown */
    unsigned long long seg_small;  /* segments: the small pool's (2 MiB) */
    unsigned long long seg_large;  /* the large pool's, under 1 GiB */
    unsigned long long seg_huge;   /* the large pool's, 1 GiB or more */
    unsigned long long seg_expandable; /* expandable segments */
    int history;                   /* 1: allocation history was on: tensors[] follow */
    int ntensors;                  /* at most 32, largest first */
    const struct gpuguard_torch_tensor *tensors;
};

#ifdef GPUGUARD_SHIM

/* 0 and *out filled, or -1: no such device, or the guard is not active. */
int gpuguard_stats(int dev, struct gpuguard_stats *out);
/* 1 and *out filled while an advice waits for its ack, else 0. */
int gpuguard_advice(struct gpuguard_advice *out);
/* The trainer has shrunk as advice `seq` said: it becomes the current batch. */
void gpuguard_ack(unsigned seq);
/* What the trainer runs now. */
void gpuguard_set_batch(int batch_size, int grad_accum);
/* The same, saying why (the `batch` event's reason: shape, advice, policy,
 * oom; the first 15 characters kept). A change for "shape" (the batch
 * sized by its input's predicted peak) keeps the step trend. */
void gpuguard_set_batch_why(int batch_size, int grad_accum, const char *why);
/* Attach text (a Python stack, say) to the journal as a `note` event. */
void gpuguard_note(const char *text);
/* A training step ended (docs/trainer.md, "Steps, forecasts and leaks"). */
void gpuguard_step(unsigned long long step);
/* 0 and *out filled with device dev's policy, or -1: no such device, or
 * the guard is not active. */
int gpuguard_policy(int dev, struct gpuguard_policy *out);
/* The input of the step in progress, told before it allocates: its shape
 * dims[0..ndims) (the first 8 kept) and which of them is the batch
 * (batch_dim; -1: not known). Its elements are the step's tokens. Told
 * several times in one step, the largest is the step's. */
void gpuguard_step_shape(const long long *dims, int ndims, int batch_dim);
/* What the step in progress's tensors held at its peak on device dev
 * (PyTorch's allocated bytes at the step's peak), told before
 * gpuguard_step ends the step. */
void gpuguard_step_needed(int dev, unsigned long long bytes);
/* The peak predicted for a step whose input has `tokens` elements on
 * device dev: 0 and *out filled; 1: no model yet (too few steps with a
 * shape, or inputs that do not vary), only out->line and out->steps filled;
 * -1: no such device, or the guard is not active. */
int gpuguard_predict(int dev, unsigned long long tokens, struct gpuguard_prediction *out);
/* The program is ending with an uncaught error (an exception's type and
 * message): the summary carries it. */
void gpuguard_uncaught(const char *what);

/* PyTorch's instrumentation registers fn (gpuguard.torch_instrument): 1 when
 * the shim can ask it through the interpreter (Py_AddPendingCall found),
 * else 0. Detach before the interpreter finalizes. */
int gpuguard_torch_attach(gpuguard_torch_fn fn);
void gpuguard_torch_detach(void);
/* PyTorch's view of its memory: one `torch` journal line. */
void gpuguard_torch_view(const struct gpuguard_torch_view *view);
/* From the callback only: exc (a Python exception object, PyObject *) was
 * raised by a signal handler while the callback worked; the shim raises it
 * into the program when the callback returns, as it would have been raised
 * without gpuguard, and calls the callback no more this time. */
void gpuguard_torch_raise(void *exc);
/* .backward() was called from these Python frames (innermost first) on
 * thread `thread` (NULL: the calling thread's name): a `backward` line. */
void gpuguard_backward(const struct gpuguard_pyframe *frames, int nframes, const char *thread);

#else /* a trainer: find the preloaded shim's functions at run time */

#include <dlfcn.h>
#include <string.h>

#ifdef RTLD_DEFAULT
#define GPUGUARD_RTLD_DEFAULT_ RTLD_DEFAULT
#else
#define GPUGUARD_RTLD_DEFAULT_ ((void *)0) /* glibc's value, when _GNU_SOURCE is not defined */
#endif

/* The shim's `name`, looked up once per slot; NULL when it is not there.
 * The slots are read and written atomically: threads that race here look up
 * the same symbol and store the same value. */
static inline void *gpuguard_resolve_(void **slot, const char *name)
{
    static char missing;
    void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!p) {
        p = dlsym(GPUGUARD_RTLD_DEFAULT_, name);
        if (!p)
            p = &missing;
        __atomic_store_n(slot, p, __ATOMIC_RELEASE);
    }
    return p == (void *)&missing ? (void *)0 : p;
}

/* C++: a function named like its struct (gpuguard_stats) "hides the
 * constructor" for -Wshadow; the C API has these names, so say it once. */
#if defined(__cplusplus) && defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif

/* 0 and *out filled, or -1: no such device, or the guard is not active. */
static inline int gpuguard_stats(int dev, struct gpuguard_stats *out)
{
    static void *slot;
    int (*fn)(int, struct gpuguard_stats *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_stats");
    if (!p)
        return -1;
    memcpy(&fn, &p, sizeof fn);
    return fn(dev, out);
}

/* 1 and *out filled while an advice waits for its ack, else 0. */
static inline int gpuguard_advice(struct gpuguard_advice *out)
{
    static void *slot;
    int (*fn)(struct gpuguard_advice *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_advice");
    if (!p)
        return 0;
    memcpy(&fn, &p, sizeof fn);
    return fn(out);
}

/* 0 and *out filled with device dev's policy, or -1: no such device, the
 * guard is not active, or a shim without this function. */
static inline int gpuguard_policy(int dev, struct gpuguard_policy *out)
{
    static void *slot;
    int (*fn)(int, struct gpuguard_policy *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_policy");
    if (!p)
        return -1;
    memcpy(&fn, &p, sizeof fn);
    return fn(dev, out);
}

#if defined(__cplusplus) && defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* The trainer has shrunk as advice `seq` said: it becomes the current batch. */
static inline void gpuguard_ack(unsigned seq)
{
    static void *slot;
    void (*fn)(unsigned);
    void *p = gpuguard_resolve_(&slot, "gpuguard_ack");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(seq);
    }
}

/* What the trainer runs now. */
static inline void gpuguard_set_batch(int batch_size, int grad_accum)
{
    static void *slot;
    void (*fn)(int, int);
    void *p = gpuguard_resolve_(&slot, "gpuguard_set_batch");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(batch_size, grad_accum);
    }
}

/* The same, saying why (an older shim: without the reason). */
static inline void gpuguard_set_batch_why(int batch_size, int grad_accum, const char *why)
{
    static void *slot;
    void (*fn)(int, int, const char *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_set_batch_why");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(batch_size, grad_accum, why);
    } else {
        gpuguard_set_batch(batch_size, grad_accum);
    }
}

/* Attach text (a Python stack, say) to the journal as a `note` event. */
static inline void gpuguard_note(const char *text)
{
    static void *slot;
    void (*fn)(const char *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_note");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(text);
    }
}

/* A training step ended (docs/trainer.md, "Steps, forecasts and leaks"). */
static inline void gpuguard_step(unsigned long long step)
{
    static void *slot;
    void (*fn)(unsigned long long);
    void *p = gpuguard_resolve_(&slot, "gpuguard_step");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(step);
    }
}

/* The input of the step in progress: its shape and batch dimension. */
static inline void gpuguard_step_shape(const long long *dims, int ndims, int batch_dim)
{
    static void *slot;
    void (*fn)(const long long *, int, int);
    void *p = gpuguard_resolve_(&slot, "gpuguard_step_shape");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(dims, ndims, batch_dim);
    }
}

/* What the step in progress's tensors held at its peak on device dev. */
static inline void gpuguard_step_needed(int dev, unsigned long long bytes)
{
    static void *slot;
    void (*fn)(int, unsigned long long);
    void *p = gpuguard_resolve_(&slot, "gpuguard_step_needed");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(dev, bytes);
    }
}

/* The peak predicted for an input of `tokens` elements on device dev: 0
 * and *out filled, 1: no model yet, -1: no shim, device, or guard. */
static inline int gpuguard_predict(int dev, unsigned long long tokens,
                                   struct gpuguard_prediction *out)
{
    static void *slot;
    int (*fn)(int, unsigned long long, struct gpuguard_prediction *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_predict");
    if (!p)
        return -1;
    memcpy(&fn, &p, sizeof fn);
    return fn(dev, tokens, out);
}

/* The program is ending with an uncaught error. */
static inline void gpuguard_uncaught(const char *what)
{
    static void *slot;
    void (*fn)(const char *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_uncaught");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        fn(what);
    }
}

/* PyTorch's instrumentation registers fn: 1 when the shim can ask it. */
static inline int gpuguard_torch_attach(gpuguard_torch_fn fn)
{
    static void *slot;
    int (*f)(gpuguard_torch_fn);
    void *p = gpuguard_resolve_(&slot, "gpuguard_torch_attach");
    if (!p)
        return 0;
    memcpy(&f, &p, sizeof f);
    return f(fn);
}

/* The shim calls the instrumentation no more. */
static inline void gpuguard_torch_detach(void)
{
    static void *slot;
    void (*f)(void);
    void *p = gpuguard_resolve_(&slot, "gpuguard_torch_detach");
    if (p) {
        memcpy(&f, &p, sizeof f);
        f();
    }
}

/* From the callback: what a signal handler raised, for the program. */
static inline void gpuguard_torch_raise(void *exc)
{
    static void *slot;
    void (*f)(void *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_torch_raise");
    if (p) {
        memcpy(&f, &p, sizeof f);
        f(exc);
    }
}

/* gpuguard_torch_view is named like its struct: see gpuguard_stats. */
#if defined(__cplusplus) && defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif

/* PyTorch's view of its memory: one `torch` journal line. */
static inline void gpuguard_torch_view(const struct gpuguard_torch_view *view)
{
    static void *slot;
    void (*f)(const struct gpuguard_torch_view *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_torch_view");
    if (p) {
        memcpy(&f, &p, sizeof f);
        f(view);
    }
}

#if defined(__cplusplus) && defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* .backward() was called from these Python frames: a `backward` line. */
static inline void gpuguard_backward(const struct gpuguard_pyframe *frames, int nframes,
                                     const char *thread)
{
    static void *slot;
    void (*f)(const struct gpuguard_pyframe *, int, const char *);
    void *p = gpuguard_resolve_(&slot, "gpuguard_backward");
    if (p) {
        memcpy(&f, &p, sizeof f);
        f(frames, nframes, thread);
    }
}

/* 1 when the shim is preloaded (its functions are there), else 0: the
 * same test as the Python helper's `guard.active`. A shim that exports its
 * own gpuguard_active has the last word. */
static inline int gpuguard_active(void)
{
    static void *own, *stats;
    int (*fn)(void);
    void *p = gpuguard_resolve_(&own, "gpuguard_active");
    if (p) {
        memcpy(&fn, &p, sizeof fn);
        return fn();
    }
    return gpuguard_resolve_(&stats, "gpuguard_stats") != (void *)0;
}

#endif /* GPUGUARD_SHIM */

#ifdef __cplusplus
}
#endif
#endif /* GPUGUARD_H */
