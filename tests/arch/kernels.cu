// Device code for the arch-check tests: tests/arch/arch.mk builds this one
// source for chosen archs (SASS only, PTX only, several, arch-specific),
// each with the static runtime (nvcc's default) and the shared one.
#include <cuda_runtime.h>

__device__ int arch_hits;    // registered with __cudaRegisterVar
__managed__ int arch_shared; // __cudaRegisterManagedVar

__global__ void arch_kernel(int *out)
{
    out[threadIdx.x] = (int)threadIdx.x + arch_shared;
    atomicAdd(&arch_hits, 1);
}

// A runtime call: with the static runtime, its first one starts that
// runtime, which looks the driver up (through the shim's hooks).
extern "C" int arch_alloc(void)
{
    void *p = 0;
    int r = (int)cudaMalloc(&p, 1 << 20);
    if (r == 0)
        r = (int)cudaFree(p);
    return r;
}

extern "C" int arch_launch(void)
{
    arch_kernel<<<1, 32>>>((int *)0);
    return (int)cudaGetLastError();
}
