/* Profiling a model (serve_int.h): runs the measurement batches that
 * wk_measure.h asks for (growing sizes, then passes over them again), in
 * slices that squishd schedules between batches, reports progress, and
 * answers the rows with PROFILE_DONE. */
#include "serve_int.h"
#include "wk_fault.h"
#include "wk_measure.h"

#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A measurement under way (execution thread): it may run in several
 * PROFILE slices (sq_profile_req_t.slice_us), each going on from here. */
typedef struct measure {
    uint64_t key;
    sq_profile_done_t *done;
    int max_b, nmem, pixels;
    int *member;
    uint8_t *in;
    float *out;
    wk_measure_t core;                    /* which size runs next, and the rows */
    uint64_t memory[SQ_MAX_PROFILE_ROWS]; /* the model's memory as each size was found */
} measure_t;

void wk__measure_free(measure_t *M)
{
    if (M == NULL)
        return;
    free(M->in);
    free(M->out);
    free(M->member);
    free(M->done);
    wk_measure_free(&M->core);
    free(M);
}

static measure_t *measure_new(uint64_t key, const model_t *m, const sq_profile_req_t *req)
{
    measure_t *M = sq_xcalloc(1, sizeof(*M));
    M->key = key;
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
    wk__profile_input(M->pixels, item, M->max_b, M->in);
    wk_measure_init(&M->core, M->max_b, (int)req->warmup, (int)req->repeats, req->budget_ms);
    return M;
}

/* The precision m's plan runs and its outputs' deviation from an FP32
 * plan's on item 0 of the profiling input (at batch 1, against the row
 * the loader kept, model_t.ref_out): 0 for a plan that runs FP32, -1 when
 * there is no FP32 row to compare with. A group reports its prefix's
 * precision, unmeasured. Runs one batch of 1 (into M->out). */
static int measure_deviation(model_t *m, measure_t *M, sq_profile_done_t *done)
{
    wk_precision_t runs = (wk_precision_t)m->runs;
    done->precision = (uint8_t)runs;
    done->max_abs_deviation = done->max_rel_deviation = 0;
    if (runs == WK_PRECISION_FP32)
        return 0;
    if (m->group != NULL || m->ref_out == NULL) {
        done->max_abs_deviation = done->max_rel_deviation = -1;
        if (m->ref_why != NULL)
            SQ_WARN("precision deviation not measured key=%llu precision=%s reason=\"%s\"",
                    (unsigned long long)m->key, wk_precision_name(runs), m->ref_why);
        return 0;
    }
    M->member[0] = 0;
    int rc = wk__model_run(m, 1, M->pixels, M->in, M->member, M->out, (size_t)m->out_elems);
    if (rc != 0)
        return rc;
    wk_deviation(M->out, m->ref_out, (size_t)m->out_elems, &done->max_abs_deviation,
                 &done->max_rel_deviation);
    SQ_INFO("precision deviation key=%llu precision=%s max_abs=%g max_rel=%g",
            (unsigned long long)m->key, wk_precision_name(runs), done->max_abs_deviation,
            done->max_rel_deviation);
    return 0;
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
    wk_measure_t *C = &M->core;
    int64_t slice_ns = (int64_t)j->profile.slice_us * 1000, t_start = sq_now_ns();
    int b;
    while ((b = wk_measure_batch(C)) > 0) {
        for (int i = 0; i < b; i++)
            M->member[i] = (int)((int64_t)i * M->nmem / b);
        int64_t t0 = sq_now_ns();
        int rc = wk__model_run(m, b, M->pixels, M->in, M->member, M->out, (size_t)m->out_elems);
        int64_t dt = sq_now_ns() - t0;
        if (rc != 0) {
            M->done->code = rc;
            snprintf(M->done->message, sizeof(M->done->message), "batch %d: %s", b,
                     wk__model_errmsg(m));
            break;
        }
        int pass0_rows = C->pass == 0 ? C->nrows : -1;
        if (wk_measure_add(C, (double)dt / 1000.0)) {
            if (pass0_rows >= 0 && C->nrows > pass0_rows)
                M->memory[pass0_rows] = wk__model_memory(m);
            uint32_t done, total;
            wk_measure_progress(C, &done, &total);
            reply_t *p = wk__reply_new(s, SQ_MSG_PROFILE_PROGRESS, M->key);
            sq_buf_put_u32(&p->payload, done);
            sq_buf_put_u32(&p->payload, total);
            /* And the run time spent and expected still (the ETA's). */
            sq_buf_put_u64(&p->payload, (uint64_t)C->spent_us);
            sq_buf_put_u64(&p->payload, (uint64_t)wk_measure_left_us(C));
            wk__reply_post(s, p);
        }
        if (wk_measure_batch(C) == 0)
            break;
        if (slice_ns > 0 && sq_now_ns() - t_start + (int64_t)(C->next_us * 1000) > slice_ns) {
            reply_t *r = wk__reply_new(s, SQ_MSG_PROFILE_SLICE, j->id);
            sq_buf_put_u64(&r->payload, (uint64_t)ceil(C->next_us));
            wk__reply_post(s, r);
            return;
        }
    }
    sq_profile_done_t *done = M->done;
    if (done->code == 0) {
        done->nrows = (uint32_t)wk_measure_rows(C, done->rows);
        for (uint32_t i = 0; i < done->nrows; i++)
            done->rows[i].peak_memory_bytes = M->memory[i];
        /* The sizes past the profile's reach are never formed from it:
         * their kernels go back (a size made again if one ever runs). */
        int reach = 0;
        for (uint32_t i = 0; i < done->nrows; i++)
            reach = (int)done->rows[i].batch > reach ? (int)done->rows[i].batch : reach;
        if ((m->plan != NULL || m->group != NULL) && reach > 0) {
            if (m->group != NULL)
                wk_group_keep_sizes(m->group, reach);
            else
                wk_plan_keep_sizes(m->plan, reach);
            malloc_trim(0);
            SQ_INFO(
                "profile done key=%llu reach=%d sizes_ready=%d", (unsigned long long)j->id, reach,
                m->group != NULL ? wk_group_sizes_ready(m->group) : wk_plan_sizes_ready(m->plan));
        }
        int rc = measure_deviation(m, M, done);
        if (rc != 0) {
            done->code = rc;
            done->nrows = 0;
            snprintf(done->message, sizeof(done->message), "batch 1 (precision): %s",
                     wk__model_errmsg(m));
        }
    }
    reply_t *r = wk__reply_new(s, SQ_MSG_PROFILE_DONE, j->id);
    sq_profile_done_encode(&r->payload, done);
    wk__reply_post(s, r);
    wk__measure_free(M);
    s->meas = NULL;
}
