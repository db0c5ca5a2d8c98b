/*
 * cuda_device.c — the CUDA device: construction on a GPU, the caching
 * allocator, pinned staging, streams and events, copies (including peer
 * copies), the elementwise and reduction slots (kernels in
 * cuda_kernels.cu), gemm on cuBLAS and the NCCL collectives.  Convolution,
 * pooling, batch norm and softmax are on cuDNN in cuda_dnn.c.
 *
 * Streams and ordering.  Each device has a compute stream (every kernel,
 * cuBLAS, cuDNN and NCCL call) and a copy stream (every transfer).  The
 * callers of this interface were written against the synchronous CPU
 * backend and rely on program order per device, so every transfer is
 * fenced both ways: the copy stream first waits for what was issued to the
 * compute stream, and the compute stream then waits for the copy.  Copies
 * still run on the copy engine and overlap with other devices' work.
 * Inside a training step the executor orders its transfers with events
 * instead and nothing is fenced: copy_async between stages, upload_async
 * for the step's input and targets, and the step's results (losses, the
 * NaN flag) left in device memory for one read at its end.  copy_h2d returns once the host source has been read: into
 * pinned staging, or by direct DMA when the source is itself pinned (the
 * loader's batches, host_alloc); copy_d2h returns with the data in host
 * memory.
 *
 * Peer copies.  copy_peer runs on the destination's copy stream after the
 * source device's compute stream (an event recorded there: the producer's
 * work) and is direct when cudaDeviceCanAccessPeer allows peer access,
 * which the first copy between a pair enables (peer_access); otherwise
 * cudaMemcpyPeerAsync stages through host memory itself.  The source
 * device's copy stream then waits for the copy, so a source buffer freed
 * afterwards is not reused (see the allocator's events) until the copy has
 * completed.
 *
 * Compiled and linked in CI; test_cuda ran on an H100 (2026-11-24).  See
 * docs/gpus.md.
 */
#include "backend/cuda/cuda_impl.h"

#include <limits.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

gp_status gp_cuda_fail(const char *lib, int code, const char *what, const char *call,
                       const char *func, const char *file, int line)
{
    return gp_error_set(GP_ERR_RUNTIME, "%s call %s failed with status %d (%s) in %s() at %s:%d",
                        lib, call, code, what ? what : "?", func, file, line);
}

gp_status gp_cuda_enter(gp_device *dev)
{
    int cur = -1;
    GP_CUDA(cudaGetDevice(&cur));
    if (cur != gp_cuda_ctx_of(dev)->ordinal) GP_CUDA(cudaSetDevice(gp_cuda_ctx_of(dev)->ordinal));
    return GP_OK;
}

static void cuda_bind_thread(gp_device *dev)
{
    gp_cuda_nvtx_push(dev->name);
    cudaError_t e = cudaSetDevice(gp_cuda_ctx_of(dev)->ordinal);
    gp_cuda_nvtx_pop();
    /* Every op enters the device again and reports a failure there. */
    if (e != cudaSuccess)
        GP_WARN("device %s: cudaSetDevice(%d) failed: %s", dev->name,
                gp_cuda_ctx_of(dev)->ordinal, cudaGetErrorString(e));
}

/* ---- the caching allocator ------------------------------------------------- */

/* Class index of a request and the class's block size; -1 if not cached. */
static int size_class(size_t bytes, size_t *block)
{
    if (bytes <= 512) {
        *block = 512;
        return 0;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^k <= bytes-1 */
    size_t q = (size_t)1 << (k - 2);
    size_t s = (bytes + q - 1) / q * q;                             /* 5q .. 8q */
    int c = 1 + 4 * (k - 9) + (int)(s >> (k - 2)) - 5;
    if (c >= CUDA_NCLASSES) return -1;
    *block = s;
    return c;
}

/* A node with its two events (created on this device: callers entered). */
static gp_status node_get(gp_cuda_ctx *ctx, cuda_block **out)
{
    pthread_mutex_lock(&ctx->lock);
    cuda_block *b = ctx->spare;
    if (b) ctx->spare = b->next;
    pthread_mutex_unlock(&ctx->lock);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) return gp_error_set(GP_ERR_OOM, "out of host memory for an allocator node");
        cudaError_t e = cudaEventCreateWithFlags(&b->done_compute, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&b->done_copy, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            if (b->done_compute) cudaEventDestroy(b->done_compute);
            free(b);
            return gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e), "cudaEventCreateWithFlags",
                                __func__, __FILE__, __LINE__);
        }
    }
    *out = b;
    return GP_OK;
}

static void node_put(gp_cuda_ctx *ctx, cuda_block *b)
{
    pthread_mutex_lock(&ctx->lock);
    b->ptr = NULL;
    b->next = ctx->spare;
    ctx->spare = b;
    pthread_mutex_unlock(&ctx->lock);
}

/* cudaFree every cached block (cudaFree waits for the device first). */
static void cache_release(gp_cuda_ctx *ctx)
{
    for (int c = 0; c < CUDA_NCLASSES; c++) {
        pthread_mutex_lock(&ctx->lock);
        cuda_block *b = ctx->free_list[c];
        ctx->free_list[c] = NULL;
        pthread_mutex_unlock(&ctx->lock);
        size_t block = 512;
        if (c > 0) {
            int k = 9 + (c - 1) / 4;
            block = ((size_t)1 << (k - 2)) * (size_t)(5 + (c - 1) % 4);
        }
        while (b) {
            cuda_block *next = b->next;
            cudaError_t e = cudaFree(b->ptr);
            if (e != cudaSuccess) GP_WARN("cudaFree: %s", cudaGetErrorString(e));
            pthread_mutex_lock(&ctx->lock);
            ctx->cached_bytes -= block;
            ctx->device_bytes -= block;
            pthread_mutex_unlock(&ctx->lock);
            node_put(ctx, b);
            b = next;
        }
    }
}

static gp_status cuda_alloc(gp_device *dev, size_t bytes, gp_mem_category cat, void **out)
{
    (void)cat; /* every block alike */
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    size_t block = 0;
    int c = size_class(bytes, &block);
    if (c >= 0) {
        pthread_mutex_lock(&ctx->lock);
        cuda_block *b = ctx->free_list[c];
        if (b) {
            ctx->free_list[c] = b->next;
            ctx->cached_bytes -= block;
        }
        pthread_mutex_unlock(&ctx->lock);
        if (b) {
            /* Work queued before the free (on either stream) comes first. */
            void *p = b->ptr;
            gp_status st = GP_OK;
            GP_CUDA_GO(cudaStreamWaitEvent(ctx->compute, b->done_compute, 0));
            GP_CUDA_GO(cudaStreamWaitEvent(ctx->compute, b->done_copy, 0));
            GP_CUDA_GO(cudaStreamWaitEvent(ctx->copy, b->done_compute, 0));
            GP_CUDA_GO(cudaStreamWaitEvent(ctx->copy, b->done_copy, 0));
            node_put(ctx, b);
            *out = p;
            return GP_OK;
        fail:
            /* cudaFree waits for the device, so the block is safe to drop. */
            node_put(ctx, b);
            (void)cudaFree(p);
            pthread_mutex_lock(&ctx->lock);
            ctx->device_bytes -= block;
            pthread_mutex_unlock(&ctx->lock);
            return st;
        }
    }
    size_t want = c >= 0 ? block : bytes;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    size_t released = 0;
    /* Out of memory: give the cached blocks back and try again, but not
     * while channels are open: cudaFree waits for the device, whose queue
     * may hold a receive that waits for a peer waiting for this thread
     * (cuda_free defers its cudaFree for the same reason), so there the
     * OOM stands and says so. */
    if (e == cudaErrorMemoryAllocation && ctx->chans_open == 0) {
        (void)cudaGetLastError();
        pthread_mutex_lock(&ctx->lock);
        released = ctx->cached_bytes;
        pthread_mutex_unlock(&ctx->lock);
        cache_release(ctx);
        e = cudaMalloc(&p, want);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t fr = 0, total = 0;
        (void)cudaMemGetInfo(&fr, &total);
        char b1[32], b2[32], b3[32], b4[32], b5[32];
        pthread_mutex_lock(&ctx->lock);
        size_t held = ctx->device_bytes;
        pthread_mutex_unlock(&ctx->lock);
        return gp_error_set(GP_ERR_OOM,
                            "out of memory on device %s: cudaMalloc of %s failed with %s held "
                            "by gpipe after releasing %s of cached blocks (GPU: %s free of %s); "
                            "use more devices, fewer or smaller micro-batches, checkpointing, "
                            "or a smaller capacity (pipeline.memory) to find the limit",
                            dev->name, gp_format_bytes(want, b1, sizeof b1),
                            gp_format_bytes(held, b2, sizeof b2),
                            gp_format_bytes(released, b3, sizeof b3),
                            gp_format_bytes(fr, b4, sizeof b4),
                            gp_format_bytes(total, b5, sizeof b5));
    }
    if (e != cudaSuccess)
        return gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e), "cudaMalloc(&p, want)",
                            __func__, __FILE__, __LINE__);
    pthread_mutex_lock(&ctx->lock);
    ctx->device_bytes += want;
    pthread_mutex_unlock(&ctx->lock);
    *out = p;
    return GP_OK;
}

static void cuda_free(gp_device *dev, void *ptr, size_t bytes)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    gp_status st = gp_cuda_enter(dev);
    size_t block = 0;
    int c = size_class(bytes, &block);
    cuda_block *b = NULL;
    if (st == GP_OK && c >= 0) st = node_get(ctx, &b);
    if (st == GP_OK && b) {
        cudaError_t e = cudaEventRecord(b->done_compute, ctx->compute);
        if (e == cudaSuccess) e = cudaEventRecord(b->done_copy, ctx->copy);
        if (e == cudaSuccess) {
            b->ptr = ptr;
            pthread_mutex_lock(&ctx->lock);
            b->next = ctx->free_list[c];
            ctx->free_list[c] = b;
            ctx->cached_bytes += block;
            pthread_mutex_unlock(&ctx->lock);
            return;
        }
        node_put(ctx, b);
    }
    /* Not cached (too large, or the events failed): cudaFree waits for the
     * device, so queued work that uses the block finishes first.  With
     * channels open that work may be a receive waiting for a peer that
     * waits for this thread: the free waits for the next synchronize. */
    if (ctx->chans_open > 0) {
        pthread_mutex_lock(&ctx->lock);
        if (ctx->n_deferred == ctx->cap_deferred) {
            int cap = ctx->cap_deferred ? 2 * ctx->cap_deferred : 16;
            void **q = realloc(ctx->deferred, (size_t)cap * sizeof *q);
            size_t *qb = realloc(ctx->deferred_bytes, (size_t)cap * sizeof *qb);
            if (q) ctx->deferred = q;
            if (qb) ctx->deferred_bytes = qb;
            if (q && qb) ctx->cap_deferred = cap;
        }
        bool queued = ctx->n_deferred < ctx->cap_deferred;
        if (queued) {
            ctx->deferred[ctx->n_deferred] = ptr;
            ctx->deferred_bytes[ctx->n_deferred++] = c >= 0 ? block : bytes;
        }
        pthread_mutex_unlock(&ctx->lock);
        if (queued) return;
    }
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) GP_WARN("device %s: cudaFree: %s", dev->name, cudaGetErrorString(e));
    pthread_mutex_lock(&ctx->lock);
    ctx->device_bytes -= c >= 0 ? block : bytes;
    pthread_mutex_unlock(&ctx->lock);
}

/* *buf grown to at least `bytes` (in whole MiB), accounted as workspace.
 * The old contents are dead between ops; the freed block's events keep it
 * from being reused under queued work. */
static gp_status grow(gp_device *dev, void **buf, size_t *have, size_t bytes, const char *what)
{
    if (bytes > *have) {
        size_t want = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        gp_dev_free(dev, *buf, *have, GP_MEM_WORKSPACE);
        *buf = NULL;
        *have = 0;
        gp_status s = gp_dev_alloc(dev, want, GP_MEM_WORKSPACE, buf);
        if (s != GP_OK) return gp_error_wrap(s, "device %s: %s", dev->name, what);
        *have = want;
    }
    return GP_OK;
}

gp_status gp_cuda_ws_reserve(gp_device *dev, size_t bytes, void **out)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(grow(dev, &ctx->ws, &ctx->ws_bytes, bytes,
                "the CUDA backend's workspace (cuDNN, reductions)"));
    *out = ctx->ws;
    return GP_OK;
}

gp_status gp_cuda_bf16_reserve(gp_device *dev, const int64_t *counts, int n, uint16_t **out)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    size_t at[GP_CUDA_BF16_PARTS + 1] = {0};
    if (n > GP_CUDA_BF16_PARTS) return gp_error_set(GP_ERR_INVALID, "bf16 operands: %d parts", n);
    for (int i = 0; i < n; i++) /* each part 256-byte aligned, as cuDNN and cuBLAS like */
        at[i + 1] = at[i] + (((size_t)counts[i] * sizeof(uint16_t) + 255) & ~(size_t)255);
    GP_TRY(grow(dev, &ctx->bws, &ctx->bws_bytes, at[n],
                "the bf16 copies of a convolution's or a matrix product's operands"));
    for (int i = 0; i < n; i++) out[i] = (uint16_t *)((char *)ctx->bws + at[i]);
    return GP_OK;
}

/* The weight tensor's bf16 mirror (gp_wmirror): made by gpipe's rounding
 * on the compute stream where not current, and written by the update's
 * kernel after that (gp_update_part.w16), so a step converts no weights. */
gp_status gp_cuda_weights_bf16(gp_device *dev, const float *w, int64_t n, const uint16_t **out)
{
    *out = NULL;
    uint16_t *copy = NULL;
    bool current = false;
    GP_TRY(gp_dev_mirror_get(dev, w, n, &copy, &current));
    if (!copy) return GP_OK;
    if (!current) {
        cudaError_t e = gp_cuk_bf16_pack(gp_cuda_ctx_of(dev)->compute, copy, w, n);
        if (e != cudaSuccess)
            return gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e), "gp_cuk_bf16_pack",
                                __func__, __FILE__, __LINE__);
        gp_dev_mirror_made(dev, w, n);
    }
    *out = copy;
    return GP_OK;
}

/* ---- transfers ----------------------------------------------------------------- */

/* `waiter` waits for everything issued to `on` so far. */
static gp_status fence(cudaStream_t waiter, cudaStream_t on, cudaEvent_t ev)
{
    GP_CUDA(cudaEventRecord(ev, on));
    GP_CUDA(cudaStreamWaitEvent(waiter, ev, 0));
    return GP_OK;
}

static gp_status copy_begin(gp_cuda_ctx *ctx)
{
    return fence(ctx->copy, ctx->compute, ctx->fence_compute);
}

static gp_status copy_end(gp_cuda_ctx *ctx)
{
    return fence(ctx->compute, ctx->copy, ctx->fence_copy);
}

/* Page-locked host memory (the loader's batches): copy_h2d reads it by DMA
 * without the staging memcpy.  Portable: every GPU of the run may read it. */
