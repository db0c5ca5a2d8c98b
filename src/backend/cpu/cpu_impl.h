/*
 * cpu_impl.h — shared inside the CPU backend (the .c files of backend/cpu):
 * the device context, the primitive cache and the oneDNN check macro.
 *
 * Context ownership: gp_cpu_ctx belongs to its gp_device and is driven by
 * the device's one worker thread at a time (backend.h), so the cache and the
 * workspace arena need no lock.  Every byte the backend keeps (the arena) is
 * allocated through gp_dev_alloc with category GP_MEM_WORKSPACE.
 *
 * Primitive cache.  Each oneDNN operation (convolution, log-softmax) is
 * built once per shape into a cpu_op: the primitive, the reorders between the interface's plain NCHW layout and whatever layout the
 * primitive prefers, memory objects without buffers (their handles are set
 * on every call) and the sizes of the temporaries it needs.  Temporaries and
 * scratchpads live in one per-device arena, reused by every op: ops run one
 * after another on the device's thread, so they never overlap.
 */
#ifndef GP_CPU_IMPL_H
#define GP_CPU_IMPL_H

/* GP_CPU_LOOPS before a function with gpipe's own loops (batch norm,
 * pooling, the elementwise ops, the update): GCC builds it for AVX-512
 * (x86-64-v4), AVX2 (x86-64-v3) and the x86-64 baseline, and the processor
 * picks one when the library loads (target_clones; the OpenMP regions
 * inside are cloned with it), where the rest of the library is built for
 * the baseline.  No contraction into fused multiply-adds anywhere
 * (-ffp-contract=off), so an elementwise result is the same bits in every
 * version; reductions keep it by fixing their order (batch norm's lanes,
 * cpu_bn.c).  GP_ISA_CLONES (CMake's GPIPE_ISA_CLONES): 4, 3 (AVX2 and the
 * baseline: an AVX2-only processor's loops, on any processor) or 0. */
#if defined(GP_ISA_CLONES) && GP_ISA_CLONES == 4
#define GP_CPU_LOOPS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(GP_ISA_CLONES) && GP_ISA_CLONES == 3
#define GP_CPU_LOOPS __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define GP_CPU_LOOPS
#endif


/*
 * GP_CPU_TEAM(nt, cond): opens an OpenMP team of nt threads (one thread
 * where cond is false) for the next statement, whose loops are orphaned
 * `#pragma omp for schedule(static)` in always_inline helpers.  Why not the
 * helper's own `parallel for`: GCC outlines a parallel region into a
 * function of its own before it makes GP_CPU_LOOPS's clones, so a region
 * written in a static helper became a baseline-only function (SSE2) that
 * every clone called: layer and RMS norms, RoPE, embeddings, bias sums,
 * dropout and upsampling ran without AVX2 or AVX-512 (issue 76).  Opened
 * in the GP_CPU_LOOPS function itself, the region is outlined from each
 * clone and built for its instruction set.  The iterations go to the
 * threads as before (static schedule), so the bits are those of before.
 */
#define GP_CPU_PRAGMA(x) _Pragma(#x)
#define GP_CPU_TEAM(nt, cond) GP_CPU_PRAGMA(omp parallel num_threads(nt) if (cond))

#include "backend/backend.h"

#include "backend/elementwise.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

/* exp(x) for x <= 88 (attention's scores minus their row's maximum or
 * log-sum-exp are <= 0; larger x read as 88); 0 below -87.3 (e^-87.3 is about FP32's
 * smallest normal); NaN gives NaN.  n = round(x / ln 2) by the 1.5 2^23
 * trick and plain selects, no library call or branch, so a loop over it
 * vectorises.  Within 1.2e-7 relative of exp over [-87.3, 0.5].  Its users:
 * cpu_attention.c, and SwiGLU's sigmoid (cpu_math.c), where the C
 * library's expf, a call per value, took 17% of a Llama step. */
static inline __attribute__((always_inline)) float gp_cpu_exp(float x)
{
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    xc = x != x ? 0.0f : xc; /* NaN: no undefined conversion below */
    float n = fmaf(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) * 8388608}; /* 2^n: n in the exponent field */
    float y = p * two_n.f;
    y = x < -87.3f ? 0.0f : y;
    return x != x ? x : y;
}

/* exp(x) in double for x <= 709 (larger x read as 709), 0 below -708 (about
 * double's smallest normal), NaN gives NaN; -inf gives 0.  As gp_cpu_exp:
 * n = round(x / ln 2) by the 1.5 2^52 trick, r = x - n ln 2 in two fmas
 * (fdlibm's ln 2 halves), e^r by its Taylor polynomial to r^13 (|r| <=
 * ln2 / 2: the next term is under 4e-18), and 2^n put in the exponent
 * field from t's low bits, where the trick leaves n: no call, no branch,
 * so a loop over it vectorises (4 lanes in AVX2, 8 in AVX-512; fma makes
 * every clone's bits the same, which test_qemu's baseline processor
 * relies on).  The baseline clone's fma() is the C library's, in software
 * on a processor without FMA: 24 ns an exponential there, about libm's
 * exp, where multiplies and adds would take 4; but those take 1.7x fma's
 * time on AVX-512 and 1.6x on AVX2 (2026-12-01, the Xeon of bench/README),
 * the processors people train on, so fma stays.  Within 2 ulp of the C library's exp
 * (test_backend).  Its user: the cross-entropy's softmax, which called
 * libm's exp for every logit, twice a step (cpu_math.c). */
