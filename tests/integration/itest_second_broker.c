/* itest_second_broker: a second dflash-queue started on the runtime dir of a running one (no
 * journal, so nothing else stops it) must exit with an error and leave the first one serving.
 * ZeroMQ's ipc bind replaces the socket file, so the second used to take the path over: new
 * clients reached it, and once it exited the first broker was unreachable. A broker SIGKILLed
 * leaves its socket file behind; the next one still starts on it. */
#include "check.h"
#include "harness.h"

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    char dir[64], ep[128], rt[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    const char *extra[] = {"--journal=none", NULL};
    pid_t first = h_start_queue(argv[1], dir, extra);
    CHECK(first > 0);
    if (first <= 0) CHECK_DONE();
    uint64_t inc = h_wait_broker(ep, H_BROKER_UP_MS);
    CHECK(inc != 0);

    char *argv2[] = {argv[1], rt, "--journal=none", NULL};
    pid_t second = h_spawn(argv2, NULL);
    /* until the second one exits, or some other broker than the first answers */
    int status = 0;
    bool exited = false, other = false;
    uint64_t end = h_now_ms() + 20000;
    while (!exited && !other && h_now_ms() < end) {
        exited = waitpid(second, &status, WNOHANG) == second;
        uint64_t now = h_wait_broker(ep, 2000);
        other = now != 0 && now != inc;
    }
    CHECK(exited);
    CHECK(!other);
    CHECK(exited && WIFEXITED(status) && WEXITSTATUS(status) == 1);
    if (!exited) h_kill(second, SIGKILL);
    CHECK(h_wait_broker(ep, H_BROKER_UP_MS) == inc);

    /* the first broker dies by SIGKILL: its socket file stays, and a new broker starts on it */
    h_kill(first, SIGKILL);
    pid_t third = h_start_queue(argv[1], dir, extra);
    CHECK(third > 0);
    uint64_t inc3 = h_wait_broker(ep, H_BROKER_UP_MS);
    CHECK(inc3 != 0 && inc3 != inc);
    CHECK_EQ_INT(h_stop(third), 0);
    h_rmdir(dir);
    CHECK_DONE();
}
