# Golden traces (tests/traces/README.md), included by the top Makefile.
#
#   replay12, replay13   make a golden trace's calls again, linked against the
#                        fake libcudart.so.12 / .13 (a trace says which runtime
#                        its program used): tests/e2e/test_traces.py runs them
#                        under the shim.

REPLAY := $(BUILD)/tests/traces/replay12 $(BUILD)/tests/traces/replay13

$(BUILD)/tests/traces:
	mkdir -p $@

$(BUILD)/tests/traces/replay%: tests/traces/replay.c $(FAKE_DIR)/libcudart.so.% | $(BUILD)/tests/traces $(FAKE_CUDA)
	$(CC) $(CFLAGS) -fno-omit-frame-pointer $(CUDA_INC) $< -o $@ $(LDFLAGS) \
	  -L$(FAKE_DIR) -l:libcudart.so.$* -Wl,-rpath,'$$ORIGIN/../../fake' -ldl
