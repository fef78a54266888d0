/* libFuzzer target for the squishd <-> worker protocol decoding
 * (common/ipc.c, common/msgs.c, common/buf.c): what either side does with
 * bytes from a peer it must not trust.
 *
 * Input: byte 0 sets how the stream arrives (0: at once, else in chunks of
 * byte 0 bytes); the rest is the byte stream. The stream is cut into frames
 * twice: by sq_frame_decode over the whole of it, and by sq_conn_next fed
 * chunk by chunk, as sq_conn_read fills a connection. Both must see the
 * same frames and stop at the same place. Every frame goes through every
 * message decoder (each must reject a frame of another type), and a message
 * that decodes must encode back to exactly its payload: the encoding is
 * canonical, so a decoder that accepted anything else has missed a check. */
#include <sq.h>
#include <sq_ipc.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_FRAMES 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    uint16_t type;
    uint64_t id;
    size_t off; /* payload offset in the stream */
    uint32_t len;
} seen_frame_t;

/* Checks that enc is the payload (exact, or a prefix where the decoder
 * tolerates trailing bytes: the handshake messages). */
static void check_encoding(const sq_buf_t *enc, const sq_frame_t *f, int exact)
{
    if (exact ? enc->len != f->len : enc->len > f->len)
        abort();
    if (enc->len && memcmp(enc->data, f->payload, enc->len) != 0)
        abort();
}

