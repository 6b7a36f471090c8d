/* arrays.h - layer 1: the device bytes of a CUDA array, from its extent and
 * format (nothing device-side invisible: docs/how-it-works.md).
 *
 * An array (cudaMallocArray, cudaMalloc3DArray, cuArrayCreate,
 * cuArray3DCreate), or a mipmapped one (cudaMallocMipmappedArray,
 * cuMipmappedArrayCreate), holds width x max(height, 1) x max(depth, 1)
 * elements per mip level, each level halving width, height and (unless
 * layered or a cubemap, whose depth counts layers) depth, at least 1; the
 * sum is rounded up to 512 bytes. Sparse and deferred-mapping arrays hold
 * nothing themselves (their memory comes from cuMemCreate when mapped).
 * The device pads real arrays for its texture layout, so these are the
 * bytes the caller asked for, as the test rig charges them: what the guard
 * judges before the call; a reading of the device corrects the estimate.
 *
 * Pure functions: no state, no I/O. An extent the driver rejects (a zero
 * width, a depth without a height unless layered, a cubemap that is not
 * square with 6 faces per layer, more levels than the extent has, a format
 * of unknown size, any overflow) has no size: the hook passes the call
 * through uncounted and the driver's own error reaches the caller.
 */
#ifndef GG_ARRAYS_H
#define GG_ARRAYS_H

#include <stdbool.h>
#include <stdint.h>

/* The CUDA_ARRAY3D_* / cudaArray* flags that change the size (both APIs
 * share the values). */
#define GG_ARRAY_LAYERED 0x01u
#define GG_ARRAY_CUBEMAP 0x04u
#define GG_ARRAY_SPARSE 0x40u
#define GG_ARRAY_DEFERRED 0x80u

/* Bytes of an array of `levels` mip levels (1: a plain array) whose
 * elements are `elem` bytes; false when the driver would reject it. */
bool gg_array_bytes(uint64_t width, uint64_t height, uint64_t depth, uint64_t elem,
                    unsigned flags, unsigned levels, uint64_t *out);

/* Bytes of one element of a driver array format (CUarray_format) with
 * `channels` channels; 0 when the format is not one whose size is known. */
uint64_t gg_array_format_bytes(int format, unsigned channels);

/* Bytes of one element of a runtime channel descriptor (bits per channel
 * x, y, z, w); 0 when it is not one the runtime takes (1, 2 or 4 channels
 * of one size). */
uint64_t gg_array_channel_bytes(int x, int y, int z, int w);

#endif /* GG_ARRAYS_H */
