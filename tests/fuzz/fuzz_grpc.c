/* libFuzzer target for the gRPC room's request decoding
 * (gateway/grpc/grpc_codec.c): protobuf-c's unpacking of each method's
 * request, then squish's own checks of what it asks (the name, a version
 * that must be "" or 1..1000000000, the repository's name), and the
 * method a call's path names.
 *
 * Input: a first byte that picks the method (modulo their count), then
 * the message's bytes as a client sends them, copied into a buffer of
 * their exact size so that ASan reports a read one byte past them. The
 * same bytes are also tried as a call's path. A success must give a
 * terminated name of the room's size and a version in 0..1000000000; a
 * failure must be SQ_BAD_REQUEST with a reason. */
#include "grpc_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gw_grpc_method_t m = (gw_grpc_method_t)(data[0] % GW_GRPC_METHOD_COUNT);
    size_t len = size - 1;
    uint8_t *msg = malloc(len > 0 ? len : 1);
    if (msg == NULL)
        return 0;
    memcpy(msg, data + 1, len);
    gw_grpc_req_t req;
    char why[256];
    why[0] = '\0';
    int rc = gw_grpc_decode(m, msg, len, &req, why, sizeof(why));
    if (rc == 0) {
        if (memchr(req.name, '\0', sizeof(req.name)) == NULL)
            abort();
        if (req.version < 0 || req.version > 1000000000 || (req.ready != 0 && req.ready != 1))
            abort();
    } else if (rc != SQ_BAD_REQUEST || why[0] == '\0' || memchr(why, '\0', sizeof(why)) == NULL) {
        abort();
    }
    int method = gw_grpc_method_of((const char *)msg, len);
    if (method < -1 || method >= GW_GRPC_METHOD_COUNT)
        abort();
    if (method >= 0 && gw_grpc_method_name((gw_grpc_method_t)method)[0] == '\0')
        abort();
    if (gw_grpc_status_of(rc) < 0 || gw_grpc_status_of(rc) > 16)
        abort();
    free(msg);
    return 0;
}
