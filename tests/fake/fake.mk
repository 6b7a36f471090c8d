# The fake CUDA stack (no GPU needed), included by the top Makefile.
# Uses $(BUILD), $(CC), $(CFLAGS), $(CUDA_INC), $(LDFLAGS); see tests/fake/README.md.
#
#   libcuda.so.1      fake driver (SONAME libcuda.so.1) + libcuda.so link
#   libcudart.so.13   fake runtime, -Bsymbolic, no DT_NEEDED on libcuda,
#                     dlopens libcuda.so.1 (RUNPATH $ORIGIN) + libcudart.so link;
#                     symbols versioned libcudart.so.13, as the real one's are
#   libcudart.so.12   the same source as a CUDA 12.8 runtime (version node
#                     libcudart.so.12): two runtimes in one process
#   libplugin12/13.so an extension linked against one runtime (tests/fake/plugin.c)
#   libtorchlike.so   PyTorch-like caching allocator, needs libcudart.so.13
#   libnccllike.so    NCCL-like library, no runtime, dlopens libcuda.so.1
#   libnvidia-ml.so.1 NVML, answering from the fake driver
#   libcublas.so.12, libcublasLt.so.12, libcudnn.so.9
#                     stand-ins for the libraries real PyTorch links
#
# and the test programs that do not link the fake runtime:
#   tests/progs/drvprog   linked with -lcuda, no runtime
#   tests/progs/srtlike   its own runtime, the driver found as NVIDIA's static one does
#   tests/progs/nvccprog  plain nvcc, NVIDIA's static runtime (only where nvcc exists)

FAKE_DIR    := $(BUILD)/fake
FAKE_CUDA   := $(FAKE_DIR)/libcuda.so.1
FAKE_CUDART := $(FAKE_DIR)/libcudart.so.13
FAKE_CUDART12 := $(FAKE_DIR)/libcudart.so.12
FAKE_TORCH  := $(FAKE_DIR)/libtorchlike.so
FAKE_NCCL   := $(FAKE_DIR)/libnccllike.so
FAKE_PLUGINS := $(FAKE_DIR)/libplugin12.so $(FAKE_DIR)/libplugin13.so
# What real PyTorch needs besides the runtime and the driver (tests/torch):
# NVML, and stand-ins for cuBLAS, cuBLASLt and cuDNN.
FAKE_NVML   := $(FAKE_DIR)/libnvidia-ml.so.1
FAKE_BLAS   := $(FAKE_DIR)/libcublas.so.12 $(FAKE_DIR)/libcublasLt.so.12
FAKE_CUDNN  := $(FAKE_DIR)/libcudnn.so.9
FAKE_LIBS   := $(FAKE_CUDA) $(FAKE_DIR)/libcuda.so $(FAKE_CUDART) $(FAKE_DIR)/libcudart.so \
               $(FAKE_CUDART12) $(FAKE_TORCH) $(FAKE_NCCL) $(FAKE_PLUGINS) $(FAKE_NVML) \
               $(FAKE_BLAS) $(FAKE_CUDNN)

FAKE_CUDA_SRC := tests/fake/fakecuda.c tests/fake/fakecuda_props.c tests/fake/fakecuda_exec.c
$(FAKE_CUDA): $(FAKE_CUDA_SRC) tests/fake/fakecuda.h | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared -Wl,-soname,libcuda.so.1 $(FAKE_CUDA_SRC) -o $@ \
	  $(LDFLAGS) -lpthread

$(FAKE_DIR)/libcuda.so: $(FAKE_CUDA)
	ln -sf libcuda.so.1 $@

# A runtime of version V: soname libcudart.so.V, every symbol in node
# libcudart.so.V.
define fake_cudart
	printf 'libcudart.so.%s { global: *; };\n' $(1) > $@.map
	$(CC) $(CFLAGS) $(CUDA_INC) -DRT_VERSION=$(2) -shared -Wl,-soname,libcudart.so.$(1) \
	  -Wl,-Bsymbolic -Wl,--version-script=$@.map -Wl,-rpath,'$$ORIGIN' $(FAKE_CUDART_SRC) -o $@ \
	  $(LDFLAGS) -ldl -lpthread
	@! readelf -d $@ | grep -q 'NEEDED.*libcuda\.so' || \
	  { echo "fake: $@ must not need libcuda" >&2; rm -f $@; exit 1; }
endef

FAKE_CUDART_SRC := tests/fake/fakecudart.c tests/fake/fakecudart_exec.c
$(FAKE_CUDART): $(FAKE_CUDART_SRC) tests/fake/fakecudart.h | $(BUILD)/fake
	$(call fake_cudart,13,13000)

