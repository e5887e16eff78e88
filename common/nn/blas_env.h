/* blas_env: makes OpenBLAS use the fast kernels of the CPU it runs on.
 *
 * OpenBLAS picks its kernels when the library is loaded, from the CPU's model number. Virtual
 * machines that report a generic model ("Intel Xeon Processor") get the SSE3 "Prescott" kernels,
 * 3-5x slower than the AVX2 / AVX-512 ones on the same CPU (measured on the build machine). The
 * choice cannot be changed after load, so the fix re-executes the program once with
 * OPENBLAS_CORETYPE set. Call it first thing in main() of every program that computes on the
 * cpu backend, before any thread starts, and follow it with signals_install_stop() (signals.h),
 * which unblocks the stop signals this function blocks across the exec.
 */
#ifndef DFLASH_BLAS_ENV_H
#define DFLASH_BLAS_ENV_H

/* If OpenBLAS chose the generic kernels and OPENBLAS_CORETYPE is unset, sets it for the best
 * supported family (SkylakeX for AVX-512, Haswell for AVX2) and execv()s /proc/self/exe with
 * argv. Returns normally when nothing needs doing or the exec failed (slow but correct). */
void blas_select_fast_kernels(char **argv);

#endif
