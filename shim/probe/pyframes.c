/* pyframes.c - the calling thread's own Python frames (see pyframes.h).
 *
 * Why plain loads are safe on the capture path: the calling thread is
 * executing C code, so its frame chain is frozen (only this thread pushes and
 * pops its frames), and every frame holds a strong reference to its code
 * object. The only way a load can fault is a wrong idea of the layout. So
 * the layout is checked once per process (version, type sizes, the 3.13
 * offsets table), and the first walk that finds frames reads every field with
 * process_vm_readv on ourselves, which fails with EFAULT instead of faulting:
 * the layout is proven on this process's real frames before a plain load is
 * trusted. Reads per frame on the plain path: the frame's link, code, owner
 * and instruction fields, and the code object's type, size, first traceable
 * instruction, name and line table pointers; every pointer is checked for
 * alignment and a user-space range first, every code object by exact type
 * identity, and the walk is bounded. Anything unexpected turns capture off
 * for good (said once) rather than guessing. process_vm_readv costs about
 * 1 us a read, so it is kept for the first walk and for late resolution of
 * frames whose code object may be gone.
 *
 * Per version (x86-64 release builds, offsets in bytes):
 *   3.10  tstate->frame (24): PyFrameObject f_back 24, f_code 32, f_lasti 96
 *         (an instruction index); code filename 104, name 112, linetable 120
 *         (pairs), firstlineno 40, co_code 48.
 *   3.11  tstate->cframe (56)->current_frame (8): _PyInterpreterFrame
 *         f_code 32, previous 48, prev_instr 56, owner 69; code filename 112,
 *         qualname 128, linetable 136, firstlineno 72, _co_firsttraceable 168,
 *         co_code_adaptive 184.
 *   3.12  tstate->cframe (56)->current_frame (0): f_code 0, previous 8,
 *         prev_instr 56, owner 70; firstlineno 68, firsttraceable 176,
 *         adaptive 192. Frames owned by the C stack (owner 3) are skipped.
 *   3.13  tstate->current_frame and the frame and code offsets from
 *         _Py_DebugOffsets at the start of _PyRuntime (72; 0, 8, 56, 70;
 *         112, 128, 136, 68, adaptive 200); firsttraceable sits 16 bytes
 *         before co_code_adaptive in 3.11-3.13.
 *   str   length 16, state 32, sizeof ASCII 48 / compact 72 (3.10, 3.11),
 *         40 / 56 (3.12, 3.13). bytes: ob_size 16, ob_sval 32. ob_type 8.
 * Like sys._getframe(), incomplete frames (not yet at their first traceable
 * instruction: 3.12+'s shim frame for __init__ calls) are skipped.
 */
#include "pyframes.h"
#include "prim.h"

#include <dlfcn.h>
#include <link.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- bounds ------------------------------------------------------------ */

#define USER_LIMIT (1ull << 56)     /* above any user-space address */
#define STEP_LIMIT(max) (4 * (max) + 16) /* frames looked at, skipped ones too */
#define FILE_MAX 4096               /* bytes of UTF-8 kept per file name */
#define FUNC_MAX 1024               /* ... per function name */
#define STR_CHARS_MAX 4096          /* code points read from one str */
#define LINETABLE_MAX (1u << 20)    /* longer line tables give line 0 */
#define CODE_HDR 256                /* bytes of a code object read at once */
#define CACHE_BITS 14               /* resolved (code, offset): direct-mapped */
#define INTERN_BITS 16              /* interned strings: half of this */
#define ARENA_CHUNK (1u << 20)
#define ARENA_CHUNKS 32             /* 32 MiB of names */
#define RESCAN_NS 1000000000ull     /* no Python yet: look again at most 1/s */

enum { ST_UNKNOWN, ST_PROBING, ST_ABSENT, ST_ON, ST_OFF, ST_FAILED };
enum { W310 = 10, W311 = 11, W312 = 12, W313 = 13 };
enum { OWNED_BY_GENERATOR = 1, OWNED_BY_CSTACK = 3 };

/* ---- what the probe finds ----------------------------------------------- */

struct layout {
    int walk;                      /* W310 ... W313 */
    uint32_t ts_frame;             /* tstate -> frame / cframe / current_frame */
    int32_t cf_current;            /* cframe -> current_frame, or -1 */
    uint32_t fr_code, fr_prev, fr_instr;
    int32_t fr_owner;              /* -1: no owner field (3.10) */
    uint32_t co_filename, co_func, co_linetable, co_firstlineno;
    uint32_t co_code;              /* 3.10: the co_code bytes object */
    uint32_t co_adaptive, co_firsttraceable; /* 3.11+ */
    uint32_t str_length, str_state, str_ascii, str_compact;
    bool str_ready_bit;
    uint32_t bytes_size, bytes_data;
};

static struct {
    void *(*this_tstate)(void);
    int (*is_finalizing)(void);
    int (*is_initialized)(void);
    uintptr_t code_type, str_type, bytes_type, frame_type;
} g_py;

static struct layout L;
static _Atomic int g_state = ST_UNKNOWN;
static _Atomic int g_verified;          /* the first walk with frames passed */
static bool g_checked_reads;            /* process_vm_readv works here */
static bool g_layout_ok;                /* L holds a checked layout */
static void *g_handle;                  /* pins a dlopen'd libpython */
static char g_status[512] = "Python not looked for yet";
static char g_error[512];
static _Atomic bool g_error_pending;
static _Atomic uint64_t g_next_scan_ns;
static unsigned long long g_adds_seen;
static GG_TLS unsigned t_absent_calls;

/* ---- reading memory ----------------------------------------------------- */

