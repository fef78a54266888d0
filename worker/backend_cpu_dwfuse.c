/* Whether the cpu backend fuses a depthwise 3x3 conv into the 1x1 conv
 * before it (the backend's conv_dw, asked by the fusion pass): the pair
 * made at max batch both ways and timed (backend_cpu_int.h). */
#include "backend_cpu_int.h"

#include <sq_clock.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Depthwise 3x3 convs fused into the 1x1 conv before them (oneDNN's dw
 * post-op, on its jit_1x1 kernel): the expanded tensor between them is
 * made and consumed a few rows at a time, in cache, instead of written to
 * memory and read back. That pays only where the tensor does not fit the
 * caches. On a 2-core Xeon (2 MB of L2 a core), 1x1 and dw with their
 * activations, apart and fused, ms per batch: mobilenet_v2's first expand
 * at batch 8 (96 x 112 x 112, 38 MB) with its stride-2 dw 4.3 and 2.5;
 * 144 x 56 x 56 (14 MB) 2.6 and 1.4; from 4.8 MB down (and every pair at
 * batch 1) alike within noise. So a pair is fused when the expanded tensor
 * takes at least DW_FUSE_MB at max batch and times faster fused
 * (wk__cpu_conv_dw), and batch 1 runs a plan without it (exec.c). oneDNN
 * 2.6 also takes the fusion on channels-last tensors and computes it
 * wrongly, so fused convs run on channel blocks only (wk__cpu_dw_block:
 * nChw16c with AVX-512, nChw8c with AVX2), and only where that has a fast
 * kernel. */
#define DW_FUSE_MB 8.0

/* wk__cpu_conv_pd for timing: nonzero when no primitive descriptor was made. */
static int conv_pd_failed(dnnl_primitive_desc_t *pd, const wk_step_t *s,
                          const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                          const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                          const_dnnl_primitive_attr_t attr, dnnl_engine_t engine)
{
    return wk__cpu_conv_pd(pd, s, false, src, wei, bias, dst, attr, engine) != dnnl_success ||
           *pd == NULL;
}

/* A primitive of pd with every argument it names in fresh memory (filled
 * with a small constant), ready to run: for timing. */
typedef struct {
    dnnl_primitive_t prim;
    dnnl_exec_arg_t args[8];
    int n;
} timed_t;

static bool timed_make(timed_t *t, dnnl_engine_t engine, const_dnnl_primitive_desc_t pd,
                       const int *kinds, int n, dnnl_memory_t share_src)
{
    memset(t, 0, sizeof(*t));
    if (dnnl_primitive_create(&t->prim, pd) != dnnl_success)
        return false;
    for (int i = 0; i < n; i++) {
        const dnnl_memory_desc_t *md =
            dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, kinds[i]);
        dnnl_memory_t m = NULL;
        if (kinds[i] == DNNL_ARG_SRC && share_src != NULL) {
            m = share_src;
        } else {
            if (md == NULL ||
                dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE) != dnnl_success)
                return false;
            void *h = NULL;
            dnnl_memory_get_data_handle(m, &h);
            size_t bytes = dnnl_memory_desc_get_size(md);
            for (size_t k = 0; k < bytes / sizeof(float); k++)
                ((float *)h)[k] = 0.01f;
        }
        t->args[t->n++] = (dnnl_exec_arg_t){kinds[i], m};
    }
    return true;
}

static void timed_free(timed_t *t, dnnl_memory_t shared)
{
    for (int i = 0; i < t->n; i++)
        if (t->args[i].memory != shared)
            dnnl_memory_destroy(t->args[i].memory);
    if (t->prim != NULL)
        dnnl_primitive_destroy(t->prim);
}

static int64_t timed_run(dnnl_stream_t stream, const timed_t *ts, int n)
{
    int64_t t0 = sq_now_ns();
    for (int i = 0; i < n; i++)
        if (dnnl_primitive_execute(ts[i].prim, stream, ts[i].n, ts[i].args) != dnnl_success)
            return INT64_MAX;
    dnnl_stream_wait(stream);
    return sq_now_ns() - t0;
}

/* Whether pw and dw, made here at max batch as wk__cpu_build_conv would make them,
 * run faster fused than apart. The tensor between them must take at least
 * DW_FUSE_MB (SQUISH_CPU_DW_FUSE_MB: another size; "off": none;
 * "always": every pair with a fast fused kernel, untimed), the fused
 * kernel must be a fast one on channel blocks (wk__cpu_dw_block), and then
 * the faster of two runs each way must be fused by at least DW_FUSE_GAIN:
 * with swish after both convs, efficientnet_b0's 24 -> 144 channel pair at
 * 56 x 56 ran 5.4 ms fused against 4.0 apart, where its 16 -> 96 at
 * 112 x 112 gained (7.3 against 9.2). */
