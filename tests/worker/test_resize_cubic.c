/* Bicubic Resize on the cpu backend (worker/backend_cpu_ckern.c):
 *
 * - against a reference written here from ONNX's specification, in double
 *   and the way ONNX's numpy reference picks its taps (the four nearest
 *   pixels of the edge-padded axis, the fraction 1 on a whole coordinate),
 *   not the kernel's floor-based way: every coordinate transform, up and
 *   down, by scales and to sizes, cubic_coeff_a -0.75 (torch) and -0.5
 *   (TensorFlow), exclude_outside 0 and 1; within 1e-5;
 * - end to end: torch's nn.Upsample(mode="bicubic") and F.interpolate's
 *   bicubic, exported with Debian's torch at opset 17 by
 *   scripts/export_models.py (upsample_bicubic, in $SQUISH_TEST_MODELS),
 *   imported as an upload is (on the cpu and cuda kinds both), run at batch
 *   1 and 2 and within 1e-4 of torch's outputs. */
#include "../modeldb/onnx_util.h"
#include "test_files.h"

#include <criterion/criterion.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec.h>

#define C 2
#define IH 5
#define IW 7

typedef enum { HALF_PIXEL, PYTORCH_HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC } coord_t;
static const char *const coord_names[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                          "asymmetric"};

typedef struct {
    coord_t coord;
    double a;
    int exclude_outside;
} cubic_t;

/* ONNX's cubic coefficients at the fraction r of the left tap (its
 * reference: r in (0, 1], taps at -1-r .. 2-r). */
static void ref_coeffs(double r, double a, double w[4])
{
    w[0] = ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a;
    w[1] = ((a + 2) * r - (a + 3)) * r * r + 1;
    w[2] = ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1;
    w[3] = ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a;
}

/* Output pixel o's coordinate in the input, per the specification (the
 * scale as the transform divides by it; align_corners over the lengths). */
static double ref_coord(coord_t coord, int64_t o, int64_t in, int64_t out, double scale)
{
    switch (coord) {
    case HALF_PIXEL:
        return (o + 0.5) / scale - 0.5;
    case PYTORCH_HALF_PIXEL:
        return out > 1 ? (o + 0.5) / scale - 0.5 : 0;
    case ALIGN_CORNERS:
        return out == 1 ? 0 : (double)o * (double)(in - 1) / (double)(out - 1);
    case ASYMMETRIC:
    default:
        return o / scale;
    }
}

/* One axis: the input positions and weights of output pixel o, as ONNX's
 * numpy reference interpolate_1d_with_x chooses them: the 4 positions of
 * the axis padded by 2 at each end (edge values) nearest to x, the closer
 * and then the lower first, taken in order. */
static void ref_taps(const cubic_t *k, int64_t o, int64_t in, int64_t out, double scale,
                     int64_t idx[4], double w[4])
{
    double x = ref_coord(k->coord, o, in, out, scale);
    double r = x == floor(x) ? 1.0 : x - floor(x);
    ref_coeffs(r, k->a, w);
    /* positions -2 .. in + 1 of the padded axis, ranked by distance */
    int64_t n = in + 4;
    bool used[64] = {false};
    cr_assert_lt(n, 64);
    for (int t = 0; t < 4; t++) {
        int64_t best = -1;
        for (int64_t p = 0; p < n; p++)
            if (!used[p] && (best < 0 || fabs(x - (double)(p - 2)) < fabs(x - (double)(best - 2))))
                best = p;
        used[best] = true;
    }
    for (int t = 0, m = 0; t < n && m < 4; t++)
        if (used[t])
            idx[m++] = t - 2;
    double sum = 0;
    for (int t = 0; t < 4; t++) {
        if (k->exclude_outside && (idx[t] < 0 || idx[t] >= in))
            w[t] = 0;
        sum += w[t];
    }
    for (int t = 0; t < 4 && k->exclude_outside; t++)
        w[t] /= sum;
}

