/* Encoders and decoders of the model, batch and profile messages. Decoders
 * check every count against its bound and the frame type: a worker or a
 * squishd that sends nonsense is a protocol error, never an overflow. */
#include "sq_error.h"
#include "sq_ipc.h"

#include <stdlib.h>
#include <string.h>

static int finish(const sq_reader_t *r, const sq_frame_t *f, unsigned type)
{
    return r->err || r->left != 0 || f->type != type ? SQ_PROTOCOL : 0;
}

void sq_model_load_encode(sq_buf_t *b, const sq_model_load_t *m)
{
    sq_buf_put_str(b, m->sha256);
    sq_buf_put_u8(b, m->format);
    sq_buf_put_u8(b, m->cached);
    sq_buf_put_u64(b, m->total_bytes);
    sq_buf_put_u32(b, m->max_batch);
    for (int i = 0; i < 3; i++) {
        sq_buf_put_f64(b, m->mean[i]);
        sq_buf_put_f64(b, m->std[i]);
        sq_buf_put_u32(b, m->in_chw[i]);
    }
    sq_buf_put_u8(b, m->bgr);
    sq_buf_put_u8(b, m->precision);
    sq_buf_put_u32(b, m->out_classes);
    sq_buf_put_u32(b, m->det_slots);
    sq_buf_put_f64(b, m->det_mean);
    sq_buf_put_u32(b, m->n_latency);
    for (uint32_t i = 0; i < m->n_latency && i < SQ_MAX_EMU_LATENCIES; i++)
        sq_buf_put_u64(b, m->latency_us[i]);
    sq_buf_put_u8(b, m->cache_only);
    sq_buf_put_u32(b, m->n_members);
    for (uint32_t i = 0; i < m->n_members && i < SQ_MAX_GROUP_MEMBERS; i++) {
        sq_buf_put_str(b, m->members[i].sha256);
        sq_buf_put_str(b, m->members[i].cut);
    }
    sq_buf_put_u32(b, m->ready_batch);
}

int sq_model_load_decode(const sq_frame_t *f, sq_model_load_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    sq_get_str(&r, m->sha256, sizeof(m->sha256));
    m->format = sq_get_u8(&r);
    m->cached = sq_get_u8(&r);
    m->total_bytes = sq_get_u64(&r);
    m->max_batch = sq_get_u32(&r);
    for (int i = 0; i < 3; i++) {
        m->mean[i] = sq_get_f64(&r);
        m->std[i] = sq_get_f64(&r);
        m->in_chw[i] = sq_get_u32(&r);
    }
    m->bgr = sq_get_u8(&r);
    m->precision = sq_get_u8(&r);
    m->out_classes = sq_get_u32(&r);
    m->det_slots = sq_get_u32(&r);
    m->det_mean = sq_get_f64(&r);
    m->n_latency = sq_get_u32(&r);
    if (m->n_latency > SQ_MAX_EMU_LATENCIES || m->format > SQ_FORMAT_GROUP || m->max_batch == 0 ||
        m->precision >= SQ_PRECISION_COUNT || m->max_batch > SQ_MAX_BATCH_ITEMS ||
        m->det_slots > SQ_MAX_EMU_DET_SLOTS ||
        (m->det_slots > 0 &&
         (m->out_classes != 5 * m->det_slots || !(m->det_mean >= 0) || m->det_mean > m->det_slots)))
        return SQ_PROTOCOL;
    for (uint32_t i = 0; i < m->n_latency; i++)
        m->latency_us[i] = sq_get_u64(&r);
    m->cache_only = sq_get_u8(&r);
    m->n_members = sq_get_u32(&r);
    if (m->n_members > SQ_MAX_GROUP_MEMBERS || (m->format == SQ_FORMAT_GROUP) != (m->n_members > 0))
        return SQ_PROTOCOL;
    for (uint32_t i = 0; i < m->n_members; i++) {
        sq_get_str(&r, m->members[i].sha256, sizeof(m->members[i].sha256));
        sq_get_str(&r, m->members[i].cut, sizeof(m->members[i].cut));
    }
    m->ready_batch = sq_get_u32(&r);
    if (m->ready_batch > m->max_batch)
        return SQ_PROTOCOL;
    return finish(&r, f, SQ_MSG_MODEL_LOAD);
}

