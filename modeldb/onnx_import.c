/* ONNX import: bytes -> canonical graph IR (see mdb_graph.h).
 *
 * The bytes come from an upload and will be fuzzed, so nothing is trusted:
 * the wire format is walked with a nesting limit before protobuf-c sees it
 * (protobuf-c recurses without one; onnx_wire.c), every count, rank,
 * dimension and data length is checked against the MDB_MAX_* caps, and
 * names are resolved through a table rather than assumed. The result is
 * either a graph in which every node is an op the worker runs, with static
 * shapes, or an error that says why (the offending ops and the opset for a
 * model the worker cannot run). */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include "onnx.pb-c.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Uploads are capped by the gateway; this is the importer's own bound. */
#define MAX_MODEL_BYTES MDB_MODEL_MAX_BYTES

/* Unsupported op types named with their first node, at most this many
 * (torchvision's SSDlite exported with its postprocessing lacks 12: the
 * ninth on had been listed without its node). */
#define MAX_NAMED_OPS 32

typedef struct {
    mdb_import_error_t *err;
    char ops[512]; /* unsupported op types, comma separated */
    size_t ops_len;
    /* Per unsupported op type (in ops' order): its first node's name and
     * how many nodes use it, for the uploader's message. */
    struct {
        char node[96]; /* "node 'up1'", or "the node writing 'x'" */
        int count;
    } named[MAX_NAMED_OPS];
    int nnamed;
    /* The sizes the upload pins the first runtime input to past the
     * batch, or NULL. */
    const mdb_input_pin_t *pin;
    /* The data files of a bundle (the .onnx not among them): where
     * tensors with external data are read from. */
    const mdb_onnx_file_t *files;
    int nfiles;
    uint64_t files_used; /* bit i: a tensor reads files[i] */
} ectx_t;

/* ---- errors ------------------------------------------------------------ */

static int fail(ectx_t *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ectx_t *e, int code, const char *fmt, ...)
{
    if (e->err) {
        e->err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->err->detail, sizeof(e->err->detail), fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Notes an unsupported op (node: the first node using it, or NULL). */
static void add_unsupported_at(ectx_t *e, const char *what, const char *node)
{
    size_t wl = strlen(what);
    /* Each op once: look for ",what," in ",ops,". */
    const char *p = e->ops;
    int k = 0;
    while ((p = strstr(p, what)) != NULL) {
        bool starts = p == e->ops || p[-1] == ',';
        bool ends = p[wl] == '\0' || p[wl] == ',';
        if (starts && ends) {
            for (const char *q = e->ops; q < p; q++)
                k += *q == ',';
            if (k < e->nnamed)
                e->named[k].count++;
            return;
        }
        p += wl;
    }
    if (e->ops_len + wl + 2 >= sizeof(e->ops))
        return;
    if (e->ops_len)
        e->ops[e->ops_len++] = ',';
    memcpy(e->ops + e->ops_len, what, wl);
    e->ops_len += wl;
    e->ops[e->ops_len] = '\0';
    if (node != NULL && e->nnamed < MAX_NAMED_OPS) {
        for (const char *q = e->ops; *q; q++)
            k += *q == ',';
        if (k == e->nnamed) { /* in step with ops (no unnamed one before it) */
            snprintf(e->named[k].node, sizeof(e->named[k].node), "%s", node);
            e->named[k].count = 1;
            e->nnamed++;
        }
    }
}

static void add_unsupported(ectx_t *e, const char *what)
{
    add_unsupported_at(e, what, NULL);
}

/* How the uploader finds node np in its graph: its name, or (unnamed, as
 * exporters often leave them) the tensor it writes. */
static const char *node_label(const Onnx__NodeProto *np, char *buf, size_t len)
{
    if (np->name != NULL && np->name[0] != '\0')
        snprintf(buf, len, "node '%.60s'", np->name);
    else if (np->n_output > 0 && np->output[0] != NULL && np->output[0][0] != '\0')
        snprintf(buf, len, "the node writing '%.60s'", np->output[0]);
    else
        return NULL;
    return buf;
}

/* "Resize (node 'up1', 3 nodes), Foo (node 'f')": the ops with their
 * first node, as far as they were named. */
static void describe_unsupported(const ectx_t *e, char *out, size_t len)
{
    size_t used = 0;
    const char *p = e->ops;
    out[0] = '\0';
    for (int k = 0; *p && used + 1 < len; k++) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        int w;
        if (k < e->nnamed && e->named[k].node[0])
            w = snprintf(out + used, len - used, "%s%.*s (%s%s", k ? ", " : "", (int)n, p,
                         e->named[k].node, e->named[k].count > 1 ? "" : ")");
        else
            w = snprintf(out + used, len - used, "%s%.*s", k ? ", " : "", (int)n, p);
        if (w < 0 || (size_t)w >= len - used)
            break;
        used += (size_t)w;
        if (k < e->nnamed && e->named[k].node[0] && e->named[k].count > 1) {
            w = snprintf(out + used, len - used, ", %d nodes)", e->named[k].count);
            if (w < 0 || (size_t)w >= len - used)
                break;
            used += (size_t)w;
        }
        p += n + (comma != NULL);
    }
}

/* After node bad, the first one refused: the first node of every other op
 * that the worker refuses, each with its reason, appended to msg ("Resize
 * node 'up': mode ...; ConvTranspose node 'd': group 2 (1 only)"), so that
 * an upload learns all it lacks at once. */
static void refuse_other_ops(ectx_t *e, const mdb_graph_t *g, bool batch_bound, int bad, char *msg,
                             size_t len)
{
    bool seen[MDB_OP_COUNT] = {false}, cut = false;
    seen[g->nodes[bad].op] = true;
    for (int i = bad + 1; i < g->n_nodes; i++) {
        char why[256];
        mdb_op_t op = g->nodes[i].op;
        if (seen[op] || mdb_node_runnable_on(g, i, SQ_DEV_CPU, batch_bound, why, sizeof(why)) == 0)
            continue;
        seen[op] = true;
        add_unsupported(e, mdb_op_name(op));
        size_t used = strlen(msg);
        if (!cut && used + strlen(why) + 3 < len) {
            snprintf(msg + used, len - used, "; %s", why);
        } else if (!cut) {
            cut = true; /* the ops all stand in the list; their reasons stop here */
            if (used + 6 < len)
                snprintf(msg + used, len - used, "; ...");
        }
    }
}

/* ---- names ------------------------------------------------------------- */

typedef struct {
    const char **keys;
    int *vals;
    size_t cap;
} names_t;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void names_init(names_t *m, size_t expect)
{
    m->cap = 16;
    while (m->cap < expect * 2)
        m->cap *= 2;
    m->keys = sq_xcalloc(m->cap, sizeof(*m->keys));
    m->vals = sq_xcalloc(m->cap, sizeof(*m->vals));
}

static void names_dispose(names_t *m)
{
    free(m->keys);
    free(m->vals);
}

/* Returns the value for key, or -1. */
static int names_get(const names_t *m, const char *key)
{
    for (size_t i = fnv1a(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i])
            return -1;
        if (strcmp(m->keys[i], key) == 0)
            return m->vals[i];
    }
}

