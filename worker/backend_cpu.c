/* The cpu backend on oneDNN (C API, 2.x).
 *
 * Layouts are chosen once, at max batch, by oneDNN itself (format "any" for
 * convolution, pooling, concat and the GEMM weights): activations stay in
 * the layouts the convs chose (channels last or nChw16c with AVX-512,
 * nChw8c with AVX2 only) from conv to conv, and reorders
 * happen only at the edges, where an op needs plain row-major data
 * (reshape, transpose, slice, pad, gemm, softmax, reduce) or a conv wants
 * another layout than its producer gave. Every batch size 1..max_batch gets
 * its own primitives over the same layouts (a layout whose batch is the
 * outermost dimension holds batch b in its first b items), so that one
 * arena planned at max batch serves every run.
 *
 * Two phases: phase 1 walks the steps at max batch and records the layouts
 * and the temporary buffers; the arena is then planned by liveness; phase 2
 * creates the primitives and memory objects for every batch size.
 *
 * Three layers, each calling only those below it (backend_cpu_int.h):
 * backend_cpu_buf.c (buffers and layouts), backend_cpu_ops.c (one builder
 * per kernel kind, in a table indexed by the kind) and this file (the
 * backend's vtable: the two phases, running, releasing). */
#include "backend_cpu_int.h"
#include "wk_omp.h"

#include <omp.h>

#include <sq_clock.h>

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int do_step(wk_plan_t *plan, int si, int batch)
{
    wk_kernel_t kind = plan->graph->steps[si].kind;
    if (kind >= WK_K_COUNT_ || wk__cpu_ops[kind].build == NULL)
        return wk_fail(plan, SQ_INTERNAL, "step %d: unknown kernel", si);
    return wk__cpu_ops[kind].build(plan, si, batch);
}

/* oneDNN keeps the implementations of the last 1024 primitives made (their
 * JIT code and state) in a process-wide cache, which outlives the
 * primitives: kernels a plan gave back, or a plan freed, stayed resident
 * until newer ones pushed them out (googlenet planned for 8, keeping size
 * 1: about 1 MB of the 10 that sizes 2..8 took left the process; the plan
 * freed, 13 of its 41 MB stayed). Emptying the cache gives them back; live
 * primitives keep their implementations, and the cache goes on sharing
 * one among the equal primitives made from then on (a plan's repeated
 * layers: without a cache at all twelve classifiers took 50 MB more).
 * Under a lock, since the capacity is read and put back. */
static void cache_flush(void)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    int capacity = 0;
    pthread_mutex_lock(&lock);
    if (dnnl_get_primitive_cache_capacity(&capacity) == dnnl_success && capacity > 0) {
        dnnl_set_primitive_cache_capacity(0);
        dnnl_set_primitive_cache_capacity(capacity);
    }
    pthread_mutex_unlock(&lock);
}

