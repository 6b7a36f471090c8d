# The test-only fakes, included by the top Makefile after sim/sim.mk (the
# simulated driver, runtimes, NVML, cuBLAS and cuDNN, built into the same
# $(BUILD)/fake); see tests/fake/README.md.
#
#   libplugin12/13.so an extension linked against one runtime (tests/fake/plugin.c)
#   libtorchlike.so   PyTorch-like caching allocator, needs libcudart.so.13
#   libnccllike.so    NCCL-like library, no runtime, dlopens libcuda.so.1
#
# and the test programs that do not link the fake runtime:
#   tests/progs/drvprog   linked with -lcuda, no runtime
#   tests/progs/srtlike   its own runtime, the driver found as NVIDIA's static one does
#   tests/progs/nvccprog  plain nvcc, NVIDIA's static runtime (only where nvcc exists)

FAKE_TORCH  := $(FAKE_DIR)/libtorchlike.so
FAKE_NCCL   := $(FAKE_DIR)/libnccllike.so
FAKE_PLUGINS := $(FAKE_DIR)/libplugin12.so $(FAKE_DIR)/libplugin13.so
FAKE_LIBS   := $(SIM_LIBS) $(FAKE_DIR)/libcuda.so $(FAKE_DIR)/libcudart.so $(FAKE_TORCH) \
               $(FAKE_NCCL) $(FAKE_PLUGINS)

$(FAKE_DIR)/libplugin%.so: tests/fake/plugin.c $(FAKE_DIR)/libcudart.so.% | $(BUILD)/fake
	$(CC) $(CFLAGS) $(CUDA_INC) -shared $< -o $@ $(LDFLAGS) -L$(FAKE_DIR) \
	  -l:libcudart.so.$* -Wl,-rpath,'$$ORIGIN' -ldl

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

