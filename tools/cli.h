/*
 * cli.h — what the command-line tools share: their exit codes and the map
 * from a library status to one (header-only; each tool is one program).
 */
#ifndef GP_CLI_H
#define GP_CLI_H

#include "gpipe.h"

enum {
    EXIT_OK = 0,
    EXIT_USAGE = 2,   /* bad command line or bad config */
    EXIT_DATA = 3,    /* dataset or file missing / corrupt */
    EXIT_RUNTIME = 4  /* failure while running: out of memory, NaN, backend error */
};

static inline int exit_code_for(gp_status s)
{
    switch (s) {
    case GP_OK: return EXIT_OK;
    case GP_ERR_INVALID:
    case GP_ERR_UNSUPPORTED: return EXIT_USAGE;
    case GP_ERR_IO:
    case GP_ERR_DATA: return EXIT_DATA;
    default: return EXIT_RUNTIME;
    }
}

#endif
