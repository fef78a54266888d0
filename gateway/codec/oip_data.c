/* Decoding of tensor data for oip.c: JSON arrays (flat or nested) and the
 * binary extension's raw tensors. */
#include "gw_codec.h"
#include "oip_int.h"

#include <sq.h>

#include <stdlib.h>
#include <string.h>

/* Reads the elements of tensor data into dst (count elements of dt; dst
 * NULL only counts). shape/ndim: the request's full shape. */
typedef struct {
    gw_oip_datatype_t dt;
    uint8_t *dst;
    size_t count; /* expected elements */
    size_t at;    /* elements read so far */
    const int64_t *shape;
    int ndim;
    int levels; /* nesting depth of the data arrays, 1 = flat */
    /* BYTES */
    gw_oip_row_t *rows;
    size_t max_image;
} data_ctx_t;

/* The innermost array of tensor data, through its ']'; *n gets its length. */
static int read_tensor_run(oip_dec_t *d, oip_cur_t *c, data_ctx_t *x, size_t *n)
{
    size_t esize = gw_oip_datatype_size(x->dt);
    size_t cap = x->dst != NULL && x->at < x->count ? x->count - x->at : 0;
    oip_bad_t bad;
    if (oip_read_numbers(c, x->dt == GW_OIP_UINT8, cap ? x->dst + x->at * esize : NULL, cap, n,
                         &bad) == 0) {
        x->at += *n;
        return 0;
    }
    int len = (int)(bad.n < 40 ? bad.n : 40);
    switch (bad.kind) {
    case OIP_BAD_NOT_NUMBER:
        oip_path_index(d, bad.index);
        return oip_fail(d, SQ_BAD_TENSOR, "expected a number");
    case OIP_BAD_FP32_RANGE:
        oip_path_index(d, bad.index);
        return oip_fail(d, SQ_BAD_TENSOR, "%.*s is out of range for FP32", len, bad.s);
    case OIP_BAD_UINT8:
        oip_path_index(d, bad.index);
        return oip_fail(d, SQ_BAD_TENSOR, "%.*s is not a UINT8 (an integer 0..255)", len, bad.s);
    default:
        return oip_malformed(d);
    }
}

static int read_bytes_elem(oip_dec_t *d, oip_cur_t *c, data_ctx_t *x, size_t index_in_array)
{
    const char *s;
    size_t n;
    int esc;
    size_t old = oip_path_index(d, index_in_array);
    if (oip_peek(c) != '"')
        return oip_fail(d, SQ_BAD_TENSOR, "expected a base64 string");
    if (oip_string(c, &s, &n, &esc) != 0)
        return oip_malformed(d);
    if (x->at >= x->count) { /* too many: only counted */
        x->at++;
        oip_path_pop(d, old);
        return 0;
    }
    char *tmp = NULL;
    if (esc) {
        /* "\/" is how some encoders write '/'; anything else escaped is not
         * base64 and fails below. */
        tmp = malloc(n ? n : 1);
        if (tmp == NULL)
            return oip_fail(d, SQ_NOMEM, "out of memory");
        n = oip_unescape(s, n, tmp);
        s = tmp;
    }
    if (gw_oip_base64_decoded_max(n) > x->max_image + 2) {
        free(tmp);
        return oip_fail(d, SQ_TOO_LARGE, "image larger than %zu bytes", x->max_image);
    }
    uint8_t *img = oip_req_alloc(d->req, gw_oip_base64_decoded_max(n));
    if (img == NULL) {
        free(tmp);
        return oip_fail(d, SQ_NOMEM, "out of memory");
    }
    long long got = gw_oip_base64_decode(s, n, img);
    free(tmp);
    if (got < 0)
        return oip_fail(d, SQ_BAD_TENSOR,
                        "invalid base64 (standard alphabet, '=' padding, no whitespace)");
    if (got == 0)
        return oip_fail(d, SQ_BAD_TENSOR, "empty image");
    if ((size_t)got > x->max_image)
        return oip_fail(d, SQ_TOO_LARGE, "image larger than %zu bytes", x->max_image);
    x->rows[x->at].data = img;
    x->rows[x->at].len = (size_t)got;
    x->at++;
    oip_path_pop(d, old);
    return 0;
}