static inline __attribute__((always_inline)) double gp_cpu_exp_d(double x)
{
    double xc = x < -708.0 ? -708.0 : x;
    xc = xc > 709.0 ? 709.0 : xc;
    xc = x != x ? 0.0 : xc; /* NaN: the lanes stay defined */
    double t = fma(xc, 1.4426950408889634, 6755399441055744.0); /* 1.5 2^52 + n */
    double n = t - 6755399441055744.0;
    double r = fma(n, -6.93147180369123816490e-01, xc);
    r = fma(n, -1.90821492927058770002e-10, r);
    double p = 1.0 / 6227020800.0; /* 1 / 13! */
    p = fma(p, r, 1.0 / 479001600.0);
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    union {
        double d;
        uint64_t u;
    } two_n = {.d = t};
    two_n.u = (two_n.u + 1023u) << 52; /* t's low bits hold n: 2^n's exponent field */
    double y = p * two_n.d;
    y = x < -708.0 ? 0.0 : y;
    return x != x ? x : y;
}

/* One body for both storage types (dropout, dropout2d's rows, layer norm,
 * instance norm's backward, upsampling):
 * b16, a constant where the body is inlined, says whether the activations
 * are bf16 patterns, widened on load (B16_LD) and rounded once on store
 * (B16_ST). The bf16 slots so do the FP32 slots' arithmetic on the widened
 * values: the storage adapter's bits without its passes. */
#define B16_LD(p, i) (b16 ? gp_ew_bf16_value(((const uint16_t *)(p))[i]) : ((const float *)(p))[i])
#define B16_ST(p, i, v)                                                                      \
    do {                                                                                     \
        if (b16) ((uint16_t *)(p))[i] = gp_ew_bf16_bits(v);                                  \
        else ((float *)(p))[i] = (v);                                                        \
    } while (0)

/* ---- bf16 tiles ------------------------------------------------------------
 * A serial run of bf16 values widened into an FP32 tile, and a tile rounded
 * back once: the bf16 slots that run the FP32 bodies on tiles (batch norm,
 * pooling, cross-entropy). Inlined into each caller's ISA clone; called
 * inside the caller's parallel region (gp_cpu_bf16_pack and unpack open
 * their own). */
static inline __attribute__((always_inline)) void gp_cpu_widen_run(float *dst, const uint16_t *src,
                                                                   int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = gp_ew_bf16_value(src[i]);
}

static inline __attribute__((always_inline)) void gp_cpu_round_run(uint16_t *dst, const float *src,
                                                                   int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = gp_ew_bf16_bits(src[i]);
}

/* ---- oneDNN checks ------------------------------------------------------ */

/* Record a failed oneDNN call as GP_ERR_RUNTIME; returns GP_ERR_RUNTIME. */
gp_status gp_cpu_dnnl_error(dnnl_status_t s, const char *call,
                            const char *func, const char *file, int line);

/* Check a oneDNN call; on failure record the call text, function, file and
 * line, set the local `st` and jump to the local label `fail`. */
#define GP_DNNL(call)                                                         \
    do {                                                                      \
        dnnl_status_t gp_dnnl_s_ = (call);                                    \
        if (gp_dnnl_s_ != dnnl_success) {                                     \
            st = gp_cpu_dnnl_error(gp_dnnl_s_, #call, __func__, __FILE__,     \
                                   __LINE__);                                 \
            goto fail;                                                        \
        }                                                                     \
    } while (0)

/* The same for functions without cleanup: return the status. */
#define GP_DNNL_RET(call)                                                     \
    do {                                                                      \
        dnnl_status_t gp_dnnl_s_ = (call);                                    \
        if (gp_dnnl_s_ != dnnl_success)                                       \
            return gp_cpu_dnnl_error(gp_dnnl_s_, #call, __func__, __FILE__,   \
                                     __LINE__);                               \
    } while (0)

/* ---- cached operations ---------------------------------------------------- */

typedef enum {
    CPU_OP_CONV_FWD = 1,
    CPU_OP_CONV_BWD_DATA,
    CPU_OP_CONV_BWD_WEIGHTS,
    CPU_OP_LOG_SOFTMAX,
    CPU_OP_MATMUL_BF16
} cpu_op_kind;

#define CPU_KEY_LEN 16
typedef struct cpu_key {
    int64_t v[CPU_KEY_LEN]; /* v[0] = cpu_op_kind, then descriptor fields */
} cpu_key;

