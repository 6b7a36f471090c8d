/* archprog.c - a CUDA program that loads libraries with device code, for the
 * arch check's tests (docs/how-it-works.md). One command per argument:
 *
 *   load:PATH     dlopen(PATH, RTLD_NOW | RTLD_LOCAL), as Python extensions are
 *   call:SYM      call `int SYM(void)` of the last loaded library; prints "SYM: N"
 *   unload        dlclose the last loaded library
 *   alloc         cudaMalloc + cudaFree of 1 MiB through the linked runtime
 *                 (the program's first CUDA call starts the guard)
 *   unlink:PATH   remove a file (a library replaced on disk while loaded)
 *   modules       prints "modules: N", the fat binaries the linked runtime
 *                 has registered (the fake runtime's count)
 *   lookup:SYM    dlsym(SYM) on libcuda.so.1, as runtimes before CUDA 11.3
 *                 (and PyTorch's VMM code) find the driver
 *   sleep:MS      sleep MS milliseconds
 *   mark:TEXT     "archprog: TEXT" on stderr (where the shim's lines fall)
 *
 * Ends with "archprog: done"; a failed load or a bad command exits 2.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

unsigned fakecudart_modules(void); /* the fake runtime's test hook */

int main(int argc, char **argv)
{
    void *lib = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "load:", 5)) {
            lib = dlopen(a + 5, RTLD_NOW | RTLD_LOCAL);
            if (!lib) {
                fprintf(stderr, "archprog: %s\n", dlerror());
                return 2;
            }
        } else if (!strncmp(a, "call:", 5)) {
            int (*fn)(void) = lib ? (int (*)(void))dlsym(lib, a + 5) : NULL;
            if (!fn) {
                fprintf(stderr, "archprog: no %s\n", a + 5);
                return 2;
            }
            printf("%s: %d\n", a + 5, fn());
        } else if (!strcmp(a, "unload")) {
            if (!lib || dlclose(lib) != 0) {
                fprintf(stderr, "archprog: nothing to unload\n");
                return 2;
            }
            lib = NULL;
        } else if (!strcmp(a, "alloc")) {
            void *p = NULL;
            cudaError_t r = cudaMalloc(&p, 1 << 20);
            if (r == cudaSuccess)
                r = cudaFree(p);
            if (r != cudaSuccess)
                printf("alloc: error %d\n", (int)r);
        } else if (!strncmp(a, "unlink:", 7)) {
            if (unlink(a + 7) != 0) {
                perror(a + 7);
                return 2;
            }
        } else if (!strncmp(a, "lookup:", 7)) {
            void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            if (!cuda || !dlsym(cuda, a + 7)) {
                fprintf(stderr, "archprog: no %s in libcuda.so.1\n", a + 7);
                return 2;
            }
        } else if (!strncmp(a, "sleep:", 6)) {
            struct timespec ts = {atoi(a + 6) / 1000, atoi(a + 6) % 1000 * 1000000L};
            while (nanosleep(&ts, &ts) != 0)
                ;
        } else if (!strncmp(a, "mark:", 5)) {
            fprintf(stderr, "archprog: %s\n", a + 5);
        } else if (!strcmp(a, "modules")) {
            printf("modules: %u\n", fakecudart_modules());
        } else {
            fprintf(stderr, "archprog: bad command %s\n", a);
            return 2;
        }
        fflush(stdout);
    }
    printf("archprog: done\n");
    return 0;
}
