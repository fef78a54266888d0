/* The typed frontend frames (gw_codec_fe.h): FE_CATALOG, FE_STATE and
 * FE_METRICS, encoded and decoded. A decoder trusts nothing: every count
 * is checked against the bytes left before anything is allocated for it,
 * every flag and kind against its range, and the frame must end where its
 * message does. */
#include "gw_codec_fe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Smallest encodings of the repeated elements: a count that the payload
 * cannot hold is refused before it is allocated. */
#define MODEL_MIN_BYTES (8 + 4)
#define PIPE_MIN_BYTES (4 + 1 + 4)
#define LIVE_MIN_BYTES (8 + 1 + 1 + 8 + 8 + 4 + 8 + 8 + 4)
#define ROW_BYTES (4 + 8 + 8)
#define STATS_MIN_BYTES (4 + 4 + 4)
#define REPORT_MIN_BYTES (4 + 4)

static int finish(const sq_reader_t *r, const sq_frame_t *f, unsigned type)
{
    return r->err || r->left != 0 || f->type != type ? SQ_PROTOCOL : 0;
}

static void put_doc(sq_buf_t *b, gw_fe_doc_t d)
{
    sq_buf_put_bytes(b, d.p, d.len);
}

static gw_fe_doc_t get_doc(sq_reader_t *r)
{
    uint32_t n = 0;
    const uint8_t *p = sq_get_bytes(r, &n, SQ_IPC_MAX_PAYLOAD);
    return (gw_fe_doc_t){.p = (const char *)p, .len = p != NULL ? n : 0};
}

/* A count of elements at least min_bytes each, which the rest of the
 * payload must be able to hold; 0 with r->err set when it cannot. */
static uint32_t get_count(sq_reader_t *r, size_t min_bytes)
{
    uint32_t n = sq_get_u32(r);
    if (r->err || (uint64_t)n * min_bytes > r->left) {
        r->err = 1;
        return 0;
    }
    return n;
}

/* An allocation of n elements (NULL for none). */
static void *alloc_n(uint32_t n, size_t size)
{
    return n > 0 ? sq_xcalloc(n, size) : NULL;
}

static uint8_t get_flag(sq_reader_t *r)
{
    uint8_t v = sq_get_u8(r);
    if (v > 1)
        r->err = 1;
    return v;
}

static double get_finite(sq_reader_t *r)
{
    double v = sq_get_f64(r);
    if (!isfinite(v))
        r->err = 1;
    return v;
}

/* ---- FE_CATALOG ---------------------------------------------------------- */

void gw_fe_catalog_encode(sq_buf_t *b, const gw_fe_catalog_t *m)
{
    sq_buf_put_u32(b, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        sq_buf_put_u64(b, (uint64_t)m->models[i].key);
        put_doc(b, m->models[i].record);
    }
}

int gw_fe_catalog_decode(const sq_frame_t *f, gw_fe_catalog_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    *m = (gw_fe_catalog_t){0};
    m->n = get_count(&r, MODEL_MIN_BYTES);
    m->models = alloc_n(m->n, sizeof(*m->models));
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        m->models[i].key = (int64_t)sq_get_u64(&r);
        m->models[i].record = get_doc(&r);
        if (m->models[i].key <= 0 || m->models[i].record.len == 0)
            r.err = 1;
    }
    int rc = finish(&r, f, SQ_MSG_FE_CATALOG);
    if (rc != 0)
        gw_fe_catalog_dispose(m);
    return rc;
}

void gw_fe_catalog_dispose(gw_fe_catalog_t *m)
{
    free(m->models);
    *m = (gw_fe_catalog_t){0};
}

/* ---- FE_STATE -------------------------------------------------------------- */

static void put_keys(sq_buf_t *b, const int64_t *keys, uint32_t n)
{
    sq_buf_put_u32(b, n);
    for (uint32_t i = 0; i < n; i++)
        sq_buf_put_u64(b, (uint64_t)keys[i]);
}

static int64_t *get_keys(sq_reader_t *r, uint32_t *n)
{
    *n = get_count(r, 8);
    int64_t *keys = alloc_n(*n, sizeof(*keys));
    for (uint32_t i = 0; i < *n; i++)
        keys[i] = (int64_t)sq_get_u64(r);
    return keys;
}