/* How an argument's user buffer relates to the primitive's buffer. */
typedef enum {
    CPU_ARG_IN = 0,   /* read: reorder user -> inner before the primitive */
    CPU_ARG_OUT,      /* overwritten: reorder inner -> user after */
    CPU_ARG_ACCUM     /* accumulated: inner is a temporary, user += inner */
} cpu_arg_dir;

#define CPU_MAX_ARGS 10
typedef struct cpu_arg {
    int arg;                  /* DNNL_ARG_* of the main primitive */
    int slot;                 /* index into the call's pointer array */
    cpu_arg_dir dir;
    dnnl_memory_t user;       /* user layout, handle set per call */
    dnnl_memory_t inner;      /* primitive layout; == user if no reorder */
    dnnl_primitive_t reorder; /* NULL if user and inner are the same */
    size_t off;               /* arena offset of inner when reordered */
} cpu_arg;

#define CPU_WKEEP_SLOTS 16 /* weight tensors of one shape kept per op */

typedef struct cpu_op {
    cpu_key key;
    struct cpu_op *next;      /* hash chain */
    dnnl_primitive_desc_t pd; /* kept as the hint for backward ops */
    dnnl_primitive_t prim;
    cpu_arg args[CPU_MAX_ARGS];
    int nargs;
    dnnl_memory_t scratch;    /* scratchpad of prim and reorders (at 0) */
    size_t scratch_bytes;
    size_t arena_need;        /* bytes of arena the op uses */
    /* Weights kept converted while the device's weights are frozen
     * (gp_dev_freeze_weights): the reorder of a micro-batch's weights runs
     * once per step instead of once per call.  GP_MEM_WORKSPACE, freed on
     * the thaw. */
    struct cpu_wkeep {
        void *buf;            /* the converted copy (op's inner layout) */
        size_t bytes;
        const void *src;      /* the user tensor it converts */
        uint64_t epoch;       /* dev->weights_epoch when converted */
    } wkeep[CPU_WKEEP_SLOTS]; /* one per weight tensor of this shape: the
                                 layers that share the op (an mlp's 2048 x
                                 2048 linears) each keep theirs */
    bool cast_w;              /* its WEIGHTS argument's inner memory is the
                                 user's cast to bf16 in the same element
                                 order: the weight tensor's bf16 mirror
                                 (gp_wmirror) serves it */
    bool no_keep;             /* its WEIGHTS argument is not always a layer's
                                 weights (a gemm's B): never kept */
} cpu_op;

#define CPU_CACHE_BUCKETS 128

/* gp_cpu_ctx.act_blk for channels-last (the block is each side's channels). */
#define CPU_ACT_NHWC (-1)

/* F(B, P) for a blocked loop over layout P (gp_blk_valid, not plain): B
 * channels at a time (gp_blk_unit) with pixels P apart, both constants
 * for nChw16c and nChw8c, so that an always_inline body F calls is
 * specialised for them (batch norm's and pooling's blocked loops). */
#define CPU_BLK_CALL(P, F)                                                                    \
    do {                                                                                      \
        if ((P) == 16) F(16, 16);                                                             \
        else if ((P) == 8) F(8, 8);                                                           \
        else if (gp_blk_unit(P) == 16) F(16, (P));                                            \
        else F(8, (P));                                                                       \
    } while (0)

/* Conv layout policy (see cpu_dnnl.c): auto chooses per shape. */
typedef enum { CPU_CONV_AUTO = 0, CPU_CONV_PLAIN, CPU_CONV_BLOCKED } cpu_conv_layout;

/* Freed blocks of one size, kept for reuse (see cpu_alloc). */
typedef struct cpu_bin {
    size_t bytes;
    void **free;              /* stack of free blocks */
    int n, cap;
} cpu_bin;

