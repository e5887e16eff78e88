/* client: the one library that speaks the broker protocol; used by dflash-target, dflash-drafter
 * and dflash-ctl alike.
 *
 * A client owns one ZeroMQ DEALER socket connected to the broker's ROUTER, with a stable routing
 * id ("<role>-<name>-<incarnation>") so that a reconnect keeps the peer's identity. Every call is
 * a blocking request/reply with a timeout (client_set_timeout, default 2000 ms): the request
 * carries a fresh request id, replies with other ids (late answers to timed-out requests) are
 * dropped. On a timeout the socket is closed and reopened (Lazy/Paranoid Pirate: queued stale
 * requests must not reach a broker later), and the call returns DFLASH_ETIMEOUT.
 *
 * Heartbeats: the broker counts any request as a heartbeat and expires a peer (its leases return
 * to READY) after it has been silent for liveness x heartbeat_ms (the broker says heartbeat_ms in
 * its Hello reply). A daemon busy for longer than heartbeat_ms calls client_poll() periodically;
 * client_poll sends a Heartbeat only when one is due, so calling it often is cheap.
 *
 * Broker restarts: every reply carries the broker's incarnation. When it differs from the one seen
 * at client_hello, the call returns DFLASH_ESTALE (whatever the reply was) and
 * client_broker_restarted() is true until the next successful client_hello. The daemon then
 * re-registers: client_hello (drafter: with the units it holds), client_register_pool (target),
 * and goes on. A broker that lost the peer (expired it) also answers DFLASH_ESTALE.
 *
 * Thread rules: all calls on one client are serialised by an internal mutex, so a heartbeat
 * thread may call client_poll while the main thread is between calls; a call blocks other
 * threads' calls for at most its timeout. client_poll never waits for another thread's call: it
 * returns at once while one is in progress (that call's request is the heartbeat), so a
 * heartbeat thread is never held by a main thread hung inside a call (heartbeat.h's watchdog
 * relies on it). Never share the underlying socket otherwise. Different clients are
 * independent.
 *
 * CURVE (tcp:// endpoints, DESIGN.md section 5): client_set_curve[_files] gives the broker's
 * public key and this client's secret key; the socket then authenticates with CURVE and the
 * broker's ZAP handler decides whether the key may connect. A key the broker does not accept
 * gets no reply at all (the handshake fails inside ZeroMQ): every call times out. Without
 * CURVE the socket uses the NULL mechanism, as over the ipc:// default.
 *
 * Return codes of every call: 0, DFLASH_ETIMEOUT (no reply in time; socket reset), DFLASH_ESTALE
 * (broker restarted or forgot us: re-register), DFLASH_EZMQ, or the code of the broker's ERROR
 * reply (client_last_error gives its message); per-call extras are listed below.
 */
#ifndef DFLASH_CLIENT_H
#define DFLASH_CLIENT_H

#include "wire.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct client client;

/* The connection options every broker peer's option table starts with (config.h). The caller's
 * settings struct has char arrays runtime_dir, endpoint, curve_server_key and curve_key, and
 * OPTS(name, default, help, member) is its string-option macro. */
#define CLIENT_CONNECTION_OPTIONS(OPTS)                                                            \
    OPTS("runtime-dir", "", "0700 directory of the broker's ipc sockets, ours alone or refused; "  \
         "made if missing (default $XDG_RUNTIME_DIR/dflash or /tmp/dflash-UID)", runtime_dir),     \
    OPTS("endpoint", "", "broker ROUTER endpoint (default ipc://<runtime-dir>/queue.sock)",       \
         endpoint),                                                                                \
    OPTS("curve-server-key", "", "CURVE for a tcp:// endpoint: the broker's public key file "     \
         "(NAME.pub)", curve_server_key),                                                          \
    OPTS("curve-key", "", "CURVE: our secret key file (NAME.key, mode 0600; dflash-ctl keygen)",  \
         curve_key)