static void put_pipe(sq_buf_t *b, const gw_fe_pipe_t *p)
{
    put_doc(b, p->spec);
    sq_buf_put_u8(b, p->unloaded);
    sq_buf_put_u32(b, p->nstages);
    for (uint32_t k = 0; k < p->nstages && k < GW_FE_MAX_STAGES; k++) {
        sq_buf_put_f64(b, p->budget_ms[k]);
        sq_buf_put_f64(b, p->cum_ms[k]);
    }
}

static void get_pipe(sq_reader_t *r, gw_fe_pipe_t *p)
{
    p->spec = get_doc(r);
    p->unloaded = get_flag(r);
    p->nstages = sq_get_u32(r);
    if (p->spec.len == 0 || p->nstages == 0 || p->nstages > GW_FE_MAX_STAGES) {
        r->err = 1;
        p->nstages = 0;
    }
    for (uint32_t k = 0; k < p->nstages; k++) {
        p->budget_ms[k] = get_finite(r);
        p->cum_ms[k] = get_finite(r);
    }
}

static void put_live(sq_buf_t *b, const gw_fe_live_t *l)
{
    sq_buf_put_u64(b, (uint64_t)l->key);
    sq_buf_put_u8(b, l->kind);
    sq_buf_put_u8(b, l->linear);
    sq_buf_put_f64(b, l->alpha_us);
    sq_buf_put_f64(b, l->beta_us);
    sq_buf_put_u32(b, (uint32_t)l->max_batch);
    sq_buf_put_f64(b, l->memory_bytes);
    sq_buf_put_f64(b, l->memory_per_item_bytes);
    sq_buf_put_u32(b, l->nrows);
    for (uint32_t i = 0; i < l->nrows; i++) {
        sq_buf_put_u32(b, (uint32_t)l->rows[i].batch);
        sq_buf_put_f64(b, l->rows[i].mean_us);
        sq_buf_put_f64(b, l->rows[i].std_us);
    }
}

static void get_live(sq_reader_t *r, gw_fe_live_t *l)
{
    l->key = (int64_t)sq_get_u64(r);
    l->kind = sq_get_u8(r);
    l->linear = get_flag(r);
    l->alpha_us = get_finite(r);
    l->beta_us = get_finite(r);
    l->max_batch = (int32_t)sq_get_u32(r);
    l->memory_bytes = get_finite(r);
    l->memory_per_item_bytes = get_finite(r);
    l->nrows = get_count(r, ROW_BYTES);
    if (l->kind >= SQ_DEV_KIND_COUNT || l->max_batch < 1 || l->max_batch > GW_FE_MAX_PROFILE_ROWS ||
        l->nrows > GW_FE_MAX_PROFILE_ROWS || (l->linear ? l->nrows != 0 : l->nrows == 0)) {
        r->err = 1;
        l->nrows = 0;
    }
    l->rows = alloc_n(l->nrows, sizeof(*l->rows));
    for (uint32_t i = 0; i < l->nrows; i++) {
        l->rows[i].batch = (int32_t)sq_get_u32(r);
        l->rows[i].mean_us = get_finite(r);
        l->rows[i].std_us = get_finite(r);
        if (l->rows[i].batch < 1 || l->rows[i].batch > GW_FE_MAX_PROFILE_ROWS)
            r->err = 1;
    }
}

void gw_fe_state_encode(sq_buf_t *b, const gw_fe_state_t *m)
{
    sq_buf_put_str(b, m->why);
    sq_buf_put_u32(b, (uint32_t)m->workers_up);
    sq_buf_put_u8(b, m->db_ready);
    sq_buf_put_u8(b, m->stopping);
    sq_buf_put_u32(b, SQ_DEV_KIND_COUNT);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        sq_buf_put_u32(b, (uint32_t)m->up[k]);
        sq_buf_put_u32(b, (uint32_t)m->coming[k]);
        sq_buf_put_u64(b, (uint64_t)m->back_in_us[k]);
    }
    put_keys(b, m->held, m->nheld);
    put_keys(b, m->gone, m->ngone);
    sq_buf_put_u32(b, m->npipes);
    for (uint32_t i = 0; i < m->npipes; i++)
        put_pipe(b, &m->pipes[i]);
    sq_buf_put_u32(b, m->nlive);
    for (uint32_t i = 0; i < m->nlive; i++)
        put_live(b, &m->live[i]);
}

