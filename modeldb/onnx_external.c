/* ONNX external data (mdb_graph.h): a model whose weights live in files
 * beside the .onnx (onnx.save_model(..., save_as_external_data=True), and
 * every model past protobuf's 2 GB) is kept as one bundle of its files, so
 * that the DB, a restart, a standby and a worker see one blob as for any
 * model. The bundle and every tensor's location, offset and length are
 * upload input: all of them are checked before a byte is read. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include "onnx.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 'S' opens the bundle: as protobuf it would be field 10 of wire type 3 (a
 * group), which the wire check refuses, so no ONNX file starts this way. */
static const char bundle_magic[8] = {'S', 'Q', 'O', 'N', 'N', 'X', 'D', '1'};

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

int mdb_onnx_location_ok(const char *loc, size_t len)
{
    if (len == 0 || len > MDB_ONNX_LOCATION_MAX || loc[0] == '/')
        return 0;
    const char *p = loc, *end = loc + len;
    while (p < end) {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        const char *seg_end = slash ? slash : end;
        size_t n = (size_t)(seg_end - p);
        if (n == 0 || (n == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        p = seg_end + (slash != NULL);
        if (slash != NULL && p == end)
            return 0; /* a trailing slash names a directory */
    }
    for (size_t i = 0; i < len; i++)
        if (loc[i] == '\\' || loc[i] == '\0' || (unsigned char)loc[i] < 0x20)
            return 0;
    return 1;
}

size_t mdb_onnx_bundle_header(const mdb_onnx_file_t *files, int n, uint8_t *out, size_t cap)
{
    size_t need = sizeof(bundle_magic) + 4;
    for (int i = 0; i < n; i++)
        need += 4 + files[i].name_len + 8;
    if (out == NULL || cap < need)
        return need;
    uint8_t *p = out;
    memcpy(p, bundle_magic, sizeof(bundle_magic));
    p += sizeof(bundle_magic);
    put_u32(p, (uint32_t)n);
    p += 4;
    for (int i = 0; i < n; i++) {
        put_u32(p, (uint32_t)files[i].name_len);
        memcpy(p + 4, files[i].name, files[i].name_len);
        p += 4 + files[i].name_len;
        put_u64(p, (uint64_t)files[i].len);
        p += 8;
    }
    return need;
}

int mdb_onnx_is_bundle(const void *bytes, size_t len)
{
    return len >= sizeof(bundle_magic) && memcmp(bytes, bundle_magic, sizeof(bundle_magic)) == 0;
}

int mdb_onnx_bundle_parse(const void *bytes, size_t len, mdb_onnx_file_t *files, int max,
                          int *nfiles, char *err, size_t errlen)
{
    const uint8_t *p = bytes, *end = p + len;
    *nfiles = 0;
    if (!mdb_onnx_is_bundle(bytes, len) || end - p < (ptrdiff_t)sizeof(bundle_magic) + 4) {
        snprintf(err, errlen, "not a model bundle");
        return SQ_BAD_MODEL;
    }
    p += sizeof(bundle_magic);
    uint64_t n = get_le(p, 4);
    p += 4;
    if (n < 1 || n > (uint64_t)max) {
        snprintf(err, errlen, "a model bundle of %llu files (1..%d)", (unsigned long long)n, max);
        return SQ_BAD_MODEL;
    }
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (end - p < 4) {
            snprintf(err, errlen, "the model bundle's table is truncated");
            return SQ_BAD_MODEL;
        }
        uint64_t nl = get_le(p, 4);
        if (nl > MDB_ONNX_LOCATION_MAX || (uint64_t)(end - p) < 4 + nl + 8) {
            snprintf(err, errlen, "the model bundle's table is truncated");
            return SQ_BAD_MODEL;
        }
        files[i].name = (const char *)p + 4;
        files[i].name_len = (size_t)nl;
        p += 4 + nl;
        files[i].len = (size_t)get_le(p, 8);
        p += 8;
        if (files[i].len > (uint64_t)len || (total += files[i].len) > (uint64_t)len) {
            snprintf(err, errlen, "the model bundle's files overrun it");
            return SQ_BAD_MODEL;
        }
    }
    if (total != (uint64_t)(end - p)) {
        snprintf(err, errlen, "the model bundle holds %llu bytes after its table, not %llu",
                 (unsigned long long)(end - p), (unsigned long long)total);
        return SQ_BAD_MODEL;
    }
    for (uint64_t i = 0; i < n; i++) {
        files[i].data = p;
        p += files[i].len;
    }
    *nfiles = (int)n;
    return 0;
}

/* The value of key in a tensor's external_data, or NULL. */
static const char *ext_value(const Onnx__TensorProto *tp, const char *key)
{
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *kv = tp->external_data[i];
        if (kv != NULL && kv->key != NULL && strcmp(kv->key, key) == 0)
            return kv->value != NULL ? kv->value : "";
    }
    return NULL;
}

/* A decimal string of external_data ("offset", "length"), or -1. */
static int64_t ext_number(const char *s)
{
    if (s == NULL || *s == '\0' || strlen(s) > 18)
        return -1;
    int64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

int mdb_onnx_external_data(const Onnx__TensorProto *tp, const char *name,
                           const mdb_onnx_file_t *files, int nfiles, size_t nbytes,
                           const uint8_t **data, int *file, char *err, size_t errlen)
{
    const char *loc = ext_value(tp, "location");
    if (loc == NULL) {
        snprintf(err, errlen, "tensor '%s': external data without a location", name);
        return SQ_BAD_MODEL;
    }
    size_t loc_len = strlen(loc);
    if (!mdb_onnx_location_ok(loc, loc_len)) {
        snprintf(err, errlen,
                 "tensor '%s': external data location '%.200s' is not a relative path inside "
                 "the model's directory (no '..', no leading '/')",
                 name, loc);
        return SQ_BAD_MODEL;
    }
    const mdb_onnx_file_t *f = NULL;
    for (int i = 0; i < nfiles && f == NULL; i++)
        if (files[i].name_len == loc_len && memcmp(files[i].name, loc, loc_len) == 0) {
            f = &files[i];
            *file = i;
        }
    if (f == NULL) {
        snprintf(err, errlen,
                 "tensor '%s': the model's external data file '%.200s' was not uploaded (send it "
                 "as a part named '%.200s' beside the model)",
                 name, loc, loc);
        return SQ_BAD_MODEL;
    }
    const char *off_s = ext_value(tp, "offset"), *len_s = ext_value(tp, "length");
    int64_t offset = off_s != NULL ? ext_number(off_s) : 0;
    int64_t length = len_s != NULL ? ext_number(len_s) : (int64_t)nbytes;
    if (offset < 0 || length < 0) {
        snprintf(err, errlen,
                 "tensor '%s': external data offset '%.32s' or length '%.32s' is not "
                 "a number",
                 name, off_s ? off_s : "", len_s ? len_s : "");
        return SQ_BAD_MODEL;
    }
    if ((uint64_t)length != nbytes) {
        snprintf(err, errlen, "tensor '%s': external data of %lld bytes, its shape needs %zu", name,
                 (long long)length, nbytes);
        return SQ_BAD_MODEL;
    }
    if ((uint64_t)offset > f->len || (uint64_t)length > f->len - (uint64_t)offset) {
        snprintf(err, errlen, "tensor '%s': bytes %lld..%lld of '%.200s', which holds %zu bytes",
                 name, (long long)offset, (long long)(offset + length), loc, f->len);
        return SQ_BAD_MODEL;
    }
    *data = (const uint8_t *)f->data + offset;
    return 0;
}
