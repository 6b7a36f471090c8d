# Test artefacts for shim/probe/pyframes.c and shim/probe/elfsym.c, included by the top
# Makefile. Uses $(BUILD), $(CC), $(CFLAGS), $(LDFLAGS), $(SANFLAGS).
#
#   tests/pyframes/libpyprobe.so  pyframes.c behind a few functions that
#                                 Python calls through ctypes
#   tests/pyframes/embed          an interpreter embedded RTLD_LOCAL
#   tests/pyframes/libpython-fake*.so  fake interpreters, right and wrong
#   tests/elfsym/libsym.so        static, exported, aligned functions
#   tests/elfsym/libsym_stripped.so  the same, strip --strip-all (.dynsym only)
#   tests/elfsym/libsymcxx.so     C++ functions (g++)
#   tests/elfsym/nopie            a non-PIE program naming its own functions

PYF_DIR    := $(BUILD)/tests/pyframes
ELFSYM_DIR := $(BUILD)/tests/elfsym
CXX        ?= g++
# The test libraries keep their functions in source order, uninstrumented:
# their layout is what the test is about.
SYMLIB_FLAGS := -O2 -g -fPIC -shared -fno-toplevel-reorder -fno-reorder-functions \
                -fno-inline -Wall -Wextra -Werror
PYFRAMES_TEST := $(PYF_DIR)/libpyprobe.so $(PYF_DIR)/embed $(ELFSYM_DIR)/libsym.so \
                 $(ELFSYM_DIR)/libsym_stripped.so $(ELFSYM_DIR)/libsymcxx.so $(ELFSYM_DIR)/nopie \
                 $(PYF_DIR)/libpython-fake.so $(PYF_DIR)/libpython-fake310.so

$(PYF_DIR) $(ELFSYM_DIR):
	mkdir -p $@

$(PYF_DIR)/libpyprobe.so: tests/pyframes/pyprobe.c shim/probe/pyframes.c shim/prim/prim.c shim/probe/pyframes.h \
                          shim/prim/prim.h | $(PYF_DIR)
	$(CC) $(CFLAGS) -fvisibility=hidden -shared -DGG_TESTING $(SHIM_INC) $(filter %.c,$^) -o $@ $(LDFLAGS) -ldl

$(PYF_DIR)/embed: tests/pyframes/embed.c shim/probe/pyframes.c shim/prim/prim.c shim/probe/pyframes.h shim/prim/prim.h \
                  | $(PYF_DIR)
	$(CC) $(CFLAGS) -DGG_TESTING $(SHIM_INC) $(filter %.c,$^) -o $@ $(LDFLAGS) -ldl -lpthread

$(ELFSYM_DIR)/libsym.so: tests/elfsym/symlib.c | $(ELFSYM_DIR)
	$(CC) $(SYMLIB_FLAGS) $< -o $@

$(ELFSYM_DIR)/libsym_stripped.so: tests/elfsym/symlib.c | $(ELFSYM_DIR)
	$(CC) $(SYMLIB_FLAGS) -Wl,-soname,libsym_stripped.so $< -o $@.tmp
	strip --strip-all $@.tmp -o $@ && rm -f $@.tmp

$(ELFSYM_DIR)/libsymcxx.so: tests/elfsym/symlib.cpp | $(ELFSYM_DIR)
	$(CXX) $(SYMLIB_FLAGS) $< -o $@

$(ELFSYM_DIR)/nopie: tests/elfsym/nopie.c shim/probe/elfsym.c shim/prim/prim.c shim/probe/elfsym.h shim/prim/prim.h \
                     | $(ELFSYM_DIR)
	$(CC) $(filter-out -fPIC,$(CFLAGS)) -fno-pie -no-pie $(SHIM_INC) $(filter %.c,$^) -o $@ \
	  $(LDFLAGS) -ldl

# Fake interpreters for the guard tests in tests/unit/test_pyframes.c.
FAKEPY_LIBS := $(PYF_DIR)/libpython-fake.so $(PYF_DIR)/libpython-fake310.so
$(PYF_DIR)/libpython-fake.so: tests/pyframes/fakepy.c tests/pyframes/fakepy.h | $(PYF_DIR)
	$(CC) $(SYMLIB_FLAGS) $< -o $@
$(PYF_DIR)/libpython-fake310.so: tests/pyframes/fakepy.c tests/pyframes/fakepy.h | $(PYF_DIR)
	$(CC) $(SYMLIB_FLAGS) -DFAKE_PY310 $< -o $@
$(BUILD)/tests/unit/test_pyframes: tests/pyframes/fakepy.h | $(FAKEPY_LIBS)

# The unit test loads the libraries and runs nopie.
$(BUILD)/tests/unit/test_elfsym: | $(ELFSYM_DIR)/libsym.so $(ELFSYM_DIR)/libsym_stripped.so \
                                   $(ELFSYM_DIR)/libsymcxx.so $(ELFSYM_DIR)/nopie