static gp_status cuda_host_alloc(gp_device *dev, size_t bytes, void **out)
{
    *out = NULL;
    GP_TRY(gp_cuda_enter(dev));
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return gp_error_set(GP_ERR_OOM, "device %s: cannot pin %zu bytes of host memory for "
                            "uploads (cudaHostAlloc: %s); lower data.prefetch or the batch size",
                            dev->name, bytes, cudaGetErrorString(e));
    }
    return GP_OK;
}

static void cuda_host_free(gp_device *dev, void *ptr)
{
    cudaError_t e = cudaFreeHost(ptr);
    if (e != cudaSuccess) GP_WARN("device %s: cudaFreeHost: %s", dev->name, cudaGetErrorString(e));
}

static bool is_pinned(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* plain malloc memory on old runtimes */
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

/* Pageable host memory src into dst on the copy stream, through the two
 * pinned staging buffers in turn: returns once src has been read (the
 * host waits only for a buffer's previous transfer).  On the device's own
 * worker, the buffers' only user. */
static gp_status stage_h2d(gp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    for (size_t off = 0; off < bytes; off += CUDA_STAGE_BYTES) {
        size_t len = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
        int k = ctx->stage_next;
        ctx->stage_next ^= 1;
        GP_CUDA(cudaEventSynchronize(ctx->stage_done[k])); /* its last copy has finished */
        memcpy(ctx->stage[k], (const char *)src + off, len);
        GP_CUDA(cudaMemcpyAsync((char *)dst + off, ctx->stage[k], len, cudaMemcpyHostToDevice,
                                ctx->copy));
        GP_CUDA(cudaEventRecord(ctx->stage_done[k], ctx->copy));
    }
    return GP_OK;
}

static gp_status cuda_copy_h2d(gp_device *dev, void *dst, const void *src, size_t bytes)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (!bytes) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(copy_begin(ctx));
    if (is_pinned(src)) {
        /* Direct DMA; return once the source has been read, as the staged
         * path does, so the caller may reuse it. */
        GP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->copy));
        GP_CUDA(cudaEventRecord(ctx->fence_copy, ctx->copy));
        GP_CUDA(cudaEventSynchronize(ctx->fence_copy));
        return copy_end(ctx);
    }
    GP_TRY(stage_h2d(ctx, dst, src, bytes));
    return copy_end(ctx);
}

static gp_status cuda_copy_d2h(gp_device *dev, void *dst, const void *src, size_t bytes)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (!bytes) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(copy_begin(ctx));
    for (size_t off = 0; off < bytes; off += CUDA_STAGE_BYTES) {
        size_t len = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
        int k = ctx->stage_next;
        ctx->stage_next ^= 1;
        GP_CUDA(cudaMemcpyAsync(ctx->stage[k], (const char *)src + off, len,
                                cudaMemcpyDeviceToHost, ctx->copy));
        GP_CUDA(cudaEventRecord(ctx->stage_done[k], ctx->copy));
        GP_CUDA(cudaEventSynchronize(ctx->stage_done[k]));
        memcpy((char *)dst + off, ctx->stage[k], len);
    }
    return copy_end(ctx);
}

static gp_status cuda_copy_d2d(gp_device *dev, void *dst, const void *src, size_t bytes)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (!bytes || dst == src) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(copy_begin(ctx));
    GP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->copy));
    return copy_end(ctx);
}

/* Peer access from our GPU to GPU s, enabled the first time a copy needs
 * it, so a run enables it only for the pairs it copies between (each pair
 * maps the other's memory, a cost on machines with many GPUs).  Without
 * it, cudaMemcpyPeerAsync stages through host memory itself. */
static gp_status peer_access(gp_cuda_ctx *ctx, int s)
{
    if (s == ctx->ordinal || s < 0 || s >= CUDA_MAX_DEVICES || ctx->can_peer[s]) return GP_OK;
    int can = 0;
    GP_CUDA(cudaDeviceCanAccessPeer(&can, ctx->ordinal, s));
    if (can) {
        /* the current device (gp_cuda_enter) gains access to s */
        cudaError_t e = cudaDeviceEnablePeerAccess(s, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError(); /* another stage */
        else if (e != cudaSuccess)
            return gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e),
                                "cudaDeviceEnablePeerAccess(s, 0)", __func__, __FILE__, __LINE__);
    }
    ctx->can_peer[s] = can ? 1 : 2;
    return GP_OK;
}

static gp_status cuda_copy_peer(gp_device *dev, void *dst, gp_device *src_dev, const void *src,
                                size_t bytes)
{
    /* CPU device memory is host memory. */
    if (src_dev->kind == GP_DEV_CPU) return cuda_copy_h2d(dev, dst, src, bytes);
    if (src_dev == dev) return cuda_copy_d2d(dev, dst, src, bytes);
    if (src_dev->kind != GP_DEV_CUDA)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no copy from %s", dev->name,
                            src_dev->name);
    if (!bytes) return GP_OK;
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev), *sc = gp_cuda_ctx_of(src_dev);
    int s = sc->ordinal;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(peer_access(ctx, s));
    if (!ctx->peer_ev[s]) {
        /* An event recorded on the source's stream must belong to it. */
        GP_CUDA(cudaSetDevice(s));
        cudaError_t e = cudaEventCreateWithFlags(&ctx->peer_ev[s], cudaEventDisableTiming);
        GP_CUDA(cudaSetDevice(ctx->ordinal));
        if (e != cudaSuccess)
            return gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e),
                                "cudaEventCreateWithFlags(&ctx->peer_ev[s], ...)", __func__,
                                __FILE__, __LINE__);
    }
    gp_cuda_nvtx_push("copy_peer");
    /* After the producer's work on the source and our own queued work. */
    GP_CUDA(cudaEventRecord(ctx->peer_ev[s], sc->compute));
    GP_CUDA(cudaStreamWaitEvent(ctx->copy, ctx->peer_ev[s], 0));
    GP_TRY(copy_begin(ctx));
    /* Direct over NVLink/PCIe with peer access, else staged by the driver. */
    GP_CUDA(cudaMemcpyPeerAsync(dst, ctx->ordinal, src, s, bytes, ctx->copy));
    GP_TRY(copy_end(ctx));
    /* The source's later frees (and reuse) wait for this read. */
    GP_CUDA(cudaStreamWaitEvent(sc->copy, ctx->fence_copy, 0));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

/* A copy between stages (backend.h, copy_async): on our copy stream behind
 * the producer's event, with no fence against either compute stream, and
 * `done` recorded behind it.  A free of dst records its block's done_copy
 * on our copy stream, so it already follows the write; for the source,
 * whose block records on the source's copy stream, that stream waits for
 * the read (torchgpipe's record_stream, done with an event). */
static gp_status cuda_copy_async(gp_device *dev, void *dst, gp_device *src_dev, const void *src,
                                 size_t bytes, void *after, void *done)
{
    if (src_dev->kind == GP_DEV_CPU) {
        /* A CPU stage's memory is pageable host memory, which its producer
         * may free as soon as this returns: staged through this device's
         * pinned buffers as copy_h2d does (on this device's own worker, the
         * buffers' only user), but without fencing the compute stream or
         * synchronizing, so the host waits for nothing of this device's
         * queue but a staging buffer's previous transfer.  The wrapper has
         * waited for `after` (another backend's event).  dst came from the
         * allocator, which made both streams wait for its last users, as
         * for upload_async. */
        gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
        GP_ASSERT(!after);
        GP_TRY(gp_cuda_enter(dev));
        GP_TRY(stage_h2d(ctx, dst, src, bytes));
        GP_CUDA(cudaEventRecord(done ? (cudaEvent_t)done : ctx->fence_copy, ctx->copy));
        return GP_OK;
    }
    if (src_dev->kind != GP_DEV_CUDA)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: no asynchronous copy from %s",
                            dev->name, src_dev->name);
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev), *sc = gp_cuda_ctx_of(src_dev);
    GP_TRY(gp_cuda_enter(dev));
    if (bytes) GP_TRY(peer_access(ctx, sc->ordinal));
    gp_cuda_nvtx_push("copy_async");
    if (after) GP_CUDA(cudaStreamWaitEvent(ctx->copy, (cudaEvent_t)after, 0));
    if (bytes && sc->ordinal == ctx->ordinal)
        GP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->copy));
    else if (bytes) /* direct over NVLink/PCIe with peer access, else staged by the driver */
        GP_CUDA(cudaMemcpyPeerAsync(dst, ctx->ordinal, src, sc->ordinal, bytes, ctx->copy));
    cudaEvent_t read = done ? (cudaEvent_t)done : ctx->fence_copy;
    GP_CUDA(cudaEventRecord(read, ctx->copy));
    if (src_dev != dev) GP_CUDA(cudaStreamWaitEvent(sc->copy, read, 0));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

/* Into a CPU stage's memory, on that stage's worker (backend.h,
 * copy_to_host): the calling thread's own default stream
 * (cudaStreamPerThread, which orders nothing against this device's
 * non-blocking streams) waits for `after`, copies and is synchronized, so
 * the host waits for the producer and the copy and for nothing else this
 * device has queued; ctx's streams and staging buffers, which this
 * device's worker uses meanwhile, are not touched. */
static gp_status cuda_copy_to_host(gp_device *dev, void *dst, const void *src, size_t bytes,
                                   void *after)
{
    GP_TRY(gp_cuda_enter(dev));
    if (after) GP_CUDA(cudaStreamWaitEvent(cudaStreamPerThread, (cudaEvent_t)after, 0));
    if (bytes)
        GP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    GP_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
    return GP_OK;
}

/* An upload on the copy stream (backend.h, upload_async): the block dst
 * came from the allocator, which already made both streams wait for its
 * last users.  From pinned memory (the loader's batches) the DMA reads src
 * later, which the caller keeps until the step's end; from pageable memory
 * the runtime stages src before it returns. */
static gp_status cuda_upload_async(gp_device *dev, void *dst, const void *src, size_t bytes,
                                   void *done)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    if (bytes) GP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->copy));
    if (done) GP_CUDA(cudaEventRecord((cudaEvent_t)done, ctx->copy));
    return GP_OK;
}

/* ---- device-time markers (backend.h, mark): timing events ------------------ */

static gp_status cuda_mark(gp_device *dev, bool copy, void **out)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    *out = NULL;
    GP_TRY(gp_cuda_enter(dev));
    if (ctx->n_marks == ctx->cap_marks) {
        int cap = ctx->cap_marks ? 2 * ctx->cap_marks : 256;
        cudaEvent_t *m = realloc(ctx->marks, (size_t)cap * sizeof *m);
        if (!m) return gp_error_set(GP_ERR_OOM, "out of host memory for device-time markers");
        ctx->marks = m;
        for (; ctx->cap_marks < cap; ctx->cap_marks++) {
            cudaError_t e = cudaEventCreate(&ctx->marks[ctx->cap_marks]); /* with timing */
            if (e != cudaSuccess)
                return gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e), "cudaEventCreate",
                                    __func__, __FILE__, __LINE__);
        }
    }
    cudaEvent_t ev = ctx->marks[ctx->n_marks++];
    GP_CUDA(cudaEventRecord(ev, copy ? ctx->copy : ctx->compute));
    *out = ev;
    return GP_OK;
}

/* t(mark) = anchor_host - (anchor - mark): the anchor is recorded once both
 * streams are idle and waited for, so its device time is (within the
 * wait's wake-up) the host time read right after. */
static gp_status cuda_mark_time(gp_device *dev, void *mark, double *seconds)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    if (!ctx->anchored) {
        if (!ctx->anchor) GP_CUDA(cudaEventCreate(&ctx->anchor));
        GP_CUDA(cudaStreamSynchronize(ctx->copy));
        GP_CUDA(cudaStreamSynchronize(ctx->compute));
        GP_CUDA(cudaEventRecord(ctx->anchor, ctx->compute));
        GP_CUDA(cudaEventSynchronize(ctx->anchor));
        ctx->anchor_host = gp_now();
        ctx->anchored = true;
    }
    float ms = 0;
    GP_CUDA(cudaEventElapsedTime(&ms, (cudaEvent_t)mark, ctx->anchor));
    *seconds = ctx->anchor_host - ms * 1e-3;
    return GP_OK;
}

static void cuda_mark_reset(gp_device *dev)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    ctx->n_marks = 0; /* the events are recorded again */
    ctx->anchored = false;
}

/* The frees cuda_free held back while channels were open. */
static void free_deferred(gp_device *dev)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    pthread_mutex_lock(&ctx->lock);
    int n = ctx->n_deferred;
    ctx->n_deferred = 0;
    for (int q = 0; q < n; q++) {
        cudaError_t e = cudaFree(ctx->deferred[q]);
        if (e != cudaSuccess) GP_WARN("device %s: cudaFree: %s", dev->name, cudaGetErrorString(e));
        ctx->device_bytes -= ctx->deferred_bytes[q];
    }
    pthread_mutex_unlock(&ctx->lock);
}

static gp_status cuda_synchronize(gp_device *dev)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    GP_CUDA(cudaStreamSynchronize(ctx->copy));
    GP_CUDA(cudaStreamSynchronize(ctx->compute));
    if (ctx->n_deferred) free_deferred(dev);
    return GP_OK;
}

/* ---- events: recorded on the compute stream (every copy is fenced into it),
 * waited on by both streams ---------------------------------------------------- */

static gp_status cuda_event_create(gp_device *dev, void **out)
{
    GP_TRY(gp_cuda_enter(dev));
    cudaEvent_t e = NULL;
    GP_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = (void *)e;
    return GP_OK;
}

static void cuda_event_destroy(gp_device *dev, void *ev)
{
    if (ev) (void)cudaEventDestroy((cudaEvent_t)ev);
}

static gp_status cuda_event_record(gp_device *dev, void *ev)
{
    GP_TRY(gp_cuda_enter(dev));
    GP_CUDA(cudaEventRecord((cudaEvent_t)ev, gp_cuda_ctx_of(dev)->compute));
    return GP_OK;
}

static gp_status cuda_event_wait(gp_device *dev, void *ev)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    GP_TRY(gp_cuda_enter(dev));
    GP_CUDA(cudaStreamWaitEvent(ctx->compute, (cudaEvent_t)ev, 0));
    GP_CUDA(cudaStreamWaitEvent(ctx->copy, (cudaEvent_t)ev, 0));
    return GP_OK;
}

static gp_status cuda_event_sync(gp_device *dev, void *ev)
{
    GP_CUDA(cudaEventSynchronize((cudaEvent_t)ev));
    return GP_OK;
}

/* ---- elementwise and reductions ------------------------------------------------- */

#define CUDA_OP(dev, launch)                                                    \
    do {                                                                        \
        GP_TRY(gp_cuda_enter(dev));                                             \
        cudaStream_t s = gp_cuda_ctx_of(dev)->compute;                          \
        GP_CUDA(launch);                                                        \
        return GP_OK;                                                           \
    } while (0)

