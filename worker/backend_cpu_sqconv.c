/* squish's own direct convolution for CPUs with AVX2 and FMA but not
 * AVX-512 (backend_cpu_int.h), over the layouts the cpu backend's
 * activations take there: 8-channel blocks (nChw8c) or channels last, in
 * and out, or a net's plain image in. Each conv it can run is timed
 * against oneDNN's when the model is planned and keeps the faster (the
 * end of this file).
 *
 * Why: on such a CPU oneDNN 2.6's jit:avx2 convs run one core near its
 * peak, but two threads on a small map (resnet18's 14x14 and 7x7 layers)
 * reach 86-108 GFLOP/s of the 178 two cores do, where ONNX Runtime's MLAS
 * keeps both busy (bench/RESULTS.md, "oneDNN's conv kernels on AVX2, layer
 * by layer"). Each thread here walks output channels with their weights
 * in its own caches.
 *
 * The kernel: an output tile of 6 pixels by 16 output channels (two
 * blocks) is 12 accumulators; for each input channel it broadcasts the
 * 6 pixels' inputs and multiplies by 16 weights, K (taps x input channels)
 * taken a chunk of about K_CHUNK at a time, so that a chunk's
 * weights stay in L1 while every pixel group of a block runs on them
 * (partial sums go through the output). The 6 pixels may lie anywhere
 * (rows, images): each has its own pointer per tap, and a tap in the
 * padding points into a read-only mapping of zero pages (no padded copy
 * of the input, and no resident memory: every page of it is the kernel's
 * one zero page). Bias, a residual (in the output buffer before the conv
 * runs, as oneDNN's sum post-op has it) and the activations oneDNN would
 * have fused are applied as a tile is stored. A 1x1 conv is the same with
 * one tap: a GEMM whose rows are pixels.
 *
 * It has no per-batch-size code: one set of packed weights serves every
 * size, and a size costs no JIT memory. */
#include "backend_cpu_avx2.h"
#include "backend_cpu_int.h"
#include "wk_omp.h"

#include <sq_clock.h>

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define TILE_PX 6      /* pixels of a tile */
#define TILE_OC 16     /* output channels of a tile: two blocks of 8 */
#define K_CHUNK 288    /* taps x input channels of a K chunk: 18 KB of a tile's weights */
#define GROUP_PTRS 864 /* tap pointers a block of pixel groups holds */
#define MAX_GROUPS 16  /* pixel groups of a block, whose output pointers a unit holds */
#define MAX_ACTS 4
/* Under AddressSanitizer every load of this kernel is checked (20 times
 * slower; oneDNN's code is not instrumented): a trial would time the
 * instrumentation and cost seconds a model, so such a build leaves the
 * convs a trial would decide to oneDNN, untimed (SQUISH_CPU_OWN_CONV=always
 * still runs this kernel: the unit tests check it under the sanitizers so). */
#if defined(__SANITIZE_ADDRESS__)
#define TRIALS_MEAN_SPEED 0
#else
#define TRIALS_MEAN_SPEED 1
#endif
#define UNIT_WEIGHTS ((size_t)192 << 10) /* of a unit's tiles: L2 holds them and a pixel block */
#define MIN_UNITS 4 /* units of work a thread, at least, where there is work for them */
#define MAX_TAPS 49 /* 7x7: a group's pointers fit GROUP_PTRS */

typedef struct cpu_sqconv {
    int ic, oc, ih, iw, oh, ow, kh, kw, sh, sw, ph, pw;
    int n_pairs;  /* output channel tiles (the last one a single block when oc % 16 == 8) */
    int n_groups; /* pixel groups of a block (gb) */
    int kc;       /* input channel blocks of a K chunk */
    bool add;     /* the output holds the residual before the conv runs */
    bool plain;   /* the input in plain NCHW (a net's image: at most 8 channels) */
    bool nhwc;    /* input and output channels last (else in 8-channel blocks) */
    int n_act;
    wk_act_t act[MAX_ACTS];
    int wbuf, bbuf; /* packed weights; bias (oc floats) */
    const float *zeros;
} cpu_sqconv_t;

/* ---- zero pages ------------------------------------------------------------ */

/* A read-only mapping of at least `bytes` of zeros: reads map the
 * kernel's zero page, so it costs no memory however large. Mappings are
 * kept for the process's life (a plan may point into an older, smaller
 * one). */
