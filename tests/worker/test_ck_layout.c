/* The cuda pointwise kernel's layout logic (worker/ck_layout.c), which
 * runs on the host and so is tested without a GPU: the walk follows the
 * output's memory order (an NHWC output walked in logical NCHW order put
 * neighbouring threads C elements apart, and FP16 plans ran 5x slower on
 * an H100), merging keeps every element's offsets, and the 32-bit index
 * path is taken only where every offset fits. The bytes-to-FP32 kernel's
 * index (ck_u8_src) is checked here too, against each layout written out,
 * and the resize kernel's walk and the transforms it shares with the cpu
 * backend (ck_resize_*). */
#include <ck_types.h>
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* y, x and a broadcast post operand over logical [N, C, H, W]. */
static ck_pointwise_t nchw_op(const int64_t *dims, const int64_t *yst, const int64_t *xst,
                              const int64_t *bst)
{
    ck_pointwise_t p;
    memset(&p, 0, sizeof(p));
    p.ndim = 4;
    for (int d = 0; d < 4; d++) {
        p.dims[d] = dims[d];
        p.y.st[d] = yst[d];
        p.x.st[d] = xst[d];
        p.post[0].t.st[d] = bst[d];
    }
    p.n_post = 2;
    p.post[0].op = CK_OP_ADD;
    p.post[1].op = CK_OP_ACT;
    return p;
}

/* Every element's (y, x, post) offsets, in walk order. */
static int64_t *walk(const ck_pointwise_t *p, int64_t *n_out)
{
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= p->dims[d];
    int64_t *o = calloc((size_t)n * 3, sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        int64_t r = i;
        for (int d = p->ndim - 1; d >= 0; d--) {
            int64_t c = r % p->dims[d];
            r /= p->dims[d];
            o[i * 3] += c * p->y.st[d];
            o[i * 3 + 1] += c * p->x.st[d];
            o[i * 3 + 2] += c * p->post[0].t.st[d];
        }
    }
    *n_out = n;
    return o;
}

static int cmp3(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    for (int k = 0; k < 3; k++)
        if (x[k] != y[k])
            return x[k] < y[k] ? -1 : 1;
    return 0;
}

/* The same elements with the same offsets before and after. */
static void same_elements(ck_pointwise_t before, ck_pointwise_t after)
{
    int64_t n0 = 0, n1 = 0;
    int64_t *a = walk(&before, &n0), *b = walk(&after, &n1);
    cr_assert_eq(n0, n1);
    qsort(a, (size_t)n0, 3 * sizeof(int64_t), cmp3);
    qsort(b, (size_t)n1, 3 * sizeof(int64_t), cmp3);
    cr_assert_eq(memcmp(a, b, (size_t)n0 * 3 * sizeof(int64_t)), 0);
    free(a);
    free(b);
}

Test(ck_layout, an_nhwc_output_is_walked_in_its_memory_order)
{
    /* a conv's epilogue in an FP16 plan: y and the residual NHWC, the bias
     * per channel */
    const int64_t dims[4] = {2, 8, 3, 5}, nhwc[4] = {120, 1, 40, 8}, bias[4] = {0, 1, 0, 0};
    ck_pointwise_t p = nchw_op(dims, nhwc, nhwc, bias), before = p;
    cr_assert(ck_pointwise_prepare(&p, 240));
    /* N, H and W merge into one dim; C, stride 1 in y, is walked fastest */
    cr_assert_eq(p.ndim, 2);
    cr_assert_eq(p.dims[0], 30);
    cr_assert_eq(p.dims[1], 8);
    cr_assert_eq(p.y.st[1], 1);
    cr_assert_eq(p.x.st[1], 1);
    cr_assert_eq(p.post[0].t.st[0], 0);
    cr_assert_eq(p.post[0].t.st[1], 1);
    /* consecutive elements of the walk are consecutive in y */
    int64_t n = 0, *o = walk(&p, &n);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(o[i * 3], i);
    free(o);
    same_elements(before, p);
}

