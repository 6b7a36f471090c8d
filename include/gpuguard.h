/* gpuguard.h - the C API of libgpuguard.so.
 *
 * These functions are exported by the preloaded library. A program that wants
 * to talk to the guard without linking against it looks them up at run time
 * (dlsym(RTLD_DEFAULT, "gpuguard_stats"), or ctypes.CDLL(None) from Python);
 * when the shim is not preloaded the lookup finds nothing and the program runs
 * unguarded. Every function is callable from any thread.
 */
#ifndef GPUGUARD_H
#define GPUGUARD_H

#ifdef __cplusplus
extern "C" {
#endif

#define GPUGUARD_VERSION "0.1.0"

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
    char reason[32];               /* near_miss, refused, oom, at_min */
};

/* 0 and *out filled, or -1: no such device, or the guard is not active. */
int gpuguard_stats(int dev, struct gpuguard_stats *out);
/* 1 and *out filled while an advice waits for its ack, else 0. */
int gpuguard_advice(struct gpuguard_advice *out);
/* The trainer has shrunk as advice `seq` said: it becomes the current batch. */
void gpuguard_ack(unsigned seq);
/* What the trainer runs now. */
void gpuguard_set_batch(int batch_size, int grad_accum);
/* Attach text (a Python stack, say) to the journal as a `note` event. */
void gpuguard_note(const char *text);

#ifdef __cplusplus
}
#endif
#endif /* GPUGUARD_H */