static void cpu_release(wk_plan_t *plan)
{
    cpu_be_t *be = plan->be;
    if (be == NULL)
        return;
    bool made = be->lists != NULL;
    int mb = plan->graph->max_batch;
    if (be->lists != NULL) {
        for (int b = 0; b <= mb; b++) {
            for (int i = 0; i < be->lists[b].n; i++) {
                if (be->lists[b].items[i].prim)
                    dnnl_primitive_destroy(be->lists[b].items[i].prim);
                free(be->lists[b].items[i].args);
            }
            free(be->lists[b].items);
        }
    }
    if (be->mems != NULL)
        for (size_t i = 0; i < (size_t)be->n_bufs * (size_t)(mb + 1); i++)
            dnnl_memory_destroy(be->mems[i]);
    if (be->out_user != NULL)
        for (size_t i = 0; i < (size_t)plan->graph->n_outputs * (size_t)(mb + 1); i++) {
            dnnl_memory_destroy(be->out_user[i]);
            dnnl_primitive_destroy(be->out_reorder[i]);
        }
    for (int i = 0; i < be->n_scratch; i++)
        dnnl_memory_destroy(be->scratch_mems[i]);
    free(be->scratch_mems);
    if (!be->shared) {
        wk__region_free(be->scratch, be->scratch_bytes);
        wk__region_free(be->arena, be->arena_bytes);
    }
    free(be->out_scratch);
    dnnl_primitive_attr_destroy(be->sp_attr);
    for (int i = 0; i < be->n_bufs; i++)
        free(be->bufs[i].own_data);
    free(be->bufs);
    for (int i = 0; be->steps != NULL && i < plan->graph->n_steps; i++)
        free(be->steps[i].wei_alt), free(be->steps[i].wino_at), free(be->steps[i].dw_alt),
            free(be->steps[i].cat_tmp), wk__cpu_sqconv_free(&be->steps[i]),
            wk__cpu_catnorm_free(&be->steps[i]);
    free(be->steps);
    free(be->lists);
    free(be->ready);
    free(be->mems);
    free(be->out_user);
    free(be->out_reorder);
    if (be->stream)
        dnnl_stream_destroy(be->stream);
    if (be->engine)
        dnnl_engine_destroy(be->engine);
    free(be);
    plan->be = NULL;
    if (made)
        cache_flush();
}

/* Constants that no primitive reads any more (weights reordered into
 * oneDNN's layout live in own_data) give their bytes back; those still read
 * count in the plan's memory. */
static void release_unused_constants(wk_plan_t *plan)
{
    cpu_be_t *be = plan->be;
    wk_graph_t *g = plan->graph;
    int mb = g->max_batch;
    bool *used = sq_xcalloc((size_t)g->n_values + 1, sizeof(bool));
    /* The C kernels read their source by pointer, without a memory object
     * (Expand's source is a constant: ViT's class token). */
    bool *c_src = sq_xcalloc((size_t)be->n_bufs + 1, sizeof(bool));
    for (int si = 0; si < g->n_steps; si++)
        if (g->steps[si].kind < WK_K_COUNT_ && wk__cpu_ops[g->steps[si].kind].run_c != NULL &&
            be->steps[si].bias >= 0)
            c_src[be->steps[si].bias] = true;
    for (int b = 0; b < be->n_bufs; b++) {
        bool has_mem = c_src[b] || be->bufs[b].lazy_ref;
        for (int k = 0; k <= mb && !has_mem; k++)
            has_mem = be->mems[(size_t)b * (size_t)(mb + 1) + (size_t)k] != NULL;
        if (!has_mem)
            continue;
        int r = wk__cpu_root_buf(be, b);
        if (r < g->n_values)
            used[r] = true;
        for (int v = 0; v < g->n_values; v++)
            if (be->bufs[r].data != NULL && be->bufs[r].data == g->values[v].data)
                used[v] = true;
    }
    for (int v = 0; v < g->n_values; v++) {
        wk_value_t *val = &g->values[v];
        if (val->data == NULL)
            continue;
        if (used[v]) {
            plan->memory_bytes += (uint64_t)wk_value_elems(val) * sizeof(float);
            continue;
        }
        free(val->data);
        val->data = NULL;
        be->bufs[v].data = NULL;
    }
    free(c_src);
    free(used);
}

/* Batch size b's kernels and memory objects, in step order, then the
 * reorders of its outputs into the caller's buffers; a dry pass (be->dry)
 * only sizes the scratchpad for them. */
