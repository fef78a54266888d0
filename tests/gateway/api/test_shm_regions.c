/* The table of registered shared-memory regions (gateway/api/shm_regions.c)
 * on real POSIX shared-memory objects: what is refused, where a window's
 * bytes are, and that a region unregistered while a request holds it stays
 * mapped until the request lets go. */
#include <criterion/criterion.h>
#include <shm_int.h>
#include <sq.h>

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char key[64];
static char why[512];

/* A fresh object of size bytes, filled with i & 0xff; its mapping. */
static uint8_t *make_object(size_t size)
{
    snprintf(key, sizeof(key), "/squish-test-shm-%d", (int)getpid());
    shm_unlink(key);
    int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    uint8_t *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(map, MAP_FAILED);
    close(fd);
    for (size_t i = 0; i < size; i++)
        map[i] = (uint8_t)i;
    return map;
}

static void drop_object(uint8_t *map, size_t size)
{
    munmap(map, size);
    shm_unlink(key);
}

Test(shm_regions, names_and_keys)
{
    cr_assert(gw_shm_name_ok("input_data-0.~", 14));
    cr_assert_not(gw_shm_name_ok("", 0));
    cr_assert_not(gw_shm_name_ok("a b", 3));
    cr_assert_not(gw_shm_name_ok("a/b", 3));
    cr_assert_not(gw_shm_name_ok("%41", 3));
    char long_name[129];
    memset(long_name, 'x', sizeof(long_name));
    cr_assert(gw_shm_name_ok(long_name, 127));
    cr_assert_not(gw_shm_name_ok(long_name, 128));

    cr_assert(gw_shm_key_ok("/input_simple"));
    cr_assert(gw_shm_key_ok("input_simple"));
    cr_assert(gw_shm_key_ok("///psm_1234"));
    cr_assert_not(gw_shm_key_ok("/"));
    cr_assert_not(gw_shm_key_ok("///"));
    cr_assert_not(gw_shm_key_ok(""));
    cr_assert_not(gw_shm_key_ok("/a/b"));
    cr_assert_not(gw_shm_key_ok("/.."));
    cr_assert_not(gw_shm_key_ok("/."));
}

Test(shm_regions, a_window_at_any_offset_reads_the_objects_bytes)
{
    uint8_t *map = make_object(3 * 4096);
    gw_shm_table_t *t = gw_shm_table_new();
    /* 100 is no page boundary: mmap needs one, the region does not. */
    cr_assert_eq(gw_shm_register(t, "in", key, 100, 5000, why, sizeof(why)), 0, "%s", why);
    json_t *st = gw_shm_status(t, NULL);
    cr_assert_eq(json_array_size(st), 1);
    json_t *e = json_array_get(st, 0);
    cr_assert_str_eq(json_string_value(json_object_get(e, "name")), "in");
    cr_assert_str_eq(json_string_value(json_object_get(e, "key")), key);
    cr_assert_eq(json_integer_value(json_object_get(e, "offset")), 100);
    cr_assert_eq(json_integer_value(json_object_get(e, "byte_size")), 5000);
    json_decref(st);

    gw_shm_region_t *r = gw_shm_acquire(t, "in");
    cr_assert_not_null(r);
    uint8_t *p = gw_shm_span(r, 10, 20, why, sizeof(why));
    cr_assert_not_null(p, "%s", why);
    cr_assert_eq(p[0], (uint8_t)110);
    cr_assert_eq(p[19], (uint8_t)129);
    /* Written through the region, seen by the client. */
    p[0] = 7;
    cr_assert_eq(map[110], 7);

    /* Triton's limits on a window. */
    cr_assert_null(gw_shm_span(r, 5000, 0, why, sizeof(why)));
    cr_assert(strstr(why, "invalid offset for shared memory region 'in'") != NULL, "%s", why);
    cr_assert_null(gw_shm_span(r, 4990, 11, why, sizeof(why)));
    cr_assert(strstr(why, "invalid offset + byte size for shared memory region 'in'") != NULL, "%s",
              why);
    cr_assert_null(gw_shm_span(r, 1, UINT64_MAX, why, sizeof(why)), "no overflow");
    cr_assert_not_null(gw_shm_span(r, 4990, 10, why, sizeof(why)), "%s", why);
    gw_shm_release(r);
    cr_assert_null(gw_shm_acquire(t, "out"));
    gw_shm_table_free(t);
    drop_object(map, 3 * 4096);
}