static const float *zero_pages(size_t bytes)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static void *map;
    static size_t map_bytes;
    pthread_mutex_lock(&mu);
    if (bytes > map_bytes) {
        size_t want = bytes < ((size_t)64 << 20) ? (size_t)64 << 20 : bytes;
        void *m = mmap(NULL, want, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m != MAP_FAILED) {
            map = m;
            map_bytes = want;
        }
    }
    const float *z = bytes <= map_bytes ? map : NULL;
    pthread_mutex_unlock(&mu);
    return z;
}

/* ---- which convs ---------------------------------------------------------- */

/* SQUISH_CPU_OWN_CONV: "off" (oneDNN's kernels for every conv); "on" (the
 * default: each conv of more than one tap runs the faster of the two
 * kernels, timed when planned); "all" (1x1 convs timed too); "always"
 * (every conv that fits, untimed: for tests). */
enum { OWN_OFF, OWN_ON, OWN_ALL, OWN_ALWAYS };
static int own_conv_mode(void)
{
    const char *e = getenv("SQUISH_CPU_OWN_CONV");
    if (e == NULL || *e == '\0' || strcmp(e, "on") == 0)
        return OWN_ON;
    if (strcmp(e, "all") == 0)
        return OWN_ALL;
    return strcmp(e, "always") == 0 ? OWN_ALWAYS : OWN_OFF;
}

static bool cpu_is_avx2_only(void)
{
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return isa == dnnl_cpu_isa_avx2 || isa == dnnl_cpu_isa_avx2_vnni;
}

static bool act_ok(wk_act_kind_t k)
{
    return k == WK_ACT_NONE || k == WK_ACT_RELU || k == WK_ACT_LEAKY_RELU || k == WK_ACT_CLIP ||
           k == WK_ACT_HARDSWISH;
}

static void geometry(cpu_sqconv_t *c, const wk_graph_t *g, const wk_step_t *s);
static bool own_faster(wk_plan_t *plan, const wk_step_t *s, const cpu_sqconv_t *c);

bool wk__cpu_sqconv_take(wk_plan_t *plan, int si)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int mode = own_conv_mode();
    if (mode == OWN_OFF || !cpu_is_avx2_only() || s->p.conv.n_spatial != 2 ||
        s->p.conv.groups != 1 || s->p.conv.dilation[0] != 1 || s->p.conv.dilation[1] != 1)
        return false;
    int64_t taps = s->p.conv.kernel[0] * s->p.conv.kernel[1];
    if (taps > MAX_TAPS || (taps == 1 && mode == OWN_ON))
        return false;
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    if (x->ndim != 4 || !x->batched || !y->batched || y->dims[1] % 8 != 0)
        return false;
    int n_act = 0;
    bool act_seen = false;
    for (int i = 0; i < s->n_post; i++) {
        const wk_post_t *p = &s->post[i];
        if (p->kind == WK_POST_DW)
            return false;
        if (p->kind == WK_POST_ADD) {
            /* the residual goes in first: only ahead of every activation */
            if (act_seen)
                return false;
            continue;
        }
        if (!act_ok(p->act.kind) || ++n_act > MAX_ACTS)
            return false;
        act_seen = true;
    }
    /* The input in 8-channel blocks or channels last already (what
     * oneDNN's convs chose upstream), or a net's image in plain NCHW (a
     * stem conv: at most 8 channels, more than one tap); otherwise
     * oneDNN's own kernels keep their layouts. The output takes the
     * input's layout (8-channel blocks after a plain image). */
    const cpu_buf_t *in = &be->bufs[wk__cpu_vbuf(s->in[0])];
    dnnl_memory_desc_t blk, pln, last;
    if (!in->decided || in->md.ndims != 4 ||
        dnnl_memory_desc_init_by_tag(&blk, 4, in->md.dims, dnnl_f32, dnnl_nChw8c) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&pln, 4, in->md.dims, dnnl_f32, dnnl_abcd) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&last, 4, in->md.dims, dnnl_f32, dnnl_acdb) != dnnl_success)
        return false;
    bool plain = x->dims[1] <= 8 && taps > 1 && dnnl_memory_desc_equal(&in->md, &pln);
    bool nhwc = !plain && dnnl_memory_desc_equal(&in->md, &last);
    if (!plain && (x->dims[1] % 8 != 0 || (!nhwc && !dnnl_memory_desc_equal(&in->md, &blk))))
        return false;
    cpu_sqconv_t *c = sq_xcalloc(1, sizeof(*c));
    geometry(c, g, s);
    c->plain = plain;
    c->nhwc = nhwc;
    c->zeros = zero_pages((size_t)c->ic * (size_t)c->ih * (size_t)c->iw * sizeof(float));
    if (c->zeros == NULL ||
        (mode != OWN_ALWAYS && (!TRIALS_MEAN_SPEED || !own_faster(plan, s, c)))) {
        free(c);
        return false;
    }
    be->steps[si].sqc = c;
    return true;
}

