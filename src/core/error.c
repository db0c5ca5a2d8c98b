/*
 * error.c — per-thread error messages, status names, assertion failures,
 * logging and the monotonic clock.
 *
 * The message buffer is thread-local (like errno): each worker thread has its
 * own, and the executor copies a failing worker's message to the caller.
 */
#include "core/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <time.h>

static _Thread_local char tls_msg[GP_ERRMSG_LEN];

/* A message snprintf cut to its buffer (`wanted`, what it returned, is
 * size or more) ends between two UTF-8 characters, not inside one: a long
 * path of multi-byte characters stays valid text in the messages, and in
 * the JSON and traces that copy them. */
static void cut_at_char(char *buf, size_t size, int wanted)
{
    if (wanted >= 0 && (size_t)wanted >= size) buf[gp_utf8_cut(buf, size - 1)] = '\0';
}

gp_status gp_error_set(gp_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cut_at_char(tls_msg, sizeof tls_msg, vsnprintf(tls_msg, sizeof tls_msg, fmt, ap));
    va_end(ap);
    /* Host memory refused under an address-space limit (`ulimit -v`) is
     * the limit more often than the machine: say so. */
    struct rlimit as; /* (once: a message set again from an earlier one has it) */
    if (code == GP_ERR_OOM && strstr(tls_msg, "host memory") && !strstr(tls_msg, "(ulimit -v)") &&
        getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
        size_t n = strlen(tls_msg);
        int k = snprintf(tls_msg + n, sizeof tls_msg - n, "; this process's address space is "
                         "limited to %llu MiB (ulimit -v): raise the limit, or give the run "
                         "less to hold", (unsigned long long)(as.rlim_cur >> 20));
        cut_at_char(tls_msg, sizeof tls_msg, k < 0 ? k : (int)n + k);
    }
    return code;
}

const char *gp_thread_error(int e, char *buf, size_t len)
{
    struct rlimit as;
    if ((e == EAGAIN || e == ENOMEM) && getrlimit(RLIMIT_AS, &as) == 0 &&
        as.rlim_cur != RLIM_INFINITY)
        snprintf(buf, len, "%s; this process's address space is limited to %llu MiB (ulimit -v) "
                 "and each thread's stack is mapped whole: raise the limit", strerror(e),
                 (unsigned long long)(as.rlim_cur >> 20));
    else
        snprintf(buf, len, "%s", strerror(e));
    return buf;
}

static atomic_bool g_flags;
static const char *_Atomic g_renamed[GP_OPT_COUNT]; /* gp_opt_rename's */

void gp_names_use_flags(void) { atomic_store(&g_flags, true); }

const char *gp_opt_name(gp_opt o)
{
    static const char *const flags[GP_OPT_COUNT] = {
        "--set", "--resume", "--resume latest", "--metrics", "--trace", "--trace-steps",
        "--export-weights", "model.init_from"};
    static const char *const library[GP_OPT_COUNT] = {
        "override",
        "gp_train_options.resume",
        "gp_train_options.resume = \"latest\"",
        "gp_train_options.metrics_path",
        "gp_train_options.trace_path",
        "gp_train_options.trace_first:trace_last",
        "gp_train_options.export_weights",
        "model.init_from"};
    if ((unsigned)o >= GP_OPT_COUNT) return "?";
    const char *own = atomic_load(&g_renamed[o]);
    if (own) return own;
    return (atomic_load(&g_flags) ? flags : library)[o];
}

void gp_opt_rename(gp_opt o, const char *name)
{
    if ((unsigned)o < GP_OPT_COUNT) atomic_store(&g_renamed[o], name);
}

const char *gp_shell_word(const char *s, char *buf, size_t len)
{
    if (len == 0) return buf;
    if (s[0] && !strpbrk(s, " \t\n{}[]*?;&|<>()$\"'\\`#~!^")) {
        snprintf(buf, len, "%s", s);
        return buf;
    }
    size_t n = 0;
    buf[n++] = '\'';
    for (; *s && n + 6 < len; s++) {
        if (*s == '\'') {
            memcpy(buf + n, "'\\''", 4);
            n += 4;
        } else {
            buf[n++] = *s;
        }
    }
    if (n + 1 < len) buf[n++] = '\'';
    buf[n < len ? n : len - 1] = '\0';
    return buf;
}

const char *gp_opt_value(gp_opt o, const char *value, char *buf, size_t len)
{
    const char *name = gp_opt_name(o);
    if (atomic_load(&g_flags)) {
        char w[2048];
        snprintf(buf, len, "%s %s", name, gp_shell_word(value, w, sizeof w));
    } else {
        snprintf(buf, len, o == GP_OPT_SET ? "%s \"%s\"" : "%s = \"%s\"", name, value);
    }
    return buf;
}

