/* The worker's serving side: the connection to squishd (an I/O thread that
 * answers heartbeats at once) and the execution thread that loads models,
 * runs batches and profiles, one at a time, in arrival order, so that two
 * models never interleave on the device. */
#ifndef WK_SERVE_H
#define WK_SERVE_H

#include "wk.h"

#include <sq.h>

typedef struct {
    wk_device_t dev;
    int threads;     /* cpu kernel threads; 0 = all cores */
    int fd;          /* connected socket, past the handshake */
    sq_conn_t *conn; /* its connection (buffers may hold frames already) */
    uint8_t *shm;
    size_t shm_bytes;
} wk_serve_opts_t;

/* Runs until SHUTDOWN or EOF; returns the exit status (0 or 1). */
int wk_serve(const wk_serve_opts_t *opts);

#endif
