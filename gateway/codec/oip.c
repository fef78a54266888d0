/* Decoding of OIP inference requests (see gw_codec.h). Two passes: the JSON
 * text is validated flat (syntax, UTF-8, nesting depth) so that every
 * malformed body is SQ_BAD_JSON whatever it says, then walked once with a
 * lexer, tensors read straight into their rows. */
#include "gw_codec.h"
#include "oip_int.h"

#include <sq.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "tensor rows are copied as little-endian bytes");

#define OIP_MAX_BATCH_LIMIT 65536           /* sanity bound on model->max_batch */
#define OIP_MAX_ITEM_ELEMS (1ll << 30)      /* sanity bound on one row */
#define OIP_MAX_SLO_MS (24.0 * 3600 * 1000) /* one day */

/* The other OIP datatypes: known (so the error says "not accepted" rather
 * than "unknown"), never accepted. */
static const char *const other_datatypes[] = {"BOOL", "UINT16", "UINT32", "UINT64",
                                              "INT8", "INT16",  "INT32",  "INT64",
                                              "FP16", "FP64",   "BF16"};

typedef struct {
    int present;
    int binary; /* -1: not given */
    int64_t classification;
    gw_oip_shm_t shm;
    int64_t shm_offset, shm_size; /* -1: not given */
} out_spec_t;

void gw_oip_request_set_id(gw_oip_request_t *req, const char *id, size_t len)
{
    free(req->id);
    req->id = sq_xmalloc(len + 1);
    memcpy(req->id, id, len);
    req->id[len] = '\0';
    req->id_len = len;
}

void gw_oip_request_dispose(gw_oip_request_t *req)
{
    if (req == NULL)
        return;
    for (int i = 0; i < req->nowned_; i++)
        free(req->owned_[i]);
    free(req->owned_);
    free(req->id);
    memset(req, 0, sizeof(*req));
    req->slo_ms = -1;
    req->header_len = -1;
}

/* ---- top-level fields ---- */

static int parse_id(oip_dec_t *d, oip_cur_t *c)
{
    const char *s;
    size_t n;
    int esc;
    if (oip_peek(c) != '"')
        return oip_fail(d, SQ_BAD_REQUEST, "expected a string");
    if (oip_string(c, &s, &n, &esc) != 0)
        return oip_malformed(d);
    /* Unescaping shrinks a string at most six times ("\u0041"). */
    if (n > 6 * (size_t)GW_OIP_ID_MAX)
        return oip_fail(d, SQ_TOO_LARGE, "longer than %d bytes", GW_OIP_ID_MAX);
    char *id = sq_xmalloc(n + 1);
    size_t len = esc ? oip_unescape(s, n, id) : n;
    if (!esc)
        memcpy(id, s, n);
    id[len] = '\0';
    if (len > GW_OIP_ID_MAX) {
        free(id);
        return oip_fail(d, SQ_TOO_LARGE, "longer than %d bytes", GW_OIP_ID_MAX);
    }
    free(d->req->id);
    d->req->id = id;
    d->req->id_len = len;
    return 0;
}

static int parse_parameters(oip_dec_t *d, oip_cur_t *c)
{
    if (!oip_accept(c, '{'))
        return oip_fail(d, SQ_BAD_REQUEST, "expected an object");
    int first = 1, rc;
    char key[40];
    double slo_ms = -1, timeout_ms = -1;
    while ((rc = oip_next_key(d, c, &first, key, sizeof(key))) == 1) {
        size_t old = oip_path_key(d, key);
        if (strcmp(key, "slo_ms") == 0) {
            const char *s;
            size_t n;
            double v = -1;
            if (oip_is_number_start(oip_peek(c))) {
                if (oip_number(c, &s, &n) != 0)
                    return oip_malformed(d);
                v = oip_parse_f64(s, n);
            }
            if (!(v > 0 && v <= OIP_MAX_SLO_MS))
                return oip_fail(d, SQ_BAD_REQUEST, "expected a number of milliseconds in (0, %.0f]",
                                OIP_MAX_SLO_MS);
            slo_ms = v;
        } else if (strcmp(key, "timeout") == 0) {
            int64_t us;
            if ((rc = oip_read_int(d, c, 0, (int64_t)(OIP_MAX_SLO_MS * 1000), &us,
                                   "an integer number of microseconds >= 0")) != 0)
                return rc;
            timeout_ms = us > 0 ? (double)us / 1000.0 : -1; /* Triton: 0 = none */
        } else if (strcmp(key, "priority") == 0) {
            int64_t prio;
            if ((rc = oip_read_int(d, c, 0, INT32_MAX, &prio, "an integer >= 0")) != 0)
                return rc;
            d->req->priority = (int)prio;
        } else if (strcmp(key, "binary_data_output") == 0) {
            if ((rc = oip_read_bool(d, c, &d->req->binary_data_output)) != 0)
                return rc;
        } else if ((rc = oip_skip_value(d, c)) != 0) {
            return rc;
        }
        oip_path_pop(d, old);
    }
    if (rc < 0)
        return rc;
    /* slo_ms is squish's own and wins over Triton's queue timeout. */
    d->req->slo_ms = slo_ms > 0 ? slo_ms : timeout_ms;
    d->req->slo_is_timeout = !(slo_ms > 0) && timeout_ms > 0;
    return 0;
}

