/* steering: see steering.h for the payload and the restore rule. This file: capture (a diff of
 * two config structs over the table's live options), the NUL-separated encoding, and restore. */
#include "steering.h"

#include "err.h"
#include "log.h"

#include <stdio.h>
#include <string.h>

void steering_capture(const cfg_table *t, const void *configured, const void *now,
                      policy_mode mode, steering_state *out)
{
    memset(out, 0, sizeof *out);
    out->mode = mode;
    for (size_t i = 0; i < t->n_options && out->n < STEERING_MAX_KEYS; i++) {
        const cfg_option *o = &t->options[i];
        if (!o->live) continue;
        steering_kv *kv = &out->kv[out->n];
        config_get(t, now, o->name, kv->value, sizeof kv->value);
        config_get(t, configured, o->name, kv->configured, sizeof kv->configured);
        if (strcmp(kv->value, kv->configured) == 0) continue;
        snprintf(kv->name, sizeof kv->name, "%s", o->name);
        out->n++;
    }
}

/* Appends s and its NUL at *at. False when it does not fit in cap. */
static bool put_str(uint8_t *out, size_t cap, size_t *at, const char *s)
{
    size_t n = strlen(s) + 1;
    if (*at + n > cap) return false;
    memcpy(out + *at, s, n);
    *at += n;
    return true;
}

int steering_encode(const steering_state *s, uint8_t *out, size_t cap)
{
    size_t at = 0;
    bool ok = put_str(out, cap, &at, "mode") && put_str(out, cap, &at, policy_mode_name(s->mode));
    for (uint32_t i = 0; i < s->n && ok; i++)
        ok = put_str(out, cap, &at, s->kv[i].name) && put_str(out, cap, &at, s->kv[i].value) &&
             put_str(out, cap, &at, s->kv[i].configured);
    return ok && at <= (size_t)INT32_MAX ? (int)at : DFLASH_ENOMEM;
}

/* Copies the NUL-terminated string at p + *at into dst (cap bytes) and moves *at past it.
 * False when it is not terminated within len or does not fit. */
static bool get_str(const char *p, size_t len, size_t *at, char *dst, size_t cap)
{
    const char *end = memchr(p + *at, 0, len - *at);
    if (!end || (size_t)(end - (p + *at)) >= cap) return false;
    memcpy(dst, p + *at, (size_t)(end - (p + *at)) + 1);
    *at = (size_t)(end - p) + 1;
    return true;
}

int steering_decode(const void *payload, size_t len, steering_state *out)
{
    const char *p = payload;
    size_t at = 0;
    char key[STEERING_NAME_MAX], mode[STEERING_NAME_MAX];
    memset(out, 0, sizeof *out);
    if (!get_str(p, len, &at, key, sizeof key) || strcmp(key, "mode") != 0 ||
        !get_str(p, len, &at, mode, sizeof mode))
        return DFLASH_ECORRUPT;
    policy_mode m = POLICY_RUNNING;
    while (m <= POLICY_DRAINING && strcmp(policy_mode_name(m), mode) != 0) m++;
    if (m > POLICY_DRAINING) return DFLASH_ECORRUPT;
    out->mode = m;
    while (at < len) {
        if (out->n == STEERING_MAX_KEYS) return DFLASH_ECORRUPT;
        steering_kv *kv = &out->kv[out->n++];
        if (!get_str(p, len, &at, kv->name, sizeof kv->name) ||
            !get_str(p, len, &at, kv->value, sizeof kv->value) ||
            !get_str(p, len, &at, kv->configured, sizeof kv->configured))
            return DFLASH_ECORRUPT;
    }
    return 0;
}

/* The option's name as dflash-ctl set takes it: min-ready -> min_ready. */
static void ctl_name(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s", name);
    for (char *c = out; *c; c++)
        if (*c == '-') *c = '_';
}

/* A value as the log shows it: an empty one (shares: the target's) as ''. */
static const char *shown(const char *v) { return v[0] ? v : "''"; }

int steering_restore(const cfg_table *t, const steering_state *journaled, void *cfg)
{
    int restored = 0;
    for (uint32_t i = 0; i < journaled->n; i++) {
        const steering_kv *kv = &journaled->kv[i];
        const cfg_option *o = config_find(t, kv->name);
        char name[STEERING_NAME_MAX], now[STEERING_VALUE_MAX], why[200] = "";
        ctl_name(kv->name, name, sizeof name);
        if (!o || !o->live || config_get(t, cfg, kv->name, now, sizeof now) != 0) {
            LOG_WARN("the journal holds the runtime value %s=%s, which is not a live setting of "
                     "this dflash-queue: left out (set it again if it is still wanted)", name,
                     shown(kv->value));
            continue;
        }
        if (strcmp(now, kv->configured) != 0) {
            LOG_INFO("configured %s=%s replaces the runtime value %s: the configuration changed "
                     "since it was set (it was %s then)", name, shown(now), shown(kv->value),
                     shown(kv->configured));
            continue;
        }
        if (config_set(t, cfg, kv->name, kv->value, true, why, sizeof why) != 0) {
            LOG_WARN("runtime value %s=%s from the journal refused (%s): configured %s=%s stays",
                     name, shown(kv->value), why, name, shown(now));
            continue;
        }
        LOG_INFO("restored %s=%s from the journal (set at runtime; configured %s)", name,
                 shown(kv->value), shown(now));
        restored++;
    }
    return restored;
}