static void geometry(cpu_sqconv_t *c, const wk_graph_t *g, const wk_step_t *s)
{
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    c->ic = (int)x->dims[1];
    c->ih = (int)x->dims[2];
    c->iw = (int)x->dims[3];
    c->oc = (int)y->dims[1];
    c->oh = (int)y->dims[2];
    c->ow = (int)y->dims[3];
    c->kh = (int)s->p.conv.kernel[0];
    c->kw = (int)s->p.conv.kernel[1];
    c->sh = (int)s->p.conv.stride[0];
    c->sw = (int)s->p.conv.stride[1];
    c->ph = (int)s->p.conv.pad_begin[0];
    c->pw = (int)s->p.conv.pad_begin[1];
    c->n_pairs = (c->oc + TILE_OC - 1) / TILE_OC;
    c->kc = K_CHUNK / (8 * c->kh * c->kw) < 1 ? 1 : K_CHUNK / (8 * c->kh * c->kw);
    int per_group = TILE_PX * c->kh * c->kw;
    c->n_groups = GROUP_PTRS / per_group < 1 ? 1 : GROUP_PTRS / per_group;
    if (c->n_groups > MAX_GROUPS)
        c->n_groups = MAX_GROUPS;
    for (int i = 0; i < s->n_post; i++) {
        if (s->post[i].kind == WK_POST_ADD)
            c->add = true;
        else
            c->act[c->n_act++] = s->post[i].act;
    }
}

/* ---- building ---------------------------------------------------------------- */

/* A buffer of n floats the plan owns (counted in its memory). */
static int own_floats(wk_plan_t *plan, size_t n, float **out)
{
    cpu_be_t *be = plan->be;
    dnnl_memory_desc_t md;
    dnnl_dims_t d = {(int64_t)n};
    dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_f32, dnnl_a);
    int id = wk__cpu_add_buf(be, &md, false, -2, -2);
    size_t bytes = (n * sizeof(float) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    float *p = aligned_alloc(ARENA_ALIGN, bytes);
    if (p == NULL)
        return wk_fail(plan, SQ_NOMEM, "conv weights of %zu bytes", bytes);
    memset(p, 0, bytes);
    be->bufs[id].own_data = p;
    be->bufs[id].data = p;
    *out = p;
    return id;
}

/* The weights [oc, ic, kh, kw] packed tile by tile: for each tile of 16
 * output channels (8 for a last single block), each K chunk of KC_BLOCKS
 * input blocks, each tap, each input channel of the chunk, the tile's
 * output channels side by side. */
static void pack_weights(const cpu_sqconv_t *c, const float *w, float *dst)
{
    int taps = c->kh * c->kw;
    for (int t = 0; t < c->n_pairs; t++) {
        int o0 = t * TILE_OC, nb = o0 + TILE_OC <= c->oc ? TILE_OC : 8;
        float *wt = dst + (size_t)t * (size_t)taps * (size_t)c->ic * TILE_OC;
        for (int k0 = 0; k0 < c->ic; k0 += c->kc * 8) {
            int kn = c->ic - k0 < c->kc * 8 ? c->ic - k0 : c->kc * 8;
            float *wc = wt + (size_t)k0 * (size_t)taps * (size_t)nb;
            for (int tap = 0; tap < taps; tap++)
                for (int i = 0; i < kn; i++)
                    for (int j = 0; j < nb; j++)
                        wc[((size_t)tap * (size_t)kn + (size_t)i) * (size_t)nb + (size_t)j] =
                            w[((size_t)(o0 + j) * (size_t)c->ic + (size_t)(k0 + i)) * (size_t)taps +
                              (size_t)tap];
        }
    }
}

