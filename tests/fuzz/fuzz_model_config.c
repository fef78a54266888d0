/* libFuzzer target for the model configuration an operator uploads
 * (gateway/model_config.c): the config JSON, parsed for an ONNX model and
 * for an emulated one, and the labels file.
 *
 * Input: the bytes of the config (which also go, as they are, through
 * gw_labels_parse, so the labels seeds are plain text files). The input is
 * copied into a buffer of its exact size, not terminated. A config that
 * parses must hold what the header promises (a valid name, values in their
 * documented ranges, a profile for an emulated model, max_batch covering the
 * profile, one label per class); a failure must be SQ_BAD_JSON or
 * SQ_BAD_CONFIG with a message that names the path ("config...") and own
 * nothing. Labels must come back as a non-empty array of short strings,
 * one per line, or NULL with a reason. */
#include <gw_codec.h>
#include <sq.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_config(const gw_model_config_t *c, int emulated)
{
    if (!gw_model_name_ok(c->name, strlen(c->name)) || c->version < 1 ||
        !(c->default_slo_ms == 0 || (c->default_slo_ms > 0 && c->default_slo_ms <= 3600000)) ||
        c->max_batch < 0 || c->max_batch > 1024 || c->emulated != emulated)
        abort();
    if (strcmp(c->resize, "bilinear") != 0 && strcmp(c->resize, "nearest") != 0)
        abort();
    if (strcmp(c->channel_order, "RGB") != 0 && strcmp(c->channel_order, "BGR") != 0)
        abort();
    for (int i = 0; i < 3; i++)
        if (!isfinite(c->mean[i]) || !(c->std[i] > 0) || !isfinite(c->std[i]))
            abort();
    if (c->labels != NULL && (!json_is_array(c->labels) || json_array_size(c->labels) == 0))
        abort();
    if (!emulated) {
        if (c->nrows != 0 || c->linear)
            abort();
        return;
    }
    if (c->linear == (c->nrows > 0) || c->nrows < 0 || c->nrows > GW_MAX_PROFILE_ROWS ||
        c->max_batch < 1)
        abort();
    if (c->linear && !(c->alpha_ms + c->beta_ms > 0))
        abort();
    for (int i = 0; i < c->nrows; i++)
        if (c->rows[i].batch < 1 || c->rows[i].batch > c->max_batch || !(c->rows[i].mean_us > 0) ||
            !(c->rows[i].std_us >= 0))
            abort();
    if (!(c->memory_mb > 0) || c->num_classes < 1 || c->input_shape[0] < 1 ||
        c->input_shape[0] > 4 || c->input_shape[1] < 1 || c->input_shape[2] < 1)
        abort();
    if (c->labels != NULL && (int)json_array_size(c->labels) != c->num_classes)
        abort();
}

static void fuzz_config(const char *text, size_t len, int emulated)
{
    static gw_model_config_t *cfg; /* ~25 KB of profile rows, on the heap for ASan */
    if (cfg == NULL && (cfg = malloc(sizeof(*cfg))) == NULL)
        abort();
    char err[256];
    err[0] = '\0';
    int rc = gw_model_config_parse(text, len, emulated, cfg, err, sizeof(err));
    if (rc == 0) {
        check_config(cfg, emulated);
    } else if ((rc != SQ_BAD_JSON && rc != SQ_BAD_CONFIG) || strncmp(err, "config", 6) != 0 ||
               cfg->labels != NULL) {
        abort();
    }
    gw_model_config_dispose(cfg);
    gw_model_config_dispose(NULL);
}

static void fuzz_labels(const char *text, size_t len)
{
    char err[256];
    err[0] = '\0';
    json_t *labels = gw_labels_parse(text, len, err, sizeof(err));
    if (labels == NULL) {
        if (strncmp(err, "labels:", 7) != 0)
            abort();
        return;
    }
    /* One label per line; an empty last line ("" or a lone CR after the
     * last LF, or the whole file) is no label. */
    size_t n = json_array_size(labels), lines = 1, last = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\n') {
            lines++;
            last = i + 1;
        }
    }
    if (len == last || (len == last + 1 && text[last] == '\r'))
        lines--;
    if (!json_is_array(labels) || n == 0 || n != lines)
        abort();
    for (size_t i = 0; i < n; i++) {
        json_t *l = json_array_get(labels, i);
        if (!json_is_string(l) || json_string_length(l) > 256 ||
            memchr(json_string_value(l), '\n', json_string_length(l)) != NULL)
            abort();
    }
    json_decref(labels);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    if (text == NULL)
        abort();
    memcpy(text, data, size);
    fuzz_config(text, size, 0);
    fuzz_config(text, size, 1);
    fuzz_labels(text, size);
    free(text);
    return 0;
}
