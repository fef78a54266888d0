/* A cluster's one view (issue 25): the dispatcher's /metrics and model
 * statistics with those of its frontends folded in. Pure functions over
 * text and JSON: the dispatcher keeps what each frontend last sent. */
#include "gw_metrics.h"

#include <stdlib.h>
#include <string.h>

/* One family of an exposition: its "# HELP" and "# TYPE" lines and its
 * samples, as text. */
typedef struct {
    char *name;
    sq_buf_t head; /* HELP and TYPE lines */
    sq_buf_t body; /* samples */
} family_t;

typedef struct {
    family_t *f;
    int n, cap;
} families_t;

static family_t *family(families_t *fs, const char *name, size_t len)
{
    for (int i = 0; i < fs->n; i++)
        if (strlen(fs->f[i].name) == len && memcmp(fs->f[i].name, name, len) == 0)
            return &fs->f[i];
    if (fs->n == fs->cap) {
        fs->cap = fs->cap ? 2 * fs->cap : 32;
        fs->f = sq_xrealloc(fs->f, sizeof(*fs->f) * (size_t)fs->cap);
    }
    family_t *f = &fs->f[fs->n++];
    f->name = sq_xmalloc(len + 1);
    memcpy(f->name, name, len);
    f->name[len] = '\0';
    sq_buf_init(&f->head);
    sq_buf_init(&f->body);
    return f;
}

/* The metric name a sample line starts with. */
static size_t name_len(const char *line, size_t n)
{
    size_t i = 0;
    while (i < n && line[i] != '{' && line[i] != ' ')
        i++;
    return i;
}

/* Whether a sample of metric `m` belongs to family `fam` (a histogram's
 * _bucket, _sum and _count samples belong to its family). */
static int of_family(const char *m, size_t mlen, const char *fam)
{
    size_t flen = strlen(fam);
    if (mlen < flen || memcmp(m, fam, flen) != 0)
        return 0;
    const char *rest = m + flen;
    size_t rlen = mlen - flen;
    return rlen == 0 || (rlen == 7 && memcmp(rest, "_bucket", 7) == 0) ||
           (rlen == 4 && memcmp(rest, "_sum", 4) == 0) ||
           (rlen == 6 && memcmp(rest, "_count", 6) == 0);
}

/* Reads an exposition into its families; a label, when given, is added
 * to every sample (label="value" first among its labels). HELP and TYPE
 * come from the first text that has the family. */
static void read_text(families_t *fs, const char *text, const char *label, const char *value)
{
    family_t *cur = NULL;
    for (const char *p = text; *p != '\0';) {
        const char *eol = strchr(p, '\n');
        size_t n = eol != NULL ? (size_t)(eol - p) : strlen(p);
        if (n > 7 && (memcmp(p, "# HELP ", 7) == 0 || memcmp(p, "# TYPE ", 7) == 0)) {
            const char *nm = p + 7;
            size_t nl = name_len(nm, n - 7);
            cur = family(fs, nm, nl);
            /* The first text's lines stand; one HELP and one TYPE each. */
            char key[8];
            memcpy(key, p, 7);
            key[7] = '\0';
            int seen = 0;
            for (size_t i = 0; i + 7 <= cur->head.len && !seen; i++)
                seen = (i == 0 || cur->head.data[i - 1] == '\n') &&
                       memcmp(cur->head.data + i, key, 7) == 0;
            if (!seen) {
                sq_buf_put(&cur->head, p, n);
                sq_buf_put(&cur->head, "\n", 1);
            }
        } else if (n > 0 && p[0] != '#') {
            size_t nl = name_len(p, n);
            if (cur == NULL || !of_family(p, nl, cur->name))
                cur = family(fs, p, nl); /* a sample without its HELP/TYPE */
            if (label == NULL) {
                sq_buf_put(&cur->body, p, n);
            } else {
                sq_buf_put(&cur->body, p, nl);
                sq_buf_put(&cur->body, "{", 1);
                sq_buf_put(&cur->body, label, strlen(label));
                sq_buf_put(&cur->body, "=\"", 2);
                for (const char *v = value; *v != '\0'; v++) {
                    if (*v == '\\' || *v == '"')
                        sq_buf_put(&cur->body, "\\", 1);
                    if (*v == '\n')
                        sq_buf_put(&cur->body, "\\n", 2);
                    else
                        sq_buf_put(&cur->body, v, 1);
                }
                sq_buf_put(&cur->body, "\"", 1);
                if (nl < n && p[nl] == '{') {
                    /* its own labels follow ours */
                    if (nl + 1 < n && p[nl + 1] != '}')
                        sq_buf_put(&cur->body, ",", 1);
                    sq_buf_put(&cur->body, p + nl + 1, n - nl - 1);
                } else {
                    sq_buf_put(&cur->body, "}", 1);
                    sq_buf_put(&cur->body, p + nl, n - nl);
                }
            }
            sq_buf_put(&cur->body, "\n", 1);
        }
        p += n + (eol != NULL);
    }
}

void gw_metrics_merge(sq_buf_t *out, const char *own, const char *const *texts,
                      const char *const *names, int n)
{
    families_t fs = {0};
    read_text(&fs, own, NULL, NULL);
    for (int i = 0; i < n; i++)
        if (texts[i] != NULL)
            read_text(&fs, texts[i], "frontend", names[i]);
    for (int i = 0; i < fs.n; i++) {
        family_t *f = &fs.f[i];
        sq_buf_put(out, f->head.data, f->head.len);
        sq_buf_put(out, f->body.data, f->body.len);
        sq_buf_dispose(&f->head);
        sq_buf_dispose(&f->body);
        free(f->name);
    }
    free(fs.f);
}

/* ---- Triton's statistics ------------------------------------------------------- */

/* Adds b's numbers into a's (objects key by key, arrays of batch_stats by
 * batch_size); last_inference keeps the later. */
static void add_numbers(json_t *a, const json_t *b)
{
    const char *k;
    json_t *bv;
    json_object_foreach((json_t *)b, k, bv)
    {
        json_t *av = json_object_get(a, k);
        if (av == NULL) {
            json_object_set_new(a, k, json_deep_copy(bv));
        } else if (json_is_integer(av) && json_is_integer(bv)) {
            json_int_t x = json_integer_value(av), y = json_integer_value(bv);
            json_integer_set(av, strcmp(k, "last_inference") == 0 ? (x > y ? x : y) : x + y);
        } else if (json_is_object(av) && json_is_object(bv)) {
            add_numbers(av, bv);
        } else if (json_is_array(av) && json_is_array(bv) && strcmp(k, "batch_stats") == 0) {
            size_t i;
            json_t *e;
            json_array_foreach((json_t *)bv, i, e)
            {
                json_int_t size = json_integer_value(json_object_get(e, "batch_size"));
                json_t *match = NULL;
                size_t j;
                json_t *x;
                json_array_foreach(av, j, x)
                {
                    if (json_integer_value(json_object_get(x, "batch_size")) == size)
                        match = x;
                }
                if (match != NULL)
                    add_numbers(match, e);
                else
                    json_array_append_new(av, json_deep_copy(e));
            }
        }
    }
}

void gw_metrics_stats_add(json_t *into, const json_t *more)
{
    if (!json_is_object(into) || !json_is_object(more))
        return;
    /* Names and versions are not numbers: only the counts add up. */
    add_numbers(into, more);
}
