/* The graph IR's data structure: construction, attributes, topological
 * order, compaction and the facts the gateway shows (op histogram,
 * parameter bytes). Shape inference lives in shape.c, folding in fold.c. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[] = {
#define MDB_OP_NAME_(e, name, runtime) name,
    MDB_OPS(MDB_OP_NAME_)
#undef MDB_OP_NAME_
};
static_assert(sizeof(op_names) / sizeof(op_names[0]) == MDB_OP_COUNT, "op name table");

static const bool op_runtime[] = {
#define MDB_OP_RT_(e, name, runtime) runtime,
    MDB_OPS(MDB_OP_RT_)
#undef MDB_OP_RT_
};
static_assert(sizeof(op_runtime) / sizeof(op_runtime[0]) == MDB_OP_COUNT, "op runtime table");

const char *mdb_op_name(mdb_op_t op)
{
    if ((int)op < 0 || op >= MDB_OP_COUNT)
        return "?";
    return op_names[op];
}

int mdb_op_from_name(const char *name)
{
    for (int i = 0; i < MDB_OP_COUNT; i++)
        if (strcmp(op_names[i], name) == 0)
            return i;
    return -1;
}

bool mdb_op_is_runtime(mdb_op_t op)
{
    return (int)op >= 0 && op < MDB_OP_COUNT && op_runtime[op];
}

static const struct {
    const char *name;
    size_t size;
} dtypes[MDB_DT_COUNT] = {
    [MDB_DT_UNDEFINED] = {"undefined", 0}, [MDB_DT_FLOAT] = {"float", 4},
    [MDB_DT_UINT8] = {"uint8", 1},         [MDB_DT_INT8] = {"int8", 1},
    [MDB_DT_INT32] = {"int32", 4},         [MDB_DT_INT64] = {"int64", 8},
    [MDB_DT_BOOL] = {"bool", 1},
};

size_t mdb_dtype_size(mdb_dtype_t dt)
{
    return (int)dt >= 0 && dt < MDB_DT_COUNT ? dtypes[dt].size : 0;
}

const char *mdb_dtype_name(mdb_dtype_t dt)
{
    return (int)dt >= 0 && dt < MDB_DT_COUNT ? dtypes[dt].name : "?";
}

int64_t mdb_shape_numel(const mdb_shape_t *shape, int64_t batch)
{
    int64_t n = 1;
    for (int i = 0; i < shape->rank; i++) {
        int64_t d = shape->dims[i];
        if (d < 0 && (batch < 0 || __builtin_mul_overflow(-d, batch, &d)))
            return -1;
        if (d != 0 && n > INT64_MAX / d)
            return -1;
        n *= d;
    }
    return n;
}

bool mdb_shape_has_batch(const mdb_shape_t *shape)
{
    for (int i = 0; i < shape->rank; i++)
        if (shape->dims[i] < 0)
            return true;
    return false;
}

bool mdb_shape_eq(const mdb_shape_t *a, const mdb_shape_t *b)
{
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return true;
}

void mdb_shape_str(const mdb_shape_t *shape, char *buf, size_t len)
{
    size_t off = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    off += (size_t)snprintf(buf + off, len - off, "[");
    for (int i = 0; i < shape->rank && off < len; i++) {
        if (shape->dims[i] == MDB_DIM_BATCH)
            off += (size_t)snprintf(buf + off, len - off, "%sN", i ? "," : "");
        else if (shape->dims[i] < 0)
            off += (size_t)snprintf(buf + off, len - off, "%s%lldN", i ? "," : "",
                                    -(long long)shape->dims[i]);
        else
            off += (size_t)snprintf(buf + off, len - off, "%s%lld", i ? "," : "",
                                    (long long)shape->dims[i]);
    }
    if (off < len)
        snprintf(buf + off, len - off, "]");
}

mdb_graph_t *mdb_graph_new(void)
{
    mdb_graph_t *g = sq_xcalloc(1, sizeof(*g));
    return g;
}

static void attr_dispose(mdb_attr_t *a)
{
    free(a->name);
    free(a->ints);
    free(a->floats);
    free(a->s);
    memset(a, 0, sizeof(*a));
}

static void node_dispose(mdb_node_t *n)
{
    free(n->name);
    free(n->inputs);
    free(n->outputs);
    for (int i = 0; i < n->n_attrs; i++)
        attr_dispose(&n->attrs[i]);
    free(n->attrs);
    memset(n, 0, sizeof(*n));
}

static void tensor_dispose(mdb_tensor_t *t)
{
    free(t->name);
    free(t->data);
    memset(t, 0, sizeof(*t));
}

void mdb_graph_free(mdb_graph_t *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_tensors; i++)
        tensor_dispose(&g->tensors[i]);
    for (int i = 0; i < g->n_nodes; i++)
        node_dispose(&g->nodes[i]);
    free(g->tensors);
    free(g->nodes);
    free(g->inputs);
    free(g->outputs);
    free(g);
}

int mdb_graph_add_tensor(mdb_graph_t *g, const char *name, mdb_dtype_t dtype,
                         const mdb_shape_t *shape)
{
    if (g->n_tensors == g->cap_tensors) {
        g->cap_tensors = g->cap_tensors ? g->cap_tensors * 2 : 64;
        g->tensors = sq_xrealloc(g->tensors, (size_t)g->cap_tensors * sizeof(*g->tensors));
    }
    mdb_tensor_t *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof(*t));
    t->name = sq_xstrdup(name ? name : "");
    t->dtype = dtype;
    if (shape) {
        assert(shape->rank >= 0 && shape->rank <= MDB_MAX_RANK);
        t->shape = *shape;
        t->shape_known = true;
    }
    t->producer = -1;
    return g->n_tensors++;
}

void mdb_graph_set_data(mdb_graph_t *g, int tensor, void *data, size_t nbytes)
{
    assert(tensor >= 0 && tensor < g->n_tensors);
    mdb_tensor_t *t = &g->tensors[tensor];
    if (t->data != data)
        free(t->data);
    t->data = data;
    t->nbytes = nbytes;
}

int mdb_graph_add_node(mdb_graph_t *g, mdb_op_t op, const char *name, const int *inputs,
                       int n_inputs, const int *outputs, int n_outputs)
{
    if (g->n_nodes == g->cap_nodes) {
        g->cap_nodes = g->cap_nodes ? g->cap_nodes * 2 : 64;
        g->nodes = sq_xrealloc(g->nodes, (size_t)g->cap_nodes * sizeof(*g->nodes));
    }
    mdb_node_t *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof(*n));
    n->op = op;
    n->name = sq_xstrdup(name ? name : "");
    n->n_inputs = n_inputs;
    n->inputs = sq_xcalloc((size_t)n_inputs + 1, sizeof(int));
    if (n_inputs)
        memcpy(n->inputs, inputs, (size_t)n_inputs * sizeof(int));
    n->n_outputs = n_outputs;
    n->outputs = sq_xcalloc((size_t)n_outputs + 1, sizeof(int));
    if (n_outputs)
        memcpy(n->outputs, outputs, (size_t)n_outputs * sizeof(int));
    return g->n_nodes++;
}

void mdb_graph_add_input(mdb_graph_t *g, int tensor)
{
    g->inputs = sq_xrealloc(g->inputs, (size_t)(g->n_inputs + 1) * sizeof(int));
    g->inputs[g->n_inputs++] = tensor;
    g->tensors[tensor].is_input = true;
}

void mdb_graph_add_output(mdb_graph_t *g, int tensor)
{
    g->outputs = sq_xrealloc(g->outputs, (size_t)(g->n_outputs + 1) * sizeof(int));
    g->outputs[g->n_outputs++] = tensor;
    g->tensors[tensor].is_output = true;
}

/* Returns the attribute slot called name, emptied, creating it if needed. */
static mdb_attr_t *attr_slot(mdb_node_t *n, const char *name, mdb_attr_type_t type)
{
    for (int i = 0; i < n->n_attrs; i++) {
        if (strcmp(n->attrs[i].name, name) == 0) {
            char *keep = n->attrs[i].name;
            n->attrs[i].name = NULL;
            attr_dispose(&n->attrs[i]);
            n->attrs[i].name = keep;
            n->attrs[i].type = type;
            n->attrs[i].tensor = -1;
            return &n->attrs[i];
        }
    }
    n->attrs = sq_xrealloc(n->attrs, (size_t)(n->n_attrs + 1) * sizeof(*n->attrs));
    mdb_attr_t *a = &n->attrs[n->n_attrs++];
    memset(a, 0, sizeof(*a));
    a->name = sq_xstrdup(name);
    a->type = type;
    a->tensor = -1;
    return a;
}

