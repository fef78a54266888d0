/* The option table's parser (sq_opts.h). */
#include "sq_opts.h"

#include "sq_error.h"
#include "sq_log.h"
#include "sq_text.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FLAGS 256

void sq_opt_flag_name(const sq_opt_t *o, char *out, size_t n)
{
    snprintf(out, n, "--%s", o->name);
    for (char *p = out; *p; p++)
        if (*p == '_')
            *p = '-';
}

static void env_name(const sq_opts_spec_t *spec, const sq_opt_t *o, char *out, size_t n)
{
    snprintf(out, n, "%s%s", spec->env_prefix, o->name);
    for (char *p = out; *p; p++)
        if (*p >= 'a' && *p <= 'z')
            *p = (char)(*p - 'a' + 'A');
}

/* Sets one option from its text form; on error writes "what: why". */
static int set_option(void *base, const sq_opt_t *o, const char *v, const char *what, char *err,
                      size_t errlen)
{
    char why[256] = "";
    int rc = 0;
    char *field = (char *)base + o->offset;
    switch (o->type) {
    case SQ_OPT_STR:
        if (strlen(v) >= o->size) {
            snprintf(why, sizeof(why), "longer than %zu characters", o->size - 1);
            rc = SQ_BAD_CONFIG;
            break;
        }
        memcpy(field, v, strlen(v) + 1);
        break;
    case SQ_OPT_INT:
    case SQ_OPT_LONG: {
        long long n;
        if (sq_parse_ll(v, &n) != 0 || n < o->min || n > o->max) {
            snprintf(why, sizeof(why), "expected an integer in %lld..%lld, got '%s'", o->min,
                     o->max, v);
            rc = SQ_BAD_CONFIG;
            break;
        }
        if (o->type == SQ_OPT_INT)
            *(int *)field = (int)n;
        else
            *(long long *)field = n;
        break;
    }
    case SQ_OPT_DOUBLE: {
        char *end;
        double d = strtod(v, &end);
        if (end == v || *end != '\0' || !(d >= (double)o->min && d <= (double)o->max)) {
            snprintf(why, sizeof(why), "expected a number in %lld..%lld, got '%s'", o->min, o->max,
                     v);
            rc = SQ_BAD_CONFIG;
            break;
        }
        *(double *)field = d;
        break;
    }
    case SQ_OPT_LOGLEVEL:
        if (sq_log_level_parse(v, (sq_log_level_t *)field) != 0) {
            snprintf(why, sizeof(why), "expected debug, info, warn, error or off, got '%s'", v);
            rc = SQ_BAD_CONFIG;
        }
        break;
    case SQ_OPT_CUSTOM:
        if (o->parse(base, o, v, why, sizeof(why)) != 0)
            rc = SQ_BAD_CONFIG;
        break;
    }
    if (rc != 0)
        snprintf(err, errlen, "%s: %s", what, why);
    return rc;
}

static const sq_opt_t *find_option(const sq_opts_spec_t *spec, const char *name)
{
    for (size_t i = 0; i < spec->nopts; i++)
        if (strcmp(spec->opts[i].name, name) == 0)
            return &spec->opts[i];
    return NULL;
}