static gp_status cuda_fill(gp_device *dev, float *x, float v, int64_t n)
{
    CUDA_OP(dev, gp_cuk_fill(s, x, v, n));
}

static gp_status cuda_scale(gp_device *dev, float *x, float a, int64_t n)
{
    CUDA_OP(dev, gp_cuk_scale(s, x, a, n));
}

static gp_status cuda_axpy(gp_device *dev, float a, const float *x, float *y, int64_t n)
{
    CUDA_OP(dev, gp_cuk_axpy(s, a, x, y, n));
}

static gp_status cuda_add(gp_device *dev, const float *a, const float *b, float *y, int64_t n)
{
    CUDA_OP(dev, gp_cuk_add(s, a, b, y, n));
}

static gp_status cuda_mul(gp_device *dev, const float *a, const float *b, float *y, int64_t n)
{
    CUDA_OP(dev, gp_cuk_mul(s, a, b, y, n));
}

static gp_status cuda_copy_box(gp_device *dev, void *dst, const int64_t ds[4], const void *src,
                               const int64_t ss[4], const int64_t dims[4], size_t es)
{
    /* gp_dev_copy_box collapsed the box: rows of contiguous values on both
     * sides (a concatenation's slice) are one 2-D copy, no index math */
    if (dims[0] == 1 && dims[1] == 1 && ds[3] == 1 && ss[3] == 1 &&
        (dims[2] == 1 || (ds[2] >= dims[3] && ss[2] >= dims[3]))) {
        size_t w = (size_t)dims[3] * es;
        size_t dp = dims[2] == 1 ? w : (size_t)ds[2] * es;
        size_t sp = dims[2] == 1 ? w : (size_t)ss[2] * es;
        GP_TRY(gp_cuda_enter(dev));
        GP_CUDA(cudaMemcpy2DAsync(dst, dp, src, sp, w, (size_t)dims[2], cudaMemcpyDeviceToDevice,
                                  gp_cuda_ctx_of(dev)->compute));
        return GP_OK;
    }
    CUDA_OP(dev, gp_cuk_copy_box(s, dst, ds, src, ss, dims, es));
}

static gp_status cuda_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n)
{
    CUDA_OP(dev, gp_cuk_relu_fwd(s, x, y, n));
}

static gp_status cuda_relu_bwd(gp_device *dev, const float *y, const float *dy, float *dx,
                               int64_t n)
{
    CUDA_OP(dev, gp_cuk_relu_bwd(s, y, dy, dx, n));
}

static gp_status cuda_sgd_update(gp_device *dev, float *w, const float *g, float *v, int64_t n,
                                 float lr, float mu, float wd, int nesterov)
{
    CUDA_OP(dev, gp_cuk_sgd(s, w, g, v, n, lr, mu, wd, nesterov));
}

/* parts [first, first + t->parts) into t. */
static void fill_table(gp_cuk_sgd_table *t, const gp_update_part *parts, int first, int n)
{
    t->parts = n - first < GP_CUK_SGD_PARTS ? n - first : GP_CUK_SGD_PARTS;
    for (int i = 0; i < t->parts; i++) {
        const gp_update_part *pt = &parts[first + i];
        t->w[i] = pt->w;
        t->g[i] = pt->g;
        t->v[i] = pt->v;
        t->v2[i] = pt->v2;
        t->n[i] = pt->n;
        t->wd[i] = pt->wd;
        t->clip[i] = pt->clip > 0.0f ? pt->clip : 1.0f;
        t->w16[i] = pt->w16;
        t->nonfinite[i] = pt->nonfinite;
    }
}

/* One launch per GP_CUK_SGD_PARTS parts; the pointer table goes in the
 * kernel's parameters, so nothing is uploaded. */
static gp_status cuda_sgd_multi(gp_device *dev, const gp_update_part *parts, int n, float lr,
                                float mu, int nesterov)
{
    gp_cuk_sgd_table t;
    GP_TRY(gp_cuda_enter(dev));
    cudaStream_t s = gp_cuda_ctx_of(dev)->compute;
    for (int first = 0; first < n; first += GP_CUK_SGD_PARTS) {
        fill_table(&t, parts, first, n);
        GP_CUDA(gp_cuk_sgd_multi(s, &t, lr, mu, nesterov));
    }
    return GP_OK;
}

/* As cuda_sgd_multi (compiled, not run on a GPU). */
static gp_status cuda_adam_multi(gp_device *dev, const gp_update_part *parts, int n,
                                 const gp_adam_step *a)
{
    gp_cuk_sgd_table t;
    GP_TRY(gp_cuda_enter(dev));
    cudaStream_t s = gp_cuda_ctx_of(dev)->compute;
    for (int first = 0; first < n; first += GP_CUK_SGD_PARTS) {
        fill_table(&t, parts, first, n);
        GP_CUDA(gp_cuk_adam_multi(s, &t, *a));
    }
    return GP_OK;
}

static gp_status cuda_dropout_apply(gp_device *dev, const float *x, float *y, int64_t n,
                                    float p, uint64_t seed, uint64_t stream, uint64_t first)
{
    CUDA_OP(dev, gp_cuk_dropout_apply(s, x, y, n, p, seed, stream, first));
}

static gp_status cuda_bf16_pack(gp_device *dev, uint16_t *dst, const float *src, int64_t n)
{
    CUDA_OP(dev, gp_cuk_bf16_pack(s, dst, src, n));
}

static gp_status cuda_bf16_unpack(gp_device *dev, float *dst, const uint16_t *src, int64_t n)
{
    CUDA_OP(dev, gp_cuk_bf16_unpack(s, dst, src, n));
}

static gp_status cuda_dropout_mask(gp_device *dev, float *mask, int64_t n, float p,
                                   uint64_t seed, uint64_t stream, uint64_t first)
{
    CUDA_OP(dev, gp_cuk_dropout_mask(s, mask, n, p, seed, stream, first));
}

static gp_status cuda_add_bias_rows(gp_device *dev, float *y, const float *bias, int64_t rows,
                                    int64_t cols)
{
    CUDA_OP(dev, gp_cuk_add_bias_rows(s, y, bias, rows, cols));
}

/* The partial sums go in the device's workspace (dead between ops). */
static gp_status sum_rows(gp_device *dev, const float *dy, float *db, int64_t rows,
                          int64_t cols, bool over)
{
    void *part = NULL;
    if (cols <= 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, (size_t)gp_cuk_sum_rows_parts(rows, cols) * (size_t)cols *
                                       sizeof(double), &part));
    GP_CUDA(gp_cuk_sum_rows(gp_cuda_ctx_of(dev)->compute, dy, db, rows, cols, part, over));
    return GP_OK;
}

static gp_status cuda_sum_rows(gp_device *dev, const float *dy, float *db, int64_t rows,
                               int64_t cols)
{
    return sum_rows(dev, dy, db, rows, cols, false);
}

/* Copy the device-side results to pinned memory and wait for them. */
static gp_status read_results(gp_cuda_ctx *ctx, cuda_res *out)
{
    GP_CUDA(cudaMemcpyAsync(ctx->host_res, ctx->dev_res, sizeof(cuda_res),
                            cudaMemcpyDeviceToHost, ctx->compute));
    GP_CUDA(cudaStreamSynchronize(ctx->compute));
    memcpy(out, ctx->host_res, sizeof *out);
    return GP_OK;
}

/* count (<= one table's) tensors into a kernel's table. */
static gp_cuk_tensor_table tensor_table(const float *const *xs, const int64_t *ns, int count)
{
    _Static_assert(GP_CUK_TABLE == GP_NONFINITE_BATCH, "one table a launch");
    GP_ASSERT(count >= 0 && count <= GP_NONFINITE_BATCH);
    gp_cuk_tensor_table t = {.count = count};
    for (int i = 0; i < count; i++) {
        t.x[i] = xs[i];
        t.n[i] = ns[i];
    }
    return t;
}

static gp_status cuda_sumsq(gp_device *dev, const float *x, int64_t n, double *out)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    void *ws;
    cuda_res r;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, GP_CUK_RED_BLOCKS * sizeof(double), &ws));
    GP_CUDA(gp_cuk_sumsq(ctx->compute, x, n, ws, &((cuda_res *)ctx->dev_res)->sumsq));
    GP_TRY(read_results(ctx, &r));
    *out = r.sumsq;
    return GP_OK;
}

/* Each tensor's partials (cuda_sumsq's first kernel, so the same bits)
 * in one launch per GP_CUK_TABLE tensors, all their sums in one more
 * (its second), then the n sums read back in one copy and one wait: a
 * GPT-2 stage's 148 gradients in 4 launches, where a pair per tensor
 * took 296.  One host wait, as llm.c's gpt2_calculate_grad_norm has:
 * the factor is known before any update runs, so a non-finite norm
 * skips the update (gp_clip_nonfinite) and the model stays as it was. */
static gp_status cuda_sumsq_multi(gp_device *dev, const float *const *xs, const int64_t *ns,
                                  int n, double *out)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    void *ws;
    if (n <= 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, (size_t)n * (GP_CUK_RED_BLOCKS + 1) * sizeof(double), &ws));
    double *partials = ws, *sums = partials + (size_t)n * GP_CUK_RED_BLOCKS;
    for (int t0 = 0; t0 < n; t0 += GP_CUK_TABLE) {
        int k = n - t0 < GP_CUK_TABLE ? n - t0 : GP_CUK_TABLE;
        gp_cuk_tensor_table t = tensor_table(xs + t0, ns + t0, k);
        GP_CUDA(gp_cuk_sumsq_many_partial(ctx->compute, &t,
                                          partials + (size_t)t0 * GP_CUK_RED_BLOCKS));
    }
    GP_CUDA(gp_cuk_sum_partials_many(ctx->compute, partials, n, sums));
    GP_CUDA(cudaMemcpyAsync(out, sums, (size_t)n * sizeof *out, cudaMemcpyDeviceToHost,
                            ctx->compute));
    GP_CUDA(cudaStreamSynchronize(ctx->compute));
    return GP_OK;
}

static gp_status cuda_nonfinite(gp_device *dev, const float *x, int64_t n, int *out)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cuda_res r;
    GP_TRY(gp_cuda_enter(dev));
    GP_CUDA(gp_cuk_nonfinite(ctx->compute, x, n, &((cuda_res *)ctx->dev_res)->nonfinite));
    GP_TRY(read_results(ctx, &r));
    *out = r.nonfinite;
    return GP_OK;
}

static gp_status cuda_nonfinite_or(gp_device *dev, const float *x, int64_t n, float *flag)
{
    GP_TRY(gp_cuda_enter(dev));
    GP_CUDA(gp_cuk_nonfinite_or(gp_cuda_ctx_of(dev)->compute, x, n, flag));
    return GP_OK;
}

static gp_status cuda_nonfinite_or_many(gp_device *dev, const float *const *xs, const int64_t *ns,
                                        int count, float *flag)
{
    gp_cuk_tensor_table t = tensor_table(xs, ns, count);
    GP_TRY(gp_cuda_enter(dev));
    GP_CUDA(gp_cuk_nonfinite_or_many(gp_cuda_ctx_of(dev)->compute, &t, flag));
    return GP_OK;
}

static gp_status cuda_mem_total(gp_device *dev, uint64_t *bytes)
{
    *bytes = gp_cuda_ctx_of(dev)->gpu_bytes; /* cudaMemGetInfo's total, at open */
    return GP_OK;
}

static gp_status cuda_zero_many(gp_device *dev, float *const *xs, const int64_t *ns, int count)
{
    gp_cuk_tensor_table t = tensor_table((const float *const *)xs, ns, count);
    GP_TRY(gp_cuda_enter(dev));
    GP_CUDA(gp_cuk_zero_many(gp_cuda_ctx_of(dev)->compute, &t));
    return GP_OK;
}

/* The cross-entropy kernels' per-row scratch in the workspace: rows
 * losses (double), then rows flags (long long). */
static gp_status xent_rows_ws(gp_device *dev, int64_t rows, double **row_loss,
                              long long **row_flag)
{
    void *ws;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, (size_t)rows * (sizeof(double) + sizeof(long long)), &ws));
    *row_loss = ws;
    *row_flag = (long long *)(*row_loss + rows);
    return GP_OK;
}

static gp_status cuda_xent(gp_device *dev, const float *logits, const float *labels,
                           int64_t rows, int64_t cols, int64_t ld, float scale, float smoothing,
                           float *dlogits, double *loss_sum, int64_t *correct, int64_t *bad_row)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    *loss_sum = 0.0;
    *correct = 0;
    *bad_row = -1;
    if (rows <= 0) return GP_OK;
    cuda_res r;
    double *row_loss;
    long long *row_flag;
    GP_TRY(xent_rows_ws(dev, rows, &row_loss, &row_flag));
    GP_CUDA(gp_cuk_xent(ctx->compute, logits, labels, rows, cols, ld, scale, smoothing, dlogits,
                        row_loss, row_flag, &((cuda_res *)ctx->dev_res)->xent));
    GP_TRY(read_results(ctx, &r));
    *bad_row = r.xent.bad_row;
    if (r.xent.bad_row < 0) {
        *loss_sum = r.xent.loss_sum;
        *correct = r.xent.correct;
    }
    return GP_OK;
}

/* The losses with their results left on the device (backend.h, xent_dev,
 * bce_logits_dev): the same kernels, writing into the caller's result. */
_Static_assert(sizeof(gp_loss_result) == sizeof(gp_cuk_xent_out) &&
                   offsetof(gp_loss_result, correct) == offsetof(gp_cuk_xent_out, correct) &&
                   offsetof(gp_loss_result, bad) == offsetof(gp_cuk_xent_out, bad_row) &&
                   sizeof(gp_loss_result) == sizeof(gp_cuk_bce_out) &&
                   offsetof(gp_loss_result, correct) == offsetof(gp_cuk_bce_out, correct) &&
                   offsetof(gp_loss_result, bad) == offsetof(gp_cuk_bce_out, bad),
               "gp_loss_result and the kernels' result structs must share a layout");

static gp_status cuda_xent_dev(gp_device *dev, const float *logits, const float *labels,
                               int64_t rows, int64_t cols, int64_t ld, float scale,
                               float smoothing, float *dlogits, gp_loss_result *out)
{
    double *row_loss;
    long long *row_flag;
    GP_TRY(xent_rows_ws(dev, rows, &row_loss, &row_flag));
    GP_CUDA(gp_cuk_xent(gp_cuda_ctx_of(dev)->compute, logits, labels, rows, cols, ld, scale,
                        smoothing, dlogits, row_loss, row_flag, (gp_cuk_xent_out *)out));
    return GP_OK;
}

static gp_status cuda_xent_bf16(gp_device *dev, const uint16_t *logits, const float *labels,
                               int64_t rows, int64_t cols, int64_t ld, float scale,
                               float smoothing, uint16_t *dlogits, gp_loss_result *out)
{
    double *row_loss;
    long long *row_flag;
    GP_TRY(xent_rows_ws(dev, rows, &row_loss, &row_flag));
    GP_CUDA(gp_cuk_xent_bf16(gp_cuda_ctx_of(dev)->compute, logits, labels, rows, cols, ld, scale,
                             smoothing, dlogits, row_loss, row_flag, (gp_cuk_xent_out *)out));
    return GP_OK;
}

