/* Shared-prefix detection on the exported torchvision models and on
 * rewritten copies of them. */
#include "onnx_util.h"

#include <criterion/criterion.h>
#include <mdb_graph.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mdb_node_sig_t *sign(const mdb_graph_t *g)
{
    mdb_node_sig_t *s = calloc((size_t)g->n_nodes + 1, sizeof(*s));
    cr_assert_eq(mdb_graph_signature(g, s), 0);
    return s;
}

Test(prefix, finetuned_variants_share_everything_but_the_classifier)
{
    mdb_graph_t *a = import_model("resnet18_ft_a");
    mdb_graph_t *b = import_model("resnet18_ft_b");
    mdb_prefix_t p;
    cr_assert_eq(mdb_prefix_find(a, b, &p), 0);
    cr_assert(p.found);
    cr_assert_eq(a->nodes[a->n_nodes - 1].op, MDB_OP_GEMM);
    /* Everything but the final Gemm; the cut is its input, [N,512]. */
    cr_assert_eq(p.prefix_nodes, (uint32_t)a->n_nodes - 1);
    cr_assert_eq(p.node_a, a->n_nodes - 2);
    cr_assert_eq(p.node_b, b->n_nodes - 2);
    cr_assert_eq(p.tensor_a, a->nodes[a->n_nodes - 1].inputs[0]);
    cr_assert_eq(p.tensor_b, b->nodes[b->n_nodes - 1].inputs[0]);
    mdb_shape_t cut = {.rank = 2, .dims = {MDB_DIM_BATCH, 512}};
    cr_assert(mdb_shape_eq(&a->tensors[p.tensor_a].shape, &cut));
    /* The prefix hash names the cut node in both graphs. */
    mdb_node_sig_t *sa = sign(a), *sb = sign(b);
    cr_assert_eq(memcmp(&p.prefix_hash, &sa[p.node_a].hash, MDB_HASH_LEN), 0);
    cr_assert_eq(memcmp(&p.prefix_hash, &sb[p.node_b].hash, MDB_HASH_LEN), 0);
    /* ... and the classifiers differ. */
    cr_assert_neq(memcmp(&sa[a->n_nodes - 1].hash, &sb[b->n_nodes - 1].hash, MDB_HASH_LEN), 0);
    /* Matching stored signatures gives the same answer as the graphs. */
    mdb_prefix_t q;
    mdb_prefix_match(sa, a->n_nodes, sb, b->n_nodes, &q);
    cr_assert(q.found);
    cr_assert_eq(q.node_a, p.node_a);
    cr_assert_eq(q.prefix_nodes, p.prefix_nodes);
    free(sa);
    free(sb);
    mdb_graph_free(a);
    mdb_graph_free(b);
}

Test(prefix, unrelated_models_share_nothing)
{
    mdb_graph_t *a = import_model("resnet18");
    mdb_graph_t *b = import_model("mobilenet_v2");
    mdb_prefix_t p;
    cr_assert_eq(mdb_prefix_find(a, b, &p), 0);
    cr_assert_not(p.found);
    cr_assert_eq(p.node_a, -1);
    cr_assert_eq(p.tensor_b, -1);
    cr_assert_eq(p.prefix_nodes, 0);
    mdb_graph_free(a);
    mdb_graph_free(b);
}

Test(prefix, a_model_shares_all_of_itself)
{
    mdb_graph_t *a = import_model("squeezenet1_1");
    mdb_graph_t *b = import_model("squeezenet1_1");
    mdb_prefix_t p;
    cr_assert_eq(mdb_prefix_find(a, b, &p), 0);
    cr_assert(p.found);
    /* Everything but its last node: a graph output is never a cut (a group
     * cut there would leave its members nothing to run; twins share one
     * load instead). */
    cr_assert_eq(p.prefix_nodes, (uint32_t)a->n_nodes - 1);
    cr_assert_neq(p.tensor_a, a->outputs[0]);
    mdb_graph_free(a);
    mdb_graph_free(b);
}

Test(prefix, cut_points_respect_skip_connections)
{
    mdb_graph_t *g = import_model("resnet18");
    mdb_node_sig_t *s = sign(g);
    int cuts = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (!s[i].cut_ok) {
            cr_assert_eq(s[i].ancestors, 0);
            continue;
        }
        cuts++;
        cr_assert_eq(s[i].ancestors, (uint32_t)i + 1);
        /* A cut never sits inside a residual block: the node right before
         * an Add's first input is read again by the Add (or is the Add). */
        for (int j = i + 1; j < g->n_nodes; j++)
            for (int k = 0; k < g->nodes[j].n_inputs; k++) {
                int t = g->nodes[j].inputs[k];
                if (t < 0 || g->tensors[t].data)
                    continue;
                int prod = g->tensors[t].producer;
                cr_assert(prod == i || prod > i, "node %d reads node %d across cut %d", j, prod, i);
            }
    }
    /* Stem conv, relu, maxpool, each block output (8), then the head. */
    cr_assert_geq(cuts, 10);
    cr_assert_lt(cuts, g->n_nodes);
    /* The first conv of a residual block is not a cut: the shortcut reads
     * the block input after it. */
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == MDB_OP_ADD)
            cr_assert_not(s[i - 1].cut_ok, "node before Add %d is a cut", i);
    free(s);
    mdb_graph_free(g);
}

