/* The dialing side of a cluster connection: a TCP connection within a
 * timeout, a frame read with a deadline, and the authentication of
 * sq_auth.h as the side that dials (a frontend joining the dispatcher, a
 * frontend opening a worker's data address). Blocking, on a connection
 * that is not yet watched by a loop. */
#ifndef SQ_DIAL_H
#define SQ_DIAL_H

#include "sq_ipc.h"
#include "sq_tls.h"

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
 * comes next), SQ_UNAUTHORIZED when either side refused the other for the
 * token (why says which and why: a wrong token does not fix itself), or
 * another negative error (SQ_PROTOCOL: the listener refused for another
 * reason). */
int sq_dial_auth(sq_conn_t *c, const uint8_t *token, size_t token_len, int timeout_ms, char *why,
                 size_t whylen);

/* How far sq_dial_open got: the step that failed. */
typedef enum {
    SQ_DIAL_OK = 0,
    SQ_DIAL_CONNECT, /* no TCP connection */
    SQ_DIAL_TLS,     /* TLS could not be put on it */
    SQ_DIAL_AUTH,    /* this side refused the listener, or no answer */
    SQ_DIAL_REFUSED, /* the listener refused this side (its ERROR) */
} sq_dial_step_t;

typedef struct {
    sq_tls_t *tls; /* NULL: plain TCP */
    const uint8_t *token;
    size_t token_len;
    int dial_timeout_ms; /* sq_dial_tcp's */
    int auth_timeout_ms; /* sq_dial_auth's */
} sq_dial_opts_t;

/* The dialing side's way in, one for every link that dials (a remote
 * worker joining squishd, a frontend joining its dispatcher or opening a
 * worker's data address): a TCP connection to addr (sq_dial_tcp; fd >= 0:
 * one already connected, e.g. a local socket, used instead), TLS on it
 * when o->tls is set (the listener's certificate must name addr's host),
 * then the authentication with o->token (sq_dial_auth). 0 with c open and
 * authenticated, nothing read past it; otherwise a negative error (-errno
 * for a TCP connection that failed, SQ_IO for TLS, sq_dial_auth's), c
 * disposed (fd too), *failed (when not NULL) the step and why why. */
int sq_dial_open(sq_conn_t *c, const char *addr, int fd, const sq_dial_opts_t *o,
                 sq_dial_step_t *failed, char *why, size_t whylen);

#endif