void sq_model_loaded_encode(sq_buf_t *b, const sq_model_loaded_t *m)
{
    sq_buf_put_u64(b, m->memory_bytes);
    sq_buf_put_u32(b, m->max_batch);
    sq_buf_put_u64(b, m->in_elems);
    sq_buf_put_u64(b, m->out_elems);
    sq_buf_put_u32(b, m->in_hw[0]);
    sq_buf_put_u32(b, m->in_hw[1]);
}

int sq_model_loaded_decode(const sq_frame_t *f, sq_model_loaded_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->memory_bytes = sq_get_u64(&r);
    m->max_batch = sq_get_u32(&r);
    m->in_elems = sq_get_u64(&r);
    m->out_elems = sq_get_u64(&r);
    m->in_hw[0] = sq_get_u32(&r);
    m->in_hw[1] = sq_get_u32(&r);
    return finish(&r, f, SQ_MSG_MODEL_LOADED);
}

void sq_batch_encode(sq_buf_t *b, const sq_batch_t *m)
{
    sq_buf_put_u64(b, m->model_key);
    sq_buf_put_u8(b, m->input_kind);
    sq_buf_put_u32(b, m->count);
    sq_buf_put_u64(b, m->out_off);
    sq_buf_put_u64(b, m->out_stride);
    for (uint32_t i = 0; i < m->count && i < SQ_MAX_BATCH_ITEMS; i++)
        sq_buf_put_u64(b, m->in_off[i]);
    sq_buf_put_u8(b, m->has_members);
    for (uint32_t i = 0; m->has_members && i < m->count && i < SQ_MAX_BATCH_ITEMS; i++)
        sq_buf_put_u16(b, m->member[i]);
    sq_buf_put_u8(b, m->has_sources);
    for (uint32_t i = 0; m->has_sources && i < m->count && i < SQ_MAX_BATCH_ITEMS; i++)
        sq_buf_put_u32(b, m->src[i]);
}

int sq_batch_decode(const sq_frame_t *f, sq_batch_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->model_key = sq_get_u64(&r);
    m->input_kind = sq_get_u8(&r);
    m->count = sq_get_u32(&r);
    m->out_off = sq_get_u64(&r);
    m->out_stride = sq_get_u64(&r);
    if (m->count == 0 || m->count > SQ_MAX_BATCH_ITEMS || m->input_kind > SQ_INPUT_UINT8)
        return SQ_PROTOCOL;
    for (uint32_t i = 0; i < m->count; i++)
        m->in_off[i] = sq_get_u64(&r);
    m->has_members = sq_get_u8(&r);
    if (m->has_members > 1)
        return SQ_PROTOCOL;
    for (uint32_t i = 0; m->has_members && i < m->count; i++)
        m->member[i] = sq_get_u16(&r);
    m->has_sources = sq_get_u8(&r);
    if (m->has_sources > 1)
        return SQ_PROTOCOL;
    for (uint32_t i = 0; m->has_sources && i < m->count; i++)
        m->src[i] = sq_get_u32(&r);
    return finish(&r, f, SQ_MSG_BATCH);
}

void sq_batch_done_encode(sq_buf_t *b, const sq_batch_done_t *m)
{
    sq_buf_put_u32(b, (uint32_t)m->code);
    sq_buf_put_u64(b, m->exec_ns);
    sq_buf_put_u64(b, m->total_ns);
    sq_buf_put_str(b, m->message);
}

int sq_batch_done_decode(const sq_frame_t *f, sq_batch_done_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->code = (int32_t)sq_get_u32(&r);
    m->exec_ns = sq_get_u64(&r);
    m->total_ns = sq_get_u64(&r);
    sq_get_str(&r, m->message, sizeof(m->message));
    return finish(&r, f, SQ_MSG_BATCH_DONE);
}

