/* Small text forms written once for every module: hex digits and strings,
 * and the HOST:PORT of a flag or a link address. */
#ifndef SQ_TEXT_H
#define SQ_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* The value of hex digit c (either case), or -1. */
int sq_hexval(int c);

/* n bytes as 2n lower-case hex digits and a NUL in out (2n + 1 bytes). */
void sq_hex_encode(const uint8_t *in, size_t n, char *out);

/* Exactly 2n hex digits (then the string's end) into n bytes: 0, or -1 on
 * a wrong length or a non-hex character. */
int sq_hex_decode(const char *hex, uint8_t *out, size_t n);

/* A whole string as a decimal integer (sign allowed, no trailing text, no
 * overflow): 0 with *out set, or -1. */
int sq_parse_ll(const char *s, long long *out);

/* Splits "HOST:PORT" or "[IPV6]:PORT" (the brackets dropped) into host and
 * a port in 0..65535 (decimal digits only): 0, or -1 when the form is not
 * that, the host is empty or does not fit hostlen. The host is not
 * resolved. */
int sq_hostport_split(const char *spec, char *host, size_t hostlen, int *port);

/* A nonnegative number in decimal: digits (ndigits of them, no trailing
 * zeros; 0 for zero) times 10^(exp10 - ndigits + 1), so exp10 is the power
 * of ten of the first digit (scientific notation's exponent). */
typedef struct {
    uint64_t digits;
    int ndigits;
    int exp10;
} sq_decimal_t;

/* |v| as the decimal with the fewest significant digits that strtod (for
 * a double) or strtof (for a float) reads back as |v|, and of those the
 * nearest to it: 0.1f is 0.1, not 0.100000001; 0.025 is 0.025, not
 * 0.025000000000000001. Zero, NaN and the infinities give 0; the sign is
 * the caller's to write. Exact 128-bit integer arithmetic for most
 * numbers, the C library's printf and strtod for the others. */
void sq_shortest_double(double v, sq_decimal_t *out);
void sq_shortest_float(float v, sq_decimal_t *out);

/* Writes d's digits (d->ndigits characters, no NUL) into out; returns
 * their count. */
int sq_decimal_digits(const sq_decimal_t *d, char *out);

#endif
