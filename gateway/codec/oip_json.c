/* JSON for the OIP codec: a flat validator, a lexer over validated text,
 * number conversion, base64 and float printing. */
#include "gw_codec.h"
#include "oip_int.h"

#include <sq.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int json_fail(const char *start, const char *p, const char *why, char *err, size_t errlen)
{
    snprintf(err, errlen, "invalid JSON at byte %zu: %s", (size_t)(p - start), why);
    return SQ_BAD_JSON;
}

/* Four hex digits at p (p + 4 <= end checked by the caller). */
static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int h = sq_hexval(p[i]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* Length of the UTF-8 sequence at p (valid, shortest form, no surrogates,
 * at most U+10FFFF), or 0 when invalid. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* Scans a string starting after its opening quote; returns the position
 * after the closing quote or NULL with *why set. */
static const char *scan_string(const char *p, const char *end, const char **why)
{
    for (;;) {
        while (p < end) {
            unsigned char ch = (unsigned char)*p;
            if (ch < 0x20 || ch == '"' || ch == '\\' || ch >= 0x80)
                break;
            p++;
        }
        if (p >= end) {
            *why = "unterminated string";
            return NULL;
        }
        unsigned char ch = (unsigned char)*p;
        if (ch == '"')
            return p + 1;
        if (ch < 0x20) {
            *why = "control character in a string";
            return NULL;
        }
        if (ch >= 0x80) {
            size_t n = utf8_len((const unsigned char *)p, (const unsigned char *)end);
            if (n == 0) {
                *why = "invalid UTF-8 in a string";
                return NULL;
            }
            p += n;
            continue;
        }
        /* backslash */
        if (end - p < 2) {
            *why = "unterminated string";
            return NULL;
        }
        char e = p[1];
        if (e == 'u') {
            if (end - p < 6 || hex4(p + 2) < 0) {
                *why = "bad \\u escape";
                return NULL;
            }
            int u = hex4(p + 2);
            p += 6;
            if (u >= 0xDC00 && u <= 0xDFFF) {
                *why = "lone low surrogate";
                return NULL;
            }
            if (u >= 0xD800 && u <= 0xDBFF) {
                int lo = (end - p >= 6 && p[0] == '\\' && p[1] == 'u') ? hex4(p + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    *why = "unpaired high surrogate";
                    return NULL;
                }
                p += 6;
            }
        } else if (strchr("\"\\/bfnrt", e) != NULL && e != '\0') {
            p += 2;
        } else {
            *why = "bad escape";
            return NULL;
        }
    }
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static const char *scan_number(const char *p, const char *end)
{
    if (p < end && *p == '-')
        p++;
    if (p >= end || !is_digit(*p))
        return NULL;
    if (*p == '0')
        p++;
    else
        while (p < end && is_digit(*p))
            p++;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p))
            return NULL;
        while (p < end && is_digit(*p))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || !is_digit(*p))
            return NULL;
        while (p < end && is_digit(*p))
            p++;
    }
    return p;
}

