/* client: see client.h. STUB: every call returns DFLASH_EUNSUPPORTED until the implementation
 * lands; the header is the stable interface. */
#include "client.h"
#include "err.h"

#include <stdlib.h>

client *client_new(const char *endpoint, wire_role role, const char *name)
{
    (void)endpoint, (void)role, (void)name;
    return NULL;
}
void client_destroy(client **c)
{
    if (c) *c = NULL;
}
void client_set_timeout(client *c, int timeout_ms) { (void)c, (void)timeout_ms; }
uint64_t client_incarnation(const client *c) { (void)c; return 0; }
uint64_t client_broker_incarnation(const client *c) { (void)c; return 0; }
bool client_broker_restarted(const client *c) { (void)c; return false; }
uint32_t client_heartbeat_ms(const client *c) { (void)c; return 0; }
uint32_t client_lease_timeout_ms(const client *c) { (void)c; return 0; }
const char *client_pub_endpoint(const client *c) { (void)c; return ""; }
const char *client_last_error(const client *c) { (void)c; return ""; }
int client_hello(client *c, const wire_unit *h, uint32_t n) { (void)c, (void)h, (void)n; return DFLASH_EUNSUPPORTED; }
int client_register_pool(client *c, const wire_pool *p) { (void)c, (void)p; return DFLASH_EUNSUPPORTED; }
int client_request_work(client *c, uint64_t i, wire_work_unit *o) { (void)c, (void)i, (void)o; return DFLASH_EUNSUPPORTED; }
int client_slot_ready(client *c, const wire_slot_ready *r) { (void)c, (void)r; return DFLASH_EUNSUPPORTED; }
int client_claim(client *c, wire_grant *o) { (void)c, (void)o; return DFLASH_EUNSUPPORTED; }
int client_release(client *c, uint64_t l) { (void)c, (void)l; return DFLASH_EUNSUPPORTED; }
int client_ack(client *c, const wire_unit *u, uint64_t s) { (void)c, (void)u, (void)s; return DFLASH_EUNSUPPORTED; }
int client_checkpoint_committed(client *c, uint64_t s) { (void)c, (void)s; return DFLASH_EUNSUPPORTED; }
int client_resume_from(client *c, uint64_t s) { (void)c, (void)s; return DFLASH_EUNSUPPORTED; }
int client_heartbeat(client *c) { (void)c; return DFLASH_EUNSUPPORTED; }
int client_poll(client *c) { (void)c; return DFLASH_EUNSUPPORTED; }
int client_status(client *c, wire_status *o) { (void)c, (void)o; return DFLASH_EUNSUPPORTED; }
int client_set(client *c, const wire_settings *s, wire_settings *a) { (void)c, (void)s, (void)a; return DFLASH_EUNSUPPORTED; }
int client_pause(client *c) { (void)c; return DFLASH_EUNSUPPORTED; }
int client_resume(client *c) { (void)c; return DFLASH_EUNSUPPORTED; }
int client_drain(client *c) { (void)c; return DFLASH_EUNSUPPORTED; }
client_sub *client_sub_new(const char *e, const char *t) { (void)e, (void)t; return NULL; }
void client_sub_destroy(client_sub **s) { if (s) *s = NULL; }
int client_sub_recv(client_sub *s, char *t, size_t tl, wire_msg *m, int to) { (void)s, (void)t, (void)tl, (void)m, (void)to; return DFLASH_EUNSUPPORTED; }
