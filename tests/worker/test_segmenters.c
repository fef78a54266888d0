/* torchvision's segmenters, exported with Debian's torch by
 * scripts/export_models.py into $SQUISH_TEST_MODELS (3x160x160, opset 17, a
 * dynamic batch, the one output [N, 21, 160, 160] class scores): imported
 * as an upload is (on the cpu and cuda kinds both: their bilinear
 * upsampling runs on the cuda backend's k_resize too), planned on the cpu
 * backend for max batch 2, run
 * at batch 1 and 2 and compared with torch's outputs within 1e-4 of their
 * largest magnitude. */
#include "test_files.h"

#include <criterion/criterion.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec.h>

#define CLASSES 21
#define HW 160

static void check_segmenter(const char *name)
{
    char file[256];
    mdb_graph_t *g = test_import(name);

    mdb_model_info_t info;
    char why[512];
    cr_assert_eq(mdb_model_info(g, &info, why, sizeof(why)), 0, "%s: %s", name, why);
    cr_assert_eq(info.n_outputs, 1);
    int64_t out_dims[] = {MDB_DIM_BATCH, CLASSES, HW, HW};
    cr_assert_eq(info.output_shapes[0].rank, 4);
    for (int d = 0; d < 4; d++)
        cr_assert_eq(info.output_shapes[0].dims[d], out_dims[d], "output axis %d", d);
    cr_assert(info.runs_on[SQ_DEV_CPU], "%s: cpu: %s", name, info.not_on[SQ_DEV_CPU]);
    cr_assert(info.runs_on[SQ_DEV_CUDA], "%s: cuda: %s", name, info.not_on[SQ_DEV_CUDA]);

    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "plan %s: %s", name, why);
    mdb_graph_free(g);
    int64_t per = wk_plan_output_elems(p, 0);
    cr_assert_eq(per, (int64_t)CLASSES * HW * HW);
    for (int batch = 1; batch <= 2; batch++) {
        size_t in_len, out_len;
        snprintf(file, sizeof(file), "%s.b%d.input.f32", name, batch);
        float *in = test_slurp(file, &in_len);
        snprintf(file, sizeof(file), "%s.b%d.output.f32", name, batch);
        float *want = test_slurp(file, &out_len);
        cr_assert_eq(in_len, (size_t)batch * 3 * HW * HW * sizeof(float));
        cr_assert_eq(out_len, (size_t)(batch * per) * sizeof(float));
        float *got = malloc(out_len);
        cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, (float *[]){got}), 0, "%s",
                     wk_plan_errmsg(p));
        for (int b = 0; b < batch; b++) {
            double max_ref = 0, max_diff = 0;
            for (int64_t i = 0; i < per; i++) {
                double r = want[b * per + i], d = fabs(got[b * per + i] - r);
                max_ref = fabs(r) > max_ref ? fabs(r) : max_ref;
                max_diff = d > max_diff ? d : max_diff;
            }
            cr_assert(max_ref > 0, "%s: torch's output is all zeros", name);
            cr_assert(max_diff <= 1e-4 * max_ref,
                      "%s batch %d image %d: max |diff| %.3g vs max |ref| %.3g (%.2g relative)",
                      name, batch, b, max_diff, max_ref, max_diff / max_ref);
        }
        if (batch == 2) {
            /* Two images whose class maps are the same would make the
             * comparison say little about the input's way through. */
            double spread = 0;
            for (int64_t i = 0; i < per; i++)
                spread = fmax(spread, fabs(want[i] - want[per + i]));
            cr_assert(spread > 1e-3, "%s: torch's class scores hardly depend on the image", name);
        }
        free(in);
        free(want);
        free(got);
    }
    wk_plan_free(p);
}

/* LR-ASPP: a sigmoid gate from a global pool, two bilinear resizes to
 * sizes sliced from Shape (torch's F.interpolate(size=)). */
Test(segmenters, lraspp_mobilenet_v3_large_matches_torch, .timeout = 300)
{
    check_segmenter("lraspp_mobilenet_v3_large");
}

/* DeepLabV3: the atrous pyramid (its dilated convs trimmed to 1x1 at this
 * size), a pooled branch resized from 1x1, a five-way concat. */
Test(segmenters, deeplabv3_mobilenet_v3_large_matches_torch, .timeout = 300)
{
    check_segmenter("deeplabv3_mobilenet_v3_large");
}
