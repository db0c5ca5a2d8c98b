/*
 * cpu_device.c — the CPU device: construction, memory, copies, the (trivial)
 * stream and event model, the workspace arena and the oneDNN error hook.
 *
 * A CPU device is a set of math threads driven by one worker thread at a
 * time.  Operations run synchronously on the calling thread; their OpenMP
 * regions use dev->threads threads.  libgomp keeps the thread count (the
 * nthreads-var ICV) per calling thread, so several CPU devices driven by
 * several worker threads compute at once, each with its own count.
 * Callers should gp_device_bind_thread() once on the worker thread; every op
 * also re-checks the count on entry (gp_cpu_enter), so an op called from an
 * unbound thread is still correct — it then leaves that thread's OpenMP
 * thread count set to this device's.
 *
 * Memory: device memory is host memory, 64-byte aligned (AVX-512 lines);
 * accounting is done by the gp_dev_alloc wrapper.  The backend's own
 * scratch (oneDNN temporaries and scratchpads) is one arena per device,
 * accounted as GP_MEM_WORKSPACE.
 */
#include "backend/cpu/cpu_impl.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

gp_status gp_cpu_dnnl_error(dnnl_status_t s, const char *call, const char *func,
                            const char *file, int line)
{
    return gp_error_set(GP_ERR_RUNTIME, "oneDNN call %s failed with status %s (%d) in %s() at %s:%d",
                        call, dnnl_status2str(s), (int)s, func, file, line);
}

void gp_cpu_enter(gp_device *dev)
{
    if (omp_get_max_threads() != dev->threads) omp_set_num_threads(dev->threads);
}

static void cpu_bind_thread(gp_device *dev) { omp_set_num_threads(dev->threads); }

int gp_caller_threads(void) { return omp_get_max_threads(); }

