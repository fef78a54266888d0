/* Canonical forms of the ops over spatial windows and sizes: Conv and the
 * pools (auto_pad resolved into pads, defaults filled in), Resize (scales
 * or sizes from constant inputs into attributes) and ConvTranspose; canon.c
 * has the others. */
#include "canon_int.h"

/* Conv and pools: defaults filled, auto_pad resolved into pads. */
int mdb__canon_window(lctx_t *c)
{
    mdb_node_t *n = c->node;
    const mdb_tensor_t *x = input(c, 0);
    int sp = x->shape.rank - 2;
    if (sp < 1)
        FAIL(SQ_BAD_MODEL, "%s '%s' needs an input of rank >= 3", mdb_op_name(n->op), n->name);
    size_t nk;
    const int64_t *k = mdb_node_ints(n, "kernel_shape", &nk);
    if (!k && n->op == MDB_OP_CONV) {
        const mdb_tensor_t *w = input(c, 1);
        if (!w || w->shape.rank != x->shape.rank)
            FAIL(SQ_BAD_MODEL, "Conv '%s': W does not match X", n->name);
        mdb_node_set_ints(n, "kernel_shape", w->shape.dims + 2, (size_t)sp);
        k = mdb_node_ints(n, "kernel_shape", &nk);
    }
    if (!k || (int)nk != sp)
        FAIL(SQ_BAD_MODEL, "%s '%s': kernel_shape missing or of the wrong length",
             mdb_op_name(n->op), n->name);
    fill_ints(n, "strides", (size_t)sp, 1);
    if (n->op != MDB_OP_AVERAGE_POOL)
        fill_ints(n, "dilations", (size_t)sp, 1);
    const char *auto_pad = mdb_node_string(n, "auto_pad", "NOTSET");
    if (strcmp(auto_pad, "NOTSET") != 0 && strcmp(auto_pad, "") != 0) {
        size_t ns, nd;
        const int64_t *s = mdb_node_ints(n, "strides", &ns);
        const int64_t *d = mdb_node_ints(n, "dilations", &nd);
        int64_t pads[MDB_MAX_RANK * 2] = {0};
        bool valid = strcmp(auto_pad, "VALID") == 0;
        bool upper = strcmp(auto_pad, "SAME_UPPER") == 0;
        if (!valid && !upper && strcmp(auto_pad, "SAME_LOWER") != 0)
            FAIL(SQ_BAD_MODEL, "%s '%s': auto_pad '%s'", mdb_op_name(n->op), n->name, auto_pad);
        for (int i = 0; !valid && i < sp; i++) {
            int64_t in = x->shape.dims[2 + i];
            int64_t st = s && (int)ns == sp ? s[i] : 1, dl = d && (int)nd == sp ? d[i] : 1;
            if (in < 0 || st < 1 || st > MDB_MAX_DIM || dl < 1 || dl > MDB_MAX_DIM || k[i] < 1 ||
                k[i] > MDB_MAX_DIM)
                FAIL(SQ_BAD_MODEL, "%s '%s': bad geometry for auto_pad", mdb_op_name(n->op),
                     n->name);
            int64_t out = (in + st - 1) / st;
            int64_t total = (out - 1) * st + (k[i] - 1) * dl + 1 - in;
            if (total < 0)
                total = 0;
            pads[i] = upper ? total / 2 : total - total / 2;
            pads[sp + i] = total - pads[i];
        }
        mdb_node_set_ints(n, "pads", pads, (size_t)(2 * sp));
    }
    mdb_node_del_attr(n, "auto_pad");
    fill_ints(n, "pads", (size_t)(2 * sp), 0);
    if (n->op == MDB_OP_CONV) {
        mdb_node_set_int(n, "group", mdb_node_int(n, "group", 1));
    } else {
        mdb_node_set_int(n, "ceil_mode", mdb_node_int(n, "ceil_mode", 0));
        mdb_node_del_attr(n, "storage_order");
        if (n->op == MDB_OP_AVERAGE_POOL)
            mdb_node_set_int(n, "count_include_pad", mdb_node_int(n, "count_include_pad", 0));
    }
    return 0;
}

/* Reads optional constant float input k (scales); 1 when absent or empty
 * (opset 11-12 give an empty scales beside sizes), 0 when read. */