static const char *skip_ws_raw(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

int oip_json_validate(const char *s, size_t len, int max_depth, char *err, size_t errlen)
{
    /* The container stack: 1 = object, 0 = array. */
    unsigned char stack[GW_OIP_MAX_DEPTH];
    int depth = 0;
    const char *p = s, *end = s + len, *why = NULL;
    if (max_depth < 1 || max_depth > GW_OIP_MAX_DEPTH)
        max_depth = GW_OIP_MAX_DEPTH;
    p = skip_ws_raw(p, end);
value:
    if (p >= end)
        return json_fail(s, p, "unexpected end, expected a value", err, errlen);
    switch (*p) {
    case '{':
    case '[':
        if (depth == max_depth) {
            snprintf(err, errlen, "JSON nested deeper than %d levels (at byte %zu)", max_depth,
                     (size_t)(p - s));
            return SQ_TOO_LARGE;
        }
        stack[depth++] = *p == '{';
        p = skip_ws_raw(p + 1, end);
        if (p < end && *p == (stack[depth - 1] ? '}' : ']')) {
            depth--;
            p++;
            goto after;
        }
        if (stack[depth - 1])
            goto key;
        goto value;
    case '"':
        p = scan_string(p + 1, end, &why);
        if (p == NULL)
            return json_fail(s, end, why, err, errlen);
        goto after;
    case 't':
    case 'f':
    case 'n': {
        const char *lit = *p == 't' ? "true" : *p == 'f' ? "false" : "null";
        size_t n = strlen(lit);
        if ((size_t)(end - p) < n || memcmp(p, lit, n) != 0)
            return json_fail(s, p, "invalid literal", err, errlen);
        p += n;
        goto after;
    }
    default: {
        const char *q = scan_number(p, end);
        if (q == NULL)
            return json_fail(s, p, "unexpected character", err, errlen);
        p = q;
        goto after;
    }
    }
key:
    if (p >= end || *p != '"')
        return json_fail(s, p, "expected a string key", err, errlen);
    p = scan_string(p + 1, end, &why);
    if (p == NULL)
        return json_fail(s, end, why, err, errlen);
    p = skip_ws_raw(p, end);
    if (p >= end || *p != ':')
        return json_fail(s, p, "expected ':'", err, errlen);
    p = skip_ws_raw(p + 1, end);
    goto value;
after:
    p = skip_ws_raw(p, end);
    if (depth == 0) {
        if (p != end)
            return json_fail(s, p, "trailing characters after the JSON value", err, errlen);
        return 0;
    }
    if (p >= end)
        return json_fail(s, p, "unexpected end inside a container", err, errlen);
    if (*p == ',') {
        p = skip_ws_raw(p + 1, end);
        if (stack[depth - 1])
            goto key;
        goto value;
    }
    if (*p == (stack[depth - 1] ? '}' : ']')) {
        depth--;
        p++;
        goto after;
    }
    return json_fail(s, p, stack[depth - 1] ? "expected ',' or '}'" : "expected ',' or ']'", err,
                     errlen);
}

void oip_ws(oip_cur_t *c)
{
    c->p = skip_ws_raw(c->p, c->end);
}

char oip_peek(oip_cur_t *c)
{
    oip_ws(c);
    return c->p < c->end ? *c->p : 0;
}

int oip_accept(oip_cur_t *c, char ch)
{
    if (oip_peek(c) != ch)
        return 0;
    c->p++;
    return 1;
}

int oip_string(oip_cur_t *c, const char **s, size_t *n, int *escaped)
{
    if (oip_peek(c) != '"')
        return -1;
    const char *start = c->p + 1, *p = start;
    int esc = 0;
    for (;;) {
        const char *q = memchr(p, '"', (size_t)(c->end - p));
        if (q == NULL)
            return -1;
        /* The quote is escaped when an odd number of backslashes precede it. */
        size_t bs = 0;
        while (q - bs > start && q[-1 - (ptrdiff_t)bs] == '\\')
            bs++;
        if (bs)
            esc = 1;
        if (bs % 2 == 0) {
            if (!esc && memchr(start, '\\', (size_t)(q - start)) != NULL)
                esc = 1;
            *s = start;
            *n = (size_t)(q - start);
            *escaped = esc;
            c->p = q + 1;
            return 0;
        }
        p = q + 1;
    }
}

int oip_number(oip_cur_t *c, const char **s, size_t *n)
{
    oip_ws(c);
    const char *q = scan_number(c->p, c->end);
    if (q == NULL)
        return -1;
    *s = c->p;
    *n = (size_t)(q - c->p);
    c->p = q;
    return 0;
}

int oip_skip(oip_cur_t *c)
{
    char ch = oip_peek(c);
    if (ch == '"') {
        const char *s;
        size_t n;
        int e;
        return oip_string(c, &s, &n, &e);
    }
    if (ch == '{' || ch == '[') {
        /* Validated text: count brackets outside strings. */
        int depth = 0;
        while (c->p < c->end) {
            char x = *c->p;
            if (x == '"') {
                const char *s;
                size_t n;
                int e;
                if (oip_string(c, &s, &n, &e) != 0)
                    return -1;
                continue;
            }
            c->p++;
            if (x == '{' || x == '[')
                depth++;
            else if (x == '}' || x == ']') {
                if (--depth == 0)
                    return 0;
            }
        }
        return -1;
    }
    if (ch == 't' || ch == 'f' || ch == 'n') {
        size_t n = ch == 'f' ? 5 : 4;
        if ((size_t)(c->end - c->p) < n)
            return -1;
        c->p += n;
        return 0;
    }
    const char *s;
    size_t n;
    return oip_number(c, &s, &n);
}

static size_t put_utf8(char *out, unsigned u)
{
    if (u < 0x80) {
        out[0] = (char)u;
        return 1;
    }
    if (u < 0x800) {
        out[0] = (char)(0xC0 | u >> 6);
        out[1] = (char)(0x80 | (u & 0x3F));
        return 2;
    }
    if (u < 0x10000) {
        out[0] = (char)(0xE0 | u >> 12);
        out[1] = (char)(0x80 | (u >> 6 & 0x3F));
        out[2] = (char)(0x80 | (u & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | u >> 18);
    out[1] = (char)(0x80 | (u >> 12 & 0x3F));
    out[2] = (char)(0x80 | (u >> 6 & 0x3F));
    out[3] = (char)(0x80 | (u & 0x3F));
    return 4;
}

size_t oip_unescape(const char *s, size_t n, char *out)
{
    size_t o = 0;
    const char *end = s + n;
    while (s < end) {
        if (*s != '\\' || end - s < 2) {
            out[o++] = *s++;
            continue;
        }
        char e = s[1];
        s += 2;
        switch (e) {
        case 'b':
            out[o++] = '\b';
            break;
        case 'f':
            out[o++] = '\f';
            break;
        case 'n':
            out[o++] = '\n';
            break;
        case 'r':
            out[o++] = '\r';
            break;
        case 't':
            out[o++] = '\t';
            break;
        case 'u': {
            int u = end - s >= 4 ? hex4(s) : -1;
            if (u < 0) {
                out[o++] = '?';
                break;
            }
            s += 4;
            if (u >= 0xD800 && u <= 0xDBFF && end - s >= 6 && s[0] == '\\' && s[1] == 'u') {
                int lo = hex4(s + 2);
                if (lo >= 0xDC00 && lo <= 0xDFFF) {
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                    s += 6;
                }
            }
            /* \uXXXX is 6 bytes of input for at most 3 of output, a pair 12
             * for 4: the output never outgrows the input. */
            o += put_utf8(out + o, (unsigned)u);
            break;
        }
        default: /* " \ / */
            out[o++] = e;
            break;
        }
    }
    return o;
}

/* Exact powers of ten as doubles (10^22 is the last exact one). */
static const double exact_pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                     1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                     1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int f32_slow(const char *s, size_t n, float *out)
{
    char buf[128];
    float f;
    if (n < sizeof(buf)) {
        memcpy(buf, s, n);
        buf[n] = '\0';
        f = strtof(buf, NULL);
    } else {
        /* A number this long lies inside an array or object of validated
         * text, so a delimiter follows it within the buffer. */
        f = strtof(s, NULL);
    }
    if (isinf(f))
        return -1;
    *out = f;
    return 0;
}

/* Scans one JSON number at p and converts it to float, correctly rounded:
 * returns the end of the number (NULL when p holds none), *overflow set
 * when it is out of FP32 range. Clinger's fast path in double: up to 19
 * digits, exact when the mantissa fits in 53 bits and the power of ten is
 * exact, then one rounding to float. That second rounding is wrong only when
 * the double lands exactly on a float halfway point, which is checked. */
static const char *f32_scan(const char *p, const char *end, float *out, int *overflow)
{
    const char *s = p;
    int neg = 0, slow = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || !is_digit(*p))
        return NULL;
    uint64_t mant = 0;
    int digits = 0, exp10 = 0;
    if (*p == '0') {
        p++;
    } else {
        for (; p < end && is_digit(*p); p++) {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                slow = 1;
            }
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p))
            return NULL;
        for (; p < end && is_digit(*p); p++) {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                if (mant)
                    digits++;
                exp10--;
            } else {
                slow = 1;
            }
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0, e = 0;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        if (p >= end || !is_digit(*p))
            return NULL;
        for (; p < end && is_digit(*p); p++)
            if (e < 100000)
                e = e * 10 + (*p - '0');
        exp10 += eneg ? -e : e;
    }
    *overflow = 0;
    if (!slow && mant == 0) {
        *out = neg ? -0.0f : 0.0f;
        return p;
    }
    if (!slow && mant <= (1ull << 53) && exp10 >= -22 && exp10 <= 22) {
        double d = (double)mant;
        d = exp10 < 0 ? d / exact_pow10[-exp10] : d * exact_pow10[exp10];
        uint64_t bits;
        memcpy(&bits, &d, sizeof(bits));
        if ((bits & 0x1FFFFFFFull) != 0x10000000ull) {
            float f = (float)d; /* d < 2^53 * 1e22 < FLT_MAX, d >= 1e-22 */
            *out = neg ? -f : f;
            return p;
        }
    }
    if (f32_slow(s, (size_t)(p - s), out) != 0)
        *overflow = 1;
    return p;
}