/* One array of the data at nesting level `level` (0 = outermost). */
static int read_data_level(oip_dec_t *d, oip_cur_t *c, data_ctx_t *x, int level)
{
    if (!oip_accept(c, '['))
        return oip_fail(d, SQ_BAD_TENSOR, "expected an array");
    int first = 1, rc;
    size_t n = 0;
    if (level == x->levels - 1) {
        /* Innermost: the trailing dims flattened. */
        size_t want = 1;
        for (int i = level; i < x->ndim; i++)
            want *= (size_t)x->shape[i];
        if (x->dt != GW_OIP_BYTES) {
            if ((rc = read_tensor_run(d, c, x, &n)) != 0)
                return rc;
        } else {
            while ((rc = oip_next_elem(d, c, &first)) == 1) {
                if ((rc = read_bytes_elem(d, c, x, n)) != 0)
                    return rc;
                n++;
            }
            if (rc < 0)
                return rc;
        }
        if (n != want) {
            if (x->levels == 1) {
                char sh[160];
                oip_shape_str(sh, sizeof(sh), x->shape[0], x->shape + 1, x->ndim - 1);
                return oip_fail(d, SQ_BAD_TENSOR, "%zu elements for shape %s (%zu)", n, sh, want);
            }
            return oip_fail(d, SQ_BAD_TENSOR, "%zu elements, expected %zu", n, want);
        }
        return 0;
    }
    while ((rc = oip_next_elem(d, c, &first)) == 1) {
        size_t old = oip_path_index(d, n);
        if (n >= (size_t)x->shape[level])
            return oip_fail(d, SQ_BAD_TENSOR, "more than %lld entries at this level",
                            (long long)x->shape[level]);
        if ((rc = read_data_level(d, c, x, level + 1)) != 0)
            return rc;
        oip_path_pop(d, old);
        n++;
    }
    if (rc < 0)
        return rc;
    if (n != (size_t)x->shape[level])
        return oip_fail(d, SQ_BAD_TENSOR, "%zu entries, expected %lld", n,
                        (long long)x->shape[level]);
    return 0;
}

/* How many '[' open the data (capped at limit + 1). */
static int data_levels(oip_cur_t c, int limit)
{
    int levels = 0;
    while (levels <= limit && oip_accept(&c, '['))
        levels++;
    return levels;
}

/* Reads "data" at c (advanced past it) into the input's rows. */
int oip_read_json_data(oip_dec_t *d, oip_cur_t *cur, gw_oip_input_t *in,
                       const oip_input_fields_t *f, size_t item, int batch)
{
    oip_cur_t c = *cur;
    size_t old = oip_path_key(d, "data");
    data_ctx_t x = {.dt = in->datatype, .shape = f->shape, .ndim = f->ndim};
    x.levels = data_levels(c, f->ndim);
    if (x.levels == 0)
        return oip_fail(d, SQ_BAD_TENSOR, "expected an array");
    if (x.levels > f->ndim)
        return oip_fail(d, SQ_BAD_TENSOR, "nested deeper than the shape (%d dims)", f->ndim);
    int rc;
    if (in->datatype == GW_OIP_BYTES) {
        x.count = (size_t)batch;
        x.rows = in->rows;
        x.max_image =
            d->model->max_image_bytes ? d->model->max_image_bytes : GW_OIP_DEFAULT_IMAGE_BYTES;
        rc = read_data_level(d, &c, &x, 0);
    } else {
        size_t esize = gw_oip_datatype_size(in->datatype);
        x.count = (size_t)batch * item;
        /* Every element takes at least two bytes of text ("0,"): a body too
         * short for the shape is only counted, for the message, never
         * allocated for. */
        if ((size_t)(c.end - c.p) >= 2 * x.count - 1) {
            x.dst = oip_req_alloc(d->req, x.count * esize);
            if (x.dst == NULL)
                return oip_fail(d, SQ_NOMEM, "out of memory for %zu elements", x.count);
        }
        rc = read_data_level(d, &c, &x, 0);
        if (rc == 0 && x.dst == NULL)
            return oip_fail(d, SQ_BAD_TENSOR, "shorter than its shape"); /* unreachable */
        if (rc == 0)
            for (int b = 0; b < batch; b++) {
                in->rows[b].data = x.dst + (size_t)b * item * esize;
                in->rows[b].len = item * esize;
            }
    }
    if (rc == 0) {
        oip_path_pop(d, old);
        *cur = c;
    }
    return rc;
}

