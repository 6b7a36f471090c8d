/* symlib.c - functions whose extents tests/unit/test_elfsym.c checks. Built
 * twice: libsym.so (with .symtab) and libsym_stripped.so (strip --strip-all:
 * .dynsym only), in source order (-fno-toplevel-reorder), so the static
 * function sits right after an exported one, where dladdr would misname it. */
int exported_fn(int x);
int tiny_fn(void);
int aligned_fn(int x);
void *symlib_local(void);

static int local_fn(int x);

int exported_fn(int x)
{
    return local_fn(x) + 1;
}

__attribute__((noinline, used)) static int local_fn(int x)
{
    return x * 3 + 1;
}

__attribute__((noinline)) int tiny_fn(void)
{
    return 7;
}

/* Aligned far past tiny_fn's end: the bytes between are padding. */
__attribute__((noinline, aligned(256))) int aligned_fn(int x)
{
    return x ^ 0x55;
}

void *symlib_local(void)
{
    return (void *)local_fn;
}