typedef struct gp_cpu_ctx {
    /* Block cache: training allocates the same sizes every step, so freed
     * blocks are kept per size and handed out again instead of going back
     * to malloc (which maps and unmaps large blocks, paying page faults and
     * zeroing each step).  Cached blocks are not "in use" in the allocator's
     * accounting; they are released when the device closes.  Guarded by
     * bins_lock (the main thread and the device's worker both allocate). */
    pthread_mutex_t bins_lock;
    cpu_bin *bins;
    int n_bins, cap_bins;
    size_t cached_bytes;
    size_t block_shift;       /* where a weight block (GP_MEM_PARAMS) of
                                 CPU_SHIFT_MIN bytes or more starts past a
                                 64-byte boundary (cpu_device.c, cpu_alloc):
                                 16 where CPU devices compute in AVX2, else 0 */
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    cpu_op *buckets[CPU_CACHE_BUCKETS];
    int64_t prims_created;    /* oneDNN primitives created (incl. reorders) */
    size_t fake_search;       /* GPIPE_CPU_FAKE_SEARCH (bytes): the first call of a
                                 convolution shape and direction borrows this much
                                 workspace and counts an algorithm search, as a
                                 GPU's measured cuDNN choice does (tests) */
    void *arena;              /* GP_MEM_WORKSPACE, 64-byte aligned (oneDNN's
                                 scratchpads are carved from it) */
    size_t arena_bytes;
    cpu_conv_layout conv_layout;
    bool keep_weights;        /* keep reordered weights while frozen;
                                 GPIPE_CPU_KEEP_WEIGHTS=0 turns it off */
    int64_t act_blk;          /* the channel block act_block may say:
                                 gp_cpu_isa_block(), or 0 with
                                 GPIPE_CPU_KEEP_BLOCKS=0 (under bf16 too
                                 since bf16 storage: the blocked bf16
                                 activations need no reorder at all), or
                                 CPU_ACT_NHWC with GPIPE_CPU_KEEP_BLOCKS=nhwc
                                 (channels-last, a GPU's layout) */
    /* Weight gradients held in the primitives' layout while frozen, one per
     * gradient tensor, in the order first held (cpu_dnnl.c, "Held
     * gradients"). */
    struct cpu_held *held;
    int n_held, cap_held;
    /* GPIPE_CPU_STREAMS=threads (cpu_streams.c): the copy stream is a queue
     * run by copy_thread, events are real.  copy_stop is guarded by
     * cpu_streams.c's lock. */
    bool streams;
    long copy_delay_us;       /* GPIPE_CPU_COPY_DELAY_US */
    /* precision bf16 (backend.h): convolutions take bf16 operands (their
     * inputs converted by the reorders into oneDNN's layouts) and give FP32 */
    bool bf16;
    bool copy_running, copy_stop;
    pthread_t copy_thread;
    /* A channel transfer's first failure (cpu_streams.c's lock), which
     * synchronize reports. */
    gp_status chan_failed;
    char chan_why[320];
    /* Device-time markers since the last mark_reset (cpu_streams.c),
     * newest first; taken on the device's worker, read between steps. */
    struct cpu_mark *marks;
    /* The missing-wait checker (cpu_streams.c, "Allocation epochs"), under
     * cpu_streams.c's lock: epoch counts the events recorded on the compute
     * stream; blocks[n_blocks] are the live blocks from cpu_alloc, sorted by
     * address, each with the epoch of its allocation. */
    uint64_t epoch;
    struct cpu_block *blocks;
    int n_blocks, cap_blocks;
} gp_cpu_ctx;

static inline gp_cpu_ctx *gp_cpu_ctx_of(gp_device *dev) { return (gp_cpu_ctx *)dev->ctx; }

/* ---- streams (cpu_streams.c) --------------------------------------------- */

typedef struct cpu_event cpu_event;
/* Whether GPIPE_CPU_STREAMS asks for the threads mode; *delay_us from
 * GPIPE_CPU_COPY_DELAY_US (0 if unset; a bad value is warned and 0). */
bool gp_cpu_streams_from_env(long *delay_us);
gp_status gp_cpu_streams_start(gp_device *dev);
/* Runs what is queued, then ends the thread. */
void gp_cpu_streams_stop(gp_device *dev);
/* Returns once no unfinished copy reads or writes [ptr, ptr + bytes), and
 * forgets the block's allocation epoch. */
void gp_cpu_streams_before_free(gp_device *dev, const void *ptr, size_t bytes);
/* A block of cpu_alloc's (fresh or from its cache) stamped with the device's
 * epoch now, for the checker (no-op unless GPIPE_CPU_STREAMS=threads). */
void gp_cpu_streams_allocated(gp_device *dev, const void *ptr, size_t bytes);
gp_status gp_cpu_synchronize(gp_device *dev);
gp_status gp_cpu_copy_async(gp_device *dev, void *dst, gp_device *src_dev, const void *src,
                            size_t bytes, void *after, void *done);
/* An upload is a copy on the copy stream from host memory, which on the
 * CPU is device memory. */
gp_status gp_cpu_upload_async(gp_device *dev, void *dst, const void *src, size_t bytes,
                              void *done);
gp_status gp_cpu_event_create(gp_device *dev, void **out);
void gp_cpu_event_destroy(gp_device *dev, void *ev);
gp_status gp_cpu_event_record(gp_device *dev, void *ev);
gp_status gp_cpu_event_sync(gp_device *dev, void *ev);
/* Device-time markers: on the compute stream (the caller) the time of the
 * call; on the copy stream, with GPIPE_CPU_STREAMS=threads, the time the
 * queue reaches the marker (no copy delay applies to it). */
gp_status gp_cpu_mark(gp_device *dev, bool copy, void **out);
/* Channels to other processes (backend.h, chan_open): GPIPE_CPU_STREAMS=
 * threads only; each a queue with a thread of its own. */
/* precision bf16: C = alpha op(A) op(B) + beta C with A and B rounded to
 * bf16 and FP32 sums (oneDNN's matmul), the gemm slot's contract
 * otherwise (cpu_dnnl.c). */
