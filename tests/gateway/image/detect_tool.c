/* Runs gateway/detect.c on a detector's raw outputs, for
 * test_detect_reference.py:
 *   detect_tool SPEC_JSON IN_W IN_H IMG_W IMG_H NAME DIMS FILE [NAME DIMS FILE...]
 * The outputs are listed in the model's order, each as raw float32 of one
 * item in FILE with DIMS "D0xD1x..." (as tests/worker/ort_run.js writes
 * them); they are concatenated into the item's output row as the data plane
 * does. SPEC_JSON is a crops_of object. Prints {"detections": [{"box": [x0,
 * y0, x1, y1], "score": s, "index": k, "crop": [x, y, w, h]}, ...]}. */
#include <gw_catalog.h>
#include <gw_image.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what)
{
    fprintf(stderr, "detect_tool: %s\n", what);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 9 || (argc - 6) % 3 != 0)
        return fail("usage: detect_tool SPEC_JSON IN_W IN_H IMG_W IMG_H NAME DIMS FILE...");
    int in_w = atoi(argv[2]), in_h = atoi(argv[3]), img_w = atoi(argv[4]), img_h = atoi(argv[5]);
    gw_model_t m;
    memset(&m, 0, sizeof(m));
    snprintf(m.name, sizeof(m.name), "detector");
    for (int a = 6; a < argc; a += 3) {
        if (m.noutputs == GW_MAX_OUTPUTS)
            return fail("too many outputs");
        gw_output_t *o = &m.outputs[m.noutputs++];
        snprintf(o->name, sizeof(o->name), "%s", argv[a]);
        o->elems = 1;
        for (char *p = argv[a + 1]; *p && o->ndims < GW_MAX_DIMS;) {
            char *end;
            o->dims[o->ndims] = strtoll(p, &end, 10);
            if (o->ndims++ > 0)
                o->elems *= o->dims[o->ndims - 1];
            p = *end == 'x' ? end + 1 : end;
        }
    }
    int64_t total = 0;
    for (int i = 0; i < m.noutputs; i++)
        total += m.outputs[i].elems;
    float *row = malloc(sizeof(float) * (size_t)total);
    int64_t off = 0;
    for (int i = 0; i < m.noutputs; i++) {
        FILE *f = fopen(argv[6 + 3 * i + 2], "rb");
        if (f == NULL)
            return fail("cannot open an output file");
        size_t n = fread(row + off, sizeof(float), (size_t)m.outputs[i].elems, f);
        fclose(f);
        if (n != (size_t)m.outputs[i].elems)
            return fail("an output file is shorter than its dims");
        off += m.outputs[i].elems;
    }
    json_error_t jerr;
    json_t *spec_json = json_loads(argv[1], 0, &jerr);
    if (spec_json == NULL)
        return fail(jerr.text);
    gw_crops_spec_t spec;
    char err[320];
    if (gw_crops_spec_parse(spec_json, "crops_of", &spec, err, sizeof(err)) != 0 ||
        gw_crops_spec_bind(&spec, m.name, m.outputs, m.noutputs, "crops_of", err, sizeof(err)) != 0)
        return fail(err);
    gw_detection_t d[GW_DETECT_MAX_CROPS];
    int n = gw_detect(&spec, row, in_w, in_h, img_w, img_h, d, GW_DETECT_MAX_CROPS);
    if (n < 0)
        return fail(sq_err_name(n));
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        gw_rect_t r = gw_crop_rect(&spec, &d[i], img_w, img_h);
        json_array_append_new(list, json_pack("{s:[f,f,f,f], s:f, s:i, s:[i,i,i,i]}", "box",
                                              (double)d[i].x0, (double)d[i].y0, (double)d[i].x1,
                                              (double)d[i].y1, "score", (double)d[i].score, "index",
                                              d[i].index, "crop", r.x, r.y, r.w, r.h));
    }
    json_t *outj = json_pack("{s:o}", "detections", list);
    char *text = json_dumps(outj, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(outj);
    json_decref(spec_json);
    free(row);
    return 0;
}
