/* The worker tests' exports (scripts/export_models.py writes them into
 * $SQUISH_TEST_MODELS at build time), read whole. */
#ifndef TEST_FILES_H
#define TEST_FILES_H

#include <criterion/criterion.h>
#include <mdb_graph.h>
#include <stdio.h>
#include <stdlib.h>

/* The exports' folder; fails the test when the variable is not set. */
static inline const char *test_models_dir(void)
{
    const char *d = getenv("SQUISH_TEST_MODELS");
    cr_assert_not_null(d, "SQUISH_TEST_MODELS is not set");
    return d;
}

/* dir/name whole, malloc'd (one byte more than *len); fails the test when
 * the file is missing. */
static inline void *test_slurp_in(const char *dir, const char *name, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "missing %s (run scripts/export_models.py)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)n + 1);
    cr_assert_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* name in the exports' folder. */
static inline void *test_slurp(const char *name, size_t *len)
{
    return test_slurp_in(test_models_dir(), name, len);
}

/* The export's inputs at batch and torch's outputs for them
 * (name.bB.input.f32, batch * item floats, and .output.f32, batch * per),
 * their sizes checked; the caller frees both. */
static inline void test_load_refs(const char *name, int batch, int64_t item, int64_t per,
                                  float **in, float **out)
{
    char file[256];
    size_t in_len, out_len;
    snprintf(file, sizeof(file), "%s.b%d.input.f32", name, batch);
    *in = test_slurp(file, &in_len);
    snprintf(file, sizeof(file), "%s.b%d.output.f32", name, batch);
    *out = test_slurp(file, &out_len);
    cr_assert_eq(in_len, (size_t)(batch * item) * sizeof(float), "%s: input size", file);
    cr_assert_eq(out_len, (size_t)(batch * per) * sizeof(float), "%s: output size", file);
}

/* torch's output k >= 1 of a multi-output export at batch
 * (name.bB.outputK.f32, batch * per floats), its size checked; the caller
 * frees it. */
static inline float *test_load_output(const char *name, int batch, int k, int64_t per)
{
    char file[256];
    size_t len;
    snprintf(file, sizeof(file), "%s.b%d.output%d.f32", name, batch, k);
    float *out = test_slurp(file, &len);
    cr_assert_eq(len, (size_t)(batch * per) * sizeof(float), "%s: output size", file);
    return out;
}

/* The export name.onnx imported (the test fails on a refusal, naming its
 * ops and why); the caller frees the graph. */
static inline mdb_graph_t *test_import(const char *name)
{
    char file[256];
    size_t len;
    snprintf(file, sizeof(file), "%s.onnx", name);
    void *bytes = test_slurp(file, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "import %s: %s %s", name, err.ops,
                 err.detail);
    free(bytes);
    return g;
}

#endif