void gp_caller_threads_restore(int threads)
{
    if (threads > 0 && omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

/* ---- memory --------------------------------------------------------------- */

/* Block sizes are rounded so that nearly equal requests (uneven
 * micro-batches) share a bin. */
static size_t cpu_round(size_t bytes)
{
    size_t q = bytes < ((size_t)1 << 16) ? 64 : 4096;
    return (bytes + q - 1) / q * q;
}

/* Where weights start (gp_cpu_ctx.block_shift).  oneDNN 2.6's AVX2 sgemm
 * runs a product whose B is not transposed (a linear layer's
 * backward-data, dx = dy W) 1.6-1.8x slower when B starts on a 32-byte
 * boundary: on an AVX2-only AMD EPYC (Zen 3, 2 threads) dy W at 256 x 2048
 * x 2048 took 29-39 ms with W at page offsets 0, 32, 64 or 8192 and 17-19
 * ms at 8, 16, 24, 48, 80 or 4112, the same bits either way; the offsets of
 * dy and dx made no difference.  So on AVX2 a weight block (GP_MEM_PARAMS)
 * of 64 KiB or more starts 16 bytes past a 64-byte boundary:
 * bench/mlp.yaml's step 362-399 -> 295-306 ms.  Other blocks keep 64-byte
 * alignment (oneDNN's convolutions read and write activations in blocked
 * layouts; its scratchpads are carved from the workspace arena), and so
 * does every block where CPU devices compute in AVX-512: on an Intel Xeon
 * with AVX-512 the shift made no difference (bench/mlp.yaml's step
 * 138.7-141.3 ms aligned, 138.0-141.8 shifted, 3 alternating rounds,
 * 2026-12-01).  gpipe's own loops load unaligned.  A block's start
 * is a function of its size, what it holds and the instruction set, so
 * every weight of a size starts alike on every device of a run; the
 * block cache keeps the two kinds in bins of their own. */
#define CPU_SHIFT_MIN ((size_t)1 << 16)

static size_t cpu_shift(const gp_cpu_ctx *ctx, size_t rounded, gp_mem_category cat)
{
    return rounded >= CPU_SHIFT_MIN && cat == GP_MEM_PARAMS ? ctx->block_shift : 0;
}

/* A block's start past 64 bytes: 0 or block_shift (cpu_alloc) */
static size_t cpu_start(const void *p) { return (size_t)((uintptr_t)p & 63); }

static cpu_bin *cpu_find_bin(gp_cpu_ctx *ctx, size_t bytes)
{
    for (int b = 0; b < ctx->n_bins; b++)
        if (ctx->bins[b].bytes == bytes) return &ctx->bins[b];
    return NULL;
}

static gp_status cpu_alloc(gp_device *dev, size_t bytes, gp_mem_category cat, void **out)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    size_t r = cpu_round(bytes ? bytes : 1), shift = cpu_shift(ctx, r, cat);
    pthread_mutex_lock(&ctx->bins_lock);
    cpu_bin *bin = cpu_find_bin(ctx, r + shift); /* (a bin's key: size + start) */
    if (bin && bin->n > 0) {
        *out = bin->free[--bin->n];
        ctx->cached_bytes -= r;
        pthread_mutex_unlock(&ctx->bins_lock);
        gp_cpu_streams_allocated(dev, *out, bytes); /* a new buffer to the checker */
        return GP_OK;
    }
    pthread_mutex_unlock(&ctx->bins_lock);
    void *p = NULL;
    if (posix_memalign(&p, 64, r + (shift ? 64 : 0)) != 0) {
        char b[32];
        return gp_error_set(GP_ERR_OOM, "out of host memory on device %s: could not allocate %s",
                            dev->name, gp_format_bytes(bytes, b, sizeof b));
    }
    *out = (char *)p + shift;
    gp_cpu_streams_allocated(dev, *out, bytes);
    return GP_OK;
}

static void cpu_free(gp_device *dev, void *ptr, size_t bytes)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    /* a queued copy may still use it; and the checker forgets it */
    gp_cpu_streams_before_free(dev, ptr, bytes);
    size_t r = cpu_round(bytes ? bytes : 1), start = cpu_start(ptr);
    pthread_mutex_lock(&ctx->bins_lock);
    cpu_bin *bin = cpu_find_bin(ctx, r + start);
    if (!bin && ctx->n_bins == ctx->cap_bins) {
        int cap = ctx->cap_bins ? 2 * ctx->cap_bins : 32;
        cpu_bin *nb = realloc(ctx->bins, (size_t)cap * sizeof *nb);
        if (nb) {
            ctx->bins = nb;
            ctx->cap_bins = cap;
        }
    }
    if (!bin && ctx->n_bins < ctx->cap_bins) {
        bin = &ctx->bins[ctx->n_bins++];
        memset(bin, 0, sizeof *bin);
        bin->bytes = r + start;
    }
    if (bin && bin->n == bin->cap) {
        int cap = bin->cap ? 2 * bin->cap : 8;
        void **nf = realloc(bin->free, (size_t)cap * sizeof *nf);
        if (nf) {
            bin->free = nf;
            bin->cap = cap;
        }
    }
    if (bin && bin->n < bin->cap) {
        bin->free[bin->n++] = ptr;
        ctx->cached_bytes += r;
        ptr = NULL;
    }
    pthread_mutex_unlock(&ctx->bins_lock);
    if (ptr) free((char *)ptr - start); /* only when the cache could not grow */
}

static void cpu_release_cache(gp_cpu_ctx *ctx)
{
    for (int b = 0; b < ctx->n_bins; b++) {
        for (int i = 0; i < ctx->bins[b].n; i++)
            free((char *)ctx->bins[b].free[i] - cpu_start(ctx->bins[b].free[i]));
        free(ctx->bins[b].free);
    }
    free(ctx->bins);
    ctx->bins = NULL;
    ctx->n_bins = ctx->cap_bins = 0;
    ctx->cached_bytes = 0;
}

gp_status gp_cpu_arena_reserve(gp_device *dev, size_t bytes)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (bytes <= ctx->arena_bytes) return GP_OK;
    /* Round up so a sequence of slightly larger shapes does not regrow it
     * every time. */
    size_t want = (bytes + ((size_t)1 << 16) - 1) & ~(((size_t)1 << 16) - 1);
    /* The old contents are dead between ops: free first, keeping peak low. */
    gp_dev_free(dev, ctx->arena, ctx->arena_bytes, GP_MEM_WORKSPACE);
    ctx->arena = NULL;
    ctx->arena_bytes = 0;
    gp_status s = gp_dev_alloc(dev, want, GP_MEM_WORKSPACE, &ctx->arena);
    if (s != GP_OK)
        return gp_error_wrap(s, "device %s: the CPU backend's workspace for oneDNN temporaries",
                             dev->name);
    ctx->arena_bytes = want;
    return GP_OK;
}

