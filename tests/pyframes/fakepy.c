/* fakepy.c - a fake CPython for the guard tests (see fakepy.h). Offsets are
 * those of real x86-64 release builds (shim/probe/pyframes.c has the table). */
#include "fakepy.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

/* Everything not static is exported (built without -fvisibility=hidden). */
#define TYPE_SIZE 416

_Alignas(16) uint8_t PyCode_Type[TYPE_SIZE], PyUnicode_Type[TYPE_SIZE],
    PyBytes_Type[TYPE_SIZE], PyFrame_Type[TYPE_SIZE], _PyRuntime[4096];

void *PyGILState_GetThisThreadState(void);
int Py_IsInitialized(void);
const char *Py_GetVersion(void);
#ifdef FAKE_PY310
int _Py_IsFinalizing(void);
#else
unsigned long Py_Version;
int Py_IsFinalizing(void);
#endif

static void *tstate;
static int finalizing;
static char version[64];
static uint8_t *inner_code, *inner_frame, *outer_frame, *entry_frame;

void *PyGILState_GetThisThreadState(void) { return tstate; }
int Py_IsInitialized(void) { return 1; }
const char *Py_GetVersion(void) { return version; }
#ifdef FAKE_PY310
int _Py_IsFinalizing(void) { return finalizing; }
#else
int Py_IsFinalizing(void) { return finalizing; }
#endif

void fakepy_finalizing_on(void) { finalizing = 1; }
void fakepy_finalizing_off(void) { finalizing = 0; }
void fakepy_no_tstate(void) { tstate = NULL; }

