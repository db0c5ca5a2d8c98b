/*
 * roofline.c — `gpipe-train --dry-run --gpu h100|h200`: a floor for a
 * step's time on a GPU nobody here has, from the model's shapes alone
 * (gp_model_build_meta: nothing allocated, no device opened), so a user
 * can plan a run and a session without a GPU can see which layers are far
 * from their floor once one is measured (issue 64, item 3).
 *
 * Each launch costs the larger of its FLOPs over the GPU's peak and its
 * bytes over its memory bandwidth (the roofline).  Per layer and
 * micro-batch (m of them, the batch's samples split evenly): the forward
 * is one launch; the backward one for a layer without parameters and two
 * with (the data and the weights gradients).  FLOPs: the layer's own
 * estimate for the forward (ops->flops, what the balancer uses) and twice
 * it for a backward with weights, once without (attention 2.5 times: its
 * backward recomputes the scores).  Bytes: the forward reads
 * its inputs and weights and writes its output; the backward reads dy, the
 * input and the weights, writes dx, and with weights reads and writes
 * their FP32 gradient sum.  Activations are 2 bytes under precision bf16
 * (auto's bf16 storage on GPUs), else 4; weights are read as bf16 copies
 * under bf16.  The update (AdamW or SGD over every parameter: one launch)
 * reads and writes each parameter's FP32 value and state and its gradient.
 * Peaks are the dense tensor-core rates (bf16 989 TFLOP/s, TF32 494) or
 * FP32's 67 on both chips, with HBM at 3.35 TB/s (H100 SXM) or 4.8 (H200).
 * A floor, not a prediction: kernels reach a share of it, and launches,
 * copies between stages and the pipeline's bubble are not in it.
 *
 * The pairs a GPU's stage runs as one launch (issue 64) count as one, under
 * the first layer's type, their FLOPs summed and the tensor between them
 * neither written nor read again: a residual add and the layer norm after
 * it (add_layer_norm_fwd), a linear layer and the GELU after it
 * (linear_gelu_fwd), and a GELU's backward in the data product of the
 * linear layer after it (linear_gelu_bwd_data).  A plain add's backward
 * hands its gradient on (no launch).
 */
#include "train/train.h"
#include "balance/balance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    double flops[3]; /* by gp_precision: FP32, TF32, bf16 (FLOP/s) */
    double bw;       /* bytes/s */
} roof_gpu;

static const roof_gpu roof_gpus[] = {
    {"h100", {67e12, 494e12, 989e12}, 3.35e12},
    {"h200", {67e12, 494e12, 989e12}, 4.8e12},
};

/* The GPU named `gpu`, NULL if the roofline knows none. */
static const roof_gpu *roof_gpu_of(const char *gpu)
{
    for (size_t k = 0; k < sizeof roof_gpus / sizeof *roof_gpus; k++)
        if (!strcmp(gpu, roof_gpus[k].name)) return &roof_gpus[k];
    return NULL;
}

/* The per-type sums. */
typedef struct {
    int type;
    int64_t launches;
    double flops, bytes, seconds, bound; /* bound: seconds where bytes decided */
} roof_row;

static double roof_launch(const roof_gpu *g, int prec, double flops, double bytes, bool *mem)
{
    double tc = flops / g->flops[prec], tm = bytes / g->bw;
    *mem = tm > tc;
    return tm > tc ? tm : tc;
}

/* n launches of `flops` and `bytes` each into r, at their roofline time. */
static void roof_add(const roof_gpu *g, int prec, roof_row *r, int64_t n, double flops,
                     double bytes)
{
    bool mem = false;
    double t = roof_launch(g, prec, flops, bytes, &mem);
    r->launches += n;
    r->flops += flops * (double)n;
    r->bytes += bytes * (double)n;
    r->seconds += t * (double)n;
    if (mem) r->bound += t * (double)n;
}

/* A layer's forward and backward as the roofline counts them. */
typedef struct {
    double f, fb;           /* forward FLOPs; backward (data) FLOPs */
    double in, out, np;     /* elements per micro-batch; parameters */
} roof_costs;

