/* The in-memory model registry: what the data plane needs to know about
 * every stored model version, readable from any thread without touching
 * sqlite. The DB thread fills it at start and after each upload, profile or
 * delete; HTTP threads look models up per request; the dispatch thread
 * reads profiles and load specs.
 *
 * Entries are immutable once published and reference-counted: an update
 * publishes a new entry, and a request keeps the one it started with. */
#ifndef GW_REGISTRY_H
#define GW_REGISTRY_H

#include "gw_model.h"

#include <jansson.h>
#include <mdb.h>
#include <pl_profile.h>
#include <pthread.h>
#include <sq_device.h>
#include <stdatomic.h>
#include <stdint.h>

/* One output of a model's graph, as its record lists it. */
#define GW_MAX_OUTPUTS 8
#define GW_MAX_DIMS 8
typedef struct {
    char name[128];
    int ndims;
    int64_t dims[GW_MAX_DIMS]; /* dims[0] is the batch (-1 or N when symbolic) */
    int64_t elems;             /* floats per item: the product of dims[1..] */
} gw_output_t;

typedef struct gw_model {
    atomic_int refs;
    int64_t key; /* the models row id: stable, unique per (name, version) */
    char name[MDB_NAME_MAX + 1];
    int version;
    char sha256[65];
    int emulated;    /* format "emulated": no ONNX file */
    char status[16]; /* profiling | ready | failed */
    char error[256]; /* why it failed ("" otherwise) */
    char input_name[128];
    int input_uint8; /* the graph's input is UINT8 (else FP32) */
    int c, h, w;     /* input item: channels, height, width */
    int nhwc;        /* the input is [N,H,W,3] (else [N,C,H,W]) */
    /* Floats of an item's output row: every output of the graph, in its
     * order, each flattened (output i starts after the elems of outputs
     * 0..i-1). outputs[0].elems is output 0's alone (a classifier's
     * classes). */
    int64_t out_elems;
    int det_slots;         /* an emulated detector's boxes per item (gw_model.h); 0 otherwise */
    double det_mean;       /* its mean detections per item */
    char output_name[128]; /* output 0's */
    /* Every output of the graph in its order (outputs[0] is output 0); at
     * most GW_MAX_OUTPUTS are listed. */
    int noutputs;
    gw_output_t outputs[GW_MAX_OUTPUTS];
    double mean[3], std[3]; /* 0..255 pixel scale */
    int bgr;
    int nearest; /* resize mode */
    double default_slo_ms;
    int max_batch;
    uint64_t memory_bytes;
    json_t *labels; /* array of strings; owned */
    /* Profiles per device kind; has_profile[k] says whether one is stored. */
    int has_profile[SQ_DEV_KIND_COUNT];
    pl_profile_t profile[SQ_DEV_KIND_COUNT];
    /* Its shared-prefix group in the model DB (0: none) and where its graph
     * is cut for it (the tensor's name in this model). */
    int64_t group_id;
    char cut_tensor[256];
    /* The version policy its upload gave (has_policy 0: none, i.e. all);
     * the newest version's applies to every version of the name. */
    int has_policy;
    gw_version_policy_t policy;
} gw_model_t;

void gw_model_ref(gw_model_t *m);
/* Accepts NULL. */
void gw_model_unref(gw_model_t *m);
/* Builds an entry from a record of mdb_model_records (see there). */
gw_model_t *gw_model_from_record(json_t *rec);
/* The label of class i ("i" when out of range) into buf. */
const char *gw_model_label(const gw_model_t *m, int64_t i, char *buf, size_t len);

typedef struct gw_registry gw_registry_t;

gw_registry_t *gw_registry_new(void);
void gw_registry_free(gw_registry_t *r);
/* Publishes m (taking the caller's reference), replacing an entry with the
 * same key. */
void gw_registry_put(gw_registry_t *r, gw_model_t *m);
/* Removes every version of name (version 0) or one version; writes the
 * removed keys (up to max) and returns how many were removed. */
int gw_registry_remove(gw_registry_t *r, const char *name, int version, int64_t *keys, int max);
/* A new reference to name's version, or NULL. Version 0: the newest ready
 * one that the name's version policy serves (a version still profiling, or
 * failed, never takes the traffic of one that is ready), else the newest
 * served, else the newest (gw_registry_served then says why not). */
gw_model_t *gw_registry_find(gw_registry_t *r, const char *name, size_t name_len, int version);
/* Whether the name's version policy serves m (the newest version's policy;
 * latest N counts ready versions); if not, why, in why. */
int gw_registry_served(gw_registry_t *r, const gw_model_t *m, char *why, size_t len);
/* A new reference by key, or NULL. */
gw_model_t *gw_registry_get(gw_registry_t *r, int64_t key);
/* Calls fn for every entry (under the lock: keep it short). */
void gw_registry_foreach(gw_registry_t *r, void (*fn)(gw_model_t *m, void *arg), void *arg);

#endif