static gp_status cuda_bce_logits_dev(gp_device *dev, const float *z, const float *t, int64_t n,
                                     float scale, float *dz, gp_loss_result *out)
{
    void *ws;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, GP_CUK_RED_BLOCKS * (sizeof(double) + sizeof(long long)),
                              &ws));
    double *loss_part = ws;
    GP_CUDA(gp_cuk_bce(gp_cuda_ctx_of(dev)->compute, z, t, n, scale, dz, loss_part,
                       (long long *)(loss_part + GP_CUK_RED_BLOCKS), (gp_cuk_bce_out *)out));
    return GP_OK;
}

static gp_status cuda_bn_merge(gp_device *dev, int64_t c, double *mean_acc, double *m2_acc,
                               double na, double nb, const float *mean, const float *var)
{
    CUDA_OP(dev, gp_cuk_bn_merge(s, mean_acc, m2_acc, na, nb, mean, var, c));
}

static gp_status cuda_bn_commit(gp_device *dev, int64_t c, float *rmean, float *rvar,
                                double *mean_acc, double *m2_acc, double momentum, double count)
{
    CUDA_OP(dev, gp_cuk_bn_commit(s, rmean, rvar, mean_acc, m2_acc, momentum, count, c));
}

/* One launch per GP_CUK_BN_COMMIT_MAX norms. */
static gp_status cuda_bn_commit_multi(gp_device *dev, const gp_bn_commit_part *parts, int n)
{
    GP_TRY(gp_cuda_enter(dev));
    for (int at = 0; at < n; at += GP_CUK_BN_COMMIT_MAX) {
        gp_cuk_bn_commit_part t[GP_CUK_BN_COMMIT_MAX];
        int k = n - at < GP_CUK_BN_COMMIT_MAX ? n - at : GP_CUK_BN_COMMIT_MAX;
        for (int i = 0; i < k; i++) {
            const gp_bn_commit_part *p = &parts[at + i];
            t[i] = (gp_cuk_bn_commit_part){p->c,        p->rmean,  p->rvar,  p->mean_acc,
                                           p->m2_acc,   p->momentum, p->count, p->pend,
                                           p->n_pend,   p->n_hi,   p->na,    p->nb_hi,
                                           p->nb_lo};
        }
        GP_CUDA(gp_cuk_bn_commit_multi(gp_cuda_ctx_of(dev)->compute, t, k));
    }
    return GP_OK;
}

/* ---- U-Net layers and loss ----------------------------------------------------------
 * Sizes were checked (and empty calls dropped) by the gp_dev_* wrappers. */

static gp_status cuda_act_bf16(gp_device *dev, gp_act_kind kind, const uint16_t *xy,
                               const uint16_t *dy, uint16_t *out, int64_t n, float slope)
{
    CUDA_OP(dev, gp_cuk_act_bf16(s, (int)kind, xy, dy, out, n, slope));
}

static gp_status cuda_dropout_apply_bf16(gp_device *dev, const uint16_t *x, uint16_t *y,
                                         int64_t n, float p, uint64_t seed, uint64_t stream,
                                         uint64_t first)
{
    CUDA_OP(dev, gp_cuk_dropout_apply_bf16(s, x, y, n, p, seed, stream, first));
}

static gp_status cuda_mul_rows_bf16(gp_device *dev, const uint16_t *x, const float *f,
                                    uint16_t *y, int64_t rows, int64_t cols)
{
    CUDA_OP(dev, gp_cuk_mul_rows_bf16(s, x, f, y, rows, cols));
}

static gp_status cuda_add_bf16(gp_device *dev, const uint16_t *a, const uint16_t *b,
                               uint16_t *y, int64_t n)
{
    CUDA_OP(dev, gp_cuk_add_bf16(s, a, b, y, n));
}

static gp_status cuda_gelu_fwd(gp_device *dev, const float *x, float *y, int64_t n)
{
    CUDA_OP(dev, gp_cuk_gelu_fwd(s, x, y, n));
}

static gp_status cuda_gelu_bwd(gp_device *dev, const float *x, const float *dy, float *dx,
                               int64_t n)
{
    CUDA_OP(dev, gp_cuk_gelu_bwd(s, x, dy, dx, n));
}

static gp_status cuda_layer_norm_fwd(gp_device *dev, const float *x, const float *w,
                                     const float *b, float *y, float *mean, float *rstd,
                                     int64_t rows, int64_t c, float eps)
{
    CUDA_OP(dev, gp_cuk_layer_norm_fwd(s, x, w, b, y, mean, rstd, rows, c, eps));
}

static gp_status cuda_layer_norm_bwd_data(gp_device *dev, const float *x, const float *w,
                                          const float *mean, const float *rstd, const float *dy,
                                          float *dx, int64_t rows, int64_t c)
{
    CUDA_OP(dev, gp_cuk_layer_norm_bwd_data(s, x, w, mean, rstd, dy, dx, rows, c));
}

static gp_status cuda_layer_norm_fwd_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                          const float *b, uint16_t *y, float *mean, float *rstd,
                                          int64_t rows, int64_t c, float eps)
{
    CUDA_OP(dev, gp_cuk_layer_norm_fwd_bf16(s, x, w, b, y, mean, rstd, rows, c, eps));
}

static gp_status cuda_layer_norm_bwd_data_bf16(gp_device *dev, const uint16_t *x, const float *w,
                                               const float *mean, const float *rstd,
                                               const uint16_t *dy, uint16_t *dx, int64_t rows,
                                               int64_t c)
{
    CUDA_OP(dev, gp_cuk_layer_norm_bwd_data_bf16(s, x, w, mean, rstd, dy, dx, rows, c));
}

static gp_status cuda_add_layer_norm_fwd(gp_device *dev, gp_dtype dt, const void *a,
                                         const void *b, void *sum, const float *w,
                                         const float *bias, void *y, float *mean, float *rstd,
                                         int64_t rows, int64_t c, float eps)
{
    CUDA_OP(dev, gp_cuk_add_layer_norm_fwd(s, dt == GP_BF16, a, b, sum, w, bias, y, mean, rstd,
                                           rows, c, eps));
}

static gp_status cuda_layer_norm_bwd_data_add(gp_device *dev, gp_dtype dt, const void *x,
                                              const float *w, const float *mean,
                                              const float *rstd, const void *dy, void *dx,
                                              int64_t rows, int64_t c)
{
    CUDA_OP(dev, gp_cuk_layer_norm_bwd_data_add(s, dt == GP_BF16, x, w, mean, rstd, dy, dx, rows,
                                                c));
}

static gp_status cuda_attn_cached(gp_device *dev, gp_dtype dt, const void *x, void *kv, void *y,
                                  int64_t b, int64_t n, int64_t pos, int64_t cap, int64_t heads,
                                  int64_t kv_heads, int64_t c)
{
    if (c / heads > 256)
        return gp_error_set(GP_ERR_UNSUPPORTED, "device %s: cached attention takes heads of up "
                            "to 256 values (got %lld); sample without the cache (gpipe-sample "
                            "--no-cache)", dev->name, (long long)(c / heads));
    CUDA_OP(dev, gp_cuk_attn_cached(s, dt == GP_BF16, x, kv, y, b, n, pos, cap, heads, kv_heads,
                                    c));
}

static gp_status cuda_rope(gp_device *dev, gp_dtype dt, const gp_rope_desc *d, bool inverse,
                           const void *x, void *y)
{
    CUDA_OP(dev, gp_cuk_rope(s, dt == GP_BF16, d, inverse, x, y));
}

static gp_status cuda_swiglu_fwd(gp_device *dev, gp_dtype dt, const void *x, void *y,
                                 int64_t rows, int64_t h)
{
    CUDA_OP(dev, gp_cuk_swiglu(s, dt == GP_BF16, x, NULL, y, rows, h));
}

static gp_status cuda_swiglu_bwd(gp_device *dev, gp_dtype dt, const void *x, const void *dy,
                                 void *dx, int64_t rows, int64_t h)
{
    CUDA_OP(dev, gp_cuk_swiglu(s, dt == GP_BF16, x, dy, dx, rows, h));
}

static gp_status cuda_rms_norm_fwd(gp_device *dev, gp_dtype dt, const void *x, const float *w,
                                   void *y, float *rstd, int64_t rows, int64_t c, float eps)
{
    CUDA_OP(dev, gp_cuk_rms_norm_fwd(s, dt == GP_BF16, x, w, y, rstd, rows, c, eps));
}

static gp_status cuda_rms_norm_bwd_data(gp_device *dev, gp_dtype dt, const void *x,
                                        const float *w, const float *rstd, const void *dy,
                                        void *dx, int64_t rows, int64_t c)
{
    CUDA_OP(dev, gp_cuk_rms_norm_bwd_data(s, dt == GP_BF16, x, w, rstd, dy, dx, rows, c));
}

static gp_status cuda_rms_norm_bwd_weights(gp_device *dev, gp_dtype dt, const void *x,
                                           const float *rstd, const void *dy, float *dw,
                                           int64_t rows, int64_t c)
{
    void *part = NULL;
    if (rows <= 0 || c <= 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, (size_t)gp_cuk_sum_rows_parts(rows, c) * (size_t)c *
                                       sizeof(double), &part));
    CUDA_OP(dev, gp_cuk_rms_norm_bwd_weights(s, dt == GP_BF16, x, rstd, dy, dw, rows, c, part));
}

/* The layer norm's weight sums' workspace: 2 doubles a column and part. */
static gp_status ln_weights_part(gp_device *dev, int64_t rows, int64_t c, void **part)
{
    if (rows <= 0 || c <= 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    return gp_cuda_ws_reserve(dev, (size_t)gp_cuk_sum_rows_parts(rows, c) * (size_t)c * 2 *
                                       sizeof(double), part);
}

static gp_status cuda_layer_norm_bwd_weights_bf16(gp_device *dev, const uint16_t *x,
                                                  const float *mean, const float *rstd,
                                                  const uint16_t *dy, float *dw, float *db,
                                                  int64_t rows, int64_t c)
{
    void *part = NULL;
    GP_TRY(ln_weights_part(dev, rows, c, &part));
    CUDA_OP(dev, gp_cuk_layer_norm_bwd_weights_bf16(s, x, mean, rstd, dy, dw, db, rows, c, part));
}

static gp_status cuda_layer_norm_bwd_weights(gp_device *dev, const float *x, const float *mean,
                                             const float *rstd, const float *dy, float *dw,
                                             float *db, int64_t rows, int64_t c)
{
    void *part = NULL;
    GP_TRY(ln_weights_part(dev, rows, c, &part));
    CUDA_OP(dev, gp_cuk_layer_norm_bwd_weights(s, x, mean, rstd, dy, dw, db, rows, c, part));
}

/* The ids' check writes the first bad row into a workspace word, read
 * back after a wait (as xent's result), then the sum runs where all are
 * good. */
static gp_status cuda_embed_fwd(gp_device *dev, const float *ids, const float *wte,
                                const float *wpe, gp_dtype dt, void *y, int64_t n, int64_t t,
                                int64_t c, int64_t vocab, int64_t *bad)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    void *ws;
    long long first = -1;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, sizeof(long long), &ws));
    GP_CUDA(gp_cuk_embed_check(ctx->compute, ids, n * t, vocab, (long long *)ws));
    GP_CUDA(cudaMemcpyAsync(&first, ws, sizeof first, cudaMemcpyDeviceToHost, ctx->compute));
    GP_CUDA(cudaStreamSynchronize(ctx->compute));
    *bad = first;
    if (first >= 0) return GP_OK;
    GP_CUDA(gp_cuk_embed_fwd(ctx->compute, ids, wte, wpe, y, dt == GP_BF16, n, t, c));
    return GP_OK;
}

static gp_status cuda_embed_bwd(gp_device *dev, const float *ids, gp_dtype dt, const void *dy,
                                float *dwte, float *dwpe, int64_t n, int64_t t, int64_t c,
                                int64_t vocab)
{
    CUDA_OP(dev, gp_cuk_embed_bwd(s, ids, dy, dt == GP_BF16, dwte, dwpe, n, t, c, vocab));
}

static gp_status cuda_leaky_relu_fwd(gp_device *dev, const float *x, float *y, int64_t n,
                                     float slope)
{
    CUDA_OP(dev, gp_cuk_leaky_relu_fwd(s, x, y, n, slope));
}

static gp_status cuda_leaky_relu_bwd(gp_device *dev, const float *y, const float *dy, float *dx,
                                     int64_t n, float slope)
{
    CUDA_OP(dev, gp_cuk_leaky_relu_bwd(s, y, dy, dx, n, slope));
}

static gp_status cuda_mul_rows(gp_device *dev, const float *x, const float *f, float *y,
                               int64_t rows, int64_t cols)
{
    CUDA_OP(dev, gp_cuk_mul_rows(s, x, f, y, rows, cols));
}

static gp_status cuda_norm_leaky_bwd(gp_device *dev, const gp_bn_desc *d, const float *yz,
                                     bool from_z, float slope, const float *var, const float *dy,
                                     float *dx)
{
    CUDA_OP(dev, gp_cuk_norm_leaky_bwd(s, yz, from_z, slope, var, d->eps, dy, dx, d->n, d->c,
                                       d->s));
}

static gp_status cuda_upsample_fwd(gp_device *dev, const float *x, float *y, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale)
{
    CUDA_OP(dev, gp_cuk_upsample_fwd(s, x, y, n * c, h, w, scale));
}

static gp_status cuda_upsample_bwd(gp_device *dev, const float *dy, float *dx, int64_t n,
                                   int64_t c, int64_t h, int64_t w, int64_t scale)
{
    CUDA_OP(dev, gp_cuk_upsample_bwd(s, dy, dx, n * c, h, w, scale));
}

static gp_status cuda_norm_leaky_bwd_bf16(gp_device *dev, const gp_bn_desc *d,
                                          const uint16_t *yz, bool from_z, float slope,
                                          const float *var, const uint16_t *dy, uint16_t *dx)
{
    CUDA_OP(dev, gp_cuk_norm_leaky_bwd_bf16(s, yz, from_z, slope, var, d->eps, dy, dx, d->n,
                                            d->c, d->s));
}

static gp_status cuda_upsample_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, int64_t n,
                                        int64_t c, int64_t h, int64_t w, int64_t scale)
{
    CUDA_OP(dev, gp_cuk_upsample_fwd_bf16(s, x, y, n * c, h, w, scale));
}

static gp_status cuda_upsample_bwd_bf16(gp_device *dev, const uint16_t *dy, uint16_t *dx,
                                        int64_t n, int64_t c, int64_t h, int64_t w, int64_t scale)
{
    CUDA_OP(dev, gp_cuk_upsample_bwd_bf16(s, dy, dx, n * c, h, w, scale));
}

