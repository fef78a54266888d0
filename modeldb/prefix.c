/* Shared-prefix detection. Every node gets a SHA-256 of what it computes:
 * its op, its canonical attributes and the hashes of its inputs, where a
 * weight is hashed by content and a graph input by position and type. Two
 * nodes with the same hash compute the same function of the same input,
 * whatever the tensors are called or the order initializers were stored in.
 *
 * A node is a cut point when the graph after it reads the part before it
 * only through its one output. In a topologically sorted, compacted graph
 * (every node feeds an output) that means: no tensor written at or before
 * position p, other than the cut itself, and no graph input is read after
 * p, and none of them is a graph output; the prefix is then exactly the
 * first p + 1 nodes. The longest shared prefix of two graphs is the cut
 * point with the most ancestors whose hash both graphs have. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    EVP_MD_CTX *ctx;
} hasher_t;

static bool h_begin(hasher_t *h, char tag)
{
    if (!EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL))
        return false;
    return EVP_DigestUpdate(h->ctx, &tag, 1) == 1;
}

static void h_bytes(hasher_t *h, const void *p, size_t n)
{
    if (n)
        EVP_DigestUpdate(h->ctx, p, n);
}

static void h_i64(hasher_t *h, int64_t v)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)v >> (8 * i));
    h_bytes(h, le, 8);
}

static void h_str(hasher_t *h, const char *s)
{
    size_t n = strlen(s);
    h_i64(h, (int64_t)n);
    h_bytes(h, s, n);
}

static void h_shape(hasher_t *h, const mdb_tensor_t *t)
{
    h_i64(h, t->dtype);
    h_i64(h, t->shape.rank);
    for (int i = 0; i < t->shape.rank; i++)
        h_i64(h, t->shape.dims[i]);
}

static bool h_end(hasher_t *h, mdb_hash_t *out)
{
    unsigned len = 0;
    return EVP_DigestFinal_ex(h->ctx, out->b, &len) == 1 && len == MDB_HASH_LEN;
}

void mdb_hash_hex(const mdb_hash_t *h, char *buf)
{
    sq_hex_encode(h->b, MDB_HASH_LEN, buf);
}

/* Hash of a constant tensor, computed once per tensor. */
static bool const_hash(hasher_t *h, const mdb_tensor_t *t, mdb_hash_t *out)
{
    if (!h_begin(h, 'C'))
        return false;
    h_shape(h, t);
    h_i64(h, (int64_t)t->nbytes);
    h_bytes(h, t->data, t->nbytes);
    return h_end(h, out);
}

static int cmp_attr(const void *a, const void *b)
{
    const mdb_attr_t *x = *(const mdb_attr_t *const *)a, *y = *(const mdb_attr_t *const *)b;
    return strcmp(x->name, y->name);
}

int mdb_graph_signature(const mdb_graph_t *g, mdb_node_sig_t *sigs)
{
    int rc = SQ_INTERNAL;
    hasher_t h = {.ctx = EVP_MD_CTX_new()};
    mdb_hash_t *th = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(*th));
    bool *have = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(bool));
    int64_t *last_use = sq_xcalloc((size_t)g->n_nodes + 1, sizeof(int64_t));
    const mdb_attr_t **attrs = NULL;
    if (!h.ctx)
        goto out;

    for (int i = 0; i < g->n_inputs; i++) {
        const mdb_tensor_t *t = &g->tensors[g->inputs[i]];
        if (!h_begin(&h, 'I'))
            goto out;
        h_i64(&h, i);
        h_shape(&h, t);
        if (!h_end(&h, &th[g->inputs[i]]))
            goto out;
        have[g->inputs[i]] = true;
    }
    for (int t = 0; t < g->n_tensors; t++) {
        if (g->tensors[t].data && !have[t]) {
            if (!const_hash(&h, &g->tensors[t], &th[t]))
                goto out;
            have[t] = true;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *n = &g->nodes[i];
        attrs = sq_xrealloc(attrs, ((size_t)n->n_attrs + 1) * sizeof(*attrs));
        for (int k = 0; k < n->n_attrs; k++)
            attrs[k] = &n->attrs[k];
        qsort(attrs, (size_t)n->n_attrs, sizeof(*attrs), cmp_attr);
        if (!h_begin(&h, 'N'))
            goto out;
        h_str(&h, mdb_op_name(n->op));
        h_i64(&h, n->n_attrs);
        for (int k = 0; k < n->n_attrs; k++) {
            const mdb_attr_t *a = attrs[k];
            h_str(&h, a->name);
            h_i64(&h, a->type);
            switch (a->type) {
            case MDB_ATTR_INT:
                h_i64(&h, a->i);
                break;
            case MDB_ATTR_FLOAT:
                h_bytes(&h, &a->f, sizeof(a->f));
                break;
            case MDB_ATTR_INTS:
                h_i64(&h, (int64_t)a->count);
                for (size_t j = 0; j < a->count; j++)
                    h_i64(&h, a->ints[j]);
                break;
            case MDB_ATTR_FLOATS:
                h_i64(&h, (int64_t)a->count);
                h_bytes(&h, a->floats, a->count * sizeof(float));
                break;
            case MDB_ATTR_STRING:
                h_str(&h, a->s);
                break;
            case MDB_ATTR_TENSOR:
                if (a->tensor >= 0 && have[a->tensor])
                    h_bytes(&h, th[a->tensor].b, MDB_HASH_LEN);
                break;
            }
        }
        h_i64(&h, n->n_inputs);
        for (int k = 0; k < n->n_inputs; k++) {
            int t = n->inputs[k];
            if (t < 0 || !have[t]) {
                /* An omitted optional input; an unset one means the graph
                 * is not sorted, which callers must not pass. */
                if (t >= 0)
                    goto out;
                h_i64(&h, -1);
                continue;
            }
            h_bytes(&h, th[t].b, MDB_HASH_LEN);
        }
        h_i64(&h, n->n_outputs);
        if (!h_end(&h, &sigs[i].hash))
            goto out;
        for (int k = 0; k < n->n_outputs; k++) {
            int t = n->outputs[k];
            if (t < 0 || have[t])
                continue;
            if (!h_begin(&h, 'O'))
                goto out;
            h_bytes(&h, sigs[i].hash.b, MDB_HASH_LEN);
            h_i64(&h, k);
            if (!h_end(&h, &th[t]))
                goto out;
            have[t] = true;
        }
    }

    /* Cut points, by the last reader of each node's outputs. */
    int *producer = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(int));
    for (int t = 0; t < g->n_tensors; t++)
        producer[t] = g->tensors[t].is_input ? -2 : -1;
    for (int i = 0; i < g->n_nodes; i++) {
        last_use[i] = i;
        for (int k = 0; k < g->nodes[i].n_outputs; k++)
            if (g->nodes[i].outputs[k] >= 0)
                producer[g->nodes[i].outputs[k]] = i;
    }
    int64_t input_last = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++) {
            int t = n->inputs[k];
            if (t < 0)
                continue;
            if (producer[t] == -2)
                input_last = i;
            else if (producer[t] >= 0 && last_use[producer[t]] < i)
                last_use[producer[t]] = i;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int t = g->outputs[i];
        if (producer[t] >= 0)
            last_use[producer[t]] = INT64_MAX;
    }
    free(producer);
    int64_t reach = -1; /* max last_use over nodes before p */
    for (int p = 0; p < g->n_nodes; p++) {
        const mdb_node_t *n = &g->nodes[p];
        int outs = 0;
        for (int k = 0; k < n->n_outputs; k++)
            outs += n->outputs[k] >= 0;
        /* A graph output is no cut: nothing of the model would be left to
         * run per member (two copies of one file share one load instead). */
        sigs[p].cut_ok = outs == 1 && reach <= p && input_last <= p && last_use[p] != INT64_MAX;
        sigs[p].ancestors = sigs[p].cut_ok ? (uint32_t)(p + 1) : 0;
        if (last_use[p] > reach)
            reach = last_use[p];
    }
    rc = 0;
