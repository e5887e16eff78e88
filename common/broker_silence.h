/* broker_silence: how a registered daemon (dflash-target, dflash-drafter) tells its log that the
 * broker went quiet and came back. By design a daemon that has registered waits for a lost broker
 * to return (DESIGN.md section 5); these lines say that it is waiting, and for whom, instead of
 * blaming its peers ("waiting for a free slot 100%").
 *
 * broker_silence_note takes the result of every request to the broker: the first
 * DFLASH_ETIMEOUT after a registration logs one warning, the next answer (any other result) logs
 * how long the silence lasted. broker_silence_suffix gives the progress line's ", waiting for the
 * broker (silent for N s)" while silent, else "". Thread: the daemon's main loop. */
#ifndef DFLASH_BROKER_SILENCE_H
#define DFLASH_BROKER_SILENCE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct broker_silence {
    double since; /* monotime_s() of the first unanswered request; 0 while the broker answers */
} broker_silence;

/* rc: the request's result; registered: whether the daemon has registered at least once (before
 * that, --broker-wait-ms governs); why: the client's last error, for the warning. */
void broker_silence_note(broker_silence *s, int rc, bool registered, const char *why);
void broker_silence_suffix(const broker_silence *s, char *buf, size_t len);

#endif
