/* config_keys: the option names of every dflash program, for DFLASH_CONFIG's unknown keys
 * (config.c) and test_config_keys. Pure functions over static data: thread-safe. */
#ifndef DFLASH_CONFIG_KEYS_H
#define DFLASH_CONFIG_KEYS_H

#include <stdbool.h>
#include <stddef.h>

/* Whether some dflash program has an option of this name (compared as config_name_cmp does). */
bool config_key_of_any_program(const char *name);
/* The sorted list itself (for the test): its length, *keys set to it. */
size_t config_every_key(const char *const **keys);

#endif
