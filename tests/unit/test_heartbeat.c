/* test_heartbeat: the heartbeat thread's watchdog (heartbeat.h). A loop that stops calling
 * heartbeat_alive for longer than stall_s ends its process with exit status 5 (a hung daemon
 * would otherwise keep its leases and in-flight batches for ever); a loop that keeps calling it,
 * or a watchdog of 0, never does; heartbeat_stop joins the thread. Each case runs in a child
 * process, since the watchdog ends the whole process. */
#include "check.h"
#include "client.h"
#include "heartbeat.h"
#include "monotime.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child that runs a loop for run_s seconds, calling heartbeat_alive every alive_ms (0: never),
 * under a watchdog of stall_s; its exit status (0 when the loop ended and the thread stopped),
 * and in *took the seconds until it ended. */
static int child(double stall_s, int alive_ms, double run_s, double *took)
{
    double t0 = monotime_s();
    pid_t pid = fork();
    if (pid == 0) {
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
    CHECK_EQ_INT(child(0.3, 0, 3.0, &took), HEARTBEAT_STALL_EXIT);
    CHECK(took >= 0.3 && took < 2.0);
    /* alive every 50 ms for 1 s under the same watchdog: the loop ends normally */
    CHECK_EQ_INT(child(0.3, 50, 1.0, &took), 0);
    /* no watchdog (0): a loop that never reports progress still ends normally */
    CHECK_EQ_INT(child(0, 0, 0.6, &took), 0);
    CHECK_DONE();
}