/* Where the ipc:// sockets live when no --runtime-dir is given: $XDG_RUNTIME_DIR/dflash, else
 * /tmp/dflash-UID. Every program (broker, daemons, ctl) resolves it the same way. */
void client_default_runtime_dir(char *out, size_t len);
/* The broker ROUTER endpoint a peer connects to: endpoint when non-empty, else
 * ipc://<runtime_dir or the default>/queue.sock. */
void client_resolve_endpoint(const char *endpoint, const char *runtime_dir, char *out, size_t len);

/* Before a client connects to endpoint: an ipc:// socket is only as trustworthy as its
 * directory, as anybody who can write there can serve a fake broker (a predictable default like
 * /tmp/dflash-UID can be made first by another user). So the socket's directory must be ours
 * alone (fs_make_private_dir, the broker's own check of its runtime dir: created 0700 when
 * missing, which also keeps it from anyone else while the broker is not up yet). An abstract
 * socket (ipc://@NAME) has no directory, and anyone may bind it: refused. Other transports
 * (tcp:// with CURVE) pass. Returns 0, DFLASH_ECONFIG or DFLASH_EDENIED (a configuration the
 * program must refuse at start), DFLASH_EIO (the directory cannot be made or examined), with
 * the reason, naming the endpoint and the fix, in err. The daemons' check: they wait for the
 * broker, and hold its directory meanwhile. */
int client_check_endpoint(const char *endpoint, char *err, size_t errlen);
/* The same checks for a program that only talks to a broker already running (dflash-ctl, a
 * benchmark's client): nothing is made (fs_check_private_dir), so a mistyped --runtime-dir
 * leaves no directory behind; a missing one is DFLASH_EPEER at once (no broker can serve
 * there), err naming the endpoint and the directory. */
int client_check_endpoint_existing(const char *endpoint, char *err, size_t errlen);

/* Creates a client for endpoint ("ipc:///run/dflash/queue.sock", "tcp://host:port") in `role`
 * with a short human `name` (shown in broker stats). Connects lazily; never blocks. Returns NULL
 * on bad arguments or when ZeroMQ cannot create the socket. */
client *client_new(const char *endpoint, wire_role role, const char *name);
/* Closes the socket (linger 0) and frees; accepts NULL and NULLs *c. */
void client_destroy(client **c);

/* Turns CURVE on: server_public is the broker's Z85 public key, secret this client's Z85 secret
 * key (its public key is derived). Reopens the socket. Returns 0 or DFLASH_EINVAL (a key is not
 * 40 Z85 characters), DFLASH_EZMQ. Call before the first request. */
int client_set_curve(client *c, const char *server_public, const char *secret);
/* The same with keys read from files (curve.h: one Z85 key per file; the secret key file must
 * have mode 0600). Returns 0 or a curve_key_read code; client_last_error says which file. */
int client_set_curve_files(client *c, const char *server_key_file, const char *key_file);

/* Per-call reply timeout in ms (>= 1). Default 2000. */
void client_set_timeout(client *c, int timeout_ms);
/* This process's incarnation (random, fixed for the client's life). */
uint64_t client_incarnation(const client *c);
/* Broker incarnation seen at the last successful hello (0 before). */
uint64_t client_broker_incarnation(const client *c);
/* True after a reply from a different broker incarnation, until the next client_hello. */
bool client_broker_restarted(const client *c);
/* Heartbeat interval and lease timeout the broker announced (0 before hello). */
uint32_t client_heartbeat_ms(const client *c);
uint32_t client_lease_timeout_ms(const client *c);
/* The broker's PUB endpoint from its hello reply ("" before hello). */
const char *client_pub_endpoint(const client *c);
/* How often the broker announces stats on PUB, from its hello reply (0: never, or before hello,
 * or a broker older than the field). */
