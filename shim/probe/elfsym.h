/* elfsym.h - names you can trust for native frames.
 *
 * dladdr names an address by the nearest exported symbol before it, whether
 * or not the address lies in that function: code in a stripped library's
 * static functions, or in padding, comes out as `ffi_prep_go_closure+0x9a`.
 * Here an address is named by a symbol only when it lies inside the
 * symbol's extent [st_value, st_value + st_size) as the ELF symbol table
 * gives it (.symtab when the file on disk has one, else .dynsym; functions
 * only); otherwise there is no name, and the caller prints module+0xOFFSET.
 *
 * The symbol table is read from the file once per loaded module, bounded and
 * with every offset checked (a corrupt or truncated file gives no symbols,
 * never a crash), into mmap'd storage: sorted once, binary-searched after.
 * The file must be the one loaded: its program headers (and build ids, when
 * both have one) are compared with the loaded image's. Separate debug files
 * (/usr/lib/debug, .gnu_debuglink, MiniDebugInfo) are not read.
 *
 * C++ names are demangled when libstdc++'s __cxa_demangle is in the process
 * (found at run time, never linked).
 *
 * For the late path only: it takes a lock, reads files, and the demangler
 * mallocs. Never call it from an allocation hook.
 */
#ifndef GG_ELFSYM_H
#define GG_ELFSYM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gg_elfsym_hit {
    const char *module;   /* the object's file; the executable's real path */
    uintptr_t bias;       /* load bias: addr - bias is the address the file
                           * itself uses (module+0xOFFSET, for addr2line) */
    const char *sym;      /* NULL: no function's extent holds addr */
    uintptr_t start;      /* where sym starts, in this process */
    uint64_t size;
};

/* Name `addr`, an address in this process. A return address names the call
 * when the caller passes ip - 1. False when no loaded module holds addr.
 * Strings live as long as the process. */
bool gg_elfsym_lookup(uintptr_t addr, struct gg_elfsym_hit *out);

/* `name` demangled into out (cut to fit): false, out untouched, when it is
 * not a C++ name or no demangler is loaded. */
bool gg_elfsym_demangle(const char *name, char *out, size_t size);

#ifdef GG_TESTING
/* For tests: the functions read from the file at `path` (no loaded image to
 * compare with), and the one holding file address `vaddr` copied to name
 * ("" when none). Returns how many functions, or -1 for a file rejected. */
long gg_elfsym_test_file(const char *path, uint64_t vaddr, char *name, size_t size);
#endif

/* The fork story (life.c): the lock is reset in a forked child. */
void gg_elfsym_after_fork(void);

#endif /* GG_ELFSYM_H */