Test(ck_layout, a_plain_elementwise_op_becomes_one_dim)
{
    const int64_t dims[4] = {4, 3, 2, 5}, rm[4] = {30, 10, 5, 1}, zero[4] = {0, 0, 0, 0};
    ck_pointwise_t p = nchw_op(dims, rm, rm, zero), before = p;
    p.n_post = 1; /* the scalar operand only as an act: it reads nothing */
    p.post[0].op = CK_OP_ACT;
    before = p;
    cr_assert(ck_pointwise_prepare(&p, 120));
    cr_assert_eq(p.ndim, 1);
    cr_assert_eq(p.dims[0], 120);
    cr_assert_eq(p.y.st[0], 1);
    same_elements(before, p);
}

Test(ck_layout, a_transpose_writes_in_order_and_keeps_every_offset)
{
    /* NCHW x into an NHWC y (the conversion at a 16-bit plan's edge) and
     * the reverse */
    const int64_t dims[4] = {3, 4, 5, 6}, rm[4] = {120, 30, 6, 1}, nhwc[4] = {120, 1, 24, 4};
    const int64_t zero[4] = {0, 0, 0, 0};
    ck_pointwise_t p = nchw_op(dims, nhwc, rm, zero), before = p;
    ck_pointwise_prepare(&p, 360);
    cr_assert_eq(p.y.st[p.ndim - 1], 1);
    int64_t n = 0, *o = walk(&p, &n);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(o[i * 3], i, "element %lld of the walk", (long long)i);
    free(o);
    same_elements(before, p);

    ck_pointwise_t q = nchw_op(dims, rm, nhwc, zero), qb = q;
    ck_pointwise_prepare(&q, 360);
    cr_assert_eq(q.y.st[q.ndim - 1], 1);
    same_elements(qb, q);
}

