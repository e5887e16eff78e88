/* test_metrics: the drafter's metrics reach the user intact.
 *   - the event file is a valid TFRecord stream (both masked CRCs of every record checked here
 *     in C), starts with file_version "brain.Event:2", and has one record per step;
 *   - an independent Python reader (tb_read.py: its own CRC32C and protobuf decoder) finds every
 *     tag, value and step, and agrees with metrics.jsonl; skipped when /usr/bin/python3 is absent;
 *   - metrics.jsonl has one parseable object per step with the fields, pos_acc array, extras and
 *     null for NaN; records are on disk before the writer is closed when flushing every record;
 *   - the progress line is rate-limited on a non-tty but always shows the first and last step;
 *     its rates read 5.0k and 2.50M, a resumed run's ETA counts the steps this run took;
 *   - a line torn by a killed writer is cut off, also when it is the file's only line;
 *   - with a long flush interval records wait in the buffer until metrics_flush();
 *   - an unusable directory gives NULL, not a crash;
 *   - a disk that refuses writes for a while loses no step and cuts no record in two.
 */
#include "check.h"
#include "crc.h"
#include "err.h"
#include "metrics.h"
#include "test_files.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_STEPS 5
#define BLOCK 4

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Walks the TFRecord frames; returns the number of records, or -1 on a framing/CRC error. */
static int count_records(const uint8_t *buf, size_t n, bool *first_is_version)
{
    size_t off = 0;
    int count = 0;
    while (off < n) {
        if (off + 12 > n) return -1;
        uint64_t len = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)buf[off + i] << (8 * i);
        if (metrics_crc_mask(crc32c(0, buf + off, 8)) != le32(buf + off + 8)) return -1;
        size_t start = off + 12;
        if (len > n || start + len + 4 > n) return -1;
        if (metrics_crc_mask(crc32c(0, buf + start, len)) != le32(buf + start + len))
            return -1;
        if (count == 0)
            *first_is_version = memmem(buf + start, len, "brain.Event:2", 13) != NULL;
        off = start + len + 4;
        count++;
    }
    return count;
}

static double step_loss(int s)
{
    return 5.0 / (s + 1);
}

static void fill_step(metrics_step *st, int s, double *pos, metrics_scalar *extra)
{
    for (int k = 0; k < BLOCK; k++) pos[k] = k == 0 ? 1.0 : 0.5 / k + 0.01 * s;
    extra[0] = (metrics_scalar){"train/anchors", 512 + s};
    extra[1] = (metrics_scalar){"train/nan_probe", s == 2 ? NAN : 0.25};
    *st = (metrics_step){.step = s,
                         .loss = step_loss(s),
                         .accuracy = 0.1 * s,
                         .pos_acc = pos,
                         .n_pos = BLOCK,
                         .pos_first = 1, /* the anchor is not predicted */
                         .acceptance_length = 1.0 + 0.3 * s,
                         .lr = 6e-4 * s / N_STEPS,
                         .grad_norm = 2.5,
                         .tokens_per_s = 12345.0,
                         .samples_per_s = 12.0,
                         .extra = extra,
                         .n_extra = 2};
}

