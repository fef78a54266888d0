/* common/map.c: the (a, b) -> int hash map. */
#include <criterion/criterion.h>
#include <sq.h>

Test(map, put_get_replace_and_absent)
{
    sq_map_t m = {0};
    cr_assert_eq(sq_map_get(&m, 1, 2), -1, "empty");
    sq_map_put(&m, 1, 2, 7);
    sq_map_put(&m, 2, 1, 8);
    cr_assert_eq(sq_map_get(&m, 1, 2), 7);
    cr_assert_eq(sq_map_get(&m, 2, 1), 8, "(a, b) and (b, a) are two keys");
    cr_assert_eq(sq_map_get(&m, 1, 3), -1);
    sq_map_put(&m, 1, 2, 9);
    cr_assert_eq(sq_map_get(&m, 1, 2), 9, "replaced");
    cr_assert_eq(m.n, 2u);
    sq_map_dispose(&m);
}

/* Grown many times, every key still found (the rehash keeps them all), and
 * keys that differ only in b (a model's SLO buckets) stay apart. */
Test(map, grows_and_finds_every_key)
{
    sq_map_t m = {0};
    for (int i = 0; i < 20000; i++)
        sq_map_put(&m, (uint64_t)(i / 25), (uint64_t)(i % 25), i);
    cr_assert_eq(m.n, 20000u);
    cr_assert_leq(2 * m.n, m.cap, "at most half full");
    for (int i = 0; i < 20000; i++)
        cr_assert_eq(sq_map_get(&m, (uint64_t)(i / 25), (uint64_t)(i % 25)), i, "key %d", i);
    cr_assert_eq(sq_map_get(&m, 800, 0), -1);
    sq_map_clear(&m);
    cr_assert_eq(m.n, 0u);
    cr_assert_eq(sq_map_get(&m, 0, 0), -1, "cleared");
    sq_map_put(&m, 0, 0, 1);
    cr_assert_eq(sq_map_get(&m, 0, 0), 1, "usable after a clear");
    sq_map_dispose(&m);
}