/* ---- one input ---- */

static int parse_shape(oip_dec_t *d, oip_cur_t *c, oip_input_fields_t *f)
{
    if (!oip_accept(c, '['))
        return oip_fail(d, SQ_BAD_TENSOR, "expected an array of integers");
    int first = 1, rc;
    f->ndim = 0;
    while ((rc = oip_next_elem(d, c, &first)) == 1) {
        size_t old = oip_path_index(d, (size_t)f->ndim);
        int64_t v;
        const char *s;
        size_t n;
        if (!oip_is_number_start(oip_peek(c)) || oip_number(c, &s, &n) != 0 ||
            oip_parse_int(s, n, 0, INT64_MAX, &v) != 0)
            return oip_fail(d, SQ_BAD_TENSOR, "expected an integer >= 0");
        oip_path_pop(d, old);
        if (f->ndim == OIP_MAX_REQ_DIMS)
            return oip_fail(d, SQ_BAD_TENSOR, "more than %d dimensions", OIP_MAX_REQ_DIMS);
        f->shape[f->ndim++] = v;
    }
    return rc;
}

static int parse_input_parameters(oip_dec_t *d, oip_cur_t *c, oip_input_fields_t *f)
{
    if (!oip_accept(c, '{'))
        return oip_fail(d, SQ_BAD_REQUEST, "expected an object");
    int first = 1, rc;
    char key[40];
    while ((rc = oip_next_key(d, c, &first, key, sizeof(key))) == 1) {
        size_t old = oip_path_key(d, key);
        if (strcmp(key, "binary_data_size") == 0) {
            if ((rc = oip_read_int(d, c, 0, INT64_MAX, &f->binary_size, "an integer >= 0")) != 0)
                return rc;
        } else if (strcmp(key, "shared_memory_region") == 0) {
            if ((rc = oip_read_region(d, c, f->shm_region)) != 0)
                return rc;
            f->have_shm_region = 1;
        } else if (strcmp(key, "shared_memory_offset") == 0) {
            if ((rc = oip_read_int(d, c, 0, INT64_MAX, &f->shm_offset, "an integer >= 0")) != 0)
                return rc;
        } else if (strcmp(key, "shared_memory_byte_size") == 0) {
            if ((rc = oip_read_int(d, c, 0, INT64_MAX, &f->shm_size, "an integer >= 0")) != 0)
                return rc;
        } else if ((rc = oip_skip_value(d, c)) != 0) {
            return rc;
        }
        oip_path_pop(d, old);
    }
    return rc;
}

static int parse_datatype(const char *s, size_t n, gw_oip_datatype_t *dt)
{
    for (int i = 0; i < GW_OIP_DATATYPE_COUNT_; i++)
        if (strlen(gw_oip_datatype_name((gw_oip_datatype_t)i)) == n &&
            memcmp(gw_oip_datatype_name((gw_oip_datatype_t)i), s, n) == 0) {
            *dt = (gw_oip_datatype_t)i;
            return 0;
        }
    for (size_t i = 0; i < sizeof(other_datatypes) / sizeof(other_datatypes[0]); i++)
        if (strlen(other_datatypes[i]) == n && memcmp(other_datatypes[i], s, n) == 0)
            return 1;
    return -1;
}

static unsigned accept_mask(const gw_oip_input_desc_t *in)
{
    return in->accept ? in->accept : (1u << in->datatype) | (1u << GW_OIP_BYTES);
}

