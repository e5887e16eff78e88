/* broker_silence: how a daemon (dflash-target, dflash-drafter) tells its log that the broker is
 * quiet: gone after a registration (by design a daemon that has registered waits for a lost
 * broker to return, DESIGN.md section 5), or not there yet at start-up (--broker-wait-ms; a
 * mistyped --runtime-dir looks like this). These lines say that it is waiting, and for whom,
 * instead of blaming its peers ("waiting for a free slot 100%", "waiting for a grant 0%").
 *
 * broker_silence_note takes the result of every request to the broker: the first
 * DFLASH_ETIMEOUT logs one line (a warning after a registration, info before one), the next
 * answer (any other result) logs how long the silence lasted. broker_silence_suffix gives the
 * progress line's ", waiting for the broker (silent for N s)" (", waiting for a broker (none
 * answered for N s)" before any answer) while silent, else "". Thread: the daemon's main loop. */
#ifndef DFLASH_BROKER_SILENCE_H
#define DFLASH_BROKER_SILENCE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct broker_silence {
    double since;        /* monotime_s() of the first unanswered request; 0 while it answers */
    bool never_answered; /* the silence began before the daemon's first registration */
} broker_silence;

/* rc: the request's result; registered: whether the daemon has registered at least once (before
 * that, --broker-wait-ms governs); why: the client's last error, for the warning. */
void broker_silence_note(broker_silence *s, int rc, bool registered, const char *why);
void broker_silence_suffix(const broker_silence *s, char *buf, size_t len);

/* The error a daemon logs when its first registration has not been taken for --broker-wait-ms
 * (wait_ms; waited_s so far; each request waits up to timeout_ms) at endpoint: "no broker
 * answered" when the last request timed out, else (answered) the broker's reason, why (e.g.
 * its peer table is full), instead of asking whether dflash-queue runs. */
void broker_silence_give_up(const char *endpoint, double waited_s, long long wait_ms,
                            long long timeout_ms, bool answered, const char *why);

#endif
