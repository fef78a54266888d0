/* Helpers shared by the modeldb graph tests: reading files, and building
 * small ONNX models with protobuf-c so that each error path has a model
 * made for it. Header-only (static), included by one test file each. */
#ifndef TEST_ONNX_UTIL_H
#define TEST_ONNX_UTIL_H

#include <mdb_graph.h>
#include <sq.h>

#include "onnx.pb-c.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads a whole file; NULL when missing. */
static inline uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (n < 0 || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* The exported torchvision models (tests/meson.build sets the variable). */
static inline uint8_t *read_model(const char *name, size_t *len)
{
    const char *dir = getenv("SQUISH_TEST_MODELS");
    cr_assert_not_null(dir, "SQUISH_TEST_MODELS is not set");
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.onnx", dir, name);
    uint8_t *buf = read_file(path, len);
    cr_assert_not_null(buf, "cannot read %s", path);
    return buf;
}

static inline mdb_graph_t *import_model(const char *name)
{
    size_t len;
    uint8_t *buf = read_model(name, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    int rc = mdb_onnx_import(buf, len, &g, &err);
    free(buf);
    cr_assert_eq(rc, 0, "%s: %s", name, err.detail);
    return g;
}

/* Asserts a shape; dims as mdb_shape_t holds them. */
static inline void expect_shape(const mdb_shape_t *s, int rank, const int64_t *dims,
                                const char *what)
{
    char got[128];
    mdb_shape_str(s, got, sizeof(got));
    cr_assert_eq(s->rank, rank, "%s: shape %s", what, got);
    for (int i = 0; i < rank; i++)
        cr_assert_eq(s->dims[i], dims[i], "%s: shape %s, axis %d", what, got, i);
}

static inline void expect_only_runtime_ops(const mdb_graph_t *g, const char *what)
{
    char why[256];
    cr_assert_eq(mdb_graph_validate(g, why, sizeof(why)), 0, "%s: %s", what, why);
    for (int i = 0; i < g->n_nodes; i++) {
        cr_assert(mdb_op_is_runtime(g->nodes[i].op), "%s: node %d is %s", what, i,
                  mdb_op_name(g->nodes[i].op));
        /* Identity survives only where it writes a graph output. */
        if (g->nodes[i].op == MDB_OP_IDENTITY)
            cr_assert(g->tensors[g->nodes[i].outputs[0]].is_output, "%s: Identity left in", what);
        for (int k = 0; k < g->nodes[i].n_outputs; k++) {
            int t = g->nodes[i].outputs[k];
            cr_assert(t < 0 || g->tensors[t].shape_known, "%s: output without shape", what);
        }
    }
}

/* ---- building models ----------------------------------------------------- */

/* A model under construction; every string and array is owned by the
 * builder's arena (freed by mb_free), so protobuf-c only packs it. */
typedef struct {
    Onnx__ModelProto model;
    Onnx__GraphProto graph;
    Onnx__OperatorSetIdProto opset;
    Onnx__OperatorSetIdProto *opsets[1];
    Onnx__NodeProto *nodes[64];
    Onnx__TensorProto *inits[64];
    Onnx__ValueInfoProto *inputs[8];
    Onnx__ValueInfoProto *outputs[8];
    void *arena[1024];
    int n_arena;
} mb_t;

static inline void *mb_alloc(mb_t *b, size_t n)
{
    cr_assert_lt(b->n_arena, 1024);
    void *p = calloc(1, n + 1);
    b->arena[b->n_arena++] = p;
    return p;
}

static inline char *mb_str(mb_t *b, const char *s)
{
    char *p = mb_alloc(b, strlen(s));
    memcpy(p, s, strlen(s));
    return p;
}

static inline void mb_init(mb_t *b, int64_t opset)
{
    memset(b, 0, sizeof(*b));
    onnx__model_proto__init(&b->model);
    onnx__graph_proto__init(&b->graph);
    onnx__operator_set_id_proto__init(&b->opset);
    b->opset.domain = mb_str(b, "");
    b->opset.has_version = 1;
    b->opset.version = opset;
    b->opsets[0] = &b->opset;
    b->model.has_ir_version = 1;
    b->model.ir_version = 8;
    b->model.n_opset_import = 1;
    b->model.opset_import = b->opsets;
    b->model.graph = &b->graph;
    b->graph.name = mb_str(b, "g");
    b->graph.node = b->nodes;
    b->graph.initializer = b->inits;
    b->graph.input = b->inputs;
    b->graph.output = b->outputs;
}

static inline void mb_free(mb_t *b)
{
    for (int i = 0; i < b->n_arena; i++)
        free(b->arena[i]);
}

/* A float tensor value info; dims < 0 become the symbolic "N". */
static inline Onnx__ValueInfoProto *mb_value_info(mb_t *b, const char *name, int rank,
                                                  const int64_t *dims)
{
    Onnx__ValueInfoProto *vi = mb_alloc(b, sizeof(*vi));
    Onnx__TypeProto *tp = mb_alloc(b, sizeof(*tp));
    Onnx__TypeProto__Tensor *tt = mb_alloc(b, sizeof(*tt));
    Onnx__TensorShapeProto *sp = mb_alloc(b, sizeof(*sp));
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sp);
    sp->n_dim = (size_t)rank;
    sp->dim = mb_alloc(b, sizeof(*sp->dim) * (size_t)(rank + 1));
    for (int i = 0; i < rank; i++) {
        Onnx__TensorShapeProto__Dimension *d = mb_alloc(b, sizeof(*d));
        onnx__tensor_shape_proto__dimension__init(d);
        if (dims[i] < 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = mb_str(b, "N");
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        }
        sp->dim[i] = d;
    }
    tt->has_elem_type = 1;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    tt->shape = sp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    vi->name = mb_str(b, name);
    vi->type = tp;
    return vi;
}

static inline void mb_input(mb_t *b, const char *name, int rank, const int64_t *dims)
{
    b->inputs[b->graph.n_input++] = mb_value_info(b, name, rank, dims);
}

static inline void mb_output(mb_t *b, const char *name)
{
    int64_t none[1] = {0};
    b->outputs[b->graph.n_output++] = mb_value_info(b, name, 0, none);
}

/* A float initializer filled with value + i * step (raw_data). */
static inline Onnx__TensorProto *mb_init_f(mb_t *b, const char *name, int rank, const int64_t *dims,
                                           float value, float step)
{
    Onnx__TensorProto *t = mb_alloc(b, sizeof(*t));
    onnx__tensor_proto__init(t);
    t->name = mb_str(b, name);
    t->has_data_type = 1;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    t->n_dims = (size_t)rank;
    t->dims = mb_alloc(b, sizeof(int64_t) * (size_t)(rank + 1));
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        t->dims[i] = dims[i];
        n *= dims[i];
    }
    float *data = mb_alloc(b, sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++)
        data[i] = value + (float)i * step;
    t->has_raw_data = 1;
    t->raw_data.len = (size_t)n * sizeof(float);
    t->raw_data.data = (uint8_t *)data;
    b->inits[b->graph.n_initializer++] = t;
    return t;
}

