/* Running one batch (serve_int.h): checks the batch against the model and
 * the region its offsets point into (the shared arena, or a remote batch's
 * own bytes), runs it and answers BATCH_DONE (a remote worker sends the
 * outputs before, in BATCH_OUTPUT frames). */
#include "serve_int.h"
#include "wk_fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *staging(server_t *s, size_t n)
{
    if (s->staging_len < n) {
        free(s->staging);
        s->staging = sq_xmalloc(n);
        s->staging_len = n;
    }
    return s->staging;
}

/* Where a batch's offsets point: the arena for a local worker; for a remote
 * one, inputs in the bytes that came with it and outputs in a buffer that
 * goes back. */
typedef struct {
    const uint8_t *in;
    size_t in_len;
    uint8_t *out;
    size_t out_len;
} view_t;

/* Checks that [off, off + n) lies inside a region of len bytes. */
static int inside(size_t len, uint64_t off, uint64_t n)
{
    return off <= len && n <= len - off;
}

static int run_batch(server_t *s, const sq_batch_t *b, const view_t *v, char *msg, size_t msglen,
                     int64_t *exec_ns)
{
    model_t *m = wk__model_find(s, b->model_key);
    if (m != NULL)
        wk_fault_check(WK_FAULT_RUN, m->sha256);
    if (m == NULL) {
        snprintf(msg, msglen, "model %llu is not loaded", (unsigned long long)b->model_key);
        return SQ_NOT_FOUND;
    }
    int count = (int)b->count;
    if (count > wk__model_max_batch(m)) {
        snprintf(msg, msglen, "batch of %d over the plan's max %d", count, wk__model_max_batch(m));
        return SQ_INVAL;
    }
    int member[SQ_MAX_BATCH_ITEMS];
    if ((m->group != NULL) != (b->has_members != 0)) {
        snprintf(msg, msglen, "a group's batch names each item's member, a model's does not");
        return SQ_PROTOCOL;
    }
    for (int i = 0; m->group != NULL && i < count; i++) {
        member[i] = b->member[i];
        if (member[i] >= wk_group_n_members(m->group)) {
            snprintf(msg, msglen, "item %d names member %d of %d", i, member[i],
                     wk_group_n_members(m->group));
            return SQ_PROTOCOL;
        }
    }
    uint64_t out_bytes = (uint64_t)m->out_elems * sizeof(float);
    if (b->out_stride < out_bytes || b->out_stride > SQ_REMOTE_MAX_BATCH_BYTES ||
        !inside(v->out_len, b->out_off, b->out_stride * (uint64_t)count)) {
        snprintf(msg, msglen, "output region outside the arena");
        return SQ_PROTOCOL;
    }
    size_t item;
    if (b->input_kind == SQ_INPUT_PIXELS) {
        if (m->pixel_h <= 0) {
            snprintf(msg, msglen, "the model does not take images");
            return SQ_INVAL;
        }
        item = (size_t)m->pixel_h * (size_t)m->pixel_w * 3;
    } else {
        item = (size_t)m->in_elems * (b->input_kind == SQ_INPUT_FP32 ? sizeof(float) : 1);
    }
    for (int i = 0; i < count; i++) {
        if (!inside(v->in_len, b->in_off[i], item)) {
            snprintf(msg, msglen, "input %d outside the arena", i);
            return SQ_PROTOCOL;
        }
    }
    /* The outputs must be contiguous for the backend: run into staging when
     * the stride has padding. */
    int rc;
    float *out = (float *)(v->out + b->out_off);
    /* A group writes each row at its stride itself. */
    int direct_out = b->out_stride == out_bytes || (m->group != NULL && b->out_stride % 4 == 0);
    size_t in_bytes = b->input_kind == SQ_INPUT_PIXELS ? item : (size_t)m->in_elems * sizeof(float);
    uint8_t *in = staging(s, in_bytes * (size_t)count + (direct_out ? 0 : out_bytes * count));
    float *out_tmp = direct_out ? out : (float *)(in + in_bytes * (size_t)count);
    for (int i = 0; i < count; i++) {
        const uint8_t *src = v->in + b->in_off[i];
        uint8_t *dst = in + in_bytes * (size_t)i;
        if (b->input_kind == SQ_INPUT_UINT8) {
            for (int64_t e = 0; e < m->in_elems; e++)
                ((float *)dst)[e] = (float)src[e];
        } else {
            memcpy(dst, src, in_bytes);
        }
    }
    size_t stride = direct_out ? (size_t)(b->out_stride / 4) : (size_t)m->out_elems;
    rc = wk__model_run(m, count, b->input_kind == SQ_INPUT_PIXELS, in, member, out_tmp, stride);
    if (rc != 0) {
        snprintf(msg, msglen, "%s", wk__model_errmsg(m));
        return rc;
    }
    if (!direct_out)
        for (int i = 0; i < count; i++)
            memcpy(v->out + b->out_off + b->out_stride * (uint64_t)i,
                   out_tmp + (size_t)m->out_elems * (size_t)i, out_bytes);
    *exec_ns = wk__model_last_run_ns(m);
    return 0;
}

void wk__do_batch(server_t *s, job_t *j)
{
    sq_batch_done_t done = {0};
    int64_t exec_ns = 0;
    view_t v = {
        .in = s->o.shm, .in_len = s->o.shm_bytes, .out = s->o.shm, .out_len = s->o.shm_bytes};
    if (s->o.remote) {
        /* The outputs go back in BATCH_OUTPUT frames: count * out_stride
         * bytes from offset 0 (run_batch checks the batch against them). */
        const sq_batch_t *b = j->batch;
        uint64_t n = b->out_stride * (uint64_t)b->count;
        v = (view_t){.in = j->input, .in_len = j->input_len};
        if (b->out_off == 0 && b->out_stride <= SQ_REMOTE_MAX_BATCH_BYTES &&
            n <= SQ_REMOTE_MAX_BATCH_BYTES && n > 0 && (v.out = malloc(n)) != NULL)
            v.out_len = n;
    }
    done.code = run_batch(s, j->batch, &v, done.message, sizeof(done.message), &exec_ns);
    if (s->o.remote && done.code == 0) {
        for (size_t off = 0; off < v.out_len; off += SQ_REMOTE_CHUNK_BYTES) {
            size_t n =
                v.out_len - off < SQ_REMOTE_CHUNK_BYTES ? v.out_len - off : SQ_REMOTE_CHUNK_BYTES;
            reply_t *o = wk__reply_new(s, SQ_MSG_BATCH_OUTPUT, j->id);
            sq_buf_put(&o->payload, v.out + off, n);
            wk__reply_post(s, o);
        }
    }
    if (s->o.remote)
        free(v.out);
    done.exec_ns = (uint64_t)exec_ns;
    done.total_ns = (uint64_t)(sq_now_ns() - j->received_ns);
    SQ_DEBUG("batch done id=%llu model=%llu count=%u code=%s exec_us=%lld total_us=%lld",
             (unsigned long long)j->id, (unsigned long long)j->batch->model_key, j->batch->count,
             sq_err_name(done.code), (long long)(exec_ns / 1000),
             (long long)(done.total_ns / 1000));
    reply_t *r = wk__reply_new(s, SQ_MSG_BATCH_DONE, j->id);
    sq_batch_done_encode(&r->payload, &done);
    wk__reply_post(s, r);
}