static void accepted_str(char *buf, size_t cap, unsigned mask)
{
    size_t o = 0;
    buf[0] = '\0';
    int count = 0, total = 0;
    for (int i = 0; i < GW_OIP_DATATYPE_COUNT_; i++)
        total += (mask >> i) & 1;
    for (int i = 0; i < GW_OIP_DATATYPE_COUNT_; i++) {
        if (!((mask >> i) & 1))
            continue;
        const char *sep = count == 0 ? "" : count == total - 1 ? " or " : ", ";
        int n = snprintf(buf + o, cap - o, "%s%s", sep, gw_oip_datatype_name((gw_oip_datatype_t)i));
        if (n < 0 || (size_t)n >= cap - o)
            return;
        o += (size_t)n;
        count++;
    }
}

static int64_t item_elems(const gw_oip_input_desc_t *in)
{
    int64_t n = 1;
    for (int i = 0; i < in->item_ndim; i++)
        n *= in->item_shape[i];
    return n;
}

/* Checks an input's name, datatype and shape against the model once all
 * three are known, and sets up its rows: *mi gets its model index. */
static int resolve_input(oip_dec_t *d, const oip_input_fields_t *f, unsigned *seen, int *mi_out)
{
    const gw_oip_model_t *m = d->model;
    gw_oip_request_t *r = d->req;

    /* Name: one of the model's inputs, once. */
    size_t old = oip_path_key(d, "name");
    if (!f->have_name)
        return oip_fail(d, SQ_BAD_REQUEST, "missing");
    int mi = -1;
    for (int i = 0; i < m->ninputs; i++)
        if (f->name_len == strlen(m->inputs[i].name) &&
            memcmp(f->name, m->inputs[i].name, f->name_len) == 0)
            mi = i;
    if (mi < 0) {
        if (m->ninputs == 1)
            return oip_fail(d, SQ_BAD_TENSOR, "unknown input \"%.64s\" (the model takes \"%s\")",
                            f->name, m->inputs[0].name);
        return oip_fail(d, SQ_BAD_TENSOR, "unknown input \"%.64s\"", f->name);
    }
    if (*seen & (1u << mi))
        return oip_fail(d, SQ_BAD_REQUEST, "input \"%s\" given twice", m->inputs[mi].name);
    *seen |= 1u << mi;
    oip_path_pop(d, old);
    const gw_oip_input_desc_t *desc = &m->inputs[mi];
    gw_oip_input_t *in = &r->inputs[mi];

    /* Datatype: known to OIP and accepted for this input. */
    old = oip_path_key(d, "datatype");
    if (!f->have_datatype)
        return oip_fail(d, SQ_BAD_REQUEST, "missing");
    gw_oip_datatype_t dt = GW_OIP_FP32;
    int known = f->datatype_len < sizeof(f->datatype)
                    ? parse_datatype(f->datatype, f->datatype_len, &dt)
                    : -1;
    char acc[64];
    accepted_str(acc, sizeof(acc), accept_mask(desc));
    if (known < 0)
        return oip_fail(d, SQ_BAD_TENSOR, "unknown datatype \"%.15s\" (expected %s)", f->datatype,
                        acc);
    if (known > 0 || !(accept_mask(desc) & (1u << dt)))
        return oip_fail(d, SQ_BAD_TENSOR, "%s is not accepted for \"%s\" (expected %s)",
                        f->datatype, desc->name, acc);
    in->datatype = dt;
    oip_path_pop(d, old);

    /* Shape: [N, item...] for tensors, [N] or [N,1] for images. */
    old = oip_path_key(d, "shape");
    if (f->ndim < 0)
        return oip_fail(d, SQ_BAD_REQUEST, "missing");
    char sh[160];
    if (dt == GW_OIP_BYTES) {
        if (!(f->ndim == 1 || (f->ndim == 2 && f->shape[1] == 1)))
            return oip_fail(d, SQ_BAD_TENSOR, "expected [N] or [N,1] for BYTES images");
    } else {
        int ok = f->ndim == desc->item_ndim + 1;
        for (int i = 0; ok && i < desc->item_ndim; i++)
            ok = f->shape[i + 1] == desc->item_shape[i];
        if (!ok) {
            oip_shape_str(sh, sizeof(sh), -1, desc->item_shape, desc->item_ndim);
            return oip_fail(d, SQ_BAD_TENSOR, "expected %s", sh);
        }
    }
    if (f->shape[0] < 1)
        return oip_fail(d, SQ_BAD_TENSOR, "batch size %lld, expected at least 1",
                        (long long)f->shape[0]);
    if (f->shape[0] > m->max_batch)
        return oip_fail(d, SQ_TOO_LARGE, "batch size %lld over the model's maximum %d",
                        (long long)f->shape[0], m->max_batch);
    int batch = (int)f->shape[0];
    if (r->batch != 0 && batch != r->batch)
        return oip_fail(d, SQ_BAD_TENSOR, "batch size %d differs from the other inputs' %d", batch,
                        r->batch);
    r->batch = batch;
    oip_path_pop(d, old);

    in->rows = oip_req_alloc(r, (size_t)batch * sizeof(gw_oip_row_t));
    if (in->rows == NULL)
        return oip_fail(d, SQ_NOMEM, "out of memory");
    memset(in->rows, 0, (size_t)batch * sizeof(gw_oip_row_t));
    *mi_out = mi;
    return 0;
}

