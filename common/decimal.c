/* Shortest round-trip decimals of doubles and floats (see sq_text.h).
 *
 * A binary number v = m x 2^e is read back from any decimal strictly
 * inside the interval halfway to its neighbours (and on the interval's
 * ends too when m is even: round half to even then picks v). With k
 * digits after the point, the candidates are the integers n with n / 10^k
 * in that interval; the fewest digits are the smallest k with a candidate
 * (if k has one, k + 1 has its tenfold), found by bisection, and the
 * answer is the candidate nearest to v. Everything is exact integer
 * arithmetic on 128 bits: the interval's ends in quarters of 2^e over a
 * power of two, times 10^k. Where that would overflow (numbers below
 * about 1e-22 or above about 1e21 for floats, below about 6e-5 or above
 * about 1e21 for doubles, and the subnormals), the digits come from the
 * C library instead: printf's correctly rounded digits, one more at a
 * time until strtod or strtof reads them (or a neighbour) back. */
#include "sq_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

#define U128_MAX (~(u128)0)
#define P19 10000000000000000000u

/* 10^0 .. 10^38, all that fit in 128 bits. */
static const u128 pow10_u128[39] = {
    1u,
    10u,
    100u,
    1000u,
    10000u,
    100000u,
    1000000u,
    10000000u,
    100000000u,
    1000000000u,
    10000000000u,
    100000000000u,
    1000000000000u,
    10000000000000u,
    100000000000000u,
    1000000000000000u,
    10000000000000000u,
    100000000000000000u,
    1000000000000000000u,
    P19,
    (u128)P19 * 10u,
    (u128)P19 * 100u,
    (u128)P19 * 1000u,
    (u128)P19 * 10000u,
    (u128)P19 * 100000u,
    (u128)P19 * 1000000u,
    (u128)P19 * 10000000u,
    (u128)P19 * 100000000u,
    (u128)P19 * 1000000000u,
    (u128)P19 * 10000000000u,
    (u128)P19 * 100000000000u,
    (u128)P19 * 1000000000000u,
    (u128)P19 * 10000000000000u,
    (u128)P19 * 100000000000000u,
    (u128)P19 * 1000000000000000u,
    (u128)P19 * 10000000000000000u,
    (u128)P19 * 100000000000000000u,
    (u128)P19 * 1000000000000000000u,
    (u128)P19 * 10000000000000000000u,
};

/* The interval that reads back as v, in units of 1 / 2^shift: its ends lo
 * and hi (inclusive or not) and v itself, mid. */
typedef struct {
    u128 lo, mid, hi;
    int shift;
    int inclusive;
} interval_t;

/* x times 10^k (0 <= k <= 38), or -1 on overflow; one multiplication
 * instruction when both fit in 64 bits, as they mostly do. */
static int times_pow10(u128 x, int k, u128 *out)
{
    if (k <= 19 && x <= UINT64_MAX) {
        *out = (u128)(uint64_t)x * (uint64_t)pow10_u128[k];
        return 0;
    }
    if (x > U128_MAX / pow10_u128[k])
        return -1;
    *out = x * pow10_u128[k];
    return 0;
}

/* candidates() where everything fits in 64 bits (floats of everyday
 * sizes: hi < 2^27, 10^k up to about 10^11). */
static int candidates64(const interval_t *iv, int k, u128 *n_lo, u128 *n_hi, u128 *near)
{
    uint64_t p = (uint64_t)pow10_u128[k], mask = (1ull << iv->shift) - 1;
    uint64_t lo = (uint64_t)iv->lo * p, hi = (uint64_t)iv->hi * p;
    uint64_t q_lo = lo >> iv->shift, r_lo = lo & mask;
    uint64_t q_hi = hi >> iv->shift, r_hi = hi & mask;
    *n_lo = iv->inclusive && r_lo == 0 ? q_lo : q_lo + 1;
    *n_hi = !iv->inclusive && r_hi == 0 ? q_hi - 1 : q_hi;
    if (near != NULL) {
        uint64_t mid = (uint64_t)iv->mid * p, den = mask + 1;
        uint64_t q = mid >> iv->shift, r = mid & mask;
        if (r > den - r || (r == den - r && (q & 1)))
            q++;
        *near = q;
    }
    return 0;
}

