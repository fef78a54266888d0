/* The rows table of frontends' rows (worker/serve_rows.c): rows that come
 * before or after their batch is claimed, absent rows, frontends gone or
 * disconnected, the deadline, late and unclaimed rows dropped, and frames
 * that break the protocol. */
#include "serve_int.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define MS 1000000LL
#define ROW_BYTES 16

/* A DATA_ROWS of n rows (rows[k], present[k]); present rows' bytes are
 * filled with 10 * row + k. */
typedef struct {
    sq_data_rows_t m;
    uint8_t bytes[SQ_MAX_BATCH_ITEMS * ROW_BYTES];
} frame_t;

static void make_rows(frame_t *f, uint32_t count, uint32_t n, const uint32_t *rows,
                      const uint8_t *present)
{
    memset(f, 0, sizeof(*f));
    f->m.count = count;
    f->m.input_kind = SQ_INPUT_UINT8;
    f->m.row_bytes = ROW_BYTES;
    f->m.n = n;
    size_t off = 0;
    for (uint32_t k = 0; k < n; k++) {
        f->m.row[k] = rows[k];
        f->m.present[k] = present[k];
        if (present[k]) {
            for (int b = 0; b < ROW_BYTES; b++)
                f->bytes[off + (size_t)b] = (uint8_t)(10 * rows[k] + (uint32_t)b);
            off += ROW_BYTES;
        }
    }
    f->m.bytes = f->bytes;
    f->m.nbytes = off;
}

static void expect_row_bytes(const rows_claim_t *c, uint32_t row)
{
    cr_assert_eq(c->state[row], ROW_PRESENT, "row %u state %d", row, c->state[row]);
    cr_assert_not_null(c->bytes[row]);
    for (int b = 0; b < ROW_BYTES; b++)
        cr_assert_eq(c->bytes[row][b], (uint8_t)(10 * row + (uint32_t)b));
}

Test(serve_rows, rows_before_the_batch_are_claimed_with_their_bytes)
{
    rows_t *t = wk__rows_new(1 << 20);
    frame_t f;
    uint32_t rows[] = {1, 3};
    uint8_t present[] = {1, 1};
    make_rows(&f, 4, 2, rows, present);
    cr_assert_eq(wk__rows_put(t, 0, 7, &f.m, sq_now_ns()), 0);
    cr_assert_eq(wk__rows_held_bytes(t), 2 * ROW_BYTES);
    uint32_t src[] = {0, 1, 0, 1};
    rows_claim_t c;
    int64_t start = sq_now_ns();
    wk__rows_claim(t, 7, 4, src, start + 5000 * MS, &c);
    cr_assert_lt(sq_now_ns() - start, 1000 * MS, "nothing to wait for");
    cr_assert_eq(c.state[0], ROW_LOCAL);
    cr_assert_eq(c.state[2], ROW_LOCAL);
    expect_row_bytes(&c, 1);
    expect_row_bytes(&c, 3);
    cr_assert_eq(c.row_bytes, ROW_BYTES);
    cr_assert_eq(c.input_kind, SQ_INPUT_UINT8);
    cr_assert_eq(wk__rows_held_bytes(t), 0, "the claim took the bytes");
    wk__rows_claim_dispose(&c);
    wk__rows_free(t);
}

typedef struct {
    rows_t *t;
    int delay_ms;
    int what; /* 0: put rows 0 and 1 (frontend 2); 1: FE_GONE 2; 2: closed 2; 3: stop */
} later_t;

static void *later(void *arg)
{
    later_t *l = arg;
    usleep((useconds_t)l->delay_ms * 1000);
    if (l->what == 0) {
        frame_t f;
        uint32_t rows[] = {0, 1};
        uint8_t present[] = {1, 0};
        make_rows(&f, 2, 2, rows, present);
        cr_assert_eq(wk__rows_put(l->t, 2, 9, &f.m, sq_now_ns()), 0);
    } else if (l->what == 1) {
        wk__rows_frontend(l->t, 2, ROWS_FE_GONE);
    } else if (l->what == 2) {
        wk__rows_frontend(l->t, 2, ROWS_FE_CLOSED);
    } else {
        wk__rows_stop(l->t);
    }
    return NULL;
}

/* Claims batch 9 (two rows of frontend 2) while `what` happens after
 * 50 ms; returns how long the claim waited. */
