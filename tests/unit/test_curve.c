/* test_curve: the CURVE key files (curve.h) the broker and its peers start from.
 *   - curve_keygen writes NAME.key (mode 0600) and NAME.pub (0644, whatever the umask) whose
 *     keys pair up (curve_public_of of the secret is the public), refuses a name that is empty,
 *     starts with '.', holds a '/' or a blank or is longer than 64 characters, and never
 *     overwrites a key;
 *   - curve_key_read takes the first word of the file (blanks around it ignored) and refuses what
 *     is not 40 Z85 characters decoding to 32 bytes (39 or 45 characters, a character outside
 *     Z85); a secret key open to the group or to others alone, or another user's, is refused,
 *     a public one of mode 0644 is read;
 *   - curve_keyset_load takes every *.pub of a directory and nothing else (not the .key files,
 *     not a file named ".pub" alone); one bad .pub file fails the load and leaves the set empty.
 */
#include "check.h"
#include "curve.h"
#include "err.h"
#include "test_files.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char dir[64];

static void put(const char *name, const char *text, mode_t mode)
{
    char p[160];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    test_spill(p, text, strlen(text));
    CHECK_EQ_INT(chmod(p, mode), 0);
}

static int read_key(const char *name, bool secret, curve_key out)
{
    char p[160], why[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return curve_key_read(p, secret, out, why, sizeof why);
}

static void test_keygen(void)
{
    curve_key pub, sec, from_file, derived;
    char why[512];
    CHECK_EQ_INT(curve_keygen(dir, "alice", pub, why, sizeof why), 0);
    struct stat st;
    char p[160];
    snprintf(p, sizeof p, "%s/alice.key", dir);
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0600);
    snprintf(p, sizeof p, "%s/alice.pub", dir);
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0644);
    CHECK_EQ_INT(read_key("alice.key", true, sec), 0);
    CHECK_EQ_INT(read_key("alice.pub", false, from_file), 0);
    CHECK(strcmp(from_file, pub) == 0);
    CHECK_EQ_INT(curve_public_of(sec, derived), 0);
    CHECK(strcmp(derived, pub) == 0);
    CHECK_EQ_INT(curve_keygen(dir, "alice", NULL, why, sizeof why), DFLASH_EEXISTS);
    CHECK(strstr(why, "refusing to overwrite") != NULL);
    CHECK_EQ_INT(read_key("alice.key", true, from_file), 0); /* untouched */
    CHECK(strcmp(from_file, sec) == 0);
    char long_name[70];
    memset(long_name, 'n', 65);
    long_name[65] = 0;
    const char *bad[] = {"", ".hidden", "a/b", "sp ace", long_name};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_EQ_INT(curve_keygen(dir, bad[i], NULL, why, sizeof why), DFLASH_EINVAL);
    long_name[64] = 0; /* 64 characters: allowed */
    CHECK_EQ_INT(curve_keygen(dir, long_name, NULL, why, sizeof why), 0);
    /* the modes are the files' whatever the umask */
    mode_t old = umask(077);
    CHECK_EQ_INT(curve_keygen(dir, "masked", NULL, why, sizeof why), 0);
    umask(old);
    snprintf(p, sizeof p, "%s/masked.pub", dir);
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0644);
}

