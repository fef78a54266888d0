/* common/backoff.c: the doubling backoff of restarts and reconnects. */
#include <criterion/criterion.h>
#include <sq.h>

#include <limits.h>

Test(backoff, doubles_up_to_the_cap_and_resets)
{
    sq_backoff_t b;
    sq_backoff_init(&b, 100, 2000);
    const int want[] = {100, 200, 400, 800, 1600, 2000, 2000};
    for (int i = 0; i < 7; i++)
        cr_assert_eq(sq_backoff_next(&b), want[i], "failure %d", i);
    sq_backoff_reset(&b);
    cr_assert_eq(sq_backoff_next(&b), 100, "after a success, the first delay again");
    cr_assert_eq(sq_backoff_next(&b), 200);
}

Test(backoff, a_zero_first_delay_grows_from_one_ms)
{
    sq_backoff_t b;
    sq_backoff_init(&b, 0, 5);
    const int want[] = {0, 1, 2, 4, 5, 5};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(sq_backoff_next(&b), want[i], "failure %d", i);
    sq_backoff_init(&b, 0, 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sq_backoff_next(&b), 0, "a cap of 0: never waits");
}

Test(backoff, a_first_delay_above_the_cap_is_waited_once)
{
    sq_backoff_t b;
    sq_backoff_init(&b, 100, 50);
    cr_assert_eq(sq_backoff_next(&b), 100);
    cr_assert_eq(sq_backoff_next(&b), 50);
    cr_assert_eq(sq_backoff_next(&b), 50);
}

Test(backoff, no_overflow_near_int_max)
{
    sq_backoff_t b;
    sq_backoff_init(&b, INT_MAX / 2 + 1, INT_MAX);
    cr_assert_eq(sq_backoff_next(&b), INT_MAX / 2 + 1);
    cr_assert_eq(sq_backoff_next(&b), INT_MAX);
    cr_assert_eq(sq_backoff_next(&b), INT_MAX);
}
