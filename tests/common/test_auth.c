#include <criterion/criterion.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char TOKEN[] = "correct horse battery staple";

/* One whole handshake between a worker holding wtok and squishd holding
 * gtok; returns the first refusal (or 0) and which side saw it. */
static int handshake(const char *wtok, const char *gtok, int *refused_by)
{
    sq_auth_t w, g;
    sq_buf_t c, r, p;
    sq_buf_init(&c);
    sq_buf_init(&r);
    sq_buf_init(&p);
    *refused_by = 0;
    cr_assert_eq(sq_auth_init(&w, SQ_AUTH_WORKER, wtok, strlen(wtok), NULL), 0);
    cr_assert_eq(sq_auth_init(&g, SQ_AUTH_GATEWAY, gtok, strlen(gtok), NULL), 0);
    int rc = sq_auth_challenge(&w, &c);
    cr_assert_eq(rc, 0);
    if ((rc = sq_auth_on_challenge(&g, c.data, c.len, &r)) != 0) {
        *refused_by = 'g';
        goto out;
    }
    if ((rc = sq_auth_on_reply(&w, r.data, r.len, &p)) != 0) {
        *refused_by = 'w';
        goto out;
    }
    if ((rc = sq_auth_on_proof(&g, p.data, p.len)) != 0) {
        *refused_by = 'g';
        goto out;
    }
    cr_assert(sq_auth_done(&w));
    cr_assert(sq_auth_done(&g));
out:
    sq_auth_wipe(&w);
    sq_auth_wipe(&g);
    sq_buf_dispose(&c);
    sq_buf_dispose(&r);
    sq_buf_dispose(&p);
    return rc;
}

Test(auth, right_token_passes_both_ways)
{
    int by;
    cr_assert_eq(handshake(TOKEN, TOKEN, &by), 0);
}

Test(auth, wrong_token_is_refused_by_the_worker_first)
{
    int by;
    cr_assert_eq(handshake("another token", TOKEN, &by), SQ_AUTH_BAD_PROOF);
    cr_assert_eq(by, 'w');
}

Test(auth, a_worker_without_token_is_refused_as_such)
{
    int by;
    cr_assert_eq(handshake("", TOKEN, &by), SQ_AUTH_NO_TOKEN);
    cr_assert_eq(by, 'g');
    cr_assert_str_eq(sq_auth_reason(SQ_AUTH_NO_TOKEN), "no_token");
}

Test(auth, squishd_needs_a_token)
{
    sq_auth_t g;
    cr_assert_eq(sq_auth_init(&g, SQ_AUTH_GATEWAY, "", 0, NULL), SQ_AUTH_NO_TOKEN);
}

Test(auth, the_token_never_crosses_the_wire)
{
    sq_auth_t w, g;
    sq_buf_t all;
    sq_buf_init(&all);
    sq_auth_init(&w, SQ_AUTH_WORKER, TOKEN, strlen(TOKEN), NULL);
    sq_auth_init(&g, SQ_AUTH_GATEWAY, TOKEN, strlen(TOKEN), NULL);
    size_t c0 = all.len;
    sq_auth_challenge(&w, &all);
    size_t r0 = all.len;
    cr_assert_eq(sq_auth_on_challenge(&g, all.data + c0, r0 - c0, &all), 0);
    size_t p0 = all.len;
    cr_assert_eq(sq_auth_on_reply(&w, all.data + r0, p0 - r0, &all), 0);
    cr_assert_eq(sq_auth_on_proof(&g, all.data + p0, all.len - p0), 0);
    cr_assert_null(memmem(all.data, all.len, TOKEN, 8));
    sq_buf_dispose(&all);
}

/* A worker's recorded challenge and proof, replayed to squishd later (which
 * draws a new nonce), do not pass; nor does squishd's recorded reply to a
 * worker with a new nonce. */
