/* Command-line flags for kiln's subcommands: a table of flags, each with a type, a
 * pointer holding its default, help text and, for a number, the range it must lie in.
 * --help prints every flag with its default and range. */
#ifndef KILN_TOOL_FLAGS_H
#define KILN_TOOL_FLAGS_H

#include <math.h>
#include <stdint.h>

typedef enum tool_flag_type {
    TOOL_FLAG_INT,    /* int64_t */
    TOOL_FLAG_FLOAT,  /* double */
    TOOL_FLAG_STRING, /* const char * (NULL: unset) */
    TOOL_FLAG_BOOL,   /* int; "--name" sets 1, "--no-name" sets 0 */
} tool_flag_type;

/* The values a numeric flag takes: from lo to hi, each bound in or out (open). hi INFINITY
 * with hi_open takes finite numbers only. NaN is in no range. Unset (all zero: an entry
 * that leaves it out): any value. */
typedef struct tool_flag_range {
    int set;
    int lo_open, hi_open;
    double lo, hi;
} tool_flag_range;

/* >= a (infinity included) */
#define TOOL_MIN(a)                                                                                \
    { 1, 0, 0, (a), INFINITY }
/* > a */
#define TOOL_ABOVE(a)                                                                              \
    { 1, 1, 0, (a), INFINITY }
/* a finite number >= a, > a */
#define TOOL_FINITE_MIN(a)                                                                         \
    { 1, 0, 1, (a), INFINITY }
#define TOOL_FINITE_ABOVE(a)                                                                       \
    { 1, 1, 1, (a), INFINITY }
/* a..b, both in */
#define TOOL_RANGE(a, b)                                                                           \
    { 1, 0, 0, (a), (b) }
/* [a, b) and (a, b] */
#define TOOL_RANGE_BELOW(a, b)                                                                     \
    { 1, 0, 1, (a), (b) }
#define TOOL_RANGE_ABOVE(a, b)                                                                     \
    { 1, 1, 0, (a), (b) }

/* A table's entry for a flag that takes any value ends after its help: positional
 * initializers that stop early (range all zero) are this table's idiom, not a mistake. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

typedef struct tool_flag {
    const char *name; /* without the leading "--" */
    tool_flag_type type;
    void *ptr;
    const char *help;
    tool_flag_range range; /* TOOL_FLAG_INT and TOOL_FLAG_FLOAT: checked as it is parsed */
    int *given;            /* optional: set to 1 when the command line names the flag */
} tool_flag;

enum { TOOL_FLAGS_OK = 0, TOOL_FLAGS_HELP = 1, TOOL_FLAGS_ERROR = 2 };

/* Parse argv[1..argc) against flags. Arguments that are not flags are positional: they
 * are moved, in order, to argv[1..*npos]. "--name value" and "--name=value" both work.
 * Returns TOOL_FLAGS_HELP after printing help for --help/-h, TOOL_FLAGS_ERROR after
 * printing the reason for an unknown flag or a bad value: one out of its range is named
 * alone with its value and the range ("kiln train: --steps -1: must be >= 0"), the
 * command's name being the lowercase words that follow "usage: " in usage. */
int tool_flags_parse(const tool_flag *flags, int nflags, int argc, char **argv, int *npos,
                     const char *usage);
void tool_flags_help(const tool_flag *flags, int nflags, const char *usage);

/* A check of one value that the table cannot make (it applies only with another flag, or
 * its range is not one interval): 0 when v lies in r, else TOOL_FLAGS_ERROR after
 * "<cmd>: --<flag> <v>: must be <r>" on stderr. integer: v is a count, printed as one. */
int tool_flag_check(const char *cmd, const char *flag, double v, int integer, tool_flag_range r);
/* The same message for a limit in words: "<cmd>: --<flag> <value>: must be <limit>". */
int tool_flag_refuse(const char *cmd, const char *flag, const char *value, const char *limit);

/* One flag's value from text, checked as the command line's is (messages start "<cmd>: "). */
int tool_flag_set(const char *cmd, const tool_flag *f, const char *v);

/* Configuration files (flags_json.c): a JSON object whose keys are the table's flag names
 * without the dashes and whose values are numbers, strings or booleans (on/off flags).
 * tool_flags_load_json sets the table's variables from the file at path, each value checked
 * as on the command line; an unknown key, a wrong type, a duplicate key, a file that is
 * missing or not one JSON object is refused with its name and the file's (TOOL_FLAGS_ERROR).
 * String values are copied into owned, which the caller frees (tool_owned_free) once the
 * table's variables are no longer used. */
typedef struct tool_owned {
    char **s;
    int n;
} tool_owned;
void tool_owned_free(tool_owned *o);
int tool_flags_load_json(const tool_flag *flags, int nflags, const char *path, const char *cmd,
                         tool_owned *owned);
/* The value of --name in argv[1..argc) ("--name V" or "--name=V", the last one; none after
 * "--"), or NULL: a configuration file is read before the command line that overrides it. */
const char *tool_flags_find(int argc, char **argv, const char *name);
/* The table's values as a JSON object (malloc'd text; NULL: out of memory), in the table's
 * order: every flag except those named in skip (NULL-terminated), strings that are unset
 * and flags with a `given` that were not given (their default means "not given");
 * a relative value of a flag named in paths (NULL-terminated) is written against the
 * current folder, so that the file means the same from anywhere. */
char *tool_flags_to_json(const tool_flag *flags, int nflags, const char *const *skip,
                         const char *const *paths);

/* Print "kiln: <what>: <status>: <message>" to stderr. */
void tool_report(const char *what, int status);

#endif
