/* gateway/api/query.c: a complex query's tree without a server: its root
 * nodes (one per frame per root stage), its deadlines and budgets from the
 * pipeline's split, crops placed in frame pixels, and the whole-query
 * drop (the first failure wins and abandons the query; a 503 is a drop). */
#include <criterion/criterion.h>
#include <api_int.h>
#include <sq.h>

#include <math.h>
#include <pthread.h>
#include <string.h>

#define CROPS "\"boxes\": \"b\", \"scores\": \"s\""

static gw_pipeline_t *parse_ok(const char *txt)
{
    json_error_t je;
    json_t *j = json_loads(txt, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    gw_pipeline_t *p = NULL;
    char err[512];
    int rc = gw_pipeline_parse(j, NULL, &p, err, sizeof(err));
    json_decref(j);
    cr_assert_eq(rc, 0, "%s", err);
    return p;
}

/* ---- roots ---------------------------------------------------------------- */

Test(query, roots_are_the_stages_on_the_image_in_stage_order)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": ["
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}},"
        "{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"scene\", \"model\": \"s\"}]}");
    int roots[GW_PIPE_MAX_STAGES];
    cr_assert_eq(gw_query_roots(p, roots), 2);
    cr_assert_eq(roots[0], 1, "det");
    cr_assert_eq(roots[1], 2, "scene");
    gw_pipeline_unref(p);

    p = parse_ok("{\"name\": \"one\", \"slo_ms\": 50, \"stages\": [{\"id\": \"a\", \"model\": "
                 "\"m\"}]}");
    cr_assert_eq(gw_query_roots(p, roots), 1);
    cr_assert_eq(roots[0], 0);
    gw_pipeline_unref(p);
}

/* ---- deadlines from the split ---------------------------------------------- */

Test(query, a_query_at_the_pipelines_slo_has_its_split)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    double cum[GW_PIPE_MAX_STAGES], budget[GW_PIPE_MAX_STAGES];
    cr_assert_float_eq(gw_query_split(p, -1, 60000, cum, budget), 300, 1e-9,
                       "no SLO asked: the pipeline's");
    /* The even split: the detector's deadline at 150 ms, the classifier's
     * at 300; 150 ms each. */
    cr_assert_float_eq(cum[0], 150, 1e-9);
    cr_assert_float_eq(cum[1], 300, 1e-9);
    cr_assert_float_eq(budget[0], 150, 1e-9);
    cr_assert_float_eq(budget[1], 150, 1e-9);
    cr_assert_float_eq(gw_query_split(p, 0, 60000, cum, budget), 300, 1e-9, "0: none asked");
    gw_pipeline_unref(p);
}

Test(query, a_query_asking_another_slo_gets_the_same_shares_of_it)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    /* A DP split that gave the detector a third. */
    pthread_mutex_lock(&p->mu);
    p->cum_ms[0] = 100;
    p->cum_ms[1] = 300;
    p->budget_ms[0] = 100;
    p->budget_ms[1] = 200;
    pthread_mutex_unlock(&p->mu);
    double cum[GW_PIPE_MAX_STAGES], budget[GW_PIPE_MAX_STAGES];
    cr_assert_float_eq(gw_query_split(p, 600, 60000, cum, budget), 600, 1e-9);
    cr_assert_float_eq(cum[0], 200, 1e-9);
    cr_assert_float_eq(cum[1], 600, 1e-9);
    cr_assert_float_eq(budget[0], 200, 1e-9);
    cr_assert_float_eq(budget[1], 400, 1e-9);
    cr_assert_float_eq(gw_query_split(p, 30, 60000, cum, budget), 30, 1e-9);
    cr_assert_float_eq(cum[0], 10, 1e-9);
    cr_assert_float_eq(budget[1], 20, 1e-9);
    /* The pipeline's own split is untouched. */
    cr_assert_float_eq(p->cum_ms[0], 100, 1e-9);
    cr_assert_float_eq(p->cum_ms[1], 300, 1e-9);
    gw_pipeline_unref(p);
}