static gp_status cuda_attn_fwd(gp_device *dev, const float *x, float *y, float *lse, int64_t b,
                               int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    bool done = false;
    GP_TRY(gp_cuda_enter(dev));
    /* cuDNN's fused path takes heads == kv_heads for now: grouped heads
     * run gpipe's kernels, which read each k and v head in place */
    if (kv_heads == heads) GP_TRY(gp_cuda_sdpa_fwd(dev, x, y, lse, b, t, heads, c, &done));
    if (done) return GP_OK;
    CUDA_OP(dev, gp_cuk_attn_fwd(s, x, y, lse, b, t, heads, kv_heads, c));
}

static gp_status cuda_attn_bwd(gp_device *dev, const float *x, const float *y, const float *lse,
                               const float *dy, float *dx, int64_t b, int64_t t, int64_t heads,
                               int64_t kv_heads, int64_t c)
{
    bool done = false;
    GP_TRY(gp_cuda_enter(dev));
    if (kv_heads == heads) GP_TRY(gp_cuda_sdpa_bwd(dev, x, y, lse, dy, dx, b, t, heads, c, &done));
    if (done) return GP_OK;
    CUDA_OP(dev, gp_cuk_attn_bwd(s, x, y, lse, dy, dx, b, t, heads, kv_heads, c));
}

/* attn_fwd_bf16 / attn_bwd_bf16: cuDNN's fused attention on the bf16
 * operands as they are; where it does not run, the adapter's way inside
 * (widened into FP32 scratch, the FP32 slot, rounded), the same bits. */
static gp_status cuda_attn_fwd_bf16(gp_device *dev, const uint16_t *x, uint16_t *y, float *lse,
                                    int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    bool done = false;
    GP_TRY(gp_cuda_enter(dev));
    if (kv_heads == heads) GP_TRY(gp_cuda_sdpa_fwd_bf16(dev, x, y, lse, b, t, heads, c, &done));
    if (done) return GP_OK;
    int64_t nx = b * t * (c + 2 * kv_heads * (c / heads)), ny = b * t * c;
    void *xf = NULL, *yf = NULL;
    GP_TRY(gp_dev_alloc(dev, (size_t)nx * sizeof(float), GP_MEM_ACTIVATIONS, &xf));
    gp_status st = gp_dev_alloc(dev, (size_t)ny * sizeof(float), GP_MEM_ACTIVATIONS, &yf);
    if (st == GP_OK) st = cuda_bf16_unpack(dev, xf, x, nx);
    if (st == GP_OK) st = cuda_attn_fwd(dev, xf, yf, lse, b, t, heads, kv_heads, c);
    if (st == GP_OK) st = cuda_bf16_pack(dev, y, yf, ny);
    if (yf) gp_dev_free(dev, yf, (size_t)ny * sizeof(float), GP_MEM_ACTIVATIONS);
    gp_dev_free(dev, xf, (size_t)nx * sizeof(float), GP_MEM_ACTIVATIONS);
    return st;
}

static gp_status cuda_attn_bwd_bf16(gp_device *dev, const uint16_t *x, const uint16_t *y,
                                    const float *lse, const uint16_t *dy, uint16_t *dx,
                                    int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    bool done = false;
    GP_TRY(gp_cuda_enter(dev));
    if (kv_heads == heads)
        GP_TRY(gp_cuda_sdpa_bwd_bf16(dev, x, y, lse, dy, dx, b, t, heads, c, &done));
    if (done) return GP_OK;
    int64_t nx = b * t * (c + 2 * kv_heads * (c / heads)), ny = b * t * c;
    size_t bytes = (size_t)(2 * nx + 2 * ny) * sizeof(float);
    void *buf = NULL; /* x, dx (b, t, 3c), y, dy (b, t, c), widened */
    GP_TRY(gp_dev_alloc(dev, bytes, GP_MEM_ACTIVATIONS, &buf));
    float *xf = buf, *dxf = xf + nx, *yf = dxf + nx, *dyf = yf + ny;
    gp_status st = cuda_bf16_unpack(dev, xf, x, nx);
    if (st == GP_OK) st = cuda_bf16_unpack(dev, yf, y, ny);
    if (st == GP_OK) st = cuda_bf16_unpack(dev, dyf, dy, ny);
    if (st == GP_OK) st = cuda_attn_bwd(dev, xf, yf, lse, dyf, dxf, b, t, heads, kv_heads, c);
    if (st == GP_OK) st = cuda_bf16_pack(dev, dx, dxf, nx);
    gp_dev_free(dev, buf, bytes, GP_MEM_ACTIVATIONS);
    return st;
}

static gp_status cuda_bce_logits(gp_device *dev, const float *z, const float *t, int64_t n,
                                 float scale, float *dz, double *loss_sum, int64_t *correct,
                                 int64_t *bad)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    *loss_sum = 0.0;
    *correct = 0;
    *bad = -1;
    if (n <= 0) return GP_OK;
    void *ws;
    cuda_res r;
    GP_TRY(gp_cuda_enter(dev));
    GP_TRY(gp_cuda_ws_reserve(dev, GP_CUK_RED_BLOCKS * (sizeof(double) + sizeof(long long)),
                              &ws));
    double *loss_part = ws;
    long long *idx_part = (long long *)(loss_part + GP_CUK_RED_BLOCKS);
    GP_CUDA(gp_cuk_bce(ctx->compute, z, t, n, scale, dz, loss_part, idx_part,
                       &((cuda_res *)ctx->dev_res)->bce));
    GP_TRY(read_results(ctx, &r));
    *bad = r.bce.bad;
    if (r.bce.bad < 0) {
        *loss_sum = r.bce.loss_sum;
        *correct = r.bce.correct;
    }
    return GP_OK;
}

/* ---- gemm on cuBLAS ---------------------------------------------------------------
 * cuBLAS is column-major; a row-major matrix X is the column-major X^T with
 * the same leading dimension.  Row-major C = op(A) op(B) is therefore the
 * column-major C^T = op(B)^T op(A)^T: call sgemm with the operands swapped
 * (B first), the same transpose flags, and the sizes (N, M, K).  No data
 * moves.  The math mode is CUBLAS_DEFAULT_MATH: sgemm in plain FP32, since
 * cuBLAS uses TF32 tensor cores only when asked (CUBLAS_TF32_TENSOR_OP_MATH)
 * and NVIDIA_TF32_OVERRIDE can only turn TF32 off, never on.  Precision
 * bf16, for products worth it (gp_bf16_gemm_worth): A and B are packed
 * into dense bf16 copies (leading dimension = their columns) and
 * cublasGemmEx multiplies them on bf16 tensor cores into the FP32 C with
 * FP32 sums (CUBLAS_COMPUTE_32F). */
static gp_status gemm_b(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float beta, float *c, int64_t ldc, bool b_weights)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (m == 0 || n == 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    if (k == 0) {
        GP_CUDA(gp_cuk_scale_matrix(ctx->compute, c, m, n, ldc, beta));
        return GP_OK;
    }
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return gp_error_set(GP_ERR_UNSUPPORTED,
                            "device %s: gemm of %lld x %lld x %lld exceeds cuBLAS's 32-bit sizes",
                            dev->name, (long long)m, (long long)n, (long long)k);
    if (ctx->bf16 && gp_bf16_gemm_worth(m, n, k)) {
        /* precision bf16: A and B rounded into dense bf16 copies, C in FP32
         * with FP32 sums (cuBLAS runs bf16 tensor cores) */
        int64_t ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k,
                bc = trans_b ? k : n, cnt[2] = {ar * ac, br * bc};
        uint16_t *p[2];
        const uint16_t *kept = NULL; /* B's copy for the step, where B is dense weights */
        if (b_weights && ldb == bc) GP_TRY(gp_cuda_weights_bf16(dev, b, br * bc, &kept));
        GP_TRY(gp_cuda_bf16_reserve(dev, cnt, kept ? 1 : 2, p));
        GP_CUDA(gp_cuk_bf16_pack2d(ctx->compute, p[0], a, ar, ac, lda));
        if (kept)
            p[1] = (uint16_t *)kept;
        else
            GP_CUDA(gp_cuk_bf16_pack2d(ctx->compute, p[1], b, br, bc, ldb));
        gp_cuda_nvtx_push("gemm");
        GP_CUBLAS(cublasGemmEx(ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                               p[1], CUDA_R_16BF, (int)bc, p[0], CUDA_R_16BF, (int)ac, &beta, c,
                               CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        gp_cuda_nvtx_pop();
        return GP_OK;
    }
    bool done;
    GP_TRY(gp_cuda_lt_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                           NULL, false, &done));
    if (done) return GP_OK;
    gp_cuda_nvtx_push("gemm");
    GP_CUBLAS(cublasSgemm(ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                          trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, b,
                          (int)ldb, a, (int)lda, &beta, c, (int)ldc));
    gp_cuda_nvtx_pop();
    return GP_OK;
}

static gp_status cuda_gemm(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc)
{
    return gemm_b(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, false);
}

/* gemm_wb: B is a layer's weights; under bf16 their copy kept for the step
 * (gp_cuda_weights_bf16). */
static gp_status cuda_gemm_wb(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, int64_t lda,
                              const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    return gemm_b(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, true);
}

/* linear_fwd: in FP32 and TF32 the product with the bias and relu as its
 * cuBLASLt epilogue (cuda_blas.c); in bf16, or where cuBLASLt did not run
 * it, cuda_gemm and one kernel for the bias and relu (a bias that is not
 * 16-byte aligned goes that way too: cuBLASLt's bias pointer is read in
 * vectors). */
static gp_status cuda_linear_fwd(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                 const float *x, const float *w, const float *bias, bool relu,
                                 float *y)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (n == 0 || out == 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    bool done = false;
    /* (gp_cuda_lt_gemm leaves in == 0 to cuda_gemm) */
    if (!(ctx->bf16 && gp_bf16_gemm_worth(n, out, in)) && (uintptr_t)bias % 16 == 0 &&
        n <= INT_MAX && out <= INT_MAX && in <= INT_MAX)
        GP_TRY(gp_cuda_lt_gemm(dev, 0, 1, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out, bias,
                               relu && ctx->lt_relu, &done));
    if (done) { /* an epilogue that would lose a NaN did the bias alone */
        if (relu && !ctx->lt_relu) GP_CUDA(gp_cuk_bias_relu_rows(ctx->compute, y, NULL, n, out));
        return GP_OK;
    }
    GP_TRY(cuda_gemm_wb(dev, 0, 1, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out));
    if (relu) GP_CUDA(gp_cuk_bias_relu_rows(ctx->compute, y, bias, n, out));
    else if (bias) GP_CUDA(gp_cuk_add_bias_rows(ctx->compute, y, bias, n, out));
    return GP_OK;
}

/* ---- linear layers on bf16 storage (backend.h's linear_*_bf16) ---------------------
 * Under precision bf16, products worth it (gp_bf16_gemm_worth) read the
 * bf16 activations as they are and the weights' bf16 copy (kept for the
 * step, or packed): the forward and the data gradient on cuBLASLt with a
 * bf16 result, the bias and relu in its epilogue in FP32 and one rounding
 * (within a bf16 unit of the storage adapter's way: cuBLASLt may sum in
 * another order than cublasGemmEx), or where cuBLASLt has no plan,
 * cublasGemmEx into an FP32 scratch and one kernel for the bias, relu and
 * rounding (the adapter's bits); the weight gradient with cublasGemmEx into
 * the FP32 gradient and the bias gradient over the widened dy (the
 * adapter's bits).  Products not worth bf16 widen their bf16 operands into
 * FP32 scratch and run the FP32 slots (the adapter's bits).  Compiled, not
 * run. */

/* FP32 scratch of n values (workspace; gp_dev_free orders its reuse). */
static gp_status f32_scratch(gp_device *dev, int64_t n, float **out)
{
    return gp_dev_alloc(dev, (size_t)(n > 0 ? n : 1) * sizeof(float), GP_MEM_WORKSPACE,
                        (void **)out);
}

static void f32_free(gp_device *dev, float *p, int64_t n)
{
    if (p) gp_dev_free(dev, p, (size_t)(n > 0 ? n : 1) * sizeof(float), GP_MEM_WORKSPACE);
}

/* The n weights' bf16 copy: kept for the step, else packed into the
 * operand scratch (gp_cuda_bf16_reserve). */
static gp_status weights16(gp_device *dev, const float *w, int64_t n, const uint16_t **out)
{
    GP_TRY(gp_cuda_weights_bf16(dev, w, n, out));
    if (*out) return GP_OK;
    uint16_t *p;
    GP_TRY(gp_cuda_bf16_reserve(dev, &n, 1, &p));
    GP_CUDA(gp_cuk_bf16_pack(gp_cuda_ctx_of(dev)->compute, p, w, n));
    *out = p;
    return GP_OK;
}

/* Row-major C(m, n) (FP32, dense) = A(m, k) op(B) with bf16 A (dense) and
 * bf16 B (out, in) dense: op(B) = B^T (trans_b) or B, on cublasGemmEx. */
static gp_status gemm_ex16(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b,
                           int64_t ldb, float beta, float *c, int64_t ldc)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    const float one = 1.0f;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return gp_error_set(GP_ERR_UNSUPPORTED,
                            "device %s: gemm of %lld x %lld x %lld exceeds cuBLAS's 32-bit sizes",
                            dev->name, (long long)m, (long long)n, (long long)k);
    gp_cuda_nvtx_push("gemm");
    cublasStatus_t cublas_gemm_ex =
        cublasGemmEx(ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, b,
                     CUDA_R_16BF, (int)ldb, a, CUDA_R_16BF, (int)lda, &beta, c, CUDA_R_32F,
                     (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    gp_cuda_nvtx_pop(); /* closed on a failure too */
    GP_CUBLAS(cublas_gemm_ex);
    return GP_OK;
}

/* bf16 C(m, n) = bits(relu(A op(B) + bias)) (bias NULL: none; relu false:
 * none) through an FP32 scratch: gemm_ex16, then one kernel for the bias,
 * relu and rounding (the adapter's bits, where cuBLASLt had no plan). */
static gp_status gemm_ex16_round(gp_device *dev, int trans_b, int64_t m, int64_t n, int64_t k,
                                 const uint16_t *a, const uint16_t *b, int64_t ldb,
                                 const float *bias, bool relu, uint16_t *c)
{
    float *f = NULL;
    GP_TRY(f32_scratch(dev, m * n, &f));
    gp_status st = gemm_ex16(dev, 0, trans_b, m, n, k, a, k, b, ldb, 0.0f, f, n);
    if (st == GP_OK) {
        cudaStream_t s = gp_cuda_ctx_of(dev)->compute;
        cudaError_t e = gp_cuk_bias_relu_pack(s, f, bias, relu, c, m, n);
        if (e != cudaSuccess)
            st = gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e), "gp_cuk_bias_relu_pack",
                              __func__, __FILE__, __LINE__);
    }
    f32_free(dev, f, m * n);
    return st;
}

