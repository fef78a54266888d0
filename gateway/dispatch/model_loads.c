/* Loads and blobs: getting a model onto a worker. A model's file is read
 * from the model DB (on the DB thread) for the loads waiting for it and
 * sent in chunks that share the bytes; a worker that already received a
 * file (same sha256 on this connection) is sent only the spec. A prefix group's load sends its
 * members' files, then the group spec. Unloads too. */
#include "placement_int.h"

#include <stdlib.h>
#include <string.h>

static void send_group_load(gw_dispatch_t *ds, ds_model_t *g, ds_worker_t *w);

/* ---- loading models ---------------------------------------------------- */

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
    int rc;
    void *bytes;
    size_t len;
} blob_job_t;

static void on_blob(sq_loop_t *loop, void *arg)
{
    blob_job_t *j = arg;
    gw_dispatch_t *ds = j->ds;
    (void)loop;
    ds_model_t *dm = ds_model_find(ds, j->key);
    if (dm == NULL || dm->removed || ds->aborted) {
        free(j->bytes);
        free(j);
        return;
    }
    if (j->rc != 0) {
        dm->blob_state = 3;
        SQ_ERROR("cannot read model bytes key=%lld", (long long)j->key);
    } else {
        dm->blob_state = 2;
        dm->blob = sq_bytes_adopt(j->bytes, j->len);
        dm->blob_len = j->len;
    }
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w ? ds_load_find(w, dm->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_WAIT_BYTES) {
            if (dm->blob_state == 2) {
                ds_send_load(ds, dm, w);
            } else {
                l->state = LOAD_FAILED;
            }
        }
    }
    if (dm->blob_state == 3)
        ds_cmd_fail_pending(ds, dm, SQ_DB, "the model's bytes cannot be read");
    /* Sent to everyone waiting (the frames hold their own reference until
     * the sockets drain): the file lives in the DB, not here, and a later
     * load reads it again. Kept, a 1.2 GB model held 1.2 GB of squishd for
     * as long as it was served. */
    if (dm->blob_state == 2) {
        sq_bytes_unref(dm->blob);
        dm->blob = NULL;
        dm->blob_state = 0;
    }
    free(j);
}

static void blob_job(mdb_t *db, void *arg)
{
    blob_job_t *j = arg;
    j->rc = mdb_model_blob(db, j->key, &j->bytes, &j->len);
    sq_loop_post(j->ds->loop, on_blob, j);
}

/* What a MODEL_LOAD says of m's input, preprocessing, output and batch. */
static void spec_from_model(sq_model_load_t *spec, const gw_model_t *m)
{
    spec->max_batch = (uint32_t)(m->max_batch > 0 ? m->max_batch : 1);
    for (int c = 0; c < 3; c++) {
        spec->mean[c] = m->mean[c];
        spec->std[c] = m->std[c];
    }
    spec->bgr = (uint8_t)m->bgr;
    spec->precision = (uint8_t)m->precision;
    /* The item shape in the model's order: an emulated plan takes images
     * in the same layout. Its one output is the model's whole row. */
    spec->in_chw[0] = (uint32_t)(m->nhwc ? m->h : m->c);
    spec->in_chw[1] = (uint32_t)(m->nhwc ? m->w : m->h);
    spec->in_chw[2] = (uint32_t)(m->nhwc ? m->c : m->w);
    spec->out_classes = (uint32_t)m->out_elems;
    spec->det_slots = (uint32_t)m->det_slots;
    spec->det_mean = m->det_mean;
}

/* Measured on kind: the worker makes the kernels of the batch sizes the
 * profile reaches at load, and those past it (sizes the dispatcher never
 * forms from this profile) only if one ever runs. Not yet: 0. */
static void spec_ready_batch(sq_model_load_t *spec, const gw_model_t *m, int kind)
{
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT || !m->has_profile[kind])
        return;
    int reach = m->profile[kind].max_batch;
    spec->ready_batch = (uint32_t)(reach < 1                      ? 1
                                   : reach > (int)spec->max_batch ? (int)spec->max_batch
                                                                  : reach);
}

static int send_spec(gw_dispatch_t *ds, ds_worker_t *w, int64_t key, const sq_model_load_t *spec)
{
    sq_buf_t buf;
    sq_buf_init(&buf);
    sq_model_load_encode(&buf, spec);
    int rc = ds_link_send(ds, w->id, SQ_MSG_MODEL_LOAD, (uint64_t)key, buf.data, (uint32_t)buf.len,
                          NULL, 0);
    sq_buf_dispose(&buf);
    return rc;
}

/* The file's bytes in MODEL_CHUNK frames after its MODEL_LOAD; the worker
 * keeps them by sha256 for the life of the connection. The frames borrow
 * the file (no copy): the loop goes on while the socket drains. */
