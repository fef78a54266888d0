#include <criterion/criterion.h>
#include <sq.h>
#include <string.h>

Test(error, ok_is_zero_and_errors_are_negative)
{
    cr_assert_eq(SQ_OK, 0);
    cr_assert_lt(SQ_NOMEM, 0);
    cr_assert_lt(SQ_INTERNAL, SQ_NOMEM);
}

Test(error, names_messages_and_statuses_come_from_the_table)
{
    cr_assert_str_eq(sq_err_name(SQ_DEADLINE), "deadline");
    cr_assert_eq(sq_err_http_status(SQ_DEADLINE), 503);
    cr_assert_str_eq(sq_err_name(SQ_UNAUTHORIZED), "unauthorized");
    cr_assert_eq(sq_err_http_status(SQ_UNAUTHORIZED), 401);
    cr_assert_eq(sq_err_http_status(SQ_TOO_LARGE), 413);
    cr_assert_eq(sq_err_http_status(SQ_MEDIA_TYPE), 415);
    cr_assert_eq(sq_err_http_status(SQ_UNSUPPORTED_MODEL), 422);
    cr_assert_eq(sq_err_http_status(SQ_EXISTS), 409);
    cr_assert_eq(sq_err_http_status(SQ_METHOD), 405);
    cr_assert_str_eq(sq_err_msg(SQ_OK), "success");
}

Test(error, an_slo_no_retry_can_meet_is_a_4xx_and_a_deadline_missed_under_load_a_503)
{
    /* The caller's contract: a 4xx says what to send instead; a 503 only
     * where a retry can succeed. */
    cr_assert_str_eq(sq_err_name(SQ_SLO_TOO_TIGHT), "slo_too_tight");
    cr_assert_eq(sq_err_http_status(SQ_SLO_TOO_TIGHT), 400);
    cr_assert(strstr(sq_err_msg(SQ_SLO_TOO_TIGHT), "ask for") != NULL, "%s",
              sq_err_msg(SQ_SLO_TOO_TIGHT));
    cr_assert_eq(sq_err_http_status(SQ_DEADLINE), 503);
    cr_assert(strstr(sq_err_msg(SQ_DEADLINE), "Retry-After") != NULL, "%s",
              sq_err_msg(SQ_DEADLINE));
}

Test(error, unknown_values_are_reported_not_crashed)
{
    cr_assert_str_eq(sq_err_name(-100000), "unknown");
    cr_assert_str_eq(sq_err_name(5), "unknown");
    cr_assert_eq(sq_err_http_status(-100000), 500);
    cr_assert_str_eq(sq_err_msg(12345), "unknown error");
}

Test(error, every_name_is_unique_snake_case)
{
    for (int i = 0; i < SQ_ERR_COUNT_; i++) {
        const char *a = sq_err_name(-i);
        for (const char *p = a; *p; p++)
            cr_assert((*p >= 'a' && *p <= 'z') || *p == '_', "%s is not snake_case", a);
        for (int j = i + 1; j < SQ_ERR_COUNT_; j++)
            cr_assert_str_neq(a, sq_err_name(-j));
        int st = sq_err_http_status(-i);
        cr_assert(st >= 200 && st < 600);
    }
}

Test(error, a_code_name_gives_its_error_back)
{
    for (int i = 1; i < SQ_ERR_COUNT_; i++)
        cr_assert_eq(sq_err_of_name(sq_err_name(-i)), -i, "%s", sq_err_name(-i));
    cr_assert_eq(sq_err_of_name("model_not_found"), SQ_MODEL_NOT_FOUND);
    cr_assert_eq(sq_err_of_name("success"), 0);
    cr_assert_eq(sq_err_of_name("no_such_code"), 0);
    cr_assert_eq(sq_err_of_name(""), 0);
    cr_assert_eq(sq_err_of_name(NULL), 0);
}
