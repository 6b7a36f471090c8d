# check.mk - gpuguard-check, included by the top Makefile.
#
# The policy and fat-binary code is compiled straight into the tool (not
# taken from the core archive), so gpuguard-check builds on its own. The CUDA
# driver is dlopen()ed at run time: only the toolkit's cuda.h is needed,
# never libcuda.

CHECK_SRC := tools/check/gpuguard-check.c tools/check/arch.c shim/policy.c shim/fatbin.c

$(BUILD)/gpuguard-check: $(CHECK_SRC) shim/policy.h shim/fatbin.h tools/check/arch.h \
                         tools/check/check.mk
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Ishim -Iinclude $(CUDA_INC) $(DEP_CFLAGS) $(CHECK_SRC) -o $@ \
	  $(LDFLAGS) -linih -ldl