/* Runs tb_read.py on the event file and checks a few scalars from its output. */
static void python_check(const char *events, const char *jsonl)
{
    char script[4096];
    snprintf(script, sizeof script, "%s", __FILE__);
    char *slash = strrchr(script, '/');
    if (slash) snprintf(slash + 1, sizeof script - (size_t)(slash + 1 - script), "tb_read.py");
    /* python3 is a dependency (scripts/install-deps): its absence fails, it does not skip */
    bool have_reader = access("/usr/bin/python3", X_OK) == 0 && access(script, R_OK) == 0;
    if (!have_reader) fprintf(stderr, "/usr/bin/python3 or %s missing\n", script);
    CHECK(have_reader);
    if (!have_reader) return;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' --jsonl '%s'", script, events, jsonl);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    char line[512];
    int n_lines = 0, seen_loss = 0, seen_pos = 0, seen_extra = 0, seen_eval = 0, seen_pos0 = 0;
    while (fgets(line, sizeof line, p)) {
        long long step;
        char tag[128];
        double v;
        if (sscanf(line, "%lld\t%127s\t%lf", &step, tag, &v) != 3) continue;
        n_lines++;
        if (strcmp(tag, "train/loss") == 0) {
            seen_loss++;
            CHECK(v == (double)(float)step_loss((int)step));
        } else if (strcmp(tag, "train/pos_acc/03") == 0) {
            seen_pos++;
            CHECK(v == (double)(float)(0.5 / 3 + 0.01 * (double)step));
        } else if (strcmp(tag, "train/pos_acc/00") == 0) {
            seen_pos0++;
        } else if (strcmp(tag, "train/anchors") == 0) {
            seen_extra++;
            CHECK(v == 512.0 + (double)step);
        } else if (strcmp(tag, "eval/tau") == 0) {
            seen_eval++;
            CHECK_EQ_INT(step, N_STEPS);
            CHECK(v == (double)2.75f);
        }
    }
    int status = pclose(p);
    CHECK_EQ_INT(status, 0); /* tb_read exits 1 on CRC, framing or JSONL mismatch */
    CHECK_EQ_INT(seen_loss, N_STEPS);
    CHECK_EQ_INT(seen_pos, N_STEPS);
    CHECK_EQ_INT(seen_extra, N_STEPS);
    CHECK_EQ_INT(seen_eval, 1);
    CHECK_EQ_INT(seen_pos0, 0); /* pos_first = 1: the anchor offset is left out */
    CHECK_EQ_INT(n_lines, N_STEPS * (7 + BLOCK - 1 + 2) + 1);
}

