/* broker_silence: see broker_silence.h. */
#include "broker_silence.h"

#include "err.h"
#include "log.h"
#include "monotime.h"

#include <stdio.h>
#include <string.h>

void broker_silence_note(broker_silence *s, int rc, bool registered, const char *why)
{
    if (rc != DFLASH_ETIMEOUT && s->since > 0) {
        LOG_INFO(s->never_answered ? "the broker answers after %.1f s"
                                   : "the broker answers again after %.1f s",
                 monotime_s() - s->since);
        s->since = 0;
    } else if (rc == DFLASH_ETIMEOUT && s->since == 0) {
        s->since = monotime_s();
        s->never_answered = !registered;
        if (registered)
            LOG_WARN("%s: waiting for the broker to come back", why ? why : "no reply");
        else
            LOG_INFO("%s: no broker has answered yet; waiting for one (--broker-wait-ms; check "
                     "--runtime-dir or --broker if none is coming)", why ? why : "no reply");
    }
}

void broker_silence_suffix(const broker_silence *s, char *buf, size_t len)
{
    if (!len) return;
    buf[0] = '\0';
    if (s->since > 0)
        snprintf(buf, len, s->never_answered ? ", waiting for a broker (none answered for %.0f s)"
                                             : ", waiting for the broker (silent for %.0f s)",
                 monotime_s() - s->since);
}

void broker_silence_give_up(const char *endpoint, double waited_s, long long wait_ms,
                            long long timeout_ms, bool answered, const char *why)
{
    if (answered)
        LOG_ERROR("the broker at %s did not take our hello for %.1f s (--broker-wait-ms %lld): "
                  "its last answer: %s", endpoint, waited_s, wait_ms, why && *why ? why : "?");
    else
        LOG_ERROR("no broker answered at %s for %.1f s (--broker-wait-ms %lld, checked after each "
                  "request, which waits up to --timeout-ms %lld; is dflash-queue running?%s)",
                  endpoint, waited_s, wait_ms, timeout_ms,
                  strncmp(endpoint, "tcp://", 6) == 0
                      ? " A tcp:// broker answers only the CURVE keys it knows, unless it "
                        "runs with --insecure-tcp: check --curve-server-key and --curve-key"
                      : "");
}
