/*
 * cpu_dnnl.c — convolution (FP32, bf16 operands, bf16 storage), matrix
 * products in bf16 (precision bf16; linear layers on bf16 storage), GELU
 * and log-softmax on oneDNN primitives, with a
 * per-device cache so that each primitive (and its reorders, memory objects
 * and scratch sizes) is created once per shape.  FP32 gemm is in cpu_math.c;
 * batch norm and pooling are plain loops (cpu_bn.c, cpu_pool.c), faster
 * than oneDNN's kernels for plain layouts.
 *
 * Layout.  The interface is plain NCHW / OIHW.  oneDNN's direct JIT kernels
 * on blocked layouts (nChw16c, OIhw16i16o, ...) run the benchmark shapes at
 * ~330-400 GFLOP/s on 2 AVX-512 cores, against ~115-245 for its
 * im2col+gemm path on plain nchw, so a convolution with at least 8 output
 * and 3 input channels runs blocked and its operands are reordered on every
 * call (~2.5 ms per (128, 64, 28, 28) tensor; still 1.3-1.9x faster than
 * plain overall, see bench/bench_ops.c).  With fewer (a 1-channel first
 * layer, a 1-channel output) the plain path is as fast or faster and needs
 * no reorders (conv_mode).  GPIPE_CPU_CONV=plain|blocked overrides the choice.
 * Inside a stage, activations between two blocked convolutions stay in
 * the block (gp_layers_blocked; d->xblk / d->yblk, act_block): the user
 * memory is then the primitive's own layout and no reorder is made.
 *
 * Accumulation.  oneDNN writes its outputs (=).  Outputs the interface
 * accumulates (conv dW, db) are computed into a temporary of the arena and
 * added to the user's buffer by a reorder with a sum post-op
 * (dst = dst + reorder(src)), which converts the layout at the same time.
 *
 * Scratch.  Primitives use the user scratchpad mode; scratchpads and
 * reordered temporaries live in the device arena (GP_MEM_WORKSPACE), so
 * peak memory accounting includes them.
 *
 * Kept weights.  While the executor has the device's weights frozen (a
 * step's forwards and backwards: gp_dev_freeze_weights), an op keeps the
 * reordered copy of each weight tensor it is called with (up to
 * CPU_WKEEP_SLOTS tensors of its shape: layers of one shape share the op)
 * in a buffer of its own (GP_MEM_WORKSPACE) and reorders again only after
 * a thaw: with m micro-batches a step reorders each weight tensor once per
 * op instead of m times (2m with recomputation).  Until 2026-11-24 an op
 * kept one copy, so an mlp's five 2048 x 2048 layers took turns evicting
 * each other's and converted on every call (bf16 at m = 8: 430 ms a step,
 * now 202).  Devices with a memory capacity keep nothing, nor does any
 * with GPIPE_CPU_KEEP_WEIGHTS=0.  The thaw (before the step's update)
 * frees the buffers.
 *
 * Weight mirrors.  A matrix product's weights under bf16 are a plain cast
 * (the tensor's own element order, build_matmul): the weight tensor's bf16
 * mirror (gp_wmirror, backend.h), which every product reading the tensor
 * shares through whatever view (a linear layer's forward reads W^T, its
 * backward-data W) and which the update writes in its own pass, so a step
 * converts no weights (until 2026-11-27 one cast per tensor and step,
 * about 3 ms of bench/mlp.yaml's 120 in bf16).  It is made here, by gpipe's own
 * rounding (gp_cpu_bf16_pack, the bits the update writes), on its first
 * use or when something other than the update wrote the tensor.
 *
 * Held gradients.  Likewise a weight gradient is summed in the primitive's
 * layout across the micro-batches (a streaming add) and reordered into the
 * plain gradient once, on the thaw, instead of a reorder-and-add per
 * micro-batch.  The layer zeroes its gradient before its first backward
 * of the step, so the tensor receives exactly the sum the per-micro-batch
 * additions would have made, in the same order: 0 + (g1 + g2 + ...) is
 * ((0 + g1) + g2) + ... bit for bit.
 */
#include "backend/cpu/cpu_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- the cache -------------------------------------------------------------- */

static uint64_t key_hash(const cpu_key *k)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)k->v;
    for (size_t i = 0; i < sizeof k->v; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void op_free(cpu_op *op)
{
    if (!op) return;
    for (int i = 0; i < op->nargs; i++) {
        cpu_arg *a = &op->args[i];
        if (a->reorder) dnnl_primitive_destroy(a->reorder);
        if (a->inner && a->inner != a->user) dnnl_memory_destroy(a->inner);
        if (a->user) dnnl_memory_destroy(a->user);
    }
    if (op->scratch) dnnl_memory_destroy(op->scratch);
    if (op->prim) dnnl_primitive_destroy(op->prim);
    if (op->pd) dnnl_primitive_desc_destroy(op->pd);
    free(op);
}

void gp_cpu_cache_destroy(gp_cpu_ctx *ctx)
{
    for (int b = 0; b < CPU_CACHE_BUCKETS; b++) {
        cpu_op *op = ctx->buckets[b];
        while (op) {
            cpu_op *next = op->next;
            op_free(op);
            op = next;
        }
        ctx->buckets[b] = NULL;
    }
}

/* ---- building ops ------------------------------------------------------------ */

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Attributes every primitive gets: user scratchpad (so it is accounted),
 * and optionally a sum post-op (accumulating reorders). */
static gp_status make_attr(dnnl_primitive_attr_t *attr, int accumulate)
{
    gp_status st = GP_OK;
    dnnl_post_ops_t po = NULL;
    *attr = NULL;
    GP_DNNL(dnnl_primitive_attr_create(attr));
    GP_DNNL(dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user));
    if (accumulate) {
        GP_DNNL(dnnl_post_ops_create(&po));
        GP_DNNL(dnnl_post_ops_append_sum(po, 1.0f));
        GP_DNNL(dnnl_primitive_attr_set_post_ops(*attr, po));
        dnnl_post_ops_destroy(po);
    }
    return GP_OK;
fail:
    if (po) dnnl_post_ops_destroy(po);
    if (*attr) dnnl_primitive_attr_destroy(*attr);
    *attr = NULL;
    return st;
}

static size_t pd_scratch_bytes(const_dnnl_primitive_desc_t pd)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

/* The main primitive descriptor of `op` from an op descriptor. */
static gp_status op_create_pd(gp_cpu_ctx *ctx, cpu_op *op, const void *op_desc,
                              const_dnnl_primitive_desc_t hint)
{
    gp_status st = GP_OK;
    dnnl_primitive_attr_t attr = NULL;
    GP_TRY(make_attr(&attr, 0));
    GP_DNNL(dnnl_primitive_desc_create(&op->pd, op_desc, attr, ctx->engine, hint));
    dnnl_primitive_attr_destroy(attr);
    op->scratch_bytes = pd_scratch_bytes(op->pd);
    return GP_OK;
fail:
    dnnl_primitive_attr_destroy(attr);
    return st;
}

/* A hint-only forward primitive descriptor (backward ops need one). */
static gp_status make_hint_pd(gp_cpu_ctx *ctx, const void *op_desc,
                              dnnl_primitive_desc_t *out)
{
    gp_status st = GP_OK;
    dnnl_primitive_attr_t attr = NULL;
    GP_TRY(make_attr(&attr, 0));
    GP_DNNL(dnnl_primitive_desc_create(out, op_desc, attr, ctx->engine, NULL));
fail:
    dnnl_primitive_attr_destroy(attr);
    return st;
}

