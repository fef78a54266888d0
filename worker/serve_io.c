/* The I/O thread (serve_int.h): reads squishd's frames, answers PING at
 * once, receives model files chunk by chunk and turns every other request
 * into a job for the execution thread. A remote worker's connection lost
 * (closed, failed, or squishd silent for several heartbeats) is rejoined
 * through the link (serve_link.c, wk__link_rejoin), and the frames that
 * came with WELCOME are handled here. FE_GONE goes to the rows table. */
#include "serve_int.h"

#include <mdb.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void queue_load(server_t *s, uint64_t key, sq_model_load_t *spec, cached_t *c)
{
    job_t *j = sq_xcalloc(1, sizeof(*j));
    j->kind = JOB_LOAD;
    j->id = key;
    j->load = spec;
    if (c != NULL) {
        j->bytes = c->bytes;
        j->nbytes = c->len;
        j->bytes_file = c->file;
    }
    wk__enqueue(s, j);
}

/* A group load names its members' files, which earlier transfers on this
 * connection cached. */
static void queue_group_load(server_t *s, uint64_t key, sq_model_load_t *spec)
{
    job_t *j = sq_xcalloc(1, sizeof(*j));
    for (uint32_t i = 0; i < spec->n_members; i++) {
        cached_t *c = wk__cache_find(s, spec->members[i].sha256);
        if (c == NULL) {
            char msg[160];
            snprintf(msg, sizeof(msg), "group member %u: bytes %.12s not held", i,
                     spec->members[i].sha256);
            wk__reply_failed(s, key, SQ_PROTOCOL, msg);
            free(spec);
            free(j);
            return;
        }
        j->member_bytes[i] = c->bytes;
        j->member_nbytes[i] = c->len;
        j->member_file[i] = c->file;
    }
    j->kind = JOB_LOAD;
    j->id = key;
    j->load = spec;
    wk__enqueue(s, j);
}

/* The last chunk is in: check the digest, cache the bytes, queue the load. */
static void rx_complete(server_t *s)
{
    char sha[65];
    mdb_sha256_end(s->rx.digest, sha);
    s->rx.digest = NULL;
    sq_model_load_t *spec = s->rx.spec;
    SQ_INFO("model file received key=%llu sha256=%.12s bytes=%zu receive_ms=%lld",
            (unsigned long long)s->rx.key, sha, s->rx.have,
            (long long)((sq_now_ns() - s->rx.started_ns) / 1000000));
    uint64_t key = s->rx.key;
    if (strcmp(sha, spec->sha256) != 0) {
        wk__reply_failed(s, key, SQ_PROTOCOL, "model bytes do not match their sha256");
        wk__file_free(s->rx.bytes, s->rx.spec->total_bytes);
        free(spec);
    } else {
        cached_t *c = sq_xcalloc(1, sizeof(*c));
        memcpy(c->sha256, sha, sizeof(sha));
        c->bytes = s->rx.bytes;
        c->len = s->rx.have;
        c->file = s->rx.file;
        c->next = s->cache;
        s->cache = c;
        if (spec->cache_only)
            free(spec);
        else
            queue_load(s, key, spec, c);
    }
    memset(&s->rx, 0, sizeof(s->rx));
}

/* A remote batch whose rows all come from frontends has no BATCH_INPUT. */
static int all_from_frontends(const sq_batch_t *b)
{
    for (uint32_t i = 0; i < b->count; i++)
        if (!b->has_sources || b->src[i] == 0)
            return 0;
    return 1;
}

