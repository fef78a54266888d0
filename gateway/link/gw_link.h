/* link/: the dispatch thread's link to its workers: the transport
 * interface, the UNIX socket + shared-memory link with supervision of the
 * workers squishd spawns, and the authenticated TCP link of a cluster. */
#ifndef GW_LINK_H
#define GW_LINK_H

#include "gw_metrics.h"
#include "gw_server.h"

#include <sq.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The dispatch thread's link to its workers. The dispatcher sends frames
 * through a gw_transport_t and hears of workers through the events it
 * gave when the link started; it never calls into the link's file, nor the
 * link into the dispatcher's. Today's link is a UNIX socket beside shared
 * memory (workers.c: batches name arena offsets, the worker maps the
 * arena); a TCP link to workers on other hosts implements the same two
 * structs, carrying the regions a frame names in the frame itself.
 *
 * Everything here runs on the dispatch thread. */

/* A piece of the shared-memory arena that a frame refers to (a batch's
 * input slots): a link without shared memory sends its bytes along. */
typedef struct {
    uint64_t offset;
    uint64_t bytes;
} gw_region_t;

typedef struct gw_transport gw_transport_t;

/* The base of a link (first member of the implementation's struct). */
struct gw_transport {
    /* Queues one frame to `worker`: 0, or SQ_NO_WORKER when it is not
     * connected, or another error when the connection failed (the link
     * then reports the worker lost). */
    int (*send)(gw_transport_t *t, int worker, uint16_t type, uint64_t id, const void *payload,
                uint32_t len, const gw_region_t *regions, int nregions);
    /* The same with a payload borrowed from shared bytes (a model file):
     * bytes[off, off + len) goes out without a copy; the link holds a
     * reference until it is written. */
    int (*send_ref)(gw_transport_t *t, int worker, uint16_t type, uint64_t id, sq_bytes_t *bytes,
                    size_t off, uint32_t len);
    /* Queues one frame to frontend fe (squishd --role frontend, joined on
     * the cluster listener): 0, or SQ_NO_WORKER when it is not connected. */
    int (*send_fe)(gw_transport_t *t, int fe, uint16_t type, uint64_t id, const void *payload,
                   uint32_t len);
};

/* What the link tells the dispatcher (ctx: the dispatcher's). */
typedef struct {
    /* A worker passed its handshake. */
    void (*up)(void *ctx, int worker, const char *device, uint64_t memory_bytes);
    /* A frame from it; nonzero means the frame breaks the protocol and the
     * link drops the worker. */
    int (*frame)(void *ctx, int worker, const sq_frame_t *f);
    /* Its connection ended (then, for a process squishd started, exited
     * with its waitpid status once it is reaped). */
    void (*lost)(void *ctx, int worker);
    void (*exited)(void *ctx, int worker, int status);
    /* squishd stops: answer everything still held (idempotent). */
    void (*abort)(void *ctx);
    /* Optional: right after up, the model files (sha256 hex) a worker that
     * reconnected still holds; loading one of them sends no bytes. */
    void (*held)(void *ctx, int worker, const char (*sha256)[65], int n);
    /* Optional: a remote worker's link as measured (its address, round
     * trip, bandwidth), when first known and when it changes. */
    void (*link)(void *ctx, int worker, const char *addr, int64_t rtt_us, double bytes_per_us);
    /* Optional: the supervised workers per device kind being restarted (or
     * not yet past their handshake), and when the first of each kind
     * should be up (INT64_MAX: unknown), whenever the link looks again. */
    void (*coming)(void *ctx, const int *coming, const int64_t *back_at_us);
    /* Frontends (optional): one passed its handshake (FE_WELCOME sent,
     * with its id), a frame from it (nonzero: it breaks the protocol and
     * is dropped), its connection ended. */
    void (*fe_up)(void *ctx, int fe, const char *name, const char *addr);
    int (*fe_frame)(void *ctx, int fe, const sq_frame_t *f);
    void (*fe_lost)(void *ctx, int fe);
} gw_transport_events_t;

/* The TCP side of the workers' link (workers.c): squishd's cluster
 * listener and, per remote worker, what differs from a local one: the
 * authentication before HELLO (sq_auth.h), the inputs and outputs of a
 * batch carried in frames instead of the shared-memory arena, and the model
 * files the worker kept from an earlier connection (sent as cached, their
 * bytes not again). workers.c calls these; nothing here calls workers.c.
 * Dispatch thread only. */

typedef struct gw_remote gw_remote_t;

/* Listens on "ADDR:PORT" (IPv4, or [IPv6]:PORT; port 0 picks one). Sets
 * *fd and the bound address ("127.0.0.1:40123") in bound. Returns 0 or a
 * negative SQ_* error with a reason in err. */
int gw_cluster_listen(const char *spec, int *fd, char *bound, size_t boundlen, char *err,
                      size_t errlen);
/* Accepts one connection from the listener: a non-blocking fd with
 * TCP_NODELAY and keep-alive, and the peer's address; -1 when none. */