void mdb_node_set_int(mdb_node_t *n, const char *name, int64_t v)
{
    attr_slot(n, name, MDB_ATTR_INT)->i = v;
}

void mdb_node_set_float(mdb_node_t *n, const char *name, float v)
{
    attr_slot(n, name, MDB_ATTR_FLOAT)->f = v;
}

void mdb_node_set_ints(mdb_node_t *n, const char *name, const int64_t *v, size_t count)
{
    /* Copy first: v may point into the attribute being replaced. */
    int64_t *copy = sq_xcalloc(count + 1, sizeof(int64_t));
    if (count)
        memcpy(copy, v, count * sizeof(int64_t));
    mdb_attr_t *a = attr_slot(n, name, MDB_ATTR_INTS);
    a->ints = copy;
    a->count = count;
}

void mdb_node_set_floats(mdb_node_t *n, const char *name, const float *v, size_t count)
{
    float *copy = sq_xcalloc(count + 1, sizeof(float));
    if (count)
        memcpy(copy, v, count * sizeof(float));
    mdb_attr_t *a = attr_slot(n, name, MDB_ATTR_FLOATS);
    a->floats = copy;
    a->count = count;
}

void mdb_node_set_string(mdb_node_t *n, const char *name, const char *s, size_t len)
{
    char *copy = sq_xstrndup(s, len);
    mdb_attr_t *a = attr_slot(n, name, MDB_ATTR_STRING);
    a->s = copy;
    a->count = strlen(a->s);
}