/* Add an argument of the main primitive.  `user_md` is the interface's
 * layout (NULL: the primitive's own); the
 * primitive's layout is queried from op->pd.  Temporaries are laid out from
 * *temp_off upwards (shifted past the scratch region in op_finish). */
static gp_status op_add_arg(gp_cpu_ctx *ctx, cpu_op *op, int arg, int slot,
                            cpu_arg_dir dir, const dnnl_memory_desc_t *user_md,
                            size_t *temp_off)
{
    gp_status st = GP_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    GP_ASSERT(op->nargs < CPU_MAX_ARGS);
    cpu_arg *a = &op->args[op->nargs++];
    a->arg = arg;
    a->slot = slot;
    a->dir = dir;
    const dnnl_memory_desc_t *inner_md = dnnl_primitive_desc_query_md(op->pd, dnnl_query_exec_arg_md, arg);
    GP_ASSERT(inner_md && inner_md->ndims > 0);
    if (!user_md) user_md = inner_md;
    GP_DNNL(dnnl_memory_create(&a->user, user_md, ctx->engine, DNNL_MEMORY_NONE));
    if (dir != CPU_ARG_ACCUM && dnnl_memory_desc_equal(user_md, inner_md)) {
        a->inner = a->user;
        return GP_OK;
    }
    GP_DNNL(dnnl_memory_create(&a->inner, inner_md, ctx->engine, DNNL_MEMORY_NONE));
    a->off = *temp_off;
    *temp_off = align_up(*temp_off + dnnl_memory_desc_get_size(inner_md), 4096);
    GP_TRY(make_attr(&attr, dir == CPU_ARG_ACCUM));
    if (dir == CPU_ARG_IN)
        GP_DNNL(dnnl_reorder_primitive_desc_create(&rpd, user_md, ctx->engine, inner_md,
                                                   ctx->engine, attr));
    else
        GP_DNNL(dnnl_reorder_primitive_desc_create(&rpd, inner_md, ctx->engine, user_md,
                                                   ctx->engine, attr));
    size_t sb = pd_scratch_bytes(rpd);
    if (sb > op->scratch_bytes) op->scratch_bytes = sb;
    GP_DNNL(dnnl_primitive_create(&a->reorder, rpd));
    ctx->prims_created++;
fail:
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

/* Create the main primitive and the scratchpad memory; fix the arena plan. */
static gp_status op_finish(gp_cpu_ctx *ctx, cpu_op *op, size_t temp_bytes)
{
    gp_status st = GP_OK;
    GP_DNNL(dnnl_primitive_create(&op->prim, op->pd));
    ctx->prims_created++;
    size_t base = 0;
    if (op->scratch_bytes) {
        dnnl_memory_desc_t md;
        dnnl_dims_t dims = {(dnnl_dim_t)op->scratch_bytes};
        GP_DNNL(dnnl_memory_desc_init_by_tag(&md, 1, dims, dnnl_u8, dnnl_a));
        GP_DNNL(dnnl_memory_create(&op->scratch, &md, ctx->engine, DNNL_MEMORY_NONE));
        base = align_up(op->scratch_bytes, 4096);
    }
    for (int i = 0; i < op->nargs; i++)
        if (op->args[i].inner != op->args[i].user) op->args[i].off += base;
    op->arena_need = base + temp_bytes;
fail:
    return st;
}

/* ---- held weight gradients ------------------------------------------------ */

/* One weight gradient held in the primitive's layout while frozen: the sum
 * of the micro-batches' gradients so far, added into `user` on the thaw by
 * op's accumulating reorder (user += reorder(buf)). */
typedef struct cpu_held {
    cpu_op *op;       /* whose argument args[arg] converts buf's layout */
    int arg;
    void *user;       /* the gradient tensor */
    void *buf;        /* GP_MEM_WORKSPACE, bytes */
    size_t bytes;
} cpu_held;

static gp_status held_flush_one(gp_device *dev, cpu_held *h)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    cpu_arg *a = &h->op->args[h->arg];
    gp_status st = GP_OK;
    if (dnnl_memory_set_data_handle(a->inner, h->buf) != dnnl_success ||
        dnnl_memory_set_data_handle(a->user, h->user) != dnnl_success)
        st = gp_error_set(GP_ERR_RUNTIME, "device %s: oneDNN refused a held gradient's buffers",
                          dev->name);
    if (st == GP_OK && h->op->scratch) {
        /* the reorder's scratchpad lives at the arena's start */
        st = gp_cpu_arena_reserve(dev, h->op->arena_need);
        if (st == GP_OK &&
            dnnl_memory_set_data_handle(h->op->scratch, ctx->arena) != dnnl_success)
            st = gp_error_set(GP_ERR_RUNTIME, "device %s: oneDNN refused a scratchpad",
                              dev->name);
    }
    if (st == GP_OK) {
        dnnl_exec_arg_t r[3] = {{DNNL_ARG_FROM, a->inner}, {DNNL_ARG_TO, a->user},
                                {DNNL_ARG_SCRATCHPAD, h->op->scratch}};
        if (dnnl_primitive_execute(a->reorder, ctx->stream, h->op->scratch ? 3 : 2, r) !=
                dnnl_success ||
            dnnl_stream_wait(ctx->stream) != dnnl_success)
            st = gp_error_set(GP_ERR_RUNTIME, "device %s: adding a held weight gradient failed",
                              dev->name);
    }
    gp_dev_free(dev, h->buf, h->bytes, GP_MEM_WORKSPACE);
    h->buf = NULL;
    return st;
}

gp_status gp_cpu_weights_thaw(gp_device *dev)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    if (!ctx) return GP_OK;
    gp_status st = GP_OK;
    gp_cpu_enter(dev);
    for (int i = 0; i < ctx->n_held; i++) {
        gp_status s1 = held_flush_one(dev, &ctx->held[i]);
        if (st == GP_OK) st = s1;
    }
    ctx->n_held = 0;
    for (int b = 0; b < CPU_CACHE_BUCKETS; b++)
        for (cpu_op *op = ctx->buckets[b]; op; op = op->next)
            for (int q = 0; q < CPU_WKEEP_SLOTS; q++) {
                struct cpu_wkeep *k = &op->wkeep[q];
                if (!k->buf) continue;
                gp_dev_free(dev, k->buf, k->bytes, GP_MEM_WORKSPACE);
                *k = (struct cpu_wkeep){0};
            }
    return st;
}

/* Whether a backend may keep or hold anything for this device now. */
static bool may_keep(gp_device *dev)
{
    /* A device with a memory capacity (pipeline.memory) keeps nothing: the
     * copies would take room that a later micro-batch's activations may
     * need, and such a device is capped to fit the largest model. */
    return dev->weights_frozen && dev->alloc.capacity == 0 && gp_cpu_ctx_of(dev)->keep_weights;
}

/* Whether op's argument a is frozen weights that a copy may serve for the
 * rest of the freeze (weights_mirror, weights_kept). */
static bool weights_keepable(gp_device *dev, const cpu_op *op, const cpu_arg *a)
{
    return may_keep(dev) && !op->no_keep && a->arg == DNNL_ARG_WEIGHTS && a->reorder &&
           a->dir == CPU_ARG_IN;
}

/* The accumulating weight-gradient argument a (index ai of op) of this
 * call, its micro-batch's gradient in the arena at `tmp`: add it to the
 * held sum for `user` instead of into user itself.  False: not held (the
 * caller adds it into user as before).  The held sums are added into their
 * tensors on the thaw in the order first held; a gradient that an op of
 * another layout reaches (an uneven last micro-batch may get another
 * primitive) is added in first, so every tensor receives its
 * micro-batches' gradients in the order it would have without holding. */
