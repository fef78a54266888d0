/* The emulated backend: a device that holds each batch for exactly the
 * model's profiled l(b) and answers with deterministic outputs of the right
 * shape. It sleeps to an absolute deadline (never spins), so that many
 * emulated devices share two cores, as the papers' large-scale evaluations
 * emulated their GPUs.
 *
 * For tests and benchmarks of squishd's live profiles, an emulated device
 * can be slowed down while it runs: SQUISH_EMU_SLOWDOWN_FILE names a file
 * holding a factor (2 = every batch takes 2 l(b)), read again at most every
 * 100 ms; absent or unreadable, the factor is 1. Unset (the default, and in
 * production) it costs nothing.
 *
 * An emulated detector (opts.emu_det_slots = K > 0) answers "boxes" [K, 4]
 * and "scores" [K] per item: K boxes on a grid of square cells (each box
 * the middle 70% of its cell, so no two overlap and NMS keeps them all),
 * and a count n ~ Poisson(opts.emu_det_mean) of them, at slots drawn at
 * random, scored 0.9, the rest 0.05. The draws come from the item's input
 * hash and a counter of the plan's items, so that a stream of equal frames
 * still has the mean as its fan-out (what a pipeline's planner measures),
 * and a run is reproducible from the plan's start. */
#include "wk_exec_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float **inputs;   /* staging per input, max batch */
    uint64_t det_seq; /* detector: items drawn so far */
    int *det_order;   /* detector: scratch, a permutation of the K slots */
} emu_be_t;

static void emu_release(wk_plan_t *plan)
{
    emu_be_t *be = plan->be;
    if (be == NULL)
        return;
    for (int i = 0; i < plan->graph->n_inputs; i++)
        free(be->inputs[i]);
    free(be->inputs);
    free(be->det_order);
    free(be);
    plan->be = NULL;
}

static int emu_prepare(wk_plan_t *plan)
{
    const wk_graph_t *g = plan->graph;
    emu_be_t *be = sq_xcalloc(1, sizeof(*be));
    plan->be = be;
    be->inputs = sq_xcalloc((size_t)(g->n_inputs ? g->n_inputs : 1), sizeof(float *));
    for (int i = 0; i < g->n_inputs; i++) {
        size_t n = (size_t)wk_value_elems(&g->values[g->inputs[i]]);
        be->inputs[i] = calloc(n ? n : 1, sizeof(float));
        if (be->inputs[i] == NULL)
            return wk_fail(plan, SQ_NOMEM, "emulated input staging of %zu floats", n);
        plan->memory_bytes += n * sizeof(float);
    }
    if (plan->opts.emu_det_slots > 0)
        be->det_order = sq_xcalloc((size_t)plan->opts.emu_det_slots, sizeof(int));
    for (int b = 1; b <= g->max_batch; b++)
        if (plan->opts.emu_latency_us[b - 1] < 0)
            return wk_fail(plan, SQ_INVAL, "l(%d) is negative", b);
    return 0;
}

static float *emu_input_buffer(wk_plan_t *plan, int index)
{
    return ((emu_be_t *)plan->be)->inputs[index];
}

/* A 64-bit mix (splitmix64's finalizer). */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* SQUISH_EMU_SLOWDOWN_FILE's factor (see the top of this file). */
static double slowdown(int64_t now_ns)
{
    static _Thread_local int64_t read_ns = -1;
    static _Thread_local double factor = 1;
    const char *path = getenv("SQUISH_EMU_SLOWDOWN_FILE");
    if (path == NULL || *path == '\0')
        return 1;
    if (read_ns >= 0 && now_ns - read_ns < 100000000)
        return factor;
    read_ns = now_ns;
    factor = 1;
    FILE *f = fopen(path, "r");
    double v;
    if (f != NULL) {
        if (fscanf(f, "%lf", &v) == 1 && v > 0 && v < 1000)
            factor = v;
        fclose(f);
    }
    return factor;
}

