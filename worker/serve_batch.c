/* Running one batch (serve_int.h): checks the batch against the model and
 * the region its offsets point into (the shared arena, or a remote batch's
 * own bytes), runs it and answers BATCH_DONE (a remote worker sends the
 * outputs before, in BATCH_OUTPUT frames). Rows that frontends hold come
 * from the rows table (the batch waits for them, WK_ROWS_WAIT_MS at most)
 * and their outputs go back to each frontend in DATA_OUTPUT; only rows
 * from squishd have their outputs written to the arena (or sent in
 * BATCH_OUTPUT). */
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
} view_t;

/* Checks that [off, off + n) lies inside a region of len bytes. */
static int inside(size_t len, uint64_t off, uint64_t n)
{
    return off <= len && n <= len - off;
}

/* The bytes of one item's input. */
static int item_bytes(const model_t *m, const sq_batch_t *b, size_t *item, char *msg, size_t msglen)
{
    if (b->input_kind == SQ_INPUT_PIXELS) {
        if (m->pixel_h <= 0) {
            snprintf(msg, msglen, "the model does not take images");
            return SQ_INVAL;
        }
        *item = (size_t)m->pixel_h * (size_t)m->pixel_w * 3;
    } else {
        *item = (size_t)m->in_elems * (b->input_kind == SQ_INPUT_FP32 ? sizeof(float) : 1);
    }
    return 0;
}

/* Runs b: row i's input at v->in + in_off[i] (a claim's ROW_LOCAL rows, or
 * every row without a claim), or from the claim (a frontend's row: its
 * bytes, or zeros when it is not there), row i's output to out + i *
 * out_stride. Rows of the claim whose size or kind are not the batch's
 * become ROW_BAD. */
static int run_batch(server_t *s, const sq_batch_t *b, const view_t *v, rows_claim_t *claim,
                     uint8_t *out_region, char *msg, size_t msglen, int64_t *exec_ns)
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
    if (b->out_stride < out_bytes) {
        snprintf(msg, msglen, "output stride %llu under the row's %llu bytes",
                 (unsigned long long)b->out_stride, (unsigned long long)out_bytes);
        return SQ_PROTOCOL;
    }
    size_t item;
    int rc = item_bytes(m, b, &item, msg, msglen);
    if (rc != 0)
        return rc;
    for (int i = 0; i < count; i++) {
        if (claim != NULL && claim->state[i] != ROW_LOCAL) {
            if (claim->state[i] == ROW_PRESENT &&
                (claim->row_bytes != item || claim->input_kind != b->input_kind)) {
                SQ_WARN("frontend rows unlike the batch's row_bytes=%llu kind=%u want=%zu kind=%u",
                        (unsigned long long)claim->row_bytes, claim->input_kind, item,
                        b->input_kind);
                claim->state[i] = ROW_BAD;
            }
            continue;
        }
        if (!inside(v->in_len, b->in_off[i], item)) {
            snprintf(msg, msglen, "input %d outside the arena", i);
            return SQ_PROTOCOL;
        }
    }
    /* The outputs must be contiguous for the backend: run into staging when
     * the stride has padding. */
    float *out = (float *)out_region;
    /* A group writes each row at its stride itself. */
    int direct_out = b->out_stride == out_bytes || (m->group != NULL && b->out_stride % 4 == 0);
    /* The batch's work from here on is what it costs this thread, as the
     * profile measured it (gathering, normalizing, the run, the copy out):
     * the backend's run alone left out the normalizing, 0.24 ms an image
     * on the GPU's host, and live batches looked 0.6x their profile. */
    int64_t t0 = sq_now_ns();
    /* UINT8 rows stay bytes for a plain model (its backend may cast them
     * on its device); a group takes FP32 */
    int bytes_in =
        b->input_kind == SQ_INPUT_PIXELS || (b->input_kind == SQ_INPUT_UINT8 && m->group == NULL);
    size_t in_bytes = bytes_in ? item : (size_t)m->in_elems * sizeof(float);
    uint8_t *in = staging(s, in_bytes * (size_t)count + (direct_out ? 0 : out_bytes * count));
    float *out_tmp = direct_out ? out : (float *)(in + in_bytes * (size_t)count);
    for (int i = 0; i < count; i++) {
        const uint8_t *src = NULL;
        if (claim == NULL || claim->state[i] == ROW_LOCAL)
            src = v->in + b->in_off[i];
        else if (claim->state[i] == ROW_PRESENT)
            src = claim->bytes[i];
        uint8_t *dst = in + in_bytes * (size_t)i;
        if (src == NULL) /* a frontend's row that is not here: it runs on zeros */
            memset(dst, 0, in_bytes);
        else if (b->input_kind == SQ_INPUT_UINT8 && !bytes_in)
            for (int64_t e = 0; e < m->in_elems; e++)
                ((float *)dst)[e] = (float)src[e];
        else
            memcpy(dst, src, in_bytes);
    }
    size_t stride = direct_out ? (size_t)(b->out_stride / 4) : (size_t)m->out_elems;
    if (b->input_kind == SQ_INPUT_UINT8 && bytes_in)
        rc = wk__model_run_u8(m, count, in, out_tmp, stride);
    else
        rc = wk__model_run(m, count, b->input_kind == SQ_INPUT_PIXELS, in, member, out_tmp, stride);
    if (rc != 0) {
        snprintf(msg, msglen, "%s", wk__model_errmsg(m));
        return rc;
    }
    if (!direct_out)
        for (int i = 0; i < count; i++)
            memcpy(out_region + b->out_stride * (uint64_t)i,
                   out_tmp + (size_t)m->out_elems * (size_t)i, out_bytes);
    *exec_ns = sq_now_ns() - t0;
    return 0;
}