static int const_floats(lctx_t *c, int k, float *vals, size_t cap, size_t *n)
{
    const mdb_tensor_t *t = input(c, k);
    if (!t)
        return 1;
    if (!t->data)
        FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s': input %d must be a constant", mdb_op_name(c->node->op),
             c->node->name, k);
    int64_t count = mdb_const_count(t);
    if (count == 0)
        return 1;
    if (count < 0 || (size_t)count > cap || t->dtype != MDB_DT_FLOAT)
        FAIL(SQ_BAD_MODEL, "%s '%s': input %d is not a float list of the input's rank",
             mdb_op_name(c->node->op), c->node->name, k);
    memcpy(vals, t->data, (size_t)count * sizeof(float));
    *n = (size_t)count;
    return 0;
}

/* Resize: the scales or sizes inputs (constants, or folded into them)
 * become the attributes scales and sizes (the output shape), ONNX's
 * defaults filled in, so that the worker reads one form from opset 10 to
 * 18. The scales are what the coordinate transform divides by: the given
 * ones, or sizes / input as float (as ONNX Runtime computes them). */
int mdb__canon_resize(lctx_t *c)
{
    mdb_node_t *n = c->node;
    const mdb_tensor_t *x = input(c, 0);
    int rank = x->shape.rank, rc;
    float scales[MDB_MAX_RANK];
    int64_t sizes[MDB_MAX_RANK];
    size_t ns = 0, nz = 0;
    if (c->opset >= 18) {
        if (mdb_node_int(n, "antialias", 0) != 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "Resize '%s' with antialias", n->name);
        if (mdb_node_ints(n, "axes", &(size_t){0}) != NULL)
            FAIL(SQ_UNSUPPORTED_MODEL, "Resize '%s' with axes", n->name);
        const char *policy = mdb_node_string(n, "keep_aspect_ratio_policy", "stretch");
        if (strcmp(policy, "stretch") != 0 && input(c, 3))
            FAIL(SQ_UNSUPPORTED_MODEL, "Resize '%s': keep_aspect_ratio_policy '%s'", n->name,
                 policy);
    }
    int scales_at = c->opset >= 11 ? 2 : 1;
    if ((rc = const_floats(c, scales_at, scales, MDB_MAX_RANK, &ns)) < 0)
        return rc;
    if (c->opset >= 11 && (rc = const_ints(c, 3, sizes, MDB_MAX_RANK, &nz)) < 0)
        return rc;
    if (ns == 0 && nz == 0)
        FAIL(SQ_BAD_MODEL, "Resize '%s' has neither scales nor sizes", n->name);
    if ((ns != 0 && nz != 0) || (int)(ns ? ns : nz) != rank)
        FAIL(SQ_BAD_MODEL, "Resize '%s': scales or sizes (one of them) must have %d values",
             n->name, rank);
    for (int d = 0; d < rank; d++) {
        int64_t in = x->shape.dims[d];
        if (nz != 0) {
            int64_t out = mdb_is_sym_batch(sizes[d]) ? -mdb_sym_batch_k(sizes[d]) : sizes[d];
            if (in < 0 || out < 0) {
                if (in != out)
                    FAIL(SQ_UNSUPPORTED_MODEL, "Resize '%s' resizes the batch", n->name);
                scales[d] = 1.0f;
            } else {
                if (out < 0 || out > MDB_MAX_DIM)
                    FAIL(SQ_BAD_MODEL, "Resize '%s': size %lld", n->name, (long long)out);
                scales[d] = in > 0 ? (float)out / (float)in : 1.0f;
            }
            sizes[d] = out;
        } else {
            if (!(scales[d] > 0) || !(scales[d] < (float)MDB_MAX_DIM))
                FAIL(SQ_BAD_MODEL, "Resize '%s': scale %g", n->name, (double)scales[d]);
            if (in < 0) {
                if (scales[d] != 1.0f)
                    FAIL(SQ_UNSUPPORTED_MODEL, "Resize '%s' resizes the batch", n->name);
                sizes[d] = in;
            } else {
                double out = floor((double)in * (double)scales[d]);
                if (out > (double)MDB_MAX_DIM)
                    FAIL(SQ_BAD_MODEL, "Resize '%s': output dim past the limit", n->name);
                sizes[d] = (int64_t)out;
            }
        }
    }
    const char *mode = mdb_node_string(n, "mode", "nearest");
    if (c->opset < 11 && strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0)
        FAIL(SQ_BAD_MODEL, "Resize '%s': mode '%s' (nearest or linear at this opset)", n->name,
             mode);
    mdb_node_set_string(n, "mode", mode, strlen(mode));
    if (c->opset < 11) {
        /* Opset 10 maps output x to x / scale and takes the nearest pixel
         * as ONNX Runtime's "simple" mode: truncated upscaling, ceiled
         * downscaling. */
        bool down = false, up = false;
        for (int d = 0; d < rank; d++) {
            down |= scales[d] < 1.0f;
            up |= scales[d] > 1.0f;
        }
        if (down && up && strcmp(mode, "nearest") == 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "Resize '%s' (opset 10) up- and downscales at once",
                 n->name);
        mdb_node_set_string(n, "coordinate_transformation_mode", "asymmetric", 10);
        mdb_node_set_string(n, "nearest_mode", down ? "ceil" : "floor", down ? 4 : 5);
    } else {
        const char *ctm = mdb_node_string(n, "coordinate_transformation_mode", "half_pixel");
        const char *nm = mdb_node_string(n, "nearest_mode", "round_prefer_floor");
        mdb_node_set_string(n, "coordinate_transformation_mode", ctm, strlen(ctm));
        mdb_node_set_string(n, "nearest_mode", nm, strlen(nm));
    }
    mdb_node_set_floats(n, "scales", scales, (size_t)rank);
    mdb_node_set_ints(n, "sizes", sizes, (size_t)rank);
    mdb_node_del_attr(n, "antialias");
    mdb_node_del_attr(n, "axes");
    mdb_node_del_attr(n, "keep_aspect_ratio_policy");
    keep_inputs(n, 1);
    return 0;
}

