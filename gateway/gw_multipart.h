/* A strict, bounded multipart/form-data parser (RFC 7578 over RFC 2046).
 * Pure: no allocation, no I/O; parts point into the body. Used for model
 * uploads and multi-image inference; fuzzed (tests/fuzz). */
#ifndef GW_MULTIPART_H
#define GW_MULTIPART_H

#include <stddef.h>
#include <stdint.h>

#define GW_MULTIPART_MAX_BOUNDARY 70  /* RFC 2046 */
#define GW_MULTIPART_MAX_HEADERS 4096 /* bytes of headers per part */

typedef struct {
    const char *name; /* form field name (not terminated; name_len) */
    size_t name_len;
    const char *filename; /* NULL when absent */
    size_t filename_len;
    const char *content_type; /* NULL when absent */
    size_t content_type_len;
    const uint8_t *data;
    size_t len;
} gw_part_t;

/* Extracts the boundary parameter of a multipart/form-data Content-Type
 * (quoted or not) into out (terminated). Returns 0, or SQ_MEDIA_TYPE when
 * the type is not multipart/form-data, or SQ_BAD_MULTIPART for a missing or
 * invalid boundary. */
int gw_multipart_boundary(const char *content_type, size_t len, char *out, size_t outlen);

/* Splits body into at most max_parts parts. Returns 0 with *nparts set, or
 * SQ_BAD_MULTIPART with a reason in err (missing delimiter, no closing
 * delimiter, a part without Content-Disposition form-data name, oversized
 * headers, malformed header line), or SQ_TOO_LARGE when there are more
 * than max_parts parts. */
int gw_multipart_parse(const uint8_t *body, size_t len, const char *boundary, gw_part_t *parts,
                       int max_parts, int *nparts, char *err, size_t errlen);

/* Whether a part's name equals s. */
int gw_part_is(const gw_part_t *p, const char *s);

#endif
