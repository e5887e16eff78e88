/* test_pool_reach: the up-front peer-access decision for a cuda pool on another GPU, without a
 * GPU: for each answer the CUDA runtime can give (pool GPU named or not, visible or hidden, same
 * device, peer access or none), the outcome the importer acts on (NO_PEER alone stops the
 * drafter) and the one line it logs, which must name both GPUs and say what to do. Also which
 * strings pass for a PCI bus id (they travel in the protocol). */
#include "check.h"
#include "log.h"
#include "pool_reach.h"

#include <string.h>

static char msg[1024];

static pool_reach decide(pool_reach_facts f) { return pool_reach_decide(&f, msg, sizeof msg); }

static bool says(const char *s) { return strstr(msg, s) != NULL; }

static void test_unknown(void)
{
    /* an older target or broker: no bus id; whatever the runtime would say, map as before */
    CHECK_EQ_INT(decide((pool_reach_facts){.pool_bus_id = "", .device = 1, .visible = true}),
                 POOL_REACH_UNKNOWN);
    CHECK(msg[0] == '\0');
    CHECK_EQ_INT(decide((pool_reach_facts){.pool_bus_id = NULL, .device = 1}), POOL_REACH_UNKNOWN);
}

static void test_same_gpu(void)
{
    pool_reach r = decide((pool_reach_facts){.pool_bus_id = "0000:1b:00.0", .device = 0,
                                             .device_bus_id = "0000:1b:00.0", .visible = true,
                                             .pool_device = 0, .can_access_peer = false});
    CHECK_EQ_INT(r, POOL_REACH_SAME); /* cudaDeviceCanAccessPeer(d, d) is 0: not asked */
    CHECK(says("own GPU") && says("0000:1b:00.0"));
    CHECK_EQ_INT(pool_reach_level(r), LOG_INFO);
}

static void test_peer(void)
{
    pool_reach r = decide((pool_reach_facts){.pool_bus_id = "0000:1b:00.0", .device = 2,
                                             .device_bus_id = "0000:43:00.0", .visible = true,
                                             .pool_device = 0, .can_access_peer = true});
    CHECK_EQ_INT(r, POOL_REACH_PEER);
    CHECK(says("0000:1b:00.0") && says("0000:43:00.0") && says("peer access"));
    CHECK_EQ_INT(pool_reach_level(r), LOG_INFO);
}

static void test_no_peer(void)
{
    pool_reach r = decide((pool_reach_facts){.pool_bus_id = "0000:1b:00.0", .device = 1,
                                             .device_bus_id = "0000:c3:00.0", .visible = true,
                                             .pool_device = 0, .can_access_peer = false});
    CHECK_EQ_INT(r, POOL_REACH_NO_PEER);
    CHECK(says("0000:1b:00.0") && says("0000:c3:00.0")); /* both GPUs */
    CHECK(says("no peer access") && says("nvidia-smi topo -m") && says("NVLink"));
    CHECK_EQ_INT(pool_reach_level(r), LOG_ERROR);
    /* the importer's own bus id unknown: still a clear line */
    r = decide((pool_reach_facts){.pool_bus_id = "0000:1b:00.0", .device = 1, .visible = true,
                                  .pool_device = 0});
    CHECK_EQ_INT(r, POOL_REACH_NO_PEER);
    CHECK(says("bus id unknown") && says("device 1"));
}

static void test_hidden(void)
{
    /* CUDA_VISIBLE_DEVICES hides the pool's GPU: peer access cannot be asked, and CUDA IPC may
     * still open it, so warn and go on */
    pool_reach r = decide((pool_reach_facts){.pool_bus_id = "0000:1b:00.0", .device = 0,
                                             .device_bus_id = "0000:43:00.0", .visible = false,
                                             .can_access_peer = true, .visible_devices = "2,3"});
    CHECK_EQ_INT(r, POOL_REACH_HIDDEN);
    CHECK(says("0000:1b:00.0") && says("CUDA_VISIBLE_DEVICES=2,3"));
    CHECK_EQ_INT(pool_reach_level(r), LOG_WARN);
    r = decide((pool_reach_facts){.pool_bus_id = "0000:1b:00.0", .device = 0, .visible = false});
    CHECK_EQ_INT(r, POOL_REACH_HIDDEN);
    CHECK(says("CUDA_VISIBLE_DEVICES=(unset)"));
}

static void test_bus_id_valid(void)
{
    CHECK(pool_bus_id_valid("", 32));
    CHECK(pool_bus_id_valid("0000:1b:00.0", 32));
    CHECK(pool_bus_id_valid("00000000:1B:00.0", 32));
    CHECK(!pool_bus_id_valid("0000:1b:00.0 ", 32));
    CHECK(!pool_bus_id_valid("GPU-1234", 32));
    CHECK(!pool_bus_id_valid("0000:1b:00.0", 12)); /* no terminator within cap */
}

int main(void)
{
    test_unknown();
    test_same_gpu();
    test_peer();
    test_no_peer();
    test_hidden();
    test_bus_id_valid();
    CHECK_DONE();
}
