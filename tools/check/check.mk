# check.mk - gpuguard-check, included by the top Makefile.
#
# The shim's own config (layer 2), driver probe (layer 3), fat-binary reader
# and library origins (layer 1) are compiled straight into the tool (not
# taken from the core archive), so gpuguard-check builds on its own and reads
# policies, lists GPUs and judges device code exactly as the shim does, and
# says the fix in the same words. The CUDA driver is dlopen()ed at run time:
# only the toolkit's cuda.h is needed, never libcuda.

CHECK_SHIM := prim values settings inifile policy driver origin fatbin
CHECK_SRC := tools/check/gpuguard-check.c tools/check/check_arch.c \
             $(call shim_src,$(CHECK_SHIM))

$(BUILD)/gpuguard-check: $(CHECK_SRC) $(SHIM_HDRS) tools/check/*.h tools/check/check.mk
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(SHIM_INC) -Iinclude $(CUDA_INC) $(DEP_CFLAGS) $(CHECK_SRC) -o $@ \
	  $(LDFLAGS) -linih -ldl