$(FAKE_CUDART12): $(FAKE_CUDART_SRC) tests/fake/fakecudart.h | $(BUILD)/fake
	$(call fake_cudart,12,12080)

$(FAKE_DIR)/libplugin%.so: tests/fake/plugin.c $(FAKE_DIR)/libcudart.so.% | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared $< -o $@ $(LDFLAGS) -L$(FAKE_DIR) \
	  -l:libcudart.so.$* -Wl,-rpath,'$$ORIGIN' -ldl

$(FAKE_DIR)/libcudart.so: $(FAKE_CUDART)
	ln -sf libcudart.so.13 $@

$(FAKE_TORCH): tests/fake/torchlike.c $(FAKE_CUDART) | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared $< -o $@ $(LDFLAGS) \
	  -L$(FAKE_DIR) -l:libcudart.so.13 -Wl,-rpath,'$$ORIGIN' -lpthread

$(FAKE_NCCL): tests/fake/nccllike.c | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared $< -o $@ $(LDFLAGS) -Wl,-rpath,'$$ORIGIN' -ldl -lpthread

# Test programs load the driver and the NCCL-like library at run time.
$(BUILD)/tests/progs/script: | $(FAKE_CUDA) $(FAKE_NCCL)

# Test programs that bring no fake runtime (their own rules, not the one for
# tests/progs/*.c): drvprog links the driver itself (-lcuda), srtlike carries
# its own runtime and finds the driver as NVIDIA's static runtime does.
$(BUILD)/tests/progs/drvprog: tests/progs/drvprog.c tests/progs/size.h $(FAKE_CUDA) | $(BUILD)/tests/progs
	$(CC) $(CFLAGS) -fno-omit-frame-pointer $(CUDA_INC) $< -o $@ $(LDFLAGS) \
	  -L$(FAKE_DIR) -lcuda -Wl,-rpath,'$$ORIGIN/../../fake'

$(BUILD)/tests/progs/srtlike: tests/progs/srtlike.c tests/progs/rtcmds.h tests/progs/size.h | $(BUILD)/tests/progs \
                              $(FAKE_CUDA)
	$(CC) $(CFLAGS) -fno-omit-frame-pointer $(CUDA_INC) $< -o $@ $(LDFLAGS) -ldl -lpthread

# The same commands built with the real nvcc and its default, static,
# runtime (tests/progs/nvccprog.cu). Without nvcc nothing is built and the
# tests that need it say so.
NVCC      ?= $(CUDA_HOME)/bin/nvcc
NVCC_PROG := $(BUILD)/tests/progs/nvccprog
$(NVCC_PROG): tests/progs/nvccprog.cu tests/progs/rtcmds.h tests/progs/size.h | $(BUILD)/tests/progs
	$(NVCC) -o $@ $<
ifneq ($(wildcard $(NVCC)),)
$(BUILD)/tests/progs/srtlike: | $(NVCC_PROG)
endif

# Libraries with real device code for chosen archs (needs nvcc).
-include tests/arch/arch.mk

# NVML: unversioned names, as the real library's.
$(FAKE_NVML): tests/fake/fakenvml.c | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -fvisibility=hidden -shared -Wl,-soname,libnvidia-ml.so.1 $< -o $@ \
	  $(LDFLAGS) -ldl -lpthread

# A library whose names sit in version node $(1) (as the real one's do):
# soname $(1), exporting the names that match $(2).
define fake_versioned
	printf '%s { global: %s; local: *; };\n' $(1) '$(2)' > $@.map
	$(CC) $(CFLAGS) -fvisibility=hidden $(3) -shared -Wl,-soname,$(1) -Wl,--version-script=$@.map \
	  $< -o $@ $(LDFLAGS)
endef

$(FAKE_DIR)/libcublas.so.12: tests/fake/fakecublas.c tests/fake/cublas.def | $(BUILD)/fake
	$(call fake_versioned,libcublas.so.12,cublas*)

$(FAKE_DIR)/libcublasLt.so.12: tests/fake/fakecublas.c tests/fake/cublas.def | $(BUILD)/fake
	$(call fake_versioned,libcublasLt.so.12,cublasLt*,-DFAKE_LT)

$(FAKE_CUDNN): tests/fake/fakecudnn.c tests/fake/cudnn.def | $(BUILD)/fake
	$(call fake_versioned,libcudnn.so.9,cudnn*)
