/*
 * decode.c — sampling with a KV cache (gpipe.h's gp_decoder).
 *
 * A language model's forward over a window of T positions recomputes every
 * position for each new token.  The decoder keeps, per sequence, each
 * attention layer's keys and values of the positions fed so far (its
 * cache, on that layer's device), and runs each new position through the
 * model alone: the position-wise layers (linear, the norms, the
 * activations, the residual adds) on its row, the embedding and rope at
 * its position (gp_fwd_ctx.pos0), and attention over the cache
 * (backend.h's attn_cached).  A token then costs one row per layer, not T.
 *
 * The layers run stage after stage on their own devices, as evaluation
 * runs them (model.c's eval_stage): what crosses a stage is moved to the
 * next device and rounded to bf16 where pipeline.copy_precision says so;
 * each skip (a residual's stash) waits on its device until the layer that
 * pops it.  The layers are the model's own, run through a copy of their
 * struct whose shapes say n positions instead of T (what their kernels
 * read from the tensors anyway): the parameters are the model's, and
 * nothing of the copy outlives the call.
 *
 * Exactness: the CPU's attn_cached gives, for every position, the bits of
 * attn_fwd over the whole window from position 0 (cpu_attention.c), so
 * the only differences from gp_run_predict's logits are the products'
 * (oneDNN may sum a 1-row product in another order than a T-row one):
 * within rounding, and tests/test_decode.c holds them to it.
 */
#include "gpipe.h"
#include "layers/layers.h"
#include "train/train.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct gp_decoder {
    gp_model *m;
    const gp_config *cfg;
    int64_t S;       /* sequences */
    int64_t T;       /* the cache's positions (model.input [T]) */
    int64_t len;     /* positions fed so far */
    int64_t step;    /* the model's step when the cache was filled */
    _Atomic int *open; /* its run's count of open decoders, or NULL */
    gp_tensor *kv;   /* [n_layers]: an attention layer's cache, else empty */
    bool bf16_copies;
};

/* How a decoder runs a layer type: not at all; on each position alone
 * (its row i of the output reads row i of each input and nothing else); or
 * knowing the positions (the embedding's position rows and rope's angles
 * are pos0's on, attention reads and extends the cache), so on every
 * position fed, each at its own.  The layer table (gp_layer_ops) does not
 * say it: a type a decoder runs is classed here by hand. */
typedef enum { DEC_NO, DEC_PER_POSITION, DEC_POSITIONS } dec_kind;

static dec_kind decode_kind(gp_layer_type t)
{
    switch (t) {
    case GP_LAYER_LINEAR:
    case GP_LAYER_LAYER_NORM:
    case GP_LAYER_RMS_NORM:
    case GP_LAYER_GELU:
    case GP_LAYER_RELU:
    case GP_LAYER_LEAKY_RELU:
    case GP_LAYER_SWIGLU:
    case GP_LAYER_ADD:
    case GP_LAYER_DROPOUT: /* (evaluation: the identity) */
    case GP_LAYER_IDENTITY:
        return DEC_PER_POSITION;
    case GP_LAYER_EMBEDDING:
    case GP_LAYER_ROPE:
    case GP_LAYER_ATTENTION:
        return DEC_POSITIONS;
    default:
        return DEC_NO;
    }
}

/* Whether shape s (one sample's) has the positions on its axis 1. */
static bool positions_axis(const gp_shape *s, int64_t T, bool ids)
{
    return s->ndim == (ids ? 4 : 3) && s->dims[1] == T;
}

static gp_status refuse(const gp_layer *l, const char *why)
{
    return gp_error_set(GP_ERR_UNSUPPORTED,
                        "sampling with a KV cache: layer %d (%s%s%s) %s; sample without the "
                        "cache (gpipe-sample --no-cache: a forward over the window per token)",
                        l->index, gp_layer_type_name(l->spec.type), l->spec.name[0] ? " " : "",
                        l->spec.name, why);
}