/* Rewrites a model: every tensor and node renamed, initializers reversed,
 * and independent nodes reordered by reversing the node list (import sorts
 * them again). */
static uint8_t *rewrite(const uint8_t *bytes, size_t len, size_t *out_len)
{
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, bytes);
    cr_assert_not_null(m);
    Onnx__GraphProto *g = m->graph;
    /* Every name but the graph's input and output gets a new spelling. */
#define RENAME(ptr)                                                                                \
    do {                                                                                           \
        if ((ptr) && *(ptr) && strcmp((ptr), "input") != 0 && strcmp((ptr), "output") != 0) {      \
            char *nn = malloc(strlen(ptr) + 16);                                                   \
            sprintf(nn, "zz_%s_renamed", (ptr));                                                   \
            free(ptr);                                                                             \
            (ptr) = nn;                                                                            \
        }                                                                                          \
    } while (0)
    for (size_t i = 0; i < g->n_initializer; i++)
        RENAME(g->initializer[i]->name);
    for (size_t i = 0; i < g->n_input; i++)
        RENAME(g->input[i]->name);
    for (size_t i = 0; i < g->n_node; i++) {
        for (size_t k = 0; k < g->node[i]->n_input; k++)
            RENAME(g->node[i]->input[k]);
        for (size_t k = 0; k < g->node[i]->n_output; k++)
            RENAME(g->node[i]->output[k]);
        RENAME(g->node[i]->name);
    }
#undef RENAME
    for (size_t i = 0; i < g->n_initializer / 2; i++) {
        Onnx__TensorProto *t = g->initializer[i];
        g->initializer[i] = g->initializer[g->n_initializer - 1 - i];
        g->initializer[g->n_initializer - 1 - i] = t;
    }
    for (size_t i = 0; i < g->n_node / 2; i++) {
        Onnx__NodeProto *t = g->node[i];
        g->node[i] = g->node[g->n_node - 1 - i];
        g->node[g->n_node - 1 - i] = t;
    }
    *out_len = onnx__model_proto__get_packed_size(m);
    uint8_t *buf = malloc(*out_len);
    onnx__model_proto__pack(m, buf);
    onnx__model_proto__free_unpacked(m, NULL);
    return buf;
}

Test(prefix, renamed_tensors_and_reordered_initializers_hash_the_same)
{
    size_t len, len2;
    uint8_t *bytes = read_model("shufflenet_v2_x1_0", &len);
    uint8_t *bytes2 = rewrite(bytes, len, &len2);
    cr_assert(len2 != len || memcmp(bytes, bytes2, len) != 0);
    mdb_graph_t *a = NULL, *b = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &a, &err), 0, "%s", err.detail);
    cr_assert_eq(mdb_onnx_import(bytes2, len2, &b, &err), 0, "%s", err.detail);
    cr_assert_eq(a->n_nodes, b->n_nodes);
    mdb_node_sig_t *sa = sign(a), *sb = sign(b);
    /* Node order may differ between the two sorts; the multiset of hashes
     * and the final node must not. */
    int matched = 0;
    for (int i = 0; i < a->n_nodes; i++)
        for (int j = 0; j < b->n_nodes; j++)
            if (memcmp(&sa[i].hash, &sb[j].hash, MDB_HASH_LEN) == 0) {
                matched++;
                break;
            }
    cr_assert_eq(matched, a->n_nodes);
    mdb_prefix_t p;
    cr_assert_eq(mdb_prefix_find(a, b, &p), 0);
    cr_assert(p.found);
    cr_assert_eq(p.prefix_nodes, (uint32_t)a->n_nodes - 1);
    free(sa);
    free(sb);
    mdb_graph_free(a);
    mdb_graph_free(b);
    free(bytes);
    free(bytes2);
}

Test(prefix, a_changed_first_weight_changes_every_hash)
{
    mb_t m;
    mb_small_cnn(&m, 13);
    size_t len;
    uint8_t *bytes = mb_pack(&m, &len);
    mdb_graph_t *a = NULL, *b = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &a, &err), 0, "%s", err.detail);
    free(bytes);
    ((float *)m.inits[0]->raw_data.data)[5] += 1e-3f; /* one conv weight */
    bytes = mb_pack(&m, &len);
    cr_assert_eq(mdb_onnx_import(bytes, len, &b, &err), 0, "%s", err.detail);
    free(bytes);
    mdb_node_sig_t *sa = sign(a), *sb = sign(b);
    for (int i = 0; i < a->n_nodes; i++)
        cr_assert_neq(memcmp(&sa[i].hash, &sb[i].hash, MDB_HASH_LEN), 0, "node %d", i);
    mdb_prefix_t p;
    cr_assert_eq(mdb_prefix_find(a, b, &p), 0);
    cr_assert_not(p.found);
    free(sa);
    free(sb);
    mdb_graph_free(a);
    mdb_graph_free(b);
    mb_free(&m);
}