/* The reference resize of x [1, C, IH, IW] to y [1, C, oh, ow]. */
static void ref_resize(const cubic_t *k, const float *x, int64_t oh, int64_t ow, double sh,
                       double sw, double *y)
{
    for (int c = 0; c < C; c++)
        for (int64_t oy = 0; oy < oh; oy++) {
            int64_t ys[4];
            double wy[4];
            ref_taps(k, oy, IH, oh, sh, ys, wy);
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t xs[4];
                double wx[4], acc = 0;
                ref_taps(k, ox, IW, ow, sw, xs, wx);
                for (int i = 0; i < 4; i++) {
                    int64_t yy = ys[i] < 0 ? 0 : ys[i] >= IH ? IH - 1 : ys[i];
                    for (int j = 0; j < 4; j++) {
                        int64_t xx = xs[j] < 0 ? 0 : xs[j] >= IW ? IW - 1 : xs[j];
                        acc += wy[i] * wx[j] * x[(c * IH + yy) * IW + xx];
                    }
                }
                y[(c * oh + oy) * ow + ox] = acc;
            }
        }
}

static void attr_float(mb_t *b, Onnx__NodeProto *n, const char *name, float v)
{
    Onnx__AttributeProto *a = mb_alloc(b, sizeof(*a));
    onnx__attribute_proto__init(a);
    a->name = mb_str(b, name);
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    a->has_f = 1;
    a->f = v;
    n->attribute[n->n_attribute++] = a;
}

static void attr_string(mb_t *b, Onnx__NodeProto *n, const char *name, const char *v)
{
    Onnx__AttributeProto *a = mb_alloc(b, sizeof(*a));
    onnx__attribute_proto__init(a);
    a->name = mb_str(b, name);
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    a->has_s = 1;
    a->s.data = (uint8_t *)mb_str(b, v);
    a->s.len = strlen(v);
    n->attribute[n->n_attribute++] = a;
}

/* x[1, C, IH, IW] -> Resize(cubic, k) by scales (sh, sw), or to sizes
 * (oh, ow) where sh is 0, run on the cpu backend at batch 1 and compared
 * with the reference. */