static inline Onnx__TensorProto *mb_init_i64(mb_t *b, const char *name, int n, const int64_t *vals)
{
    Onnx__TensorProto *t = mb_alloc(b, sizeof(*t));
    onnx__tensor_proto__init(t);
    t->name = mb_str(b, name);
    t->has_data_type = 1;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    t->n_dims = 1;
    t->dims = mb_alloc(b, sizeof(int64_t));
    t->dims[0] = n;
    t->n_int64_data = (size_t)n;
    t->int64_data = mb_alloc(b, sizeof(int64_t) * (size_t)(n + 1));
    memcpy(t->int64_data, vals, sizeof(int64_t) * (size_t)n);
    b->inits[b->graph.n_initializer++] = t;
    return t;
}

/* A node; ins/outs are NULL-terminated name lists. */
static inline Onnx__NodeProto *mb_node(mb_t *b, const char *op, const char *const *ins,
                                       const char *const *outs)
{
    Onnx__NodeProto *n = mb_alloc(b, sizeof(*n));
    onnx__node_proto__init(n);
    n->op_type = mb_str(b, op);
    n->name = mb_str(b, op);
    size_t n_ins = 0;
    while (ins && ins[n_ins])
        n_ins++;
    n->input = mb_alloc(b, sizeof(char *) * (n_ins > 16 ? n_ins : 16));
    n->output = mb_alloc(b, sizeof(char *) * 16);
    for (; ins && ins[n->n_input]; n->n_input++)
        n->input[n->n_input] = mb_str(b, ins[n->n_input]);
    for (; outs && outs[n->n_output]; n->n_output++)
        n->output[n->n_output] = mb_str(b, outs[n->n_output]);
    n->attribute = mb_alloc(b, sizeof(Onnx__AttributeProto *) * 16);
    b->nodes[b->graph.n_node++] = n;
    return n;
}

static inline void mb_attr_ints(mb_t *b, Onnx__NodeProto *n, const char *name, int count,
                                const int64_t *vals)
{
    Onnx__AttributeProto *a = mb_alloc(b, sizeof(*a));
    onnx__attribute_proto__init(a);
    a->name = mb_str(b, name);
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    a->n_ints = (size_t)count;
    a->ints = mb_alloc(b, sizeof(int64_t) * (size_t)(count + 1));
    memcpy(a->ints, vals, sizeof(int64_t) * (size_t)count);
    n->attribute[n->n_attribute++] = a;
}

static inline void mb_attr_int(mb_t *b, Onnx__NodeProto *n, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = mb_alloc(b, sizeof(*a));
    onnx__attribute_proto__init(a);
    a->name = mb_str(b, name);
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->has_i = 1;
    a->i = v;
    n->attribute[n->n_attribute++] = a;
}

/* x[N,4,6] -> LayerNorm over the last axis (gamma, beta) -> GELU -> z,
 * node for node as torch exports them; eps and the GELU's sqrt 2 as given. */
