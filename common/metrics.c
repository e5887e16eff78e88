/* metrics: see metrics.h.
 *
 * State: two record files (record_file.h: JSONL, event file; a full disk never cuts a record in
 * two, and records wait in memory until it takes them again), a reusable pack buffer and
 * a reusable array of Summary.Value structs (grown when a record has more scalars than any
 * before, so steady state allocates nothing for the event file; cJSON allocates a small tree per
 * record). Clocks: CLOCK_MONOTONIC for flush and progress intervals and the ETA, CLOCK_REALTIME
 * for wall_time. The generated protobuf-c names stay inside this file.
 *
 * TFRecord frame, all integers little-endian:
 *   u64 length | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)
 */
#include "metrics.h"
#include "crc.h"
#include "monotime.h"
#include "err.h"
#include "fsutil.h"
#include "log.h"
#include "record_file.h"

#include "tensorboard.pb-c.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define METRICS_TAG_LEN 32

struct metrics {
    record_file *jsonl, *events;
    char jsonl_path[4096], event_path[4096];
    FILE *progress_out;
    bool progress, progress_tty, progress_open; /* open: a '\r' line awaits its newline */
    int64_t total_steps;
    double flush_interval, progress_interval;
    double last_flush, last_progress;
    bool have_first;
    double first_time;
    int64_t first_step;

    uint8_t *pack; /* packed Event */
    size_t pack_cap;
    Tensorboard__Summary__Value *values;
    Tensorboard__Summary__Value **value_ptrs;
    char (*pos_tags)[METRICS_TAG_LEN]; /* "train/pos_acc/NN" for offset NN */
    int values_cap, pos_tags_n;
};

/* ---- TFRecord ---- */

uint32_t metrics_crc_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ---- helpers ---- */

static double now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A file appended to across restarts ends in a line cut short when the last writer was killed
 * (its buffer flushes at any byte): that partial line is cut off, so the next record starts a
 * line and every line stays JSON. Returns the bytes cut (0: none or no file). */
static long trim_torn_line(const char *path)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) return 0;
    struct stat sb;
    off_t end = fstat(fd, &sb) == 0 ? sb.st_size : 0, keep = end;
    char chunk[4096];
    while (keep > 0) {
        off_t from = keep > (off_t)sizeof chunk ? keep - (off_t)sizeof chunk : 0;
        ssize_t n = pread(fd, chunk, (size_t)(keep - from), from);
        if (n != (ssize_t)(keep - from)) {
            keep = end; /* unreadable: leave the file as it is */
            break;
        }
        while (n > 0 && chunk[n - 1] != '\n') n--;
        if (n > 0) {
            keep = from + n;
            break;
        }
        keep = from;
    }
    long cut = keep < end && ftruncate(fd, keep) == 0 ? (long)(end - keep) : 0;
    close(fd);
    return cut;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* One TFRecord frame around data[n]. */
static int tfrecord_write(metrics *m, const uint8_t *data, size_t n)
{
    uint8_t head[12], tail[4];
    uint64_t len = n;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
    put_le32(head + 8, metrics_crc_mask(crc32c(0, head, 8)));
    put_le32(tail, metrics_crc_mask(crc32c(0, data, n)));
    const void *parts[] = {head, data, tail};
    const size_t lens[] = {12, n, 4};
    return record_file_add(m->events, parts, lens, 3);
}

static int pack_event(metrics *m, const Tensorboard__Event *ev)
{
    size_t need = tensorboard__event__get_packed_size(ev);
    if (need > m->pack_cap) {
        uint8_t *p = realloc(m->pack, need * 2);
        if (!p) return DFLASH_ENOMEM;
        m->pack = p;
        m->pack_cap = need * 2;
    }
    size_t got = tensorboard__event__pack(ev, m->pack);
    if (got != need) return DFLASH_EINTERNAL;
    return tfrecord_write(m, m->pack, got);
}