static bool grad_held(gp_device *dev, cpu_op *op, int ai, void *user, const void *tmp,
                      gp_status *st)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    const cpu_arg *a = &op->args[ai];
    *st = GP_OK;
    if (!may_keep(dev) || a->arg != DNNL_ARG_DIFF_WEIGHTS || a->dir != CPU_ARG_ACCUM ||
        !a->reorder)
        return false;
    const dnnl_memory_desc_t *md = NULL;
    if (dnnl_memory_get_memory_desc(a->inner, &md) != dnnl_success || !md) return false;
    size_t bytes = dnnl_memory_desc_get_size(md);
    cpu_held *h = NULL;
    for (int i = 0; i < ctx->n_held && !h; i++)
        if (ctx->held[i].user == user && ctx->held[i].buf) h = &ctx->held[i];
    if (h) {
        const dnnl_memory_desc_t *hm = NULL;
        if (dnnl_memory_get_memory_desc(h->op->args[h->arg].inner, &hm) == dnnl_success && hm &&
            dnnl_memory_desc_equal(hm, md)) {
            /* on the device's threads, as the reorder it replaces ran */
            *st = gp_cpu_add(dev, h->buf, tmp, h->buf, (int64_t)(bytes / sizeof(float)));
            return *st == GP_OK;
        }
        /* another layout: what is held goes in first */
        *st = held_flush_one(dev, h);
        if (*st != GP_OK) return false;
        h = NULL;
    }
    if (ctx->n_held == ctx->cap_held) {
        int nc = ctx->cap_held ? 2 * ctx->cap_held : 64;
        cpu_held *p = realloc(ctx->held, sizeof *p * (size_t)nc);
        if (!p) return false;
        ctx->held = p;
        ctx->cap_held = nc;
    }
    void *buf = NULL;
    if (gp_dev_alloc(dev, bytes, GP_MEM_WORKSPACE, &buf) != GP_OK) {
        gp_error_clear();
        return false;
    }
    memcpy(buf, tmp, bytes);
    ctx->held[ctx->n_held++] = (cpu_held){.op = op, .arg = ai, .user = user, .buf = buf,
                                          .bytes = bytes};
    return true;
}

/* The bytes of argument a's memory in the primitive's layout; 0 where
 * oneDNN does not say. */
static size_t inner_bytes(const cpu_arg *a)
{
    const dnnl_memory_desc_t *md = NULL;
    if (dnnl_memory_get_memory_desc(a->inner, &md) != dnnl_success || !md) return 0;
    return dnnl_memory_desc_get_size(md);
}

/* The weights argument a of an op whose weights are a plain cast
 * (cast_w): the device's bf16 mirror of weight tensor src (gp_wmirror),
 * which every such op reading src shares whatever its view of the tensor
 * (the bytes are the same), current already (*fresh: converted earlier in
 * this freeze, or written by the last update) or to be converted into now;
 * NULL: reorder as usual, into the arena. */
static gp_status weights_mirror(gp_device *dev, const cpu_op *op, const cpu_arg *a,
                                const void *src, uint16_t **copy, int64_t *n, bool *fresh)
{
    *copy = NULL;
    *fresh = false;
    if (!op->cast_w || !weights_keepable(dev, op, a)) return GP_OK;
    *n = (int64_t)(inner_bytes(a) / sizeof(uint16_t));
    if (!*n) return GP_OK;
    return gp_dev_mirror_get(dev, src, *n, copy, fresh);
}

/* The frozen copy the op's weights argument a uses (an op without cast_w):
 * src's own slot of op->wkeep, current already (*fresh) or to be converted
 * into now; NULL: reorder as usual, into the arena.  A slot converted in
 * an earlier epoch is free for another tensor. */
static struct cpu_wkeep *weights_kept(gp_device *dev, cpu_op *op, const cpu_arg *a,
                                      const void *src, bool *fresh)
{
    *fresh = false;
    if (op->cast_w || !weights_keepable(dev, op, a)) return NULL;
    struct cpu_wkeep *k = NULL;
    for (int q = 0; q < CPU_WKEEP_SLOTS && !k; q++)
        if (op->wkeep[q].buf && op->wkeep[q].src == src &&
            op->wkeep[q].epoch == dev->weights_epoch)
            k = &op->wkeep[q];
    if (k) {
        *fresh = true;
        return k;
    }
    for (int q = 0; q < CPU_WKEEP_SLOTS && !k; q++)
        if (op->wkeep[q].buf && op->wkeep[q].epoch != dev->weights_epoch) k = &op->wkeep[q];
    for (int q = 0; q < CPU_WKEEP_SLOTS && !k; q++)
        if (!op->wkeep[q].buf) k = &op->wkeep[q];
    if (!k) return NULL; /* more tensors of this shape than slots */
    if (!k->buf) {
        size_t bytes = inner_bytes(a);
        if (!bytes) return NULL;
        /* a device near its capacity just reorders every call */
        if (gp_dev_alloc(dev, bytes, GP_MEM_WORKSPACE, &k->buf) != GP_OK) {
            gp_error_clear();
            k->buf = NULL;
            return NULL;
        }
        k->bytes = bytes;
    }
    k->src = NULL; /* until converted */
    return k;
}

/* Run a built op on the call's buffers (ptrs indexed by cpu_arg.slot). */
static gp_status op_run(gp_device *dev, cpu_op *op, void *const *ptrs)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    gp_cpu_enter(dev);
    GP_TRY(gp_cpu_arena_reserve(dev, op->arena_need));
    char *arena = ctx->arena;
    dnnl_exec_arg_t ex[CPU_MAX_ARGS + 1];
    int n = 0;
    struct cpu_wkeep *keep[CPU_MAX_ARGS] = {NULL};
    uint16_t *mirror[CPU_MAX_ARGS] = {NULL}; /* weights_mirror's copy, of mn values */
    int64_t mn[CPU_MAX_ARGS] = {0};
    bool fresh[CPU_MAX_ARGS] = {false};
    for (int i = 0; i < op->nargs; i++) {
        cpu_arg *a = &op->args[i];
        GP_ASSERT(ptrs[a->slot] != NULL);
        GP_DNNL_RET(dnnl_memory_set_data_handle(a->user, ptrs[a->slot]));
        GP_TRY(weights_mirror(dev, op, a, ptrs[a->slot], &mirror[i], &mn[i], &fresh[i]));
        if (!mirror[i]) keep[i] = weights_kept(dev, op, a, ptrs[a->slot], &fresh[i]);
        if (mirror[i]) GP_DNNL_RET(dnnl_memory_set_data_handle(a->inner, mirror[i]));
        else if (keep[i]) GP_DNNL_RET(dnnl_memory_set_data_handle(a->inner, keep[i]->buf));
        else if (a->inner != a->user)
            GP_DNNL_RET(dnnl_memory_set_data_handle(a->inner, arena + a->off));
        ex[n++] = (dnnl_exec_arg_t){a->arg, a->inner};
    }
    if (op->scratch) {
        GP_DNNL_RET(dnnl_memory_set_data_handle(op->scratch, arena));
        ex[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, op->scratch};
    }
    for (int i = 0; i < op->nargs; i++) {
        cpu_arg *a = &op->args[i];
        if (mirror[i] && !fresh[i]) { /* the same bits the update writes */
            GP_TRY(gp_cpu_bf16_pack(dev, mirror[i], ptrs[a->slot], mn[i]));
            gp_dev_mirror_made(dev, ptrs[a->slot], mn[i]);
        } else if (a->reorder && a->dir == CPU_ARG_IN && !fresh[i]) {
            dnnl_exec_arg_t r[3] = {{DNNL_ARG_FROM, a->user}, {DNNL_ARG_TO, a->inner},
                                    {DNNL_ARG_SCRATCHPAD, op->scratch}};
            GP_DNNL_RET(dnnl_primitive_execute(a->reorder, ctx->stream, op->scratch ? 3 : 2, r));
            if (keep[i]) {
                keep[i]->src = ptrs[a->slot];
                keep[i]->epoch = dev->weights_epoch;
            }
        }
    }
    GP_DNNL_RET(dnnl_primitive_execute(op->prim, ctx->stream, n, ex));
    for (int i = 0; i < op->nargs; i++) {
        cpu_arg *a = &op->args[i];
        if (a->reorder && a->dir == CPU_ARG_ACCUM) {
            gp_status hs;
            bool held = grad_held(dev, op, i, ptrs[a->slot], arena + a->off, &hs);
            GP_TRY(hs);
            if (held) continue;
            /* a flush may have moved the handles: point them back */
            GP_DNNL_RET(dnnl_memory_set_data_handle(a->user, ptrs[a->slot]));
            GP_DNNL_RET(dnnl_memory_set_data_handle(a->inner, arena + a->off));
            if (op->scratch) GP_DNNL_RET(dnnl_memory_set_data_handle(op->scratch, arena));
        }
        if (a->reorder && a->dir != CPU_ARG_IN) {
            dnnl_exec_arg_t r[3] = {{DNNL_ARG_FROM, a->inner}, {DNNL_ARG_TO, a->user},
                                    {DNNL_ARG_SCRATCHPAD, op->scratch}};
            GP_DNNL_RET(dnnl_primitive_execute(a->reorder, ctx->stream, op->scratch ? 3 : 2, r));
        }
    }
    /* The CPU stream is in order and blocking; wait keeps that explicit. */
    GP_DNNL_RET(dnnl_stream_wait(ctx->stream));
    return GP_OK;
}

