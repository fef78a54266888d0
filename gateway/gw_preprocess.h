/* JPEG preprocessing: the step between an HTTP body and a model input.
 *
 * Two layers:
 * - gw_image_to_rgb(): a pure function (no threads, no clock, fuzzed in
 *   tests/fuzz/fuzz_jpeg.c). It sniffs the format, reads the JPEG header with
 *   libjpeg-turbo's TurboJPEG API, rejects decompression bombs before any
 *   pixel buffer exists, decodes with DCT scaling when the image is at least
 *   twice the model input, and resizes to the model input as uint8 HWC RGB,
 *   written straight into the caller's buffer (a shared-memory slot).
 *   Its state (a TurboJPEG handle and scratch buffers) lives in a
 *   gw_prep_ctx_t: one per thread, never shared.
 * - gw_prep_pool_t: a fixed pool of threads, each with its own context, fed
 *   through a bounded FIFO. Submitting to a full queue fails at once with
 *   SQ_OVERLOAD, so that the HTTP loop never blocks on preprocessing.
 *
 * Errors (sq_error.h): SQ_MEDIA_TYPE (415) for PNG, GIF, WebP, BMP, TIFF and
 * anything else that is not a JPEG; SQ_BAD_IMAGE (400) for empty, corrupt or
 * truncated data, with the decoder's reason in err; SQ_TOO_LARGE (413) when
 * the header announces more than the configured limits; SQ_NOMEM when a
 * pixel buffer cannot be allocated; SQ_INVAL for bad arguments (a bug in the
 * caller, not in the image). */
#ifndef GW_PREPROCESS_H
#define GW_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

/* How the decoded image is brought to the model input size. Both use pixel
 * centers at (i + 0.5), as OpenCV and PIL do. */
typedef enum {
    /* Triangle filter whose support widens with the reduction factor (PIL's
     * BILINEAR): plain bilinear interpolation when enlarging, an area-like
     * average of every covered source pixel when reducing (no aliasing). */
    GW_RESIZE_BILINEAR = 0,
    /* The source pixel whose center is closest to the output pixel's center. */
    GW_RESIZE_NEAREST = 1,
} gw_resize_t;

/* Parses "bilinear" or "nearest" (the model config's preprocess.resize).
 * Returns 0, or SQ_INVAL for anything else. */
int gw_resize_parse(const char *name, gw_resize_t *out);
const char *gw_resize_name(gw_resize_t mode);

/* Decompression-bomb limits, checked on the header before anything is
 * decoded, and the DCT scaling switch. */
typedef struct {
    uint32_t max_width;  /* pixels; GW_PREP_DEFAULT_MAX_SIDE */
    uint32_t max_height; /* pixels; GW_PREP_DEFAULT_MAX_SIDE */
    uint64_t max_pixels; /* width * height; GW_PREP_DEFAULT_MAX_PIXELS */
    /* 1: when the image is at least twice the target in both dimensions,
     * decode at the smallest libjpeg-turbo scaling factor (1/8, 1/4, 3/8,
     * 1/2, ...) that keeps both dimensions >= the target. 0: always decode
     * at full size (for comparison in the benchmark). */
    int dct_scaling;
} gw_prep_limits_t;

/* 16384 x 16384 and 64 Mpixel: the most one request may cost is a 64
 * Mpixel CMYK decode buffer (256 MB), plus, for a progressive JPEG, the
 * coefficients libjpeg-turbo keeps for the whole image (up to 6 bytes per
 * pixel). Cameras and phones stay well below (12 to 50 Mpixel). */
#define GW_PREP_DEFAULT_MAX_SIDE 16384u
#define GW_PREP_DEFAULT_MAX_PIXELS (64ull * 1024 * 1024)

/* The defaults above, with DCT scaling on. */
gw_prep_limits_t gw_prep_limits_default(void);

