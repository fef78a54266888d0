/* The wire-format pre-check of an upload's protobuf (mdb_graph_int.h):
 * protobuf-c recurses without a limit and allocates many times the size of
 * a hostile file, so the bytes are walked first, with a nesting limit and
 * a count of what decoding them would allocate. */
#include "mdb_graph_int.h"

#include <protobuf-c/protobuf-c.h>

#include <stdbool.h>
#include <stdint.h>

/* Legitimate ONNX nests Model > Graph > Node > Attribute > Graph ... a few
 * levels deep; protobuf-c recursion must not follow a hostile file further. */
#define MAX_PROTO_DEPTH 24

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return false;
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* Walks a message of type desc, descending into known message fields, and
 * fails on truncation, groups or nesting deeper than MAX_PROTO_DEPTH. It
 * also adds up what protobuf-c will allocate to decode it (*cost, bytes):
 * an empty nested message costs two bytes on the wire and a hundred in
 * memory, a packed varint one byte and eight, so a hostile file could
 * otherwise ask for many times its size. */
bool mdb_onnx_wire_check(const ProtobufCMessageDescriptor *desc, const uint8_t *p,
                         const uint8_t *end, int depth, uint64_t *cost)
{
    if (depth > MAX_PROTO_DEPTH)
        return false;
    *cost += desc ? desc->sizeof_message : 0;
    while (p < end) {
        uint64_t key, len;
        if (!read_varint(&p, end, &key))
            return false;
        uint32_t field = (uint32_t)(key >> 3);
        if (field == 0 || key >> 3 > 0x1fffffff)
            return false;
        const ProtobufCFieldDescriptor *f =
            desc ? protobuf_c_message_descriptor_get_field(desc, field) : NULL;
        /* Unknown fields are kept by protobuf-c (a copy and a header);
         * repeated elements take an array slot. */
        *cost += !f ? 32 : f->label == PROTOBUF_C_LABEL_REPEATED ? 8 : 0;
        switch (key & 7) {
        case 0:
            if (!read_varint(&p, end, &len))
                return false;
            break;
        case 1:
            if (end - p < 8)
                return false;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return false;
            p += 4;
            break;
        case 2: {
            if (!read_varint(&p, end, &len) || len > (uint64_t)(end - p))
                return false;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                if (!mdb_onnx_wire_check(f->descriptor, p, p + len, depth + 1, cost))
                    return false;
            } else if (f && f->label == PROTOBUF_C_LABEL_REPEATED &&
                       f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_BYTES) {
                *cost += len * 8; /* packed scalars: at worst one byte each, eight decoded */
            } else {
                *cost += len + 16;
            }
            p += len;
            break;
        }
        default:
            return false; /* groups (3, 4) and reserved wire types */
        }
    }
    return true;
}

/* What decoding may allocate for an input of len bytes: weights decode
 * about one to one, structure a few times its size. */
uint64_t mdb_onnx_decode_budget(size_t len)
{
    return (uint64_t)len * 4 + ((uint64_t)64 << 20);
}