Test(auth, a_replayed_transcript_is_refused)
{
    uint8_t nw[32], ng1[32], ng2[32], nw2[32];
    memset(nw, 1, 32);
    memset(ng1, 2, 32);
    memset(ng2, 3, 32);
    memset(nw2, 4, 32);
    sq_auth_t w, g;
    sq_buf_t c, r, p;
    sq_buf_init(&c);
    sq_buf_init(&r);
    sq_buf_init(&p);
    sq_auth_init(&w, SQ_AUTH_WORKER, TOKEN, strlen(TOKEN), nw);
    sq_auth_init(&g, SQ_AUTH_GATEWAY, TOKEN, strlen(TOKEN), ng1);
    sq_auth_challenge(&w, &c);
    cr_assert_eq(sq_auth_on_challenge(&g, c.data, c.len, &r), 0);
    cr_assert_eq(sq_auth_on_reply(&w, r.data, r.len, &p), 0);
    cr_assert_eq(sq_auth_on_proof(&g, p.data, p.len), 0);

    /* The attacker replays the worker's side to a new squishd session. */
    sq_auth_t g2;
    sq_buf_t r2;
    sq_buf_init(&r2);
    sq_auth_init(&g2, SQ_AUTH_GATEWAY, TOKEN, strlen(TOKEN), ng2);
    cr_assert_eq(sq_auth_on_challenge(&g2, c.data, c.len, &r2), 0);
    cr_assert_eq(sq_auth_on_proof(&g2, p.data, p.len), SQ_AUTH_BAD_PROOF);
    cr_assert(!sq_auth_done(&g2));

    /* ... or squishd's side to a new worker session. */
    sq_auth_t w2;
    sq_buf_t c2, p2;
    sq_buf_init(&c2);
    sq_buf_init(&p2);
    sq_auth_init(&w2, SQ_AUTH_WORKER, TOKEN, strlen(TOKEN), nw2);
    sq_auth_challenge(&w2, &c2);
    cr_assert_eq(sq_auth_on_reply(&w2, r.data, r.len, &p2), SQ_AUTH_BAD_PROOF);

    /* ... or reflects squishd's proof back as the worker's. */
    sq_auth_t g3;
    sq_buf_t r3;
    sq_buf_init(&r3);
    sq_auth_init(&g3, SQ_AUTH_GATEWAY, TOKEN, strlen(TOKEN), NULL);
    cr_assert_eq(sq_auth_on_challenge(&g3, c.data, c.len, &r3), 0);
    cr_assert_eq(sq_auth_on_proof(&g3, r3.data + 32, 32), SQ_AUTH_BAD_PROOF);
    sq_buf_dispose(&c);
    sq_buf_dispose(&r);
    sq_buf_dispose(&p);
    sq_buf_dispose(&r2);
    sq_buf_dispose(&c2);
    sq_buf_dispose(&p2);
    sq_buf_dispose(&r3);
}