static inline bool ptr_ok(uintptr_t p, uintptr_t align)
{
    return p >= 4096 && p < USER_LIMIT && (p & (align - 1)) == 0;
}

/* Read n bytes at src: a plain copy, or one that fails instead of faulting. */
static bool checked_copy(void *dst, uintptr_t src, size_t n)
{
    struct iovec local = { dst, n }, remote = { (void *)src, n };
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

__attribute__((always_inline)) static inline bool rd(bool checked, void *dst, uintptr_t src,
                                                     size_t n)
{
    if (checked)
        return checked_copy(dst, src, n);
    memcpy(dst, (const void *)src, n);
    return true;
}

__attribute__((always_inline)) static inline bool rd_ptr(bool checked, uintptr_t src,
                                                         uintptr_t *v)
{
    return rd(checked, v, src, sizeof *v);
}

static inline uintptr_t field_ptr(const uint8_t *hdr, uint32_t off)
{
    uintptr_t v;
    memcpy(&v, hdr + off, sizeof v);
    return v;
}

static inline int64_t field_i64(const uint8_t *hdr, uint32_t off)
{
    int64_t v;
    memcpy(&v, hdr + off, sizeof v);
    return v;
}

static inline int32_t field_i32(const uint8_t *hdr, uint32_t off)
{
    int32_t v;
    memcpy(&v, hdr + off, sizeof v);
    return v;
}

/* A code object's identity beyond its address: its name and line table
 * objects (immutable for its life, one cache line in every version). */
static inline uint32_t ident_of(uintptr_t func, uintptr_t linetable)
{
    uint64_t x = (uint64_t)func * 0x9e3779b97f4a7c15ull ^ (uint64_t)linetable;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return (uint32_t)(x >> 32);
}

/* ---- saying things ------------------------------------------------------ */

static void set_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_status(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_status, sizeof g_status, fmt, ap);
    va_end(ap);
}

/* Off for good, with one message for the journal. First failure wins. */
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    int st = atomic_load(&g_state);
    for (;;) {
        if (st == ST_FAILED || st == ST_OFF)
            return;
        /* ST_PROBING is ours: only the probing thread calls fail() then. */
        if (atomic_compare_exchange_weak(&g_state, &st, ST_PROBING) || st == ST_PROBING)
            break;
    }
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(g_error, sizeof g_error, "Python frames off: %s", msg);
    snprintf(g_status, sizeof g_status, "%s", g_error);
    atomic_store(&g_error_pending, true);
    atomic_store(&g_state, ST_FAILED);
}

/* ---- finding Python ----------------------------------------------------- */

#define CANDIDATES 4
struct find_libpython {
    char names[CANDIDATES][512];
    int n;
    unsigned long long adds;
};

/* Copies names only: no dlopen under the loader's lock. */
static int find_libpython_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct find_libpython *f = arg;
    f->adds = info->dlpi_adds;
    const char *name = info->dlpi_name;
    if (!name || !name[0] || f->n >= CANDIDATES)
        return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libpython", 9) != 0 || strlen(name) >= sizeof f->names[0])
        return 0;
    strcpy(f->names[f->n++], name);
    return 0;
}

static int adds_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    *(unsigned long long *)arg = info->dlpi_adds;
    return 1;
}

/* The object that defines PyGILState_GetThisThreadState: a handle for dlsym
 * (RTLD_DEFAULT, which is NULL, when it is the executable), and the file it
 * came from. False when there is none. */
static bool find_python(void **out, char *where, size_t size)
{
    void *sym = dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    void *handle = RTLD_DEFAULT;
    if (!sym) {
        struct find_libpython f = { .n = 0 };
        dl_iterate_phdr(find_libpython_cb, &f);
        g_adds_seen = f.adds;
        for (int i = 0; i < f.n && !sym; i++) {
            void *h = dlopen(f.names[i], RTLD_NOLOAD | RTLD_LAZY);
            if (!h)
                continue;
            sym = dlsym(h, "PyGILState_GetThisThreadState");
            if (sym)
                handle = h;   /* kept: the interpreter can never be unloaded under us */
            else
                dlclose(h);
        }
        if (!sym)
            return false;
    }
    Dl_info info;
    struct link_map *lm = NULL;
    if (dladdr1(sym, &info, (void **)&lm, RTLD_DL_LINKMAP) && info.dli_fname)
        snprintf(where, size, "%s", info.dli_fname);
    /* A global libpython that was dlopen'd could be dlclosed: pin it too. */
    if (handle == RTLD_DEFAULT && lm && lm->l_name && lm->l_name[0]) {
        void *h = dlopen(lm->l_name, RTLD_NOLOAD | RTLD_LAZY);
        if (h)
            handle = h;
    }
    *out = handle;
    return true;
}

/* major, minor, micro and release level (0xF final) of the interpreter. */
struct pyver { int major, minor, micro, level; };

static bool parse_version(const char *s, struct pyver *v)
{
    int n = 0;
    if (sscanf(s, "%d.%d.%d%n", &v->major, &v->minor, &v->micro, &n) != 3)
        return false;
    v->level = (s[n] == 'a' || s[n] == 'b' || s[n] == 'r') ? 0 : 0xF;
    return true;
}

/* Read a type object's tp_name and tp_basicsize (offsets 24 and 32 in every
 * release build; a trace-refs build moves them and fails the check). */