static void decode_all(const sq_frame_t *f)
{
    /* The large messages live on the heap so that ASan sees their edges. */
    static sq_model_load_t *load;
    static sq_batch_t *batch;
    static sq_profile_done_t *prof;
    static sq_fe_assign_t *assign;
    static sq_data_rows_t *rows;
    static sq_data_output_t *output;
    static sq_fe_item_t *items;
    static uint64_t *slots;
    if (load == NULL) {
        load = malloc(sizeof(*load));
        batch = malloc(sizeof(*batch));
        prof = malloc(sizeof(*prof));
        assign = malloc(sizeof(*assign));
        rows = malloc(sizeof(*rows));
        output = malloc(sizeof(*output));
        items = malloc(sizeof(*items) * SQ_MAX_FE_ITEMS);
        slots = malloc(sizeof(*slots) * SQ_MAX_FE_ITEMS);
        if (load == NULL || batch == NULL || prof == NULL || assign == NULL || rows == NULL ||
            output == NULL || items == NULL || slots == NULL)
            abort();
    }
    sq_fe_hello_t fe_hello;
    sq_fe_welcome_t fe_welcome;
    sq_fe_fail_t fe_fail;
    uint32_t nitems = 0, nslots = 0;
    sq_hello_t hello;
    sq_welcome_t welcome;
    sq_ipc_error_t error;
    sq_model_loaded_t loaded;
    sq_batch_done_t done;
    sq_profile_req_t req;
    sq_buf_t enc;
    sq_buf_init(&enc);
    int ok = 0;

/* An error body comes in ERROR frames and, saying why a load failed, in
 * MODEL_FAILED frames; every other message in frames of its own type. */
#define FUZZ_DECODE(msg, msg_type, exact, ...)                                                     \
    do {                                                                                           \
        int rc_ = sq_##msg##_decode(f, __VA_ARGS__);                                               \
        if (rc_ != 0 && rc_ != SQ_PROTOCOL)                                                        \
            abort();                                                                               \
        if (rc_ == 0) {                                                                            \
            if (f->type != (msg_type) &&                                                           \
                !((msg_type) == SQ_MSG_ERROR && f->type == SQ_MSG_MODEL_FAILED))                   \
                abort();                                                                           \
            ok++;                                                                                  \
            enc.len = 0;                                                                           \
            sq_##msg##_encode(&enc, __VA_ARGS__);                                                  \
            check_encoding(&enc, f, exact);                                                        \
        }                                                                                          \
    } while (0)

    FUZZ_DECODE(hello, SQ_MSG_HELLO, 0, &hello);
    FUZZ_DECODE(welcome, SQ_MSG_WELCOME, 0, &welcome);
    FUZZ_DECODE(ipc_error, SQ_MSG_ERROR, 0, &error);
    FUZZ_DECODE(model_load, SQ_MSG_MODEL_LOAD, 1, load);
    FUZZ_DECODE(model_loaded, SQ_MSG_MODEL_LOADED, 1, &loaded);
    FUZZ_DECODE(batch, SQ_MSG_BATCH, 1, batch);
    FUZZ_DECODE(batch_done, SQ_MSG_BATCH_DONE, 1, &done);
    FUZZ_DECODE(profile_req, SQ_MSG_PROFILE, 1, &req);
    FUZZ_DECODE(profile_done, SQ_MSG_PROFILE_DONE, 1, prof);
    /* Frontends' messages (issue 25); rows and outputs carry bytes after
     * their header. */
    FUZZ_DECODE(fe_hello, SQ_MSG_FE_HELLO, 1, &fe_hello);
    FUZZ_DECODE(fe_welcome, SQ_MSG_FE_WELCOME, 1, &fe_welcome);
    FUZZ_DECODE(fe_assign, SQ_MSG_FE_ASSIGN, 1, assign);
    FUZZ_DECODE(fe_fail, SQ_MSG_FE_FAIL, 1, &fe_fail);
    FUZZ_DECODE(data_rows, SQ_MSG_DATA_ROWS, 0, rows);
    FUZZ_DECODE(data_output, SQ_MSG_DATA_OUTPUT, 0, output);
#undef FUZZ_DECODE
    int irc = sq_fe_items_decode(f, items, &nitems);
    if (irc != 0 && irc != SQ_PROTOCOL)
        abort();
    if (irc == 0) {
        if (f->type != SQ_MSG_FE_ITEMS)
            abort();
        ok++;
        enc.len = 0;
        sq_fe_items_encode(&enc, items, nitems);
        check_encoding(&enc, f, 1);
    }
    int wrc = sq_fe_withdraw_decode(f, slots, SQ_MAX_FE_ITEMS, &nslots);
    if (wrc != 0 && wrc != SQ_PROTOCOL)
        abort();
    if (wrc == 0) {
        if (f->type != SQ_MSG_FE_WITHDRAW)
            abort();
        ok++;
        enc.len = 0;
        sq_fe_withdraw_encode(&enc, slots, nslots);
        check_encoding(&enc, f, 1);
    }
    /* A remote worker's model files: a list, encoded from its entries. */
    sq_models_held_t held;
    int hrc = sq_models_held_decode(f, &held);
    if (hrc != 0 && hrc != SQ_PROTOCOL && hrc != SQ_NOMEM)
        abort();
    if (hrc != 0 && held.sha256 != NULL)
        abort(); /* nothing to free after a refusal */
    if (hrc == 0) {
        if (f->type != SQ_MSG_MODELS_HELD)
            abort();
        ok++;
        enc.len = 0;
        sq_models_held_encode(&enc, held.n, (const char(*)[65])held.sha256);
        check_encoding(&enc, f, 1);
        free(held.sha256);
    }
    if (ok > 1)
        abort(); /* one frame, one message type */
    sq_buf_dispose(&enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = data[0];
    const uint8_t *stream = data + 1;
    size_t len = size - 1;
    uint8_t *copy = malloc(len ? len : 1); /* exact size: ASan sees overreads */
    if (copy == NULL)
        abort();
    memcpy(copy, stream, len);

    /* Whole stream at once. */
    seen_frame_t seen[FUZZ_MAX_FRAMES];
    int nseen = 0, end_rc = 0;
    size_t off = 0;
    while (nseen < FUZZ_MAX_FRAMES) {
        sq_frame_t f;
        size_t used = 0;
        int rc = sq_frame_decode(copy + off, len - off, &f, &used);
        if (rc != 1) {
            if (rc != 0 && rc != SQ_PROTOCOL)
                abort();
            end_rc = rc;
            break;
        }
        if (used != SQ_IPC_HEADER_SIZE + (size_t)f.len || used > len - off || f.flags != 0 ||
            sq_msg_name(f.type) == NULL || f.payload != copy + off + SQ_IPC_HEADER_SIZE)
            abort();
        decode_all(&f);
        seen[nseen++] = (seen_frame_t){f.type, f.id, off + SQ_IPC_HEADER_SIZE, f.len};
        off += used;
    }

    /* The same stream through a connection's input buffer, chunk by chunk. */
    sq_conn_t c;
    sq_conn_init(&c, -1);
    size_t fed = 0;
    int n = 0, rc = 0;
    while (n < nseen || (n == nseen && nseen < FUZZ_MAX_FRAMES)) {
        sq_frame_t f;
        rc = sq_conn_next(&c, &f);
        if (rc == 1) {
            if (n == nseen || f.type != seen[n].type || f.id != seen[n].id ||
                f.len != seen[n].len || memcmp(f.payload, copy + seen[n].off, f.len) != 0)
                abort();
            n++;
            continue;
        }
        if (rc != 0)
            break;
        if (fed == len)
            break;
        size_t chunk = step == 0 || step > len - fed ? len - fed : step;
        sq_buf_put(&c.in, copy + fed, chunk);
        fed += chunk;
    }
    if (n != nseen)
        abort();
    if (nseen < FUZZ_MAX_FRAMES && rc != end_rc)
        abort(); /* the connection stops where the whole-stream decode stopped */
    sq_conn_dispose(&c);
    free(copy);
    return 0;
}