typedef gp_status (*op_builder)(gp_cpu_ctx *ctx, cpu_op *op, const void *desc);

/* Find the op for `key`, building and caching it on first use. */
static gp_status op_get(gp_device *dev, const cpu_key *key, op_builder build,
                        const void *desc, const char *what, cpu_op **out)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    uint64_t h = key_hash(key) % CPU_CACHE_BUCKETS;
    for (cpu_op *op = ctx->buckets[h]; op; op = op->next)
        if (!memcmp(op->key.v, key->v, sizeof key->v)) {
            *out = op;
            return GP_OK;
        }
    cpu_op *op = calloc(1, sizeof *op);
    if (!op) return gp_error_set(GP_ERR_OOM, "out of host memory caching a oneDNN primitive");
    op->key = *key;
    /* Primitive creation may query the thread count: make it the device's. */
    gp_cpu_enter(dev);
    gp_status st = build(ctx, op, desc);
    if (st != GP_OK) {
        op_free(op);
        return gp_error_wrap(st, "device %s: creating %s", dev->name, what);
    }
    op->next = ctx->buckets[h];
    ctx->buckets[h] = op;
    *out = op;
    return GP_OK;
}

static gp_status md_init_t(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                           dnnl_data_type_t dt, dnnl_format_tag_t tag)
{
    dnnl_dims_t d;
    for (int i = 0; i < ndims; i++) d[i] = dims[i];
    GP_DNNL_RET(dnnl_memory_desc_init_by_tag(md, ndims, d, dt, tag));
    return GP_OK;
}

static gp_status md_init(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                         dnnl_format_tag_t tag)
{
    return md_init_t(md, ndims, dims, dnnl_f32, tag);
}

/* Right padding that makes oneDNN's output size equal to the caller's
 * (the caller's oh may come from floor or ceil division). */
static int64_t pad_right(int64_t in, int64_t k, int64_t s, int64_t pl, int64_t out)
{
    int64_t pr = (out - 1) * s + k - in - pl;
    return pr > 0 ? pr : 0;
}

/* ---- convolution --------------------------------------------------------------- */

/* oneDNN's tag of an activation's interface layout blk: plain, or a channel
 * block (backend.h, "Layouts of activations"; conv_check admits what
 * gp_blk_valid does), where a block other than 8 or 16 is channels-last. */
static dnnl_format_tag_t act_tag(int64_t blk)
{
    if (gp_blk_nhwc(blk)) return dnnl_nhwc;
    return blk == 16 ? dnnl_nChw16c : blk == 8 ? dnnl_nChw8c : dnnl_nchw;
}

/* A layout in the op cache's key: 0 plain, 8, 16, or 1 for channels-last
 * (whose block is the channel count, in the key already). */
static int64_t layout_key(int64_t blk) { return gp_blk_nhwc(blk) ? 1 : blk; }

static cpu_key conv_key(cpu_op_kind kind, const gp_conv_desc *d, bool io16)
{
    cpu_key k = {{kind, d->n, d->c, d->h, d->w, d->k, d->kh, d->kw, d->sh, d->sw,
                  d->ph, d->pw, d->oh, d->ow, d->has_bias != 0,
                  layout_key(d->xblk) | layout_key(d->yblk) << 8 | (int64_t)io16 << 16}};
    return k;
}

typedef struct conv_build {
    const gp_conv_desc *d;
    cpu_op_kind kind;
    int mode; /* conv_mode */
    bool bf16; /* the device's precision (its own cache: not in the key) */
    bool io16; /* bf16 storage (the conv_*_bf16 slots): x, y, dx, dy bf16 */
} conv_build;

/* Blocked layouts pay off once the output channels fill half a 16-wide
 * vector block and the input has more than a plane or two.  Until
 * 2026-11-23 both counts had to reach 16; on the AMD EPYC (AVX-512) VM the
 * U-Net's 3 -> 8, 16 -> 8 and 8 -> 8 3x3 convolutions at 64x64 then ran on
 * the im2col+gemm path 1.6-2.9x slower than blocked (forward + both
 * backwards, batch 32: 11.5 -> 7.1, 73.9 -> 25.1, 21.7 -> 9.2 ms), while
 * its 8 -> 1 1x1 output convolution is 5x faster plain (0.6 vs 2.9 ms: the
 * reorders and the padding to 16 outweigh one output channel), and so is
 * a 1-channel input (Fashion-MNIST's first layer, bench_ops). */
enum { CONV_PLAIN = 0, CONV_BLOCKED, CONV_FIRST };

/* Whether this convolution takes bf16 operands (backend.h). */
static bool conv_bf16(const gp_cpu_ctx *ctx, const gp_conv_desc *d)
{
    return ctx->bf16 && gp_bf16_conv_worth(d);
}

static int conv_mode(const gp_cpu_ctx *ctx, const gp_conv_desc *d)
{
    if (ctx->conv_layout == CPU_CONV_PLAIN) return CONV_PLAIN;
    if (ctx->conv_layout == CPU_CONV_BLOCKED) return CONV_BLOCKED;
    if (d->k < 8) return CONV_PLAIN;
    if (d->c >= 3) return CONV_BLOCKED;
    /* 1 or 2 input channels (a first layer): the direct kernel from a plain
     * input to a blocked output.  Alone (its output reordered to plain) it
     * is about as fast as the gemm path; when its output stays blocked
     * (gp_layers_blocked) it saves the reorders of the largest maps
     * (bench/README.md, "Blocked layouts across a stage").  Its
     * backward-weights with AVX2 is the gemm path on a plain dy, which
     * reorders the blocked one: oneDNN's jit:avx2 reads a plain source
     * only with exactly 3 input channels (AVX-512's with 1 to 3), and a
     * blocked source would reorder x instead (test_backend).  The choice
     * depends on nothing but the shape and the device's precision, so the
     * bits are the same whatever the partition or GPIPE_CPU_KEEP_BLOCKS. */
    return conv_bf16(ctx, d) ? CONV_PLAIN : CONV_FIRST;
}

