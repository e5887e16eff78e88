/* curve: see curve.h. Key files are tiny text files: written with open(O_EXCL) at the final mode
 * (no window where a secret is world-readable), read whole with one read(). */
#include "curve.h"
#include "err.h"
#include "fsutil.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define WHY(...) (why && why_len ? (void)snprintf(why, why_len, __VA_ARGS__) : (void)0)

bool curve_available(void) { return zmq_has("curve") != 0; }

bool curve_endpoint_is_tcp(const char *ep) { return ep && strncmp(ep, "tcp://", 6) == 0; }

static bool z85_key_ok(const char *z)
{
    uint8_t raw[32];
    return strlen(z) == CURVE_Z85_LEN && zmq_z85_decode(raw, z) != NULL;
}

static bool name_ok(const char *name)
{
    if (!name || !*name || strlen(name) > 64 || name[0] == '.') return false;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.') return false;
    return true;
}

static int write_new(const char *path, const char *text, mode_t mode, char *why, size_t why_len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        WHY("cannot create %s: %s", path, strerror(errno));
        return errno == EEXIST ? DFLASH_EEXISTS : DFLASH_EIO;
    }
    size_t n = strlen(text);
    ssize_t wrote = write(fd, text, n);
    if (wrote >= 0 && wrote < (ssize_t)n) errno = ENOSPC; /* a short write says no reason */
    bool ok = wrote == (ssize_t)n && fchmod(fd, mode) == 0 && fsync(fd) == 0;
    if (close(fd) != 0) ok = false;
    if (!ok) {
        WHY("cannot write %s: %s", path, strerror(errno));
        unlink(path);
        return DFLASH_EIO;
    }
    return 0;
}

int curve_keygen(const char *dir, const char *name, curve_key public_out, char *why,
                 size_t why_len)
{
    if (!curve_available()) {
        WHY("this libzmq has no CURVE support (built without libsodium)");
        return DFLASH_EUNSUPPORTED;
    }
    if (!dir || !*dir || !name_ok(name)) {
        WHY("bad key name '%s' (letters, digits, '-', '_', '.')", name ? name : "");
        return DFLASH_EINVAL;
    }
    char pub[CURVE_Z85_LEN + 1], sec[CURVE_Z85_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0) {
        WHY("zmq_curve_keypair: %s", zmq_strerror(errno));
        return DFLASH_EUNSUPPORTED;
    }
    char kpath[1024], ppath[1024], line[CURVE_Z85_LEN + 2];
    snprintf(kpath, sizeof kpath, "%s/%s.key", dir, name);
    snprintf(ppath, sizeof ppath, "%s/%s.pub", dir, name);
    struct stat st;
    if (stat(ppath, &st) == 0) {
        WHY("%s exists: refusing to overwrite a key", ppath);
        return DFLASH_EEXISTS;
    }
    if (stat(kpath, &st) == 0) {
        WHY("%s exists without %s (a keygen that did not finish?): remove it and run again",
            kpath, ppath);
        return DFLASH_EEXISTS;
    }
    snprintf(line, sizeof line, "%s\n", sec);
    int rc = write_new(kpath, line, 0600, why, why_len);
    if (rc) return rc;
    snprintf(line, sizeof line, "%s\n", pub);
    if ((rc = write_new(ppath, line, 0644, why, why_len))) {
        unlink(kpath);
        return rc;
    }
    if (fs_sync_parent_dir(ppath) != 0) {
        WHY("cannot fsync %s: %s", dir, strerror(errno));
        return DFLASH_EIO;
    }
    if (public_out) memcpy(public_out, pub, sizeof pub);
    return 0;
}

int curve_key_read(const char *path, bool secret, curve_key out, char *why, size_t why_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        WHY("cannot open key file %s: %s", path, strerror(errno));
        return DFLASH_ENOTFOUND;
    }
    struct stat st;
    if (secret && (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077))) {
        close(fd);
        WHY("secret key %s must be ours with mode 0600 (chmod 600 %s)", path, path);
        return DFLASH_EDENIED;
    }
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) n = 0;
    buf[n] = 0;
    char *s = buf;
    while (*s && isspace((unsigned char)*s)) s++;
    char *e = s;
    while (*e && !isspace((unsigned char)*e)) e++;
    *e = 0;
    if (!z85_key_ok(s)) {
        WHY("%s does not hold a Z85 CURVE key (40 characters)", path);
        return DFLASH_EINVAL;
    }
    memcpy(out, s, CURVE_Z85_LEN + 1);
    return 0;
}

int curve_public_of(const curve_key secret, curve_key public_out)
{
    if (!z85_key_ok(secret) || zmq_curve_public(public_out, secret) != 0) return DFLASH_EINVAL;
    return 0;
}

int curve_keyset_load(const char *dir, curve_keyset *out, char *why, size_t why_len)
{
    curve_keyset_clear(out);
    DIR *d = opendir(dir);
    if (!d) {
        WHY("cannot open key directory %s: %s", dir, strerror(errno));
        return DFLASH_ENOTFOUND;
    }
    int rc = 0;
    uint32_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".pub") != 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        curve_key k;
        if ((rc = curve_key_read(path, false, k, why, why_len))) break;
        if (out->n == cap) {
            uint32_t nc = cap ? 2 * cap : 8;
            curve_key *nk = realloc(out->keys, nc * sizeof *nk);
            if (!nk) {
                rc = DFLASH_ENOMEM;
                break;
            }
            out->keys = nk;
            cap = nc;
        }
        memcpy(out->keys[out->n++], k, sizeof k);
    }
    closedir(d);
    if (rc) curve_keyset_clear(out);
    return rc;
}

bool curve_keyset_has(const curve_keyset *s, const char *z85)
{
    if (!s || !z85) return false;
    for (uint32_t i = 0; i < s->n; i++)
        if (strcmp(s->keys[i], z85) == 0) return true;
    return false;
}

void curve_keyset_clear(curve_keyset *s)
{
    if (!s) return;
    free(s->keys);
    s->keys = NULL;
    s->n = 0;
}
