/* gateway/codec/oip_json.c: base64, float formatting and the JSON
 * validator. */
#include "oip_test.h"

/* ---- base64 and floats ---- */

static long long dec(const char *s, uint8_t *out)
{
    return gw_oip_base64_decode(s, strlen(s), out);
}

Test(oip, base64_is_strict_rfc4648)
{
    uint8_t out[64];
    cr_assert_eq(dec("", out), 0);
    cr_assert_eq(dec("QQ==", out), 1);
    cr_assert_eq(out[0], 'A');
    cr_assert_eq(dec("QUI=", out), 2);
    cr_assert_eq(memcmp(out, "AB", 2), 0);
    cr_assert_eq(dec("QUJD", out), 3);
    cr_assert_eq(dec("+/+/", out), 3);
    cr_assert_eq(memcmp(out, "\xfb\xff\xbf", 3), 0);
    const char *bad[] = {"Q",        "QQ",    "QQ=",  "QQQ",    "Q===",     "====",    "QR==",
                         "QUJ=",     "=QQQ",  "Q=QQ", "QQ=Q",   "QQ==QQ==", "QU JD",   "QUJD\n",
                         "QUJD\r\n", " QUJD", "QU-_", "QUJD\t", "QUJ\x80",  "QUJD===="};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(dec(bad[i], out), -1, "\"%s\" is rejected", bad[i]);
    /* Round trip every length over random bytes. */
    srand(7);
    for (size_t n = 0; n < 200; n++) {
        uint8_t in[200], back[204];
        char text[300];
        for (size_t i = 0; i < n; i++)
            in[i] = (uint8_t)rand();
        size_t tl = gw_oip_base64_encode(in, n, text);
        cr_assert_eq(tl, 4 * ((n + 2) / 3));
        cr_assert_leq(gw_oip_base64_decoded_max(tl), sizeof(back));
        cr_assert_eq(gw_oip_base64_decode(text, tl, back), (long long)n);
        cr_assert_eq(memcmp(in, back, n), 0);
    }
}

Test(oip, floats_print_compactly_and_read_back_exactly)
{
    char buf[32];
    const struct {
        float f;
        const char *s;
    } cases[] = {
        {0.0f, "0"},
        {-0.0f, "-0"},
        {1.0f, "1"},
        {-2.5f, "-2.5"},
        {0.5f, "0.5"},
        {100.0f, "100"},
        {0.1f, "0.1"},
        {123456792.0f, "123456790"}, /* 1.2345679e8 reads back */
        {1e9f, "1e9"},
        {1e-5f, "1e-5"},
        {0.0001f, "0.0001"},
        {0.001f, "0.001"},
        {1.0f / 3, "0.33333334"},
        {3.4028235e38f, "3.4028235e38"},
        {1.4e-45f, "1e-45"},
        {16777216.0f, "16777216"},
        {-1e10f, "-1e10"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_oip_format_float(cases[i].f, buf);
        cr_assert_str_eq(buf, cases[i].s);
    }
    cr_assert_eq(gw_oip_format_float(NAN, buf), 4);
    cr_assert_str_eq(buf, "null");
    gw_oip_format_float(-INFINITY, buf);
    cr_assert_str_eq(buf, "null");
    /* Random bit patterns over the whole range (fixed seed), plus every
     * power of two: the text reads back to the same float, and has no
     * more digits than %.9g's shortest form that reads back (the digit
     * search itself is tested in tests/common/test_decimal.c). */
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 300000; i++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        float f = bits_to_float((uint32_t)state);
        if (i < 254)
            f = ldexpf(1.0f, i - 149);
        if (!isfinite(f))
            continue;
        int n = gw_oip_format_float(f, buf);
        cr_assert_eq((size_t)n, strlen(buf));
        cr_assert_lt(n, 24);
        float back = strtof(buf, NULL);
        cr_assert_eq(float_bits(back), float_bits(f), "%s for %.9g", buf, (double)f);
        /* "-1.2345678e-38" at most: a reply's floats fit OIP_FLOAT_TEXT_MAX. */
        cr_assert_leq(n, 15, "%s", buf);
        int digits = 0; /* significant: from the first nonzero one */
        for (const char *c = buf; *c != '\0' && *c != 'e'; c++)
            digits += *c >= (digits > 0 ? '0' : '1') && *c <= '9';
        cr_assert_leq(digits, 9, "%s", buf);
    }
}