Test(query, the_slo_is_capped_at_the_longest_a_request_may_take)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    double cum[GW_PIPE_MAX_STAGES], budget[GW_PIPE_MAX_STAGES];
    cr_assert_float_eq(gw_query_split(p, 10000, 1000, cum, budget), 1000, 1e-9);
    cr_assert_float_eq(cum[1], 1000, 1e-9, "the last deadline is the capped SLO");
    cr_assert_float_eq(cum[0], 500, 1e-9);
    /* The pipeline's own SLO is capped too. */
    cr_assert_float_eq(gw_query_split(p, -1, 200, cum, budget), 200, 1e-9);
    cr_assert_float_eq(cum[1], 200, 1e-9);
    gw_pipeline_unref(p);
}

/* A deeper tree: det -> face -> eyes, det -> car, and a root scene
 * classifier beside the detector. Every path fits the SLO, and a budget is
 * its stage's deadline less its parent's. */
Test(query, every_stage_budget_is_its_deadline_less_its_parents)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": ["
        "{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"face\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}},"
        "{\"id\": \"eyes\", \"model\": \"c\", \"crops_of\": {\"stage\": \"face\", " CROPS "}},"
        "{\"id\": \"car\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}},"
        "{\"id\": \"scene\", \"model\": \"s\"}]}");
    double cum[GW_PIPE_MAX_STAGES], budget[GW_PIPE_MAX_STAGES];
    gw_query_split(p, 600, 60000, cum, budget);
    /* The even split (each stage the SLO over the longest path through it,
     * pl_query_even_budgets), scaled to 600: det, face and eyes 200 on the
     * three-stage path, car 300 (det -> car is two stages), scene alone 600. */
    double want_cum[] = {200, 400, 600, 500, 600};
    double want_budget[] = {200, 200, 200, 300, 600};
    for (int i = 0; i < p->nstages; i++) {
        cr_assert_float_eq(cum[i], want_cum[i], 1e-9, "stage %s", p->stages[i].id);
        cr_assert_float_eq(budget[i], want_budget[i], 1e-9, "stage %s", p->stages[i].id);
    }
    /* An uneven split: each budget follows its own parent's deadline. */
    pthread_mutex_lock(&p->mu);
    double dp[] = {50, 200, 300, 250, 120};
    memcpy(p->cum_ms, dp, sizeof(dp));
    pthread_mutex_unlock(&p->mu);
    gw_query_split(p, 300, 60000, cum, budget);
    cr_assert_float_eq(budget[0], 50, 1e-9);
    cr_assert_float_eq(budget[1], 150, 1e-9, "face: 200 - det's 50");
    cr_assert_float_eq(budget[2], 100, 1e-9, "eyes: 300 - face's 200");
    cr_assert_float_eq(budget[3], 200, 1e-9, "car: 250 - det's 50");
    cr_assert_float_eq(budget[4], 120, 1e-9, "scene: a root, from arrival");
    gw_pipeline_unref(p);
}

/* ---- crops in frame pixels -------------------------------------------------- */

Test(query, crops_of_a_frame_decoded_at_a_dct_scale_are_placed_in_the_frames_own_pixels)
{
    /* A 4000 x 3000 frame kept at 1/8 (500 x 375): a face the detector
     * found at (10, 20)-(50, 80) of that image is at 8x that in the frame;
     * a crop of its crop at 8x its place too. */
    gw_qnode_t root, face, eye;
    memset(&root, 0, sizeof(root));
    memset(&face, 0, sizeof(face));
    memset(&eye, 0, sizeof(eye));
    root.sx = root.sy = 8;
    gw_detection_t d = {.x0 = 10, .y0 = 20, .x1 = 50, .y1 = 80, .score = 0.9f};
    gw_query_place_crop(&root, &d, (gw_rect_t){5, 15, 50, 70}, &face);
    cr_assert_float_eq(face.det.x0, 80, 1e-4);
    cr_assert_float_eq(face.det.y1, 640, 1e-4);
    cr_assert_eq(face.rect_x, 5, "cut in the decoded image's pixels");
    gw_detection_t e = {.x0 = 3, .y0 = 4, .x1 = 13, .y1 = 24, .score = 0.5f};
    gw_query_place_crop(&face, &e, (gw_rect_t){2, 3, 12, 22}, &eye);
    cr_assert_float_eq(eye.det.x0, 64, 1e-4, "(3 + 5) x 8");
    cr_assert_float_eq(eye.det.y0, 152, 1e-4, "(4 + 15) x 8");
}

