/* steering: the operator's runtime steering of the broker (dflash-ctl set, pause, resume, drain)
 * as the payload of the ledger's SETTINGS record (ledger_set_settings), and the rule that
 * restores it when the broker starts again on the same journal.
 *
 * Data: steering_state = the mode and, for each live option of the config table whose runtime
 * value differs from the one configured at start-up, {name, runtime value, configured value}:
 * the configured value recorded with it is what the restore rule compares with.
 * Payload: NUL-terminated strings, "mode", the mode's name (policy_mode_name), then per entry
 * its option name, runtime value and configured value. A value never holds a NUL, so nothing is
 * escaped; the ledger does not look inside.
 *
 * Restore rule (steering_restore): an entry's runtime value wins when the value configured now
 * equals the configured value recorded with it ("restored min_ready=4 from the journal (set at
 * runtime; configured 2)"); otherwise the configuration changed since and wins ("configured
 * min_ready=3 replaces the runtime value 4: ..."). One INFO line per entry. The mode comes back
 * as it was; the broker says so (broker_steering.c).
 *
 * Thread: the broker's loop thread (plain functions over a config table and its struct).
 * Callers: broker_steering.c (capture at every set/pause/resume/drain, restore at start-up),
 * tests.
 */
#ifndef DFLASH_QUEUE_STEERING_H
#define DFLASH_QUEUE_STEERING_H

#include "config.h"
#include "policy.h"

#include <stddef.h>
#include <stdint.h>

#define STEERING_MAX_KEYS 32
#define STEERING_NAME_MAX 64
#define STEERING_VALUE_MAX 256
/* bound on steering_encode's length: "mode", a mode name, STEERING_MAX_KEYS entries */
#define STEERING_PAYLOAD_MAX (16 + STEERING_MAX_KEYS * (STEERING_NAME_MAX + 2 * STEERING_VALUE_MAX))

typedef struct {
    char name[STEERING_NAME_MAX];        /* the table's option name, e.g. "min-ready" */
    char value[STEERING_VALUE_MAX];      /* set at runtime */
    char configured[STEERING_VALUE_MAX]; /* configured when it was set */
} steering_kv;

typedef struct {
    policy_mode mode;
    uint32_t n;
    steering_kv kv[STEERING_MAX_KEYS];
} steering_state;

/* The state to journal: mode, and one entry per live option of t whose value in now (a struct
 * of t) differs from its value in configured (the same struct as configured at start-up). */
void steering_capture(const cfg_table *t, const void *configured, const void *now,
                      policy_mode mode, steering_state *out);

/* Writes the payload of s into out. Returns its length, or DFLASH_ENOMEM when cap is too small. */
int steering_encode(const steering_state *s, uint8_t *out, size_t cap);

/* Reads a payload written by steering_encode. 0, or DFLASH_ECORRUPT (not a whole payload, an
 * unknown mode, a name or value too long, too many entries): out is then undefined. */
int steering_decode(const void *p, size_t len, steering_state *out);

/* Applies the restore rule to cfg (a struct of t holding the configuration now): each entry
 * of journaled whose configured value equals cfg's gets its runtime value; the others keep
 * cfg's. Logs one line per entry (an entry t does not know as live, or whose value t refuses
 * now, is warned about and left out). Returns the number of runtime values restored. */
int steering_restore(const cfg_table *t, const steering_state *journaled, void *cfg);

#endif
