/* Profiling a model (serve_int.h): runs measurement batches of growing
 * size, in slices that squishd schedules between batches, and answers each
 * size's latency row, then PROFILE_DONE. */
#include "serve_int.h"
#include "wk_fault.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Mean and std of the fastest three quarters of the samples: the slowest
 * runs of a batch on a shared host are other processes' time, not the
 * model's. */
static void trimmed_stats(double *samples, int n, double *mean, double *sd)
{
    qsort(samples, (size_t)n, sizeof(*samples), cmp_double);
    int keep = n >= 4 ? n - n / 4 : n;
    double sum = 0, sumsq = 0;
    for (int i = 0; i < keep; i++) {
        sum += samples[i];
        sumsq += samples[i] * samples[i];
    }
    *mean = keep > 0 ? sum / keep : 0;
    double var = keep > 0 ? sumsq / keep - *mean * *mean : 0;
    *sd = var > 0 ? sqrt(var) : 0;
}

/* The batch sizes the profiler measures: every size to 8, then steps of a
 * quarter of the current size. Between them the planner rounds a batch up
 * to the next measured size (a batch never runs slower padded). */
static int next_profile_batch(int b)
{
    return b < 8 ? b + 1 : b + b / 4;
}

/* A measurement under way (execution thread): it may run in several
 * PROFILE slices (sq_profile_req_t.slice_us), each going on from here. */
typedef struct measure {
    uint64_t key;
    sq_profile_req_t req;
    sq_profile_done_t *done;
    int max_b, nmem, pixels;
    int *member;
    uint8_t *in;
    float *out;
    int b;      /* the size being measured */
    uint32_t r; /* its runs so far, warmup first */
    double samples[1000];
    int nsamples;
    double best_tput;
    int stale;
    int64_t spent_ns; /* measuring time so far (the budget's) */
    double next_us;   /* the expected time of the next run */
} measure_t;

void wk__measure_free(measure_t *M)
{
    if (M == NULL)
        return;
    free(M->in);
    free(M->out);
    free(M->member);
    free(M->done);
    free(M);
}

