/* A YOLO-style detector written in torch from the public architecture
 * (scripts/export_models.py's YoloTiny: C2f blocks, SPPF, nearest 2x
 * upsampling, a decoupled head; one output [N, 4 + 3, 84] as YOLOv8's),
 * exported with Debian's torch at opset 17 into $SQUISH_TEST_MODELS:
 * imported as an upload is, planned for batches up to 2 and run at 1 and
 * 2, its boxes (input pixels) and class scores within 1e-4 of torch's,
 * and no step on oneDNN's reference kernels: the bottlenecks' conv, SiLU,
 * + x (an add after the activation, which oneDNN's jit convs do not take
 * as a post-op) ran there, 10x slower, and so did the concats after them.
 * integration/test_vision_v1 serves it on /v1 and in a pipeline. */
#include "test_files.h"

#include <backend_cpu_int.h>

#include <criterion/criterion.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <wk_exec.h>

Test(detectors, a_yolo_style_detector_from_torch_matches_torch, .timeout = 120)
{
    const char *name = "yolo_tiny";
    const int64_t per = (4 + 3) * (8 * 8 + 4 * 4 + 2 * 2), item = 3 * 64 * 64;
    mdb_graph_t *g = test_import(name);
    mdb_model_info_t info;
    char why[512];
    cr_assert_eq(mdb_model_info(g, &info, why, sizeof(why)), 0, "%s", why);
    cr_assert(info.runs_on[SQ_DEV_CPU], "cpu: %s", info.not_on[SQ_DEV_CPU]);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "plan: %s", why);
    mdb_graph_free(g);
    cr_assert_eq(wk_plan_output_elems(p, 0), per);
    const cpu_be_t *be = p->be;
    cr_assert_eq(be->n_ref_kernels, 0, "%d steps run oneDNN's reference kernels",
                 be->n_ref_kernels);
    for (int batch = 1; batch <= 2; batch++) {
        float *in, *want;
        test_load_refs(name, batch, item, per, &in, &want);
        float *got = malloc((size_t)(batch * per) * sizeof(float));
        cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, (float *[]){got}), 0, "%s",
                     wk_plan_errmsg(p));
        for (int b = 0; b < batch; b++) {
            /* boxes (rows 0-3, pixels) and scores (rows 4-6, 0 to 1) apart:
             * one bound for both would let the scores be off by 6e-3 */
            for (int part = 0; part < 2; part++) {
                double max_ref = 0, max_diff = 0;
                for (int64_t r = part == 0 ? 0 : 4; r < (part == 0 ? 4 : 7); r++)
                    for (int64_t a = 0; a < 84; a++) {
                        int64_t i = b * per + r * 84 + a;
                        max_ref = fmax(max_ref, fabs(want[i]));
                        max_diff = fmax(max_diff, fabs(got[i] - want[i]));
                    }
                cr_assert(max_ref > 0, "torch's %s are all zeros", part ? "scores" : "boxes");
                cr_assert(max_diff <= 1e-4 * fmax(1.0, max_ref),
                          "batch %d image %d %s: max |diff| %.3g vs max |torch| %.3g", batch, b,
                          part ? "scores" : "boxes", max_diff, max_ref);
            }
        }
        free(in);
        free(want);
        free(got);
    }
    wk_plan_free(p);
}
