/* gateway/api/query_answer.c: a query's answer without a server: a stage
 * without crop children answers its top-k, one with crop children one node
 * per detection per child stage under its parent, each with its box in
 * frame pixels and its score. */
#include <criterion/criterion.h>
#include <api_int.h>
#include <sq.h>

#include <math.h>
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

/* A classifier with these classes (labels), from a modeldb record. */
static gw_model_t *classifier(const char *name, int nclasses)
{
    json_t *labels = json_array();
    static const char *names[] = {"cat", "dog", "owl", "fox"};
    for (int i = 0; i < nclasses && i < 4; i++)
        json_array_append_new(labels, json_string(names[i]));
    json_t *rec = json_pack(
        "{s:I, s:s, s:i, s:s, s:s, s:s, s:{s:s, s:s, s:[i, i, i, i]}, s:[{s:s, s:s, s:[i, i]}],"
        " s:f, s:i, s:o}",
        "id", (json_int_t)1, "name", name, "version", 1, "sha256", "00", "format", "emulated",
        "status", "ready", "input", "name", "x", "datatype", "FP32", "shape", -1, 3, 64, 64,
        "outputs", "name", "y", "datatype", "FP32", "shape", -1, nclasses, "default_slo_ms", 100.0,
        "max_batch", 8, "labels", labels);
    cr_assert_not_null(rec);
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    return m;
}

/* ---- the answer ------------------------------------------------------------- */

/* A node of stage with its output row (owned by the test). */
static gw_qnode_t *node(int stage, const float *row)
{
    gw_qnode_t *n = sq_xcalloc(1, sizeof(*n));
    n->stage = stage;
    n->row = (float *)row;
    return n;
}

static void adopt(gw_qnode_t *parent, int k, gw_qnode_t **kids, int n)
{
    parent->kids[k] = kids;
    parent->nkids[k] = n;
}

static void assert_prediction(json_t *preds, size_t i, int index, const char *label)
{
    json_t *pr = json_array_get(preds, i);
    cr_assert_not_null(pr, "prediction %zu", i);
    cr_assert_eq(json_integer_value(json_object_get(pr, "index")), index, "prediction %zu", i);
    cr_assert_str_eq(json_string_value(json_object_get(pr, "label")), label);
}

static void assert_box(json_t *d, double x0, double y0, double x1, double y1, double score)
{
    json_t *box = json_object_get(d, "box");
    cr_assert_eq(json_array_size(box), 4);
    double want[4] = {x0, y0, x1, y1};
    for (size_t i = 0; i < 4; i++)
        cr_assert_float_eq(json_number_value(json_array_get(box, i)), want[i], 1e-6, "box[%zu]", i);
    cr_assert_float_eq(json_number_value(json_object_get(d, "score")), score, 1e-6);
}

Test(query, a_stage_without_crop_children_answers_its_top_k)
{
    gw_pipeline_t *p = parse_ok("{\"name\": \"one\", \"slo_ms\": 50, \"stages\": [{\"id\": "
                                "\"cls\", \"model\": \"c\", \"top_k\": 2}]}");
    gw_model_t *models[GW_PIPE_MAX_STAGES] = {classifier("c", 4)};
    const float row[4] = {0.1f, 3.0f, 0.2f, 2.0f};
    gw_qnode_t *n = node(0, row);
    json_t *o = gw_query_node_json(p, models, n);
    cr_assert_eq(json_object_size(o), 1);
    json_t *preds = json_object_get(o, "predictions");
    cr_assert_eq(json_array_size(preds), 2, "top_k 2");
    assert_prediction(preds, 0, 1, "dog");
    assert_prediction(preds, 1, 3, "fox");
    json_decref(o);
    free(n);
    gw_model_unref(models[0]);
    gw_pipeline_unref(p);
}

/* det -> cls (top_k 1) and det -> age: one node per detection per child
 * stage, in detection order, each with its box and score. */
