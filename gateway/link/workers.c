/* The dispatch thread's worker side: the UNIX socket workers connect to,
 * handshakes, heartbeats and supervision of the workers squishd spawns.
 *
 * A supervised worker lives in a slot (its device spec). When it dies (EOF,
 * a protocol error, missed heartbeats or an exit), the slot kills what is
 * left of it and respawns it after a backoff that doubles per consecutive
 * failure and resets once a worker stayed up for a while. A worker that
 * exits with SQ_EXIT_DEVICE_UNAVAILABLE (a cuda worker on a machine without
 * a GPU) is not retried: its slot becomes the cpu worker when no slot is
 * one yet, and is disabled otherwise (one cpu worker uses every core).
 * Workers started by hand join as unsupervised peers, on the UNIX socket or,
 * from other hosts, on the cluster listener (TCP, cluster.c: they
 * authenticate before HELLO, and their batches carry inputs and outputs in
 * frames). */
#include "gw_link.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <openssl/crypto.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define HANDSHAKE_TIMEOUT_MS 10000
/* Remote connections still in their handshake: at most this many (a new
 * one closes the oldest: a real worker's handshake takes a round trip or
 * two, so whoever holds a slot for long is not one), each buffering at
 * most this much before it authenticates (AUTH frames and MODELS_HELD are
 * small). */
#define MAX_HANDSHAKES 64
#define HANDSHAKE_MAX_BYTES (1u << 20)
#define STABLE_AFTER_MS 10000
#define SHUTDOWN_GRACE_MS 3000

typedef enum {
    SLOT_IDLE,     /* waiting for its restart timer */
    SLOT_SPAWNED,  /* process started, not yet past the handshake */
    SLOT_UP,       /* connected and past the handshake */
    SLOT_DISABLED, /* fell back or given up */
} slot_state_t;

typedef struct peer peer_t;

/* A supervised device slot. */
typedef struct {
    gw_workers_t *ws;
    int id;
    char device[64]; /* "emu:3" */
    slot_state_t state;
    pid_t pid;
    peer_t *peer;
    int64_t up_since_ns;
    int backoff_ms;
    int restarts;
    uint64_t restart_timer;
    int64_t restart_at_ns; /* when its restart timer fires */
    int64_t spawned_ns;
    int64_t startup_ns; /* spawn to handshake, last time (0: not seen yet) */
} slot_t;

/* A connection from a worker process. */
struct peer {
    peer_t *next;
    gw_workers_t *ws;
    sq_conn_t conn;
    int id;       /* worker id; slot id for supervised ones */
    slot_t *slot; /* NULL for a worker started by hand */
    int welcomed;
    gw_remote_t *remote; /* a worker on TCP; NULL on the UNIX socket */
    sq_hello_t hello;
    int64_t accepted_ns;
    int64_t last_heard_ns;
    uint64_t written_at_tick; /* conn.bytes_written at the last heartbeat tick */
    int backlogged_at_tick;   /* more was queued then than the socket took */
    /* A remote worker's link, measured by PINGs (the worker echoes their
     * payload in its PONG; the PING's id is its send time): the round trip
     * is the least of the last RTT_SAMPLES small ones (a PONG that waited
     * behind a batch says nothing about the network), the bandwidth comes
     * from a PROBE_BYTES PING, at the handshake and every PROBE_EVERY_MS. */
    int64_t rtt_ns[8];
    int nrtt;
    double bytes_per_us;
    int64_t probed_ns;
    int64_t told_rtt_us; /* what the dispatcher was last told */
    double told_bw;
};

