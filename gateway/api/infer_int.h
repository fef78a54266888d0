/* api/: internal to the inference files: what infer_request.c (a request's
 * setup and end), infer_item.c (its items' life), infer_reply.c (its
 * answer's parts), infer_v1.c, infer_v2.c and infer_v2_shm.c (the routes)
 * share. The files call down that list's order: the routes call the
 * request, item and reply files, which call none of the routes; gw_infer_t
 * itself is in api_int.h. */
#ifndef GW_INFER_INT_H
#define GW_INFER_INT_H

#include "api_int.h"
#include "gw_codec.h"
#include "shm_int.h"

/* ---- a request's setup and end (infer_request.c) ------------------------ */

/* Looks the model up (call->args[0], version in args[1] when given) and
 * builds the request, admitted (--max-inflight) and watched for its client
 * going away; replies and returns NULL on an error. Its dispose is
 * gw_infer_dispose. */
gw_infer_t *gw_infer_new(gw_call_t *call, gw_api_t kind);
/* Whether model m (found) can take a request now: served, not failed,
 * unloaded or being profiled, a worker up, and room under --max-inflight
 * (then it is counted in flight: gw_infer_dispose leaves). 0, or the
 * error (counted in the metrics) with why. */
int gw_infer_admit(gw_api_ctx_t *api, gw_model_t *m, char *why, size_t len);
/* A request admitted for m (base.app set): its model (the reference
 * taken), kind, arrival, default SLO and priority, and trace sampling. */
void gw_infer_init(gw_infer_t *req, gw_model_t *m, gw_api_t kind);
/* The request is done (any thread, once): its transport answers it (the
 * HTTP loop, or ext_done). */
void gw_infer_done(gw_infer_t *req);
/* The request's end (its gw_async_t dispose): leaves the in-flight count,
 * writes its trace line when traced, and frees what it holds. A route
 * with state of its own (api_state) binds its own dispose, which calls
 * this before freeing that state. */
void gw_infer_dispose(gw_async_t *a);
/* Applies an SLO (ms; <= 0 keeps the current one), caps it and sets the
 * deadline: without an SLO (best effort), --max-request-ms's. */
void gw_infer_set_deadline(gw_infer_t *req, double slo_ms, const gw_api_config_t *cfg);
/* Sizes the item and output arrays and marks every item pending; 0, or
 * SQ_OVERLOAD when memory is short (the sizes are the request's). */
