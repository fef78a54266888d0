#include "gw_codec.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_LABELS 100000
#define MAX_LABEL_LEN 256

int gw_model_name_ok(const char *name, size_t len)
{
    if (len == 0 || len > MDB_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '_' && c != '-' && c != '.')))
            return 0;
    }
    return 1;
}

static int bad(char *err, size_t errlen, const char *path, const char *why)
{
    snprintf(err, errlen, "config.%s: %s", path, why);
    return SQ_BAD_CONFIG;
}

int gw_version_policy_parse(json_t *v, gw_version_policy_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    json_t *x;
    if (!json_is_object(v) || json_object_size(v) != 1)
        return bad(err, errlen, "version_policy",
                   "expected one of {\"latest\": {\"num_versions\": N}}, {\"specific\": "
                   "{\"versions\": [...]}} or {\"all\": {}}");
    if ((x = json_object_get(v, "all")) != NULL) {
        if (!json_is_object(x) || json_object_size(x) != 0)
            return bad(err, errlen, "version_policy.all", "expected {}");
        out->kind = GW_VP_ALL;
        return 0;
    }
    if ((x = json_object_get(v, "latest")) != NULL) {
        json_t *n = json_is_object(x) ? json_object_get(x, "num_versions") : NULL;
        if (!json_is_object(x) || json_object_size(x) != 1 || !json_is_integer(n) ||
            json_integer_value(n) < 1 || json_integer_value(n) > 1000)
            return bad(err, errlen, "version_policy.latest.num_versions",
                       "expected an integer in 1..1000");
        out->kind = GW_VP_LATEST;
        out->latest = (int)json_integer_value(n);
        return 0;
    }
    if ((x = json_object_get(v, "specific")) != NULL) {
        json_t *a = json_is_object(x) ? json_object_get(x, "versions") : NULL;
        if (!json_is_object(x) || json_object_size(x) != 1 || !json_is_array(a) ||
            json_array_size(a) < 1 || json_array_size(a) > GW_MAX_POLICY_VERSIONS)
            return bad(err, errlen, "version_policy.specific.versions",
                       "expected 1 to 64 version numbers");
        size_t i;
        json_t *e;
        json_array_foreach(a, i, e)
        {
            if (!json_is_integer(e) || json_integer_value(e) < 1 ||
                json_integer_value(e) > 1000000000)
                return bad(err, errlen, "version_policy.specific.versions",
                           "expected integers in 1..1000000000");
            out->versions[out->nversions++] = (int)json_integer_value(e);
        }
        out->kind = GW_VP_SPECIFIC;
        return 0;
    }
    return bad(err, errlen, "version_policy", "expected \"latest\", \"specific\" or \"all\"");
}

void gw_version_policy_describe(const gw_version_policy_t *p, char *buf, size_t len)
{
    if (p->kind == GW_VP_LATEST) {
        snprintf(buf, len, "the latest %d ready", p->latest);
    } else if (p->kind == GW_VP_SPECIFIC) {
        size_t o = (size_t)snprintf(buf, len, "versions");
        for (int i = 0; i < p->nversions && o < len; i++)
            o += (size_t)snprintf(buf + o, len - o, "%s %d", i ? "," : "", p->versions[i]);
    } else {
        snprintf(buf, len, "all");
    }
}

static int get_number(json_t *v, double *out)
{
    if (!json_is_number(v))
        return -1;
    *out = json_number_value(v);
    return isfinite(*out) ? 0 : -1;
}

static int parse_triple(json_t *v, double out[3], double lo, double hi)
{
    if (!json_is_array(v) || json_array_size(v) != 3)
        return -1;
    for (size_t i = 0; i < 3; i++) {
        if (get_number(json_array_get(v, i), &out[i]) != 0 || out[i] < lo || out[i] > hi)
            return -1;
    }
    return 0;
}

