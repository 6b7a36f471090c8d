/* origin.h - layer 1: where a library comes from, in its user's terms
 * (docs/how-it-works.md, "Device code against the GPU").
 *
 * A library that cannot run on a GPU is fixed by installing another build
 * of what brought it, and its user knows that thing, not the file: "the
 * wheel torch 2.6.0+cu124", "the Debian package libnccl2 2.22.3-1-1". So
 * for a file (the name the loader shows) this finds
 *   - what it is, by its name: one of PyTorch's own libraries (libtorch*,
 *     libc10*) or a CUDA library PyTorch uses (libnccl: NCCL, libcudnn:
 *     cuDNN, ...);
 *   - the Debian package that installed it, from dpkg's database: the
 *     `info/PACKAGE.list` files whose package name starts with the
 *     library's (libnccl.so.2: libnccl2, libtorch_cuda.so.2.6:
 *     libtorch-cuda-2.6) and list the file (as named, or under /usr:
 *     Debian's /lib is /usr/lib), and the package's version from `status`;
 *   - else the wheel, for a file of a site-packages or dist-packages
 *     directory: the `.dist-info` of its top package (torch/: torch-*,
 *     nvidia/nccl/: nvidia_nccl_cu*-*, else the file's leading name) whose
 *     RECORD lists the file; the name and version from the directory's
 *     name (torch-2.6.0+cu124.dist-info).
 * Directory listings and a few text files, read with read(2): for a cold
 * point only (a library found that cannot run), never the allocation path.
 * Nothing found is said as nothing: no guess is shown.
 */
#ifndef GG_ORIGIN_H
#define GG_ORIGIN_H

#include <stdbool.h>
#include <stddef.h>

#define GG_ORIGIN_DPKG "/var/lib/dpkg"

enum gg_origin_from {
    GG_ORIGIN_UNKNOWN = 0,
    GG_ORIGIN_DEB,   /* a Debian package (dpkg) */
    GG_ORIGIN_WHEEL, /* a Python wheel installed by pip */
};

struct gg_origin {
    char what[16];     /* "PyTorch", "NCCL", "cuDNN", ...; "" for another library */
    bool torch;        /* PyTorch's own: by its name, or from a torch wheel or package */
    int from;          /* enum gg_origin_from */
    char package[96];  /* "libnccl2", "torch", "nvidia-nccl-cu12" */
    char version[64];  /* "2.22.3-1-1", "2.6.0+cu124"; "" when not known */
};

/* Where the library at `path` comes from; `dpkg` is dpkg's directory
 * (GG_ORIGIN_DPKG, another for tests). Always fills `o`; false when
 * neither a package nor a wheel was found. */
bool gg_origin_of(const char *path, const char *dpkg, struct gg_origin *o);

/* "the Debian package libnccl2 2.22.3-1-1", "the wheel torch 2.6.0+cu124",
 * "" when not known. */
void gg_origin_source(const struct gg_origin *o, char *out, size_t cap);

/* The wheel PyTorch's CUDA wheels bring the library in ("nvidia-nccl-cu12"
 * for NCCL), NULL for none. */
const char *gg_origin_torch_wheel(const struct gg_origin *o);

/* One sentence on what the library is and where it comes from, and, when
 * `torch` (the process's PyTorch, or NULL) is given and the library is one
 * PyTorch uses, that this PyTorch uses it: "It is NCCL, from the Debian
 * package libnccl2 2.22.3-1-1, which PyTorch here (the Debian package
 * libtorch-cuda-2.6 2.6.0+dfsg-7+b1) uses for torch.distributed's
 * collectives." "" when nothing is known. */
void gg_origin_describe(const struct gg_origin *o, const struct gg_origin *torch, char *out,
                        size_t cap);

#endif /* GG_ORIGIN_H */