gp_status gp_cpu_gemm_bf16(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc, bool b_weights);
/* The gemm_wb slot (backend.h): B is frozen weights; with bf16 its bf16
 * copy is kept across a step's calls like a convolution's weights. */
gp_status gp_cpu_gemm_wb(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                         int64_t ldb, float beta, float *c, int64_t ldc);
gp_status gp_cpu_chan_open(gp_device *dev, const gp_chan_desc *d, void **out);
gp_status gp_cpu_chan_send(gp_device *dev, void *ch, const float *buf, int64_t n, void *after,
                           void *done);
gp_status gp_cpu_event_query(gp_device *dev, void *ev, bool *done);
gp_status gp_cpu_chan_recv(gp_device *dev, void *ch, float *buf, int64_t n, void *done);
void gp_cpu_chan_close(gp_device *dev, void *ch, bool abort);
gp_status gp_cpu_mark_time(gp_device *dev, void *mark, double *seconds);
void gp_cpu_mark_reset(gp_device *dev);

/* Set the calling thread's OpenMP thread count to the device's (cheap when
 * already right).  Every op calls it first, so an op is correct even on a
 * thread that never called gp_device_bind_thread. */
void gp_cpu_enter(gp_device *dev);

/* Grow the arena to at least `bytes` (accounted as GP_MEM_WORKSPACE). */
gp_status gp_cpu_arena_reserve(gp_device *dev, size_t bytes);

/* The thaw hook: add the held weight gradients into their tensors (in the
 * order they were first held) and free them and the kept weights. */
gp_status gp_cpu_weights_thaw(gp_device *dev);
/* Free every cached op (device destruction). */
void gp_cpu_cache_destroy(gp_cpu_ctx *ctx);

/* The iface slots implemented in cpu_dnnl.c, cpu_bn.c, cpu_pool.c, cpu_math.c,
 * cpu_upsample.c and cpu_comm.c. */
/* act_block (backend.h), and the block it says on this processor. */
int64_t gp_cpu_act_block(gp_device *dev, const gp_conv_desc *d, bool output);
int64_t gp_cpu_isa_block(void);
/* The instruction set switch (cpu_isa.c): GPIPE_CPU_ISA applied to
 * oneDNN once, before its first kernel (every CPU device's open calls
 * it; so does gp_cpu_isa_has). */
void gp_cpu_isa_init(void);
/* Whether the instruction set CPU devices run (the processor's, as far as
 * GPIPE_CPU_ISA or ONEDNN_MAX_CPU_ISA lets it) includes `want` (a
 * dnnl_cpu_isa_* value: each includes the bits of those below it).  Every
 * choice gpipe makes from the processor asks this, nothing else. */
bool gp_cpu_isa_has(dnnl_cpu_isa_t want);
/* For tests: how many of the activation operands (x / dx, y / dy) of each
 * of the three primitives of convolution d (forward, backward-data,
 * backward-weights; built if they are not) go through a reorder: 0 when
 * d's blocks are the primitive's own layouts. */
gp_status gp_cpu_conv_act_reorders(gp_device *dev, const gp_conv_desc *d, int count[3]);
gp_status gp_cpu_conv_fwd(gp_device *dev, const gp_conv_desc *d, const float *x,
                          const float *w, const float *b, float *y);
gp_status gp_cpu_conv_bwd_data(gp_device *dev, const gp_conv_desc *d,
                               const float *w, const float *dy, float *dx);
gp_status gp_cpu_conv_bwd_weights(gp_device *dev, const gp_conv_desc *d,
                                  const float *x, const float *dy, float *dw,
                                  float *db);
/* conv_*_bf16 and linear_*_bf16 (backend.h): bf16 storage under precision
 * bf16, the products on oneDNN's bf16 kernels (cpu_dnnl.c) */
gp_status gp_cpu_conv_fwd_bf16(gp_device *dev, const gp_conv_desc *d, const uint16_t *x,
                               const float *w, const float *b, uint16_t *y);
gp_status gp_cpu_conv_bwd_data_bf16(gp_device *dev, const gp_conv_desc *d, const float *w,
                                    const uint16_t *dy, uint16_t *dx);
gp_status gp_cpu_conv_bwd_weights_bf16(gp_device *dev, const gp_conv_desc *d,
                                       const uint16_t *x, const uint16_t *dy, float *dw,
                                       float *db);
gp_status gp_cpu_linear_fwd_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                 const uint16_t *x, const float *w, const float *bias, bool relu,
                                 uint16_t *y);
gp_status gp_cpu_linear_bwd_data_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                      const uint16_t *dy, const float *w, uint16_t *dx);
gp_status gp_cpu_linear_gelu_fwd(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                 int64_t in, const void *x, const float *w, const float *bias,
                                 void *pre, void *y);
gp_status gp_cpu_linear_gelu_bwd_data(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                      int64_t in, const void *dy, const float *w,
                                      const void *pre, void *dx);
