#include <criterion/criterion.h>
#include <sq.h>

#include <errno.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Test certificates, made here with OpenSSL: CA "a" signs the server's
 * (for 127.0.0.1) and the client's; CA "b" signs a stranger's. */
static char dir[64];

static EVP_PKEY *key_new(void)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    cr_assert_not_null(k);
    return k;
}

static void write_pem(const char *name, EVP_PKEY *k, X509 *x)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s.key", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert(PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL));
    fclose(f);
    snprintf(path, sizeof(path), "%s/%s.pem", dir, name);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert(PEM_write_X509(f, x));
    fclose(f);
}

static X509 *cert_new(const char *cn, EVP_PKEY *k, X509 *issuer, EVP_PKEY *issuer_key,
                      const char *san)
{
    X509 *x = X509_new();
    ASN1_INTEGER_set(X509_get_serialNumber(x), (long)(random() & 0x7fffffff));
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : n);
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer ? issuer : x, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, NID_basic_constraints,
                                            issuer ? "critical,CA:FALSE" : "critical,CA:TRUE");
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    if (san != NULL) {
        e = X509V3_EXT_conf_nid(NULL, &ctx, NID_subject_alt_name, san);
        X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
    }
    cr_assert(X509_sign(x, issuer_key ? issuer_key : k, EVP_sha256()));
    return x;
}