static bool type_is(uintptr_t type, const char *name, int64_t basicsize, char *why, size_t size)
{
    uintptr_t tp_name = 0;
    int64_t bs = 0;
    char got[16] = "";
    bool ok = type && rd(g_checked_reads, &tp_name, type + 24, 8) &&
              rd(g_checked_reads, &bs, type + 32, 8) && ptr_ok(tp_name, 1) &&
              rd(g_checked_reads, got, tp_name, strlen(name) + 1);
    got[sizeof got - 1] = '\0';
    if (ok && strcmp(got, name) == 0 && bs == basicsize)
        return true;
    snprintf(why, size, "type '%s' has size %lld, not %lld", ok ? got : "?", (long long)bs,
             (long long)basicsize);
    return false;
}

/* 3.13: the offsets the interpreter publishes for debuggers. */
struct debug_offsets_313 {
    char cookie[8];
    uint64_t version, free_threaded;
    uint64_t runtime_state[3];
    uint64_t interpreter_state[13];
    struct { uint64_t size, prev, next, interp, current_frame, thread_id, native_thread_id,
             datastack_chunk, status; } thread_state;
    struct { uint64_t size, previous, executable, instr_ptr, localsplus, owner; } frame;
    struct { uint64_t size, filename, name, qualname, linetable, firstlineno, argcount,
             localsplusnames, localspluskinds, co_code_adaptive; } code;
    struct { uint64_t size, ob_type; } pyobject;
    uint64_t type_object[4], tuple_object[3], list_object[3], dict_object[3], float_object[2],
             long_object[3];
    struct { uint64_t size, ob_size, ob_sval; } bytes;
    struct { uint64_t size, state, length, asciiobject_size; } unicode;
    uint64_t gc[2];
};

static bool layout_313(uintptr_t runtime, unsigned long hexversion, char *why, size_t size)
{
    struct debug_offsets_313 d;
    if (!runtime || !rd(g_checked_reads, &d, runtime, sizeof d)) {
        snprintf(why, size, "_PyRuntime unreadable");
        return false;
    }
    if (memcmp(d.cookie, "xdebugpy", 8) != 0 || d.version != hexversion || d.free_threaded) {
        snprintf(why, size, "_Py_DebugOffsets: cookie, version %#llx or free-threaded %llu "
                 "not as expected", (unsigned long long)d.version,
                 (unsigned long long)d.free_threaded);
        return false;
    }
    /* Each offset must lie inside the structure it belongs to. */
    bool ok = d.pyobject.ob_type == 8 &&
              d.thread_state.size < 4096 && d.thread_state.current_frame + 8 <= d.thread_state.size &&
              d.frame.size < 4096 && d.frame.previous + 8 <= d.frame.size &&
              d.frame.executable + 8 <= d.frame.size && d.frame.instr_ptr + 8 <= d.frame.size &&
              d.frame.owner < d.frame.size &&
              /* the code fields are read from the fixed part, before the bytecode */
              d.code.co_code_adaptive <= d.code.size && d.code.co_code_adaptive <= CODE_HDR &&
              d.code.filename + 8 <= d.code.co_code_adaptive &&
              d.code.qualname + 8 <= d.code.co_code_adaptive &&
              d.code.linetable + 8 <= d.code.co_code_adaptive &&
              d.code.firstlineno + 4 <= d.code.co_code_adaptive &&
              d.code.co_code_adaptive >= 24 &&
              d.bytes.ob_size == 16 && d.bytes.ob_sval < 64 &&
              d.unicode.length + 8 <= d.unicode.asciiobject_size &&
              d.unicode.state + 4 <= d.unicode.asciiobject_size && d.unicode.asciiobject_size < 128;
    if (!ok) {
        snprintf(why, size, "_Py_DebugOffsets: offsets out of range");
        return false;
    }
    L = (struct layout){
        .walk = W313, .ts_frame = (uint32_t)d.thread_state.current_frame, .cf_current = -1,
        .fr_code = (uint32_t)d.frame.executable, .fr_prev = (uint32_t)d.frame.previous,
        .fr_instr = (uint32_t)d.frame.instr_ptr, .fr_owner = (int32_t)d.frame.owner,
        .co_filename = (uint32_t)d.code.filename, .co_func = (uint32_t)d.code.qualname,
        .co_linetable = (uint32_t)d.code.linetable, .co_firstlineno = (uint32_t)d.code.firstlineno,
        .co_adaptive = (uint32_t)d.code.co_code_adaptive,
        .co_firsttraceable = (uint32_t)d.code.co_code_adaptive - 16,
        .str_length = (uint32_t)d.unicode.length, .str_state = (uint32_t)d.unicode.state,
        .str_ascii = (uint32_t)d.unicode.asciiobject_size,
        .str_compact = (uint32_t)d.unicode.asciiobject_size + 16, .str_ready_bit = false,
        .bytes_size = (uint32_t)d.bytes.ob_size, .bytes_data = (uint32_t)d.bytes.ob_sval,
    };
    return true;
}

static const struct layout LAYOUT_310 = {
    .walk = W310, .ts_frame = 24, .cf_current = -1, .fr_code = 32, .fr_prev = 24,
    .fr_instr = 96, .fr_owner = -1, .co_filename = 104, .co_func = 112, .co_linetable = 120,
    .co_firstlineno = 40, .co_code = 48, .str_length = 16, .str_state = 32, .str_ascii = 48,
    .str_compact = 72, .str_ready_bit = true, .bytes_size = 16, .bytes_data = 32,
};
static const struct layout LAYOUT_311 = {
    .walk = W311, .ts_frame = 56, .cf_current = 8, .fr_code = 32, .fr_prev = 48,
    .fr_instr = 56, .fr_owner = 69, .co_filename = 112, .co_func = 128, .co_linetable = 136,
    .co_firstlineno = 72, .co_adaptive = 184, .co_firsttraceable = 168, .str_length = 16,
    .str_state = 32, .str_ascii = 48, .str_compact = 72, .str_ready_bit = true,
    .bytes_size = 16, .bytes_data = 32,
};
static const struct layout LAYOUT_312 = {
    .walk = W312, .ts_frame = 56, .cf_current = 0, .fr_code = 0, .fr_prev = 8,
    .fr_instr = 56, .fr_owner = 70, .co_filename = 112, .co_func = 128, .co_linetable = 136,
    .co_firstlineno = 68, .co_adaptive = 192, .co_firsttraceable = 176, .str_length = 16,
    .str_state = 32, .str_ascii = 40, .str_compact = 56, .str_ready_bit = false,
    .bytes_size = 16, .bytes_data = 32,
};

