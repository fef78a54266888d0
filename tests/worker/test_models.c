/* Whole torchvision models, exported with Debian's torch by
 * scripts/export_models.py into $SQUISH_TEST_MODELS: imported, planned for
 * max batch 8, run at batch 1 and at batch 8 (eight distinct images), and
 * compared with torch's own outputs. Tolerance: 1e-4 of the output's
 * largest magnitude (fp32 accumulation order differs from torch's). */
#include "test_files.h"

#include <criterion/criterion.h>
#include <malloc.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec_int.h>

/* Items 0..batch-1 of torch's batch-8 reference (eight distinct images,
 * each output torch's for its own image), or its batch-1 one. */
typedef struct {
    float *in, *out;
} ref_t;

static ref_t load_ref(const char *name, int batch, int64_t per)
{
    ref_t r;
    test_load_refs(name, batch, 3 * 224 * 224, per, &r.in, &r.out);
    return r;
}

/* Plans name for max batch 8 and runs it at each of batches (1..8) against
 * torch's outputs; the items of a batch b > 1 are the first b of torch's
 * batch 8, in buffers of exactly b items. n_plans > 0: the plan holds that
 * many plans per batch size (wk_plan_t.each). ready > 0: the plan is made
 * with sizes 1..ready only (wk_plan_opts_t.ready_batch), and each other
 * size is made at its first run. */
static void check_model_ready(const char *name, const int *batches, int n_batches, int n_plans,
                              int ready)
{
    mdb_graph_t *g = test_import(name);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 8;
    o.ready_batch = ready;
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "plan %s: %s", name, why);
    mdb_graph_free(g);
    if (ready > 0) {
        /* sizes 1..ready, and the first size of the plan for larger
         * batches where small batches have a plan of their own */
        int want = p->small != NULL && p->min_batch > ready ? ready + 1 : ready;
        cr_assert_eq(wk_plan_sizes_ready(p), want, "%s: %d sizes ready at creation, not %d", name,
                     wk_plan_sizes_ready(p), want);
    } else {
        cr_assert_eq(wk_plan_sizes_ready(p), 8);
    }
    int64_t per = wk_plan_output_elems(p, 0);
    cr_assert_eq(per, 1000);
    if (n_plans > 0) {
        cr_assert_not_null(p->each, "%s is not planned per batch size", name);
        cr_assert_eq(p->n_each, n_plans);
        uint64_t plans = 0;
        for (int s = 1; s <= 8; s++)
            plans += p->each[s] != NULL ? wk_plan_memory_bytes(p->each[s]) : 0;
        /* the plans, and the scratch: 8 images in, 8 rows of logits out */
        cr_assert_eq(wk_plan_memory_bytes(p), plans + (8 * 3 * 224 * 224 + 8 * 1000) * 4);
    }
    ref_t one = load_ref(name, 1, per), eight = load_ref(name, 8, per);
    size_t item = (size_t)3 * 224 * 224;
    for (int k = 0; k < n_batches; k++) {
        int batch = batches[k];
        const ref_t *r = batch == 1 ? &one : &eight;
        float *in = malloc((size_t)batch * item * sizeof(float));
        memcpy(in, r->in, (size_t)batch * item * sizeof(float));
        const float *want = r->out;
        float *got = malloc((size_t)(batch * per) * sizeof(float));
        cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, (float *[]){got}), 0, "%s",
                     wk_plan_errmsg(p));
        for (int b = 0; b < batch; b++) {
            double max_ref = 0, max_diff = 0;
            for (int64_t i = 0; i < per; i++) {
                double ref = want[b * per + i], d = fabs(got[b * per + i] - ref);
                max_ref = fabs(ref) > max_ref ? fabs(ref) : max_ref;
                max_diff = d > max_diff ? d : max_diff;
            }
            cr_assert(max_diff <= 1e-4 * max_ref,
                      "%s batch %d image %d: max |diff| %.3g vs max |ref| %.3g (%.2g relative)",
                      name, batch, b, max_diff, max_ref, max_diff / max_ref);
        }
        free(in);
        free(got);
    }
    if (ready > 0) {
        bool seen[9] = {false};
        int made = wk_plan_sizes_ready(p) - (p->small != NULL && p->min_batch > ready ? 1 : 0);
        for (int k = 0; k < n_batches; k++)
            seen[batches[k]] = true;
        int want = 0;
        for (int b = 1; b <= 8; b++)
            want += b <= ready || seen[b];
        cr_assert_eq(made, want, "%s: %d sizes ready after the runs, not %d", name, made, want);
    } else if (n_plans == 0) {
        /* every size made, then those past 2 given back (a profile that
         * reached 2): sizes 1 and 2 stay, the first of the large batches'
         * plan too, and a size given back is made again at its run */
        int keep = p->small != NULL && p->min_batch > 2 ? 3 : 2;
        wk_plan_keep_sizes(p, 2);
        cr_assert_eq(wk_plan_sizes_ready(p), keep, "%s: %d sizes after keeping 2", name,
                     wk_plan_sizes_ready(p));
        for (int k = 0; k < n_batches; k++) {
            int batch = batches[k];
            const ref_t *r = batch == 1 ? &one : &eight;
            float *got = malloc((size_t)(batch * per) * sizeof(float));
            float *in = malloc((size_t)batch * item * sizeof(float));
            memcpy(in, r->in, (size_t)batch * item * sizeof(float));
            cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, (float *[]){got}), 0, "%s",
                         wk_plan_errmsg(p));
            double max_ref = 0;
            for (int64_t i = 0; i < batch * per; i++)
                max_ref = fabs(r->out[i]) > max_ref ? fabs(r->out[i]) : max_ref;
            for (int64_t i = 0; i < batch * per; i++)
                cr_assert(fabs(got[i] - r->out[i]) <= 1e-4 * max_ref,
                          "%s batch %d made again: element %lld", name, batch, (long long)i);
            free(in);
            free(got);
        }
    }
    /* A reference whose images all give the same answer (a randomly
     * initialized net whose activations vanish) makes the comparison
     * vacuous: say so rather than pass. */
    double spread = 0, max_ref = 0;
    for (int64_t i = 0; i < per; i++) {
        double d = fabs(eight.out[i] - eight.out[7 * per + i]);
        spread = d > spread ? d : spread;
        max_ref = fabs(eight.out[i]) > max_ref ? fabs(eight.out[i]) : max_ref;
    }
    bool vacuous = spread <= 1e-3 * max_ref;
    free(one.in);
    free(one.out);
    free(eight.in);
    free(eight.out);
    wk_plan_free(p);
    if (vacuous)
        cr_skip_test("%s: torch's outputs hardly depend on the input (max spread between images "
                     "below 1e-3 of the logits), so agreeing with them proves little; export "
                     "with calibrated BatchNorm statistics",
                     name);
}