Test(auth, truncated_or_garbled_messages_are_refused)
{
    sq_auth_t w, g;
    sq_buf_t c, r, p;
    sq_buf_init(&c);
    sq_buf_init(&r);
    sq_buf_init(&p);
    sq_auth_init(&w, SQ_AUTH_WORKER, TOKEN, strlen(TOKEN), NULL);
    sq_auth_challenge(&w, &c);
    for (size_t cut = 0; cut < c.len; cut++) {
        sq_auth_init(&g, SQ_AUTH_GATEWAY, TOKEN, strlen(TOKEN), NULL);
        r.len = 0;
        cr_assert_eq(sq_auth_on_challenge(&g, c.data, cut, &r), SQ_AUTH_MALFORMED, "cut %zu", cut);
        cr_assert_eq(r.len, 0);
    }
    c.data[0] ^= 0xff; /* the magic */
    sq_auth_init(&g, SQ_AUTH_GATEWAY, TOKEN, strlen(TOKEN), NULL);
    cr_assert_eq(sq_auth_on_challenge(&g, c.data, c.len, &r), SQ_AUTH_MALFORMED);
    c.data[0] ^= 0xff;
    sq_auth_init(&g, SQ_AUTH_GATEWAY, TOKEN, strlen(TOKEN), NULL);
    cr_assert_eq(sq_auth_on_challenge(&g, c.data, c.len, &r), 0);
    /* Every flipped bit of the reply's proof fails; a short reply too. */
    for (size_t bit = 32 * 8; bit < r.len * 8; bit += 7) {
        sq_auth_t w2 = w;
        r.data[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        p.len = 0;
        cr_assert_eq(sq_auth_on_reply(&w2, r.data, r.len, &p), SQ_AUTH_BAD_PROOF);
        r.data[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    sq_auth_t w3 = w;
    cr_assert_eq(sq_auth_on_reply(&w3, r.data, r.len - 1, &p), SQ_AUTH_MALFORMED);
    p.len = 0;
    cr_assert_eq(sq_auth_on_reply(&w, r.data, r.len, &p), 0);
    /* A garbled or short proof, then anything after a refusal. */
    sq_auth_t g2 = g;
    p.data[5] ^= 0x10;
    cr_assert_eq(sq_auth_on_proof(&g2, p.data, p.len), SQ_AUTH_BAD_PROOF);
    cr_assert_eq(sq_auth_on_proof(&g2, p.data, p.len), SQ_AUTH_STATE);
    p.data[5] ^= 0x10;
    sq_auth_t g3 = g;
    cr_assert_eq(sq_auth_on_proof(&g3, p.data, p.len - 1), SQ_AUTH_MALFORMED);
    cr_assert_eq(sq_auth_on_proof(&g, p.data, p.len), 0);
    /* Out of order: a second proof, a reply to squishd. */
    cr_assert_eq(sq_auth_on_proof(&g, p.data, p.len), SQ_AUTH_STATE);
    sq_buf_dispose(&c);
    sq_buf_dispose(&r);
    sq_buf_dispose(&p);
}

Test(auth, nonces_are_fresh)
{
    sq_auth_t a, b;
    sq_auth_init(&a, SQ_AUTH_WORKER, TOKEN, strlen(TOKEN), NULL);
    sq_auth_init(&b, SQ_AUTH_WORKER, TOKEN, strlen(TOKEN), NULL);
    cr_assert_neq(memcmp(a.nonce_w, b.nonce_w, SQ_AUTH_NONCE_BYTES), 0);
}

Test(auth, token_file)
{
    char path[] = "/tmp/sq_test_token_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    uint8_t tok[SQ_AUTH_MAX_TOKEN];
    size_t len = 0;
    char err[256];
    cr_assert_eq(sq_auth_read_token(path, tok, sizeof(tok), &len, err, sizeof(err)),
                 SQ_BAD_CONFIG); /* empty */
    cr_assert_eq(write(fd, "s3cret\n\n", 8), 8);
    cr_assert_eq(sq_auth_read_token(path, tok, sizeof(tok), &len, err, sizeof(err)), 0);
    cr_assert_eq(len, 6);
    cr_assert_eq(memcmp(tok, "s3cret", 6), 0);
    cr_assert_eq(sq_auth_read_token(path, tok, 3, &len, err, sizeof(err)), SQ_BAD_CONFIG);
    close(fd);
    unlink(path);
    cr_assert_eq(sq_auth_read_token(path, tok, sizeof(tok), &len, err, sizeof(err)), SQ_IO);
}

Test(auth, models_held_round_trip_and_garbage)
{
    char shas[2][65];
    memset(shas[0], 'a', 64);
    shas[0][64] = 0;
    memset(shas[1], '0', 64);
    shas[1][64] = 0;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_models_held_encode(&b, 2, (const char(*)[65])shas);
    sq_frame_t f = {.type = SQ_MSG_MODELS_HELD, .payload = b.data, .len = (uint32_t)b.len};
    sq_models_held_t m;
    cr_assert_eq(sq_models_held_decode(&f, &m), 0);
    cr_assert_eq(m.n, 2);
    cr_assert_str_eq(m.sha256[1], shas[1]);
    free(m.sha256);
    for (uint32_t cut = 0; cut < b.len; cut++) {
        f.len = cut;
        cr_assert_eq(sq_models_held_decode(&f, &m), SQ_PROTOCOL, "cut %u", cut);
        cr_assert_null(m.sha256);
    }
    f.len = (uint32_t)b.len;
    b.data[10] = 'G'; /* not hex */
    cr_assert_eq(sq_models_held_decode(&f, &m), SQ_PROTOCOL);
    sq_buf_dispose(&b);
}