static measure_t *measure_new(uint64_t key, const model_t *m, const sq_profile_req_t *req)
{
    measure_t *M = sq_xcalloc(1, sizeof(*M));
    M->key = key;
    M->req = *req;
    M->done = sq_xcalloc(1, sizeof(*M->done));
    M->max_b =
        (int)req->max_batch < wk__model_max_batch(m) ? (int)req->max_batch : wk__model_max_batch(m);
    /* A group is measured with its members sharing each batch evenly. */
    M->member = sq_xcalloc((size_t)M->max_b + 1, sizeof(int));
    M->nmem = m->group != NULL ? wk_group_n_members(m->group) : 1;
    M->pixels = m->pixel_h > 0;
    size_t item = M->pixels ? (size_t)m->pixel_h * m->pixel_w * 3 : (size_t)m->in_elems * 4;
    M->in = sq_xmalloc(item * (size_t)M->max_b);
    M->out = sq_xmalloc((size_t)m->out_elems * sizeof(float) * (size_t)M->max_b);
    uint32_t seed = 12345;
    for (size_t i = 0; i < item * (size_t)M->max_b; i++) {
        seed = seed * 1103515245u + 12345u;
        M->in[i] = M->pixels ? (uint8_t)(seed >> 24) : 0;
    }
    if (!M->pixels)
        for (size_t i = 0; i < (size_t)m->in_elems * (size_t)M->max_b; i++)
            ((float *)M->in)[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    M->b = 1;
    return M;
}

/* Size M->b has all its runs: its row, the stop rule, progress. Returns 1
 * when the measurement is complete. */
static int measure_row(server_t *s, measure_t *M)
{
    sq_profile_done_t *done = M->done;
    double mean, sd;
    trimmed_stats(M->samples, M->nsamples, &mean, &sd);
    sq_profile_row_t *row = &done->rows[done->nrows++];
    row->batch = (uint32_t)M->b;
    row->mean_us = mean;
    row->std_us = sd;
    model_t *m = wk__model_find(s, M->key);
    row->peak_memory_bytes = m != NULL ? wk__model_memory(m) : 0;
    /* Stop once throughput has not improved by 3% for three sizes, or
     * when the next size would run past the time budget. */
    const sq_profile_req_t *req = &M->req;
    double tput = M->b / mean;
    int stop = 0;
    if (tput > M->best_tput * 1.03) {
        M->best_tput = tput;
        M->stale = 0;
    } else if (++M->stale >= 3) {
        stop = 1;
    }
    int64_t spent = M->spent_ns / 1000000;
    int nb = next_profile_batch(M->b);
    double next_cost_ms = mean / 1000.0 * nb / M->b * (req->warmup + req->repeats);
    if (req->budget_ms > 0 && (double)spent + next_cost_ms > req->budget_ms)
        stop = 1;
    if (nb > M->max_b || done->nrows >= SQ_MAX_PROFILE_ROWS)
        stop = 1;
    /* Progress in sizes measured, of those still expected: the sizes up
     * to max_b that fit what is left of the budget at this pace (a batch
     * of n taking n / b times this one's). */
    uint32_t expect = done->nrows;
    if (!stop) {
        double left = req->budget_ms > 0 ? (double)req->budget_ms - (double)spent : 1e300;
        for (int n = nb; n <= M->max_b && expect < SQ_MAX_PROFILE_ROWS; n = next_profile_batch(n)) {
            left -= mean / 1000.0 * n / M->b * (req->warmup + req->repeats);
            if (left < 0)
                break;
            expect++;
        }
    }
    reply_t *p = wk__reply_new(s, SQ_MSG_PROFILE_PROGRESS, M->key);
    sq_buf_put_u32(&p->payload, done->nrows);
    sq_buf_put_u32(&p->payload, expect);
    wk__reply_post(s, p);
    M->next_us = M->next_us * nb / M->b;
    M->b = nb;
    M->r = 0;
    M->nsamples = 0;
    return stop;
}

/* PROFILE: runs measurement batches of the model until the slice is used
 * up (PROFILE_SLICE: the next batch's expected µs) or the measurement is
 * complete (PROFILE_DONE with the rows). */
void wk__do_profile(server_t *s, job_t *j)
{
    model_t *m = wk__model_find(s, j->id);
    if (s->meas != NULL && (s->meas->key != j->id || (j->profile.flags & SQ_PROFILE_FRESH))) {
        wk__measure_free(s->meas);
        s->meas = NULL;
    }
    if (m == NULL) {
        sq_profile_done_t *none = sq_xcalloc(1, sizeof(*none));
        none->code = SQ_NOT_FOUND;
        snprintf(none->message, sizeof(none->message), "model not loaded");
        reply_t *r = wk__reply_new(s, SQ_MSG_PROFILE_DONE, j->id);
        sq_profile_done_encode(&r->payload, none);
        wk__reply_post(s, r);
        free(none);
        wk__measure_free(s->meas);
        s->meas = NULL;
        return;
    }
    if (s->meas == NULL) {
        wk_fault_check(WK_FAULT_PROFILE, m->sha256);
        s->meas = measure_new(j->id, m, &j->profile);
    }
    measure_t *M = s->meas;
    int64_t slice_ns = (int64_t)j->profile.slice_us * 1000, t_start = sq_now_ns();
    int complete = 0;
    for (;;) {
        for (int i = 0; i < M->b; i++)
            M->member[i] = (int)((int64_t)i * M->nmem / M->b);
        int64_t t0 = sq_now_ns();
        int rc = wk__model_run(m, M->b, M->pixels, M->in, M->member, M->out, (size_t)m->out_elems);
        int64_t dt = sq_now_ns() - t0;
        M->spent_ns += dt;
        M->next_us = (double)dt / 1000.0;
        if (M->r >= M->req.warmup && M->nsamples < 1000)
            M->samples[M->nsamples++] = (double)dt / 1000.0;
        M->r++;
        if (rc != 0) {
            M->done->code = rc;
            snprintf(M->done->message, sizeof(M->done->message), "batch %d: %s", M->b,
                     wk__model_errmsg(m));
            break;
        }
        if (M->r >= M->req.warmup + M->req.repeats && measure_row(s, M)) {
            complete = 1;
            break;
        }
        if (slice_ns > 0 && sq_now_ns() - t_start + (int64_t)(M->next_us * 1000) > slice_ns) {
            reply_t *r = wk__reply_new(s, SQ_MSG_PROFILE_SLICE, j->id);
            sq_buf_put_u64(&r->payload, (uint64_t)ceil(M->next_us));
            wk__reply_post(s, r);
            return;
        }
    }
    sq_profile_done_t *done = M->done;
    /* A smaller batch can always run padded to a larger one, so l(b) is at
     * most any larger size's latency: the envelope removes the noise that a
     * busy host puts into small batches (and keeps l(b)/b meaningful). */
    for (int i = (int)done->nrows - 2; complete && i >= 0; i--) {
        if (done->rows[i].mean_us > done->rows[i + 1].mean_us) {
            done->rows[i].mean_us = done->rows[i + 1].mean_us;
            done->rows[i].std_us = done->rows[i + 1].std_us;
        }
    }
    reply_t *r = wk__reply_new(s, SQ_MSG_PROFILE_DONE, j->id);
    sq_profile_done_encode(&r->payload, done);
    wk__reply_post(s, r);
    wk__measure_free(M);
    s->meas = NULL;
}