Test(query, a_crop_of_a_crop_is_placed_in_frame_pixels)
{
    gw_qnode_t root, face, eye;
    memset(&root, 0, sizeof(root));
    memset(&face, 0, sizeof(face));
    memset(&eye, 0, sizeof(eye));
    /* The detector saw a face at (10, 20)-(50, 80) of the frame; its crop,
     * padded, is the frame's (5, 15) 50x70. */
    gw_detection_t d = {.x0 = 10, .y0 = 20, .x1 = 50, .y1 = 80, .score = 0.9f, .index = 3};
    gw_query_place_crop(&root, &d, (gw_rect_t){5, 15, 50, 70}, &face);
    cr_assert_float_eq(face.det.x0, 10, 1e-6);
    cr_assert_float_eq(face.det.y1, 80, 1e-6);
    cr_assert_float_eq(face.det.score, 0.9f, 1e-6);
    cr_assert_eq(face.det.index, 3);
    cr_assert_eq(face.rect_x, 5);
    cr_assert_eq(face.rect_y, 15);
    /* In the face's crop, an eye at (3, 4)-(13, 24); its crop at (2, 3). */
    gw_detection_t e = {.x0 = 3, .y0 = 4, .x1 = 13, .y1 = 24, .score = 0.5f, .index = 0};
    gw_query_place_crop(&face, &e, (gw_rect_t){2, 3, 12, 22}, &eye);
    cr_assert_float_eq(eye.det.x0, 8, 1e-6, "3 + the face crop's 5");
    cr_assert_float_eq(eye.det.y0, 19, 1e-6, "4 + 15");
    cr_assert_float_eq(eye.det.x1, 18, 1e-6);
    cr_assert_float_eq(eye.det.y1, 39, 1e-6);
    cr_assert_float_eq(eye.det.score, 0.5f, 1e-6);
    cr_assert_eq(eye.rect_x, 7);
    cr_assert_eq(eye.rect_y, 18);
    /* The parent's detection is left as it was. */
    cr_assert_float_eq(e.x0, 3, 1e-6);
}

/* A box the detector drew past its image's edge is answered clamped to
 * that image, as /v1 answers it (the pipeline answered it unclamped: the
 * same detection, two boxes); the crop is cut where it was. */
Test(query, a_box_past_the_image_s_edge_is_answered_clamped_to_it_as_on_v1)
{
    gw_qnode_t root, face;
    memset(&root, 0, sizeof(root));
    memset(&face, 0, sizeof(face));
    root.orig_w = 96;
    root.orig_h = 64;
    gw_detection_t d = {.x0 = -5.5f, .y0 = -3, .x1 = 120, .y1 = 60, .score = 0.9f};
    gw_query_place_crop(&root, &d, (gw_rect_t){0, 0, 96, 64}, &face);
    cr_assert_float_eq(face.det.x0, 0, 1e-6);
    cr_assert_float_eq(face.det.y0, 0, 1e-6);
    cr_assert_float_eq(face.det.x1, 96, 1e-6);
    cr_assert_float_eq(face.det.y1, 60, 1e-6);
    /* In a crop at (10, 20) of a frame kept at 1/2: clamped to the crop's
     * 30 x 30, then placed. */
    face.orig_w = face.orig_h = 30;
    face.rect_x = 10;
    face.rect_y = 20;
    face.sx = face.sy = 2;
    gw_qnode_t eye;
    memset(&eye, 0, sizeof(eye));
    gw_detection_t e = {.x0 = 25, .y0 = -2, .x1 = 40, .y1 = 10};
    gw_query_place_crop(&face, &e, (gw_rect_t){25, 0, 5, 10}, &eye);
    cr_assert_float_eq(eye.det.x0, 70, 1e-6, "(25 + 10) x 2");
    cr_assert_float_eq(eye.det.x1, 80, 1e-6, "(30 + 10) x 2");
    cr_assert_float_eq(eye.det.y0, 40, 1e-6, "(0 + 20) x 2");
    cr_assert_float_eq(eye.det.y1, 60, 1e-6);
}