static roof_costs roof_costs_of(const gp_layer *l, int64_t b, int m)
{
    double per = (double)b / m, f = l->ops->flops(l, b) / m;
    /* attention's backward recomputes the scores: 5 products to 2.  A
     * tied weight is read, and its gradient made, by each layer that has
     * it (tie.c: each keeps its own gradient; their sum is the update's):
     * a tied head's backward-weights product is a tenth of GPT-2's step,
     * which the model's parameter count (the weight once) left out. */
    return (roof_costs){f, l->spec.type == GP_LAYER_ATTENTION ? 2.5 * f : f,
                        (double)gp_shape_numel(&l->in_shape) * per,
                        (double)gp_shape_numel(&l->out_shape) * per,
                        (double)(gp_layer_param_count(l) - gp_model_layer_padding(l, NULL))};
}

/* Whether a layer with weights passes a gradient to its input: not an
 * embedding (token ids). */
static bool roof_has_dx(const gp_layer *l) { return l->spec.type != GP_LAYER_EMBEDDING; }

/* Whether layer k's forward runs in layer k - 1's launch (the same stage:
 * `first` its first layer), or its backward in layer k + 1's. */
static bool roof_fwd_joins(const gp_layer *ls, int first, int k)
{
    if (k - 1 < first) return false;
    const gp_layer_spec *a = &ls[k - 1].spec, *b = &ls[k].spec;
    return b->n_pop == 0 && ((a->type == GP_LAYER_ADD && a->out == 0 &&
                              b->type == GP_LAYER_LAYER_NORM) ||
                             (a->type == GP_LAYER_LINEAR && !a->stash[0] &&
                              b->type == GP_LAYER_GELU));
}
static bool roof_bwd_joins(const gp_layer *ls, int end, int k)
{
    return k + 1 < end && ls[k].spec.type == GP_LAYER_GELU && !ls[k].spec.stash[0] &&
           ls[k + 1].spec.type == GP_LAYER_LINEAR && ls[k + 1].spec.n_pop == 0;
}

/* Layer k's forward and backward over m micro-batches of b / m samples, in
 * the stage of layers [first, end): with the pairs above, a launch of two
 * layers under the first's type. */
static void roof_layer(const roof_gpu *g, int prec, const gp_layer *ls, int first, int end, int k,
                       int64_t b, int m, double elt, double welt, roof_row *rows)
{
    const gp_layer *l = &ls[k];
    roof_costs c = roof_costs_of(l, b, m);
    roof_row *r = &rows[l->spec.type];
    if (!roof_fwd_joins(ls, first, k)) {
        double f = c.f, bytes = (c.in + c.out) * elt + c.np * welt;
        if (k + 1 < end && roof_fwd_joins(ls, first, k + 1)) { /* and the next's output */
            roof_costs n = roof_costs_of(&ls[k + 1], b, m);
            f += n.f;
            bytes += n.out * elt + n.np * welt;
        }
        roof_add(g, prec, r, m, f, bytes);
    }
    if (c.np > 0) { /* backward-data, then backward-weights into the FP32 sums */
        double fb = c.f, bytes = (c.out + c.in) * elt + c.np * welt;
        if (k > first && roof_bwd_joins(ls, end, k - 1)) { /* GELU' from its input */
            roof_costs p = roof_costs_of(&ls[k - 1], b, m);
            fb += p.fb;
            bytes += p.in * elt;
        }
        if (roof_has_dx(l)) roof_add(g, prec, r, m, fb, bytes);
        roof_add(g, prec, r, m, c.f, (c.out + c.in) * elt + c.np * 8.0);
    } else if (!roof_bwd_joins(ls, end, k) &&
               !(l->spec.type == GP_LAYER_ADD && l->spec.out == 0)) {
        /* (a plain add hands its gradient on: no launch) */
        roof_add(g, prec, r, m, c.fb, (2 * c.out + 2 * c.in) * elt);
    }
}

