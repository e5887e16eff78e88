/* test_heartbeat: the heartbeat thread's watchdog (heartbeat.h). A loop that stops calling
 * heartbeat_alive for longer than stall_s ends its process with exit status 5 (a hung daemon
 * would otherwise keep its leases and in-flight batches for ever); a loop that keeps calling it,
 * or a watchdog of 0, never does; heartbeat_stop joins the thread. A stuck stderr (the
 * watchdog's message cannot be written) does not keep the process alive. Each case runs in a child
 * process, since the watchdog ends the whole process. */
#include "check.h"
#include "client.h"
#include "heartbeat.h"
#include "monotime.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* stderr becomes a pipe that is full and never read (a log collector that hangs): the next
 * write to it blocks for ever. -1 when it cannot be set up. */
static int fill_stderr(void)
{
    int fd[2];
    if (pipe(fd) < 0) return -1;
    int fl = fcntl(fd[1], F_GETFL);
    if (fcntl(fd[1], F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    char block[4096];
    memset(block, 'x', sizeof block);
    while (write(fd[1], block, sizeof block) > 0) {
    }
    while (write(fd[1], block, 1) > 0) {
    }
    if (errno != EAGAIN || fcntl(fd[1], F_SETFL, fl) < 0 || dup2(fd[1], 2) < 0) return -1;
    return 0; /* fd[0] stays open and unread: writes block instead of failing */
}

/* A child that runs a loop for run_s seconds, calling heartbeat_alive every alive_ms (0: never),
 * under a watchdog of stall_s; its exit status (0 when the loop ended and the thread stopped),
 * and in *took the seconds until it ended. */
static int child(double stall_s, int alive_ms, double run_s, bool stuck_stderr, double *took)
{
    double t0 = monotime_s();
    pid_t pid = fork();
    if (pid == 0) {
        alarm((unsigned)run_s + 5); /* a child stuck for good dies of SIGALRM: no exit status */
        if (stuck_stderr && fill_stderr() < 0) _exit(10);
        /* no broker: the client never learns an incarnation, so only the watchdog acts */
        client *c = client_new("ipc:///nonexistent/dflash-test-heartbeat.sock", WIRE_ROLE_DRAFTER,
                               "hb");
        heartbeat *h = heartbeat_start(c, stall_s, "the test's loop");
        if (!h) _exit(9);
        while (monotime_s() - t0 < run_s) {
            if (alive_ms) heartbeat_alive(h);
            monotime_sleep_ms(alive_ms ? alive_ms : 50);
        }
        heartbeat_stop(&h);
        client_destroy(&c);
        _exit(h == NULL ? 0 : 8);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    *took = monotime_s() - t0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    double took = 0;
    /* hung: no heartbeat_alive for 0.3 s ends the process with status 5, well before its 3 s */
    CHECK_EQ_INT(child(0.3, 0, 3.0, false, &took), HEARTBEAT_STALL_EXIT);
    CHECK(took >= 0.3 && took < 2.0);
    /* ... also when its stderr blocks (the watchdog's own message cannot be written): within
     * the message's grace, not never (the loop runs 30 s: an exit 0 means no watchdog) */
    CHECK_EQ_INT(child(0.3, 0, 30.0, true, &took), HEARTBEAT_STALL_EXIT);
    CHECK(took >= 0.3 && took < 0.3 + HEARTBEAT_LOG_GRACE_MS / 1000.0 + 1.5);
    /* alive every 50 ms for 1 s under the same watchdog: the loop ends normally */
    CHECK_EQ_INT(child(0.3, 50, 1.0, false, &took), 0);
    /* no watchdog (0): a loop that never reports progress still ends normally */
    CHECK_EQ_INT(child(0, 0, 0.6, false, &took), 0);
    CHECK_DONE();
}
