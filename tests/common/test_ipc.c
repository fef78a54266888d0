#include <criterion/criterion.h>
#include <sq.h>

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

Test(ipc, frame_round_trip)
{
    sq_buf_t b;
    sq_buf_init(&b);
    sq_frame_encode(&b, SQ_MSG_PING, 0x1122334455667788ull, "hey", 3);
    cr_assert_eq(b.len, SQ_IPC_HEADER_SIZE + 3);
    sq_frame_t f;
    size_t used = 0;
    cr_assert_eq(sq_frame_decode(b.data, b.len, &f, &used), 1);
    cr_assert_eq(used, b.len);
    cr_assert_eq(f.type, SQ_MSG_PING);
    cr_assert_eq(f.id, 0x1122334455667788ull);
    cr_assert_eq(f.len, 3);
    cr_assert_eq(memcmp(f.payload, "hey", 3), 0);
    sq_buf_dispose(&b);
}

Test(ipc, truncated_frames_need_more_bytes_at_every_cut)
{
    sq_buf_t b;
    sq_buf_init(&b);
    sq_frame_encode(&b, SQ_MSG_HELLO, 7, "0123456789", 10);
    for (size_t cut = 0; cut < b.len; cut++) {
        sq_frame_t f;
        size_t used = 0;
        cr_assert_eq(sq_frame_decode(b.data, cut, &f, &used), 0, "cut at %zu", cut);
    }
    sq_buf_dispose(&b);
}

Test(ipc, oversized_frames_are_rejected_before_buffering)
{
    uint8_t h[SQ_IPC_HEADER_SIZE] = {0};
    sq_put_le32(h, SQ_IPC_MAX_PAYLOAD + 1);
    sq_put_le16(h + 4, SQ_MSG_PING);
    sq_frame_t f;
    size_t used;
    cr_assert_eq(sq_frame_decode(h, sizeof(h), &f, &used), SQ_PROTOCOL);
}

Test(ipc, unknown_types_and_reserved_flags_are_rejected)
{
    uint8_t h[SQ_IPC_HEADER_SIZE] = {0};
    sq_put_le16(h + 4, 999);
    sq_frame_t f;
    size_t used;
    cr_assert_eq(sq_frame_decode(h, sizeof(h), &f, &used), SQ_PROTOCOL);
    sq_put_le16(h + 4, SQ_MSG_PING);
    sq_put_le16(h + 6, 1);
    cr_assert_eq(sq_frame_decode(h, sizeof(h), &f, &used), SQ_PROTOCOL);
}

Test(ipc, message_names)
{
    cr_assert_str_eq(sq_msg_name(SQ_MSG_WELCOME), "WELCOME");
    cr_assert_null(sq_msg_name(0));
}

Test(ipc, hello_round_trip_and_bad_magic)
{
    sq_hello_t in = {
        .magic = SQ_IPC_MAGIC, .version = SQ_IPC_VERSION, .memory_bytes = 1ull << 34, .pid = 4242};
    strcpy(in.kind, "emu");
    strcpy(in.name, "emu:7");
    sq_buf_t b;
    sq_buf_init(&b);
    sq_hello_encode(&b, &in);
    sq_frame_t f = {.type = SQ_MSG_HELLO, .payload = b.data, .len = (uint32_t)b.len};
    sq_hello_t out;
    cr_assert_eq(sq_hello_decode(&f, &out), 0);
    cr_assert_str_eq(out.name, "emu:7");
    cr_assert_str_eq(out.kind, "emu");
    cr_assert_eq(out.memory_bytes, 1ull << 34);
    cr_assert_eq(out.pid, 4242);
    b.data[0] ^= 0xff;
    cr_assert_eq(sq_hello_decode(&f, &out), SQ_PROTOCOL);
    f.len = 5;
    cr_assert_eq(sq_hello_decode(&f, &out), SQ_PROTOCOL, "a short payload is refused");
    sq_buf_dispose(&b);
}

