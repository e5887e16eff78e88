/* test_fuzz_dispatch: a bounded, deterministic mutation fuzzer over the broker's whole input path
 * (wire_unpack + range checks + broker_dispatch into policy and ledger).
 *
 * A corpus of valid envelopes (a target and a drafter session: hello, pool registration, work,
 * slot ready, claim, release, ack, commit, rewind, status, set, pause/resume/drain) is replayed
 * and mutated (bit flips, byte overwrites with interesting values, truncation, insertion,
 * splicing two messages, random bytes), from a few routing ids: a valid envelope comes from its
 * session's id, a mutated one mostly from its seed's and sometimes from another (the choice is
 * not taken from the envelope, whose first byte is the same in every valid one; libFuzzer: the
 * input's first byte picks the id, the rest is the envelope). Each input must get a reply that
 * is itself a valid envelope from the broker; an input wire_unpack rejects must get an ERROR and
 * bump the malformed counter. Runs under ASan/UBSan in CI. Iterations: DFLASH_FUZZ_ITERS
 * (default 30000, a few seconds). Built with -DDFLASH_LIBFUZZER and clang -fsanitize=fuzzer,
 * the same file is a libFuzzer target (LLVMFuzzerTestOneInput). */
#include "broker.h"
#include "check.h"
#include "config.h"
#include "err.h"
#include "log.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

static broker *fz_broker;
static uv_loop_t fz_loop;
static uint8_t out[WIRE_MAX_MSG];
static uint64_t rejected, bad_replies;

static broker *fz_setup(void)
{
    log_init("fuzz", LOG_ERROR);
    queue_config cfg;
    char *argv[] = {"fuzz", NULL};
    if (config_load(broker_config_table(), &cfg, 1, argv, NULL, 0, NULL)) return NULL;
    snprintf(cfg.journal, sizeof cfg.journal, "none");
    cfg.min_ready = 1;
    snprintf(cfg.log_level, sizeof cfg.log_level, "error");
    uv_loop_init(&fz_loop);
    return broker_new(&fz_loop, &cfg, NULL);
}

enum { RID_TARGET, RID_DRAFTER, RID_CTL, RID_OTHER, N_RIDS };