gp_status gp_model_roofline(const gp_config *cfg, const char *gpu, FILE *f)
{
    const roof_gpu *g = roof_gpu_of(gpu);
    if (!g)
        return gp_error_set(GP_ERR_INVALID, "--gpu %s: not a GPU the estimate knows; give h100 "
                            "or h200", gpu);
    int S = cfg->pipeline.n_devices * gp_model_virtual(cfg), balance[GP_MAX_DEVICES];
    bool given = cfg->pipeline.n_balance == S;
    if (given) {
        GP_TRY(gp_model_balance(cfg, S, balance, true));
    } else { /* any split to build the shapes; the sums take the model as one stage */
        for (int j = 0; j < S; j++) balance[j] = j == 0 ? cfg->model.n_layers - (S - 1) : 1;
    }
    gp_model m = {0};
    GP_TRY(gp_model_build_meta(cfg, balance, &m));
    int prec = cfg->train.precision, mb = cfg->pipeline.chunks > 0 ? cfg->pipeline.chunks : 1;
    int64_t b = cfg->train.batch_size;
    double elt = prec == GP_PRECISION_BF16 ? 2.0 : 4.0, welt = elt;
    roof_row rows[GP_LAYER_TYPE_COUNT + 1] = {{0}}, tot = {0};
    double params = 0;
    /* the stages whose pairs fuse: the config's balance, else one */
    int nst = given ? S : 1, span[GP_MAX_DEVICES];
    for (int j = 0; j < nst; j++) span[j] = given ? balance[j] : m.n_layers;
    for (int j = 0, first = 0; j < nst; first += span[j++])
        for (int k = first; k < first + span[j]; k++) {
            const gp_layer *l = &m.layers[k];
            roof_layer(g, prec, m.layers, first, first + span[j], k, b, mb, elt, welt, rows);
            rows[l->spec.type].type = (int)l->spec.type;
            params += (double)gp_model_layer_params(l);
        }
    /* the update: value, gradient and state read, value and state written */
    double ub = params * 4.0 * (prec == GP_PRECISION_BF16 ? 7.5 : 7.0);
    roof_add(g, prec, &rows[GP_LAYER_TYPE_COUNT], 1, 12.0 * params, ub);
    fprintf(f, "roofline on one %s (%.0f TFLOP/s %s, %.2f TB/s): a floor for the step, each "
               "launch max(FLOPs / peak, bytes / bandwidth), %d micro-batch%s of %.4g samples\n",
            g->name, g->flops[prec] / 1e12, gp_precision_name((gp_precision)prec), g->bw / 1e12,
            mb, mb == 1 ? "" : "es", (double)b / mb);
    fprintf(f, "  %-14s %9s %12s %12s %10s %7s %9s\n", "layer type", "launches", "GFLOP",
            "GB moved", "ms", "share", "mem-bound");
    for (int t = 0; t <= GP_LAYER_TYPE_COUNT; t++) tot.seconds += rows[t].seconds;
    for (int t = 0; t <= GP_LAYER_TYPE_COUNT; t++) {
        roof_row *r = &rows[t];
        if (!r->launches) continue;
        const char *name = t == GP_LAYER_TYPE_COUNT ? "(update)"
                                                    : gp_layer_type_name((gp_layer_type)t);
        fprintf(f, "  %-14s %9lld %12.2f %12.3f %10.3f %6.1f%% %8.0f%%\n", name,
                (long long)r->launches, r->flops / 1e9, r->bytes / 1e9, r->seconds * 1e3,
                100.0 * r->seconds / tot.seconds, 100.0 * r->bound / r->seconds);
        tot.launches += r->launches;
        tot.flops += r->flops;
        tot.bytes += r->bytes;
        tot.bound += r->bound;
    }
    fprintf(f, "  %-14s %9lld %12.2f %12.3f %10.3f\n", "step", (long long)tot.launches,
            tot.flops / 1e9, tot.bytes / 1e9, tot.seconds * 1e3);
    double tokens = (double)b * (double)cfg->model.input[0];
    if (m.layers[0].spec.type == GP_LAYER_EMBEDDING)
        fprintf(f, "  at that floor: %.0f tokens/s, MFU %.0f%% (the step's FLOPs over the "
                   "peak); measured steps run slower: bench/README.md\n",
                tokens / tot.seconds, 100.0 * tot.flops / (tot.seconds * g->flops[prec]));
    gp_model_free(&m);
    return GP_OK;
}

/* ---- a profile from the roofline (the planner's times on a GPU) ------------- */