Test(ck_layout, random_strides_keep_every_element)
{
    uint64_t s = 11;
    for (int trial = 0; trial < 200; trial++) {
        int64_t dims[4], yst[4], xst[4], bst[4];
        int perm[4] = {0, 1, 2, 3};
        for (int d = 0; d < 4; d++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            dims[d] = 1 + (int64_t)((s >> 33) % 4);
        }
        for (int i = 3; i > 0; i--) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int j = (int)((s >> 33) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        /* y dense in a random dim order, x row-major, b broadcast in some */
        int64_t acc = 1;
        for (int k = 3; k >= 0; k--) {
            yst[perm[k]] = acc;
            acc *= dims[perm[k]];
        }
        acc = 1;
        for (int d = 3; d >= 0; d--) {
            xst[d] = acc;
            acc *= dims[d];
            bst[d] = (trial >> d) & 1 ? xst[d] : 0;
        }
        ck_pointwise_t p = nchw_op(dims, yst, xst, bst), before = p;
        int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
        cr_assert(ck_pointwise_prepare(&p, n));
        same_elements(before, p);
        /* y is walked densely in memory order */
        int64_t m = 0, *o = walk(&p, &m);
        for (int64_t i = 0; i < m; i++)
            cr_assert_eq(o[i * 3], i, "trial %d, element %lld", trial, (long long)i);
        free(o);
    }
}

Test(ck_layout, only_what_fits_in_31_bits_takes_the_32_bit_path)
{
    const int64_t rm[4] = {30, 10, 5, 1}, zero[4] = {0, 0, 0, 0};
    const int64_t small[4] = {4, 3, 2, 5};
    ck_pointwise_t p = nchw_op(small, rm, rm, zero);
    cr_assert(ck_pointwise_prepare(&p, 120));
    /* 2^31 elements: past the grid-stride margin */
    const int64_t big[4] = {1 << 16, 1 << 15, 1, 1}, bigst[4] = {1 << 15, 1, 1, 1};
    p = nchw_op(big, bigst, bigst, zero);
    cr_assert_not(ck_pointwise_prepare(&p, (int64_t)1 << 31));
    /* few elements, but an operand's offsets reach past 2^31 */
    const int64_t few[4] = {2, 2, 1, 1}, far[4] = {(int64_t)1 << 31, 1, 1, 1};
    p = nchw_op(few, rm, far, zero);
    cr_assert_not(ck_pointwise_prepare(&p, 4));
    /* a negative stride: 64-bit */
    const int64_t neg[4] = {-1, 1, 1, 1};
    p = nchw_op(few, rm, neg, zero);
    cr_assert_not(ck_pointwise_prepare(&p, 4));
}

/* ck_u8 as the kernel computes it, on the host. */
static void u8_ref(const ck_u8_t *p, const uint8_t *x, float *y)
{
    for (int64_t i = 0; i < ck_u8_count(p); i++) {
        int c;
        int64_t s = ck_u8_src(p, i, &c);
        y[i] = (float)x[s] * p->scale[c] + p->bias[c];
    }
}

Test(ck_u8, pixels_become_planes_or_interleaved_channels_of_each_image)
{
    enum { N = 3, H = 5, W = 7, PER = H * W * 3 };
    uint8_t x[N * PER];
    for (int i = 0; i < N * PER; i++)
        x[i] = (uint8_t)(i * 131 + 7);
    for (int bgr = 0; bgr < 2; bgr++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            ck_u8_t p = {.n = N, .hw = H * W, .pixels = true, .y_nhwc = nhwc};
            for (int c = 0; c < 3; c++) {
                p.src_chan[c] = bgr ? 2 - c : c;
                p.scale[c] = 0.5f + (float)c;
                p.bias[c] = -1.0f - (float)c;
            }
            cr_assert_eq(ck_u8_count(&p), N * PER);
            float y[N * PER], want[N * PER];
            u8_ref(&p, x, y);
            for (int b = 0; b < N; b++)
                for (int c = 0; c < 3; c++)
                    for (int q = 0; q < H * W; q++) {
                        int from = bgr ? 2 - c : c;
                        int at = b * PER + (nhwc ? q * 3 + c : c * H * W + q);
                        want[at] = (float)x[b * PER + q * 3 + from] * p.scale[c] + p.bias[c];
                    }
            cr_assert_arr_eq(y, want, sizeof(y), "bgr %d nhwc %d", bgr, nhwc);
        }
}

Test(ck_u8, a_tensors_bytes_are_cast_one_for_one)
{
    uint8_t x[300];
    for (int i = 0; i < 300; i++)
        x[i] = (uint8_t)(255 - i);
    ck_u8_t p = {.n = 300, .scale = {1.0f, 1.0f, 1.0f}};
    float y[300];
    cr_assert_eq(ck_u8_count(&p), 300);
    u8_ref(&p, x, y);
    for (int i = 0; i < 300; i++)
        cr_assert_eq(y[i], (float)x[i], "element %d", i);
}

/* The resize kernel's walk (ck_resize_prepare, ck_resize_at): element i of
 * an NHWC output is its i-th in memory (N, H, W, C), of an NCHW one its
 * i-th in logical order; every output element is visited once. */
Test(ck_resize, the_walk_follows_the_output_s_memory_order)
{
    const int64_t n = 2, c = 3, h = 4, w = 5;
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        ck_resize_t p;
        memset(&p, 0, sizeof(p));
        int64_t dims[4] = {n, c, h, w};
        memcpy(p.dims, dims, sizeof(dims));
        int64_t st_nchw[4] = {c * h * w, h * w, w, 1}, st_nhwc[4] = {h * w * c, 1, w * c, c};
        memcpy(p.y.st, nhwc ? st_nhwc : st_nchw, sizeof(st_nchw));
        ck_resize_prepare(&p);
        int want_order[2][4] = {{0, 1, 2, 3}, {0, 2, 3, 1}};
        for (int d = 0; d < 4; d++)
            cr_assert_eq(p.order[d], want_order[nhwc][d], "nhwc %d: order[%d] = %d", nhwc, d,
                         p.order[d]);
        for (int64_t i = 0; i < n * c * h * w; i++) {
            int64_t at[4];
            ck_resize_at(&p, i, at);
            int64_t off = 0;
            for (int d = 0; d < 4; d++) {
                cr_assert(at[d] >= 0 && at[d] < dims[d]);
                off += at[d] * p.y.st[d];
            }
            cr_assert_eq(off, i, "nhwc %d: element %lld lies at %lld", nhwc, (long long)i,
                         (long long)off);
        }
    }
}

