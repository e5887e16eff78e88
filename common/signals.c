/* signals: see signals.h. */
#include "signals.h"

#include <signal.h>
#include <stddef.h>

static void stop_set(sigset_t *s)
{
    sigemptyset(s);
    sigaddset(s, SIGINT);
    sigaddset(s, SIGTERM);
}

void signals_block_stop(void)
{
    sigset_t s;
    stop_set(&s);
    sigprocmask(SIG_BLOCK, &s, NULL);
}

void signals_ignore_write_faults(void)
{
    signal(SIGPIPE, SIG_IGN);
    /* a file size limit (ulimit -f, systemd's LimitFSIZE) is a write error, EFBIG, which every
     * writer reports as it does a full disk (defect: the process was killed, a broker amid a
     * journal write included) */
    signal(SIGXFSZ, SIG_IGN);
}

void signals_install_stop(void (*on_stop)(int))
{
    if (on_stop) {
        struct sigaction sa = {.sa_handler = on_stop};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    signals_ignore_write_faults();
    sigset_t s;
    stop_set(&s);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
}

static volatile sig_atomic_t stop_flag;

static void set_stop_flag(int sig)
{
    stop_flag = sig;
}

volatile sig_atomic_t *signals_install_stop_flag(void)
{
    signals_install_stop(set_stop_flag);
    return &stop_flag;
}