/* An input whose parameters name a shared-memory region: its byte size
 * must be given, and be the tensor's (FP32/UINT8; a BYTES tensor's
 * elements are checked when its bytes come, gw_oip_input_set_bytes). */
static int shm_input(oip_dec_t *d, const oip_input_fields_t *f, gw_oip_input_t *in, size_t item)
{
    size_t old = oip_path_key(d, "parameters.shared_memory_byte_size");
    if (f->shm_size < 0)
        return oip_fail(d, SQ_BAD_REQUEST, "missing (parameters.shared_memory_region needs it)");
    if (in->datatype != GW_OIP_BYTES) {
        int batch = d->req->batch;
        size_t want = (size_t)batch * item * gw_oip_datatype_size(in->datatype);
        if ((uint64_t)f->shm_size != want) {
            char sh[160];
            oip_shape_str(sh, sizeof(sh), batch, f->shape + 1, f->ndim - 1);
            return oip_fail(d, SQ_BAD_TENSOR, "%lld bytes, but %s %s takes %zu",
                            (long long)f->shm_size, gw_oip_datatype_name(in->datatype), sh, want);
        }
    }
    oip_path_pop(d, old);
    memcpy(in->shm.region, f->shm_region, sizeof(in->shm.region));
    in->shm.offset = f->shm_offset > 0 ? (uint64_t)f->shm_offset : 0;
    in->shm.byte_size = (uint64_t)f->shm_size;
    return 0;
}

static int parse_input(oip_dec_t *d, oip_cur_t *c, unsigned *seen, int position)
{
    const gw_oip_model_t *m = d->model;
    oip_input_fields_t f = {.ndim = -1, .binary_size = -1, .shm_offset = -1, .shm_size = -1};
    if (!oip_accept(c, '{'))
        return oip_fail(d, SQ_BAD_REQUEST, "expected an object");
    int first = 1, rc, mi = -1, data_done = 0;
    char key[40];
    unsigned keys = 0;
    while ((rc = oip_next_key(d, c, &first, key, sizeof(key))) == 1) {
        static const char *const known[] = {"name", "datatype", "shape", "parameters", "data"};
        int k = -1;
        for (int i = 0; i < 5; i++)
            if (strcmp(key, known[i]) == 0)
                k = i;
        if (k < 0) {
            if ((rc = oip_skip_value(d, c)) != 0)
                return rc;
            continue;
        }
        if (keys & (1u << k)) {
            oip_path_key(d, key);
            return oip_fail(d, SQ_BAD_REQUEST, "given twice");
        }
        keys |= 1u << k;
        if (k == 4) {
            f.data = *c;
            f.have_data = 1;
            /* Usual order (name, shape, datatype, then data): read the
             * tensor in place, in one pass; otherwise come back to it. */
            if (f.have_name && f.have_datatype && f.ndim >= 0 && f.binary_size < 0 &&
                !f.have_shm_region && f.shm_size < 0 && f.shm_offset < 0) {
                if ((rc = resolve_input(d, &f, seen, &mi)) != 0)
                    return rc;
                size_t item = (size_t)item_elems(&m->inputs[mi]);
                if ((rc = oip_read_json_data(d, c, &d->req->inputs[mi], &f, item, d->req->batch)) !=
                    0)
                    return rc;
                data_done = 1;
            } else if ((rc = oip_skip_value(d, c)) != 0) {
                return rc;
            }
            continue;
        }
        size_t old = oip_path_key(d, key);
        switch (k) {
        case 0:
            rc = oip_read_string(d, c, f.name, sizeof(f.name), &f.name_len);
            f.have_name = 1;
            break;
        case 1:
            rc = oip_read_string(d, c, f.datatype, sizeof(f.datatype), &f.datatype_len);
            f.have_datatype = 1;
            break;
        case 2:
            rc = parse_shape(d, c, &f);
            break;
        default:
            rc = parse_input_parameters(d, c, &f);
            break;
        }
        if (rc != 0)
            return rc;
        oip_path_pop(d, old);
    }
    if (rc < 0)
        return rc;
    if (mi < 0 && (rc = resolve_input(d, &f, seen, &mi)) != 0)
        return rc;
    gw_oip_input_t *in = &d->req->inputs[mi];
    in->position = position;

    /* Data: JSON, binary or in shared memory, exactly one of them. */
    int sources = f.have_data + (f.binary_size >= 0) + f.have_shm_region;
    if (f.have_data && f.binary_size >= 0 && !f.have_shm_region)
        return oip_fail(d, SQ_BAD_REQUEST, "both data and parameters.binary_data_size given");
    if (sources > 1)
        return oip_fail(d, SQ_BAD_REQUEST,
                        "set only one of data, parameters.binary_data_size and "
                        "parameters.shared_memory_region");
    if (!f.have_shm_region && (f.shm_size >= 0 || f.shm_offset >= 0)) {
        oip_path_key(d, f.shm_size >= 0 ? "parameters.shared_memory_byte_size"
                                        : "parameters.shared_memory_offset");
        return oip_fail(d, SQ_BAD_REQUEST, "given without parameters.shared_memory_region");
    }
    if (sources == 0) {
        oip_path_key(d, "data");
        return oip_fail(d, SQ_BAD_REQUEST,
                        "missing (and no parameters.binary_data_size or shared_memory_region)");
    }
    if (data_done)
        return 0;
    size_t item = (size_t)item_elems(&m->inputs[mi]);
    if (f.have_shm_region)
        return shm_input(d, &f, in, item);
    if (f.have_data) {
        oip_cur_t dc = f.data;
        return oip_read_json_data(d, &dc, in, &f, item, d->req->batch);
    }
    return oip_read_binary_data(d, in, &f, item, d->req->batch);
}