/* The shared transforms as ONNX defines them, on worked values (the cpu
 * kernel's outputs are held to ONNX Runtime and torch by test_ort and
 * test_resize_cubic, through these same functions). */
Test(ck_resize, transforms_and_taps_on_worked_values)
{
    ck_resize_how_t h = {.mode = CK_RESIZE_LINEAR, .coord = CK_COORD_HALF_PIXEL};
    /* 4 -> 8, half_pixel: output 0 is at -0.25, output 3 at 1.25 */
    cr_assert_float_eq(ck_resize_coord(&h, 0, 4, 8, 2.0f), -0.25f, 1e-7);
    cr_assert_float_eq(ck_resize_coord(&h, 3, 4, 8, 2.0f), 1.25f, 1e-7);
    h.coord = CK_COORD_ALIGN_CORNERS;
    cr_assert_float_eq(ck_resize_coord(&h, 7, 4, 8, 2.0f), 3.0f, 1e-7);
    h.coord = CK_COORD_PYTORCH_HALF_PIXEL;
    cr_assert_float_eq(ck_resize_coord(&h, 0, 4, 1, 0.25f), 0.0f, 0);
    int64_t i1, i2;
    float w1, w2;
    h.coord = CK_COORD_HALF_PIXEL;
    ck_resize_linear(&h, 3, 4, 8, 2.0f, &i1, &i2, &w1, &w2); /* at 1.25 */
    cr_assert_eq(i1, 1);
    cr_assert_eq(i2, 2);
    cr_assert_float_eq(w1, 0.75f, 1e-6);
    cr_assert_float_eq(w2, 0.25f, 1e-6);
    ck_resize_linear(&h, 0, 4, 8, 2.0f, &i1, &i2, &w1, &w2); /* clamped to 0 */
    cr_assert_eq(i1, 0);
    cr_assert_float_eq(w1, 1.0f, 1e-6);
    /* nearest at 1.5: round_prefer_floor 1, round_prefer_ceil 2 */
    h.mode = CK_RESIZE_NEAREST;
    h.nearest = CK_NEAREST_ROUND_PREFER_FLOOR;
    cr_assert_eq(ck_resize_nearest(&h, 1.5f, 4), 1);
    h.nearest = CK_NEAREST_ROUND_PREFER_CEIL;
    cr_assert_eq(ck_resize_nearest(&h, 1.5f, 4), 2);
    h.nearest = CK_NEAREST_FLOOR;
    cr_assert_eq(ck_resize_nearest(&h, -0.25f, 4), 0, "clamped");
    h.nearest = CK_NEAREST_CEIL;
    cr_assert_eq(ck_resize_nearest(&h, 3.5f, 4), 3, "clamped");
    /* cubic weights sum to 1 at any fraction */
    h.mode = CK_RESIZE_CUBIC;
    h.cubic_a = -0.75f;
    int64_t idx[4];
    float wc[4];
    ck_resize_cubic(&h, 3, 4, 8, 2.0f, idx, wc);
    cr_assert_float_eq(wc[0] + wc[1] + wc[2] + wc[3], 1.0f, 1e-6);
    cr_assert_eq(idx[0], 0);
    cr_assert_eq(idx[3], 3);
}
