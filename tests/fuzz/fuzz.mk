# fuzz.mk - libFuzzer harnesses (tests/fuzz/README.md), included by the top
# Makefile. Built with clang's -fsanitize=fuzzer,address,undefined whatever
# SANITIZE says; where no clang can build them, FUZZ_BIN is empty and the
# test that runs them says so and skips.
#
#   $(BUILD)/fuzz/fuzz_policy   the policy reader (layer 2)
#   $(BUILD)/fuzz/fuzz_json     the journal's JSON writer (layer 1)
#
# `make test` runs each briefly (tests/e2e/test_hardening_input.py, class Fuzzing);
# `make fuzz` for FUZZ_SECONDS each, keeping what it finds in $(BUILD)/fuzz/found/.

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -Wshadow \
                -Wstrict-prototypes -Wmissing-prototypes -fno-omit-frame-pointer \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                $(SHIM_INC) -Iinclude -Itests/fuzz $(DEP_CFLAGS)
# Whether this clang links a fuzzer (it needs compiler-rt's libFuzzer).
FUZZ_OK      := $(shell echo 'int LLVMFuzzerTestOneInput(void) { return 0; }' | \
                  $(FUZZ_CC) -x c -fsanitize=fuzzer,address,undefined - -o /dev/null >/dev/null 2>&1 && echo yes)

FUZZ_POLICY_SRC := tests/fuzz/fuzz_policy.c $(call shim_src,prim values settings inifile policy json)
FUZZ_JSON_SRC   := tests/fuzz/fuzz_json.c shim/base/json.c

ifeq ($(FUZZ_OK),yes)
FUZZ_BIN := $(FUZZ_DIR)/fuzz_policy $(FUZZ_DIR)/fuzz_json
else
FUZZ_BIN :=
endif

$(FUZZ_DIR)/fuzz_policy: $(FUZZ_POLICY_SRC) $(SHIM_HDRS) tests/fuzz/json_check.h tests/fuzz/fuzz.mk
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_POLICY_SRC) -o $@ -linih -lm

$(FUZZ_DIR)/fuzz_json: $(FUZZ_JSON_SRC) shim/base/json.h tests/fuzz/json_check.h tests/fuzz/fuzz.mk
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_JSON_SRC) -o $@ -lm

# The unit test of json.c shares the harnesses' oracle.
$(BUILD)/tests/unit/test_json: tests/fuzz/json_check.h

# Each harness for FUZZ_SECONDS, with tests/fuzz/NAME.dict if there is one:
# new inputs go to $(FUZZ_DIR)/found/NAME (the kept corpus,
# tests/fuzz/corpus/NAME, is only read), a crash to $(FUZZ_DIR)/crash-*, the
# whole output to $(FUZZ_DIR)/NAME.log; stops at the first crash.
fuzz:
	@test "$(FUZZ_OK)" = yes || { echo "fuzz: $(FUZZ_CC) cannot build a libFuzzer harness (install clang)" >&2; exit 2; }
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	@for h in policy json; do \
	  mkdir -p $(FUZZ_DIR)/found/$$h; \
	  echo "fuzz: $$h for $(FUZZ_SECONDS) s"; \
	  dict=; test ! -f tests/fuzz/$$h.dict || dict=-dict=tests/fuzz/$$h.dict; \
	  if ! TMPDIR=$(FUZZ_DIR) $(FUZZ_DIR)/fuzz_$$h -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/ $$dict \
	      $(FUZZ_DIR)/found/$$h tests/fuzz/corpus/$$h >$(FUZZ_DIR)/$$h.log 2>&1; then \
	    tail -n 40 $(FUZZ_DIR)/$$h.log; echo "fuzz: $$h FAILED (log: $(FUZZ_DIR)/$$h.log)"; exit 1; \
	  fi; \
	  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
	    $(FUZZ_DIR)/$$h.log; \
	done
