/* Request traces, Triton's trace extension: settings, sampling, and the
 * trace file's writer thread (trace_int.h).
 *
 * Settings follow Triton's TraceManager: one global setting, and a model's
 * own over it. A model's setting holds the fields it was given and copies
 * the others from the global one whenever that changes; a setting updated
 * starts its rate count afresh; a model whose fields are all cleared uses
 * the global setting itself (and its counts). The rate and count decide as
 * Triton's: of the requests under a setting, every rate-th is traced while
 * count (the traces left, -1 for no limit) is not 0.
 *
 * Lines are queued under a lock and written by the writer thread, so the
 * HTTP loop that answers a traced request formats its line and never
 * touches the file. */
#include "trace_int.h"

#include <sq.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Lines waiting for the writer, at most (then dropped and counted). */
#define PENDING_MAX_BYTES (16u << 20)

/* The fields of a setting a model may give itself. */
enum { SET_LEVEL = 1u, SET_RATE = 2u, SET_COUNT = 4u, SET_FREQUENCY = 8u };

typedef struct {
    int level;
    uint32_t rate;
    int32_t count; /* traces left; -1: no limit */
    uint32_t log_frequency;
    unsigned specified; /* a model's: the fields it gives itself (SET_*) */
    uint64_t seen;      /* requests under it since it was set (for the rate) */
} setting_t;

typedef struct model_setting model_setting_t;
struct model_setting {
    model_setting_t *next;
    setting_t s;
    char name[];
};

struct gw_trace {
    char *path; /* "" = none */
    /* Settings: lock held while they are read or changed. */
    pthread_mutex_t lock;
    setting_t global;
    model_setting_t *models;
    uint64_t last_id;
    atomic_int active;         /* some setting can trace now: sampling looks */
    atomic_uint log_frequency; /* the global one, for the writer */
    /* The writer: wlock guards pending, dropped and stop. */
    pthread_mutex_t wlock;
    pthread_cond_t wake;
    sq_buf_t pending;
    uint64_t dropped;
    int stop;
    int running;
    pthread_t thread;
    /* The writer thread's own. */
    int fd;              /* the file lines go to now; -1: none open */
    int fd_indexed;      /* fd is path.N (log_frequency > 0), not path */
    uint64_t fd_lines;   /* lines written to it */
    uint64_t next_index; /* N of the next path.N */
    int write_failing;   /* warned once per failing streak */
};

static const setting_t setting_default = {
    .level = GW_TRACE_OFF, .rate = GW_TRACE_DEFAULT_RATE, .count = -1, .log_frequency = 0};

gw_trace_t *gw_trace_new(const char *path)
{
    gw_trace_t *t = sq_xcalloc(1, sizeof(*t));
    t->path = sq_xstrdup(path != NULL ? path : "");
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->wlock, NULL);
    pthread_cond_init(&t->wake, NULL);
    t->global = setting_default;
    sq_buf_init(&t->pending);
    t->fd = -1;
    return t;
}

/* ---- settings ------------------------------------------------------------ */

/* Whether s traces requests now. */
static int setting_live(const setting_t *s)
{
    return s->level != GW_TRACE_OFF && s->rate > 0 && s->count != 0;
}

/* Under lock. */
static void update_active(gw_trace_t *t)
{
    int live = setting_live(&t->global);
    for (const model_setting_t *m = t->models; m != NULL && !live; m = m->next)
        live = setting_live(&m->s);
    atomic_store(&t->active, live);
}

static model_setting_t *model_find(gw_trace_t *t, const char *name, model_setting_t ***link)
{
    model_setting_t **at = &t->models;
    for (; *at != NULL; at = &(*at)->next)
        if (strcmp((*at)->name, name) == 0)
            break;
    if (link != NULL)
        *link = at;
    return *at;
}

/* A model's fields not its own, from the global setting; its count starts
 * afresh. */
static void inherit(setting_t *s, const setting_t *global)
{
    if (!(s->specified & SET_LEVEL))
        s->level = global->level;
    if (!(s->specified & SET_RATE))
        s->rate = global->rate;
    if (!(s->specified & SET_COUNT))
        s->count = global->count;
    if (!(s->specified & SET_FREQUENCY))
        s->log_frequency = global->log_frequency;
    s->seen = 0;
}

/* One field of a request: left alone, set to a value, or cleared (null). */
typedef enum { KEEP, SET, CLEAR } op_t;

typedef struct {
    op_t level_op, rate_op, count_op, frequency_op;
    int level;
    long long rate, count, frequency;
} change_t;

/* An integer setting: a string of digits (Triton's clients send strings)
 * or a JSON integer, in min..max. */