uint32_t client_stats_interval_ms(const client *c);
/* Message of the last ERROR reply ("" if none) of the last call other than client_poll (a
 * heartbeat thread's polls leave it as it was). Valid until the next such call. */
const char *client_last_error(const client *c);
/* The run id that last ERROR reply names as the live process of the caller's own run that
 * replaced it (a hello refused EXISTS, docs/protocol.md "One broker, one model"); 0 for every
 * other error, none, or a broker older than the field. Kept like client_last_error. */
uint64_t client_last_error_replaced_by_run(const client *c);
/* What that last ERROR reply, a group join refused MISMATCH, says differs (a wire_mismatch:
 * WIRE_MISMATCH_SHAPE or _ACCUMULATE); WIRE_MISMATCH_NONE for every other error, none, or a
 * broker older than the field. Kept like client_last_error. */
uint32_t client_last_error_mismatch(const client *c);
/* Whether that last ERROR reply, a DENIED, says the request named what a live peer registered
 * with another CURVE key holds (its name, its run, its routing id: docs/protocol.md, "Security");
 * false for every other error, none, or a broker older than the field. Kept like
 * client_last_error. */
bool client_last_error_other_key(const client *c);
/* That last ERROR reply's committed_step: a GroupJoin held (AGAIN) because its member would
 * create the group below the newest committed checkpoint, that checkpoint's step; 0 for every
 * other error, none, or a broker older than the field. Kept like client_last_error. */
uint64_t client_last_error_committed_step(const client *c);
/* Whether the last request got the broker's reply (an ERROR too), not a timeout or a socket
 * error: a broker that answers "try again" is there. Kept like client_last_error. */
bool client_last_answered(const client *c);

/* Introduces this peer; records the broker incarnation and clears client_broker_restarted.
 * A restarting drafter passes the units it copied but has not acked (held may be NULL). */
int client_hello(client *c, const wire_unit *held, uint32_t n_held);

/* A solo trainer whose resume the broker took: every later hello names run_id (Hello.run_id),
 * so a broker that forgot us (it restarted, or expired us) knows us as that run's trainer
 * again, without a second resume (which would rewind). 0: not a trainer (the default). */
void client_set_trainer_run(client *c, uint64_t run_id);

/* A group drafter: every later GroupJoin states its drafter's shape (GroupJoin.shape, the
 * layout hash the state sync compares, and shape_text, the same in words, cut to
 * WIRE_MAX_SHAPE_TEXT - 1 bytes), so that the broker turns away a joiner of another shape than
 * its group's (Error MISMATCH) before the group re-forms for it. 0: none stated (the default). */
void client_set_drafter_shape(client *c, uint64_t shape, const char *text);
/* Drafter: its gradient accumulation (micro-steps per group step, --accumulate), stated in
 * every GroupJoin like the shape: the broker refuses a joiner with another than its group's
 * (Error MISMATCH). 0 or 1: one micro-step (the default; 1 is not sent, as before). */
void client_set_group_accumulate(client *c, uint32_t accumulate);
/* Drafter: whether it ends its run when the broker has nothing more (--exit-when-drained),
 * stated in every GroupJoin: a broker with nothing left to hand out then answers the join Error
 * SHUTDOWN, as it answers a claim, instead of a view. False: a view (the default). */
void client_set_group_ends_when_drained(client *c, bool ends);

/* Target: registers (or re-registers) its slot pool. The broker drops every slot of an older
 * pool incarnation and returns its batches to to-do. Extra: DFLASH_EINVAL/ERANGE (bad pool). */
int client_register_pool(client *c, const wire_pool *pool);

/* Target: asks for the next batch to materialise and the slot to write it to. Extra:
 * DFLASH_EAGAIN (nothing to do now: paused, or all epochs handed out), DFLASH_EFULL (max_depth
 * reached: wait and retry), DFLASH_ESHUTDOWN (draining: finish and exit). */
int client_request_work(client *c, uint64_t pool_incarnation, wire_work_unit *out);