/* A uniform double in [0, 1) from a 64-bit hash. */
static double unit(uint64_t h)
{
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* A Poisson(mean) count from the stream seeded by seed: Knuth's product of
 * uniforms up to a mean of 30, the normal approximation above (where it is
 * within a fraction of a percent). */
static int poisson_draw(double mean, uint64_t seed)
{
    if (!(mean > 0))
        return 0;
    if (mean > 30) {
        double u1 = unit(mix(seed)), u2 = unit(mix(seed + 1));
        double z = sqrt(-2 * log(u1 > 0 ? u1 : 1e-300)) * cos(6.283185307179586 * u2);
        double n = floor(mean + sqrt(mean) * z + 0.5);
        return n < 0 ? 0 : (int)n;
    }
    double limit = exp(-mean), prod = unit(mix(seed));
    int n = 0;
    for (uint64_t k = 1; prod > limit; k++) {
        n++;
        prod *= unit(mix(seed + k));
    }
    return n;
}

/* One item's detector row (see the top of this file). */
static void detections(emu_be_t *be, int slots, double mean, uint64_t h, float *boxes,
                       float *scores)
{
    uint64_t seed = mix(h ^ mix(++be->det_seq));
    int n = poisson_draw(mean, seed);
    if (n > slots)
        n = slots;
    int grid = 1;
    while (grid * grid < slots)
        grid++;
    for (int k = 0; k < slots; k++) {
        int cx = k % grid, cy = k / grid;
        boxes[4 * k + 0] = (float)((cx + 0.15) / grid);
        boxes[4 * k + 1] = (float)((cy + 0.15) / grid);
        boxes[4 * k + 2] = (float)((cx + 0.85) / grid);
        boxes[4 * k + 3] = (float)((cy + 0.85) / grid);
        scores[k] = 0.05f;
        be->det_order[k] = k;
    }
    /* n slots at random: the first n of a Fisher-Yates shuffle. */
    for (int i = 0; i < n; i++) {
        int j = i + (int)(unit(mix(seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)))) *
                          (double)(slots - i));
        int t = be->det_order[i];
        be->det_order[i] = be->det_order[j];
        be->det_order[j] = t;
        scores[be->det_order[i]] = 0.9f;
    }
}

static int emu_run(wk_plan_t *plan, int batch, float *const *outputs)
{
    const wk_graph_t *g = plan->graph;
    emu_be_t *be = plan->be;
    int64_t now = sq_now_ns();
    int64_t deadline_ns =
        now + (int64_t)((double)plan->opts.emu_latency_us[batch - 1] * 1000 * slowdown(now));
    /* Each item's outputs depend on its own input only (a hash of up to
     * 256 of its first values), so that equal images get equal answers. */
    const wk_value_t *in = g->n_inputs > 0 ? &g->values[g->inputs[0]] : NULL;
    int64_t in_per = in ? wk_value_elems_at(in, 1) : 0;
    for (int b = 0; b < batch; b++) {
        uint64_t h = 0x5157495348ull;
        for (int64_t k = 0; k < in_per && k < 256; k++) {
            uint32_t bits;
            memcpy(&bits, &be->inputs[0][b * in_per + k], sizeof(bits));
            h = mix(h ^ bits);
        }
        int slots = plan->opts.emu_det_slots;
        if (slots > 0) {
            detections(be, slots, plan->opts.emu_det_mean, h, outputs[0] + (int64_t)b * 4 * slots,
                       outputs[1] + (int64_t)b * slots);
            continue;
        }
        for (int o = 0; o < g->n_outputs; o++) {
            const wk_value_t *v = &g->values[g->outputs[o]];
            int64_t per = wk_value_elems_at(v, 1);
            float *dst = outputs[o] + b * per;
            for (int64_t j = 0; j < per; j++)
                dst[j] = (float)(mix(h + (uint64_t)j) >> 40) / (float)(1 << 24) * 8.0f - 4.0f;
        }
    }
    sq_sleep_until_ns(deadline_ns);
    return 0;
}

const wk_backend_ops_t wk_backend_emu = {
    .kind = SQ_DEV_EMU,
    .prepare = emu_prepare,
    .input_buffer = emu_input_buffer,
    .run = emu_run,
    .release = emu_release,
};
