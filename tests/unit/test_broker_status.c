/* test_broker_status: the live targets and drafters a status reply lists (dflash-ctl status and
 * dflash-ctl peer, a container's healthcheck, read them), from a broker driven in-process
 * (broker_stub.h):
 *   - targets first, then drafters; a ctl is not listed; a request's peer_prefix lists only the
 *     names that start so (dflash-ctl peer asks so: past 64 peers its own is still listed);
 *   - a target's registered pool's slots; a drafter's leases (granted, not released), batches in
 *     training (released, not acked) and whether it trains (said ResumeFrom);
 *   - heard how long ago: the broker's clock since the peer's last message (a peer silent for
 *     300 ms reads at least that, one heard since less);
 *   - at most WIRE_MAX_STATUS_PEERS listed, the rest counted in peers_unlisted. */
#include "check.h"
#include "broker_stub.h"
#include "err.h"

#include <stdio.h>

enum { TARGET_INC = 11, POOL_INC = 111 };

static int hello(wire_role role, uint64_t inc, const char *name)
{
    stub_init(WIRE_HELLO, role, inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", name);
    return stub_send(name);
}

/* A ctl's status request listing the peers whose names start with prefix. */
static wire_status status_of(const char *prefix)
{
    stub_init(WIRE_STATUS_REQUEST, WIRE_ROLE_CTL, 99);
    snprintf(stub_req.u.peer_prefix, sizeof stub_req.u.peer_prefix, "%s", prefix);
    CHECK_EQ_INT(stub_send("ctl-c-99"), 0);
    return stub_rep.u.status;
}

static const wire_peer_stat *listed(const wire_status *s, const char *name)
{
    for (uint32_t i = 0; i < s->n_peer_list; i++)
        if (strcmp(s->peer_list[i].name, name) == 0) return &s->peer_list[i];
    return NULL;
}

static void test_listed_peers(void)
{
    stub_broker_new(NULL);
    if (!stub_b) return;
    const stub_drafter d1 = {"d1", "d1", 21}, d2 = {"d2", "d2", 22};
    CHECK_EQ_INT(hello(WIRE_ROLE_DRAFTER, d1.inc, d1.name), 0);
    CHECK_EQ_INT(hello(WIRE_ROLE_TARGET, TARGET_INC, "t"), 0);
    CHECK_EQ_INT(hello(WIRE_ROLE_DRAFTER, d2.inc, d2.name), 0);
    CHECK_EQ_INT(hello(WIRE_ROLE_CTL, 99, "ctl-1"), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.n_peer_list, 3);
    CHECK_EQ_INT(s.peers_unlisted, 0);
    CHECK(strcmp(s.peer_list[0].name, "t") == 0 && s.peer_list[0].role == WIRE_ROLE_TARGET);
    CHECK(strcmp(s.peer_list[1].name, "d1") == 0 && s.peer_list[1].role == WIRE_ROLE_DRAFTER);
    CHECK(strcmp(s.peer_list[2].name, "d2") == 0);
    CHECK(!listed(&s, "ctl-1"));
    CHECK_EQ_INT(s.peer_list[0].slots, 0); /* no pool yet */
    /* d2 heard 300 ms after the others */
    usleep(300 * 1000);
    stub_init(WIRE_HEARTBEAT, WIRE_ROLE_DRAFTER, d2.inc);
    CHECK_EQ_INT(stub_send(d2.rid), 0);
    s = stub_status();
    const wire_peer_stat *h1 = listed(&s, "d1"), *h2 = listed(&s, "d2");
    CHECK(h1 && h2 && h1->heard_ms_ago >= 300 && h2->heard_ms_ago < h1->heard_ms_ago);
    /* only the names asked for */
    s = status_of("d");
    CHECK(s.n_peer_list == 2 && listed(&s, "d1") && listed(&s, "d2") && !listed(&s, "t"));
    s = status_of("t");
    CHECK(s.n_peer_list == 1 && listed(&s, "t"));
    s = status_of("zz");
    CHECK(s.n_peer_list == 0 && s.peers_unlisted == 0);

    stub_pool("t", TARGET_INC, POOL_INC, 4);
    stub_make_ready("t", TARGET_INC, POOL_INC, 3);
    wire_grant g1, g2;
    CHECK_EQ_INT(stub_claim(&d1, &g1), 0);
    CHECK_EQ_INT(stub_claim(&d1, &g2), 0);
    CHECK_EQ_INT(stub_release(&d1, g1.lease_id), 0); /* in training: released, not acked */
    stub_init(WIRE_RESUME_FROM, WIRE_ROLE_DRAFTER, d2.inc);
    stub_req.u.step = 0;
    CHECK_EQ_INT(stub_send(d2.rid), 0);
    s = stub_status();
    const wire_peer_stat *t = listed(&s, "t"), *p1 = listed(&s, "d1"), *p2 = listed(&s, "d2");
    CHECK(t && p1 && p2);
    if (t && p1 && p2) {
        CHECK_EQ_INT(t->slots, 4);
        CHECK_EQ_INT(p1->leases, 1);
        CHECK_EQ_INT(p1->held, 1);
        CHECK(!p1->trains);
        CHECK_EQ_INT(p2->leases, 0);
        CHECK_EQ_INT(p2->held, 0);
        CHECK(p2->trains);
        CHECK_EQ_INT(p1->slots, 0);
    }
    stub_broker_free();
}

/* More live peers than a reply lists: the first WIRE_MAX_STATUS_PEERS (the target among them,
 * listed first though it came last), the rest counted. */
static void test_peers_unlisted(void)
{
    stub_broker_new(NULL);
    if (!stub_b) return;
    int extra = 7;
    for (int i = 0; i < WIRE_MAX_STATUS_PEERS + extra - 1; i++) {
        char name[32];
        snprintf(name, sizeof name, "drafter-%02d", i);
        CHECK_EQ_INT(hello(WIRE_ROLE_DRAFTER, 1000 + (uint64_t)i, name), 0);
    }
    CHECK_EQ_INT(hello(WIRE_ROLE_TARGET, TARGET_INC, "t"), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.n_peer_list, WIRE_MAX_STATUS_PEERS);
    CHECK_EQ_INT(s.peers_unlisted, extra);
    CHECK(strcmp(s.peer_list[0].name, "t") == 0);
    CHECK(strcmp(s.peer_list[1].name, "drafter-00") == 0);
    /* asked for a prefix: those, whatever the others */
    s = status_of("drafter-6");
    CHECK_EQ_INT(s.n_peer_list, 10); /* drafter-60 .. drafter-69 */
    CHECK_EQ_INT(s.peers_unlisted, 0);
    CHECK(listed(&s, "drafter-69") != NULL);
    stub_broker_free();
}

int main(void)
{
    test_listed_peers();
    test_peers_unlisted();
    CHECK_DONE();
}