static int parse_inputs(oip_dec_t *d, oip_cur_t *c)
{
    if (!oip_accept(c, '['))
        return oip_fail(d, SQ_BAD_REQUEST, "expected an array");
    int first = 1, rc, i = 0;
    unsigned seen = 0;
    while ((rc = oip_next_elem(d, c, &first)) == 1) {
        size_t old = oip_path_index(d, (size_t)i);
        if (i == d->model->ninputs)
            return oip_fail(d, SQ_BAD_TENSOR, "the model takes %d input%s", d->model->ninputs,
                            d->model->ninputs == 1 ? "" : "s");
        if ((rc = parse_input(d, c, &seen, i)) != 0)
            return rc;
        oip_path_pop(d, old);
        i++;
    }
    if (rc < 0)
        return rc;
    for (int k = 0; k < d->model->ninputs; k++)
        if (!(seen & (1u << k)))
            return oip_fail(d, SQ_BAD_TENSOR, "missing input \"%s\"", d->model->inputs[k].name);
    return 0;
}

/* ---- outputs ---- */

static int parse_output(oip_dec_t *d, oip_cur_t *c, out_spec_t *specs, int *order, int *norder)
{
    const gw_oip_model_t *m = d->model;
    if (!oip_accept(c, '{'))
        return oip_fail(d, SQ_BAD_REQUEST, "expected an object");
    char name[GW_OIP_NAME_MAX + 2];
    size_t name_len = 0;
    int have_name = 0, binary = -1, first = 1, rc;
    int64_t classification = 0, shm_offset = -1, shm_size = -1;
    char region[GW_OIP_REGION_MAX + 1] = "";
    char key[40];
    while ((rc = oip_next_key(d, c, &first, key, sizeof(key))) == 1) {
        size_t old = oip_path_key(d, key);
        if (strcmp(key, "name") == 0) {
            if ((rc = oip_read_string(d, c, name, sizeof(name), &name_len)) != 0)
                return rc;
            have_name = 1;
        } else if (strcmp(key, "parameters") == 0) {
            if (!oip_accept(c, '{'))
                return oip_fail(d, SQ_BAD_REQUEST, "expected an object");
            int pfirst = 1;
            char pkey[40];
            while ((rc = oip_next_key(d, c, &pfirst, pkey, sizeof(pkey))) == 1) {
                size_t pold = oip_path_key(d, pkey);
                if (strcmp(pkey, "binary_data") == 0)
                    rc = oip_read_bool(d, c, &binary);
                else if (strcmp(pkey, "classification") == 0)
                    rc = oip_read_int(d, c, 0, INT32_MAX, &classification, "an integer >= 0");
                else if (strcmp(pkey, "shared_memory_region") == 0)
                    rc = oip_read_region(d, c, region);
                else if (strcmp(pkey, "shared_memory_offset") == 0)
                    rc = oip_read_int(d, c, 0, INT64_MAX, &shm_offset, "an integer >= 0");
                else if (strcmp(pkey, "shared_memory_byte_size") == 0)
                    rc = oip_read_int(d, c, 0, INT64_MAX, &shm_size, "an integer >= 0");
                else
                    rc = oip_skip_value(d, c);
                if (rc != 0)
                    return rc;
                oip_path_pop(d, pold);
            }
            if (rc < 0)
                return rc;
        } else if ((rc = oip_skip_value(d, c)) != 0) {
            return rc;
        }
        oip_path_pop(d, old);
    }
    if (rc < 0)
        return rc;
    size_t old = oip_path_key(d, "name");
    if (!have_name)
        return oip_fail(d, SQ_BAD_REQUEST, "missing");
    int mo = -1;
    for (int i = 0; i < m->noutputs; i++)
        if (name_len == strlen(m->outputs[i].name) &&
            memcmp(name, m->outputs[i].name, name_len) == 0)
            mo = i;
    if (mo < 0)
        return oip_fail(d, SQ_BAD_TENSOR, "unknown output \"%.64s\"", name);
    if (specs[mo].present)
        return oip_fail(d, SQ_BAD_REQUEST, "output \"%s\" requested twice", m->outputs[mo].name);
    oip_path_pop(d, old);
    /* As Triton: a tensor in shared memory is neither classes nor binary. */
    if (region[0] != '\0') {
        old = oip_path_key(d, "parameters.shared_memory_region");
        if (classification > 0)
            return oip_fail(d, SQ_BAD_REQUEST,
                            "an output cannot set both shared_memory_region and classification");
        if (binary == 1)
            return oip_fail(d, SQ_BAD_REQUEST,
                            "an output cannot set both shared_memory_region and binary_data");
        if (shm_size < 0) {
            oip_path_pop(d, old);
            oip_path_key(d, "parameters.shared_memory_byte_size");
            return oip_fail(d, SQ_BAD_REQUEST,
                            "missing (parameters.shared_memory_region needs it)");
        }
        oip_path_pop(d, old);
    } else if (shm_size >= 0 || shm_offset >= 0) {
        oip_path_key(d, shm_size >= 0 ? "parameters.shared_memory_byte_size"
                                      : "parameters.shared_memory_offset");
        return oip_fail(d, SQ_BAD_REQUEST, "given without parameters.shared_memory_region");
    }
    specs[mo].present = 1;
    specs[mo].binary = binary;
    specs[mo].classification = classification;
    memcpy(specs[mo].shm.region, region, sizeof(region));
    specs[mo].shm.offset = shm_offset > 0 ? (uint64_t)shm_offset : 0;
    specs[mo].shm.byte_size = shm_size > 0 ? (uint64_t)shm_size : 0;
    order[(*norder)++] = mo;
    return 0;
}

