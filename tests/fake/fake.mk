# The fake CUDA stack (no GPU needed), included by the top Makefile.
# Uses $(BUILD), $(CC), $(CFLAGS), $(CUDA_INC), $(LDFLAGS); see tests/fake/README.md.
#
#   libcuda.so.1      fake driver (SONAME libcuda.so.1) + libcuda.so link
#   libcudart.so.13   fake runtime, -Bsymbolic, no DT_NEEDED on libcuda,
#                     dlopens libcuda.so.1 (RUNPATH $ORIGIN) + libcudart.so link
#   libtorchlike.so   PyTorch-like caching allocator, needs libcudart.so.13
#   libnccllike.so    NCCL-like library, no runtime, dlopens libcuda.so.1

FAKE_DIR    := $(BUILD)/fake
FAKE_CUDA   := $(FAKE_DIR)/libcuda.so.1
FAKE_CUDART := $(FAKE_DIR)/libcudart.so.13
FAKE_TORCH  := $(FAKE_DIR)/libtorchlike.so
FAKE_NCCL   := $(FAKE_DIR)/libnccllike.so
FAKE_LIBS   := $(FAKE_CUDA) $(FAKE_DIR)/libcuda.so $(FAKE_CUDART) $(FAKE_DIR)/libcudart.so \
               $(FAKE_TORCH) $(FAKE_NCCL)

$(FAKE_CUDA): tests/fake/fakecuda.c | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared -Wl,-soname,libcuda.so.1 $< -o $@ \
	  $(LDFLAGS) -lpthread

$(FAKE_DIR)/libcuda.so: $(FAKE_CUDA)
	ln -sf libcuda.so.1 $@

$(FAKE_CUDART): tests/fake/fakecudart.c | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared -Wl,-soname,libcudart.so.13 -Wl,-Bsymbolic \
	  -Wl,-rpath,'$$ORIGIN' $< -o $@ $(LDFLAGS) -ldl -lpthread
	@! readelf -d $@ | grep -q 'NEEDED.*libcuda\.so' || \
	  { echo "fake: $@ must not need libcuda" >&2; rm -f $@; exit 1; }

$(FAKE_DIR)/libcudart.so: $(FAKE_CUDART)
	ln -sf libcudart.so.13 $@

$(FAKE_TORCH): tests/fake/torchlike.c $(FAKE_CUDART) | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared $< -o $@ $(LDFLAGS) \
	  -L$(FAKE_DIR) -l:libcudart.so.13 -Wl,-rpath,'$$ORIGIN' -lpthread

$(FAKE_NCCL): tests/fake/nccllike.c | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared $< -o $@ $(LDFLAGS) -Wl,-rpath,'$$ORIGIN' -ldl -lpthread

# Test programs load the driver and the NCCL-like library at run time.
$(BUILD)/tests/progs/script: | $(FAKE_CUDA) $(FAKE_NCCL)

# Libraries with real device code for chosen archs (needs nvcc).
-include tests/arch/arch.mk