int wk__handle_frame(server_t *s, const sq_frame_t *f)
{
    switch (f->type) {
    case SQ_MSG_PING:
        return sq_conn_send(s->conn, SQ_MSG_PONG, f->id, f->payload, f->len) < 0 ? -1 : 0;
    case SQ_MSG_SHUTDOWN:
        if (s->o.remote) {
            /* squishd stops (a restart, say): this host's worker stays, with
             * its models, and joins it (or another) again. */
            wk__connection_lost(s, "squishd shut down");
            return 0;
        }
        SQ_INFO("shutdown requested");
        wk__finish(s, 0);
        return 0;
    case SQ_MSG_MODEL_LOAD: {
        sq_model_load_t *spec = sq_xmalloc(sizeof(*spec));
        if (sq_model_load_decode(f, spec) != 0 || s->rx.spec != NULL) {
            free(spec);
            return -1;
        }
        if (spec->format == SQ_FORMAT_GROUP) {
            queue_group_load(s, f->id, spec);
            return 0;
        }
        if (spec->format == SQ_FORMAT_EMULATED) {
            queue_load(s, f->id, spec, NULL);
            return 0;
        }
        /* Bytes this connection already sent (for this model or a group). */
        cached_t *c = wk__cache_find(s, spec->sha256);
        if (c == NULL && spec->total_bytes == 0) {
            wk__reply_failed(s, f->id, SQ_PROTOCOL, "model bytes neither sent nor held");
            free(spec);
            return 0;
        }
        if (c != NULL) {
            if (spec->cache_only)
                free(spec);
            else
                queue_load(s, f->id, spec, c);
            return 0;
        }
        if (spec->cached) {
            wk__reply_failed(s, f->id, SQ_PROTOCOL, "model bytes marked cached but not held");
            free(spec);
            return 0;
        }
        if (spec->total_bytes > ((uint64_t)4 << 30)) {
            wk__reply_failed(s, f->id, SQ_TOO_LARGE, "model larger than 4 GiB");
            free(spec);
            return 0;
        }
        s->rx.key = f->id;
        s->rx.spec = spec;
        s->rx.bytes = wk__file_alloc(spec->total_bytes, &s->rx.file);
        s->rx.have = 0;
        s->rx.digest = mdb_sha256_begin();
        s->rx.started_ns = sq_now_ns();
        if (s->rx.bytes == NULL) {
            mdb_sha256_free(s->rx.digest);
            wk__reply_failed(s, f->id, SQ_NOMEM, "cannot hold the model file");
            free(spec);
            memset(&s->rx, 0, sizeof(s->rx));
        }
        return 0;
    }
    case SQ_MSG_MODEL_CHUNK:
        if (s->rx.spec == NULL) /* a transfer we refused: skip its chunks */
            return 0;
        if (f->id != s->rx.key || s->rx.have + f->len > s->rx.spec->total_bytes)
            return -1;
        /* Hashed chunk by chunk: the digest of a whole 500 MB file at the
         * end would hold this thread (and its PONGs) for a second or more
         * on a CPU without SHA extensions. */
        memcpy(s->rx.bytes + s->rx.have, f->payload, f->len);
        mdb_sha256_update(s->rx.digest, f->payload, f->len);
        s->rx.have += f->len;
        if (s->rx.have == s->rx.spec->total_bytes)
            rx_complete(s);
        return 0;
    case SQ_MSG_MODEL_UNLOAD: {
        job_t *j = sq_xcalloc(1, sizeof(*j));
        j->kind = JOB_UNLOAD;
        j->id = f->id;
        wk__enqueue(s, j);
        return 0;
    }
    case SQ_MSG_BATCH_INPUT:
        /* A remote batch's inputs, before its BATCH. */
        if (!s->o.remote || (s->rin.active && s->rin.id != f->id) ||
            s->rin.bytes.len + f->len > SQ_REMOTE_MAX_BATCH_BYTES)
            return -1;
        s->rin.active = 1;
        s->rin.id = f->id;
        sq_buf_put(&s->rin.bytes, f->payload, f->len);
        return 0;
    case SQ_MSG_BATCH: {
        if (s->o.remote && s->rin.active && s->rin.id != f->id)
            return -1;
        job_t *j = sq_xcalloc(1, sizeof(*j));
        j->kind = JOB_BATCH;
        j->id = f->id;
        j->batch = sq_xmalloc(sizeof(*j->batch));
        if (sq_batch_decode(f, j->batch) != 0 ||
            (s->o.remote && !s->rin.active && !all_from_frontends(j->batch))) {
            free(j->batch);
            free(j);
            return -1;
        }
        if (s->o.remote && s->rin.active) {
            /* The job takes the bytes. */
            j->input = s->rin.bytes.data;
            j->input_len = s->rin.bytes.len;
            sq_buf_init(&s->rin.bytes);
            s->rin.active = 0;
        }
        SQ_DEBUG("batch received id=%llu count=%u", (unsigned long long)f->id, j->batch->count);
        wk__enqueue(s, j);
        return 0;
    }
    case SQ_MSG_FE_GONE:
        /* A frontend left: its rows never come (batches waiting for them
         * run now). */
        if (f->len != 0 || f->id > UINT32_MAX)
            return -1;
        SQ_INFO("frontend gone frontend=%llu", (unsigned long long)f->id);
        wk__rows_frontend(s->rows, (uint32_t)f->id, ROWS_FE_GONE);
        return 0;
    case SQ_MSG_PROFILE: {
        job_t *j = sq_xcalloc(1, sizeof(*j));
        j->kind = JOB_PROFILE;
        j->id = f->id;
        if (sq_profile_req_decode(f, &j->profile) != 0) {
            free(j);
            return -1;
        }
        wk__enqueue(s, j);
        return 0;
    }
    default:
        SQ_WARN("unexpected message type=%s", sq_msg_name(f->type));
        return -1;
    }
}