/* One DATA_OUTPUT for frontend fe: rows[0..n) with their outputs from out
 * (code 0), or the failure and no bytes. */
static void post_output(server_t *s, uint64_t batch, uint32_t fe, const sq_batch_t *b,
                        const sq_batch_done_t *done, const uint32_t *rows, uint32_t n,
                        const uint8_t *out)
{
    sq_data_output_t *o = sq_xcalloc(1, sizeof(*o));
    o->code = done->code;
    o->exec_ns = done->exec_ns;
    o->total_ns = done->total_ns;
    o->count = b->count;
    snprintf(o->message, sizeof(o->message), "%s", done->message);
    o->out_stride = b->out_stride;
    o->n = n;
    memcpy(o->row, rows, n * sizeof(*rows));
    reply_t *r = wk__reply_new_data(s, SQ_MSG_DATA_OUTPUT, batch, fe);
    sq_data_output_encode(&r->payload, o);
    for (uint32_t k = 0; out != NULL && k < n; k++)
        sq_buf_put(&r->payload, out + b->out_stride * (uint64_t)rows[k], b->out_stride);
    free(o);
    wk__reply_post(s, r);
}

/* The rows of frontend fe in one state, with their outputs (ok) or a
 * failure: as many DATA_OUTPUT frames as SQ_IPC_MAX_PAYLOAD needs. */
static void output_rows(server_t *s, uint64_t batch, uint32_t fe, const sq_batch_t *b,
                        const rows_claim_t *c, const sq_batch_done_t *done, const uint8_t *out,
                        int want_state)
{
    uint32_t rows[SQ_MAX_BATCH_ITEMS], n = 0;
    for (uint32_t i = 0; i < b->count; i++)
        if (c->state[i] == want_state && b->src[i] == fe + 1)
            rows[n++] = i;
    if (n == 0)
        return;
    if (out == NULL || done->code != 0) {
        post_output(s, batch, fe, b, done, rows, n, NULL);
        return;
    }
    /* The header: 44 bytes, the message and 4 a row. */
    uint64_t header = 64 + sizeof(done->message);
    uint64_t per = b->out_stride + 4;
    if (header + per > SQ_IPC_MAX_PAYLOAD) {
        sq_batch_done_t big = {.code = SQ_TOO_LARGE};
        snprintf(big.message, sizeof(big.message), "a row's output (%llu bytes) exceeds a frame",
                 (unsigned long long)b->out_stride);
        post_output(s, batch, fe, b, &big, rows, n, NULL);
        return;
    }
    uint32_t most = (uint32_t)((SQ_IPC_MAX_PAYLOAD - header) / per);
    for (uint32_t k = 0; k < n; k += most)
        post_output(s, batch, fe, b, done, rows + k, n - k < most ? n - k : most, out);
}

/* Each frontend named by the batch hears about its rows: the outputs of
 * those that ran (or the batch's failure), and a failure for those that
 * did not come in time or were unlike the batch's. Rows it sent absent,
 * and those of a frontend gone or disconnected, have no answer. */
static void answer_frontends(server_t *s, uint64_t batch, const sq_batch_t *b,
                             const rows_claim_t *c, const sq_batch_done_t *done, const uint8_t *out)
{
    uint32_t seen[SQ_MAX_BATCH_ITEMS], nseen = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        if (b->src[i] == 0)
            continue;
        uint32_t fe = b->src[i] - 1, k = 0;
        while (k < nseen && seen[k] != fe)
            k++;
        if (k < nseen)
            continue;
        seen[nseen++] = fe;
        output_rows(s, batch, fe, b, c, done, out, ROW_PRESENT);
        sq_batch_done_t late = {.code = done->code != 0 ? done->code : SQ_IO,
                                .exec_ns = done->exec_ns,
                                .total_ns = done->total_ns};
        if (done->code != 0)
            snprintf(late.message, sizeof(late.message), "%s", done->message);
        else
            snprintf(late.message, sizeof(late.message),
                     "the rows did not reach the worker within %d ms", WK_ROWS_WAIT_MS);
        output_rows(s, batch, fe, b, c, &late, NULL, ROW_LATE);
        sq_batch_done_t bad = late;
        if (done->code == 0) {
            bad.code = SQ_PROTOCOL;
            snprintf(bad.message, sizeof(bad.message),
                     "rows sent by another frontend or unlike the batch's");
        }
        output_rows(s, batch, fe, b, c, &bad, NULL, ROW_BAD);
    }
}

