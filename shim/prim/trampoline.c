/* trampoline.c - layer 0: the shim's dlsym, in assembly only.
 *
 * libcudart (DT_SYMBOLIC) and static runtimes (NCCL, cuBLAS) take the
 * driver's functions with dlsym on libcuda's handle; the shim must see those
 * lookups. But a C override of dlsym breaks dlsym(RTLD_NEXT, ...): the real
 * dlsym resolves RTLD_NEXT relative to its caller, which would be the shim
 * (HAMi-core's hung `import torch`). So dlsym is a trampoline: it asks the
 * registered filter (prim.h, gg_dlsym_set_filter) and returns its answer, or
 * tail-jumps to the real dlsym with the caller's own return address on the
 * stack, as if the shim were not there.
 *
 * The filter is registered from above (the layer that knows the hooks); until
 * then every lookup goes to the real dlsym. Only the shim links this file:
 * gpuguard-check, an ordinary program, keeps libc's dlsym.
 */
#include "prim.h"

GG_HIDDEN extern void *_Atomic gg_real_dlsym_fn;
GG_HIDDEN void *gg_real_dlsym_resolve(void);

static _Atomic gg_dlsym_filter_fn filter;

void gg_dlsym_set_filter(gg_dlsym_filter_fn fn)
{
    atomic_store_explicit(&filter, fn, memory_order_release);
}

/* Called by the trampoline: makes sure it has the real dlsym to jump to, and
 * asks the filter. Runs before a sanitizer's runtime is ready. */
GG_HIDDEN void *gg_trampoline_enter(void *handle, const char *name, uintptr_t caller);
GG_NO_SANITIZE void *gg_trampoline_enter(void *handle, const char *name, uintptr_t caller)
{
    (void)gg_real_dlsym_resolve();
    gg_dlsym_filter_fn f = atomic_load_explicit(&filter, memory_order_acquire);
    return f ? f(handle, name, caller) : NULL;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        ".cfi_startproc\n"
        "    endbr64\n" /* a landing pad under CET; a no-op elsewhere */
        "    pushq %rdi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    pushq %rsi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    subq $8, %rsp\n"
        ".cfi_adjust_cfa_offset 8\n"
        "    movq 24(%rsp), %rdx\n" /* the caller's return address: who looks up */
        "    call gg_trampoline_enter\n"
        "    addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    popq %rsi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    popq %rdi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    ret\n"
        "1:  jmp *gg_real_dlsym_fn(%rip)\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,%function\n"
        "dlsym:\n"
        ".cfi_startproc\n"
        "    stp x29, x30, [sp, #-32]!\n"
        ".cfi_def_cfa_offset 32\n"
        ".cfi_offset 29, -32\n"
        ".cfi_offset 30, -24\n"
        "    mov x29, sp\n"
        "    stp x0, x1, [sp, #16]\n"
        "    mov x2, x30\n" /* the caller's return address: who looks up */
        "    bl gg_trampoline_enter\n"
        "    mov x2, x0\n"
        "    ldp x0, x1, [sp, #16]\n"
        "    ldp x29, x30, [sp], #32\n"
        ".cfi_def_cfa_offset 0\n"
        "    cbz x2, 1f\n"
        "    mov x0, x2\n"
        "    ret\n"
        "1:  adrp x16, gg_real_dlsym_fn\n"
        "    ldr x16, [x16, :lo12:gg_real_dlsym_fn]\n"
        "    br x16\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
/* No trampoline: driver lookups are not intercepted on this platform. */
#endif