static gp_status cuda_linear_fwd_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                      const uint16_t *x, const float *w, const float *bias,
                                      bool relu, uint16_t *y)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (n == 0 || out == 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    if (!gp_bf16_gemm_worth(n, out, in)) { /* FP32: the adapter's way */
        float *f = NULL, *fx = NULL;
        gp_status st = f32_scratch(dev, n * in, &fx);
        if (st == GP_OK) st = f32_scratch(dev, n * out, &f);
        if (st == GP_OK) st = gp_dev_bf16_unpack(dev, fx, x, n * in);
        if (st == GP_OK) st = cuda_linear_fwd(dev, n, out, in, fx, w, bias, relu, f);
        if (st == GP_OK) st = gp_dev_bf16_pack(dev, y, f, n * out);
        f32_free(dev, fx, n * in);
        f32_free(dev, f, n * out);
        return st;
    }
    const uint16_t *w16;
    GP_TRY(weights16(dev, w, out * in, &w16));
    bool done = false;
    if ((uintptr_t)bias % 16 == 0)
        GP_TRY(gp_cuda_lt_gemm_io(dev, GP_LT_ABC16, 0, 1, n, out, in, 1.0f, x, in, w16, in, 0.0f,
                                  y, out, bias, relu && ctx->lt_relu, &done));
    if (done) { /* an epilogue that would lose a NaN did the bias alone */
        if (relu && !ctx->lt_relu)
            GP_CUDA(gp_cuk_act_bf16(ctx->compute, GP_ACT_RELU, y, NULL, y, n * out, 0.0f));
        return GP_OK;
    }
    return gemm_ex16_round(dev, 1, n, out, in, x, w16, in, bias, relu, y);
}

/* dx(n, in) = dy(n, out) W(out, in) */
static gp_status cuda_linear_bwd_data_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                           const uint16_t *dy, const float *w, uint16_t *dx)
{
    if (n == 0 || in == 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    if (!gp_bf16_gemm_worth(n, in, out)) { /* FP32: the adapter's way */
        float *f = NULL, *fdy = NULL;
        gp_status st = f32_scratch(dev, n * out, &fdy);
        if (st == GP_OK) st = f32_scratch(dev, n * in, &f);
        if (st == GP_OK) st = gp_dev_bf16_unpack(dev, fdy, dy, n * out);
        if (st == GP_OK) st = cuda_gemm_wb(dev, 0, 0, n, in, out, 1.0f, fdy, out, w, in, 0.0f, f, in);
        if (st == GP_OK) st = gp_dev_bf16_pack(dev, dx, f, n * in);
        f32_free(dev, fdy, n * out);
        f32_free(dev, f, n * in);
        return st;
    }
    const uint16_t *w16;
    GP_TRY(weights16(dev, w, out * in, &w16));
    bool done = false;
    GP_TRY(gp_cuda_lt_gemm_io(dev, GP_LT_ABC16, 0, 0, n, in, out, 1.0f, dy, out, w16, in, 0.0f,
                              dx, in, NULL, false, &done));
    if (done) return GP_OK;
    return gemm_ex16_round(dev, 0, n, in, out, dy, w16, in, NULL, false, dx);
}

/* linear_gelu_fwd (backend.h): the product with cuBLASLt's GELU_AUX(_BIAS)
 * epilogue (y the GELU, pre the product and bias), where it has a plan;
 * else the linear layer's slot into pre and the GELU kernel into y.
 * Compiled, not run. */
static gp_status cuda_linear_gelu_fwd(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                      int64_t in, const void *x, const float *w,
                                      const float *bias, void *pre, void *y)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (n == 0 || out == 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    bool done = false, fits = n <= INT_MAX && out <= INT_MAX && in <= INT_MAX &&
                             (uintptr_t)bias % 16 == 0;
    if (dt == GP_BF16 && fits && gp_bf16_gemm_worth(n, out, in)) {
        const uint16_t *w16;
        GP_TRY(weights16(dev, w, out * in, &w16));
        GP_TRY(gp_cuda_lt_gemm_gelu(dev, GP_LT_ABC16, false, 0, 1, n, out, in, x, in, w16, in,
                                    y, out, bias, pre, &done));
    } else if (dt == GP_F32 && fits && !(ctx->bf16 && gp_bf16_gemm_worth(n, out, in))) {
        GP_TRY(gp_cuda_lt_gemm_gelu(dev, GP_LT_F32, false, 0, 1, n, out, in, x, in, w, in, y,
                                    out, bias, pre, &done));
    }
    if (done) return GP_OK;
    if (dt == GP_BF16) {
        GP_TRY(cuda_linear_fwd_bf16(dev, n, out, in, x, w, bias, false, pre));
        return cuda_act_bf16(dev, GP_ACT_GELU, pre, NULL, y, n * out, 0.0f);
    }
    GP_TRY(cuda_linear_fwd(dev, n, out, in, x, w, bias, false, pre));
    return cuda_gelu_fwd(dev, pre, y, n * out);
}

/* linear_gelu_bwd_data (backend.h): dx = (dy w) GELU'(pre) with cuBLASLt's
 * DGELU epilogue where it has a plan; else the product's dx and the GELU
 * backward kernel over it in place.  Compiled, not run. */
static gp_status cuda_linear_gelu_bwd_data(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                           int64_t in, const void *dy, const float *w,
                                           const void *pre, void *dx)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (n == 0 || in == 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    bool done = false, fits = n <= INT_MAX && out <= INT_MAX && in <= INT_MAX;
    if (dt == GP_BF16 && fits && gp_bf16_gemm_worth(n, in, out)) {
        const uint16_t *w16;
        GP_TRY(weights16(dev, w, out * in, &w16));
        GP_TRY(gp_cuda_lt_gemm_gelu(dev, GP_LT_ABC16, true, 0, 0, n, in, out, dy, out, w16, in,
                                    dx, in, NULL, pre, &done));
    } else if (dt == GP_F32 && fits && !(ctx->bf16 && gp_bf16_gemm_worth(n, in, out))) {
        GP_TRY(gp_cuda_lt_gemm_gelu(dev, GP_LT_F32, true, 0, 0, n, in, out, dy, out, w, in, dx,
                                    in, NULL, pre, &done));
    }
    if (done) return GP_OK;
    if (dt == GP_BF16) {
        GP_TRY(cuda_linear_bwd_data_bf16(dev, n, out, in, dy, w, dx));
        return cuda_act_bf16(dev, GP_ACT_GELU, pre, dx, dx, n * in, 0.0f);
    }
    GP_TRY(cuda_gemm_wb(dev, 0, 0, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in));
    return cuda_gelu_bwd(dev, pre, dx, dx, n * in);
}

/* dW(out, in) (fresh: =, else +=) dy^T(out, n) x(n, in); db likewise the
 * column sums of dy (db NULL: no bias); dy and x of element type dt. */
static gp_status cuda_linear_bwd_weights(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                         int64_t in, const void *dy, const void *x, float *dw,
                                         float *db, bool fresh)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (out == 0) return GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    if (n == 0) {
        if (fresh) GP_CUDA(gp_cuk_fill(ctx->compute, dw, 0.0f, out * in));
        if (fresh && db) GP_CUDA(gp_cuk_fill(ctx->compute, db, 0.0f, out));
        return GP_OK;
    }
    if (dt == GP_F32) {
        GP_TRY(cuda_gemm(dev, 1, 0, out, in, n, 1.0f, dy, out, x, in, fresh ? 0.0f : 1.0f, dw,
                         in));
        return db ? sum_rows(dev, dy, db, n, out, fresh) : GP_OK; /* (fresh: no fill) */
    }
    if (gp_bf16_gemm_worth(out, in, n)) {
        GP_TRY(gemm_ex16(dev, 1, 0, out, in, n, dy, out, x, in, fresh ? 0.0f : 1.0f, dw, in));
    } else { /* FP32: the adapter's way */
        float *fdy = NULL, *fx = NULL;
        gp_status st = f32_scratch(dev, n * out, &fdy);
        if (st == GP_OK) st = f32_scratch(dev, n * in, &fx);
        if (st == GP_OK) st = gp_dev_bf16_unpack(dev, fdy, dy, n * out);
        if (st == GP_OK) st = gp_dev_bf16_unpack(dev, fx, x, n * in);
        if (st == GP_OK)
            st = cuda_gemm(dev, 1, 0, out, in, n, 1.0f, fdy, out, fx, in, fresh ? 0.0f : 1.0f, dw,
                           in);
        f32_free(dev, fdy, n * out);
        f32_free(dev, fx, n * in);
        GP_TRY(st);
    }
    if (!db) return GP_OK;
    void *part; /* fresh: the sums written over db, with no fill before */
    GP_TRY(gp_cuda_ws_reserve(dev, (size_t)gp_cuk_sum_rows_parts(n, out) * (size_t)out *
                                       sizeof(double), &part));
    GP_CUDA(gp_cuk_sum_rows_bf16(ctx->compute, dy, db, n, out, part, fresh));
    return GP_OK;
}

/* ---- NCCL collectives -------------------------------------------------------------- */

/* The communicators are nonblocking (ncclConfig_t.blocking = 0): an NCCL
 * call returns at once, ncclInProgress while NCCL's own threads finish it
 * (the first collective of a rank connects to its peers, which since NCCL
 * 2.22 waits for every rank to arrive), and comm_settle polls
 * ncclCommGetAsyncError until it is done.  `lock` guards comms and aborted
 * and is held only around calls that return at once, never while a rank
 * waits for its peers: a rank that blocked in NCCL holding a lock every
 * rank takes would keep the others from ever arriving.  So a rank whose
 * peers never come (one of them failed) polls without the lock until the
 * failed rank's abort, which takes the lock, ends every communicator
 * (ncclCommAbort also ends kernels still running on the GPUs, so a rank
 * waiting in a synchronize comes back) and makes the pollers return
 * GP_ERR_CANCELLED; reset then makes new communicators.  One thread
 * creates, aborts and destroys all ranks, each inside one
 * ncclGroupStart / ncclGroupEnd.  Compiled, not run: no GPU here. */
typedef struct cuda_comm {
    ncclComm_t *comms;    /* (n) one per rank; NULL after an abort */
    int *ordinals;        /* (n) the ranks' GPUs, to make them again */
    pthread_mutex_t lock; /* guards comms and aborted */
    bool aborted;
} cuda_comm;

