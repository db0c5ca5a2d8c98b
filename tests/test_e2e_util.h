/*
 * test_e2e_util.h — what the end-to-end tests (test_e2e.c, test_e2e_writes.c),
 * which run the real gpipe-train and gpipe-balance, share:
 *
 *   tmpdir, bin, balance_bin  the scratch directory and the two binaries
 *   e2e_start                 fills them in (false: no scratch directory)
 *   run                       a shell command's exit status and output
 *   write_file                a text into a file
 *   in_tmp                    tmpdir/name
 *
 * Include it instead of test_util.h, in the one .c file of such a test
 * program: like test.h's counters, its state is static, one per program.
 */
#ifndef GP_TEST_E2E_UTIL_H
#define GP_TEST_E2E_UTIL_H

#include "test_util.h"

static char tmpdir[256];
static char bin[512];
static char balance_bin[512];

/* The binaries' paths, and a new scratch directory /tmp/<prefix>XXXXXX
 * (the caller removes it); false when it cannot be made. */
static inline bool e2e_start(const char *prefix)
{
    gpt_binary_path(bin, sizeof bin, "gpipe-train");
    gpt_binary_path(balance_bin, sizeof balance_bin, "gpipe-balance");
    return gpt_make_tmpdir(tmpdir, sizeof tmpdir, prefix);
}

/* Run a shell command; return its exit status and capture its output. */
static inline int run(const char *cmd, char *out, size_t len)
{
    return gpt_run_cmd(cmd, out, len);
}

static inline void write_file(const char *path, const char *text)
{
    gpt_write_file(path, text, strlen(text));
}

/* tmpdir/name into buf. */
static inline void in_tmp(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%.200s/%s", tmpdir, name);
}

#endif
