/* Prefix-batched execution on real models: resnet18_ft_a and resnet18_ft_b
 * (scripts/export_models.py) share every layer but the final Gemm. A group
 * runs their backbone once over a mixed batch and each classifier on its
 * rows; every row must match running its own model alone, and torch. */
#include "test_files.h"

#include <criterion/criterion.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec.h>

#define PER 1000
#define HW (3 * 224 * 224)

static mdb_graph_t *load(const char *name)
{
    return test_import(name);
}

static wk_plan_t *plan_of(const mdb_graph_t *g, int max_batch)
{
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = max_batch;
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    return p;
}

static double rel_diff(const float *got, const float *want, int64_t n)
{
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        max_ref = fabs(want[i]) > max_ref ? fabs(want[i]) : max_ref;
        max_diff = d > max_diff ? d : max_diff;
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

typedef struct {
    mdb_graph_t *a, *b;
    const char *cuts[2];
    wk_group_t *grp;
} pair_t;

static void pair_open(pair_t *p, int max_batch)
{
    p->a = load("resnet18_ft_a");
    p->b = load("resnet18_ft_b");
    mdb_prefix_t pre;
    cr_assert_eq(mdb_prefix_find(p->a, p->b, &pre), 0);
    cr_assert(pre.found);
    p->cuts[0] = p->a->tensors[pre.tensor_a].name;
    p->cuts[1] = p->b->tensors[pre.tensor_b].name;
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = max_batch;
    char why[512];
    const mdb_graph_t *gs[2] = {p->a, p->b};
    cr_assert_eq(wk_group_create(gs, p->cuts, 2, &o, &p->grp, why, sizeof(why)), 0, "%s", why);
}

static void pair_close(pair_t *p)
{
    wk_group_free(p->grp);
    mdb_graph_free(p->a);
    mdb_graph_free(p->b);
}

Test(group, mixed_batch_matches_each_model_alone_and_torch, .timeout = 300)
{
    pair_t p;
    pair_open(&p, 8);
    cr_assert_eq(wk_group_n_members(p.grp), 2);
    cr_assert_eq(wk_group_output_elems(p.grp, 0), PER);
    cr_assert_eq(wk_group_output_elems(p.grp, 1), PER);

    size_t len;
    float *in = test_slurp("resnet18_ft_a.b8.input.f32", &len);
    cr_assert_eq(len, (size_t)8 * HW * sizeof(float));
    float *ref[2];
    ref[0] = test_slurp("resnet18_ft_a.b8.output.f32", &len);
    ref[1] = test_slurp("resnet18_ft_b.b8.output.f32", &len);
    float *in_b = test_slurp("resnet18_ft_b.b8.input.f32", &len);
    cr_assert_eq(memcmp(in, in_b, len), 0, "the variants' references use the same images");
    free(in_b);

    /* Each model alone over all eight images. */
    float *alone[2];
    const mdb_graph_t *gs[2] = {p.a, p.b};
    for (int m = 0; m < 2; m++) {
        wk_plan_t *pl = plan_of(gs[m], 8);
        alone[m] = malloc(sizeof(float) * 8 * PER);
        cr_assert_eq(wk_plan_run(pl, 8, (const float *[]){in}, (float *[]){alone[m]}), 0);
        wk_plan_free(pl);
    }
    /* The variants really differ (else the test proves nothing). */
    cr_assert_gt(rel_diff(alone[0], alone[1], PER), 1e-2);

    /* Mixed batches: grouped runs, interleaved rows, one member only, and a
     * stride wider than the outputs. */
    const int patterns[4][8] = {{0, 0, 0, 1, 1, 1, 1, 1},
                                {1, 0, 1, 0, 0, 1, 1, 0},
                                {1, 1, 1, 1, 1, 1, 1, 1},
                                {0, 1, 0, 0, 0, 0, 0, 0}};
    const size_t strides[4] = {PER, PER, PER, PER + 24};
    for (int t = 0; t < 4; t++) {
        for (int batch = 1; batch <= 8; batch += 7) {
            float *out = calloc((size_t)batch * strides[t], sizeof(float));
            cr_assert_eq(wk_group_run(p.grp, batch, in, patterns[t], out, strides[t]), 0, "%s",
                         wk_group_errmsg(p.grp));
            for (int r = 0; r < batch; r++) {
                int m = patterns[t][r];
                const float *row = out + (size_t)r * strides[t];
                double d_alone = rel_diff(row, alone[m] + (size_t)r * PER, PER);
                double d_torch = rel_diff(row, ref[m] + (size_t)r * PER, PER);
                cr_assert(d_alone <= 1e-5, "pattern %d batch %d row %d (member %d): %.3g vs alone",
                          t, batch, r, m, d_alone);
                cr_assert(d_torch <= 1e-4, "pattern %d batch %d row %d: %.3g vs torch", t, batch, r,
                          d_torch);
            }
            free(out);
        }
    }
    free(in);
    for (int m = 0; m < 2; m++) {
        free(ref[m]);
        free(alone[m]);
    }
    pair_close(&p);
}

Test(group, pixels_take_the_same_path_as_a_plain_model, .timeout = 300)
{
    pair_t p;
    pair_open(&p, 4);
    uint8_t *px = malloc((size_t)4 * HW);
    uint32_t seed = 7;
    for (size_t i = 0; i < (size_t)4 * HW; i++) {
        seed = seed * 1103515245u + 12345u;
        px[i] = (uint8_t)(seed >> 24);
    }
    const int member[4] = {1, 1, 0, 1};
    float *out = malloc(sizeof(float) * 4 * PER);
    cr_assert_eq(wk_group_run_pixels(p.grp, 4, px, member, out, PER), 0, "%s",
                 wk_group_errmsg(p.grp));
    const mdb_graph_t *gs[2] = {p.a, p.b};
    for (int m = 0; m < 2; m++) {
        wk_plan_t *pl = plan_of(gs[m], 4);
        float *alone = malloc(sizeof(float) * 4 * PER);
        cr_assert_eq(wk_plan_run_pixels(pl, 4, px, alone), 0);
        for (int r = 0; r < 4; r++)
            if (member[r] == m)
                cr_assert(rel_diff(out + r * PER, alone + r * PER, PER) <= 1e-5, "row %d", r);
        free(alone);
        wk_plan_free(pl);
    }
    free(px);
    free(out);
    pair_close(&p);
}

Test(group, holds_one_backbone, .timeout = 300)
{
    pair_t p;
    pair_open(&p, 8);
    wk_plan_t *pa = plan_of(p.a, 8);
    uint64_t one = wk_plan_memory_bytes(pa), both = wk_group_memory_bytes(p.grp);
    /* resnet18's fc is 2 MB of its 45 MB of weights: two members cost a
     * little more than one model, far less than two. */
    cr_assert_lt(both, one + one / 5, "group %llu bytes vs one model %llu",
                 (unsigned long long)both, (unsigned long long)one);
    wk_plan_free(pa);
    pair_close(&p);
}

Test(group, refuses_bad_cuts_and_different_prefixes, .timeout = 300)
{
    mdb_graph_t *a = load("resnet18_ft_a"), *m = load("mobilenet_v2");
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_group_t *grp = NULL;
    char why[512];
    const mdb_graph_t *one[1] = {a};

    /* No such tensor. */
    const char *none[1] = {"no-such-tensor"};
    cr_assert_eq(wk_group_create(one, none, 1, &o, &grp, why, sizeof(why)), SQ_BAD_MODEL);
    cr_assert(strstr(why, "no-such-tensor") != NULL, "%s", why);

    /* A tensor inside a residual block: the skip connection bypasses it. */
    mdb_node_sig_t *sigs = calloc((size_t)a->n_nodes, sizeof(*sigs));
    cr_assert_eq(mdb_graph_signature(a, sigs), 0);
    const char *inside = NULL;
    for (int i = 1; i < a->n_nodes && inside == NULL; i++)
        if (!sigs[i].cut_ok && a->nodes[i].n_outputs == 1)
            inside = a->tensors[a->nodes[i].outputs[0]].name;
    free(sigs);
    cr_assert_not_null(inside);
    const char *cut_in[1] = {inside};
    cr_assert_eq(wk_group_create(one, cut_in, 1, &o, &grp, why, sizeof(why)), SQ_BAD_MODEL,
                 "cut at %s", inside);
    cr_assert(strstr(why, "not a cut") != NULL, "%s", why);

    /* mobilenet_v2 cut before its classifier: its layers are not resnet's. */
    const char *cuts[2] = {a->tensors[a->nodes[a->n_nodes - 1].inputs[0]].name,
                           m->tensors[m->nodes[m->n_nodes - 1].inputs[0]].name};
    const mdb_graph_t *gs[2] = {a, m};
    int rc = wk_group_create(gs, cuts, 2, &o, &grp, why, sizeof(why));
    cr_assert_neq(rc, 0);
    cr_assert_null(grp);
    cr_assert(strstr(why, "member 1") != NULL, "%s", why);

    /* Rows naming a member the group does not have. */
    const char *cut_a[1] = {cuts[0]};
    cr_assert_eq(wk_group_create(one, cut_a, 1, &o, &grp, why, sizeof(why)), 0, "%s", why);
    float *in = calloc((size_t)2 * HW, sizeof(float)), *out = calloc(2 * PER, sizeof(float));
    cr_assert_eq(wk_group_run(grp, 2, in, (const int[]){0, 1}, out, PER), SQ_INVAL);
    cr_assert_eq(wk_group_run(grp, 3, in, (const int[]){0, 0, 0}, out, PER), SQ_INVAL);
    cr_assert_eq(wk_group_run(grp, 2, in, (const int[]){0, 0}, out, PER - 1), SQ_INVAL);
    cr_assert_eq(wk_group_run(grp, 2, in, (const int[]){0, 0}, out, PER), 0);
    free(in);
    free(out);
    wk_group_free(grp);
    mdb_graph_free(a);
    mdb_graph_free(m);
}

/* A group in the arena a worker's models share, its batches alternating
 * with another model's (each run overwrites the other's activations):
 * every row still the model's own answer, and the arena the larger plan's,
 * not the sum; after keeping sizes 1..2 a size given back is made again. */
Test(group, shares_an_arena_with_another_model_and_alternates_batches, .timeout = 300)
{
    pair_t p;
    pair_open(&p, 8);
    size_t len;
    float *in = test_slurp("resnet18_ft_a.b8.input.f32", &len);
    cr_assert_eq(len, (size_t)8 * HW * sizeof(float));
    const mdb_graph_t *gs[2] = {p.a, p.b};
    float *alone[2];
    wk_plan_t *model = NULL;
    for (int m = 0; m < 2; m++) {
        wk_plan_t *pl = plan_of(gs[m], 8);
        alone[m] = malloc(sizeof(float) * 8 * PER);
        cr_assert_eq(wk_plan_run(pl, 8, (const float *[]){in}, (float *[]){alone[m]}), 0);
        if (m == 0)
            model = pl; /* the other model in the arena: member a alone */
        else
            wk_plan_free(pl);
    }
    wk_arena_t *a = wk_arena_new();
    char why[256];
    cr_assert_eq(wk_plan_share_arena(model, a, why, sizeof(why)), 0, "%s", why);
    size_t model_bytes = wk_arena_bytes(a);
    cr_assert_eq(wk_group_share_arena(p.grp, a, why, sizeof(why)), 0, "%s", why);
    /* the group's backbone is the model's: its activations fit the same */
    cr_assert_leq(wk_arena_bytes(a), model_bytes + model_bytes / 10, "%zu bytes, model alone %zu",
                  wk_arena_bytes(a), model_bytes);
    const int member[8] = {1, 0, 1, 1, 0, 0, 1, 0};
    const int batches[] = {8, 3, 1, 8, 5, 2};
    float *out = malloc(sizeof(float) * 8 * PER);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 6; i++) {
            int gb = batches[i], mb = batches[(i + 1) % 6];
            cr_assert_eq(wk_group_run(p.grp, gb, in, member, out, PER), 0, "%s",
                         wk_group_errmsg(p.grp));
            for (int r = 0; r < gb; r++)
                cr_assert(rel_diff(out + (size_t)r * PER, alone[member[r]] + (size_t)r * PER,
                                   PER) <= 1e-5,
                          "round %d group batch %d row %d", round, gb, r);
            cr_assert_eq(wk_plan_run(model, mb, (const float *[]){in}, (float *[]){out}), 0);
            cr_assert(rel_diff(out, alone[0], (int64_t)mb * PER) <= 1e-5, "round %d model batch %d",
                      round, mb);
        }
        /* the profile reached 2: the rest given back (but the first size
         * of the plan for large batches, where small ones have their own),
         * made again in the next round */
        wk_group_keep_sizes(p.grp, 2);
        int ready = wk_group_sizes_ready(p.grp);
        cr_assert(ready == 2 || ready == 3, "%d sizes ready after keeping 2", ready);
    }
    free(out);
    free(in);
    free(alone[0]);
    free(alone[1]);
    pair_close(&p);
    wk_plan_free(model);
    wk_arena_free(a);
}