static void make_certs(void)
{
    snprintf(dir, sizeof(dir), "/tmp/sq_test_tls_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    EVP_PKEY *ka = key_new(), *kb = key_new(), *ks = key_new(), *kc = key_new(), *kx = key_new();
    X509 *ca = cert_new("ca-a", ka, NULL, NULL, NULL);
    X509 *cb = cert_new("ca-b", kb, NULL, NULL, NULL);
    X509 *srv = cert_new("squishd", ks, ca, ka, "IP:127.0.0.1");
    X509 *cli = cert_new("worker", kc, ca, ka, "DNS:worker");
    X509 *str = cert_new("stranger", kx, cb, kb, "DNS:stranger");
    write_pem("ca-a", ka, ca);
    write_pem("ca-b", kb, cb);
    write_pem("server", ks, srv);
    write_pem("client", kc, cli);
    write_pem("stranger", kx, str);
    X509 *all[] = {ca, cb, srv, cli, str};
    EVP_PKEY *keys[] = {ka, kb, ks, kc, kx};
    for (int i = 0; i < 5; i++) {
        X509_free(all[i]);
        EVP_PKEY_free(keys[i]);
    }
}

static void remove_certs(void)
{
    const char *names[] = {"ca-a", "ca-b", "server", "client", "stranger"};
    char path[128];
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "%s/%s.pem", dir, names[i]);
        unlink(path);
        snprintf(path, sizeof(path), "%s/%s.key", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static sq_tls_t *ctx(int server, const char *name, const char *ca)
{
    char cert[128], key[128], cap[128], err[512];
    snprintf(cert, sizeof(cert), "%s/%s.pem", dir, name);
    snprintf(key, sizeof(key), "%s/%s.key", dir, name);
    snprintf(cap, sizeof(cap), "%s/%s.pem", dir, ca);
    sq_tls_t *t = NULL;
    int rc = sq_tls_new(&t, server, cert, key, cap, err, sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    return t;
}

/* Moves bytes both ways until `want` frames came to b (or either side
 * fails); returns the frames seen, or -1 on a failure. */
static int pump(sq_conn_t *a, sq_conn_t *b, sq_buf_t *got, int want)
{
    int frames = 0;
    for (int round = 0; round < 20000 && frames < want; round++) {
        if (sq_conn_flush(a) < 0 || sq_conn_flush(b) < 0)
            return -1;
        int ra = sq_conn_read(a), rb = sq_conn_read(b);
        if ((ra < 0 && ra != -EAGAIN) || ra == 0 || (rb < 0 && rb != -EAGAIN) || rb == 0)
            return -1;
        sq_frame_t f;
        int rc;
        while ((rc = sq_conn_next(b, &f)) == 1) {
            sq_buf_put(got, f.payload, f.len);
            frames++;
        }
        if (rc < 0)
            return -1;
    }
    return frames;
}

Test(tls, frames_cross_both_ways_verified, .init = make_certs, .fini = remove_certs)
{
    sq_tls_t *s = ctx(1, "server", "ca-a"), *c = ctx(0, "client", "ca-a");
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    sq_conn_t cs, cc;
    sq_conn_init(&cs, sv[0]);
    sq_conn_init(&cc, sv[1]);
    cr_assert_eq(sq_tls_attach(s, &cs, NULL, "client"), 0);
    cr_assert_eq(sq_tls_attach(c, &cc, "127.0.0.1", "server"), 0);
    /* A frame larger than the socket buffer and TLS records: partial writes. */
    size_t n = 5u << 20;
    uint8_t *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i * 131 + 7);
    cr_assert_eq(sq_conn_send(&cc, SQ_MSG_BATCH_INPUT, 1, big, (uint32_t)n), 0);
    cr_assert_eq(sq_conn_send(&cc, SQ_MSG_PING, 2, "x", 1), 0);
    sq_buf_t got;
    sq_buf_init(&got);
    cr_assert_eq(pump(&cc, &cs, &got, 2), 2);
    cr_assert_eq(got.len, n + 1);
    cr_assert_eq(memcmp(got.data, big, n), 0);
    char subject[128];
    sq_tls_peer(&cs, subject, sizeof(subject));
    cr_assert_str_eq(subject, "/CN=worker");
    /* And back. */
    got.len = 0;
    cr_assert_eq(sq_conn_send(&cs, SQ_MSG_PONG, 3, "pong", 4), 0);
    cr_assert_eq(pump(&cs, &cc, &got, 1), 1);
    cr_assert_eq(memcmp(got.data, "pong", 4), 0);
    /* A plain UNIX connection has no peer certificate. */
    sq_conn_t plain;
    sq_conn_init(&plain, -1);
    sq_tls_peer(&plain, subject, sizeof(subject));
    cr_assert_str_eq(subject, "");
    sq_buf_dispose(&got);
    free(big);
    sq_conn_dispose(&cs);
    sq_conn_dispose(&cc);
    sq_tls_free(s);
    sq_tls_free(c);
}

static int handshake_fails(const char *srv_name, const char *srv_ca, const char *cli_name,
                           const char *cli_ca, const char *host)
{
    sq_log_set_level(SQ_LOG_OFF);
    sq_tls_t *s = ctx(1, srv_name, srv_ca), *c = ctx(0, cli_name, cli_ca);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    sq_conn_t cs, cc;
    sq_conn_init(&cs, sv[0]);
    sq_conn_init(&cc, sv[1]);
    cr_assert_eq(sq_tls_attach(s, &cs, NULL, "client"), 0);
    cr_assert_eq(sq_tls_attach(c, &cc, host, "server"), 0);
    cr_assert_eq(sq_conn_send(&cc, SQ_MSG_PING, 1, "x", 1), 0);
    sq_buf_t got;
    sq_buf_init(&got);
    int rc = pump(&cc, &cs, &got, 1);
    sq_buf_dispose(&got);
    sq_conn_dispose(&cs);
    sq_conn_dispose(&cc);
    sq_tls_free(s);
    sq_tls_free(c);
    return rc < 0;
}

Test(tls, a_stranger_is_refused, .init = make_certs, .fini = remove_certs)
{
    /* A client certificate another CA signed. */
    cr_assert(handshake_fails("server", "ca-a", "stranger", "ca-a", "127.0.0.1"));
    /* A client that trusts another CA than the server's. */
    cr_assert(handshake_fails("server", "ca-a", "client", "ca-b", "127.0.0.1"));
    /* A server certificate for another address than the one dialed. */
    cr_assert(handshake_fails("server", "ca-a", "client", "ca-a", "10.1.2.3"));
    cr_assert(handshake_fails("server", "ca-a", "client", "ca-a", "squishd.example"));
}

Test(tls, bad_files_are_refused_with_a_reason)
{
    sq_tls_t *t = NULL;
    char err[512];
    cr_assert_eq(sq_tls_new(&t, 1, "/nonexistent.pem", "/nonexistent.key", "/nonexistent-ca.pem",
                            err, sizeof(err)),
                 SQ_BAD_CONFIG);
    cr_assert_null(t);
    cr_assert_not_null(strstr(err, "/nonexistent.pem"), "%s", err);
}