static void check_model_at(const char *name, const int *batches, int n_batches, int n_plans)
{
    check_model_ready(name, batches, n_batches, n_plans, 0);
}

/* At batch 1 and at batch 8 (eight distinct images). */
static void check_model(const char *name)
{
    check_model_at(name, (const int[]){1, 8}, 2, 0);
}

/* torch's MultiheadAttention reshapes [tokens, N, C] to [tokens, N * heads,
 * d] and back: the batch merged with the heads, planned for batch sizes 1,
 * 2, 4 and 8 only; 3, 5 and 7 run padded with zeroed images in the plans
 * for 4 and 8, and their own images still match torch. */
Test(models, a_vit_whose_attention_merges_the_batch_runs_every_batch, .timeout = 240)
{
    check_model_at("vit_tiny", (const int[]){1, 3, 8, 5, 7}, 5, 4);
}

/* A plan holds the kernels of the batch sizes it was asked to have ready
 * (a worker: those the model's profile reaches) and makes another size's at
 * its first run: every size's kernels at creation held densenet121's 16
 * sizes in 19 MB each of JIT code. Sizes made late compute what torch
 * does, through concats (googlenet), the fused depthwise convs and the
 * plan of their own small batches have (mobilenet_v2). */
Test(models, a_plan_makes_the_sizes_past_its_ready_ones_at_their_first_run, .timeout = 240)
{
    check_model_ready("googlenet", (const int[]){1, 8, 5, 8}, 4, 0, 1);
    check_model_ready("mobilenet_v2", (const int[]){8, 1, 3}, 3, 0, 1);
    check_model_ready("resnet18", (const int[]){2, 8}, 2, 0, 2);
}

Test(models, resnet18, .timeout = 120)
{
    check_model("resnet18");
}

Test(models, mobilenet_v2, .timeout = 120)
{
    check_model("mobilenet_v2");
}

/* Every depthwise conv that oneDNN can fuse into the 1x1 before it,
 * fused whatever its size or time (on its own the worker fuses only big
 * ones that time faster): batch 8 runs them fused, batch 1 in its plan
 * without them, and both match torch. */
Test(models, mobilenet_v2_with_its_depthwise_convs_fused, .timeout = 120)
{
    setenv("SQUISH_CPU_DW_FUSE_MB", "always", 1);
    check_model("mobilenet_v2");
    unsetenv("SQUISH_CPU_DW_FUSE_MB");
}

Test(models, squeezenet1_1, .timeout = 120)
{
    check_model("squeezenet1_1");
}

Test(models, shufflenet_v2_x1_0, .timeout = 120)
{
    check_model("shufflenet_v2_x1_0");
}

Test(models, googlenet, .timeout = 120)
{
    check_model("googlenet");
}

