/* pysite.h - layer 5: gpuguard's site directory on a Python interpreter's
 * path, at load (docs/trainer.md, "Without a code change: gpuguard-run
 * instruments PyTorch").
 *
 * With GPUGUARD_TORCH=1 (gpuguard-run sets it) the library, when it is
 * loaded into a Python interpreter, puts gpuguard's site directory first on
 * PYTHONPATH: a directory holding gpuguard's sitecustomize and the gpuguard
 * package, nothing else (<libdir>/../share/gpuguard/site as installed, the
 * source tree's tools/site from build/ and build/<variant>/). The
 * interpreter reads PYTHONPATH after the preloaded libraries' constructors
 * and before any Python code runs: the one moment a preloaded library can
 * do it, and the only thing the library does at load. Nothing changes:
 *   - in secure-execution mode (a set-user-ID program, or one that gained
 *     capabilities), GPUGUARD_TORCH unset or 0, or GPUGUARD_MODE=off;
 *   - in a program that is not a Python 3.6+ interpreter: a shell, Python
 *     2, a program that embeds libpython (gdb) and would pass the path on
 *     to its own children (the interpreter is the main program when that
 *     program calls Py_BytesMain or Py_Main, as python's main does);
 *   - in an interpreter started with -I, -E (which ignore PYTHONPATH) or -S
 *     (which imports no sitecustomize);
 *   - with a PYTHONPATH that holds the directory already;
 *   - when the directory, or one above it up to the one that holds the
 *     library, or anything in it, could have been written by another user
 *     (the rule ssh applies to its files): owned by root or the process's
 *     user, writable by no one else (an ancestor directory may be a sticky
 *     one, /tmp's kind); then it is said once when the shim starts.
 * The sitecustomize itself takes the directory out of PYTHONPATH again, so
 * that the process's children get it only as they are loaded themselves.
 */
#ifndef GG_PYSITE_H
#define GG_PYSITE_H

#include <stdbool.h>
#include <stddef.h>

/* What the library's constructor does (and tests call) with the program's
 * arguments: true when it changed PYTHONPATH. */
bool gg_pysite_load(int argc, char **argv);

/* Why a site directory that GPUGUARD_TORCH=1 asked for was not used (said
 * once when the shim starts), or NULL. */
const char *gg_pysite_problem(void);

/* ---- parts, for the unit test ----------------------------------------------------- */

/* The site directory (holding sitecustomize.py and gpuguard/__init__.py) for
 * a library in directory libdir, its real path in out; false when none. */
bool gg_pysite_find(const char *libdir, char *out, size_t cap);

/* PYTHONPATH with site first (old: the current one, or NULL); false when
 * old has site already or the result does not fit. */
bool gg_pysite_pythonpath(const char *old, const char *site, char *out, size_t cap);

/* The interpreter's options that matter here, from its arguments (python's
 * own parsing: clusters of flags, -W/-X take an argument, -c and -m end
 * the options). */
enum { GG_PY_ISOLATED = 1, GG_PY_NO_ENV = 2, GG_PY_NO_SITE = 4 };
unsigned gg_pysite_options(int argc, char *const *argv);

/* Could no one but root and this process's user have written site (a real
 * path), what is in it, and the directories above it up to the first that
 * holds libdir (a real path)? Else why, naming the path. */
bool gg_pysite_trusted(const char *site, const char *libdir, char *why, size_t cap);

/* Is the main program a Python 3.6+ interpreter (it calls Py_BytesMain,
 * _Py_UnixMain or Py_Main itself), not a program that embeds one? */
bool gg_pysite_is_interpreter(void);

#endif /* GG_PYSITE_H */