struct gw_workers {
    gw_transport_t base; /* first: the dispatcher sees the link as this */
    const gw_transport_events_t *ev;
    void *ev_ctx;
    gw_server_t *srv;
    sq_loop_t *loop;
    pthread_t thread;
    int listen_fd;
    int cluster_fd; /* TCP listener for remote workers, or -1 */
    sq_tls_t *tls;  /* TLS on it, or NULL */
    uint8_t token[SQ_AUTH_MAX_TOKEN];
    size_t token_len;
    char worker_bin[PATH_MAX];
    slot_t *slots;
    int nslots;
    peer_t *peers;
    int next_external_id;
    /* Remote workers seen, by device name ("cpu@host2"): one that comes
     * back gets its id again (the dispatcher's record and the metrics'
     * labels stay one per device, however often it reconnects). */
    char (*remote_names)[64];
    int *remote_ids;
    int nremote;
    int stopping;
    atomic_int aborted;
    int64_t stop_deadline_ns;
    uint64_t tick_timer;
    uint64_t handshakes_evicted; /* remote connections closed for MAX_HANDSHAKES */
    int64_t evicted_logged_ns;
};

static void schedule_restart(gw_workers_t *ws, slot_t *s);

static int count_up(gw_workers_t *ws)
{
    int n = 0;
    for (peer_t *p = ws->peers; p != NULL; p = p->next)
        n += p->welcomed;
    return n;
}

/* A slot's device names its kind ("cuda:1"); cpu for a name that does not
 * parse (none should). */
static sq_dev_kind_t slot_kind(const slot_t *s)
{
    sq_device_t dev;
    return sq_device_parse(s->device, &dev) == 0 ? dev.kind : SQ_DEV_CPU;
}

static void publish(gw_workers_t *ws)
{
    atomic_store(&ws->srv->workers_up, count_up(ws));
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
        int k = slot_kind(s);
        coming[k]++;
        /* When it should be back: its restart, then its start-up as long as
         * last time (a second before it was ever seen). */
        int64_t start = s->state == SLOT_IDLE      ? s->restart_at_ns
                        : s->state == SLOT_SPAWNED ? s->spawned_ns
                                                   : now + (int64_t)s->backoff_ms * 1000000;
        int64_t at = (start + (s->startup_ns > 0 ? s->startup_ns : 1000000000)) / 1000;
        if (at < back_at[k])
            back_at[k] = at;
    }
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        atomic_store(&ws->srv->kind_back_at_us[k], back_at[k]);
        atomic_store(&ws->srv->kind_coming[k], coming[k]);
    }
}

/* Finds squish-worker: the configured path, beside squishd, or in the
 * build tree (squishd in build/gateway, the worker in build/worker). */
static int find_worker_bin(gw_workers_t *ws, char *err, size_t errlen)
{
    const gw_config_t *cfg = ws->srv->cfg;
    if (cfg->worker_bin[0] != '\0') {
        if (access(cfg->worker_bin, X_OK) != 0) {
            snprintf(err, errlen, "--worker-bin %s: %s", cfg->worker_bin, strerror(errno));
            return SQ_BAD_CONFIG;
        }
        snprintf(ws->worker_bin, sizeof(ws->worker_bin), "%s", cfg->worker_bin);
        return 0;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            *slash = '\0';
            const char *candidates[] = {"%s/squish-worker", "%s/../worker/squish-worker"};
            for (size_t i = 0; i < 2; i++) {
                char path[PATH_MAX + 32];
                snprintf(path, sizeof(path), candidates[i], self);
                if (access(path, X_OK) == 0 && strlen(path) < sizeof(ws->worker_bin)) {
                    snprintf(ws->worker_bin, sizeof(ws->worker_bin), "%s", path);
                    return 0;
                }
            }
        }
    }
    snprintf(err, errlen, "--worker-bin: squish-worker not found beside squishd; give its path");
    return SQ_BAD_CONFIG;
}

static void spawn(gw_workers_t *ws, slot_t *s)
{
    const gw_config_t *cfg = ws->srv->cfg;
    char mem[32];
    snprintf(mem, sizeof(mem), "%d", cfg->emu_memory_mb);
    char *argv[] = {ws->worker_bin,
                    "--connect",
                    ws->srv->socket_path,
                    "--device",
                    s->device,
                    "--memory-mb",
                    mem,
                    "--log-level",
                    (char *)sq_log_level_name(cfg->log_level),
                    NULL};
    if (strncmp(s->device, "emu:", 4) != 0)
        argv[5] = NULL; /* --memory-mb is for emulated devices only */
    pid_t pid;
    int rc = posix_spawn(&pid, ws->worker_bin, NULL, NULL, argv, environ);
    if (rc != 0) {
        SQ_ERROR("cannot spawn worker device=%s error=\"%s\"", s->device, strerror(rc));
        schedule_restart(ws, s);
        return;
    }
    s->pid = pid;
    s->state = SLOT_SPAWNED;
    s->spawned_ns = sq_now_ns();
    publish(ws);
    SQ_INFO("worker spawned id=%d device=%s pid=%d", s->id, s->device, (int)pid);
}