/* Makes room for n values and pos tags for offsets [0, n_pos). */
static int values_reserve(metrics *m, int n, int n_pos)
{
    if (n > m->values_cap) {
        Tensorboard__Summary__Value *v = realloc(m->values, (size_t)n * sizeof *v);
        if (!v) return DFLASH_ENOMEM;
        m->values = v;
        Tensorboard__Summary__Value **vp = realloc(m->value_ptrs, (size_t)n * sizeof *vp);
        if (!vp) return DFLASH_ENOMEM;
        m->value_ptrs = vp;
        m->values_cap = n;
    }
    if (n_pos > m->pos_tags_n) {
        char(*t)[METRICS_TAG_LEN] = realloc(m->pos_tags, (size_t)n_pos * METRICS_TAG_LEN);
        if (!t) return DFLASH_ENOMEM;
        for (int i = m->pos_tags_n; i < n_pos; i++)
            snprintf(t[i], METRICS_TAG_LEN, "train/pos_acc/%02d", i);
        m->pos_tags = t;
        m->pos_tags_n = n_pos;
    }
    return 0;
}

static void value_set(metrics *m, int i, const char *tag, double v)
{
    Tensorboard__Summary__Value *val = &m->values[i];
    tensorboard__summary__value__init(val);
    val->tag = (char *)tag;
    val->has_simple_value = true;
    val->simple_value = (float)v;
    m->value_ptrs[i] = val;
}

static int event_write_values(metrics *m, int64_t step, int n_values)
{
    Tensorboard__Summary summary = TENSORBOARD__SUMMARY__INIT;
    summary.n_value = (size_t)n_values;
    summary.value = m->value_ptrs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.has_wall_time = true;
    ev.wall_time = now_wall();
    ev.has_step = true;
    ev.step = step;
    ev.summary = &summary;
    return pack_event(m, &ev);
}

static void json_number(cJSON *o, const char *name, double v)
{
    if (isfinite(v)) cJSON_AddNumberToObject(o, name, v);
    else cJSON_AddNullToObject(o, name);
}

static int jsonl_write_obj(metrics *m, cJSON *o)
{
    char *text = cJSON_PrintUnformatted(o);
    if (!text) return DFLASH_ENOMEM;
    const void *parts[] = {text, "\n"};
    const size_t lens[] = {strlen(text), 1};
    int rc = record_file_add(m->jsonl, parts, lens, 2);
    cJSON_free(text);
    return rc;
}

static void maybe_flush(metrics *m, double now)
{
    if (now - m->last_flush >= m->flush_interval) {
        metrics_flush(m);
        m->last_flush = now;
    }
}

