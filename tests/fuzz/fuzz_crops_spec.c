/* libFuzzer target for a detector's output spec (gateway/image/detect.c):
 * a pipeline's crops_of and a detector's upload config "detector" block,
 * parsed, bound to a fixed detector's outputs and decoded.
 *
 * Input: the spec's JSON text up to the first NUL byte; the bytes after it
 * fill the detector's output row (floats, repeated; zeros when there are
 * none). A spec that parses must come back the same through its JSON, a
 * failure must be SQ_BAD_CONFIG with a message that names the path; a
 * bound spec decodes to at most max_crops detections, best first, each of
 * a kept class and scored at least the threshold, whose crop rectangles
 * lie inside the image. */
#include <gw_image.h>
#include <sq.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The detector: every layout's outputs side by side. */
static const struct {
    const char *name;
    int ndims;
    int64_t dims[3];
} outs[] = {
    {"boxes", 3, {1, 16, 4}}, {"scores", 2, {1, 16}},     {"cls", 3, {1, 16, 3}},
    {"labels", 2, {1, 16}},   {"output0", 3, {1, 7, 16}}, {"yolo_t", 3, {1, 16, 7}},
    {"raw", 3, {1, 896, 16}}, {"s896", 3, {1, 896, 1}},   {"sq", 3, {1, 6, 6}},
};
#define NOUTS (sizeof(outs) / sizeof(outs[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul != NULL ? (size_t)(nul - data) : size;
    json_t *v = json_loadb((const char *)data, jlen, 0, NULL);
    if (v == NULL)
        return 0;
    gw_crops_spec_t *s = malloc(sizeof(*s)), *again = malloc(sizeof(*again));
    char err[512];
    int rc = gw_crops_spec_parse(v, "crops_of", s, err, sizeof(err));
    json_decref(v);
    if (rc != 0) {
        if (rc != SQ_BAD_CONFIG || strncmp(err, "crops_of", 8) != 0)
            abort();
        goto out;
    }
    json_t *j = gw_crops_spec_json(s);
    if (gw_crops_spec_parse(j, "crops_of", again, err, sizeof(err)) != 0)
        abort();
    json_t *j2 = gw_crops_spec_json(again);
    if (!json_equal(j, j2))
        abort();
    json_decref(j);
    json_decref(j2);

    gw_output_t o[NOUTS];
    int64_t row_len = 0;
    memset(o, 0, sizeof(o));
    for (size_t i = 0; i < NOUTS; i++) {
        strcpy(o[i].name, outs[i].name);
        o[i].ndims = outs[i].ndims;
        o[i].elems = 1;
        for (int d = 0; d < outs[i].ndims; d++) {
            o[i].dims[d] = outs[i].dims[d];
            if (d > 0)
                o[i].elems *= outs[i].dims[d];
        }
        row_len += o[i].elems;
    }
    rc = gw_crops_spec_bind(s, "det", o, (int)NOUTS, "crops_of", err, sizeof(err));
    if (rc != 0) {
        if (rc != SQ_BAD_CONFIG || strncmp(err, "crops_of", 8) != 0 || s->bound)
            abort();
        goto out;
    }
    float *row = calloc((size_t)row_len, sizeof(float));
    const uint8_t *fill = nul != NULL ? nul + 1 : NULL;
    size_t nfill = fill != NULL ? size - jlen - 1 : 0;
    if (nfill >= sizeof(float)) {
        size_t nf = nfill / sizeof(float);
        for (int64_t i = 0; i < row_len; i++)
            memcpy(&row[i], fill + (size_t)(i % (int64_t)nf) * sizeof(float), sizeof(float));
    }
    gw_detection_t d[GW_DETECT_MAX_CROPS];
    int n = gw_detect(s, row, 32, 32, 100, 80, d, GW_DETECT_MAX_CROPS);
    if (n < 0 || n > s->max_crops)
        abort();
    for (int i = 0; i < n; i++) {
        if (!(d[i].score >= (float)s->score_threshold) || (i > 0 && d[i].score > d[i - 1].score))
            abort();
        int kept = s->nclasses_kept == 0;
        for (int c = 0; c < s->nclasses_kept; c++)
            kept |= s->classes_kept[c] == d[i].label;
        if (!kept || d[i].index < 0 || d[i].index >= s->nboxes)
            abort();
        gw_rect_t r = gw_crop_rect(s, &d[i], 100, 80);
        if (r.x < 0 || r.y < 0 || r.w < 1 || r.h < 1 || r.x + r.w > 100 || r.y + r.h > 80)
            abort();
    }
    free(row);
out:
    free(s);
    free(again);
    return 0;
}
