/* gateway/codec/front_frames.c: the typed frontend frames round trip, and
 * a frame cut short at any length, with a byte too many, of another type,
 * or with a count or flag out of range is refused (SQ_PROTOCOL). Each
 * payload is copied to a heap block of exactly its length, so that an
 * overread is AddressSanitizer's to see. */
#include "gw_codec_fe.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

static const char *REC1 = "{\"id\":7,\"name\":\"resnet\",\"version\":1,\"format\":\"onnx\"}";
static const char *REC2 = "{\"id\":9,\"name\":\"tiny\",\"version\":3,\"format\":\"emulated\"}";

static gw_fe_doc_t doc(const char *s)
{
    return (gw_fe_doc_t){.p = s, .len = (uint32_t)strlen(s)};
}

static int doc_is(gw_fe_doc_t d, const char *s)
{
    return d.len == strlen(s) && memcmp(d.p, s, d.len) == 0;
}

/* A frame of type over a heap copy of b's first len bytes (freed by the
 * caller through *copy). */
static sq_frame_t frame_of(uint16_t type, const sq_buf_t *b, size_t len, uint8_t **copy)
{
    *copy = malloc(len > 0 ? len : 1);
    if (len > 0)
        memcpy(*copy, b->data, len);
    return (sq_frame_t){.type = type, .payload = *copy, .len = (uint32_t)len};
}

static void catalog_sample(gw_fe_catalog_t *c, gw_fe_model_t *models)
{
    models[0] = (gw_fe_model_t){.key = 7, .record = doc(REC1)};
    models[1] = (gw_fe_model_t){.key = 9, .record = doc(REC2)};
    *c = (gw_fe_catalog_t){.n = 2, .models = models};
}

static gw_fe_profile_row_t ROWS[3] = {{1, 1000, 50}, {4, 2500, 80}, {8, 4200, 120}};

static void state_sample(gw_fe_state_t *s, gw_fe_pipe_t *pipes, gw_fe_live_t *live, int64_t *held,
                         int64_t *gone)
{
    *s = (gw_fe_state_t){.workers_up = 3, .db_ready = 1, .stopping = 0};
    snprintf(s->why, sizeof(s->why), "model tiny: no worker holds it");
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        s->up[k] = k + 1;
        s->coming[k] = k;
        s->back_in_us[k] = k == 0 ? -1 : 1000 * k;
    }
    held[0] = 7;
    held[1] = 9;
    gone[0] = 11;
    s->held = held;
    s->nheld = 2;
    s->gone = gone;
    s->ngone = 1;
    pipes[0] = (gw_fe_pipe_t){.spec = doc("{\"name\":\"p\",\"stages\":[]}"),
                              .unloaded = 1,
                              .nstages = 2,
                              .budget_ms = {12.5, 30},
                              .cum_ms = {12.5, 42.5}};
    s->pipes = pipes;
    s->npipes = 1;
    live[0] = (gw_fe_live_t){.key = 7,
                             .kind = SQ_DEV_CPU,
                             .linear = 0,
                             .max_batch = 8,
                             .memory_bytes = 1e6,
                             .memory_per_item_bytes = 2e4,
                             .nrows = 3,
                             .rows = ROWS};
    live[1] = (gw_fe_live_t){.key = 9,
                             .kind = SQ_DEV_EMU,
                             .linear = 1,
                             .alpha_us = 100,
                             .beta_us = 900,
                             .max_batch = 16};
    s->live = live;
    s->nlive = 2;
}

static void metrics_sample(gw_fe_metrics_t *m, gw_fe_model_stats_t *stats,
                           gw_fe_pipe_report_t *reports)
{
    stats[0] = (gw_fe_model_stats_t){.stats = doc("{\"name\":\"resnet\",\"version\":\"1\"}")};
    snprintf(stats[0].name, sizeof(stats[0].name), "resnet");
    snprintf(stats[0].version, sizeof(stats[0].version), "1");
    reports[0] = (gw_fe_pipe_report_t){.report = doc("{\"queries\":4}")};
    snprintf(reports[0].name, sizeof(reports[0].name), "p");
    *m = (gw_fe_metrics_t){.text = doc("# TYPE x counter\nx 1\n"),
                           .nstats = 1,
                           .stats = stats,
                           .nreports = 1,
                           .reports = reports};
}

Test(front_frames, catalog_round_trips)
{
    gw_fe_model_t models[2];
    gw_fe_catalog_t in, out;
    catalog_sample(&in, models);
    sq_buf_t b;
    sq_buf_init(&b);
    gw_fe_catalog_encode(&b, &in);
    uint8_t *copy;
    sq_frame_t f = frame_of(SQ_MSG_FE_CATALOG, &b, b.len, &copy);
    cr_assert_eq(gw_fe_catalog_decode(&f, &out), 0);
    cr_assert_eq(out.n, 2);
    cr_assert_eq(out.models[0].key, 7);
    cr_assert(doc_is(out.models[0].record, REC1));
    cr_assert_eq(out.models[1].key, 9);
    cr_assert(doc_is(out.models[1].record, REC2));
    gw_fe_catalog_dispose(&out);
    free(copy);
    sq_buf_dispose(&b);
}

