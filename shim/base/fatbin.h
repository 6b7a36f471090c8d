/* fatbin.h - what device code a library carries, and what runs it
 * ("no kernel image is available": docs/how-it-works.md,
 * "Device code against the GPU").
 *
 * nvcc puts a library's device code in fat binaries: a 16-byte header
 * (magic 0xBA55ED50, version 1, header size, size of what follows) and
 * entries, each a header (kind 1 PTX or 2 ELF/SASS, its arch sm_XY as the
 * number XY, flags) followed by its payload, which may be compressed. A
 * linked ELF file keeps them back to back in the section `.nv_fatbin`;
 * `__cudaRegisterFatBinary` receives one at a time through a wrapper
 * {int magic 0x466243B1; int version; const void *data; void *extra} whose
 * data points at the fat-binary header.
 *
 * Which fat binaries count. The wrappers sit in the section
 * `.nvFatBinSegment`; the runtime registers what they point at. nvcc's
 * device-link step adds a version-2 wrapper: with -rdc it points at the
 * linked code, without -rdc at a stub with no kernels, built for the
 * link-time archs (SASS only; nvcc 13's default is sm_75). So when version-1
 * wrappers point into .nv_fatbin (whole-program code) and none into
 * __nv_relfatbin (-rdc code), the version-2 targets are stubs and skipped. A file with a .nv_fatbin but no wrappers
 * (cuFFT's libraries) registers nothing through the runtime: its fat
 * binaries are loaded some other way, or not at all, and are not judged.
 *
 * Only headers are read, never payloads. Every offset and length is checked
 * against the section, file or mapping it lies in: a corrupt or truncated
 * input is reported (an error code, its offset, gg_fatbin_strerror()),
 * never a crash. No allocation, no stdio, no global state: the shim uses
 * this inside host processes, gpuguard-check on files.
 *
 * The entry header's flags say more than the kind (measured on nvcc 13.0
 * output, -gencode for sm_90a, sm_100f, sm_120a and their compute_ forms):
 * bit 0x100000 marks arch-specific code (sm_90a, sm_120a: that exact GPU
 * only), bit 0x200000 family-specific code (sm_100f), bit 0x8000 (0x2000
 * before CUDA 12.8) a compressed payload.
 */
#ifndef GG_FATBIN_H
#define GG_FATBIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_FATBIN_MAGIC 0xBA55ED50u
#define GG_FATBIN_WRAPPER_MAGIC 0x466243B1u

enum gg_fatbin_kind { GG_FATBIN_PTX = 1, GG_FATBIN_SASS = 2 };

enum gg_fatbin_variant {
    GG_FATBIN_PLAIN = 0,
    GG_FATBIN_ARCH_SPECIFIC = 1, /* sm_90a, compute_90a */
    GG_FATBIN_FAMILY = 2,        /* sm_100f, compute_100f */
};

/* One kind of code: SASS for sm_86, PTX for compute_80, SASS for sm_90a. */
struct gg_fatbin_code {
    uint8_t kind;     /* enum gg_fatbin_kind */
    uint8_t variant;  /* enum gg_fatbin_variant */
    uint16_t arch;    /* major * 10 + minor: 86, 90, 120 */
};

enum gg_fatbin_err {
    GG_FATBIN_OK = 0,
    GG_FATBIN_NONE,     /* no device code here: no .nv_fatbin section */
    GG_FATBIN_UNREGISTERED, /* a .nv_fatbin but no wrappers: nothing the runtime registers */
    GG_FATBIN_EOPEN,    /* the file cannot be opened or read */
    GG_FATBIN_ENOTELF,  /* not a 64-bit little-endian ELF file */
    GG_FATBIN_EELF,     /* ELF section headers outside the file or inconsistent */
    GG_FATBIN_ETRUNC,   /* a header runs past the end of its section or mapping */
    GG_FATBIN_EMAGIC,   /* no fat-binary magic where a fat binary must start */
    GG_FATBIN_EHEADER,  /* a header with impossible sizes */
    GG_FATBIN_EWRAPPER, /* a registration wrapper with a wrong magic or version */
};

#define GG_FATBIN_CODES 64 /* distinct codes kept */

/* What one library (or one fat binary) carries: the distinct codes of all
 * its fat binaries. A library is judged on this union, not fat binary by
 * fat binary: nvcc's device-link step adds a fat binary with no kernels
 * (for the link-time archs, SASS only), and libraries such as
 * flash-attention build some kernels for some archs on purpose; either
 * would make a per-fat-binary verdict cry wolf. */
struct gg_fatbin {
    struct gg_fatbin_code code[GG_FATBIN_CODES]; /* distinct codes, in order first seen */
    unsigned ncode;
    uint64_t fatbins;    /* fat binaries with at least one entry */
    uint64_t entries;    /* entries read */
    uint64_t unknown;    /* entries of other kinds (LTO IR...), or codes past GG_FATBIN_CODES */
    uint64_t stubs;      /* device-link stubs skipped */
    uint64_t size;       /* bytes of device code walked (sections, fat binaries) */
    uint64_t bytes_read; /* header bytes actually read: the cost */
    int err;             /* the first problem, enum gg_fatbin_err */
    uint64_t err_off;    /* where: offset in the file, or in the fat binary in memory */
};