void sq_profile_req_encode(sq_buf_t *b, const sq_profile_req_t *m)
{
    sq_buf_put_u32(b, m->max_batch);
    sq_buf_put_u32(b, m->warmup);
    sq_buf_put_u32(b, m->repeats);
    sq_buf_put_u32(b, m->budget_ms);
    sq_buf_put_u32(b, m->slice_us);
    sq_buf_put_u32(b, m->flags);
}

int sq_profile_req_decode(const sq_frame_t *f, sq_profile_req_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->max_batch = sq_get_u32(&r);
    m->warmup = sq_get_u32(&r);
    m->repeats = sq_get_u32(&r);
    m->budget_ms = sq_get_u32(&r);
    m->slice_us = sq_get_u32(&r);
    m->flags = sq_get_u32(&r);
    if (m->max_batch == 0 || m->max_batch > SQ_MAX_BATCH_ITEMS || m->repeats == 0 ||
        m->repeats > 1000 || m->warmup > 1000)
        return SQ_PROTOCOL;
    return finish(&r, f, SQ_MSG_PROFILE);
}

void sq_profile_done_encode(sq_buf_t *b, const sq_profile_done_t *m)
{
    sq_buf_put_u32(b, (uint32_t)m->code);
    sq_buf_put_str(b, m->message);
    sq_buf_put_u32(b, m->nrows);
    for (uint32_t i = 0; i < m->nrows && i < SQ_MAX_PROFILE_ROWS; i++) {
        sq_buf_put_u32(b, m->rows[i].batch);
        sq_buf_put_f64(b, m->rows[i].mean_us);
        sq_buf_put_f64(b, m->rows[i].std_us);
        sq_buf_put_u64(b, m->rows[i].peak_memory_bytes);
    }
    sq_buf_put_u8(b, m->precision);
    sq_buf_put_f64(b, m->max_abs_deviation);
    sq_buf_put_f64(b, m->max_rel_deviation);
}

int sq_profile_done_decode(const sq_frame_t *f, sq_profile_done_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->code = (int32_t)sq_get_u32(&r);
    sq_get_str(&r, m->message, sizeof(m->message));
    m->nrows = sq_get_u32(&r);
    if (m->nrows > SQ_MAX_PROFILE_ROWS)
        return SQ_PROTOCOL;
    for (uint32_t i = 0; i < m->nrows; i++) {
        m->rows[i].batch = sq_get_u32(&r);
        m->rows[i].mean_us = sq_get_f64(&r);
        m->rows[i].std_us = sq_get_f64(&r);
        m->rows[i].peak_memory_bytes = sq_get_u64(&r);
    }
    m->precision = sq_get_u8(&r);
    m->max_abs_deviation = sq_get_f64(&r);
    m->max_rel_deviation = sq_get_f64(&r);
    /* -1 (not measured), 0 or more, +inf; never NaN */
    if (m->precision >= SQ_PRECISION_COUNT || !(m->max_abs_deviation >= -1) ||
        !(m->max_rel_deviation >= -1))
        return SQ_PROTOCOL;
    return finish(&r, f, SQ_MSG_PROFILE_DONE);
}

void sq_models_held_encode(sq_buf_t *b, uint32_t n, const char (*sha256)[65])
{
    sq_buf_put_u32(b, n);
    for (uint32_t i = 0; i < n; i++)
        sq_buf_put_str(b, sha256[i]);
}