/* Target: the slot named in a work unit is written (its event recorded). */
int client_slot_ready(client *c, const wire_slot_ready *ready);

/* Target: it stops and gives up its pool (docs/protocol.md, "Stopping a target"). On 0 *out
 * says which slots this call gave back and how many drafters still copy: while out->leased > 0
 * keep the pool's memory and call again; at 0 the broker has ended our session. Extra:
 * DFLASH_EPROTO (a broker that predates the message), DFLASH_ESTALE (it knows no such pool). */
int client_pool_leave(client *c, uint64_t pool_incarnation, wire_pool_left *out);

/* Drafter: claims a ready slot. Extra: DFLASH_EAGAIN (nothing eligible now, e.g. fewer than
 * min_ready ready), DFLASH_ESHUTDOWN (drained and empty). On 0 *out holds the lease. */
int client_claim(client *c, wire_grant *out);
/* Drafter: the slot is copied; gives it back. Extra: DFLASH_ESTALE (lease expired meanwhile:
 * the batch was redelivered; drop the copy). */
int client_release(client *c, uint64_t lease_id);
/* Drafter: the slot could not be read (copy failed); gives the lease back unread, so the broker
 * returns the batch to to-do instead of counting it as held by us. Extra: DFLASH_ESTALE (lease
 * expired meanwhile). An older broker takes it as a plain release. */
int client_release_unread(client *c, uint64_t lease_id);
/* Drafter: the batch is trained in optimizer step `step`. */
int client_ack(client *c, const wire_unit *unit, uint64_t step);
/* Drafter: a durable checkpoint of step `step` exists; commits everything trained up to it. */
int client_checkpoint_committed(client *c, uint64_t step);
/* Drafter: a durability barrier before it publishes a checkpoint: answered once the broker's
 * journal has fdatasynced every record written before the request (our acks included). Needs
 * no hello. Extra: DFLASH_EIO (the journal cannot make them durable), DFLASH_EPROTO (a broker
 * that predates the request). */
int client_journal_sync(client *c);
/* Drafter: restarted from checkpoint `step`; everything trained after it returns to to-do.
 * run_id names the trainer's run (0: not said). DFLASH_EAGAIN: another solo trainer or a group
 * trains on this broker and may be a dying predecessor: ask again; DFLASH_EEXISTS: it is alive,
 * the broker serves its model (client_last_error says which drafter; docs/protocol.md). */
int client_resume_from(client *c, uint64_t step, uint64_t run_id);

/* Data-parallel drafter groups (docs/protocol.md "Groups"). A group call answered DFLASH_ESTALE
 * means "re-form": the epoch is over (or, with client_broker_restarted(), the broker restarted:
 * hello first). */
/* Drafter: joins `group` (or polls for the view of its current epoch). step: optimizer steps our
 * model has taken; failed_epoch: the epoch whose collective failed here (0 = none); gone_rank:
 * with failed_epoch, the rank of it whose process our collective saw end (-1 = none; an older
 * broker ignores it). On 0 *out is
 * our rank in the current epoch (out->id_len 0: rank 0 has not posted the id yet). Extra:
 * DFLASH_EAGAIN (waiting for a step boundary or for the group to re-form: poll again),
 * DFLASH_EFULL (the group would be larger than the broker's max-depth), DFLASH_EEXISTS,
 * DFLASH_EMISMATCH (the shape of client_set_drafter_shape differs from the group's). */
int client_group_join(client *c, const char *group, uint64_t step, uint64_t failed_epoch,
                      int gone_rank, uint32_t world_hint, wire_group_view *out);
/* Rank 0: posts the rendezvous id of `epoch` (1..WIRE_GROUP_ID_BYTES bytes). */
int client_group_set_id(client *c, const char *group, uint64_t epoch, const uint8_t *id,
                        uint32_t len);