static void test_write_and_read_back(void)
{
    char dir[] = "/tmp/dflash-test-metrics-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/run/metrics", dir); /* parents are created */
    FILE *prog = tmpfile();
    metrics_opts o = metrics_opts_default();
    o.dir = sub;
    o.progress_out = prog;
    o.total_steps = N_STEPS;
    o.flush_interval_s = 0; /* every record */
    metrics *m = metrics_new(&o);
    CHECK(m != NULL);
    if (!m) return;
    char events[4096], jsonl[4096];
    snprintf(events, sizeof events, "%s", metrics_event_path(m));
    snprintf(jsonl, sizeof jsonl, "%s", metrics_jsonl_path(m));
    CHECK(strstr(events, "/events.out.tfevents.") != NULL);

    for (int s = 1; s <= N_STEPS; s++) {
        metrics_step st;
        double pos[BLOCK];
        metrics_scalar extra[2];
        fill_step(&st, s, pos, extra);
        CHECK_EQ_INT(metrics_write(m, &st), 0);
    }
    CHECK_EQ_INT(metrics_write_scalar(m, N_STEPS, "eval/tau", 2.75), 0);
    metrics_step bad = {.step = 9, .n_pos = 3, .pos_acc = NULL};
    CHECK_EQ_INT(metrics_write(m, &bad), DFLASH_EINVAL);

    /* flushed every record: complete on disk while the writer is still open */
    size_t n = 0;
    uint8_t *buf = (uint8_t *)read_all(events, &n);
    CHECK(buf != NULL);
    bool version = false;
    CHECK_EQ_INT(buf ? count_records(buf, n, &version) : -1, 1 + N_STEPS + 1);
    CHECK(version);
    free(buf);
    metrics_destroy(&m);
    CHECK(m == NULL);
    metrics_destroy(&m); /* NULL is fine */

    /* a corrupted byte is caught by the framing check */
    buf = (uint8_t *)read_all(events, &n);
    if (buf && n > 40) {
        buf[n - 10] ^= 0x40;
        CHECK_EQ_INT(count_records(buf, n, &version), -1);
    }
    free(buf);

    /* JSONL: one object per line, fields present, NaN as null */
    char *text = read_all(jsonl, &n);
    CHECK(text != NULL);
    int lines = 0;
    for (char *save = NULL, *l = text ? strtok_r(text, "\n", &save) : NULL; l;
         l = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(l);
        CHECK(j != NULL);
        if (!j) continue;
        lines++;
        int step = (int)cJSON_GetObjectItem(j, "step")->valuedouble;
        if (lines <= N_STEPS) {
            CHECK_EQ_INT(step, lines);
            CHECK_NEAR(cJSON_GetObjectItem(j, "loss")->valuedouble, step_loss(step), 1e-12);
            CHECK_NEAR(cJSON_GetObjectItem(j, "acceptance_length")->valuedouble,
                       1.0 + 0.3 * step, 1e-12);
            cJSON *pa = cJSON_GetObjectItem(j, "pos_acc");
            CHECK(cJSON_IsArray(pa) && cJSON_GetArraySize(pa) == BLOCK);
            CHECK(cJSON_IsNull(cJSON_GetArrayItem(pa, 0)));
            CHECK_NEAR(cJSON_GetArrayItem(pa, 2)->valuedouble, 0.25 + 0.01 * step, 1e-12);
            CHECK(cJSON_GetObjectItem(j, "grad_norm") && cJSON_GetObjectItem(j, "lr") &&
                  cJSON_GetObjectItem(j, "tokens_per_s") &&
                  cJSON_GetObjectItem(j, "samples_per_s") && cJSON_GetObjectItem(j, "time"));
            CHECK_NEAR(cJSON_GetObjectItem(j, "train/anchors")->valuedouble, 512 + step, 0);
            CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "train/nan_probe")) == (step == 2));
        } else {
            CHECK_NEAR(cJSON_GetObjectItem(j, "eval/tau")->valuedouble, 2.75, 0);
        }
        cJSON_Delete(j);
    }
    CHECK_EQ_INT(lines, N_STEPS + 1);
    free(text);

    python_check(events, jsonl);

    /* progress on a non-tty: first and last step only (10 s interval), with the ETA */
    fflush(prog);
    rewind(prog);
    char line[512];
    int plines = 0;
    bool first = false, last = false;
    while (fgets(line, sizeof line, prog)) {
        plines++;
        if (strstr(line, "step 1/5 loss 2.5000")) first = true;
        if (strstr(line, "step 5/5 ") && strstr(line, "tau 2.50") && strstr(line, "ETA 0s") &&
            strstr(line, "tok/s 12.3k"))
            last = true;
    }
    CHECK_EQ_INT(plines, 2);
    CHECK(first);
    CHECK(last);
    fclose(prog);

    /* a restarted writer appends to metrics.jsonl and opens a new event file */
    o.progress = false;
    m = metrics_new(&o);
    CHECK(m != NULL);
    if (m) {
        CHECK(strcmp(metrics_event_path(m), events) != 0);
        CHECK_EQ_INT(metrics_write_scalar(m, 6, "eval/tau", 3.0), 0);
        metrics_destroy(&m);
        text = read_all(jsonl, &n);
        int nl = 0;
        for (size_t i = 0; text && i < n; i++) nl += text[i] == '\n';
        CHECK_EQ_INT(nl, N_STEPS + 2);
        free(text);
    }

    CHECK_EQ_INT(test_rmtree(dir), 0);
}

/* A writer into a new temporary dir (its template filled in) that flushes only when told
 * (metrics_flush, metrics_sync), without a progress line; NULL after a failed CHECK. */
static metrics *held_writer(char *dir)
{
    CHECK(mkdtemp(dir) != NULL);
    metrics_opts o = metrics_opts_default();
    o.dir = dir;
    o.progress = false;
    o.flush_interval_s = 1000;
    metrics *m = metrics_new(&o);
    CHECK(m != NULL);
    return m;
}