/* ---- transfers: all memory is host memory ---------------------------------- */

static gp_status cpu_copy(gp_device *dev, void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memcpy(dst, src, bytes);
    return GP_OK;
}

static gp_status cpu_copy_peer(gp_device *dev, void *dst, gp_device *src_dev,
                               const void *src, size_t bytes)
{
    if (src_dev->kind != GP_DEV_CPU)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no direct copy from %s",
                            dev->name, src_dev->name);
    if (bytes && dst != src) memcpy(dst, src, bytes);
    return GP_OK;
}


/* ---- lifetime ------------------------------------------------------------- */

static void cpu_destroy(gp_device *dev)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (ctx) {
        gp_cpu_streams_stop(dev); /* its queued copies run first */
        gp_cpu_mark_reset(dev);
        (void)gp_cpu_weights_thaw(dev); /* kept weights go back to the allocator */
        free(ctx->held);
        gp_cpu_cache_destroy(ctx);
        gp_dev_free(dev, ctx->arena, ctx->arena_bytes, GP_MEM_WORKSPACE);
        cpu_release_cache(ctx);
        free(ctx->blocks);
        pthread_mutex_destroy(&ctx->bins_lock);
        if (ctx->stream) dnnl_stream_destroy(ctx->stream);
        if (ctx->engine) dnnl_engine_destroy(ctx->engine);
        free(ctx);
    }
}

