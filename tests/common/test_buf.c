#include <criterion/criterion.h>
#include <sq.h>
#include <string.h>

Test(buf, integers_and_strings_round_trip_little_endian)
{
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put_u8(&b, 0xab);
    sq_buf_put_u16(&b, 0x1234);
    sq_buf_put_u32(&b, 0xdeadbeef);
    sq_buf_put_u64(&b, 0x0102030405060708ull);
    sq_buf_put_f64(&b, -2.5);
    sq_buf_put_str(&b, "emu:3");
    cr_assert_eq(b.data[1], 0x34);
    cr_assert_eq(b.data[2], 0x12);

    sq_reader_t r;
    sq_reader_init(&r, b.data, b.len);
    cr_assert_eq(sq_get_u8(&r), 0xab);
    cr_assert_eq(sq_get_u16(&r), 0x1234);
    cr_assert_eq(sq_get_u32(&r), 0xdeadbeef);
    cr_assert_eq(sq_get_u64(&r), 0x0102030405060708ull);
    cr_assert_eq(sq_get_f64(&r), -2.5);
    char s[16];
    sq_get_str(&r, s, sizeof(s));
    cr_assert_str_eq(s, "emu:3");
    cr_assert_eq(r.err, 0);
    cr_assert_eq(r.left, 0);
    sq_buf_dispose(&b);
}

Test(buf, reads_past_the_end_set_the_error_and_return_zero)
{
    uint8_t two[2] = {1, 2};
    sq_reader_t r;
    sq_reader_init(&r, two, sizeof(two));
    cr_assert_eq(sq_get_u32(&r), 0);
    cr_assert_eq(r.err, 1);
    cr_assert_eq(sq_get_u8(&r), 0, "the error is sticky");
}

Test(buf, strings_longer_than_the_destination_or_with_nul_are_rejected)
{
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put_str(&b, "0123456789");
    sq_reader_t r;
    char small[4];
    sq_reader_init(&r, b.data, b.len);
    sq_get_str(&r, small, sizeof(small));
    cr_assert_eq(r.err, 1);
    cr_assert_str_eq(small, "");

    sq_buf_t n;
    sq_buf_init(&n);
    sq_buf_put_bytes(&n, "a\0b", 3);
    char out[8];
    sq_reader_init(&r, n.data, n.len);
    sq_get_str(&r, out, sizeof(out));
    cr_assert_eq(r.err, 1);
    sq_buf_dispose(&b);
    sq_buf_dispose(&n);
}

Test(buf, a_length_prefix_larger_than_the_payload_is_truncation)
{
    uint8_t lie[8] = {100, 0, 0, 0, 'a', 'b', 'c', 'd'};
    sq_reader_t r;
    uint32_t len;
    sq_reader_init(&r, lie, sizeof(lie));
    cr_assert_null(sq_get_bytes(&r, &len, 1000));
    cr_assert_eq(r.err, 1);
    cr_assert_eq(len, 0);
}

Test(buf, consume_keeps_the_tail)
{
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put(&b, "abcdef", 6);
    sq_buf_consume(&b, 4);
    cr_assert_eq(b.len, 2);
    cr_assert_eq(memcmp(b.data, "ef", 2), 0);
    sq_buf_consume(&b, 10);
    cr_assert_eq(b.len, 0);
    sq_buf_dispose(&b);
}

Test(buf, printf_appends_text_of_any_length)
{
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_printf(&b, "%s=%d;", "a", 1);
    char big[1000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    sq_buf_printf(&b, "[%s]", big);
    cr_assert_eq(b.len, 4 + 1001);
    cr_assert_eq(memcmp(b.data, "a=1;[x", 6), 0);
    cr_assert_eq(b.data[b.len - 1], ']');
    cr_assert_eq(b.data[b.len - 2], 'x');
    sq_buf_dispose(&b);
}