Test(ipc, frames_cross_a_real_socket_in_pieces_with_an_fd)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    sq_conn_t a, b;
    sq_conn_init(&a, sv[0]);
    sq_conn_init(&b, sv[1]);
    sq_welcome_t w = {.version = 1, .worker_id = 9, .heartbeat_ms = 200, .shm_bytes = 4096};
    sq_buf_t pl;
    sq_buf_init(&pl);
    sq_welcome_encode(&pl, &w);
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    cr_assert_eq(sq_conn_send(&a, SQ_MSG_PING, 1, NULL, 0), 0);
    cr_assert_eq(
        sq_conn_send_with_fd(&a, SQ_MSG_WELCOME, 2, pl.data, (uint32_t)pl.len, pipefd[1], 1000), 0);
    close(pipefd[1]);
    cr_assert_gt(sq_conn_read(&b), 0);
    sq_frame_t f;
    cr_assert_eq(sq_conn_next(&b, &f), 1);
    cr_assert_eq(f.type, SQ_MSG_PING);
    cr_assert_eq(sq_conn_next(&b, &f), 1);
    cr_assert_eq(f.type, SQ_MSG_WELCOME);
    sq_welcome_t got;
    cr_assert_eq(sq_welcome_decode(&f, &got), 0);
    cr_assert_eq(got.worker_id, 9);
    int fd = sq_conn_take_fd(&b);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "x", 1), 1, "the passed fd is the pipe's write end");
    char c;
    cr_assert_eq(read(pipefd[0], &c, 1), 1);
    cr_assert_eq(c, 'x');
    close(fd);
    close(pipefd[0]);
    cr_assert_eq(sq_conn_next(&b, &f), 0);
    cr_assert_eq(sq_conn_read(&b), -EAGAIN);
    sq_conn_dispose(&a);
    cr_assert_eq(sq_conn_read(&b), 0, "EOF after the peer closes");
    sq_conn_dispose(&b);
    sq_buf_dispose(&pl);
}

/* Moves what a holds to b until a has nothing left; returns the frames b
 * decoded, checking each against what was sent. */
static int pump_frames(sq_conn_t *a, sq_conn_t *b, const uint16_t *types, const uint8_t *file,
                       size_t chunk, int nframes)
{
    int got = 0, rc;
    size_t file_off = 0;
    do {
        rc = sq_conn_flush(a);
        cr_assert_geq(rc, 0);
        int n = sq_conn_read(b);
        cr_assert(n > 0 || n == -EAGAIN, "read: %d", n);
        sq_frame_t f;
        while (sq_conn_next(b, &f) == 1) {
            cr_assert_lt(got, nframes);
            cr_assert_eq(f.type, types[got], "frame %d: type %u", got, f.type);
            cr_assert_eq(f.id, (uint64_t)got);
            if (f.type == SQ_MSG_MODEL_CHUNK) {
                cr_assert_eq(f.len, chunk);
                cr_assert_eq(memcmp(f.payload, file + file_off, chunk), 0, "chunk at %zu",
                             file_off);
                file_off += chunk;
            } else {
                cr_assert_eq(f.len, 5);
                cr_assert_eq(memcmp(f.payload, "owned", 5), 0);
            }
            got++;
        }
    } while (rc == 1 || got < nframes);
    return got;
}