static int make_size(wk_plan_t *plan, int b)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0, mb = g->max_batch;
    dnnl_primitive_desc_t pd = NULL;
    for (int si = 0; si < g->n_steps; si++)
        if ((rc = do_step(plan, si, b)) != 0)
            return rc;
    for (int o = 0; o < g->n_outputs; o++) {
        const wk_value_t *v = &g->values[g->outputs[o]];
        int64_t dims[WK_MAX_DIMS];
        wk_value_dims_at(v, b, dims);
        int out_buf = wk__cpu_vbuf(g->outputs[o]);
        dnnl_memory_desc_t umd, smd = wk__cpu_md_at(&be->bufs[out_buf], b);
        wk__cpu_plain_md(&umd, v->ndim, dims);
        size_t k = (size_t)o * (size_t)(mb + 1) + (size_t)b;
        DN(dnnl_reorder_primitive_desc_create(&pd, &smd, be->engine, &umd, be->engine,
                                              be->sp_attr));
        dnnl_status_t st = dnnl_success;
        if (be->dry) {
            wk__cpu_scratch_grow(be, pd);
        } else {
            st = dnnl_memory_create(&be->out_user[k], &umd, be->engine, DNNL_MEMORY_NONE);
            if (st == dnnl_success)
                st = dnnl_primitive_create(&be->out_reorder[k], pd);
            if (st == dnnl_success)
                st = wk__cpu_scratch_of(be, pd, &be->out_scratch[k]);
        }
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
        DN(st);
        if (!be->dry && wk__cpu_mem_of(plan, out_buf, b) == NULL) {
            rc = wk_fail(plan, SQ_NOMEM, "output memory object");
            goto out;
        }
    }
out:
    if (pd != NULL)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* Gives back batch size b's kernels, memory objects and output reorders
 * (its scratchpad objects stay in scratch_mems, freed with the plan). */
static void drop_size(wk_plan_t *plan, int b)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int mb = g->max_batch;
    cpu_list_t *l = &be->lists[b];
    for (int i = 0; i < l->n; i++) {
        if (l->items[i].prim)
            dnnl_primitive_destroy(l->items[i].prim);
        free(l->items[i].args);
    }
    free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
    for (int id = 0; id < be->n_bufs; id++) {
        dnnl_memory_t *m = &be->mems[(size_t)id * (size_t)(mb + 1) + (size_t)b];
        dnnl_memory_destroy(*m);
        *m = NULL;
    }
    for (int o = 0; o < g->n_outputs; o++) {
        size_t k = (size_t)o * (size_t)(mb + 1) + (size_t)b;
        dnnl_memory_destroy(be->out_user[k]);
        dnnl_primitive_destroy(be->out_reorder[k]);
        be->out_user[k] = NULL;
        be->out_reorder[k] = NULL;
        be->out_scratch[k] = NULL;
    }
    be->ready[b] = false;
}

/* Makes batch size b's kernels at its first run (late: the scratchpad and
 * the arena are the plan's already). A size that fails keeps no items. */
static int ready_size(wk_plan_t *plan, int b)
{
    cpu_be_t *be = plan->be;
    if (be->ready[b])
        return 0;
    int64_t t0 = sq_now_ns();
    be->late = true;
    int rc = make_size(plan, b);
    be->late = false;
    if (rc != 0) {
        drop_size(plan, b);
        return rc;
    }
    be->ready[b] = true;
    SQ_DEBUG("cpu plan: batch size %d made at its first run in %.1f ms", b,
             (double)(sq_now_ns() - t0) / 1e6);
    return 0;
}

static void cpu_keep_sizes(wk_plan_t *plan, int upto)
{
    cpu_be_t *be = plan->be;
    int first = plan->min_batch > 1 ? plan->min_batch : 1, dropped = 0;
    for (int b = upto + 1; be->ready != NULL && b <= plan->graph->max_batch; b++)
        if (b != first && be->ready[b]) {
            drop_size(plan, b);
            dropped++;
        }
    if (dropped > 0)
        cache_flush();
}

static int cpu_sizes_ready(const wk_plan_t *plan)
{
    const cpu_be_t *be = plan->be;
    int n = 0;
    for (int b = 1; be->ready != NULL && b <= plan->graph->max_batch; b++)
        n += be->ready[b];
    return n;
}

