/* plugin.c - an extension linked against one CUDA runtime (built twice, as
 * libplugin12.so and libplugin13.so): what a CUDA 12 extension beside a CUDA
 * 13 PyTorch looks like. Its calls must reach its own runtime. */
#include <cuda_runtime_api.h>
#include <stddef.h>

int plugin_alloc(size_t size, void **out);
int plugin_free(void *p);
int plugin_setdev(int dev);
int plugin_lasterror(void);
int plugin_runtime_version(void);

int plugin_alloc(size_t size, void **out)
{
    return (int)cudaMalloc(out, size);
}

int plugin_free(void *p)
{
    return (int)cudaFree(p);
}

int plugin_setdev(int dev)
{
    return (int)cudaSetDevice(dev);
}

int plugin_lasterror(void)
{
    return (int)cudaGetLastError();
}

int plugin_runtime_version(void)
{
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
}