/* An NCCL call on a nonblocking communicator: ncclInProgress is no error. */
static gp_status nccl_issued(ncclResult_t r, const char *call, const char *func, int line)
{
    if (r == ncclSuccess || r == ncclInProgress) return GP_OK;
    return gp_cuda_fail("NCCL", (int)r, ncclGetErrorString(r), call, func, __FILE__, line);
}
#define NCCL_ISSUE(var, call)                                                   \
    do {                                                                        \
        gp_status nccl_st_ = nccl_issued((call), #call, __func__, __LINE__);    \
        if (var == GP_OK) var = nccl_st_;                                       \
    } while (0)

/* The state of the last call on a nonblocking communicator: ncclSuccess,
 * ncclInProgress, or its error (a failed query is its own error). */
static ncclResult_t comm_state(ncclComm_t c)
{
    ncclResult_t state = ncclSuccess, q = ncclCommGetAsyncError(c, &state);
    return q != ncclSuccess ? q : state;
}

/* Between two polls: yield at first, then sleep 50 us. */
static void poll_backoff(unsigned spin)
{
    if (spin < 1000) sched_yield();
    else nanosleep(&(struct timespec){0, 50 * 1000}, NULL);
}

/* Waits (without the lock held between polls) until the last call on rank
 * r's communicator is done: its result, or GP_ERR_CANCELLED once aborted. */
static gp_status comm_settle(gp_comm *comm, int r)
{
    cuda_comm *cc = comm->ctx;
    for (unsigned spin = 0;; spin++) {
        pthread_mutex_lock(&cc->lock);
        bool aborted = cc->aborted;
        ncclResult_t state = aborted ? ncclSuccess : comm_state(cc->comms[r]);
        pthread_mutex_unlock(&cc->lock);
        if (aborted)
            return gp_error_set(GP_ERR_CANCELLED, "collective cancelled: another rank failed");
        if (state == ncclSuccess) return GP_OK;
        if (state != ncclInProgress)
            return gp_cuda_fail("NCCL", (int)state, ncclGetErrorString(state),
                                "ncclCommGetAsyncError(comm, &state)", __func__, __FILE__,
                                __LINE__);
        poll_backoff(spin);
    }
}

/* Every rank's communicator ended, in one group (the lock held, or the
 * comm not shared yet). */
static void comm_abort_all(cuda_comm *cc, int n)
{
    (void)ncclGroupStart();
    for (int r = 0; r < n; r++)
        if (cc->comms[r]) (void)ncclCommAbort(cc->comms[r]);
    (void)ncclGroupEnd();
    for (int r = 0; r < n; r++) cc->comms[r] = NULL;
}

/* New nonblocking communicators for the n ranks on GPUs `ordinals`, made
 * in one group and settled; the lock must be held or the comm unshared. */
static gp_status comm_init(cuda_comm *cc, int n)
{
    ncclUniqueId id;
    gp_status st = GP_OK, e = GP_OK;
    GP_NCCL(ncclGetUniqueId(&id));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    int cur = 0;
    GP_CUDA(cudaGetDevice(&cur));
    NCCL_ISSUE(st, ncclGroupStart());
    for (int r = 0; r < n && st == GP_OK; r++) {
        cudaError_t ce = cudaSetDevice(cc->ordinals[r]);
        if (ce != cudaSuccess)
            st = gp_cuda_fail("CUDA", (int)ce, cudaGetErrorString(ce),
                              "cudaSetDevice(cc->ordinals[r])", __func__, __FILE__, __LINE__);
        else NCCL_ISSUE(st, ncclCommInitRankConfig(&cc->comms[r], n, id, r, &cfg));
    }
    NCCL_ISSUE(e, ncclGroupEnd()); /* ended even after a failed call */
    (void)cudaSetDevice(cur);
    if (st == GP_OK) st = e;
    /* settle each rank: no other thread uses these yet */
    for (int r = 0; r < n && st == GP_OK; r++) {
        ncclResult_t state;
        for (unsigned spin = 0; (state = comm_state(cc->comms[r])) == ncclInProgress; spin++)
            poll_backoff(spin);
        if (state != ncclSuccess)
            st = gp_cuda_fail("NCCL", (int)state, ncclGetErrorString(state),
                              "ncclCommInitRankConfig(...) (settled)", __func__, __FILE__,
                              __LINE__);
    }
    if (st != GP_OK) comm_abort_all(cc, n); /* whatever was made goes */
    return st;
}

static void cuda_comm_destroy(gp_comm *comm)
{
    cuda_comm *cc = comm->ctx;
    if (cc) {
        if (cc->comms) {
            /* flush what was issued, then free: each in one group */
            bool live = false;
            for (int r = 0; r < comm->n; r++) live = live || cc->comms[r];
            if (live) {
                (void)ncclGroupStart();
                for (int r = 0; r < comm->n; r++)
                    if (cc->comms[r]) (void)ncclCommFinalize(cc->comms[r]);
                (void)ncclGroupEnd();
                bool ok = true;
                for (int r = 0; r < comm->n && ok; r++)
                    if (cc->comms[r]) ok = comm_settle(comm, r) == GP_OK;
                if (ok) {
                    (void)ncclGroupStart();
                    for (int r = 0; r < comm->n; r++)
                        if (cc->comms[r]) (void)ncclCommDestroy(cc->comms[r]);
                    (void)ncclGroupEnd();
                    for (int r = 0; r < comm->n; r++) cc->comms[r] = NULL;
                } else {
                    gp_error_clear();
                    comm_abort_all(cc, comm->n);
                }
            }
        }
        free(cc->comms);
        free(cc->ordinals);
        pthread_mutex_destroy(&cc->lock);
        free(cc);
    }
    free(comm->devs);
    free(comm);
}

static void cuda_comm_abort(gp_comm *comm)
{
    cuda_comm *cc = comm->ctx;
    pthread_mutex_lock(&cc->lock);
    if (!cc->aborted) comm_abort_all(cc, comm->n);
    cc->aborted = true;
    pthread_mutex_unlock(&cc->lock);
}

static void cuda_comm_reset(gp_comm *comm)
{
    cuda_comm *cc = comm->ctx;
    pthread_mutex_lock(&cc->lock);
    /* A failed re-init leaves the comm aborted: its collectives then say so. */
    if (cc->aborted) {
        if (comm_init(cc, comm->n) == GP_OK) cc->aborted = false;
        else gp_error_clear();
    }
    pthread_mutex_unlock(&cc->lock);
}

gp_status gp_cuda_comm_create(gp_device **devs, int n, gp_comm **out)
{
    gp_status st = GP_OK;
    *out = NULL;
    int *list = calloc((size_t)n, sizeof *list);
    gp_comm *comm = calloc(1, sizeof *comm);
    cuda_comm *cc = calloc(1, sizeof *cc);
    if (cc) pthread_mutex_init(&cc->lock, NULL);
    if (comm) comm->destroy = cuda_comm_destroy;
    if (comm && cc) {
        comm->ctx = cc;
        comm->n = n;
        comm->abort = cuda_comm_abort;
        comm->reset = cuda_comm_reset;
        comm->devs = calloc((size_t)n, sizeof *comm->devs);
        cc->comms = calloc((size_t)n, sizeof *cc->comms);
    }
    if (!list || !comm || !cc || !comm->devs || !cc->comms) {
        if (cc) {
            free(cc->comms);
            pthread_mutex_destroy(&cc->lock);
        }
        free(cc);
        if (comm) comm->ctx = NULL;
        st = gp_error_set(GP_ERR_OOM, "out of host memory creating a communicator");
        goto fail;
    }
    for (int r = 0; r < n; r++) {
        if (devs[r]->kind != GP_DEV_CUDA) {
            st = gp_error_set(GP_ERR_INVALID, "NCCL communicator: %s is not a CUDA device",
                              devs[r]->name);
            goto fail;
        }
        list[r] = gp_cuda_ctx_of(devs[r])->ordinal;
        for (int q = 0; q < r; q++)
            if (list[q] == list[r]) {
                st = gp_error_set(GP_ERR_INVALID,
                                  "NCCL communicator: %s appears twice; a group needs distinct "
                                  "GPUs", devs[r]->name);
                goto fail;
            }
        comm->devs[r] = devs[r];
    }
    cc->ordinals = list; /* reset makes the communicators again from it */
    list = NULL;
    st = comm_init(cc, n);
    if (st != GP_OK) goto fail;
    *out = comm;
    return GP_OK;
fail:
    free(list);
    if (comm) cuda_comm_destroy(comm);
    return st;
}

static gp_status comm_rank(gp_device *dev, gp_comm *comm, int *rank)
{
    if (!comm || comm->destroy != cuda_comm_destroy)
        return gp_error_set(GP_ERR_INVALID, "device %s: not an NCCL communicator", dev->name);
    for (int r = 0; r < comm->n; r++)
        if (comm->devs[r] == dev) {
            *rank = r;
            return GP_OK;
        }
    return gp_error_set(GP_ERR_INVALID, "device %s is not in this communicator", dev->name);
}

/* The rank of dev and its NCCL communicator, with the comm's lock held
 * (released by comm_leave, right after the calls that return at once) so
 * that an abort cannot free it meanwhile; GP_ERR_CANCELLED after an
 * abort. */
static gp_status comm_enter(gp_device *dev, gp_comm *comm, int *rank, ncclComm_t *nc)
{
    GP_TRY(comm_rank(dev, comm, rank));
    GP_TRY(gp_cuda_enter(dev));
    cuda_comm *cc = comm->ctx;
    pthread_mutex_lock(&cc->lock);
    if (cc->aborted) {
        pthread_mutex_unlock(&cc->lock);
        return gp_error_set(GP_ERR_CANCELLED, "collective cancelled: another rank failed");
    }
    *nc = cc->comms[*rank];
    return GP_OK;
}

/* Unlock, then wait for rank r's call to be done (s: how issuing went). */
static gp_status comm_leave(gp_comm *comm, int r, gp_status s)
{
    pthread_mutex_unlock(&((cuda_comm *)comm->ctx)->lock);
    return s == GP_OK ? comm_settle(comm, r) : s;
}

static gp_status cuda_allreduce(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    int r = 0;
    ncclComm_t nc;
    GP_TRY(comm_enter(dev, comm, &r, &nc));
    gp_cuda_nvtx_push("allreduce");
    gp_status s = GP_OK;
    NCCL_ISSUE(s, ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, nc,
                                gp_cuda_ctx_of(dev)->compute));
    gp_cuda_nvtx_pop();
    return comm_leave(comm, r, s);
}

static gp_status cuda_broadcast(gp_device *dev, gp_comm *comm, float *buf, int64_t n, int root)
{
    int r = 0;
    ncclComm_t nc;
    if (root < 0 || root >= comm->n)
        return gp_error_set(GP_ERR_INVALID, "broadcast root %d outside the group of %d", root,
                            comm->n);
    GP_TRY(comm_enter(dev, comm, &r, &nc));
    gp_cuda_nvtx_push("broadcast");
    gp_status s = GP_OK;
    NCCL_ISSUE(s, ncclBroadcast(buf, buf, (size_t)n, ncclFloat, root, nc,
                                gp_cuda_ctx_of(dev)->compute));
    gp_cuda_nvtx_pop();
    return comm_leave(comm, r, s);
}

/* The sharded collectives (backend.h), in place with gp_comm_chunk's uneven
 * chunks: NCCL's own ncclReduceScatter / ncclAllGather need equal counts and
 * separate buffers, so each is a group of one ncclReduce / ncclBroadcast per
 * chunk, rooted at the chunk's owner; every rank issues the same group. */
static gp_status cuda_chunked(gp_device *dev, gp_comm *comm, float *buf, int64_t n, bool reduce)
{
    int r = 0;
    ncclComm_t nc;
    GP_TRY(comm_enter(dev, comm, &r, &nc));
    gp_cuda_nvtx_push(reduce ? "reduce_scatter" : "all_gather");
    cudaStream_t st = gp_cuda_ctx_of(dev)->compute;
    gp_status s = GP_OK, e = GP_OK;
    NCCL_ISSUE(s, ncclGroupStart());
    if (s == GP_OK) {
        for (int q = 0; q < comm->n && s == GP_OK; q++) {
            int64_t lo, hi;
            gp_comm_chunk(n, comm->n, q, &lo, &hi);
            if (hi <= lo) continue; /* the same on every rank */
            if (reduce)
                NCCL_ISSUE(s, ncclReduce(buf + lo, buf + lo, (size_t)(hi - lo), ncclFloat,
                                         ncclSum, q, nc, st));
            else
                NCCL_ISSUE(s, ncclBroadcast(buf + lo, buf + lo, (size_t)(hi - lo), ncclFloat, q,
                                            nc, st));
        }
        /* End the group even after a failed call, so NCCL's state stays sane. */
        NCCL_ISSUE(e, ncclGroupEnd());
    }
    gp_cuda_nvtx_pop();
    return comm_leave(comm, r, s != GP_OK ? s : e);
}

static gp_status cuda_reduce_scatter(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    return cuda_chunked(dev, comm, buf, n, true);
}

static gp_status cuda_all_gather(gp_device *dev, gp_comm *comm, float *buf, int64_t n)
{
    return cuda_chunked(dev, comm, buf, n, false);
}

/* ---- lifetime -------------------------------------------------------------------- */

static void cuda_destroy(gp_device *dev)
{
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    if (ctx) {
        (void)cudaSetDevice(ctx->ordinal);
        if (ctx->compute) (void)cudaStreamSynchronize(ctx->compute);
        if (ctx->copy) (void)cudaStreamSynchronize(ctx->copy);
        gp_cuda_dnn_destroy(ctx);
        gp_cuda_lt_destroy(ctx);
        gp_cuda_sdpa_destroy(ctx);
        gp_dev_free(dev, ctx->ws, ctx->ws_bytes, GP_MEM_WORKSPACE);
        gp_dev_free(dev, ctx->bws, ctx->bws_bytes, GP_MEM_WORKSPACE);
        gp_dev_free(dev, ctx->dev_res, sizeof(cuda_res), GP_MEM_WORKSPACE);
        free_deferred(dev);
        free(ctx->deferred);
        free(ctx->deferred_bytes);
        cache_release(ctx);
        while (ctx->spare) {
            cuda_block *b = ctx->spare;
            ctx->spare = b->next;
            (void)cudaEventDestroy(b->done_compute);
            (void)cudaEventDestroy(b->done_copy);
            free(b);
        }
        for (int k = 0; k < 2; k++) {
            if (ctx->stage[k]) (void)cudaFreeHost(ctx->stage[k]);
            if (ctx->stage_done[k]) (void)cudaEventDestroy(ctx->stage_done[k]);
        }
        if (ctx->host_res) (void)cudaFreeHost(ctx->host_res);
        for (int s = 0; s < CUDA_MAX_DEVICES; s++)
            if (ctx->peer_ev[s]) (void)cudaEventDestroy(ctx->peer_ev[s]);
        if (ctx->dnn) (void)cudnnDestroy(ctx->dnn);
        if (ctx->blas) (void)cublasDestroy(ctx->blas);
        for (int q = 0; q < ctx->cap_marks; q++) (void)cudaEventDestroy(ctx->marks[q]);
        free(ctx->marks);
        if (ctx->anchor) (void)cudaEventDestroy(ctx->anchor);
        if (ctx->fence_compute) (void)cudaEventDestroy(ctx->fence_compute);
        if (ctx->fence_copy) (void)cudaEventDestroy(ctx->fence_copy);
        if (ctx->compute) (void)cudaStreamDestroy(ctx->compute);
        if (ctx->copy) (void)cudaStreamDestroy(ctx->copy);
        if (ctx->device_bytes)
            GP_DEBUG("device %s closed with %zu bytes of blocks still allocated", dev->name,
                     ctx->device_bytes);
        pthread_mutex_destroy(&ctx->lock);
        free(ctx);
    }
}

/* ---- channels to another process's GPU (backend.h, chan_open) ------------- */

/* One flow between two processes: a communicator of the two ranks (NCCL
 * forbids two ranks of one communicator on one GPU: the executor stages
 * through host memory for those) and a stream of its own, so that a
 * receive waiting for its peer holds back no other flow and no upload.
 * Compiled, not run: no session has had two GPUs in two processes. */
typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t tail;               /* before a receive: the compute stream's work so far */
    int peer;
} cuda_chan;

static gp_status cuda_event_query(gp_device *dev, void *ev, bool *done)
{
    GP_TRY(gp_cuda_enter(dev));
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not an error: clear it */
        return GP_OK;
    }
    return e == cudaSuccess ? GP_OK
                            : gp_cuda_fail("CUDA", (int)e, cudaGetErrorString(e),
                                           "cudaEventQuery(ev)", __func__, __FILE__, __LINE__);
}

static gp_status cuda_uid(gp_device *dev, char *buf, size_t len)
{
    GP_CUDA(cudaDeviceGetPCIBusId(buf, (int)(len < INT_MAX ? len : INT_MAX),
                                  gp_cuda_ctx_of(dev)->ordinal));
    return GP_OK;
}

static gp_status cuda_chan_id(gp_device *dev, void *id, size_t *bytes)
{
    _Static_assert(sizeof(ncclUniqueId) <= GP_CHAN_ID_BYTES, "GP_CHAN_ID_BYTES too small");
    (void)dev;
    ncclUniqueId u;
    GP_NCCL(ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
    *bytes = sizeof u;
    return GP_OK;
}

static void chan_free(cuda_chan *ch, bool abort)
{
    if (ch->comm) {
        if (abort) (void)ncclCommAbort(ch->comm);
        else {
            (void)ncclCommFinalize(ch->comm); /* its operations end first */
            (void)ncclCommDestroy(ch->comm);
        }
    }
    if (ch->stream) (void)cudaStreamDestroy(ch->stream);
    if (ch->tail) (void)cudaEventDestroy(ch->tail);
    free(ch);
}

static gp_status cuda_chan_open(gp_device *dev, const gp_chan_desc *d, void **out)
{
    *out = NULL;
    if (d->id_bytes != sizeof(ncclUniqueId))
        return gp_error_set(GP_ERR_INVALID, "device %s, channel %s: an id of %zu bytes, not "
                            "NCCL's %zu", dev->name, d->name, d->id_bytes, sizeof(ncclUniqueId));
    GP_TRY(gp_cuda_enter(dev));
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    cuda_chan *ch = calloc(1, sizeof *ch);
    if (!ch) return gp_error_set(GP_ERR_OOM, "out of host memory for a channel");
    gp_status st = GP_OK;
    void *probe = NULL;
    GP_CUDA_GO(cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking));
    GP_CUDA_GO(cudaEventCreateWithFlags(&ch->tail, cudaEventDisableTiming));
    ncclUniqueId u;
    memcpy(&u, d->id, sizeof u);
    /* the sender is rank 0; blocks until the peer joins */
    GP_NCCL_GO(ncclCommInitRank(&ch->comm, 2, u, d->sender ? 0 : 1));
    ch->peer = d->sender ? 1 : 0;
    /* NCCL connects a pair on its first send / receive, and that blocks
     * the calling thread until the peer gets there too: first uses in
     * the schedule's order would wait across flows.  So one float goes
     * over now, while every process opens its channels in one order. */
    GP_CUDA_GO(cudaMalloc(&probe, sizeof(float)));
    GP_CUDA_GO(cudaMemsetAsync(probe, 0, sizeof(float), ch->stream));
    if (d->sender) GP_NCCL_GO(ncclSend(probe, 1, ncclFloat, ch->peer, ch->comm, ch->stream));
    else GP_NCCL_GO(ncclRecv(probe, 1, ncclFloat, ch->peer, ch->comm, ch->stream));
    GP_CUDA_GO(cudaStreamSynchronize(ch->stream));
    GP_CUDA_GO(cudaFree(probe));
    probe = NULL;
    ctx->chans_open++;
    *out = ch;
    return GP_OK;
fail:
    if (probe) (void)cudaFree(probe);
    chan_free(ch, true);
    return gp_error_wrap(st, "device %s, channel %s", dev->name, d->name);
}

