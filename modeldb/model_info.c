/* What serving needs of an imported graph (mdb_graph.h): whether it is an
 * image model squish serves (one NCHW input, 1 to 8 outputs, no batch
 * fixed above 1), its input and outputs, parameters and ops, and per device
 * kind whether that backend would run it. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include <string.h>

int mdb_model_info(const mdb_graph_t *g, mdb_model_info_t *info, char *err, size_t errlen)
{
    memset(info, 0, sizeof(*info));
    if (g->n_inputs != 1) {
        mdb_errf(err, errlen, "an image model has exactly one input (this one has %d)",
                 g->n_inputs);
        return SQ_UNSUPPORTED_MODEL;
    }
    const mdb_tensor_t *in = &g->tensors[g->inputs[0]];
    if (in->shape.rank != 4 || (in->dtype != MDB_DT_FLOAT && in->dtype != MDB_DT_UINT8)) {
        mdb_errf(err, errlen, "input '%s' is not an NCHW float or uint8 image", in->name);
        return SQ_UNSUPPORTED_MODEL;
    }
    for (int d = 1; d < 4; d++)
        if (in->shape.dims[d] <= 0) {
            mdb_errf(err, errlen, "input '%s' has an empty or symbolic dimension %d", in->name, d);
            return SQ_UNSUPPORTED_MODEL;
        }
    /* squish gives a model one image per item and batches items; a file
     * whose shapes hold for a batch of N > 1 only (its outputs need not
     * even be per image: a Transpose may move the batch) has no per-item
     * rows to answer with. Batch 1 is served (one item per run). */
    if (g->batch_fixed > 1) {
        mdb_errf(err, errlen,
                 "the file fixes its batch at %lld (its shapes hold for that batch only); "
                 "export it with a dynamic batch or batch 1",
                 (long long)g->batch_fixed);
        return SQ_UNSUPPORTED_MODEL;
    }
    if (g->n_outputs < 1 || g->n_outputs > 8) {
        mdb_errf(err, errlen, "the model has %d outputs (1 to 8 supported)", g->n_outputs);
        return SQ_UNSUPPORTED_MODEL;
    }
    info->input_name = in->name;
    info->input_dtype = in->dtype;
    info->input_shape = in->shape;
    info->layout = "NCHW";
    info->n_outputs = g->n_outputs;
    for (int i = 0; i < g->n_outputs; i++) {
        info->output_names[i] = g->tensors[g->outputs[i]].name;
        info->output_shapes[i] = g->tensors[g->outputs[i]].shape;
    }
    info->param_bytes = mdb_graph_param_bytes(g);
    mdb_graph_op_histogram(g, info->op_hist);
    /* Per device kind, what its backend would say when it loads the model
     * (the op table's rules for it): the planner need not place the model
     * where it would be refused. emu workers run emulated models only. */
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        info->runs_on[k] = false;
        info->not_on[k][0] = '\0';
        if (k == SQ_DEV_EMU)
            mdb_errf(info->not_on[k], sizeof(info->not_on[k]), "emu runs emulated models only");
        else
            info->runs_on[k] =
                mdb_graph_runnable_on(g, (sq_dev_kind_t)k,
                                      g->batch_fixed > 0 || !mdb_graph_batch_outermost(g), NULL,
                                      info->not_on[k], sizeof(info->not_on[k])) == 0;
    }
    return 0;
}