void mdb_node_set_tensor(mdb_node_t *n, const char *name, int tensor)
{
    attr_slot(n, name, MDB_ATTR_TENSOR)->tensor = tensor;
}

void mdb_node_del_attr(mdb_node_t *n, const char *name)
{
    for (int i = 0; i < n->n_attrs; i++) {
        if (strcmp(n->attrs[i].name, name) == 0) {
            attr_dispose(&n->attrs[i]);
            memmove(&n->attrs[i], &n->attrs[i + 1],
                    (size_t)(n->n_attrs - i - 1) * sizeof(*n->attrs));
            n->n_attrs--;
            return;
        }
    }
}

const mdb_attr_t *mdb_node_attr(const mdb_node_t *n, const char *name)
{
    for (int i = 0; i < n->n_attrs; i++)
        if (strcmp(n->attrs[i].name, name) == 0)
            return &n->attrs[i];
    return NULL;
}

int64_t mdb_node_int(const mdb_node_t *n, const char *name, int64_t def)
{
    const mdb_attr_t *a = mdb_node_attr(n, name);
    return a && a->type == MDB_ATTR_INT ? a->i : def;
}

float mdb_node_float(const mdb_node_t *n, const char *name, float def)
{
    const mdb_attr_t *a = mdb_node_attr(n, name);
    return a && a->type == MDB_ATTR_FLOAT ? a->f : def;
}

