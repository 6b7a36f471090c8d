/* check_arch.h - gpuguard-check's device-code check (docs/how-it-works.md):
 * does a library carry kernels the GPUs here can run?
 *
 *   gpuguard-check --arch FILE...   one line per (file, GPU): what the file
 *                                   carries and whether it runs
 *   gpuguard-check --arch           the same for the CUDA libraries of the
 *                                   PyTorch that python3 imports
 *   gpuguard-check                  (listing) ends with a paragraph on that
 *                                   PyTorch, when there is one
 */
#ifndef GG_CHECK_ARCH_H
#define GG_CHECK_ARCH_H

/* --arch FILE... (argc may be 0: the installed PyTorch). Exit status: 0
 * every file runs on every GPU, 1 a file has nothing some GPU runs or cannot
 * be read, 2 no driver, no GPU or no PyTorch to judge. */
int gg_check_arch(int argc, char **argv);

/* The listing's paragraph on the installed PyTorch; prints nothing when
 * python3 has no torch or there is no GPU. */
void gg_check_arch_torch_paragraph(void);

#endif /* GG_CHECK_ARCH_H */
