/* JSON printing with shortest round-trip reals (see sq_json.h). */
#include "sq_json.h"

#include "sq_alloc.h"
#include "sq_text.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jansson's parser refuses deeper nesting (JSON_PARSER_MAX_DEPTH). */
#define SQ_JSON_MAX_DEPTH 2048

size_t sq_json_real(double v, char *out)
{
    if (!isfinite(v)) {
        memcpy(out, "null", 5);
        return 4;
    }
    sq_decimal_t d;
    sq_shortest_double(v, &d);
    char digits[20];
    int ndigits = sq_decimal_digits(&d, digits);
    int exp10 = d.exp10;

    char *o = out;
    if (signbit(v))
        *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++)
                *o++ = i < ndigits ? digits[i] : '0';
            *o++ = '.';
            if (ndigits > exp10 + 1) {
                memcpy(o, digits + exp10 + 1, (size_t)(ndigits - exp10 - 1));
                o += ndigits - exp10 - 1;
            } else {
                *o++ = '0';
            }
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp10 - 1; i++)
                *o++ = '0';
            memcpy(o, digits, (size_t)ndigits);
            o += ndigits;
        }
    } else {
        *o++ = digits[0];
        if (ndigits > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(ndigits - 1));
            o += ndigits - 1;
        }
        o += sprintf(o, "e%d", exp10);
    }
    *o = '\0';
    return (size_t)(o - out);
}

/* ---- strings ---- */

static void put_lit(sq_buf_t *b, const char *s)
{
    sq_buf_put(b, s, strlen(s));
}

/* The length of the UTF-8 sequence at s (n bytes left), or 0 when it is
 * not one (overlong, a surrogate, past U+10FFFF, truncated). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, cp = c & 0x07;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* A JSON string: '"', '\\' and the control characters escaped, UTF-8 as
 * it is, a byte that is not UTF-8 as U+FFFD. */
static void put_string(sq_buf_t *b, const char *str, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    sq_buf_reserve(b, n + 2);
    sq_buf_put_u8(b, '"');
    size_t run = 0, i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0x80) {
            size_t len = utf8_len(s + i, n - i);
            if (len > 0) {
                i += len;
                continue;
            }
        }
        sq_buf_put(b, s + run, i - run);
        char esc[7] = {'\\', 0};
        switch (c) {
        case '"':
        case '\\':
            esc[1] = (char)c;
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            if (c >= 0x80)
                memcpy(esc + 1, "ufffd", 5);
            else
                snprintf(esc + 1, sizeof(esc) - 1, "u00%c%c", hex[c >> 4], hex[c & 15]);
            break;
        }
        put_lit(b, esc);
        run = ++i;
    }
    sq_buf_put(b, s + run, n - run);
    sq_buf_put_u8(b, '"');
}

/* ---- values ---- */

typedef struct {
    sq_buf_t *out;
    int indent; /* spaces per level; 0: one line */
    int compact;
    int sort_keys;
} dumper_t;

/* Before an item at depth (after its ',' or its opening bracket), or
 * before a closing bracket: a new line and the indent, or the one space of
 * jansson's default layout between items. */
static void put_break(const dumper_t *d, int depth)
{
    if (d->indent > 0) {
        sq_buf_put_u8(d->out, '\n');
        for (int i = 0; i < depth * d->indent; i++)
            sq_buf_put_u8(d->out, ' ');
    } else if (!d->compact) {
        sq_buf_put_u8(d->out, ' ');
    }
}

typedef struct {
    const char *key;
    size_t len;
    json_t *value;
} member_t;

static int member_cmp(const void *a, const void *b)
{
    const member_t *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, n);
    return c != 0 ? c : (x->len > y->len) - (x->len < y->len);
}

static int dump_value(const dumper_t *d, const json_t *j, int depth);

static int dump_object(const dumper_t *d, const json_t *j, int depth)
{
    size_t n = json_object_size(j);
    if (n == 0) {
        put_lit(d->out, "{}");
        return 0;
    }
    member_t *members = sq_xmalloc(n * sizeof(*members));
    size_t count = 0;
    const char *key;
    size_t len;
    json_t *value;
    json_object_keylen_foreach((json_t *)j, key, len, value)
    {
        members[count++] = (member_t){key, len, value};
    }
    if (d->sort_keys)
        qsort(members, count, sizeof(*members), member_cmp);
    int rc = 0;
    sq_buf_put_u8(d->out, '{');
    for (size_t i = 0; i < count && rc == 0; i++) {
        if (i > 0)
            sq_buf_put_u8(d->out, ',');
        if (d->indent > 0 || i > 0)
            put_break(d, depth + 1);
        put_string(d->out, members[i].key, members[i].len);
        put_lit(d->out, d->compact ? ":" : ": ");
        rc = dump_value(d, members[i].value, depth + 1);
    }
    free(members);
    if (d->indent > 0)
        put_break(d, depth);
    sq_buf_put_u8(d->out, '}');
    return rc;
}

static int dump_array(const dumper_t *d, const json_t *j, int depth)
{
    size_t n = json_array_size(j);
    if (n == 0) {
        put_lit(d->out, "[]");
        return 0;
    }
    sq_buf_put_u8(d->out, '[');
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            sq_buf_put_u8(d->out, ',');
        if (d->indent > 0 || i > 0)
            put_break(d, depth + 1);
        if (dump_value(d, json_array_get(j, i), depth + 1) != 0)
            return -1;
    }
    if (d->indent > 0)
        put_break(d, depth);
    sq_buf_put_u8(d->out, ']');
    return 0;
}

static int dump_value(const dumper_t *d, const json_t *j, int depth)
{
    if (j == NULL || depth > SQ_JSON_MAX_DEPTH)
        return -1;
    char text[SQ_JSON_REAL_MAX];
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        return dump_object(d, j, depth);
    case JSON_ARRAY:
        return dump_array(d, j, depth);
    case JSON_STRING:
        put_string(d->out, json_string_value(j), json_string_length(j));
        return 0;
    case JSON_INTEGER:
        snprintf(text, sizeof(text), "%" JSON_INTEGER_FORMAT, json_integer_value(j));
        put_lit(d->out, text);
        return 0;
    case JSON_REAL:
        sq_buf_put(d->out, text, sq_json_real(json_real_value(j), text));
        return 0;
    case JSON_TRUE:
        put_lit(d->out, "true");
        return 0;
    case JSON_FALSE:
        put_lit(d->out, "false");
        return 0;
    case JSON_NULL:
        put_lit(d->out, "null");
        return 0;
    }
    return -1;
}

int sq_json_dump_buf(const json_t *j, size_t flags, sq_buf_t *out)
{
    assert((flags & ~(size_t)SQ_JSON_FLAGS) == 0);
    dumper_t d = {.out = out,
                  .indent = (int)(flags & JSON_MAX_INDENT),
                  .compact = (flags & JSON_COMPACT) != 0,
                  .sort_keys = (flags & JSON_SORT_KEYS) != 0};
    size_t start = out->len;
    if (dump_value(&d, j, 0) != 0) {
        out->len = start;
        return -1;
    }
    return 0;
}

char *sq_json_dumps(const json_t *j, size_t flags)
{
    sq_buf_t b;
    sq_buf_init(&b);
    if (sq_json_dump_buf(j, flags, &b) != 0) {
        sq_buf_dispose(&b);
        return NULL;
    }
    sq_buf_put_u8(&b, '\0');
    return (char *)b.data; /* sq_buf_dispose would free it */
}