/* The link between two GPUs of one node (NVLink 4, one direction: 450
 * GB/s, of which NCCL's bus bandwidth reaches about 360) and the host's
 * (PCIe 5 x16, about 25 GB/s): the copies' and the reductions' floors. */
#define ROOF_LINK 360e9
#define ROOF_PCIE 25e9

gp_status gp_roofline_profile(const gp_config *cfg, const char *gpu, const int64_t *sizes,
                              int n_sizes, gp_profile *out)
{
    const roof_gpu *g = roof_gpu_of(gpu);
    if (!g)
        return gp_error_set(GP_ERR_INVALID, "--gpu %s: not a GPU the estimate knows; give h100 "
                            "or h200", gpu);
    if (n_sizes < 1 || n_sizes > GP_PROFILE_MAX_SIZES)
        return gp_error_set(GP_ERR_INVALID, "roofline profile: 1..%d sizes", GP_PROFILE_MAX_SIZES);
    GP_TRY(gp_model_profile_estimate(cfg, NULL, out)); /* the memory columns */
    int S = cfg->pipeline.n_devices * gp_model_virtual(cfg), balance[GP_MAX_DEVICES];
    for (int j = 0; j < S; j++) balance[j] = j == 0 ? cfg->model.n_layers - (S - 1) : 1;
    gp_model m = {0};
    gp_status s = gp_model_build_meta(cfg, balance, &m);
    gp_layer_times *t = s == GP_OK ? calloc((size_t)n_sizes * (size_t)m.n_layers, sizeof *t) : NULL;
    if (s == GP_OK && !t) s = gp_error_set(GP_ERR_OOM, "out of host memory");
    if (s != GP_OK) {
        if (m.layers) gp_model_free(&m);
        gp_profile_free(out);
        return s;
    }
    int prec = cfg->train.precision;
    double elt = prec == GP_PRECISION_BF16 ? 2.0 : 4.0;
    bool mem;
    for (int z = 0; z < n_sizes; z++) {
        int64_t b = sizes[z];
        for (int k = 0; k < m.n_layers; k++) {
            roof_costs c = roof_costs_of(&m.layers[k], b, 1);
            gp_layer_times *lt = &t[(size_t)z * (size_t)m.n_layers + (size_t)k];
            lt->fwd = roof_launch(g, prec, c.f, (c.in + c.out) * elt + c.np * elt, &mem);
            lt->recompute = lt->fwd;
            if (c.np > 0) {
                lt->bwd_data = roof_has_dx(&m.layers[k])
                                   ? roof_launch(g, prec, c.fb, (c.out + c.in) * elt + c.np * elt,
                                                 &mem)
                                   : 0;
                lt->bwd_weights = roof_launch(g, prec, c.f, (c.out + c.in) * elt + c.np * 8.0, &mem);
            } else {
                lt->bwd_data = roof_launch(g, prec, c.fb, (2 * c.out + 2 * c.in) * elt, &mem);
            }
            lt->bwd_alone = lt->bwd_weights;
            lt->copy = c.out * elt / ROOF_LINK;
        }
        /* the loss: the logits read, their gradient written (a pass each) */
        roof_costs last = roof_costs_of(&m.layers[m.n_layers - 1], b, 1);
        out->loss[z] = 3.0 * last.out * 4.0 / g->bw;
        out->upload[z] = (double)b * (double)(cfg->model.input[0] * cfg->model.input[1] *
                                              cfg->model.input[2]) * 4.0 / ROOF_PCIE;
        out->sizes[z] = b;
    }
    for (int k = 0; k < m.n_layers; k++) /* the update's time: the update launch's share */
        out->mem[k].update = (double)gp_model_layer_params(&m.layers[k]) * 4.0 *
                             (prec == GP_PRECISION_BF16 ? 7.5 : 7.0) / g->bw;
    gp_model_free(&m);
    free(out->t);
    out->t = t;
    out->n_sizes = n_sizes;
    out->timed = true;
    snprintf(out->device, sizeof out->device, "%s", g->name);
    return GP_OK;
}

double gp_roofline_peak(const char *gpu, int precision)
{
    const roof_gpu *g = roof_gpu_of(gpu);
    return g ? g->flops[precision] : 0;
}