/* One input through the broker from routing id number pick (mod N_RIDS); checks the reply. */
static void fz_one(unsigned pick, const uint8_t *data, size_t len)
{
    static const char *const rids[] = {"target-t-1", "drafter-d-2", "ctl-c-3", "drafter-e-4"};
    const char *rid = rids[pick % N_RIDS];
    wire_msg m;
    int unpack_rc = wire_unpack(data, len, &m, NULL, 0);
    wire_msg_clear(&m);
    wire_status before;
    broker_status(fz_broker, &before);
    int n = broker_dispatch(fz_broker, (const uint8_t *)rid, strlen(rid), data, len, out,
                            sizeof out);
    wire_msg r;
    if (n <= 0 || wire_unpack(out, (size_t)n, &r, NULL, 0) != 0 || r.role != WIRE_ROLE_BROKER) {
        bad_replies++;
        return;
    }
    if (unpack_rc) {
        wire_status after;
        broker_status(fz_broker, &after);
        rejected++;
        if (r.type != WIRE_ERROR || after.malformed != before.malformed + 1) bad_replies++;
    }
    wire_msg_clear(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (!fz_broker) fz_broker = fz_setup();
    if (len) fz_one(data[0], data + 1, len - 1);
    return 0;
}

#ifndef DFLASH_LIBFUZZER

typedef struct {
    uint8_t data[4096];
    size_t len;
    unsigned rid; /* its session's routing id */
} seed;

static seed corpus[64];
static int n_corpus;

static void add(wire_msg *m)
{
    seed *s = &corpus[n_corpus];
    int n = wire_pack(m, s->data, sizeof s->data);
    if (n <= 0) return;
    s->len = (size_t)n;
    s->rid = m->role == WIRE_ROLE_TARGET ? RID_TARGET
             : m->role == WIRE_ROLE_CTL  ? RID_CTL
                                         : RID_DRAFTER;
    n_corpus++;
}

/* Valid sessions: the target uses incarnation 1, the drafter 2, each from its own routing id;
 * mutated inputs sent from another id exercise the STALE paths too. */
static void build_corpus(void)
{
    wire_msg m;
    wire_msg_init(&m, WIRE_HELLO, WIRE_ROLE_TARGET, 1, 1);
    strcpy(m.u.hello.name, "t");
    add(&m);
    wire_msg_init(&m, WIRE_HELLO, WIRE_ROLE_DRAFTER, 2, 1);
    strcpy(m.u.hello.name, "d");
    m.u.hello.n_held = 2;
    m.u.hello.held[1] = (wire_unit){0, 1, 3};
    add(&m);
    uint8_t ev[2][WIRE_HANDLE_BYTES] = {{1}, {2}};
    /* a CUDA pool first; the host pool then replaces it (a new pool incarnation) and is the
     * one the work requests below name */
    wire_msg_init(&m, WIRE_POOL_REGISTER, WIRE_ROLE_TARGET, 1, 2);
    wire_pool *p = &m.u.pool;
    p->pool_incarnation = 10;
    p->backend = WIRE_BACKEND_CUDA;
    p->event_handles = (const uint8_t(*)[WIRE_HANDLE_BYTES])ev;
    p->n_events = 2;
    p->slot_count = 2;
    p->slot_size = 1 << 21;
    p->n_buckets = 2;
    p->bucket_upper[0] = 512, p->bucket_upper[1] = 1024;
    p->bucket_share[0] = 0.25, p->bucket_share[1] = 0.75;
    p->bucket_batches[0] = p->bucket_batches[1] = 4;
    p->epochs = 1;
    add(&m);
    wire_msg_init(&m, WIRE_POOL_REGISTER, WIRE_ROLE_TARGET, 1, 2);
    *p = (wire_pool){0};
    p->pool_incarnation = 9;
    p->backend = WIRE_BACKEND_HOST;
    strcpy(p->shm_name, "/f");
    p->slot_count = 8;
    p->slot_size = 4096;
    p->n_buckets = 2;
    p->bucket_upper[0] = 512, p->bucket_upper[1] = 1024;
    p->bucket_share[0] = 0.5, p->bucket_share[1] = 0.5;
    p->bucket_batches[0] = p->bucket_batches[1] = 4;
    p->epochs = 2;
    add(&m);
    for (int i = 0; i < 4; i++) {
        wire_msg_init(&m, WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, 1, 3);
        m.u.pool_incarnation = 9;
        add(&m);
        wire_msg_init(&m, WIRE_SLOT_READY, WIRE_ROLE_TARGET, 1, 4);
        m.u.ready = (wire_slot_ready){9, (uint32_t)i, {0, (uint32_t)i % 2, (uint64_t)i / 2}, 100, 2};
        add(&m);
    }
    wire_msg_init(&m, WIRE_CLAIM, WIRE_ROLE_DRAFTER, 2, 5);
    add(&m);
    wire_msg_init(&m, WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, 2, 6);
    m.u.lease_id = 1;
    add(&m);
    wire_msg_init(&m, WIRE_ACK, WIRE_ROLE_DRAFTER, 2, 7);
    m.u.ack = (wire_ack){{0, 0, 0}, 1};
    add(&m);
    wire_msg_init(&m, WIRE_CHECKPOINT_COMMITTED, WIRE_ROLE_DRAFTER, 2, 8);
    m.u.step = 1;
    add(&m);
    wire_msg_init(&m, WIRE_RESUME_FROM, WIRE_ROLE_DRAFTER, 2, 9);
    m.u.step = 0;
    add(&m);
    wire_msg_init(&m, WIRE_HEARTBEAT, WIRE_ROLE_DRAFTER, 2, 10);
    add(&m);
    wire_msg_init(&m, WIRE_STATUS_REQUEST, WIRE_ROLE_CTL, 3, 11);
    add(&m);
    wire_msg_init(&m, WIRE_SET_CONFIG, WIRE_ROLE_CTL, 3, 12);
    m.u.settings.n = 2;
    strcpy(m.u.settings.kv[0].key, "min_ready");
    strcpy(m.u.settings.kv[0].value, "2");
    strcpy(m.u.settings.kv[1].key, "shares");
    strcpy(m.u.settings.kv[1].value, "0.3,0.7");
    add(&m);
    wire_type modes[] = {WIRE_PAUSE, WIRE_RESUME, WIRE_DRAIN, WIRE_RESUME};
    for (int i = 0; i < 4; i++) {
        wire_msg_init(&m, modes[i], WIRE_ROLE_CTL, 3, 13);
        add(&m);
    }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

static size_t mutate(uint8_t *buf, size_t len, size_t cap)
{
    static const uint8_t interesting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x08, 0x10, 0x12, 0x1a};
    int rounds = rnd() % 4 ? 1 : 2 + (int)(rnd() % 3);
    for (int r = 0; r < rounds; r++) {
        switch (rnd() % 7) {
        case 0: if (len) buf[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8)); break;
        case 1: if (len) buf[rnd() % len] = interesting[rnd() % sizeof interesting]; break;
        case 2: if (len) len = rnd() % len; break; /* truncate */
        case 3: /* insert a byte */
            if (len + 1 < cap) {
                size_t at = len ? rnd() % len : 0;
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = (uint8_t)rnd();
                len++;
            }
            break;
        case 4: { /* splice another corpus entry's tail */
            const seed *o = &corpus[rnd() % n_corpus];
            size_t at = len ? rnd() % len : 0, from = rnd() % o->len, n = o->len - from;
            if (at + n > cap) n = cap - at;
            memcpy(buf + at, o->data + from, n);
            len = at + n;
            break;
        }
        case 5: /* a run of random bytes */
            for (size_t i = 0, at = len ? rnd() % len : 0; i < 8 && at + i < len; i++)
                buf[at + i] = (uint8_t)rnd();
            break;
        default: /* a varint to its maximum */
            if (len > 2) {
                size_t at = rnd() % (len - 1);
                buf[at] = 0xff;
                buf[at + 1] = 0x7f;
            }
        }
    }
    return len;
}