/* The block oneDNN's direct convolutions compute in on this processor (as
 * far as ONEDNN_MAX_CPU_ISA lets them): nChw16c with AVX-512, nChw8c with
 * AVX2, else none (bench/README.md, "Blocked layouts across a stage", has
 * the ONEDNN_VERBOSE lines that show it).  Where the guess were wrong the
 * primitive would reorder, as it does for plain tensors: slower, not
 * different. */
int64_t gp_cpu_isa_block(void)
{
    return gp_cpu_isa_has(dnnl_cpu_isa_avx512_core) ? 16
           : gp_cpu_isa_has(dnnl_cpu_isa_avx2)      ? 8
                                                    : 0;
}

/* ctx->act_blk (the device's block, 0 with GPIPE_CPU_KEEP_BLOCKS=0)
 * where the convolution computes that side blocked; a CONV_FIRST
 * convolution's input stays plain.  GPIPE_CPU_KEEP_BLOCKS=nhwc
 * (CPU_ACT_NHWC) says channels-last instead, where the channels are a
 * multiple of 8: the layout a GPU keeps between its convolutions, which
 * oneDNN reorders from and to around its own, so that the layer logic of
 * channels-last chains runs here, bit for bit against plain (tests). */
int64_t gp_cpu_act_block(gp_device *dev, const gp_conv_desc *d, bool output)
{
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    int mode = conv_mode(ctx, d);
    int64_t b = ctx->act_blk, ch = output ? d->k : d->c;
    if (!b || !mode || (mode == CONV_FIRST && !output)) return 0;
    if (b == CPU_ACT_NHWC) return ch % 8 == 0 ? ch : 0;
    return ch % b == 0 ? b : 0;
}

enum { CONV_SLOT_X, CONV_SLOT_W, CONV_SLOT_B, CONV_SLOT_Y };

static gp_status build_conv(gp_cpu_ctx *ctx, cpu_op *op, const void *desc)
{
    const conv_build *cb = desc;
    const gp_conv_desc *d = cb->d;
    gp_status st = GP_OK;
    dnnl_primitive_desc_t hint = NULL;
    dnnl_memory_desc_t src, wei, bias, dst, src_any, wei_any, dst_any;
    int64_t sd[4] = {d->n, d->c, d->h, d->w}, wd[4] = {d->k, d->c, d->kh, d->kw};
    int64_t dd[4] = {d->n, d->k, d->oh, d->ow}, bd[1] = {d->k};
    /* bf16 storage: the activations' user memory is bf16, plain or in
     * the block of a chain (gp_layers_blocked) */
    dnnl_data_type_t act = cb->io16 ? dnnl_bf16 : dnnl_f32;
    GP_TRY(md_init_t(&src, 4, sd, act, act_tag(d->xblk)));
    GP_TRY(md_init(&wei, 4, wd, dnnl_oihw));
    GP_TRY(md_init_t(&dst, 4, dd, act, act_tag(d->yblk)));
    GP_TRY(md_init(&bias, 1, bd, dnnl_a));
    /* bf16 (backend.h, gp_precision): the operands a product reads (x and
     * w forward; dy and w for dx; x and dy for dw) in bf16, what it writes
     * (y, dx, dw, db) in FP32; the reorders into the primitive's layouts
     * convert, so the layers' tensors stay FP32.  On bf16 storage (io16)
     * the primitive writes y and dx in bf16 itself, from its FP32
     * accumulators (the bias added in FP32), rounded once as the storage
     * adapter would round its FP32 output, with no FP32 copy of either
     * side */
    dnnl_data_type_t in = cb->bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_data_type_t dy_t = cb->kind == CPU_OP_CONV_FWD && !cb->io16 ? dnnl_f32 : in;
    dnnl_data_type_t x_t = cb->kind == CPU_OP_CONV_BWD_DATA && !cb->io16 ? dnnl_f32 : in;
    dnnl_data_type_t w_t = cb->kind == CPU_OP_CONV_BWD_WEIGHTS ? dnnl_f32 : in;
    /* CONV_FIRST: the input stays plain (a few channels: blocking would pad
     * them to the block), weights and output in the primitive's layouts */
    dnnl_format_tag_t xf = cb->mode == CONV_BLOCKED ? dnnl_format_tag_any : dnnl_nchw;
    dnnl_format_tag_t wf = cb->mode ? dnnl_format_tag_any : dnnl_oihw;
    dnnl_format_tag_t yf = cb->mode ? dnnl_format_tag_any : dnnl_nchw;
    GP_TRY(md_init_t(&src_any, 4, sd, x_t, xf));
    GP_TRY(md_init_t(&wei_any, 4, wd, w_t, wf));
    GP_TRY(md_init_t(&dst_any, 4, dd, dy_t, yf));
    /* the forward that hints the backwards' layouts: bf16 operands too */
    dnnl_memory_desc_t hsrc, hwei, hdst;
    GP_TRY(md_init_t(&hsrc, 4, sd, in, xf));
    GP_TRY(md_init_t(&hwei, 4, wd, in, wf));
    GP_TRY(md_init_t(&hdst, 4, dd, cb->io16 ? dnnl_bf16 : dnnl_f32, yf));
    dnnl_dims_t strides = {d->sh, d->sw}, pl = {d->ph, d->pw};
    dnnl_dims_t pr = {pad_right(d->h, d->kh, d->sh, d->ph, d->oh),
                      pad_right(d->w, d->kw, d->sw, d->pw, d->ow)};
    const dnnl_memory_desc_t *bias_md = d->has_bias ? &bias : NULL;
    dnnl_convolution_desc_t fwd, cd;
    GP_DNNL(dnnl_convolution_forward_desc_init(&fwd, dnnl_forward_training, dnnl_convolution_direct,
                                               &hsrc, &hwei, bias_md, &hdst, strides,
                                               pl, pr));
    size_t temp = 0;
    switch (cb->kind) {
    case CPU_OP_CONV_FWD:
        GP_TRY(op_create_pd(ctx, op, &fwd, NULL));
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_SRC, CONV_SLOT_X, CPU_ARG_IN, &src, &temp));
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_WEIGHTS, CONV_SLOT_W, CPU_ARG_IN, &wei, &temp));
        if (d->has_bias)
            GP_TRY(op_add_arg(ctx, op, DNNL_ARG_BIAS, CONV_SLOT_B, CPU_ARG_IN, &bias, &temp));
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DST, CONV_SLOT_Y, CPU_ARG_OUT, &dst, &temp));
        break;
    case CPU_OP_CONV_BWD_DATA:
        GP_TRY(make_hint_pd(ctx, &fwd, &hint));
        GP_DNNL(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &src_any,
                                                         &wei_any, &dst_any, strides, pl, pr));
        GP_TRY(op_create_pd(ctx, op, &cd, hint));
        /* slots: W = weights, Y = dy, X = dx */
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_WEIGHTS, CONV_SLOT_W, CPU_ARG_IN, &wei, &temp));
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DIFF_DST, CONV_SLOT_Y, CPU_ARG_IN, &dst, &temp));
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DIFF_SRC, CONV_SLOT_X, CPU_ARG_OUT, &src, &temp));
        break;
    case CPU_OP_CONV_BWD_WEIGHTS:
        GP_TRY(make_hint_pd(ctx, &fwd, &hint));
        GP_DNNL(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &src_any,
                                                            &wei_any, bias_md, &dst_any, strides,
                                                            pl, pr));
        GP_TRY(op_create_pd(ctx, op, &cd, hint));
        /* slots: X = x, Y = dy, W = dw (+=), B = db (+=) */
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_SRC, CONV_SLOT_X, CPU_ARG_IN, &src, &temp));
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DIFF_DST, CONV_SLOT_Y, CPU_ARG_IN, &dst, &temp));
        GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DIFF_WEIGHTS, CONV_SLOT_W, CPU_ARG_ACCUM, &wei, &temp));
        if (d->has_bias)
            GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DIFF_BIAS, CONV_SLOT_B, CPU_ARG_ACCUM, &bias, &temp));
        break;
    default:
        GP_ASSERT(!"not a convolution kind");
    }
    st = op_finish(ctx, op, temp);