int wk__cpu_build_sqconv(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *w = &g->values[s->in[1]], *y = &g->values[s->out];
    if (be->phase == 1) {
        cpu_sqconv_t *c = cs->sqc;
        float *pw = NULL, *pb = NULL;
        size_t nw = (size_t)c->n_pairs * TILE_OC * (size_t)c->ic * (size_t)(c->kh * c->kw);
        if ((c->wbuf = own_floats(plan, nw, &pw)) < 0)
            return c->wbuf;
        pack_weights(c, w->data, pw);
        wk__cpu_share_twin(plan, c->wbuf);
        if ((c->bbuf = own_floats(plan, (size_t)c->oc, &pb)) < 0)
            return c->bbuf;
        if (s->n_in > 2 && s->in[2] >= 0)
            memcpy(pb, g->values[s->in[2]].data, (size_t)c->oc * sizeof(float));
        wk__cpu_share_twin(plan, c->bbuf);
        dnnl_memory_desc_t md;
        dnnl_dims_t d = {y->dims[0], y->dims[1], y->dims[2], y->dims[3]};
        dnnl_memory_desc_init_by_tag(&md, 4, d, dnnl_f32, c->nhwc ? dnnl_acdb : dnnl_nChw8c);
        wk__cpu_set_out_md(plan, s->out, &md);
        if (!dnnl_memory_desc_equal(&be->bufs[wk__cpu_vbuf(s->out)].md, &md))
            return wk_fail(plan, SQ_INTERNAL, "conv step %d: output not in the layout asked", si);
        wk__cpu_conv_sum_in_place(plan, si, &md);
        return 0;
    }
    int rc = wk__cpu_conv_residual_first(plan, si, batch);
    if (rc != 0)
        return rc;
    if (be->dry)
        return 0;
    cpu_item_t it = {.prim = NULL, .step = si};
    wk__cpu_push_item(be, batch, &it);
    return 0;
}

int wk__cpu_build_any_conv(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    if (be->phase == 1 ? wk__cpu_sqconv_take(plan, si) : be->steps[si].sqc != NULL)
        return wk__cpu_build_sqconv(plan, si, batch);
    return wk__cpu_build_conv(plan, si, batch);
}

void wk__cpu_sqconv_free(cpu_step_t *cs)
{
    free(cs->sqc);
    cs->sqc = NULL;
}

/* ---- running ------------------------------------------------------------------ */

#define TARGET WK_AVX2

/* One tile: R pixels (tap pointers tp[tap * TILE_PX + r]) by NB blocks of
 * 8 output channels (out pointers o[r], the second block ostep floats
 * on), K chunk [icb0, icb1) of input blocks (istep floats apart). first:
 * start from the bias (and the residual in the output); else from the
 * partial sums in the output. last: apply the activations. */