/* ---- responses ---- */

static uint64_t gen_state;

static uint32_t gen_rand(void)
{
    gen_state ^= gen_state << 13;
    gen_state ^= gen_state >> 7;
    gen_state ^= gen_state << 17;
    return (uint32_t)gen_state;
}

static const char *pick(const char *const *pool, size_t n)
{
    return pool[gen_rand() % n];
}

#define PICK(pool) pick(pool, sizeof(pool) / sizeof(pool[0]))

static void gen_value(sq_buf_t *b, int depth)
{
    static const char *const numbers[] = {"0",   "-1",  "1.5", "1e5", "-0.0e-3", "12E+2",
                                          "01",  "1.",  ".5",  "-",   "1e",      "+1",
                                          "0x1", "1e+", "-01", "2.e3"};
    static const char *const literals[] = {"true", "false", "null", "tru", "nul", "True"};
    static const char *const pieces[] = {"a",
                                         "\\\"",
                                         "\\n",
                                         "\\u00e9",
                                         "\\ud83d\\ude00",
                                         "\\ud800",
                                         "\\udc00x",
                                         "\\u12g4",
                                         "\\x",
                                         "\xc3\xa9",
                                         "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80",
                                         "\xc0\xaf",
                                         "\xed\xa0\x80",
                                         "\xf4\x90\x80\x80",
                                         "\xff",
                                         "\x01",
                                         "\t",
                                         " ",
                                         "\\/",
                                         "\\u0000"};
    static const char *const ws[] = {"", "", " ", "\n", "\t", "\r\n", "\f"};
    sb_printf(b, "%s", PICK(ws));
    uint32_t kind = gen_rand() % (depth > 6 ? 3 : 5);
    if (kind == 0) {
        sb_printf(b, "%s", PICK(numbers));
    } else if (kind == 1) {
        sb_printf(b, "%s", PICK(literals));
    } else if (kind == 2) {
        sb_printf(b, "\"");
        for (uint32_t i = gen_rand() % 4; i > 0; i--)
            sb_printf(b, "%s", PICK(pieces));
        sb_printf(b, "\"");
    } else {
        int obj = kind == 3;
        sb_printf(b, obj ? "{" : "[");
        uint32_t n = gen_rand() % 4;
        for (uint32_t i = 0; i < n; i++) {
            if (i > 0)
                sb_printf(b, "%s,", PICK(ws));
            if (obj)
                sb_printf(b, "%s\"k%u\"%s:", PICK(ws), i, PICK(ws));
            gen_value(b, depth + 1);
        }
        sb_printf(b, "%s%s", PICK(ws), obj ? "}" : "]");
    }
    sb_printf(b, "%s", PICK(ws));
}

Test(oip, the_validator_agrees_with_jansson)
{
    gen_state = 0x2545F4914F6CDD1Dull;
    int valid = 0, invalid = 0;
    for (int iter = 0; iter < 30000; iter++) {
        sq_buf_t b;
        sq_buf_init(&b);
        gen_value(&b, 0);
        /* A few random edits on a third of them. */
        if (iter % 3 == 0 && b.len > 0)
            for (uint32_t e = 1 + gen_rand() % 2; e > 0; e--) {
                size_t at = gen_rand() % b.len;
                static const char edits[] = "{}[]\",:\\ 0e-.tn\x80";
                b.data[at] = (uint8_t)edits[gen_rand() % (sizeof(edits) - 1)];
            }
        json_error_t je;
        json_t *j = json_loadb((const char *)b.data, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        char e[256] = "";
        int rc = oip_json_validate((const char *)b.data, b.len, 32, e, sizeof(e));
        cr_assert_eq(rc == 0, j != NULL, "jansson %s, squish %s (%s) on <%.*s>",
                     j ? "accepts" : je.text, rc == 0 ? "accepts" : "rejects", e, (int)b.len,
                     b.data);
        if (rc == 0)
            valid++;
        else
            invalid++;
        json_decref(j);
        sq_buf_dispose(&b);
    }
    cr_assert_gt(valid, 3000, "the generator makes valid texts (%d)", valid);
    cr_assert_gt(invalid, 3000, "and invalid ones (%d)", invalid);
}