const int64_t *mdb_node_ints(const mdb_node_t *n, const char *name, size_t *count)
{
    const mdb_attr_t *a = mdb_node_attr(n, name);
    if (!a || a->type != MDB_ATTR_INTS) {
        *count = 0;
        return NULL;
    }
    *count = a->count;
    return a->ints;
}

const float *mdb_node_floats(const mdb_node_t *n, const char *name, size_t *count)
{
    const mdb_attr_t *a = mdb_node_attr(n, name);
    if (!a || a->type != MDB_ATTR_FLOATS) {
        *count = 0;
        return NULL;
    }
    *count = a->count;
    return a->floats;
}

const char *mdb_node_string(const mdb_node_t *n, const char *name, const char *def)
{
    const mdb_attr_t *a = mdb_node_attr(n, name);
    return a && a->type == MDB_ATTR_STRING ? a->s : def;
}

int mdb_graph_find_tensor(const mdb_graph_t *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return i;
    return -1;
}

void mdb_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int mdb_graph_toposort(mdb_graph_t *g, char *err, size_t errlen)
{
    int rc = 0;
    int n = g->n_nodes;
    int *indeg = sq_xcalloc((size_t)n + 1, sizeof(int));
    int *order = sq_xcalloc((size_t)n + 1, sizeof(int));
    /* Consumers as CSR: cons_start[t]..cons_start[t+1] in cons. */
    int *cons_start = sq_xcalloc((size_t)g->n_tensors + 2, sizeof(int));
    int *cons = NULL;
    size_t n_edges = 0;

    for (int t = 0; t < g->n_tensors; t++)
        g->tensors[t].producer = -1;
    for (int i = 0; i < n; i++) {
        const mdb_node_t *node = &g->nodes[i];
        for (int k = 0; k < node->n_outputs; k++) {
            int t = node->outputs[k];
            if (t < 0)
                continue;
            mdb_tensor_t *tt = &g->tensors[t];
            if (tt->producer >= 0 || tt->is_input) {
                mdb_errf(err, errlen, "tensor '%s' is written twice (node '%s')", tt->name,
                         node->name);
                rc = SQ_BAD_MODEL;
                goto out;
            }
            tt->producer = i;
        }
        for (int k = 0; k < node->n_inputs; k++)
            if (node->inputs[k] >= 0) {
                cons_start[node->inputs[k] + 1]++;
                n_edges++;
            }
    }
    for (int t = 0; t < g->n_tensors; t++)
        cons_start[t + 1] += cons_start[t];
    cons = sq_xcalloc(n_edges + 1, sizeof(int));
    {
        int *fill = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(int));
        for (int i = 0; i < n; i++) {
            const mdb_node_t *node = &g->nodes[i];
            for (int k = 0; k < node->n_inputs; k++) {
                int t = node->inputs[k];
                if (t < 0)
                    continue;
                cons[cons_start[t] + fill[t]++] = i;
                if (g->tensors[t].producer >= 0)
                    indeg[i]++;
            }
        }
        free(fill);
    }
    /* Kahn with a min-heap would keep file order strictly; a FIFO seeded in
     * file order is stable enough and linear. */
    int head = 0, tail = 0;
    for (int i = 0; i < n; i++)
        if (indeg[i] == 0)
            order[tail++] = i;
    while (head < tail) {
        int i = order[head++];
        const mdb_node_t *node = &g->nodes[i];
        for (int k = 0; k < node->n_outputs; k++) {
            int t = node->outputs[k];
            if (t < 0)
                continue;
            for (int c = cons_start[t]; c < cons_start[t + 1]; c++)
                if (--indeg[cons[c]] == 0)
                    order[tail++] = cons[c];
        }
    }
    if (tail != n) {
        mdb_errf(err, errlen, "the graph has a cycle (%d of %d nodes sortable)", tail, n);
        rc = SQ_BAD_MODEL;
        goto out;
    }
    {
        mdb_node_t *sorted = sq_xcalloc((size_t)g->cap_nodes + 1, sizeof(*sorted));
        for (int i = 0; i < n; i++)
            sorted[i] = g->nodes[order[i]];
        free(g->nodes);
        g->nodes = sorted;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < g->nodes[i].n_outputs; k++)
                if (g->nodes[i].outputs[k] >= 0)
                    g->tensors[g->nodes[i].outputs[k]].producer = i;
    }