static int cpu_prepare(wk_plan_t *plan)
{
    wk_graph_t *g = plan->graph;
    int rc = 0, mb = g->max_batch;
    cpu_be_t *be = sq_xcalloc(1, sizeof(*be));
    plan->be = be;
    if (plan->opts.threads > 0)
        omp_set_num_threads(plan->opts.threads);
    DN(dnnl_engine_create(&be->engine, dnnl_cpu, 0));
    DN(dnnl_stream_create(&be->stream, be->engine, dnnl_stream_default_flags));
    DN(dnnl_primitive_attr_create(&be->sp_attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(be->sp_attr, dnnl_scratchpad_mode_user));
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        int first = v->is_input ? 0 : v->producer;
        int last = v->last_use > first ? v->last_use : first;
        int id = wk__cpu_add_buf(be, NULL, v->batched, first, last);
        if (v->data != NULL || v->producer == -2 || (!v->is_input && v->producer < 0)) {
            be->bufs[id].first = be->bufs[id].last = -2;
            be->bufs[id].data = v->data;
        }
        if (v->data != NULL || v->is_input) {
            dnnl_memory_desc_t md;
            wk__cpu_plain_md(&md, v->ndim, v->dims);
            be->bufs[id].md = md;
            be->bufs[id].decided = true;
        }
    }
    be->steps = sq_xcalloc((size_t)(g->n_steps ? g->n_steps : 1), sizeof(*be->steps));
    for (int i = 0; i < g->n_steps; i++) {
        cpu_step_t *cs = &be->steps[i];
        cs->tmp_src = cs->weights = cs->bias = cs->extra = cs->dw_wei = cs->dw_bias = -1;
        for (int k = 0; k < 4; k++)
            cs->tmp_in[k] = -1;
    }
    be->phase = 1;
    for (int si = 0; si < g->n_steps; si++)
        if ((rc = do_step(plan, si, mb)) != 0)
            goto out;

    /* The arena, by liveness. */
    {
        wk_buf_req_t *reqs = sq_xcalloc((size_t)be->n_bufs, sizeof(*reqs));
        size_t *offs = sq_xcalloc((size_t)be->n_bufs, sizeof(*offs));
        int *ids = sq_xcalloc((size_t)be->n_bufs, sizeof(int));
        int n = 0;
        for (int i = 0; i < be->n_bufs; i++) {
            cpu_buf_t *b = &be->bufs[i];
            if (b->first == -2 || b->alias >= 0)
                continue;
            if (!b->decided) {
                free(reqs);
                free(offs);
                free(ids);
                rc = wk_fail(plan, SQ_INTERNAL, "buffer %d has no layout", i);
                goto out;
            }
            reqs[n] = (wk_buf_req_t){dnnl_memory_desc_get_size(&b->md), b->first, b->last};
            ids[n++] = i;
        }
        be->arena_bytes = wk_arena_plan(reqs, n, ARENA_ALIGN, offs);
        for (int k = 0; k < n; k++)
            be->bufs[ids[k]].offset = offs[k];
        free(reqs);
        free(offs);
        free(ids);
        /* Mapped zero pages, resident as runs touch them: the batch
         * sizes that run hold what they use of an arena planned at max
         * batch (the batch is the outermost dimension of every buffer). */
        be->arena_bytes += ARENA_ALIGN;
        be->arena = wk__region_alloc(be->arena_bytes);
        if (be->arena == NULL) {
            rc = wk_fail(plan, SQ_NOMEM, "arena of %zu bytes", be->arena_bytes);
            goto out;
        }
    }
    plan->memory_bytes = 0;
    for (int i = 0; i < be->n_bufs; i++)
        if (be->bufs[i].own_data)
            plan->memory_bytes += dnnl_memory_desc_get_size(&be->bufs[i].md);

    be->phase = 2;
    be->lists = sq_xcalloc((size_t)mb + 1, sizeof(*be->lists));
    be->mems = sq_xcalloc((size_t)be->n_bufs * (size_t)(mb + 1), sizeof(dnnl_memory_t));
    be->out_user = sq_xcalloc((size_t)g->n_outputs * (size_t)(mb + 1), sizeof(dnnl_memory_t));
    be->out_reorder = sq_xcalloc((size_t)g->n_outputs * (size_t)(mb + 1), sizeof(dnnl_primitive_t));
    be->out_scratch = sq_xcalloc((size_t)g->n_outputs * (size_t)(mb + 1), sizeof(dnnl_memory_t));
    be->ready = sq_xcalloc((size_t)mb + 1, sizeof(bool));
    int first = plan->min_batch > 1 ? plan->min_batch : 1;
    int upto = plan->opts.ready_batch > 0 ? plan->opts.ready_batch : mb;
    for (int b = first; b <= mb; b++) {
        be->dry = b > first && b > upto;
        if ((rc = make_size(plan, b)) != 0)
            goto out;
        be->ready[b] = !be->dry;
    }
    be->dry = false;
    if (be->scratch_bytes > 0) {
        be->scratch_bytes = (be->scratch_bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        if ((be->scratch = wk__region_alloc(be->scratch_bytes)) == NULL) {
            rc = wk_fail(plan, SQ_NOMEM, "scratchpad of %zu bytes", be->scratch_bytes);
            goto out;
        }
        for (int i = 0; i < be->n_scratch; i++)
            DN(dnnl_memory_set_data_handle_v2(be->scratch_mems[i], be->scratch, be->stream));
    }
    release_unused_constants(plan);
out:
    if (rc != 0)
        cpu_release(plan);
    return rc;
}

static float *cpu_input_buffer(wk_plan_t *plan, int index)
{
    return wk__cpu_buf_ptr(plan->be, wk__cpu_vbuf(plan->graph->inputs[index]));
}

/* ---- How the pool's threads run a graph -----------------------------------
 *
 * The worker's OpenMP pool (omp_pool.c) runs a graph's regions one of three
 * ways: its threads wait for the next region spinning, or sleep at once,
 * or the leading thread runs every region alone, its team's shares one
 * after the other. Which is fastest depends on the machine and the moment,
 * so each batch size measures them: on a quiet machine spinning ran
 * mobilenet_v3_large at batch 1 in 3.1-3.4 ms a run against 4.6 sleeping
 * (each of its ~85 regions wakes the other thread); beside one busy
 * process sleeping ran it in 6-9 ms and spinning in 12-16 (the spinner
 * holds the core its descheduled partner could have moved to), and a team
 * waits at each region for the share of the thread a neighbour holds off
 * its core, where the leader alone runs on the free core at one thread's
 * speed (bench/RESULTS.md, "A neighbour on a core"). Runs take the ways in turn
 * until each has WAY_MIN; then each run takes the way whose last runs'
 * median is lowest, and every WAY_LOOK-th run one of the others in turn,
 * so that a change of the machine is seen (wk__cpu_way_note). */
#define WAY_MIN 3
#define WAY_LOOK 16

static int64_t way_median(const cpu_ways_t *s, int way)
{
    int n = s->n[way] < WAY_RING ? (int)s->n[way] : WAY_RING;
    int64_t v[WAY_RING];
    for (int i = 0; i < n; i++) {
        int64_t x = s->ns[way][i];
        int k = i;
        for (; k > 0 && v[k - 1] > x; k--)
            v[k] = v[k - 1];
        v[k] = x;
    }
    return v[n / 2];
}

/* SQUISH_CPU_WAY=sleep, spin or alone runs every graph that way (for
 * benchmarks that compare them); unset or anything else, each batch size
 * measures and picks. */
static int forced_way(void)
{
    static _Atomic int forced = -2;
    int way = atomic_load_explicit(&forced, memory_order_relaxed);
    if (way == -2) {
        const char *e = getenv("SQUISH_CPU_WAY");
        way = e == NULL                 ? -1
              : strcmp(e, "sleep") == 0 ? WAY_SLEEP
              : strcmp(e, "spin") == 0  ? WAY_SPIN
              : strcmp(e, "alone") == 0 ? WAY_ALONE
                                        : -1;
        atomic_store_explicit(&forced, way, memory_order_relaxed);
    }
    return way;
}

int wk__cpu_way_pick(cpu_ways_t *s)
{
    int forced = forced_way();
    if (omp_get_max_threads() <= 1)
        return WAY_SLEEP;
    if (forced >= 0)
        return forced;
    int ways[N_WAYS], k = 0;
    ways[k++] = WAY_SLEEP;
    if (wk_omp_spins())
        ways[k++] = WAY_SPIN;
    ways[k++] = WAY_ALONE;
    unsigned r = s->runs++;
    int least = ways[0], best = ways[0];
    for (int i = 1; i < k; i++) {
        if (s->n[ways[i]] < s->n[least])
            least = ways[i];
    }
    if (s->n[least] < WAY_MIN)
        return least;
    if (s->confirm > 0)
        return s->confirm - 1;
    for (int i = 1; i < k; i++) {
        if (way_median(s, ways[i]) < way_median(s, best))
            best = ways[i];
    }
    if (r % WAY_LOOK != 0)
        return best;
    /* a look at another way: the others in turn */
    int other = (int)((r / WAY_LOOK) % (unsigned)(k - 1));
    for (int i = 0; i < k; i++) {
        if (ways[i] != best && other-- == 0)
            return ways[i];
    }
    return best;
}

/* A look faster than every other way's median is run again at once, and
 * two such runs in a row are believed: a neighbour, an interrupt or a page
 * fault only ever slow a run down, so a way that was slow while the
 * machine was busy and is fast now (the neighbour left) takes over within
 * two runs, not after WAY_RING / 2. One fast run alone is not believed: on
 * a guest whose host ran other guests, the threads sleeping had single
 * runs as fast as spinning (the other vCPU awake by chance) and, believed,
 * took over for 40 runs at 1.5 times spinning's time (mnasnet0_5 at batch
 * 1, bench/RESULTS.md). */
void wk__cpu_way_note(cpu_ways_t *s, int way, int64_t ns)
{
    bool fastest = s->n[way] > 0;
    for (int w = 0; w < N_WAYS && fastest; w++) {
        if (w != way && s->n[w] > 0 && way_median(s, w) <= ns)
            fastest = false;
    }
    bool confirming = s->confirm == way + 1;
    s->confirm = 0;
    if (fastest && s->n[way] >= WAY_MIN && way_median(s, way) > ns) {
        if (confirming) {
            for (int i = 0; i < WAY_RING; i++)
                s->ns[way][i] = ns;
            if (s->n[way] < WAY_RING)
                s->n[way] = WAY_RING;
            return;
        }
        s->confirm = way + 1;
    }
    s->ns[way][s->n[way] % WAY_RING] = ns;
    s->n[way]++;
}

static int cpu_run(wk_plan_t *plan, int batch, float *const *outputs)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0, mb = g->max_batch;
    if (plan->opts.threads > 0)
        omp_set_num_threads(plan->opts.threads);
    if ((rc = ready_size(plan, batch)) != 0)
        return rc;
    cpu_list_t *l = &be->lists[batch];
    if (batch > be->ran_batch)
        be->ran_batch = batch;
    int way = wk__cpu_way_pick(&l->ways);
    int64_t t0 = sq_now_ns();
    wk_omp_hot(way == WAY_SPIN);
    wk_omp_alone(way == WAY_ALONE);
    for (int i = 0; i < l->n; i++) {
        const cpu_item_t *it = &l->items[i];
        if (it->prim != NULL) {
            DN(dnnl_primitive_execute(it->prim, be->stream, it->n_args, it->args));
            continue;
        }
        /* C kernels read plain memory written by the primitives before. */
        DN(dnnl_stream_wait(be->stream));
        const wk_step_t *s = &g->steps[it->step];
        if (be->steps[it->step].sqc != NULL) {
            wk__cpu_run_sqconv(be, s, &be->steps[it->step], batch);
            continue;
        }
        if (be->steps[it->step].catn != NULL) {
            wk__cpu_run_catnorm(be, s, &be->steps[it->step], batch);
            continue;
        }
        const float *src = wk__cpu_buf_ptr(be, be->steps[it->step].bias);
        float *dst = wk__cpu_buf_ptr(be, wk__cpu_vbuf(s->out));
        wk__cpu_ops[s->kind].run_c(s, &g->values[s->in[0]], &g->values[s->out], batch, src, dst);
    }
    for (int o = 0; o < g->n_outputs; o++) {
        size_t k = (size_t)o * (size_t)(mb + 1) + (size_t)batch;
        DN(dnnl_memory_set_data_handle_v2(be->out_user[k], outputs[o], be->stream));
        dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_FROM, wk__cpu_mem_of(plan, wk__cpu_vbuf(g->outputs[o]), batch)},
            {DNNL_ARG_TO, be->out_user[k]},
            {DNNL_ARG_SCRATCHPAD, be->out_scratch[k]}};
        DN(dnnl_primitive_execute(be->out_reorder[k], be->stream, be->out_scratch[k] ? 3 : 2,
                                  args));
    }
    DN(dnnl_stream_wait(be->stream));
