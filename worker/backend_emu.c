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
 * production) it costs nothing. */
#include "wk_exec_int.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float **inputs; /* staging per input, max batch */
} emu_be_t;

static void emu_release(wk_plan_t *plan)
{
    emu_be_t *be = plan->be;
    if (be == NULL)
        return;
    for (int i = 0; i < plan->graph->n_inputs; i++)
        free(be->inputs[i]);
    free(be->inputs);
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
    .name = "emu",
    .prepare = emu_prepare,
    .input_buffer = emu_input_buffer,
    .run = emu_run,
    .release = emu_release,
};
