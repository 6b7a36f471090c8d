/*
 * fakecudnn.c - a stand-in for cuDNN 9 (libcudnn.so.9) on the fake GPU.
 *
 * Debian's PyTorch 2.6 CUDA build links libcudnn.so.9, which its
 * nvidia-cudnn package downloads from NVIDIA when installed: the rig
 * declines that download, so nothing would satisfy the link. This library
 * does: it says it is cuDNN 9.0.0 (what Debian's package fetches) for CUDA
 * 12.4, and every other function (cudnn.def) fails with
 * CUDNN_STATUS_NOT_INITIALIZED, so cudnnCreate fails and PyTorch says cuDNN
 * is unusable wherever it tries it (convolutions, RNNs, batch norm). Linear
 * layers, attention, LayerNorm and GELU do not use cuDNN.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef int cudnnStatus_t;
#define CUDNN_STATUS_SUCCESS         0
#define CUDNN_STATUS_NOT_INITIALIZED 1001
#define CUDNN_STATUS_BAD_PARAM       2000

#define EXPORT __attribute__((visibility("default")))

#define STUB(name)                                  \
    EXPORT cudnnStatus_t name(void);                \
    EXPORT cudnnStatus_t name(void)                 \
    {                                               \
        return CUDNN_STATUS_NOT_INITIALIZED;        \
    }
#include "cudnn.def"
#undef STUB

#define VERSION 90000 /* 9.0.0, major * 10000 + minor * 100 + patch */

EXPORT size_t cudnnGetVersion(void);
EXPORT size_t cudnnGetVersion(void)
{
    return VERSION;
}

EXPORT size_t cudnnGetCudartVersion(void);
EXPORT size_t cudnnGetCudartVersion(void)
{
    return 12040;
}

/* libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2. */
EXPORT cudnnStatus_t cudnnGetProperty(int type, int *value);
EXPORT cudnnStatus_t cudnnGetProperty(int type, int *value)
{
    if (!value || type < 0 || type > 2)
        return CUDNN_STATUS_BAD_PARAM;
    *value = type == 0 ? VERSION / 10000 : type == 1 ? VERSION / 100 % 100 : VERSION % 100;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT const char *cudnnGetErrorString(cudnnStatus_t status);
EXPORT const char *cudnnGetErrorString(cudnnStatus_t status)
{
    switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    default: return "CUDNN_UNKNOWN_STATUS_FOUND";
    }
}

EXPORT void cudnnGetLastErrorString(char *message, size_t max_size);
EXPORT void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (message && max_size)
        snprintf(message, max_size, "%s", "cuDNN is a stand-in on the fake GPU: not initialised");
}