/* ConvTranspose: defaults filled in; explicit pads only (what torch and
 * paddle2onnx export). */
int mdb__canon_conv_transpose(lctx_t *c)
{
    mdb_node_t *n = c->node;
    const mdb_tensor_t *x = input(c, 0), *w = input(c, 1);
    int sp = x->shape.rank - 2;
    if (sp < 1 || !w || w->shape.rank != x->shape.rank)
        FAIL(SQ_BAD_MODEL, "ConvTranspose '%s' needs X and W of the same rank >= 3", n->name);
    const char *auto_pad = mdb_node_string(n, "auto_pad", "NOTSET");
    if (strcmp(auto_pad, "NOTSET") != 0 && strcmp(auto_pad, "") != 0 &&
        strcmp(auto_pad, "VALID") != 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "ConvTranspose '%s' with auto_pad %s", n->name, auto_pad);
    if (mdb_node_ints(n, "output_shape", &(size_t){0}) != NULL)
        FAIL(SQ_UNSUPPORTED_MODEL, "ConvTranspose '%s' with output_shape", n->name);
    mdb_node_del_attr(n, "auto_pad");
    size_t nk;
    const int64_t *k = mdb_node_ints(n, "kernel_shape", &nk);
    if (!k)
        mdb_node_set_ints(n, "kernel_shape", w->shape.dims + 2, (size_t)sp);
    else if ((int)nk != sp)
        FAIL(SQ_BAD_MODEL, "ConvTranspose '%s': kernel_shape of the wrong length", n->name);
    fill_ints(n, "strides", (size_t)sp, 1);
    fill_ints(n, "dilations", (size_t)sp, 1);
    fill_ints(n, "pads", (size_t)sp * 2, 0);
    fill_ints(n, "output_padding", (size_t)sp, 0);
    mdb_node_set_int(n, "group", mdb_node_int(n, "group", 1));
    const char *names[] = {"strides", "dilations", "pads", "output_padding"};
    for (int i = 0; i < 4; i++) {
        size_t cnt;
        mdb_node_ints(n, names[i], &cnt);
        if ((int)cnt != (i == 2 ? 2 * sp : sp))
            FAIL(SQ_BAD_MODEL, "ConvTranspose '%s': %s of the wrong length", n->name, names[i]);
    }
    return 0;
}
