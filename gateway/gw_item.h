/* One image or tensor row of an inference request: what the HTTP side
 * hands the dispatcher, and how the dispatcher answers it (its finish
 * callback, exactly once). */
#ifndef GW_ITEM_H
#define GW_ITEM_H

#include "gw_preprocess.h"
#include "gw_registry.h"
#include "gw_server.h"

#include <stdint.h>

typedef struct gw_infer gw_infer_t;

typedef struct gw_item gw_item_t;

/* One image or tensor row of a request. The fields from srv to finish are
 * set before it is submitted, and are all the dispatcher knows of it: it
 * never reaches into the request. */
struct gw_item {
    gw_infer_t *req;
    int index;
    gw_server_t *srv;
    gw_model_t *model; /* the request's reference */
    double slo_ms;
    int64_t arrival_us, deadline_us;
    float *out; /* its output row (model->out_elems floats) */
    /* Called exactly once, on any thread, with the item's outcome. */
    void (*finish)(gw_item_t *item, int rc, const char *detail);
    int64_t in_off;     /* arena offset of the item's input; -1 when none yet */
    uint8_t input_kind; /* SQ_INPUT_* */
    int64_t ready_us;   /* preprocessed and handed to the dispatcher */
    int64_t sent_us;    /* its batch went to a worker */
    int64_t done_us;
    int batch_size;
    int member;         /* in a prefix group's batch: its model's index there */
    uint64_t core_id;   /* its handle in the dispatcher core (0: none; dispatch thread) */
    gw_prep_job_t prep; /* JPEG items */
};

/* Marks item done with rc (0 or an SQ_* error and a detail); the request's
 * last item triggers the reply. Thread-safe. */
void gw_item_finish(gw_item_t *item, int rc, const char *detail);

#endif