gp_status gp_cpu_attn_cached(gp_device *dev, gp_dtype dt, const void *x, void *kv, void *y,
                             int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                             int64_t kv_heads, int64_t c);
gp_status gp_cpu_rope(gp_device *dev, gp_dtype dt, const gp_rope_desc *d, bool inverse,
                      const void *x, void *y);
gp_status gp_cpu_swiglu_fwd(gp_device *dev, gp_dtype dt, const void *x, void *y, int64_t rows,
                            int64_t h);
gp_status gp_cpu_swiglu_bwd(gp_device *dev, gp_dtype dt, const void *x, const void *dy, void *dx,
                            int64_t rows, int64_t h);
gp_status gp_cpu_rms_norm_fwd(gp_device *dev, gp_dtype dt, const void *x, const float *w, void *y,
                              float *rstd, int64_t rows, int64_t c, float eps);
gp_status gp_cpu_rms_norm_bwd_data(gp_device *dev, gp_dtype dt, const void *x, const float *w,
                                   const float *rstd, const void *dy, void *dx, int64_t rows,
                                   int64_t c);
gp_status gp_cpu_rms_norm_bwd_weights(gp_device *dev, gp_dtype dt, const void *x,
                                      const float *rstd, const void *dy, float *dw, int64_t rows,
                                      int64_t c);
gp_status gp_cpu_add_layer_norm_fwd(gp_device *dev, gp_dtype dt, const void *a, const void *b,
                                    void *s, const float *w, const float *bias, void *y,
                                    float *mean, float *rstd, int64_t rows, int64_t c, float eps);
gp_status gp_cpu_layer_norm_bwd_data_add(gp_device *dev, gp_dtype dt, const void *x,
                                         const float *w, const float *mean, const float *rstd,
                                         const void *dy, void *dx, int64_t rows, int64_t c);
gp_status gp_cpu_linear_bwd_weights(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                    int64_t in, const void *dy, const void *x, float *dw,
                                    float *db, bool fresh);
/* db (cols) += (over: =) the column sums of dy (rows, cols), of type dt */
void gp_cpu_col_sums(gp_device *dev, gp_dtype dt, const void *dy, float *db, int64_t rows,
                     int64_t cols, bool over);
size_t gp_cpu_pool_ws_bytes(gp_device *dev, const gp_pool_desc *d);
gp_status gp_cpu_pool_fwd(gp_device *dev, const gp_pool_desc *d, const float *x,
                          float *y, void *ws);
gp_status gp_cpu_pool_bwd(gp_device *dev, const gp_pool_desc *d, const float *x,
                          const float *y, const float *dy, float *dx, const void *ws);
gp_status gp_cpu_bn_fwd_train(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, float *y,
                              float *mean, float *var);
gp_status gp_cpu_bn_fwd_infer(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta,
                              const float *mean, const float *var, float *y);
gp_status gp_cpu_norm_leaky_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *yz,
                                     bool from_z, float slope, const float *var,
                                     const uint16_t *dy, uint16_t *dx);
gp_status gp_cpu_upsample_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale);
gp_status gp_cpu_upsample_bwd_bf16(gp_device *dev, const uint16_t *dy, uint16_t *dx, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale);
gp_status gp_cpu_norm_leaky_bwd(gp_device *dev, const gp_bn_desc *d, const float *yz,
                                bool from_z, float slope, const float *var, const float *dy,
                                float *dx);
gp_status gp_cpu_bn_bwd(gp_device *dev, const gp_bn_desc *d, const float *x,
                        const float *gamma, const float *beta, const float *mean,
                        const float *var, const float *dy, float *dx, float *dgamma,
                        float *dbeta);
gp_status gp_cpu_log_softmax(gp_device *dev, const float *x, float *y,
                             int64_t rows, int64_t cols);

gp_status gp_cpu_fill(gp_device *dev, float *x, float v, int64_t n);
gp_status gp_cpu_scale(gp_device *dev, float *x, float a, int64_t n);
gp_status gp_cpu_axpy(gp_device *dev, float a, const float *x, float *y, int64_t n);
gp_status gp_cpu_add(gp_device *dev, const float *a, const float *b, float *y, int64_t n);
gp_status gp_cpu_sumsq(gp_device *dev, const float *x, int64_t n, double *out);
gp_status gp_cpu_sumsq_multi(gp_device *dev, const float *const *xs, const int64_t *ns, int n,
                             double *out);
gp_status gp_cpu_nonfinite(gp_device *dev, const float *x, int64_t n, int *out);
gp_status gp_cpu_nonfinite_or(gp_device *dev, const float *x, int64_t n, float *flag);
gp_status gp_cpu_zero_many(gp_device *dev, float *const *xs, const int64_t *ns, int count);
gp_status gp_cpu_nonfinite_or_many(gp_device *dev, const float *const *xs, const int64_t *ns,
                                   int count, float *flag);