fail:
    if (hint) dnnl_primitive_desc_destroy(hint);
    return st;
}

static gp_status conv_check(gp_device *dev, const gp_conv_desc *d)
{
    if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 || d->kh <= 0 ||
        d->kw <= 0 || d->sh <= 0 || d->sw <= 0 || d->ph < 0 || d->pw < 0 || d->oh <= 0 ||
        d->ow <= 0 || (d->oh - 1) * d->sh + d->kh > d->h + 2 * d->ph ||
        (d->ow - 1) * d->sw + d->kw > d->w + 2 * d->pw ||
        !gp_blk_valid(d->xblk, d->c) || !gp_blk_valid(d->yblk, d->k))
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: invalid convolution (n=%lld c=%lld h=%lld w=%lld k=%lld "
                            "kernel %lldx%lld stride %lldx%lld pad %lldx%lld output %lldx%lld "
                            "blocks %lld/%lld; a block is 8 or 16 and divides the channels, or "
                            "is all of them, a multiple of 8: channels-last)",
                            dev->name, (long long)d->n, (long long)d->c, (long long)d->h,
                            (long long)d->w, (long long)d->k, (long long)d->kh,
                            (long long)d->kw, (long long)d->sh, (long long)d->sw,
                            (long long)d->ph, (long long)d->pw, (long long)d->oh,
                            (long long)d->ow, (long long)d->xblk, (long long)d->yblk);
    return GP_OK;
}

static gp_status conv_op(gp_device *dev, cpu_op_kind kind, const gp_conv_desc *d, bool io16,
                         cpu_op **op)
{
    GP_TRY(conv_check(dev, d));
    cpu_key key = conv_key(kind, d, io16);
    conv_build cb = {d, kind, conv_mode(gp_cpu_ctx_of(dev), d), conv_bf16(gp_cpu_ctx_of(dev), d),
                     io16};
    /* bf16 storage only where the product is bf16 (gp_dev_conv_bf16_takes) */
    GP_ASSERT(!io16 || cb.bf16);
    static const char *names[] = {"", "a convolution forward", "a convolution backward-data",
                                  "a convolution backward-weights"};
    gp_cpu_ctx *ctx = gp_cpu_ctx_of(dev);
    int64_t built = ctx->prims_created;
    GP_TRY(op_get(dev, &key, build_conv, &cb, names[kind], op));
    if (ctx->fake_search && ctx->prims_created != built) { /* GPIPE_CPU_FAKE_SEARCH */
        void *ws = NULL;
        GP_TRY(gp_dev_alloc(dev, ctx->fake_search, GP_MEM_WORKSPACE, &ws));
        gp_dev_free(dev, ws, ctx->fake_search, GP_MEM_WORKSPACE);
        dev->algo_searches++;
    }
    return GP_OK;
}

/* Convolution d of `kind` on the call's buffers, in the slots' order
 * (x or dx, w or dw, b or db, y or dy); io16: bf16 storage. */
static gp_status conv_run(gp_device *dev, cpu_op_kind kind, const gp_conv_desc *d, bool io16,
                          const void *x, const void *w, const void *b, const void *y)
{
    cpu_op *op = NULL;
    GP_TRY(conv_op(dev, kind, d, io16, &op));
    void *p[4] = {(void *)x, (void *)w, (void *)b, (void *)y};
    return op_run(dev, op, p);
}

gp_status gp_cpu_conv_fwd(gp_device *dev, const gp_conv_desc *d, const float *x,
                          const float *w, const float *b, float *y)
{
    return conv_run(dev, CPU_OP_CONV_FWD, d, false, x, w, b, y);
}

/* conv_*_bf16 (backend.h): the same primitives on bf16 user memory */
gp_status gp_cpu_conv_fwd_bf16(gp_device *dev, const gp_conv_desc *d, const uint16_t *x,
                               const float *w, const float *b, uint16_t *y)
{
    return conv_run(dev, CPU_OP_CONV_FWD, d, true, x, w, b, y);
}

gp_status gp_cpu_conv_bwd_data_bf16(gp_device *dev, const gp_conv_desc *d, const float *w,
                                    const uint16_t *dy, uint16_t *dx)
{
    return conv_run(dev, CPU_OP_CONV_BWD_DATA, d, true, dx, w, NULL, dy);
}

gp_status gp_cpu_conv_bwd_weights_bf16(gp_device *dev, const gp_conv_desc *d,
                                       const uint16_t *x, const uint16_t *dy, float *dw,
                                       float *db)
{
    return conv_run(dev, CPU_OP_CONV_BWD_WEIGHTS, d, true, x, dw, db, dy);
}

gp_status gp_cpu_conv_bwd_data(gp_device *dev, const gp_conv_desc *d, const float *w,
                               const float *dy, float *dx)
{
    return conv_run(dev, CPU_OP_CONV_BWD_DATA, d, false, dx, w, NULL, dy);
}

gp_status gp_cpu_conv_act_reorders(gp_device *dev, const gp_conv_desc *d, int count[3])
{
    for (int kind = CPU_OP_CONV_FWD; kind <= CPU_OP_CONV_BWD_WEIGHTS; kind++) {
        cpu_op *op = NULL;
        int *c = &count[kind - CPU_OP_CONV_FWD];
        *c = 0;
        GP_TRY(conv_op(dev, (cpu_op_kind)kind, d, false, &op));
        for (int i = 0; i < op->nargs; i++)
            if (op->args[i].reorder &&
                (op->args[i].slot == CONV_SLOT_X || op->args[i].slot == CONV_SLOT_Y))
                ++*c;
    }
    return GP_OK;
}

gp_status gp_cpu_conv_bwd_weights(gp_device *dev, const gp_conv_desc *d, const float *x,
                                  const float *dy, float *dw, float *db)
{
    return conv_run(dev, CPU_OP_CONV_BWD_WEIGHTS, d, false, x, dw, db, dy);
}

/* ---- matrix products in bf16 (precision bf16) ------------------------------------------
 * The gemm slot's C(m, n) = alpha op(A) op(B) + beta C, row-major with
 * leading dimensions, as oneDNN's matmul: A and B described by their
 * strides as they lie (a transpose is a stride swap, no copy) and
 * reordered into bf16 in the arena, C written in place in FP32 with alpha
 * as the output scale and beta as a sum post-op. */

typedef struct {
    int64_t m, n, k, lda, ldb, ldc;
    int ta, tb;
    float alpha, beta;
    bool b_weights; /* B is frozen weights: its bf16 copy may be kept */
    /* bf16 storage (the linear_*_bf16 slots): A, B, C as they lie are bf16
     * (else FP32); a bias row (n, FP32, slot 3) added and a relu applied to
     * the FP32 sums before C is written (rounded once where C is bf16) */
    bool a16, b16, c16, bias, relu;
} mm_build;