/* Behind `after` (the producer's event) on the channel's stream, `done`
 * recorded behind it: the caller keeps buf until done (backend.h), so no
 * free waits for a peer. */
static gp_status cuda_chan_send(gp_device *dev, void *chp, const float *buf, int64_t n,
                                void *after, void *done)
{
    cuda_chan *ch = chp;
    gp_status st = GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    gp_cuda_nvtx_push("chan_send");
    if (after) GP_CUDA_GO(cudaStreamWaitEvent(ch->stream, (cudaEvent_t)after, 0));
    GP_NCCL_GO(ncclSend(buf, (size_t)n, ncclFloat, ch->peer, ch->comm, ch->stream));
    if (done) GP_CUDA_GO(cudaEventRecord((cudaEvent_t)done, ch->stream));
fail:
    gp_cuda_nvtx_pop();
    return st;
}

/* buf is a block just allocated: the allocator made the compute stream
 * wait for the block's last users on both streams, so the channel's stream
 * waits for the compute stream's work so far, then receives and records
 * `done`, which the reader waits for.  Not for the copy stream's: nothing
 * there waits for a peer, and nothing here needs to. */
static gp_status cuda_chan_recv(gp_device *dev, void *chp, float *buf, int64_t n, void *done)
{
    cuda_chan *ch = chp;
    gp_cuda_ctx *ctx = gp_cuda_ctx_of(dev);
    gp_status st = GP_OK;
    GP_TRY(gp_cuda_enter(dev));
    gp_cuda_nvtx_push("chan_recv");
    GP_CUDA_GO(cudaEventRecord(ch->tail, ctx->compute));
    GP_CUDA_GO(cudaStreamWaitEvent(ch->stream, ch->tail, 0));
    GP_NCCL_GO(ncclRecv(buf, (size_t)n, ncclFloat, ch->peer, ch->comm, ch->stream));
    if (done) GP_CUDA_GO(cudaEventRecord((cudaEvent_t)done, ch->stream));
fail:
    gp_cuda_nvtx_pop();
    return st;
}

static void cuda_chan_close(gp_device *dev, void *chp, bool abort)
{
    if (gp_cuda_enter(dev) != GP_OK) gp_error_clear();
    chan_free(chp, abort);
    gp_cuda_ctx_of(dev)->chans_open--;
}

static const gp_device_iface cuda_iface = {
    .version = GP_DEVICE_IFACE_VERSION,
    .backend_name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .bind_thread = cuda_bind_thread,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .copy_d2d = cuda_copy_d2d,
    .copy_peer = cuda_copy_peer,
    .synchronize = cuda_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_sync = cuda_event_sync,
    .fill = cuda_fill,
    .scale = cuda_scale,
    .axpy = cuda_axpy,
    .add = cuda_add,
    .sumsq = cuda_sumsq,
    .nonfinite = cuda_nonfinite,
    .sgd_update = cuda_sgd_update,
    .sgd_multi = cuda_sgd_multi,
    .adam_multi = cuda_adam_multi,
    .sumsq_multi = cuda_sumsq_multi,
    .norm_leaky_bwd = cuda_norm_leaky_bwd,
    .dropout_apply = cuda_dropout_apply,
    .bf16_pack = cuda_bf16_pack,
    .bf16_unpack = cuda_bf16_unpack,
    .gemm = cuda_gemm,
    .gemm_wb = cuda_gemm_wb,
    .act_bf16 = cuda_act_bf16,
    .add_bf16 = cuda_add_bf16,
    .norm_leaky_bwd_bf16 = cuda_norm_leaky_bwd_bf16,
    .upsample_fwd_bf16 = cuda_upsample_fwd_bf16,
    .upsample_bwd_bf16 = cuda_upsample_bwd_bf16,
    .linear_fwd_bf16 = cuda_linear_fwd_bf16,
    .linear_bwd_data_bf16 = cuda_linear_bwd_data_bf16,
    .linear_bwd_weights = cuda_linear_bwd_weights,
    .add_layer_norm_fwd = cuda_add_layer_norm_fwd,
    .layer_norm_bwd_data_add = cuda_layer_norm_bwd_data_add,
    .linear_gelu_fwd = cuda_linear_gelu_fwd,
    .linear_gelu_bwd_data = cuda_linear_gelu_bwd_data,
    .rms_norm_fwd = cuda_rms_norm_fwd,
    .rms_norm_bwd_data = cuda_rms_norm_bwd_data,
    .rms_norm_bwd_weights = cuda_rms_norm_bwd_weights,
    .swiglu_fwd = cuda_swiglu_fwd,
    .swiglu_bwd = cuda_swiglu_bwd,
    .rope = cuda_rope,
    .attn_cached = cuda_attn_cached,
    .pool_fwd_bf16 = gp_cuda_pool_fwd_bf16,
    .pool_bwd_bf16 = gp_cuda_pool_bwd_bf16,
    .dropout_apply_bf16 = cuda_dropout_apply_bf16,
    .mul_rows_bf16 = cuda_mul_rows_bf16,
    .bn_fwd_train_bf16 = gp_cuda_bn_fwd_train_bf16,
    .bn_fwd_infer_bf16 = gp_cuda_bn_fwd_infer_bf16,
    .bn_bwd_bf16 = gp_cuda_bn_bwd_bf16,
    .conv_fwd_bf16 = gp_cuda_conv_fwd_bf16,
    .conv_bwd_data_bf16 = gp_cuda_conv_bwd_data_bf16,
    .conv_bwd_weights_bf16 = gp_cuda_conv_bwd_weights_bf16,
    .xent_bf16 = cuda_xent_bf16,
    .layer_norm_fwd_bf16 = cuda_layer_norm_fwd_bf16,
    .layer_norm_bwd_data_bf16 = cuda_layer_norm_bwd_data_bf16,
    .layer_norm_bwd_weights_bf16 = cuda_layer_norm_bwd_weights_bf16,
    .attn_fwd_bf16 = cuda_attn_fwd_bf16,
    .attn_bwd_bf16 = cuda_attn_bwd_bf16,
    .act_bf16_kinds = 1u << GP_ACT_RELU | 1u << GP_ACT_LEAKY_RELU | 1u << GP_ACT_GELU,
    .add_bias_rows = cuda_add_bias_rows,
    .linear_fwd = cuda_linear_fwd,
    .sum_rows = cuda_sum_rows,
    .act_block = gp_cuda_act_block,
    .conv_fwd = gp_cuda_conv_fwd,
    .conv_bwd_data = gp_cuda_conv_bwd_data,
    .conv_bwd_weights = gp_cuda_conv_bwd_weights,
    .pool_ws_bytes = gp_cuda_pool_ws_bytes,
    .pool_fwd = gp_cuda_pool_fwd,
    .pool_bwd = gp_cuda_pool_bwd,
    .bn_fwd_train = gp_cuda_bn_fwd_train,
    .bn_fwd_infer = gp_cuda_bn_fwd_infer,
    .bn_bwd = gp_cuda_bn_bwd,
    .relu_fwd = cuda_relu_fwd,
    .relu_bwd = cuda_relu_bwd,
    .log_softmax = gp_cuda_log_softmax,
    .xent = cuda_xent,
    .dropout_mask = cuda_dropout_mask,
    .mul = cuda_mul,
    .allreduce = cuda_allreduce,
    .broadcast = cuda_broadcast,
    .reduce_scatter = cuda_reduce_scatter,
    .all_gather = cuda_all_gather,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .bn_stats = gp_cuda_bn_stats,
    .bn_bwd_sums = gp_cuda_bn_bwd_sums,
    .bn_bwd_apply = gp_cuda_bn_bwd_apply,
    .copy_box = cuda_copy_box,
    .gelu_fwd = cuda_gelu_fwd,
    .gelu_bwd = cuda_gelu_bwd,
    .layer_norm_fwd = cuda_layer_norm_fwd,
    .layer_norm_bwd_data = cuda_layer_norm_bwd_data,
    .layer_norm_bwd_weights = cuda_layer_norm_bwd_weights,
    .embed_fwd = cuda_embed_fwd,
    .embed_bwd = cuda_embed_bwd,
    .leaky_relu_fwd = cuda_leaky_relu_fwd,
    .leaky_relu_bwd = cuda_leaky_relu_bwd,
    .mul_rows = cuda_mul_rows,
    .upsample_fwd = cuda_upsample_fwd,
    .upsample_bwd = cuda_upsample_bwd,
    .attn_fwd = cuda_attn_fwd,
    .attn_bwd = cuda_attn_bwd,
    .bce_logits = cuda_bce_logits,
    .copy_async = cuda_copy_async,
    .nonfinite_or = cuda_nonfinite_or,
    .nonfinite_or_many = cuda_nonfinite_or_many,
    .zero_many = cuda_zero_many,
    .mem_total = cuda_mem_total,
    .upload_async = cuda_upload_async,
    .bn_merge = cuda_bn_merge,
    .bn_commit = cuda_bn_commit,
    .bn_commit_multi = cuda_bn_commit_multi,
    .xent_dev = cuda_xent_dev,
    .bce_logits_dev = cuda_bce_logits_dev,
    .mark = cuda_mark,
    .mark_time = cuda_mark_time,
    .mark_reset = cuda_mark_reset,
    .chan_open = cuda_chan_open,
    .chan_send = cuda_chan_send,
    .chan_recv = cuda_chan_recv,
    .chan_close = cuda_chan_close,
    .chan_id = cuda_chan_id,
    .event_query = cuda_event_query,
    .uid = cuda_uid,
    .copy_to_host = cuda_copy_to_host,
};

gp_status gp_cuda_device_create(int index, const gp_device_opts *opts, gp_device **out)
{
    *out = NULL;
    gp_device_opts def = {0};
    if (!opts) opts = &def;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return gp_error_set(GP_ERR_UNSUPPORTED,
                            "no CUDA device %d: cudaGetDeviceCount reports 0 (%s: %s); use "
                            "cpu:N devices, or run on a machine with an NVIDIA GPU and driver",
                            index, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (index >= count || index >= CUDA_MAX_DEVICES)
        return gp_error_set(GP_ERR_UNSUPPORTED,
                            "no CUDA device %d: cudaGetDeviceCount reports %d%s; use cpu:N "
                            "devices or cuda:0..cuda:%d (CUDA_VISIBLE_DEVICES selects GPUs)",
                            index, count, count ? "" : " (no GPU visible)",
                            count > 0 ? count - 1 : 0);

    gp_cuda_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return gp_error_set(GP_ERR_OOM, "out of host memory creating device cuda:%d", index);
    gp_device *dev;
    gp_status st = gp_device_new(&cuda_iface, GP_DEV_CUDA, index, opts, &dev);
    if (st != GP_OK) {
        free(ctx);
        return st;
    }
    dev->ctx = ctx;
    ctx->ordinal = index;
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->tf32 = opts->precision == GP_PRECISION_TF32;
    ctx->bf16 = opts->precision == GP_PRECISION_BF16;
    ctx->deterministic = opts->deterministic;
    const char *legacy = getenv("GPIPE_CUDNN_LEGACY");
    ctx->legacy_conv = legacy && strcmp(legacy, "0") != 0;
    const char *graph = getenv("GPIPE_CUDNN_GRAPH");
    ctx->graph_force = graph && strcmp(graph, "force") == 0;
    const char *sdpa = getenv("GPIPE_CUDNN_SDPA");
    ctx->sdpa_off = sdpa && strcmp(sdpa, "0") == 0;
    const char *nhwc = getenv("GPIPE_CUDA_NHWC");
    ctx->nhwc = nhwc && !strcmp(nhwc, "0")        ? GP_CUDA_NHWC_OFF
                : nhwc && !strcmp(nhwc, "chains") ? GP_CUDA_NHWC_CHAINS
                                                  : GP_CUDA_NHWC_ALL;
    dev->precision = opts->precision;

    GP_CUDA_GO(cudaSetDevice(index));
    int major = 0, minor = 0;
    GP_CUDA_GO(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
    GP_CUDA_GO(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
    ctx->sm = major * 10 + minor;
    dev->arch = ctx->sm;
    if (ctx->bf16) {
        /* bf16 tensor cores came with Ampere (sm_80); cuBLAS and cuDNN
         * would emulate them slower than FP32 before */
        if (major < 8) {
            st = gp_error_set(GP_ERR_UNSUPPORTED,
                              "GPU cuda:%d (sm_%d%d) has no bf16 tensor cores (sm_80 and later "
                              "do); use train.precision: fp32", index, major, minor);
            goto fail;
        }
    }
    size_t gpu_free = 0;
    GP_CUDA_GO(cudaMemGetInfo(&gpu_free, &ctx->gpu_bytes));
    GP_CUDA_GO(cudaStreamCreateWithFlags(&ctx->compute, cudaStreamNonBlocking));
    GP_CUDA_GO(cudaStreamCreateWithFlags(&ctx->copy, cudaStreamNonBlocking));
    GP_CUDA_GO(cudaEventCreateWithFlags(&ctx->fence_compute, cudaEventDisableTiming));
    GP_CUDA_GO(cudaEventCreateWithFlags(&ctx->fence_copy, cudaEventDisableTiming));
    GP_CUBLAS_GO(cublasCreate(&ctx->blas));
    GP_CUBLAS_GO(cublasSetStream(ctx->blas, ctx->compute));
    /* fp32: plain FP32; tf32: TF32 tensor cores for FP32 products */
    GP_CUBLAS_GO(cublasSetMathMode(ctx->blas, ctx->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                        : CUBLAS_DEFAULT_MATH));
    st = gp_cuda_lt_init(ctx);
    if (st != GP_OK) goto fail;
    GP_CUDNN_GO(cudnnCreate(&ctx->dnn));
    GP_CUDNN_GO(cudnnSetStream(ctx->dnn, ctx->compute));
    for (int k = 0; k < 2; k++) {
        GP_CUDA_GO(cudaHostAlloc(&ctx->stage[k], CUDA_STAGE_BYTES, cudaHostAllocDefault));
        GP_CUDA_GO(cudaEventCreateWithFlags(&ctx->stage_done[k], cudaEventDisableTiming));
        GP_CUDA_GO(cudaEventRecord(ctx->stage_done[k], ctx->copy));
    }
    GP_CUDA_GO(cudaHostAlloc(&ctx->host_res, sizeof(cuda_res), cudaHostAllocDefault));
    st = gp_dev_alloc(dev, sizeof(cuda_res), GP_MEM_WORKSPACE, &ctx->dev_res);
    if (st != GP_OK) goto fail;
    st = gp_cuda_dnn_init(ctx);
    if (st != GP_OK) goto fail;
    st = gp_cuda_lt_probe_relu(dev);
    if (st != GP_OK) goto fail;
    dev->chans = true;
    *out = dev;
    return GP_OK;
fail:
    gp_device_close(dev);
    return gp_error_wrap(st, "device cuda:%d", index);
}