int oip_read_binary_data(oip_dec_t *d, gw_oip_input_t *in, const oip_input_fields_t *f, size_t item,
                         int batch)
{
    size_t old = oip_path_key(d, "parameters.binary_data_size");
    if (d->header_len < 0)
        return oip_fail(d, SQ_BAD_REQUEST,
                        "binary data needs the Inference-Header-Content-Length header");
    size_t left = d->len - d->bin_off;
    if ((uint64_t)f->binary_size > left)
        return oip_fail(d, SQ_BAD_REQUEST, "%lld bytes declared but only %zu left in the body",
                        (long long)f->binary_size, left);
    const uint8_t *p = d->body + d->bin_off;
    d->bin_off += (size_t)f->binary_size;
    in->binary = 1;
    if (in->datatype != GW_OIP_BYTES) {
        size_t want = (size_t)batch * item * gw_oip_datatype_size(in->datatype);
        if ((size_t)f->binary_size != want) {
            char sh[160];
            oip_shape_str(sh, sizeof(sh), batch, f->shape + 1, f->ndim - 1);
            return oip_fail(d, SQ_BAD_TENSOR, "%lld bytes for %s %s (%zu)",
                            (long long)f->binary_size, gw_oip_datatype_name(in->datatype), sh,
                            want);
        }
    }
    int rc = oip_split_rows(d, in, p, (size_t)f->binary_size, item, batch);
    if (rc == 0)
        oip_path_pop(d, old);
    return rc;
}

int oip_split_rows(oip_dec_t *d, gw_oip_input_t *in, const uint8_t *p, size_t n, size_t item,
                   int batch)
{
    const uint8_t *end = p + n;
    if (in->datatype != GW_OIP_BYTES) {
        size_t row = item * gw_oip_datatype_size(in->datatype);
        for (int b = 0; b < batch; b++) {
            in->rows[b].data = p + (size_t)b * row;
            in->rows[b].len = row;
        }
        return 0;
    }
    size_t max_image =
        d->model->max_image_bytes ? d->model->max_image_bytes : GW_OIP_DEFAULT_IMAGE_BYTES;
    for (int b = 0; b < batch; b++) {
        if (end - p < 4)
            return oip_fail(d, SQ_BAD_TENSOR, "element %d: missing its 4-byte length", b);
        uint32_t elen = sq_le32(p);
        if (p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
            return oip_fail(d, SQ_BAD_TENSOR,
                            "element %d starts with a JPEG's first bytes (FF D8 FF), not its "
                            "length: in the binary data extension each BYTES element is a 4-byte "
                            "little-endian length, then that many bytes",
                            b);
        p += 4;
        if (elen > (size_t)(end - p))
            return oip_fail(d, SQ_BAD_TENSOR,
                            "element %d: %u bytes declared by its 4-byte little-endian length "
                            "prefix, %zu left in the tensor",
                            b, elen, (size_t)(end - p));
        if (elen == 0)
            return oip_fail(d, SQ_BAD_TENSOR, "element %d: empty image", b);
        if (elen > max_image)
            return oip_fail(d, SQ_TOO_LARGE, "element %d: image larger than %zu bytes", b,
                            max_image);
        in->rows[b].data = p;
        in->rows[b].len = elen;
        p += elen;
    }
    if (p != end)
        return oip_fail(d, SQ_BAD_TENSOR, "%zu bytes after the %d elements of shape [%d]",
                        (size_t)(end - p), batch, batch);
    return 0;
}