out:
    free(indeg);
    free(order);
    free(cons_start);
    free(cons);
    return rc;
}

void mdb_graph_compact(mdb_graph_t *g)
{
    int n = g->n_nodes;
    bool *live_node = sq_xcalloc((size_t)n + 1, sizeof(bool));
    bool *live_tensor = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(bool));
    int *remap = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(int));

    for (int i = 0; i < g->n_outputs; i++)
        live_tensor[g->outputs[i]] = true;
    for (int i = 0; i < g->n_inputs; i++)
        live_tensor[g->inputs[i]] = true;
    /* Reverse topological sweep: a node lives when one of its outputs does. */
    for (int i = n - 1; i >= 0; i--) {
        const mdb_node_t *node = &g->nodes[i];
        bool live = false;
        for (int k = 0; k < node->n_outputs; k++)
            if (node->outputs[k] >= 0 && live_tensor[node->outputs[k]] &&
                !g->tensors[node->outputs[k]].data)
                live = true;
        if (!live)
            continue;
        live_node[i] = true;
        for (int k = 0; k < node->n_outputs; k++)
            if (node->outputs[k] >= 0)
                live_tensor[node->outputs[k]] = true;
        for (int k = 0; k < node->n_inputs; k++)
            if (node->inputs[k] >= 0)
                live_tensor[node->inputs[k]] = true;
        for (int k = 0; k < node->n_attrs; k++)
            if (node->attrs[k].type == MDB_ATTR_TENSOR && node->attrs[k].tensor >= 0)
                live_tensor[node->attrs[k].tensor] = true;
    }
    int nt = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        if (!live_tensor[t]) {
            tensor_dispose(&g->tensors[t]);
            remap[t] = -1;
            continue;
        }
        remap[t] = nt;
        g->tensors[nt++] = g->tensors[t];
    }
    g->n_tensors = nt;
    int nn = 0;
    for (int i = 0; i < n; i++) {
        if (!live_node[i]) {
            node_dispose(&g->nodes[i]);
            continue;
        }
        mdb_node_t *node = &g->nodes[nn];
        *node = g->nodes[i];
        for (int k = 0; k < node->n_inputs; k++)
            if (node->inputs[k] >= 0)
                node->inputs[k] = remap[node->inputs[k]];
        for (int k = 0; k < node->n_outputs; k++)
            if (node->outputs[k] >= 0)
                node->outputs[k] = remap[node->outputs[k]];
        for (int k = 0; k < node->n_attrs; k++)
            if (node->attrs[k].type == MDB_ATTR_TENSOR && node->attrs[k].tensor >= 0)
                node->attrs[k].tensor = remap[node->attrs[k].tensor];
        nn++;
    }
    g->n_nodes = nn;
    for (int i = 0; i < g->n_inputs; i++)
        g->inputs[i] = remap[g->inputs[i]];
    for (int i = 0; i < g->n_outputs; i++)
        g->outputs[i] = remap[g->outputs[i]];
    for (int t = 0; t < g->n_tensors; t++)
        g->tensors[t].producer = -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_outputs; k++)
            if (g->nodes[i].outputs[k] >= 0 && !g->tensors[g->nodes[i].outputs[k]].data)
                g->tensors[g->nodes[i].outputs[k]].producer = i;
    free(live_node);
    free(live_tensor);
    free(remap);
}

bool mdb_graph_batch_outermost(const mdb_graph_t *g)
{
    for (int t = 0; t < g->n_tensors; t++) {
        const mdb_shape_t *s = &g->tensors[t].shape;
        for (int d = 0; g->tensors[t].shape_known && d < s->rank; d++)
            if (s->dims[d] < 0 && (d != 0 || s->dims[d] != MDB_DIM_BATCH))
                return false;
    }
    return true;
}

