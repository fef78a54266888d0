/* A YOLO-style detector written in torch from the public architecture
 * (scripts/export_models.py's YoloTiny: C2f blocks, SPPF, nearest 2x
 * upsampling, a decoupled head; one output [N, 4 + 3, 84] as YOLOv8's),
 * exported with Debian's torch at opset 17 into $SQUISH_TEST_MODELS:
 * imported as an upload is, planned for batches up to 2 and run at 1 and
 * 2, its boxes (input pixels) and class scores within 1e-4 of torch's,
 * and no step on oneDNN's reference kernels: the bottlenecks' conv, SiLU,
 * + x (an add after the activation, which oneDNN's jit convs do not take
 * as a post-op) ran there, 10x slower, and so did the concats after them.
 * integration/test_vision_v1 serves it on /v1 and in a pipeline.
 *
 * torchvision's SSDlite320 (MobileNetV3-Large) and a RetinaNet (ResNet-18
 * FPN), exported up to their boxes and scores (TorchvisionDetector: the
 * anchors decoded in the graph, the data-dependent postprocessing left to
 * crops_of): both outputs within 1e-4 of torch's at batch 1 and 2. */
#include "test_files.h"

#include <backend_cpu_int.h>

#include <criterion/criterion.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Output k of a batch against torch's: max |diff| within 1e-4 of the
 * largest |torch| (at least 1). */
static void expect_close(const char *what, const float *got, const float *want, int64_t n)
{
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < n; i++) {
        max_ref = fmax(max_ref, fabs(want[i]));
        max_diff = fmax(max_diff, fabs(got[i] - want[i]));
    }
    cr_assert(max_ref > 0, "torch's %s are all zeros", what);
    cr_assert(max_diff <= 1e-4 * fmax(1.0, max_ref), "%s: max |diff| %.3g vs max |torch| %.3g",
              what, max_diff, max_ref);
}

/* cuda_lacks: what the cuda backend is refused for (NULL: it runs there). */
static void torchvision_detector_matches_torch(const char *name, int64_t hw, int64_t anchors,
                                               int64_t classes, const char *cuda_lacks)
{
    const int64_t item = 3 * hw * hw, nbox = anchors * 4, nscore = anchors * classes;
    mdb_graph_t *g = test_import(name);
    mdb_model_info_t info;
    char why[512];
    cr_assert_eq(mdb_model_info(g, &info, why, sizeof(why)), 0, "%s", why);
    cr_assert(info.runs_on[SQ_DEV_CPU], "cpu: %s", info.not_on[SQ_DEV_CPU]);
    if (cuda_lacks == NULL)
        cr_assert(info.runs_on[SQ_DEV_CUDA], "cuda: %s", info.not_on[SQ_DEV_CUDA]);
    else
        cr_assert(!info.runs_on[SQ_DEV_CUDA] && strstr(info.not_on[SQ_DEV_CUDA], cuda_lacks),
                  "cuda: %s", info.not_on[SQ_DEV_CUDA]);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "plan: %s", why);
    mdb_graph_free(g);
    cr_assert_eq(wk_plan_output_elems(p, 0), nbox);
    cr_assert_eq(wk_plan_output_elems(p, 1), nscore);
    const cpu_be_t *be = p->be;
    cr_assert_eq(be->n_ref_kernels, 0, "%s: %d steps run oneDNN's reference kernels", name,
                 be->n_ref_kernels);
    for (int batch = 1; batch <= 2; batch++) {
        float *in, *want_boxes;
        test_load_refs(name, batch, item, nbox, &in, &want_boxes);
        float *want_scores = test_load_output(name, batch, 1, nscore);
        float *boxes = malloc((size_t)(batch * nbox) * sizeof(float));
        float *scores = malloc((size_t)(batch * nscore) * sizeof(float));
        cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, (float *[]){boxes, scores}), 0,
                     "%s", wk_plan_errmsg(p));
        for (int b = 0; b < batch; b++) {
            char what[64];
            snprintf(what, sizeof(what), "%s batch %d image %d boxes", name, batch, b);
            expect_close(what, boxes + b * nbox, want_boxes + b * nbox, nbox);
            snprintf(what, sizeof(what), "%s batch %d image %d scores", name, batch, b);
            expect_close(what, scores + b * nscore, want_scores + b * nscore, nscore);
        }
        free(in);
        free(want_boxes);
        free(want_scores);
        free(boxes);
        free(scores);
    }
    wk_plan_free(p);
}

Test(detectors, torchvision_ssdlite_matches_torch, .timeout = 120)
{
    /* its extra blocks' stride-2 convs on 2x2 maps ran on cuda only once
     * conv_trim kept their pads symmetric */
    torchvision_detector_matches_torch("ssdlite", 320, 3234, 91, NULL);
}

Test(detectors, torchvision_retinanet_matches_torch, .timeout = 120)
{
    torchvision_detector_matches_torch("retinanet_tiny", 128, 3069, 5, NULL);
}