static gp_status strided_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld,
                            int trans, dnnl_data_type_t dt)
{
    /* op(X) is rows x cols; X itself lies row-major with leading dim ld */
    dnnl_dims_t d = {rows, cols}, st = {trans ? 1 : ld, trans ? ld : 1};
    GP_DNNL_RET(dnnl_memory_desc_init_by_strides(md, 2, d, dt, st));
    return GP_OK;
}

static gp_status build_matmul(gp_cpu_ctx *ctx, cpu_op *op, const void *desc)
{
    const mm_build *b = desc;
    gp_status st = GP_OK;
    dnnl_memory_desc_t a_user, b_user, c_md, a_any, b_any, bias_md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    GP_TRY(strided_md(&a_user, b->m, b->k, b->lda, b->ta, b->a16 ? dnnl_bf16 : dnnl_f32));
    GP_TRY(strided_md(&b_user, b->k, b->n, b->ldb, b->tb, b->b16 ? dnnl_bf16 : dnnl_f32));
    GP_TRY(strided_md(&c_md, b->m, b->n, b->ldc, 0, b->c16 ? dnnl_bf16 : dnnl_f32));
    GP_TRY(md_init_t(&a_any, 2, (int64_t[]){b->m, b->k}, dnnl_bf16, dnnl_format_tag_any));
    /* Frozen weights are converted once a step (kept, op_run) into bf16
     * laid out as the FP32 tensor lies: a plain cast.  Left to choose
     * (format any), oneDNN's brgemm asks for BA16a64b2a, whose reorder
     * from FP32 took 2.3-2.8 ms per 2048 x 2048 weight against 0.6-0.8
     * for the cast, while its products on the plain copy are as fast at
     * 256 rows and 0.1-0.2 ms slower per call at 32 (AMD EPYC with
     * avx512_bf16, 2 threads): bench/mlp.yaml's bf16 step 141 -> 123 ms,
     * and 58 -> 38 ms at batch 32 (bench/README.md, "bf16 activations").
     * With AMX oneDNN's tiles read B in a layout of their own, and no AMX
     * processor has measured the plain copy: there oneDNN still chooses,
     * each op keeping its own reordered copy as before. */
    bool plain_w = b->b_weights && !gp_cpu_isa_has(dnnl_cpu_isa_avx512_core_amx);
    if (plain_w)
        GP_TRY(strided_md(&b_any, b->k, b->n, b->ldb, b->tb, dnnl_bf16));
    else
        GP_TRY(md_init_t(&b_any, 2, (int64_t[]){b->k, b->n}, dnnl_bf16, dnnl_format_tag_any));
    GP_TRY(md_init(&bias_md, 2, (int64_t[]){1, b->n}, dnnl_ab));
    dnnl_matmul_desc_t md;
    GP_DNNL(dnnl_matmul_desc_init(&md, &a_any, &b_any, b->bias ? &bias_md : NULL, &c_md));
    GP_TRY(make_attr(&attr, 0));
    if (b->alpha != 1.0f) GP_DNNL(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &b->alpha));
    if (b->beta != 0.0f || b->relu) {
        GP_DNNL(dnnl_post_ops_create(&po));
        if (b->beta != 0.0f) GP_DNNL(dnnl_post_ops_append_sum(po, b->beta));
        if (b->relu) GP_DNNL(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
        GP_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    GP_DNNL(dnnl_primitive_desc_create(&op->pd, &md, attr, ctx->engine, NULL));
    op->scratch_bytes = pd_scratch_bytes(op->pd);
    op->no_keep = !b->b_weights;
    /* a plain cast (above) of a dense tensor: every op's view of it covers
     * the same elements, so one copy serves them all */
    op->cast_w = plain_w && b->ldb == (b->tb ? b->k : b->n);
    size_t temp = 0;
    GP_TRY(op_add_arg(ctx, op, DNNL_ARG_SRC, 0, CPU_ARG_IN, &a_user, &temp));
    GP_TRY(op_add_arg(ctx, op, DNNL_ARG_WEIGHTS, 1, CPU_ARG_IN, &b_user, &temp));
    GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DST, 2, CPU_ARG_OUT, &c_md, &temp));
    if (b->bias) GP_TRY(op_add_arg(ctx, op, DNNL_ARG_BIAS, 3, CPU_ARG_IN, &bias_md, &temp));
    st = op_finish(ctx, op, temp);
fail:
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

/* The bf16 product mb on the call's buffers (bias: slot 3, or NULL). */
static gp_status matmul_run(gp_device *dev, const mm_build *mb, const void *a, const void *b,
                            void *c, const float *bias)
{
    int32_t ab, bb;
    memcpy(&ab, &mb->alpha, sizeof ab);
    memcpy(&bb, &mb->beta, sizeof bb);
    int64_t io = mb->a16 | mb->b16 << 1 | mb->c16 << 2 | mb->bias << 3 | mb->relu << 4;
    cpu_key key = {{CPU_OP_MATMUL_BF16, mb->m, mb->n, mb->k, mb->ta, mb->tb, mb->lda, mb->ldb,
                    mb->ldc, ab, bb, mb->b_weights, io, 0, 0, 0}};
    cpu_op *op = NULL;
    GP_TRY(op_get(dev, &key, build_matmul, mb, "a bf16 matrix product", &op));
    void *p[4] = {(void *)a, (void *)b, c, (void *)bias};
    return op_run(dev, op, p);
}

gp_status gp_cpu_gemm_bf16(gp_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc, bool b_weights)
{
    mm_build mb = {.m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                   .ta = trans_a != 0, .tb = trans_b != 0, .alpha = alpha, .beta = beta,
                   .b_weights = b_weights};
    return matmul_run(dev, &mb, a, b, c, NULL);
}

/* ---- linear layers on bf16 storage (linear_*_bf16, backend.h) -----------------------
 * A product worth bf16 (gp_bf16_gemm_worth, as gemm decides on FP32
 * storage) is one matmul that reads the bf16 activations as they lie and
 * writes y or dx in bf16 from its FP32 sums, the bias and relu in its
 * epilogue (relu(sum + bias), the FP32 slot's pass after the product),
 * rounded once; the weights' bf16 copy is kept across a step (op_run).
 * A product not worth it runs the FP32 slot on widened copies and rounds:
 * the storage adapter's way, its bits. */

/* An FP32 copy of n bf16 values in the device's workspace, or (src NULL)
 * room for n FP32 values (free: f32_free). */
static gp_status f32_of(gp_device *dev, const uint16_t *src, int64_t n, float **out)
{
    void *p = NULL;
    *out = NULL;
    GP_TRY(gp_dev_alloc(dev, (size_t)(n > 0 ? n : 1) * sizeof(float), GP_MEM_WORKSPACE, &p));
    *out = p;
    return src ? gp_cpu_bf16_unpack(dev, *out, src, n) : GP_OK;
}

static void f32_free(gp_device *dev, float *p, int64_t n)
{
    if (p) gp_dev_free(dev, p, (size_t)(n > 0 ? n : 1) * sizeof(float), GP_MEM_WORKSPACE);
}

