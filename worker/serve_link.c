/* A remote worker's link to squishd over TCP (serve_int.h): joining with
 * the model files it holds, rejoining after a lost connection (models and
 * files kept; those not loaded again within kept_models_ms are swept) and
 * stopping on a signal. A new connection is handed to the I/O thread's
 * socket handler through the server's on_socket; the I/O thread (serve_io.c)
 * notices a lost or silent connection, calls the rejoin and handles the
 * frames that came with WELCOME, so that this file calls nothing of the
 * I/O thread's. After each WELCOME, squishd hears the data address
 * (serve_data.c). */
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

/* After a lost connection: drops what was queued for the old one and
 * joins squishd again (wk__link_join), then arms the sweep of the models
 * not loaded again. Returns 0, 1 when the worker was told to stop, or -1
 * when it gives up. */
int wk__link_rejoin(server_t *s)
{
    wk__drop_queued(s);
    wk__reset_connection_state(s);
    int rc = wk__link_join(s);
    if (rc != 0)
        return rc;
    if (s->sweep_timer != 0)
        sq_loop_timer_cancel(s->loop, s->sweep_timer);
    s->sweep_timer = sq_loop_timer_at(s->loop, sq_now_ns() + (int64_t)s->o.kept_models_ms * 1000000,
                                      on_sweep, s);
    return 0;
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