/* ---- plans sharing one arena ---------------------------------------------- */

static wk_plan_t *plan_export(const char *name, int max_batch)
{
    mdb_graph_t *g = test_import(name);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = max_batch;
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "plan %s: %s", name, why);
    mdb_graph_free(g);
    return p;
}

/* Runs the first `batch` images of torch's reference (batch 1's, or the
 * first of batch 8's) and compares each image's logits at 1e-4 of the
 * largest. */
static void run_matches_torch(wk_plan_t *p, const char *name, const ref_t *one, const ref_t *eight,
                              int batch)
{
    const ref_t *r = batch == 1 ? one : eight;
    size_t item = (size_t)3 * 224 * 224;
    float *in = malloc((size_t)batch * item * sizeof(float));
    memcpy(in, r->in, (size_t)batch * item * sizeof(float));
    float *got = malloc((size_t)batch * 1000 * sizeof(float));
    cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, (float *[]){got}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int b = 0; b < batch; b++) {
        double max_ref = 0, max_diff = 0;
        for (int i = 0; i < 1000; i++) {
            double ref = r->out[b * 1000 + i], d = fabs(got[b * 1000 + i] - ref);
            max_ref = fabs(ref) > max_ref ? fabs(ref) : max_ref;
            max_diff = d > max_diff ? d : max_diff;
        }
        cr_assert(max_diff <= 1e-4 * max_ref, "%s batch %d image %d: max |diff| %.3g of %.3g", name,
                  batch, b, max_diff, max_ref);
    }
    free(in);
    free(got);
}

/* Two models in one arena, their batches alternating (each run overwrites
 * the other's activations): every output still torch's, and the arena is
 * the larger plan's, not the sum of both. */