/* Inserts key (borrowed; must outlive the map); false if present. The
 * capacity is sized up front for every name the model can declare. */
static bool names_put(names_t *m, const char *key, int val)
{
    for (size_t i = fnv1a(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i]) {
            m->keys[i] = key;
            m->vals[i] = val;
            return true;
        }
        if (strcmp(m->keys[i], key) == 0)
            return false;
    }
}

/* ---- tensors ----------------------------------------------------------- */

static mdb_dtype_t dtype_from_onnx(int32_t t)
{
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
        return MDB_DT_FLOAT;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8:
        return MDB_DT_UINT8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT8:
        return MDB_DT_INT8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
        return MDB_DT_INT32;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
        return MDB_DT_INT64;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL:
        return MDB_DT_BOOL;
    default:
        return MDB_DT_UNDEFINED;
    }
}

/* Creates a constant tensor from a TensorProto; returns its index or a
 * negative SQ_* code. */
static int add_tensor_proto(ectx_t *e, mdb_graph_t *g, const Onnx__TensorProto *tp,
                            const char *name)
{
    mdb_dtype_t dt = dtype_from_onnx(tp->data_type);
    if (dt == MDB_DT_UNDEFINED) {
        add_unsupported(e, "tensor data type");
        return fail(e, SQ_UNSUPPORTED_MODEL, "tensor '%s' has data type %d, which is not supported",
                    name, (int)tp->data_type);
    }
    bool external =
        tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    if (tp->segment)
        return fail(e, SQ_UNSUPPORTED_MODEL, "tensor '%s' is segmented", name);
    if (tp->n_dims > MDB_MAX_RANK)
        return fail(e, SQ_UNSUPPORTED_MODEL, "tensor '%s' has rank %zu (max %d)", name, tp->n_dims,
                    MDB_MAX_RANK);
    mdb_shape_t shape = {.rank = (int)tp->n_dims};
    for (size_t i = 0; i < tp->n_dims; i++) {
        if (tp->dims[i] < 0 || tp->dims[i] > MDB_MAX_DIM)
            return fail(e, SQ_BAD_MODEL, "tensor '%s' has dimension %lld", name,
                        (long long)tp->dims[i]);
        shape.dims[i] = tp->dims[i];
    }
    int64_t numel = mdb_shape_numel(&shape, 1);
    if (numel < 0 || numel > MDB_MAX_ELEMENTS)
        return fail(e, SQ_BAD_MODEL, "tensor '%s' is too large", name);
    size_t es = mdb_dtype_size(dt);
    size_t nbytes = (size_t)numel * es;
    size_t n = (size_t)numel;
    /* Which field holds the data, checked against the shape before any
     * allocation: the shape alone may claim gigabytes. */
    enum { RAW, FLOATS, INT64S, INT32S, EMPTY } src;
    const uint8_t *raw = tp->raw_data.data;
    if (external) {
        char why[512];
        int file = -1;
        int rc = mdb_onnx_external_data(tp, name, e->files, e->nfiles, nbytes, &raw, &file, why,
                                        sizeof(why));
        if (rc != 0)
            return fail(e, rc, "%s", why);
        e->files_used |= (uint64_t)1 << file;
        src = RAW;
    } else if (tp->has_raw_data) {
        if (tp->raw_data.len != nbytes)
            return fail(e, SQ_BAD_MODEL, "tensor '%s': raw_data has %zu bytes, shape needs %zu",
                        name, tp->raw_data.len, nbytes);
        src = RAW;
    } else if (dt == MDB_DT_FLOAT && tp->n_float_data == n && n) {
        src = FLOATS;
    } else if (dt == MDB_DT_INT64 && tp->n_int64_data == n && n) {
        src = INT64S;
    } else if ((dt == MDB_DT_INT32 || dt == MDB_DT_UINT8 || dt == MDB_DT_INT8 ||
                dt == MDB_DT_BOOL) &&
               tp->n_int32_data == n && n) {
        src = INT32S;
    } else if (n == 0 && tp->n_float_data == 0 && tp->n_int64_data == 0 && tp->n_int32_data == 0) {
        src = EMPTY;
    } else {
        return fail(e, SQ_BAD_MODEL, "tensor '%s': data does not match its %lld elements", name,
                    (long long)numel);
    }
    uint8_t *data = malloc(nbytes + 1);
    if (!data)
        return fail(e, SQ_NOMEM, "no memory for tensor '%s' (%zu bytes)", name, nbytes);
    switch (src) {
    case RAW:
        if (nbytes)
            memcpy(data, raw, nbytes);
        break;
    case FLOATS:
        memcpy(data, tp->float_data, nbytes);
        break;
    case INT64S:
        memcpy(data, tp->int64_data, nbytes);
        break;
    case INT32S:
        for (size_t i = 0; i < n; i++) {
            if (dt == MDB_DT_INT32)
                memcpy(data + i * 4, &tp->int32_data[i], 4);
            else
                data[i] = (uint8_t)tp->int32_data[i];
        }
        break;
    case EMPTY:
        break;
    }
    int t = mdb_graph_add_tensor(g, name, dt, &shape);
    mdb_graph_set_data(g, t, data, nbytes);
    return t;
}

