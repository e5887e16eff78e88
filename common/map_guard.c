/* map_guard: see map_guard.h. The table is written under a mutex and read by the signal handler
 * without one: an entry's size and path are filled before its base is published (release), and
 * the handler reads the base first (acquire), so it never sees a half-written entry. The handler
 * uses only async-signal-safe calls (write, _exit, sigaction). */
#include "map_guard.h"

#include "log.h"

#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef struct guard_entry {
    _Atomic uintptr_t base; /* 0: free */
    size_t size;
    char path[256];
} guard_entry;

static guard_entry table[MAP_GUARD_MAX];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t installed = PTHREAD_ONCE_INIT;
static struct sigaction previous; /* the SIGBUS action before ours: a fault not ours goes there */
static bool full_said;

static void put(const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void put_u64(uint64_t v)
{
    char buf[24];
    int i = (int)sizeof buf - 1;
    buf[i] = 0;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i > 0);
    put(buf + i);
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    uintptr_t at = (uintptr_t)info->si_addr;
    for (int i = 0; i < MAP_GUARD_MAX; i++) {
        uintptr_t base = atomic_load_explicit(&table[i].base, memory_order_acquire);
        if (!base || at < base || at - base >= table[i].size) continue;
        put("FATAL: reading ");
        put(table[i].path);
        put(" at byte ");
        put_u64((uint64_t)(at - base));
        put(" failed (SIGBUS): the file shrank, or its storage failed, while this process had it "
            "mapped. Files in use must be replaced by writing a new file and renaming it over "
            "the old one, never rewritten in place; restore it and start again\n");
        _exit(MAP_GUARD_EXIT);
    }
    /* not ours: the action that was there before ours (the default, or another library's
     * handler), for a fault (made again on return) and a kill(2) alike (raised again here,
     * pending while the handler runs, delivered on return) */
    sigaction(sig, &previous, NULL);
    raise(sig);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous);
}

void map_guard_add(const void *base, size_t size, const char *path)
{
    if (!base || !size) return;
    pthread_once(&installed, install);
    pthread_mutex_lock(&table_lock);
    int i = 0;
    while (i < MAP_GUARD_MAX && atomic_load_explicit(&table[i].base, memory_order_relaxed)) i++;
    if (i < MAP_GUARD_MAX) {
        table[i].size = size;
        strncpy(table[i].path, path ? path : "?", sizeof table[i].path - 1);
        table[i].path[sizeof table[i].path - 1] = 0;
        atomic_store_explicit(&table[i].base, (uintptr_t)base, memory_order_release);
    } else if (!full_said) {
        full_said = true;
        LOG_INFO("map_guard: more than %d files mapped at once: %s and those after it are not "
                 "named if they shrink while mapped (a plain \"Bus error\")", MAP_GUARD_MAX,
                 path ? path : "?");
    }
    pthread_mutex_unlock(&table_lock);
}

void map_guard_remove(const void *base)
{
    if (!base) return;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAP_GUARD_MAX; i++)
        if (atomic_load_explicit(&table[i].base, memory_order_relaxed) == (uintptr_t)base)
            atomic_store_explicit(&table[i].base, 0, memory_order_release);
    pthread_mutex_unlock(&table_lock);
}
