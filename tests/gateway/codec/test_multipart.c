#include <criterion/criterion.h>
#include <gw_codec.h>
#include <sq.h>

#include <string.h>

static int parse(const char *body, gw_part_t *parts, int max, int *n, char *err)
{
    return gw_multipart_parse((const uint8_t *)body, strlen(body), "XyZ", parts, max, n, err, 256);
}

Test(multipart, boundary_from_the_content_type)
{
    char b[80];
    const char *ct = "multipart/form-data; boundary=------------------------abc123";
    cr_assert_eq(gw_multipart_boundary(ct, strlen(ct), b, sizeof(b)), 0);
    cr_assert_str_eq(b, "------------------------abc123");
    const char *q = "Multipart/Form-Data; charset=utf-8; boundary=\"a b:c\"";
    cr_assert_eq(gw_multipart_boundary(q, strlen(q), b, sizeof(b)), 0);
    cr_assert_str_eq(b, "a b:c");
    const char *other = "application/json";
    cr_assert_eq(gw_multipart_boundary(other, strlen(other), b, sizeof(b)), SQ_MEDIA_TYPE);
    const char *mixed = "multipart/mixed; boundary=x";
    cr_assert_eq(gw_multipart_boundary(mixed, strlen(mixed), b, sizeof(b)), SQ_MEDIA_TYPE);
    const char *none = "multipart/form-data";
    cr_assert_eq(gw_multipart_boundary(none, strlen(none), b, sizeof(b)), SQ_BAD_MULTIPART);
    const char *bad = "multipart/form-data; boundary=a<b";
    cr_assert_eq(gw_multipart_boundary(bad, strlen(bad), b, sizeof(b)), SQ_BAD_MULTIPART);
    char longb[200] = "multipart/form-data; boundary=";
    memset(longb + strlen(longb), 'a', 71);
    cr_assert_eq(gw_multipart_boundary(longb, strlen(longb), b, sizeof(b)), SQ_BAD_MULTIPART);
}

/* Found by fuzz_multipart: NUL passed the bchar check (strchr matches the
 * terminator), so "boundary=\0\0X" gave an empty or cut boundary. */
Test(multipart, boundary_with_a_nul_byte_is_rejected)
{
    char b[80];
    static const char nul_first[] = "multipart/form-data; boundary=\0\0XyZ";
    cr_assert_eq(gw_multipart_boundary(nul_first, sizeof(nul_first) - 1, b, sizeof(b)),
                 SQ_BAD_MULTIPART);
    static const char nul_inside[] = "multipart/form-data; boundary=\"Xy\0Z\"";
    cr_assert_eq(gw_multipart_boundary(nul_inside, sizeof(nul_inside) - 1, b, sizeof(b)),
                 SQ_BAD_MULTIPART);
}

Test(multipart, parts_as_curl_sends_them)
{
    const char *body = "--XyZ\r\n"
                       "Content-Disposition: form-data; name=\"model\"; filename=\"r.onnx\"\r\n"
                       "Content-Type: application/octet-stream\r\n\r\n"
                       "\x01\x02\r\n--X\r\n"
                       "\r\n--XyZ\r\n"
                       "Content-Disposition: form-data; name=config\r\n\r\n"
                       "{\"name\":\"r\"}\r\n"
                       "--XyZ--\r\n";
    gw_part_t parts[4];
    int n;
    char err[256];
    cr_assert_eq(parse(body, parts, 4, &n, err), 0, "%s", err);
    cr_assert_eq(n, 2);
    cr_assert(gw_part_is(&parts[0], "model"));
    cr_assert_eq(parts[0].filename_len, 6);
    cr_assert_eq(memcmp(parts[0].filename, "r.onnx", 6), 0);
    cr_assert_eq(parts[0].len, 9, "a partial boundary inside the data is data");
    cr_assert_eq(memcmp(parts[0].data, "\x01\x02\r\n--X\r\n", 9), 0);
    cr_assert(gw_part_is(&parts[1], "config"));
    cr_assert_eq(parts[1].len, 12);
    cr_assert_null(parts[1].filename);
}

Test(multipart, preamble_and_empty_parts_are_fine)
{
    const char *body = "this is a preamble\r\n--XyZ\r\n"
                       "Content-Disposition: form-data; name=\"a\"\r\n\r\n"
                       "\r\n--XyZ--";
    gw_part_t parts[2];
    int n;
    char err[256];
    cr_assert_eq(parse(body, parts, 2, &n, err), 0, "%s", err);
    cr_assert_eq(n, 1);
    cr_assert_eq(parts[0].len, 0);
}

Test(multipart, malformed_bodies_are_rejected_with_a_reason)
{
    const char *bad[] = {
        "",
        "no boundary here",
        "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\ndata with no end",
        "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n",
        "--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--",
        "--XyZ\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\nx\r\n--XyZ--",
        "--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--",
        "--XyZ\r\nbroken header\r\n\r\nx\r\n--XyZ--",
        "--XyZjunk\r\n",
        "--XyZ\r\n\r\nx\r\n--XyZ--",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gw_part_t parts[4];
        int n;
        char err[256] = "";
        cr_assert_eq(parse(bad[i], parts, 4, &n, err), SQ_BAD_MULTIPART, "case %zu", i);
        cr_assert_neq(err[0], '\0', "case %zu has a reason", i);
    }
}

Test(multipart, too_many_parts_is_too_large)
{
    const char *body = "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n"
                       "--XyZ\r\nContent-Disposition: form-data; name=\"b\"\r\n\r\n2\r\n"
                       "--XyZ--\r\n";
    gw_part_t parts[1];
    int n;
    char err[256];
    cr_assert_eq(parse(body, parts, 1, &n, err), SQ_TOO_LARGE);
}

Test(multipart, oversized_part_headers_are_rejected)
{
    static char body[16384];
    strcpy(body, "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\nX-Pad: ");
    size_t n = strlen(body);
    memset(body + n, 'p', 6000);
    strcpy(body + n + 6000, "\r\n\r\nx\r\n--XyZ--");
    gw_part_t parts[1];
    int np;
    char err[256];
    cr_assert_eq(parse(body, parts, 1, &np, err), SQ_BAD_MULTIPART);
    cr_assert(strstr(err, "too large") != NULL, "%s", err);
}
