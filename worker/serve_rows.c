/* Frontends' rows of batches (serve_int.h): the I/O thread puts the rows
 * that come in DATA_ROWS, by batch id, and what it learns of the frontends
 * (a data connection up or closed, FE_GONE from squishd); the execution
 * thread claims a batch's rows when it runs it, waiting until each is there
 * or can no longer come. Rows and their BATCH travel on different
 * connections, so either may come first; rows no BATCH claims are dropped
 * after WK_ROWS_KEEP_MS, and rows of a batch already claimed (they came too
 * late) at once. Calls nothing of the serving side. */
#include "serve_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Batches claimed lately: late rows for them are dropped, not kept. */
#define CLAIMED_RING 4096

enum { HAVE_NONE, HAVE_PRESENT, HAVE_ABSENT };

/* One batch's rows received so far (arrays of count). */
typedef struct entry {
    struct entry *next;
    uint64_t batch;
    int64_t born_ns;
    uint32_t count;
    uint8_t input_kind;
    uint64_t row_bytes;
    uint8_t *have;   /* HAVE_* */
    uint32_t *from;  /* the frontend that sent it */
    uint8_t **bytes; /* present rows: row_bytes each, owned */
} entry_t;

typedef struct {
    uint32_t id;
    uint8_t connected; /* a data connection past DATA_HELLO */
    uint8_t closed;    /* its last data connection closed (until one is up again) */
    uint8_t gone;      /* FE_GONE: its rows never come */
} frontend_t;

struct rows {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* rows came, a frontend changed, stopping */
    entry_t *entries;    /* newest first */
    uint64_t held_bytes, max_bytes;
    frontend_t *fe;
    int nfe, capfe;
    uint64_t claimed[CLAIMED_RING];
    int nclaimed, claimed_at;
    int stopping;
};

