/* gateway/http/async.c: a deferred job's life on requests built by hand (a
 * pool, no connection, no loop): the two holds (the request's and the
 * reply's), the dispose hook called once when both are let go, the client
 * told gone once and only before its reply, and the job's error text. */
#include <criterion/criterion.h>
#include <http_int.h>
#include <sq.h>

#include <stdlib.h>
#include <string.h>

static int disposed, gone;

static void count_dispose(gw_async_t *a)
{
    (void)a;
    disposed++;
}

static void count_gone(gw_async_t *a)
{
    (void)a;
    gone++;
}

typedef struct {
    h2o_req_t req;
    gw_call_t call;
} fake_t;

static gw_async_t *job_for(fake_t *f)
{
    memset(f, 0, sizeof(*f));
    disposed = gone = 0;
    h2o_mem_init_pool(&f->req.pool);
    f->call.req = &f->req;
    gw_async_t *a = gw_async_new(&f->call, sizeof(gw_async_t) + 16);
    a->dispose = count_dispose;
    a->gone = count_gone;
    return a;
}

Test(async, a_new_job_is_tied_to_its_request_and_zeroed)
{
    fake_t f;
    gw_async_t *a = job_for(&f);
    cr_assert_eq(a->req, &f.req);
    cr_assert_eq(a->refs, 2, "the request's hold and the reply's");
    cr_assert_eq(a->err, 0);
    cr_assert_null(a->raw);
    h2o_mem_clear_pool(&f.req.pool);
    gw__async_release(a);
}

Test(async, a_client_gone_before_the_reply_is_told_once)
{
    fake_t f;
    gw_async_t *a = job_for(&f);
    h2o_mem_clear_pool(&f.req.pool); /* h2o frees the request: the client left */
    cr_assert_null(a->req, "the reply goes nowhere now");
    cr_assert_eq(gone, 1);
    cr_assert_eq(disposed, 0, "the reply side still holds the job");
    gw__async_tell_gone(a); /* the watch finds it too */
    cr_assert_eq(gone, 1, "told once");
    gw__async_release(a);
    cr_assert_eq(disposed, 1, "freed when both sides let go");
}

Test(async, a_job_already_answered_is_never_told_gone)
{
    fake_t f;
    gw_async_t *a = job_for(&f);
    a->answered = 1;
    gw__async_release(a); /* the reply was sent */
    cr_assert_eq(disposed, 0, "the request still holds the job");
    h2o_mem_clear_pool(&f.req.pool);
    cr_assert_eq(gone, 0);
    cr_assert_eq(disposed, 1);
}

Test(async, raw_bytes_and_header_values_go_with_the_job)
{
    /* Under AddressSanitizer a leak of either fails this test. */
    fake_t f;
    gw_async_t *a = job_for(&f);
    a->raw = malloc(8);
    a->raw_len = 8;
    a->raw_headers[a->nraw_headers++] = (gw_async_header_t){"content-type", strdup("text/plain")};
    a->raw_headers[a->nraw_headers++] = (gw_async_header_t){"retry-after", strdup("1")};
    h2o_mem_clear_pool(&f.req.pool);
    gw__async_release(a);
    cr_assert_eq(disposed, 1);
}

Test(async, a_deferred_job_keeps_its_error_and_detail)
{
    gw_async_t a;
    memset(&a, 0, sizeof(a));
    gw_async_fail(&a, SQ_NOT_FOUND, "model %s version %d", "resnet", 3);
    cr_assert_eq(a.err, SQ_NOT_FOUND);
    cr_assert_str_eq(a.detail, "model resnet version 3");
    gw_async_fail(&a, SQ_OVERLOAD, NULL);
    cr_assert_eq(a.err, SQ_OVERLOAD);
    cr_assert_str_eq(a.detail, "", "no detail: the error's own message is sent");
    cr_assert_str_eq(gw_async_detail(&a), "");
    /* Past the struct's buffer: whole, on the heap (an upload refused for a
     * dozen ops), and gone with the next failure or the job. */
    char longer[sizeof(a.detail) + 1500];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    gw_async_fail(&a, SQ_BAD_REQUEST, "%s", longer);
    cr_assert_str_eq(gw_async_detail(&a), longer, "kept whole");
    cr_assert_eq(strlen(a.detail), sizeof(a.detail) - 1, "the buffer holds its start");
    gw_async_fail(&a, SQ_BAD_REQUEST, "short");
    cr_assert_str_eq(gw_async_detail(&a), "short");
    cr_assert_null(a.detail_long);
    gw_async_dispose_detail(&a);
}
