/* Inside link/: the worker link's records (slots, peers, the link itself)
 * and what its files share. peers.c (connections: handshakes, frames,
 * sending, accepting, what the server record publishes) is the lowest;
 * supervise.c (spawning, reaping and restarting the workers squishd
 * supervises) calls it; workers.c (the link's thread, its tick, start and
 * stop) calls both. */
#ifndef GW_WORKERS_INT_H
#define GW_WORKERS_INT_H

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

/* A remote link's measurement (peer_t): the round trip is the least of
 * the last RTT_SAMPLES small PONGs, the bandwidth a PROBE_BYTES PING's,
 * taken at the handshake and every PROBE_EVERY_MS. */
#define RTT_SAMPLES 8
#define PROBE_BYTES (256u << 10)
#define PROBE_EVERY_MS 30000

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
    sq_backoff_t backoff; /* its restarts' delay (--restart_backoff_ms, doubling) */
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
    /* Told to stop (SHUTDOWN, or SIGTERM before its handshake): the end of
     * its connection is then the exit squishd asked for, not a loss. */
    int stop_asked;
    gw_remote_t *remote; /* a worker on TCP; NULL on the UNIX socket */
    /* A frontend (squishd --role frontend) rather than a worker: its id
     * (a space of its own) and name; welcomed once FE_WELCOME went. */
    int frontend;
    char fe_name[64];
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
    gw_workers_config_t cfg; /* its settings (gw_workers_deps_t) */
    sq_shm_arena_t *arena;
    gw_metrics_t *metrics;
    const atomic_int *http_port;
    gw_transport_t **transport; /* where it publishes itself */
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
    int next_frontend_id;
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

/* A slot's device names its kind ("cuda:1"); cpu for a name that does not
 * parse (none should). */
sq_dev_kind_t gw__workers_slot_kind(const slot_t *s);

void gw__workers_publish(gw_workers_t *ws);

/* Finds squish-worker: the configured path, beside squishd, or in the
 * build tree (squishd in build/gateway, the worker in build/worker). */
void gw__workers_peer_close(gw_workers_t *ws, peer_t *p, const char *reason);

/* A bandwidth probe: PROBE_BYTES there and back. */
int gw__workers_send_probe(peer_t *p, int64_t now);

/* The UNIX link's send: the worker maps the arena, so the regions a frame
 * names need no copy. */
int gw__workers_link_send(gw_transport_t *t, int worker, uint16_t type, uint64_t id,
                          const void *payload, uint32_t len, const gw_region_t *regions,
                          int nregions);

int gw__workers_link_send_ref(gw_transport_t *t, int worker, uint16_t type, uint64_t id,
                              sq_bytes_t *bytes, size_t off, uint32_t len);

/* The link's send to a frontend. */
int gw__workers_link_send_fe(gw_transport_t *t, int fe, uint16_t type, uint64_t id,
                             const void *payload, uint32_t len);

void gw__workers_on_accept(sq_loop_t *loop, int fd, int events, void *data);

/* squishd's side of the cluster: the token and the TCP listener. */
int gw__workers_cluster_start(gw_workers_t *ws, char *err, size_t errlen);

int gw__workers_find_worker_bin(gw_workers_t *ws, char *err, size_t errlen);

void gw__workers_spawn(gw_workers_t *ws, slot_t *s);

void gw__workers_reap(gw_workers_t *ws);

#endif