static const gp_device_iface cpu_iface = {
    .version = GP_DEVICE_IFACE_VERSION,
    .backend_name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .bind_thread = cpu_bind_thread,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .copy_peer = cpu_copy_peer,
    /* Synchronous by default (events are NULL, a call's work is done when
     * it returns); GPIPE_CPU_STREAMS=threads: copy_async on a queue of its
     * own (cpu_streams.c). */
    .synchronize = gp_cpu_synchronize,
    .event_create = gp_cpu_event_create,
    .event_destroy = gp_cpu_event_destroy,
    .event_record = gp_cpu_event_record,
    .event_wait = gp_cpu_event_sync, /* the compute stream is the caller */
    .event_sync = gp_cpu_event_sync,
    .fill = gp_cpu_fill,
    .scale = gp_cpu_scale,
    .axpy = gp_cpu_axpy,
    .add = gp_cpu_add,
    .sumsq = gp_cpu_sumsq,
    .nonfinite = gp_cpu_nonfinite,
    .sgd_update = gp_cpu_sgd_update,
    .sgd_multi = gp_cpu_sgd_multi,
    .adam_multi = gp_cpu_adam_multi,
    .sumsq_multi = gp_cpu_sumsq_multi,
    .norm_leaky_bwd = gp_cpu_norm_leaky_bwd,
    .dropout_apply = gp_cpu_dropout_apply,
    .bf16_pack = gp_cpu_bf16_pack,
    .bf16_unpack = gp_cpu_bf16_unpack,
    .act_block = gp_cpu_act_block,
    .gemm = gp_cpu_gemm,
    .add_bias_rows = gp_cpu_add_bias_rows,
    .sum_rows = gp_cpu_sum_rows,
    .conv_fwd = gp_cpu_conv_fwd,
    .conv_bwd_data = gp_cpu_conv_bwd_data,
    .conv_bwd_weights = gp_cpu_conv_bwd_weights,
    .pool_ws_bytes = gp_cpu_pool_ws_bytes,
    .pool_fwd = gp_cpu_pool_fwd,
    .pool_bwd = gp_cpu_pool_bwd,
    .bn_fwd_train = gp_cpu_bn_fwd_train,
    .bn_fwd_infer = gp_cpu_bn_fwd_infer,
    .bn_bwd = gp_cpu_bn_bwd,
    .relu_fwd = gp_cpu_relu_fwd,
    .relu_bwd = gp_cpu_relu_bwd,
    .log_softmax = gp_cpu_log_softmax,
    .xent = gp_cpu_xent,
    .dropout_mask = gp_cpu_dropout_mask,
    .mul = gp_cpu_mul,
    .allreduce = gp_cpu_allreduce,
    .broadcast = gp_cpu_broadcast,
    .bn_stats = gp_cpu_bn_stats,
    .bn_bwd_sums = gp_cpu_bn_bwd_sums,
    .bn_bwd_apply = gp_cpu_bn_bwd_apply,
    .reduce_scatter = gp_cpu_reduce_scatter,
    .all_gather = gp_cpu_all_gather,
    .host_alloc = NULL, /* device memory is host memory: gp_dev_host_alloc's aligned malloc */
    .host_free = NULL,
    .sharded_sgd = gp_cpu_sharded_sgd,
    .barrier = gp_cpu_barrier,
    .copy_box = gp_cpu_copy_box,
    .gelu_fwd = gp_cpu_gelu_fwd,
    .gelu_bwd = gp_cpu_gelu_bwd,
    .layer_norm_fwd = gp_cpu_layer_norm_fwd,
    .layer_norm_bwd_data = gp_cpu_layer_norm_bwd_data,
    .layer_norm_bwd_weights = gp_cpu_layer_norm_bwd_weights,
    .embed_fwd = gp_cpu_embed_fwd,
    .embed_bwd = gp_cpu_embed_bwd,
    .leaky_relu_fwd = gp_cpu_leaky_relu_fwd,
    .leaky_relu_bwd = gp_cpu_leaky_relu_bwd,
    .act_bf16 = gp_cpu_act_bf16,
    /* GELU: the FP32 slot's loop on the widened values (cpu_math.c) */
    .act_bf16_kinds = 1u << GP_ACT_RELU | 1u << GP_ACT_LEAKY_RELU | 1u << GP_ACT_GELU,
    .mul_rows = gp_cpu_mul_rows,
    .upsample_fwd = gp_cpu_upsample_fwd,
    .upsample_bwd = gp_cpu_upsample_bwd,
    .bce_logits = gp_cpu_bce_logits,
    .copy_async = gp_cpu_copy_async,
    .nonfinite_or = gp_cpu_nonfinite_or,
    .nonfinite_or_many = gp_cpu_nonfinite_or_many,
    .zero_many = gp_cpu_zero_many,
    .upload_async = gp_cpu_upload_async,
    .bn_merge = gp_cpu_bn_merge,
    .bn_commit = gp_cpu_bn_commit,
    .bn_commit_multi = gp_cpu_bn_commit_multi,
    .xent_dev = gp_cpu_xent_dev,
    .bce_logits_dev = gp_cpu_bce_logits_dev,
    .mark = gp_cpu_mark,
    .mark_time = gp_cpu_mark_time,
    .mark_reset = gp_cpu_mark_reset,
    .chan_open = gp_cpu_chan_open,
    .chan_send = gp_cpu_chan_send,
    .chan_recv = gp_cpu_chan_recv,
    .chan_close = gp_cpu_chan_close,
    .event_query = gp_cpu_event_query,
    .gemm_wb = gp_cpu_gemm_wb,
    .linear_fwd = gp_cpu_linear_fwd,
    .attn_fwd = gp_cpu_attn_fwd,
    .attn_bwd = gp_cpu_attn_bwd,
    .attn_fwd_bf16 = gp_cpu_attn_fwd_bf16,
    .attn_bwd_bf16 = gp_cpu_attn_bwd_bf16,
    .bn_fwd_train_bf16 = gp_cpu_bn_fwd_train_bf16,
    .bn_fwd_infer_bf16 = gp_cpu_bn_fwd_infer_bf16,
    .bn_bwd_bf16 = gp_cpu_bn_bwd_bf16,
    .pool_fwd_bf16 = gp_cpu_pool_fwd_bf16,
    .pool_bwd_bf16 = gp_cpu_pool_bwd_bf16,
    .add_bf16 = gp_cpu_add_bf16,
    .xent_bf16 = gp_cpu_xent_bf16,
    .layer_norm_fwd_bf16 = gp_cpu_layer_norm_fwd_bf16,
    .layer_norm_bwd_data_bf16 = gp_cpu_layer_norm_bwd_data_bf16,
    .layer_norm_bwd_weights_bf16 = gp_cpu_layer_norm_bwd_weights_bf16,
    .dropout_apply_bf16 = gp_cpu_dropout_apply_bf16,
    .mul_rows_bf16 = gp_cpu_mul_rows_bf16,
    .norm_leaky_bwd_bf16 = gp_cpu_norm_leaky_bwd_bf16,
    .upsample_fwd_bf16 = gp_cpu_upsample_fwd_bf16,
    .upsample_bwd_bf16 = gp_cpu_upsample_bwd_bf16,
    .conv_fwd_bf16 = gp_cpu_conv_fwd_bf16,
    .conv_bwd_data_bf16 = gp_cpu_conv_bwd_data_bf16,
    .conv_bwd_weights_bf16 = gp_cpu_conv_bwd_weights_bf16,
    .linear_fwd_bf16 = gp_cpu_linear_fwd_bf16,
    .linear_bwd_data_bf16 = gp_cpu_linear_bwd_data_bf16,
    .linear_bwd_weights = gp_cpu_linear_bwd_weights,
    .add_layer_norm_fwd = gp_cpu_add_layer_norm_fwd,
    .layer_norm_bwd_data_add = gp_cpu_layer_norm_bwd_data_add,
    .linear_gelu_fwd = gp_cpu_linear_gelu_fwd,
    .linear_gelu_bwd_data = gp_cpu_linear_gelu_bwd_data,
    .rms_norm_fwd = gp_cpu_rms_norm_fwd,
    .rms_norm_bwd_data = gp_cpu_rms_norm_bwd_data,
    .rms_norm_bwd_weights = gp_cpu_rms_norm_bwd_weights,
    .swiglu_fwd = gp_cpu_swiglu_fwd,
    .swiglu_bwd = gp_cpu_swiglu_bwd,
    .rope = gp_cpu_rope,
    .attn_cached = gp_cpu_attn_cached,
};