out:
    wk_omp_hot(false);
    wk_omp_alone(false);
    if (rc == 0)
        wk__cpu_way_note(&l->ways, way, sq_now_ns() - t0);
    return rc;
}

/* Points every memory object over input `index`'s bytes (the input and its
 * views) at ptr for runs at `batch`, or back at the arena. The C kernels
 * address the arena directly, so a plan where one reads the input at this
 * batch copies instead. */
static int cpu_bind_input(wk_plan_t *plan, int index, int batch, const float *ptr)
{
    cpu_be_t *be = plan->be;
    int mb = plan->graph->max_batch, rc = 0;
    if ((rc = ready_size(plan, batch)) != 0)
        return rc;
    const cpu_list_t *l = &be->lists[batch];
    int root = wk__cpu_vbuf(plan->graph->inputs[index]);
    for (int i = 0; i < l->n; i++) {
        if (l->items[i].prim != NULL)
            continue;
        /* what the C kernel reads: a conv of backend_cpu_sqconv.c its
         * input, a concat its inputs, the others their plain source */
        int si = l->items[i].step;
        const cpu_step_t *cs = &be->steps[si];
        const wk_step_t *s = &plan->graph->steps[si];
        int n_src = cs->catn != NULL ? s->n_in : 1;
        for (int k = 0; k < n_src; k++) {
            int src = cs->catn != NULL  ? wk__cpu_concat_src(cs, s, k)
                      : cs->sqc != NULL ? wk__cpu_vbuf(s->in[0])
                                        : cs->bias;
            if (src < 0 || wk__cpu_root_buf(be, src) == root)
                return SQ_UNSUPPORTED_MODEL;
        }
    }
    for (int id = 0; id < be->n_bufs; id++) {
        dnnl_memory_t m = be->mems[(size_t)id * (size_t)(mb + 1) + (size_t)batch];
        if (m == NULL || wk__cpu_root_buf(be, id) != root)
            continue;
        void *h = ptr != NULL ? (void *)ptr : wk__cpu_buf_ptr(be, id);
        DN(dnnl_memory_set_data_handle_v2(m, h, be->stream));
    }
out:
    return rc;
}

