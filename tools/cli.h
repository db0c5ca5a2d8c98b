/*
 * cli.h — what the command-line tools share: their exit codes and the hint
 * for a --set value the shell split (header-only; each tool is one program).
 */
#ifndef GP_CLI_H
#define GP_CLI_H

#include "core/core.h"
#include "gpipe.h"

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

/* The map from a library status to one of these is core's
 * gp_status_exit_code (a failing rank under mpirun exits with it too). */

#endif