void gg_fatbin_init(struct gg_fatbin *fb);

#ifdef GG_TESTING
/* The fat binaries back to back in [data, data + size), as in a .nv_fatbin
 * section in memory. Returns fb->err (GG_FATBIN_OK when all were read). */
int gg_fatbin_parse(struct gg_fatbin *fb, const void *data, size_t size);
#endif

/* The fat binary a registration wrapper points at. `wrapper_avail` and the
 * data's `data_avail` (see gg_fatbin_wrapper_data) are the readable bytes
 * from each pointer to the end of its mapping. */
int gg_fatbin_wrapper_data(const void *wrapper, size_t wrapper_avail, const void **data);
int gg_fatbin_parse_one(struct gg_fatbin *fb, const void *data, size_t data_avail);

/* Readable memory, for the wrappers' pointers: [lo, hi). */
struct gg_fatbin_range {
    uintptr_t lo, hi;
};

/* The fat binaries of the wrappers found from `first` to `last` (both
 * wrapper addresses, 8-byte steps), as registered in a running process;
 * every wrapper and fat binary must lie inside one of `ranges`. Stubs are
 * not told apart here (that needs the file's sections): lenient. */
int gg_fatbin_parse_wrappers(struct gg_fatbin *fb, const void *first, const void *last,
                             const struct gg_fatbin_range *ranges, unsigned nranges);

/* The .nv_fatbin section of an ELF file, read with pread (no mapping: a
 * file truncated under us gives short reads, never SIGBUS), stubs skipped
 * as above. GG_FATBIN_NONE when the file has no such section,
 * GG_FATBIN_UNREGISTERED when no wrapper registers it. */
int gg_fatbin_read_fd(struct gg_fatbin *fb, int fd);
int gg_fatbin_read_file(struct gg_fatbin *fb, const char *path);

const char *gg_fatbin_strerror(int err);

/* ---- the rule ----------------------------------------------------------- */

/* Whether `c` runs on a GPU of compute capability major.minor:
 *   SASS: same major, minor <= the GPU's (binary compatible upward);
 *   PTX: arch <= the GPU's (the driver JIT-compiles it);
 *   arch-specific (sm_90a): that exact arch only, SASS or PTX;
 *   family-specific (sm_100f): same major, minor <= the GPU's, SASS or PTX.
 * Nothing else runs. */
bool gg_fatbin_runs(struct gg_fatbin_code c, int major, int minor);

/* A library against one GPU. */
struct gg_fatbin_verdict {
    bool any_code;              /* the library carries SASS or PTX at all */
    bool ok;                    /* some of it runs on this GPU */
    struct gg_fatbin_code used; /* what the driver picks: the newest SASS that runs,
                                   else the newest PTX (JIT); kind 0 when none */
};
void gg_fatbin_judge(const struct gg_fatbin *fb, int major, int minor,
                     struct gg_fatbin_verdict *v);

/* "sm_86", "sm_90a", "compute_80", "compute_100f" into out. */
void gg_fatbin_code_name(struct gg_fatbin_code c, char *out, size_t cap);

/* "SASS sm_75 sm_86, PTX compute_86", "SASS sm_80, no PTX", "PTX compute_80,
 * no SASS" or "no device code" into out. */
void gg_fatbin_describe(const struct gg_fatbin *fb, char *out, size_t cap);

/* The first CUDA toolkit whose nvcc builds SASS for sm_XY ("12.8" for 12.0,
 * from NVIDIA's CUDA release notes and the Blackwell compatibility guide,
 * https://docs.nvidia.com/cuda/blackwell-compatibility-guide/), NULL when
 * not known. */
const char *gg_fatbin_first_cuda(int major, int minor);

/* Which PyTorch to install for a GPU (from the arch lists PyTorch's CUDA
 * wheels are built with, https://pytorch.org/get-started/locally/, and the
 * release notes: PyTorch 2.7 is the first with CUDA 12.8 wheels, for
 * Blackwell, https://pytorch.org/blog/pytorch-2-7/): an imperative clause,
 * no period. */
const char *gg_fatbin_torch_fix(int major, int minor);

/* What to do about a library that has no code for sm_XY, in its user's
 * terms (an imperative clause, no period): `lib` says what it is and where
 * it comes from (origin.h), `torch_here` whether the process (or the files
 * judged with it) holds PyTorch. PyTorch's own libraries, and the CUDA
 * libraries PyTorch uses when PyTorch is here: install another PyTorch
 * (whose wheels bring their own NCCL, cuDNN...); a library of another
 * package or wheel: a build of that for the GPU; else rebuild it. */
struct gg_origin;
void gg_fatbin_fix(const struct gg_origin *lib, bool torch_here, int major, int minor, char *out,
                   size_t cap);

#endif /* GG_FATBIN_H */
