/* libFuzzer target for what squishd and a remote worker do with bytes from
 * a TCP peer they must not trust (common/auth.c, gateway/cluster.c): the
 * authentication messages and the frames of a remote link.
 *
 * Input: byte 0 picks the path, the rest is the byte stream.
 *   0: the stream is cut into frames (sq_frame_decode) and squishd's side of
 *      a connection gets them before HELLO (gw_remote_before_hello): the
 *      challenge, the proof, MODELS_HELD, anything out of order. The nonce
 *      is random, so no proof ever verifies: what is checked is that no
 *      input crashes it or authenticates it.
 *   1: squishd has sent a batch of 3 items (BATCH_INPUT, BATCH); the frames
 *      go to gw_remote_on_frame (BATCH_OUTPUT into a fake arena at the
 *      batch's output region, BATCH_DONE checked against what came). A write
 *      outside the region is an ASan report; a BATCH_DONE it accepts for a
 *      batch whose outputs did not all come is an abort.
 *   2: the pure handshake with fixed nonces: the stream's first 39 bytes as
 *      a challenge to squishd, the next 64 as a reply to a worker, the next
 *      32 as a proof. Only the genuine messages may pass. */
#include "gw_link.h"

#include <sq.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ARENA_BYTES 65536
#define OUT_OFF 4096
#define OUT_STRIDE 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char TOKEN[] = "fuzz-cluster-token";

static void before_hello(const uint8_t *p, size_t n)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        abort();
    sq_conn_t c;
    sq_conn_init(&c, sv[0]);
    gw_remote_t *r = gw_remote_new((const uint8_t *)TOKEN, sizeof(TOKEN) - 1, "fuzz");
    size_t off = 0;
    for (;;) {
        sq_frame_t f;
        size_t used = 0;
        if (sq_frame_decode(p + off, n - off, &f, &used) != 1)
            break;
        off += used;
        char why[300];
        int rc = gw_remote_before_hello(r, &c, &f, why, sizeof(why));
        if (rc < 0)
            break;
        if (rc == 1) /* a HELLO past authentication: impossible without the nonce */
            abort();
    }
    gw_remote_free(r);
    sq_conn_dispose(&c);
    close(sv[1]);
}

static void batch_frames(const uint8_t *p, size_t n)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        abort();
    sq_conn_t c;
    sq_conn_init(&c, sv[0]);
    gw_remote_t *r = gw_remote_new((const uint8_t *)TOKEN, sizeof(TOKEN) - 1, "fuzz");
    uint8_t *arena = calloc(1, ARENA_BYTES);
    sq_batch_t *b = calloc(1, sizeof(*b));
    if (arena == NULL || b == NULL)
        abort();
    b->model_key = 1;
    b->count = 3;
    b->out_off = OUT_OFF;
    b->out_stride = OUT_STRIDE;
    gw_region_t regions[3];
    for (int i = 0; i < 3; i++) {
        b->in_off[i] = (uint64_t)(i * 100);
        regions[i] = (gw_region_t){.offset = b->in_off[i], .bytes = 48};
    }
    sq_buf_t enc;
    sq_buf_init(&enc);
    sq_batch_encode(&enc, b);
    if (gw_remote_send(r, &c, 0, arena, ARENA_BYTES, SQ_MSG_BATCH, 7, enc.data, (uint32_t)enc.len,
                       regions, 3) != 0)
        abort();
    uint64_t got = 0;
    size_t off = 0;
    for (;;) {
        sq_frame_t f;
        size_t used = 0;
        if (sq_frame_decode(p + off, n - off, &f, &used) != 1)
            break;
        off += used;
        int rc = gw_remote_on_frame(r, &f, arena, ARENA_BYTES);
        if (rc < 0)
            break;
        if (f.type == SQ_MSG_BATCH_OUTPUT && f.id == 7 && rc == 0)
            got += f.len;
        if (f.type == SQ_MSG_BATCH_DONE && f.id == 7 && rc == 1) {
            sq_batch_done_t done;
            if (sq_batch_done_decode(&f, &done) != 0 || (done.code == 0 && got != 3 * OUT_STRIDE))
                abort();
            break;
        }
    }
    sq_buf_dispose(&enc);
    free(b);
    free(arena);
    gw_remote_free(r);
    sq_conn_dispose(&c);
    close(sv[1]);
}

