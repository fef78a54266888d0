/* TLS on a connection (OpenSSL), for the cluster link between squishd and
 * remote workers: non-blocking, over the same event loops, the handshake
 * happening as the connection reads and writes (sq_conn_io_t). Each side
 * presents a certificate and verifies the other's against a CA; a worker
 * also checks that squishd's certificate names the address it dialed. */
#ifndef SQ_TLS_H
#define SQ_TLS_H

#include "sq_ipc.h"

#include <stddef.h>

typedef struct sq_tls sq_tls_t;

/* A context for squishd (server != 0) or a worker: cert (PEM chain), its
 * key and the CA that the peer's certificate must chain to. Returns 0 or a
 * negative SQ_* error with OpenSSL's reason in err. */
int sq_tls_new(sq_tls_t **out, int server, const char *cert, const char *key, const char *ca,
               char *err, size_t errlen);
void sq_tls_free(sq_tls_t *t);

/* Puts TLS on c (its fd connected, nothing sent yet). host: on a worker,
 * the name or IP address squishd's certificate must carry; label: the peer
 * in log lines. Returns 0 or SQ_NOMEM / SQ_INVAL. */
int sq_tls_attach(sq_tls_t *t, sq_conn_t *c, const char *host, const char *label);

/* The verified peer's certificate subject (after the handshake), or "". */
void sq_tls_peer(const sq_conn_t *c, char *out, size_t n);

#endif