static int is_sha256_hex(const char *s)
{
    size_t n = 0;
    for (; s[n] != '\0'; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
            return 0;
    return n == 64;
}

int sq_models_held_decode(const sq_frame_t *f, sq_models_held_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->sha256 = NULL;
    m->n = sq_get_u32(&r);
    if (r.err || m->n > SQ_MAX_HELD || (uint64_t)m->n * 68 > r.left) {
        m->n = 0;
        return SQ_PROTOCOL;
    }
    m->sha256 = m->n > 0 ? calloc(m->n, sizeof(*m->sha256)) : NULL;
    if (m->n > 0 && m->sha256 == NULL) {
        m->n = 0;
        return SQ_NOMEM;
    }
    for (uint32_t i = 0; i < m->n && !r.err; i++) {
        sq_get_str(&r, m->sha256[i], sizeof(m->sha256[i]));
        if (!r.err && !is_sha256_hex(m->sha256[i]))
            r.err = 1;
    }
    if (finish(&r, f, SQ_MSG_MODELS_HELD) != 0) {
        free(m->sha256);
        m->sha256 = NULL;
        m->n = 0;
        return SQ_PROTOCOL;
    }
    return 0;
}

/* ---- frontends ------------------------------------------------------------ */

void sq_fe_items_encode(sq_buf_t *b, const sq_fe_item_t *items, uint32_t n)
{
    sq_buf_put_u32(b, n);
    for (uint32_t i = 0; i < n; i++) {
        const sq_fe_item_t *it = &items[i];
        sq_buf_put_u64(b, it->slot);
        sq_buf_put_u64(b, (uint64_t)it->model_key);
        sq_buf_put_f64(b, it->slo_ms);
        sq_buf_put_u64(b, (uint64_t)it->budget_us);
        sq_buf_put_u64(b, (uint64_t)it->age_us);
        sq_buf_put_u8(b, it->input_kind);
        sq_buf_put_u8(b, it->priority);
        sq_buf_put_u8(b, it->best_effort);
        sq_buf_put_u8(b, it->clump_next);
        sq_buf_put_u32(b, (uint32_t)it->stage);
        if (it->stage >= 0) {
            sq_buf_put_f64(b, it->query_slo_ms);
            sq_buf_put_str(b, it->pipeline);
        }
    }
}

int sq_fe_items_decode(const sq_frame_t *f, sq_fe_item_t *items, uint32_t *n)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    *n = sq_get_u32(&r);
    if (r.err || *n == 0 || *n > SQ_MAX_FE_ITEMS) {
        *n = 0;
        return SQ_PROTOCOL;
    }
    for (uint32_t i = 0; i < *n && !r.err; i++) {
        sq_fe_item_t *it = &items[i];
        it->slot = sq_get_u64(&r);
        it->model_key = (int64_t)sq_get_u64(&r);
        it->slo_ms = sq_get_f64(&r);
        it->budget_us = (int64_t)sq_get_u64(&r);
        it->age_us = (int64_t)sq_get_u64(&r);
        it->input_kind = sq_get_u8(&r);
        it->priority = sq_get_u8(&r);
        it->best_effort = sq_get_u8(&r);
        it->clump_next = sq_get_u8(&r);
        it->stage = (int32_t)sq_get_u32(&r);
        it->query_slo_ms = 0;
        it->pipeline[0] = '\0';
        if (it->stage >= 0) {
            it->query_slo_ms = sq_get_f64(&r);
            sq_get_str(&r, it->pipeline, sizeof(it->pipeline));
        }
        if (it->input_kind > SQ_INPUT_UINT8 || it->best_effort > 1 || it->clump_next > 1 ||
            it->stage < -1 || !(it->slo_ms >= 0 && it->slo_ms < 1e9) || it->age_us < 0)
            r.err = 1;
    }
    if (finish(&r, f, SQ_MSG_FE_ITEMS) != 0) {
        *n = 0;
        return SQ_PROTOCOL;
    }
    return 0;
}

void sq_fe_hello_encode(sq_buf_t *b, const sq_fe_hello_t *m)
{
    sq_buf_put_u32(b, m->version);
    sq_buf_put_str(b, m->name);
}

int sq_fe_hello_decode(const sq_frame_t *f, sq_fe_hello_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->version = sq_get_u32(&r);
    sq_get_str(&r, m->name, sizeof(m->name));
    return finish(&r, f, SQ_MSG_FE_HELLO);
}

