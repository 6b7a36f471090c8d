/* pysite.h - layer 5: GPUGUARD_TORCH=1 under a plain LD_PRELOAD (docs/trainer.md,
 * "Without a code change: gpuguard-run instruments PyTorch").
 *
 * gpuguard-run instruments Python by putting the directory of gpuguard's
 * sitecustomize first on PYTHONPATH (with the helper's package after it)
 * and setting GPUGUARD_TORCH=1. A user of LD_PRELOAD alone asks for the same
 * with GPUGUARD_TORCH=1: when the library is loaded into a Python
 * interpreter (the program defines Py_BytesMain), the same two directories,
 * found beside the library (<libdir>/../share/gpuguard/python as installed,
 * the source tree's tools/python from build/), are put first on PYTHONPATH,
 * which the interpreter reads after the preloaded libraries' constructors
 * and before any Python code runs. That is the only moment a preloaded
 * library can do it, and nothing else happens at load: a program that is
 * not Python, GPUGUARD_TORCH unset or 0, GPUGUARD_MODE=off, a PYTHONPATH
 * that holds the directory already (gpuguard-run's, a parent's): nothing is
 * changed. The sitecustomize itself does nothing until torch is imported.
 */
#ifndef GG_PYSITE_H
#define GG_PYSITE_H

#include <stdbool.h>
#include <stddef.h>

/* What the library's constructor does (and tests call): true when it
 * changed PYTHONPATH. */
bool gg_pysite_load(void);

/* ---- pure parts, for the unit test ------------------------------------------ */

/* The helper's directory (holding gpuguard/_site/sitecustomize.py) for a
 * library in directory libdir, in out; false when there is none. */
bool gg_pysite_find(const char *libdir, char *out, size_t cap);

/* PYTHONPATH with site and pydir first (old: the current one, or NULL),
 * leaving out pydir when old has it; false when old has site already or
 * the result does not fit. */
bool gg_pysite_pythonpath(const char *old, const char *site, const char *pydir, char *out,
                          size_t cap);

#endif /* GG_PYSITE_H */