/* Candidates with k digits after the point: n_lo..n_hi (empty when n_lo >
 * n_hi), and, when near is not NULL, the nearest to v (round half to
 * even) in *near. 0, or -1 when the arithmetic would overflow. */
static int candidates(const interval_t *iv, int k, u128 *n_lo, u128 *n_hi, u128 *near)
{
    if (k > 38 || -k > 38)
        return -1;
    if (k >= 0 && k <= 19 && iv->shift < 64 && iv->hi <= UINT64_MAX / (uint64_t)pow10_u128[k])
        return candidates64(iv, k, n_lo, n_hi, near);
    u128 lo = iv->lo, mid = iv->mid, hi = iv->hi, den;
    u128 q_lo, r_lo, q_hi, r_hi, q_mid = 0, r_mid = 0;
    if (k >= 0) { /* over 2^shift */
        if (times_pow10(hi, k, &hi) != 0)
            return -1;
        times_pow10(lo, k, &lo);
        den = (u128)1 << iv->shift;
        u128 mask = den - 1;
        q_lo = lo >> iv->shift, r_lo = lo & mask;
        q_hi = hi >> iv->shift, r_hi = hi & mask;
        if (near != NULL) {
            times_pow10(mid, k, &mid);
            q_mid = mid >> iv->shift, r_mid = mid & mask;
        }
    } else {
        if (pow10_u128[-k] > (U128_MAX >> iv->shift))
            return -1;
        den = pow10_u128[-k] << iv->shift;
        q_lo = lo / den, r_lo = lo % den;
        q_hi = hi / den, r_hi = hi % den;
        if (near != NULL)
            q_mid = mid / den, r_mid = mid % den;
    }
    *n_lo = iv->inclusive && r_lo == 0 ? q_lo : q_lo + 1;
    *n_hi = !iv->inclusive && r_hi == 0 ? q_hi - 1 : q_hi;
    if (near != NULL) {
        u128 n = q_mid;
        if (r_mid > den - r_mid || (r_mid == den - r_mid && (q_mid & 1)))
            n++;
        *near = n;
    }
    return 0;
}

/* v = m x 2^e (m > 0); lower_closer: v is a power of two whose neighbour
 * below is half as far as the one above. 0, or -1 to fall back. */
static int shortest_exact(uint64_t m, int e, int lower_closer, int max_digits, sq_decimal_t *out)
{
    interval_t iv = {.mid = (u128)m << 2, .inclusive = (m & 1) == 0};
    iv.hi = iv.mid + 2;
    iv.lo = iv.mid - (lower_closer ? 1 : 2);
    if (e > 2) {
        if (e - 2 > 127 - 57) /* hi < 2^56 */
            return -1;
        iv.lo <<= e - 2;
        iv.mid <<= e - 2;
        iv.hi <<= e - 2;
    } else if (2 - e > 127) {
        return -1;
    } else {
        iv.shift = 2 - e;
    }
    /* floor(log10 v) or one less: (x * 78913) >> 18 is floor(x log10 2)
     * for every |x| < 1200 (checked for each). */
    int log2v = 63 - __builtin_clzll(m) + e;
    int e10 = (log2v * 78913) >> 18;
    /* Bisection between k_none, where candidates are multiples of a power
     * of ten above v (one only when v is within half a gap below it, as
     * 1e23 is: then k_none + 1 has it too, as a 10 that loses its 0), and
     * k_some, where candidates have max_digits or more, which always read
     * back. */
    int k_none = -e10 - 2, k_some = max_digits - 1 - e10;
    /* The first probe is at two digits fewer than max_digits: most values
     * that are not short decimals (a model's scores) need 7 to 9 digits as
     * floats, and 15 to 17 as doubles, so they end in two or three
     * probes, the short ones in about five. The probe that settles k_some
     * keeps its candidates. */
    u128 n_lo = 0, n_hi = 0, near = 0;
    int have = 0;
    for (int k = k_some - 2; k_some - k_none > 1; k = k_none + (k_some - k_none) / 2) {
        u128 lo, hi, nr;
        if (candidates(&iv, k, &lo, &hi, &nr) != 0)
            return -1;
        if (lo <= hi) {
            k_some = k;
            n_lo = lo, n_hi = hi, near = nr, have = 1;
        } else {
            k_none = k;
        }
    }
    if (!have && (candidates(&iv, k_some, &n_lo, &n_hi, &near) != 0 || n_lo > n_hi))
        return -1;
    u128 n = near < n_lo ? n_lo : near > n_hi ? n_hi : near;
    if (n == 0 || n > (u128)UINT64_MAX)
        return -1;
    uint64_t digits = (uint64_t)n;
    int k = k_some;
    while (digits % 10 == 0) {
        digits /= 10;
        k--;
    }
    int nd = 1;
    while (nd < 20 && digits >= (uint64_t)pow10_u128[nd])
        nd++;
    out->digits = digits;
    out->ndigits = nd;
    out->exp10 = nd - 1 - k;
    return 0;
}

