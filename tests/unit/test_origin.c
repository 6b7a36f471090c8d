/* test_origin.c - where a library comes from (shim/base/origin.h), and the fix said
 * in its user's terms (gg_fatbin_fix): dpkg's database and wheels'
 * .dist-info directories made here, in a temporary directory. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fatbin.h"
#include "origin.h"
#include "unit.h"

static char root[256];

static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++) /* the directories on the way */
        if (*p == '/') {
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                printf("  mkdir %s: %s\n", path, strerror(errno));
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    if (!f) {
        printf("  cannot write %s\n", path);
        return;
    }
    fputs(text, f);
    fclose(f);
}

static const char *at(const char *rel)
{
    static char path[4][512];
    static int i;
    i = (i + 1) % 4;
    snprintf(path[i], sizeof path[i], "%s/%s", root, rel);
    return path[i];
}

static void make_tree(void)
{
    /* dpkg: NCCL and PyTorch as Debian packages them; /lib is /usr/lib */
    put("dpkg/info/libnccl2.list", "/.\n/usr\n/usr/lib/x86_64-linux-gnu/libnccl.so.2.22.3\n"
                                   "/usr/lib/x86_64-linux-gnu/libnccl.so.2");
    put("dpkg/info/libnccl-dev.list", "/usr/lib/x86_64-linux-gnu/libnccl.so\n");
    put("dpkg/info/libtorch-cuda-2.6:amd64.list",
        "/usr/lib/x86_64-linux-gnu/libtorch_cuda.so.2.6.0\n"
        "/usr/lib/x86_64-linux-gnu/libtorch_cuda.so.2.6\n");
    put("dpkg/info/libtorchaudio2.6.list", "/usr/lib/x86_64-linux-gnu/libtorchaudio.so.2.6\n");
    put("dpkg/status", "Package: libnccl-dev\nStatus: install ok installed\nVersion: 9\n\n"
                       "Package: libnccl2\nStatus: install ok installed\nArchitecture: amd64\n"
                       "Source: nvidia-nccl\nVersion: 2.22.3-1-1\nDescription: NCCL\n mine\n\n"
                       "Package: libtorch-cuda-2.6\nArchitecture: arm64\nVersion: 2.6.0+dfsg-1\n\n"
                       "Package: libtorch-cuda-2.6\nArchitecture: amd64\n"
                       "Version: 2.6.0+dfsg-7+b1\n\n"
                       "Package: libtorchaudio2.6\nVersion: 2.6.0-1\n");
    /* wheels: torch, its NCCL (and another CUDA's, which does not list the
     * file), a third party's extension, torchaudio */
    put("site-packages/torch-2.6.0+cu124.dist-info/RECORD",
        "torch/__init__.py,sha256=x,1\ntorch/lib/libtorch_cuda.so,sha256=y,2\n");
    put("site-packages/nvidia_nccl_cu11-2.19.3.dist-info/RECORD",
        "nvidia/nccl/lib/libnccl.so.2.19,sha256=z,3\n");
    put("site-packages/nvidia_nccl_cu12-2.21.5.dist-info/RECORD",
        "nvidia/__init__.py,,\nnvidia/nccl/lib/libnccl.so.2,sha256=z,3");
    put("site-packages/flash_attn-2.7.4.post1.dist-info/RECORD",
        "flash_attn/__init__.py,sha256=a,1\n"
        "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so,sha256=b,2\n");
    put("site-packages/torchaudio-2.6.0.dist-info/RECORD", "torchaudio/lib/libtorchaudio.so,,\n");
}