static void handshake(const uint8_t *p, size_t n)
{
    uint8_t nw[SQ_AUTH_NONCE_BYTES], ng[SQ_AUTH_NONCE_BYTES];
    memset(nw, 0x11, sizeof(nw));
    memset(ng, 0x22, sizeof(ng));
    sq_auth_t w, g;
    sq_buf_t genuine_c, genuine_r, genuine_p, out;
    sq_buf_init(&genuine_c);
    sq_buf_init(&genuine_r);
    sq_buf_init(&genuine_p);
    sq_buf_init(&out);
    /* The genuine transcript, to tell a forged pass from a real one. */
    sq_auth_init(&w, SQ_AUTH_WORKER, TOKEN, sizeof(TOKEN) - 1, nw);
    sq_auth_init(&g, SQ_AUTH_GATEWAY, TOKEN, sizeof(TOKEN) - 1, ng);
    sq_auth_challenge(&w, &genuine_c);
    if (sq_auth_on_challenge(&g, genuine_c.data, genuine_c.len, &genuine_r) != 0 ||
        sq_auth_on_reply(&w, genuine_r.data, genuine_r.len, &genuine_p) != 0 ||
        sq_auth_on_proof(&g, genuine_p.data, genuine_p.len) != 0)
        abort();

    size_t cl = n < 39 ? n : 39;
    size_t rl = n - cl < 64 ? n - cl : 64;
    size_t pl = n - cl - rl < 32 ? n - cl - rl : 32;
    const uint8_t *cp = p, *rp = p + cl, *pp = p + cl + rl;
    sq_auth_init(&g, SQ_AUTH_GATEWAY, TOKEN, sizeof(TOKEN) - 1, ng);
    if (sq_auth_on_challenge(&g, cp, cl, &out) == 0 && sq_auth_on_proof(&g, pp, pl) == 0) {
        /* squishd accepted: the proof must be the genuine one for the nonce
         * the challenge carried, which only the token's holder can make. */
        sq_auth_t w2;
        sq_buf_t r2, p2;
        sq_buf_init(&r2);
        sq_buf_init(&p2);
        sq_auth_init(&w2, SQ_AUTH_WORKER, TOKEN, sizeof(TOKEN) - 1, cp + 7);
        sq_auth_challenge(&w2, &r2);
        if (sq_auth_on_reply(&w2, out.data, out.len, &p2) != 0 || p2.len != pl ||
            memcmp(p2.data, pp, pl) != 0)
            abort();
        sq_buf_dispose(&r2);
        sq_buf_dispose(&p2);
    }
    out.len = 0;
    sq_auth_init(&w, SQ_AUTH_WORKER, TOKEN, sizeof(TOKEN) - 1, nw);
    sq_auth_challenge(&w, &out);
    out.len = 0;
    if (sq_auth_on_reply(&w, rp, rl, &out) == 0 &&
        (rl != genuine_r.len || memcmp(rp, genuine_r.data, rl) != 0))
        abort(); /* a forged reply passed */
    sq_auth_wipe(&w);
    sq_auth_wipe(&g);
    sq_buf_dispose(&genuine_c);
    sq_buf_dispose(&genuine_r);
    sq_buf_dispose(&genuine_p);
    sq_buf_dispose(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    sq_log_set_level(SQ_LOG_OFF);
    switch (data[0] % 3) {
    case 0:
        before_hello(data + 1, size - 1);
        break;
    case 1:
        batch_frames(data + 1, size - 1);
        break;
    default:
        handshake(data + 1, size - 1);
        break;
    }
    return 0;
}
