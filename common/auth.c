#include "sq_auth.h"
#include "sq_error.h"
#include "sq_ipc.h"
#include "sq_log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char LABEL[] = "squish-cluster-auth-v1";

enum { ST_START, ST_WAIT_REPLY, ST_WAIT_PROOF, ST_DONE, ST_FAILED };

#define CHALLENGE_BYTES (4 + 2 + 1 + SQ_AUTH_NONCE_BYTES)
#define REPLY_BYTES (SQ_AUTH_NONCE_BYTES + SQ_AUTH_MAC_BYTES)

int sq_auth_init(sq_auth_t *a, sq_auth_role_t role, const void *token, size_t token_len,
                 const uint8_t *nonce)
{
    memset(a, 0, sizeof(*a));
    a->role = role;
    a->state = ST_FAILED;
    if (token_len > SQ_AUTH_MAX_TOKEN)
        return SQ_AUTH_MALFORMED;
    if (role == SQ_AUTH_GATEWAY && token_len == 0)
        return SQ_AUTH_NO_TOKEN;
    if (token_len > 0)
        memcpy(a->token, token, token_len);
    a->token_len = token_len;
    uint8_t *own = role == SQ_AUTH_WORKER ? a->nonce_w : a->nonce_g;
    if (nonce != NULL)
        memcpy(own, nonce, SQ_AUTH_NONCE_BYTES);
    else if (RAND_bytes(own, SQ_AUTH_NONCE_BYTES) != 1)
        return SQ_AUTH_NO_RANDOM;
    a->state = ST_START;
    return 0;
}

void sq_auth_wipe(sq_auth_t *a)
{
    OPENSSL_cleanse(a, sizeof(*a));
}

/* The proof of `role` over both nonces. */
static int mac(const sq_auth_t *a, sq_auth_role_t role, uint8_t out[SQ_AUTH_MAC_BYTES])
{
    const char *who = role == SQ_AUTH_GATEWAY ? "gateway" : "worker";
    uint8_t msg[sizeof(LABEL) + 16 + 2 + 2 * SQ_AUTH_NONCE_BYTES];
    size_t n = 0;
    memcpy(msg, LABEL, sizeof(LABEL)); /* with its NUL */
    n += sizeof(LABEL);
    size_t wl = strlen(who) + 1;
    memcpy(msg + n, who, wl);
    n += wl;
    sq_put_le16(msg + n, SQ_AUTH_VERSION);
    n += 2;
    memcpy(msg + n, a->nonce_w, SQ_AUTH_NONCE_BYTES);
    n += SQ_AUTH_NONCE_BYTES;
    memcpy(msg + n, a->nonce_g, SQ_AUTH_NONCE_BYTES);
    n += SQ_AUTH_NONCE_BYTES;
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), a->token, (int)a->token_len, msg, n, out, &len) == NULL ||
        len != SQ_AUTH_MAC_BYTES)
        return SQ_AUTH_NO_RANDOM;
    return 0;
}

static int fail(sq_auth_t *a, int rc)
{
    a->state = ST_FAILED;
    return rc;
}

int sq_auth_challenge(sq_auth_t *a, sq_buf_t *out)
{
    if (a->role != SQ_AUTH_WORKER || a->state != ST_START)
        return fail(a, SQ_AUTH_STATE);
    sq_buf_put_u32(out, SQ_IPC_MAGIC);
    sq_buf_put_u16(out, SQ_AUTH_VERSION);
    sq_buf_put_u8(out, a->token_len > 0);
    sq_buf_put(out, a->nonce_w, SQ_AUTH_NONCE_BYTES);
    a->state = ST_WAIT_REPLY;
    return 0;
}

int sq_auth_on_challenge(sq_auth_t *a, const uint8_t *p, size_t n, sq_buf_t *out)
{
    if (a->role != SQ_AUTH_GATEWAY || a->state != ST_START)
        return fail(a, SQ_AUTH_STATE);
    if (n != CHALLENGE_BYTES || sq_le32(p) != SQ_IPC_MAGIC || sq_le16(p + 4) != SQ_AUTH_VERSION ||
        p[6] > 1)
        return fail(a, SQ_AUTH_MALFORMED);
    if (p[6] == 0)
        return fail(a, SQ_AUTH_NO_TOKEN);
    memcpy(a->nonce_w, p + 7, SQ_AUTH_NONCE_BYTES);
    uint8_t m[SQ_AUTH_MAC_BYTES];
    if (mac(a, SQ_AUTH_GATEWAY, m) != 0)
        return fail(a, SQ_AUTH_NO_RANDOM);
    sq_buf_put(out, a->nonce_g, SQ_AUTH_NONCE_BYTES);
    sq_buf_put(out, m, SQ_AUTH_MAC_BYTES);
    a->state = ST_WAIT_PROOF;
    return 0;
}