gp_status gp_cpu_bf16_pack(gp_device *dev, uint16_t *dst, const float *src, int64_t n);
gp_status gp_cpu_bf16_unpack(gp_device *dev, float *dst, const uint16_t *src, int64_t n);
gp_status gp_cpu_dropout_apply(gp_device *dev, const float *x, float *y, int64_t n, float p,
                               uint64_t seed, uint64_t stream, uint64_t first);
gp_status gp_cpu_sgd_multi(gp_device *dev, const gp_update_part *parts, int n, float lr, float mu,
                           int nesterov);
gp_status gp_cpu_adam_multi(gp_device *dev, const gp_update_part *parts, int n,
                            const gp_adam_step *a);
gp_status gp_cpu_sgd_update(gp_device *dev, float *w, const float *g, float *v,
                            int64_t n, float lr, float mu, float wd, int nesterov);
gp_status gp_cpu_gemm(gp_device *dev, int trans_a, int trans_b, int64_t m,
                      int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc);
gp_status gp_cpu_linear_fwd(gp_device *dev, int64_t n, int64_t out, int64_t in, const float *x,
                            const float *w, const float *bias, bool relu, float *y);
gp_status gp_cpu_add_bias_rows(gp_device *dev, float *y, const float *bias,
                               int64_t rows, int64_t cols);
gp_status gp_cpu_sum_rows(gp_device *dev, const float *dy, float *db,
                          int64_t rows, int64_t cols);
gp_status gp_cpu_sum_rows_bf16(gp_device *dev, const uint16_t *dy, float *db,
                               int64_t rows, int64_t cols);
gp_status gp_cpu_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n);
gp_status gp_cpu_relu_bwd(gp_device *dev, const float *y, const float *dy,
                          float *dx, int64_t n);
gp_status gp_cpu_xent(gp_device *dev, const float *logits, const float *labels,
                      int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                      float *dlogits, double *loss_sum, int64_t *correct, int64_t *bad_row);
gp_status gp_cpu_dropout_mask(gp_device *dev, float *mask, int64_t n, float p,
                              uint64_t seed, uint64_t stream, uint64_t first);
gp_status gp_cpu_mul(gp_device *dev, const float *a, const float *b, float *y,
                     int64_t n);
gp_status gp_cpu_add_bf16(gp_device *dev, const uint16_t *a, const uint16_t *b, uint16_t *y,
                          int64_t n);
gp_status gp_cpu_xent_bf16(gp_device *dev, const uint16_t *logits, const float *labels,
                           int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                           uint16_t *dlogits, gp_loss_result *out);
gp_status gp_cpu_layer_norm_fwd_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                     const float *b, uint16_t *y, float *mean, float *rstd,
                                     int64_t rows, int64_t c, float eps);
gp_status gp_cpu_layer_norm_bwd_data_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                          const float *mean, const float *rstd,
                                          const uint16_t *dy, uint16_t *dx, int64_t rows,
                                          int64_t c);
gp_status gp_cpu_layer_norm_bwd_weights_bf16(gp_device *dev, const uint16_t *x,
                                             const float *mean, const float *rstd,
                                             const uint16_t *dy, float *dw, float *db,
                                             int64_t rows, int64_t c);
gp_status gp_cpu_dropout_apply_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                    float p, uint64_t seed, uint64_t stream, uint64_t first);
gp_status gp_cpu_mul_rows_bf16(gp_device *dev, const uint16_t *x, const float *s, uint16_t *y,
                               int64_t rows, int64_t cols);
/* cpu_pool.c: pooling on bf16 storage (backend.h's pool_*_bf16) */
gp_status gp_cpu_pool_fwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               uint16_t *y, void *ws);
gp_status gp_cpu_pool_bwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                               const void *ws);
/* cpu_bn.c: batch norm on bf16 storage (backend.h's bn_*_bf16) */
gp_status gp_cpu_bn_fwd_train_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, uint16_t *y,
                                   float *mean, float *var);
gp_status gp_cpu_bn_fwd_infer_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                                   const float *gamma, const float *beta, const float *mean,
                                   const float *var, uint16_t *y);
gp_status gp_cpu_bn_bwd_bf16(gp_device *dev, const gp_bn_desc *d, const uint16_t *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const uint16_t *dy, uint16_t *dx, float *dgamma,
                             float *dbeta);
gp_status gp_cpu_act_bf16(gp_device *dev, gp_act_kind kind, const uint16_t *xy,
                          const uint16_t *dy, uint16_t *out, int64_t n, float slope);
gp_status gp_cpu_gelu_fwd(gp_device *dev, const float *x, float *y, int64_t n);
gp_status gp_cpu_gelu_bwd(gp_device *dev, const float *x, const float *dy, float *dx, int64_t n);
gp_status gp_cpu_gelu_bf16(gp_device *dev, const uint16_t *x, const uint16_t *dy, uint16_t *out,
                           int64_t n);
gp_status gp_cpu_layer_norm_fwd(gp_device *dev, const float *x, const float *w, const float *b,
                                float *y, float *mean, float *rstd, int64_t rows, int64_t c,
                                float eps);
