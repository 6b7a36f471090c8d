/* pyframes.h - the calling thread's own Python frames, read from the
 * interpreter's memory without the GIL and without running Python code
 * (docs/how-it-works.md, "Python frames without the GIL").
 *
 * Two steps, so the allocation path pays only for the first:
 *
 *   struct gg_py_raw raw[64];
 *   int n = gg_py_capture(raw, 64);          // hot: plain loads, no lock, no malloc
 *   ...
 *   struct gg_py_frame f[64];
 *   gg_py_resolve(raw, n, true, f);          // once per new site: file, line, function
 *
 * A raw frame is (code object, instruction offset, identity of that code
 * object): two captures at the same Python line compare equal, so a stack
 * table can key sites on raw frames; a code object freed and another one
 * built at the same address gets another identity, so such a site is not
 * confused with the old one.
 *
 * Resolution names a raw frame from a cache when it can (no interpreter
 * memory read at all); otherwise it reads the code object. Pass live = true
 * when the calling thread is the one that captured the frame and it has not
 * returned to Python since: its frames hold their code objects alive, so
 * they are read directly. With live = false every read of interpreter memory
 * is checked (process_vm_readv on ourselves: about 1 us a read): a code
 * object freed since is not named ("?"), never a crash. So resolve a new
 * site's frames live, in the hook that captured them (about 25 ns a frame,
 * 4 ns from the cache), and keep the result: by the time a summary is
 * written the code may be gone. The strings handed back live in storage this
 * module owns for the life of the process (valid UTF-8, no NUL inside, safe
 * to format into JSON at any later time).
 *
 * Python is found once, on the first call (dlsym(RTLD_DEFAULT), else a loaded
 * libpython*.so found with dl_iterate_phdr, which covers an interpreter
 * embedded RTLD_LOCAL); a process without Python re-checks at most once a
 * second, and only after new objects were loaded. The layout is checked once
 * per process (version, type sizes, 3.13's _Py_DebugOffsets); the first walk
 * that finds frames is made with checked reads, proving the layout on real
 * frames before plain reads are trusted. On any mismatch capture turns off
 * for good, and gg_py_take_error() hands the reason out once, for the journal.
 *
 * Supported: CPython 3.10, 3.11, 3.12, 3.13 release builds with the GIL, on
 * x86-64 (tested). aarch64 is assumed to share every offset used here (LP64,
 * the same alignment rules, little-endian bit fields) but is untested; the
 * checks and the first checked walk would turn capture off if it did not.
 * 3.9 and older, 3.14 and newer, pre-releases, trace-refs and free-threaded
 * builds: no frames and one error message, never a crash.
 */
#ifndef GG_PYFRAMES_H
#define GG_PYFRAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_PY_MAX_DEPTH 128

/* One captured frame. `addr` is the byte offset of the instruction in the
 * code object's bytecode, as PyCode_Addr2Line takes it (may be negative for
 * a frame that has not started); `ident` folds fields of the code object that
 * a different code object at the same address would not share. */
struct gg_py_raw {
    uintptr_t code;
    int32_t addr;
    uint32_t ident;
};

/* A named frame. `line` is 0 when the instruction has no line. */
struct gg_py_frame {
    const char *file;
    const char *func;      /* co_qualname (3.11+), else co_name */
    int line;
};

/* The calling thread's Python frames, innermost first, at most `max`
 * (capped at GG_PY_MAX_DEPTH); returns how many were written. 0 when the
 * process has no Python, the thread has no Python frames, the interpreter is
 * finalizing, or capture is off. Never blocks, allocates or takes the GIL;
 * the first call looks for Python (dlsym, dl_iterate_phdr) and the first walk
 * that finds frames is made with checked reads (slow, once). */
int gg_py_capture(struct gg_py_raw *out, int max);

/* Name n captured frames (see above) into out[0..n); returns how many were
 * named. One that cannot be (the code object is gone or changed, storage is
 * exhausted, capture never ran) gets "?" strings and line 0. Takes a lock
 * (one spin lock of this module, never held across a call out of it). */
int gg_py_resolve(const struct gg_py_raw *f, int n, bool live, struct gg_py_frame *out);

/* Turn capture off for good (GPUGUARD_PYTHON=0, [journal] python = no). */
void gg_py_disable(void);

enum gg_py_state {
    GG_PY_UNKNOWN,      /* not looked for yet */
    GG_PY_ABSENT,       /* no Python in the process (yet) */
    GG_PY_ON,           /* capturing */
    GG_PY_OFF,          /* turned off by gg_py_disable */
    GG_PY_FAILED,       /* unsupported version or layout mismatch: off for good */
};

/* Where capture stands; looks for Python if that was not done yet. */
enum gg_py_state gg_py_state(void);

#ifdef GG_TESTING
/* One line saying what was found and whether frames are captured, e.g.
 * "CPython 3.11.7 (libpython3.11.so.1.0): frames on". Never NULL. */
const char *gg_py_status(void);
#endif

/* The reason capture failed, once per process (NULL before and after):
 * what the journal writes as its one `error` line. */
const char *gg_py_take_error(void);

/* ---- pure parts, exposed for the unit test ------------------------------ */

/* The line of byte offset `addr` in a line table: the 3.11+ location table
 * (gg_py_line_311) or the 3.10 (start delta, line delta) pairs
 * (gg_py_line_310); addr < 0 gives firstlineno, an offset the table does not
 * cover or that has no line gives -1. Never reads past tab[len - 1]. */
int gg_py_line_311(const uint8_t *tab, size_t len, int firstlineno, int addr);
int gg_py_line_310(const uint8_t *tab, size_t len, int firstlineno, int addr);

/* Encode `length` code points of PEP 393 data of width `kind` (1, 2 or 4
 * bytes) as UTF-8 into out (NUL-terminated, cut at a character boundary to
 * fit `size`). Surrogates and invalid code points become U+FFFD, NUL '?'.
 * Returns the bytes written, without the NUL. */
size_t gg_py_utf8(unsigned kind, const void *data, size_t length, char *out, size_t size);

/* The kind (1, 2, 4) of a str object's `state` bit field when the string is
 * compact and ready (so its characters follow the header), else 0; *ascii
 * says whether it is compact ASCII. `ready_bit`: 3.10 and 3.11 have one. */
unsigned gg_py_str_kind(uint32_t state, bool ready_bit, bool *ascii);

#ifdef GG_TESTING
/* For tests: a raw frame for a live code object (address from id(code)) and
 * offset, as capture would record it; false when `code` is not one. A
 * frame's cache entry forgotten (NULL: all; interned strings stay). The next
 * look for a Python loaded later allowed now rather than within a second. */
bool gg_py_test_raw(uintptr_t code, int32_t addr, struct gg_py_raw *out);
void gg_py_test_forget(const struct gg_py_raw *f);
void gg_py_test_rescan_now(void);
#endif

/* The fork story (life.c): the lock is reset in a forked child. */
void gg_py_after_fork(void);

#endif /* GG_PYFRAMES_H */