int oip_parse_f32(const char *s, size_t n, float *out)
{
    int overflow;
    const char *q = f32_scan(s, s + n, out, &overflow);
    if (q != s + n || overflow)
        return -1;
    return 0;
}

int oip_read_numbers(oip_cur_t *c, int as_uint8, uint8_t *dst, size_t cap, size_t *count,
                     oip_bad_t *bad)
{
    const char *p = skip_ws_raw(c->p, c->end), *end = c->end;
    size_t n = 0;
    if (p < end && *p == ']') {
        c->p = p + 1;
        *count = 0;
        return 0;
    }
    for (;;) {
        const char *q;
        if (as_uint8) {
            /* Fast path: 1-3 digits, no leading zero, no fraction. */
            unsigned v = 0;
            for (q = p; q < end && is_digit(*q) && q - p < 4; q++)
                v = v * 10 + (unsigned)(*q - '0');
            size_t nd = (size_t)(q - p);
            if (nd == 0 || nd > 3 || v > 255 || (nd > 1 && *p == '0') ||
                (q < end && (*q == '.' || *q == 'e' || *q == 'E'))) {
                int64_t iv;
                q = scan_number(p, end);
                if (q == NULL) {
                    *bad = (oip_bad_t){OIP_BAD_NOT_NUMBER, n, p, 0};
                    return -1;
                }
                if (oip_parse_int(p, (size_t)(q - p), 0, 255, &iv) != 0) {
                    *bad = (oip_bad_t){OIP_BAD_UINT8, n, p, (size_t)(q - p)};
                    return -1;
                }
                v = (unsigned)iv;
            }
            if (n < cap)
                dst[n] = (uint8_t)v;
        } else {
            float f;
            int overflow;
            q = f32_scan(p, end, &f, &overflow);
            if (q == NULL) {
                *bad = (oip_bad_t){OIP_BAD_NOT_NUMBER, n, p, 0};
                return -1;
            }
            if (overflow) {
                *bad = (oip_bad_t){OIP_BAD_FP32_RANGE, n, p, (size_t)(q - p)};
                return -1;
            }
            if (n < cap)
                memcpy(dst + 4 * n, &f, 4);
        }
        n++;
        p = skip_ws_raw(q, end);
        if (p < end && *p == ',') {
            p = skip_ws_raw(p + 1, end);
            continue;
        }
        if (p < end && *p == ']') {
            c->p = p + 1;
            *count = n;
            return 0;
        }
        *bad = (oip_bad_t){OIP_BAD_SYNTAX, n, p, 0};
        return -1;
    }
}

