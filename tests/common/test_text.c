#include <sq_text.h>

#include <criterion/criterion.h>
#include <string.h>

Test(text, hexval_reads_both_cases_and_refuses_the_rest)
{
    cr_assert_eq(sq_hexval('0'), 0);
    cr_assert_eq(sq_hexval('9'), 9);
    cr_assert_eq(sq_hexval('a'), 10);
    cr_assert_eq(sq_hexval('F'), 15);
    cr_assert_eq(sq_hexval('g'), -1);
    cr_assert_eq(sq_hexval('/'), -1);
    cr_assert_eq(sq_hexval('\0'), -1);
}

Test(text, hex_round_trips_and_refuses_a_wrong_length_or_digit)
{
    const uint8_t in[] = {0x00, 0x7f, 0x80, 0xff, 0x1a};
    char hex[11];
    sq_hex_encode(in, sizeof(in), hex);
    cr_assert_str_eq(hex, "007f80ff1a");
    uint8_t out[5];
    cr_assert_eq(sq_hex_decode(hex, out, sizeof(out)), 0);
    cr_assert_eq(memcmp(in, out, sizeof(in)), 0);
    cr_assert_eq(sq_hex_decode("007F80FF1A", out, sizeof(out)), 0, "upper case is hex too");
    cr_assert_eq(memcmp(in, out, sizeof(in)), 0);
    cr_assert_eq(sq_hex_decode("007f80ff1", out, sizeof(out)), -1);
    cr_assert_eq(sq_hex_decode("007f80ff1a00", out, sizeof(out)), -1);
    cr_assert_eq(sq_hex_decode("007f80ff1g", out, sizeof(out)), -1);
    cr_assert_eq(sq_hex_decode(NULL, out, sizeof(out)), -1);
}

Test(text, hostport_splits_names_v4_and_bracketed_v6)
{
    char host[64];
    int port = -1;
    cr_assert_eq(sq_hostport_split("127.0.0.1:8000", host, sizeof(host), &port), 0);
    cr_assert_str_eq(host, "127.0.0.1");
    cr_assert_eq(port, 8000);
    cr_assert_eq(sq_hostport_split("localhost:0", host, sizeof(host), &port), 0);
    cr_assert_str_eq(host, "localhost");
    cr_assert_eq(port, 0);
    cr_assert_eq(sq_hostport_split("[::1]:65535", host, sizeof(host), &port), 0);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(port, 65535);
}

Test(text, hostport_refuses_what_is_not_host_and_port)
{
    char host[8];
    int port = 7;
    const char *bad[] = {
        "8000",     ":8000",     "host:",   "host:65536",  "host:80a",         "host:-1",
        "::1:8000", "[::1:8000", "[]:8000", "host:123456", "toolonghostname:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(sq_hostport_split(bad[i], host, sizeof(host), &port), -1, "%s", bad[i]);
    cr_assert_eq(port, 7, "a refused spec leaves the port alone");
}

Test(text, parse_ll_takes_a_whole_decimal_and_nothing_else)
{
    long long v = 7;
    cr_assert_eq(sq_parse_ll("-42", &v), 0);
    cr_assert_eq(v, -42);
    cr_assert_eq(sq_parse_ll("9223372036854775807", &v), 0);
    cr_assert_eq(v, 9223372036854775807LL);
    cr_assert_eq(sq_parse_ll("9223372036854775808", &v), -1, "overflow");
    cr_assert_eq(sq_parse_ll("12x", &v), -1);
    cr_assert_eq(sq_parse_ll("", &v), -1);
    cr_assert_eq(v, 9223372036854775807LL, "a refused text leaves *out alone");
}