Test(ipc, borrowed_payloads_go_out_in_order_between_copied_frames_uncopied_and_released)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    sq_conn_t a, b;
    sq_conn_init(&a, sv[0]);
    sq_conn_init(&b, sv[1]);
    enum { CHUNK = 1 << 20, CHUNKS = 8 };
    uint8_t *data = malloc((size_t)CHUNK * CHUNKS);
    for (size_t i = 0; i < (size_t)CHUNK * CHUNKS; i++)
        data[i] = (uint8_t)(i * 7 + i / 4096);
    sq_bytes_t *file = sq_bytes_adopt(data, (size_t)CHUNK * CHUNKS);
    /* An owned frame, the file in chunks with an owned frame in the middle,
     * and one after: the socket takes far less than 8 MB at once. */
    uint16_t types[CHUNKS + 3];
    int n = 0;
    types[n] = SQ_MSG_PING;
    cr_assert_eq(sq_conn_send(&a, SQ_MSG_PING, (uint64_t)n++, "owned", 5), 0);
    for (int i = 0; i < CHUNKS; i++) {
        if (i == CHUNKS / 2) {
            types[n] = SQ_MSG_PONG;
            cr_assert_eq(sq_conn_send(&a, SQ_MSG_PONG, (uint64_t)n++, "owned", 5), 0);
        }
        types[n] = SQ_MSG_MODEL_CHUNK;
        cr_assert_eq(
            sq_conn_send_ref(&a, SQ_MSG_MODEL_CHUNK, (uint64_t)n++, file, (size_t)i * CHUNK, CHUNK),
            0);
    }
    types[n] = SQ_MSG_PING;
    cr_assert_eq(sq_conn_send(&a, SQ_MSG_PING, (uint64_t)n++, "owned", 5), 0);
    cr_assert(sq_conn_pending(&a));
    cr_assert_lt(a.out.cap, (size_t)CHUNK, "the file is borrowed, not copied: out holds %zu",
                 a.out.cap);
    cr_assert_gt(atomic_load(&file->refs), 1, "queued chunks hold the file");
    cr_assert_eq(pump_frames(&a, &b, types, data, CHUNK, n), n);
    cr_assert_not(sq_conn_pending(&a));
    cr_assert_eq(atomic_load(&file->refs), 1, "every chunk written dropped its reference");
    cr_assert_eq(a.bytes_written, (uint64_t)n * SQ_IPC_HEADER_SIZE + (uint64_t)CHUNK * CHUNKS +
                                      (uint64_t)(n - CHUNKS) * 5);
    sq_bytes_unref(file);
    sq_conn_dispose(&a);
    sq_conn_dispose(&b);
}

Test(ipc, a_connection_disposed_with_borrowed_payloads_queued_releases_them)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    sq_conn_t a;
    sq_conn_init(&a, sv[0]);
    size_t len = 4u << 20;
    sq_bytes_t *file = sq_bytes_adopt(calloc(1, len), len);
    for (size_t off = 0; off < len; off += 1u << 20)
        cr_assert_eq(sq_conn_send_ref(&a, SQ_MSG_MODEL_CHUNK, 1, file, off, 1u << 20), 0);
    cr_assert(sq_conn_pending(&a), "nobody reads: the socket cannot take 4 MB");
    sq_conn_dispose(&a);
    cr_assert_eq(atomic_load(&file->refs), 1);
    sq_bytes_unref(file);
    close(sv[1]);
}

Test(ipc, a_large_copied_frame_is_given_back_once_written)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    sq_conn_t a, b;
    sq_conn_init(&a, sv[0]);
    sq_conn_init(&b, sv[1]);
    size_t len = 3u << 20;
    uint8_t *big = calloc(1, len);
    cr_assert_eq(sq_conn_send(&a, SQ_MSG_MODEL_CHUNK, 5, big, (uint32_t)len), 0);
    size_t frames = 0;
    int rc;
    do {
        rc = sq_conn_flush(&a);
        cr_assert_geq(rc, 0);
        sq_conn_read(&b);
        sq_frame_t f;
        while (sq_conn_next(&b, &f) == 1) {
            cr_assert_eq(f.len, len);
            frames++;
        }
    } while (rc == 1 || frames == 0);
    cr_assert_eq(frames, 1);
    cr_assert_eq(a.out.cap, 0, "the 3 MB output buffer is freed once empty");
    free(big);
    sq_conn_dispose(&a);
    sq_conn_dispose(&b);
}

Test(ipc, a_garbage_stream_is_a_protocol_error)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    sq_conn_t b;
    sq_conn_init(&b, sv[1]);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(write(sv[0], junk, sizeof(junk)), (ssize_t)sizeof(junk));
    cr_assert_gt(sq_conn_read(&b), 0);
    sq_frame_t f;
    cr_assert_eq(sq_conn_next(&b, &f), SQ_PROTOCOL);
    close(sv[0]);
    sq_conn_dispose(&b);
}

