/* Internals of the OIP codec shared by oip.c (requests), oip_data.c (tensor
 * data), oip_lex.c (the decoder's shared pieces and typed values),
 * oip_response.c and oip_json.c (a strict JSON validator and the small
 * lexer the request decoder walks the validated text with). */
#ifndef OIP_INT_H
#define OIP_INT_H

#include "gw_codec.h"

#include <stddef.h>
#include <stdint.h>

/* Validates s as one RFC 8259 JSON text (strings: escapes, surrogate pairs,
 * UTF-8, no control characters) without recursion. Containers nest at most
 * max_depth deep. Returns 0, SQ_TOO_LARGE (too deep) or SQ_BAD_JSON, with
 * the byte offset in err. */
int oip_json_validate(const char *s, size_t len, int max_depth, char *err, size_t errlen);

/* A cursor over validated JSON. Every function still bounds-checks and
 * reports a malformed token with -1, so a caller that skipped validation
 * cannot make it read out of bounds. */
typedef struct {
    const char *p;
    const char *end;
} oip_cur_t;

void oip_ws(oip_cur_t *c);
/* Whether the next non-space character is ch; consumes it when it is. */
int oip_accept(oip_cur_t *c, char ch);
/* Next non-space character without consuming it, or 0 at the end. */
char oip_peek(oip_cur_t *c);
/* A string token: (*s, *n) is the raw text between the quotes, *escaped whether
 * it holds backslashes. */
int oip_string(oip_cur_t *c, const char **s, size_t *n, int *escaped);
/* A number token's text. */
int oip_number(oip_cur_t *c, const char **s, size_t *n);
/* Skips one value of any kind. */
int oip_skip(oip_cur_t *c);
/* Unescapes the raw text of a validated string into out (at most n bytes);
 * returns the length. */
size_t oip_unescape(const char *s, size_t n, char *out);

/* Converts a JSON number's text to float, correctly rounded. Returns 0, or
 * -1 when it overflows FP32. */
int oip_parse_f32(const char *s, size_t n, float *out);
/* Why oip_read_numbers stopped: the element's index in its array and text. */
enum { OIP_BAD_NOT_NUMBER = 1, OIP_BAD_FP32_RANGE, OIP_BAD_UINT8, OIP_BAD_SYNTAX };
typedef struct {
    int kind;
    size_t index;
    const char *s;
    size_t n;
} oip_bad_t;

/* Reads the numbers of one array whose '[' was consumed, through its ']',
 * as FP32 (4 bytes each) or UINT8 (integers 0..255) into dst; elements past
 * cap are counted, not stored. The hot loop of JSON tensors. Returns 0 with
 * *count, or -1 with *bad. */
int oip_read_numbers(oip_cur_t *c, int as_uint8, uint8_t *dst, size_t cap, size_t *count,
                     oip_bad_t *bad);
/* Converts a JSON number's text to double. */
double oip_parse_f64(const char *s, size_t n);
/* An integer (no fraction, no exponent) in [min, max]: 0, else -1. */
int oip_parse_int(const char *s, size_t n, int64_t min, int64_t max, int64_t *out);

/* ---- the request decoder's state, shared by oip.c and oip_data.c ---- */

#define OIP_MAX_REQ_DIMS (GW_OIP_MAX_DIMS + 1)

typedef struct {
    const gw_oip_model_t *model;
    gw_oip_request_t *req;
    const uint8_t *body;
    size_t len;
    long long header_len;
    size_t bin_off; /* next unread byte of the binary part */
    char *err;
    size_t errlen;
    char path[192];
    size_t plen;
} oip_dec_t;

/* The members of one element of "inputs", as read. */
typedef struct {
    char name[GW_OIP_NAME_MAX + 2];
    size_t name_len;
    int have_name;
    char datatype[16];
    size_t datatype_len;
    int have_datatype;
    int64_t shape[OIP_MAX_REQ_DIMS];
    int ndim;            /* -1: absent */
    int64_t binary_size; /* -1: absent */
    oip_cur_t data;      /* where "data" starts */
    int have_data;
    /* parameters.shared_memory_*: region "" absent; offset, size -1 absent */
    char shm_region[GW_OIP_REGION_MAX + 1];
    int have_shm_region;
    int64_t shm_offset;
    int64_t shm_size;
} oip_input_fields_t;

/* Fails with code and "<path>: <message>" in d->err. */
__attribute__((format(printf, 3, 4))) int oip_fail(oip_dec_t *d, int code, const char *fmt, ...);
/* Append ".key" or "[i]" to the error path; return the length to restore. */
size_t oip_path_key(oip_dec_t *d, const char *key);
size_t oip_path_index(oip_dec_t *d, size_t i);
void oip_path_pop(oip_dec_t *d, size_t old);
/* The validated text disagrees with the lexer (SQ_BAD_JSON). */
int oip_malformed(oip_dec_t *d);
/* "[N,3,224,224]" (batch < 0) or "[2,3,224,224]". */
void oip_shape_str(char *buf, size_t cap, long long batch, const int64_t *item, int ndim);
/* Memory the request owns (freed by gw_oip_request_dispose); NULL on OOM. */
void *oip_req_alloc(gw_oip_request_t *r, size_t n);
/* Next element of an array whose '[' was consumed: 1, 0 at the end, <0 error. */
int oip_next_elem(oip_dec_t *d, oip_cur_t *c, int *first);
/* Reads "data" at *cur (advanced past it) into the input's rows. */
int oip_read_json_data(oip_dec_t *d, oip_cur_t *cur, gw_oip_input_t *in,
                       const oip_input_fields_t *f, size_t item, int batch);
/* Takes the input's tensor from the binary part at d->bin_off. */
int oip_read_binary_data(oip_dec_t *d, gw_oip_input_t *in, const oip_input_fields_t *f, size_t item,
                         int batch);
/* Points the input's rows into the n bytes at p, which hold its whole
 * tensor in the binary extension's form: FP32/UINT8 rows one after the
 * other (n already checked), or BYTES elements each a 4-byte little-endian
 * length then its bytes, filling n exactly. */
int oip_split_rows(oip_dec_t *d, gw_oip_input_t *in, const uint8_t *p, size_t n, size_t item,
                   int batch);

/* ---- values of the request walk, each failing with its path ---- */

/* Next member of an object whose '{' was consumed: 1 with the key (keys
 * longer than keycap - 1 come back truncated and match nothing known), 0 at
 * the end, <0 on error. */
int oip_next_key(oip_dec_t *d, oip_cur_t *c, int *first, char *key, size_t keycap);
/* Skips one value (SQ_BAD_JSON when the lexer disagrees). */
int oip_skip_value(oip_dec_t *d, oip_cur_t *c);
/* Reads a boolean value; SQ_BAD_REQUEST naming the path otherwise. */
int oip_read_bool(oip_dec_t *d, oip_cur_t *c, int *out);
/* Whether ch can begin a JSON number. */
int oip_is_number_start(char ch);
/* An integer in [min, max], else SQ_BAD_REQUEST with what. */
int oip_read_int(oip_dec_t *d, oip_cur_t *c, int64_t min, int64_t max, int64_t *out,
                 const char *what);
/* A string value unescaped into out (cap bytes with the NUL); *len gets the
 * full length even when it did not fit. */
int oip_read_string(oip_dec_t *d, oip_cur_t *c, char *out, size_t cap, size_t *len);
/* parameters.shared_memory_region: a region's name, 1..GW_OIP_REGION_MAX
 * bytes without NUL; refused where the model does not take shared memory. */
int oip_read_region(oip_dec_t *d, oip_cur_t *c, char *out);

#endif