Test(front_frames, state_round_trips)
{
    gw_fe_pipe_t pipes[1];
    gw_fe_live_t live[2];
    int64_t held[2], gone[1];
    gw_fe_state_t in, out;
    state_sample(&in, pipes, live, held, gone);
    sq_buf_t b;
    sq_buf_init(&b);
    gw_fe_state_encode(&b, &in);
    uint8_t *copy;
    sq_frame_t f = frame_of(SQ_MSG_FE_STATE, &b, b.len, &copy);
    cr_assert_eq(gw_fe_state_decode(&f, &out), 0);
    cr_assert_str_eq(out.why, in.why);
    cr_assert_eq(out.workers_up, 3);
    cr_assert_eq(out.db_ready, 1);
    cr_assert_eq(out.stopping, 0);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        cr_assert_eq(out.up[k], k + 1);
        cr_assert_eq(out.coming[k], k);
        cr_assert_eq(out.back_in_us[k], k == 0 ? -1 : 1000 * k);
    }
    cr_assert_eq(out.nheld, 2);
    cr_assert_eq(out.held[0], 7);
    cr_assert_eq(out.held[1], 9);
    cr_assert_eq(out.ngone, 1);
    cr_assert_eq(out.gone[0], 11);
    cr_assert_eq(out.npipes, 1);
    cr_assert(doc_is(out.pipes[0].spec, "{\"name\":\"p\",\"stages\":[]}"));
    cr_assert_eq(out.pipes[0].unloaded, 1);
    cr_assert_eq(out.pipes[0].nstages, 2);
    cr_assert_float_eq(out.pipes[0].budget_ms[1], 30, 1e-12);
    cr_assert_float_eq(out.pipes[0].cum_ms[1], 42.5, 1e-12);
    cr_assert_eq(out.nlive, 2);
    cr_assert_eq(out.live[0].key, 7);
    cr_assert_eq(out.live[0].kind, SQ_DEV_CPU);
    cr_assert_eq(out.live[0].nrows, 3);
    cr_assert_eq(out.live[0].rows[2].batch, 8);
    cr_assert_float_eq(out.live[0].rows[2].mean_us, 4200, 1e-9);
    cr_assert_float_eq(out.live[0].rows[1].std_us, 80, 1e-9);
    cr_assert_float_eq(out.live[0].memory_per_item_bytes, 2e4, 1e-9);
    cr_assert_eq(out.live[1].linear, 1);
    cr_assert_eq(out.live[1].nrows, 0);
    cr_assert_float_eq(out.live[1].alpha_us, 100, 1e-9);
    cr_assert_float_eq(out.live[1].beta_us, 900, 1e-9);
    cr_assert_eq(out.live[1].max_batch, 16);
    gw_fe_state_dispose(&out);
    free(copy);
    sq_buf_dispose(&b);
}

Test(front_frames, metrics_round_trips)
{
    gw_fe_model_stats_t stats[1];
    gw_fe_pipe_report_t reports[1];
    gw_fe_metrics_t in, out;
    metrics_sample(&in, stats, reports);
    sq_buf_t b;
    sq_buf_init(&b);
    gw_fe_metrics_encode(&b, &in);
    uint8_t *copy;
    sq_frame_t f = frame_of(SQ_MSG_FE_METRICS, &b, b.len, &copy);
    cr_assert_eq(gw_fe_metrics_decode(&f, &out), 0);
    cr_assert(doc_is(out.text, "# TYPE x counter\nx 1\n"));
    cr_assert_eq(out.nstats, 1);
    cr_assert_str_eq(out.stats[0].name, "resnet");
    cr_assert_str_eq(out.stats[0].version, "1");
    cr_assert(doc_is(out.stats[0].stats, "{\"name\":\"resnet\",\"version\":\"1\"}"));
    cr_assert_eq(out.nreports, 1);
    cr_assert_str_eq(out.reports[0].name, "p");
    cr_assert(doc_is(out.reports[0].report, "{\"queries\":4}"));
    gw_fe_metrics_dispose(&out);
    free(copy);
    sq_buf_dispose(&b);
}

/* Every proper prefix of each frame, and the frame with one byte more, is
 * refused; the whole frame under another type is too. */