rows_t *wk__rows_new(uint64_t max_bytes)
{
    rows_t *t = sq_xcalloc(1, sizeof(*t));
    pthread_mutex_init(&t->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines are sq_now_ns() */
    pthread_cond_init(&t->cond, &ca);
    pthread_condattr_destroy(&ca);
    t->max_bytes = max_bytes;
    return t;
}

static void entry_free(rows_t *t, entry_t *e)
{
    for (uint32_t i = 0; i < e->count; i++) {
        if (e->bytes[i] != NULL)
            t->held_bytes -= e->row_bytes;
        free(e->bytes[i]);
    }
    free(e->have);
    free(e->from);
    free(e->bytes);
    free(e);
}

static void drop_entries(rows_t *t)
{
    while (t->entries != NULL) {
        entry_t *e = t->entries;
        t->entries = e->next;
        entry_free(t, e);
    }
}

void wk__rows_free(rows_t *t)
{
    if (t == NULL)
        return;
    drop_entries(t);
    free(t->fe);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static frontend_t *fe_find(rows_t *t, uint32_t id, int add)
{
    for (int i = 0; i < t->nfe; i++)
        if (t->fe[i].id == id)
            return &t->fe[i];
    if (!add)
        return NULL;
    if (t->nfe == t->capfe) {
        t->capfe = t->capfe ? 2 * t->capfe : 8;
        t->fe = sq_xrealloc(t->fe, (size_t)t->capfe * sizeof(*t->fe));
    }
    frontend_t *f = &t->fe[t->nfe++];
    memset(f, 0, sizeof(*f));
    f->id = id;
    return f;
}

static int was_claimed(const rows_t *t, uint64_t batch)
{
    for (int i = 0; i < t->nclaimed; i++)
        if (t->claimed[i] == batch)
            return 1;
    return 0;
}

/* Drops entries older than WK_ROWS_KEEP_MS (lock held). */
static void expire_locked(rows_t *t, int64_t now_ns)
{
    for (entry_t **pe = &t->entries; *pe != NULL;) {
        entry_t *e = *pe;
        if (now_ns - e->born_ns > (int64_t)WK_ROWS_KEEP_MS * 1000000) {
            SQ_DEBUG("frontend rows dropped unclaimed batch=%llu", (unsigned long long)e->batch);
            *pe = e->next;
            entry_free(t, e);
        } else {
            pe = &e->next;
        }
    }
}

void wk__rows_expire(rows_t *t, int64_t now_ns)
{
    pthread_mutex_lock(&t->lock);
    expire_locked(t, now_ns);
    pthread_mutex_unlock(&t->lock);
}

int wk__rows_put(rows_t *t, uint32_t frontend, uint64_t batch, const sq_data_rows_t *m,
                 int64_t now_ns)
{
    int rc = 0;
    pthread_mutex_lock(&t->lock);
    expire_locked(t, now_ns);
    if (was_claimed(t, batch))
        goto out; /* too late: the batch ran without them */
    entry_t *e = t->entries;
    while (e != NULL && e->batch != batch)
        e = e->next;
    if (e != NULL &&
        (e->count != m->count || e->row_bytes != m->row_bytes || e->input_kind != m->input_kind)) {
        rc = SQ_PROTOCOL; /* another frontend's rows of this batch say otherwise */
        goto out;
    }
    uint64_t present = 0;
    for (uint32_t k = 0; k < m->n; k++) {
        present += m->present[k];
        if (e != NULL && e->have[m->row[k]] != HAVE_NONE) {
            rc = SQ_PROTOCOL; /* a row sent twice */
            goto out;
        }
    }
    if (t->held_bytes + present * m->row_bytes > t->max_bytes) {
        rc = SQ_TOO_LARGE;
        goto out;
    }
    if (e == NULL) {
        e = sq_xcalloc(1, sizeof(*e));
        e->batch = batch;
        e->born_ns = now_ns;
        e->count = m->count;
        e->input_kind = m->input_kind;
        e->row_bytes = m->row_bytes;
        e->have = sq_xcalloc(m->count, sizeof(*e->have));
        e->from = sq_xcalloc(m->count, sizeof(*e->from));
        e->bytes = sq_xcalloc(m->count, sizeof(*e->bytes));
        e->next = t->entries;
        t->entries = e;
    }
    const uint8_t *p = m->bytes;
    for (uint32_t k = 0; k < m->n; k++) {
        uint32_t r = m->row[k];
        if (e->have[r] != HAVE_NONE) {
            rc = SQ_PROTOCOL; /* twice in this frame */
            break;
        }
        e->from[r] = frontend;
        e->have[r] = m->present[k] ? HAVE_PRESENT : HAVE_ABSENT;
        if (m->present[k]) {
            e->bytes[r] = sq_xmalloc(m->row_bytes);
            memcpy(e->bytes[r], p, m->row_bytes);
            p += m->row_bytes;
            t->held_bytes += m->row_bytes;
        }
    }
    pthread_cond_broadcast(&t->cond);
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void wk__rows_frontend(rows_t *t, uint32_t frontend, rows_fe_event_t ev)
{
    pthread_mutex_lock(&t->lock);
    frontend_t *f = fe_find(t, frontend, 1);
    switch (ev) {
    case ROWS_FE_UP:
        f->connected = 1;
        f->closed = 0;
        break;
    case ROWS_FE_CLOSED:
        f->connected = 0;
        f->closed = 1;
        break;
    case ROWS_FE_GONE:
        f->gone = 1;
        break;
    }
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

int wk__rows_frontend_gone(rows_t *t, uint32_t frontend)
{
    pthread_mutex_lock(&t->lock);
    frontend_t *f = fe_find(t, frontend, 0);
    int gone = f != NULL && f->gone;
    pthread_mutex_unlock(&t->lock);
    return gone;
}

void wk__rows_reset(rows_t *t)
{
    pthread_mutex_lock(&t->lock);
    drop_entries(t);
    t->nclaimed = t->claimed_at = 0;
    for (int i = 0; i < t->nfe; i++)
        t->fe[i].gone = 0;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

void wk__rows_stop(rows_t *t)
{
    pthread_mutex_lock(&t->lock);
    t->stopping = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

/* What row i of a claim is now (lock held), ROWS_PENDING while it may
 * still come. */
static int row_state(rows_t *t, const entry_t *e, uint32_t i, uint32_t fe, int late)
{
    if (e != NULL && i < e->count && e->have[i] != HAVE_NONE) {
        if (e->from[i] != fe)
            return ROW_BAD; /* another frontend sent it */
        return e->have[i] == HAVE_PRESENT ? ROW_PRESENT : ROW_ABSENT;
    }
    const frontend_t *f = fe_find(t, fe, 0);
    if (f != NULL && (f->gone || f->closed))
        return ROW_LOST;
    return late || t->stopping ? ROW_LATE : ROWS_PENDING;
}

void wk__rows_claim(rows_t *t, uint64_t batch, uint32_t count, const uint32_t *src,
                    int64_t deadline_ns, rows_claim_t *c)
{
    memset(c, 0, sizeof(*c));
    c->count = count;
    pthread_mutex_lock(&t->lock);
    entry_t *e;
    for (;;) {
        e = t->entries;
        while (e != NULL && e->batch != batch)
            e = e->next;
        int late = sq_now_ns() >= deadline_ns, pending = 0;
        for (uint32_t i = 0; i < count && !pending; i++)
            pending = src[i] != 0 && row_state(t, e, i, src[i] - 1, late) == ROWS_PENDING;
        if (!pending)
            break;
        struct timespec ts = {.tv_sec = deadline_ns / 1000000000,
                              .tv_nsec = deadline_ns % 1000000000};
        pthread_cond_timedwait(&t->cond, &t->lock, &ts);
    }
    /* Rows that disagree with the batch on its size are no use. */
    int mismatch = e != NULL && e->count != count;
    for (uint32_t i = 0; i < count; i++) {
        if (src[i] == 0) {
            c->state[i] = ROW_LOCAL;
            continue;
        }
        int st = row_state(t, e, i, src[i] - 1, 1);
        if (mismatch && (st == ROW_PRESENT || st == ROW_ABSENT))
            st = ROW_BAD;
        c->state[i] = (uint8_t)st;
        if (c->state[i] == ROW_PRESENT) {
            c->bytes[i] = e->bytes[i]; /* the claim takes them */
            e->bytes[i] = NULL;
            t->held_bytes -= e->row_bytes;
        }
    }
    if (e != NULL) {
        c->row_bytes = e->row_bytes;
        c->input_kind = e->input_kind;
        for (entry_t **pe = &t->entries; *pe != NULL; pe = &(*pe)->next)
            if (*pe == e) {
                *pe = e->next;
                break;
            }
        entry_free(t, e);
    }
    t->claimed[t->claimed_at] = batch;
    t->claimed_at = (t->claimed_at + 1) % CLAIMED_RING;
    if (t->nclaimed < CLAIMED_RING)
        t->nclaimed++;
    pthread_mutex_unlock(&t->lock);
}

void wk__rows_claim_dispose(rows_claim_t *c)
{
    for (uint32_t i = 0; i < c->count; i++) {
        free(c->bytes[i]);
        c->bytes[i] = NULL;
    }
}

uint64_t wk__rows_held_bytes(rows_t *t)
{
    pthread_mutex_lock(&t->lock);
    uint64_t n = t->held_bytes;
    pthread_mutex_unlock(&t->lock);
    return n;
}
