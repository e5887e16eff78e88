/* blas_env: see blas_env.h. */
#include "blas_env.h"
#include "signals.h"

#include <cblas.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

void blas_select_fast_kernels(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE") || strcasecmp(openblas_get_corename(), "prescott") != 0)
        return;
    __builtin_cpu_init();
    const char *core = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        core = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        core = "Haswell";
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    /* A stop request during the exec must survive it: blocked signals stay pending across
     * execv, and the new image unblocks them once its handler is installed (signals.h). */
    signals_block_stop();
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the slow kernels (the caller's signals_install_stop unblocks) */
}