static void test_read(void)
{
    curve_key k, ref;
    CHECK_EQ_INT(read_key("alice.pub", false, ref), 0);
    char text[128];
    snprintf(text, sizeof text, "  \n\t%s  \nsecond line\n", ref); /* blanks around: the key */
    put("spaced.pub", text, 0644);
    CHECK(read_key("spaced.pub", false, k) == 0 && strcmp(k, ref) == 0);
    snprintf(text, sizeof text, "%.39s\n", ref); /* one character short */
    put("short.pub", text, 0644);
    CHECK_EQ_INT(read_key("short.pub", false, k), DFLASH_EINVAL);
    snprintf(text, sizeof text, "%s\n", ref);
    text[5] = '~'; /* no Z85 character */
    put("junk.pub", text, 0644);
    CHECK_EQ_INT(read_key("junk.pub", false, k), DFLASH_EINVAL);
    snprintf(text, sizeof text, "%s%.5s\n", ref, ref); /* 45 characters: 36 bytes, no key */
    put("long.pub", text, 0644);
    CHECK_EQ_INT(read_key("long.pub", false, k), DFLASH_EINVAL);
    CHECK_EQ_INT(read_key("missing.pub", false, k), DFLASH_ENOTFOUND);

    curve_key sec;
    CHECK_EQ_INT(read_key("alice.key", true, sec), 0);
    snprintf(text, sizeof text, "%s\n", sec);
    put("group.key", text, 0640);
    CHECK_EQ_INT(read_key("group.key", true, k), DFLASH_EDENIED);
    put("others.key", text, 0604);
    CHECK_EQ_INT(read_key("others.key", true, k), DFLASH_EDENIED);
    CHECK_EQ_INT(read_key("others.key", false, k), 0); /* read as a public key: no such rule */
    put("mine.key", text, 0600);
    CHECK(read_key("mine.key", true, k) == 0 && strcmp(k, sec) == 0);
    if (geteuid() == 0) { /* another user's, mode 0600 (only root can chown it) */
        char p[160];
        snprintf(p, sizeof p, "%s/mine.key", dir);
        CHECK_EQ_INT(chown(p, 65534, (gid_t)-1), 0);
        CHECK_EQ_INT(read_key("mine.key", true, k), DFLASH_EDENIED);
    }
}

static void test_keyset(void)
{
    char sub[128], why[512];
    snprintf(sub, sizeof sub, "%s/clients", dir);
    CHECK_EQ_INT(mkdir(sub, 0700), 0);
    curve_key a, b;
    CHECK_EQ_INT(curve_keygen(sub, "a", a, why, sizeof why), 0);
    CHECK_EQ_INT(curve_keygen(sub, "b", b, why, sizeof why), 0);
    char p[200];
    snprintf(p, sizeof p, "%s/.pub", sub); /* a name that is the suffix alone */
    char text[64];
    snprintf(text, sizeof text, "%s\n", a);
    test_spill(p, text, strlen(text));
    snprintf(p, sizeof p, "%s/notes.txt", sub);
    test_spill(p, "not a key\n", 10);
    curve_keyset s = {0};
    CHECK_EQ_INT(curve_keyset_load(sub, &s, why, sizeof why), 0);
    CHECK_EQ_INT((int)s.n, 2);
    CHECK(curve_keyset_has(&s, a) && curve_keyset_has(&s, b));
    curve_key sec;
    snprintf(p, sizeof p, "%s/a.key", sub);
    CHECK_EQ_INT(curve_key_read(p, true, sec, why, sizeof why), 0);
    CHECK(!curve_keyset_has(&s, sec)); /* the secret keys' files are not read */
    CHECK(!curve_keyset_has(&s, NULL) && !curve_keyset_has(NULL, a));
    snprintf(p, sizeof p, "%s/bad.pub", sub);
    test_spill(p, "nonsense\n", 9);
    CHECK_EQ_INT(curve_keyset_load(sub, &s, why, sizeof why), DFLASH_EINVAL);
    CHECK_EQ_INT((int)s.n, 0);
    CHECK(!curve_keyset_has(&s, a));
    curve_keyset_clear(&s);
    snprintf(p, sizeof p, "%s/none", dir);
    CHECK_EQ_INT(curve_keyset_load(p, &s, why, sizeof why), DFLASH_ENOTFOUND);
    CHECK(curve_endpoint_is_tcp("tcp://1.2.3.4:5") && !curve_endpoint_is_tcp("ipc:///x") &&
          !curve_endpoint_is_tcp(NULL));
}

int main(void)
{
    if (!curve_available()) {
        printf("this libzmq has no CURVE: skipped\n");
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/dflash-test-curve-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    umask(022);
    test_keygen();
    test_read();
    test_keyset();
    test_rmtree(dir);
    CHECK_DONE();
}