/* Find Python and check its layout; sets the state (we hold ST_PROBING). */
static void probe(void)
{
    char where[256] = "", why[200] = "";
    {   /* process_vm_readv on ourselves: allowed unless a seccomp filter says no */
        uint64_t probe_word = 0x5a5a, copy = 0;
        g_checked_reads = checked_copy(&copy, (uintptr_t)&probe_word, sizeof copy) &&
                          copy == probe_word;
    }
    void *h;
    if (!find_python(&h, where, sizeof where)) {
        if (!g_adds_seen)
            dl_iterate_phdr(adds_cb, &g_adds_seen);
        set_status("no Python in this process");
        atomic_store(&g_next_scan_ns, gg_now_ns() + RESCAN_NS);
        atomic_store(&g_state, ST_ABSENT);
        return;
    }
    if (h != RTLD_DEFAULT)
        g_handle = h;
    *(void **)&g_py.this_tstate = dlsym(h, "PyGILState_GetThisThreadState");
    *(void **)&g_py.is_finalizing = dlsym(h, "Py_IsFinalizing");
    if (!g_py.is_finalizing)
        *(void **)&g_py.is_finalizing = dlsym(h, "_Py_IsFinalizing");
    *(void **)&g_py.is_initialized = dlsym(h, "Py_IsInitialized");
    g_py.code_type = (uintptr_t)dlsym(h, "PyCode_Type");
    g_py.str_type = (uintptr_t)dlsym(h, "PyUnicode_Type");
    g_py.bytes_type = (uintptr_t)dlsym(h, "PyBytes_Type");
    g_py.frame_type = (uintptr_t)dlsym(h, "PyFrame_Type");
    uintptr_t runtime = (uintptr_t)dlsym(h, "_PyRuntime");
    const unsigned long *hexp = dlsym(h, "Py_Version");          /* 3.11+ */
    const char *(*get_version)(void) = (const char *(*)(void))dlsym(h, "Py_GetVersion");

    struct pyver v = { 0, 0, 0, 0 };
    unsigned long hex = 0;
    if (hexp) {
        hex = *hexp;
        v = (struct pyver){ (int)(hex >> 24), (int)(hex >> 16 & 0xff), (int)(hex >> 8 & 0xff),
                            (int)(hex >> 4 & 0xf) };
    } else if (!get_version || !parse_version(get_version(), &v)) {
        fail("a Python was found (%s) but not its version", where);
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "CPython %d.%d.%d%s", v.major, v.minor, v.micro,
             v.level == 0xF ? "" : " (pre-release)");
    if (v.major != 3 || v.minor < 10 || v.minor > 13) {
        fail("%s (%s) is not supported (3.10-3.13 are)", name, where);
        return;
    }
    if (v.level != 0xF) {
        fail("%s (%s) is a pre-release; only final releases are supported", name, where);
        return;
    }
    if (!g_py.this_tstate || !g_py.is_finalizing || !g_py.is_initialized || !g_py.code_type ||
        !g_py.str_type || !g_py.bytes_type || (v.minor == 10 && !g_py.frame_type) ||
        (v.minor == 13 && !runtime) || (v.minor >= 11 && !hexp)) {
        fail("%s (%s): an expected symbol is missing", name, where);
        return;
    }
    bool ok;
    switch (v.minor) {
    case 10: L = LAYOUT_310; ok = true; break;
    case 11: L = LAYOUT_311; ok = true; break;
    case 12: L = LAYOUT_312; ok = true; break;
    default: ok = layout_313(runtime, hex, why, sizeof why); break;
    }
    int64_t code_size = v.minor == 10 ? 176 : L.co_adaptive;
    ok = ok && type_is(g_py.code_type, "code", code_size, why, sizeof why) &&
         type_is(g_py.str_type, "str", L.str_compact + 8, why, sizeof why) &&
         type_is(g_py.bytes_type, "bytes", L.bytes_data + 1, why, sizeof why) &&
         (v.minor != 10 || type_is(g_py.frame_type, "frame", 360, why, sizeof why));
    if (!ok) {
        fail("%s (%s): layout not as expected (%s)", name, where, why);
        return;
    }
    g_layout_ok = true;
    set_status("%s (%s): frames on%s", name, where,
               g_checked_reads ? "" : " (first walk unchecked: process_vm_readv refused)");
    atomic_store_explicit(&g_state, ST_ON, memory_order_release);
}

/* The state, looking for Python when that is due. Never waits. */
static int ready_slow(int st)
{
    if (st == ST_ABSENT) {
        /* Python may be loaded later (embedded): look again now and then,
         * only once objects were added since the last look. */
        if (++t_absent_calls & 255)
            return st;
        uint64_t now = gg_now_ns(), next = atomic_load(&g_next_scan_ns);
        if (now < next || !atomic_compare_exchange_strong(&g_next_scan_ns, &next, now + RESCAN_NS))
            return st;
        unsigned long long adds = 0;
        dl_iterate_phdr(adds_cb, &adds);
        if (adds == g_adds_seen)
            return st;
        g_adds_seen = adds;
    } else if (st != ST_UNKNOWN) {
        return st;
    }
    if (!atomic_compare_exchange_strong(&g_state, &st, ST_PROBING))
        return atomic_load(&g_state);
    probe();
    return atomic_load_explicit(&g_state, memory_order_acquire);
}

