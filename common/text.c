/* Hex and HOST:PORT (sq_text.h). */
#include "sq_text.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sq_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

void sq_hex_encode(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

int sq_hex_decode(const char *hex, uint8_t *out, size_t n)
{
    if (hex == NULL || strlen(hex) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = sq_hexval(hex[2 * i]), lo = sq_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int sq_parse_ll(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

int sq_hostport_split(const char *spec, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(spec, ':');
    if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) > 5)
        return -1;
    int p = 0;
    for (const char *d = colon + 1; *d != '\0'; d++) {
        if (*d < '0' || *d > '9')
            return -1;
        p = p * 10 + (*d - '0');
    }
    if (p > 65535)
        return -1;
    const char *h = spec;
    size_t hl = (size_t)(colon - spec);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl) != NULL || memchr(h, '[', hl) != NULL) {
        return -1; /* an IPv6 address needs its brackets: "[::1]:8000" */
    }
    if (hl == 0 || hl >= hostlen)
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = p;
    return 0;
}