/* "12.3k" style for rates. */
static void fmt_rate(char *out, size_t len, double v)
{
    if (!isfinite(v)) snprintf(out, len, "-");
    else if (v >= 1e6) snprintf(out, len, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(out, len, "%.1fk", v / 1e3);
    else snprintf(out, len, "%.1f", v);
}

static void fmt_eta(char *out, size_t len, double s)
{
    if (!isfinite(s) || s < 0) {
        snprintf(out, len, "-");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(out, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, len, "%lds", t);
}

static void progress_print(metrics *m, const metrics_step *s, double now)
{
    bool last = m->total_steps > 0 && s->step >= m->total_steps;
    bool first = m->last_progress == 0;
    if (!last && !first && now - m->last_progress < m->progress_interval) return;
    m->last_progress = now;

    char steps[48], rate[16], eta[16] = "-";
    if (m->total_steps > 0)
        snprintf(steps, sizeof steps, "%lld/%lld", (long long)s->step, (long long)m->total_steps);
    else snprintf(steps, sizeof steps, "%lld", (long long)s->step);
    fmt_rate(rate, sizeof rate, s->tokens_per_s);
    if (m->total_steps > 0 && s->step > m->first_step && now > m->first_time) {
        double per_step = (now - m->first_time) / (double)(s->step - m->first_step);
        fmt_eta(eta, sizeof eta, per_step * (double)(m->total_steps - s->step));
    }
    char line[256];
    snprintf(line, sizeof line, "step %s loss %.4f acc %.3f tau %.2f lr %.2e tok/s %s ETA %s",
             steps, s->loss, s->accuracy, s->acceptance_length, s->lr, rate, eta);
    if (m->progress_tty) {
        fprintf(m->progress_out, "\r%s\033[K", line);
        m->progress_open = true;
    } else {
        fprintf(m->progress_out, "%s\n", line);
    }
    fflush(m->progress_out);
}

/* ---- public ---- */

metrics_opts metrics_opts_default(void)
{
    return (metrics_opts){.dir = NULL,
                          .jsonl = true,
                          .tensorboard = true,
                          .progress = true,
                          .progress_out = NULL,
                          .total_steps = 0,
                          .flush_interval_s = -1,
                          .progress_interval_s = 0};
}

metrics *metrics_new(const metrics_opts *o)
{
    metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->total_steps = o->total_steps;
    m->flush_interval = o->flush_interval_s < 0 ? 1.0 : o->flush_interval_s;
    m->progress = o->progress;
    m->progress_out = o->progress_out ? o->progress_out : stderr;
    m->progress_tty = isatty(fileno(m->progress_out));
    m->progress_interval = o->progress_interval_s > 0 ? o->progress_interval_s
                           : m->progress_tty          ? 0.2
                                                      : 10.0;
    m->last_flush = monotime_s();

    if (o->dir && (o->jsonl || o->tensorboard)) {
        if (fs_make_dirs(o->dir)) {
            LOG_ERROR("metrics: cannot create directory %s: %s", o->dir, strerror(errno));
            goto fail;
        }
    }
    if (o->dir && o->jsonl) {
        snprintf(m->jsonl_path, sizeof m->jsonl_path, "%s/metrics.jsonl", o->dir);
        long cut = trim_torn_line(m->jsonl_path);
        if (cut > 0)
            LOG_WARN("metrics: cut %ld bytes of a line left unfinished at the end of %s (its "
                     "writer was killed)",
                     cut, m->jsonl_path);
        m->jsonl = record_file_open(m->jsonl_path, false);
        if (!m->jsonl) {
            LOG_ERROR("metrics: cannot open %s: %s", m->jsonl_path, strerror(errno));
            goto fail;
        }
    }
    if (o->dir && o->tensorboard) {
        char host[256] = "localhost";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        snprintf(m->event_path, sizeof m->event_path, "%s/events.out.tfevents.%lld.%s", o->dir,
                 (long long)time(NULL), host);
        m->events = record_file_open(m->event_path, true);
        if (!m->events && errno == EEXIST) { /* a writer started in the same second */
            size_t len = strlen(m->event_path);
            snprintf(m->event_path + len, sizeof m->event_path - len, ".%ld", (long)getpid());
            m->events = record_file_open(m->event_path, true);
        }
        if (!m->events) {
            LOG_ERROR("metrics: cannot create %s: %s", m->event_path, strerror(errno));
            goto fail;
        }
        Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
        ev.has_wall_time = true;
        ev.wall_time = now_wall();
        ev.file_version = "brain.Event:2";
        if (pack_event(m, &ev) || record_file_flush(m->events)) {
            LOG_ERROR("metrics: cannot write %s: %s", m->event_path, strerror(errno));
            goto fail;
        }
    }
    return m;

fail:
    metrics_destroy(&m);
    return NULL;
}

int metrics_write(metrics *m, const metrics_step *s)
{
    if (!m || !s || s->n_pos < 0 || s->n_extra < 0 || (s->n_pos && !s->pos_acc) ||
        s->pos_first < 0 ||
        (s->n_extra && !s->extra))
        return DFLASH_EINVAL;
    double now = monotime_s();
    if (!m->have_first) {
        m->have_first = true;
        m->first_time = now;
        m->first_step = s->step;
    }
    int rc = 0;

    if (m->events) {
        int n = 7 + s->n_pos + s->n_extra;
        int r = values_reserve(m, n, s->n_pos);
        if (r) return r;
        int i = 0;
        value_set(m, i++, "train/loss", s->loss);
        value_set(m, i++, "train/accuracy", s->accuracy);
        value_set(m, i++, "train/acceptance_length", s->acceptance_length);
        value_set(m, i++, "train/lr", s->lr);
        value_set(m, i++, "train/grad_norm", s->grad_norm);
        value_set(m, i++, "perf/tokens_per_s", s->tokens_per_s);
        value_set(m, i++, "perf/samples_per_s", s->samples_per_s);
        for (int k = s->pos_first; k < s->n_pos; k++)
            value_set(m, i++, m->pos_tags[k], s->pos_acc[k]);
        for (int k = 0; k < s->n_extra; k++)
            value_set(m, i++, s->extra[k].name, s->extra[k].value);
        r = event_write_values(m, s->step, i);
        if (r) rc = r;
    }

    if (m->jsonl) {
        cJSON *o = cJSON_CreateObject();
        if (!o) return DFLASH_ENOMEM;
        cJSON_AddNumberToObject(o, "step", (double)s->step);
        cJSON_AddNumberToObject(o, "time", now_wall());
        json_number(o, "loss", s->loss);
        json_number(o, "accuracy", s->accuracy);
        json_number(o, "acceptance_length", s->acceptance_length);
        json_number(o, "lr", s->lr);
        json_number(o, "grad_norm", s->grad_norm);
        json_number(o, "tokens_per_s", s->tokens_per_s);
        json_number(o, "samples_per_s", s->samples_per_s);
        if (s->n_pos) {
            cJSON *a = cJSON_AddArrayToObject(o, "pos_acc");
            for (int k = 0; a && k < s->n_pos; k++)
                cJSON_AddItemToArray(a, k >= s->pos_first && isfinite(s->pos_acc[k])
                                            ? cJSON_CreateNumber(s->pos_acc[k])
                                            : cJSON_CreateNull());
        }
        for (int k = 0; k < s->n_extra; k++) json_number(o, s->extra[k].name, s->extra[k].value);
        int r = jsonl_write_obj(m, o);
        cJSON_Delete(o);
        if (r) rc = r;
    }

    if (m->progress) progress_print(m, s, now);
    maybe_flush(m, now);
    return rc;
}

int metrics_write_scalar(metrics *m, int64_t step, const char *name, double value)
{
    if (!m || !name || !*name) return DFLASH_EINVAL;
    int rc = 0;
    if (m->events) {
        int r = values_reserve(m, 1, 0);
        if (r) return r;
        value_set(m, 0, name, value);
        r = event_write_values(m, step, 1);
        if (r) rc = r;
    }
    if (m->jsonl) {
        cJSON *o = cJSON_CreateObject();
        if (!o) return DFLASH_ENOMEM;
        cJSON_AddNumberToObject(o, "step", (double)step);
        cJSON_AddNumberToObject(o, "time", now_wall());
        json_number(o, name, value);
        int r = jsonl_write_obj(m, o);
        cJSON_Delete(o);
        if (r) rc = r;
    }
    maybe_flush(m, monotime_s());
    return rc;
}

int metrics_flush(metrics *m)
{
    if (!m) return DFLASH_EINVAL;
    int rc = 0;
    if (m->jsonl && record_file_flush(m->jsonl)) rc = DFLASH_EIO;
    if (m->events && record_file_flush(m->events)) rc = DFLASH_EIO;
    return rc;
}

int metrics_sync(metrics *m)
{
    if (!m) return DFLASH_EINVAL;
    int rc = 0;
    if (m->jsonl && record_file_sync(m->jsonl)) rc = DFLASH_EIO;
    if (m->events && record_file_sync(m->events)) rc = DFLASH_EIO;
    return rc;
}

const char *metrics_jsonl_path(const metrics *m)
{
    return m && m->jsonl ? m->jsonl_path : NULL;
}

const char *metrics_event_path(const metrics *m)
{
    return m && m->events ? m->event_path : NULL;
}

void metrics_destroy(metrics **mp)
{
    if (!mp || !*mp) return;
    metrics *m = *mp;
    if (m->progress_open) {
        fputc('\n', m->progress_out);
        fflush(m->progress_out);
    }
    record_file_close(&m->jsonl);
    record_file_close(&m->events);
    free(m->pack);
    free(m->values);
    free(m->value_ptrs);
    free(m->pos_tags);
    free(m);
    *mp = NULL;
}
