/* test_steering: the runtime steering the broker journals (steering.h), on its own: what is
 * captured, the payload's form and every way a payload is refused, and the restore rule.
 *   - capture: only live options whose value differs from the configured one (a non-live option
 *     changed in the struct is not steering: heartbeat-ms);
 *   - encode / decode round trip; encode refuses a buffer one byte short; decode refuses a first
 *     key other than "mode", a mode it does not know, a name of STEERING_NAME_MAX characters (no
 *     room for its NUL), a payload cut inside a string, and more than STEERING_MAX_KEYS entries;
 *   - restore: an entry whose recorded configured value is today's is restored, one whose
 *     configuration changed since is not, a non-live option, an unknown one or a value the
 *     table refuses now is left out, each with its reason in the log; the count says how many
 *     were restored.
 * The broker-level behaviour (journaled at set/pause/drain, restored at start-up, said in the
 * log) is test_broker_durable's and itest_live_set's. */
#include "check.h"
#include "broker.h"
#include "err.h"
#include "log.h"
#include "steering.h"
#include "test_files.h"

#include <stdlib.h>
#include <string.h>

static const cfg_table *table;

static void configured_defaults(queue_config *c)
{
    char *argv[] = {"test", NULL};
    CHECK_EQ_INT(config_load(table, c, 1, argv, NULL, 0, NULL), 0);
}

static void test_capture_rule(void)
{
    queue_config conf, now;
    configured_defaults(&conf);
    now = conf;
    now.min_ready = 4;      /* live: captured */
    now.heartbeat_ms = 500; /* not live: not steering */
    steering_state s;
    steering_capture(table, &conf, &now, POLICY_PAUSED, &s);
    CHECK_EQ_INT((int)s.n, 1);
    CHECK(s.mode == POLICY_PAUSED);
    CHECK(strcmp(s.kv[0].name, "min-ready") == 0 && strcmp(s.kv[0].value, "4") == 0 &&
          strcmp(s.kv[0].configured, "30") == 0);
}

/* A payload of n entries "min-ready" = "1" / "30" after "mode" and mode, into buf. Its length. */
static size_t payload(uint8_t *buf, size_t cap, const char *key, const char *mode, int n)
{
    size_t at = 0;
    const char *head[2] = {key, mode};
    for (int i = 0; i < 2; i++) {
        size_t l = strlen(head[i]) + 1;
        if (at + l > cap) return at;
        memcpy(buf + at, head[i], l), at += l;
    }
    for (int k = 0; k < n; k++)
        for (int j = 0; j < 3; j++) {
            const char *s = j == 0 ? "min-ready" : j == 1 ? "1" : "30";
            size_t l = strlen(s) + 1;
            if (at + l > cap) return at;
            memcpy(buf + at, s, l), at += l;
        }
    return at;
}