/* ---- nodes ------------------------------------------------------------- */

static int convert_attr(ectx_t *e, mdb_graph_t *g, mdb_node_t *node, const Onnx__AttributeProto *a)
{
    const char *name = a->name ? a->name : "";
    int type = a->has_type ? (int)a->type : ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED;
    if (type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED) {
        /* Old writers omit the type; take the one field that is set. */
        if (a->t)
            type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
        else if (a->n_ints)
            type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
        else if (a->n_floats)
            type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
        else if (a->has_s)
            type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
        else if (a->has_i)
            type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
        else if (a->has_f)
            type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    }
    switch (type) {
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
        mdb_node_set_int(node, name, a->i);
        return 0;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
        mdb_node_set_float(node, name, a->f);
        return 0;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS:
        if (a->n_ints > MDB_MAX_ATTR_LIST)
            return fail(e, SQ_BAD_MODEL, "attribute '%s' of '%s' has %zu values", name, node->name,
                        a->n_ints);
        mdb_node_set_ints(node, name, a->ints, a->n_ints);
        return 0;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS:
        if (a->n_floats > MDB_MAX_ATTR_LIST)
            return fail(e, SQ_BAD_MODEL, "attribute '%s' of '%s' has %zu values", name, node->name,
                        a->n_floats);
        mdb_node_set_floats(node, name, a->floats, a->n_floats);
        return 0;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
        if (a->s.len > MDB_MAX_ATTR_LIST)
            return fail(e, SQ_BAD_MODEL, "attribute '%s' of '%s' is too long", name, node->name);
        mdb_node_set_string(node, name, a->s.data ? (const char *)a->s.data : "", a->s.len);
        return 0;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: {
        if (!a->t)
            return fail(e, SQ_BAD_MODEL, "attribute '%s' of '%s' has no tensor", name, node->name);
        char tname[256];
        snprintf(tname, sizeof(tname), "%s/%s", node->name, name);
        int t = add_tensor_proto(e, g, a->t, tname);
        if (t < 0)
            return t;
        mdb_node_set_tensor(node, name, t);
        return 0;
    }
    default:
        /* Graphs, sparse tensors, string lists: no op the worker runs uses
         * them; the op itself is reported if it is unknown. */
        return fail(e, SQ_UNSUPPORTED_MODEL, "attribute '%s' of '%s' has unsupported type %d", name,
                    node->name, type);
    }
}

