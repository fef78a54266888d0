/* libFuzzer target for the multipart/form-data parser (gateway/multipart.c).
 *
 * Input: a Content-Type value, a newline, then the body, as a client sends
 * them with an upload or a multi-image inference. The boundary is taken from
 * the Content-Type by gw_multipart_boundary; a body is split only when that
 * succeeds, as the server does. Both halves are copied into buffers of their
 * exact size (the Content-Type not terminated), so that ASan reports a read
 * one byte past either. A success must give parts that lie inside the body,
 * each with a non-empty field name inside its headers; a failure must be
 * one of the documented codes with a reason. */
#include <gw_codec.h>
#include <sq.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_PARTS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int inside(const void *p, size_t n, const uint8_t *base, size_t len)
{
    const uint8_t *q = p;
    return q >= base && n <= len && (size_t)(q - base) <= len - n;
}

static void check_parts(const gw_part_t *parts, int nparts, const uint8_t *body, size_t len)
{
    volatile uint8_t sink = 0;
    if (nparts < 0 || nparts > FUZZ_MAX_PARTS)
        abort();
    for (int i = 0; i < nparts; i++) {
        const gw_part_t *p = &parts[i];
        if (p->name == NULL || p->name_len == 0 || !inside(p->name, p->name_len, body, len) ||
            !inside(p->data, p->len, body, len))
            abort();
        if (p->filename != NULL && !inside(p->filename, p->filename_len, body, len))
            abort();
        if (p->content_type != NULL && !inside(p->content_type, p->content_type_len, body, len))
            abort();
        /* A part's data ends where the next delimiter starts: CRLF "--". */
        if ((size_t)(p->data - body) + p->len + 2 > len || p->data[p->len] != '\r' ||
            p->data[p->len + 1] != '\n')
            abort();
        for (size_t k = 0; k < p->len; k++) /* ASan checks every byte */
            sink ^= p->data[k];
        char name[64];
        size_t n = p->name_len < sizeof(name) - 1 ? p->name_len : sizeof(name) - 1;
        memcpy(name, p->name, n);
        name[n] = '\0';
        if (memchr(name, '\0', n) == NULL && !gw_part_is(p, name) && n == p->name_len)
            abort(); /* a name equals itself */
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t ct_len = nl ? (size_t)(nl - data) : size;
    size_t body_len = nl ? size - ct_len - 1 : 0;
    char *ct = malloc(ct_len ? ct_len : 1);
    uint8_t *body = malloc(body_len ? body_len : 1);
    if (ct == NULL || body == NULL)
        abort();
    memcpy(ct, data, ct_len);
    if (body_len)
        memcpy(body, nl + 1, body_len);

    char boundary[GW_MULTIPART_MAX_BOUNDARY + 1];
    int rc = gw_multipart_boundary(ct, ct_len, boundary, sizeof(boundary));
    if (rc == 0) {
        size_t blen = strlen(boundary);
        if (blen == 0 || blen > GW_MULTIPART_MAX_BOUNDARY)
            abort();
        gw_part_t parts[FUZZ_MAX_PARTS];
        int nparts = -1;
        char err[256];
        err[0] = '\0';
        rc = gw_multipart_parse(body, body_len, boundary, parts, FUZZ_MAX_PARTS, &nparts, err,
                                sizeof(err));
        if (rc == 0)
            check_parts(parts, nparts, body, body_len);
        else if ((rc != SQ_BAD_MULTIPART && rc != SQ_TOO_LARGE) || err[0] == '\0' || nparts < 0 ||
                 nparts > FUZZ_MAX_PARTS)
            abort();
        /* A body too large for fewer parts fails with SQ_TOO_LARGE only. */
        if (rc == 0 && nparts > 1) {
            int n2 = -1;
            int rc2 = gw_multipart_parse(body, body_len, boundary, parts, nparts - 1, &n2, err,
                                         sizeof(err));
            if (rc2 != SQ_TOO_LARGE)
                abort();
        }
    } else if (rc != SQ_MEDIA_TYPE && rc != SQ_BAD_MULTIPART) {
        abort();
    }
    free(ct);
    free(body);
    return 0;
}
