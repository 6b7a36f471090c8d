# gpuguard - allocator shim and OOM guard for GPU training.
#
#   make              build/libgpuguard.so and build/gpuguard-check
#   make check        the quick tier, after each edit: unit tests, the Python
#                     package's tests, end-to-end tests under a second (< 1 min)
#   make test         every test (no GPU needed); SANITIZE=1 for ASan+UBSan
#   make test-tsan    the threaded unit tests under ThreadSanitizer
#   make timings      run every test and write tests/slow.txt (what check leaves out)
#   make coverage     the shim's C lines the unit and end-to-end tests run (gcov)
#   make test-gpu     real PyTorch steps on a GPU (skips without one)
#   make torch-rig    build the real-PyTorch rig once (tests/torch: 3-4 min, 3.7 GB)
#   make test-torch   only the real-PyTorch tests (needs the rig)
#   make torch-traces record the golden traces (tests/traces) with the rig
#   make demo         a simulated training run under the guard (TORCH=real:
#                     real PyTorch 2.6 on the fake GPU, with the rig)
#   make bench        what the shim costs (docs/costs.md)
#   make fuzz         the libFuzzer harnesses, FUZZ_SECONDS (60) each (needs clang)
#   make install PREFIX=/usr/local DESTDIR=   (gpuguard-preflight's simulated GPU
#                     in <prefix>/lib/gpuguard/sim)

CUDA_HOME ?= /usr/local/cuda
PREFIX    ?= /usr/local
DESTDIR   ?=
PYTHON    ?= python3

ifeq ($(COVERAGE),1)
# make coverage: the shim's objects count their lines (gcc --coverage)
BUILD     ?= build/cov
SANFLAGS  :=
COVFLAGS  := --coverage
else ifeq ($(SANITIZE),1)
BUILD     ?= build/san
SANFLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
else ifeq ($(SANITIZE),thread)
BUILD     ?= build/tsan
SANFLAGS  := -fsanitize=thread -fno-omit-frame-pointer
else
BUILD     ?= build
SANFLAGS  :=
endif

# The version is written once, as include/gpuguard.h's GPUGUARD_VERSION
# (the journal's start line); gpuguard.pc takes it from there, and a test
# holds the Python package's __version__ to it.
VERSION   := $(shell sed -n 's/^\#define GPUGUARD_VERSION "\(.*\)"$$/\1/p' include/gpuguard.h)

CC        ?= cc
OPT       ?= -O2
CFLAGS    := -std=c11 -D_GNU_SOURCE $(OPT) -g -fPIC -Wall -Wextra -Werror \
             -Wshadow -Wstrict-prototypes -Wmissing-prototypes $(SANFLAGS)
CUDA_INC  := -I$(CUDA_HOME)/include
DEP_CFLAGS := $(shell pkg-config --cflags libunwind inih 2>/dev/null)
# libunwind is not linked: the shim loads it RTLD_LOCAL at run time (stack.c).
DEP_LIBS   := $(shell pkg-config --libs inih 2>/dev/null)
LDFLAGS   := $(SANFLAGS)

# The shim: hidden by default; only the runtime hooks (gpuguard.map), dlsym
# and the gpuguard_* API export. Its modules sit in layers, a folder each
# (shim/LAYERS names them, lowest first); a module includes its headers by
# name, from any layer's folder (the layer check says which it may).
SHIM_LAYERS := $(shell awk '!/^\#/ && NF { print $$2 }' shim/LAYERS)
SHIM_INC  := $(patsubst %,-Ishim/%,$(SHIM_LAYERS))
SHIM_HDRS := $(wildcard shim/*/*.h shim/*/*.def)
SHIM_SRC  := $(sort $(wildcard shim/*/*.c))
SHIM_OBJ  := $(patsubst shim/%.c,$(BUILD)/shim/%.o,$(SHIM_SRC))
# The sources of modules named by their module: $(call shim_src,prim json)
shim_src   = $(foreach m,$(1),$(wildcard shim/*/$(m).c))
SHIM_LIB  := $(BUILD)/libgpuguard.so
SHIM_MAP  := shim/gpuguard.map
# The interposer: what exports CUDA names or overrides dlsym (layer 6, and
# the trampoline). Everything else is the core, for unit tests and tools.
INTERPOSER := hook_runtime hook_driver lookup api trampoline
# Test-only entry points (a module's reset, a probe of its state) are
# compiled only with -DGG_TESTING, so the shipped library leaves them out:
# the modules that have any are built a second time with them, into
# $(BUILD)/shim-testing, for the core archive the unit tests link.
TESTING_SRC := $(shell grep -l '^\#ifdef GG_TESTING' $(SHIM_SRC))
TESTING_OBJ := $(patsubst shim/%.c,$(BUILD)/shim-testing/%.o,$(TESTING_SRC))
CORE_OBJ  := $(filter-out $(foreach m,$(INTERPOSER),$(filter %/$(m).o,$(SHIM_OBJ))) \
               $(patsubst shim/%.c,$(BUILD)/shim/%.o,$(TESTING_SRC)),$(SHIM_OBJ)) $(TESTING_OBJ)