/* Constant's value_* attributes become one tensor attribute "value". */
static int canon_constant_attrs(ectx_t *e, mdb_graph_t *g, mdb_node_t *node)
{
    const mdb_attr_t *a;
    int64_t iv;
    float fv;
    mdb_shape_t scalar = {.rank = 0};
    if (mdb_node_attr(node, "value"))
        return 0;
    int t = -1;
    if ((a = mdb_node_attr(node, "value_int")) && a->type == MDB_ATTR_INT) {
        iv = a->i;
        t = mdb_graph_add_tensor(g, "", MDB_DT_INT64, &scalar);
        int64_t *d = sq_xmalloc(8);
        *d = iv;
        mdb_graph_set_data(g, t, d, 8);
    } else if ((a = mdb_node_attr(node, "value_float")) && a->type == MDB_ATTR_FLOAT) {
        fv = a->f;
        t = mdb_graph_add_tensor(g, "", MDB_DT_FLOAT, &scalar);
        float *d = sq_xmalloc(4);
        *d = fv;
        mdb_graph_set_data(g, t, d, 4);
    } else if ((a = mdb_node_attr(node, "value_ints")) && a->type == MDB_ATTR_INTS) {
        mdb_shape_t s = {.rank = 1, .dims = {(int64_t)a->count}};
        t = mdb_graph_add_tensor(g, "", MDB_DT_INT64, &s);
        void *d = sq_xmalloc(a->count * 8 + 1);
        memcpy(d, a->ints, a->count * 8);
        mdb_graph_set_data(g, t, d, a->count * 8);
    } else if ((a = mdb_node_attr(node, "value_floats")) && a->type == MDB_ATTR_FLOATS) {
        mdb_shape_t s = {.rank = 1, .dims = {(int64_t)a->count}};
        t = mdb_graph_add_tensor(g, "", MDB_DT_FLOAT, &s);
        void *d = sq_xmalloc(a->count * 4 + 1);
        memcpy(d, a->floats, a->count * 4);
        mdb_graph_set_data(g, t, d, a->count * 4);
    } else {
        add_unsupported(e, "Constant");
        return fail(e, SQ_UNSUPPORTED_MODEL, "Constant '%s' has no supported value", node->name);
    }
    mdb_node_set_tensor(node, "value", t);
    return 0;
}

/* Finds a binding for input name; NULL if none. */
static const mdb_onnx_const_t *find_binding(const mdb_onnx_const_t *consts, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (consts[i].name && strcmp(consts[i].name, name) == 0)
            return &consts[i];
    return NULL;
}

/* Adds the serialized TensorProto of a binding as a constant named name. */
static int add_binding(ectx_t *e, mdb_graph_t *g, const mdb_onnx_const_t *b, const char *name)
{
    uint64_t cost = 0;
    if (!b->tensor_pb || b->len == 0 || b->len > MAX_MODEL_BYTES ||
        !mdb_onnx_wire_check(&onnx__tensor_proto__descriptor, b->tensor_pb,
                             (const uint8_t *)b->tensor_pb + b->len, 0, &cost) ||
        cost > mdb_onnx_decode_budget(b->len))
        return fail(e, SQ_BAD_MODEL, "the value bound to input '%s' is not a TensorProto", name);
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, b->len, b->tensor_pb);
    if (!tp)
        return fail(e, SQ_BAD_MODEL, "the value bound to input '%s' is not a TensorProto", name);
    int t = add_tensor_proto(e, g, tp, name);
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return t;
}

/* ---- the runtime input's sizes past the batch --------------------------- */

/* The file's shape of an input, as "[batch, 3, height, width]": sizes,
 * and the names of symbolic ones ("?" when unnamed). */