static int parse_outputs(oip_dec_t *d, oip_cur_t *c, out_spec_t *specs, int *order, int *norder)
{
    if (!oip_accept(c, '['))
        return oip_fail(d, SQ_BAD_REQUEST, "expected an array");
    int first = 1, rc, i = 0;
    while ((rc = oip_next_elem(d, c, &first)) == 1) {
        size_t old = oip_path_index(d, (size_t)i++);
        if ((rc = parse_output(d, c, specs, order, norder)) != 0)
            return rc;
        oip_path_pop(d, old);
    }
    return rc;
}

/* ---- the request ---- */

static int check_model(const gw_oip_model_t *m, char *err, size_t errlen)
{
    const char *why = NULL;
    if (m->ninputs < 1 || m->ninputs > GW_OIP_MAX_INPUTS)
        why = "ninputs";
    else if (m->noutputs < 0 || m->noutputs > GW_OIP_MAX_OUTPUTS)
        why = "noutputs";
    else if (m->max_batch < 1 || m->max_batch > OIP_MAX_BATCH_LIMIT)
        why = "max_batch";
    else if (m->max_depth < 0 || m->max_depth > GW_OIP_MAX_DEPTH)
        why = "max_depth";
    for (int i = 0; why == NULL && i < m->ninputs; i++) {
        const gw_oip_input_desc_t *in = &m->inputs[i];
        if (in->datatype != GW_OIP_FP32 && in->datatype != GW_OIP_UINT8)
            why = "inputs[].datatype";
        else if (in->item_ndim < 1 || in->item_ndim > GW_OIP_MAX_DIMS)
            why = "inputs[].item_ndim";
        int64_t n = 1;
        for (int k = 0; why == NULL && k < in->item_ndim; k++) {
            if (in->item_shape[k] < 1 || in->item_shape[k] > OIP_MAX_ITEM_ELEMS)
                why = "inputs[].item_shape";
            else if ((n *= in->item_shape[k]) > OIP_MAX_ITEM_ELEMS)
                why = "inputs[].item_shape (too many elements)";
        }
    }
    for (int i = 0; why == NULL && i < m->noutputs; i++) {
        const gw_oip_output_desc_t *o = &m->outputs[i];
        if (o->item_ndim < 1 || o->item_ndim > GW_OIP_MAX_DIMS)
            why = "outputs[].item_ndim";
        int64_t n = 1;
        for (int k = 0; why == NULL && k < o->item_ndim; k++)
            if (o->item_shape[k] < 1 || (n *= o->item_shape[k]) > OIP_MAX_ITEM_ELEMS)
                why = "outputs[].item_shape";
    }
    if (why == NULL)
        return 0;
    snprintf(err, errlen, "invalid model description: %s", why);
    return SQ_INVAL;
}

