/* The worker link's connections: a worker's handshake (HELLO, and before
 * it a remote worker's authentication), its frames and PONGs (the round
 * trip and bandwidth of a remote link), sending batches through the
 * transport interface, accepting on the UNIX socket and the cluster
 * listener, and the workers coming back (the coming event). */
#include "workers_int.h"

#include "gw_codec_fe.h"

/* A slot's device names its kind ("cuda:1"); cpu for a name that does not
 * parse (none should). */
sq_dev_kind_t gw__workers_slot_kind(const slot_t *s)
{
    sq_device_t dev;
    return sq_device_parse(s->device, &dev) == 0 ? dev.kind : SQ_DEV_CPU;
}

void gw__workers_publish(gw_workers_t *ws)
{
    int coming[SQ_DEV_KIND_COUNT] = {0};
    int64_t back_at[SQ_DEV_KIND_COUNT];
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        back_at[k] = INT64_MAX;
    int64_t now = sq_now_ns();
    for (int i = 0; i < ws->nslots && !ws->stopping; i++) {
        const slot_t *s = &ws->slots[i];
        /* Up but its connection gone: it is being reaped and restarted. */
        int lost = s->state == SLOT_UP && s->peer == NULL;
        if (s->state != SLOT_IDLE && s->state != SLOT_SPAWNED && !lost)
            continue;
        int k = gw__workers_slot_kind(s);
        coming[k]++;
        /* When it should be back: its restart, then its start-up as long as
         * last time (a second before it was ever seen). */
        int64_t start = s->state == SLOT_IDLE      ? s->restart_at_ns
                        : s->state == SLOT_SPAWNED ? s->spawned_ns
                                                   : now + (int64_t)s->backoff.next_ms * 1000000;
        int64_t at = (start + (s->startup_ns > 0 ? s->startup_ns : 1000000000)) / 1000;
        if (at < back_at[k])
            back_at[k] = at;
    }
    if (ws->ev->coming != NULL)
        ws->ev->coming(ws->ev_ctx, coming, back_at);
}

/* Finds squish-worker: the configured path, beside squishd, or in the
 * build tree (squishd in build/gateway, the worker in build/worker). */