gp_status gp_cpu_linear_fwd_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                 const uint16_t *x, const float *w, const float *bias, bool relu,
                                 uint16_t *y)
{
    if (n == 0 || out == 0) return GP_OK;
    if (gp_bf16_gemm_worth(n, out, in)) { /* y(n, out) = x(n, in) W(out, in)^T */
        mm_build mb = {.m = n, .n = out, .k = in, .lda = in, .ldb = in, .ldc = out, .tb = 1,
                       .alpha = 1.0f, .b_weights = true, .a16 = true, .c16 = true,
                       .bias = bias != NULL, .relu = relu};
        return matmul_run(dev, &mb, x, w, y, bias);
    }
    float *fx = NULL, *fy = NULL;
    gp_status st = f32_of(dev, x, n * in, &fx);
    if (st == GP_OK) st = f32_of(dev, NULL, n * out, &fy);
    if (st == GP_OK) st = gp_cpu_linear_fwd(dev, n, out, in, fx, w, bias, relu, fy);
    if (st == GP_OK) st = gp_cpu_bf16_pack(dev, y, fy, n * out);
    f32_free(dev, fx, n * in);
    f32_free(dev, fy, n * out);
    return st;
}

/* dx(n, in) = dy(n, out) W(out, in) */
gp_status gp_cpu_linear_bwd_data_bf16(gp_device *dev, int64_t n, int64_t out, int64_t in,
                                      const uint16_t *dy, const float *w, uint16_t *dx)
{
    if (n == 0 || in == 0) return GP_OK;
    if (gp_bf16_gemm_worth(n, in, out)) {
        mm_build mb = {.m = n, .n = in, .k = out, .lda = out, .ldb = in, .ldc = in,
                       .alpha = 1.0f, .b_weights = true, .a16 = true, .c16 = true};
        return matmul_run(dev, &mb, dy, w, dx, NULL);
    }
    float *fdy = NULL, *fdx = NULL;
    gp_status st = f32_of(dev, dy, n * out, &fdy);
    if (st == GP_OK) st = f32_of(dev, NULL, n * in, &fdx);
    if (st == GP_OK)
        st = gp_cpu_gemm_wb(dev, 0, 0, n, in, out, 1.0f, fdy, out, w, in, 0.0f, fdx, in);
    if (st == GP_OK) st = gp_cpu_bf16_pack(dev, dx, fdx, n * in);
    f32_free(dev, fdy, n * out);
    f32_free(dev, fdx, n * in);
    return st;
}

/* dW(out, in) (fresh: =, else +=) dy^T(out, n) x(n, in); db likewise the
 * column sums of dy (NULL: no bias), dy and x of element type dt */
gp_status gp_cpu_linear_bwd_weights(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                    int64_t in, const void *dy, const void *x, float *dw,
                                    float *db, bool fresh)
{
    if (out == 0) return GP_OK;
    float beta = fresh ? 0.0f : 1.0f;
    if (n == 0) {
        if (fresh) GP_TRY(gp_cpu_fill(dev, dw, 0.0f, out * in));
        if (fresh && db) GP_TRY(gp_cpu_fill(dev, db, 0.0f, out));
        return GP_OK;
    }
    if (dt == GP_F32) {
        GP_TRY(gp_cpu_gemm(dev, 1, 0, out, in, n, 1.0f, dy, out, x, in, beta, dw, in));
    } else if (gp_bf16_gemm_worth(out, in, n)) {
        mm_build mb = {.m = out, .n = in, .k = n, .lda = out, .ldb = in, .ldc = in, .ta = 1,
                       .alpha = 1.0f, .beta = beta, .a16 = true, .b16 = true};
        GP_TRY(matmul_run(dev, &mb, dy, x, dw, NULL));
    } else {
        float *fdy = NULL, *fx = NULL;
        gp_status st = f32_of(dev, dy, n * out, &fdy);
        if (st == GP_OK) st = f32_of(dev, x, n * in, &fx);
        if (st == GP_OK)
            st = gp_cpu_gemm(dev, 1, 0, out, in, n, 1.0f, fdy, out, fx, in, beta, dw, in);
        f32_free(dev, fdy, n * out);
        f32_free(dev, fx, n * in);
        GP_TRY(st);
    }
    /* the bias's sums overwrite on a fresh step (the fill's and the sums'
     * bits: 0 + s is s) */
    if (db) gp_cpu_col_sums(dev, dt, dy, db, n, out, fresh);
    return GP_OK;
}

/* linear_gelu_fwd (backend.h): the product and bias into pre, GELU from
 * pre into y: the two slots it stands for, called in turn (their bits;
 * one launch on a GPU, where cuBLASLt's epilogue writes both). */
gp_status gp_cpu_linear_gelu_fwd(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                 int64_t in, const void *x, const float *w, const float *bias,
                                 void *pre, void *y)
{
    if (dt == GP_BF16) {
        GP_TRY(gp_cpu_linear_fwd_bf16(dev, n, out, in, x, w, bias, false, pre));
        return gp_cpu_gelu_bf16(dev, pre, NULL, y, n * out);
    }
    GP_TRY(gp_cpu_linear_fwd(dev, n, out, in, x, w, bias, false, pre));
    return gp_cpu_gelu_fwd(dev, pre, y, n * out);
}

/* linear_gelu_bwd_data (backend.h): dx = dy w, then GELU's backward from
 * pre over dx in place (cpu_math.c's loop reads each value before it
 * writes it): the bits of the product's dx and the GELU layer's backward
 * after it. */
gp_status gp_cpu_linear_gelu_bwd_data(gp_device *dev, gp_dtype dt, int64_t n, int64_t out,
                                      int64_t in, const void *dy, const float *w,
                                      const void *pre, void *dx)
{
    if (dt == GP_BF16) {
        GP_TRY(gp_cpu_linear_bwd_data_bf16(dev, n, out, in, dy, w, dx));
        return gp_cpu_gelu_bf16(dev, pre, dx, dx, n * in);
    }
    GP_TRY(gp_cpu_gemm_wb(dev, 0, 0, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in));
    return gp_cpu_gelu_bwd(dev, pre, dx, dx, n * in);
}

/* ---- log-softmax ------------------------------------------------------------------- */

static gp_status build_log_softmax(gp_cpu_ctx *ctx, cpu_op *op, const void *desc)
{
    const int64_t *rc = desc;
    gp_status st = GP_OK;
    dnnl_memory_desc_t md;
    dnnl_logsoftmax_desc_t ld;
    size_t temp = 0;
    GP_TRY(md_init(&md, 2, rc, dnnl_nc));
    GP_DNNL(dnnl_logsoftmax_forward_desc_init(&ld, dnnl_forward_inference, &md, 1));
    GP_TRY(op_create_pd(ctx, op, &ld, NULL));
    GP_TRY(op_add_arg(ctx, op, DNNL_ARG_SRC, 0, CPU_ARG_IN, &md, &temp));
    GP_TRY(op_add_arg(ctx, op, DNNL_ARG_DST, 1, CPU_ARG_OUT, &md, &temp));
    st = op_finish(ctx, op, temp);
fail:
    return st;
}

gp_status gp_cpu_log_softmax(gp_device *dev, const float *x, float *y, int64_t rows,
                             int64_t cols)
{
    if (rows == 0) return GP_OK;
    if (rows < 0 || cols <= 0)
        return gp_error_set(GP_ERR_INVALID, "device %s: log-softmax of %lld x %lld", dev->name,
                            (long long)rows, (long long)cols);
    cpu_key key = {{CPU_OP_LOG_SOFTMAX, rows, cols, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
    int64_t rc[2] = {rows, cols};
    cpu_op *op = NULL;
    GP_TRY(op_get(dev, &key, build_log_softmax, rc, "a log-softmax", &op));
    void *p[2] = {(void *)x, y};
    return op_run(dev, op, p);
}