/* ---- walking the frame chain -------------------------------------------- */

/* Walk this thread's frames from tstate `ts`. `checked`: every read through
 * process_vm_readv (the first walk). Returns the count, or -1 with *why set
 * when something is not as the layout says. */
__attribute__((always_inline)) static inline int walk(uintptr_t ts, struct gg_py_raw *out,
                                                      int max, bool checked, const char **why)
{
    const struct layout *l = &L;
    uintptr_t fr = 0;
    if (!ptr_ok(ts, 8) || !rd_ptr(checked, ts + l->ts_frame, &fr))
        return *why = "thread state unreadable", -1;
    if (l->cf_current >= 0) {            /* 3.11, 3.12: through the cframe */
        if (!fr)
            return 0;
        if (!ptr_ok(fr, 8) || !rd_ptr(checked, fr + (uint32_t)l->cf_current, &fr))
            return *why = "cframe unreadable", -1;
    }
    int n = 0;
    /* Brent's cycle detection: `mark` is a frame seen `power` steps ago at
     * most; meeting it again means a cycle, caught within twice its length. */
    uintptr_t mark = 0;
    unsigned since_mark = 0, power = 1;
    for (int steps = 0; fr && n < max && steps < STEP_LIMIT(max); steps++) {
        uintptr_t code = 0, prev = 0, type = 0;
        if (fr == mark)
            return *why = "the frame chain is a cycle", -1;
        if (++since_mark == power) {
            mark = fr;
            power <<= 1;
            since_mark = 0;
        }
        if (!ptr_ok(fr, 8) || !rd_ptr(checked, fr + l->fr_code, &code) ||
            !rd_ptr(checked, fr + l->fr_prev, &prev))
            return *why = "frame unreadable", -1;
        int owner = 0;
        if (l->fr_owner >= 0) {
            int8_t o = 0;
            if (!rd(checked, &o, fr + (uint32_t)l->fr_owner, 1))
                return *why = "frame owner unreadable", -1;
            owner = o;
            if (owner == OWNED_BY_CSTACK && l->walk >= W312) {
                fr = prev;                /* the eval loop's entry frame */
                continue;
            }
            if (owner < 0 || owner > 2)
                return *why = "frame owner out of range", -1;
        }
        if (!ptr_ok(code, 8) || !rd_ptr(checked, code + 8, &type))
            return *why = "code pointer bad", -1;
        if (type != g_py.code_type)
            return *why = "frame without a code object", -1;
        int32_t addr;
        if (l->walk == W310) {
            uintptr_t ftype = 0;
            int32_t lasti = 0;
            if (!rd_ptr(checked, fr + 8, &ftype) || ftype != g_py.frame_type ||
                !rd(checked, &lasti, fr + l->fr_instr, 4))
                return *why = "frame object not a frame", -1;
            if (lasti < -1 || lasti > (1 << 28))
                return *why = "f_lasti out of range", -1;
            addr = lasti * 2;
        } else {
            uintptr_t instr = 0;
            int64_t units = 0;
            int32_t first = 0;
            if (!rd_ptr(checked, fr + l->fr_instr, &instr) ||
                !rd(checked, &units, code + 16, 8) ||
                !rd(checked, &first, code + l->co_firsttraceable, 4))
                return *why = "instruction pointer unreadable", -1;
            intptr_t d = (intptr_t)(instr - (code + l->co_adaptive));
            if (units < 0 || units > (1 << 28) || d < -2 || d >= (intptr_t)units * 2 || (d & 1))
                return *why = "instruction pointer outside its code", -1;
            addr = (int32_t)d;
            if (owner != OWNED_BY_GENERATOR && addr < first * 2) {
                fr = prev;                /* incomplete: not started yet */
                continue;
            }
        }
        uintptr_t func = 0, lt = 0;
        if (!rd_ptr(checked, code + l->co_func, &func) ||
            !rd_ptr(checked, code + l->co_linetable, &lt))
            return *why = "code fields unreadable", -1;
        out[n].code = code;
        out[n].addr = addr;
        out[n].ident = ident_of(func, lt);
        n++;
        fr = prev;
    }
    return n;
}

static int walk_plain(uintptr_t ts, struct gg_py_raw *out, int max, const char **why)
{
    return walk(ts, out, max, false, why);
}

static GG_COLD int walk_checked(uintptr_t ts, struct gg_py_raw *out, int max, const char **why)
{
    return walk(ts, out, max, true, why);
}

static bool check_code(uintptr_t code, bool checked, const char **why);

/* The first walk that finds frames: every read checked, and every code
 * object's strings and line table proven readable as the layout says. */
static GG_COLD int walk_first(uintptr_t ts, struct gg_py_raw *out, int max)
{
    const char *why = NULL;
    int n = walk_checked(ts, out, max, &why);
    for (int i = 0; i < n && !why; i++)
        check_code(out[i].code, g_checked_reads, &why);
    if (why) {
        fail("the first walk of this thread's frames failed (%s)", why);
        return 0;
    }
    if (n > 0)
        atomic_store(&g_verified, 1);
    return n;
}

