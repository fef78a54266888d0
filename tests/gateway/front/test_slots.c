/* gateway/front/slots.c: an item's slot id names it until it is answered,
 * and nothing after (a late assignment or failure finds nothing); each
 * item is answered exactly once. */
#include "front_test.h"

#include <criterion/criterion.h>

static int finished, last_rc;
static gw_item_t *last_item;

static void on_finish(gw_item_t *it, int rc, const char *detail)
{
    (void)detail;
    finished++;
    last_rc = rc;
    last_item = it;
}

static gw_item_t item(void)
{
    gw_item_t it = {0};
    it.input.in_off = -1;
    it.owner.finish = on_finish;
    return it;
}

Test(slots, an_id_names_its_item_until_the_slot_is_released)
{
    front_fixture_t x;
    front_fixture_init(&x);
    gw_item_t a = item(), b = item();
    uint64_t ida, idb;
    uint32_t idx;
    cr_assert_eq(fr_slot_new(x.fr, &a, &ida), 0);
    cr_assert_eq(fr_slot_new(x.fr, &b, &idb), 0);
    cr_assert_neq(ida, idb);
    cr_assert_eq(fr_slot_item(x.fr, ida, &idx), &a);
    cr_assert_eq(x.fr->slots[idx].state, SLOT_OFFERED);
    cr_assert_eq(fr_slot_item(x.fr, idb, &idx), &b);
    fr_release_slot(x.fr, (uint32_t)ida);
    cr_assert_null(fr_slot_item(x.fr, ida, &idx));
    /* The slot is reused with another generation: the old id still
     * names nothing, the new one names the new item. */
    gw_item_t c = item();
    uint64_t idc;
    cr_assert_eq(fr_slot_new(x.fr, &c, &idc), 0);
    cr_assert_eq((uint32_t)idc, (uint32_t)ida);
    cr_assert_neq(idc, ida);
    cr_assert_null(fr_slot_item(x.fr, ida, &idx));
    cr_assert_eq(fr_slot_item(x.fr, idc, &idx), &c);
    /* An index past the table names nothing. */
    cr_assert_null(fr_slot_item(x.fr, (uint64_t)x.fr->nslots, &idx));
    front_fixture_dispose(&x);
}

Test(slots, answering_a_slot_finishes_its_item_once_and_frees_it)
{
    front_fixture_t x;
    front_fixture_init(&x);
    finished = 0;
    gw_item_t a = item();
    uint64_t id;
    uint32_t idx;
    cr_assert_eq(fr_slot_new(x.fr, &a, &id), 0);
    cr_assert_not_null(fr_slot_item(x.fr, id, &idx));
    fr_answer_slot(x.fr, idx, SQ_WORKER_LOST, "gone");
    cr_assert_eq(finished, 1);
    cr_assert_eq(last_rc, SQ_WORKER_LOST);
    cr_assert_eq(last_item, &a);
    cr_assert_gt(a.times.done_us, 0);
    cr_assert_null(fr_slot_item(x.fr, id, &idx)); /* a late FE_FAIL finds nothing */
    front_fixture_dispose(&x);
}

Test(slots, the_table_grows_past_its_first_size)
{
    front_fixture_t x;
    front_fixture_init(&x);
    enum { N = 1000 };
    gw_item_t *items = calloc(N, sizeof(*items));
    uint64_t *ids = calloc(N, sizeof(*ids));
    for (int i = 0; i < N; i++) {
        items[i] = item();
        cr_assert_eq(fr_slot_new(x.fr, &items[i], &ids[i]), 0);
    }
    cr_assert_geq(x.fr->nslots, N);
    for (int i = 0; i < N; i++) {
        uint32_t idx;
        cr_assert_eq(fr_slot_item(x.fr, ids[i], &idx), &items[i], "item %d", i);
    }
    free(items);
    free(ids);
    front_fixture_dispose(&x);
}
