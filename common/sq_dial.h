/* The dialing side of a cluster connection: a TCP connection within a
 * timeout, a frame read with a deadline, and the authentication of
 * sq_auth.h as the side that dials (a frontend joining the dispatcher, a
 * frontend opening a worker's data address). Blocking, on a connection
 * that is not yet watched by a loop. */
#ifndef SQ_DIAL_H
#define SQ_DIAL_H

#include "sq_ipc.h"

#include <stddef.h>
#include <stdint.h>

/* A non-blocking TCP connection to "host:port" ("[v6]:port"), with
 * TCP_NODELAY and keep-alive, within timeout_ms; -errno on failure. */
int sq_dial_tcp(const char *addr, int timeout_ms);

/* A listening non-blocking TCP socket on "ADDR:PORT" ("[v6]:PORT"; a
 * numeric address, port 0 picks one), SO_REUSEADDR; the bound address
 * ("127.0.0.1:40123", "[::1]:40123") in bound. The fd, or -1 with err
 * saying why (the spec named). The cluster listener and the workers'
 * data listener. */
int sq_listen_tcp(const char *spec, char *bound, size_t boundlen, char *err, size_t errlen);

/* The next whole frame of c within timeout_ms, flushing what c has queued
 * meanwhile: 1, or a negative errno (-ETIMEDOUT, -ECONNRESET) or
 * SQ_PROTOCOL. The frame is valid until c is read again. */
int sq_conn_read_frame(sq_conn_t *c, sq_frame_t *f, int timeout_ms);

/* The dialing side's authentication on c (AUTH_CHALLENGE, AUTH_REPLY,
 * AUTH_PROOF) with token: 0 when done (the listener may still refuse what
 * comes next), SQ_UNAUTHORIZED when either side refused the other (why
 * says which and why: a wrong token does not fix itself), or another
 * negative error. */
int sq_dial_auth(sq_conn_t *c, const uint8_t *token, size_t token_len, int timeout_ms, char *why,
                 size_t whylen);

#endif