Test(shm_regions, refusals_say_why)
{
    uint8_t *map = make_object(4096);
    gw_shm_table_t *t = gw_shm_table_new();
    cr_assert_eq(gw_shm_register(t, "in", key, 0, 4096, why, sizeof(why)), 0, "%s", why);
    struct {
        const char *name, *key;
        uint64_t offset, byte_size;
        const char *what;
    } bad[] = {
        {"in", key, 0, 64, "shared memory region 'in' is already registered"},
        {"b", "/squish-test-shm-none", 0, 64, "no shared-memory object '/squish-test-shm-none'"},
        {"b", "/", 0, 64, "invalid shm key '/'"},
        {"b", "/a/b", 0, 64, "invalid shm key '/a/b'"},
        {"b", key, 0, 4097, "offset 0 + byte_size 4097 is past the end of"},
        {"b", key, 1, 4096, "offset 1 + byte_size 4096 is past the end of"},
        {"b", key, 4096, 1, "offset 4096 + byte_size 1 is past the end of"},
        {"b", key, UINT64_MAX, 2, "is past the end of"},
        {"b", key, 0, 0, "byte_size: expected an integer >= 1"},
        {"a b", key, 0, 64, "region name 'a b': expected 1..127 of the characters"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(gw_shm_register(t, bad[i].name, bad[i].key, bad[i].offset, bad[i].byte_size,
                                     why, sizeof(why)),
                     SQ_BAD_REQUEST, "case %zu", i);
        cr_assert(strstr(why, bad[i].what) != NULL, "case %zu: \"%s\" lacks \"%s\"", i, why,
                  bad[i].what);
    }
    json_t *st = gw_shm_status(t, NULL);
    cr_assert_eq(json_array_size(st), 1, "a refusal registers nothing");
    json_decref(st);
    cr_assert_null(gw_shm_status(t, "b"));
    gw_shm_table_free(t);
    drop_object(map, 4096);
}

Test(shm_regions, a_region_unregistered_in_use_stays_mapped_until_let_go)
{
    uint8_t *map = make_object(4096);
    gw_shm_table_t *t = gw_shm_table_new();
    cr_assert_eq(gw_shm_register(t, "in", key, 0, 4096, why, sizeof(why)), 0, "%s", why);
    gw_shm_region_t *held = gw_shm_acquire(t, "in");
    json_t *gone = gw_shm_unregister(t, "in");
    cr_assert_eq(json_array_size(gone), 1);
    json_decref(gone);
    /* The name is free at once: unknown to new requests, registrable again. */
    cr_assert_null(gw_shm_acquire(t, "in"));
    cr_assert_null(gw_shm_status(t, "in"));
    cr_assert_eq(gw_shm_register(t, "in", key, 0, 64, why, sizeof(why)), 0, "%s", why);
    /* The request holding the old mapping still reads and writes it. */
    uint8_t *p = gw_shm_span(held, 4000, 96, why, sizeof(why));
    cr_assert_not_null(p, "%s", why);
    p[95] = 42;
    cr_assert_eq(map[4095], 42);
    gw_shm_release(held);
    /* Unregistering an unknown name takes nothing out, and is no error. */
    gone = gw_shm_unregister(t, "nothing");
    cr_assert_eq(json_array_size(gone), 0);
    json_decref(gone);
    gw_shm_table_free(t);
    drop_object(map, 4096);
}

Test(shm_regions, unregister_all_takes_every_region_in_order)
{
    uint8_t *map = make_object(4096);
    gw_shm_table_t *t = gw_shm_table_new();
    const char *names[] = {"c", "a", "b"};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(gw_shm_register(t, names[i], key, (uint64_t)i * 1000, 1000, why, sizeof(why)),
                     0, "%s", why);
    json_t *st = gw_shm_status(t, NULL);
    cr_assert_eq(json_array_size(st), 3);
    json_decref(st);
    json_t *gone = gw_shm_unregister(t, NULL);
    cr_assert_eq(json_array_size(gone), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_str_eq(json_string_value(json_array_get(gone, (size_t)i)), names[i]);
    json_decref(gone);
    st = gw_shm_status(t, NULL);
    cr_assert_eq(json_array_size(st), 0);
    json_decref(st);
    gw_shm_table_free(t);
    drop_object(map, 4096);
}

Test(shm_regions, an_object_shrunk_after_registering_is_refused_not_a_sigbus)
{
    uint8_t *map = make_object(8192);
    gw_shm_table_t *t = gw_shm_table_new();
    cr_assert_eq(gw_shm_register(t, "in", key, 0, 8192, why, sizeof(why)), 0, "%s", why);
    int fd = shm_open(key, O_RDWR, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 4096), 0);
    close(fd);
    gw_shm_region_t *r = gw_shm_acquire(t, "in");
    cr_assert_not_null(gw_shm_span(r, 0, 4096, why, sizeof(why)), "%s", why);
    cr_assert_null(gw_shm_span(r, 4096, 1, why, sizeof(why)));
    cr_assert(strstr(why, "shrank to 4096 bytes since it was registered") != NULL, "%s", why);
    gw_shm_release(r);
    gw_shm_table_free(t);
    munmap(map, 8192);
    shm_unlink(key);
}