static int parse_number(const char *name, json_t *v, long long min, long long max, long long *out,
                        char *why, size_t len)
{
    long long n = 0;
    int ok = 0;
    if (json_is_integer(v)) {
        n = json_integer_value(v);
        ok = 1;
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        n = strtoll(s, &end, 10);
        ok = *s != '\0' && *end == '\0' && errno == 0 &&
             (s[0] == '-' || (s[0] >= '0' && s[0] <= '9'));
    }
    if (!ok || n < min || n > max) {
        char got[64];
        if (json_is_string(v))
            snprintf(got, sizeof(got), "\"%.40s\"", json_string_value(v));
        else if (json_is_integer(v))
            snprintf(got, sizeof(got), "%lld", (long long)json_integer_value(v));
        else
            snprintf(got, sizeof(got), "a JSON %s",
                     json_is_real(v)      ? "fraction"
                     : json_is_boolean(v) ? "boolean"
                                          : "value");
        snprintf(why, len,
                 "%s: expected an integer in %lld..%lld (as a string, like Triton's, or a number), "
                 "got %s",
                 name, min, max, got);
        return SQ_BAD_REQUEST;
    }
    *out = n;
    return 0;
}

/* trace_level: ["OFF"], ["TIMESTAMPS"] (or the bare string). */
static int parse_level(json_t *v, int *level, char *why, size_t len)
{
    json_t *one = json_is_string(v) ? v : NULL;
    size_t n = json_is_array(v) ? json_array_size(v) : one != NULL ? 1 : 0;
    if (n == 0) {
        snprintf(why, len, "trace_level: expected [\"OFF\"] or [\"TIMESTAMPS\"]");
        return SQ_BAD_REQUEST;
    }
    int timestamps = 0, off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = one != NULL ? one : json_array_get(v, i);
        const char *s = json_string_value(e);
        if (s != NULL && strcmp(s, "OFF") == 0) {
            off = 1;
        } else if (s != NULL && strcmp(s, "TIMESTAMPS") == 0) {
            timestamps = 1;
        } else if (s != NULL && strcmp(s, "TENSORS") == 0) {
            snprintf(why, len,
                     "trace_level: TENSORS is not supported: squish traces timestamps only (its "
                     "tensors live in shared memory between squishd and its workers and are not "
                     "copied out for traces); ask for [\"TIMESTAMPS\"]");
            return SQ_BAD_REQUEST;
        } else {
            snprintf(why, len,
                     "trace_level: unknown level %s%.40s%s: expected \"OFF\" or \"TIMESTAMPS\"",
                     s != NULL ? "\"" : "", s != NULL ? s : "(not a string)",
                     s != NULL ? "\"" : "");
            return SQ_BAD_REQUEST;
        }
    }
    if (off && n > 1) {
        snprintf(why, len, "trace_level: \"OFF\" must be the only level given");
        return SQ_BAD_REQUEST;
    }
    *level = timestamps ? GW_TRACE_TIMESTAMPS : GW_TRACE_OFF;
    return 0;
}

/* Reads the body into c; SQ_BAD_REQUEST with why on anything squish does
 * not do. Under lock (trace_file is compared with the path). */
static int parse_change(gw_trace_t *t, const char *model, json_t *body, change_t *c, char *why,
                        size_t len)
{
    memset(c, 0, sizeof(*c));
    if (!json_is_object(body)) {
        snprintf(why, len, "the body must be a JSON object of trace settings");
        return SQ_BAD_REQUEST;
    }
    const char *key;
    json_t *v;
    int rc;
    json_object_foreach(body, key, v)
    {
        int null = json_is_null(v);
        if (strcmp(key, "trace_level") == 0) {
            c->level_op = null ? CLEAR : SET;
            if (!null && (rc = parse_level(v, &c->level, why, len)) != 0)
                return rc;
        } else if (strcmp(key, "trace_rate") == 0) {
            c->rate_op = null ? CLEAR : SET;
            if (!null && (rc = parse_number(key, v, 0, UINT32_MAX, &c->rate, why, len)) != 0)
                return rc;
        } else if (strcmp(key, "trace_count") == 0) {
            c->count_op = null ? CLEAR : SET;
            if (!null && (rc = parse_number(key, v, -1, INT32_MAX, &c->count, why, len)) != 0)
                return rc;
        } else if (strcmp(key, "log_frequency") == 0) {
            if (!null && model != NULL) {
                snprintf(why, len,
                         "log_frequency: squishd has one trace file, so its log_frequency is "
                         "server-wide: POST it to /v2/trace/setting");
                return SQ_BAD_REQUEST;
            }
            c->frequency_op = null ? CLEAR : SET;
            if (!null && (rc = parse_number(key, v, 0, UINT32_MAX, &c->frequency, why, len)) != 0)
                return rc;
        } else if (strcmp(key, "trace_file") == 0) {
            /* As Triton: a request over the network does not choose files
             * on the server. Sending back what GET gave is no change. */
            if (!null && !(json_is_string(v) && strcmp(json_string_value(v), t->path) == 0)) {
                snprintf(why, len,
                         "trace_file: the trace file is chosen when squishd starts (--trace-file, "
                         "now \"%.200s\") and cannot be changed over HTTP, as in Triton",
                         t->path);
                return SQ_BAD_REQUEST;
            }
        } else if (strcmp(key, "trace_mode") == 0) {
            if (!null && !(json_is_string(v) && strcmp(json_string_value(v), "triton") == 0)) {
                snprintf(why, len,
                         "trace_mode: squish writes Triton-mode traces only (\"triton\"; no "
                         "OpenTelemetry export)");
                return SQ_BAD_REQUEST;
            }
        } else {
            snprintf(why, len,
                     "unknown trace setting \"%.64s\": expected trace_level, trace_rate, "
                     "trace_count, log_frequency, trace_file or trace_mode",
                     key);
            return SQ_BAD_REQUEST;
        }
    }
    return 0;
}

