#include "sq_tls.h"
#include "sq_alloc.h"
#include "sq_error.h"
#include "sq_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sq_tls {
    SSL_CTX *ctx;
    int server;
};

typedef struct {
    SSL *ssl;
    int want_write;
    int failed;
    char label[64];
} tls_io_t;

static void ssl_reason(char *err, size_t errlen, const char *what)
{
    unsigned long e = ERR_get_error();
    char buf[256] = "unknown error";
    if (e != 0)
        ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    snprintf(err, errlen, "%s: %s", what, buf);
}

int sq_tls_new(sq_tls_t **out, int server, const char *cert, const char *key, const char *ca,
               char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (ctx == NULL) {
        ssl_reason(err, errlen, "SSL_CTX_new");
        return SQ_NOMEM;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* A connection's output buffer moves and grows between retries. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    if (server)
        SSL_CTX_set_num_tickets(ctx, 0);
    char what[320];
    int rc = 0;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(what, sizeof(what), "certificate %s", cert);
        rc = SQ_BAD_CONFIG;
    } else if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(what, sizeof(what), "key %s", key);
        rc = SQ_BAD_CONFIG;
    } else if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(what, sizeof(what), "key %s does not match certificate %s", key, cert);
        rc = SQ_BAD_CONFIG;
    } else if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
        snprintf(what, sizeof(what), "CA %s", ca);
        rc = SQ_BAD_CONFIG;
    }
    if (rc != 0) {
        ssl_reason(err, errlen, what);
        SSL_CTX_free(ctx);
        return rc;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), NULL);
    sq_tls_t *t = sq_xcalloc(1, sizeof(*t));
    t->ctx = ctx;
    t->server = server;
    *out = t;
    return 0;
}

void sq_tls_free(sq_tls_t *t)
{
    if (t == NULL)
        return;
    SSL_CTX_free(t->ctx);
    free(t);
}

/* After an SSL call returned r <= 0: 0 with errno EAGAIN (wait), -2 at a
 * clean close, -1 on an error (logged). */
static int outcome(tls_io_t *t, int r)
{
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ) {
        t->want_write = 0;
        errno = EAGAIN;
        return 0;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
        t->want_write = 1;
        errno = EAGAIN;
        return 0;
    }
    t->want_write = 0;
    if (e == SSL_ERROR_ZERO_RETURN)
        return -2;
    if (!t->failed) {
        t->failed = 1;
        char why[300];
        if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
            snprintf(why, sizeof(why), "%s", errno != 0 ? strerror(errno) : "connection closed");
        } else {
            ssl_reason(why, sizeof(why), "TLS");
            long v = SSL_get_verify_result(t->ssl);
            if (v != X509_V_OK) {
                size_t n = strlen(why);
                snprintf(why + n, sizeof(why) - n, " (certificate: %s)",
                         X509_verify_cert_error_string(v));
            }
        }
        SQ_WARN("TLS failed peer=%s reason=\"%s\"", t->label, why);
    }
    ERR_clear_error();
    errno = ECONNRESET;
    return -1;
}

/* Drives the handshake: 1 once done, else as outcome(). */
static int handshake(tls_io_t *t)
{
    if (SSL_is_init_finished(t->ssl))
        return 1;
    int r = SSL_do_handshake(t->ssl);
    if (r == 1) {
        t->want_write = 0;
        return 1;
    }
    return outcome(t, r);
}

static ssize_t io_read(void *ctx, void *buf, size_t len)
{
    tls_io_t *t = ctx;
    int h = handshake(t);
    if (h <= 0)
        return h == -2 ? 0 : -1;
    size_t total = 0;
    while (total < len) {
        size_t n = 0;
        int r = SSL_read_ex(t->ssl, (char *)buf + total, len - total, &n);
        if (r == 1) {
            total += n;
            continue;
        }
        int o = outcome(t, 0);
        if (total > 0)
            return (ssize_t)total;
        return o == -2 ? 0 : -1;
    }
    return (ssize_t)total;
}

static ssize_t io_writev(void *ctx, const struct iovec *iov, int n)
{
    tls_io_t *t = ctx;
    int h = handshake(t);
    if (h <= 0) {
        if (h == -2)
            errno = EPIPE;
        return -1;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len == 0)
            continue;
        size_t w = 0;
        int r = SSL_write_ex(t->ssl, iov[i].iov_base, iov[i].iov_len, &w);
        if (r == 1) {
            total += w;
            if (w < iov[i].iov_len)
                break;
            continue;
        }
        int o = outcome(t, 0);
        if (total > 0)
            return (ssize_t)total;
        if (o == -2)
            errno = EPIPE;
        return -1;
    }
    return (ssize_t)total;
}

static int io_want_write(const void *ctx)
{
    const tls_io_t *t = ctx;
    return t->want_write;
}

static void io_free(void *ctx)
{
    tls_io_t *t = ctx;
    SSL_free(t->ssl);
    free(t);
}

static const sq_conn_io_t tls_io = {
    .read = io_read, .writev = io_writev, .want_write = io_want_write, .free = io_free};

int sq_tls_attach(sq_tls_t *tls, sq_conn_t *c, const char *host, const char *label)
{
    SSL *ssl = SSL_new(tls->ctx);
    if (ssl == NULL || SSL_set_fd(ssl, c->fd) != 1) {
        SSL_free(ssl);
        return SQ_NOMEM;
    }
    if (tls->server) {
        SSL_set_accept_state(ssl);
    } else {
        SSL_set_connect_state(ssl);
        if (host != NULL) {
            /* squishd's certificate must name what the worker dialed. */
            X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
            unsigned char ip[16];
            int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
            int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, host)
                           : X509_VERIFY_PARAM_set1_host(vp, host, 0);
            if (!is_ip)
                SSL_set_tlsext_host_name(ssl, host);
            if (ok != 1) {
                SSL_free(ssl);
                return SQ_INVAL;
            }
        }
    }
    tls_io_t *t = sq_xcalloc(1, sizeof(*t));
    t->ssl = ssl;
    snprintf(t->label, sizeof(t->label), "%s", label != NULL ? label : "?");
    c->io = &tls_io;
    c->io_ctx = t;
    return 0;
}

void sq_tls_peer(const sq_conn_t *c, char *out, size_t n)
{
    if (n > 0)
        out[0] = '\0';
    if (c->io != &tls_io || n == 0)
        return;
    const tls_io_t *t = c->io_ctx;
    X509 *cert = SSL_get1_peer_certificate(t->ssl);
    if (cert == NULL)
        return;
    X509_NAME_oneline(X509_get_subject_name(cert), out, (int)n);
    X509_free(cert);
}
