/* libFuzzer target: ONNX import (modeldb/onnx_import.c and the graph IR
 * behind it), then what the gateway does with an imported graph: model
 * info and the prefix signature. Any byte string must give a graph or a
 * clean SQ_BAD_MODEL / SQ_UNSUPPORTED_MODEL (SQ_BAD_CONFIG for an input
 * with symbolic sizes past the batch, which need a pin), never a crash or
 * a leak.
 * Seed it with .onnx files (the libonnx-testdata node/ models are small). */
#include <mdb_graph.h>
#include <sq.h>

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    int rc = mdb_onnx_import(data, size, &g, &err);
    if (rc != 0) {
        if (rc != SQ_BAD_MODEL && rc != SQ_UNSUPPORTED_MODEL && rc != SQ_NOMEM &&
            rc != SQ_TOO_LARGE && rc != SQ_BAD_CONFIG)
            abort();
        if (g)
            abort();
        return 0;
    }
    char why[256];
    if (mdb_graph_validate(g, why, sizeof(why)) != 0)
        abort(); /* the importer built a graph that breaks its own rules */
    mdb_model_info_t info;
    mdb_model_info(g, &info, why, sizeof(why));
    mdb_node_sig_t *sigs = calloc((size_t)g->n_nodes + 1, sizeof(*sigs));
    if (sigs && mdb_graph_signature(g, sigs) == 0) {
        mdb_prefix_t p;
        mdb_prefix_match(sigs, g->n_nodes, sigs, g->n_nodes, &p);
        if (g->n_nodes > 0 && g->nodes[g->n_nodes - 1].n_outputs == 1 && !p.found &&
            sigs[g->n_nodes - 1].cut_ok)
            abort(); /* a graph always shares its last cut with itself */
    }
    free(sigs);
    mdb_graph_free(g);
    return 0;
}