Test(query, each_detection_answers_one_node_per_child_stage_under_its_parent)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"top_k\": 1, \"crops_of\": {\"stage\": "
        "\"det\", " CROPS "}},"
        "{\"id\": \"age\", \"model\": \"a\", \"top_k\": 2, \"crops_of\": {\"stage\": "
        "\"det\", " CROPS "}}]}");
    gw_model_t *models[GW_PIPE_MAX_STAGES] = {classifier("d", 2), classifier("c", 3),
                                              classifier("a", 2)};
    const float det_row[2] = {0, 0}, cat[3] = {5, 0, 0}, owl[3] = {0, 0, 5}, young[2] = {1, 0};
    gw_qnode_t *root = node(0, det_row);
    gw_qnode_t *c0 = node(1, cat), *c1 = node(1, owl), *a0 = node(2, young), *a1 = node(2, young);
    gw_detection_t d0 = {.x0 = 1, .y0 = 2, .x1 = 3, .y1 = 4, .score = 0.75f};
    gw_detection_t d1 = {.x0 = 10, .y0 = 20, .x1 = 30, .y1 = 40, .score = 0.5f};
    c0->det = a0->det = d0;
    c1->det = a1->det = d1;
    gw_qnode_t *cls_kids[] = {c0, c1}, *age_kids[] = {a0, a1};
    adopt(root, 0, cls_kids, 2);
    adopt(root, 1, age_kids, 2);

    json_t *o = gw_query_node_json(p, models, root);
    cr_assert_eq(json_object_size(o), 2, "one key per child stage, no predictions of its own");
    cr_assert_null(json_object_get(o, "predictions"));
    json_t *cls = json_object_get(o, "cls");
    cr_assert_eq(json_array_size(cls), 2);
    assert_box(json_array_get(cls, 0), 1, 2, 3, 4, 0.75);
    assert_box(json_array_get(cls, 1), 10, 20, 30, 40, 0.5);
    json_t *p0 = json_object_get(json_array_get(cls, 0), "predictions");
    cr_assert_eq(json_array_size(p0), 1);
    assert_prediction(p0, 0, 0, "cat");
    assert_prediction(json_object_get(json_array_get(cls, 1), "predictions"), 0, 2, "owl");
    json_t *age = json_object_get(o, "age");
    cr_assert_eq(json_array_size(age), 2);
    cr_assert_eq(json_array_size(json_object_get(json_array_get(age, 1), "predictions")), 2);
    assert_box(json_array_get(age, 1), 10, 20, 30, 40, 0.5);
    json_decref(o);
    free(root);
    free(c0);
    free(c1);
    free(a0);
    free(a1);
    for (int i = 0; i < 3; i++)
        gw_model_unref(models[i]);
    gw_pipeline_unref(p);
}

Test(query, a_node_without_detections_answers_an_empty_list_per_child_stage)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    gw_model_t *models[GW_PIPE_MAX_STAGES] = {classifier("d", 2), classifier("c", 3)};
    const float row[2] = {0, 0};
    gw_qnode_t *root = node(0, row);
    json_t *o = gw_query_node_json(p, models, root);
    json_t *cls = json_object_get(o, "cls");
    cr_assert(json_is_array(cls));
    cr_assert_eq(json_array_size(cls), 0);
    json_decref(o);
    free(root);
    gw_model_unref(models[0]);
    gw_model_unref(models[1]);
    gw_pipeline_unref(p);
}

/* det -> face -> eyes: a crop of a crop nests under its parent's node. */
Test(query, a_crop_of_a_crop_nests_under_its_parents_node)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": ["
        "{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"face\", \"model\": \"f\", \"crops_of\": {\"stage\": \"det\", " CROPS "}},"
        "{\"id\": \"eyes\", \"model\": \"e\", \"top_k\": 1, \"crops_of\": {\"stage\": "
        "\"face\", " CROPS "}}]}");
    gw_model_t *models[GW_PIPE_MAX_STAGES] = {classifier("d", 2), classifier("f", 2),
                                              classifier("e", 2)};
    const float row[2] = {0, 1};
    gw_qnode_t *root = node(0, row), *face = node(1, row), *e0 = node(2, row), *e1 = node(2, row);
    gw_qnode_t *faces[] = {face}, *eyes[] = {e0, e1};
    adopt(root, 0, faces, 1);
    adopt(face, 0, eyes, 2);
    gw_query_place_crop(root, &(gw_detection_t){.x0 = 10, .y0 = 10, .x1 = 40, .y1 = 40},
                        (gw_rect_t){10, 10, 30, 30}, face);
    gw_query_place_crop(face, &(gw_detection_t){.x0 = 1, .y0 = 2, .x1 = 5, .y1 = 6},
                        (gw_rect_t){1, 2, 4, 4}, e0);
    gw_query_place_crop(face, &(gw_detection_t){.x0 = 20, .y0 = 2, .x1 = 25, .y1 = 6},
                        (gw_rect_t){20, 2, 5, 4}, e1);
    json_t *o = gw_query_node_json(p, models, root);
    json_t *f0 = json_array_get(json_object_get(o, "face"), 0);
    cr_assert_not_null(f0);
    assert_box(f0, 10, 10, 40, 40, 0);
    cr_assert_null(json_object_get(f0, "predictions"), "a face has crop children: no top-k");
    json_t *es = json_object_get(f0, "eyes");
    cr_assert_eq(json_array_size(es), 2);
    assert_box(json_array_get(es, 0), 11, 12, 15, 16, 0);
    assert_box(json_array_get(es, 1), 30, 12, 35, 16, 0);
    assert_prediction(json_object_get(json_array_get(es, 1), "predictions"), 0, 1, "dog");
    json_decref(o);
    free(root);
    free(face);
    free(e0);
    free(e1);
    for (int i = 0; i < 3; i++)
        gw_model_unref(models[i]);
    gw_pipeline_unref(p);
}