/* With a long flush interval records stay in the writer's buffer (no write(2) per record) until
 * metrics_flush(), which a daemon calls from its timer. */
static void test_buffered_until_flush(void)
{
    char dir[] = "/tmp/dflash-test-metrics-XXXXXX";
    metrics *m = held_writer(dir);
    if (!m) return;
    char jsonl[4096];
    snprintf(jsonl, sizeof jsonl, "%s", metrics_jsonl_path(m));
    metrics_step st = {.step = 1, .loss = 1.5};
    CHECK_EQ_INT(metrics_write(m, &st), 0);
    struct stat sb;
    CHECK(stat(jsonl, &sb) == 0 && sb.st_size == 0);
    CHECK_EQ_INT(metrics_flush(m), 0);
    CHECK(stat(jsonl, &sb) == 0 && sb.st_size > 0);
    metrics_destroy(&m);
    CHECK_EQ_INT(test_rmtree(dir), 0);
}

/* A writer killed mid-record leaves a line cut short at the end of metrics.jsonl; the next
 * writer cuts it off, so every line stays one JSON object. */
/* metrics.jsonl holding `initial` (a writer killed mid-record), then one record appended by a new
 * writer: every line parses, and there are want_lines of them. */
static void torn_case(const char *initial, int want_lines)
{
    char dir[] = "/tmp/dflash-test-metrics-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char jsonl[4096];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", dir);
    FILE *f = fopen(jsonl, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(initial, f);
    fclose(f);
    metrics_opts o = metrics_opts_default();
    o.dir = dir;
    o.progress = false;
    o.tensorboard = false;
    o.flush_interval_s = 0;
    metrics *m = metrics_new(&o);
    CHECK(m != NULL);
    if (!m) return;
    metrics_step st = {.step = 2, .loss = 1.5};
    CHECK_EQ_INT(metrics_write(m, &st), 0);
    metrics_destroy(&m);
    size_t n = 0;
    char *text = read_all(jsonl, &n);
    int lines = 0, parsed = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        lines++;
        cJSON *j = cJSON_Parse(line);
        parsed += j != NULL;
        cJSON_Delete(j);
    }
    CHECK_EQ_INT(lines, want_lines);
    CHECK_EQ_INT(parsed, want_lines);
    free(text);
    CHECK_EQ_INT(test_rmtree(dir), 0);
}

