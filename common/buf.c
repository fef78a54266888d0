#include "sq_buf.h"
#include "sq_alloc.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sq_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

void sq_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void sq_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint16_t sq_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

uint32_t sq_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t sq_le64(const uint8_t *p)
{
    return (uint64_t)sq_le32(p) | ((uint64_t)sq_le32(p + 4) << 32);
}

void sq_buf_init(sq_buf_t *b)
{
    b->data = NULL;
    b->len = b->cap = 0;
}

void sq_buf_dispose(sq_buf_t *b)
{
    free(b->data);
    sq_buf_init(b);
}

void sq_buf_reserve(sq_buf_t *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    b->data = sq_xrealloc(b->data, cap);
    b->cap = cap;
}

void sq_buf_put(sq_buf_t *b, const void *p, size_t n)
{
    if (n == 0)
        return;
    sq_buf_reserve(b, n);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void sq_buf_printf(sq_buf_t *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        sq_buf_put(b, tmp, (size_t)n);
        return;
    }
    sq_buf_reserve(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sq_buf_put_u8(sq_buf_t *b, uint8_t v)
{
    sq_buf_put(b, &v, 1);
}

void sq_buf_put_u16(sq_buf_t *b, uint16_t v)
{
    uint8_t t[2];
    sq_put_le16(t, v);
    sq_buf_put(b, t, 2);
}

void sq_buf_put_u32(sq_buf_t *b, uint32_t v)
{
    uint8_t t[4];
    sq_put_le32(t, v);
    sq_buf_put(b, t, 4);
}

void sq_buf_put_u64(sq_buf_t *b, uint64_t v)
{
    uint8_t t[8];
    sq_put_le64(t, v);
    sq_buf_put(b, t, 8);
}

void sq_buf_put_f64(sq_buf_t *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    sq_buf_put_u64(b, u);
}

void sq_buf_put_bytes(sq_buf_t *b, const void *p, uint32_t n)
{
    sq_buf_put_u32(b, n);
    sq_buf_put(b, p, n);
}

void sq_buf_put_str(sq_buf_t *b, const char *s)
{
    sq_buf_put_bytes(b, s, (uint32_t)strlen(s));
}

void sq_buf_consume(sq_buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

sq_bytes_t *sq_bytes_adopt(void *data, size_t len)
{
    sq_bytes_t *b = sq_xmalloc(sizeof(*b));
    atomic_init(&b->refs, 1);
    b->len = len;
    b->data = data;
    return b;
}

sq_bytes_t *sq_bytes_ref(sq_bytes_t *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

void sq_bytes_unref(sq_bytes_t *b)
{
    if (b == NULL || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
        return;
    free(b->data);
    free(b);
}

void sq_reader_init(sq_reader_t *r, const void *p, size_t n)
{
    r->p = p;
    r->left = n;
    r->err = 0;
}

static const uint8_t *take(sq_reader_t *r, size_t n)
{
    if (r->err || r->left < n) {
        r->err = 1;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

uint8_t sq_get_u8(sq_reader_t *r)
{
    const uint8_t *p = take(r, 1);
    return p ? p[0] : 0;
}

uint16_t sq_get_u16(sq_reader_t *r)
{
    const uint8_t *p = take(r, 2);
    return p ? sq_le16(p) : 0;
}

uint32_t sq_get_u32(sq_reader_t *r)
{
    const uint8_t *p = take(r, 4);
    return p ? sq_le32(p) : 0;
}

uint64_t sq_get_u64(sq_reader_t *r)
{
    const uint8_t *p = take(r, 8);
    return p ? sq_le64(p) : 0;
}

double sq_get_f64(sq_reader_t *r)
{
    uint64_t u = sq_get_u64(r);
    double v;
    memcpy(&v, &u, 8);
    return v;
}

const uint8_t *sq_get_bytes(sq_reader_t *r, uint32_t *len, uint32_t max_len)
{
    uint32_t n = sq_get_u32(r);
    if (r->err || n > max_len) {
        r->err = 1;
        *len = 0;
        return NULL;
    }
    const uint8_t *p = take(r, n);
    *len = p ? n : 0;
    return p;
}

void sq_get_str(sq_reader_t *r, char *out, size_t out_size)
{
    uint32_t n;
    const uint8_t *p = sq_get_bytes(r, &n, out_size > 0 ? (uint32_t)(out_size - 1) : 0);
    if (p == NULL || memchr(p, '\0', n) != NULL) {
        r->err = 1;
        if (out_size)
            out[0] = '\0';
        return;
    }
    memcpy(out, p, n);
    out[n] = '\0';
}