static void file_shape_str(const Onnx__TensorShapeProto *sp, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (size_t d = 0; d < sp->n_dim && at < len; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = sp->dim[d];
        const char *sep = d ? ", " : "";
        if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
            at += (size_t)snprintf(buf + at, len - at, "%s%lld", sep, (long long)dim->dim_value);
        else
            at += (size_t)snprintf(
                buf + at, len - at, "%s%.24s", sep,
                dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                        dim->dim_param && *dim->dim_param
                    ? dim->dim_param
                    : "?");
    }
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* Sizes dims 1.. of the first runtime input from the file and e->pin: a
 * symbolic size takes its pin, a static one must equal it; without a pin a
 * symbolic size is refused with what to send. The pin's errors name the
 * upload config's key, where pins come from. */
static int pin_input(ectx_t *e, const char *name, const Onnx__TensorShapeProto *sp,
                     mdb_shape_t *shape)
{
    const mdb_input_pin_t *pin = e->pin != NULL && e->pin->rank > 0 ? e->pin : NULL;
    char file[256];
    file_shape_str(sp, file, sizeof(file));
    if (pin != NULL && pin->rank != shape->rank - 1)
        return fail(e, SQ_BAD_CONFIG,
                    "config.input.shape: %d sizes, but input '%s' of shape %s has %d past the "
                    "batch",
                    pin->rank, name, file, shape->rank > 0 ? shape->rank - 1 : 0);
    int symbolic = 0;
    for (int d = 1; d < shape->rank; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = sp->dim[d];
        bool known = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        if (known && (dim->dim_value < 0 || dim->dim_value > MDB_MAX_DIM))
            return fail(e, SQ_BAD_MODEL, "input '%s': dimension %d has size %lld", name, d,
                        (long long)dim->dim_value);
        if (pin == NULL) {
            symbolic += !known;
            shape->dims[d] = known ? dim->dim_value : 0;
            continue;
        }
        int64_t want = pin->dims[d - 1];
        if (want < 1 || want > MDB_MAX_DIM)
            return fail(e, SQ_BAD_CONFIG, "config.input.shape[%d]: %lld is not a size", d - 1,
                        (long long)want);
        if (known && dim->dim_value != want)
            return fail(e, SQ_BAD_CONFIG,
                        "config.input.shape[%d]: %lld, but input '%s' has %lld there (dimension "
                        "%d of %s); only its symbolic sizes can be pinned",
                        d - 1, (long long)want, name, (long long)dim->dim_value, d, file);
        shape->dims[d] = want;
    }
    if (symbolic == 0)
        return 0;
    /* What to send, for this model's rank: its static sizes as they are,
     * an example size in place of each symbolic one. */
    char example[160];
    size_t at = (size_t)snprintf(example, sizeof(example), "[");
    for (int d = 1; d < shape->rank && at < sizeof(example); d++)
        at += (size_t)snprintf(example + at, sizeof(example) - at, "%s%lld", d > 1 ? ", " : "",
                               shape->dims[d] > 0 ? (long long)shape->dims[d] : 224LL);
    if (at < sizeof(example))
        snprintf(example + at, sizeof(example) - at, "]");
    return fail(e, SQ_BAD_CONFIG,
                "config.input.shape: required: input '%s' has %d symbolic size%s past the batch "
                "(%s); pin %s in the upload config to the size to serve, as \"input\": "
                "{\"shape\": %s} (one size per model: upload it again for another)",
                name, symbolic, symbolic > 1 ? "s" : "", file, symbolic > 1 ? "them" : "it",
                example);
}

/* How build() reads dim 0 of the runtime inputs. */
typedef enum {
    BATCH_SYMBOLIC, /* the batch N, even when the file gives a number */
    BATCH_DECLARED, /* the file's number; N where it gives none */
    BATCH_ONE,      /* the file's number; 1 where it gives none */
} batch_mode_t;

/* Builds the graph once, reading the batch as mode says. */
static int build(ectx_t *e, const Onnx__ModelProto *m, int64_t opset, batch_mode_t mode,
                 const mdb_onnx_const_t *consts, int n_consts, uint64_t fold_budget,
                 mdb_graph_t **out, bool *forced_symbolic, int64_t *declared_batch)
{
    const Onnx__GraphProto *gp = m->graph;
    mdb_graph_t *g = mdb_graph_new();
    names_t names = {0};
    int rc = 0;
    size_t n_names = gp->n_initializer + gp->n_input + gp->n_output;
    for (size_t i = 0; i < gp->n_node; i++)
        n_names += gp->node[i]->n_output;
    g->opset = opset;
    if (gp->n_node > MDB_MAX_NODES || n_names > MDB_MAX_TENSORS) {
        rc = fail(e, SQ_BAD_MODEL, "the graph has too many nodes or tensors");
        goto out;
    }
    names_init(&names, n_names + 1);
    *forced_symbolic = false;

    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        const char *name = tp->name ? tp->name : "";
        int t = add_tensor_proto(e, g, tp, name);
        if (t < 0) {
            rc = t;
            goto out;
        }
        if (!*name || !names_put(&names, g->tensors[t].name, t)) {
            rc = fail(e, SQ_BAD_MODEL, "initializer '%s' is unnamed or declared twice", name);
            goto out;
        }
    }
    if (gp->n_sparse_initializer) {
        rc = fail(e, SQ_UNSUPPORTED_MODEL, "sparse initializers are not supported");
        goto out;
    }
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        const char *name = vi->name ? vi->name : "";
        if (names_get(&names, name) >= 0)
            continue; /* an initializer listed as input (IR < 4 style) */
        const mdb_onnx_const_t *bound = find_binding(consts, n_consts, name);
        if (bound) {
            int t = add_binding(e, g, bound, name);
            if (t < 0) {
                rc = t;
                goto out;
            }
            if (!*name || !names_put(&names, g->tensors[t].name, t)) {
                rc = fail(e, SQ_BAD_MODEL, "input '%s' declared twice", name);
                goto out;
            }
            continue;
        }
        const Onnx__TypeProto *tp = vi->type;
        if (!*name || !tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
            !tp->tensor_type) {
            rc = fail(e, SQ_UNSUPPORTED_MODEL, "input '%s' is not a named tensor", name);
            goto out;
        }
        const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
        mdb_dtype_t dt = dtype_from_onnx(tt->elem_type);
        if (dt == MDB_DT_UNDEFINED) {
            rc = fail(e, SQ_UNSUPPORTED_MODEL, "input '%s' has element type %d", name,
                      (int)tt->elem_type);
            goto out;
        }
        if (!tt->shape || tt->shape->n_dim > MDB_MAX_RANK) {
            rc = fail(e, SQ_UNSUPPORTED_MODEL, "input '%s' has no static shape of rank <= %d", name,
                      MDB_MAX_RANK);
            goto out;
        }
        mdb_shape_t shape = {.rank = (int)tt->shape->n_dim};
        /* The first runtime input's sizes past the batch may be pinned by
         * the upload (pin_input); every other input's are the file's. */
        bool first = g->n_inputs == 0;
        if (first && (rc = pin_input(e, name, tt->shape, &shape)) != 0)
            goto out;
        for (int d = 0; d < shape.rank; d++) {
            const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
            bool known = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            if (d == 0 && !known && mode == BATCH_ONE) {
                shape.dims[d] = 1;
                continue;
            }
            if (d == 0 && (!known || mode == BATCH_SYMBOLIC)) {
                if (known) {
                    *forced_symbolic = true;
                    *declared_batch = dim->dim_value;
                }
                shape.dims[d] = MDB_DIM_BATCH;
                continue;
            }
            if (d > 0 && first)
                continue; /* pin_input's */
            if (!known || dim->dim_value < 0 || dim->dim_value > MDB_MAX_DIM) {
                rc = fail(e, SQ_UNSUPPORTED_MODEL,
                          "input '%s': dimension %d is not a static size (only the batch may "
                          "be symbolic in an input after the first)",
                          name, d);
                goto out;
            }
            shape.dims[d] = dim->dim_value;
        }
        int64_t numel = mdb_shape_numel(&shape, 1);
        if (numel < 0 || numel > MDB_MAX_ELEMENTS) {
            rc = fail(e, SQ_BAD_MODEL, "input '%s' is too large", name);
            goto out;
        }
        int t = mdb_graph_add_tensor(g, name, dt, &shape);
        if (!names_put(&names, g->tensors[t].name, t)) {
            rc = fail(e, SQ_BAD_MODEL, "input '%s' declared twice", name);
            goto out;
        }
        mdb_graph_add_input(g, t);
    }

    /* Nodes: outputs first (a file need not be sorted), then inputs. */
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        const char *op_type = np->op_type ? np->op_type : "";
        const char *domain = np->domain ? np->domain : "";
        if (np->n_input > MDB_MAX_NODE_IO || np->n_output > MDB_MAX_NODE_IO ||
            np->n_attribute > MDB_MAX_NODE_ATTRS) {
            rc = fail(e, SQ_BAD_MODEL, "node %zu has too many inputs, outputs or attributes", i);
            goto out;
        }
        int op = mdb_op_from_name(op_type);
        char label[96];
        if (*domain && strcmp(domain, "ai.onnx") != 0) {
            char what[160];
            snprintf(what, sizeof(what), "%.60s:%.60s", domain, op_type);
            add_unsupported_at(e, what, node_label(np, label, sizeof(label)));
            continue;
        }
        if (op < 0) {
            char what[64];
            snprintf(what, sizeof(what), "%.60s", *op_type ? op_type : "(empty)");
            add_unsupported_at(e, what, node_label(np, label, sizeof(label)));
            continue;
        }
        int outs[MDB_MAX_NODE_IO];
        for (size_t k = 0; k < np->n_output; k++) {
            const char *oname = np->output[k] ? np->output[k] : "";
            if (!*oname) {
                outs[k] = -1;
                continue;
            }
            outs[k] = mdb_graph_add_tensor(g, oname, MDB_DT_UNDEFINED, NULL);
            if (!names_put(&names, g->tensors[outs[k]].name, outs[k])) {
                rc = fail(e, SQ_BAD_MODEL, "tensor '%s' is written twice", oname);
                goto out;
            }
        }
        int idx = mdb_graph_add_node(g, (mdb_op_t)op, np->name ? np->name : "", NULL, 0, outs,
                                     (int)np->n_output);
        if (g->n_nodes > MDB_MAX_NODES || g->n_tensors > MDB_MAX_TENSORS) {
            rc = fail(e, SQ_BAD_MODEL, "the graph has too many nodes or tensors");
            goto out;
        }
        mdb_node_t *node = &g->nodes[idx];
        for (size_t k = 0; k < np->n_attribute; k++) {
            rc = convert_attr(e, g, &g->nodes[idx], np->attribute[k]);
            if (rc)
                goto out;
            node = &g->nodes[idx];
        }
        if (op == MDB_OP_CONSTANT && (rc = canon_constant_attrs(e, g, node)) != 0)
            goto out;
    }
    if (e->ops_len) {
        char named[sizeof(e->err->detail) - 64];
        describe_unsupported(e, named, sizeof(named));
        rc = fail(e, SQ_UNSUPPORTED_MODEL, "unsupported operators (opset %lld): %s",
                  (long long)opset, named);
        goto out;
    }
    for (size_t i = 0, idx = 0; i < gp->n_node; i++, idx++) {
        const Onnx__NodeProto *np = gp->node[i];
        mdb_node_t *node = &g->nodes[idx];
        node->inputs = sq_xrealloc(node->inputs, (np->n_input + 1) * sizeof(int));
        node->n_inputs = (int)np->n_input;
        for (size_t k = 0; k < np->n_input; k++) {
            const char *iname = np->input[k] ? np->input[k] : "";
            if (!*iname) {
                node->inputs[k] = -1;
                continue;
            }
            node->inputs[k] = names_get(&names, iname);
            if (node->inputs[k] < 0) {
                rc = fail(e, SQ_BAD_MODEL, "node '%s' reads '%s', which nothing defines",
                          node->name, iname);
                goto out;
            }
        }
    }
    if (gp->n_output == 0) {
        rc = fail(e, SQ_BAD_MODEL, "the graph has no outputs");
        goto out;
    }
    for (size_t i = 0; i < gp->n_output; i++) {
        const char *oname = gp->output[i]->name ? gp->output[i]->name : "";
        int t = names_get(&names, oname);
        if (t < 0) {
            rc = fail(e, SQ_BAD_MODEL, "graph output '%s' is not defined", oname);
            goto out;
        }
        if (g->tensors[t].is_output) {
            rc = fail(e, SQ_BAD_MODEL, "graph output '%s' listed twice", oname);
            goto out;
        }
        mdb_graph_add_output(g, t);
    }
    if (g->n_inputs == 0) {
        rc = fail(e, SQ_UNSUPPORTED_MODEL, "the graph has no runtime input");
        goto out;
    }
    char msg[sizeof(e->err->detail)];
    msg[0] = '\0';
    rc = mdb_graph_toposort(g, msg, sizeof(msg));
    if (rc) {
        rc = fail(e, rc, "%s", msg);
        goto out;
    }
    rc = mdb_onnx_lower(g, opset, fold_budget, msg, sizeof(msg), e->ops, sizeof(e->ops));
    if (rc) {
        e->ops_len = strlen(e->ops);
        rc = fail(e, rc, "%s (opset %lld)", msg, (long long)opset);
        goto out;
    }
    /* What the worker's lowering would refuse is refused here, with its
     * reason (one list, runnable.c). A file that fixes its batch is tried
     * again for that batch, where the batching rules do not apply. A graph
     * that merges the batch into other dimensions is planned per batch
     * size, with the batch bound: its items must stay apart instead. */
    int bad_node;
    bool outermost = mdb_graph_batch_outermost(g);
    rc = outermost ? 0 : mdb_graph_items_apart(g, &bad_node, msg, sizeof(msg));
    bool apart = rc == 0;
    if (rc == 0)
        rc = mdb_graph_runnable(g, !outermost, &bad_node, msg, sizeof(msg));
    if (rc) {
        if (bad_node >= 0)
            add_unsupported(e, mdb_op_name(g->nodes[bad_node].op));
        if (bad_node >= 0 && apart)
            refuse_other_ops(e, g, !outermost, bad_node, msg, sizeof(msg));
        rc = fail(e, rc, "%s", msg);
        goto out;
    }