int sq_auth_on_reply(sq_auth_t *a, const uint8_t *p, size_t n, sq_buf_t *out)
{
    if (a->role != SQ_AUTH_WORKER || a->state != ST_WAIT_REPLY)
        return fail(a, SQ_AUTH_STATE);
    if (n != REPLY_BYTES)
        return fail(a, SQ_AUTH_MALFORMED);
    if (a->token_len == 0)
        return fail(a, SQ_AUTH_NO_TOKEN);
    memcpy(a->nonce_g, p, SQ_AUTH_NONCE_BYTES);
    uint8_t want[SQ_AUTH_MAC_BYTES], m[SQ_AUTH_MAC_BYTES];
    if (mac(a, SQ_AUTH_GATEWAY, want) != 0)
        return fail(a, SQ_AUTH_NO_RANDOM);
    if (CRYPTO_memcmp(want, p + SQ_AUTH_NONCE_BYTES, SQ_AUTH_MAC_BYTES) != 0)
        return fail(a, SQ_AUTH_BAD_PROOF);
    if (mac(a, SQ_AUTH_WORKER, m) != 0)
        return fail(a, SQ_AUTH_NO_RANDOM);
    sq_buf_put(out, m, SQ_AUTH_MAC_BYTES);
    a->state = ST_DONE;
    return 0;
}

int sq_auth_on_proof(sq_auth_t *a, const uint8_t *p, size_t n)
{
    if (a->role != SQ_AUTH_GATEWAY || a->state != ST_WAIT_PROOF)
        return fail(a, SQ_AUTH_STATE);
    if (n != SQ_AUTH_MAC_BYTES)
        return fail(a, SQ_AUTH_MALFORMED);
    uint8_t want[SQ_AUTH_MAC_BYTES];
    if (mac(a, SQ_AUTH_WORKER, want) != 0)
        return fail(a, SQ_AUTH_NO_RANDOM);
    if (CRYPTO_memcmp(want, p, SQ_AUTH_MAC_BYTES) != 0)
        return fail(a, SQ_AUTH_BAD_PROOF);
    a->state = ST_DONE;
    return 0;
}

int sq_auth_done(const sq_auth_t *a)
{
    return a->state == ST_DONE;
}

const char *sq_auth_reason(int rc)
{
    switch (rc) {
    case SQ_AUTH_OK:
        return "ok";
    case SQ_AUTH_MALFORMED:
        return "malformed";
    case SQ_AUTH_BAD_PROOF:
        return "bad_proof";
    case SQ_AUTH_NO_TOKEN:
        return "no_token";
    case SQ_AUTH_STATE:
        return "out_of_order";
    case SQ_AUTH_NO_RANDOM:
        return "no_random";
    }
    return "unknown";
}

int sq_auth_read_token(const char *path, uint8_t *out, size_t cap, size_t *len, char *err,
                       size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return SQ_IO;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & 077) != 0)
        SQ_WARN("token file readable by others (chmod 600 it) path=%s", path);
    size_t n = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            char extra;
            if (read(fd, &extra, 1) > 0) {
                snprintf(err, errlen, "%s: token longer than %zu bytes", path, cap);
                rc = SQ_BAD_CONFIG;
            }
            break;
        }
        ssize_t r = read(fd, out + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            rc = SQ_IO;
            break;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    while (n > 0 &&
           (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' ' || out[n - 1] == '\t'))
        n--;
    if (rc == 0 && n == 0) {
        snprintf(err, errlen, "%s: empty token", path);
        rc = SQ_BAD_CONFIG;
    }
    if (rc != 0)
        OPENSSL_cleanse(out, cap);
    *len = rc == 0 ? n : 0;
    return rc;
}
