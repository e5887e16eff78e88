/* test_run_id: the run id a trainer names itself by to the broker (run_id.h).
 *
 * What a user would notice if it broke:
 *   - a drafter restarted on its checkpoint dir got a new id: the broker took it for a second
 *     trainer of another model and held it, then refused it (exit 6), instead of letting it
 *     replace its dead predecessor at once;
 *   - two checkpoint dirs (two runs) shared an id: the second run replaced the first one live;
 *   - a damaged run-id file was taken as some other id (or 0, "an older drafter"): it is
 *     refused, naming the file and saying to remove it. Exactly 16 hex digits (and a newline)
 *     are an id: "-1", "+5", "0x..." or a leading space were taken as one.
 */
#include "check.h"
#include "err.h"
#include "run_id.h"
#include "test_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int main(void)
{
    char root[] = "/tmp/dflash-run-id-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char a[300], b[300], path[400], err[512] = "";
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    CHECK_EQ_INT(mkdir(a, 0700), 0);
    CHECK_EQ_INT(mkdir(b, 0700), 0);

    uint64_t first = 0, again = 0, other = 0;
    CHECK_EQ_INT(run_id_load_or_create(a, &first, err, sizeof err), 0);
    CHECK(first != 0);
    CHECK_EQ_INT(run_id_load_or_create(a, &again, err, sizeof err), 0); /* a restart */
    CHECK(again == first);
    CHECK_EQ_INT(run_id_load_or_create(b, &other, err, sizeof err), 0); /* another run */
    CHECK(other != 0 && other != first);
    snprintf(path, sizeof path, "%s/run-id", a);
    char *text = test_slurp(path, NULL);
    char want[32];
    snprintf(want, sizeof want, "%016llx\n", (unsigned long long)first);
    CHECK(text && strcmp(text, want) == 0);
    free(text);

    /* strtoull alone took the last five: a sign, a 0x, a leading space, fewer digits */
    const char *bad[] = {"", "zz\n", "0000000000000000\n", "12 34\n", "1234567890abcdef0\n",
                         "-1\n", "+5\n", "0x1234567890abcd\n", " 123\n", "abc\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        test_spill(path, bad[i], strlen(bad[i]));
        uint64_t id = 7;
        err[0] = 0;
        CHECK_EQ_INT(run_id_load_or_create(a, &id, err, sizeof err), DFLASH_EFORMAT);
        CHECK(strstr(err, path) && strstr(err, "remove it"));
        CHECK(id == 7);
    }
    test_rmtree(root);
    CHECK_DONE();
}