/* A rank: its slot of micro-step `micro` (0 without accumulation) of optimizer step `step` of
 * `epoch` (the broker reserves one slot per rank at once, or none). On 0 *out holds its grant
 * (own lease), the micro-step's units and, from a broker that knows micro-steps, has_micro.
 * Extra: DFLASH_EAGAIN (fewer slots eligible than ranks, or no id yet), DFLASH_ESTALE
 * (re-form), DFLASH_ESTATE (wrong step number), DFLASH_ESHUTDOWN (drained; for micro > 0: the
 * step ended before it, close it with the micro-steps it has). */
int client_step_claim(client *c, const char *group, uint64_t epoch, uint64_t step,
                      uint32_t micro, wire_step_grant *out);
/* Rank 0: the update of `step` is done; the broker acks all its units once. *n_acked (may be
 * NULL): units recorded now (0 for a repeated StepDone). Extra: DFLASH_ESTALE (the step was
 * aborted: re-form), DFLASH_EDENIED (not rank 0). */
int client_step_done(client *c, const char *group, uint64_t epoch, uint64_t step,
                     uint64_t *n_acked);
/* Drafter: leaves its group (clean exit); the others re-form at once. */
int client_group_leave(client *c, const char *group);

/* Sends a Heartbeat and waits for the echo. */
int client_heartbeat(client *c);
/* Sends a Heartbeat only if no request was sent (or timed out) for heartbeat_ms/2 and no other
 * thread is in a call on c; otherwise returns 0 at once (never waits for the mutex). */
int client_poll(client *c);

/* Any role: full broker statistics. */
int client_status(client *c, wire_status *out);
/* The same, its peer list only the live peers whose name starts with peer_prefix (< 64
 * characters; "" or NULL: every one). An older broker lists every one (at most 64). */
int client_status_peers(client *c, const char *peer_prefix, wire_status *out);
/* Any role: changes live settings (key=value), all or nothing; *applied (may be NULL) gets the
 * effective values. Extra: DFLASH_ENOTFOUND/EINVAL/ERANGE/EDENIED (not live) for a bad key. */
int client_set(client *c, const wire_settings *set, wire_settings *applied);
int client_pause(client *c);
int client_resume(client *c);
int client_drain(client *c);
/* Ctl (an admin over CURVE): quarantined batches back to to-do: the one unit names, or every one
 * (unit NULL); *released (may be NULL) gets how many. Answered once the broker's journal holds
 * it. Extra: DFLASH_ESTATE (unit is not quarantined), DFLASH_ERANGE (not in the plan),
 * DFLASH_EDENIED (not an admin key), DFLASH_EIO (released, but not durable), DFLASH_EPROTO (a
 * broker that predates the request). */
int client_release_quarantine(client *c, const wire_unit *unit, uint64_t *released);

/* Subscriber to the broker's PUB socket (dflash-ctl watch). Topics: "ready" (SLOT_READY body),
 * "config" (SET_CONFIG_REPLY body), "stats" (STATUS_REPLY body, every stats interval). */
typedef struct client_sub client_sub;
/* Subscribes to topic prefix `topic` ("" for all). NULL on error. */
client_sub *client_sub_new(const char *pub_endpoint, const char *topic);
/* The same, using the CURVE keys of `keys` (NULL or a client without CURVE: none) when
 * pub_endpoint is tcp:// (an ipc:// PUB gets none, as the broker binds it without CURVE). */
client_sub *client_sub_new_curve(const char *pub_endpoint, const char *topic, const client *keys);
void client_sub_destroy(client_sub **s);
/* Waits up to timeout_ms for one announcement: 0 and *msg filled (wire_msg_clear it),
 * DFLASH_ETIMEOUT, or DFLASH_EPROTO for a malformed one (skipped). topic gets the topic. */
int client_sub_recv(client_sub *s, char *topic, size_t topic_len, wire_msg *msg, int timeout_ms);

#endif