/* s with c applied; fallback gives a cleared field (the default for the
 * global setting, the global one for a model's). */
static void apply_change(setting_t *s, const change_t *c, const setting_t *fallback, int is_model)
{
    struct {
        op_t op;
        unsigned bit;
    } f[] = {{c->level_op, SET_LEVEL},
             {c->rate_op, SET_RATE},
             {c->count_op, SET_COUNT},
             {c->frequency_op, SET_FREQUENCY}};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        if (f[i].op == SET)
            s->specified |= f[i].bit;
        else if (f[i].op == CLEAR)
            s->specified &= ~f[i].bit;
    }
    if (c->level_op == SET)
        s->level = c->level;
    if (c->rate_op == SET)
        s->rate = (uint32_t)c->rate;
    if (c->count_op == SET)
        s->count = (int32_t)c->count;
    if (c->frequency_op == SET)
        s->log_frequency = (uint32_t)c->frequency;
    if (is_model) {
        inherit(s, fallback); /* the fields not its own */
        return;
    }
    if (c->level_op == CLEAR)
        s->level = fallback->level;
    if (c->rate_op == CLEAR)
        s->rate = fallback->rate;
    if (c->count_op == CLEAR)
        s->count = fallback->count;
    if (c->frequency_op == CLEAR)
        s->log_frequency = fallback->log_frequency;
    s->specified = 0;
    s->seen = 0;
}