static int send_chunks(gw_dispatch_t *ds, ds_worker_t *w, int64_t key, const char *sha,
                       sq_bytes_t *bytes)
{
    int rc = 0;
    size_t len = bytes->len;
    for (size_t off = 0; off < len && rc == 0; off += SQ_MODEL_CHUNK_BYTES) {
        size_t n = len - off < SQ_MODEL_CHUNK_BYTES ? len - off : SQ_MODEL_CHUNK_BYTES;
        rc =
            ds_link_send_ref(ds, w->id, SQ_MSG_MODEL_CHUNK, (uint64_t)key, bytes, off, (uint32_t)n);
    }
    if (rc == 0)
        ds_note_sha(w, sha);
    return rc;
}

void ds_send_load(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w)
{
    if (dm->is_group) {
        send_group_load(ds, dm, w);
        return;
    }
    gw_model_t *m = dm->m;
    if (dm->poisoned || dm->removed)
        return; /* it crashed its workers, or left service: never sent again */
    ds_load_t *l = ds_load_find(w, dm->key, 1);
    int need_bytes = !m->emulated && w->kind != SQ_DEV_EMU;
    int cached = need_bytes && ds_has_sha(w, m->sha256);
    if (need_bytes && !cached && dm->blob_state != 2) {
        l->state = LOAD_WAIT_BYTES;
        if (dm->blob_state == 0) {
            dm->blob_state = 1;
            blob_job_t *j = sq_xcalloc(1, sizeof(*j));
            j->ds = ds;
            j->key = dm->key;
            gw_db_job(ds->db, blob_job, j);
        }
        return;
    }
    sq_model_load_t *spec = sq_xcalloc(1, sizeof(*spec));
    snprintf(spec->sha256, sizeof(spec->sha256), "%s", m->sha256);
    spec->format = m->emulated ? SQ_FORMAT_EMULATED : SQ_FORMAT_ONNX;
    spec->cached = (uint8_t)cached;
    spec->total_bytes = need_bytes ? dm->blob_len : 0;
    spec_from_model(spec, m);
    spec_ready_batch(spec, m, w->kind);
    if (w->kind == SQ_DEV_EMU) {
        /* An emulated device holds the batch for l(b) of the model's emu
         * profile (or, for a real model, of its cpu or cuda profile). */
        int k = m->has_profile[SQ_DEV_EMU]    ? SQ_DEV_EMU
                : m->has_profile[SQ_DEV_CUDA] ? SQ_DEV_CUDA
                                              : SQ_DEV_CPU;
        int n = spec->max_batch > SQ_MAX_EMU_LATENCIES ? SQ_MAX_EMU_LATENCIES : spec->max_batch;
        spec->max_batch = (uint32_t)n;
        if (spec->ready_batch > spec->max_batch)
            spec->ready_batch = spec->max_batch;
        spec->n_latency = (uint32_t)n;
        for (int b = 1; b <= n; b++) {
            double lat = m->has_profile[k] ? pl_latency_us(&m->profile[k], b, 0) : -1;
            spec->latency_us[b - 1] = lat > 0 ? (uint64_t)lat : 1000;
        }
        spec->format = SQ_FORMAT_EMULATED;
    }
    int rc = send_spec(ds, w, dm->key, spec);
    free(spec);
    if (rc == 0 && need_bytes && !cached)
        rc = send_chunks(ds, w, dm->key, m->sha256, dm->blob);
    l->state = rc == 0 ? LOAD_SENT : LOAD_FAILED;
    l->sent_seq = ++w->job_seq;
    SQ_INFO("model load sent worker=%d device=%s model=%s version=%d bytes=%zu cached=%d", w->id,
            w->device, m->name, m->version, need_bytes && !cached ? dm->blob_len : 0, cached);
}

void ds_group_free_blobs(ds_model_t *g)
{
    for (int i = 0; g->member_blobs != NULL && i < g->nmembers; i++)
        sq_bytes_unref(g->member_blobs[i]);
    free(g->member_blobs);
    free(g->member_lens);
    g->member_blobs = NULL;
    g->member_lens = NULL;
    g->blob_state = 0;
}

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
    int n, rc;
    int64_t keys[SQ_MAX_GROUP_MEMBERS];
    void *bytes[SQ_MAX_GROUP_MEMBERS];
    size_t lens[SQ_MAX_GROUP_MEMBERS];
} group_blob_t;

static void on_group_blob(sq_loop_t *loop, void *arg)
{
    group_blob_t *j = arg;
    gw_dispatch_t *ds = j->ds;
    (void)loop;
    ds_model_t *g = ds_model_find(ds, j->key);
    if (g == NULL || g->removed || j->rc != 0 || ds->aborted) {
        if (g != NULL && !g->removed && !ds->aborted) {
            SQ_ERROR("cannot read the files of prefix group %s", g->m->name);
            g->failed = 1;
            g->blob_state = 3;
        }
        for (int i = 0; i < j->n; i++)
            free(j->bytes[i]);
        free(j);
        return;
    }
    g->member_blobs = sq_xcalloc((size_t)j->n, sizeof(*g->member_blobs));
    g->member_lens = sq_xcalloc((size_t)j->n, sizeof(*g->member_lens));
    for (int i = 0; i < j->n; i++) {
        g->member_blobs[i] = sq_bytes_adopt(j->bytes[i], j->lens[i]);
        g->member_lens[i] = j->lens[i];
    }
    g->blob_state = 2;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w ? ds_load_find(w, g->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_WAIT_BYTES)
            send_group_load(ds, g, w);
    }
    /* Sent to everyone waiting: the files live in the DB, not here. */
    ds_group_free_blobs(g);
    free(j);
    ds_cmd_pump(ds);
}

