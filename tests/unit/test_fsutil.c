/* test_fsutil: the local-trust steps of fsutil (the security audit's local-trust findings).
 *   - fs_make_private_dir, the check of the ipc:// socket directory shared by the broker and
 *     every client: a missing dir is made 0700; one open to group or others, a symlink (even to
 *     a good dir), a file, another user's dir (only as root, who can chown) are refused with a
 *     message naming the dir, its owner and mode and the fix. */
#include "check.h"
#include "err.h"
#include "fsutil.h"
#include "test_files.h"

#include <stdlib.h>

static char dir[64];

/* fs_make_private_dir on p: its code, the message in why. */
static int private_dir(const char *p, char *why, size_t len)
{
    why[0] = 0;
    return fs_make_private_dir(p, why, len);
}

static void test_private_dir(void)
{
    char p[128], why[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s/rt", dir);
    CHECK_EQ_INT(private_dir(p, why, sizeof why), 0); /* missing: made, ours, 0700 */
    CHECK(lstat(p, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    CHECK_EQ_INT(private_dir(p, why, sizeof why), 0); /* and accepted as it is */

    CHECK_EQ_INT(chmod(p, 0750), 0);
    CHECK_EQ_INT(private_dir(p, why, sizeof why), DFLASH_EDENIED);
    CHECK(strstr(why, p) && strstr(why, "mode 0750") && strstr(why, "chmod 700"));
    CHECK_EQ_INT(chmod(p, 0701), 0); /* others may only enter: still refused */
    CHECK_EQ_INT(private_dir(p, why, sizeof why), DFLASH_EDENIED);
    CHECK_EQ_INT(chmod(p, 0700), 0);

    if (geteuid() == 0) {
        CHECK_EQ_INT(chown(p, 65534, (gid_t)-1), 0);
        CHECK_EQ_INT(private_dir(p, why, sizeof why), DFLASH_EDENIED);
        CHECK(strstr(why, "owned by uid 65534") && strstr(why, "remove it"));
        CHECK_EQ_INT(chown(p, 0, (gid_t)-1), 0);
    }

    char link[128];
    snprintf(link, sizeof link, "%s/rt-link", dir);
    CHECK_EQ_INT(symlink(p, link), 0);
    CHECK_EQ_INT(private_dir(link, why, sizeof why), DFLASH_ECONFIG);
    CHECK(strstr(why, link) && strstr(why, "symbolic link"));

    char file[128];
    snprintf(file, sizeof file, "%s/a-file", dir);
    test_spill(file, "x", 1);
    CHECK_EQ_INT(private_dir(file, why, sizeof why), DFLASH_ECONFIG);
    CHECK(strstr(why, "not a directory"));

    char deep[160];
    snprintf(deep, sizeof deep, "%s/no/such", dir); /* only the last component is made */
    CHECK_EQ_INT(private_dir(deep, why, sizeof why), DFLASH_EIO);
    CHECK(strstr(why, "cannot create"));
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dflash-test-fsutil-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_private_dir();
    test_rmtree(dir);
    CHECK_DONE();
}