/* ---- the whole-query drop ---------------------------------------------------- */

Test(query, the_first_failure_is_the_answer_and_abandons_the_query)
{
    gw_query_fate_t f;
    memset(&f, 0, sizeof(f));
    cr_assert_eq(gw_query_outcome(&f), GW_Q_OK);
    cr_assert_not(atomic_load(&f.abandoned));
    gw_query_fate_fail(&f, SQ_DEADLINE, "stage %s: %s", "cls", "too late");
    cr_assert(atomic_load(&f.abandoned), "its queued items are not run");
    cr_assert(atomic_load(&f.failed));
    cr_assert_eq(f.err, SQ_DEADLINE);
    cr_assert_str_eq(f.detail, "stage cls: too late");
    /* A later failure (another node of the same query) changes nothing. */
    gw_query_fate_fail(&f, SQ_BAD_IMAGE, "stage det: %s", "not a JPEG");
    cr_assert_eq(f.err, SQ_DEADLINE);
    cr_assert_str_eq(f.detail, "stage cls: too late");
    cr_assert(atomic_load(&f.abandoned));
    cr_assert_eq(gw_query_outcome(&f), GW_Q_DROPPED);
}

Test(query, a_503_failure_is_a_drop_and_any_other_an_error)
{
    const int dropped[] = {SQ_DEADLINE, SQ_OVERLOAD, SQ_NO_WORKER, SQ_WORKER_LOST,
                           SQ_SHUTTING_DOWN};
    for (size_t i = 0; i < sizeof(dropped) / sizeof(dropped[0]); i++) {
        gw_query_fate_t f;
        memset(&f, 0, sizeof(f));
        gw_query_fate_fail(&f, dropped[i], "x");
        cr_assert_eq(gw_query_outcome(&f), GW_Q_DROPPED, "%s", sq_err_name(dropped[i]));
    }
    /* slo_too_tight: refused for an SLO no retry can meet, the caller's
     * error (400), not a drop. */
    const int failed[] = {SQ_BAD_IMAGE, SQ_MODEL_FAILED, SQ_BAD_CONFIG, SQ_MODEL_NOT_FOUND,
                          SQ_SLO_TOO_TIGHT};
    for (size_t i = 0; i < sizeof(failed) / sizeof(failed[0]); i++) {
        gw_query_fate_t f;
        memset(&f, 0, sizeof(f));
        gw_query_fate_fail(&f, failed[i], "x");
        cr_assert_eq(gw_query_outcome(&f), GW_Q_FAILED, "%s", sq_err_name(failed[i]));
    }
}

Test(query, a_long_failure_detail_is_cut_to_fit)
{
    gw_query_fate_t f;
    memset(&f, 0, sizeof(f));
    char longer[600];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    gw_query_fate_fail(&f, SQ_BAD_IMAGE, "%s", longer);
    cr_assert_eq(strlen(f.detail), sizeof(f.detail) - 1);
}

/* Nodes of one query fail on several threads at once: one failure wins,
 * whole (its error with its own detail). */
typedef struct {
    gw_query_fate_t *f;
    int rc;
} racer_t;

static void *race(void *arg)
{
    racer_t *r = arg;
    for (int i = 0; i < 100; i++)
        gw_query_fate_fail(r->f, r->rc, "error %d", r->rc);
    return NULL;
}

Test(query, failures_racing_on_threads_keep_one_whole_answer)
{
    for (int round = 0; round < 20; round++) {
        gw_query_fate_t f;
        memset(&f, 0, sizeof(f));
        const int codes[] = {SQ_DEADLINE, SQ_BAD_IMAGE, SQ_OVERLOAD, SQ_MODEL_FAILED};
        pthread_t t[4];
        racer_t r[4];
        for (int i = 0; i < 4; i++) {
            r[i] = (racer_t){&f, codes[i]};
            cr_assert_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
        }
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        char want[32];
        snprintf(want, sizeof(want), "error %d", f.err);
        cr_assert_str_eq(f.detail, want, "the detail is the winning error's");
        cr_assert(atomic_load(&f.abandoned));
    }
}