void sq_fe_welcome_encode(sq_buf_t *b, const sq_fe_welcome_t *m)
{
    sq_buf_put_u32(b, m->frontend);
    sq_buf_put_u32(b, m->heartbeat_ms);
    sq_buf_put_str(b, m->admin);
}

int sq_fe_welcome_decode(const sq_frame_t *f, sq_fe_welcome_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->frontend = sq_get_u32(&r);
    m->heartbeat_ms = sq_get_u32(&r);
    sq_get_str(&r, m->admin, sizeof(m->admin));
    return finish(&r, f, SQ_MSG_FE_WELCOME);
}

void sq_fe_assign_encode(sq_buf_t *b, const sq_fe_assign_t *m)
{
    sq_buf_put_u32(b, m->worker);
    sq_buf_put_str(b, m->addr);
    sq_buf_put_u64(b, (uint64_t)m->model_key);
    sq_buf_put_u8(b, m->input_kind);
    sq_buf_put_u32(b, m->count);
    sq_buf_put_u64(b, m->row_bytes);
    sq_buf_put_u64(b, m->out_stride);
    sq_buf_put_u32(b, m->n);
    for (uint32_t i = 0; i < m->n && i < SQ_MAX_BATCH_ITEMS; i++) {
        sq_buf_put_u64(b, m->slot[i]);
        sq_buf_put_u32(b, m->row[i]);
    }
}

int sq_fe_assign_decode(const sq_frame_t *f, sq_fe_assign_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->worker = sq_get_u32(&r);
    sq_get_str(&r, m->addr, sizeof(m->addr));
    m->model_key = (int64_t)sq_get_u64(&r);
    m->input_kind = sq_get_u8(&r);
    m->count = sq_get_u32(&r);
    m->row_bytes = sq_get_u64(&r);
    m->out_stride = sq_get_u64(&r);
    m->n = sq_get_u32(&r);
    if (r.err || m->input_kind > SQ_INPUT_UINT8 || m->count == 0 || m->count > SQ_MAX_BATCH_ITEMS ||
        m->n == 0 || m->n > m->count || m->row_bytes == 0 ||
        m->row_bytes > SQ_IPC_MAX_PAYLOAD - 4096 || m->out_stride == 0 ||
        m->out_stride > SQ_IPC_MAX_PAYLOAD - 4096)
        return SQ_PROTOCOL;
    for (uint32_t i = 0; i < m->n; i++) {
        m->slot[i] = sq_get_u64(&r);
        m->row[i] = sq_get_u32(&r);
        if (m->row[i] >= m->count)
            r.err = 1;
    }
    return finish(&r, f, SQ_MSG_FE_ASSIGN);
}

void sq_fe_fail_encode(sq_buf_t *b, const sq_fe_fail_t *m)
{
    sq_buf_put_u32(b, (uint32_t)m->code);
    sq_buf_put_str(b, m->detail);
}

int sq_fe_fail_decode(const sq_frame_t *f, sq_fe_fail_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->code = (int32_t)sq_get_u32(&r);
    sq_get_str(&r, m->detail, sizeof(m->detail));
    if (m->code >= 0)
        return SQ_PROTOCOL;
    return finish(&r, f, SQ_MSG_FE_FAIL);
}

void sq_fe_withdraw_encode(sq_buf_t *b, const uint64_t *slots, uint32_t n)
{
    sq_buf_put_u32(b, n);
    for (uint32_t i = 0; i < n; i++)
        sq_buf_put_u64(b, slots[i]);
}

int sq_fe_withdraw_decode(const sq_frame_t *f, uint64_t *slots, uint32_t cap, uint32_t *n)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    *n = sq_get_u32(&r);
    if (r.err || *n == 0 || *n > cap) {
        *n = 0;
        return SQ_PROTOCOL;
    }
    for (uint32_t i = 0; i < *n; i++)
        slots[i] = sq_get_u64(&r);
    if (finish(&r, f, SQ_MSG_FE_WITHDRAW) != 0) {
        *n = 0;
        return SQ_PROTOCOL;
    }
    return 0;
}