static size_t cpu_arena_need(const wk_plan_t *plan, size_t *scratch_bytes)
{
    const cpu_be_t *be = plan->be;
    *scratch_bytes = be->scratch_bytes;
    return be->arena_bytes;
}

/* Every memory object over the arena (lazily made, per batch size) and
 * every scratchpad object moves to the new bytes; the C kernels find the
 * arena through be->arena at each run. */
static int cpu_arena_use(wk_plan_t *plan, char *act, void *scratch)
{
    cpu_be_t *be = plan->be;
    int mb = plan->graph->max_batch, rc = 0;
    if (!be->shared) {
        wk__region_free(be->arena, be->arena_bytes);
        wk__region_free(be->scratch, be->scratch_bytes);
    }
    be->shared = true;
    be->arena = act;
    be->scratch = be->scratch_bytes > 0 ? scratch : NULL;
    for (int id = 0; id < be->n_bufs; id++) {
        for (int b = 0; b <= mb; b++) {
            dnnl_memory_t m = be->mems[(size_t)id * (size_t)(mb + 1) + (size_t)b];
            if (m != NULL)
                DN(dnnl_memory_set_data_handle_v2(m, wk__cpu_buf_ptr(be, id), be->stream));
        }
    }
    for (int i = 0; i < be->n_scratch && be->scratch != NULL; i++)
        DN(dnnl_memory_set_data_handle_v2(be->scratch_mems[i], be->scratch, be->stream));
out:
    return rc;
}

