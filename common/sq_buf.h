/* Growable byte buffer and a bounds-checked little-endian reader. Used for
 * IPC payloads. The writer aborts on OOM (bookkeeping); the reader never
 * reads past its end and reports truncation through a sticky error flag. */
#ifndef SQ_BUF_H
#define SQ_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *data;
    size_t len;
    size_t cap;
} sq_buf_t;

void sq_buf_init(sq_buf_t *b);
void sq_buf_dispose(sq_buf_t *b);
void sq_buf_reserve(sq_buf_t *b, size_t extra);
void sq_buf_put(sq_buf_t *b, const void *p, size_t n);
/* printf's text appended (any length). */
void sq_buf_printf(sq_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sq_buf_put_u8(sq_buf_t *b, uint8_t v);
void sq_buf_put_u16(sq_buf_t *b, uint16_t v);
void sq_buf_put_u32(sq_buf_t *b, uint32_t v);
void sq_buf_put_u64(sq_buf_t *b, uint64_t v);
void sq_buf_put_f64(sq_buf_t *b, double v);
/* A string as u32 length + bytes (no terminator). */
void sq_buf_put_str(sq_buf_t *b, const char *s);
void sq_buf_put_bytes(sq_buf_t *b, const void *p, uint32_t n);
/* Drops the first n bytes. */
void sq_buf_consume(sq_buf_t *b, size_t n);

/* Immutable bytes shared by reference count: a model file that squishd's
 * dispatcher keeps and that worker connections send without copying it
 * (sq_conn_send_ref). Whoever holds a reference may read data[0..len);
 * the last sq_bytes_unref frees it. References may be taken and dropped on
 * any thread. */
typedef struct {
    _Atomic long refs;
    size_t len;
    uint8_t *data;
} sq_bytes_t;

/* Takes ownership of data (malloc'd, or NULL when len is 0); one reference. */
sq_bytes_t *sq_bytes_adopt(void *data, size_t len);
/* Another reference to b; returns b. */
sq_bytes_t *sq_bytes_ref(sq_bytes_t *b);
/* Drops a reference; accepts NULL. */
void sq_bytes_unref(sq_bytes_t *b);

typedef struct {
    const uint8_t *p;
    size_t left;
    int err; /* set once a read runs past the end; later reads return zeros */
} sq_reader_t;

void sq_reader_init(sq_reader_t *r, const void *p, size_t n);
uint8_t sq_get_u8(sq_reader_t *r);
uint16_t sq_get_u16(sq_reader_t *r);
uint32_t sq_get_u32(sq_reader_t *r);
uint64_t sq_get_u64(sq_reader_t *r);
double sq_get_f64(sq_reader_t *r);
/* Returns a pointer into the payload and its length, or NULL on truncation
 * or when the length exceeds max_len. */
const uint8_t *sq_get_bytes(sq_reader_t *r, uint32_t *len, uint32_t max_len);
/* Copies a string into out (NUL-terminated); truncation of the payload or
 * a string longer than out_size-1 or containing NUL sets err. */
void sq_get_str(sq_reader_t *r, char *out, size_t out_size);

void sq_put_le16(uint8_t *p, uint16_t v);
void sq_put_le32(uint8_t *p, uint32_t v);
void sq_put_le64(uint8_t *p, uint64_t v);
uint16_t sq_le16(const uint8_t *p);
uint32_t sq_le32(const uint8_t *p);
uint64_t sq_le64(const uint8_t *p);

#endif
