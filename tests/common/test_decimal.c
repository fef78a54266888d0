#include <sq_text.h>

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* d as text that strtod reads: "DIGITSeEXP" (the exponent of the last
 * digit). */
static void decimal_text(const sq_decimal_t *d, char *out, size_t len)
{
    snprintf(out, len, "%llue%d", (unsigned long long)d->digits, d->exp10 - d->ndigits + 1);
}

static const char *double_text(double v)
{
    static char text[48];
    sq_decimal_t d;
    sq_shortest_double(v, &d);
    decimal_text(&d, text, sizeof(text));
    return text;
}

static const char *float_text(float v)
{
    static char text[48];
    sq_decimal_t d;
    sq_shortest_float(v, &d);
    decimal_text(&d, text, sizeof(text));
    return text;
}

static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* What makes d the answer for v (is_float: v is a float): it reads back
 * as |v|, has no trailing zero, says its digit count and exponent right,
 * and one digit fewer never reads back (the candidates with one digit
 * fewer nearest to v are d's digits / 10 and that plus one). */
static void check_shortest(double v, int is_float, const sq_decimal_t *d)
{
    char text[48];
    decimal_text(d, text, sizeof(text));
    double back = is_float ? (double)strtof(text, NULL) : strtod(text, NULL);
    cr_assert_eq(back, fabs(v), "%s does not read back as %.17g", text, v);
    cr_assert(d->digits % 10 != 0, "%s has a trailing zero", text);
    char digits[24];
    int nd = sq_decimal_digits(d, digits);
    cr_assert_eq(nd, d->ndigits);
    cr_assert(digits[0] != '0', "%s", text);
    cr_assert_eq(nd, snprintf(NULL, 0, "%llu", (unsigned long long)d->digits));
    if (d->ndigits == 1)
        return;
    int exp_last = d->exp10 - d->ndigits + 2;
    for (uint64_t shorter = d->digits / 10; shorter <= d->digits / 10 + 1; shorter++) {
        if (shorter == 0)
            continue;
        char t[48];
        snprintf(t, sizeof(t), "%llue%d", (unsigned long long)shorter, exp_last);
        double b = is_float ? (double)strtof(t, NULL) : strtod(t, NULL);
        cr_assert_neq(b, fabs(v), "%s is shorter than %s and reads back as %.17g", t, text, v);
    }
}

Test(decimal, doubles_get_the_fewest_digits_that_read_back)
{
    cr_assert_str_eq(double_text(0.025), "25e-3");
    cr_assert_str_eq(double_text(0.1), "1e-1");
    cr_assert_str_eq(double_text(-2.5), "25e-1");
    cr_assert_str_eq(double_text(3.0), "3e0");
    cr_assert_str_eq(double_text(1e15), "1e15");
    cr_assert_str_eq(double_text(1.0 / 3), "3333333333333333e-16");
    cr_assert_str_eq(double_text(0.1 + 0.2), "30000000000000004e-17");
    cr_assert_str_eq(double_text(19.574000000000002), "19574e-3");
    cr_assert_str_eq(double_text(nextafter(19.574, 20)), "19574000000000005e-15");
    /* 1e23 is not a double: its nearest is 9.999999999999999e22, and the
     * text "1e23" reads back as that. */
    cr_assert_str_eq(double_text(1e23), "1e23");
    cr_assert_str_eq(double_text(9007199254740993.0), "9007199254740992e0");
    /* Outside the exact path: the C library's digits. */
    cr_assert_str_eq(double_text(DBL_MAX), "17976931348623157e292");
    cr_assert_str_eq(double_text(DBL_MIN), "22250738585072014e-324");
    cr_assert_str_eq(double_text(5e-324), "5e-324");
    cr_assert_str_eq(double_text(1e-7), "1e-7");
    sq_decimal_t d;
    sq_shortest_double(0.0, &d);
    cr_assert_eq(d.digits, 0);
    cr_assert_eq(d.ndigits, 1);
    cr_assert_eq(d.exp10, 0);
}

Test(decimal, floats_get_the_fewest_digits_that_read_back_as_the_float)
{
    cr_assert_str_eq(float_text(0.1f), "1e-1");
    cr_assert_str_eq(float_text(0.001f), "1e-3");
    cr_assert_str_eq(float_text(1e-5f), "1e-5");
    cr_assert_str_eq(float_text(1.0f / 3), "33333334e-8");
    cr_assert_str_eq(float_text(16777216.0f), "16777216e0");
    cr_assert_str_eq(float_text(123456792.0f), "12345679e1");
    cr_assert_str_eq(float_text(1e10f), "1e10");
    cr_assert_str_eq(float_text(FLT_MAX), "34028235e31");
    cr_assert_str_eq(float_text(FLT_MIN), "11754944e-45");
    cr_assert_str_eq(float_text(1.4e-45f), "1e-45");
    /* 2^-7 as a float: the neighbour below is half as far. */
    cr_assert_str_eq(float_text(0.0078125f), "78125e-7");
}

/* Every power of two (where the interval below is half the one above)
 * and random bit patterns over the whole range, both formats: each answer
 * reads back and has no shorter one. */
Test(decimal, every_power_of_two_and_random_patterns_are_shortest)
{
    sq_decimal_t d;
    for (int e = -1074; e <= 1023; e++) {
        double v = ldexp(1.0, e);
        sq_shortest_double(v, &d);
        check_shortest(v, 0, &d);
        for (int s = -1; s <= 1; s += 2) {
            double w = nextafter(v, s < 0 ? 0 : INFINITY);
            if (isfinite(w) && w > 0) {
                sq_shortest_double(w, &d);
                check_shortest(w, 0, &d);
            }
        }
    }
    for (int e = -149; e <= 127; e++) {
        float v = ldexpf(1.0f, e);
        sq_shortest_float(v, &d);
        check_shortest(v, 1, &d);
        float w = nextafterf(v, INFINITY);
        if (isfinite(w)) {
            sq_shortest_float(w, &d);
            check_shortest(w, 1, &d);
        }
    }
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 200000; i++) {
        uint64_t r = next_random(&state);
        double v;
        memcpy(&v, &r, sizeof(v));
        if (isfinite(v) && v != 0) {
            sq_shortest_double(v, &d);
            check_shortest(v, 0, &d);
        }
        uint32_t r32 = (uint32_t)(r >> 16);
        float f;
        memcpy(&f, &r32, sizeof(f));
        if (isfinite(f) && f != 0) {
            sq_shortest_float(f, &d);
            check_shortest(f, 1, &d);
        }
    }
}

/* Numbers as squish prints them most (milliseconds, scores): short
 * decimals and their float neighbours read back with their own digits. */
Test(decimal, short_decimals_keep_their_digits)
{
    char text[48];
    for (int i = 1; i < 100000; i++) {
        double v = i / 1000.0;
        sq_decimal_t d;
        sq_shortest_double(v, &d);
        decimal_text(&d, text, sizeof(text));
        cr_assert_eq(strtod(text, NULL), v);
        cr_assert_leq(d.ndigits, 5, "%d/1000 -> %s", i, text);
        float f = (float)v;
        sq_shortest_float(f, &d);
        decimal_text(&d, text, sizeof(text));
        cr_assert_eq(strtof(text, NULL), f);
        cr_assert_leq(d.ndigits, 5, "%d/1000f -> %s", i, text);
    }
}