void gw__workers_peer_close(gw_workers_t *ws, peer_t *p, const char *reason)
{
    /* A worker told to stop closes its end, and whatever reading or writing
     * then finds (the end of the stream, a reset) is the exit squishd asked
     * for: logged as such, at info. Anything else (a worker lost while
     * serving, a protocol error, one killed at the stop's deadline) is a
     * warning, while stopping too. */
    if (p->stop_asked && (strcmp(reason, "eof") == 0 || strcmp(reason, "read_error") == 0 ||
                          strcmp(reason, "write_error") == 0))
        reason = "shutdown";
    int clean = strcmp(reason, "shutdown") == 0;
    for (peer_t **pp = &ws->peers; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    if (p->frontend) {
        if (p->welcomed && ws->ev->fe_lost != NULL)
            ws->ev->fe_lost(ws->ev_ctx, p->id);
        SQ_LOG(clean || ws->stopping ? SQ_LOG_INFO : SQ_LOG_WARN,
               "frontend %s id=%d name=%s addr=%s reason=%s", ws->stopping ? "gone" : "lost", p->id,
               p->fe_name, gw_remote_addr(p->remote), reason);
    } else {
        if (p->welcomed) {
            ws->ev->lost(ws->ev_ctx, p->id);
            gw_metrics_worker_up(ws->metrics, p->id, p->hello.name, 0);
        }
        if (p->welcomed || p->slot != NULL)
            SQ_LOG(clean ? SQ_LOG_INFO : SQ_LOG_WARN,
                   "worker %s id=%d device=%s pid=%u reason=%s%s%s", ws->stopping ? "gone" : "lost",
                   p->id, p->hello.name[0] ? p->hello.name : "?", p->hello.pid, reason,
                   p->remote ? " addr=" : "", p->remote ? gw_remote_addr(p->remote) : "");
        else if (p->remote != NULL && strcmp(reason, "protocol_error") != 0 &&
                 strcmp(reason, "too_many_handshakes") != 0)
            SQ_WARN("worker connection ended before its handshake addr=%s reason=%s",
                    gw_remote_addr(p->remote), reason);
    }
    sq_loop_unwatch(ws->loop, p->conn.fd);
    sq_conn_dispose(&p->conn);
    gw_remote_free(p->remote);
    slot_t *s = p->slot;
    free(p);
    if (s != NULL)
        s->peer = NULL;
    gw__workers_publish(ws);
    if (s != NULL) {
        /* Make sure the process is gone; reaping restarts the slot. One
         * that closed its end as told is on its way out: killing it would
         * cut its exit short (the stop's deadline kills one that hangs). */
        if (s->pid > 0 && s->state != SLOT_IDLE && !clean)
            kill(s->pid, SIGKILL);
    }
}

/* Called when a supervised child has been reaped. */
static void send_error(peer_t *p, int code, const char *msg)
{
    sq_ipc_error_t e = {.code = code};
    snprintf(e.message, sizeof(e.message), "%s", msg);
    sq_buf_t b;
    sq_buf_init(&b);
    sq_ipc_error_encode(&b, &e);
    sq_conn_send(&p->conn, SQ_MSG_ERROR, 0, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
}

static int remote_id(gw_workers_t *ws, const char *name)
{
    for (int i = 0; i < ws->nremote; i++)
        if (strcmp(ws->remote_names[i], name) == 0)
            return ws->remote_ids[i];
    ws->remote_names =
        sq_xrealloc(ws->remote_names, sizeof(*ws->remote_names) * (size_t)(ws->nremote + 1));
    ws->remote_ids =
        sq_xrealloc(ws->remote_ids, sizeof(*ws->remote_ids) * (size_t)(ws->nremote + 1));
    snprintf(ws->remote_names[ws->nremote], sizeof(ws->remote_names[0]), "%s", name);
    ws->remote_ids[ws->nremote] = ws->next_external_id++;
    return ws->remote_ids[ws->nremote++];
}

static int64_t min_rtt_ns(const peer_t *p)
{
    int64_t m = INT64_MAX;
    for (int i = 0; i < p->nrtt && i < RTT_SAMPLES; i++)
        if (p->rtt_ns[i] < m)
            m = p->rtt_ns[i];
    return p->nrtt > 0 ? m : 0;
}

/* A bandwidth probe: PROBE_BYTES there and back. */
int gw__workers_send_probe(peer_t *p, int64_t now)
{
    static const uint8_t zeros[PROBE_BYTES];
    p->probed_ns = now;
    return sq_conn_send(&p->conn, SQ_MSG_PING, (uint64_t)now, zeros, PROBE_BYTES);
}

/* A PONG from a remote worker: a round trip (or a probe's), and the
 * dispatcher told when the link changed by a tenth or more. */
static void on_pong(gw_workers_t *ws, peer_t *p, const sq_frame_t *f)
{
    int64_t rtt = sq_now_ns() - (int64_t)f->id;
    if (p->remote == NULL || rtt <= 0)
        return;
    if (f->len == 0) {
        p->rtt_ns[p->nrtt++ % RTT_SAMPLES] = rtt;
    } else {
        /* Twice the payload in the probe's time over an empty round trip. */
        int64_t extra = rtt - min_rtt_ns(p);
        double bw = extra > 0 ? 2.0 * f->len / ((double)extra / 1000.0) : 0;
        if (bw > 0)
            p->bytes_per_us = p->bytes_per_us > 0 ? 0.5 * (p->bytes_per_us + bw) : bw;
    }
    int64_t rtt_us = min_rtt_ns(p) / 1000;
    if (p->nrtt == 0 || p->bytes_per_us <= 0 || ws->ev->link == NULL)
        return;
    if (llabs(rtt_us - p->told_rtt_us) * 10 > p->told_rtt_us + 10 ||
        fabs(p->bytes_per_us - p->told_bw) * 10 > p->told_bw) {
        p->told_rtt_us = rtt_us;
        p->told_bw = p->bytes_per_us;
        SQ_INFO("worker link id=%d addr=%s rtt_us=%lld mbit_s=%.0f", p->id,
                gw_remote_addr(p->remote), (long long)rtt_us, p->bytes_per_us * 8.0);
        ws->ev->link(ws->ev_ctx, p->id, gw_remote_addr(p->remote), rtt_us, p->bytes_per_us);
    }
}

static int on_hello(gw_workers_t *ws, peer_t *p, const sq_frame_t *f)
{
    if (sq_hello_decode(f, &p->hello) != 0) {
        send_error(p, SQ_PROTOCOL, "malformed HELLO");
        return -1;
    }
    if (p->hello.version != SQ_IPC_VERSION) {
        char msg[96];
        snprintf(msg, sizeof(msg), "protocol version %u not supported (squishd speaks %d)",
                 p->hello.version, SQ_IPC_VERSION);
        send_error(p, SQ_PROTOCOL, msg);
        return -1;
    }
    sq_device_t dev;
    if (sq_device_parse(p->hello.name, &dev) != 0) {
        send_error(p, SQ_PROTOCOL, "unknown device name");
        return -1;
    }
    for (int i = 0; i < ws->nslots && p->remote == NULL; i++) {
        slot_t *s = &ws->slots[i];
        if (s->pid > 0 && (uint32_t)s->pid == p->hello.pid && s->peer == NULL) {
            p->slot = s;
            break;
        }
    }
    for (peer_t *o = ws->peers; o != NULL; o = o->next) {
        if (o != p && o->welcomed && strcmp(o->hello.name, p->hello.name) == 0) {
            if (p->remote != NULL && o->remote != NULL) {
                /* The same remote worker, back before its old connection
                 * timed out here (a network that dropped it silently): the
                 * authenticated new one replaces it. */
                gw__workers_peer_close(ws, o, "replaced");
                break;
            }
            send_error(p, SQ_EXISTS, "a worker for this device is already connected");
            return -1;
        }
    }
    p->id = p->slot     ? p->slot->id
            : p->remote ? remote_id(ws, p->hello.name)
                        : ws->next_external_id++;
    sq_welcome_t wel = {.version = SQ_IPC_VERSION,
                        .worker_id = (uint32_t)p->id,
                        .heartbeat_ms = (uint32_t)ws->cfg.heartbeat_ms,
                        .shm_bytes = sq_shm_arena_size(ws->arena)};
    if (p->remote != NULL)
        wel.shm_bytes = 0; /* no shared memory across hosts */
    sq_buf_t b;
    sq_buf_init(&b);
    sq_welcome_encode(&b, &wel);
    int rc = p->remote != NULL
                 ? sq_conn_send(&p->conn, SQ_MSG_WELCOME, 0, b.data, (uint32_t)b.len)
                 : sq_conn_send_with_fd(&p->conn, SQ_MSG_WELCOME, 0, b.data, (uint32_t)b.len,
                                        sq_shm_arena_fd(ws->arena), 1000);
    sq_buf_dispose(&b);
    if (rc != 0)
        return -1;
    p->welcomed = 1;
    if (p->slot != NULL) {
        p->slot->peer = p;
        p->slot->state = SLOT_UP;
        p->slot->up_since_ns = sq_now_ns();
        p->slot->startup_ns = p->slot->up_since_ns - p->slot->spawned_ns;
    }
    if (p->remote != NULL && ws->tls != NULL) {
        char subject[256];
        sq_tls_peer(&p->conn, subject, sizeof(subject));
        SQ_INFO("worker certificate id=%d subject=\"%s\"", p->id, subject);
    }
    SQ_INFO("worker up id=%d device=%s pid=%u memory_mb=%llu supervised=%s%s%s", p->id,
            p->hello.name, p->hello.pid, (unsigned long long)(p->hello.memory_bytes >> 20),
            p->slot ? "yes" : "no", p->remote ? " remote=" : "",
            p->remote ? gw_remote_addr(p->remote) : "");
    gw__workers_publish(ws);
    gw_metrics_worker_up(ws->metrics, p->id, p->hello.name, 1);
    ws->ev->up(ws->ev_ctx, p->id, p->hello.name, p->hello.memory_bytes);
    int nheld = 0;
    const char(*held)[65] = p->remote ? gw_remote_held(p->remote, &nheld) : NULL;
    if (nheld > 0 && ws->ev->held != NULL)
        ws->ev->held(ws->ev_ctx, p->id, held, nheld);
    return 0;
}

/* An authenticated frontend's FE_HELLO: its id (never reused while
 * squishd runs: a frontend that reconnects is a new one, whose old items
 * were failed when it left), FE_WELCOME, and the dispatcher told. */
static int on_fe_hello(gw_workers_t *ws, peer_t *p, const sq_frame_t *f)
{
    sq_fe_hello_t h;
    if (sq_fe_hello_decode(f, &h) != 0) {
        send_error(p, SQ_PROTOCOL, "malformed FE_HELLO");
        return -1;
    }
    /* The frontend frames' version and the worker protocol's, both. */
    if (h.version != GW_FE_HELLO_VERSION) {
        char msg[128];
        snprintf(msg, sizeof(msg), "frontend protocol %u.%u not supported (squishd speaks %d.%d)",
                 h.version >> 16, h.version & 0xffff, GW_FE_VERSION, SQ_IPC_VERSION);
        send_error(p, SQ_PROTOCOL, msg);
        return -1;
    }
    if (ws->ev->fe_up == NULL) {
        send_error(p, SQ_PROTOCOL, "this squishd takes no frontends");
        return -1;
    }
    p->frontend = 1;
    p->id = ws->next_frontend_id++;
    snprintf(p->fe_name, sizeof(p->fe_name), "%s", h.name);
    const gw_workers_config_t *cfg = &ws->cfg;
    sq_fe_welcome_t wel = {.frontend = (uint32_t)p->id,
                           .heartbeat_ms = (uint32_t)cfg->heartbeat_ms};
    /* Its HTTP listener as bound; a wildcard host the frontend replaces by
     * the host it reached this one at. */
    snprintf(wel.admin, sizeof(wel.admin),
             strchr(cfg->listen_host, ':') != NULL ? "[%s]:%d" : "%s:%d", cfg->listen_host,
             atomic_load(ws->http_port));
    sq_buf_t b;
    sq_buf_init(&b);
    sq_fe_welcome_encode(&b, &wel);
    int rc = sq_conn_send(&p->conn, SQ_MSG_FE_WELCOME, 0, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
    if (rc != 0)
        return -1;
    p->welcomed = 1;
    SQ_INFO("frontend up id=%d name=%s addr=%s", p->id, p->fe_name, gw_remote_addr(p->remote));
    ws->ev->fe_up(ws->ev_ctx, p->id, p->fe_name, gw_remote_addr(p->remote));
    return 0;
}

static int on_frontend_frame(gw_workers_t *ws, peer_t *p, const sq_frame_t *f)
{
    switch (f->type) {
    case SQ_MSG_PONG:
        return 0;
    case SQ_MSG_ERROR: {
        sq_ipc_error_t e;
        if (sq_ipc_error_decode(f, &e) == 0)
            SQ_WARN("frontend error id=%d code=%s message=\"%s\"", p->id, sq_err_name(e.code),
                    e.message);
        return 0;
    }
    case SQ_MSG_FE_ITEMS:
    case SQ_MSG_FE_WITHDRAW:
    case SQ_MSG_FE_METRICS:
        return ws->ev->fe_frame(ws->ev_ctx, p->id, f);
    default:
        SQ_WARN("unexpected message from frontend id=%d type=%s", p->id, sq_msg_name(f->type));
        return -1;
    }
}

static int on_frame(gw_workers_t *ws, peer_t *p, const sq_frame_t *f)
{
    if (p->frontend)
        return on_frontend_frame(ws, p, f);
    if (!p->welcomed && p->remote != NULL) {
        char why[300] = "";
        int rc = gw_remote_before_hello(p->remote, &p->conn, f, why, sizeof(why));
        if (rc < 0) {
            SQ_WARN("worker refused addr=%s reason=%s", gw_remote_addr(p->remote), why);
            char msg[sizeof(why) + 32];
            snprintf(msg, sizeof(msg), "authentication failed: %s", why);
            send_error(p, rc, msg);
            return -1;
        }
        if (rc == 0)
            return 0;
        if (rc == 2)
            return on_fe_hello(ws, p, f);
    }
    if (p->remote != NULL && p->welcomed) {
        if (atomic_load(&ws->aborted) &&
            (f->type == SQ_MSG_BATCH_OUTPUT || f->type == SQ_MSG_BATCH_DONE))
            return 0; /* the dispatcher answered everything: the outputs go nowhere */
        int rc = gw_remote_on_frame(p->remote, f, sq_shm_arena_base(ws->arena),
                                    sq_shm_arena_size(ws->arena));
        if (rc <= 0) {
            if (rc < 0)
                SQ_WARN("bad batch outputs from remote worker id=%d type=%s", p->id,
                        sq_msg_name(f->type));
            return rc;
        }
    }
    if (!p->welcomed) {
        if (f->type != SQ_MSG_HELLO) {
            send_error(p, SQ_PROTOCOL, "expected HELLO");
            return -1;
        }
        return on_hello(ws, p, f);
    }
    switch (f->type) {
    case SQ_MSG_PONG:
        on_pong(ws, p, f);
        return 0;
    case SQ_MSG_ERROR: {
        sq_ipc_error_t e;
        if (sq_ipc_error_decode(f, &e) == 0)
            SQ_WARN("worker error id=%d code=%s message=\"%s\"", p->id, sq_err_name(e.code),
                    e.message);
        return 0;
    }
    case SQ_MSG_MODEL_LOADED:
    case SQ_MSG_MODEL_FAILED:
    case SQ_MSG_BATCH_DONE:
    case SQ_MSG_PROFILE_PROGRESS:
    case SQ_MSG_PROFILE_DONE:
    case SQ_MSG_PROFILE_SLICE:
    case SQ_MSG_WORKER_DATA:
        return ws->ev->frame(ws->ev_ctx, p->id, f);
    default:
        SQ_WARN("unexpected message from worker id=%d type=%s", p->id, sq_msg_name(f->type));
        return -1;
    }
}

static peer_t *peer_of(gw_workers_t *ws, int worker)
{
    for (peer_t *p = ws->peers; p != NULL; p = p->next)
        if (p->welcomed && !p->frontend && p->id == worker)
            return p;
    return NULL;
}

static peer_t *frontend_of(gw_workers_t *ws, int fe)
{
    for (peer_t *p = ws->peers; p != NULL; p = p->next)
        if (p->welcomed && p->frontend && p->id == fe)
            return p;
    return NULL;
}

/* After queueing: what the socket did not take waits for EPOLLOUT. */
static int sent(gw_workers_t *ws, peer_t *p, int rc)
{
    if (rc < 0)
        return rc;
    if (sq_conn_pending(&p->conn))
        sq_loop_modify(ws->loop, p->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
    return 0;
}

/* The UNIX link's send: the worker maps the arena, so the regions a frame
 * names need no copy. */
int gw__workers_link_send(gw_transport_t *t, int worker, uint16_t type, uint64_t id,
                          const void *payload, uint32_t len, const gw_region_t *regions,
                          int nregions)
{
    gw_workers_t *ws = (gw_workers_t *)t;
    peer_t *p = peer_of(ws, worker);
    if (p == NULL)
        return SQ_NO_WORKER;
    if (p->remote != NULL)
        return sent(ws, p,
                    gw_remote_send(p->remote, &p->conn, worker, sq_shm_arena_base(ws->arena),
                                   sq_shm_arena_size(ws->arena), type, id, payload, len, regions,
                                   nregions));
    return sent(ws, p, sq_conn_send(&p->conn, type, id, payload, len));
}

int gw__workers_link_send_ref(gw_transport_t *t, int worker, uint16_t type, uint64_t id,
                              sq_bytes_t *bytes, size_t off, uint32_t len)
{
    gw_workers_t *ws = (gw_workers_t *)t;
    peer_t *p = peer_of(ws, worker);
    if (p == NULL)
        return SQ_NO_WORKER;
    return sent(ws, p, sq_conn_send_ref(&p->conn, type, id, bytes, off, len));
}

int gw__workers_link_send_fe(gw_transport_t *t, int fe, uint16_t type, uint64_t id,
                             const void *payload, uint32_t len)
{
    gw_workers_t *ws = (gw_workers_t *)t;
    peer_t *p = frontend_of(ws, fe);
    if (p == NULL)
        return SQ_NO_WORKER;
    return sent(ws, p, sq_conn_send(&p->conn, type, id, payload, len));
}

static void on_peer_io(sq_loop_t *loop, int fd, int events, void *data)
{
    peer_t *p = data;
    gw_workers_t *ws = p->ws;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(&p->conn);
        if (rc < 0) {
            gw__workers_peer_close(ws, p, "write_error");
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(&p->conn);
    if (rc == 0) {
        gw__workers_peer_close(ws, p, "eof");
        return;
    }
    if (rc < 0 && rc != -EAGAIN) {
        gw__workers_peer_close(ws, p, "read_error");
        return;
    }
    p->last_heard_ns = sq_now_ns();
    if (!p->welcomed && p->remote != NULL &&
        p->conn.in.len - p->conn.in_off > HANDSHAKE_MAX_BYTES) {
        gw__workers_peer_close(ws, p, "handshake_too_large");
        return;
    }
    sq_frame_t f;
    while ((rc = sq_conn_next(&p->conn, &f)) == 1) {
        if (on_frame(ws, p, &f) != 0) {
            gw__workers_peer_close(ws, p, "protocol_error");
            return;
        }
    }
    if (rc < 0) {
        gw__workers_peer_close(ws, p, "bad_frame");
        return;
    }
    if (sq_conn_pending(&p->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* Takes a new worker connection (remote: a TCP one with its address, then
 * TLS when configured); 0, or -1 when it was dropped. */
static int peer_add(gw_workers_t *ws, sq_loop_t *loop, int cfd, const char *addr)
{
    peer_t *p = sq_xcalloc(1, sizeof(*p));
    p->ws = ws;
    sq_conn_init(&p->conn, cfd);
    if (addr != NULL)
        p->remote = gw_remote_new(ws->token, ws->token_len, addr);
    p->accepted_ns = p->last_heard_ns = sq_now_ns();
    const char *why = NULL;
    if (addr != NULL && ws->tls != NULL && sq_tls_attach(ws->tls, &p->conn, NULL, addr) != 0)
        why = "cannot start TLS on a worker connection";
    else if (sq_loop_watch(loop, cfd, SQ_EV_READ, on_peer_io, p) != 0)
        why = "cannot watch a worker connection";
    if (why != NULL) {
        SQ_WARN("%s addr=%s: dropped", why, addr != NULL ? addr : "local");
        sq_conn_dispose(&p->conn);
        gw_remote_free(p->remote);
        free(p);
        return -1;
    }
    if (addr != NULL)
        SQ_DEBUG("remote worker connection addr=%s", addr);
    p->next = ws->peers;
    ws->peers = p;
    return 0;
}

void gw__workers_on_accept(sq_loop_t *loop, int fd, int events, void *data)
{
    gw_workers_t *ws = data;
    (void)events;
    for (;;) {
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0)
            return;
        if (ws->stopping)
            close(cfd);
        else
            peer_add(ws, loop, cfd, NULL);
    }
}

static void on_accept_cluster(sq_loop_t *loop, int fd, int events, void *data)
{
    gw_workers_t *ws = data;
    (void)events;
    for (;;) {
        char addr[64];
        int cfd = gw_cluster_accept(fd, addr, sizeof(addr));
        if (cfd < 0)
            return;
        if (ws->stopping) {
            close(cfd);
            continue;
        }
        /* Too many in their handshake: the oldest goes. */
        peer_t *oldest = NULL;
        int n = 0;
        for (peer_t *p = ws->peers; p != NULL; p = p->next)
            if (!p->welcomed && p->remote != NULL) {
                n++;
                if (oldest == NULL || p->accepted_ns <= oldest->accepted_ns)
                    oldest = p;
            }
        if (n >= MAX_HANDSHAKES) {
            int64_t now = sq_now_ns();
            ws->handshakes_evicted++;
            if (now - ws->evicted_logged_ns > 1000000000) {
                SQ_WARN("too many worker connections in their handshake (max=%d): closing the "
                        "oldest addr=%s evicted=%llu",
                        MAX_HANDSHAKES, gw_remote_addr(oldest->remote),
                        (unsigned long long)ws->handshakes_evicted);
                ws->evicted_logged_ns = now;
            }
            gw__workers_peer_close(ws, oldest, "too_many_handshakes");
        }
        peer_add(ws, loop, cfd, addr);
    }
}

/* squishd's side of the cluster: the token and the TCP listener. */
int gw__workers_cluster_start(gw_workers_t *ws, char *err, size_t errlen)
{
    const gw_workers_config_t *cfg = &ws->cfg;
    if (cfg->cluster_listen[0] == '\0')
        return 0;
    int rc;
    if (cfg->cluster_tls_cert[0] != '\0' &&
        (rc = sq_tls_new(&ws->tls, 1, cfg->cluster_tls_cert, cfg->cluster_tls_key,
                         cfg->cluster_tls_ca, err, errlen)) != 0)
        return rc;
    rc = sq_auth_read_token(cfg->cluster_token_file, ws->token, sizeof(ws->token), &ws->token_len,
                            err, errlen);
    if (rc != 0)
        return rc;
    char bound[96];
    if ((rc = gw_cluster_listen(cfg->cluster_listen, &ws->cluster_fd, bound, sizeof(bound), err,
                                errlen)) != 0)
        return rc;
    if (sq_loop_watch(ws->loop, ws->cluster_fd, SQ_EV_READ, on_accept_cluster, ws) != 0) {
        snprintf(err, errlen, "cannot watch the cluster listener");
        return SQ_IO;
    }
    SQ_INFO("cluster listening addr=%s tls=%s", bound, ws->tls != NULL ? "yes" : "no");
    return 0;
}

/* Heartbeats, handshake and heartbeat timeouts, reaping; every heartbeat_ms. */