int mdb_graph_validate(const mdb_graph_t *g, char *err, size_t errlen)
{
    int rc = SQ_INTERNAL;
    /* written[t]: the tensor holds a value by the time node i runs. */
    bool *written = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(bool));
    for (int t = 0; t < g->n_tensors; t++) {
        const mdb_tensor_t *tt = &g->tensors[t];
        if (!tt->shape_known || tt->shape.rank < 0 || tt->shape.rank > MDB_MAX_RANK) {
            mdb_errf(err, errlen, "tensor %d '%s' has no valid shape", t, tt->name);
            goto out;
        }
        for (int d = 0; d < tt->shape.rank; d++)
            if (tt->shape.dims[d] < -MDB_MAX_DIM) {
                mdb_errf(err, errlen, "tensor '%s' has dimension %lld", tt->name,
                         (long long)tt->shape.dims[d]);
                goto out;
            }
        if (tt->data) {
            int64_t n = mdb_shape_numel(&tt->shape, 1);
            if (mdb_shape_has_batch(&tt->shape) || n < 0 ||
                (uint64_t)n * mdb_dtype_size(tt->dtype) != tt->nbytes) {
                mdb_errf(err, errlen, "constant '%s' holds %zu bytes for its shape", tt->name,
                         tt->nbytes);
                goto out;
            }
            written[t] = true;
        }
    }
    for (int i = 0; i < g->n_inputs; i++) {
        if (g->inputs[i] < 0 || g->inputs[i] >= g->n_tensors) {
            mdb_errf(err, errlen, "graph input %d out of range", i);
            goto out;
        }
        written[g->inputs[i]] = true;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *n = &g->nodes[i];
        if (!mdb_op_is_runtime(n->op)) {
            mdb_errf(err, errlen, "node %d is %s, which only exists at import", i,
                     mdb_op_name(n->op));
            goto out;
        }
        for (int k = 0; k < n->n_inputs; k++) {
            int t = n->inputs[k];
            if (t >= g->n_tensors || (t >= 0 && !written[t])) {
                mdb_errf(err, errlen, "node %d '%s' reads input %d before it is written", i,
                         n->name, k);
                goto out;
            }
        }
        for (int k = 0; k < n->n_outputs; k++) {
            int t = n->outputs[k];
            if (t < 0)
                continue;
            if (t >= g->n_tensors || written[t] || g->tensors[t].producer != i) {
                mdb_errf(err, errlen, "node %d '%s' writes output %d twice or out of range", i,
                         n->name, k);
                goto out;
            }
            written[t] = true;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        if (g->outputs[i] < 0 || g->outputs[i] >= g->n_tensors || !written[g->outputs[i]]) {
            mdb_errf(err, errlen, "graph output %d is never written", i);
            goto out;
        }
    }
    rc = 0;
out:
    free(written);
    return rc;
}

uint64_t mdb_graph_param_bytes(const mdb_graph_t *g)
{
    bool *seen = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(bool));
    uint64_t total = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *node = &g->nodes[i];
        for (int k = 0; k < node->n_inputs; k++) {
            int t = node->inputs[k];
            if (t >= 0 && g->tensors[t].data && !seen[t]) {
                seen[t] = true;
                total += g->tensors[t].nbytes;
            }
        }
    }
    free(seen);
    return total;
}

void mdb_graph_op_histogram(const mdb_graph_t *g, int hist[MDB_OP_COUNT])
{
    memset(hist, 0, MDB_OP_COUNT * sizeof(int));
    for (int i = 0; i < g->n_nodes; i++)
        if ((int)g->nodes[i].op >= 0 && g->nodes[i].op < MDB_OP_COUNT)
            hist[g->nodes[i].op]++;
}
