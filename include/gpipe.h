/*
 * gpipe.h — the public C API of gpipe, a pipeline-parallel trainer.
 *
 * Everything a program needs to load a run description (YAML), build the
 * model, train and evaluate it, and read metrics.  Handles are opaque; every
 * function that can fail returns a gp_status and leaves a human-readable
 * message for the calling thread in gp_last_error().
 *
 * Memory: objects returned by gp_*_create / gp_*_load are freed with the
 * matching gp_*_destroy / gp_*_free, which accept NULL.
 * Threads: a gp_run is used from one thread at a time; gpipe starts its own
 * worker threads internally.
 */
#ifndef GPIPE_H
#define GPIPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPIPE_VERSION_MAJOR 0
#define GPIPE_VERSION_MINOR 1
#define GPIPE_VERSION_PATCH 0

/* Status codes.  The integer values are stable (they are part of the ABI). */
typedef enum gp_status {
    GP_OK = 0,
    GP_ERR_INVALID = 1,     /* bad argument or configuration */
    GP_ERR_IO = 2,          /* file missing, unreadable, unwritable */
    GP_ERR_DATA = 3,        /* malformed or truncated data file */
    GP_ERR_OOM = 4,         /* a device's memory capacity was exceeded */
    GP_ERR_NUMERIC = 5,     /* NaN or Inf in the loss or gradients */
    GP_ERR_UNSUPPORTED = 6, /* feature or device not available in this build */
    GP_ERR_RUNTIME = 7,     /* a backend library call failed */
    GP_ERR_CANCELLED = 8    /* stopped because another worker failed */
} gp_status;

/* "ok", "invalid", ... */
const char *gp_status_name(gp_status s);
/* The calling thread's last error message ("" if none). */
const char *gp_last_error(void);
/* "0.1.0" */
const char *gp_version(void);

/* ---- running a configuration --------------------------------------------
 * The same path gpipe-train takes: load YAML (+ overrides), build, train. */

typedef struct gp_run gp_run;

/* Load `path` and apply `n_overrides` strings of the form "a.b.c=value"
 * (value parsed as YAML).  Errors name file:line:column. */
gp_status gp_run_load(const char *path, const char *const *overrides,
                      int n_overrides, gp_run **out);
void gp_run_free(gp_run *run);

#ifdef __cplusplus
}
#endif
#endif /* GPIPE_H */
