/* Mutual authentication of a remote worker and squishd over TCP, by a
 * shared token that never crosses the wire: a challenge-response with
 * HMAC-SHA256.
 *
 *   worker  -> squishd  AUTH_CHALLENGE  magic u32 | version u16 | has_token u8 | nonce_w[32]
 *   squishd -> worker   AUTH_REPLY      nonce_g[32] | mac_g[32]
 *   worker  -> squishd  AUTH_PROOF      mac_w[32]
 *
 * mac_R = HMAC-SHA256(token, "squish-cluster-auth-v1" | 0 | R | 0 | version u16 |
 *                     nonce_w | nonce_g)
 * with R the prover's role ("gateway" or "worker"). Each side proves it
 * holds the token over a nonce the other side just drew, so a recorded
 * handshake replayed later fails, and a proof reflected back to its sender
 * fails on the role. Proofs are compared with CRYPTO_memcmp.
 *
 * Pure functions over buffers (no I/O): the links call them with frame
 * payloads, the tests and the fuzzer with anything. */
#ifndef SQ_AUTH_H
#define SQ_AUTH_H

#include "sq_buf.h"

#include <stddef.h>
#include <stdint.h>

#define SQ_AUTH_NONCE_BYTES 32
#define SQ_AUTH_MAC_BYTES 32
#define SQ_AUTH_MAX_TOKEN 1024
#define SQ_AUTH_VERSION 1

typedef enum { SQ_AUTH_WORKER = 1, SQ_AUTH_GATEWAY = 2 } sq_auth_role_t;

/* Results: 0, or why the peer is refused. */
enum {
    SQ_AUTH_OK = 0,
    SQ_AUTH_MALFORMED = -1, /* truncated, garbled, wrong magic or version */
    SQ_AUTH_BAD_PROOF = -2, /* the peer's proof does not verify: another token, or a replay */
    SQ_AUTH_NO_TOKEN = -3,  /* the peer has no token */
    SQ_AUTH_STATE = -4,     /* a message out of order */
    SQ_AUTH_NO_RANDOM = -5, /* no nonce could be drawn */
};

typedef struct {
    sq_auth_role_t role;
    int state; /* internal: which message comes next */
    uint8_t token[SQ_AUTH_MAX_TOKEN];
    size_t token_len;
    uint8_t nonce_w[SQ_AUTH_NONCE_BYTES];
    uint8_t nonce_g[SQ_AUTH_NONCE_BYTES];
} sq_auth_t;

/* Starts one side of one handshake. token may be empty (len 0) for a worker
 * that has none (squishd then refuses it, saying so); squishd must have
 * one. nonce: this side's nonce, or NULL to draw a fresh one (RAND_bytes;
 * tests and the fuzzer pass their own). Returns 0, SQ_AUTH_NO_TOKEN,
 * SQ_AUTH_MALFORMED (token too long) or SQ_AUTH_NO_RANDOM. */
int sq_auth_init(sq_auth_t *a, sq_auth_role_t role, const void *token, size_t token_len,
                 const uint8_t *nonce);
/* Erases the token and nonces. */
void sq_auth_wipe(sq_auth_t *a);

/* Worker: appends its AUTH_CHALLENGE payload to out. */
int sq_auth_challenge(sq_auth_t *a, sq_buf_t *out);
/* squishd: checks a worker's AUTH_CHALLENGE and appends the AUTH_REPLY. */
int sq_auth_on_challenge(sq_auth_t *a, const uint8_t *p, size_t n, sq_buf_t *out);
/* Worker: checks squishd's AUTH_REPLY (its proof) and appends AUTH_PROOF. */
int sq_auth_on_reply(sq_auth_t *a, const uint8_t *p, size_t n, sq_buf_t *out);
/* squishd: checks the worker's AUTH_PROOF. */
int sq_auth_on_proof(sq_auth_t *a, const uint8_t *p, size_t n);
/* Whether this side has verified the other. */
int sq_auth_done(const sq_auth_t *a);

/* "no_token", "bad_proof", ... for a result above. */
const char *sq_auth_reason(int rc);

/* Reads a token file: its bytes, less trailing whitespace; it must not be
 * empty. Returns 0 or a negative SQ_* error with a reason in err. */
int sq_auth_read_token(const char *path, uint8_t *out, size_t cap, size_t *len, char *err,
                       size_t errlen);

#endif