Test(models, two_models_sharing_one_arena_alternate_batches_and_still_match_torch, .timeout = 300)
{
    const char *names[2] = {"resnet18", "mobilenet_v2"};
    wk_plan_t *p[2];
    ref_t one[2], eight[2];
    wk_arena_t *a = wk_arena_new();
    char why[256];
    for (int k = 0; k < 2; k++) {
        p[k] = plan_export(names[k], 8);
        one[k] = load_ref(names[k], 1, 1000);
        eight[k] = load_ref(names[k], 8, 1000);
        /* a run in its own arena first: joining moves what was made */
        run_matches_torch(p[k], names[k], &one[k], &eight[k], 8);
        cr_assert_eq(wk_plan_share_arena(p[k], a, why, sizeof(why)), 0, "%s", why);
    }
    const int batches[] = {1, 8, 3, 8, 1, 5};
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 2; k++)
            run_matches_torch(p[k], names[k], &one[k], &eight[k], batches[(i + k) % 6]);
    /* resnet18's arena at batch 8 is the larger: mobilenet_v2 added nothing */
    wk_arena_t *alone = wk_arena_new();
    wk_plan_t *r = plan_export("resnet18", 8);
    cr_assert_eq(wk_plan_share_arena(r, alone, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(wk_arena_bytes(a), wk_arena_bytes(alone));
    cr_assert_leq(wk_arena_resident_bytes(a), wk_arena_bytes(a));
    cr_assert_gt(wk_arena_resident_bytes(a), 0);
    wk_plan_free(r);
    wk_arena_free(alone);
    /* the one left runs on after the other leaves */
    wk_plan_free(p[0]);
    run_matches_torch(p[1], names[1], &one[1], &eight[1], 8);
    cr_assert_eq(wk_arena_n_plans(a), p[1]->small != NULL ? 2 : 1);
    wk_plan_free(p[1]);
    wk_arena_free(a);
    for (int k = 0; k < 2; k++) {
        free(one[k].in), free(one[k].out);
        free(eight[k].in), free(eight[k].out);
    }
}

/* A plan for max batch 32 holds of its arena what its runs touch: after
 * batch 1 much less than after batch 32 (the memory it reports is
 * measured, not the arena planned at max batch). */
Test(models, a_plan_holds_the_arena_its_batches_touch, .timeout = 300)
{
    wk_plan_t *p = plan_export("resnet18", 32);
    ref_t one = load_ref("resnet18", 1, 1000);
    ref_t eight = load_ref("resnet18", 8, 1000);
    uint64_t weights = wk_plan_memory_bytes(p);
    run_matches_torch(p, "resnet18", &one, &eight, 1);
    uint64_t at1 = wk_plan_memory_bytes(p) - weights;
    size_t item = (size_t)3 * 224 * 224;
    float *in = calloc((size_t)32 * item, sizeof(float));
    float *out = malloc((size_t)32 * 1000 * sizeof(float));
    cr_assert_eq(wk_plan_run(p, 32, (const float *[]){in}, (float *[]){out}), 0);
    uint64_t at32 = wk_plan_memory_bytes(p) - weights;
    /* resnet18's activations at batch 32 take ~200 MB */
    cr_assert_gt(at32, (uint64_t)100 << 20, "%llu", (unsigned long long)at32);
    cr_assert_lt(at1 * 4, at32, "batch 1: %llu bytes, batch 32: %llu", (unsigned long long)at1,
                 (unsigned long long)at32);
    free(in);
    free(out);
    free(one.in), free(one.out), free(eight.in), free(eight.out);
    wk_plan_free(p);
}

/* A model that ran batch 2 beside one that ran batch 8 in the same arena
 * reports what its own batch 2 uses, not the pages the other touched. */
Test(models, a_plan_in_a_shared_arena_reports_the_pages_its_own_runs_use, .timeout = 300)
{
    wk_plan_t *big = plan_export("resnet18", 8), *small = plan_export("mobilenet_v2", 8);
    ref_t one = load_ref("mobilenet_v2", 1, 1000);
    ref_t eight = load_ref("mobilenet_v2", 8, 1000);
    run_matches_torch(small, "mobilenet_v2", &one, &eight, 2);
    uint64_t alone = wk_plan_memory_bytes(small);
    wk_arena_t *a = wk_arena_new();
    char why[256];
    cr_assert_eq(wk_plan_share_arena(big, a, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(wk_plan_share_arena(small, a, why, sizeof(why)), 0, "%s", why);
    size_t item = (size_t)3 * 224 * 224;
    float *in = calloc(8 * item, sizeof(float)), *out = malloc(8 * 1000 * sizeof(float));
    cr_assert_eq(wk_plan_run(big, 8, (const float *[]){in}, (float *[]){out}), 0);
    run_matches_torch(small, "mobilenet_v2", &one, &eight, 2);
    uint64_t shared = wk_plan_memory_bytes(small);
    /* its spans at batch 2, resident in both cases; resnet18's batch 8
     * touched the whole of mobilenet_v2's extent besides */
    cr_assert_leq(shared, alone + (1 << 20), "alone %llu bytes, shared %llu",
                  (unsigned long long)alone, (unsigned long long)shared);
    cr_assert_gt(shared, alone / 2);
    free(in), free(out);
    free(one.in), free(one.out), free(eight.in), free(eight.out);
    wk_plan_free(big);
    wk_plan_free(small);
    wk_arena_free(a);
}

/* Bytes malloc has handed out and not had back (the heap's and mmap's). */
static double malloc_in_use_mb(void)
{
    struct mallinfo2 mi = mallinfo2();
    return (double)(mi.uordblks + mi.hblkhd) / (1 << 20);
}

/* The kernels of the sizes a plan gives back, and of a plan freed, leave
 * the process: oneDNN's primitive cache, which outlives the primitives,
 * keeps none of them (it had kept about 9 of the 10 MB that googlenet's
 * sizes 2..8 took after they were given back, and 13 MB of the plan after
 * it was freed). */
Test(models, the_kernels_a_plan_gives_back_leave_the_process, .timeout = 240)
{
    mdb_graph_t *g = test_import("googlenet");
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 8;
    o.ready_batch = 1;
    size_t item = (size_t)3 * 224 * 224;
    float *in = calloc(8 * item, sizeof(float)), *out = malloc(8 * 1000 * sizeof(float));
    double before = malloc_in_use_mb();
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(wk_plan_run(p, 1, (const float *[]){in}, (float *[]){out}), 0);
    double one = malloc_in_use_mb() - before;
    for (int b = 2; b <= 8; b++)
        cr_assert_eq(wk_plan_run(p, b, (const float *[]){in}, (float *[]){out}), 0);
    double every = malloc_in_use_mb() - before;
    wk_plan_keep_sizes(p, 1);
    double kept = malloc_in_use_mb() - before;
    /* and size 8 made again runs */
    cr_assert_eq(wk_plan_run(p, 8, (const float *[]){in}, (float *[]){out}), 0);
    wk_plan_free(p);
    double after = malloc_in_use_mb() - before;
    /* (AddressSanitizer's allocator is not glibc's: mallinfo2 does not
     * see it) */
#ifndef __SANITIZE_ADDRESS__
    /* sizes 2..8 made their own kernels: several MB */
    cr_assert_gt(every - one, 4.0, "size 1: %.1f MB, every size: %.1f MB", one, every);
    cr_assert_lt(kept - one, 0.2 * (every - one),
                 "size 1: %.1f MB, every size: %.1f MB, size 1 kept: %.1f MB", one, every, kept);
    cr_assert_lt(after, 0.1 * one, "the plan held %.1f MB, freed %.1f MB stay", one, after);
#else
    (void)one, (void)kept, (void)every, (void)after;
#endif
    mdb_graph_free(g);
    free(in);
    free(out);
}
