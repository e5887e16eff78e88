/* signals: how a daemon learns it should stop. SIGINT and SIGTERM call the daemon's handler
 * (which only sets its stop flag); SIGPIPE and SIGXFSZ are ignored (a write past a file size
 * limit fails with EFBIG, reported as a full disk is). Call signals_install_stop() first thing in
 * main(), right after blas_select_fast_kernels(): that function blocks SIGINT/SIGTERM across its
 * re-exec, so a stop requested during start-up stays pending until the handler is in place and is
 * then delivered, instead of killing the process with the default action. Main thread only.
 */
#ifndef DFLASH_SIGNALS_H
#define DFLASH_SIGNALS_H

#include <signal.h>

/* Ignores SIGPIPE (a write to a closed pipe or socket fails with EPIPE) and SIGXFSZ (one past a
 * file size limit fails with EFBIG). */
void signals_ignore_write_faults(void);

/* Installs on_stop for SIGINT and SIGTERM (NULL keeps the default action: tools that just die),
 * ignores SIGPIPE and SIGXFSZ (signals_ignore_write_faults), then unblocks SIGINT and
 * SIGTERM. */
void signals_install_stop(void (*on_stop)(int));

/* signals_install_stop with a handler that sets one process-wide flag; returns the flag, which
 * a daemon's loop polls (the target and the drafter): 0 until a stop signal came, then its
 * number (SIGINT or SIGTERM; `dflash-drafter eval` exits 128 + it, as a shell reports it). */
volatile sig_atomic_t *signals_install_stop_flag(void);

/* Blocks SIGINT and SIGTERM (kept across exec; pending signals stay pending). */
void signals_block_stop(void);

#endif