static int check_labels(json_t *labels, char *err, size_t errlen)
{
    if (!json_is_array(labels) || json_array_size(labels) == 0 ||
        json_array_size(labels) > MAX_LABELS)
        return bad(err, errlen, "labels", "expected a non-empty array of strings");
    size_t i;
    json_t *l;
    json_array_foreach(labels, i, l)
    {
        if (!json_is_string(l) || json_string_length(l) > MAX_LABEL_LEN) {
            char path[48];
            snprintf(path, sizeof(path), "labels[%zu]", i);
            return bad(err, errlen, path, "expected a string of at most 256 bytes");
        }
    }
    return 0;
}

json_t *gw_labels_parse(const char *text, size_t len, char *err, size_t errlen)
{
    json_t *labels = json_array();
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && text[i] != '\n')
            continue;
        size_t end = i;
        if (end > start && text[end - 1] == '\r')
            end--;
        if (i == len && end == start)
            break; /* trailing newline */
        if (end - start > MAX_LABEL_LEN || json_array_size(labels) >= MAX_LABELS) {
            snprintf(err, errlen, "labels: line %zu too long or too many labels",
                     json_array_size(labels) + 1);
            json_decref(labels);
            return NULL;
        }
        json_t *s = json_stringn(text + start, end - start);
        if (s == NULL) {
            snprintf(err, errlen, "labels: line %zu is not UTF-8", json_array_size(labels) + 1);
            json_decref(labels);
            return NULL;
        }
        json_array_append_new(labels, s);
        start = i + 1;
    }
    if (json_array_size(labels) == 0) {
        snprintf(err, errlen, "labels: the file is empty");
        json_decref(labels);
        return NULL;
    }
    return labels;
}

static int parse_profile(json_t *p, gw_model_config_t *cfg, char *err, size_t errlen)
{
    if (!json_is_object(p))
        return bad(err, errlen, "profile", "expected an object");
    json_t *alpha = json_object_get(p, "alpha_ms"), *beta = json_object_get(p, "beta_ms");
    json_t *batch = json_object_get(p, "batch"), *lat = json_object_get(p, "latency_ms");
    if (alpha != NULL || beta != NULL) {
        if (get_number(alpha, &cfg->alpha_ms) != 0 || cfg->alpha_ms < 0 || cfg->alpha_ms > 1e5)
            return bad(err, errlen, "profile.alpha_ms", "expected a number in 0..100000");
        if (get_number(beta, &cfg->beta_ms) != 0 || cfg->beta_ms < 0 || cfg->beta_ms > 1e6)
            return bad(err, errlen, "profile.beta_ms", "expected a number in 0..1000000");
        if (cfg->alpha_ms + cfg->beta_ms <= 0)
            return bad(err, errlen, "profile", "l(1) = alpha + beta must be positive");
        cfg->linear = 1;
        return 0;
    }
    if (!json_is_array(batch) || !json_is_array(lat) || json_array_size(batch) == 0 ||
        json_array_size(batch) != json_array_size(lat) ||
        json_array_size(batch) > GW_MAX_PROFILE_ROWS)
        return bad(err, errlen, "profile",
                   "expected alpha_ms and beta_ms, or batch and latency_ms arrays of one length");
    json_t *stdv = json_object_get(p, "latency_std_ms");
    if (stdv != NULL && (!json_is_array(stdv) || json_array_size(stdv) != json_array_size(batch)))
        return bad(err, errlen, "profile.latency_std_ms", "expected one value per batch size");
    cfg->nrows = (int)json_array_size(batch);
    for (int i = 0; i < cfg->nrows; i++) {
        json_t *b = json_array_get(batch, (size_t)i);
        double l, sd = 0;
        char path[48];
        if (!json_is_integer(b) || json_integer_value(b) < 1 || json_integer_value(b) > 1024) {
            snprintf(path, sizeof(path), "profile.batch[%d]", i);
            return bad(err, errlen, path, "expected an integer in 1..1024");
        }
        if (get_number(json_array_get(lat, (size_t)i), &l) != 0 || l <= 0 || l > 1e6) {
            snprintf(path, sizeof(path), "profile.latency_ms[%d]", i);
            return bad(err, errlen, path, "expected a positive number of ms");
        }
        if (stdv != NULL &&
            (get_number(json_array_get(stdv, (size_t)i), &sd) != 0 || sd < 0 || sd > 1e6)) {
            snprintf(path, sizeof(path), "profile.latency_std_ms[%d]", i);
            return bad(err, errlen, path, "expected a number >= 0");
        }
        for (int j = 0; j < i; j++) {
            if (cfg->rows[j].batch == (int)json_integer_value(b)) {
                snprintf(path, sizeof(path), "profile.batch[%d]", i);
                return bad(err, errlen, path, "batch size listed twice");
            }
        }
        cfg->rows[i] = (mdb_profile_row_t){
            .batch = (int)json_integer_value(b), .mean_us = l * 1000.0, .std_us = sd * 1000.0};
    }
    return 0;
}

