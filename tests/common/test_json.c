#include <sq_json.h>

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *real_text(double v)
{
    static char text[SQ_JSON_REAL_MAX];
    size_t n = sq_json_real(v, text);
    cr_assert_eq(n, strlen(text));
    return text;
}

static char *dump(json_t *j, size_t flags)
{
    char *text = sq_json_dumps(j, flags);
    cr_assert_not_null(text);
    return text;
}

Test(json, reals_print_as_the_shortest_decimal_that_reads_back)
{
    cr_assert_str_eq(real_text(0.025), "0.025");
    cr_assert_str_eq(real_text(0.1), "0.1");
    cr_assert_str_eq(real_text(19.574), "19.574");
    cr_assert_str_eq(real_text(1.0 / 3), "0.3333333333333333");
    cr_assert_str_eq(real_text(2.0 / 3), "0.6666666666666666");
    cr_assert_str_eq(real_text(0.1 + 0.2), "0.30000000000000004");
    /* 19.574000000000002 is the double nearest 19.574 (%.17g's text of
     * it); the next double up is not 19.574, and says so. */
    cr_assert_str_eq(real_text(19.574000000000002), "19.574");
    cr_assert_str_eq(real_text(nextafter(19.574, 20)), "19.574000000000005");
    cr_assert_str_eq(real_text(-1.5), "-1.5");
    cr_assert_str_eq(real_text(123456.789), "123456.789");
}

Test(json, whole_reals_keep_a_point_and_big_or_tiny_ones_an_exponent)
{
    cr_assert_str_eq(real_text(0.0), "0.0");
    cr_assert_str_eq(real_text(-0.0), "-0.0");
    cr_assert_str_eq(real_text(3.0), "3.0");
    cr_assert_str_eq(real_text(-42.0), "-42.0");
    cr_assert_str_eq(real_text(1e15), "1000000000000000.0");
    cr_assert_str_eq(real_text(9007199254740992.0), "9007199254740992.0");
    cr_assert_str_eq(real_text(1e16), "1e16");
    cr_assert_str_eq(real_text(1.5e17), "1.5e17");
    cr_assert_str_eq(real_text(1e300), "1e300");
    cr_assert_str_eq(real_text(1.7976931348623157e308), "1.7976931348623157e308");
    cr_assert_str_eq(real_text(0.0001), "0.0001");
    cr_assert_str_eq(real_text(0.00012), "0.00012");
    cr_assert_str_eq(real_text(0.00001), "1e-5");
    cr_assert_str_eq(real_text(1e-7), "1e-7");
    cr_assert_str_eq(real_text(-2.5e-8), "-2.5e-8");
    cr_assert_str_eq(real_text(5e-324), "5e-324"); /* the least subnormal */
    cr_assert_str_eq(real_text(2.2250738585072014e-308), "2.2250738585072014e-308");
}

Test(json, what_json_cannot_say_is_null)
{
    cr_assert_str_eq(real_text(NAN), "null");
    cr_assert_str_eq(real_text(INFINITY), "null");
    cr_assert_str_eq(real_text(-INFINITY), "null");
}

/* Seeded: the same 200,000 doubles every run, from every exponent. */
Test(json, every_real_reads_back_exactly_with_no_digit_to_spare)
{
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 200000; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        double v;
        uint64_t bits = state;
        memcpy(&v, &bits, sizeof(v));
        if (!isfinite(v))
            continue;
        const char *text = real_text(v);
        cr_assert_eq(strtod(text, NULL), v, "%s does not read back as %.17g", text, v);
        json_error_t err;
        json_t *parsed = json_loads(text, JSON_DECODE_ANY, &err);
        cr_assert(json_is_real(parsed), "%s: not a JSON real (%s)", text, err.text);
        cr_assert_eq(json_real_value(parsed), v);
        json_decref(parsed);
        /* Its significant digits are the fewest of any correctly rounded
         * decimal that reads back. */
        int fewest = 1;
        char shorter[40];
        for (; fewest < 17; fewest++) {
            snprintf(shorter, sizeof(shorter), "%.*e", fewest - 1, v);
            if (strtod(shorter, NULL) == v)
                break;
        }
        char sig[40];
        int nsig = 0;
        for (const char *p = text; *p && *p != 'e'; p++)
            if (*p >= '0' && *p <= '9' && (nsig > 0 || *p != '0'))
                sig[nsig++] = *p;
        while (nsig > 0 && sig[nsig - 1] == '0')
            nsig--;
        cr_assert_eq(nsig, fewest, "%s: %d significant digits, %s reads back too", text, nsig,
                     shorter);
    }
}