int gw_cluster_accept(int listen_fd, char *addr, size_t addrlen);

/* A remote worker's state; token: squishd's (copied). */
gw_remote_t *gw_remote_new(const uint8_t *token, size_t token_len, const char *addr);
void gw_remote_free(gw_remote_t *r);
const char *gw_remote_addr(const gw_remote_t *r);
/* The model files (sha256 hex) the worker said it holds (MODELS_HELD at
 * its handshake); *n of them, borrowed. */
const char (*gw_remote_held(const gw_remote_t *r, int *n))[65];

/* A frame before HELLO: the authentication and MODELS_HELD. Returns 0 when
 * handled (answers go out on c), 1 for the HELLO of an authenticated
 * worker, 2 for the FE_HELLO of an authenticated frontend, or a negative
 * SQ_* error when the peer is refused (reason in why: the caller sends
 * ERROR, logs and closes). */
int gw_remote_before_hello(gw_remote_t *r, sq_conn_t *c, const sq_frame_t *f, char *why,
                           size_t whylen);

/* The link's send for a remote worker: a batch's regions go along in
 * BATCH_INPUT frames (read from arena); other frames as they are (a model
 * file the worker holds is sent as cached by the dispatcher, which knows it
 * from the transport's held event). Returns 0 or a negative errno or SQ_*
 * error. */
int gw_remote_send(gw_remote_t *r, sq_conn_t *c, int worker, const uint8_t *arena,
                   size_t arena_size, uint16_t type, uint64_t id, const void *payload, uint32_t len,
                   const gw_region_t *regions, int nregions);

/* A frame from an authenticated remote worker: BATCH_OUTPUT is written
 * into the arena at the batch's output region (0: consumed); BATCH_DONE is
 * checked against what came (1: hand it to the dispatcher, which reads the
 * outputs from the arena as for a local worker); anything else: 1. A
 * negative SQ_PROTOCOL drops the worker. */
int gw_remote_on_frame(gw_remote_t *r, const sq_frame_t *f, uint8_t *arena, size_t arena_size);

/* The workers' link (workers.c), on the dispatch thread: the worker
 * socket, handshakes, heartbeats, supervision of the workers squishd
 * spawns; it implements gw_link.h for the dispatcher. */
/* The link's settings, copied once from gw_config_t (and the worker
 * socket's path, which server.c decides) by server.c. */
typedef struct {
    char socket_path[108];    /* the UNIX socket workers connect to */
    char listen_host[64];     /* HTTP's host, told to frontends */
    char worker_bin[256];     /* "" = beside squishd, then the build tree */
    char cluster_listen[128]; /* "" = no cluster listener */
    char cluster_token_file[256];
    char cluster_tls_cert[256]; /* "" = no TLS */
    char cluster_tls_key[256];
    char cluster_tls_ca[256];
    char worker_data_listen[128]; /* HOST the workers squishd spawns take frontends' rows on */
    sq_log_level_t log_level;     /* the workers squishd spawns log at it */
    int ngroups;
    gw_worker_group_t groups[GW_MAX_WORKER_GROUPS];
    int heartbeat_ms;
    int heartbeat_timeout_ms;
    int restart_backoff_ms;
    int restart_backoff_max_ms;
    int emu_memory_mb;
} gw_workers_config_t;

/* What the link needs, given once at gw_workers_start (server.c fills it):
 * its settings, the loop it runs, whom it tells, the handles it uses, and
 * the slots it reads or publishes in. */
typedef struct {
    gw_workers_config_t cfg;
    sq_loop_t *loop; /* the dispatch loop, run on the link's thread */
    const gw_transport_events_t *ev;
    void *ev_ctx;
    sq_shm_arena_t *arena;
    gw_metrics_t *metrics;
    const atomic_int *http_port; /* the port HTTP listens on, once bound (told to frontends) */
    /* Where the link publishes itself for the dispatcher (the server's
     * transport slot): set before its thread starts, cleared when freed. */
    gw_transport_t **transport;
} gw_workers_deps_t;

/* gw_workers_start binds the socket (refusing to steal a live one), spawns
 * the configured workers and runs the loop on a thread of its own; the
 * link in *out and in *deps->transport, and events go to ev with ev_ctx. */
int gw_workers_start(const gw_workers_deps_t *deps, gw_workers_t **out, char *err, size_t errlen);
/* Answers every request still queued in the dispatcher (503 shutting
 * down) and waits until that is done; accepts NULL. */
void gw_workers_abort(gw_workers_t *ws);
/* Asks workers to exit, waits for them (SIGKILL after a grace period) and
 * joins the thread. The dispatch loop stays (the DB thread may still post
 * to it): gw_workers_free, after gw_db_stop, runs what was posted. Both
 * accept NULL. */
void gw_workers_stop(gw_workers_t *ws);
void gw_workers_free(gw_workers_t *ws);

#endif
