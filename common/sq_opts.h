/* Command-line options as one table, for every squish program: each entry
 * names a setting, its type and bounds, its default, where it lands in the
 * program's configuration struct, and its help line. One parser reads the
 * defaults, then an optional JSON config file, then optional environment
 * variables, then the flags (each source overriding the one before), and
 * every error names the flag, variable or file key it came from. squishd's
 * configuration (gateway/config.c) and squish-worker's flags use it. */
#ifndef SQ_OPTS_H
#define SQ_OPTS_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    SQ_OPT_STR,      /* char[size] at offset */
    SQ_OPT_INT,      /* int at offset, min..max */
    SQ_OPT_LONG,     /* long long at offset, min..max */
    SQ_OPT_DOUBLE,   /* double at offset, min..max */
    SQ_OPT_LOGLEVEL, /* sq_log_level_t at offset */
    SQ_OPT_CUSTOM,   /* parse() does it */
} sq_opt_type_t;

typedef struct sq_opt sq_opt_t;
struct sq_opt {
    /* The setting's name: its JSON key, its flag --name with '-' for '_',
     * its environment variable PREFIX + NAME in upper case. */
    const char *name;
    sq_opt_type_t type;
    size_t offset;
    size_t size; /* SQ_OPT_STR: the buffer's size */
    long long min, max;
    const char *def; /* its text form; "" sets nothing (a custom one: not parsed) */
    const char *help;
    /* SQ_OPT_CUSTOM: parses text v into the configuration at base; 0, or
     * non-zero with why (without the option's name). */
    int (*parse)(void *base, const sq_opt_t *o, const char *v, char *why, size_t whylen);
};
/* A flag given twice is parsed twice, in order: the last value counts,
 * unless a custom parse() collects them (squish-worker's --connect). */

typedef struct {
    const sq_opt_t *opts;
    size_t nopts;
    /* Environment variables as env_prefix + NAME ("SQUISH_"); NULL: none. */
    const char *env_prefix;
    /* The option that names a JSON config file read before the environment
     * and the flags (its keys are the options' names); NULL: none. */
    const char *config_opt;
} sq_opts_spec_t;

typedef enum { SQ_OPTS_RUN, SQ_OPTS_HELP, SQ_OPTS_VERSION } sq_opts_action_t;

/* Fills the configuration at base from the defaults, the config file, the
 * environment (envp, may be NULL) and argv (--name VALUE or --name=VALUE;
 * --help / -h and --version end parsing with that action). Returns 0, or
 * SQ_BAD_CONFIG with "--flag: why" (or "VAR: why", "FILE: key: why") in
 * err. */
int sq_opts_parse(const sq_opts_spec_t *spec, void *base, int argc, char **argv, char **envp,
                  sq_opts_action_t *action, char *err, size_t errlen);

/* One line per option: the flag, its help and its default. */
void sq_opts_usage(const sq_opts_spec_t *spec, FILE *f);

/* "--name" of an option into out (for messages). */
void sq_opt_flag_name(const sq_opt_t *o, char *out, size_t n);

#endif