static int reads_back(uint64_t digits, int exp_last, double v, int is_float)
{
    char text[40];
    snprintf(text, sizeof(text), "%llue%d", (unsigned long long)digits, exp_last);
    return is_float ? strtof(text, NULL) == (float)v : strtod(text, NULL) == v;
}

/* From the C library: printf's correctly rounded p digits for p = 1, 2,
 * ... until they or a neighbour (one unit of the last digit up or down:
 * next to a power of two, the interval is not centred on v) read back. */
static void shortest_slow(double v, int is_float, sq_decimal_t *out)
{
    char text[40];
    int max_digits = is_float ? 9 : 17;
    uint64_t digits = 0;
    int exp_last = 0;
    for (int p = 1; p <= max_digits; p++) {
        snprintf(text, sizeof(text), "%.*e", p - 1, v);
        digits = 0;
        const char *c = text;
        for (; *c != 'e'; c++)
            if (*c != '.')
                digits = digits * 10 + (uint64_t)(*c - '0');
        exp_last = atoi(c + 1) - (p - 1);
        if (reads_back(digits, exp_last, v, is_float))
            break;
        if (reads_back(digits + 1, exp_last, v, is_float)) {
            digits++;
            break;
        }
        if (digits > 1 && reads_back(digits - 1, exp_last, v, is_float)) {
            digits--;
            break;
        }
    }
    while (digits % 10 == 0) {
        digits /= 10;
        exp_last++;
    }
    int nd = 1;
    for (uint64_t t = digits; t >= 10; t /= 10)
        nd++;
    out->digits = digits;
    out->ndigits = nd;
    out->exp10 = exp_last + nd - 1;
}

void sq_shortest_double(double v, sq_decimal_t *out)
{
    v = fabs(v);
    if (v == 0 || !isfinite(v)) {
        *out = (sq_decimal_t){0, 1, 0};
        return;
    }
    uint64_t bits;
    memcpy(&bits, &v, sizeof(bits));
    int biased = (int)(bits >> 52);
    uint64_t frac = bits & ((1ull << 52) - 1);
    if (biased == 0 ||
        shortest_exact(frac | 1ull << 52, biased - 1075, frac == 0 && biased > 1, 17, out) != 0)
        shortest_slow(v, 0, out);
}

void sq_shortest_float(float v, sq_decimal_t *out)
{
    v = fabsf(v);
    if (v == 0 || !isfinite(v)) {
        *out = (sq_decimal_t){0, 1, 0};
        return;
    }
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    int biased = (int)(bits >> 23);
    uint32_t frac = bits & ((1u << 23) - 1);
    if (biased == 0 ||
        shortest_exact(frac | 1u << 23, biased - 150, frac == 0 && biased > 1, 9, out) != 0)
        shortest_slow(v, 1, out);
}

int sq_decimal_digits(const sq_decimal_t *d, char *out)
{
    static const char pairs[] =
        "00010203040506070809101112131415161718192021222324252627282930313233"
        "34353637383940414243444546474849505152535455565758596061626364656667"
        "6869707172737475767778798081828384858687888990919293949596979899";
    uint64_t x = d->digits;
    int i = d->ndigits;
    while (i >= 2) { /* two digits a division */
        memcpy(out + i - 2, pairs + 2 * (x % 100), 2);
        x /= 100;
        i -= 2;
    }
    if (i == 1)
        out[0] = (char)('0' + x);
    return d->ndigits;
}