int gw_infer_alloc_items(gw_infer_t *req, int n);
/* Replies at once with err (the request never started). */
void gw_infer_reject(gw_infer_t *req, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Points the request at its body (gw_request_body: in place, or a copy
 * for HTTP/2); replies 503 and returns -1 when a copy finds no memory. */
int gw_infer_take_body(gw_infer_t *req, h2o_req_t *hreq);
/* The SLO a request's header (X-SLO-Ms) or query (?slo_ms=) asks for, in
 * *slo (-1: none); -1 after rejecting a malformed one. */
int gw_infer_request_slo(gw_infer_t *req, h2o_req_t *hreq, double *slo);
/* The priority a request's header (X-Priority) or query (?priority=) asks
 * for, Triton's numbers (gw_priority_level), in *priority (-1: none); -1
 * after rejecting a malformed one. */
int gw_infer_request_priority(gw_infer_t *req, h2o_req_t *hreq, int64_t *priority);
/* Refuses at once (400 slo_too_tight), saying what would work, an SLO
 * below the least the model can meet (gw_sched_least); 0, or -1 after
 * rejecting. */
int gw_infer_check_feasible(gw_infer_t *req);
/* s as a finite number > 0 in *out; 0, or -1 (out untouched). */
int gw_infer_parse_positive(const char *s, double *out);
/* s as a priority, Triton's numbers (gw_priority_level): digits only (no
 * sign, space or fraction), at most INT32_MAX, in *out; 0, or -1 (out
 * untouched). */
int gw_infer_parse_priority(const char *s, int64_t *out);
/* Whether p starts as a JPEG does (FF D8 FF). */
int gw_infer_is_jpeg(const uint8_t *p, size_t n);

/* ---- its items (infer_item.c) ------------------------------------------- */

/* Starts a JPEG item (any thread): decoded by the preprocess pool into an
 * arena slot, then handed to the dispatcher with the request's others. */
void gw_infer_start_jpeg(gw_api_ctx_t *api, gw_item_t *item, const uint8_t *data, size_t len);
/* Starts a tensor item: the row is copied into the arena as is. */
void gw_infer_start_tensor(gw_api_ctx_t *api, gw_item_t *item, const uint8_t *data, size_t len,
                           int uint8);

/* ---- its answer (infer_reply.c) ------------------------------------------ */

typedef struct {
    double queue_ms, preprocess_ms, execute_ms, total_ms;
    int batch_size;
} gw_infer_timing_t;

/* Each phase's longest among the request's items, and its total so far. */
gw_infer_timing_t gw_infer_timing(const gw_infer_t *req);
/* Headers of every inference answer: its id, the SLO it was served under,
 * and a warning when --max-request-ms cut the one asked for. */
void gw_infer_answer_headers(gw_infer_t *req, h2o_req_t *hreq);
/* The code a request failed with err answers with, once its items take
 * least ms alone on an idle worker (0: unknown): SQ_SLO_TOO_TIGHT for a
 * deadline failure whose SLO is below least (no retry can serve it),
 * err otherwise. */
int gw_infer_failure_code(const gw_infer_t *req, double least);
/* Settles the answer about to be sent, before anything records it: a
 * failed request's code (gw_infer_failure_code, on the least its items
 * take now, kept in least_ms) and the status for its trace (answer_v2
 * sets a failure to encode); hreq is not read once the answer is sent. */
void gw_infer_settle(gw_infer_t *req);
/* A failed request's answer (after gw_infer_settle), saying what SLO
 * would work where one can. */
void gw_infer_send_failure(gw_infer_t *req, h2o_req_t *hreq);
/* A request dropped or refused for its deadline (err, err_detail), whose
 * items take least ms alone on an idle worker (> 0): why, saying the SLO it
 * had and what would work. Returns whether a retry can succeed (its SLO is
 * not below least). */
int gw_infer_failure_why(const gw_infer_t *req, double least, char *why, size_t len);

/* ---- /v1 (infer_v1.c) --------------------------------------------------- */

/* Why model cm cannot answer /v1 (a classifier's top-k labels: output 0
 * is [N, K] class scores; a detector's boxes ranked as classes would be
 * meaningless, unless its upload described them: has_detector, or it is a
 * segmenter), saying where to go instead: SQ_BAD_REQUEST with why; 0 when
 * it can. */
int gw_v1_scores_why(const gw_model_t *cm, char *why, size_t len);
/* A /v1 body (b, n bytes, Content-Type ct) sent the way a common slip sends
 * it, with what to send instead: a JPEG labelled as JSON, JSON sent to the
 * image route (model's), and a file that `curl -d @photo.jpg` sent
 * (form-encoded, with every CR and LF byte taken out: a JPEG of a few KB
 * without one is all but impossible, about 1 in 10^14). SQ_MEDIA_TYPE with
 * why, or 0. */
int gw_v1_body_slip(const uint8_t *b, size_t n, h2o_iovec_t ct, const char *model, char *why,
                    size_t len);

/* ---- /v1's rows (infer_reply.c) ------------------------------------------ */

/* A /v1 answer's list per image: a classifier's top-k, a detector's
 * detections or a segmenter's segments. */
json_t *gw_v1_rows(const gw_infer_t *req);
/* gw_v1_rows into req->answer_rows: a segmenter's gw_infer_t.finish, run
 * on the offload thread (its argmax over every pixel is too long for an
 * HTTP loop). */
void gw_v1_rows_off_loop(gw_infer_t *req);
/* A detector's (has_detector) /v1 answer for one item's output row, the
 * original image being img_w x img_h: [{"box": [x0, y0, x1, y1] in its
 * pixels (clamped to it), "index" (the class), "label", "score"}], after
 * NMS, best first, at most its spec's max_crops. */
json_t *gw_v1_detections_json(const gw_model_t *m, const float *row, int img_w, int img_h);
/* A segmenter's (output 0 [N, C, H, W]) /v1 answer for one item's output
 * row: the classes of the argmax class map, [{"index", "label", "share"}]
 * by share (of the H x W pixels), largest first. */
json_t *gw_v1_segments_json(const gw_model_t *m, const float *row);

/* ---- /v2 (infer_v2.c; its shared-memory tensors in infer_v2_shm.c) ----- */

/* A /v2 request's state (gw_infer_t.api_state). */
typedef struct {
    gw_oip_model_t desc;
    gw_oip_request_t parsed;
    long long header_len;
    double header_slo_ms;    /* X-SLO-Ms or ?slo_ms=; -1 none */
    int64_t header_priority; /* X-Priority or ?priority=; -1 none */
    char version[16];
    /* The shared-memory regions its inputs and outputs name, held until it
     * is disposed (its items are done by then, and its answer written), so
     * that an unregister meanwhile unmaps nothing under it. */
    gw_shm_region_t *regions[GW_OIP_MAX_INPUTS + GW_OIP_MAX_OUTPUTS];
    int nregions;
    gw_shm_region_t *out_region[GW_OIP_MAX_OUTPUTS]; /* per requested output; NULL: not in one */
} gw_v2_state_t;

/* What the OIP codec is to parse a request to model m against: its input
 * (the model's datatype, also taking UINT8 and BYTES: JPEGs), each of its
 * outputs with its dims after the batch ([N]: one value per item), and
 * the server's limits (cfg). */
void gw_v2_model_desc(const gw_model_t *m, const gw_api_config_t *cfg, gw_oip_model_t *d);
/* Each of model m's outputs as n_items x its elems floats in outputs[],
 * from the items' rows (out_elems each: output i's slice after outputs
 * 0..i-1): rows itself for a single output (NULL returned), else a new
 * buffer the caller frees, returned. */
float *gw_v2_gather_outputs(const gw_model_t *m, int n_items, const float *rows,
                            const float **outputs);
/* The regions the request's tensors name: each input's window is checked
 * against its region and its rows pointed into it; each output's window is
 * checked (and again when it is written). *copy_bytes gets the bytes the
 * inputs will copy into the arena. 0, or -1 after rejecting. */
int gw_v2_shm_resolve(gw_infer_t *req, gw_v2_state_t *st, size_t *copy_bytes);
/* Writes the outputs asked for in shared memory into their regions (each
 * output's batch x item floats); 0, or SQ_BAD_REQUEST with why. */
int gw_v2_write_shm_outputs(gw_infer_t *req, const float *const *outputs, char *why, size_t len);
/* Parses a /v2 request's body (req->body, its state's header_len) and
 * starts its items; on the HTTP loop (on_loop: large copies go to the
 * offload thread) or another thread. Rejects on an error. */
void gw_v2_start(gw_infer_t *req, int on_loop);
/* A succeeded /v2 request's answer (its outputs in shared memory written
 * first) into out, *header_len as gw_oip_response_encode's; 0, or
 * SQ_BAD_REQUEST (an output's region no longer holds it) or SQ_INTERNAL
 * with why. */
int gw_v2_encode(gw_infer_t *req, sq_buf_t *out, long long *header_len, char *why, size_t len);
/* A /v2 request's end: gw_infer_dispose, then its state. */
void gw_v2_dispose(gw_async_t *a);

#endif