/* Where the outputs go: the arena at out_off (a local worker's batch with
 * no frontend rows), else a buffer of count * out_stride bytes (sent back
 * in BATCH_OUTPUT, copied to the arena, or to frontends). Returns 0, or an
 * error with msg. */
static int output_region(server_t *s, const sq_batch_t *b, int from_frontends, uint8_t **out,
                         int *owned, char *msg, size_t msglen)
{
    uint64_t n = b->out_stride * (uint64_t)b->count;
    *owned = 0;
    *out = NULL;
    if (b->out_stride > SQ_REMOTE_MAX_BATCH_BYTES || n > SQ_REMOTE_MAX_BATCH_BYTES || n == 0) {
        snprintf(msg, msglen, "output region of %llu bytes", (unsigned long long)n);
        return SQ_PROTOCOL;
    }
    int local_rows = !from_frontends;
    for (uint32_t i = 0; from_frontends && i < b->count; i++)
        local_rows |= b->src[i] == 0;
    if (s->o.remote ? b->out_off != 0 && local_rows
                    : local_rows && !inside(s->o.shm_bytes, b->out_off, n)) {
        snprintf(msg, msglen, "output region outside the arena");
        return SQ_PROTOCOL;
    }
    if (!s->o.remote && !from_frontends) {
        *out = s->o.shm + b->out_off;
        return 0;
    }
    if ((*out = malloc(n)) == NULL) {
        snprintf(msg, msglen, "cannot hold the outputs (%llu bytes)", (unsigned long long)n);
        return SQ_NOMEM;
    }
    *owned = 1;
    return 0;
}

void wk__do_batch(server_t *s, job_t *j)
{
    const sq_batch_t *b = j->batch;
    sq_batch_done_t done = {0};
    int64_t exec_ns = 0;
    int from_frontends = 0, local_rows = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        if (b->has_sources && b->src[i] != 0)
            from_frontends++;
        else
            local_rows++;
    }
    rows_claim_t *claim = NULL;
    if (from_frontends > 0) {
        /* Waiting here, inside the job, keeps jobs in their order. A worker
         * without a data listener has no rows coming. */
        claim = sq_xmalloc(sizeof(*claim));
        int64_t deadline_ns =
            s->data != NULL ? j->received_ns + (int64_t)WK_ROWS_WAIT_MS * 1000000 : 0;
        wk__rows_claim(s->rows, j->id, b->count, b->src, deadline_ns, claim);
    }
    view_t v = {.in = s->o.shm, .in_len = s->o.shm_bytes};
    if (s->o.remote)
        v = (view_t){.in = j->input, .in_len = j->input_len};
    uint8_t *out = NULL;
    int owned = 0;
    done.code =
        output_region(s, b, from_frontends > 0, &out, &owned, done.message, sizeof(done.message));
    if (done.code == 0)
        done.code = run_batch(s, b, &v, claim, out, done.message, sizeof(done.message), &exec_ns);
    done.exec_ns = (uint64_t)exec_ns;
    done.total_ns = (uint64_t)(sq_now_ns() - j->received_ns);
    if (claim != NULL) {
        /* First: the zeroing below is squishd's copy. */
        answer_frontends(s, j->id, b, claim, &done, out);
        wk__rows_claim_dispose(claim);
        free(claim);
    }
    if (done.code == 0 && from_frontends > 0 && local_rows > 0) {
        /* squishd's rows only: a frontend's outputs are not its to see. */
        for (uint32_t i = 0; i < b->count; i++) {
            uint8_t *row = out + b->out_stride * (uint64_t)i;
            if (b->src[i] != 0 && s->o.remote)
                memset(row, 0, b->out_stride);
            else if (b->src[i] == 0 && !s->o.remote)
                memcpy(s->o.shm + b->out_off + b->out_stride * (uint64_t)i, row, b->out_stride);
        }
    }
    if (s->o.remote && done.code == 0 && local_rows > 0) {
        size_t len = b->out_stride * (size_t)b->count;
        for (size_t off = 0; off < len; off += SQ_REMOTE_CHUNK_BYTES) {
            size_t n = len - off < SQ_REMOTE_CHUNK_BYTES ? len - off : SQ_REMOTE_CHUNK_BYTES;
            reply_t *o = wk__reply_new(s, SQ_MSG_BATCH_OUTPUT, j->id);
            sq_buf_put(&o->payload, out + off, n);
            wk__reply_post(s, o);
        }
    }
    if (owned)
        free(out);
    SQ_DEBUG("batch done id=%llu model=%llu count=%u frontend_rows=%d code=%s exec_us=%lld "
             "total_us=%lld",
             (unsigned long long)j->id, (unsigned long long)b->model_key, b->count, from_frontends,
             sq_err_name(done.code), (long long)(exec_ns / 1000),
             (long long)(done.total_ns / 1000));
    reply_t *r = wk__reply_new(s, SQ_MSG_BATCH_DONE, j->id);
    sq_batch_done_encode(&r->payload, &done);
    wk__reply_post(s, r);
}
