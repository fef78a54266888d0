/* ONNX external data (modeldb/onnx_external.c): a model whose tensors live
 * in data files beside the .onnx, given as its files or as their bundle,
 * imports as the same model with its data inline; every location, offset
 * and length is upload input and is checked. */
#include "onnx_util.h"

#include <mdb_graph.h>

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE 4096

/* Data files the test writes tensors into. */
typedef struct {
    const char *name;
    uint8_t bytes[MAX_FILE];
    size_t len;
} data_file_t;

static void ext_entry(mb_t *b, Onnx__TensorProto *t, const char *key, const char *value)
{
    Onnx__StringStringEntryProto *kv = mb_alloc(b, sizeof(*kv));
    onnx__string_string_entry_proto__init(kv);
    kv->key = mb_str(b, key);
    kv->value = mb_str(b, value);
    t->external_data[t->n_external_data++] = kv;
}

/* Moves initializer name's raw data to file f at offset (zero padding
 * before it), as onnx.save_model(..., save_as_external_data=True) does. */
static void externalize(mb_t *b, const char *name, data_file_t *f, size_t offset)
{
    Onnx__TensorProto *t = NULL;
    for (size_t i = 0; i < b->graph.n_initializer; i++)
        if (strcmp(b->inits[i]->name, name) == 0)
            t = b->inits[i];
    cr_assert_not_null(t, "no initializer %s", name);
    cr_assert_leq(offset + t->raw_data.len, MAX_FILE);
    memcpy(f->bytes + offset, t->raw_data.data, t->raw_data.len);
    if (offset + t->raw_data.len > f->len)
        f->len = offset + t->raw_data.len;
    char num[32];
    t->external_data = mb_alloc(b, 4 * sizeof(*t->external_data));
    ext_entry(b, t, "location", f->name);
    snprintf(num, sizeof(num), "%zu", offset);
    ext_entry(b, t, "offset", num);
    snprintf(num, sizeof(num), "%zu", t->raw_data.len);
    ext_entry(b, t, "length", num);
    t->has_raw_data = 0;
    t->raw_data.len = 0;
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

/* The value of external_data key of initializer name, to tamper with. */
static Onnx__StringStringEntryProto *ext_of(mb_t *b, const char *name, const char *key)
{
    for (size_t i = 0; i < b->graph.n_initializer; i++) {
        Onnx__TensorProto *t = b->inits[i];
        for (size_t k = 0; strcmp(t->name, name) == 0 && k < t->n_external_data; k++)
            if (strcmp(t->external_data[k]->key, key) == 0)
                return t->external_data[k];
    }
    cr_assert_fail("no %s in %s's external data", key, name);
    return NULL;
}

/* Imports the builder's model with the data files as an upload gives them. */
static int import_with(mb_t *b, data_file_t *files, int n, mdb_graph_t **g, mdb_import_error_t *err)
{
    size_t len;
    uint8_t *onnx = mb_pack(b, &len);
    mdb_onnx_file_t f[8] = {{"model.onnx", 10, onnx, len}};
    for (int i = 0; i < n; i++)
        f[i + 1] =
            (mdb_onnx_file_t){files[i].name, strlen(files[i].name), files[i].bytes, files[i].len};
    int rc = mdb_onnx_import_files(f, n + 1, NULL, g, err);
    free(onnx);
    return rc;
}

/* The bundle of the builder's model and the data files, as stored. */
static uint8_t *bundle_of(mb_t *b, data_file_t *files, int n, size_t *len)
{
    size_t onnx_len;
    uint8_t *onnx = mb_pack(b, &onnx_len);
    mdb_onnx_file_t f[8] = {{"model.onnx", 10, onnx, onnx_len}};
    for (int i = 0; i < n; i++)
        f[i + 1] =
            (mdb_onnx_file_t){files[i].name, strlen(files[i].name), files[i].bytes, files[i].len};
    size_t table = mdb_onnx_bundle_header(f, n + 1, NULL, 0);
    *len = table;
    for (int i = 0; i <= n; i++)
        *len += f[i].len;
    uint8_t *out = malloc(*len), *p = out + table;
    cr_assert_eq(mdb_onnx_bundle_header(f, n + 1, out, table), table);
    for (int i = 0; i <= n; i++) {
        memcpy(p, f[i].data, f[i].len);
        p += f[i].len;
    }
    free(onnx);
    return out;
}

/* Every initializer of a holds the bytes it holds in b. */
static void expect_same_weights(const mdb_graph_t *a, const mdb_graph_t *b)
{
    const char *names[] = {"w", "b", "fc_w", "fc_b"};
    for (int i = 0; i < 4; i++) {
        int ta = mdb_graph_find_tensor(a, names[i]), tb = mdb_graph_find_tensor(b, names[i]);
        cr_assert(ta >= 0 && tb >= 0, "%s", names[i]);
        cr_assert_eq(a->tensors[ta].nbytes, b->tensors[tb].nbytes, "%s", names[i]);
        cr_assert(memcmp(a->tensors[ta].data, b->tensors[tb].data, a->tensors[ta].nbytes) == 0,
                  "%s's bytes differ", names[i]);
    }
}

static mdb_graph_t *inline_reference(void)
{
    mb_t b;
    mb_small_cnn(&b, 13);
    size_t len;
    uint8_t *bytes = mb_pack(&b, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s", err.detail);
    free(bytes);
    mb_free(&b);
    return g;
}

/* The small CNN with w and b in "weights.bin" (b after padding) and the
 * classifier's in "head/fc.bin": the model's tensors split across files. */
static void split_cnn(mb_t *b, data_file_t files[2])
{
    memset(files, 0, 2 * sizeof(*files));
    files[0].name = "weights.bin";
    files[1].name = "head/fc.bin";
    mb_small_cnn(b, 13);
    externalize(b, "w", &files[0], 0);
    externalize(b, "b", &files[0], 512);
    externalize(b, "fc_w", &files[1], 0);
    externalize(b, "fc_b", &files[1], 160);
}

Test(onnx_external, tensors_split_across_two_files_import_as_the_inline_model)
{
    mdb_graph_t *ref = inline_reference();
    mb_t b;
    data_file_t files[2];
    split_cnn(&b, files);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(import_with(&b, files, 2, &g, &err), 0, "%s", err.detail);
    expect_same_weights(g, ref);
    cr_assert_eq(mdb_graph_param_bytes(g), mdb_graph_param_bytes(ref));
    mdb_graph_free(g);
    /* The stored bundle imports the same through mdb_onnx_import (what a
     * worker and a restart do). */
    size_t len;
    uint8_t *bundle = bundle_of(&b, files, 2, &len);
    cr_assert(mdb_onnx_is_bundle(bundle, len));
    cr_assert_eq(mdb_onnx_import(bundle, len, &g, &err), 0, "%s", err.detail);
    expect_same_weights(g, ref);
    mdb_graph_free(g);
    free(bundle);
    mdb_graph_free(ref);
    mb_free(&b);
}

Test(onnx_external, a_missing_data_file_is_refused_naming_it)
{
    mb_t b;
    data_file_t files[2];
    split_cnn(&b, files);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(import_with(&b, files, 1, &g, &err), SQ_BAD_MODEL);
    cr_assert_null(g);
    cr_assert_not_null(strstr(err.detail, "'head/fc.bin' was not uploaded"), "%s", err.detail);
    cr_assert_eq(sq_err_http_status(SQ_BAD_MODEL), 400);
    /* A file no tensor reads is refused too, and which one said. */
    data_file_t three[3];
    memcpy(three, files, sizeof(files));
    three[2] = (data_file_t){.name = "unused.bin", .len = 4};
    cr_assert_eq(import_with(&b, three, 3, &g, &err), SQ_BAD_MODEL);
    cr_assert_null(g);
    cr_assert_eq(err.unused_file, 3, "%s", err.detail);
    cr_assert_not_null(strstr(err.detail, "'unused.bin' is read by no tensor"), "%s", err.detail);
    /* A lone .onnx with external data says the same. */
    size_t len;
    uint8_t *onnx = mb_pack(&b, &len);
    cr_assert_eq(mdb_onnx_import(onnx, len, &g, &err), SQ_BAD_MODEL);
    cr_assert_not_null(strstr(err.detail, "'weights.bin' was not uploaded"), "%s", err.detail);
    free(onnx);
    mb_free(&b);
}

Test(onnx_external, locations_outside_the_model_directory_are_refused)
{
    static const char *const bad[] = {
        "../weights.bin", "/etc/passwd", "head/../../x", "head//fc.bin",
        "head\\fc.bin",   "..",          "head/",        ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert(!mdb_onnx_location_ok(bad[i], strlen(bad[i])), "%s", bad[i]);
        mb_t b;
        data_file_t files[2];
        split_cnn(&b, files);
        ext_of(&b, "fc_w", "location")->value = mb_str(&b, bad[i]);
        mdb_graph_t *g = NULL;
        mdb_import_error_t err;
        cr_assert_eq(import_with(&b, files, 2, &g, &err), SQ_BAD_MODEL, "%s", bad[i]);
        cr_assert_not_null(strstr(err.detail, "not a relative path"), "%s: %s", bad[i], err.detail);
        mb_free(&b);
    }
    static const char *const good[] = {"weights.bin", "head/fc.bin", "a..b", ".hidden",
                                       "model.onnx.data"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        cr_assert(mdb_onnx_location_ok(good[i], strlen(good[i])), "%s", good[i]);
}

Test(onnx_external, offsets_and_lengths_are_checked_against_the_file_and_the_shape)
{
    static const struct {
        const char *key, *value, *says;
    } cases[] = {
        {"offset", "4000", "which holds"},        /* fc_w's 160 bytes past the file's end */
        {"offset", "100", "which holds"},         /* ends 60 bytes past it (file: 200) */
        {"offset", "-1", "is not a number"},      /* negative */
        {"offset", "0x10", "is not a number"},    /* not decimal */
        {"length", "156", "its shape needs 160"}, /* shorter than the shape */
        {"length", "99999999999999999999", "is not a number"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mb_t b;
        data_file_t files[2];
        split_cnn(&b, files);
        ext_of(&b, "fc_w", cases[i].key)->value = mb_str(&b, cases[i].value);
        mdb_graph_t *g = NULL;
        mdb_import_error_t err;
        cr_assert_eq(import_with(&b, files, 2, &g, &err), SQ_BAD_MODEL, "%s=%s", cases[i].key,
                     cases[i].value);
        cr_assert_not_null(strstr(err.detail, cases[i].says), "%s=%s: %s", cases[i].key,
                           cases[i].value, err.detail);
        cr_assert_not_null(strstr(err.detail, "fc_w"), "%s", err.detail);
        mb_free(&b);
    }
    /* Without offset and length: the tensor is the file's first bytes. */
    mb_t b;
    data_file_t files[2];
    split_cnn(&b, files);
    for (size_t i = 0; i < b.graph.n_initializer; i++)
        if (strcmp(b.inits[i]->name, "w") == 0)
            b.inits[i]->n_external_data = 1;
    mdb_graph_t *g = NULL, *ref = inline_reference();
    mdb_import_error_t err;
    cr_assert_eq(import_with(&b, files, 2, &g, &err), 0, "%s", err.detail);
    expect_same_weights(g, ref);
    mdb_graph_free(g);
    mdb_graph_free(ref);
    mb_free(&b);
}

/* A bundle is stored input too (a DB row someone edited, a worker's bytes):
 * every truncation of one, and tables that lie about sizes, are refused. */
Test(onnx_external, truncated_or_lying_bundles_are_refused_without_crashing)
{
    mb_t b;
    data_file_t files[2];
    split_cnn(&b, files);
    size_t len;
    uint8_t *bundle = bundle_of(&b, files, 2, &len);
    for (size_t cut = 0; cut < len; cut += cut < 200 ? 1 : 37) {
        uint8_t *copy = malloc(cut + 1);
        memcpy(copy, bundle, cut);
        mdb_graph_t *g = NULL;
        mdb_import_error_t err;
        cr_assert_neq(mdb_onnx_import(copy, cut, &g, &err), 0, "cut at %zu", cut);
        cr_assert_null(g);
        free(copy);
    }
    /* File 1's size (after the magic, the count and file 0's entry) made
     * larger than the bundle. */
    size_t at = 8 + 4 + 4 + 10 + 8 + 4 + strlen("weights.bin");
    for (int i = 0; i < 8; i++)
        bundle[at + (size_t)i] = 0xff;
    mdb_onnx_file_t f[8];
    int n = 0;
    char why[256];
    cr_assert_eq(mdb_onnx_bundle_parse(bundle, len, f, 8, &n, why, sizeof(why)), SQ_BAD_MODEL);
    cr_assert_not_null(strstr(why, "overrun"), "%s", why);
    free(bundle);
    mb_free(&b);
}
