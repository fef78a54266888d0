#include <sq_heap.h>

#include <criterion/criterion.h>
#include <stdlib.h>

/* A reference: the present ids and keys, the least (key, id) by a scan. */
typedef struct {
    int present[64];
    int64_t key[64];
} ref_t;

static int ref_top(const ref_t *r, int n)
{
    int best = -1;
    for (int id = 0; id < n; id++)
        if (r->present[id] &&
            (best < 0 || r->key[id] < r->key[best] || (r->key[id] == r->key[best] && id < best)))
            best = id;
    return best;
}

Test(heap, random_sets_moves_and_removes_match_a_scan)
{
    enum { N = 64 };
    sq_iheap_t h = {0};
    sq_iheap_reserve(&h, N);
    ref_t r = {0};
    srand(7);
    for (int step = 0; step < 20000; step++) {
        int id = rand() % N, op = rand() % 4;
        if (op == 0) {
            sq_iheap_remove(&h, id);
            r.present[id] = 0;
        } else {
            int64_t key = rand() % 16; /* many ties */
            sq_iheap_set(&h, id, key);
            r.present[id] = 1;
            r.key[id] = key;
        }
        int want = ref_top(&r, N);
        cr_assert_eq(sq_iheap_top(&h), want, "step %d", step);
        if (want >= 0)
            cr_assert_eq(sq_iheap_top_key(&h, -1), r.key[want]);
        cr_assert_eq(sq_iheap_has(&h, id), r.present[id]);
    }
    /* Draining gives (key, id) order. */
    int64_t last_key = INT64_MIN;
    int last_id = -1;
    while (sq_iheap_top(&h) >= 0) {
        int id = sq_iheap_top(&h);
        int64_t k = sq_iheap_top_key(&h, 0);
        cr_assert(k > last_key || (k == last_key && id > last_id));
        last_key = k;
        last_id = id;
        sq_iheap_remove(&h, id);
    }
    sq_iheap_dispose(&h);
}

Test(heap, equal_keys_come_out_lowest_id_first_whatever_the_insertion_order)
{
    sq_iheap_t h = {0};
    sq_iheap_reserve(&h, 8);
    const int order[] = {5, 2, 7, 0, 3};
    for (int i = 0; i < 5; i++)
        sq_iheap_set(&h, order[i], 100);
    const int want[] = {0, 2, 3, 5, 7};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(sq_iheap_top(&h), want[i]);
        sq_iheap_remove(&h, want[i]);
    }
    cr_assert_eq(sq_iheap_top(&h), -1);
    cr_assert_eq(sq_iheap_top_key(&h, 42), 42);
    sq_iheap_remove(&h, 3);  /* absent: nothing */
    sq_iheap_remove(&h, 99); /* out of range: nothing */
    sq_iheap_dispose(&h);
}