void sq_data_rows_encode(sq_buf_t *b, const sq_data_rows_t *m)
{
    sq_buf_put_u32(b, m->count);
    sq_buf_put_u8(b, m->input_kind);
    sq_buf_put_u64(b, m->row_bytes);
    sq_buf_put_u32(b, m->n);
    for (uint32_t i = 0; i < m->n && i < SQ_MAX_BATCH_ITEMS; i++) {
        sq_buf_put_u32(b, m->row[i]);
        sq_buf_put_u8(b, m->present[i]);
    }
    sq_buf_put_u8(b, m->shm);
    for (uint32_t i = 0; m->shm && i < m->n && i < SQ_MAX_BATCH_ITEMS; i++)
        if (m->present[i])
            sq_buf_put_u64(b, m->off[i]);
}

int sq_data_rows_decode(const sq_frame_t *f, sq_data_rows_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->count = sq_get_u32(&r);
    m->input_kind = sq_get_u8(&r);
    m->row_bytes = sq_get_u64(&r);
    m->n = sq_get_u32(&r);
    if (r.err || m->count == 0 || m->count > SQ_MAX_BATCH_ITEMS || m->input_kind > SQ_INPUT_UINT8 ||
        m->row_bytes == 0 || m->row_bytes > SQ_IPC_MAX_PAYLOAD || m->n == 0 || m->n > m->count)
        return SQ_PROTOCOL;
    uint64_t present = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        m->row[i] = sq_get_u32(&r);
        m->present[i] = sq_get_u8(&r);
        if (m->row[i] >= m->count || m->present[i] > 1)
            r.err = 1;
        present += m->present[i];
    }
    m->shm = sq_get_u8(&r);
    for (uint32_t i = 0; m->shm == 1 && i < m->n; i++)
        m->off[i] = m->present[i] ? sq_get_u64(&r) : 0;
    if (r.err || m->shm > 1 || r.left != (m->shm ? 0 : present * m->row_bytes) ||
        f->type != SQ_MSG_DATA_ROWS)
        return SQ_PROTOCOL;
    m->bytes = m->shm ? NULL : r.p;
    m->nbytes = r.left;
    return 0;
}

void sq_data_output_encode(sq_buf_t *b, const sq_data_output_t *m)
{
    sq_buf_put_u32(b, (uint32_t)m->code);
    sq_buf_put_u64(b, m->exec_ns);
    sq_buf_put_u64(b, m->total_ns);
    sq_buf_put_u32(b, m->count);
    sq_buf_put_str(b, m->message);
    sq_buf_put_u64(b, m->out_stride);
    sq_buf_put_u32(b, m->n);
    for (uint32_t i = 0; i < m->n && i < SQ_MAX_BATCH_ITEMS; i++)
        sq_buf_put_u32(b, m->row[i]);
}

int sq_data_output_decode(const sq_frame_t *f, sq_data_output_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->code = (int32_t)sq_get_u32(&r);
    m->exec_ns = sq_get_u64(&r);
    m->total_ns = sq_get_u64(&r);
    m->count = sq_get_u32(&r);
    sq_get_str(&r, m->message, sizeof(m->message));
    m->out_stride = sq_get_u64(&r);
    m->n = sq_get_u32(&r);
    if (r.err || m->count == 0 || m->count > SQ_MAX_BATCH_ITEMS || m->n == 0 || m->n > m->count ||
        m->out_stride == 0 || m->out_stride > SQ_IPC_MAX_PAYLOAD)
        return SQ_PROTOCOL;
    for (uint32_t i = 0; i < m->n; i++) {
        m->row[i] = sq_get_u32(&r);
        if (m->row[i] >= m->count)
            r.err = 1;
    }
    uint64_t want = m->code == 0 ? (uint64_t)m->n * m->out_stride : 0;
    if (r.err || r.left != want || f->type != SQ_MSG_DATA_OUTPUT)
        return SQ_PROTOCOL;
    m->bytes = r.p;
    m->nbytes = r.left;
    return 0;
}
