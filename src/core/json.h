/*
 * json.h — gpipe's one JSON reader and one JSON writer (RFC 8259), for the
 * formats it reads from outside (safetensors headers, profiles) and the
 * ones it writes (metrics, traces, profiles, safetensors headers).
 *
 * Reader, two layers:
 *   - a pull reader: the caller walks the document it expects
 *     (enter an object, take its members one by one, read a string or an
 *     unsigned integer...), so a format with one known shape (a
 *     safetensors header) needs no tree and keeps integers exact;
 *   - a small tree (gp_json_value) built with the pull reader, for formats
 *     looked up by key in any order (profiles, tests).
 *   Strict: the RFC's grammar (no comments, trailing commas, NaN, leading
 *   zeros, raw control characters), \u escapes decoded to UTF-8 with
 *   surrogate pairs checked, \u0000 refused (strings come out as C
 *   strings), nesting at most GP_JSON_MAX_DEPTH, numbers that overflow a
 *   double refused.  Bytes >= 0x80 in strings must be UTF-8 (RFC 3629:
 *   no overlong forms, surrogates or code points past U+10FFFF, as Python's
 *   and the safetensors library's readers take it) and are kept as they
 *   are; JSON text is UTF-8 (RFC 8259, 8.1).  The first error sticks: every later call fails,
 *   and r->err says what went wrong at byte r->err_at (gp_json_where turns
 *   that into a line and column) so each format can word its own message.
 *
 * Writer: a growable buffer with comma and nesting bookkeeping; every
 * string (keys too) is escaped (" \ and control characters; UTF-8 kept),
 * non-finite numbers are written as null (JSON has no NaN or Infinity),
 * finite ones with the fewest digits that read back to the same double.
 * Several values at the top level are written one after the other with
 * nothing in between (JSON Lines: the caller puts the "\n").  Misuse (a key
 * inside an array, closing with nothing open) is a bug: GP_ASSERT.
 *
 * Memory: strings the reader returns are malloc'd and the caller's; a tree
 * owns everything below it (gp_json_value_free).  A writer owns its text
 * (gp_json_writer_free); an allocation failure sets `oom`, stops the
 * writing and is reported by gp_json_flush.
 * Thread safety: none needed; a reader or writer belongs to one thread.
 */
#ifndef GP_JSON_H
#define GP_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define GP_JSON_MAX_DEPTH 64

typedef enum gp_json_kind {
    GP_JSON_NONE = 0, /* no value: end of input, or a byte that starts none */
    GP_JSON_NULL,
    GP_JSON_FALSE,
    GP_JSON_TRUE,
    GP_JSON_NUMBER,
    GP_JSON_STRING,
    GP_JSON_ARRAY,
    GP_JSON_OBJECT
} gp_json_kind;

/* ---- the pull reader ------------------------------------------------------ */

typedef struct gp_json_reader {
    const char *text;   /* len bytes, not owned; need not end in NUL */
    size_t len;
    size_t pos;         /* the next byte to read */
    int depth;          /* containers entered and not yet left */
    bool first;         /* just inside a container: no ',' before its next item */
    bool oom;           /* an allocation failed (err says so too) */
    size_t err_at;      /* byte offset of the first error */
    char err[160];      /* the first error; "" while there is none */
} gp_json_reader;

void gp_json_reader_init(gp_json_reader *r, const char *text, size_t len);
/* Skip whitespace; the kind of the value that starts there, judged by its
 * first byte (reading it checks the rest).  NONE after an error. */
gp_json_kind gp_json_peek(gp_json_reader *r);
/* '{' or '['; fails (err set) if something else comes or nesting would
 * pass GP_JSON_MAX_DEPTH. */
bool gp_json_enter_object(gp_json_reader *r);
bool gp_json_enter_array(gp_json_reader *r);
/* The next member of the object entered last: true with *key (malloc'd)
 * and the ':' read, the value next to read; false at its '}' (consumed)
 * or on an error (r->err[0] tells which; *key is NULL). */
bool gp_json_next_member(gp_json_reader *r, char **key);
/* The next item of the array entered last: true if one follows (read it
 * next); false at its ']' (consumed) or on an error. */