typedef struct {
    size_t from, to;
} span_t;

static int span_cmp(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return x->from < y->from ? -1 : x->from > y->from;
}

/* In its own arena, the plan holds every resident page. In a shared one,
 * the pages of its extent that other plans' runs touched are not its: it
 * counts the resident pages of the bytes its own runs use, each buffer's
 * first ran_batch items (page-rounded spans, merged so that a page counts
 * once). The scratchpad counts whole (shared: an upper bound). */
static uint64_t cpu_resident(const wk_plan_t *plan)
{
    const cpu_be_t *be = plan->be;
    uint64_t scratch = wk__region_resident(be->scratch, 0, be->scratch_bytes);
    if (!be->shared)
        return wk__region_resident(be->arena, 0, be->arena_bytes) + scratch;
    if (be->ran_batch == 0)
        return 0;
    size_t pg = wk__page_bytes();
    span_t *s = sq_xmalloc((size_t)(be->n_bufs + 1) * sizeof(*s));
    int n = 0;
    for (int i = 0; i < be->n_bufs; i++) {
        const cpu_buf_t *b = &be->bufs[i];
        if (b->first == -2 || b->alias >= 0)
            continue;
        dnnl_memory_desc_t md = wk__cpu_md_at(b, be->ran_batch);
        size_t to = b->offset + dnnl_memory_desc_get_size(&md);
        s[n++] = (span_t){b->offset / pg * pg, (to + pg - 1) / pg * pg};
    }
    qsort(s, (size_t)n, sizeof(*s), span_cmp);
    uint64_t bytes = scratch;
    for (int i = 0; i < n;) {
        span_t m = s[i++];
        while (i < n && s[i].from <= m.to) {
            m.to = s[i].to > m.to ? s[i].to : m.to;
            i++;
        }
        bytes += wk__region_resident(be->arena, m.from, m.to);
    }
    free(s);
    return bytes;
}

/* conv_add_after_act false: oneDNN 2.6's jit convs take a sum post-op
 * first only; conv, swish, + x (YOLO's C2f) ran its reference kernel, 0.9
 * ms for an 8-channel 16x16 conv. */
const wk_backend_ops_t wk_backend_cpu = {
    .kind = SQ_DEV_CPU,
    .prepare = cpu_prepare,
    .input_buffer = cpu_input_buffer,
    .run = cpu_run,
    .release = cpu_release,
    .bind_input = cpu_bind_input,
    .split_batch = wk__cpu_split_batch,
    .conv_dw = wk__cpu_conv_dw,
    .norm_act = wk__cpu_norm_act,
    .sizes_ready = cpu_sizes_ready,
    .keep_sizes = cpu_keep_sizes,
    .arena_need = cpu_arena_need,
    .arena_use = cpu_arena_use,
    .resident = cpu_resident,
};