static void on_restart_timer(sq_loop_t *loop, uint64_t id, void *data)
{
    slot_t *s = data;
    gw_workers_t *ws = s->ws;
    (void)loop;
    (void)id;
    s->restart_timer = 0;
    if (!ws->stopping && s->state == SLOT_IDLE)
        spawn(ws, s);
}

static void schedule_restart(gw_workers_t *ws, slot_t *s)
{
    if (ws->stopping || s->state == SLOT_DISABLED)
        return;
    s->state = SLOT_IDLE;
    s->pid = 0;
    int delay = s->backoff_ms;
    int64_t now = sq_now_ns();
    s->restarts++;
    gw_metrics_worker_restart(ws->srv->metrics, s->id, s->device);
    s->restart_at_ns = now + (int64_t)delay * 1000000;
    s->restart_timer = sq_loop_timer_at(ws->loop, s->restart_at_ns, on_restart_timer, s);
    SQ_INFO("worker restart scheduled id=%d device=%s in_ms=%d restarts=%d", s->id, s->device,
            delay, s->restarts);
    publish(ws);
    int max = ws->srv->cfg->restart_backoff_max_ms;
    s->backoff_ms = s->backoff_ms * 2 > max ? max : (s->backoff_ms == 0 ? 1 : s->backoff_ms * 2);
}

static void peer_close(gw_workers_t *ws, peer_t *p, const char *reason)
{
    for (peer_t **pp = &ws->peers; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    if (p->welcomed)
        ws->ev->lost(ws->ev_ctx, p->id);
    if (p->welcomed)
        gw_metrics_worker_up(ws->srv->metrics, p->id, p->hello.name, 0);
    if (p->welcomed || p->slot != NULL)
        SQ_LOG(ws->stopping ? SQ_LOG_INFO : SQ_LOG_WARN,
               "worker %s id=%d device=%s pid=%u reason=%s%s%s", ws->stopping ? "gone" : "lost",
               p->id, p->hello.name[0] ? p->hello.name : "?", p->hello.pid, reason,
               p->remote ? " addr=" : "", p->remote ? gw_remote_addr(p->remote) : "");
    else if (p->remote != NULL && strcmp(reason, "protocol_error") != 0 &&
             strcmp(reason, "too_many_handshakes") != 0)
        SQ_WARN("worker connection ended before its handshake addr=%s reason=%s",
                gw_remote_addr(p->remote), reason);
    sq_loop_unwatch(ws->loop, p->conn.fd);
    sq_conn_dispose(&p->conn);
    gw_remote_free(p->remote);
    slot_t *s = p->slot;
    free(p);
    if (s != NULL)
        s->peer = NULL;
    publish(ws);
    if (s != NULL) {
        /* Make sure the process is gone; reaping restarts the slot. */
        if (s->pid > 0 && s->state != SLOT_IDLE)
            kill(s->pid, SIGKILL);
    }
}

/* Called when a supervised child has been reaped. */
static void slot_exited(gw_workers_t *ws, slot_t *s, int status)
{
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (s->peer != NULL)
        peer_close(ws, s->peer, "exited");
    s->pid = 0;
    ws->ev->exited(ws->ev_ctx, s->id, status);
    if (ws->stopping) {
        s->state = SLOT_IDLE;
        return;
    }
    SQ_INFO("worker exited id=%d device=%s status=%d signal=%d", s->id, s->device, code, sig);
    if (code == SQ_EXIT_DEVICE_UNAVAILABLE) {
        /* The slot becomes the cpu worker, unless one is already there: one
         * cpu worker uses every core, and a second on the same cores would
         * only contend with it (as workers=cpu:N runs one). */
        int cpu_slot = -1;
        for (int i = 0; i < ws->nslots && cpu_slot < 0; i++)
            if (slot_kind(&ws->slots[i]) == SQ_DEV_CPU && ws->slots[i].state != SLOT_DISABLED)
                cpu_slot = i;
        if (slot_kind(s) == SQ_DEV_CPU) {
            SQ_WARN("device unavailable, slot disabled id=%d device=%s", s->id, s->device);
            s->state = SLOT_DISABLED;
            publish(ws);
            return;
        }
        if (cpu_slot >= 0) {
            SQ_WARN("device unavailable, slot disabled (no fallback: the cpu worker of slot %d "
                    "already uses every core) id=%d device=%s",
                    cpu_slot, s->id, s->device);
            s->state = SLOT_DISABLED;
            return;
        }
        SQ_WARN("device unavailable, falling back to cpu id=%d device=%s", s->id, s->device);
        sq_device_format(s->device, sizeof(s->device), SQ_DEV_CPU, 0);
    }
    if (s->up_since_ns > 0 && sq_now_ns() - s->up_since_ns > (int64_t)STABLE_AFTER_MS * 1000000)
        s->backoff_ms = ws->srv->cfg->restart_backoff_ms;
    s->up_since_ns = 0;
    schedule_restart(ws, s);
}

static void reap(gw_workers_t *ws)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < ws->nslots; i++) {
            if (ws->slots[i].pid == pid) {
                slot_exited(ws, &ws->slots[i], status);
                break;
            }
        }
    }
}

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