gp_status gp_error_wrap(gp_status code, const char *fmt, ...)
{
    char prefix[GP_ERRMSG_LEN];
    char old[GP_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    cut_at_char(prefix, sizeof prefix, vsnprintf(prefix, sizeof prefix, fmt, ap));
    va_end(ap);
    memcpy(old, tls_msg, sizeof old);
    /* prefix + ": " + old, truncated to the buffer between characters */
    size_t n = strlen(prefix);
    if (n > sizeof tls_msg - 3) n = gp_utf8_cut(prefix, sizeof tls_msg - 3);
    memcpy(tls_msg, prefix, n);
    memcpy(tls_msg + n, ": ", 2);
    size_t m = strnlen(old, sizeof old - 1);
    if (m > sizeof tls_msg - n - 3) m = gp_utf8_cut(old, sizeof tls_msg - n - 3);
    memcpy(tls_msg + n + 2, old, m);
    tls_msg[n + 2 + m] = '\0';
    return code;
}

const char *gp_error_message(void) { return tls_msg; }
const char *gp_last_error(void) { return tls_msg; }
void gp_error_clear(void) { tls_msg[0] = '\0'; }

const char *gp_error_quote(const char *s, size_t n, size_t most, char *buf, size_t len)
{
    size_t o = 0;
    if (!len) return buf;
    for (size_t k = 0; k < n && k < most; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c < 0x20 || c == 0x7f) {
            if (o + 5 >= len) break;
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", c);
        } else {
            if (o + 2 >= len) break;
            buf[o++] = (char)c;
        }
    }
    if (n > most && o + 4 < len) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

size_t gp_utf8_cut(const char *s, size_t n)
{
    size_t k = n, more = 0;
    while (k > 0 && more < 3 && ((unsigned char)s[k - 1] & 0xC0) == 0x80) k--, more++;
    if (k == 0) return n;
    unsigned char lead = (unsigned char)s[k - 1];
    size_t want = lead >= 0xF8 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    return more < want ? k - 1 : n;
}

int gp_status_exit_code(gp_status s)
{
    switch (s) {
    case GP_OK: return 0;
    case GP_ERR_INVALID:
    case GP_ERR_UNSUPPORTED: return 2;
    case GP_ERR_IO:
    case GP_ERR_DATA: return 3;
    default: return 4;
    }
}

const char *gp_status_name(gp_status s)
{
    switch (s) {
    case GP_OK: return "ok";
    case GP_ERR_INVALID: return "invalid";
    case GP_ERR_IO: return "io";
    case GP_ERR_DATA: return "data";
    case GP_ERR_OOM: return "out-of-memory";
    case GP_ERR_NUMERIC: return "numeric";
    case GP_ERR_UNSUPPORTED: return "unsupported";
    case GP_ERR_RUNTIME: return "runtime";
    case GP_ERR_CANCELLED: return "cancelled";
    case GP_ERR_STOPPED: return "stopped";
    }
    return "unknown";
}

#define GP_STR_(x) #x
#define GP_STR(x) GP_STR_(x)
const char *gp_version(void)
{
    return GP_STR(GPIPE_VERSION_MAJOR) "." GP_STR(GPIPE_VERSION_MINOR) "." GP_STR(
        GPIPE_VERSION_PATCH);
}

_Noreturn void gp_assert_fail(const char *expr, const char *file, int line,
                              const char *func)
{
    fprintf(stderr, "gpipe: internal error: assertion `%s` failed at %s:%d in %s()\n"
                    "       this is a bug in gpipe; please report it with the config used\n",
            expr, file, line, func);
    fflush(stderr);
    abort();
}

/* ---- logging ----------------------------------------------------------- */

/* Process-wide verbosity, read by every thread: atomic so it is race-free. */
static _Atomic int log_level = -1;

void gp_log_set_level(gp_log_level level) { log_level = (int)level; }

/* The level a name (GPIPE_LOG's, gp_set_log_level's) gives, in
 * gp_log_level's order; -1 for no level's name. */
static int level_named(const char *name)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "quiet"};
    for (int i = 0; name && i < 5; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

gp_status gp_set_log_level(const char *level)
{
    if (!level) { /* GPIPE_LOG again, read on the next line logged */
        log_level = -1;
        return GP_OK;
    }
    int lv = level_named(level);
    if (lv < 0)
        return gp_error_set(GP_ERR_INVALID, "log level '%s': give debug, info, warn, error or "
                            "quiet (or NULL for GPIPE_LOG's)", level);
    log_level = lv;
    return GP_OK;
}

static int current_level(void)
{
    if (log_level < 0) {
        int lv = level_named(getenv("GPIPE_LOG"));
        log_level = lv < 0 ? GP_LOG_INFO : lv; /* unset or no level's name: info */
    }
    return log_level;
}

bool gp_log_enabled(gp_log_level level) { return (int)level >= current_level(); }

void gp_log(gp_log_level level, const char *fmt, ...)
{
    if ((int)level < current_level()) return;
    static const char *tag[] = {"debug", "info", "warning", "error"};
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line so lines from several threads do not interleave. */
    fprintf(stderr, "gpipe: %s: %s\n", tag[level], line);
}

double gp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
