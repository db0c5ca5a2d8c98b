/*
 * fuzz_util.h — shared by the libFuzzer targets (fuzz_*.c): the readers
 * that take a path get the input through one temporary file per process,
 * rewritten for every input and removed at exit.
 *
 * Each target defines LLVMFuzzerTestOneInput; clang's -fsanitize=fuzzer
 * supplies main() (GPIPE_FUZZ=ON), replay_main.c does otherwise (the
 * corpus replay that ctest runs under the normal and sanitizer builds).
 */
#ifndef GP_FUZZ_UTIL_H
#define GP_FUZZ_UTIL_H

#include "core/core.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_path[256];

static inline void fuzz_cleanup(void)
{
    if (fuzz_path[0]) unlink(fuzz_path);
}

/* The input as a file; the path stays valid until the next call. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) {
        const char *t = getenv("TMPDIR");
        snprintf(fuzz_path, sizeof fuzz_path, "%s/gpipe_fuzz_XXXXXX", t && *t ? t : "/tmp");
        fd = mkstemp(fuzz_path);
        if (fd < 0) abort();
        atexit(fuzz_cleanup);
        gp_log_set_level(GP_LOG_QUIET);
    }
    if (ftruncate(fd, 0) != 0) abort();
    size_t off = 0;
    while (off < size) {
        ssize_t w = pwrite(fd, data + off, size - off, (off_t)off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
    return fuzz_path;
}

#endif
