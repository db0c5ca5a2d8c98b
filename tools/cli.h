/*
 * cli.h — what the command-line tools share: their exit codes and the hint
 * for a --set value the shell split (header-only; each tool is one program).
 */
#ifndef GP_CLI_H
#define GP_CLI_H

#include "core/core.h"
#include "gpipe.h"

#include <stdio.h>
#include <string.h>

enum {
    EXIT_OK = 0,
    EXIT_USAGE = 2,   /* bad command line or bad config */
    EXIT_DATA = 3,    /* dataset or file missing / corrupt */
    EXIT_RUNTIME = 4  /* failure while running: out of memory, NaN, backend error */
};

/* A word after a --set's value that is not an option: the value was split
 * by the shell at a blank ("--set pipeline.devices=[cpu:0, cpu:1]"). */
#define SET_SPLIT_HINT                                                                        \
    "; it follows a --set value: quote a value with blanks, like --set "                      \
    "'pipeline.devices=[cpu:0, cpu:1]', and write KEY=VALUE as one word"

/* Argument a as one of the n options in `valued` that take a value,
 * written "--opt=VALUE": its name into opt and VALUE returned.  Anything
 * else returns NULL with a's own text in opt (then "--opt VALUE" takes the
 * next argument).  Every tool takes both forms of every option that has a
 * value. */
static inline const char *cli_split_valued(const char *a, const char *const *valued, size_t n,
                                           char *opt, size_t len)
{
    snprintf(opt, len, "%s", a);
    const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
    if (!eq || (size_t)(eq - a) >= len) return NULL;
    for (size_t q = 0; q < n; q++)
        if (strlen(valued[q]) == (size_t)(eq - a) && !strncmp(a, valued[q], (size_t)(eq - a))) {
            snprintf(opt, len, "%s", valued[q]);
            return eq + 1;
        }
    return NULL;
}

/* The map from a library status to one of these is core's
 * gp_status_exit_code (a failing rank under mpirun exits with it too). */

#endif