/* What gw_image_to_rgb found and did. */
typedef struct {
    int width, height;                 /* as stored in the JPEG */
    int decoded_width, decoded_height; /* after DCT scaling */
    int scale_num, scale_denom;        /* DCT scaling factor used; 1/1 = none */
    int subsamp;                       /* TJSAMP_* of turbojpeg.h */
    int colorspace;                    /* TJCS_* of turbojpeg.h */
} gw_image_info_t;

/* Per-thread decoding state: a TurboJPEG decompressor and scratch buffers
 * (kept between calls up to GW_PREP_SCRATCH_KEEP_BYTES, so that a stream of
 * camera frames allocates nothing). Not thread-safe: one per thread. */
typedef struct gw_prep_ctx gw_prep_ctx_t;

#define GW_PREP_SCRATCH_KEEP_BYTES (16u * 1024 * 1024)

/* Creates a context; limits NULL means gw_prep_limits_default(). Returns
 * NULL when TurboJPEG cannot be initialised (out of memory). */
gw_prep_ctx_t *gw_prep_ctx_new(const gw_prep_limits_t *limits);
/* Releases the context; accepts NULL. */
void gw_prep_ctx_free(gw_prep_ctx_t *ctx);
/* The limits the context enforces. */
const gw_prep_limits_t *gw_prep_ctx_limits(const gw_prep_ctx_t *ctx);

/* The cheap part of gw_image_to_rgb's checks, on the first bytes only: 0
 * for a JPEG, SQ_BAD_IMAGE when empty, SQ_MEDIA_TYPE (with the format it
 * looks like in err) otherwise. Lets a caller answer a non-JPEG at once,
 * whatever its size, before queueing it for a decoder. */
int gw_image_type_check(const uint8_t *data, size_t len, char *err, size_t errlen);

/* Decodes the image in data[0..len) and writes out_w x out_h pixels, uint8
 * RGB, row-major, no padding (out_w * out_h * 3 bytes) to dst. Grayscale
 * JPEGs come out with R = G = B; CMYK and YCCK JPEGs are taken as Adobe
 * (inverted) CMYK, as Photoshop writes them, and converted with
 * R = C * K / 255 (libjpeg-turbo's convention). EXIF orientation is not
 * applied. Warnings of the decoder (a truncated scan, a bad Huffman code)
 * are errors: a half-gray image must not reach a model.
 * info may be NULL; err (may be NULL) receives a one-line reason on failure.
 * Returns 0 or a negative SQ_* code (see the top of this file); dst is
 * unspecified after an error. */
int gw_image_to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                    gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, char *err,
                    size_t errlen);

/* gw_image_to_rgb, decoding at full size (no DCT scaling) and handing the
 * decoded image to the caller: *original (malloc'd, packed RGB,
 * info->width x info->height; the caller frees it) on success, NULL after
 * an error. For work on the original after the resize (a pipeline's
 * crops). */
int gw_image_to_rgb_keep(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                         gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, uint8_t **original,
                         char *err, size_t errlen);

/* Resizes a packed RGB image (src_stride bytes per row, >= src_w * 3) to
 * dst_w x dst_h packed RGB with the arithmetic gw_image_to_rgb uses
 * (fixed point, 14-bit weights that sum exactly to one, so a flat image
 * stays exactly flat). Returns 0, SQ_INVAL or SQ_NOMEM. */
int gw_resize_rgb(gw_prep_ctx_t *ctx, const uint8_t *src, int src_w, int src_h, size_t src_stride,
                  uint8_t *dst, int dst_w, int dst_h, gw_resize_t mode);

/* ---- thread pool ---------------------------------------------------- */

typedef struct gw_prep_pool gw_prep_pool_t;
typedef struct gw_prep_job gw_prep_job_t;

/* Called exactly once per accepted job, on a pool thread, with 0 or an
 * SQ_* code: the codes of gw_image_to_rgb, SQ_DEADLINE (the job was still
 * queued at its deadline, or so close to it that a decode of the pool's
 * recent duration would end past it, and was not decoded) or
 * SQ_SHUTTING_DOWN (cancelled
 * by gw_prep_pool_shutdown). The pool no longer touches the job once this
 * returns, so the callback may free or reuse it. It must not block for
 * long, and must not shut down or free the pool. */
