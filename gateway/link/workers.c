/* The dispatch thread's worker side (gw_link.h): the UNIX socket workers
 * connect to, the cluster listener, the heartbeat tick, start and stop.
 * Connections are peers.c's, supervision supervise.c's. Workers started by
 * hand join as unsupervised peers, on the UNIX socket or, from other hosts,
 * on the cluster listener (TCP, cluster.c: they authenticate before HELLO,
 * and their batches carry inputs and outputs in frames). */
#include "workers_int.h"

static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_workers_t *ws = data;
    const gw_workers_config_t *cfg = &ws->cfg;
    int64_t now = sq_now_ns();
    (void)id;
    gw__workers_reap(ws);
    for (peer_t *p = ws->peers, *next; p != NULL; p = next) {
        next = p->next;
        if (!p->welcomed) {
            if (now - p->accepted_ns > (int64_t)HANDSHAKE_TIMEOUT_MS * 1000000)
                gw__workers_peer_close(ws, p, "handshake_timeout");
            continue;
        }
        /* A worker told to stop is not pinged: it reads nothing more, and a
         * frame left unread when it closes its socket turns its clean exit
         * into a reset here (read_error). It answers no PING either: the
         * stop's deadline, not the heartbeat, bounds its way out. */
        if (p->stop_asked)
            continue;
        /* A worker that drained its socket since the last tick, while
         * squishd had more queued than the socket held (a model file), is
         * reading it: alive, though the PINGs queued behind the file reach
         * it (and its PONGs come back) only after the file. Bytes the
         * kernel merely buffered (a PING to a stopped worker) prove nothing. */
        if (p->backlogged_at_tick && p->conn.bytes_written != p->written_at_tick)
            p->last_heard_ns = now;
        p->written_at_tick = p->conn.bytes_written;
        p->backlogged_at_tick = sq_conn_pending(&p->conn);
        if (now - p->last_heard_ns > (int64_t)cfg->heartbeat_timeout_ms * 1000000) {
            gw__workers_peer_close(ws, p, "heartbeat_timeout");
            continue;
        }
        if (sq_conn_send(&p->conn, SQ_MSG_PING, (uint64_t)now, NULL, 0) < 0 ||
            (p->remote != NULL && p->nrtt >= 2 &&
             (p->probed_ns == 0 || now - p->probed_ns > (int64_t)PROBE_EVERY_MS * 1000000) &&
             gw__workers_send_probe(p, now) < 0)) {
            gw__workers_peer_close(ws, p, "write_error");
            continue;
        }
        if (sq_conn_pending(&p->conn))
            sq_loop_modify(loop, p->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
    }
    if (ws->stopping) {
        int alive = 0;
        for (int i = 0; i < ws->nslots; i++)
            alive += ws->slots[i].pid > 0;
        if (alive == 0 && ws->peers == NULL) {
            sq_loop_stop(loop);
            return;
        }
        if (now > ws->stop_deadline_ns) {
            for (int i = 0; i < ws->nslots; i++)
                if (ws->slots[i].pid > 0)
                    kill(ws->slots[i].pid, SIGKILL);
            for (peer_t *p = ws->peers, *next; p != NULL; p = next) {
                next = p->next;
                gw__workers_peer_close(ws, p, "shutdown_timeout");
            }
        }
    }
    int64_t period = (int64_t)(ws->stopping ? 20 : cfg->heartbeat_ms) * 1000000;
    ws->tick_timer = sq_loop_timer_at(loop, now + period, on_tick, ws);
}

static void *workers_thread(void *arg)
{
    gw_workers_t *ws = arg;
    sq_loop_run(ws->loop);
    return NULL;
}