Test(json, integers_print_whole_across_their_range)
{
    json_t *a = json_pack("[I, I, I, i]", (json_int_t)INT64_MAX, (json_int_t)INT64_MIN,
                          (json_int_t)9007199254740993LL, 0);
    char *text = dump(a, JSON_COMPACT);
    cr_assert_str_eq(text, "[9223372036854775807,-9223372036854775808,9007199254740993,0]");
    free(text);
    json_decref(a);
}

Test(json, strings_escape_quotes_backslashes_and_control_characters)
{
    json_t *s = json_string("a\"b\\c/\n\r\t\b\f\x01\x1f\x7f");
    char *text = dump(s, 0);
    cr_assert_str_eq(text, "\"a\\\"b\\\\c/\\n\\r\\t\\b\\f\\u0001\\u001f\x7f\"");
    free(text);
    json_decref(s);

    s = json_stringn("a\0b", 3); /* a NUL inside */
    text = dump(s, 0);
    cr_assert_str_eq(text, "\"a\\u0000b\"");
    free(text);
    json_decref(s);
}

Test(json, utf8_passes_as_it_is_and_a_stray_byte_becomes_a_replacement)
{
    json_t *s = json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    char *text = dump(s, 0);
    cr_assert_str_eq(text, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
    free(text);
    json_decref(s);

    /* jansson's _nocheck constructors take anything: a lone continuation
     * byte, a truncated sequence, an overlong '/', a surrogate. */
    s = json_string_nocheck("a\x80z\xe2\x82 \xc0\xaf \xed\xa0\x80!");
    text = dump(s, 0);
    json_error_t err;
    json_t *back = json_loads(text, JSON_DECODE_ANY, &err);
    cr_assert_not_null(back, "%s: %s", text, err.text);
    cr_assert_str_eq(json_string_value(back),
                     "a\xef\xbf\xbdz\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd "
                     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!");
    json_decref(back);
    free(text);
    json_decref(s);
}

static json_t *nested(void)
{
    return json_pack("{s:i, s:{s:[i, s, {}, []], s:b, s:n}, s:[], s:{}, s:s}", "zeta", 1, "alpha",
                     "list", 2, "two", "flag", 1, "none", "empty_list", "empty_object", "last",
                     "x");
}

Test(json, nested_objects_keep_their_key_order_as_jansson_lays_them_out)
{
    json_t *j = nested();
    char *text = dump(j, JSON_COMPACT);
    cr_assert_str_eq(text, "{\"zeta\":1,\"alpha\":{\"list\":[2,\"two\",{},[]],\"flag\":true,"
                           "\"none\":null},\"empty_list\":[],\"empty_object\":{},\"last\":\"x\"}");
    free(text);
    /* Without reals the text is jansson's, byte for byte, in every layout. */
    const size_t layouts[] = {0,
                              JSON_COMPACT,
                              JSON_INDENT(2),
                              JSON_INDENT(4) | JSON_COMPACT,
                              JSON_SORT_KEYS,
                              JSON_INDENT(2) | JSON_SORT_KEYS,
                              JSON_INDENT(2) | JSON_PRESERVE_ORDER};
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++) {
        char *ours = dump(j, layouts[i]);
        char *theirs = json_dumps(j, layouts[i]);
        cr_assert_str_eq(ours, theirs, "flags %#zx", layouts[i]);
        free(ours);
        free(theirs);
    }
    json_decref(j);
}

Test(json, reals_inside_a_tree_print_short_and_the_tree_reads_back_equal)
{
    json_t *j = json_pack("{s:f, s:[f, f, f], s:{s:f}}", "queue_ms", 0.025, "list", 0.1, 19.574,
                          1.0 / 3, "inner", "whole", 3.0);
    char *text = dump(j, JSON_COMPACT);
    cr_assert_str_eq(text, "{\"queue_ms\":0.025,\"list\":[0.1,19.574,0.3333333333333333],"
                           "\"inner\":{\"whole\":3.0}}");
    json_t *back = json_loads(text, 0, NULL);
    cr_assert(json_equal(back, j));
    json_decref(back);
    free(text);
    json_decref(j);
}

Test(json, any_value_dumps_and_a_tree_too_deep_for_a_parser_does_not)
{
    json_t *r = json_real(0.5);
    char *text = dump(r, 0);
    cr_assert_str_eq(text, "0.5");
    free(text);
    json_decref(r);
    cr_assert_null(sq_json_dumps(NULL, 0));

    json_t *deep = json_array();
    for (int i = 0; i < 3000; i++) {
        json_t *outer = json_array();
        json_array_append_new(outer, deep);
        deep = outer;
    }
    cr_assert_null(sq_json_dumps(deep, JSON_COMPACT));
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put(&b, "x", 1);
    cr_assert_eq(sq_json_dump_buf(deep, 0, &b), -1);
    cr_assert_eq(b.len, 1, "a failed dump leaves the buffer as it was");
    sq_buf_dispose(&b);
    json_decref(deep);
}
