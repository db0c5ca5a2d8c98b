/*
 * test.h — a tiny assertion harness for gpipe's test programs.
 *
 * Every CHECK counts as one check; a failed one prints file:line and the
 * expression (with values for the numeric forms) and the program exits
 * non-zero at the end.  The last line a test program prints is
 * "<name>: N passed, N failed", which CTest output keeps.
 * Include in exactly one .c file per test program (the counters are static).
 */
#ifndef GP_TEST_H
#define GP_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gpt_passed, gpt_failed;

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (cond) gpt_passed++;                                                 \
        else {                                                                  \
            gpt_failed++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                       \
    } while (0)

#define CHECK_MSG(cond, ...)                                                    \
    do {                                                                        \
        if (cond) gpt_passed++;                                                 \
        else {                                                                  \
            gpt_failed++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_NEAR(a, b, atol, rtol)                                            \
    do {                                                                        \
        double gpt_a = (double)(a), gpt_b = (double)(b);                        \
        double gpt_tol = (double)(atol) + (double)(rtol) * fabs(gpt_b);         \
        if (fabs(gpt_a - gpt_b) <= gpt_tol) gpt_passed++;                       \
        else {                                                                  \
            gpt_failed++;                                                       \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g vs %s = %.9g (tol %.3g)\n", \
                    __FILE__, __LINE__, #a, gpt_a, #b, gpt_b, gpt_tol);         \
        }                                                                       \
    } while (0)

#define CHECK_OK(expr)                                                          \
    do {                                                                        \
        gp_status gpt_s = (expr);                                               \
        if (gpt_s == GP_OK) gpt_passed++;                                       \
        else {                                                                  \
            gpt_failed++;                                                       \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__,  \
                    #expr, gp_status_name(gpt_s), gp_last_error());             \
        }                                                                       \
    } while (0)

/* The call fails with `code` and its message contains `needle`. */
#define CHECK_ERR(expr, code, needle)                                           \
    do {                                                                        \
        gp_status gpt_s = (expr);                                               \
        const char *gpt_m = gp_last_error();                                    \
        if (gpt_s == (code) && strstr(gpt_m, (needle))) gpt_passed++;           \
        else {                                                                  \
            gpt_failed++;                                                       \
            fprintf(stderr, "%s:%d: %s: expected %s containing \"%s\", got %s: \"%s\"\n", \
                    __FILE__, __LINE__, #expr, gp_status_name(code), (needle),  \
                    gp_status_name(gpt_s), gpt_m);                              \
        }                                                                       \
    } while (0)

/* The whole file at path in a malloc'ed buffer with a '\0' after its last
 * byte (so a text file reads as a string), its length in *n unless n is
 * NULL; NULL when it cannot be opened. */
static inline void *gpt_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(k > 0 ? k : 0) + 1);
    size_t got = b ? fread(b, 1, (size_t)(k > 0 ? k : 0), f) : 0;
    fclose(f);
    if (!b) return NULL;
    b[got] = '\0';
    if (n) *n = got;
    return b;
}

/* Whether s is UTF-8: every character's lead byte followed by as many
 * continuation bytes as it says (naive; overlong forms not looked for). */
static inline bool gpt_utf8_valid(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int more = *p < 0x80 ? 0 : *p >= 0xC0 && *p < 0xE0 ? 1 : *p >= 0xE0 && *p < 0xF0 ? 2
                 : *p >= 0xF0 && *p < 0xF8 ? 3 : -1;
        if (more < 0) return false;
        p++;
        for (int q = 0; q < more; q++, p++)
            if ((*p & 0xC0) != 0x80) return false;
    }
    return true;
}

/* The sanitizer a test runs under, from GPIPE_SANITIZED, which CI's
 * sanitizer stages set (.ci/run): "address" (AddressSanitizer + UBSan) or
 * "thread" (ThreadSanitizer); any other non-empty value (the "1" that CI
 * set before, or a script's own) says sanitized without saying which.
 * The tests thin their largest grids under a sanitizer, and leave parts
 * with no thread of their own out under ThreadSanitizer; the unsanitized
 * build runs everything, and each test says what it left out. */
typedef enum { GPT_SAN_NONE, GPT_SAN_UNKNOWN, GPT_SAN_ADDRESS, GPT_SAN_THREAD } gpt_san;

static inline gpt_san gpt_sanitizer(void)
{
    const char *s = getenv("GPIPE_SANITIZED");
    if (!s || !*s) return GPT_SAN_NONE;
    if (!strcmp(s, "address")) return GPT_SAN_ADDRESS;
    if (!strcmp(s, "thread")) return GPT_SAN_THREAD;
    return GPT_SAN_UNKNOWN;
}

/* Print the summary line and return the exit code. */
static inline int gpt_finish(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, gpt_passed, gpt_failed);
    fflush(stdout);
    return gpt_failed ? 1 : (gpt_passed ? 0 : 1);
}

#endif