CORE_LIB  := $(BUILD)/libggcore.a

.PHONY: all deps deps-build docs check test unchanged test-unit test-e2e test-tsan test-gpu demo bench fuzz install \
        clean check-deps torch-rig test-torch torch-traces timings coverage coverage-build
all: check-deps $(SHIM_LIB) $(BUILD)/gpuguard-check

# One clear message, with the command that installs what is missing.
check-deps:
	@sh tools/build-aux/deps.sh check "$(CUDA_HOME)"

# `make test` and `make demo` install the Debian packages themselves as root;
# `make test` also Debian's python3-torch, for the helper's tests (it says so,
# and how large, first).
deps:
	@sh tools/build-aux/deps.sh install-test "$(CUDA_HOME)"

deps-build:
	@sh tools/build-aux/deps.sh install "$(CUDA_HOME)"

$(BUILD)/shim/%.o: shim/%.c $(SHIM_HDRS) include/gpuguard.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(COVFLAGS) -fvisibility=hidden -DGPUGUARD_SHIM -Iinclude $(SHIM_INC) $(CUDA_INC) $(DEP_CFLAGS) -c $< -o $@

$(BUILD)/shim-testing/%.o: shim/%.c $(SHIM_HDRS) include/gpuguard.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(COVFLAGS) -fvisibility=hidden -DGPUGUARD_SHIM -DGG_TESTING -Iinclude $(SHIM_INC) $(CUDA_INC) $(DEP_CFLAGS) -c $< -o $@

$(SHIM_LIB): $(SHIM_OBJ) $(SHIM_MAP) shim/LAYERS tools/build-aux/layers.py
	$(CC) -shared -o $@ $(SHIM_OBJ) $(LDFLAGS) $(COVFLAGS) -Wl,-z,defs -Wl,-z,nodelete -Wl,--as-needed \
	  -Wl,--version-script=$(SHIM_MAP) $(DEP_LIBS) -ldl -lpthread -lm
	@! readelf -d $@ | grep -Eq 'NEEDED.*lib(cudart|cuda|unwind)\.so' || \
	  { echo "gpuguard: $@ must not need libcudart, libcuda or libunwind" >&2; rm -f $@; exit 1; }
	@$(PYTHON) tools/build-aux/layers.py shim/LAYERS $(SHIM_OBJ) || { rm -f $@; exit 1; }