static inline void mb_ln_gelu(mb_t *b, float eps, float sqrt2, int64_t axis)
{
    mb_init(b, 13);
    int64_t x_dims[] = {-1, 4, 6}, c_dims[] = {6};
    mb_input(b, "x", 3, x_dims);
    mb_init_f(b, "two", 0, NULL, 2.0f, 0.0f);
    mb_init_f(b, "eps", 0, NULL, eps, 0.0f);
    mb_init_f(b, "gamma", 1, c_dims, 0.5f, 0.25f);
    mb_init_f(b, "beta", 1, c_dims, -0.5f, 0.125f);
    mb_init_f(b, "sqrt2", 0, NULL, sqrt2, 0.0f);
    mb_init_f(b, "one", 0, NULL, 1.0f, 0.0f);
    mb_init_f(b, "half", 0, NULL, 0.5f, 0.0f);
    Onnx__NodeProto *m =
        mb_node(b, "ReduceMean", (const char *[]){"x", NULL}, (const char *[]){"m", NULL});
    mb_attr_ints(b, m, "axes", 1, &axis);
    mb_node(b, "Sub", (const char *[]){"x", "m", NULL}, (const char *[]){"d", NULL});
    mb_node(b, "Pow", (const char *[]){"d", "two", NULL}, (const char *[]){"p", NULL});
    Onnx__NodeProto *v =
        mb_node(b, "ReduceMean", (const char *[]){"p", NULL}, (const char *[]){"v", NULL});
    mb_attr_ints(b, v, "axes", 1, &axis);
    mb_node(b, "Add", (const char *[]){"v", "eps", NULL}, (const char *[]){"e", NULL});
    mb_node(b, "Sqrt", (const char *[]){"e", NULL}, (const char *[]){"s", NULL});
    mb_node(b, "Div", (const char *[]){"d", "s", NULL}, (const char *[]){"n", NULL});
    mb_node(b, "Mul", (const char *[]){"n", "gamma", NULL}, (const char *[]){"g", NULL});
    mb_node(b, "Add", (const char *[]){"g", "beta", NULL}, (const char *[]){"y", NULL});
    mb_node(b, "Div", (const char *[]){"y", "sqrt2", NULL}, (const char *[]){"a", NULL});
    mb_node(b, "Erf", (const char *[]){"a", NULL}, (const char *[]){"er", NULL});
    mb_node(b, "Add", (const char *[]){"er", "one", NULL}, (const char *[]){"c", NULL});
    mb_node(b, "Mul", (const char *[]){"y", "c", NULL}, (const char *[]){"u", NULL});
    mb_node(b, "Mul", (const char *[]){"u", "half", NULL}, (const char *[]){"z", NULL});
    mb_output(b, "z");
}

/* Packs the model; caller frees. */
static inline uint8_t *mb_pack(mb_t *b, size_t *len)
{
    *len = onnx__model_proto__get_packed_size(&b->model);
    uint8_t *buf = malloc(*len + 1);
    onnx__model_proto__pack(&b->model, buf);
    return buf;
}

/* The small CNN most error tests start from:
 * x[N,3,8,8] -> Conv(w 4x3x3x3, b, pads 1) -> Relu -> GlobalAveragePool
 *   -> Flatten -> Gemm(fc_w 10x4, fc_b, transB) -> y[N,10] */
static inline void mb_small_cnn(mb_t *b, int64_t opset)
{
    mb_init(b, opset);
    int64_t x_dims[] = {-1, 3, 8, 8}, w_dims[] = {4, 3, 3, 3}, b_dims[] = {4};
    int64_t fc_dims[] = {10, 4}, fcb_dims[] = {10}, pads[] = {1, 1, 1, 1};
    mb_input(b, "x", 4, x_dims);
    mb_init_f(b, "w", 4, w_dims, 0.01f, 0.001f);
    mb_init_f(b, "b", 1, b_dims, 0.1f, 0.1f);
    mb_init_f(b, "fc_w", 2, fc_dims, -0.2f, 0.01f);
    mb_init_f(b, "fc_b", 1, fcb_dims, 0.0f, 0.5f);
    Onnx__NodeProto *conv =
        mb_node(b, "Conv", (const char *[]){"x", "w", "b", NULL}, (const char *[]){"c", NULL});
    mb_attr_ints(b, conv, "pads", 4, pads);
    mb_node(b, "Relu", (const char *[]){"c", NULL}, (const char *[]){"r", NULL});
    mb_node(b, "GlobalAveragePool", (const char *[]){"r", NULL}, (const char *[]){"p", NULL});
    mb_node(b, "Flatten", (const char *[]){"p", NULL}, (const char *[]){"f", NULL});
    Onnx__NodeProto *gemm = mb_node(b, "Gemm", (const char *[]){"f", "fc_w", "fc_b", NULL},
                                    (const char *[]){"y", NULL});
    mb_attr_int(b, gemm, "transB", 1);
    mb_output(b, "y");
}

#endif