static void check(const cubic_t *k, float sh, float sw, int64_t oh, int64_t ow)
{
    mb_t b;
    mb_init(&b, 13);
    mb_input(&b, "x", 4, (const int64_t[]){1, C, IH, IW}); /* sizes fix the batch */
    const char *ins[] = {"x", "", sh > 0 ? "scales" : "", sh > 0 ? NULL : "sizes", NULL};
    if (sh > 0) {
        Onnx__TensorProto *t = mb_init_f(&b, "scales", 1, (const int64_t[]){4}, 1, 0);
        ((float *)t->raw_data.data)[2] = sh;
        ((float *)t->raw_data.data)[3] = sw;
        oh = (int64_t)floor(IH * (double)sh);
        ow = (int64_t)floor(IW * (double)sw);
    } else {
        mb_init_i64(&b, "sizes", 4, (const int64_t[]){1, C, oh, ow});
    }
    Onnx__NodeProto *n = mb_node(&b, "Resize", ins, (const char *[]){"y", NULL});
    attr_string(&b, n, "mode", "cubic");
    attr_string(&b, n, "coordinate_transformation_mode", coord_names[k->coord]);
    attr_float(&b, n, "cubic_coeff_a", (float)k->a);
    mb_attr_int(&b, n, "exclude_outside", k->exclude_outside);
    mb_output(&b, "y");
    size_t len;
    uint8_t *bytes = mb_pack(&b, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s %s", err.ops, err.detail);
    free(bytes);
    mb_free(&b);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 1;
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    mdb_graph_free(g);
    cr_assert_eq(wk_plan_output_elems(p, 0), C * oh * ow);

    float x[C * IH * IW];
    for (int i = 0; i < C * IH * IW; i++) /* not smooth: the taps' weights all show */
        x[i] = (float)((i * 37 % 23) - 11) / 7.0f + (float)(i % IW) * 0.25f;
    float *got = malloc((size_t)(C * oh * ow) * sizeof(float));
    double *want = malloc((size_t)(C * oh * ow) * sizeof(double));
    cr_assert_eq(wk_plan_run(p, 1, (const float *[]){x}, (float *[]){got}), 0, "%s",
                 wk_plan_errmsg(p));
    /* The transform divides by the given scales, or by sizes / input. */
    double dh = sh > 0 ? sh : (double)(float)((float)oh / (float)IH);
    double dw = sh > 0 ? sw : (double)(float)((float)ow / (float)IW);
    ref_resize(k, x, oh, ow, dh, dw, want);
    double max_diff = 0;
    for (int64_t i = 0; i < C * oh * ow; i++)
        max_diff = fmax(max_diff, fabs(got[i] - want[i]));
    cr_assert(max_diff <= 1e-5,
              "%s a %g exclude_outside %d, %dx%d -> %lldx%lld: max |worker - reference| %.3g",
              coord_names[k->coord], k->a, k->exclude_outside, IH, IW, (long long)oh, (long long)ow,
              max_diff);
    free(got);
    free(want);
    wk_plan_free(p);
}

/* Every transform x cubic_coeff_a x exclude_outside, up and down, by
 * scales (whole and fractional factors) and to sizes (one of them a
 * single pixel). */
Test(resize_cubic, matches_onnx_reference_in_every_mode)
{
    const double as[] = {-0.75, -0.5};
    int cases = 0;
    for (int coord = 0; coord < 4; coord++)
        for (int ai = 0; ai < 2; ai++)
            for (int ex = 0; ex < 2; ex++) {
                cubic_t k = {(coord_t)coord, as[ai], ex};
                check(&k, 2.0f, 2.0f, 0, 0); /* up, whole */
                check(&k, 1.6f, 1.3f, 0, 0); /* up, fractional */
                check(&k, 0.5f, 0.5f, 0, 0); /* down, by 2 */
                check(&k, 0.8f, 0.6f, 0, 0); /* down, fractional */
                check(&k, 0, 0, 11, 4);      /* sizes: up H, down W */
                check(&k, 0, 0, 1, 9);       /* sizes: a row of one pixel */
                cases += 6;
            }
    cr_assert_eq(cases, 96);
}

/* The reference itself: a=-0.75 at fraction 0.5 gives Keys' weights, and
 * a whole coordinate takes its own pixel. */
Test(resize_cubic, the_reference_weights_are_keys)
{
    double w[4];
    ref_coeffs(0.5, -0.75, w);
    cr_assert_float_eq(w[0], -0.09375, 1e-12);
    cr_assert_float_eq(w[1], 0.59375, 1e-12);
    cr_assert_float_eq(w[2], 0.59375, 1e-12);
    cr_assert_float_eq(w[3], -0.09375, 1e-12);
    cubic_t k = {ASYMMETRIC, -0.5, 0};
    int64_t idx[4];
    ref_taps(&k, 2, IW, IW, 1.0, idx, w);
    for (int t = 0; t < 4; t++)
        cr_assert_float_eq(w[t], idx[t] == 2 ? 1.0 : 0.0, 1e-12, "tap %lld", (long long)idx[t]);
}

/* torch's bicubic resizes (2x by scales, to 20x24 with align_corners, 0.5x
 * by F.interpolate) of a conv's 4 maps of 16x16, flattened into one
 * output, against torch at batch 1 and 2. */
Test(resize_cubic, torch_upsample_bicubic_export_matches_torch, .timeout = 120)
{
    const char *name = "upsample_bicubic";
    const int64_t per = 4 * (32 * 32 + 20 * 24 + 8 * 8), item = 3 * 16 * 16;
    mdb_graph_t *g = test_import(name);
    mdb_model_info_t info;
    char why[512];
    cr_assert_eq(mdb_model_info(g, &info, why, sizeof(why)), 0, "%s", why);
    cr_assert(info.runs_on[SQ_DEV_CPU], "cpu: %s", info.not_on[SQ_DEV_CPU]);
    cr_assert(info.runs_on[SQ_DEV_CUDA], "cuda: %s", info.not_on[SQ_DEV_CUDA]);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "plan: %s", why);
    mdb_graph_free(g);
    cr_assert_eq(wk_plan_output_elems(p, 0), per);
    for (int batch = 1; batch <= 2; batch++) {
        float *in, *want;
        test_load_refs(name, batch, item, per, &in, &want);
        float *got = malloc((size_t)(batch * per) * sizeof(float));
        cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, (float *[]){got}), 0, "%s",
                     wk_plan_errmsg(p));
        for (int b = 0; b < batch; b++) {
            double max_ref = 0, max_diff = 0;
            for (int64_t i = 0; i < per; i++) {
                double r = want[b * per + i], d = fabs(got[b * per + i] - r);
                max_ref = fmax(max_ref, fabs(r));
                max_diff = fmax(max_diff, d);
            }
            cr_assert(max_ref > 0, "torch's output is all zeros");
            cr_assert(max_diff <= 1e-4 * fmax(1.0, max_ref),
                      "batch %d image %d: max |diff| %.3g vs max |torch| %.3g", batch, b, max_diff,
                      max_ref);
            cr_log_info("batch %d image %d: max |worker - torch| %.3g (max |torch| %.3g)", batch, b,
                        max_diff, max_ref);
        }
        free(in);
        free(want);
        free(got);
    }
    wk_plan_free(p);
}
