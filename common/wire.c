/* wire: see wire.h. STUB until the implementation lands. */
#include "wire.h"
#include "err.h"

#include <string.h>

void wire_msg_init(wire_msg *m, wire_type t, wire_role r, uint64_t inc, uint64_t rid)
{
    memset(m, 0, sizeof *m);
    m->version = WIRE_VERSION, m->type = t, m->role = r, m->incarnation = inc, m->request_id = rid;
}
void wire_msg_clear(wire_msg *m) { (void)m; }
int wire_check(const wire_msg *m, char *w, size_t l) { (void)m, (void)w, (void)l; return 0; }
int wire_pack(const wire_msg *m, uint8_t *b, size_t c) { (void)m, (void)b, (void)c; return DFLASH_EUNSUPPORTED; }
int wire_unpack(const uint8_t *b, size_t n, wire_msg *m, char *w, size_t l) { (void)b, (void)n, (void)m, (void)w, (void)l; return DFLASH_EUNSUPPORTED; }
const char *wire_type_name(wire_type t) { (void)t; return "unknown"; }
const char *wire_role_name(wire_role r) { (void)r; return "unknown"; }
uint64_t wire_new_incarnation(void) { return 1; }