static int bind_socket(gw_workers_t *ws, char *err, size_t errlen)
{
    const char *path = ws->cfg.socket_path;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "--socket %s: path too long for a UNIX socket", path);
        return SQ_BAD_CONFIG;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return SQ_IO;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (errno != EADDRINUSE) {
            snprintf(err, errlen, "--socket %s: %s", path, strerror(errno));
            close(fd);
            return SQ_IO;
        }
        /* A live squishd answers on it; a stale file from a crash does not. */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            close(fd);
            snprintf(err, errlen, "--socket %s: another squishd is serving this socket", path);
            return SQ_EXISTS;
        }
        unlink(path);
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
            snprintf(err, errlen, "--socket %s: %s", path, strerror(errno));
            close(fd);
            return SQ_IO;
        }
    }
    chmod(path, 0600);
    if (listen(fd, 128) != 0) {
        snprintf(err, errlen, "--socket %s: listen: %s", path, strerror(errno));
        close(fd);
        return SQ_IO;
    }
    ws->listen_fd = fd;
    return 0;
}

int gw_workers_start(const gw_workers_deps_t *deps, gw_workers_t **out, char *err, size_t errlen)
{
    const gw_workers_config_t *cfg = &deps->cfg;
    int nslots = 0;
    for (int g = 0; g < cfg->ngroups; g++)
        nslots += sq_dev_kind_parse(cfg->groups[g].kind) == SQ_DEV_CPU ? 1 : cfg->groups[g].count;
    gw_workers_t *ws = sq_xcalloc(1, sizeof(*ws));
    ws->base.send = gw__workers_link_send;
    ws->base.send_ref = gw__workers_link_send_ref;
    ws->base.send_fe = gw__workers_link_send_fe;
    ws->ev = deps->ev;
    ws->ev_ctx = deps->ev_ctx;
    ws->loop = deps->loop;
    ws->cfg = deps->cfg;
    ws->arena = deps->arena;
    ws->metrics = deps->metrics;
    ws->http_port = deps->http_port;
    ws->transport = deps->transport;
    cfg = &ws->cfg;
    ws->slots = sq_xcalloc((size_t)nslots + 1, sizeof(slot_t));
    ws->listen_fd = -1;
    ws->cluster_fd = -1;
    int rc;
    if (nslots > 0 && (rc = gw__workers_find_worker_bin(ws, err, errlen)) != 0)
        goto fail;
    if ((rc = bind_socket(ws, err, errlen)) != 0)
        goto fail;
    for (int g = 0; g < cfg->ngroups; g++) {
        const gw_worker_group_t *gr = &cfg->groups[g];
        int kind = sq_dev_kind_parse(gr->kind);
        int n = kind == SQ_DEV_CPU ? 1 : gr->count;
        if (kind == SQ_DEV_CPU && gr->count > 1)
            SQ_WARN("one cpu worker uses every core; workers=cpu:%d runs one", gr->count);
        for (int i = 0; i < n; i++) {
            slot_t *s = &ws->slots[ws->nslots];
            s->ws = ws;
            s->id = ws->nslots++;
            sq_device_format(s->device, sizeof(s->device), (sq_dev_kind_t)kind, i);
            sq_backoff_init(&s->backoff, cfg->restart_backoff_ms, cfg->restart_backoff_max_ms);
        }
    }
    ws->next_external_id = 1000;
    if (sq_loop_watch(ws->loop, ws->listen_fd, SQ_EV_READ, gw__workers_on_accept, ws) != 0) {
        snprintf(err, errlen, "cannot watch the worker socket");
        rc = SQ_IO;
        goto fail;
    }
    if ((rc = gw__workers_cluster_start(ws, err, errlen)) != 0)
        goto fail;
    *ws->transport = &ws->base;
    for (int i = 0; i < ws->nslots; i++)
        gw__workers_spawn(ws, &ws->slots[i]);
    ws->tick_timer =
        sq_loop_timer_at(ws->loop, sq_now_ns() + (int64_t)cfg->heartbeat_ms * 1000000, on_tick, ws);
    if (pthread_create(&ws->thread, NULL, workers_thread, ws) != 0) {
        snprintf(err, errlen, "cannot start the dispatch thread");
        rc = SQ_NOMEM;
        *ws->transport = NULL;
        goto fail;
    }
    pthread_setname_np(ws->thread, "sq-dispatch"); /* top -H, /proc/PID/task/TID/comm */
    SQ_INFO("worker socket ready path=%s workers=%d", cfg->socket_path, ws->nslots);
    *out = ws;
    return 0;
fail:
    for (int i = 0; i < ws->nslots; i++)
        if (ws->slots[i].pid > 0)
            kill(ws->slots[i].pid, SIGKILL);
    if (ws->listen_fd >= 0) {
        close(ws->listen_fd);
        unlink(cfg->socket_path);
    }
    if (ws->cluster_fd >= 0)
        close(ws->cluster_fd);
    sq_tls_free(ws->tls);
    OPENSSL_cleanse(ws->token, sizeof(ws->token));
    free(ws->slots);
    free(ws);
    return rc;
}