/* A lost connection's rejoin (wk__link_rejoin), then the frames that came
 * with WELCOME. */
static void on_rejoin(sq_loop_t *loop, uint64_t id, void *data)
{
    server_t *s = data;
    (void)loop;
    (void)id;
    /* Told to stop meanwhile (a signal read in the same turn of the loop as
     * the connection's end): the signal is consumed, so a rejoin would try
     * squishd for ever. */
    if (s->exit_status >= 0)
        return;
    int rc = wk__link_rejoin(s);
    if (rc != 0) {
        wk__finish(s, rc > 0 ? 0 : 1);
        return;
    }
    sq_frame_t f;
    while (s->exit_status < 0 && !s->lost && sq_conn_next(s->conn, &f) == 1)
        if (wk__handle_frame(s, &f) != 0)
            wk__connection_lost(s, "protocol error");
}

void wk__connection_lost(server_t *s, const char *why)
{
    if (s->lost)
        return;
    SQ_WARN("connection to squishd lost reason=\"%s\"; reconnecting (models kept)", why);
    s->lost = 1;
    sq_loop_unwatch(s->loop, s->conn->fd);
    sq_loop_timer_at(s->loop, sq_now_ns(), on_rejoin, s);
}

/* A remote link can die without a word (a cable, a firewall): squishd
 * pings every heartbeat_ms, so silence for several of them means it is
 * gone. */
void wk__on_silence_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    server_t *s = data;
    (void)id;
    int64_t now = sq_now_ns();
    int64_t limit = (int64_t)s->heartbeat_ms * 5 * 1000000;
    if (limit < (int64_t)2000 * 1000000)
        limit = (int64_t)2000 * 1000000;
    if (!s->lost && now - s->last_heard_ns > limit)
        wk__connection_lost(s, "squishd silent");
    s->silence_timer = sq_loop_timer_at(loop, now + (int64_t)250 * 1000000, wk__on_silence_tick, s);
}

void wk__on_socket(sq_loop_t *loop, int fd, int events, void *data)
{
    server_t *s = data;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(s->conn);
        if (rc < 0) {
            if (s->o.remote) {
                wk__connection_lost(s, strerror(-rc));
                return;
            }
            wk__finish(s, 1);
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(s->conn);
    if (rc == 0) {
        if (s->o.remote) {
            wk__connection_lost(s, "closed by squishd");
            return;
        }
        SQ_INFO("squishd closed the connection; exiting");
        wk__finish(s, 0);
        return;
    }
    if (rc < 0 && rc != -EAGAIN) {
        if (s->o.remote) {
            wk__connection_lost(s, strerror(-rc));
            return;
        }
        SQ_ERROR("read from squishd failed: %s", strerror(-rc));
        wk__finish(s, 1);
        return;
    }
    s->last_heard_ns = sq_now_ns();
    sq_frame_t f;
    while ((rc = sq_conn_next(s->conn, &f)) == 1) {
        if (wk__handle_frame(s, &f) != 0) {
            SQ_ERROR("protocol error from squishd type=%s", sq_msg_name(f.type));
            if (s->o.remote) {
                wk__connection_lost(s, "protocol error");
                return;
            }
            wk__finish(s, 1);
            return;
        }
        if (s->exit_status >= 0 || s->lost)
            return;
    }
    if (rc < 0) {
        SQ_ERROR("protocol error from squishd");
        if (s->o.remote) {
            wk__connection_lost(s, "protocol error");
            return;
        }
        wk__finish(s, 1);
        return;
    }
    if (sq_conn_pending(s->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}