typedef void (*gw_prep_done_fn)(gw_prep_job_t *job, int rc);

#define GW_PREP_ERR_MAX 160

/* Owned by the caller; the pool links it into its queue (no allocation on
 * submit). Every input must stay valid until done runs. */
struct gw_prep_job {
    /* in */
    const uint8_t *data; /* the encoded image (borrowed) */
    size_t len;
    int out_w, out_h;
    gw_resize_t mode;
    uint8_t *dst;        /* out_w * out_h * 3 bytes, e.g. a shared-memory slot */
    int64_t deadline_ns; /* CLOCK_MONOTONIC (sq_now_ns); 0 = none */
    gw_prep_done_fn done;
    void *user; /* for the caller (the request) */
    /* 1: decode at full size and keep the decoded image in original (see
     * gw_image_to_rgb_keep); done owns it from then on. */
    int keep_original;
    /* Not NULL: the job is this work instead of a decode (data, dst and
     * the sizes are the work's own business): it runs on a pool thread
     * with that thread's context and returns 0 or an SQ_* code (with a
     * reason in err), which done receives. The deadline applies as to a
     * decode. */
    int (*work)(gw_prep_ctx_t *ctx, gw_prep_job_t *job);
    /* out, valid in done */
    gw_image_info_t info;
    uint8_t *original; /* keep_original: the decoded image (info->width x height) */
    int64_t queued_ns, started_ns, finished_ns; /* CLOCK_MONOTONIC */
    char err[GW_PREP_ERR_MAX];                  /* reason when rc != 0 */
    /* private to the pool */
    gw_prep_job_t *next_;
};

typedef struct {
    int threads;        /* >= 1 */
    int queue_capacity; /* jobs waiting (not yet running) at most; >= 1 */
    gw_prep_limits_t limits;
} gw_prep_pool_config_t;

typedef enum {
    GW_PREP_DRAIN,  /* run every queued job, then stop */
    GW_PREP_CANCEL, /* finish running jobs; queued ones get SQ_SHUTTING_DOWN */
} gw_prep_shutdown_t;

/* Starts cfg->threads threads, each with its own context. Returns 0 and the
 * pool in *out, SQ_INVAL for a bad config, SQ_NOMEM or SQ_INTERNAL when a
 * context or thread cannot be created (nothing is left running then). */
int gw_prep_pool_new(const gw_prep_pool_config_t *cfg, gw_prep_pool_t **out);
/* Queues a job; thread-safe, never blocks on decoding. Returns 0 (done will
 * be called), SQ_OVERLOAD when queue_capacity jobs are already waiting,
 * SQ_DEADLINE when the jobs waiting ahead of it and its own decode, at the
 * pool's recent decode time per job (an EWMA), would not let it be done by
 * its deadline, SQ_SHUTTING_DOWN after shutdown began, SQ_INVAL for a malformed
 * job (no callback, no dst, bad size). On an error done is not called. */
int gw_prep_pool_submit(gw_prep_pool_t *pool, gw_prep_job_t *job);
/* Jobs waiting in the queue now (for metrics and admission control). */
int gw_prep_pool_queued(gw_prep_pool_t *pool);
/* The pool's recent decode time per job (the EWMA submit uses), in µs; 0
 * before the first decode. Thread-safe. */
double gw_prep_pool_decode_us(gw_prep_pool_t *pool);
/* Stops accepting jobs, drains or cancels the queue, and joins the
 * threads; on return no callback is running or will run. Call from one
 * thread, never from a callback. A second call does nothing. */
void gw_prep_pool_shutdown(gw_prep_pool_t *pool, gw_prep_shutdown_t how);
/* Shuts down (draining) if not done yet and releases the pool; accepts NULL. */
void gw_prep_pool_free(gw_prep_pool_t *pool);

#endif