bool gp_json_next_item(gp_json_reader *r);
/* A string, decoded into a malloc'd NUL-terminated copy. */
bool gp_json_read_string(gp_json_reader *r, char **out);
/* Any JSON number as the nearest double; one beyond a double's range fails. */
bool gp_json_read_number(gp_json_reader *r, double *out);
/* A non-negative integer without fraction or exponent, exact to 2^64 - 1. */
bool gp_json_read_uint(gp_json_reader *r, uint64_t *out);
bool gp_json_read_bool(gp_json_reader *r, bool *out);
bool gp_json_read_null(gp_json_reader *r);
/* Only whitespace is left (and no error happened). */
bool gp_json_at_end(gp_json_reader *r);
/* Record the caller's own error at the next non-blank byte, unless an
 * error is already recorded; returns false for `return gp_json_fail(...)`. */
bool gp_json_fail(gp_json_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1-based line and column of byte `offset` (the error's: r->err_at). */
void gp_json_where(const gp_json_reader *r, size_t offset, int *line, int *column);

/* ---- the tree --------------------------------------------------------------- */

typedef struct gp_json_value {
    gp_json_kind kind;          /* never NONE in a tree */
    size_t offset;              /* byte where the value starts, for messages */
    double num;                 /* NUMBER */
    char *str;                  /* STRING (owned) */
    char **keys;                /* OBJECT: keys[i] names items[i] (owned) */
    struct gp_json_value *items;/* ARRAY, OBJECT: n values in document order (owned) */
    int n;
} gp_json_value;

/* One value of any kind from where the reader is, as a tree; NULL on an
 * error (r->err says which). */
gp_json_value *gp_json_read_value(gp_json_reader *r);
/* A whole document: one value and nothing after it but whitespace.  The
 * reader is initialised here and holds the error when NULL is returned. */
gp_json_value *gp_json_parse(const char *text, size_t len, gp_json_reader *r);
void gp_json_value_free(gp_json_value *v);
/* The value of the last member named `key` (a key given twice is taken
 * as Python's json and serde_json take it, issue 77); NULL if there is
 * none or o is not an object. */
const gp_json_value *gp_json_get(const gp_json_value *o, const char *key);

/* ---- the writer ------------------------------------------------------------- */

typedef struct gp_json_writer {
    char *text;         /* len bytes written so far, NUL-terminated (owned;
                           NULL before the first byte) */
    size_t len, cap;
    int pretty;         /* in containers nested at most this deep, members of
                           objects and items of arrays of containers go on
                           lines of their own, indented by two spaces a
                           level; 0 = all on one line.  Set before writing. */
    bool oom;           /* an allocation failed: text is incomplete */
    int depth;          /* containers open */
    bool comma;         /* the open container has an item: the next needs ',' */
    bool array[GP_JSON_MAX_DEPTH]; /* [d]: container d + 1 is an array */
    bool lines[GP_JSON_MAX_DEPTH]; /* [d]: its items go on lines of their own */
} gp_json_writer;

/* Each value takes `key`: its member name inside an object, NULL inside an
 * array or at the top level. */
void gp_json_open_object(gp_json_writer *w, const char *key);
void gp_json_open_array(gp_json_writer *w, const char *key);
void gp_json_close(gp_json_writer *w); /* the container opened last */
void gp_json_put_str(gp_json_writer *w, const char *key, const char *s); /* NULL: null */
/* Shortest decimal that reads back to v; NaN and infinities as null. */
void gp_json_put_num(gp_json_writer *w, const char *key, double v);
/* A float (FP32) value as the shortest decimal that reads back as that
 * float (1e-05, not 9.9999997e-06: what a config said), and a whole one
 * with its ".0" (8.0, not 8: Hugging Face checks some fields are floats). */
void gp_json_put_float(gp_json_writer *w, const char *key, double v);
/* v with `decimals` digits after the point (measured times); non-finite: null. */
void gp_json_put_fixed(gp_json_writer *w, const char *key, double v, int decimals);
void gp_json_put_int(gp_json_writer *w, const char *key, int64_t v);
void gp_json_put_uint(gp_json_writer *w, const char *key, uint64_t v);
void gp_json_put_bool(gp_json_writer *w, const char *key, bool v);
void gp_json_put_null(gp_json_writer *w, const char *key);
/* Bytes as they are, outside the bookkeeping: a record's "\n", padding. */
void gp_json_put_raw(gp_json_writer *w, const char *text);
/* Write the text so far to f and empty the buffer (the nesting goes on,
 * so a long document can be written in pieces).  False if f reports an
 * error or an allocation failed (then nothing is written, and the writer
 * stays failed: its text lost a piece). */
bool gp_json_flush(gp_json_writer *w, FILE *f);
void gp_json_writer_free(gp_json_writer *w);

#endif /* GP_JSON_H */
