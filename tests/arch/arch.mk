# arch.mk - libraries with device code for chosen archs, built with the real
# nvcc, for the arch check's tests (docs/how-it-works.md). Included by
# tests/fake/fake.mk. One source, compiled once per arch list, linked with
# the static runtime (nvcc's default) and with the shared one (-cudart
# shared: at run time the fake libcudart.so.13 in LD_LIBRARY_PATH).
#
#   libarch_NAME.so         static runtime
#   libarch_NAME_shared.so  shared runtime
#   libarch_sass80_dlink.so sm_80 code linked without arch flags: nvcc's
#                           device-link stub is sm_75 (and has no kernels)
#   libarch_rdc80.so        -rdc=true: the code is the device-link output
#
# Without nvcc nothing is built and the tests that need these say so.

# nvcc's output does not depend on SANITIZE: it is built once, in build/arch,
# and a sanitized build (build/san, build/tsan, build/cov) copies it.
NVCC     ?= $(CUDA_HOME)/bin/nvcc
ARCH_DIR := $(BUILD)/arch
ARCH_HOME := build/arch
ARCH_CU  := tests/arch/kernels.cu

ARCH_FLAGS_sass80 := -gencode arch=compute_80,code=sm_80
ARCH_FLAGS_ptx80  := -gencode arch=compute_80,code=compute_80
ARCH_FLAGS_multi  := -gencode arch=compute_75,code=sm_75 -gencode arch=compute_86,code=sm_86 \
                     -gencode arch=compute_90,code=sm_90 -Xfatbin -compress-all
ARCH_FLAGS_sm90a  := -gencode arch=compute_90a,code=sm_90a
ARCH_FLAGS_sm120  := -gencode arch=compute_120,code=sm_120
ARCH_FLAGS_rdc80  := -rdc=true -gencode arch=compute_80,code=sm_80

ARCH_NAMES := sass80 ptx80 multi sm90a sm120
ARCH_LIBS  := $(foreach n,$(ARCH_NAMES),$(ARCH_DIR)/libarch_$(n).so $(ARCH_DIR)/libarch_$(n)_shared.so) \
              $(ARCH_DIR)/libarch_sass80_dlink.so $(ARCH_DIR)/libarch_rdc80.so

ifneq ($(wildcard $(NVCC)),)
ARCH_ALL := $(ARCH_LIBS)
endif

$(ARCH_HOME)/k_%.o: $(ARCH_CU) tests/arch/arch.mk
	@mkdir -p $(@D)
	$(NVCC) -c -Xcompiler -fPIC $(ARCH_FLAGS_$*) $< -o $@

$(ARCH_HOME)/libarch_%_shared.so: $(ARCH_HOME)/k_%.o
	$(NVCC) -shared -cudart shared $(ARCH_FLAGS_$*) $< -o $@

$(ARCH_HOME)/libarch_sass80_dlink.so: $(ARCH_HOME)/k_sass80.o
	$(NVCC) -shared $< -o $@

$(ARCH_HOME)/libarch_%.so: $(ARCH_HOME)/k_%.o
	$(NVCC) -shared $(ARCH_FLAGS_$*) $< -o $@

ifneq ($(abspath $(ARCH_DIR)),$(abspath $(ARCH_HOME)))
$(ARCH_DIR)/%.so: $(ARCH_HOME)/%.so
	@mkdir -p $(@D)
	cp -f $< $@
endif

# Built before the tests that read them.
$(BUILD)/tests/unit/test_fatbin $(BUILD)/tests/progs/archprog: | $(ARCH_ALL)

.SECONDARY: $(foreach n,$(ARCH_NAMES) rdc80,$(ARCH_HOME)/k_$(n).o)
