/*
 * core.h — the bottom of gpipe: status codes and error messages, logging,
 * the clock, tensor shapes and views, the counter-based RNG, and per-device
 * memory accounting.
 *
 * Place in the design (modules, lowest first: core < backend < layers <
 * checkpoint < optim < pipeline < balance < trace < config < train;
 * scripts/check-includes.sh fails the tests on an include up that order).
 * core owns: gp_status messages (per thread), logging, gp_now, the checks
 * of output paths before a run writes them, the Philox RNG, the
 * gp_allocator counters (accounting only: core never allocates device
 * memory), and gp_tensor / gp_shape as descriptions: shapes, sizes,
 * slices and reshapes.  It may call only the C library, pthreads and the
 * public header include/gpipe.h.  It knows nothing of devices (a tensor's
 * `dev` is an opaque pointer to it), layers or the pipeline; whatever
 * allocates, fills or copies a tensor's memory belongs to backend.
 *
 * Errors: a function a user can make fail returns gp_status and, before it
 * does, records a message with gp_error_set().  The message lives in a
 * per-thread buffer (like errno) so that every call site does not have to
 * thread an error object through; a worker thread that fails copies its
 * message out with gp_error_message() before handing the status to the
 * caller.  Bugs (broken invariants) use GP_ASSERT, which aborts.
 *
 * Memory: every byte a device holds is reserved here with a category
 * (gp_allocator_reserve, called by backend's gp_dev_alloc), so
 * current/peak/capacity are always the truth (see gp_allocator).
 *
 * Thread safety: gp_allocator functions are thread-safe (one mutex each);
 * a gp_tensor is owned by one thread at a time; the RNG is a pure function.
 */
#ifndef GP_CORE_H
#define GP_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>

#include "gpipe.h"

/* ------------------------------------------------------------------------ */
/* errors                                                                    */

/* Record `code` with a printf-style message for this thread; returns code so
 * callers can write `return gp_error_set(GP_ERR_INVALID, "...")`. */