#define DW_FUSE_GAIN 0.9
bool wk__cpu_conv_dw(const wk_graph_t *g, const wk_step_t *pw, const wk_step_t *dw)
{
    const char *env = getenv("SQUISH_CPU_DW_FUSE_MB");
    double mb = DW_FUSE_MB;
    bool always = env != NULL && strcmp(env, "always") == 0;
    if (env != NULL && *env != '\0' && !always) {
        char *end;
        mb = strcmp(env, "off") == 0 ? -1 : strtod(env, &end);
        if (mb < 0 || *end != '\0')
            return false;
    }
    const wk_value_t *x = &g->values[pw->in[0]], *w = &g->values[pw->in[1]],
                     *mid = &g->values[pw->out], *y = &g->values[dw->out];
    if (!always && (double)wk_value_elems(mid) * sizeof(float) < mb * 1024 * 1024)
        return false;
    bool pw_bias = pw->n_in > 2 && pw->in[2] >= 0;
    /* The fused step, as wk__cpu_build_conv will ask for it. */
    wk_step_t f = *pw;
    f.out = dw->out;
    f.post[f.n_post++] = (wk_post_t){.kind = WK_POST_DW, .stride = (int)dw->p.conv.stride[0]};
    for (int i = 0; i < dw->n_post && f.n_post < WK_MAX_POST; i++)
        f.post[f.n_post++] = dw->post[i];
    dnnl_engine_t engine = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_primitive_attr_t attr[3] = {NULL, NULL, NULL};
    dnnl_post_ops_t po[3] = {NULL, NULL, NULL};
    dnnl_primitive_desc_t pd[3] = {NULL, NULL, NULL}; /* fused, pw apart, dw apart */
    timed_t tf = {0}, t1 = {0}, t2 = {0}, r_in = {0}, r_out = {0};
    dnnl_primitive_desc_t rpd[2] = {NULL, NULL};
    bool ok = false;
    dnnl_memory_desc_t sm, wm, bm, dm, am, mm, dwm, ym;
    dnnl_dims_t sd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]},
                wd = {w->dims[0], w->dims[1], 1, 1}, bd = {w->dims[0]},
                dwd = {y->dims[1], 1, 1, 3, 3},
                yd = {y->dims[0], y->dims[1], y->dims[2], y->dims[3]};
    wk__cpu_dw_mid_md(&dm, x->dims[0], x, y);
    const wk_step_t *apart[2] = {pw, dw};
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success)
        goto out;
    for (int k = 0; k < 3; k++)
        if (dnnl_primitive_attr_create(&attr[k]) != dnnl_success ||
            dnnl_post_ops_create(&po[k]) != dnnl_success ||
            wk__cpu_conv_post_ops(po[k], k == 0 ? &f : apart[k - 1]) != dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr[k], po[k]) != dnnl_success)
            goto out;
    if (dnnl_memory_desc_init_by_tag(&sm, 4, sd, dnnl_f32, wk__cpu_dw_block()) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&wm, 4, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&bm, 1, bd, dnnl_f32, dnnl_a) != dnnl_success ||
        !wk__cpu_pd_fast(wk__cpu_conv_pd(&pd[0], &f, false, &sm, &wm, pw_bias ? &bm : NULL, &dm,
                                         attr[0], engine),
                         &pd[0]))
        goto out;
    if (always) {
        ok = true;
        goto out;
    }
    /* Apart, in the layouts oneDNN picks for each (channels last, in
     * practice), the dw reading what the 1x1 wrote. */
    if (dnnl_memory_desc_init_by_tag(&am, 4, sd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&mm, 4, dm.dims, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success ||
        conv_pd_failed(&pd[1], pw, &am, &wm, pw_bias ? &bm : NULL, &mm, attr[1], engine) ||
        dnnl_memory_desc_init_by_tag(&dwm, 5, dwd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&ym, 4, yd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        conv_pd_failed(&pd[2], dw, dnnl_primitive_desc_query_md(pd[1], dnnl_query_dst_md, 0), &dwm,
                       &bm, &ym, attr[2], engine))
        goto out;
    static const int fk[] = {DNNL_ARG_SRC,
                             DNNL_ARG_WEIGHTS,
                             DNNL_ARG_DST,
                             DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS,
                             DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS,
                             DNNL_ARG_BIAS};
    static const int ck[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    if (!timed_make(&tf, engine, pd[0], fk, pw_bias ? 6 : 5, NULL) ||
        !timed_make(&t1, engine, pd[1], ck, pw_bias ? 4 : 3, NULL) ||
        !timed_make(&t2, engine, pd[2], ck, 4, t1.args[2].memory))
        goto out;
    /* Fused, it pays a reorder into the channel blocks and, but before a
     * conv, one back (wk__cpu_build_conv keeps the blocks only from conv to conv);
     * neither where the convs apart chose those blocks too (nChw8c with
     * AVX2 only). */
    static const int rk[] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    if (dnnl_reorder_primitive_desc_create(
            &rpd[0], dnnl_primitive_desc_query_md(pd[1], dnnl_query_src_md, 0), engine,
            dnnl_primitive_desc_query_md(pd[0], dnnl_query_src_md, 0), engine,
            NULL) != dnnl_success ||
        dnnl_reorder_primitive_desc_create(
            &rpd[1], dnnl_primitive_desc_query_md(pd[0], dnnl_query_dst_md, 0), engine,
            dnnl_primitive_desc_query_md(pd[2], dnnl_query_dst_md, 0), engine,
            NULL) != dnnl_success ||
        !timed_make(&r_in, engine, rpd[0], rk, 2, NULL) ||
        !timed_make(&r_out, engine, rpd[1], rk, 2, NULL))
        goto out;
    /* Not where wk__cpu_build_conv keeps the blocks: a 1x1 reading a conv that
     * reads a fused one's output (mobilenet_v2's next block), and a dw
     * whose output only convs read. */
    int from = x->producer;
    bool blocked_in =
        (from >= 0 && g->steps[from].kind == WK_K_CONV &&
         (wk__cpu_written_fused(g, pw->in[0]) || wk__cpu_written_fused(g, g->steps[from].in[0]))) ||
        dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd[1], dnnl_query_src_md, 0),
                               dnnl_primitive_desc_query_md(pd[0], dnnl_query_src_md, 0));
    bool convs_read = y->n_uses > 0 && !y->is_output;
    for (int i = 0; i < g->n_steps && convs_read; i++)
        for (int k = 0; k < g->steps[i].n_in; k++)
            if (g->steps[i].in[k] == dw->out && (g->steps[i].kind != WK_K_CONV || k != 0))
                convs_read = false;
    bool blocked_out = convs_read || dnnl_memory_desc_equal(
                                         dnnl_primitive_desc_query_md(pd[0], dnnl_query_dst_md, 0),
                                         dnnl_primitive_desc_query_md(pd[2], dnnl_query_dst_md, 0));
    timed_t both[2] = {t1, t2}, fused[3] = {tf, r_in, r_out};
    int n_fused = 1 + !blocked_in;
    if (!blocked_out)
        fused[n_fused++] = r_out;
    int64_t best_f = INT64_MAX, best_a = INT64_MAX;
    for (int r = 0; r < 3; r++) { /* the first round warms up */
        int64_t a = timed_run(stream, both, 2), b = timed_run(stream, fused, n_fused);
        if (r > 0) {
            best_a = a < best_a ? a : best_a;
            best_f = b < best_f ? b : best_f;
        }
    }
    ok = (double)best_f <= DW_FUSE_GAIN * (double)best_a;
    SQ_DEBUG("cpu: 1x1 conv to %lld channels at %lldx%lld and its depthwise conv: %.2f ms "
             "apart, %.2f fused (%s%s)%s",
             (long long)y->dims[1], (long long)x->dims[2], (long long)x->dims[3],
             (double)best_a / 1e6, (double)best_f / 1e6, blocked_in ? "" : "a reorder in, ",
             blocked_out ? "none out" : "a reorder out", ok ? ": fused" : "");
out:
    timed_free(&tf, NULL);
    timed_free(&r_in, NULL);
    timed_free(&r_out, NULL);
    for (int k = 0; k < 2; k++)
        if (rpd[k] != NULL)
            dnnl_primitive_desc_destroy(rpd[k]);
    timed_free(&t1, NULL);
    timed_free(&t2, t1.args[2].memory);
    for (int k = 0; k < 3; k++) {
        if (pd[k] != NULL)
            dnnl_primitive_desc_destroy(pd[k]);
        if (po[k] != NULL)
            dnnl_post_ops_destroy(po[k]);
        if (attr[k] != NULL)
            dnnl_primitive_attr_destroy(attr[k]);
    }
    if (stream != NULL)
        dnnl_stream_destroy(stream);
    if (engine != NULL)
        dnnl_engine_destroy(engine);
    return ok;
}