int gg_py_capture(struct gg_py_raw *out, int max)
{
    int st = atomic_load_explicit(&g_state, memory_order_acquire);
    if (gg_unlikely(st != ST_ON) && ready_slow(st) != ST_ON)
        return 0;
    if (max <= 0 || !out)
        return 0;
    if (max > GG_PY_MAX_DEPTH)
        max = GG_PY_MAX_DEPTH;
    if (!g_py.is_initialized() || g_py.is_finalizing())
        return 0;
    uintptr_t ts = (uintptr_t)g_py.this_tstate();
    if (!ts)
        return 0;                          /* a thread Python never saw */
    if (gg_unlikely(!atomic_load_explicit(&g_verified, memory_order_relaxed)))
        return walk_first(ts, out, max);
    const char *why = NULL;
    int n = walk_plain(ts, out, max, &why);
    if (gg_unlikely(n < 0)) {
        fail("unexpected frame (%s)", why);
        return 0;
    }
    return n;
}

/* ---- pure decoding ------------------------------------------------------ */

int gg_py_line_310(const uint8_t *tab, size_t len, int firstlineno, int addr)
{
    if (addr < 0)
        return firstlineno;
    /* Pairs (start delta in bytes, signed line delta; -128: no line). Empty
     * ranges only carry their line delta forward. */
    long start = 0, end = 0, line = firstlineno;
    int ar_line = -1;
    for (size_t i = 0; i + 1 < len; i += 2) {
        int sdelta = tab[i], ldelta = (int8_t)tab[i + 1];
        start = end;
        end += sdelta;
        if (ldelta == -128) {
            ar_line = -1;
        } else {
            line += ldelta;
            ar_line = (int)line;
        }
        if (start < end && addr < end)
            return addr >= start ? ar_line : -1;
    }
    return -1;
}

/* 3.11+ location table varints: 6 bits a byte, bit 6 says more follow. */
static bool varint(const uint8_t *tab, size_t len, size_t *i, uint32_t *out)
{
    uint32_t v = 0;
    for (unsigned shift = 0; *i < len && shift < 32; shift += 6) {
        uint8_t b = tab[(*i)++];
        v |= (uint32_t)(b & 63) << shift;
        if (!(b & 64)) {
            *out = v;
            return true;
        }
    }
    return false;
}

int gg_py_line_311(const uint8_t *tab, size_t len, int firstlineno, int addr)
{
    if (addr < 0)
        return firstlineno;
    /* Entries: a first byte 1CCCCLLL (code C, L+1 code units), then code
     * dependent bytes, none with bit 7 set. Code 15: no line; 13, 14: line
     * delta as a signed varint; 10-12: delta C-10; 0-9: same line. */
    long end = 0, line = firstlineno;
    size_t i = 0;
    while (i < len) {
        uint8_t first = tab[i];
        if (!(first & 0x80))
            return -1;                          /* not at an entry: corrupt */
        int code = (first >> 3) & 15;
        long start = end;
        end += ((first & 7) + 1) * 2;
        size_t next = i + 1;
        long delta = 0;
        if (code == 13 || code == 14) {
            uint32_t u;
            if (!varint(tab, len, &next, &u))
                return -1;
            delta = (u & 1) ? -(long)(u >> 1) : (long)(u >> 1);
        } else if (code >= 10 && code <= 12) {
            delta = code - 10;
        }
        line += delta;
        if (addr < end)
            return addr >= start && code != 15 ? (int)line : -1;
        i = next;
        while (i < len && !(tab[i] & 0x80))
            i++;
    }
    return -1;
}

unsigned gg_py_str_kind(uint32_t state, bool ready_bit, bool *ascii)
{
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, is_ascii = (state >> 6) & 1;
    *ascii = false;
    if (!compact || (ready_bit && !((state >> 7) & 1)))
        return 0;
    if (kind != 1 && kind != 2 && kind != 4)
        return 0;
    if (is_ascii && kind != 1)
        return 0;
    *ascii = is_ascii;
    return kind;
}

