/* Model configuration as operators send it with an upload, validated into
 * a typed struct. Pure (no I/O): parsed on the DB thread, fuzzed.
 *
 * Every field but `name` has a default, so {"name": "resnet18"} is a valid
 * config for an ONNX model: version 1, ImageNet mean/std, RGB, bilinear
 * resize to the graph's input size, labels "0".."K-1", SLO 100 ms.
 * An emulated model (no ONNX file) carries its profile instead:
 * {"name", "profile": {"alpha_ms", "beta_ms"} or {"batch": [...],
 * "latency_ms": [...], "latency_std_ms": [...]}, "max_batch", "memory_mb",
 * "input": {"shape": [3, 224, 224]}, "num_classes"}. An emulated detector
 * (for pipelines) says "detections": {"mean": gamma, "slots": K} instead of
 * num_classes: its outputs are "boxes" [N, K, 4] (normalized x0 y0 x1 y1,
 * on a grid so that no two overlap) and "scores" [N, K], and each item gets
 * a Poisson(gamma) count of slots scored 0.9 (the rest 0.05), drawn by the
 * emu worker. */
#ifndef GW_MODEL_H
#define GW_MODEL_H

#include <jansson.h>
#include <mdb.h>
#include <stddef.h>

#define GW_MAX_PROFILE_ROWS 1024
#define GW_MAX_POLICY_VERSIONS 64
/* An emulated detector's boxes per item (the IPC bound SQ_MAX_EMU_DET_SLOTS). */
#define GW_EMU_DET_MAX_SLOTS 1024
#define GW_EMU_DET_DEFAULT_SLOTS 32

/* Which versions of a model are served (Triton's version_policy): all
 * (the default), the latest N ready ones, or the ones listed. The newest
 * upload's policy applies to every version of its name. */
typedef enum { GW_VP_ALL = 0, GW_VP_LATEST, GW_VP_SPECIFIC } gw_vp_kind_t;
typedef struct {
    gw_vp_kind_t kind;
    int latest;                           /* GW_VP_LATEST: N >= 1 */
    int versions[GW_MAX_POLICY_VERSIONS]; /* GW_VP_SPECIFIC */
    int nversions;
} gw_version_policy_t;

/* Parses Triton's JSON form: {"latest": {"num_versions": N}}, {"specific":
 * {"versions": [v, ...]}} or {"all": {}}. Returns 0, or SQ_BAD_CONFIG with
 * "config.version_policy...: why" in err. */
int gw_version_policy_parse(json_t *v, gw_version_policy_t *out, char *err, size_t errlen);
/* "latest 2", "versions 1, 3" or "all", for messages. */
void gw_version_policy_describe(const gw_version_policy_t *p, char *buf, size_t len);

typedef struct {
    char name[MDB_NAME_MAX + 1];
    int version;
    double default_slo_ms;
    int max_batch; /* 0 = choose (profiling / emulated default 64) */
    /* preprocessing */
    char resize[16];        /* "bilinear" | "nearest" */
    char channel_order[4];  /* "RGB" | "BGR" */
    double mean[3], std[3]; /* on 0..255 pixel values */
    json_t *labels;         /* array of strings or NULL (then 0..K-1); owned */
    /* emulated */
    int emulated;
    int linear;
    double alpha_ms, beta_ms;
    int nrows;
    mdb_profile_row_t rows[GW_MAX_PROFILE_ROWS];
    double memory_mb;
    int input_shape[3]; /* C, H, W */
    int num_classes;
    int det_slots;   /* emulated detector: K boxes per item; 0 = a classifier */
    double det_mean; /* emulated detector: mean detections per item */
} gw_model_config_t;

/* Parses and validates a config (JSON text). emulated: the upload carries
 * no ONNX file, so a profile is required. Returns 0, or SQ_BAD_CONFIG /
 * SQ_BAD_JSON with a message naming the JSON path in err ("config.version:
 * expected an integer >= 1"). */
int gw_model_config_parse(const char *json, size_t len, int emulated, gw_model_config_t *cfg,
                          char *err, size_t errlen);
/* Releases what the config owns; accepts NULL. */
void gw_model_config_dispose(gw_model_config_t *cfg);
/* Whether name is a valid model name: [A-Za-z0-9][A-Za-z0-9_.-]{0,63}. */
int gw_model_name_ok(const char *name, size_t len);
/* Parses a labels file: one label per line (CR/LF tolerated, trailing
 * empty line ignored). Returns a new array, or NULL with err set. */
json_t *gw_labels_parse(const char *text, size_t len, char *err, size_t errlen);

#endif