static int load_file(const sq_opts_spec_t *spec, void *base, const char *path, char *err,
                     size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(err, errlen, "%s: line %d: %s", path, jerr.line, jerr.text);
        return SQ_BAD_CONFIG;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: expected a JSON object", path);
        rc = SQ_BAD_CONFIG;
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        char what[300];
        snprintf(what, sizeof(what), "%s: %s", path, key);
        const sq_opt_t *o = find_option(spec, key);
        if (o == NULL || strcmp(key, spec->config_opt) == 0) {
            snprintf(err, errlen, "%s: unknown setting", what);
            rc = SQ_BAD_CONFIG;
            goto out;
        }
        char text[512];
        if (json_is_string(val))
            snprintf(text, sizeof(text), "%s", json_string_value(val));
        else if (json_is_integer(val))
            snprintf(text, sizeof(text), "%lld", (long long)json_integer_value(val));
        else if (json_is_real(val))
            snprintf(text, sizeof(text), "%.17g", json_real_value(val));
        else {
            snprintf(err, errlen, "%s: expected a string or an integer", what);
            rc = SQ_BAD_CONFIG;
            goto out;
        }
        if ((rc = set_option(base, o, text, what, err, errlen)) != 0)
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

static const char *env_get(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

void sq_opts_usage(const sq_opts_spec_t *spec, FILE *f)
{
    for (size_t i = 0; i < spec->nopts; i++) {
        const sq_opt_t *o = &spec->opts[i];
        char flag[64];
        sq_opt_flag_name(o, flag, sizeof(flag));
        fprintf(f, "  %-26s %s", flag, o->help);
        if (o->def != NULL && o->def[0] != '\0')
            fprintf(f, " [%s]", o->def);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-26s %s\n  %-26s %s\n", "--help", "print this and exit", "--version",
            "print the version and exit");
}

int sq_opts_parse(const sq_opts_spec_t *spec, void *base, int argc, char **argv, char **envp,
                  sq_opts_action_t *action, char *err, size_t errlen)
{
    *action = SQ_OPTS_RUN;
    for (size_t i = 0; i < spec->nopts; i++) {
        const sq_opt_t *o = &spec->opts[i];
        if (o->def == NULL || (o->type == SQ_OPT_CUSTOM && o->def[0] == '\0'))
            continue;
        int rc = set_option(base, o, o->def, o->name, err, errlen);
        if (rc != 0)
            return rc; /* a bad default is a bug, but say so */
    }

    /* Flags are collected first so that the config file can be read before
     * the environment and the flags override it. */
    const sq_opt_t *flag_opt[MAX_FLAGS];
    const char *flag_val[MAX_FLAGS];
    char flag_what[MAX_FLAGS][72];
    int nflags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = SQ_OPTS_HELP;
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            *action = SQ_OPTS_VERSION;
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "%s: unexpected argument", a);
            return SQ_BAD_CONFIG;
        }
        char name[64];
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (nlen >= sizeof(name)) {
            snprintf(err, errlen, "%.64s: unknown flag", a);
            return SQ_BAD_CONFIG;
        }
        memcpy(name, a + 2, nlen);
        name[nlen] = '\0';
        for (char *p = name; *p; p++)
            if (*p == '-')
                *p = '_';
        const sq_opt_t *o = find_option(spec, name);
        if (o == NULL) {
            snprintf(err, errlen, "--%.*s: unknown flag (see --help)", (int)nlen, a + 2);
            return SQ_BAD_CONFIG;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (v == NULL) {
            if (i + 1 >= argc) {
                sq_opt_flag_name(o, name, sizeof(name));
                snprintf(err, errlen, "%s: missing value", name);
                return SQ_BAD_CONFIG;
            }
            v = argv[++i];
        }
        if (nflags == MAX_FLAGS) {
            snprintf(err, errlen, "too many flags");
            return SQ_BAD_CONFIG;
        }
        flag_opt[nflags] = o;
        flag_val[nflags] = v;
        sq_opt_flag_name(o, flag_what[nflags], sizeof(flag_what[nflags]));
        nflags++;
    }

    const sq_opt_t *config = spec->config_opt ? find_option(spec, spec->config_opt) : NULL;
    if (config != NULL) {
        const char *config_file = NULL;
        char ename[80];
        if (spec->env_prefix != NULL) {
            env_name(spec, config, ename, sizeof(ename));
            config_file = env_get(envp, ename);
        }
        for (int i = 0; i < nflags; i++)
            if (flag_opt[i] == config)
                config_file = flag_val[i];
        if (config_file != NULL && *config_file != '\0') {
            char flag[72];
            sq_opt_flag_name(config, flag, sizeof(flag));
            int rc = set_option(base, config, config_file, flag, err, errlen);
            if (rc != 0 || (rc = load_file(spec, base, config_file, err, errlen)) != 0)
                return rc;
        }
    }
    for (size_t i = 0; spec->env_prefix != NULL && i < spec->nopts; i++) {
        const sq_opt_t *o = &spec->opts[i];
        char ename[80];
        env_name(spec, o, ename, sizeof(ename));
        const char *v = env_get(envp, ename);
        if (v == NULL || o == config)
            continue;
        int rc = set_option(base, o, v, ename, err, errlen);
        if (rc != 0)
            return rc;
    }
    for (int i = 0; i < nflags; i++) {
        if (flag_opt[i] == config)
            continue; /* read above */
        int rc = set_option(base, flag_opt[i], flag_val[i], flag_what[i], err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}