size_t gg_py_utf8(unsigned kind, const void *data, size_t length, char *out, size_t size)
{
    if (!size)
        return 0;
    size_t o = 0;
    for (size_t i = 0; i < length; i++) {
        uint32_t c;
        if (kind == 1) {
            c = ((const uint8_t *)data)[i];
        } else if (kind == 2) {
            uint16_t u;
            memcpy(&u, (const uint8_t *)data + 2 * i, 2);
            c = u;
        } else {
            memcpy(&c, (const uint8_t *)data + 4 * i, 4);
        }
        if (c == 0)
            c = '?';
        if ((c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff)
            c = 0xfffd;
        char b[4];
        size_t n;
        if (c < 0x80) {
            b[0] = (char)c;
            n = 1;
        } else if (c < 0x800) {
            b[0] = (char)(0xc0 | c >> 6);
            b[1] = (char)(0x80 | (c & 63));
            n = 2;
        } else if (c < 0x10000) {
            b[0] = (char)(0xe0 | c >> 12);
            b[1] = (char)(0x80 | (c >> 6 & 63));
            b[2] = (char)(0x80 | (c & 63));
            n = 3;
        } else {
            b[0] = (char)(0xf0 | c >> 18);
            b[1] = (char)(0x80 | (c >> 12 & 63));
            b[2] = (char)(0x80 | (c >> 6 & 63));
            b[3] = (char)(0x80 | (c & 63));
            n = 4;
        }
        if (o + n + 1 > size)
            break;
        memcpy(out + o, b, n);
        o += n;
    }
    out[o] = '\0';
    return o;
}

/* ---- naming frames ------------------------------------------------------ */


struct centry {
    uintptr_t code;
    int32_t addr;
    uint32_t ident;
    const char *file, *func;   /* NULL: empty slot */
    int32_t line;
};

struct istr { uint64_t hash; const char *s; };

static gg_spin g_lock = GG_SPIN_INIT;
static struct centry *g_cache;           /* 1 << CACHE_BITS */
static struct istr *g_intern;            /* 1 << INTERN_BITS */
static size_t g_interned;
static char *g_arena;
static size_t g_arena_left;
static unsigned g_arena_chunks;
static uint8_t *g_ltbuf;                 /* LINETABLE_MAX: one line table */
static uint32_t g_strbuf[STR_CHARS_MAX]; /* one str's characters */

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static char *arena_alloc(size_t n)
{
    if (n > ARENA_CHUNK)
        return NULL;
    if (n > g_arena_left) {
        if (g_arena_chunks >= ARENA_CHUNKS || !(g_arena = gg_pages(ARENA_CHUNK)))
            return NULL;
        g_arena_chunks++;
        g_arena_left = ARENA_CHUNK;
    }
    char *p = g_arena;
    g_arena += n;
    g_arena_left -= n;
    return p;
}

/* The one stored copy of s (n bytes, no NUL inside); NULL when out of room. */
static const char *intern(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    h = mix64(h ^ n) | 1;
    const size_t mask = ((size_t)1 << INTERN_BITS) - 1;
    size_t i = (size_t)h & mask;
    if (g_intern) {
        for (; g_intern[i].hash; i = (i + 1) & mask)
            if (g_intern[i].hash == h && strncmp(g_intern[i].s, s, n) == 0 && !g_intern[i].s[n])
                return g_intern[i].s;
    }
    char *copy = arena_alloc(n + 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, n);
    copy[n] = '\0';
    if (g_intern && g_interned < (mask + 1) / 2) {   /* full: stored, not shared */
        g_intern[i] = (struct istr){ h, copy };
        g_interned++;
    }
    return copy;
}

/* A str object as UTF-8 into out; `chars` (room for STR_CHARS_MAX code
 * points, or fewer: `max_chars`) holds its characters meanwhile. */
static bool read_str(uintptr_t p, bool checked, void *chars, size_t max_chars, char *out,
                     size_t size)
{
    uint8_t hdr[128];
    if (!ptr_ok(p, 8) || L.str_ascii > sizeof hdr || !rd(checked, hdr, p, L.str_ascii) ||
        field_ptr(hdr, 8) != g_py.str_type)
        return false;
    uint32_t state;
    memcpy(&state, hdr + L.str_state, 4);
    int64_t length = field_i64(hdr, L.str_length);
    bool ascii;
    unsigned kind = gg_py_str_kind(state, L.str_ready_bit, &ascii);
    if (!kind || length < 0 || length > (1 << 30))
        return false;
    size_t n = (size_t)length < max_chars ? (size_t)length : max_chars;
    uintptr_t data = p + (ascii ? L.str_ascii : L.str_compact);
    if (n && !rd(checked, chars, data, n * kind))
        return false;
    gg_py_utf8(kind, chars, n, out, size);
    return true;
}

/* A bytes object's size, and its data address. */
static bool read_bytes_hdr(uintptr_t p, bool checked, int64_t *size, uintptr_t *data)
{
    uint8_t hdr[64];
    if (!ptr_ok(p, 8) || L.bytes_data > sizeof hdr || !rd(checked, hdr, p, L.bytes_data) ||
        field_ptr(hdr, 8) != g_py.bytes_type)
        return false;
    *size = field_i64(hdr, L.bytes_size);
    *data = p + L.bytes_data;
    return *size >= 0;
}

/* The fixed part of a code object, after its type is checked. */
static inline uint32_t code_hdr_len(void)
{
    return L.walk == W310 ? 176 : L.co_adaptive;
}

static bool read_code(uintptr_t code, bool checked, uint8_t *hdr)
{
    return ptr_ok(code, 8) && rd(checked, hdr, code, code_hdr_len()) &&
           field_ptr(hdr, 8) == g_py.code_type;
}

/* Called on the first walk: the code object's names and line table are
 * where the layout says. No lock, nothing stored. */
static bool check_code(uintptr_t code, bool checked, const char **why)
{
    uint8_t hdr[CODE_HDR];
    uint32_t chars[64];
    char text[64];
    int64_t size;
    uintptr_t data;
    if (!read_code(code, checked, hdr))
        *why = "code object unreadable";
    else if (!read_str(field_ptr(hdr, L.co_filename), checked, chars, 64, text, sizeof text))
        *why = "co_filename not a str";
    else if (!read_str(field_ptr(hdr, L.co_func), checked, chars, 64, text, sizeof text))
        *why = "code name not a str";
    else if (!read_bytes_hdr(field_ptr(hdr, L.co_linetable), checked, &size, &data))
        *why = "co_linetable not bytes";
    else
        return true;
    return false;
}

/* Name a frame from the code object (under the lock). */
/* Under g_lock: one frame is named at a time, so its names' buffers are
 * static, not kilobytes of a thread's stack. */
static char g_file[FILE_MAX], g_name[FUNC_MAX];

static bool name_frame(const struct gg_py_raw *f, bool checked, struct centry *e)
{
    uint8_t hdr[CODE_HDR];
    if (!read_code(f->code, checked, hdr))
        return false;
    uintptr_t func = field_ptr(hdr, L.co_func), lt = field_ptr(hdr, L.co_linetable);
    if (ident_of(func, lt) != f->ident)
        return false;                     /* another code object now */
    int64_t nbytes;
    if (L.walk == W310) {
        uintptr_t data;
        if (!read_bytes_hdr(field_ptr(hdr, L.co_code), checked, &nbytes, &data))
            return false;
    } else {
        nbytes = field_i64(hdr, 16) * 2;
    }
    if (f->addr < -2 || f->addr >= nbytes)
        return false;

    char *file = g_file, *name = g_name;
    if (!read_str(field_ptr(hdr, L.co_filename), checked, g_strbuf, STR_CHARS_MAX, file,
                  FILE_MAX) ||
        !read_str(func, checked, g_strbuf, STR_CHARS_MAX, name, FUNC_MAX))
        return false;
    int line = -1, firstlineno = field_i32(hdr, L.co_firstlineno);
    int64_t ltsize;
    uintptr_t ltdata;
    if (!read_bytes_hdr(lt, checked, &ltsize, &ltdata))
        return false;
    if (!g_ltbuf)
        g_ltbuf = gg_pages(LINETABLE_MAX);
    if (g_ltbuf && ltsize <= LINETABLE_MAX && (!ltsize || rd(checked, g_ltbuf, ltdata, (size_t)ltsize)))
        line = L.walk == W310 ? gg_py_line_310(g_ltbuf, (size_t)ltsize, firstlineno, f->addr)
                              : gg_py_line_311(g_ltbuf, (size_t)ltsize, firstlineno, f->addr);
    e->file = intern(file, strlen(file));
    e->func = intern(name, strlen(name));
    if (!e->file || !e->func)
        return false;
    e->line = line > 0 ? line : 0;
    return true;
}

static inline size_t cache_slot(const struct gg_py_raw *f)
{
    uint64_t h = mix64(f->code ^ (uint64_t)(uint32_t)f->addr << 40 ^ f->ident);
    return (size_t)h & ((1u << CACHE_BITS) - 1);
}

/* One frame, from the cache or the code object (under the lock). */
static bool resolve_one(const struct gg_py_raw *f, bool checked, struct gg_py_frame *out)
{
    struct centry *e = g_cache ? &g_cache[cache_slot(f)] : NULL;
    if (!(e && e->file && e->code == f->code && e->addr == f->addr && e->ident == f->ident)) {
        struct centry fresh = { f->code, f->addr, f->ident, NULL, NULL, 0 };
        if (!name_frame(f, checked, &fresh))
            return false;
        if (e)
            *e = fresh;
        else
            e = &fresh;
    }
    *out = (struct gg_py_frame){ e->file, e->func, e->line };
    return true;
}

int gg_py_resolve(const struct gg_py_raw *f, int n, bool live, struct gg_py_frame *out)
{
    for (int i = 0; i < n; i++)
        out[i] = (struct gg_py_frame){ "?", "?", 0 };
    if (!f || n <= 0 || !g_layout_ok ||
        atomic_load_explicit(&g_state, memory_order_acquire) == ST_FAILED)
        return 0;
    bool checked = !live || !atomic_load(&g_verified);
    if (checked && !g_checked_reads) {
        if (!live)
            return 0;                      /* cannot read a maybe-freed object safely */
        checked = false;
    }
    int named = 0;
    /* A signal handler interrupting a naming on its own thread gets "?"
     * rather than waiting for itself. */
    if (!gg_spin_trylock(&g_lock, 1000000))
        return 0;
    if (!g_cache)
        g_cache = gg_pages(sizeof *g_cache << CACHE_BITS);
    if (!g_intern)
        g_intern = gg_pages(sizeof *g_intern << INTERN_BITS);
    for (int i = 0; i < n; i++)
        named += resolve_one(&f[i], checked, &out[i]);
    gg_spin_unlock(&g_lock);
    return named;
}

/* ---- state -------------------------------------------------------------- */

void gg_py_disable(void)
{
    int st = atomic_load(&g_state);
    for (;;) {
        if (st == ST_FAILED || st == ST_OFF)
            return;
        if (st == ST_PROBING) {            /* let the probe finish, then turn off */
            sched_yield();
            st = atomic_load(&g_state);
            continue;
        }
        if (atomic_compare_exchange_weak(&g_state, &st, ST_OFF))
            break;
    }
    set_status("Python frames turned off by configuration");
}

enum gg_py_state gg_py_state(void)
{
    int st = atomic_load_explicit(&g_state, memory_order_acquire);
    if (st == ST_UNKNOWN)
        st = ready_slow(st);
    switch (st) {
    case ST_ABSENT: return GG_PY_ABSENT;
    case ST_ON: return GG_PY_ON;
    case ST_OFF: return GG_PY_OFF;
    case ST_FAILED: return GG_PY_FAILED;
    default: return GG_PY_UNKNOWN;
    }
}

#ifdef GG_TESTING
const char *gg_py_status(void)
{
    gg_py_state();
    return g_status;
}
#endif

const char *gg_py_take_error(void)
{
    return atomic_exchange(&g_error_pending, false) ? g_error : NULL;
}

#ifdef GG_TESTING
bool gg_py_test_raw(uintptr_t code, int32_t addr, struct gg_py_raw *out)
{
    uint8_t hdr[CODE_HDR];
    if (gg_py_state() != GG_PY_ON || !g_layout_ok ||
        !read_code(code, g_checked_reads, hdr))
        return false;
    *out = (struct gg_py_raw){ code, addr,
                               ident_of(field_ptr(hdr, L.co_func), field_ptr(hdr, L.co_linetable)) };
    return true;
}

void gg_py_test_forget(const struct gg_py_raw *f)
{
    gg_spin_lock(&g_lock);
    if (g_cache && !f)
        memset(g_cache, 0, sizeof *g_cache << CACHE_BITS);
    else if (g_cache)
        g_cache[cache_slot(f)].file = NULL;
    gg_spin_unlock(&g_lock);
}

void gg_py_test_rescan_now(void)
{
    atomic_store(&g_next_scan_ns, 0);
}
#endif

void gg_py_after_fork(void)
{
    gg_spin_reset(&g_lock);
}