static cpu_conv_layout conv_layout_from_env(void)
{
    /* A tuning knob for benchmarks: GPIPE_CPU_CONV=auto|plain|blocked. */
    const char *e = getenv("GPIPE_CPU_CONV");
    if (!e || !strcmp(e, "auto")) return CPU_CONV_AUTO;
    if (!strcmp(e, "plain")) return CPU_CONV_PLAIN;
    if (!strcmp(e, "blocked")) return CPU_CONV_BLOCKED;
    GP_WARN("GPIPE_CPU_CONV='%s' is not auto, plain or blocked; using auto", e);
    return CPU_CONV_AUTO;
}

gp_status gp_cpu_device_create(int index, const gp_device_opts *opts, gp_device **out)
{
    *out = NULL;
    gp_device_opts def = {0};
    if (!opts) opts = &def;
    if (opts->threads < 0)
        return gp_error_set(GP_ERR_INVALID, "device cpu:%d: threads must be >= 0 (0 = all cores), got %d",
                            index, opts->threads);
    gp_cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return gp_error_set(GP_ERR_OOM, "out of host memory creating device cpu:%d", index);
    gp_device *dev;
    gp_status st = gp_device_new(&cpu_iface, GP_DEV_CPU, index, opts, &dev);
    if (st != GP_OK) {
        free(ctx);
        return st;
    }
    dev->ctx = ctx;
    dev->on_weights_thaw = gp_cpu_weights_thaw;
    gp_cpu_isa_init(); /* GPIPE_CPU_ISA, before oneDNN's first kernel */
    pthread_mutex_init(&ctx->bins_lock, NULL);
    ctx->block_shift =
        gp_cpu_isa_has(dnnl_cpu_isa_avx2) && !gp_cpu_isa_has(dnnl_cpu_isa_avx512_core) ? 16 : 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    dev->threads = opts->threads > 0 ? opts->threads : (cores > 0 ? (int)cores : 1);
    ctx->conv_layout = conv_layout_from_env();
    if (opts->precision == GP_PRECISION_BF16) {
        /* oneDNN's bf16 kernels need the instructions (vdpbf16ps or AMX);
         * without them it would emulate bf16, slower than fp32 */
        if (!gp_cpu_isa_has(dnnl_cpu_isa_avx512_core_bf16) && !opts->plan) {
            const char *cap = gp_cpu_isa_switch();
            char capped[96] = "";
            if (cap) snprintf(capped, sizeof capped, " (%s caps it)", cap);
            st = gp_error_set(GP_ERR_UNSUPPORTED, "precision bf16 needs a processor with bf16 "
                              "instructions (avx512_bf16 or AMX), and CPU devices run %s "
                              "here%s; use train.precision: fp32", gp_cpu_isa_name(), capped);
            goto fail;
        }
        ctx->bf16 = true;
        dev->precision = GP_PRECISION_BF16;
    } else if (opts->precision == GP_PRECISION_TF32) {
        /* TF32 is a GPU math mode: "may round products to 10 bits"; exact
         * FP32 keeps that promise */
        GP_INFO("device cpu:%d: precision tf32 is a GPU math mode; this CPU device computes "
                "in fp32", index);
    }
    /* A tuning knob for benchmarks: GPIPE_CPU_KEEP_WEIGHTS=0 reorders a
     * blocked convolution's weights on every call (cpu_dnnl.c, "Kept
     * weights"). */
    const char *kw = getenv("GPIPE_CPU_KEEP_WEIGHTS");
    ctx->keep_weights = !(kw && !strcmp(kw, "0"));
    /* and GPIPE_CPU_KEEP_BLOCKS=0 keeps every activation plain (act_block
     * 0), for the A/B of bench/README.md's "Blocked layouts across a
     * stage"; =nhwc keeps chains channels-last (a GPU's layout, for tests) */
    const char *kb = getenv("GPIPE_CPU_KEEP_BLOCKS");
    ctx->act_blk = kb && !strcmp(kb, "0")      ? 0
                   : kb && !strcmp(kb, "nhwc") ? CPU_ACT_NHWC
                                               : gp_cpu_isa_block();
    /* A test hook: GPIPE_CPU_FAKE_SEARCH=MiB plays a GPU's algorithm search
     * (cpu_dnnl.c conv_op), so the profile's handling of it runs here. */
    const char *fs = getenv("GPIPE_CPU_FAKE_SEARCH");
    ctx->fake_search = fs ? (size_t)strtoul(fs, NULL, 10) << 20 : 0;
    ctx->streams = gp_cpu_streams_from_env(&ctx->copy_delay_us);
    dev->chans = ctx->streams; /* a channel is a stream's queue */
    if (ctx->streams && (st = gp_cpu_streams_start(dev)) != GP_OK) goto fail;

    /* Each device caches its own primitives per shape (cpu_dnnl.c), so
     * oneDNN's process-wide primitive cache only adds sharing of primitive
     * objects between devices' worker threads (published through atomics
     * inside the library, which ThreadSanitizer cannot see).  Turn it off;
     * the setting is process-wide and idempotent. */
    GP_DNNL(dnnl_set_primitive_cache_capacity(0));
    GP_DNNL(dnnl_engine_create(&ctx->engine, dnnl_cpu, 0));
    GP_DNNL(dnnl_stream_create(&ctx->stream, ctx->engine, dnnl_stream_default_flags));
    *out = dev;
    return GP_OK;
fail:
    gp_device_close(dev);
    return gp_error_wrap(st, "device cpu:%d", index);
}

int64_t gp_cpu_primitives_created(const gp_device *dev)
{
    GP_ASSERT(dev && dev->kind == GP_DEV_CPU);
    return ((const gp_cpu_ctx *)dev->ctx)->prims_created;
}

const char *gp_cpu_loops_isa(void)
{
#if defined(GP_ISA_CLONES) && GP_ISA_CLONES >= 3
    __builtin_cpu_init();
#if GP_ISA_CLONES == 4
    if (__builtin_cpu_supports("x86-64-v4")) return "AVX-512 (x86-64-v4)";
#endif
    if (__builtin_cpu_supports("x86-64-v3")) return "AVX2 (x86-64-v3)";
#endif
    return "x86-64 baseline";
}