/* Inference-Header-Content-Length: 0: the body is the raw tensor of the
 * model's single input at batch 1. */
static int parse_raw(oip_dec_t *d)
{
    const gw_oip_model_t *m = d->model;
    gw_oip_request_t *r = d->req;
    if (m->ninputs != 1)
        return oip_fail(d, SQ_BAD_REQUEST,
                        "Inference-Header-Content-Length: 0 needs a model with a single input");
    const gw_oip_input_desc_t *desc = &m->inputs[0];
    size_t want = (size_t)item_elems(desc) * gw_oip_datatype_size(desc->datatype);
    if (d->len != want) {
        char sh[160];
        oip_shape_str(sh, sizeof(sh), 1, desc->item_shape, desc->item_ndim);
        return oip_fail(d, SQ_BAD_TENSOR, "body: %zu bytes, expected %zu for %s %s (raw tensor)",
                        d->len, want, gw_oip_datatype_name(desc->datatype), sh);
    }
    gw_oip_input_t *in = &r->inputs[0];
    in->rows = oip_req_alloc(r, sizeof(gw_oip_row_t));
    if (in->rows == NULL)
        return oip_fail(d, SQ_NOMEM, "out of memory");
    in->datatype = desc->datatype;
    in->binary = 1;
    in->rows[0].data = d->body;
    in->rows[0].len = want;
    r->batch = 1;
    return 0;
}

/* Every model output in model order, binary as binary_data_output says. */
static void all_outputs(gw_oip_request_t *r, const gw_oip_model_t *m)
{
    r->noutputs = m->noutputs;
    for (int i = 0; i < m->noutputs; i++) {
        r->outputs[i].model_output = i;
        r->outputs[i].binary = r->binary_data_output;
        r->outputs[i].classification = 0;
    }
}