static void group_blob_job(mdb_t *db, void *arg)
{
    group_blob_t *j = arg;
    for (int i = 0; i < j->n && j->rc == 0; i++)
        j->rc = mdb_model_blob(db, j->keys[i], &j->bytes[i], &j->lens[i]);
    sq_loop_post(j->ds->loop, on_group_blob, j);
}

/* Sends the members' files this worker lacks (kept there by sha256), then
 * the group load naming them and where each is cut. */
static void send_group_load(gw_dispatch_t *ds, ds_model_t *g, ds_worker_t *w)
{
    ds_load_t *l = ds_load_find(w, g->key, 1);
    int missing = 0;
    for (int i = 0; i < g->nmembers; i++)
        missing += !ds_has_sha(w, g->members[i]->sha256);
    if (missing > 0 && g->blob_state != 2) {
        l->state = LOAD_WAIT_BYTES;
        if (g->blob_state == 0) {
            g->blob_state = 1;
            group_blob_t *j = sq_xcalloc(1, sizeof(*j));
            j->ds = ds;
            j->key = g->key;
            j->n = g->nmembers;
            for (int i = 0; i < g->nmembers; i++)
                j->keys[i] = g->members[i]->key;
            gw_db_job(ds->db, group_blob_job, j);
        }
        return;
    }
    int rc = 0;
    size_t sent = 0;
    sq_model_load_t *spec = sq_xcalloc(1, sizeof(*spec));
    for (int i = 0; i < g->nmembers && rc == 0; i++) {
        const gw_model_t *mm = g->members[i];
        if (ds_has_sha(w, mm->sha256))
            continue;
        memset(spec, 0, sizeof(*spec));
        snprintf(spec->sha256, sizeof(spec->sha256), "%s", mm->sha256);
        spec->format = SQ_FORMAT_ONNX;
        spec->cache_only = 1;
        spec->total_bytes = g->member_lens[i];
        spec->max_batch = 1;
        rc = send_spec(ds, w, g->key, spec);
        if (rc == 0)
            rc = send_chunks(ds, w, g->key, mm->sha256, g->member_blobs[i]);
        sent += g->member_lens[i];
    }
    const gw_model_t *gm = g->m;
    memset(spec, 0, sizeof(*spec));
    spec_from_model(spec, gm);
    spec_ready_batch(spec, gm, w->kind);
    spec->format = SQ_FORMAT_GROUP;
    spec->n_members = (uint32_t)g->nmembers;
    for (int i = 0; i < g->nmembers; i++) {
        snprintf(spec->members[i].sha256, sizeof(spec->members[i].sha256), "%s",
                 g->members[i]->sha256);
        snprintf(spec->members[i].cut, sizeof(spec->members[i].cut), "%s",
                 g->members[i]->cut_tensor);
    }
    if (rc == 0)
        rc = send_spec(ds, w, g->key, spec);
    free(spec);
    l->state = rc == 0 ? LOAD_SENT : LOAD_FAILED;
    l->sent_seq = ++w->job_seq;
    SQ_INFO("prefix group load sent worker=%d device=%s group=%s members=%d bytes=%zu", w->id,
            w->device, gm->name, g->nmembers, sent);
}

/* Tells w to unload l's model (its load state becomes LOAD_NONE; its
 * routes are made again, by command, when it was loaded). */
void ds_unload(gw_dispatch_t *ds, ds_worker_t *w, ds_load_t *l)
{
    /* A load waiting for its bytes was never sent: nothing to unload. */
    if (l->state != LOAD_WAIT_BYTES)
        ds_link_send(ds, w->id, SQ_MSG_MODEL_UNLOAD, (uint64_t)l->key, NULL, 0, NULL, 0);
    if (l->state == LOAD_SENT)
        l->stale++;
    int was_done = l->state == LOAD_DONE;
    l->state = LOAD_NONE;
    /* No batch of it may go to w from now on (the routes before a plan
     * covers a model are every worker that holds it). */
    ds_model_t *dm = was_done ? ds_model_find(ds, l->key) : NULL;
    if (dm != NULL && !dm->removed && dm->active && !ds->place.routes_deferred)
        ds_cmd_route(ds, dm);
    else if (dm != NULL)
        dm->routes_stale = 1; /* routed by who deferred it, or at its next enqueue */
}