static uint8_t *page(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void put64(uint8_t *o, unsigned off, uint64_t v) { memcpy(o + off, &v, 8); }
static void put32(uint8_t *o, unsigned off, uint32_t v) { memcpy(o + off, &v, 4); }
static void putp(uint8_t *o, unsigned off, const void *p) { put64(o, off, (uintptr_t)p); }

/* Per-version layout of what is built. */
struct layout {
    int minor;
    unsigned str_ascii, str_compact, code_size, adaptive, firsttraceable;
    unsigned filename, name, qualname, linetable, firstlineno;
};
static struct layout v;

static void type(uint8_t *t, const char *name, uint64_t basicsize)
{
    putp(t, 24, name);
    put64(t, 32, basicsize);
}

/* A compact str: ASCII, or latin-1 when a byte is >= 0x80. */
static uint8_t *str(const char *s)
{
    uint8_t *o = page();
    size_t n = strlen(s);
    bool ascii = true;
    for (size_t i = 0; i < n; i++)
        ascii = ascii && (uint8_t)s[i] < 0x80;
    putp(o, 8, PyUnicode_Type);
    put64(o, 16, n);
    uint32_t state = 1u << 2 | 1u << 5 | (ascii ? 1u << 6 : 0) | (v.minor <= 11 ? 1u << 7 : 0);
    put32(o, 32, state);
    memcpy(o + (ascii ? v.str_ascii : v.str_compact), s, n);
    return o;
}

static uint8_t *bytes(const uint8_t *d, size_t n)
{
    uint8_t *o = page();
    putp(o, 8, PyBytes_Type);
    put64(o, 16, n);
    memcpy(o + 32, d, n);
    return o;
}

/* One location entry for 8 code units, line firstlineno + delta; 3.10: one
 * pair for 16 bytes. */
static uint8_t *code(const char *file, const char *func, int firstlineno, int delta,
                     int firsttraceable)
{
    uint8_t *o = page();
    putp(o, 8, PyCode_Type);
    putp(o, v.filename, str(file));
    putp(o, v.name, str(func));
    put32(o, v.firstlineno, (uint32_t)firstlineno);
    if (v.minor == 10) {
        uint8_t lt[2] = { 16, (uint8_t)delta };
        uint8_t zeros[16] = { 0 };
        putp(o, v.linetable, bytes(lt, 2));
        putp(o, 48, bytes(zeros, 16));                 /* co_code */
    } else {
        uint8_t lt[2] = { 0x80 | 13 << 3 | 7, (uint8_t)(delta * 2) };
        putp(o, v.qualname, str(func));
        putp(o, v.linetable, bytes(lt, 2));
        put64(o, 16, 8);                               /* ob_size: 8 code units */
        put32(o, v.firsttraceable, (uint32_t)firsttraceable);
    }
    return o;
}

/* A frame at instruction byte offset `addr` of `co`. */
static uint8_t *frame(uint8_t *co, uint8_t *prev, int addr, int owner)
{
    uint8_t *f = page();
    if (v.minor == 10) {
        putp(f, 8, PyFrame_Type);
        putp(f, 24, prev);
        putp(f, 32, co);
        put32(f, 96, (uint32_t)(addr / 2));
    } else {
        putp(f, 0, co);
        putp(f, 8, prev);
        putp(f, 56, co ? co + v.adaptive + addr : NULL);
        f[70] = (uint8_t)owner;
    }
    return f;
}

struct debug_offsets_313 {
    char cookie[8];
    uint64_t version, free_threaded, runtime_state[3], interpreter_state[13];
    uint64_t thread_state[9], frame[6], code[10], pyobject[2], type_object[4], tuple_object[3],
        list_object[3], dict_object[3], float_object[2], long_object[3], bytes[3], unicode[4],
        gc[2];
};

static void runtime_313(const char *cookie, uint64_t free_threaded, uint64_t owner_off)
{
    struct debug_offsets_313 d = { .version = 0x030D00F0, .free_threaded = free_threaded,
        .thread_state = { 400, 0, 8, 16, 72, 0, 0, 0, 0 },
        .frame = { 80, 8, 0, 56, 72, owner_off },
        .code = { 208, 112, 120, 128, 136, 68, 0, 0, 0, 200 },
        .pyobject = { 16, 8 }, .bytes = { 33, 16, 32 }, .unicode = { 64, 32, 16, 40 } };
    memcpy(d.cookie, cookie, 8);
    memcpy(_PyRuntime, &d, sizeof d);
}

static void set_version(unsigned long hex, const char *text)
{
#ifndef FAKE_PY310
    Py_Version = hex;
#else
    (void)hex;
#endif
    strcpy(version, text);
}

int fakepy_setup(int scenario)
{
    int minor = scenario == FAKE_313 || (scenario >= FAKE_313_COOKIE &&
                                         scenario <= FAKE_313_OFFSETS) ? 13
              : scenario == FAKE_310 || scenario == FAKE_39 ? 10 : 12;
    if (minor == 10)
        v = (struct layout){ 10, 48, 72, 176, 0, 0, 104, 112, 0, 120, 40 };
    else if (minor == 12)
        v = (struct layout){ 12, 40, 56, 192, 192, 176, 112, 120, 128, 136, 68 };
    else
        v = (struct layout){ 13, 40, 56, 208, 200, 184, 112, 120, 128, 136, 68 };
    type(PyCode_Type, "code", minor == 10 ? 176 : v.adaptive);
    type(PyUnicode_Type, "str", v.str_compact + 8);
    type(PyBytes_Type, "bytes", 33);
    type(PyFrame_Type, "frame", minor == 10 ? 360 : 120);
    switch (scenario) {
    case FAKE_310: set_version(0, "3.10.13 (main, fake)"); break;
    case FAKE_39: set_version(0, "3.9.18 (main, fake)"); break;
    case FAKE_314: set_version(0x030E00F0, "3.14.0"); break;
    case FAKE_PRERELEASE: set_version(0x030C00C1, "3.12.0rc1"); break;
    default: set_version(minor == 13 ? 0x030D00F0 : 0x030C01F0, ""); break;
    }
    if (scenario == FAKE_CODE_SIZE)
        type(PyCode_Type, "code", 200);
    if (scenario == FAKE_TP_NAME_BAD)
        put64(PyCode_Type, 24, 0x10);
    if (minor == 13)
        runtime_313(scenario == FAKE_313_COOKIE ? "xdebugpX" : "xdebugpy",
                    scenario == FAKE_313_FREE_THREADED, scenario == FAKE_313_OFFSETS ? 4000 : 70);

    /* <module> (train.py, line 21) -> C entry frame -> Net.forward
     * (model.py, line 13) -> a frame not started yet. */
    uint8_t *outer_code = code("/m/train.py", "<module>", 20, 1, 0);
    inner_code = code("/m/m\xf6" "del.py", "Net.forward", 10, 3, 0);
    uint8_t *fresh_code = code("/m/x.py", "fresh", 1, 0, 2);
    outer_frame = frame(outer_code, NULL, 4, 0);
    uint8_t *entry = entry_frame = frame(minor == 13 ? str("None") : outer_code, outer_frame, 0, 3);
    inner_frame = frame(inner_code, minor == 10 ? outer_frame : entry, 6, 0);
    uint8_t *top = minor == 10 ? inner_frame : frame(fresh_code, inner_frame, 0, 0);
    uint8_t *ts = page();
    if (minor == 10) {
        putp(ts, 24, top);
    } else if (minor == 12) {
        uint8_t *cframe = page();
        putp(cframe, 0, top);
        putp(ts, 56, cframe);
    } else {
        putp(ts, 72, top);
    }
    switch (scenario) {
    case FAKE_UNMAPPED_FRAME: munmap(outer_frame, 4096); break;
    case FAKE_CYCLE: putp(outer_frame, 8, inner_frame); break;
    case FAKE_MISALIGNED: putp(inner_frame, 8, entry + 4); break;
    case FAKE_NOT_CODE: putp(inner_frame, 0, str("not code")); break;
    case FAKE_BAD_INSTR: putp(inner_frame, 56, inner_code + v.adaptive + 4096); break;
    case FAKE_BAD_OWNER: inner_frame[70] = 9; break;
    case FAKE_BAD_STR: putp(inner_code, v.filename, bytes((const uint8_t *)"x", 1)); break;
    }
    tstate = ts;
    finalizing = 0;
    return 0;
}

void fakepy_free_inner_code(void)
{
    munmap(inner_code, 4096);
}

void fakepy_rename_inner_code(void)
{
    putp(inner_code, v.qualname, str("Other.forward"));
}

void fakepy_misalign_inner(void)
{
    putp(inner_frame, 8, entry_frame + 4);
}