static void test_debian_packages(void)
{
    struct gg_origin o;
    char s[256];
    CHECK(gg_origin_of("/lib/x86_64-linux-gnu/libnccl.so.2", at("dpkg"), &o));
    CHECK_EQ_U64(o.from, GG_ORIGIN_DEB);
    CHECK_STR(o.package, "libnccl2");
    CHECK_STR(o.version, "2.22.3-1-1");
    CHECK_STR(o.what, "NCCL");
    CHECK(!o.torch);
    gg_origin_source(&o, s, sizeof s);
    CHECK_STR(s, "the Debian package libnccl2 2.22.3-1-1");

    /* a Multi-Arch package: the version of the architecture its list is of */
    CHECK(gg_origin_of("/usr/lib/x86_64-linux-gnu/libtorch_cuda.so.2.6", at("dpkg"), &o));
    CHECK_STR(o.package, "libtorch-cuda-2.6");
    CHECK_STR(o.version, "2.6.0+dfsg-7+b1");
    CHECK(o.torch);

    /* not PyTorch's, though its name begins the same */
    CHECK(gg_origin_of("/usr/lib/x86_64-linux-gnu/libtorchaudio.so.2.6", at("dpkg"), &o));
    CHECK_STR(o.package, "libtorchaudio2.6");
    CHECK(!o.torch && !o.what[0]);

    /* no list names it: what it is, by its name, and nothing else */
    CHECK(!gg_origin_of("/usr/lib/x86_64-linux-gnu/libnccl.so.1", at("dpkg"), &o));
    CHECK_EQ_U64(o.from, GG_ORIGIN_UNKNOWN);
    CHECK_STR(o.what, "NCCL");
    gg_origin_source(&o, s, sizeof s);
    CHECK_STR(s, "");
    CHECK(!gg_origin_of("/usr/lib/libnccl.so.2", at("nowhere"), &o));
}

static void test_wheels(void)
{
    struct gg_origin o;
    char s[256];
    CHECK(gg_origin_of(at("site-packages/torch/lib/libtorch_cuda.so"), at("dpkg"), &o));
    CHECK_EQ_U64(o.from, GG_ORIGIN_WHEEL);
    CHECK_STR(o.package, "torch");
    CHECK_STR(o.version, "2.6.0+cu124");
    CHECK(o.torch);
    gg_origin_source(&o, s, sizeof s);
    CHECK_STR(s, "the wheel torch 2.6.0+cu124");

    /* nvidia/nccl: nvidia-nccl-cu12, the one whose RECORD lists the file */
    CHECK(gg_origin_of(at("site-packages/nvidia/nccl/lib/libnccl.so.2"), at("dpkg"), &o));
    CHECK_STR(o.package, "nvidia-nccl-cu12");
    CHECK_STR(o.version, "2.21.5");
    CHECK_STR(o.what, "NCCL");
    CHECK(!o.torch);
    CHECK_STR(gg_origin_torch_wheel(&o), "nvidia-nccl-cu12");

    /* an extension module at the top of site-packages */
    CHECK(gg_origin_of(at("site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"),
                       at("dpkg"), &o));
    CHECK_STR(o.package, "flash-attn");
    CHECK_STR(o.version, "2.7.4.post1");
    CHECK(!o.torch && !o.what[0]);

    CHECK(gg_origin_of(at("site-packages/torchaudio/lib/libtorchaudio.so"), at("dpkg"), &o));
    CHECK_STR(o.package, "torchaudio");
    CHECK(!o.torch);

    /* in a torch/lib no wheel lists: PyTorch's install, from nothing known */
    CHECK(!gg_origin_of(at("site-packages/torch/lib/libother.so"), at("dpkg"), &o));
    CHECK(o.torch);
    CHECK(!gg_origin_of(at("elsewhere/libx.so"), at("dpkg"), &o));
}