out:
    EVP_MD_CTX_free(h.ctx);
    free(th);
    free(have);
    free(last_use);
    free(attrs);
    return rc;
}

typedef struct {
    const mdb_hash_t *hash;
    int node;
} keyed_t;

static int cmp_keyed(const void *a, const void *b)
{
    return memcmp(((const keyed_t *)a)->hash->b, ((const keyed_t *)b)->hash->b, MDB_HASH_LEN);
}

void mdb_prefix_match(const mdb_node_sig_t *a, int n_a, const mdb_node_sig_t *b, int n_b,
                      mdb_prefix_t *out)
{
    memset(out, 0, sizeof(*out));
    out->node_a = out->node_b = out->tensor_a = out->tensor_b = -1;
    keyed_t *keys = sq_xcalloc((size_t)(n_b > 0 ? n_b : 1), sizeof(*keys));
    int nk = 0;
    for (int i = 0; i < n_b; i++)
        if (b[i].cut_ok)
            keys[nk++] = (keyed_t){&b[i].hash, i};
    qsort(keys, (size_t)nk, sizeof(*keys), cmp_keyed);
    for (int i = 0; i < n_a; i++) {
        if (!a[i].cut_ok || (out->found && a[i].ancestors <= out->prefix_nodes))
            continue;
        keyed_t probe = {&a[i].hash, -1};
        keyed_t *hit = bsearch(&probe, keys, (size_t)nk, sizeof(*keys), cmp_keyed);
        if (!hit)
            continue;
        out->found = true;
        out->node_a = i;
        out->node_b = hit->node;
        out->prefix_nodes = a[i].ancestors;
        out->prefix_hash = a[i].hash;
    }
    free(keys);
}

int mdb_prefix_find(const mdb_graph_t *a, const mdb_graph_t *b, mdb_prefix_t *out)
{
    mdb_node_sig_t *sa = sq_xcalloc((size_t)a->n_nodes + 1, sizeof(*sa));
    mdb_node_sig_t *sb = sq_xcalloc((size_t)b->n_nodes + 1, sizeof(*sb));
    int rc = mdb_graph_signature(a, sa);
    if (rc == 0)
        rc = mdb_graph_signature(b, sb);
    if (rc == 0) {
        mdb_prefix_match(sa, a->n_nodes, sb, b->n_nodes, out);
        if (out->found) {
            for (int k = 0; k < a->nodes[out->node_a].n_outputs; k++)
                if (a->nodes[out->node_a].outputs[k] >= 0)
                    out->tensor_a = a->nodes[out->node_a].outputs[k];
            for (int k = 0; k < b->nodes[out->node_b].n_outputs; k++)
                if (b->nodes[out->node_b].outputs[k] >= 0)
                    out->tensor_b = b->nodes[out->node_b].outputs[k];
        }
    }
    free(sa);
    free(sb);
    return rc;
}
