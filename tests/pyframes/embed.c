/* embed.c - a program that embeds CPython loaded RTLD_LOCAL, as a C++
 * application or a plugin host would: dlsym(RTLD_DEFAULT) cannot see the
 * interpreter, so pyframes.c must find it among the loaded objects.
 *
 *   embed LIBPYTHON SCRIPT     (PYTHONHOME set to the interpreter's prefix)
 *
 * Installs sys.gg_probe(), which returns the calling thread's frames as
 * pyframes.c names them ("file\x1fline\x1ffunc" lines), runs SCRIPT (which
 * compares them with sys._getframe()), finalizes the interpreter and checks
 * that a capture afterwards finds nothing. Exit status 0 when all held.
 */
#include "pyframes.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The few CPython entry points used, by their stable signatures. */
struct method_def { const char *name; void *meth; int flags; const char *doc; };
#define METH_NOARGS 0x0004

static void *(*unicode_from_string)(const char *);

static void *probe(void *self, void *unused)
{
    (void)self;
    (void)unused;
    static char text[1 << 16];
    struct gg_py_raw raw[GG_PY_MAX_DEPTH];
    int n = gg_py_capture(raw, GG_PY_MAX_DEPTH);
    struct gg_py_frame f[GG_PY_MAX_DEPTH];
    gg_py_resolve(raw, n, true, f);
    size_t used = 0;
    text[0] = '\0';
    for (int i = 0; i < n; i++) {
        int w = snprintf(text + used, sizeof text - used, "%s\x1f%d\x1f%s\n", f[i].file,
                         f[i].line, f[i].func);
        if (w < 0 || (size_t)w >= sizeof text - used)
            break;
        used += (size_t)w;
    }
    return unicode_from_string(text);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: embed LIBPYTHON SCRIPT\n");
        return 2;
    }
    char *script = slurp(argv[2]);
    void *py = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!py || !script) {
        fprintf(stderr, "embed: cannot load %s or read %s: %s\n", argv[1], argv[2], dlerror());
        return 2;
    }
    if (dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState")) {
        fprintf(stderr, "embed: the interpreter is visible globally; not the case under test\n");
        return 2;
    }
    void (*initialize)(int) = (void (*)(int))dlsym(py, "Py_InitializeEx");
    int (*finalize)(void) = (int (*)(void))dlsym(py, "Py_FinalizeEx");
    int (*run)(const char *, void *) = (int (*)(const char *, void *))dlsym(py, "PyRun_SimpleStringFlags");
    void *(*new_function)(struct method_def *, void *, void *) =
        (void *(*)(struct method_def *, void *, void *))dlsym(py, "PyCFunction_NewEx");
    int (*sys_set)(const char *, void *) = (int (*)(const char *, void *))dlsym(py, "PySys_SetObject");
    *(void **)&unicode_from_string = dlsym(py, "PyUnicode_FromString");
    if (!initialize || !finalize || !run || !new_function || !sys_set || !unicode_from_string) {
        fprintf(stderr, "embed: %s lacks an entry point\n", argv[1]);
        return 2;
    }

    struct gg_py_raw raw[4];
    int before = gg_py_capture(raw, 4);          /* loaded, not initialized: nothing */
    initialize(0);
    static struct method_def def = { "gg_probe", (void *)probe, METH_NOARGS, NULL };
    void *fn = new_function(&def, NULL, NULL);
    if (!fn || sys_set("gg_probe", fn) != 0) {
        fprintf(stderr, "embed: cannot install sys.gg_probe\n");
        return 2;
    }
    int rc = run(script, NULL);
    printf("embed: status: %s\n", gg_py_status());
    finalize();
    int after = gg_py_capture(raw, 4);           /* finalized: nothing, no crash */
    printf("embed: %s: script %s; %d frames before initialize, %d after finalize\n", argv[1],
           rc == 0 ? "passed" : "failed", before, after);
    return rc == 0 && before == 0 && after == 0 ? 0 : 1;
}