int gw_fe_state_decode(const sq_frame_t *f, gw_fe_state_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    *m = (gw_fe_state_t){0};
    sq_get_str(&r, m->why, sizeof(m->why));
    m->workers_up = (int32_t)sq_get_u32(&r);
    m->db_ready = get_flag(&r);
    m->stopping = get_flag(&r);
    if (sq_get_u32(&r) != SQ_DEV_KIND_COUNT || m->workers_up < 0)
        r.err = 1;
    for (int k = 0; k < SQ_DEV_KIND_COUNT && !r.err; k++) {
        m->up[k] = (int32_t)sq_get_u32(&r);
        m->coming[k] = (int32_t)sq_get_u32(&r);
        m->back_in_us[k] = (int64_t)sq_get_u64(&r);
        if (m->up[k] < 0 || m->coming[k] < 0 || m->back_in_us[k] < -1)
            r.err = 1;
    }
    if (!r.err)
        m->held = get_keys(&r, &m->nheld);
    if (!r.err)
        m->gone = get_keys(&r, &m->ngone);
    if (!r.err) {
        m->npipes = get_count(&r, PIPE_MIN_BYTES);
        m->pipes = alloc_n(m->npipes, sizeof(*m->pipes));
    }
    for (uint32_t i = 0; i < m->npipes && !r.err; i++)
        get_pipe(&r, &m->pipes[i]);
    if (!r.err) {
        m->nlive = get_count(&r, LIVE_MIN_BYTES);
        m->live = alloc_n(m->nlive, sizeof(*m->live));
    }
    for (uint32_t i = 0; i < m->nlive && !r.err; i++)
        get_live(&r, &m->live[i]);
    int rc = finish(&r, f, SQ_MSG_FE_STATE);
    if (rc != 0)
        gw_fe_state_dispose(m);
    return rc;
}

void gw_fe_state_dispose(gw_fe_state_t *m)
{
    free(m->held);
    free(m->gone);
    free(m->pipes);
    for (uint32_t i = 0; m->live != NULL && i < m->nlive; i++)
        free(m->live[i].rows);
    free(m->live);
    *m = (gw_fe_state_t){0};
}

/* ---- FE_METRICS ------------------------------------------------------------- */

void gw_fe_metrics_encode(sq_buf_t *b, const gw_fe_metrics_t *m)
{
    put_doc(b, m->text);
    sq_buf_put_u32(b, m->nstats);
    for (uint32_t i = 0; i < m->nstats; i++) {
        sq_buf_put_str(b, m->stats[i].name);
        sq_buf_put_str(b, m->stats[i].version);
        put_doc(b, m->stats[i].stats);
    }
    sq_buf_put_u32(b, m->nreports);
    for (uint32_t i = 0; i < m->nreports; i++) {
        sq_buf_put_str(b, m->reports[i].name);
        put_doc(b, m->reports[i].report);
    }
}

int gw_fe_metrics_decode(const sq_frame_t *f, gw_fe_metrics_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    *m = (gw_fe_metrics_t){0};
    m->text = get_doc(&r);
    m->nstats = get_count(&r, STATS_MIN_BYTES);
    m->stats = alloc_n(m->nstats, sizeof(*m->stats));
    for (uint32_t i = 0; i < m->nstats && !r.err; i++) {
        sq_get_str(&r, m->stats[i].name, sizeof(m->stats[i].name));
        sq_get_str(&r, m->stats[i].version, sizeof(m->stats[i].version));
        m->stats[i].stats = get_doc(&r);
        if (m->stats[i].stats.len == 0)
            r.err = 1;
    }
    if (!r.err) {
        m->nreports = get_count(&r, REPORT_MIN_BYTES);
        m->reports = alloc_n(m->nreports, sizeof(*m->reports));
    }
    for (uint32_t i = 0; i < m->nreports && !r.err; i++) {
        sq_get_str(&r, m->reports[i].name, sizeof(m->reports[i].name));
        m->reports[i].report = get_doc(&r);
        if (m->reports[i].report.len == 0)
            r.err = 1;
    }
    int rc = finish(&r, f, SQ_MSG_FE_METRICS);
    if (rc != 0)
        gw_fe_metrics_dispose(m);
    return rc;
}

void gw_fe_metrics_dispose(gw_fe_metrics_t *m)
{
    free(m->stats);
    free(m->reports);
    *m = (gw_fe_metrics_t){0};
}