gp_status gp_model_decoder_open(gp_model *m, const gp_config *cfg, int64_t samples,
                                _Atomic int *open, gp_decoder **out)
{
    *out = NULL;
    if (m->local_device >= 0)
        return gp_error_set(GP_ERR_UNSUPPORTED, "sampling with a KV cache runs in one process: "
                            "run it without mpirun");
    if (samples < 1)
        return gp_error_set(GP_ERR_INVALID, "gp_decoder_open: samples = %lld; give at least 1",
                            (long long)samples);
    const gp_shape *in = &m->input, *o = &m->output;
    int64_t T = in->dims[1];
    if (!(in->ndim == 4 && in->dims[2] == 1 && in->dims[3] == 1) || o->ndim != 3 ||
        o->dims[1] != T || m->n_layers < 1 || m->layers[0].spec.type != GP_LAYER_EMBEDDING)
        return gp_error_set(GP_ERR_UNSUPPORTED, "sampling with a KV cache takes a language "
                            "model: an embedding first (model.input [T]) and an output (T, "
                            "vocabulary)");
    for (int k = 0; k < m->n_layers; k++) {
        const gp_layer *l = &m->layers[k];
        if (decode_kind(l->spec.type) == DEC_NO)
            return refuse(l, "is not a layer a Transformer decoder runs one position at a time");
        bool ok = positions_axis(&l->in_shape, T, k == 0) && positions_axis(&l->out_shape, T,
                                                                             false);
        for (int q = 0; q + 1 < l->n_in; q++) ok = ok && positions_axis(&l->pop_shape[q], T, false);
        if (!ok) return refuse(l, "does not keep the positions on its first axis");
        if (l->spec.type == GP_LAYER_ATTENTION && !l->dev->iface->attn_cached)
            return refuse(l, "is on a device whose backend has no cached attention kernel");
    }
    gp_decoder *d = calloc(1, sizeof *d);
    if (d) d->kv = calloc((size_t)m->n_layers, sizeof *d->kv);
    if (!d || !d->kv) {
        free(d);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    *d = (gp_decoder){.m = m, .cfg = cfg, .S = samples, .T = T, .step = m->step, .kv = d->kv,
                      .bf16_copies = gp_config_bf16_copies(cfg)};
    gp_status s = GP_OK;
    for (int k = 1; k < m->n_layers && s == GP_OK; k++) {
        const gp_layer *l = &m->layers[k];
        if (l->spec.type != GP_LAYER_ATTENTION) continue;
        /* (N, T, (H + 2 G) d) in, (N, T, H d) out: the cache's rows 2 G d */
        int64_t w = l->in_shape.dims[2], c = l->out_shape.dims[2];
        gp_shape ks = {3, {samples, T, w - c, 0}};
        gp_dtype dt = gp_layer_kernel_dtype(l, m->layers[k - 1].out_dtype);
        s = gp_tensor_alloc_as(&d->kv[k], l->dev, &ks, dt, GP_MEM_ACTIVATIONS);
        if (s != GP_OK)
            gp_error_wrap(s, "the KV cache of layer %d (%s) on %s: %lld sequences of %lld "
                          "positions", k, l->spec.name[0] ? l->spec.name : "attention",
                          l->dev->name, (long long)samples, (long long)T);
    }
    if (s != GP_OK) {
        gp_decoder_free(d);
        return s;
    }
    d->open = open;
    if (open) atomic_fetch_add(open, 1);
    *out = d;
    return GP_OK;
}

void gp_decoder_free(gp_decoder *d)
{
    if (!d) return;
    if (d->open) atomic_fetch_sub(d->open, 1);
    for (int k = 0; k < d->m->n_layers; k++) gp_tensor_free(&d->kv[k]);
    free(d->kv);
    free(d);
}

int64_t gp_decoder_length(const gp_decoder *d) { return d ? d->len : 0; }

int64_t gp_decoder_capacity(const gp_decoder *d) { return d ? d->T : 0; }

gp_status gp_decoder_rewind(gp_decoder *d, int64_t length)
{
    if (!d) return gp_error_set(GP_ERR_INVALID, "gp_decoder_rewind: the decoder is NULL");
    if (length < 0 || length > d->len)
        return gp_error_set(GP_ERR_INVALID, "gp_decoder_rewind: length %lld is not in [0, %lld] "
                            "(the positions fed so far)", (long long)length, (long long)d->len);
    d->len = length; /* the rows past it are written again before anything reads them */
    if (length == 0) d->step = d->m->step;
    return GP_OK;
}

/* What crosses into another stage: rounded to bf16 where the stages' copies
 * are (pipeline.copy_precision), as training and evaluation see it. */
static gp_status cross(const gp_decoder *d, gp_tensor *t, gp_device *dev)
{
    GP_TRY(gp_tensor_move(t, dev));
    return d->bf16_copies && t->dtype == GP_F32 ? gp_tensor_round_bf16(t) : GP_OK;
}

static void with_positions(gp_shape *s, int64_t n) { s->dims[1] = n; }

/* The last position of each of the S sequences of t (S, n, C): a new
 * tensor (S, 1, C) on t's device. */
static gp_status last_rows(const gp_tensor *t, gp_tensor *out)
{
    int64_t S = t->dims[0], n = t->dims[1], C = gp_tensor_numel(t) / (S * n);
    gp_shape sh = {3, {S, 1, C, 0}};
    GP_TRY(gp_tensor_alloc_as(out, t->dev, &sh, t->dtype, GP_MEM_ACTIVATIONS));
    const int64_t ds[4] = {C, 0, 0, 1}, ss[4] = {n * C, 0, 0, 1}, dims[4] = {S, 1, 1, C};
    size_t es = t->dtype == GP_BF16 ? 2 : 4;
    const char *src = (const char *)gp_tensor_mem(t) + (size_t)((n - 1) * C) * es;
    gp_status s = gp_dev_copy_box_es(t->dev, gp_tensor_mem(out), ds, src, ss, dims, es);
    if (s != GP_OK) gp_tensor_free(out);
    return s;
}

/* Each input of last layer L cut to the last row of each sequence (only
 * they are asked for): cut[] owns the copies, x[] is pointed at them. */
static gp_status last_inputs(gp_layer *L, gp_tensor *x, gp_tensor *cut)
{
    for (int q = 0; q < L->n_in; q++) {
        GP_TRY(last_rows(&x[q], &cut[q]));
        x[q] = cut[q];
    }
    with_positions(&L->in_shape, 1);
    with_positions(&L->out_shape, 1);
    for (int q = 0; q + 1 < L->n_in; q++) with_positions(&L->pop_shape[q], 1);
    return GP_OK;
}

/* The n new positions through every layer: cur the ids in, the output out:
 * (S, n, row), or (S, 1, row) unless all. */
static gp_status run_layers(gp_decoder *d, gp_tensor *cur, int64_t n, bool all, gp_tensor *pend)
{
    gp_model *m = d->m;
    gp_status s = GP_OK;
    for (int k = 0; k < m->n_layers && s == GP_OK; k++) {
        gp_layer L = m->layers[k]; /* the model's layer, its shapes n positions long */
        with_positions(&L.in_shape, n);
        with_positions(&L.out_shape, n);
        for (int q = 0; q + 1 < L.n_in; q++) with_positions(&L.pop_shape[q], n);
        int j = gp_model_stage_of(m, k);
        if (k > 0 && gp_model_stage_of(m, k - 1) != j) s = cross(d, cur, L.dev);
        gp_tensor x[1 + GP_MAX_POPS];
        x[0] = *cur;
        for (int q = 0; q + 1 < L.n_in && s == GP_OK; q++) {
            int t = m->skips.pops[k * GP_MAX_POPS + q];
            int from = m->skips.skips[t].from;
            if (gp_model_stage_of(m, from) != j) s = cross(d, &pend[t], L.dev);
            x[1 + q] = pend[t];
        }
        /* Where only the last positions are asked for, a last layer that
         * acts on each position alone runs on their rows alone; one that
         * knows positions runs on every row fed (each at its own position,
         * each one's keys and values into the cache), and its output is
         * cut after. */
        bool cut_out = !all && n > 1 && k == m->n_layers - 1;
        gp_tensor cut[1 + GP_MAX_POPS] = {{0}};
        if (s == GP_OK && cut_out && decode_kind(L.spec.type) == DEC_PER_POSITION) {
            s = last_inputs(&L, x, cut);
            cut_out = false;
        }
        gp_fwd_ctx ctx = {.training = false, .seed = d->cfg->train.seed,
                          .step = (uint64_t)m->step, .batch_total = d->S, .pos0 = d->len,
                          .kv = gp_tensor_mem(&d->kv[k]) ? &d->kv[k] : NULL};
        gp_tensor y = {0};
        gp_saved sv = {0};
        if (s == GP_OK) s = gp_layer_forward(&L, &ctx, x, &y, &sv);
        gp_saved_free(&sv);
        for (int q = 0; q < L.n_in; q++) gp_tensor_free(&cut[q]);
        if (s == GP_OK && cut_out) {
            gp_tensor last = {0};
            s = last_rows(&y, &last);
            gp_tensor_free(&y);
            y = last;
        }
        /* the inputs done with (a view's free is nothing), the output on:
         * a stashed one owned by its skip, cur viewing it */
        gp_tensor_free(cur);
        for (int q = 0; q + 1 < L.n_in; q++)
            gp_tensor_free(&pend[m->skips.pops[k * GP_MAX_POPS + q]]);
        *cur = y;
        if (s == GP_OK && m->skips.stashes[k] >= 0) {
            pend[m->skips.stashes[k]] = y;
            cur->owned = false;
        }
    }
    return s;
}

gp_status gp_decoder_feed(gp_decoder *d, const float *ids, int64_t n, int all, float *out)
{
    if (!d || !ids || !out || n < 1)
        return gp_error_set(GP_ERR_INVALID, "gp_decoder_feed: %s (n = %lld)",
                            !d ? "the decoder is NULL" : !ids ? "ids is NULL"
                            : !out ? "out is NULL (it takes the logits)"
                            : "give at least one id per sequence", (long long)n);
    gp_model *m = d->m;
    if (d->len > 0 && m->step != d->step)
        return gp_error_set(GP_ERR_INVALID, "gp_decoder_feed: the model took %lld step%s since "
                            "the cache was filled, so its keys and values are another model's; "
                            "rewind to 0 (gp_decoder_rewind) and feed the sequence again",
                            (long long)(m->step - d->step), m->step - d->step == 1 ? "" : "s");
    if (d->len + n > d->T)
        return gp_error_set(GP_ERR_INVALID, "gp_decoder_feed: %lld more position%s after %lld "
                            "would pass the cache's %lld (model.input [T]); rewind "
                            "(gp_decoder_rewind) and feed the last ones again", (long long)n,
                            n == 1 ? "" : "s", (long long)d->len, (long long)d->T);
    for (int64_t e = 0; e < d->S * n; e++)
        if (!(ids[e] >= 0.0f && ids[e] < 16777216.0f && ids[e] == (float)(int64_t)ids[e]))
            return gp_error_set(GP_ERR_DATA, "gp_decoder_feed: ids[%lld] = %g is not a token id "
                                "(a whole number >= 0)", (long long)e, (double)ids[e]);
    if (d->len == 0) d->step = m->step;
    gp_tensor cur = {0};
    gp_shape xs = {4, {d->S, n, 1, 1}};
    GP_TRY(gp_tensor_alloc(&cur, m->layers[0].dev, &xs, GP_MEM_ACTIVATIONS));
    gp_status s = gp_dev_upload(cur.dev, gp_f32(&cur), ids, d->S * n);
    gp_tensor *pend = calloc((size_t)(m->skips.n ? m->skips.n : 1), sizeof *pend);
    if (!pend) s = gp_error_set(GP_ERR_OOM, "out of host memory");
    if (s == GP_OK) s = run_layers(d, &cur, n, all != 0, pend);
    if (s == GP_OK) s = gp_tensor_download_f32(&cur, out);
    if (s == GP_OK) s = gp_dev_synchronize(cur.dev);
    gp_tensor_free(&cur);
    for (int t = 0; pend && t < m->skips.n; t++) gp_tensor_free(&pend[t]);
    free(pend);
    /* a failure leaves the cache's new rows half written: they are past
     * len, which stays, and the next feed writes them again */
    if (s == GP_OK) d->len += n;
    return s;
}