double oip_parse_f64(const char *s, size_t n)
{
    char buf[128];
    if (n < sizeof(buf)) {
        memcpy(buf, s, n);
        buf[n] = '\0';
        return strtod(buf, NULL);
    }
    return strtod(s, NULL); /* see f32_slow */
}

int oip_parse_int(const char *s, size_t n, int64_t min, int64_t max, int64_t *out)
{
    const char *p = s, *end = s + n;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end)
        return -1;
    uint64_t v = 0;
    for (; p < end; p++) {
        if (!is_digit(*p))
            return -1;
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > (uint64_t)INT64_MAX)
        return -1;
    int64_t x = neg ? -(int64_t)v : (int64_t)v;
    if (x < min || x > max)
        return -1;
    *out = x;
    return 0;
}

/* ---- base64 ---- */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* 0..63, or 0x80 for anything outside the alphabet. */
static const uint8_t b64_table[256] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x3e, 0x80, 0x80, 0x80, 0x3f,
    0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x3b, 0x3c, 0x3d, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
    0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28,
    0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32, 0x33, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
};

size_t gw_oip_base64_decoded_max(size_t len)
{
    return len / 4 * 3;
}

long long gw_oip_base64_decode(const char *in, size_t len, uint8_t *out)
{
    const uint8_t *t = b64_table;
    const unsigned char *s = (const unsigned char *)in;
    if (len % 4 != 0)
        return -1;
    if (len == 0)
        return 0;
    size_t o = 0, full = len - 4;
    for (size_t i = 0; i < full; i += 4) {
        uint8_t a = t[s[i]], b = t[s[i + 1]], c = t[s[i + 2]], d = t[s[i + 3]];
        if ((a | b | c | d) & 0x80)
            return -1;
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | d;
        out[o++] = (uint8_t)(v >> 16);
        out[o++] = (uint8_t)(v >> 8);
        out[o++] = (uint8_t)v;
    }
    /* The last group: "xxxx", "xxx=" or "xx==", with zero pad bits. */
    const unsigned char *g = s + full;
    uint8_t a = t[g[0]], b = t[g[1]];
    if ((a | b) & 0x80)
        return -1;
    if (g[2] == '=') {
        if (g[3] != '=' || (b & 0x0F) != 0)
            return -1;
        out[o++] = (uint8_t)(a << 2 | b >> 4);
        return (long long)o;
    }
    uint8_t c = t[g[2]];
    if (c & 0x80)
        return -1;
    if (g[3] == '=') {
        if ((c & 0x03) != 0)
            return -1;
        out[o++] = (uint8_t)(a << 2 | b >> 4);
        out[o++] = (uint8_t)(b << 4 | c >> 2);
        return (long long)o;
    }
    uint8_t d = t[g[3]];
    if (d & 0x80)
        return -1;
    out[o++] = (uint8_t)(a << 2 | b >> 4);
    out[o++] = (uint8_t)(b << 4 | c >> 2);
    out[o++] = (uint8_t)(c << 6 | d);
    return (long long)o;
}