int main(void)
{
    fz_broker = fz_setup();
    CHECK(fz_broker != NULL);
    if (!fz_broker) CHECK_DONE();
    build_corpus();
    CHECK(n_corpus > 20);
    const char *it = getenv("DFLASH_FUZZ_ITERS");
    long iters = it ? atol(it) : 30000;
    /* The valid corpus first, in order, twice (sessions get established). */
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < n_corpus; i++) fz_one(corpus[i].rid, corpus[i].data, corpus[i].len);
    CHECK_EQ_INT(bad_replies, 0);
    wire_status est; /* the sessions exist: the pool's slots, a drafter's grant */
    broker_status(fz_broker, &est);
    CHECK(est.slot_count > 0);
    CHECK(est.grants > 0);
    static uint8_t buf[8192];
    for (long i = 0; i < iters; i++) {
        const seed *s = &corpus[rnd() % n_corpus];
        unsigned pick = rnd() % 4 ? s->rid : rnd();
        size_t len;
        if (rnd() % 16 == 0) { /* pure noise */
            len = rnd() % 256;
            for (size_t k = 0; k < len; k++) buf[k] = (uint8_t)rnd();
        } else {
            memcpy(buf, s->data, s->len);
            len = mutate(buf, s->len, sizeof buf);
        }
        fz_one(pick, buf, len);
        if (rnd() % 64 == 0) { /* keep the sessions alive so deep paths stay reachable */
            int k = (int)(rnd() % n_corpus);
            fz_one(corpus[k].rid, corpus[k].data, corpus[k].len);
        }
    }
    printf("%ld inputs, %llu rejected by the wire checks\n", iters, (unsigned long long)rejected);
    CHECK_EQ_INT(bad_replies, 0);
    CHECK(rejected > (uint64_t)iters / 10); /* the mutator really produces bad input */
    wire_status s;
    broker_status(fz_broker, &s);
    CHECK(s.malformed >= rejected); /* plus well-formed replies sent as requests */
    broker_destroy(&fz_broker);
    uv_run(&fz_loop, UV_RUN_NOWAIT);
    CHECK_EQ_INT(uv_loop_close(&fz_loop), 0);
    CHECK_DONE();
}
#endif