/* An emulated detector's "detections": {"mean": gamma, "slots": K}. K is
 * at most GW_EMU_DET_MAX_SLOTS and gamma at most K (a row holds K); a
 * detector has no classes, so num_classes and labels are refused. */
static int parse_detections(json_t *v, json_t *root, gw_model_config_t *cfg, char *err,
                            size_t errlen)
{
    if (!json_is_object(v))
        return bad(err, errlen, "detections", "expected {\"mean\": gamma, \"slots\": K}");
    if (json_object_get(root, "num_classes") != NULL || json_object_get(root, "labels") != NULL)
        return bad(err, errlen, "detections",
                   "a detector has no classes: num_classes and labels do not apply");
    const char *key;
    json_t *f;
    json_object_foreach(v, key, f)
    {
        if (strcmp(key, "mean") != 0 && strcmp(key, "slots") != 0) {
            char path[80];
            snprintf(path, sizeof(path), "detections.%s", key);
            return bad(err, errlen, path, "unknown field");
        }
    }
    cfg->det_slots = GW_EMU_DET_DEFAULT_SLOTS;
    if ((f = json_object_get(v, "slots")) != NULL) {
        if (!json_is_integer(f) || json_integer_value(f) < 1 ||
            json_integer_value(f) > GW_EMU_DET_MAX_SLOTS)
            return bad(err, errlen, "detections.slots", "expected an integer in 1..1024");
        cfg->det_slots = (int)json_integer_value(f);
    }
    f = json_object_get(v, "mean");
    if (f == NULL || get_number(f, &cfg->det_mean) != 0 || !(cfg->det_mean >= 0) ||
        cfg->det_mean > cfg->det_slots)
        return bad(err, errlen, "detections.mean",
                   "required: a number of detections per item in 0..slots");
    return 0;
}

/* An ONNX model's "input": {"shape": [...]}: a size for each dimension of
 * its input past the batch, which the importer pins the symbolic ones to
 * (and checks the static ones against: it knows the file). */
static int parse_input_pin(json_t *v, gw_model_config_t *cfg, char *err, size_t errlen)
{
    json_t *shape = json_object_get(v, "shape");
    if (!json_is_object(v) || json_object_size(v) != 1 || !json_is_array(shape) ||
        json_array_size(shape) < 1 || json_array_size(shape) > GW_INPUT_MAX_RANK)
        return bad(err, errlen, "input",
                   "expected {\"shape\": [C, H, W]}: the input's sizes past the batch, in the "
                   "model's order");
    for (size_t i = 0; i < json_array_size(shape); i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 1 ||
            json_integer_value(d) > GW_INPUT_MAX_DIM) {
            char path[32];
            snprintf(path, sizeof(path), "input.shape[%zu]", i);
            return bad(err, errlen, path, "expected a size in 1..65536");
        }
        cfg->input_shape[i] = (int)json_integer_value(d);
    }
    cfg->input_rank = (int)json_array_size(shape);
    return 0;
}

