/*
 * nvccprog.cu - host code only, built with plain `nvcc -o nvccprog
 * nvccprog.cu`: NVIDIA's static runtime (libcudart_static.a) is linked in,
 * nothing links libcudart.so or libcuda. Its runtime dlopens libcuda.so.1,
 * takes cuGetProcAddress_v2 and asks it for every driver function it knows,
 * then for the driver's private export tables (cuGetExportTable) before its
 * first call: see tests/fake/README.md for how far it gets on the fake.
 * Commands: tests/progs/rtcmds.h.
 */
#include "rtcmds.h"

int main(int argc, char **argv)
{
    return rt_main("nvccprog", argc, argv);
}