static int parse_body(oip_dec_t *d)
{
    const gw_oip_model_t *m = d->model;
    gw_oip_request_t *r = d->req;
    int rc;
    if (m->max_body_bytes && d->len > m->max_body_bytes)
        return oip_fail(d, SQ_TOO_LARGE, "body of %zu bytes over the limit of %zu", d->len,
                        m->max_body_bytes);
    if (d->header_len < -1 || (d->header_len >= 0 && (unsigned long long)d->header_len > d->len))
        return oip_fail(d, SQ_BAD_REQUEST,
                        "Inference-Header-Content-Length %lld does not fit the body of %zu bytes",
                        d->header_len, d->len);
    r->header_len = (int)(d->header_len > INT32_MAX ? INT32_MAX : d->header_len);
    if (d->header_len == 0) {
        rc = parse_raw(d);
        if (rc == 0)
            all_outputs(r, m);
        return rc;
    }
    size_t json_len = d->header_len > 0 ? (size_t)d->header_len : d->len;
    d->bin_off = json_len;
    rc = oip_json_validate((const char *)d->body, json_len,
                           m->max_depth ? m->max_depth : GW_OIP_DEFAULT_DEPTH, d->err, d->errlen);
    if (rc != 0)
        return rc;
    oip_cur_t c = {(const char *)d->body, (const char *)d->body + json_len};
    if (!oip_accept(&c, '{'))
        return oip_fail(d, SQ_BAD_REQUEST, "expected a JSON object");
    out_spec_t specs[GW_OIP_MAX_OUTPUTS] = {{0}};
    int order[GW_OIP_MAX_OUTPUTS], norder = 0;
    int first = 1, have_inputs = 0;
    unsigned keys = 0;
    char key[40];
    while ((rc = oip_next_key(d, &c, &first, key, sizeof(key))) == 1) {
        static const char *const known[] = {"id", "parameters", "inputs", "outputs"};
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(key, known[i]) == 0)
                k = i;
        if (k < 0) {
            if ((rc = oip_skip_value(d, &c)) != 0)
                return rc;
            continue;
        }
        size_t old = oip_path_key(d, key);
        if (keys & (1u << k))
            return oip_fail(d, SQ_BAD_REQUEST, "given twice");
        keys |= 1u << k;
        switch (k) {
        case 0:
            rc = parse_id(d, &c);
            break;
        case 1:
            rc = parse_parameters(d, &c);
            break;
        case 2:
            rc = parse_inputs(d, &c);
            have_inputs = 1;
            break;
        default:
            rc = parse_outputs(d, &c, specs, order, &norder);
            break;
        }
        if (rc != 0)
            return rc;
        oip_path_pop(d, old);
    }
    if (rc < 0)
        return rc;
    if (!have_inputs)
        return oip_fail(d, SQ_BAD_REQUEST, "inputs: missing");
    if (d->bin_off != d->len)
        return oip_fail(d, SQ_BAD_REQUEST, "body: %zu bytes after the %s", d->len - d->bin_off,
                        d->header_len > 0 ? "binary tensors" : "JSON");
    /* No "outputs" (or an empty list): every output. */
    if (norder == 0) {
        all_outputs(r, m);
        return 0;
    }
    r->noutputs = norder;
    for (int i = 0; i < norder; i++) {
        const out_spec_t *s = &specs[order[i]];
        r->outputs[i].model_output = order[i];
        r->outputs[i].binary = s->binary >= 0 ? s->binary : r->binary_data_output;
        r->outputs[i].classification = (int)s->classification;
        if (s->shm.region[0] == '\0')
            continue;
        /* Its region must hold the whole tensor, known once the batch is. */
        r->outputs[i].binary = 0;
        r->outputs[i].shm = s->shm;
        const gw_oip_output_desc_t *desc = &m->outputs[order[i]];
        size_t want = (size_t)r->batch * sizeof(float);
        for (int k = 0; k < desc->item_ndim; k++)
            want *= (size_t)desc->item_shape[k];
        if (s->shm.byte_size < want) {
            char sh[160];
            oip_shape_str(sh, sizeof(sh), r->batch, desc->item_shape, desc->item_ndim);
            oip_path_key(d, "outputs");
            oip_path_index(d, (size_t)i);
            oip_path_key(d, "parameters.shared_memory_byte_size");
            return oip_fail(d, SQ_BAD_TENSOR, "%llu bytes cannot hold FP32 %s (%zu bytes)",
                            (unsigned long long)s->shm.byte_size, sh, want);
        }
    }
    return 0;
}

int gw_oip_input_set_bytes(gw_oip_request_t *req, const gw_oip_model_t *model, int input,
                           const uint8_t *data, size_t len, char *err, size_t errlen)
{
    if (errlen > 0)
        err[0] = '\0';
    if (input < 0 || input >= model->ninputs || req->inputs[input].shm.region[0] == '\0' ||
        req->inputs[input].rows == NULL || len != req->inputs[input].shm.byte_size) {
        snprintf(err, errlen, "input %d: not in shared memory, or not %zu bytes", input, len);
        return SQ_INVAL;
    }
    gw_oip_input_t *in = &req->inputs[input];
    oip_dec_t d = {.model = model, .req = req, .err = err, .errlen = errlen};
    int n = snprintf(d.path, sizeof(d.path), "inputs[%d] (region \"%s\")", in->position,
                     in->shm.region);
    d.plen = n > 0 && (size_t)n < sizeof(d.path) ? (size_t)n : sizeof(d.path) - 1;
    return oip_split_rows(&d, in, data, len, (size_t)item_elems(&model->inputs[input]), req->batch);
}

int gw_oip_request_parse(const uint8_t *body, size_t len, long long header_len,
                         const gw_oip_model_t *model, gw_oip_request_t *out, char *err,
                         size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->slo_ms = -1;
    out->header_len = -1;
    if (errlen > 0)
        err[0] = '\0';
    int rc = check_model(model, err, errlen);
    if (rc != 0)
        return rc;
    oip_dec_t d = {.model = model,
                   .req = out,
                   .body = body,
                   .len = len,
                   .header_len = header_len,
                   .err = err,
                   .errlen = errlen};
    rc = parse_body(&d);
    if (rc != 0) {
        /* Nothing half-decoded leaks out: the caller sees a disposable,
         * empty request. */
        gw_oip_request_dispose(out);
    }
    return rc;
}