out:
    names_dispose(&names);
    if (rc) {
        mdb_graph_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int mdb_onnx_import(const void *bytes, size_t len, mdb_graph_t **out, mdb_import_error_t *err)
{
    return mdb_onnx_import_bound(bytes, len, NULL, 0, out, err);
}

static int import(const void *bytes, size_t len, const mdb_onnx_const_t *consts, int n_consts,
                  const mdb_input_pin_t *pin, mdb_graph_t **out, mdb_import_error_t *err);
static int import_model(ectx_t *e, const void *bytes, size_t len, uint64_t total,
                        const mdb_onnx_const_t *consts, int n_consts, mdb_graph_t **out);

int mdb_onnx_import_bound(const void *bytes, size_t len, const mdb_onnx_const_t *consts,
                          int n_consts, mdb_graph_t **out, mdb_import_error_t *err)
{
    return import(bytes, len, consts, n_consts, NULL, out, err);
}

int mdb_onnx_import_pinned(const void *bytes, size_t len, const mdb_input_pin_t *pin,
                           mdb_graph_t **out, mdb_import_error_t *err)
{
    return import(bytes, len, NULL, 0, pin, out, err);
}

int mdb_onnx_import_files(const mdb_onnx_file_t *files, int nfiles, const mdb_input_pin_t *pin,
                          mdb_graph_t **out, mdb_import_error_t *err)
{
    ectx_t e = {.err = err, .pin = pin, .files = files + 1, .nfiles = nfiles - 1};
    *out = NULL;
    if (err) {
        memset(err, 0, sizeof(*err));
        err->opset = -1;
    }
    uint64_t total = 0;
    for (int i = 0; i < nfiles; i++)
        total += files[i].len;
    if (nfiles < 1 || nfiles > MDB_ONNX_BUNDLE_MAX_FILES)
        return fail(&e, SQ_BAD_MODEL, "a model of %d files (1..%d)", nfiles,
                    MDB_ONNX_BUNDLE_MAX_FILES);
    if (total > MAX_MODEL_BYTES)
        return fail(&e, SQ_TOO_LARGE,
                    "model of %llu bytes (with its data files) exceeds the %zu a worker holds "
                    "(MDB_MODEL_MAX_BYTES)",
                    (unsigned long long)total, MAX_MODEL_BYTES);
    return import_model(&e, files[0].data, files[0].len, total, NULL, 0, out);
}

static int import(const void *bytes, size_t len, const mdb_onnx_const_t *consts, int n_consts,
                  const mdb_input_pin_t *pin, mdb_graph_t **out, mdb_import_error_t *err)
{
    ectx_t e = {.err = err, .pin = pin};
    int rc;
    *out = NULL;
    if (err) {
        memset(err, 0, sizeof(*err));
        err->opset = -1;
    }
    if (!bytes || len == 0)
        return fail(&e, SQ_BAD_MODEL, "empty model");
    if (len > MAX_MODEL_BYTES)
        return fail(&e, SQ_TOO_LARGE,
                    "model of %zu bytes exceeds the %zu a worker holds (MDB_MODEL_MAX_BYTES)", len,
                    MAX_MODEL_BYTES);
    uint64_t total = len;
    mdb_onnx_file_t files[MDB_ONNX_BUNDLE_MAX_FILES];
    if (mdb_onnx_is_bundle(bytes, len)) {
        int nfiles = 0;
        char why[256];
        if ((rc = mdb_onnx_bundle_parse(bytes, len, files, MDB_ONNX_BUNDLE_MAX_FILES, &nfiles, why,
                                        sizeof(why))) != 0)
            return fail(&e, rc, "%s", why);
        bytes = files[0].data;
        len = files[0].len;
        e.files = files + 1;
        e.nfiles = nfiles - 1;
    }
    return import_model(&e, bytes, len, total, consts, n_consts, out);
}

/* Imports the ModelProto bytes[0..len) (its external data in e->files;
 * total: its size with them). */
static int import_model(ectx_t *ep, const void *bytes, size_t len, uint64_t total,
                        const mdb_onnx_const_t *consts, int n_consts, mdb_graph_t **out)
{
    ectx_t e = *ep;
    mdb_import_error_t *err = e.err;
    Onnx__ModelProto *m = NULL;
    int rc;
    if (len == 0)
        return fail(&e, SQ_BAD_MODEL, "empty model");
    /* Folding may turn a small file into big constants (ConstantOfShape);
     * real models fold at most what they already hold, their external
     * data included. */
    uint64_t fold_budget = total * 2 + ((uint64_t)64 << 20);
    uint64_t cost = 0;
    if (!mdb_onnx_wire_check(&onnx__model_proto__descriptor, bytes, (const uint8_t *)bytes + len, 0,
                             &cost))
        return fail(&e, SQ_BAD_MODEL, "not a protobuf ModelProto (truncated or malformed)");
    if (cost > mdb_onnx_decode_budget(len))
        return fail(&e, SQ_BAD_MODEL,
                    "the model would take %llu bytes to decode from %zu (too many tiny parts)",
                    (unsigned long long)cost, len);
    m = onnx__model_proto__unpack(NULL, len, bytes);
    if (!m)
        return fail(&e, SQ_BAD_MODEL, "not an ONNX ModelProto (protobuf decoding failed)");
    if (!m->graph) {
        rc = fail(&e, SQ_BAD_MODEL, "the model has no graph");
        goto out;
    }
    if (!m->has_ir_version || m->ir_version < 3) {
        rc = fail(&e, SQ_BAD_MODEL, "missing or too old ir_version");
        goto out;
    }
    int64_t opset = -1;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *os = m->opset_import[i];
        const char *domain = os->domain ? os->domain : "";
        if (!*domain || strcmp(domain, "ai.onnx") == 0)
            opset = os->has_version ? os->version : -1;
    }
    if (err)
        err->opset = opset;
    if (opset < MDB_OPSET_MIN || opset > MDB_OPSET_MAX) {
        rc = fail(&e, SQ_UNSUPPORTED_MODEL, "opset %lld is outside the supported range %d..%d",
                  (long long)opset, MDB_OPSET_MIN, MDB_OPSET_MAX);
        goto out;
    }
    bool forced = false;
    int64_t declared = 0;
    rc =
        build(&e, m, opset, BATCH_SYMBOLIC, consts, n_consts, fold_budget, out, &forced, &declared);
    if (rc && forced && rc != SQ_NOMEM) {
        /* The file fixes the batch and its shapes depend on it (a Reshape
         * to [1, -1], say): import it for that batch only. */
        e.ops_len = 0;
        e.ops[0] = '\0';
        e.nnamed = 0;
        bool again;
        rc = build(&e, m, opset, BATCH_DECLARED, consts, n_consts, fold_budget, out, &again,
                   &declared);
        /* On failure the fixed-batch attempt's reason stands: the symbolic
         * one failed for a batch the file never promised. */
        if (rc == 0) {
            (*out)->batch_fixed = declared > 0 ? declared : 1;
            if (err) {
                memset(err, 0, sizeof(*err));
                err->opset = opset;
            }
        }
    } else if (rc == SQ_UNSUPPORTED_MODEL && err) {
        /* A dynamic batch that the graph computes with (ViT's and Swin's
         * attention reshape to N * heads) has no one plan for every N; if
         * the file holds for N = 1, the uploader learns how to serve it. */
        ectx_t probe = e;
        probe.err = NULL;
        probe.ops_len = 0; /* the ops the symbolic attempt named are not this one's */
        probe.ops[0] = '\0';
        probe.nnamed = 0;
        mdb_graph_t *one = NULL;
        bool again;
        int64_t none = 0;
        if (build(&probe, m, opset, BATCH_ONE, consts, n_consts, fold_budget, &one, &again,
                  &none) == 0) {
            size_t at = strlen(err->detail);
            snprintf(err->detail + at, sizeof(err->detail) - at,
                     " (with a dynamic batch; the graph computes with the batch size: export "
                     "it with a batch of 1 to serve it one item per run)");
        }
        mdb_graph_free(one);
    }
    /* A data file no tensor reads is a mistake (a misnamed part, a file of
     * another model), not weight to keep. */
    for (int i = 0; rc == 0 && i < e.nfiles; i++) {
        if (e.files_used & ((uint64_t)1 << i))
            continue;
        mdb_graph_free(*out);
        *out = NULL;
        rc = fail(&e, SQ_BAD_MODEL, "data file '%.*s' is read by no tensor of the model",
                  (int)(e.files[i].name_len > 200 ? 200 : e.files[i].name_len), e.files[i].name);
        if (err)
            err->unused_file = i + 1;
    }
out:
    if (err && rc) {
        err->code = rc;
        snprintf(err->ops, sizeof(err->ops), "%s", e.ops);
    }
    onnx__model_proto__free_unpacked(m, NULL);
    return rc;
}
