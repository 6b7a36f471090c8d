# The overhead benchmark (docs/costs.md), included by the top Makefile.
# `make bench` builds $(BUILD)/bench/bench and runs bench/run.py, which runs
# it with and without the shim preloaded and prints the table.
#
#   bench/bench.c   the measuring program: an ordinary CUDA application,
#                   linked against the fake runtime like tests/progs
#   bench/run.py    runs it, interleaves repetitions, prints the table and
#                   writes $(BUILD)/bench.json (standard library only)

$(BUILD)/bench:
	mkdir -p $@

$(BUILD)/bench/bench: bench/bench.c $(FAKE_CUDART) | $(BUILD)/bench $(FAKE_CUDA)
	$(CC) $(CFLAGS) -fno-omit-frame-pointer -Iinclude $(CUDA_INC) $< -o $@ $(LDFLAGS) \
	  -L$(BUILD)/fake -l:libcudart.so.13 -Wl,-rpath,'$$ORIGIN/../fake' -ldl -lpthread