static inline __attribute__((always_inline)) TARGET void
tile(const cpu_sqconv_t *c, const float *const *tp, const float *w, int icb0, int icb1,
     size_t istep, float *const *o, size_t ostep, const float *bias, bool first, bool last,
     const int R, const int NB, const bool PLAIN)
{
    __m256 a0[TILE_PX], a1[TILE_PX];
    int taps = c->kh * c->kw;
    if (first) {
        __m256 b0 = _mm256_loadu_ps(bias), b1 = NB == 2 ? _mm256_loadu_ps(bias + 8) : b0;
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            a0[r] = c->add ? _mm256_add_ps(b0, _mm256_load_ps(o[r])) : b0;
            if (NB == 2)
                a1[r] = c->add ? _mm256_add_ps(b1, _mm256_load_ps(o[r] + ostep)) : b1;
        }
    } else {
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            a0[r] = _mm256_load_ps(o[r]);
            if (NB == 2)
                a1[r] = _mm256_load_ps(o[r] + ostep);
        }
    }
    for (int t = 0; t < taps; t++) {
        const float *const *p = tp + t * TILE_PX;
        if (PLAIN) {
            /* one partial block: channel i a plane (istep / 8 floats) on */
            for (int i = 0; i < c->ic; i++) {
                __m256 w0 = _mm256_load_ps(w), w1 = NB == 2 ? _mm256_load_ps(w + 8) : w0;
                w += NB * 8;
                size_t off = (size_t)i * (istep / 8);
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    __m256 v = _mm256_broadcast_ss(p[r] + off);
                    a0[r] = _mm256_fmadd_ps(v, w0, a0[r]);
                    if (NB == 2)
                        a1[r] = _mm256_fmadd_ps(v, w1, a1[r]);
                }
            }
            continue;
        }
        for (int icb = icb0; icb < icb1; icb++) {
            size_t off = (size_t)icb * istep;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m256 w0 = _mm256_load_ps(w), w1 = NB == 2 ? _mm256_load_ps(w + 8) : w0;
                w += NB * 8;
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    __m256 v = _mm256_broadcast_ss(p[r] + off + i);
                    a0[r] = _mm256_fmadd_ps(v, w0, a0[r]);
                    if (NB == 2)
                        a1[r] = _mm256_fmadd_ps(v, w1, a1[r]);
                }
            }
        }
    }
    if (last) {
        for (int k = 0; k < c->n_act; k++) {
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                a0[r] = wk__cpu_act8(a0[r], &c->act[k]);
                if (NB == 2)
                    a1[r] = wk__cpu_act8(a1[r], &c->act[k]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_store_ps(o[r], a0[r]);
        if (NB == 2)
            _mm256_store_ps(o[r] + ostep, a1[r]);
    }
}

static TARGET void tile_any(const cpu_sqconv_t *c, const float *const *tp, const float *w, int icb0,
                            int icb1, size_t istep, float *const *o, size_t ostep,
                            const float *bias, bool first, bool last, int R, int NB)
{
#define TILE_CASE(r_, nb_)                                                                         \
    case (r_)*4 + (nb_):                                                                           \
        if (c->plain)                                                                              \
            tile(c, tp, w, icb0, icb1, istep, o, ostep, bias, first, last, r_, nb_, true);         \
        else                                                                                       \
            tile(c, tp, w, icb0, icb1, istep, o, ostep, bias, first, last, r_, nb_, false);        \
        return;
    switch (R * 4 + NB) {
        TILE_CASE(6, 2)
        TILE_CASE(5, 2)
        TILE_CASE(4, 2)
        TILE_CASE(3, 2)
        TILE_CASE(2, 2)
        TILE_CASE(1, 2)
        TILE_CASE(6, 1)
        TILE_CASE(5, 1)
        TILE_CASE(4, 1)
        TILE_CASE(3, 1)
        TILE_CASE(2, 1)
        TILE_CASE(1, 1)
    default:
        return;
    }
#undef TILE_CASE
}

typedef struct {
    const cpu_sqconv_t *c;
    const float *in, *w, *bias;
    float *out;
    int batch;
    int n_units, per_claim;
    int pb;  /* output channel tiles of a unit, whose weights stay in L2 while it runs */
    int gsz; /* pixel groups of a unit (at most the conv's n_groups) */
    atomic_int next;
} run_t;

/* The tap pointers of pixel groups g0.. (up to n) into tp, and each
 * pixel's output pointer (first block of tile 0) into op; returns the
 * pixels covered. */
static int group_ptrs(const run_t *rn, int g0, int n, const float **tp, float **op)
{
    const cpu_sqconv_t *c = rn->c;
    int64_t hw = (int64_t)c->oh * c->ow, total = hw * rn->batch;
    int taps = c->kh * c->kw;
    size_t in_img = (size_t)c->ic * (size_t)c->ih * (size_t)c->iw;
    size_t out_img = (size_t)c->oc * (size_t)hw;
    /* floats from a pixel to the next: channels last, blocks, plain */
    size_t px_in = c->nhwc ? (size_t)c->ic : c->plain ? 1 : 8;
    size_t px_out = c->nhwc ? (size_t)c->oc : 8;
    int px = 0;
    for (int gi = 0; gi < n; gi++) {
        for (int r = 0; r < TILE_PX; r++) {
            int64_t p = (int64_t)(g0 + gi) * TILE_PX + r;
            if (p >= total)
                break;
            int64_t img = p / hw, q = p % hw;
            int oy = (int)(q / c->ow), ox = (int)(q % c->ow);
            const float *base = rn->in + (size_t)img * in_img;
            for (int t = 0; t < taps; t++) {
                int iy = oy * c->sh - c->ph + t / c->kw, ix = ox * c->sw - c->pw + t % c->kw;
                tp[(gi * taps + t) * TILE_PX + r] =
                    iy < 0 || ix < 0 || iy >= c->ih || ix >= c->iw
                        ? c->zeros
                        : base + ((size_t)iy * (size_t)c->iw + (size_t)ix) * px_in;
            }
            op[gi * TILE_PX + r] = rn->out + (size_t)img * out_img + (size_t)q * px_out;
            px++;
        }
    }
    return px;
}

static TARGET void run_pair(const run_t *rn, int pair, const float *const *tp, float *const *op,
                            int g0, int gn, int64_t total, int icbs, size_t istep, size_t ostep);

/* Units u0..u1: unit u is pixel block u % n_gb by the pb output channel
 * tiles from u / n_gb * pb: the block's input stays in L2 while each
 * tile's weights run over it. */
static TARGET void run_units(run_t *rn, int u0, int u1)
{
    const cpu_sqconv_t *c = rn->c;
    int icbs = (c->ic + 7) / 8;
    int64_t hw = (int64_t)c->oh * c->ow, total = hw * rn->batch;
    int n_groups = (int)((total + TILE_PX - 1) / TILE_PX);
    int n_gb = (n_groups + rn->gsz - 1) / rn->gsz;
    /* floats from a block of 8 channels to the next */
    size_t istep = c->nhwc ? 8 : (size_t)c->ih * (size_t)c->iw * 8;
    size_t ostep = c->nhwc ? 8 : (size_t)hw * 8;
    const float *tp[GROUP_PTRS];
    float *op[MAX_GROUPS * TILE_PX];
    int have_gb = -1;
    for (int u = u0; u < u1; u++) {
        int gb = u % n_gb, pair0 = u / n_gb * rn->pb;
        int pair1 = pair0 + rn->pb < c->n_pairs ? pair0 + rn->pb : c->n_pairs;
        int g0 = gb * rn->gsz, gn = n_groups - g0 < rn->gsz ? n_groups - g0 : rn->gsz;
        if (gb != have_gb) {
            group_ptrs(rn, g0, gn, tp, op);
            have_gb = gb;
        }
        for (int pair = pair0; pair < pair1; pair++)
            run_pair(rn, pair, tp, op, g0, gn, total, icbs, istep, ostep);
    }
}

/* One tile of output channels over pixel groups g0.. (gn of them), whose
 * tap and output pointers group_ptrs made. */
static TARGET void run_pair(const run_t *rn, int pair, const float *const *tp, float *const *op,
                            int g0, int gn, int64_t total, int icbs, size_t istep, size_t ostep)
{
    const cpu_sqconv_t *c = rn->c;
    int taps = c->kh * c->kw;
    int nb = pair * TILE_OC + TILE_OC <= c->oc ? 2 : 1;
    const float *wt = rn->w + (size_t)pair * (size_t)taps * (size_t)c->ic * TILE_OC;
    const float *bias = rn->bias + pair * TILE_OC;
    size_t oshift = (size_t)(pair * 2) * ostep;
    for (int k0 = 0; k0 < icbs; k0 += c->kc) {
        int k1 = k0 + c->kc < icbs ? k0 + c->kc : icbs;
        const float *wc = wt + (size_t)k0 * 8 * (size_t)taps * (size_t)(nb * 8);
        for (int gi = 0; gi < gn; gi++) {
            int64_t p0 = (int64_t)(g0 + gi) * TILE_PX;
            int R = total - p0 < TILE_PX ? (int)(total - p0) : TILE_PX;
            float *o[TILE_PX];
            for (int r = 0; r < R; r++)
                o[r] = op[gi * TILE_PX + r] + oshift;
            tile_any(c, tp + (size_t)gi * (size_t)taps * TILE_PX, wc, k0, k1, istep, o, ostep, bias,
                     k0 == 0, k1 == icbs, R, nb);
        }
    }
}

static void run_share(void *data)
{
    run_t *rn = data;
    for (;;) {
        int u0 = atomic_fetch_add(&rn->next, rn->per_claim);
        if (u0 >= rn->n_units)
            return;
        int u1 = u0 + rn->per_claim < rn->n_units ? u0 + rn->per_claim : rn->n_units;
        run_units(rn, u0, u1);
    }
}

static void sqconv_exec(const cpu_sqconv_t *c, const float *in, const float *w, const float *bias,
                        float *out, int batch)
{
    run_t rn = {.c = c, .in = in, .w = w, .bias = bias, .out = out, .batch = batch};
    int64_t total = (int64_t)c->oh * c->ow * batch;
    int n_groups = (int)((total + TILE_PX - 1) / TILE_PX);
    /* As many tiles a unit as keep their weights within UNIT_WEIGHTS */
    size_t wbytes = TILE_OC * (size_t)c->ic * (size_t)(c->kh * c->kw) * 4;
    rn.pb = (int)(UNIT_WEIGHTS / wbytes) < 1 ? 1 : (int)(UNIT_WEIGHTS / wbytes);
    rn.pb = rn.pb > c->n_pairs ? c->n_pairs : rn.pb;
    rn.gsz = c->n_groups;
    /* ... but at least MIN_UNITS a thread, smaller units where the work is
     * small: densenet121's 3x3 convs of 32 output channels on a 7x7 map
     * at batch 1 were one unit, one thread's, beside an idle one. */
    int nt = omp_get_max_threads();
    for (;;) {
        int n_gb = (n_groups + rn.gsz - 1) / rn.gsz;
        rn.n_units = n_gb * ((c->n_pairs + rn.pb - 1) / rn.pb);
        if (rn.n_units >= MIN_UNITS * nt || (rn.pb == 1 && rn.gsz == 1))
            break;
        if (rn.pb > 1)
            rn.pb = (rn.pb + 1) / 2;
        else
            rn.gsz = (rn.gsz + 1) / 2;
    }
    rn.per_claim = rn.n_units / (nt * 4) > 0 ? rn.n_units / (nt * 4) : 1;
    atomic_init(&rn.next, 0);
    wk_omp_run(run_share, &rn);
}

void wk__cpu_run_sqconv(cpu_be_t *be, const wk_step_t *s, const cpu_step_t *cs, int batch)
{
    const cpu_sqconv_t *c = cs->sqc;
    sqconv_exec(c, wk__cpu_buf_ptr(be, wk__cpu_vbuf(s->in[0])), be->bufs[c->wbuf].data,
                be->bufs[c->bbuf].data, wk__cpu_buf_ptr(be, wk__cpu_vbuf(s->out)), batch);
}

/* ---- which kernel is faster -------------------------------------------------- */

/* Whether this kernel runs conv s faster than oneDNN's, both made at the
 * plan's largest batch (at most TRIAL_BATCH: the model's plan for small
 * batches and its plan for large ones ask the same) over scratch buffers and
 * timed in turn, the faster of TRIAL_ROUNDS runs each after one to warm
 * up; it must win by OWN_GAIN (a tie stays with oneDNN). Where oneDNN has
 * no fast kernel for it, this one is taken untimed. Which wins differs by
 * shape and machine: on a 2-vCPU AMD EPYC (AVX2) this kernel led on
 * resnet18's 3x3 convs and trailed oneDNN's jit_1x1 on most 1x1 convs
 * (bench/RESULTS.md). */
#define TRIAL_BATCH 3
#define TRIAL_ROUNDS 3
#define OWN_GAIN 0.97

/* What a trial found, by shape: the convs of one shape (resnet18 has 16
 * 3x3 convs of 7 shapes, densenet121 58 of 4) and every later plan of it
 * (the model's plan for small batches, a reload, another model) take the
 * first trial's answer in this process: trials at every conv made a
 * resnet18 plan take 6 s instead of 0.3. */
typedef struct {
    int key[14];
    bool own;
} trial_t;

#define MAX_TRIALS 512
static trial_t g_trials[MAX_TRIALS];
static int g_n_trials;
static pthread_mutex_t g_trials_mu = PTHREAD_MUTEX_INITIALIZER;

static void trial_key(const cpu_sqconv_t *c, int *key)
{
    int k[14] = {c->ic, c->oc, c->ih, c->iw,    c->kh,   c->kw,  c->sh,
                 c->sw, c->ph, c->pw, c->plain, c->nhwc, c->add, c->n_act};
    memcpy(key, k, sizeof(k));
}

/* 1: own, 0: oneDNN, -1: not tried yet. */
static int trial_known(const int *key)
{
    int r = -1;
    pthread_mutex_lock(&g_trials_mu);
    for (int i = 0; i < g_n_trials && r < 0; i++)
        if (memcmp(g_trials[i].key, key, sizeof(g_trials[i].key)) == 0)
            r = g_trials[i].own;
    pthread_mutex_unlock(&g_trials_mu);
    return r;
}

static void trial_note(const int *key, bool own)
{
    pthread_mutex_lock(&g_trials_mu);
    if (g_n_trials < MAX_TRIALS) {
        memcpy(g_trials[g_n_trials].key, key, sizeof(g_trials[g_n_trials].key));
        g_trials[g_n_trials++].own = own;
    }
    pthread_mutex_unlock(&g_trials_mu);
}

static bool own_faster(wk_plan_t *plan, const wk_step_t *s, const cpu_sqconv_t *c)
{
    const cpu_be_t *be = plan->be;
    int tb = plan->graph->max_batch < TRIAL_BATCH ? plan->graph->max_batch : TRIAL_BATCH;
    int key[14];
    trial_key(c, key);
    int known = trial_known(key);
    if (known >= 0)
        return known == 1;
    bool has_bias = s->n_in > 2 && s->in[2] >= 0, faster = true;
    dnnl_dims_t sd = {tb, c->ic, c->ih, c->iw}, dd = {tb, c->oc, c->oh, c->ow};
    dnnl_dims_t wd = {c->oc, c->ic, c->kh, c->kw}, bd = {c->oc};
    dnnl_memory_desc_t smd, dmd, wmd, bmd;
    dnnl_format_tag_t in_tag = c->plain ? dnnl_abcd : c->nhwc ? dnnl_acdb : dnnl_nChw8c;
    dnnl_memory_desc_init_by_tag(&smd, 4, sd, dnnl_f32, in_tag);
    dnnl_memory_desc_init_by_tag(&dmd, 4, dd, dnnl_f32, c->nhwc ? dnnl_acdb : dnnl_nChw8c);
    dnnl_memory_desc_init_by_tag(&wmd, 4, wd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[5] = {NULL, NULL, NULL, NULL, NULL};
    size_t in_n = (size_t)tb * (size_t)c->ic * (size_t)c->ih * (size_t)c->iw;
    size_t out_n = (size_t)tb * (size_t)c->oc * (size_t)c->oh * (size_t)c->ow;
    size_t w_n = (size_t)c->n_pairs * TILE_OC * (size_t)c->ic * (size_t)(c->kh * c->kw);
    float *in =
        aligned_alloc(ARENA_ALIGN, (in_n * 4 + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    float *out =
        aligned_alloc(ARENA_ALIGN, (out_n * 4 + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    float *w = aligned_alloc(ARENA_ALIGN, (w_n * 4 + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    float *bias = calloc((size_t)c->oc + 8, sizeof(float));
    if (in == NULL || out == NULL || w == NULL || bias == NULL ||
        dnnl_primitive_attr_create(&attr) != dnnl_success ||
        dnnl_post_ops_create(&po) != dnnl_success || wk__cpu_conv_post_ops(po, s) != dnnl_success ||
        dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success ||
        !wk__cpu_pd_fast(wk__cpu_conv_pd(&pd, s, false, &smd, &wmd, has_bias ? &bmd : NULL, &dmd,
                                         attr, be->engine),
                         &pd))
        goto out; /* oneDNN has no fast kernel: this one */
    for (size_t i = 0; i < in_n; i++)
        in[i] = 0.01f;
    for (size_t i = 0; i < out_n; i++)
        out[i] = 0.01f;
    for (size_t i = 0; i < w_n; i++)
        w[i] = 0.01f;
    static const int kinds[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS,
                                 DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[5];
    int n_args = 0;
    for (int k = 0; k < 5; k++) {
        const dnnl_memory_desc_t *md =
            k == 4 ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)
                   : dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, kinds[k]);
        if ((k == 3 && !has_bias) || md == NULL || dnnl_memory_desc_get_size(md) == 0)
            continue;
        /* src and dst over this kernel's own buffers: the same bytes */
        void *h = k == 0 ? (void *)in : k == 2 ? (void *)out : DNNL_MEMORY_ALLOCATE;
        if (dnnl_memory_create(&mem[k], md, be->engine, h) != dnnl_success)
            goto out;
        args[n_args++] = (dnnl_exec_arg_t){kinds[k], mem[k]};
    }
    if (dnnl_primitive_create(&prim, pd) != dnnl_success)
        goto out;
    int64_t best_own = INT64_MAX, best_dnnl = INT64_MAX;
    for (int r = 0; r <= TRIAL_ROUNDS; r++) {
        int64_t t0 = sq_now_ns();
        if (dnnl_primitive_execute(prim, be->stream, n_args, args) != dnnl_success ||
            dnnl_stream_wait(be->stream) != dnnl_success)
            goto out;
        int64_t t1 = sq_now_ns();
        sqconv_exec(c, in, w, bias, out, tb);
        int64_t t2 = sq_now_ns();
        if (r > 0) {
            best_dnnl = t1 - t0 < best_dnnl ? t1 - t0 : best_dnnl;
            best_own = t2 - t1 < best_own ? t2 - t1 : best_own;
        }
    }
    faster = (double)best_own < OWN_GAIN * (double)best_dnnl;
    trial_note(key, faster);
    SQ_DEBUG("cpu plan: conv %dx%d %d->%d at %dx%d, batch %d: own %.3f ms, oneDNN %.3f ms: %s",
             c->kh, c->kw, c->ic, c->oc, c->ih, c->iw, tb, (double)best_own / 1e6,
             (double)best_dnnl / 1e6, faster ? "own" : "oneDNN");
out:
    for (int k = 0; k < 5; k++)
        dnnl_memory_destroy(mem[k]);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    free(in);
    free(out);
    free(w);
    free(bias);
    return faster;
}