size_t gw_oip_base64_encode(const uint8_t *in, size_t len, char *out)
{
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = b64_alphabet[v >> 18];
        out[o++] = b64_alphabet[v >> 12 & 63];
        out[o++] = b64_alphabet[v >> 6 & 63];
        out[o++] = b64_alphabet[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = b64_alphabet[v >> 18];
        out[o++] = b64_alphabet[v >> 12 & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = b64_alphabet[v >> 18];
        out[o++] = b64_alphabet[v >> 12 & 63];
        out[o++] = b64_alphabet[v >> 6 & 63];
        out[o++] = '=';
    }
    return o;
}

/* ---- float printing ---- */

int gw_oip_format_float(float f, char *buf)
{
    /* The fewest digits that read back as the same float (0.1f is "0.1",
     * not %.9g's "0.100000001"): what a client that reads the number and
     * rounds it to FP32 gets back is f, and the text is short. */
    if (!isfinite(f)) {
        memcpy(buf, "null", 5);
        return 4;
    }
    char *o = buf;
    if (signbit(f))
        *o++ = '-';
    if (f == 0) {
        *o++ = '0';
        *o = '\0';
        return (int)(o - buf);
    }
    sq_decimal_t dec;
    sq_shortest_float(f, &dec);
    char d[20];
    int nd = sq_decimal_digits(&dec, d);
    int e10 = dec.exp10;
    if (e10 >= -4 && e10 < 9) {
        if (e10 >= 0) {
            for (int i = 0; i <= e10; i++)
                *o++ = i < nd ? d[i] : '0';
            if (nd > e10 + 1) {
                *o++ = '.';
                for (int i = e10 + 1; i < nd; i++)
                    *o++ = d[i];
            }
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -e10 - 1; i++)
                *o++ = '0';
            for (int i = 0; i < nd; i++)
                *o++ = d[i];
        }
    } else {
        *o++ = d[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++)
                *o++ = d[i];
        }
        o += sprintf(o, "e%d", e10);
    }
    *o = '\0';
    return (int)(o - buf);
}
