/* Command-line flags for kiln's subcommands: a table of flags, each with a type, a
 * pointer holding its default, and help text. --help prints every flag with its default. */
#ifndef KILN_TOOL_FLAGS_H
#define KILN_TOOL_FLAGS_H

#include <stdint.h>

typedef enum tool_flag_type {
    TOOL_FLAG_INT,    /* int64_t */
    TOOL_FLAG_FLOAT,  /* double */
    TOOL_FLAG_STRING, /* const char * (NULL: unset) */
    TOOL_FLAG_BOOL,   /* int; "--name" sets 1, "--no-name" sets 0 */
} tool_flag_type;

typedef struct tool_flag {
    const char *name; /* without the leading "--" */
    tool_flag_type type;
    void *ptr;
    const char *help;
} tool_flag;

enum { TOOL_FLAGS_OK = 0, TOOL_FLAGS_HELP = 1, TOOL_FLAGS_ERROR = 2 };

/* Parse argv[1..argc) against flags. Arguments that are not flags are positional: they
 * are moved, in order, to argv[1..*npos]. "--name value" and "--name=value" both work.
 * Returns TOOL_FLAGS_HELP after printing help for --help/-h, TOOL_FLAGS_ERROR after
 * printing the reason for an unknown flag or a bad value. */
int tool_flags_parse(const tool_flag *flags, int nflags, int argc, char **argv, int *npos,
                     const char *usage);
void tool_flags_help(const tool_flag *flags, int nflags, const char *usage);

/* Print "kiln: <what>: <status>: <message>" to stderr. */
void tool_report(const char *what, int status);

#endif