static void test_torn_line_after_kill(void)
{
    torn_case("{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"lo", 2); /* killed mid-record */
    torn_case("{\"step\":1,\"lo", 1); /* killed inside the first record: nothing kept */
}

/* The progress line's figures: rates as 5.0k and 2.50M, and a resumed run's ETA from the steps
 * it took itself (from step 1000, one step in ~20 ms, 999999 to go: hours, not the ~20 s that
 * dividing by the step number gives), written as hours and minutes under 60. */
static void test_progress_figures(void)
{
    FILE *prog = tmpfile();
    CHECK(prog != NULL);
    if (!prog) return;
    metrics_opts o = metrics_opts_default();
    o.dir = NULL;
    o.progress_out = prog;
    o.progress_interval_s = 1e-9; /* every step */
    o.total_steps = 1001000;
    metrics *m = metrics_new(&o);
    CHECK(m != NULL);
    if (!m) return;
    metrics_step st = {.step = 1000, .tokens_per_s = 5000.0};
    CHECK_EQ_INT(metrics_write(m, &st), 0);
    usleep(20000);
    st = (metrics_step){.step = 1001, .tokens_per_s = 2.5e6};
    CHECK_EQ_INT(metrics_write(m, &st), 0);
    metrics_destroy(&m);
    rewind(prog);
    char l1[512] = "", l2[512] = "";
    CHECK(fgets(l1, sizeof l1, prog) && fgets(l2, sizeof l2, prog));
    fclose(prog);
    CHECK(strstr(l1, "tok/s 5.0k ") != NULL);
    CHECK(strstr(l2, "tok/s 2.50M ") != NULL);
    const char *eta = strstr(l2, "ETA ");
    unsigned h = 0, mins = 99;
    char tail = 0;
    CHECK(eta && sscanf(eta, "ETA %uh%2um%c", &h, &mins, &tail) == 3 && h >= 1 && mins < 60 &&
          tail == '\n');
    if (!eta || mins >= 60) printf("progress: %s", l2);
}

/* A disk that refuses writes for a while (past RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC,
 * cutting a write part way): the flushes meanwhile fail, and once it takes them again every
 * step is in both files, in order, every line parses and every frame's CRCs hold (defect: stdio
 * flushed part of a buffer, dropped the rest, and the next writes left a line glued to a later
 * one and a broken TFRecord frame mid-file, with the steps between lost). */
static void test_full_disk_for_a_while(void)
{
    char dir[] = "/tmp/dflash-test-metrics-XXXXXX";
    metrics *m = held_writer(dir);
    if (!m) return;
    char jsonl[4096], events[4096];
    snprintf(jsonl, sizeof jsonl, "%s", metrics_jsonl_path(m));
    snprintf(events, sizeof events, "%s", metrics_event_path(m));
    struct rlimit was, small;
    CHECK_EQ_INT(getrlimit(RLIMIT_FSIZE, &was), 0);
    small = (struct rlimit){3000, was.rlim_max};
    signal(SIGXFSZ, SIG_IGN);
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &small), 0);
    enum { STEPS = 120 };
    int failed_flushes = 0;
    for (int s = 1; s <= STEPS; s++) {
        double pos[BLOCK];
        metrics_scalar extra[2];
        metrics_step st;
        fill_step(&st, s, pos, extra);
        metrics_write(m, &st); /* may fail: the disk is full */
        if (s % 10 == 0) failed_flushes += metrics_flush(m) != 0;
    }
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &was), 0);
    signal(SIGXFSZ, SIG_DFL);
    CHECK(failed_flushes > 0);
    CHECK_EQ_INT(metrics_sync(m), 0);
    metrics_destroy(&m);
    size_t n = 0;
    char *text = read_all(jsonl, &n);
    int lines = 0, in_order = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        lines++;
        cJSON *j = cJSON_Parse(line);
        const cJSON *step = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        in_order += cJSON_IsNumber(step) && step->valuedouble == lines;
        cJSON_Delete(j);
    }
    printf("a full disk for %d flushes: %d lines, %d of them the steps in order\n",
           failed_flushes, lines, in_order);
    CHECK_EQ_INT(lines, STEPS);
    CHECK_EQ_INT(in_order, STEPS);
    free(text);
    uint8_t *ev = (uint8_t *)read_all(events, &n);
    bool version = false;
    CHECK_EQ_INT(ev ? count_records(ev, n, &version) : -2, STEPS + 1);
    CHECK(version);
    free(ev);
    CHECK_EQ_INT(test_rmtree(dir), 0);
}

static void test_bad_dir(void)
{
    metrics_opts o = metrics_opts_default();
    o.dir = "/proc/self/no/such/dir";
    o.progress = false;
    CHECK(metrics_new(&o) == NULL);
    /* no files: only the progress line */
    o.dir = NULL;
    o.progress = false;
    metrics *m = metrics_new(&o);
    CHECK(m != NULL);
    CHECK(metrics_event_path(m) == NULL && metrics_jsonl_path(m) == NULL);
    metrics_step st = {.step = 1};
    CHECK_EQ_INT(metrics_write(m, &st), 0);
    metrics_destroy(&m);
}

int main(void)
{
    test_write_and_read_back();
    test_buffered_until_flush();
    test_torn_line_after_kill();
    test_progress_figures();
    test_bad_dir();
    test_full_disk_for_a_while();
    CHECK_DONE();
}