static void begin_stop(sq_loop_t *loop, void *arg)
{
    gw_workers_t *ws = arg;
    ws->stopping = 1;
    gw__workers_publish(ws);
    ws->stop_deadline_ns = sq_now_ns() + (int64_t)SHUTDOWN_GRACE_MS * 1000000;
    sq_loop_unwatch(loop, ws->listen_fd);
    if (ws->cluster_fd >= 0)
        sq_loop_unwatch(loop, ws->cluster_fd);
    ws->ev->abort(ws->ev_ctx);
    atomic_store(&ws->aborted, 1);
    for (int i = 0; i < ws->nslots; i++) {
        slot_t *s = &ws->slots[i];
        if (s->restart_timer)
            sq_loop_timer_cancel(loop, s->restart_timer);
        s->restart_timer = 0;
        if (s->state == SLOT_SPAWNED && s->pid > 0) {
            kill(s->pid, SIGTERM);
            if (s->peer != NULL)
                s->peer->stop_asked = 1;
        }
    }
    for (peer_t *p = ws->peers; p != NULL; p = p->next) {
        if (p->welcomed) {
            if (sq_conn_send(&p->conn, SQ_MSG_SHUTDOWN, 0, NULL, 0) >= 0 &&
                sq_conn_pending(&p->conn))
                sq_loop_modify(loop, p->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
            p->stop_asked = 1;
        }
    }
    sq_loop_timer_cancel(loop, ws->tick_timer);
    ws->tick_timer = sq_loop_timer_at(loop, sq_now_ns() + 20000000, on_tick, ws);
}

static void abort_on_loop(sq_loop_t *loop, void *arg)
{
    gw_workers_t *ws = arg;
    (void)loop;
    ws->ev->abort(ws->ev_ctx);
    atomic_store(&ws->aborted, 1);
}

void gw_workers_abort(gw_workers_t *ws)
{
    if (ws == NULL || atomic_load(&ws->aborted))
        return;
    sq_loop_post(ws->loop, abort_on_loop, ws);
    while (!atomic_load(&ws->aborted))
        usleep(1000);
}

void gw_workers_stop(gw_workers_t *ws)
{
    if (ws == NULL)
        return;
    sq_loop_post(ws->loop, begin_stop, ws);
    pthread_join(ws->thread, NULL);
    gw__workers_reap(ws);
    while (ws->peers != NULL)
        gw__workers_peer_close(ws, ws->peers, "shutdown");
    sq_loop_run_posts(ws->loop);
    ws->ev->abort(ws->ev_ctx);
    close(ws->listen_fd);
    ws->listen_fd = -1;
    if (ws->cluster_fd >= 0)
        close(ws->cluster_fd);
    ws->cluster_fd = -1;
    unlink(ws->cfg.socket_path);
    SQ_INFO("workers stopped");
}

void gw_workers_free(gw_workers_t *ws)
{
    if (ws == NULL)
        return;
    /* What the DB thread posted until it stopped (answers to the
     * dispatcher's jobs) runs on a dispatcher that answers nothing more. */
    sq_loop_run_posts(ws->loop);
    ws->ev->abort(ws->ev_ctx);
    sq_tls_free(ws->tls);
    OPENSSL_cleanse(ws->token, sizeof(ws->token));
    free(ws->remote_names);
    free(ws->remote_ids);
    free(ws->slots);
    *ws->transport = NULL;
    free(ws);
}