Test(prefix, a_different_input_size_shares_nothing)
{
    mb_t m;
    mb_small_cnn(&m, 13);
    size_t len;
    uint8_t *bytes = mb_pack(&m, &len);
    mdb_graph_t *a = NULL, *b = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &a, &err), 0, "%s", err.detail);
    free(bytes);
    m.inputs[0]->type->tensor_type->shape->dim[2]->dim_value = 16;
    m.inputs[0]->type->tensor_type->shape->dim[3]->dim_value = 16;
    bytes = mb_pack(&m, &len);
    cr_assert_eq(mdb_onnx_import(bytes, len, &b, &err), 0, "%s", err.detail);
    free(bytes);
    mdb_prefix_t p;
    cr_assert_eq(mdb_prefix_find(a, b, &p), 0);
    cr_assert_not(p.found);
    mdb_graph_free(a);
    mdb_graph_free(b);
    mb_free(&m);
}

Test(prefix, hashes_print_as_hex)
{
    mdb_hash_t h;
    for (int i = 0; i < MDB_HASH_LEN; i++)
        h.b[i] = (uint8_t)(i * 17);
    char buf[2 * MDB_HASH_LEN + 1];
    mdb_hash_hex(&h, buf);
    cr_assert_eq(strlen(buf), 64);
    cr_assert_eq(strncmp(buf, "00112233", 8), 0);
}

/* x -> conv1 -> relu -> conv2 -> relu -> gap -> flatten -> gemm, with
 * conv2's and the classifier's weights chosen by the caller. */
static mdb_graph_t *two_conv_model(float conv2_seed, float fc_seed)
{
    mb_t m;
    mb_init(&m, 13);
    int64_t x[] = {-1, 3, 16, 16}, w1[] = {8, 3, 3, 3}, w2[] = {8, 8, 3, 3}, fc[] = {5, 8};
    mb_input(&m, "x", 4, x);
    mb_init_f(&m, "w1", 4, w1, 0.01f, 0.002f);
    mb_init_f(&m, "w2", 4, w2, conv2_seed, 0.001f);
    mb_init_f(&m, "fc", 2, fc, fc_seed, 0.01f);
    mb_node(&m, "Conv", (const char *[]){"x", "w1", NULL}, (const char *[]){"c1", NULL});
    mb_node(&m, "Relu", (const char *[]){"c1", NULL}, (const char *[]){"r1", NULL});
    mb_node(&m, "Conv", (const char *[]){"r1", "w2", NULL}, (const char *[]){"c2", NULL});
    mb_node(&m, "Relu", (const char *[]){"c2", NULL}, (const char *[]){"r2", NULL});
    mb_node(&m, "GlobalAveragePool", (const char *[]){"r2", NULL}, (const char *[]){"p", NULL});
    mb_node(&m, "Flatten", (const char *[]){"p", NULL}, (const char *[]){"f", NULL});
    Onnx__NodeProto *gemm =
        mb_node(&m, "Gemm", (const char *[]){"f", "fc", NULL}, (const char *[]){"y", NULL});
    mb_attr_int(&m, gemm, "transB", 1);
    mb_output(&m, "y");
    size_t len;
    uint8_t *bytes = mb_pack(&m, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s", err.detail);
    free(bytes);
    mb_free(&m);
    return g;
}

Test(prefix, the_cut_moves_up_to_the_first_differing_layer)
{
    mdb_graph_t *base = two_conv_model(0.1f, 0.2f);
    mdb_graph_t *new_head = two_conv_model(0.1f, 0.3f);
    mdb_graph_t *new_conv2 = two_conv_model(0.15f, 0.2f);
    mdb_prefix_t p;
    /* Only the classifier differs: the cut is Flatten's output. */
    cr_assert_eq(mdb_prefix_find(base, new_head, &p), 0);
    cr_assert(p.found);
    cr_assert_eq(p.prefix_nodes, 6);
    cr_assert_eq(base->nodes[p.node_a].op, MDB_OP_FLATTEN);
    /* conv2 differs too: the shared part is conv1 + relu. */
    cr_assert_eq(mdb_prefix_find(base, new_conv2, &p), 0);
    cr_assert(p.found);
    cr_assert_eq(p.prefix_nodes, 2);
    cr_assert_eq(p.node_a, 1);
    cr_assert_eq(base->nodes[p.node_a].op, MDB_OP_RELU);
    cr_assert_eq(p.tensor_a, base->nodes[2].inputs[0]);
    /* Symmetric. */
    mdb_prefix_t q;
    cr_assert_eq(mdb_prefix_find(new_conv2, base, &q), 0);
    cr_assert_eq(q.prefix_nodes, 2);
    cr_assert_eq(memcmp(&p.prefix_hash, &q.prefix_hash, MDB_HASH_LEN), 0);
    mdb_graph_free(base);
    mdb_graph_free(new_head);
    mdb_graph_free(new_conv2);
}