Test(front_frames, truncation_at_every_length_is_refused)
{
    gw_fe_model_t models[2];
    gw_fe_catalog_t cat;
    catalog_sample(&cat, models);
    gw_fe_pipe_t pipes[1];
    gw_fe_live_t live[2];
    int64_t held[2], gone[1];
    gw_fe_state_t st;
    state_sample(&st, pipes, live, held, gone);
    gw_fe_model_stats_t stats[1];
    gw_fe_pipe_report_t reports[1];
    gw_fe_metrics_t met;
    metrics_sample(&met, stats, reports);
    sq_buf_t b[3];
    for (int i = 0; i < 3; i++)
        sq_buf_init(&b[i]);
    gw_fe_catalog_encode(&b[0], &cat);
    gw_fe_state_encode(&b[1], &st);
    gw_fe_metrics_encode(&b[2], &met);
    const uint16_t types[3] = {SQ_MSG_FE_CATALOG, SQ_MSG_FE_STATE, SQ_MSG_FE_METRICS};
    for (int i = 0; i < 3; i++) {
        sq_buf_put_u8(&b[i], 0); /* one byte past the message */
        for (size_t len = 0; len <= b[i].len; len++) {
            if (len == b[i].len - 1)
                continue; /* the whole message */
            uint8_t *copy;
            sq_frame_t f = frame_of(types[i], &b[i], len, &copy);
            gw_fe_catalog_t c;
            gw_fe_state_t s;
            gw_fe_metrics_t m;
            int rc = i == 0   ? gw_fe_catalog_decode(&f, &c)
                     : i == 1 ? gw_fe_state_decode(&f, &s)
                              : gw_fe_metrics_decode(&f, &m);
            cr_assert_eq(rc, SQ_PROTOCOL, "frame %d cut at %zu of %zu", i, len, b[i].len - 1);
            free(copy);
        }
        uint8_t *copy;
        sq_frame_t f = frame_of(types[(i + 1) % 3], &b[i], b[i].len - 1, &copy);
        gw_fe_catalog_t c;
        gw_fe_state_t s;
        gw_fe_metrics_t m;
        int rc = i == 2   ? gw_fe_catalog_decode(&f, &c)
                 : i == 0 ? gw_fe_state_decode(&f, &s)
                          : gw_fe_metrics_decode(&f, &m);
        cr_assert_eq(rc, SQ_PROTOCOL, "frame %d under another type", i);
        free(copy);
        sq_buf_dispose(&b[i]);
    }
}

/* A count the payload cannot hold is refused before anything is
 * allocated for it. */
Test(front_frames, a_count_past_the_payload_is_refused)
{
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put_u32(&b, 0xffffffffu); /* models */
    uint8_t *copy;
    sq_frame_t f = frame_of(SQ_MSG_FE_CATALOG, &b, b.len, &copy);
    gw_fe_catalog_t c;
    cr_assert_eq(gw_fe_catalog_decode(&f, &c), SQ_PROTOCOL);
    cr_assert_null(c.models);
    free(copy);
    sq_buf_dispose(&b);
}

/* Values out of range: a device kind, a flag, a profile whose form and
 * rows disagree, a stage count past the limit, a key of 0. */
Test(front_frames, out_of_range_values_are_refused)
{
    for (int bad = 0; bad < 5; bad++) {
        gw_fe_pipe_t pipes[1];
        gw_fe_live_t live[2];
        int64_t held[2], gone[1];
        gw_fe_state_t st;
        state_sample(&st, pipes, live, held, gone);
        if (bad == 0)
            live[0].kind = SQ_DEV_KIND_COUNT;
        if (bad == 1)
            st.db_ready = 2;
        if (bad == 2)
            live[1].nrows = 3, live[1].rows = ROWS; /* linear with rows */
        if (bad == 3)
            pipes[0].nstages = GW_FE_MAX_STAGES + 1;
        if (bad == 4)
            live[0].max_batch = 0;
        sq_buf_t b;
        sq_buf_init(&b);
        gw_fe_state_encode(&b, &st);
        uint8_t *copy;
        sq_frame_t f = frame_of(SQ_MSG_FE_STATE, &b, b.len, &copy);
        gw_fe_state_t out;
        cr_assert_eq(gw_fe_state_decode(&f, &out), SQ_PROTOCOL, "case %d", bad);
        free(copy);
        sq_buf_dispose(&b);
    }
    gw_fe_model_t models[2];
    gw_fe_catalog_t cat;
    catalog_sample(&cat, models);
    models[1].key = 0;
    sq_buf_t b;
    sq_buf_init(&b);
    gw_fe_catalog_encode(&b, &cat);
    uint8_t *copy;
    sq_frame_t f = frame_of(SQ_MSG_FE_CATALOG, &b, b.len, &copy);
    gw_fe_catalog_t out;
    cr_assert_eq(gw_fe_catalog_decode(&f, &out), SQ_PROTOCOL);
    free(copy);
    sq_buf_dispose(&b);
}

/* The hello's version names both protocols: a frontend of the JSON frames
 * (the worker protocol's number alone) is not this one. */
Test(front_frames, hello_version_is_not_the_worker_protocol_alone)
{
    cr_assert_neq(GW_FE_HELLO_VERSION, (uint32_t)SQ_IPC_VERSION);
    cr_assert_eq(GW_FE_HELLO_VERSION & 0xffff, (uint32_t)SQ_IPC_VERSION);
    cr_assert_eq(GW_FE_HELLO_VERSION >> 16, (uint32_t)GW_FE_VERSION);
}