int gw_model_config_parse(const char *text, size_t len, int emulated, gw_model_config_t *cfg,
                          char *err, size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->version = 1;
    cfg->default_slo_ms = 0; /* none: best effort unless the request or squishd names one */
    snprintf(cfg->resize, sizeof(cfg->resize), "bilinear");
    snprintf(cfg->channel_order, sizeof(cfg->channel_order), "RGB");
    const double mean[3] = {0.485 * 255, 0.456 * 255, 0.406 * 255};
    const double std[3] = {0.229 * 255, 0.224 * 255, 0.225 * 255};
    memcpy(cfg->mean, mean, sizeof(mean));
    memcpy(cfg->std, std, sizeof(std));
    cfg->emulated = emulated;
    cfg->input_shape[0] = 3;
    cfg->input_shape[1] = cfg->input_shape[2] = 224;
    cfg->input_rank = emulated ? 3 : 0;
    cfg->num_classes = 1000;
    cfg->memory_mb = 100;

    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(err, errlen, "config: invalid JSON at line %d column %d: %s", jerr.line,
                 jerr.column, jerr.text);
        return SQ_BAD_JSON;
    }
    int rc = SQ_BAD_CONFIG;
    if (!json_is_object(root)) {
        snprintf(err, errlen, "config: expected a JSON object");
        goto out;
    }
    static const char *known[] = {"name",           "version",     "labels",         "preprocess",
                                  "default_slo_ms", "max_batch",   "profile",        "memory_mb",
                                  "input",          "num_classes", "version_policy", "detections",
                                  "precision",      "detector",    "segmenter"};
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        size_t k = 0;
        while (k < sizeof(known) / sizeof(known[0]) && strcmp(known[k], key) != 0)
            k++;
        if (k == sizeof(known) / sizeof(known[0])) {
            /* What was likely meant, then every field (the upload config's
             * schema: schemas/model_upload_config.schema.json). */
            char why[512];
            int slo = strcmp(key, "slo_ms") == 0 || strcmp(key, "slo") == 0 ||
                      strcmp(key, "timeout") == 0 || strcmp(key, "latency_slo_ms") == 0;
            int batch = strcmp(key, "max_batch_size") == 0 || strcmp(key, "batch") == 0;
            size_t used = (size_t)snprintf(
                why, sizeof(why), "unknown field%s; the fields are",
                slo ? " (did you mean default_slo_ms: the SLO, in ms, of the requests that name "
                      "none?)"
                : batch ? " (did you mean max_batch?)"
                        : "");
            for (size_t f = 0; f < sizeof(known) / sizeof(known[0]) && used < sizeof(why); f++)
                used += (size_t)snprintf(why + used, sizeof(why) - used, "%s %s", f ? "," : "",
                                         known[f]);
            rc = bad(err, errlen, key, why);
            goto out;
        }
    }
    v = json_object_get(root, "name");
    if (!json_is_string(v) || !gw_model_name_ok(json_string_value(v), json_string_length(v))) {
        rc = bad(err, errlen, "name",
                 "required: 1 to 64 characters of [A-Za-z0-9_.-], starting with a letter or digit");
        goto out;
    }
    snprintf(cfg->name, sizeof(cfg->name), "%s", json_string_value(v));
    if ((v = json_object_get(root, "version")) != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > 1000000000) {
            rc = bad(err, errlen, "version", "expected an integer in 1..1000000000");
            goto out;
        }
        cfg->version = (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "version_policy")) != NULL) {
        gw_version_policy_t vp;
        if ((rc = gw_version_policy_parse(v, &vp, err, errlen)) != 0)
            goto out;
        rc = SQ_BAD_CONFIG;
    }
    if ((v = json_object_get(root, "default_slo_ms")) != NULL && !json_is_null(v)) {
        if (get_number(v, &cfg->default_slo_ms) != 0 || cfg->default_slo_ms <= 0 ||
            cfg->default_slo_ms > 3600000) {
            rc = bad(err, errlen, "default_slo_ms",
                     "expected a number of ms in (0, 3600000], or null (none: "
                     "best effort)");
            goto out;
        }
    }
    if ((v = json_object_get(root, "max_batch")) != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1024) {
            rc = bad(err, errlen, "max_batch", "expected an integer in 1..1024");
            goto out;
        }
        cfg->max_batch = (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "precision")) != NULL &&
        (cfg->precision = sq_precision_parse(json_string_value(v))) < 0) {
        cfg->precision = 0;
        rc = bad(err, errlen, "precision",
                 "expected \"fp32\" (the default), \"tf32\", \"fp16\" or \"bf16\"");
        goto out;
    }
    if ((v = json_object_get(root, "labels")) != NULL) {
        if ((rc = check_labels(v, err, errlen)) != 0)
            goto out;
        cfg->labels = json_incref(v);
        rc = SQ_BAD_CONFIG;
    }
    if ((v = json_object_get(root, "preprocess")) != NULL) {
        if (!json_is_object(v)) {
            rc = bad(err, errlen, "preprocess", "expected an object");
            goto out;
        }
        json_t *f;
        json_object_foreach(v, key, f)
        {
            if (strcmp(key, "mean") == 0) {
                if (parse_triple(f, cfg->mean, -1e4, 1e4) != 0) {
                    rc = bad(err, errlen, "preprocess.mean", "expected 3 numbers (0..255 scale)");
                    goto out;
                }
            } else if (strcmp(key, "std") == 0) {
                if (parse_triple(f, cfg->std, 1e-6, 1e4) != 0) {
                    rc = bad(err, errlen, "preprocess.std", "expected 3 positive numbers");
                    goto out;
                }
            } else if (strcmp(key, "resize") == 0) {
                const char *s = json_string_value(f);
                if (s == NULL || (strcmp(s, "bilinear") != 0 && strcmp(s, "nearest") != 0)) {
                    rc = bad(err, errlen, "preprocess.resize",
                             "expected \"bilinear\" or \"nearest\"");
                    goto out;
                }
                snprintf(cfg->resize, sizeof(cfg->resize), "%s", s);
            } else if (strcmp(key, "channel_order") == 0) {
                const char *s = json_string_value(f);
                if (s == NULL || (strcmp(s, "RGB") != 0 && strcmp(s, "BGR") != 0)) {
                    rc =
                        bad(err, errlen, "preprocess.channel_order", "expected \"RGB\" or \"BGR\"");
                    goto out;
                }
                snprintf(cfg->channel_order, sizeof(cfg->channel_order), "%s", s);
            } else {
                char path[80];
                snprintf(path, sizeof(path), "preprocess.%s", key);
                rc = bad(err, errlen, path, "unknown field");
                goto out;
            }
        }
    }
    json_t *profile = json_object_get(root, "profile");
    if (!emulated) {
        if (profile != NULL || json_object_get(root, "num_classes") != NULL ||
            json_object_get(root, "memory_mb") != NULL ||
            json_object_get(root, "detections") != NULL) {
            rc = bad(err, errlen, "profile",
                     "profile, num_classes, detections and memory_mb are for emulated "
                     "models only (an ONNX model is profiled by the worker)");
            goto out;
        }
        if ((v = json_object_get(root, "input")) != NULL &&
            (rc = parse_input_pin(v, cfg, err, errlen)) != 0)
            goto out;
        rc = SQ_BAD_CONFIG;
        /* The detector block's fields are a crops_of's: image/ reads them,
         * against the graph's outputs, at upload. */
        if ((v = json_object_get(root, "detector")) != NULL) {
            if (!json_is_object(v)) {
                rc = bad(err, errlen, "detector",
                         "expected an object with a pipeline's crops_of fields (\"layout\", ...)");
                goto out;
            }
            cfg->detector = json_incref(v);
        }
        if ((v = json_object_get(root, "segmenter")) != NULL) {
            if (!json_is_boolean(v)) {
                rc = bad(err, errlen, "segmenter", "expected true or false");
                goto out;
            }
            cfg->segmenter = json_is_true(v);
        }
        if (cfg->detector != NULL && cfg->segmenter) {
            rc = bad(err, errlen, "segmenter", "a model is a detector or a segmenter, not both");
            goto out;
        }
    } else {
        if (json_object_get(root, "detector") != NULL ||
            json_object_get(root, "segmenter") != NULL) {
            rc = bad(err, errlen, "detector",
                     "detector and segmenter are for ONNX models (an emulated detector says "
                     "\"detections\")");
            goto out;
        }
        if (profile == NULL) {
            rc = bad(err, errlen, "profile", "an emulated model (no ONNX file) needs a profile");
            goto out;
        }
        if ((rc = parse_profile(profile, cfg, err, errlen)) != 0)
            goto out;
        rc = SQ_BAD_CONFIG;
        if ((v = json_object_get(root, "memory_mb")) != NULL &&
            (get_number(v, &cfg->memory_mb) != 0 || cfg->memory_mb <= 0 || cfg->memory_mb > 1e7)) {
            rc = bad(err, errlen, "memory_mb", "expected a positive number");
            goto out;
        }
        if ((v = json_object_get(root, "num_classes")) != NULL) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 ||
                json_integer_value(v) > 1000000) {
                rc = bad(err, errlen, "num_classes", "expected an integer in 1..1000000");
                goto out;
            }
            cfg->num_classes = (int)json_integer_value(v);
        }
        if ((v = json_object_get(root, "detections")) != NULL &&
            (rc = parse_detections(v, root, cfg, err, errlen)) != 0)
            goto out;
        rc = SQ_BAD_CONFIG;
        if ((v = json_object_get(root, "input")) != NULL) {
            json_t *shape = json_object_get(v, "shape");
            if (!json_is_object(v) || json_object_size(v) != 1 || !json_is_array(shape) ||
                json_array_size(shape) != 3) {
                rc = bad(err, errlen, "input", "expected {\"shape\": [C, H, W]}");
                goto out;
            }
            for (size_t i = 0; i < 3; i++) {
                json_t *d = json_array_get(shape, i);
                if (!json_is_integer(d) || json_integer_value(d) < 1 ||
                    json_integer_value(d) > (i == 0 ? 4 : 8192)) {
                    rc = bad(err, errlen, "input.shape",
                             "expected [C, H, W] with C in 1..4 and H, W in 1..8192");
                    goto out;
                }
                cfg->input_shape[i] = (int)json_integer_value(d);
            }
        }
        if (cfg->labels != NULL && (int)json_array_size(cfg->labels) != cfg->num_classes) {
            if (json_object_get(root, "num_classes") != NULL) {
                rc = bad(err, errlen, "labels", "one label per class (num_classes) expected");
                goto out;
            }
            cfg->num_classes = (int)json_array_size(cfg->labels);
        }
        if (cfg->max_batch == 0) {
            int top = cfg->linear ? 64 : 0;
            for (int i = 0; i < cfg->nrows; i++)
                if (cfg->rows[i].batch > top)
                    top = cfg->rows[i].batch;
            cfg->max_batch = top;
        }
        for (int i = 0; i < cfg->nrows; i++) {
            if (cfg->rows[i].batch > cfg->max_batch) {
                rc = bad(err, errlen, "max_batch", "smaller than a batch size in the profile");
                goto out;
            }
        }
    }
    rc = 0;
out:
    json_decref(root);
    if (rc != 0) {
        json_decref(cfg->labels);
        cfg->labels = NULL;
        json_decref(cfg->detector);
        cfg->detector = NULL;
    }
    return rc;
}

void gw_model_config_dispose(gw_model_config_t *cfg)
{
    if (cfg == NULL)
        return;
    json_decref(cfg->labels);
    cfg->labels = NULL;
    json_decref(cfg->detector);
    cfg->detector = NULL;
}