#define RTT_SAMPLES 8
#define PROBE_BYTES (256u << 10)
#define PROBE_EVERY_MS 30000

static int64_t min_rtt_ns(const peer_t *p)
{
    int64_t m = INT64_MAX;
    for (int i = 0; i < p->nrtt && i < RTT_SAMPLES; i++)
        if (p->rtt_ns[i] < m)
            m = p->rtt_ns[i];
    return p->nrtt > 0 ? m : 0;
}

/* A bandwidth probe: PROBE_BYTES there and back. */
static int send_probe(peer_t *p, int64_t now)
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
                peer_close(ws, o, "replaced");
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
                        .heartbeat_ms = (uint32_t)ws->srv->cfg->heartbeat_ms,
                        .shm_bytes = sq_shm_arena_size(ws->srv->arena)};
    if (p->remote != NULL)
        wel.shm_bytes = 0; /* no shared memory across hosts */
    sq_buf_t b;
    sq_buf_init(&b);
    sq_welcome_encode(&b, &wel);
    int rc = p->remote != NULL
                 ? sq_conn_send(&p->conn, SQ_MSG_WELCOME, 0, b.data, (uint32_t)b.len)
                 : sq_conn_send_with_fd(&p->conn, SQ_MSG_WELCOME, 0, b.data, (uint32_t)b.len,
                                        sq_shm_arena_fd(ws->srv->arena), 1000);
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
    publish(ws);
    gw_metrics_worker_up(ws->srv->metrics, p->id, p->hello.name, 1);
    ws->ev->up(ws->ev_ctx, p->id, p->hello.name, p->hello.memory_bytes);
    int nheld = 0;
    const char(*held)[65] = p->remote ? gw_remote_held(p->remote, &nheld) : NULL;
    if (nheld > 0 && ws->ev->held != NULL)
        ws->ev->held(ws->ev_ctx, p->id, held, nheld);
    return 0;
}

static int on_frame(gw_workers_t *ws, peer_t *p, const sq_frame_t *f)
{
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
    }
    if (p->remote != NULL && p->welcomed) {
        if (atomic_load(&ws->aborted) &&
            (f->type == SQ_MSG_BATCH_OUTPUT || f->type == SQ_MSG_BATCH_DONE))
            return 0; /* the dispatcher answered everything: the outputs go nowhere */
        int rc = gw_remote_on_frame(p->remote, f, sq_shm_arena_base(ws->srv->arena),
                                    sq_shm_arena_size(ws->srv->arena));
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
        return ws->ev->frame(ws->ev_ctx, p->id, f);
    default:
        SQ_WARN("unexpected message from worker id=%d type=%s", p->id, sq_msg_name(f->type));
        return -1;
    }
}