static bool starts(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

static void test_what_is_said(void)
{
    struct gg_origin nccl, torch, ext, plain;
    char s[640], fix[512];
    gg_origin_of(at("site-packages/nvidia/nccl/lib/libnccl.so.2"), at("dpkg"), &nccl);
    gg_origin_of(at("site-packages/torch/lib/libtorch_cuda.so"), at("dpkg"), &torch);
    gg_origin_of(at("site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"),
                 at("dpkg"), &ext);
    gg_origin_of(at("elsewhere/libx.so"), at("dpkg"), &plain);

    gg_origin_describe(&nccl, &torch, s, sizeof s);
    CHECK_STR(s, "It is NCCL, from the wheel nvidia-nccl-cu12 2.21.5, which PyTorch here (the "
                 "wheel torch 2.6.0+cu124) uses for its multi-GPU collectives "
                 "(torch.distributed).");
    gg_origin_describe(&nccl, NULL, s, sizeof s);
    CHECK_STR(s, "It is NCCL, from the wheel nvidia-nccl-cu12 2.21.5.");
    gg_origin_describe(&torch, NULL, s, sizeof s);
    CHECK_STR(s, "It is one of PyTorch's own libraries, from the wheel torch 2.6.0+cu124.");
    gg_origin_describe(&ext, &torch, s, sizeof s);
    CHECK_STR(s, "It comes from the wheel flash-attn 2.7.4.post1.");
    gg_origin_describe(&plain, &torch, s, sizeof s);
    CHECK_STR(s, "");

    /* PyTorch's own, and what PyTorch uses where PyTorch is: another PyTorch */
    gg_fatbin_fix(&torch, true, 12, 0, fix, sizeof fix);
    CHECK_STR(fix, gg_fatbin_torch_fix(12, 0));
    CHECK(strstr(fix, "PyTorch 2.7 or newer built with CUDA 12.8 or newer") != NULL);
    CHECK(strstr(fix, "https://download.pytorch.org/whl/cu128") != NULL);
    gg_fatbin_fix(&nccl, true, 12, 0, fix, sizeof fix);
    CHECK(!strncmp(fix, gg_fatbin_torch_fix(12, 0), strlen(gg_fatbin_torch_fix(12, 0))));
    CHECK(strstr(fix, "its own NCCL (the nvidia-nccl-cu12 wheel)") != NULL);
    /* without PyTorch, a library of a package or wheel: a build of that */
    gg_fatbin_fix(&ext, true, 12, 0, fix, sizeof fix);
    CHECK(starts(fix, "install a build of flash-attn made for sm_120 with CUDA 12.8 or newer, "
                        "or rebuild it (nvcc -gencode arch=compute_120,code=sm_120)"));
    gg_fatbin_fix(&nccl, false, 9, 0, fix, sizeof fix);
    CHECK(starts(fix, "install a build of nvidia-nccl-cu12 made for sm_90 with CUDA 11.8"));
    /* nothing known: rebuild it */
    gg_fatbin_fix(&plain, true, 12, 0, fix, sizeof fix);
    CHECK(starts(fix, "rebuild it for this GPU with CUDA 12.8 or newer (nvcc -gencode "
                        "arch=compute_120,code=sm_120)"));
    gg_fatbin_fix(&plain, false, 5, 2, fix, sizeof fix);
    CHECK(starts(fix, "rebuild it for this GPU (nvcc -gencode arch=compute_52,code=sm_52)"));
}

static void test_first_cuda(void)
{
    CHECK_STR(gg_fatbin_first_cuda(12, 0), "12.8");
    CHECK_STR(gg_fatbin_first_cuda(10, 0), "12.8");
    CHECK_STR(gg_fatbin_first_cuda(9, 0), "11.8");
    CHECK_STR(gg_fatbin_first_cuda(8, 6), "11.1");
    CHECK(gg_fatbin_first_cuda(5, 2) == NULL);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/gg-origin-XXXXXX");
    if (!unit_tmpdir(root)) {
        printf("mkdtemp: %s\n0 passed, 1 failed\n", strerror(errno));
        return 1;
    }
    make_tree();
    RUN(test_debian_packages);
    RUN(test_wheels);
    RUN(test_what_is_said);
    RUN(test_first_cuda);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        printf("  could not remove %s\n", root);
    return unit_done();
}