static int64_t claim_while(rows_t *t, int what, rows_claim_t *c)
{
    later_t l = {.t = t, .delay_ms = 50, .what = what};
    pthread_t th;
    pthread_create(&th, NULL, later, &l);
    uint32_t src[] = {3, 3};
    int64_t start = sq_now_ns();
    wk__rows_claim(t, 9, 2, src, start + 5000 * MS, c);
    int64_t waited = sq_now_ns() - start;
    pthread_join(th, NULL);
    return waited;
}

Test(serve_rows, rows_after_the_batch_end_its_wait)
{
    rows_t *t = wk__rows_new(1 << 20);
    wk__rows_frontend(t, 2, ROWS_FE_UP);
    rows_claim_t c;
    int64_t waited = claim_while(t, 0, &c);
    cr_assert_geq(waited, 40 * MS, "the claim waited for the rows");
    cr_assert_lt(waited, 2000 * MS, "and not for the deadline");
    expect_row_bytes(&c, 0);
    cr_assert_eq(c.state[1], ROW_ABSENT, "sent absent");
    cr_assert_null(c.bytes[1]);
    wk__rows_claim_dispose(&c);
    wk__rows_free(t);
}

Test(serve_rows, a_frontend_gone_ends_the_wait_and_stays_gone)
{
    rows_t *t = wk__rows_new(1 << 20);
    wk__rows_frontend(t, 2, ROWS_FE_UP);
    rows_claim_t c;
    int64_t waited = claim_while(t, 1, &c);
    cr_assert_lt(waited, 2000 * MS);
    cr_assert_eq(c.state[0], ROW_LOST);
    cr_assert_eq(c.state[1], ROW_LOST);
    cr_assert(wk__rows_frontend_gone(t, 2));
    /* Connecting again does not undo FE_GONE; a new squishd connection does. */
    wk__rows_frontend(t, 2, ROWS_FE_UP);
    cr_assert(wk__rows_frontend_gone(t, 2));
    wk__rows_reset(t);
    cr_assert_not(wk__rows_frontend_gone(t, 2));
    wk__rows_free(t);
}

Test(serve_rows, a_closed_connection_ends_the_wait_until_it_is_back)
{
    rows_t *t = wk__rows_new(1 << 20);
    wk__rows_frontend(t, 2, ROWS_FE_UP);
    rows_claim_t c;
    int64_t waited = claim_while(t, 2, &c);
    cr_assert_lt(waited, 2000 * MS);
    cr_assert_eq(c.state[0], ROW_LOST);
    /* Back (same id): its rows are waited for again. */
    wk__rows_frontend(t, 2, ROWS_FE_UP);
    uint32_t src[] = {3};
    int64_t start = sq_now_ns();
    wk__rows_claim(t, 10, 1, src, start + 100 * MS, &c);
    cr_assert_geq(sq_now_ns() - start, 100 * MS);
    cr_assert_eq(c.state[0], ROW_LATE);
    wk__rows_free(t);
}

Test(serve_rows, rows_that_never_come_are_late_at_the_deadline)
{
    rows_t *t = wk__rows_new(1 << 20);
    uint32_t src[] = {0, 1, 2};
    rows_claim_t c;
    int64_t start = sq_now_ns();
    wk__rows_claim(t, 11, 3, src, start + 120 * MS, &c);
    int64_t waited = sq_now_ns() - start;
    cr_assert_geq(waited, 120 * MS);
    cr_assert_lt(waited, 1000 * MS);
    cr_assert_eq(c.state[0], ROW_LOCAL);
    cr_assert_eq(c.state[1], ROW_LATE);
    cr_assert_eq(c.state[2], ROW_LATE);
    cr_assert_eq(c.row_bytes, 0, "no rows came");
    /* Rows that come after the claim are dropped, not kept. */
    frame_t f;
    uint32_t rows[] = {1};
    uint8_t present[] = {1};
    make_rows(&f, 3, 1, rows, present);
    cr_assert_eq(wk__rows_put(t, 0, 11, &f.m, sq_now_ns()), 0);
    cr_assert_eq(wk__rows_held_bytes(t), 0);
    wk__rows_free(t);
}