static peer_t *peer_of(gw_workers_t *ws, int worker)
{
    for (peer_t *p = ws->peers; p != NULL; p = p->next)
        if (p->welcomed && p->id == worker)
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
static int link_send(gw_transport_t *t, int worker, uint16_t type, uint64_t id, const void *payload,
                     uint32_t len, const gw_region_t *regions, int nregions)
{
    gw_workers_t *ws = (gw_workers_t *)t;
    peer_t *p = peer_of(ws, worker);
    if (p == NULL)
        return SQ_NO_WORKER;
    if (p->remote != NULL)
        return sent(ws, p,
                    gw_remote_send(p->remote, &p->conn, worker, sq_shm_arena_base(ws->srv->arena),
                                   sq_shm_arena_size(ws->srv->arena), type, id, payload, len,
                                   regions, nregions));
    return sent(ws, p, sq_conn_send(&p->conn, type, id, payload, len));
}

static int link_send_ref(gw_transport_t *t, int worker, uint16_t type, uint64_t id,
                         sq_bytes_t *bytes, size_t off, uint32_t len)
{
    gw_workers_t *ws = (gw_workers_t *)t;
    peer_t *p = peer_of(ws, worker);
    if (p == NULL)
        return SQ_NO_WORKER;
    return sent(ws, p, sq_conn_send_ref(&p->conn, type, id, bytes, off, len));
}

static void on_peer_io(sq_loop_t *loop, int fd, int events, void *data)
{
    peer_t *p = data;
    gw_workers_t *ws = p->ws;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(&p->conn);
        if (rc < 0) {
            peer_close(ws, p, "write_error");
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(&p->conn);
    if (rc == 0) {
        peer_close(ws, p, "eof");
        return;
    }
    if (rc < 0 && rc != -EAGAIN) {
        peer_close(ws, p, "read_error");
        return;
    }
    p->last_heard_ns = sq_now_ns();
    if (!p->welcomed && p->remote != NULL &&
        p->conn.in.len - p->conn.in_off > HANDSHAKE_MAX_BYTES) {
        peer_close(ws, p, "handshake_too_large");
        return;
    }
    sq_frame_t f;
    while ((rc = sq_conn_next(&p->conn, &f)) == 1) {
        if (on_frame(ws, p, &f) != 0) {
            peer_close(ws, p, "protocol_error");
            return;
        }
    }
    if (rc < 0) {
        peer_close(ws, p, "bad_frame");
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

static void on_accept(sq_loop_t *loop, int fd, int events, void *data)
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
            peer_close(ws, oldest, "too_many_handshakes");
        }
        peer_add(ws, loop, cfd, addr);
    }
}

/* squishd's side of the cluster: the token and the TCP listener. */
static int cluster_start(gw_workers_t *ws, char *err, size_t errlen)
{
    const gw_config_t *cfg = ws->srv->cfg;
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
static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_workers_t *ws = data;
    const gw_config_t *cfg = ws->srv->cfg;
    int64_t now = sq_now_ns();
    (void)id;
    reap(ws);
    for (peer_t *p = ws->peers, *next; p != NULL; p = next) {
        next = p->next;
        if (!p->welcomed) {
            if (now - p->accepted_ns > (int64_t)HANDSHAKE_TIMEOUT_MS * 1000000)
                peer_close(ws, p, "handshake_timeout");
            continue;
        }
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
            peer_close(ws, p, "heartbeat_timeout");
            continue;
        }
        if (sq_conn_send(&p->conn, SQ_MSG_PING, (uint64_t)now, NULL, 0) < 0 ||
            (p->remote != NULL && p->nrtt >= 2 &&
             (p->probed_ns == 0 || now - p->probed_ns > (int64_t)PROBE_EVERY_MS * 1000000) &&
             send_probe(p, now) < 0)) {
            peer_close(ws, p, "write_error");
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
                peer_close(ws, p, "shutdown");
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
    const char *path = ws->srv->socket_path;
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

int gw_workers_start(gw_server_t *srv, sq_loop_t *loop, const gw_transport_events_t *ev, void *ctx,
                     char *err, size_t errlen)
{
    const gw_config_t *cfg = srv->cfg;
    int nslots = 0;
    for (int g = 0; g < cfg->ngroups; g++)
        nslots += sq_dev_kind_parse(cfg->groups[g].kind) == SQ_DEV_CPU ? 1 : cfg->groups[g].count;
    gw_workers_t *ws = sq_xcalloc(1, sizeof(*ws));
    ws->base.send = link_send;
    ws->base.send_ref = link_send_ref;
    ws->ev = ev;
    ws->ev_ctx = ctx;
    ws->loop = loop;
    ws->srv = srv;
    ws->slots = sq_xcalloc((size_t)nslots + 1, sizeof(slot_t));
    ws->listen_fd = -1;
    ws->cluster_fd = -1;
    int rc;
    if (nslots > 0 && (rc = find_worker_bin(ws, err, errlen)) != 0)
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
            s->backoff_ms = cfg->restart_backoff_ms;
        }
    }
    ws->next_external_id = 1000;
    if (sq_loop_watch(ws->loop, ws->listen_fd, SQ_EV_READ, on_accept, ws) != 0) {
        snprintf(err, errlen, "cannot watch the worker socket");
        rc = SQ_IO;
        goto fail;
    }
    if ((rc = cluster_start(ws, err, errlen)) != 0)
        goto fail;
    srv->workers = ws;
    srv->transport = &ws->base;
    for (int i = 0; i < ws->nslots; i++)
        spawn(ws, &ws->slots[i]);
    ws->tick_timer =
        sq_loop_timer_at(ws->loop, sq_now_ns() + (int64_t)cfg->heartbeat_ms * 1000000, on_tick, ws);
    if (pthread_create(&ws->thread, NULL, workers_thread, ws) != 0) {
        snprintf(err, errlen, "cannot start the dispatch thread");
        rc = SQ_NOMEM;
        srv->workers = NULL;
        srv->transport = NULL;
        goto fail;
    }
    SQ_INFO("worker socket ready path=%s workers=%d", srv->socket_path, ws->nslots);
    return 0;
fail:
    for (int i = 0; i < ws->nslots; i++)
        if (ws->slots[i].pid > 0)
            kill(ws->slots[i].pid, SIGKILL);
    if (ws->listen_fd >= 0) {
        close(ws->listen_fd);
        unlink(srv->socket_path);
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
    publish(ws);
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
        if (s->state == SLOT_SPAWNED && s->pid > 0)
            kill(s->pid, SIGTERM);
    }
    for (peer_t *p = ws->peers; p != NULL; p = p->next) {
        if (p->welcomed)
            sq_conn_send(&p->conn, SQ_MSG_SHUTDOWN, 0, NULL, 0);
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

void gw_workers_abort(gw_server_t *srv)
{
    gw_workers_t *ws = srv->workers;
    if (ws == NULL || atomic_load(&ws->aborted))
        return;
    sq_loop_post(ws->loop, abort_on_loop, ws);
    while (!atomic_load(&ws->aborted))
        usleep(1000);
}

void gw_workers_stop(gw_server_t *srv)
{
    gw_workers_t *ws = srv->workers;
    if (ws == NULL)
        return;
    sq_loop_post(ws->loop, begin_stop, ws);
    pthread_join(ws->thread, NULL);
    reap(ws);
    while (ws->peers != NULL)
        peer_close(ws, ws->peers, "shutdown");
    sq_loop_run_posts(ws->loop);
    ws->ev->abort(ws->ev_ctx);
    close(ws->listen_fd);
    ws->listen_fd = -1;
    if (ws->cluster_fd >= 0)
        close(ws->cluster_fd);
    ws->cluster_fd = -1;
    unlink(srv->socket_path);
    atomic_store(&srv->workers_up, 0);
    SQ_INFO("workers stopped");
}

void gw_workers_free(gw_server_t *srv)
{
    gw_workers_t *ws = srv->workers;
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
    free(ws);
    srv->workers = NULL;
    srv->transport = NULL;
}
