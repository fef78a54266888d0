#include "gw_codec.h"

#include <sq.h>

#include <stdio.h>
#include <string.h>
#include <strings.h>

static int is_tspecial_ok(char c)
{
    /* bchars of RFC 2046 (without the space, which may not end a boundary).
     * NUL is tested apart: strchr finds it as the string's terminator. */
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("'()+_,-./:=? ", c) != NULL);
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

/* Finds parameter `key` in "type; a=b; key=value" (value quoted or not). */
static int find_param(const char *s, size_t len, const char *key, const char **val, size_t *vlen)
{
    const char *p = s, *end = s + len;
    size_t klen = strlen(key);
    while (p < end) {
        const char *semi = memchr(p, ';', (size_t)(end - p));
        if (semi == NULL)
            return -1;
        p = skip_ws(semi + 1, end);
        if ((size_t)(end - p) > klen && strncasecmp(p, key, klen) == 0 && p[klen] == '=') {
            p += klen + 1;
            if (p < end && *p == '"') {
                const char *q = ++p;
                while (q < end && *q != '"') {
                    if (*q == '\\' && q + 1 < end)
                        q++;
                    q++;
                }
                if (q >= end)
                    return -1;
                *val = p;
                *vlen = (size_t)(q - p);
                return 0;
            }
            const char *q = p;
            while (q < end && *q != ';' && *q != ' ' && *q != '\t')
                q++;
            *val = p;
            *vlen = (size_t)(q - p);
            return 0;
        }
    }
    return -1;
}

int gw_multipart_boundary(const char *ct, size_t len, char *out, size_t outlen)
{
    static const char type[] = "multipart/form-data";
    if (len < sizeof(type) - 1 || strncasecmp(ct, type, sizeof(type) - 1) != 0 ||
        (len > sizeof(type) - 1 && ct[sizeof(type) - 1] != ';' && ct[sizeof(type) - 1] != ' '))
        return SQ_MEDIA_TYPE;
    const char *v;
    size_t vlen;
    if (find_param(ct, len, "boundary", &v, &vlen) != 0 || vlen == 0 ||
        vlen > GW_MULTIPART_MAX_BOUNDARY || vlen + 1 > outlen || v[vlen - 1] == ' ')
        return SQ_BAD_MULTIPART;
    for (size_t i = 0; i < vlen; i++)
        if (!is_tspecial_ok(v[i]))
            return SQ_BAD_MULTIPART;
    memcpy(out, v, vlen);
    out[vlen] = '\0';
    return 0;
}

int gw_part_is(const gw_part_t *p, const char *s)
{
    size_t n = strlen(s);
    return p->name_len == n && memcmp(p->name, s, n) == 0;
}

static int fail(char *err, size_t errlen, const char *why)
{
    snprintf(err, errlen, "%s", why);
    return SQ_BAD_MULTIPART;
}

/* Parses the header block [p, end) of one part. */
static int parse_headers(const char *p, const char *end, gw_part_t *part, char *err, size_t errlen)
{
    int have_disposition = 0;
    while (p < end) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (eol == NULL)
            eol = end;
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (colon == NULL || colon == p)
            return fail(err, errlen, "malformed part header line");
        size_t nlen = (size_t)(colon - p);
        const char *v = skip_ws(colon + 1, eol);
        size_t vlen = (size_t)(eol - v);
        while (vlen > 0 && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
            vlen--;
        if (nlen == 19 && strncasecmp(p, "Content-Disposition", 19) == 0) {
            if (vlen < 9 || strncasecmp(v, "form-data", 9) != 0 ||
                (vlen > 9 && v[9] != ';' && v[9] != ' '))
                return fail(err, errlen, "part disposition is not form-data");
            if (find_param(v, vlen, "name", &part->name, &part->name_len) != 0 ||
                part->name_len == 0)
                return fail(err, errlen, "part without a form field name");
            const char *fn;
            size_t fnlen;
            if (find_param(v, vlen, "filename", &fn, &fnlen) == 0) {
                part->filename = fn;
                part->filename_len = fnlen;
            }
            have_disposition = 1;
        } else if (nlen == 12 && strncasecmp(p, "Content-Type", 12) == 0) {
            part->content_type = v;
            part->content_type_len = vlen;
        }
        p = eol + 2;
    }
    if (!have_disposition)
        return fail(err, errlen, "part without Content-Disposition");
    return 0;
}

int gw_multipart_parse(const uint8_t *body, size_t len, const char *boundary, gw_part_t *parts,
                       int max_parts, int *nparts, char *err, size_t errlen)
{
    char delim[GW_MULTIPART_MAX_BOUNDARY + 5];
    size_t blen = strlen(boundary);
    *nparts = 0;
    if (blen == 0 || blen > GW_MULTIPART_MAX_BOUNDARY)
        return fail(err, errlen, "invalid boundary");
    /* The delimiter inside the body is CRLF "--" boundary; the first one may
     * be at the very start (no CRLF). */
    int dlen = snprintf(delim, sizeof(delim), "\r\n--%s", boundary);
    const uint8_t *end = body + len;
    const uint8_t *p;
    if (len >= (size_t)dlen - 2 && memcmp(body, delim + 2, (size_t)dlen - 2) == 0) {
        p = body + dlen - 2;
    } else {
        const uint8_t *first = memmem(body, len, delim, (size_t)dlen);
        if (first == NULL)
            return fail(err, errlen, "the body does not contain the boundary");
        p = first + dlen; /* preamble ignored */
    }
    for (;;) {
        /* After a delimiter: "--" closes, CRLF opens a part (transport
         * padding of spaces/tabs allowed before the CRLF). */
        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            break;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            return fail(err, errlen, "malformed delimiter line (truncated body?)");
        p += 2;
        const uint8_t *hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        const uint8_t *hstart = p;
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
            hend = p; /* no headers at all */
        }
        if (hend == NULL)
            return fail(err, errlen, "unterminated part headers (truncated body?)");
        if (hend - hstart > GW_MULTIPART_MAX_HEADERS)
            return fail(err, errlen, "part headers too large");
        if (*nparts == max_parts) {
            snprintf(err, errlen, "more than %d parts", max_parts);
            return SQ_TOO_LARGE;
        }
        gw_part_t *part = &parts[*nparts];
        memset(part, 0, sizeof(*part));
        int rc = parse_headers((const char *)hstart, (const char *)hend, part, err, errlen);
        if (rc != 0)
            return rc;
        p = hend + (hend == hstart ? 2 : 4);
        const uint8_t *next = memmem(p, (size_t)(end - p), delim, (size_t)dlen);
        if (next == NULL)
            return fail(err, errlen, "no closing boundary (truncated body?)");
        part->data = p;
        part->len = (size_t)(next - p);
        (*nparts)++;
        p = next + dlen;
    }
    return 0;
}
