/* broker_silence: see broker_silence.h. */
#include "broker_silence.h"

#include "err.h"
#include "log.h"
#include "monotime.h"

#include <stdio.h>

void broker_silence_note(broker_silence *s, int rc, bool registered, const char *why)
{
    if (rc != DFLASH_ETIMEOUT && s->since > 0) {
        LOG_INFO("the broker answers again after %.1f s", monotime_s() - s->since);
        s->since = 0;
    } else if (rc == DFLASH_ETIMEOUT && s->since == 0 && registered) {
        s->since = monotime_s();
        LOG_WARN("%s: waiting for the broker to come back", why ? why : "no reply");
    }
}

void broker_silence_suffix(const broker_silence *s, char *buf, size_t len)
{
    if (!len) return;
    buf[0] = '\0';
    if (s->since > 0)
        snprintf(buf, len, ", waiting for the broker (silent for %.0f s)", monotime_s() - s->since);
}
