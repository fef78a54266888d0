#include <criterion/criterion.h>
#include <sq.h>

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

Test(shm, allocations_are_slot_aligned_disjoint_and_reusable)
{
    sq_shm_arena_t *a;
    cr_assert_eq(sq_shm_arena_create(&a, 64 * 1024, 4096), 0);
    cr_assert_eq(sq_shm_arena_size(a), 64 * 1024);
    int64_t x = sq_shm_alloc(a, 100);
    int64_t y = sq_shm_alloc(a, 4097);
    int64_t z = sq_shm_alloc(a, 4096);
    cr_assert_geq(x, 0);
    cr_assert_eq(x % 4096, 0);
    cr_assert_eq(y % 4096, 0);
    cr_assert(y >= x + 4096 || y + 8192 <= x);
    cr_assert(z >= y + 8192 || z + 4096 <= y);
    cr_assert_eq(sq_shm_arena_used(a), 4 * 4096);
    sq_shm_release(a, y);
    cr_assert_eq(sq_shm_arena_used(a), 2 * 4096);
    sq_shm_release(a, x);
    sq_shm_release(a, z);
    cr_assert_eq(sq_shm_arena_used(a), 0);
    sq_shm_arena_free(a);
}

Test(shm, exhaustion_returns_nomem_and_fragmentation_is_handled)
{
    sq_shm_arena_t *a;
    cr_assert_eq(sq_shm_arena_create(&a, 4 * 4096, 4096), 0);
    int64_t s[4];
    for (int i = 0; i < 4; i++)
        cr_assert_geq(s[i] = sq_shm_alloc(a, 4096), 0);
    cr_assert_eq(sq_shm_alloc(a, 1), SQ_NOMEM);
    sq_shm_release(a, s[1]);
    sq_shm_release(a, s[3]);
    cr_assert_eq(sq_shm_alloc(a, 8192), SQ_NOMEM, "two free slots, not contiguous");
    sq_shm_release(a, s[2]);
    int64_t big = sq_shm_alloc(a, 3 * 4096);
    cr_assert_eq(big, 4096);
    cr_assert_eq(sq_shm_alloc(a, 0), SQ_NOMEM);
    cr_assert_eq(sq_shm_alloc(a, 1 << 30), SQ_NOMEM);
    sq_shm_arena_free(a);
}

Test(shm, the_lowest_free_slots_are_reused_so_the_touched_pages_stay_few)
{
    sq_shm_arena_t *a;
    cr_assert_eq(sq_shm_arena_create(&a, 1024 * 4096, 4096), 0);
    /* Three in flight at a time, ten thousand allocations: only the first
     * slots are ever used. */
    int64_t live[3] = {-1, -1, -1}, top = 0;
    for (int i = 0; i < 10000; i++) {
        int k = i % 3;
        if (live[k] >= 0)
            sq_shm_release(a, live[k]);
        cr_assert_geq(live[k] = sq_shm_alloc(a, 100 + (i % 2) * 4096), 0);
        top = live[k] > top ? live[k] : top;
    }
    cr_assert_lt(top, 6 * 4096, "highest offset used %lld", (long long)top);
    /* A hole below is taken before anything above. */
    int64_t x = sq_shm_alloc(a, 4096), y = sq_shm_alloc(a, 4096);
    sq_shm_release(a, x);
    cr_assert_eq(sq_shm_alloc(a, 4096), x);
    cr_assert_gt(y, x);
    sq_shm_arena_free(a);
}

Test(shm, bad_geometry_is_rejected)
{
    sq_shm_arena_t *a = NULL;
    cr_assert_eq(sq_shm_arena_create(&a, 4096, 100), SQ_INVAL);
    cr_assert_eq(sq_shm_arena_create(&a, 0, 4096), SQ_INVAL);
    sq_shm_arena_free(NULL);
}

Test(shm, a_second_mapping_of_the_fd_sees_the_same_bytes)
{
    sq_shm_arena_t *a;
    cr_assert_eq(sq_shm_arena_create(&a, 8192, 4096), 0);
    int64_t off = sq_shm_alloc(a, 16);
    memcpy(sq_shm_arena_base(a) + off, "pixels", 7);
    pid_t pid = fork();
    if (pid == 0) {
        uint8_t *m = sq_shm_map(sq_shm_arena_fd(a), sq_shm_arena_size(a));
        int ok = m != NULL && strcmp((char *)m + off, "pixels") == 0;
        if (ok)
            memcpy(m + off, "output", 7);
        _exit(ok ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_assert_str_eq((char *)sq_shm_arena_base(a) + off, "output");
    sq_shm_arena_free(a);
}

/* Random allocations and releases against a plain first-fit over a slot
 * map: the same offsets, never an overlap, and the used count right. */
Test(shm, random_traffic_matches_a_plain_first_fit)
{
    enum { SLOTS = 256, LIVE = 64 };
    sq_shm_arena_t *a;
    cr_assert_eq(sq_shm_arena_create(&a, SLOTS * 64, 64), 0);
    unsigned char ref[SLOTS] = {0};
    int64_t off[LIVE];
    size_t len[LIVE];
    for (int i = 0; i < LIVE; i++)
        off[i] = -1;
    unsigned seed = 12345;
    size_t used = 0;
    for (int step = 0; step < 20000; step++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 16) % LIVE);
        if (off[k] >= 0) {
            sq_shm_release(a, off[k]);
            memset(ref + off[k] / 64, 0, len[k]);
            used -= len[k];
            off[k] = -1;
            continue;
        }
        size_t need = 1 + (seed >> 8) % 9;
        size_t at = SIZE_MAX;
        for (size_t i = 0, run = 0; i < SLOTS; i++) {
            run = ref[i] ? 0 : run + 1;
            if (run == need) {
                at = i + 1 - need;
                break;
            }
        }
        int64_t got = sq_shm_alloc(a, need * 64 - (seed >> 4) % 64);
        if (at == SIZE_MAX) {
            cr_assert_eq(got, SQ_NOMEM, "step %d", step);
            continue;
        }
        cr_assert_eq(got, (int64_t)(at * 64), "step %d: got %lld, first fit %zu", step,
                     (long long)got, at * 64);
        memset(ref + at, 1, need);
        off[k] = got;
        len[k] = need;
        used += need;
        cr_assert_eq(sq_shm_arena_used(a), used * 64);
    }
    sq_shm_arena_free(a);
}