gp_status gp_error_set(gp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* pthread_create's error e as words, and where an address-space limit
 * (`ulimit -v`) is set and e is EAGAIN or ENOMEM (a thread's stack is
 * mapped whole), that limit and what to do: into buf, returned. */
const char *gp_thread_error(int e, char *buf, size_t len);
/* Prefix the current message with more context ("layer 3 (conv2d): ..."). */
gp_status gp_error_wrap(gp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
const char *gp_error_message(void); /* this thread's last message, never NULL */
/* How messages name what a run was given: by default the library's names
 * (an override, gp_train_options' fields), and gpipe-train's and
 * gpipe-balance's flags (--set, --resume, ...) once a tool has called
 * gp_names_use_flags(), before anything else.  Process-wide. */
typedef enum gp_opt {
    GP_OPT_SET,           /* "--set" / "override" */
    GP_OPT_RESUME,        /* "--resume" / "gp_train_options.resume" */
    GP_OPT_RESUME_LATEST, /* "--resume latest" / its "latest" */
    GP_OPT_METRICS,
    GP_OPT_TRACE,
    GP_OPT_TRACE_STEPS,
    GP_OPT_EXPORT,
    GP_OPT_INIT_FROM,     /* "model.init_from" (gpipe-sample: "--weights") */
    GP_OPT_COUNT
} gp_opt;
void gp_names_use_flags(void);
/* A tool's own name for o (static storage), process-wide, before anything
 * else: gpipe-sample's --weights is model.init_from underneath. */
void gp_opt_rename(gp_opt o, const char *name);
const char *gp_opt_name(gp_opt o);
/* The option given a value, as its caller would write it: --resume DIR,
 * --set 'k={a: 1}' (quoted for a shell where needed); for the library
 * gp_train_options.resume = "DIR", override "k={a: 1}".  Into buf. */
const char *gp_opt_value(gp_opt o, const char *value, char *buf, size_t len);
/* s as one word of a POSIX shell's command line: as it is where nothing in
 * it is special, else in single quotes (a ' in it written '\''); into buf
 * (cut to fit: a command that long is not run from a message anyway). */
const char *gp_shell_word(const char *s, char *buf, size_t len);
/* At most `most` bytes of s[0..n) for a message that quotes a file's text:
 * control bytes (below 0x20, and 0x7f) written \xNN, so that a binary file's
 * error cannot drive the terminal; "..." after a cut.  Into buf. */
const char *gp_error_quote(const char *s, size_t n, size_t most, char *buf, size_t len);
/* Where a text cut at n bytes (s[0..n)) ends so that it ends between two
 * UTF-8 characters: n, or the start of the character the cut would leave
 * without some of its continuation bytes (a name or a path cut by a fixed
 * buffer, which a JSON writer or a terminal then reads).  Bytes that are
 * no UTF-8 anyway are left as they are. */
size_t gp_utf8_cut(const char *s, size_t n);
#define GP_ERRMSG_LEN 2048          /* its buffer, the terminating 0 included */
void gp_error_clear(void);
/* The exit status gpipe's tools give for s (the one map, which a failing
 * rank under mpirun uses too): 0 ok, 2 bad command line or config
 * (invalid, unsupported), 3 data or file (io, data), 4 anything during the
 * run (out of memory, NaN, backend error, ...). */
int gp_status_exit_code(gp_status s);

#define GP_ASSERT(cond)                                                       \
    do {                                                                      \
        if (!(cond)) gp_assert_fail(#cond, __FILE__, __LINE__, __func__);     \
    } while (0)
_Noreturn void gp_assert_fail(const char *expr, const char *file, int line,
                              const char *func);

/* Propagate a non-OK status. */
#define GP_TRY(expr)                                                          \
    do {                                                                      \
        gp_status gp_try_s_ = (expr);                                         \
        if (gp_try_s_ != GP_OK) return gp_try_s_;                             \
    } while (0)

/* ------------------------------------------------------------------------ */
/* logging                                                                   */

typedef enum {
    GP_LOG_DEBUG = 0,
    GP_LOG_INFO = 1,
    GP_LOG_WARN = 2,
    GP_LOG_ERROR = 3,
    GP_LOG_QUIET = 4
} gp_log_level;

/* The level is read from the environment variable GPIPE_LOG once
 * (debug|info|warn|error|quiet) unless set with gp_log_set_level. */
void gp_log_set_level(gp_log_level level);
/* Whether a message of this level is shown (for tools that print their
 * own notes: they follow GPIPE_LOG too). */
bool gp_log_enabled(gp_log_level level);
void gp_log(gp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define GP_DEBUG(...) gp_log(GP_LOG_DEBUG, __VA_ARGS__)
#define GP_INFO(...) gp_log(GP_LOG_INFO, __VA_ARGS__)
#define GP_WARN(...) gp_log(GP_LOG_WARN, __VA_ARGS__)

/* Monotonic clock in seconds. */
double gp_now(void);

/* ------------------------------------------------------------------------ */
/* output paths (paths.c)                                                    */

/* Checked before any work, so that a bad path fails in a second, not after
 * the run.  Each tries what its writer will do and removes whatever it
 * made, leaving nothing behind; a failure is GP_ERR_IO (GP_ERR_INVALID for
 * an empty or overlong path) with a message that starts with `what` (the
 * flag or config key that gave the path) and says what to do.
 *
 * A file at `path`: not a directory, and writable.  `replaced`: the writer
 * writes a temporary file beside it and renames it over (safetensors), so
 * its directory must take a new file and an existing path must be a
 * regular file; otherwise it is opened and written in place. */
gp_status gp_check_writable_file(const char *path, const char *what, bool replaced);
/* The longest output path, file or directory, the checks pass: what the
 * writers' buffers hold (gp_atomic_file's 1024 bytes) with room for the
 * names written inside a directory (a snapshot's, a staged Hugging Face
 * shard's).  A longer one passed the checks and failed, or was cut, when
 * written at the end of the run. */
#define GP_PATH_MAX_OUT 900
/* A directory that the writer makes if missing (mkdir -p) and creates
 * files in: an existing `dir` must be a directory that takes a new file; a
 * missing one must be possible to make (it is made, probed, and removed
 * again). */
gp_status gp_check_writable_dir(const char *dir, const char *what);
/* mkdir -p: dir and every missing parent (0755).  GP_ERR_IO naming `what`
 * and dir when it cannot be made. */
gp_status gp_make_dirs(const char *dir, const char *what);

/* A file written whole or not at all (snapshots, weight files, and
 * gpipe-balance's profile and config): gp_atomic_open creates a temporary
 * file beside `path` (".<name>.tmp.<pid>" in its directory), the caller
 * writes a->f, and gp_atomic_commit flushes and fsyncs it, renames it over
 * `path` and fsyncs the directory.  `err`: 0, or the errno the caller's own
 * writes failed with; then, or when the flush, fsync or rename fails, the
 * temporary file is removed and `path` is as it was.  gp_atomic_abort
 * removes it too (a caller that gives up before writing it all).  A
 * failure is GP_ERR_IO naming the file, the reason and what to do about
 * the ones a user can act on (a full disk or quota, a file-size limit,
 * too many open files, a read-only file system); a->err and errno hold the
 * cause. */
typedef struct gp_atomic_file {
    FILE *f;
    int err;                    /* errno of the failure, or 0 */
    char path[1024], tmp[1200], dir[1024];
} gp_atomic_file;
gp_status gp_atomic_open(const char *path, gp_atomic_file *a);
gp_status gp_atomic_commit(gp_atomic_file *a, int err);
void gp_atomic_abort(gp_atomic_file *a);
/* What to do about errno e when a file cannot be written, as a tail for a
 * message (": the disk or the quota is full; free space there, ..."): a
 * full disk, a file-size limit, too many open files, a read-only or
 * missing directory; "" for the rest. */
const char *gp_write_advice(int e, char *buf, size_t len);

/* open(path, O_RDONLY | O_CLOEXEC) for an input gpipe reads (a config,
 * dataset, image, weights, snapshot or profile): what is not a regular
 * file fails at once, -1 with errno EINVAL, instead of blocking the open (a
 * FIFO) or reading as nothing (a folder, a device).  gp_fopen_regular: the
 * same as a FILE opened "rb".  gp_open_strerror(e): strerror(e), or for
 * EINVAL what that means. */
int gp_open_regular(const char *path);
FILE *gp_fopen_regular(const char *path);
const char *gp_open_strerror(int e);
/* The regular file at path read whole (gp_open_regular) into *text, NUL
 * after its *len bytes (free it): 0; a file over max bytes: 1, nothing
 * read; it cannot be opened or read: -1, errno says why (ENOMEM: no host
 * memory).  For the small inputs read at once: configs, schedules,
 * config.json, profiles; each says its own error. */
int gp_read_regular(const char *path, size_t max, char **text, size_t *len);

/* An environment variable read as an option is (issue 77: =-5 was taken,
 * =20kB read as 20): unset or empty gives def; otherwise the whole value
 * must be a whole number in [lo, hi], or the error names the variable, its
 * value and the range.  gp_env_bytes also takes a unit as save_pretrained's
 * max_shard_size does: kB, MB, GB (powers of 1000) or KiB, MiB, GiB. */
gp_status gp_env_int(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out);
gp_status gp_env_bytes(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out);
/* Every GPIPE_* environment variable gpipe reads whose value is one of a
 * few words or a number, checked at once (every config load calls it):
 * the first that is set to something else is an error naming it, its
 * value and what it takes (issue 77: a misspelt value was taken as the
 * default, or as any other value, without a word). */
gp_status gp_env_check(void);
/* Whether the folder that holds `path` (its directory part, "." for a bare
 * name) is `dir`, the same folder on disk, whatever the spelling; false
 * when either does not exist. */
bool gp_path_in_dir(const char *path, const char *dir);
/* Whether `a` and `b` name the same file, whatever the spelling: the same
 * device and inode where both exist; where neither does, the same name in
 * the same (resolved) directory, so two outputs not yet written compare
 * too; false where only one exists. */
bool gp_same_file(const char *a, const char *b);
/* Whether `path` is an existing file that lies anywhere below folder `dir`
 * (or is `dir` itself, where that names a file), whatever the spelling
 * (links resolved): an output that would replace a file of a dataset's
 * folder. */
bool gp_path_below(const char *path, const char *dir);
/* Whether writing `out` (a file, or a folder of a Hugging Face export)
 * could replace what reading `in` (a file, or a folder gpipe reads, like a
 * Hugging Face model's) reads: the same file whatever the spelling (hard
 * links too: gp_same_file), or one inside the other where the inner one is
 * a member such a folder is made of (config.json, generation_config.json,
 * *.safetensors, *.index.json; inside an output folder, the names a
 * Hugging Face export writes or removes there).  Issue 77: `--out
 * D/model.safetensors` with `--weights D` replaced the input, as whole
 * paths were compared. */
bool gp_path_overlaps(const char *out, const char *in);
/* Whether the last part of `path` is a file a Hugging Face export writes
 * (config.json, generation_config.json, model.safetensors, its index or a
 * model-NNNNN-of-NNNNN.safetensors shard): what an export replaces or
 * removes in its folder, and nothing else. */
bool gp_hf_export_name(const char *path);

/* ------------------------------------------------------------------------ */
/* counter-based RNG: Philox4x32-10                                          */

/* Four 32-bit random words that depend only on (key, counter). */
typedef struct {
    uint32_t v[4];
} gp_philox_out;
gp_philox_out gp_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo);

/* Uniform float in [0, 1) for element `index` of stream (seed, stream).
 * Same (seed, stream, index) -> same value on any thread, any order. */
float gp_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Fill out[0..n) with uniforms for indices first..first+n. */
void gp_rng_uniform_fill(uint64_t seed, uint64_t stream, uint64_t first,
                         float *out, int64_t n);
/* Standard normal values (mean 0, variance 1) for indices first..first+n
 * of stream (seed, stream): value i is Box-Muller's cosine branch of the
 * two 32-bit words of lane pair (i & 1) of the Philox block at counter
 * (stream, i >> 1), in double, so any sub-range equals the same range of
 * the whole.  |value| < 6.7 (the smallest uniform is 2^-32).  Host only. */
double gp_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
void gp_rng_normal_fill(uint64_t seed, uint64_t stream, uint64_t first, float *out, int64_t n);
/* Mix several 64-bit words into one stream id (splitmix64-based). */
uint64_t gp_rng_stream(uint64_t a, uint64_t b, uint64_t c);

/* ------------------------------------------------------------------------ */
/* memory accounting                                                         */

typedef enum {
    GP_MEM_PARAMS = 0,
    GP_MEM_GRADS,
    GP_MEM_OPTIMIZER,
    GP_MEM_ACTIVATIONS, /* activations and stashed stage inputs */
    GP_MEM_COPIES,      /* buffers received from another device */
    GP_MEM_WORKSPACE,   /* scratch of backends and layers */
    GP_MEM_COUNT
} gp_mem_category;

const char *gp_mem_category_name(gp_mem_category c);

/* Accounting only: the backend does the allocation and reports the sizes.
 * Guarded by `lock`; safe to call from any thread. */
typedef struct gp_allocator {
    char device[32];     /* "cpu:0", for messages */
    size_t capacity;     /* 0 = unlimited */
    size_t current;      /* bytes in use now */
    size_t peak;         /* high-water mark of current since last reset */
    size_t cur_by[GP_MEM_COUNT];
    size_t peak_by[GP_MEM_COUNT];
    int64_t live_blocks; /* outstanding allocations (leak check) */
    pthread_mutex_t lock;
} gp_allocator;

void gp_allocator_init(gp_allocator *a, const char *device, size_t capacity);
void gp_allocator_destroy(gp_allocator *a);
/* Reserve `bytes` in category `cat`; fails with GP_ERR_OOM and a message
 * naming the device, the request, the bytes in use and the capacity.  The
 * peaks take it at gp_allocator_commit, once the memory is there: a
 * reservation released because the backend could not allocate (a search's
 * workspace halved and tried again) was counted in the peaks, up to GiBs
 * that were never held. */
gp_status gp_allocator_reserve(gp_allocator *a, size_t bytes,
                               gp_mem_category cat);
void gp_allocator_commit(gp_allocator *a, gp_mem_category cat);
void gp_allocator_release(gp_allocator *a, size_t bytes, gp_mem_category cat);
/* Bytes in use now. */
size_t gp_allocator_current(gp_allocator *a);
/* Peaks start again from the current values (e.g. at the start of a step). */
void gp_allocator_reset_peak(gp_allocator *a);
/* A consistent copy of the counters. */
void gp_allocator_snapshot(gp_allocator *a, gp_allocator *out);

/* Parse "512MiB", "1.5GB", "4096" (bytes); K/M/G with or without iB.
 * Returns false if malformed. */
bool gp_parse_bytes(const char *s, size_t *out);
/* "12.3 MiB" into buf. */
const char *gp_format_bytes(size_t bytes, char *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* tensors                                                                   */

struct gp_device;

#define GP_MAX_DIMS 4

/* The element type of a tensor's values.  FP32 is 0, so a tensor made by
 * zeroing a struct holds floats, as every tensor did before bf16 storage. */
typedef enum gp_dtype {
    GP_F32 = 0, /* IEEE binary32 */
    GP_BF16,    /* bfloat16: the high half of a binary32, 16-bit patterns
                   (gp_ew_bf16_bits / gp_ew_bf16_value round and widen) */
    GP_DTYPE_COUNT
} gp_dtype;
/* Bytes one value takes: 4, 2. */
size_t gp_dtype_size(gp_dtype d);
/* "fp32", "bf16" (the names --dry-run and messages use). */
const char *gp_dtype_name(gp_dtype d);

/* A tensor's storage: `dtype` values in device memory.  The type is never
 * completed, so the compiler refuses to read it as floats (or anything
 * else) directly: code reads a tensor through gp_f32 or gp_bf16, which
 * check the element type, and moves its bytes through gp_tensor_mem. */
typedef struct gp_mem gp_mem;

/* A dense tensor, row-major, logical layout NCHW for 4-D, (N, F) for 2-D,
 * of one element type.  `mem` is device memory of `dev`, gp_tensor_bytes
 * long.  A tensor either owns its memory (owned == true: allocated through
 * the device's allocator, freed by gp_tensor_free) or is a view into
 * another tensor's memory.  Core only describes tensors and makes views;
 * allocating, zeroing, freeing and copying need the device and live in
 * backend/backend.h (backend/tensor.c). */
typedef struct gp_tensor {
    gp_mem *mem;
    gp_dtype dtype;
    int ndim;
    int64_t dims[GP_MAX_DIMS];
    struct gp_device *dev;
    gp_mem_category cat; /* accounting category when owned */
    bool owned;
} gp_tensor;

/* The values of a tensor of floats (NULL for an empty one).  Asserts the
 * element type: a bf16 tensor read as floats stops at the call, not at a
 * wrong result. */
static inline float *gp_f32(const gp_tensor *t)
{
    GP_ASSERT(t->dtype == GP_F32);
    return (float *)(void *)t->mem;
}
/* The 16-bit patterns of a bf16 tensor (NULL for an empty one); asserts
 * the element type. */
static inline uint16_t *gp_bf16(const gp_tensor *t)
{
    GP_ASSERT(t->dtype == GP_BF16);
    return (uint16_t *)(void *)t->mem;
}
/* A tensor's storage as bytes, whatever its element type: for what moves,
 * frees or compares memory without reading values. */
static inline void *gp_tensor_mem(const gp_tensor *t) { return t->mem; }

/* Shapes without storage, for shape inference. */
typedef struct gp_shape {
    int ndim;
    int64_t dims[GP_MAX_DIMS];
} gp_shape;

gp_shape gp_shape_make(int ndim, const int64_t *dims);
gp_shape gp_shape_2d(int64_t n, int64_t f);
gp_shape gp_shape_4d(int64_t n, int64_t c, int64_t h, int64_t w);
int64_t gp_shape_numel(const gp_shape *s);
/* gp_shape_numel, or -1 when the product exceeds `most` (computed without
 * overflow, whatever the dims): what checks a shape a config asked for. */
int64_t gp_shape_numel_within(const gp_shape *s, int64_t most);
/* The most values gpipe takes in one sample's tensor or one parameter
 * (2^38: 1 TiB in FP32), so that a batch (at most 2^24 samples) of them
 * still counts in 64 bits. */
#define GP_MAX_NUMEL ((int64_t)1 << 38)
bool gp_shape_equal(const gp_shape *a, const gp_shape *b);
/* Same shape with dims[0] (the batch) replaced. */
gp_shape gp_shape_with_batch(const gp_shape *s, int64_t n);
/* "(128, 64, 28, 28)" into buf. */
const char *gp_shape_str(const gp_shape *s, char *buf, size_t len);
/* Element `flat` of dims [from, ndim) of s as an index, "(i, j, k)", into
 * buf, with add0 added to its first coordinate (a row offset); messages
 * that say where a bad value is. */
const char *gp_shape_index_str(const gp_shape *s, int from, int64_t flat, int64_t add0,
                               char *buf, size_t len);

gp_shape gp_tensor_shape(const gp_tensor *t);
int64_t gp_tensor_numel(const gp_tensor *t);
/* numel times the element type's size. */
size_t gp_tensor_bytes(const gp_tensor *t);
/* What an owned tensor's allocation takes: gp_tensor_bytes rounded up to
 * whole 4-byte words, so that every transport (device copies, channels,
 * MPI messages), which moves floats, moves a bf16 tensor of an odd count
 * too.  The allocator zeroes the half word an odd bf16 count leaves, so
 * the bytes that travel are the same every run. */
size_t gp_tensor_storage_bytes(const gp_tensor *t);
/* gp_tensor_storage_bytes in 4-byte words: the count a transport moves. */
int64_t gp_tensor_words(const gp_tensor *t);
/* A non-owning view of rows [first, first+count) along dims[0]. */
gp_tensor gp_tensor_slice(const gp_tensor *t, int64_t first, int64_t count);
/* A non-owning view with another shape of the same element count. */
gp_tensor gp_tensor_reshape(const gp_tensor *t, const gp_shape *shape);

/* ------------------------------------------------------------------------ */
/* gates                                                                     */

/* A gate one thread closes and another opens, and others wait at: a
 * snapshot's copy of the model's state, made in the background while the
 * next step's forward and backward run, closes the model's gate until it
 * has read every tensor; whatever writes that state (the update, batch
 * norm's commit, a load, freeing the model) waits for it to open.  Opening
 * signals under the mutex, so a waiter may destroy the gate as soon as its
 * wait returns.  gp_gate_new returns NULL when out of memory. */
typedef struct gp_gate gp_gate;
gp_gate *gp_gate_new(void);
void gp_gate_free(gp_gate *g); /* (after waiting for it to open) */
void gp_gate_close(gp_gate *g);
void gp_gate_open(gp_gate *g);
/* Until g is open (NULL: at once); whether it was closed on arrival. */
bool gp_gate_wait(gp_gate *g);

#endif /* GP_CORE_H */
