/* A remote worker's link to squishd over TCP (serve_int.h): joining with
 * the model files it holds, noticing a silent squishd, rejoining after a
 * lost connection (models and files kept; those not loaded again within
 * kept_models_ms are swept) and stopping on a signal. A new connection is
 * handed to the I/O thread's handlers through the server's on_socket and
 * handle_frame, so that this file calls nothing of the I/O thread's. After
 * each WELCOME, squishd hears the data address (serve_data.c). */
#include "serve_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Joins squishd (the opts' reconnect: tries its addresses with backoff and
 * does the handshake), telling it which model files this worker holds.
 * Returns 0, 1 when the worker was told to stop, or -1 when it gives up. */
int wk__link_join(server_t *s)
{
    sq_buf_t held;
    sq_buf_init(&held);
    uint32_t n = 0;
    for (cached_t *c = s->cache; c != NULL && n < SQ_MAX_HELD; c = c->next)
        n++;
    char(*shas)[65] = n > 0 ? sq_xcalloc(n, sizeof(*shas)) : NULL;
    uint32_t i = 0;
    for (cached_t *c = s->cache; c != NULL && i < n; c = c->next)
        memcpy(shas[i++], c->sha256, 65);
    sq_models_held_encode(&held, n, (const char(*)[65])shas);
    free(shas);
    sq_conn_t *conn = NULL;
    uint32_t hb = 0;
    int rc = s->o.reconnect(s->o.reconnect_ctx, &held, &conn, &hb);
    sq_buf_dispose(&held);
    if (rc != 0)
        return rc > 0 ? 1 : -1;
    s->conn = conn;
    s->conn_gen++;
    s->lost = 0;
    s->heartbeat_ms = hb > 0 ? hb : 200;
    s->last_heard_ns = sq_now_ns();
    int err = sq_loop_watch(s->loop, conn->fd, SQ_EV_READ, s->on_socket, s);
    if (err != 0) {
        SQ_ERROR("cannot watch the squishd socket error=\"%s\"", strerror(-err));
        return -1;
    }
    /* Rows of the last connection's batches are no use; this squishd (or
     * the same one, again) numbers batches and frontends afresh. */
    wk__rows_reset(s->rows);
    wk__data_announce(s);
    if (n > 0)
        SQ_INFO("rejoined with model files held=%u", n);
    return 0;
}

/* o.kept_models_ms after a rejoin: the execution thread drops the
 * models this connection did not load again. */
static void on_sweep(sq_loop_t *loop, uint64_t id, void *data)
{
    server_t *s = data;
    (void)loop;
    (void)id;
    s->sweep_timer = 0;
    if (s->lost || s->exit_status >= 0)
        return; /* the next rejoin arms it again */
    job_t *j = sq_xcalloc(1, sizeof(*j));
    j->kind = JOB_SWEEP;
    wk__enqueue(s, j);
}

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
    wk__drop_queued(s);
    wk__reset_connection_state(s);
    int rc = wk__link_join(s);
    if (rc != 0) {
        wk__finish(s, rc > 0 ? 0 : 1);
        return;
    }
    if (s->sweep_timer != 0)
        sq_loop_timer_cancel(s->loop, s->sweep_timer);
    s->sweep_timer = sq_loop_timer_at(s->loop, sq_now_ns() + (int64_t)s->o.kept_models_ms * 1000000,
                                      on_sweep, s);
    /* Frames that came with WELCOME. */
    sq_frame_t f;
    while (s->exit_status < 0 && !s->lost && sq_conn_next(s->conn, &f) == 1)
        if (s->handle_frame(s, &f) != 0)
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

/* A remote worker's stop_fd became readable (SIGTERM, SIGINT). */
void wk__on_stop(sq_loop_t *loop, int fd, int events, void *data)
{
    server_t *s = data;
    (void)loop;
    (void)events;
    char info[128]; /* a signalfd_siginfo: consumed, so that nothing else sees it */
    ssize_t n = read(fd, info, sizeof(info));
    (void)n;
    SQ_INFO("stopping on a signal");
    wk__finish(s, 0);
}
