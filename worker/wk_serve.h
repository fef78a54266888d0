/* The worker's serving side: the connection to squishd (an I/O thread that
 * answers heartbeats at once) and the execution thread that loads models,
 * runs batches and profiles, one at a time, in arrival order, so that two
 * models never interleave on the device. */
#ifndef WK_SERVE_H
#define WK_SERVE_H

#include "wk.h"

#include <sq.h>

#define WK_KEPT_MODELS_MS 60000

typedef struct {
    wk_device_t dev;
    int threads;     /* cpu kernel threads; 0 = all cores */
    int fd;          /* connected socket, past the handshake */
    sq_conn_t *conn; /* its connection (buffers may hold frames already) */
    uint8_t *shm;
    size_t shm_bytes;
    /* A remote worker (TCP, no shared memory; fd, conn and shm unused):
     * wk_serve gets each connection from reconnect, which blocks until it
     * has one past its handshake (having sent `held`, a MODELS_HELD
     * payload, before HELLO) and sets *conn and the heartbeat period, or
     * returns 1 when the worker should stop (exit 0), -1 to give up (exit
     * 1). When a connection ends, the worker keeps its models and model
     * files and calls it again. stop_fd: readable when the worker should
     * stop (a signalfd), or -1. */
    int remote;
    int (*reconnect)(void *ctx, const sq_buf_t *held, sq_conn_t **conn, uint32_t *heartbeat_ms);
    void *reconnect_ctx;
    /* After a reconnect, models squishd loads again (same file and options)
     * are kept as they are (nothing imported or compiled again); those it
     * has not loaded within this many ms are dropped (deleted or moved away
     * while the link was down, or a squishd on another database). 0:
     * WK_KEPT_MODELS_MS. */
    int kept_models_ms;
    int stop_fd;
    /* Frontends' data connections (--data-listen; data_bound "": none):
     * data_fd, a listening non-blocking TCP socket bound to data_bound
     * ("HOST:PORT"); data_advertise, the address squishd is told instead
     * ("": data_bound, a wildcard host replaced by this end's address of
     * the connection to squishd); the token frontends must prove (as a
     * remote worker does to squishd); data_tls, a server TLS context or
     * NULL. The caller keeps these, and closes data_fd. */
    int data_fd;
    char data_bound[80];
    char data_advertise[80];
    const uint8_t *token;
    size_t token_len;
    sq_tls_t *data_tls;
} wk_serve_opts_t;

/* Runs until SHUTDOWN or EOF (a remote worker: until reconnect gives up);
 * returns the exit status (0 or 1). */
int wk_serve(const wk_serve_opts_t *opts);

#endif