static void test_payload(void)
{
    steering_state s = {.mode = POLICY_DRAINING, .n = 2}, back;
    snprintf(s.kv[0].name, sizeof s.kv[0].name, "min-ready");
    snprintf(s.kv[0].value, sizeof s.kv[0].value, "4");
    snprintf(s.kv[0].configured, sizeof s.kv[0].configured, "30");
    snprintf(s.kv[1].name, sizeof s.kv[1].name, "shares");
    s.kv[1].value[0] = 0; /* an empty value */
    snprintf(s.kv[1].configured, sizeof s.kv[1].configured, "a=1,b=2");
    static uint8_t buf[STEERING_PAYLOAD_MAX + 4096];
    int len = steering_encode(&s, buf, sizeof buf);
    CHECK(len > 0);
    CHECK_EQ_INT(steering_decode(buf, (size_t)len, &back), 0);
    CHECK(back.mode == POLICY_DRAINING && back.n == 2 &&
          strcmp(back.kv[0].value, "4") == 0 && strcmp(back.kv[1].value, "") == 0 &&
          strcmp(back.kv[1].configured, "a=1,b=2") == 0);
    CHECK_EQ_INT(steering_encode(&s, buf, (size_t)len - 1), DFLASH_ENOMEM);
    CHECK_EQ_INT(steering_encode(&s, buf, (size_t)len), len);
    CHECK_EQ_INT(steering_decode(buf, (size_t)len - 1, &back), DFLASH_ECORRUPT); /* cut */

    size_t n = payload(buf, sizeof buf, "mode", "paused", STEERING_MAX_KEYS);
    CHECK_EQ_INT(steering_decode(buf, n, &back), 0);
    CHECK(back.n == STEERING_MAX_KEYS && back.mode == POLICY_PAUSED);
    n = payload(buf, sizeof buf, "mode", "paused", STEERING_MAX_KEYS + 1);
    CHECK_EQ_INT(steering_decode(buf, n, &back), DFLASH_ECORRUPT);
    n = payload(buf, sizeof buf, "mood", "paused", 1);
    CHECK_EQ_INT(steering_decode(buf, n, &back), DFLASH_ECORRUPT);
    n = payload(buf, sizeof buf, "mode", "sleeping", 1);
    CHECK_EQ_INT(steering_decode(buf, n, &back), DFLASH_ECORRUPT);
    char name[STEERING_NAME_MAX + 1];
    memset(name, 'k', STEERING_NAME_MAX);
    name[STEERING_NAME_MAX] = 0;
    n = payload(buf, sizeof buf, "mode", "running", 0);
    memcpy(buf + n, name, sizeof name), n += sizeof name;
    memcpy(buf + n, "1\0" "2", 4), n += 4;
    CHECK_EQ_INT(steering_decode(buf, n, &back), DFLASH_ECORRUPT);
    name[STEERING_NAME_MAX - 1] = 0; /* one shorter: taken */
    n = payload(buf, sizeof buf, "mode", "running", 0);
    memcpy(buf + n, name, STEERING_NAME_MAX), n += STEERING_NAME_MAX;
    memcpy(buf + n, "1\0" "2", 4), n += 4;
    CHECK_EQ_INT(steering_decode(buf, n, &back), 0);
}

static void test_restore(void)
{
    queue_config cfg;
    configured_defaults(&cfg);
    cfg.max_depth = 50; /* configured now; it was 90 when the runtime value was set */
    steering_state j = {.mode = POLICY_RUNNING, .n = 5};
    const char *e[5][3] = {{"min-ready", "4", "30"},       /* configured as then: restored */
                           {"max-depth", "120", "90"},     /* configuration changed: stays 50 */
                           {"heartbeat-ms", "200", "1000"}, /* not live: left out */
                           {"lease-timeout-ms", "abc", "5000"}, /* refused now: left out */
                           {"no-such-option", "1", "2"}};
    for (int i = 0; i < 5; i++) {
        snprintf(j.kv[i].name, sizeof j.kv[i].name, "%s", e[i][0]);
        snprintf(j.kv[i].value, sizeof j.kv[i].value, "%s", e[i][1]);
        snprintf(j.kv[i].configured, sizeof j.kv[i].configured, "%s", e[i][2]);
    }
    log_init("test", LOG_WARN);
    test_capture cap = test_capture_begin();
    int restored = steering_restore(table, &j, &cfg);
    char *said = test_capture_end(&cap);
    log_init("test", LOG_ERROR);
    CHECK_EQ_INT(restored, 1);
    /* each left out for its own reason, said */
    CHECK(said && strstr(said, "heartbeat_ms=200, which is not a live setting") &&
          strstr(said, "lease_timeout_ms=abc from the journal refused") &&
          strstr(said, "no_such_option=1, which is not a live setting"));
    free(said);
    CHECK(cfg.min_ready == 4 && cfg.max_depth == 50 && cfg.heartbeat_ms == 1000 &&
          cfg.lease_timeout_ms == 5000);
}

int main(void)
{
    log_init("test", LOG_ERROR);
    table = broker_config_table();
    test_capture_rule();
    test_payload();
    test_restore();
    CHECK_DONE();
}
