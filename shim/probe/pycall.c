/* pycall.c - layer 3: Py_AddPendingCall, found at run time, never waited
 * for (see pycall.h). */
#include "pycall.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "prim.h"

#define CLOSE_WAIT_NS 100000000ull /* 100 ms */

static int (*add_fn)(gg_pycall_fn, void *);
static int (*finalizing_fn)(void);
/* Raising into the program from a pending call: PyErr_SetObject,
 * PyObject_Type, Py_DecRef (the stable ABI's, every 3.x). */
static void (*set_object_fn)(void *, void *);
static void *(*type_fn)(void *);
static void (*incref_fn)(void *), (*decref_fn)(void *);
static _Atomic bool is_open;
static _Atomic int inflight;   /* adds between their check of is_open and their return */
static gg_spin find_lock = GG_SPIN_INIT;
static bool fork_handler;

struct find_lib {
    char name[512];
};

/* The first loaded libpython*.so (names only: no dlopen under the loader's lock). */
static int find_lib_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct find_lib *f = arg;
    const char *name = info->dlpi_name;
    if (!name || !name[0])
        return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libpython", 9) != 0 || strlen(name) >= sizeof f->name)
        return 0;
    memcpy(f->name, name, strlen(name) + 1);
    return 1;
}

static void *python_sym(void *handle, const char *name)
{
    return handle ? gg_real_dlsym(handle, name) : NULL;
}

/* Py_AddPendingCall and Py_IsFinalizing (3.13; _Py_IsFinalizing before),
 * from the global scope or a libpython loaded RTLD_LOCAL, which stays
 * loaded for good (dlopen RTLD_NOLOAD takes a reference). */
static bool find(void)
{
    void *h = RTLD_DEFAULT;
    void *add = gg_real_dlsym(h, "Py_AddPendingCall");
    if (!add) {
        struct find_lib f = {""};
        dl_iterate_phdr(find_lib_cb, &f);
        h = f.name[0] ? dlopen(f.name, RTLD_NOLOAD | RTLD_LAZY) : NULL;
        add = python_sym(h, "Py_AddPendingCall");
        if (!add) {
            if (h)
                dlclose(h);
            return false;
        }
    }
    void *fin = gg_real_dlsym(h, "Py_IsFinalizing");
    if (!fin)
        fin = gg_real_dlsym(h, "_Py_IsFinalizing");
    void *set = gg_real_dlsym(h, "PyErr_SetObject"), *type = gg_real_dlsym(h, "PyObject_Type"),
         *inc = gg_real_dlsym(h, "Py_IncRef"), *dec = gg_real_dlsym(h, "Py_DecRef");
    if (set && type && inc && dec) {
        memcpy(&set_object_fn, &set, sizeof set);
        memcpy(&type_fn, &type, sizeof type);
        memcpy(&incref_fn, &inc, sizeof inc);
        memcpy(&decref_fn, &dec, sizeof dec);
    }
    memcpy(&finalizing_fn, &fin, sizeof fin);
    memcpy(&add_fn, &add, sizeof add);
    return true;
}

bool gg_pycall_keep(void *obj)
{
    if (!obj || !incref_fn)
        return false;
    incref_fn(obj);
    return true;
}

bool gg_pycall_raise(void *exc)
{
    if (!exc || !decref_fn)
        return false;
    void *type = set_object_fn && type_fn ? type_fn(exc) : NULL;
    if (!type) {
        decref_fn(exc);
        return false;
    }
    set_object_fn(type, exc); /* the exception as it was: its traceback with it */
    decref_fn(type);
    decref_fn(exc);
    return true;
}

/* A forked child has only the thread that forked: no add of another
 * thread is in flight there. */
static void child_after_fork(void)
{
    atomic_store(&inflight, 0);
}

bool gg_pycall_open(void)
{
    if (!gg_spin_trylock(&find_lock, 1000000))
        return false;
    bool ok = add_fn || find();
    if (ok && !fork_handler)
        fork_handler = pthread_atfork(NULL, NULL, child_after_fork) == 0;
    gg_spin_unlock(&find_lock);
    if (ok)
        atomic_store(&is_open, true);
    return ok;
}

void gg_pycall_close(void)
{
    atomic_store(&is_open, false); /* seq_cst: ordered before the loads of inflight */
    uint64_t until = gg_now_ns() + CLOSE_WAIT_NS;
    while (atomic_load(&inflight) > 0 && gg_now_ns() < until)
        sched_yield();
}

bool gg_pycall_is_open(void)
{
    return atomic_load_explicit(&is_open, memory_order_relaxed);
}

bool gg_pycall_add(gg_pycall_fn fn, void *arg)
{
    if (!atomic_load_explicit(&is_open, memory_order_relaxed))
        return false;
    /* Counted in flight before is_open is looked at again (both seq_cst):
     * either close() sees this add, and waits for it, or this add sees the
     * queue closed. */
    atomic_fetch_add(&inflight, 1);
    bool ok = atomic_load(&is_open) && add_fn && !(finalizing_fn && finalizing_fn()) &&
              add_fn(fn, arg) == 0;
    atomic_fetch_sub(&inflight, 1);
    return ok;
}

#ifdef GG_TESTING
void gg_pycall_test_use(int (*add)(gg_pycall_fn, void *), int (*finalizing)(void))
{
    add_fn = add;
    finalizing_fn = finalizing;
}
#endif
