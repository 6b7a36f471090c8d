# The simulated GPU stack (sim/README.md): a CUDA driver, runtimes, NVML and
# stand-ins for cuBLAS, cuBLASLt and cuDNN, on which real programs (real
# PyTorch included) run with no GPU and no driver. Included by the top
# Makefile; uses $(BUILD), $(CC), $(CFLAGS), $(CUDA_INC), $(LDFLAGS).
#
#   libcuda.so.1      the driver (SONAME libcuda.so.1) + libcuda.so link
#   libcudart.so.13   the runtime, -Bsymbolic, no DT_NEEDED on libcuda,
#                     dlopens libcuda.so.1 (RUNPATH $ORIGIN) + libcudart.so link;
#                     symbols versioned libcudart.so.13, as the real one's are
#   libcudart.so.12   the same source as a CUDA 12.8 runtime (version node
#                     libcudart.so.12, CUDA 12's structure layouts)
#   libnvidia-ml.so.1 NVML, answering from the driver
#   libcublas.so.12, libcublasLt.so.12, libcublas.so.13, libcublasLt.so.13,
#   libcudnn.so.9     stand-ins for the libraries PyTorch links (CUDA 12 and 13
#                     builds)
#
# Built into $(BUILD)/fake, the directory the tests load them from; `make
# install` puts them in <prefix>/lib/gpuguard/sim, a directory no loader
# searches (a libcuda.so.1 found by other programs would break every GPU
# job on the host): gpuguard-preflight names it for the programs it runs.

FAKE_DIR      := $(BUILD)/fake
FAKE_CUDA     := $(FAKE_DIR)/libcuda.so.1
FAKE_CUDART   := $(FAKE_DIR)/libcudart.so.13
FAKE_CUDART12 := $(FAKE_DIR)/libcudart.so.12
FAKE_NVML     := $(FAKE_DIR)/libnvidia-ml.so.1
FAKE_BLAS     := $(FAKE_DIR)/libcublas.so.12 $(FAKE_DIR)/libcublasLt.so.12 \
                 $(FAKE_DIR)/libcublas.so.13 $(FAKE_DIR)/libcublasLt.so.13
FAKE_CUDNN    := $(FAKE_DIR)/libcudnn.so.9
# What `make install` puts in lib/gpuguard/sim.
SIM_LIBS      := $(FAKE_CUDA) $(FAKE_CUDART) $(FAKE_CUDART12) $(FAKE_NVML) $(FAKE_BLAS) \
                 $(FAKE_CUDNN)

FAKE_CUDA_SRC := sim/fakecuda.c sim/fakecuda_props.c sim/fakecuda_exec.c
$(FAKE_CUDA): $(FAKE_CUDA_SRC) sim/fakecuda.h | $(BUILD)/fake
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

FAKE_CUDART_SRC := sim/fakecudart.c sim/fakecudart_exec.c
$(FAKE_CUDART): $(FAKE_CUDART_SRC) sim/fakecudart.h | $(BUILD)/fake
	$(call fake_cudart,13,13000)

$(FAKE_CUDART12): $(FAKE_CUDART_SRC) sim/fakecudart.h | $(BUILD)/fake
	$(call fake_cudart,12,12080)

$(FAKE_DIR)/libcudart.so: $(FAKE_CUDART)
	ln -sf libcudart.so.13 $@

# NVML: unversioned names, as the real library's.
$(FAKE_NVML): sim/fakenvml.c | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -fvisibility=hidden -shared -Wl,-soname,libnvidia-ml.so.1 $< -o $@ \
	  $(LDFLAGS) -ldl -lpthread

# A library whose names sit in version node $(1) (as the real one's do):
# soname $(1), exporting the names that match $(2).
define fake_versioned
	printf '%s { global: %s; local: *; };\n' $(1) '$(2)' > $@.map
	$(CC) $(CFLAGS) -fvisibility=hidden $(3) -shared -Wl,-soname,$(1) -Wl,--version-script=$@.map \
	  $< -o $@ $(LDFLAGS)
endef

$(FAKE_DIR)/libcublas.so.%: sim/fakecublas.c sim/cublas.def | $(BUILD)/fake
	$(call fake_versioned,libcublas.so.$*,cublas*)

$(FAKE_DIR)/libcublasLt.so.%: sim/fakecublas.c sim/cublas.def | $(BUILD)/fake
	$(call fake_versioned,libcublasLt.so.$*,cublasLt*,-DFAKE_LT)

$(FAKE_CUDNN): sim/fakecudnn.c sim/cudnn.def | $(BUILD)/fake
	$(call fake_versioned,libcudnn.so.9,cudnn*)