gp_status gp_cpu_layer_norm_bwd_data(gp_device *dev, const float *x, const float *w,
                                     const float *mean, const float *rstd, const float *dy,
                                     float *dx, int64_t rows, int64_t c);
gp_status gp_cpu_layer_norm_bwd_weights(gp_device *dev, const float *x, const float *mean,
                                        const float *rstd, const float *dy, float *dw,
                                        float *db, int64_t rows, int64_t c);
gp_status gp_cpu_embed_fwd(gp_device *dev, const float *ids, const float *wte, const float *wpe,
                           gp_dtype dt, void *y, int64_t n, int64_t t, int64_t c, int64_t vocab,
                           int64_t *bad);
gp_status gp_cpu_embed_bwd(gp_device *dev, const float *ids, gp_dtype dt, const void *dy,
                           float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                           int64_t vocab);
gp_status gp_cpu_leaky_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n,
                                float slope);
gp_status gp_cpu_leaky_relu_bwd(gp_device *dev, const float *y, const float *dy, float *dx,
                                int64_t n, float slope);
gp_status gp_cpu_mul_rows(gp_device *dev, const float *x, const float *s, float *y,
                          int64_t rows, int64_t cols);
gp_status gp_cpu_bce_logits(gp_device *dev, const float *z, const float *t, int64_t n,
                            float scale, float *dz, double *loss_sum, int64_t *correct,
                            int64_t *bad);
/* The two losses with their results in device memory (here host memory). */
gp_status gp_cpu_xent_dev(gp_device *dev, const float *logits, const float *labels,
                          int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                          float *dlogits, gp_loss_result *out);
gp_status gp_cpu_bce_logits_dev(gp_device *dev, const float *z, const float *t, int64_t n,
                                float scale, float *dz, gp_loss_result *out);
/* cpu_upsample.c: nearest-neighbour upsampling and its adjoint. */
gp_status gp_cpu_upsample_fwd(gp_device *dev, const float *x, float *y, int64_t n, int64_t c,
                              int64_t h, int64_t w, int64_t scale);
gp_status gp_cpu_upsample_bwd(gp_device *dev, const float *dy, float *dx, int64_t n,
                              int64_t c, int64_t h, int64_t w, int64_t scale);
/* cpu_attention.c: causal multi-head self-attention (backend.h's attn_fwd
 * and attn_bwd), blocked, with an online softmax. */
gp_status gp_cpu_attn_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                          int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
gp_status gp_cpu_attn_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                          const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                          int64_t kv_heads, int64_t c);
gp_status gp_cpu_attn_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                               int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c);
gp_status gp_cpu_attn_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                               const float *lse, const uint16_t *dy, uint16_t *dx, int64_t b,
                               int64_t t, int64_t heads, int64_t kv_heads, int64_t c);

/* cpu_comm.c: collectives between the devices' worker threads. */
gp_status gp_cpu_allreduce(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
gp_status gp_cpu_reduce_scatter(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
gp_status gp_cpu_all_gather(gp_device *dev, gp_comm *comm, float *buf, int64_t n);
gp_status gp_cpu_barrier(gp_device *dev, gp_comm *comm);
gp_status gp_cpu_copy_box(gp_device *dev, void *dst, const int64_t ds[4], const void *src,
                          const int64_t ss[4], const int64_t dims[4], size_t es);
gp_status gp_cpu_sharded_sgd(gp_device *dev, gp_comm *comm, float *w, float *g, float *v,
                             int64_t n, float lr, float mu, float wd, int nesterov);
gp_status gp_cpu_broadcast(gp_device *dev, gp_comm *comm, float *buf, int64_t n, int root);
/* cpu_bn.c: the step's statistics on the device, and the SyncBN pieces. */
gp_status gp_cpu_bn_merge(gp_device *dev, int64_t c, double *mean_acc, double *m2_acc,
                          double na, double nb, const float *mean, const float *var);
gp_status gp_cpu_bn_commit_multi(gp_device *dev, const gp_bn_commit_part *parts, int n);
gp_status gp_cpu_bn_commit(gp_device *dev, int64_t c, float *rmean, float *rvar,
                           double *mean_acc, double *m2_acc, double momentum, double count);
gp_status gp_cpu_bn_stats(gp_device *dev, const gp_bn_desc *d, const float *x, float *mean,
                          float *var);
gp_status gp_cpu_bn_bwd_sums(gp_device *dev, const gp_bn_desc *d, const float *x,
                             const float *gamma, const float *beta, const float *mean,
                             const float *var, const float *dy, float *sums);
gp_status gp_cpu_bn_bwd_apply(gp_device *dev, const gp_bn_desc *d, const float *x,
                              const float *gamma, const float *beta, const float *mean,
                              const float *var, const float *dy, const float *sums,
                              double count, float *dx, const float *local, float *dgamma,
                              float *dbeta);

#endif /* GP_CPU_IMPL_H */