Test(ipc, an_emulated_detector_load_round_trips_and_its_row_must_be_five_floats_a_slot)
{
    sq_model_load_t *in = calloc(1, sizeof(*in)), *out = calloc(1, sizeof(*out));
    in->format = SQ_FORMAT_EMULATED;
    in->max_batch = 4;
    in->in_chw[0] = 3;
    in->in_chw[1] = in->in_chw[2] = 32;
    in->det_slots = 16;
    in->det_mean = 2.5;
    in->out_classes = 80;
    in->n_latency = 4;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_model_load_encode(&b, in);
    sq_frame_t f = {.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_model_load_decode(&f, out), 0);
    cr_assert_eq(out->det_slots, 16);
    cr_assert_float_eq(out->det_mean, 2.5, 1e-12);
    cr_assert_eq(out->out_classes, 80);
    /* A row that is not 4 box floats and a score per slot, or a mean past
     * the slots, is a protocol error. */
    double means[] = {2.5, 17, -1};
    uint32_t outs[] = {81, 80, 80};
    for (int i = 0; i < 3; i++) {
        in->det_mean = means[i];
        in->out_classes = outs[i];
        b.len = 0;
        sq_model_load_encode(&b, in);
        f = (sq_frame_t){.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
        cr_assert_eq(sq_model_load_decode(&f, out), SQ_PROTOCOL, "case %d", i);
    }
    sq_buf_dispose(&b);
    free(in);
    free(out);
}

/* A load says up to which batch the model's profile on the worker's kind
 * reaches (protocol 9): the sizes a cpu plan makes at once. Past the
 * load's max batch it is a protocol error. */
Test(ipc, a_load_carries_the_batch_its_profile_reaches)
{
    sq_model_load_t *in = calloc(1, sizeof(*in)), *out = calloc(1, sizeof(*out));
    in->format = SQ_FORMAT_ONNX;
    in->max_batch = 16;
    in->ready_batch = 5;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_model_load_encode(&b, in);
    sq_frame_t f = {.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_model_load_decode(&f, out), 0);
    cr_assert_eq(out->ready_batch, 5);
    in->ready_batch = 17;
    b.len = 0;
    sq_model_load_encode(&b, in);
    f = (sq_frame_t){.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_model_load_decode(&f, out), SQ_PROTOCOL);
    sq_buf_dispose(&b);
    free(in);
    free(out);
}

Test(ipc, group_load_and_member_batches_round_trip)
{
    sq_model_load_t *in = calloc(1, sizeof(*in)), *out = calloc(1, sizeof(*out));
    in->format = SQ_FORMAT_GROUP;
    in->max_batch = 16;
    in->n_members = 3;
    for (int i = 0; i < 3; i++) {
        snprintf(in->members[i].sha256, sizeof(in->members[i].sha256), "%064d", i);
        snprintf(in->members[i].cut, sizeof(in->members[i].cut), "/Flatten_output_%d", i);
    }
    sq_buf_t b;
    sq_buf_init(&b);
    sq_model_load_encode(&b, in);
    sq_frame_t f = {.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_model_load_decode(&f, out), 0);
    cr_assert_eq(out->n_members, 3);
    cr_assert_str_eq(out->members[2].cut, "/Flatten_output_2");
    cr_assert_str_eq(out->members[1].sha256, in->members[1].sha256);
    /* A group without members, or members on a plain model, is refused. */
    in->n_members = 0;
    b.len = 0;
    sq_model_load_encode(&b, in);
    f = (sq_frame_t){.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_model_load_decode(&f, out), SQ_PROTOCOL);
    in->format = SQ_FORMAT_ONNX;
    in->n_members = 1;
    b.len = 0;
    sq_model_load_encode(&b, in);
    f = (sq_frame_t){.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_model_load_decode(&f, out), SQ_PROTOCOL);

    sq_batch_t *bi = calloc(1, sizeof(*bi)), *bo = calloc(1, sizeof(*bo));
    bi->count = 4;
    bi->has_members = 1;
    for (int i = 0; i < 4; i++) {
        bi->in_off[i] = 4096u * (unsigned)i;
        bi->member[i] = (uint16_t)(i / 2);
    }
    b.len = 0;
    sq_batch_encode(&b, bi);
    f = (sq_frame_t){.type = SQ_MSG_BATCH, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_batch_decode(&f, bo), 0);
    cr_assert_eq(bo->has_members, 1);
    cr_assert_eq(bo->member[3], 1);
    cr_assert_eq(bo->in_off[3], 3 * 4096u);
    sq_buf_dispose(&b);
    free(in);
    free(out);
    free(bi);
    free(bo);
}

/* The precision a model's config asks for reaches the worker with its load
 * (protocol 8), every value of it; a value past bf16 is a protocol error. */
Test(ipc, a_load_carries_the_asked_precision)
{
    sq_model_load_t *in = calloc(1, sizeof(*in)), *out = calloc(1, sizeof(*out));
    in->format = SQ_FORMAT_ONNX;
    in->max_batch = 8;
    in->bgr = 1;
    in->out_classes = 10;
    sq_buf_t b;
    sq_buf_init(&b);
    for (int p = 0; p <= SQ_PRECISION_COUNT; p++) {
        in->precision = (uint8_t)p;
        b.len = 0;
        sq_model_load_encode(&b, in);
        sq_frame_t f = {.type = SQ_MSG_MODEL_LOAD, .payload = b.data, .len = (uint32_t)b.len};
        memset(out, 0xff, sizeof(*out));
        if (p == SQ_PRECISION_COUNT) {
            cr_assert_eq(sq_model_load_decode(&f, out), SQ_PROTOCOL, "precision %d", p);
            continue;
        }
        cr_assert_eq(sq_model_load_decode(&f, out), 0, "precision %d", p);
        cr_assert_eq(out->precision, p);
        cr_assert_eq(out->bgr, 1, "the fields around it stay in place");
        cr_assert_eq(out->out_classes, 10);
    }
    sq_buf_dispose(&b);
    free(in);
    free(out);
}

/* PROFILE_DONE says what precision the plan ran and its deviation from
 * FP32's outputs (protocol 8): -1 (not measured) and +inf (overflow) pass,
 * NaN and a precision past bf16 do not, and nothing may trail. */
Test(ipc, profile_done_carries_the_precision_run_and_its_deviation)
{
    sq_profile_done_t *in = calloc(1, sizeof(*in)), *out = calloc(1, sizeof(*out));
    in->nrows = 2;
    in->rows[0] =
        (sq_profile_row_t){.batch = 1, .mean_us = 100, .std_us = 2, .peak_memory_bytes = 1 << 20};
    in->rows[1] =
        (sq_profile_row_t){.batch = 4, .mean_us = 300, .std_us = 5, .peak_memory_bytes = 2 << 20};
    in->precision = 2; /* fp16 */
    in->max_abs_deviation = 0.0125;
    in->max_rel_deviation = 0.0004;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_profile_done_encode(&b, in);
    sq_frame_t f = {.type = SQ_MSG_PROFILE_DONE, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_profile_done_decode(&f, out), 0);
    cr_assert_eq(out->nrows, 2);
    cr_assert_eq(out->rows[1].batch, 4);
    cr_assert_eq(out->rows[1].peak_memory_bytes, 2u << 20);
    cr_assert_eq(out->precision, 2);
    cr_assert_float_eq(out->max_abs_deviation, 0.0125, 1e-15);
    cr_assert_float_eq(out->max_rel_deviation, 0.0004, 1e-15);

    double ok[] = {0, -1, INFINITY}, bad[] = {NAN, -2};
    for (int i = 0; i < 3; i++) {
        in->max_abs_deviation = in->max_rel_deviation = ok[i];
        b.len = 0;
        sq_profile_done_encode(&b, in);
        f = (sq_frame_t){.type = SQ_MSG_PROFILE_DONE, .payload = b.data, .len = (uint32_t)b.len};
        cr_assert_eq(sq_profile_done_decode(&f, out), 0, "deviation %g", ok[i]);
        cr_assert(out->max_rel_deviation == ok[i], "deviation %g", ok[i]);
    }
    for (int i = 0; i < 2; i++) {
        in->max_abs_deviation = bad[i];
        b.len = 0;
        sq_profile_done_encode(&b, in);
        f = (sq_frame_t){.type = SQ_MSG_PROFILE_DONE, .payload = b.data, .len = (uint32_t)b.len};
        cr_assert_eq(sq_profile_done_decode(&f, out), SQ_PROTOCOL, "deviation %g", bad[i]);
    }
    in->max_abs_deviation = 0;
    in->precision = SQ_PRECISION_COUNT;
    b.len = 0;
    sq_profile_done_encode(&b, in);
    f = (sq_frame_t){.type = SQ_MSG_PROFILE_DONE, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_profile_done_decode(&f, out), SQ_PROTOCOL);
    /* A protocol 7 answer (no precision, no deviations) is refused, not
     * read short. */
    in->precision = 0;
    b.len = 0;
    sq_profile_done_encode(&b, in);
    f = (sq_frame_t){.type = SQ_MSG_PROFILE_DONE, .payload = b.data, .len = (uint32_t)b.len - 17};
    cr_assert_eq(sq_profile_done_decode(&f, out), SQ_PROTOCOL);
    sq_buf_dispose(&b);
    free(in);
    free(out);
}

/* A worker's refusal of a model (MODEL_FAILED) carries the same body as an
 * ERROR frame; squishd must read it as an answer, not as a protocol error
 * (it used to kill the worker and retry the load forever). */
Test(ipc, model_failed_carries_an_error_body)
{
    sq_ipc_error_t in = {.code = SQ_UNSUPPORTED_MODEL}, out;
    snprintf(in.message, sizeof(in.message), "Concat node 'c': 9 inputs");
    sq_buf_t b;
    sq_buf_init(&b);
    sq_ipc_error_encode(&b, &in);
    uint16_t types[] = {SQ_MSG_ERROR, SQ_MSG_MODEL_FAILED};
    for (size_t i = 0; i < 2; i++) {
        memset(&out, 0, sizeof(out));
        sq_frame_t f = {.type = types[i], .payload = b.data, .len = (uint32_t)b.len};
        cr_assert_eq(sq_ipc_error_decode(&f, &out), 0, "type %s", sq_msg_name(types[i]));
        cr_assert_eq(out.code, SQ_UNSUPPORTED_MODEL);
        cr_assert_str_eq(out.message, in.message);
    }
    sq_frame_t other = {.type = SQ_MSG_BATCH_DONE, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_ipc_error_decode(&other, &out), SQ_PROTOCOL);
    sq_buf_dispose(&b);
}

/* A frontend's frames (issue 25): what the dispatcher learns of an item is
 * metadata only, and each decoder refuses what would point outside a
 * batch or carry bytes it did not announce. */
Test(ipc, frontend_items_assignments_rows_and_outputs_round_trip_and_refuse_lies)
{
    sq_fe_item_t in[3] = {
        {.slot = 7,
         .model_key = 42,
         .slo_ms = 25,
         .budget_us = 24000,
         .age_us = 900,
         .input_kind = SQ_INPUT_PIXELS,
         .priority = 2,
         .stage = -1,
         .clump_next = 1},
        {.slot = 8, .model_key = 42, .slo_ms = 25, .budget_us = 23000, .stage = -1},
        {.slot = 9,
         .model_key = 5,
         .slo_ms = 100,
         .best_effort = 1,
         .stage = 1,
         .query_slo_ms = 300,
         .pipeline = "emu"}};
    sq_fe_item_t out[SQ_MAX_FE_ITEMS];
    uint32_t n = 0;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_fe_items_encode(&b, in, 3);
    sq_frame_t f = {.type = SQ_MSG_FE_ITEMS, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_fe_items_decode(&f, out, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(out[0].slot, 7);
    cr_assert_eq(out[0].clump_next, 1);
    cr_assert_eq(out[1].budget_us, 23000);
    cr_assert_str_eq(out[2].pipeline, "emu");
    cr_assert_eq(out[2].stage, 1);
    /* Metadata only: a few dozen bytes an item. */
    cr_assert_lt(b.len, 3 * 64);
    f.len--;
    cr_assert_eq(sq_fe_items_decode(&f, out, &n), SQ_PROTOCOL);
    cr_assert_eq(n, 0);

    sq_fe_assign_t *a = calloc(1, sizeof(*a)), *ao = calloc(1, sizeof(*ao));
    *a = (sq_fe_assign_t){.worker = 3,
                          .addr = "10.0.0.2:7070",
                          .model_key = 42,
                          .count = 4,
                          .row_bytes = 150528,
                          .out_stride = 4032,
                          .n = 2};
    a->slot[0] = 7, a->row[0] = 0, a->slot[1] = 8, a->row[1] = 3;
    b.len = 0;
    sq_fe_assign_encode(&b, a);
    f = (sq_frame_t){.type = SQ_MSG_FE_ASSIGN, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_fe_assign_decode(&f, ao), 0);
    cr_assert_str_eq(ao->addr, "10.0.0.2:7070");
    cr_assert_eq(ao->row[1], 3);
    a->row[1] = 4; /* past the batch */
    b.len = 0;
    sq_fe_assign_encode(&b, a);
    f = (sq_frame_t){.type = SQ_MSG_FE_ASSIGN, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_fe_assign_decode(&f, ao), SQ_PROTOCOL);

    sq_data_rows_t *r = calloc(1, sizeof(*r)), *ro = calloc(1, sizeof(*ro));
    *r = (sq_data_rows_t){.count = 4, .row_bytes = 3, .n = 2};
    r->row[0] = 1, r->present[0] = 1, r->row[1] = 2, r->present[1] = 0;
    b.len = 0;
    sq_data_rows_encode(&b, r);
    sq_buf_put(&b, "abc", 3);
    f = (sq_frame_t){.type = SQ_MSG_DATA_ROWS, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_data_rows_decode(&f, ro), 0);
    cr_assert_eq(ro->nbytes, 3);
    cr_assert_eq(memcmp(ro->bytes, "abc", 3), 0);
    cr_assert_eq(ro->present[1], 0);
    /* An absent row brings no bytes: one more byte is a lie. */
    sq_buf_put(&b, "d", 1);
    f.len++;
    cr_assert_eq(sq_data_rows_decode(&f, ro), SQ_PROTOCOL);
    /* From a frontend on the worker's host: offsets in its arena, no bytes. */
    r->shm = 1;
    r->off[0] = 8192;
    b.len = 0;
    sq_data_rows_encode(&b, r);
    f = (sq_frame_t){.type = SQ_MSG_DATA_ROWS, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_data_rows_decode(&f, ro), 0);
    cr_assert_eq(ro->shm, 1);
    cr_assert_eq(ro->off[0], 8192);
    cr_assert_null(ro->bytes);
    sq_buf_put(&b, "abc", 3);
    f.len += 3;
    cr_assert_eq(sq_data_rows_decode(&f, ro), SQ_PROTOCOL);

    sq_data_output_t *o = calloc(1, sizeof(*o)), *oo = calloc(1, sizeof(*oo));
    *o = (sq_data_output_t){.code = 0, .exec_ns = 5000, .count = 4, .out_stride = 8, .n = 1};
    o->row[0] = 2;
    b.len = 0;
    sq_data_output_encode(&b, o);
    sq_buf_put(&b, "12345678", 8);
    f = (sq_frame_t){.type = SQ_MSG_DATA_OUTPUT, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_data_output_decode(&f, oo), 0);
    cr_assert_eq(oo->row[0], 2);
    cr_assert_eq(oo->nbytes, 8);
    /* A failed batch carries no outputs. */
    o->code = SQ_DEVICE;
    b.len = 0;
    sq_data_output_encode(&b, o);
    f = (sq_frame_t){.type = SQ_MSG_DATA_OUTPUT, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_data_output_decode(&f, oo), 0);
    sq_buf_put(&b, "1", 1);
    f.len++;
    cr_assert_eq(sq_data_output_decode(&f, oo), SQ_PROTOCOL);

    uint64_t slots[4] = {7, 8}, so[4];
    b.len = 0;
    sq_fe_withdraw_encode(&b, slots, 2);
    f = (sq_frame_t){.type = SQ_MSG_FE_WITHDRAW, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_fe_withdraw_decode(&f, so, 4, &n), 0);
    cr_assert_eq(so[1], 8);
    cr_assert_eq(sq_fe_withdraw_decode(&f, so, 1, &n), SQ_PROTOCOL);

    sq_batch_t *bi = calloc(1, sizeof(*bi)), *bo = calloc(1, sizeof(*bo));
    bi->count = 2;
    bi->has_sources = 1;
    bi->src[1] = 3;
    b.len = 0;
    sq_batch_encode(&b, bi);
    f = (sq_frame_t){.type = SQ_MSG_BATCH, .payload = b.data, .len = (uint32_t)b.len};
    cr_assert_eq(sq_batch_decode(&f, bo), 0);
    cr_assert_eq(bo->has_sources, 1);
    cr_assert_eq(bo->src[0], 0);
    cr_assert_eq(bo->src[1], 3);
    sq_buf_dispose(&b);
    free(a);
    free(ao);
    free(r);
    free(ro);
    free(o);
    free(oo);
    free(bi);
    free(bo);
}