Test(serve_rows, stopping_ends_a_wait)
{
    rows_t *t = wk__rows_new(1 << 20);
    rows_claim_t c;
    int64_t waited = claim_while(t, 3, &c);
    cr_assert_lt(waited, 2000 * MS);
    cr_assert_eq(c.state[0], ROW_LATE);
    wk__rows_free(t);
}

Test(serve_rows, unclaimed_rows_are_dropped_after_a_while)
{
    rows_t *t = wk__rows_new(1 << 20);
    frame_t f;
    uint32_t rows[] = {0};
    uint8_t present[] = {1};
    make_rows(&f, 1, 1, rows, present);
    int64_t now = sq_now_ns();
    cr_assert_eq(wk__rows_put(t, 0, 12, &f.m, now), 0);
    wk__rows_expire(t, now + (WK_ROWS_KEEP_MS - 100) * MS);
    cr_assert_eq(wk__rows_held_bytes(t), ROW_BYTES, "kept a while");
    wk__rows_expire(t, now + (WK_ROWS_KEEP_MS + 1) * MS);
    cr_assert_eq(wk__rows_held_bytes(t), 0);
    uint32_t src[] = {1};
    rows_claim_t c;
    wk__rows_claim(t, 12, 1, src, sq_now_ns(), &c);
    cr_assert_eq(c.state[0], ROW_LATE);
    wk__rows_free(t);
}

Test(serve_rows, a_row_of_another_frontend_is_bad)
{
    rows_t *t = wk__rows_new(1 << 20);
    frame_t f;
    uint32_t rows[] = {0};
    uint8_t present[] = {1};
    make_rows(&f, 1, 1, rows, present);
    cr_assert_eq(wk__rows_put(t, 5, 13, &f.m, sq_now_ns()), 0);
    uint32_t src[] = {1}; /* frontend 0's */
    rows_claim_t c;
    wk__rows_claim(t, 13, 1, src, sq_now_ns() + 1000 * MS, &c);
    cr_assert_eq(c.state[0], ROW_BAD);
    cr_assert_null(c.bytes[0]);
    cr_assert_eq(wk__rows_held_bytes(t), 0);
    wk__rows_free(t);
}

Test(serve_rows, rows_unlike_the_batch_are_bad)
{
    rows_t *t = wk__rows_new(1 << 20);
    frame_t f;
    uint32_t rows[] = {0};
    uint8_t present[] = {1};
    make_rows(&f, 2, 1, rows, present); /* a batch of 2, says the frontend */
    cr_assert_eq(wk__rows_put(t, 0, 14, &f.m, sq_now_ns()), 0);
    uint32_t src[] = {1, 1, 1};
    rows_claim_t c;
    wk__rows_claim(t, 14, 3, src, sq_now_ns() + 50 * MS, &c);
    cr_assert_eq(c.state[0], ROW_BAD);
    cr_assert_eq(c.state[1], ROW_LATE);
    cr_assert_eq(c.state[2], ROW_LATE);
    wk__rows_claim_dispose(&c);
    wk__rows_free(t);
}

Test(serve_rows, frames_that_break_the_protocol_are_refused)
{
    rows_t *t = wk__rows_new(3 * ROW_BYTES);
    frame_t f;
    uint32_t rows[] = {0, 1};
    uint8_t present[] = {1, 1};
    make_rows(&f, 4, 2, rows, present);
    cr_assert_eq(wk__rows_put(t, 0, 15, &f.m, sq_now_ns()), 0);
    cr_assert_eq(wk__rows_put(t, 0, 15, &f.m, sq_now_ns()), SQ_PROTOCOL, "rows twice");
    frame_t g;
    uint32_t other[] = {2};
    make_rows(&g, 5, 1, other, present);
    cr_assert_eq(wk__rows_put(t, 1, 15, &g.m, sq_now_ns()), SQ_PROTOCOL, "another batch size");
    make_rows(&g, 4, 2, (uint32_t[]){2, 3}, present);
    cr_assert_eq(wk__rows_put(t, 1, 15, &g.m, sq_now_ns()), SQ_TOO_LARGE, "past max_bytes");
    cr_assert_eq(wk__rows_held_bytes(t), 2 * ROW_BYTES, "nothing of the refused frames kept");
    make_rows(&g, 4, 1, other, present);
    cr_assert_eq(wk__rows_put(t, 1, 15, &g.m, sq_now_ns()), 0, "one more fits");
    wk__rows_free(t);
}
