/* curve: ZeroMQ CURVE keys from files, for tcp:// endpoints (DESIGN.md section 5: "TCP needs
 * ZeroMQ CURVE keys; steering verbs need the admin key").
 *
 * Files: NAME.key holds the secret key, NAME.pub the public key, each one line of 40 Z85
 * characters (zmq_curve_keypair's text form). A secret key file must be ours and not readable by
 * group or others (mode 0600, as curve_keygen writes it); the public key is always derived from
 * the secret (zmq_curve_public), so a .key file is all a peer needs. A key *set* is every *.pub
 * file of a directory (the broker's allowed clients, its admin keys); it is read once at start.
 *
 * Keys are handled as Z85 text (CURVE_Z85_LEN chars + NUL), which libzmq accepts for
 * ZMQ_CURVE_* options and which the broker's ZAP handler sets as the connection's User-Id.
 * No state, no threads: any thread may call these. Callers: client.c, services/queue
 * (broker_config.c, broker_security.c, broker.c, main.c), tools/ctl (keygen), tests.
 */
#ifndef DFLASH_CURVE_H
#define DFLASH_CURVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CURVE_Z85_LEN 40

typedef char curve_key[CURVE_Z85_LEN + 1];

/* True when this libzmq was built with CURVE (libsodium). */
bool curve_available(void);

/* True for a "tcp://..." endpoint (the transports that leave the host and need CURVE). */
bool curve_endpoint_is_tcp(const char *endpoint);

/* Writes a fresh keypair as DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub (public, 0644).
 * Refuses to overwrite either file. NAME: letters, digits, '-', '_', '.' (no '/').
 * public_out (may be NULL) gets the public key. Returns 0, DFLASH_EINVAL (bad name),
 * DFLASH_EEXISTS (a file is there), DFLASH_EIO, DFLASH_EUNSUPPORTED (no CURVE). why gets a
 * message on error (may be NULL). */
int curve_keygen(const char *dir, const char *name, curve_key public_out, char *why,
                 size_t why_len);

/* Reads one Z85 key from path (first line, surrounding white space ignored) and checks it
 * decodes to 32 bytes. secret = true also checks the file is owned by us with no group/other
 * permission. Returns 0, DFLASH_ENOTFOUND, DFLASH_EINVAL (not a key), DFLASH_EDENIED (secret
 * file too open); why gets a message. */
int curve_key_read(const char *path, bool secret, curve_key out, char *why, size_t why_len);

/* The public key of a Z85 secret key. Returns 0 or DFLASH_EINVAL. */
int curve_public_of(const curve_key secret, curve_key public_out);

/* The public keys of every DIR/ *.pub file. Returns 0 (an empty dir gives an empty set),
 * DFLASH_ENOTFOUND (no dir), DFLASH_EINVAL (a file that is not a key), DFLASH_ENOMEM. */
typedef struct curve_keyset {
    uint32_t n;
    curve_key *keys;
} curve_keyset;
int curve_keyset_load(const char *dir, curve_keyset *out, char *why, size_t why_len);
bool curve_keyset_has(const curve_keyset *s, const char *z85);
/* Frees the keys; the set becomes empty. */
void curve_keyset_clear(curve_keyset *s);

#endif
