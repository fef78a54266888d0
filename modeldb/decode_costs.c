/* What decoding a frame costs the gateway, kept across restarts: for each
 * named estimate (the gateway's preprocess pool keeps three: a decode, a
 * small frame's decode, a large file's time per byte), the mean, the mean
 * absolute deviation and the number of samples behind them. squishd reads
 * them before it splits its pipelines, so that the first frames after a
 * start are planned as the later ones. Table decode_costs (migration 7). */
#include "mdb.h"
#include "mdb_int.h"
#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int mdb_decode_costs_read(mdb_t *db, mdb_decode_cost_t *out, int max, int *n)
{
    static const char sql[] =
        "SELECT what, mean_ns, dev_ns, samples FROM decode_costs ORDER BY what";
    *n = 0;
    mdb_q_t *q = mdb_q(db, sql);
    int step;
    while ((step = mdb_q_step(q, "read decode costs")) == 1) {
        if (*n >= max)
            continue; /* more than the caller knows of: not an error */
        mdb_decode_cost_t *c = &out[(*n)++];
        snprintf(c->what, sizeof(c->what), "%s", mdb_q_text_at(q, 0));
        c->mean_ns = mdb_q_double_at(q, 1);
        c->dev_ns = mdb_q_double_at(q, 2);
        c->samples = mdb_q_int64_at(q, 3);
    }
    mdb_q_reset(q);
    return step < 0 ? step : 0;
}

typedef struct {
    const mdb_decode_cost_t *costs;
    int n;
} write_t;

static int write_tx(mdb_t *db, void *arg)
{
    static const char sql[] =
        "INSERT INTO decode_costs (what, mean_ns, dev_ns, samples) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (what) DO UPDATE SET mean_ns = excluded.mean_ns, dev_ns = excluded.dev_ns, "
        "samples = excluded.samples";
    const write_t *w = arg;
    for (int i = 0; i < w->n; i++) {
        mdb_q_t *q = mdb_q(db, sql);
        mdb_q_text(q, 1, w->costs[i].what);
        mdb_q_double(q, 2, w->costs[i].mean_ns);
        mdb_q_double(q, 3, w->costs[i].dev_ns);
        mdb_q_int64(q, 4, w->costs[i].samples);
        int rc = mdb_q_run(q, "store decode costs");
        if (rc != 0)
            return rc;
    }
    return 0;
}

int mdb_decode_costs_write(mdb_t *db, const mdb_decode_cost_t *costs, int n)
{
    for (int i = 0; i < n; i++) {
        const mdb_decode_cost_t *c = &costs[i];
        if (c->what[0] == '\0' || !isfinite(c->mean_ns) || !isfinite(c->dev_ns) || c->mean_ns < 0 ||
            c->dev_ns < 0 || c->samples < 0) {
            snprintf(db->errmsg, sizeof(db->errmsg), "decode cost %d (%.40s): not a cost", i,
                     c->what);
            return SQ_INVAL;
        }
    }
    write_t w = {.costs = costs, .n = n};
    return n > 0 ? mdb_write(db, write_tx, &w) : 0;
}