$(CORE_LIB): $(CORE_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/tests/unit $(BUILD)/tests/progs $(BUILD)/fake:
	mkdir -p $@

-include sim/sim.mk
-include tests/fake/fake.mk
-include tools/check/check.mk
-include bench/bench.mk
-include tests/pyframes/pyframes.mk
-include tests/fuzz/fuzz.mk
-include tests/traces/traces.mk

# Unit tests: one per module, linked against the core archive.
UNIT_SRC  := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN  := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
$(BUILD)/tests/unit/%: tests/unit/%.c tests/unit/unit.h $(CORE_LIB) | $(BUILD)/tests/unit
	$(CC) $(CFLAGS) -DGG_TESTING -Iinclude $(SHIM_INC) $(CUDA_INC) $(DEP_CFLAGS) $< $(CORE_LIB) -o $@ \
	  $(LDFLAGS) $(COVFLAGS:--coverage=-lgcov) $(DEP_LIBS) -ldl -lpthread -lm

# Test programs: ordinary CUDA applications, linked against the fake runtime.
PROG_SRC  := $(sort $(wildcard tests/progs/*.c))
PROG_BIN  := $(patsubst tests/progs/%.c,$(BUILD)/tests/progs/%,$(PROG_SRC))
$(BUILD)/tests/progs/%: tests/progs/%.c tests/progs/size.h $(FAKE_CUDART) | $(BUILD)/tests/progs
	$(CC) $(CFLAGS) -fno-omit-frame-pointer -Iinclude $(CUDA_INC) $< -o $@ $(LDFLAGS) \
	  -L$(BUILD)/fake -l:libcudart.so.13 -Wl,-rpath,'$$ORIGIN/../../fake' -ldl -lpthread

TEST_DEPS := $(SHIM_LIB) $(BUILD)/gpuguard-check $(FAKE_LIBS) $(UNIT_BIN) $(PROG_BIN) \
             $(PYFRAMES_TEST) $(FUZZ_BIN) $(REPLAY)

# The test runner (tests/run.py) runs tests in parallel, -j the cores by
# default; RUNFLAGS passes it more (-j 4, -k NAME, --plain-rerun build).
# The builds below use the cores too unless make was given its own -j.
NPROC     := $(shell nproc 2>/dev/null || echo 2)
SUBJOBS    = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC))
RUN_TESTS  = GG_BUILD=$(BUILD) GG_SANITIZE=$(SANITIZE) $(PYTHON) tests/run.py

# The developer's loop: the quick tier (docs/testing.md).
check: deps
	@$(MAKE) --no-print-directory $(SUBJOBS) $(TEST_DEPS)
	@$(RUN_TESTS) --quick $(RUNFLAGS)

test: deps
	@$(MAKE) --no-print-directory $(SUBJOBS) $(TEST_DEPS)
	@$(RUN_TESTS) $(RUNFLAGS)

# A refactoring's proof (docs/testing.md): the same runs with the shim of
# BASE (default main, built once in build/unchanged) and of this tree leave
# the same journals, shim lines and reports. RUNFLAGS: -k NAME, -j N.
BASE ?= main
unchanged: deps
	@$(PYTHON) tests/unchanged/unchanged.py --base $(BASE) $(RUNFLAGS)

# Every test, and tests/slow.txt written again from their times.
timings: deps
	@$(MAKE) --no-print-directory $(SUBJOBS) $(TEST_DEPS)
	@$(RUN_TESTS) --write-slow $(RUNFLAGS)

# Coverage of the shim's C by the unit, end-to-end and package tests (not
# the rig's: its processes run in a chroot that cannot write build/cov's
# counters), built into build/cov; a table per file and the total. A figure
# (docs/testing.md), not a gate.
coverage: deps
	@$(MAKE) --no-print-directory $(SUBJOBS) COVERAGE=1 coverage-build
	@find build/cov -name '*.gcda' -delete
	@rc=0; GG_BUILD=build/cov $(PYTHON) tests/run.py --unit --e2e $(RUNFLAGS) || rc=$$?; \
	  $(PYTHON) tools/build-aux/coverage.py build/cov/shim:build/cov/shim-testing $(SHIM_SRC) || rc=$$?; exit $$rc

coverage-build: $(TEST_DEPS)

test-unit: $(UNIT_BIN)
	@$(RUN_TESTS) --unit $(RUNFLAGS)

test-e2e: $(TEST_DEPS)
	@$(RUN_TESTS) --e2e $(RUNFLAGS)

# ThreadSanitizer over the threaded unit tests (ledger, stack table, advice).
test-tsan: deps
	@$(MAKE) --no-print-directory $(SUBJOBS) SANITIZE=thread \
	  $(patsubst $(BUILD)/%,build/tsan/%,$(UNIT_BIN) $(FAKE_LIBS))
	@GG_BUILD=build/tsan GG_SANITIZE=thread $(PYTHON) tests/run.py --unit

# Real PyTorch training steps under the shim (docs/testing.md); skips
# cleanly, and says so, where there is no GPU or no PyTorch.
test-gpu: all $(SIM_LIBS)
	@GG_BUILD=$(BUILD) $(PYTHON) tests/gpu/run_gpu.py

# Real PyTorch 2.6 (Debian's CUDA build) on the fake GPU: the rig is a
# chroot outside the work tree (tests/torch/README.md); `make test` runs its
# tests when it is built.
torch-rig:
	@tests/torch/rig build

test-torch: deps
	@$(MAKE) --no-print-directory $(SUBJOBS) $(TEST_DEPS)
	@$(RUN_TESTS) --torch $(RUNFLAGS)

torch-traces: all
	@$(MAKE) --no-print-directory $(FAKE_LIBS)
	@GG_BUILD=$(BUILD) $(PYTHON) tests/torch/record_traces.py

# TORCH=real: the same story with real PyTorch 2.6 on the fake GPU (the rig).
demo: deps-build
	@$(MAKE) --no-print-directory $(SHIM_LIB) $(FAKE_LIBS)
	@GG_BUILD=$(BUILD) $(PYTHON) tools/demo/demo.py $(if $(filter real,$(TORCH)),--rig)

bench: deps
	@$(MAKE) --no-print-directory OPT=-O2 $(SHIM_LIB) $(FAKE_LIBS) $(BUILD)/bench/bench \
	  $(BUILD)/tests/progs/harden
	@GG_BUILD=$(BUILD) $(PYTHON) bench/run.py
	@GG_BUILD=$(BUILD) $(PYTHON) bench/report_bench.py
	@GG_BUILD=$(BUILD) $(PYTHON) bench/torch_step.py
	@GG_BUILD=$(BUILD) $(PYTHON) bench/torch_view.py
	@GG_BUILD=$(BUILD) $(PYTHON) bench/instrument.py
	@GG_BUILD=$(BUILD) $(PYTHON) bench/torch_sizing.py

# The generated part of docs/journal.md, from shim/core/events.def (a test fails
# when it is not current).
docs:
	@$(PYTHON) tools/build-aux/journal_doc.py

install: all $(SIM_LIBS)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin \
	  $(DESTDIR)$(PREFIX)/share/gpuguard/policy $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard
	install -m 0755 $(SHIM_LIB) $(DESTDIR)$(PREFIX)/lib/libgpuguard.so
	install -m 0644 include/gpuguard.h $(DESTDIR)$(PREFIX)/include/gpuguard.h
	install -m 0644 policy/*.ini $(DESTDIR)$(PREFIX)/share/gpuguard/policy/
	install -d $(DESTDIR)$(PREFIX)/share/gpuguard/dashboards
	install -m 0644 dashboards/*.json $(DESTDIR)$(PREFIX)/share/gpuguard/dashboards/
	install -m 0755 $(BUILD)/gpuguard-check $(DESTDIR)$(PREFIX)/bin/gpuguard-check
	install -m 0755 tools/bin/gpuguard-run $(DESTDIR)$(PREFIX)/bin/gpuguard-run
	install -m 0755 tools/bin/gpuguard-report $(DESTDIR)$(PREFIX)/bin/gpuguard-report
	install -m 0755 tools/bin/gpuguard-preflight $(DESTDIR)$(PREFIX)/bin/gpuguard-preflight
# The simulated GPU (sim/README.md) for gpuguard-preflight, where no loader
# looks: never a directory of the loader's default path or of ld.so.conf (a
# libcuda.so.1 found there by other programs would break every GPU job).
	rm -rf $(DESTDIR)$(PREFIX)/lib/gpuguard/sim
	install -d $(DESTDIR)$(PREFIX)/lib/gpuguard/sim
	install -m 0755 $(SIM_LIBS) $(DESTDIR)$(PREFIX)/lib/gpuguard/sim/
# The helper package exactly as `pip install tools/python` installs it: its
# modules and nothing else (a module an older version had goes away).
	rm -rf $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard
	install -d $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/journal \
	  $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/report \
	  $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/_site \
	  $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/preflight
	install -m 0644 tools/python/gpuguard/*.py $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/
	install -m 0644 tools/python/gpuguard/_site/sitecustomize.py $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/_site/
	install -m 0644 tools/python/gpuguard/journal/*.py $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/journal/
	install -m 0644 tools/python/gpuguard/report/*.py $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/report/
	install -m 0644 tools/python/gpuguard/preflight/*.py $(DESTDIR)$(PREFIX)/share/gpuguard/python/gpuguard/preflight/
# gpuguard's site directory (docs/trainer.md): its sitecustomize and the
# helper package, nothing else; the library puts it on Python's path.
	rm -rf $(DESTDIR)$(PREFIX)/share/gpuguard/site
	install -d $(DESTDIR)$(PREFIX)/share/gpuguard/site
	install -m 0644 tools/python/gpuguard/_site/sitecustomize.py $(DESTDIR)$(PREFIX)/share/gpuguard/site/
	ln -s ../python/gpuguard $(DESTDIR)$(PREFIX)/share/gpuguard/site/gpuguard
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' tools/build-aux/gpuguard.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/gpuguard.pc

clean:
	rm -rf build