int gw_trace_update(gw_trace_t *t, const char *model, json_t *body, char *why, size_t len)
{
    change_t c;
    pthread_mutex_lock(&t->lock);
    int rc = parse_change(t, model, body, &c, why, len);
    if (rc != 0)
        goto out;
    model_setting_t **link = NULL;
    model_setting_t *m = model != NULL ? model_find(t, model, &link) : NULL;
    setting_t next;
    if (model == NULL) {
        next = t->global;
        apply_change(&next, &c, &setting_default, 0);
    } else {
        if (m != NULL) {
            next = m->s;
        } else {
            next = t->global;
            next.specified = 0;
        }
        apply_change(&next, &c, &t->global, 1);
    }
    /* As Triton: the only setting that may not trace is one turned off. */
    if (next.level != GW_TRACE_OFF) {
        if (t->path[0] == '\0') {
            snprintf(why, len,
                     "trace_level: squishd has no trace file to write to: start it with "
                     "--trace-file PATH to trace requests");
            rc = SQ_BAD_REQUEST;
            goto out;
        }
        if (next.rate == 0) {
            snprintf(why, len, "trace_rate: must be at least 1 while tracing (1: every request)");
            rc = SQ_BAD_REQUEST;
            goto out;
        }
    }
    if (model == NULL) {
        t->global = next;
        for (model_setting_t *x = t->models; x != NULL; x = x->next)
            inherit(&x->s, &t->global);
        atomic_store(&t->log_frequency, t->global.log_frequency);
    } else if (next.specified == 0) {
        /* Nothing of its own left: the model uses the global setting. */
        if (m != NULL) {
            *link = m->next;
            free(m);
        }
    } else {
        if (m == NULL) {
            size_t n = strlen(model);
            m = sq_xcalloc(1, sizeof(*m) + n + 1);
            memcpy(m->name, model, n + 1);
            *link = m;
        }
        m->s = next;
    }
    update_active(t);
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

json_t *gw_trace_settings_json(gw_trace_t *t, const char *model)
{
    pthread_mutex_lock(&t->lock);
    const model_setting_t *m = model != NULL ? model_find(t, model, NULL) : NULL;
    setting_t s = m != NULL ? m->s : t->global;
    pthread_mutex_unlock(&t->lock);
    char rate[16], count[16], frequency[16];
    snprintf(rate, sizeof(rate), "%u", s.rate);
    snprintf(count, sizeof(count), "%d", s.count);
    snprintf(frequency, sizeof(frequency), "%u", s.log_frequency);
    return json_pack("{s:[s], s:s, s:s, s:s, s:s, s:s}", "trace_level",
                     s.level == GW_TRACE_OFF ? "OFF" : "TIMESTAMPS", "trace_rate", rate,
                     "trace_count", count, "log_frequency", frequency, "trace_file", t->path,
                     "trace_mode", "triton");
}

uint64_t gw_trace_sample(gw_trace_t *t, const char *model)
{
    if (t == NULL || !atomic_load_explicit(&t->active, memory_order_relaxed))
        return 0;
    uint64_t id = 0;
    pthread_mutex_lock(&t->lock);
    model_setting_t *m = model_find(t, model, NULL);
    setting_t *s = m != NULL ? &m->s : &t->global;
    if (setting_live(s) && ++s->seen % s->rate == 0) {
        if (s->count > 0 && --s->count == 0)
            update_active(t);
        id = ++t->last_id;
    }
    pthread_mutex_unlock(&t->lock);
    return id;
}

/* ---- lines --------------------------------------------------------------- */

static const char *const stamp_names[GW_TRACE_NSTAMPS] = {
    "receive", "decode_start",  "decode_end",  "queue",
    "batch",   "execute_start", "execute_end", "reply"};

const char *gw_trace_stamp_name(gw_trace_stamp_t s)
{
    return s < GW_TRACE_NSTAMPS ? stamp_names[s] : "?";
}

/* An output that counts what it would have written past its room. */
typedef struct {
    char *p;
    size_t room, at;
} out_t;

static void put(out_t *o, const char *s, size_t n)
{
    if (o->at < o->room) {
        size_t k = o->room - o->at < n ? o->room - o->at : n;
        memcpy(o->p + o->at, s, k);
    }
    o->at += n;
}

static void putf(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(out_t *o, const char *fmt, ...)
{
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    put(o, buf, n < 0 ? 0 : (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

/* s as a JSON string, byte by byte. */
static void put_string(out_t *o, const char *s)
{
    put(o, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)(s != NULL ? s : ""); *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            put(o, e, 2);
        } else if (*c < 0x20 || *c >= 0x7f) {
            putf(o, "\\u%04x", *c);
        } else {
            put(o, (const char *)c, 1);
        }
    }
    put(o, "\"", 1);
}

size_t gw_trace_format(const gw_trace_record_t *r, char *out, size_t len)
{
    out_t o = {.p = out, .room = len > 0 ? len - 1 : 0};
    putf(&o, "{\"id\":%llu,\"request_id\":", (unsigned long long)r->id);
    put_string(&o, r->request_id);
    put(&o, ",\"model_name\":", 14);
    put_string(&o, r->model);
    putf(&o, ",\"model_version\":%d,\"status\":%d,\"items\":%d,\"batch_size\":%d", r->version,
         r->status, r->items, r->batch_size);
    put(&o, ",\"timestamps\":[", 15);
    int first = 1;
    for (int i = 0; i < GW_TRACE_NSTAMPS; i++) {
        if (r->at_us[i] <= 0)
            continue;
        putf(&o, "%s{\"name\":\"%s\",\"us\":%lld}", first ? "" : ",", stamp_names[i],
             (long long)r->at_us[i]);
        first = 0;
    }
    put(&o, "]}\n", 3);
    if (len > 0)
        out[o.at < o.room ? o.at : o.room] = '\0';
    return o.at;
}

/* ---- the writer ---------------------------------------------------------- */

/* Writes all of p to t's file; warns once per failing streak. */
static void write_all(gw_trace_t *t, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(t->fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (!t->write_failing)
                SQ_WARN("trace file write failed file=\"%s\" error=\"%s\"; lines are lost", t->path,
                        strerror(errno));
            t->write_failing = 1;
            return;
        }
        p += k;
        n -= (size_t)k;
    }
    t->write_failing = 0;
}

/* Opens where lines go under log_frequency: path itself (0), or the next
 * path.N (Triton's indexed files, N from 0, log_frequency lines each). */
static int open_target(gw_trace_t *t, uint32_t frequency)
{
    if (t->fd >= 0)
        close(t->fd);
    char name[PATH_MAX];
    if (frequency == 0)
        snprintf(name, sizeof(name), "%s", t->path);
    else
        snprintf(name, sizeof(name), "%s.%llu", t->path, (unsigned long long)t->next_index++);
    t->fd = open(name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    t->fd_indexed = frequency != 0;
    t->fd_lines = 0;
    if (t->fd < 0) {
        if (!t->write_failing)
            SQ_WARN("cannot open the trace file file=\"%s\" error=\"%s\"; lines are lost", name,
                    strerror(errno));
        t->write_failing = 1;
        return -1;
    }
    return 0;
}

/* Writes whole lines, starting a new indexed file every log_frequency
 * lines when it is not 0. */
static void write_lines(gw_trace_t *t, const uint8_t *p, size_t n)
{
    while (n > 0) {
        uint32_t frequency = atomic_load(&t->log_frequency);
        if (t->fd < 0 || t->fd_indexed != (frequency != 0) ||
            (frequency != 0 && t->fd_lines >= frequency)) {
            if (open_target(t, frequency) != 0)
                return;
        }
        size_t take = n;
        if (frequency != 0) {
            take = 0;
            while (take < n && t->fd_lines < frequency) {
                const uint8_t *nl = memchr(p + take, '\n', n - take);
                take = nl != NULL ? (size_t)(nl - p) + 1 : n;
                t->fd_lines++;
            }
        }
        write_all(t, p, take);
        p += take;
        n -= take;
    }
}

static void *writer_main(void *arg)
{
    gw_trace_t *t = arg;
    sq_buf_t batch;
    sq_buf_init(&batch);
    pthread_mutex_lock(&t->wlock);
    for (;;) {
        while (t->pending.len == 0 && !t->stop)
            pthread_cond_wait(&t->wake, &t->wlock);
        if (t->pending.len == 0)
            break; /* stopping, all written */
        sq_buf_t swap = t->pending;
        t->pending = batch;
        batch = swap;
        uint64_t dropped = t->dropped;
        t->dropped = 0;
        pthread_mutex_unlock(&t->wlock);
        if (dropped > 0)
            SQ_WARN("trace lines dropped count=%llu: the trace file is written slower than "
                    "requests are traced (raise trace_rate)",
                    (unsigned long long)dropped);
        write_lines(t, batch.data, batch.len);
        batch.len = 0;
        pthread_mutex_lock(&t->wlock);
    }
    pthread_mutex_unlock(&t->wlock);
    sq_buf_dispose(&batch);
    return NULL;
}

int gw_trace_open(gw_trace_t *t, char *why, size_t len)
{
    if (t->path[0] == '\0')
        return 0;
    t->fd = open(t->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (t->fd < 0) {
        snprintf(why, len, "--trace-file %s: cannot open: %s", t->path, strerror(errno));
        return SQ_IO;
    }
    if (pthread_create(&t->thread, NULL, writer_main, t) != 0) {
        close(t->fd);
        t->fd = -1;
        snprintf(why, len, "cannot start the trace writer thread");
        return SQ_IO;
    }
    t->running = 1;
    return 0;
}

void gw_trace_emit(gw_trace_t *t, const gw_trace_record_t *r)
{
    if (t == NULL || !t->running)
        return;
    char small[2048];
    char *line = small;
    size_t n = gw_trace_format(r, small, sizeof(small));
    if (n >= sizeof(small)) {
        line = sq_xmalloc(n + 1);
        gw_trace_format(r, line, n + 1);
    }
    pthread_mutex_lock(&t->wlock);
    if (t->pending.len + n > PENDING_MAX_BYTES) {
        t->dropped++;
    } else {
        sq_buf_put(&t->pending, line, n);
        pthread_cond_signal(&t->wake);
    }
    pthread_mutex_unlock(&t->wlock);
    if (line != small)
        free(line);
}

void gw_trace_free(gw_trace_t *t)
{
    if (t == NULL)
        return;
    if (t->running) {
        pthread_mutex_lock(&t->wlock);
        t->stop = 1;
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->wlock);
        pthread_join(t->thread, NULL);
    }
    if (t->fd >= 0)
        close(t->fd);
    while (t->models != NULL) {
        model_setting_t *next = t->models->next;
        free(t->models);
        t->models = next;
    }
    sq_buf_dispose(&t->pending);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->wlock);
    pthread_mutex_destroy(&t->lock);
    free(t->path);
    free(t);
}
