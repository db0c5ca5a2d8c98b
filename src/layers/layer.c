/*
 * layer.c — what every layer shares: type names and spec defaults, creation
 * and destruction, the forward/backward wrappers that allocate outputs,
 * parameter helpers, gp_saved, layer descriptions for messages, and the
 * losses (cross-entropy, binary cross-entropy with logits).
 */
#include "layers/layers_impl.h"
#include "backend/elementwise.h"

#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[GP_LAYER_TYPE_COUNT] = {
    "linear",  "conv2d",  "batchnorm", "relu",    "maxpool2d",
    "avgpool2d", "global_avgpool", "flatten", "dropout", "residual",
    "identity", "add", "concat",
    "leaky_relu", "dropout2d", "instance_norm", "upsample",
    "factorized_reduce", "amoeba_cell",
    "attention",
    "gelu", "layer_norm", "embedding", "rms_norm", "swiglu", "rope",
};

static const char *const init_names[GP_INIT_COUNT] = {"default", "kaiming_normal_fan_out",
                                                          "normal"};

const char *gp_conv_init_name(gp_conv_init i)
{
    if ((int)i < 0 || i >= GP_INIT_COUNT) return "unknown";
    return init_names[i];
}

const char *gp_hw_str(gp_hw v, char *buf, size_t len)
{
    if (gp_hw_is_square(v)) snprintf(buf, len, "%lld", (long long)v.h);
    else snprintf(buf, len, "[%lld, %lld]", (long long)v.h, (long long)v.w);
    return buf;
}

const char *gp_layer_type_name(gp_layer_type t)
{
    if ((int)t < 0 || t >= GP_LAYER_TYPE_COUNT) return "unknown";
    return type_names[t];
}

bool gp_layer_type_parse(const char *name, gp_layer_type *out)
{
    for (int t = 0; t < GP_LAYER_TYPE_COUNT; t++) {
        if (!strcmp(name, type_names[t])) {
            *out = (gp_layer_type)t;
            return true;
        }
    }
    return false;
}

gp_layer_spec gp_layer_spec_default(gp_layer_type type)
{
    gp_layer_spec s;
    memset(&s, 0, sizeof s);
    s.type = type;
    bool pool = type == GP_LAYER_MAXPOOL2D || type == GP_LAYER_AVGPOOL2D;
    s.stride = gp_hw_square(pool ? 0 : 1); /* pools: 0 = the kernel size */
    s.bias = true;
    s.count_include_pad = true;
    s.init = GP_INIT_DEFAULT;
    s.std = 0.02f;
    s.momentum = 0.1f;
    s.eps = 1e-5f;
    s.p = 0.5f;
    s.slope = 0.01f;
    s.scale = 2;
    s.heads = 1;
    s.rope_theta = 10000.0f;
    s.rope_factor = 8.0f;
    s.rope_low_freq = 1.0f;
    s.rope_high_freq = 4.0f;
    s.rope_orig_positions = 8192;
    return s;
}

const gp_layer_ops *gp_layer_ops_for(gp_layer_type t)
{
    switch (t) {
    case GP_LAYER_LINEAR: return &gp_linear_ops;
    case GP_LAYER_CONV2D: return &gp_conv2d_ops;
    case GP_LAYER_BATCHNORM: return &gp_batchnorm_ops;
    case GP_LAYER_RELU: return &gp_relu_ops;
    case GP_LAYER_MAXPOOL2D: return &gp_maxpool2d_ops;
    case GP_LAYER_AVGPOOL2D: return &gp_avgpool2d_ops;
    case GP_LAYER_GLOBAL_AVGPOOL: return &gp_global_avgpool_ops;
    case GP_LAYER_FLATTEN: return &gp_flatten_ops;
    case GP_LAYER_DROPOUT: return &gp_dropout_ops;
    case GP_LAYER_RESIDUAL: return &gp_residual_ops;
    case GP_LAYER_IDENTITY: return &gp_identity_ops;
    case GP_LAYER_ADD: return &gp_add_ops;
    case GP_LAYER_CONCAT: return &gp_concat_ops;
    case GP_LAYER_LEAKY_RELU: return &gp_leaky_relu_ops;
    case GP_LAYER_DROPOUT2D: return &gp_dropout2d_ops;
    case GP_LAYER_INSTANCE_NORM: return &gp_instance_norm_ops;
    case GP_LAYER_UPSAMPLE: return &gp_upsample_ops;
    case GP_LAYER_FACTORIZED_REDUCE: return &gp_factorized_reduce_ops;
    case GP_LAYER_AMOEBA_CELL: return &gp_amoeba_cell_ops;
    case GP_LAYER_ATTENTION: return &gp_attention_ops;
    case GP_LAYER_GELU: return &gp_gelu_ops;
    case GP_LAYER_LAYER_NORM: return &gp_layer_norm_ops;
    case GP_LAYER_EMBEDDING: return &gp_embedding_ops;
    case GP_LAYER_RMS_NORM: return &gp_rms_norm_ops;
    case GP_LAYER_SWIGLU: return &gp_swiglu_ops;
    case GP_LAYER_ROPE: return &gp_rope_ops;
    default: return NULL;
    }
}

const char *gp_layer_window_str(const gp_layer_spec *s, char *buf, size_t len)
{
    char k[48], st[48], p[48];
    const char *init = s->init != GP_INIT_DEFAULT ? gp_conv_init_name(s->init) : NULL;
    if (len) buf[0] = '\0';
    switch (s->type) {
    case GP_LAYER_CONV2D:
    case GP_LAYER_MAXPOOL2D:
    case GP_LAYER_AVGPOOL2D: {
        bool pool = s->type != GP_LAYER_CONV2D; /* stride {0, 0}: the kernel */
        gp_hw sd = pool && !s->stride.h && !s->stride.w ? s->kernel : s->stride;
        bool excl = s->type == GP_LAYER_AVGPOOL2D && !s->count_include_pad;
        snprintf(buf, len, "{kernel: %s, stride: %s, padding: %s%s%s%s}",
                 gp_hw_str(s->kernel, k, sizeof k), gp_hw_str(sd, st, sizeof st),
                 gp_hw_str(s->padding, p, sizeof p), excl ? ", count_include_pad: false" : "",
                 init && s->type == GP_LAYER_CONV2D ? ", init: " : "",
                 init && s->type == GP_LAYER_CONV2D ? init : "");
        break;
    }
    case GP_LAYER_RESIDUAL:
    case GP_LAYER_ADD:
    case GP_LAYER_FACTORIZED_REDUCE:
        if (init) snprintf(buf, len, "{init: %s}", init);
        break;
    case GP_LAYER_LINEAR: /* GPT-2's init, and the layer whose weight it is */
        if (s->init == GP_INIT_NORMAL)
            snprintf(buf, len, "{init: normal, std: %g%s%s}", (double)s->std,
                     s->tie[0] ? ", tie: " : "", s->tie);
        else if (s->tie[0]) snprintf(buf, len, "{tie: %s}", s->tie);
        break;
    case GP_LAYER_AMOEBA_CELL:
        if (s->reduction) snprintf(buf, len, "{reduction: true}");
        break;
    case GP_LAYER_ATTENTION:
        if (s->kv_heads && s->kv_heads != s->heads)
            snprintf(buf, len, "{heads: %lld, kv_heads: %lld}", (long long)s->heads,
                     (long long)s->kv_heads);
        else snprintf(buf, len, "{heads: %lld}", (long long)s->heads);
        break;
    case GP_LAYER_ROPE:
        snprintf(buf, len, "{heads: %lld, kv_heads: %lld, theta: %g%s}", (long long)s->heads,
                 (long long)(s->kv_heads ? s->kv_heads : s->heads), (double)s->rope_theta,
                 s->rope_llama3 ? ", scaling: llama3" : "");
        break;
    default:
        break;
    }
    return buf;
}

/* ---- descriptions and errors ------------------------------------------ */

/* fmt's text at buf + off; off after it.  A text cut by len ends before
 * the character it would cut in half (a layer's name or its config's path
 * in a message, which a JSON writer or a terminal then reads as UTF-8),
 * and every later append is nothing, as after a cut between characters. */
static size_t append(char *buf, size_t len, size_t off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static size_t append(char *buf, size_t len, size_t off, const char *fmt, ...)
{
    if (off + 1 >= len) return off; /* full, or cut: buf ends at off */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + off, len - off, fmt, ap);
    va_end(ap);
    if (n < 0) return off;
    if ((size_t)n < len - off) return off + (size_t)n;
    buf[gp_utf8_cut(buf, len - 1)] = '\0';
    return len - 1;
}

const char *gp_layer_spec_describe(const gp_layer_spec *sp, int index, char *buf, size_t len)
{
    if (len == 0) return buf;
    buf[0] = '\0';
    size_t off = append(buf, len, 0, "layer %d (%s", index, gp_layer_type_name(sp->type));
    if (sp->name[0]) off = append(buf, len, off, " '%s'", sp->name);
    off = append(buf, len, off, ")");
    if (sp->line > 0) {
        if (sp->file[0])
            off = append(buf, len, off, " at %s:%d:%d", sp->file, sp->line, sp->column);
        else
            off = append(buf, len, off, " at line %d, column %d", sp->line, sp->column);
    }
    if (sp->set[0]) /* the file's line may read right: the override changed it */
        append(buf, len, off, sp->line > 0 ? " (as %s %s changed it)" : " from %s %s",
               gp_opt_name(GP_OPT_SET), sp->set);
    return buf;
}

const char *gp_layer_describe(const gp_layer *l, char *buf, size_t len)
{
    return gp_layer_spec_describe(&l->spec, l->index, buf, len);
}

gp_status gp_layer_spec_error(const gp_layer *l, const char *fmt, ...)
{
    char msg[512], d[400];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* cut between two characters, as every message is (a name or a path of
     * multi-byte characters in it) */
    if (n >= (int)sizeof msg) msg[gp_utf8_cut(msg, sizeof msg - 1)] = '\0';
    return gp_error_set(GP_ERR_INVALID, "%s: %s", gp_layer_describe(l, d, sizeof d), msg);
}

const char *gp_layers_shape_n(const gp_shape *s, char *buf, size_t len)
{
    if (len == 0) return buf;
    buf[0] = '\0';
    size_t off = append(buf, len, 0, "(N");
    for (int i = 1; i < s->ndim; i++) off = append(buf, len, off, ", %lld", (long long)s->dims[i]);
    append(buf, len, off, ")");
    return buf;
}

int64_t gp_layers_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad)
{
    if (kernel <= 0 || stride <= 0 || in + 2 * pad < kernel) return 0;
    return (in + 2 * pad - kernel) / stride + 1;
}

gp_hw gp_layers_out_hw(int64_t in_h, int64_t in_w, gp_hw kernel, gp_hw stride, gp_hw pad)
{
    return (gp_hw){gp_layers_out_size(in_h, kernel.h, stride.h, pad.h),
                   gp_layers_out_size(in_w, kernel.w, stride.w, pad.w)};
}

/* ---- creation ------------------------------------------------------------ */

static gp_status setup(const gp_layer_spec *spec, int index, int param_base, const gp_shape *in,
                       gp_device *dev, bool meta, uint64_t seed, gp_layer *out)
{
    memset(out, 0, sizeof *out);
    out->spec = *spec;
    out->index = index;
    out->param_base = param_base;
    out->ops = gp_layer_ops_for(spec->type);
    if (!out->ops)
        return gp_error_set(GP_ERR_INVALID, "layer %d: unknown layer type %d", index,
                            (int)spec->type);
    if (spec->n_pop != out->ops->pops && !(out->ops->pops_optional && spec->n_pop == 0)) {
        if (out->ops->pops == 0)
            return gp_layer_spec_error(out, "pops '%s', but a %s layer takes no popped tensor; "
                                       "pop it in an add or concat layer",
                                       spec->pop[0], gp_layer_type_name(spec->type));
        return gp_layer_spec_error(out, "needs %d popped tensor%s (pop: NAME, the name a "
                                   "layer before it stashed) but has %d", out->ops->pops,
                                   out->ops->pops == 1 ? "" : "s", spec->n_pop);
    }
    out->n_in = 1 + spec->n_pop;
    gp_shape ins[1 + GP_MAX_POPS] = {{0}};
    for (int q = 0; q < out->n_in; q++) ins[q] = gp_shape_with_batch(&in[q], 1);
    out->in_shape = ins[0];
    for (int q = 1; q < out->n_in; q++) out->pop_shape[q - 1] = ins[q];
    for (int q = 0; q < out->n_in; q++)
        if (gp_shape_numel_within(&ins[q], GP_MAX_NUMEL) < 0)
            return gp_layer_spec_error(out, "its %s holds more than 2^38 values a sample; "
                                       "make model.input or the layers before it smaller",
                                       q ? "popped tensor" : "input");
    GP_TRY(out->ops->infer(out, ins, &out->out_shape));
    out->out_shape = gp_shape_with_batch(&out->out_shape, 1);
    if (gp_shape_numel_within(&out->out_shape, GP_MAX_NUMEL) < 0)
        return gp_layer_spec_error(out, "its output would hold more than 2^38 values a sample; "
                                   "make the layer (or its input) smaller");
    out->dev = dev;
    out->meta = meta;
    if (!dev && !meta) return GP_OK;
    gp_status s = out->ops->init(out, seed);
    if (s != GP_OK) gp_layer_destroy(out);
    return s;
}

gp_status gp_layer_setup(const gp_layer_spec *spec, int index, int param_base,
                         const gp_shape *in, gp_device *dev, uint64_t seed, gp_layer *out)
{
    return setup(spec, index, param_base, in, dev, false, seed, out);
}

gp_status gp_layer_create(const gp_layer_spec *spec, int index, const gp_shape *in,
                          gp_device *dev, uint64_t seed, gp_layer *out)
{
    GP_ASSERT(dev != NULL);
    gp_status s = gp_layer_setup(spec, index, 0, in, dev, seed, out);
    if (s != GP_OK && s != GP_ERR_INVALID) {
        /* infer names the layer itself; failures of init (out of memory on
         * the device) get the layer prepended here */
        char d[256];
        gp_error_wrap(s, "%s", gp_layer_spec_describe(spec, index, d, sizeof d));
    }
    return s;
}

gp_status gp_layer_shapes(const gp_layer_spec *spec, int index, const gp_shape *in,
                          gp_layer *out)
{
    return gp_layer_setup(spec, index, 0, in, NULL, 0, out);
}

gp_status gp_layer_meta(const gp_layer_spec *spec, int index, const gp_shape *in,
                        gp_layer *out)
{
    return setup(spec, index, 0, in, NULL, true, 0, out);
}

void gp_layer_destroy(gp_layer *l)
{
    if (!l || !l->ops) return;
    if (l->ops->destroy) l->ops->destroy(l);
    for (int p = 0; p < l->n_params; p++) {
        gp_tensor_free(&l->params[p].value);
        gp_tensor_free(&l->params[p].grad);
    }
    free(l->params);
    memset(l, 0, sizeof *l);
}

/* ---- parameters ---------------------------------------------------------- */

/* Room for `more` parameters after l->n_params. */
static gp_status params_reserve(gp_layer *l, int more)
{
    if (l->n_params + more <= l->cap_params) return GP_OK;
    int cap = l->cap_params ? l->cap_params : 4;
    while (cap < l->n_params + more) cap *= 2;
    gp_param *p = realloc(l->params, (size_t)cap * sizeof *p);
    if (!p) return gp_error_set(GP_ERR_OOM, "out of host memory for %d parameters", cap);
    l->params = p;
    l->cap_params = cap;
    return GP_OK;
}
/* gp_layers_with_grads(false): parameters without gradients (an
 * inference-only model) */
static _Thread_local bool no_grads;


gp_status gp_layers_add_param(gp_layer *l, const char *name, const gp_shape *shape,
                              bool is_buffer, bool no_decay)
{
    if (gp_shape_numel_within(shape, GP_MAX_NUMEL) < 0)
        return gp_layer_spec_error(l, "its parameter '%s' would hold more than 2^38 values; "
                                   "make the layer smaller", name);
    GP_TRY(params_reserve(l, 1));
    gp_param *p = &l->params[l->n_params];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->is_buffer = is_buffer;
    p->no_decay = no_decay;
    if (l->meta) { /* the shape, nothing allocated */
        p->value.ndim = shape->ndim;
        memcpy(p->value.dims, shape->dims, sizeof p->value.dims);
        l->n_params++;
        return GP_OK;
    }
    GP_TRY(gp_tensor_alloc(&p->value, l->dev, shape, GP_MEM_PARAMS));
    if (!is_buffer && !no_grads) {
        gp_status s = gp_tensor_zeros(&p->grad, l->dev, shape, GP_MEM_GRADS);
        if (s != GP_OK) {
            gp_tensor_free(&p->value);
            return s;
        }
    }
    l->n_params++;
    return GP_OK;
}

gp_layer_spec gp_layers_child_spec(const gp_layer *parent, gp_layer_type t, const char *name)
{
    gp_layer_spec s = gp_layer_spec_default(t);
    snprintf(s.name, sizeof s.name, "%s", name);
    memcpy(s.file, parent->spec.file, sizeof s.file);
    memcpy(s.set, parent->spec.set, sizeof s.set);
    s.line = parent->spec.line;
    s.column = parent->spec.column;
    return s;
}

gp_status gp_layers_child_setup(gp_layer *parent, const gp_layer_spec *spec, const char *prefix,
                                const gp_shape *in, uint64_t seed, gp_layer *child, int *first)
{
    GP_TRY(setup(spec, parent->index, parent->n_params, in, parent->dev, parent->meta, seed,
                 child));
    gp_status s = params_reserve(parent, child->n_params);
    if (s != GP_OK) {
        gp_layer_destroy(child); /* its tensors are still its own */
        return s;
    }
    *first = parent->n_params;
    for (int p = 0; p < child->n_params; p++) {
        gp_param *dst = &parent->params[parent->n_params++];
        *dst = child->params[p];
        size_t a = strlen(prefix), b = strlen(child->params[p].name);
        GP_ASSERT(a + 1 + b < sizeof dst->name); /* the names are the code's own */
        memcpy(dst->name, prefix, a);
        dst->name[a] = '.';
        memcpy(dst->name + a + 1, child->params[p].name, b + 1);
    }
    gp_layers_child_view(parent, child, *first);
    return GP_OK;
}

void gp_layers_child_view(const gp_layer *parent, gp_layer *child, int first)
{
    for (int p = 0; p < child->n_params; p++) {
        child->params[p].value = parent->params[first + p].value;
        child->params[p].value.owned = false;
        child->params[p].grad = parent->params[first + p].grad;
        child->params[p].grad.owned = false;
    }
}

static _Thread_local bool no_draw; /* gp_layers_draw_init(false) */
bool gp_layers_with_grads(bool grads)
{
    bool was = !no_grads;
    no_grads = !grads;
    return was;
}

bool gp_layers_draw_init(bool draw)
{
    bool was = !no_draw;
    no_draw = !draw;
    return was;
}

/* params[p] from the counter-based RNG on the host: uniform(-scale, scale)
 * or normal(0, scale), drawn from (seed, stream(index, param_base + p,
 * "init")) and uploaded, so the values do not depend on placement; zeros
 * where this thread's layers draw nothing (gp_layers_draw_init). */
static gp_status init_random(gp_layer *l, int p, uint64_t seed, float scale, bool normal)
{
    if (l->meta) return GP_OK;
    gp_tensor *t = &l->params[p].value;
    int64_t n = gp_tensor_numel(t);
    if (no_draw) return gp_dev_fill(l->dev, gp_f32(t), 0.0f, n);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    if (!h) return gp_error_set(GP_ERR_OOM, "out of host memory initialising %lld parameters",
                                (long long)n);
    uint64_t stream = gp_rng_stream((uint64_t)l->index, (uint64_t)(l->param_base + p),
                                    GP_RNG_TAG_INIT);
    if (normal) {
        gp_rng_normal_fill(seed, stream, 0, h, n);
        for (int64_t i = 0; i < n; i++) h[i] *= scale;
    } else {
        gp_rng_uniform_fill(seed, stream, 0, h, n);
        for (int64_t i = 0; i < n; i++) h[i] = (2.0f * h[i] - 1.0f) * scale;
    }
    gp_status s = gp_dev_upload(l->dev, gp_f32(t), h, n);
    if (s == GP_OK) s = gp_dev_synchronize(l->dev); /* h is freed next */
    free(h);
    return s;
}

gp_status gp_layers_init_uniform(gp_layer *l, int p, uint64_t seed, float bound)
{
    return init_random(l, p, seed, bound, false);
}

gp_status gp_layers_init_normal(gp_layer *l, int p, uint64_t seed, float std)
{
    return init_random(l, p, seed, std, true);
}

gp_status gp_layers_fill_param(gp_layer *l, int p, float v)
{
    if (l->meta) return GP_OK;
    gp_tensor *t = &l->params[p].value;
    return gp_dev_fill(l->dev, gp_f32(t), v, gp_tensor_numel(t));
}

gp_status gp_layers_zero_rows(gp_layer *l, int p, int64_t first)
{
    gp_tensor *t = &l->params[p].value;
    int64_t rows = t->dims[0], per = rows > 0 ? gp_tensor_numel(t) / rows : 0;
    if (l->meta || first >= rows) return GP_OK;
    return gp_dev_fill(l->dev, gp_f32(t) + first * per, 0.0f, (rows - first) * per);
}

gp_status gp_layer_zero_grad(gp_layer *l)
{
    for (int p = 0; p < l->n_params; p++) {
        gp_tensor *g = &l->params[p].grad;
        int64_t n = gp_tensor_numel(g);
        if (l->params[p].is_buffer || n == 0) continue;
        GP_TRY(gp_dev_fill(g->dev, gp_f32(g), 0.0f, n));
    }
    l->grads_stale = false;
    return GP_OK;
}

gp_status gp_layers_zero_stale(gp_layer *layers, int n)
{
    float *xs[GP_NONFINITE_BATCH];
    int64_t ns[GP_NONFINITE_BATCH];
    gp_device *dev = NULL;
    int k = 0;
    for (int c = 0; c < n; c++) {
        gp_layer *l = &layers[c];
        if (l->meta || !l->grads_stale || l->ops->overwrites_grads) continue;
        for (int p = 0; p < l->n_params; p++) { /* gp_layer_zero_grad's tensors */
            gp_tensor *g = &l->params[p].grad;
            int64_t numel = gp_tensor_numel(g);
            if (l->params[p].is_buffer || numel == 0) continue;
            if (k == GP_NONFINITE_BATCH || (k > 0 && g->dev != dev)) {
                GP_TRY(gp_dev_zero_many(dev, xs, ns, k));
                k = 0;
            }
            dev = g->dev;
            xs[k] = gp_f32(g);
            ns[k++] = numel;
        }
        l->grads_stale = false;
    }
    return k ? gp_dev_zero_many(dev, xs, ns, k) : GP_OK;
}

gp_status gp_layer_check_finite(const gp_layer *l, const char *when)
{
    for (int p = 0; p < l->n_params; p++) {
        const gp_tensor *t = &l->params[p].value;
        int64_t n = gp_tensor_numel(t);
        int bad = 0;
        if (n == 0) continue;
        GP_TRY(gp_dev_nonfinite(t->dev, gp_f32(t), n, &bad));
        if (!bad) continue;
        float *h = malloc((size_t)n * sizeof *h);
        if (!h) return gp_error_set(GP_ERR_OOM, "out of host memory");
        gp_status s = gp_dev_download(t->dev, h, gp_f32(t), n);
        if (s == GP_OK) s = gp_dev_synchronize(t->dev);
        int64_t at = 0;
        while (s == GP_OK && at < n - 1 && isfinite(h[at])) at++;
        float v = h[at];
        free(h);
        GP_TRY(s);
        char d[160];
        return gp_error_set(GP_ERR_NUMERIC,
                            "%s: %s[%lld] is %g %s; the run diverged: lower "
                            "train.optimizer.lr, add warm-up or gradient-friendly normalisation, "
                            "or check the data",
                            gp_layer_describe(l, d, sizeof d), l->params[p].name, (long long)at,
                            (double)v, when);
    }
    return GP_OK;
}

gp_status gp_layers_flag_nonfinite(const gp_layer *ls, int count, gp_device *dev, float *flag,
                                   bool skip_trained)
{
    /* every parameter of the device's layers in one table: one launch per
     * GP_NONFINITE_BATCH tensors (gp_dev_nonfinite_or_many) */
    int n = 0;
    for (int k = 0; k < count; k++)
        if (!ls[k].meta && ls[k].dev == dev) n += ls[k].n_params;
    if (n == 0) return GP_OK;
    const float **xs = malloc((size_t)n * sizeof *xs);
    int64_t *ns = malloc((size_t)n * sizeof *ns);
    if (!xs || !ns) {
        free(xs);
        free(ns);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    int i = 0;
    for (int k = 0; k < count; k++) {
        if (ls[k].meta || ls[k].dev != dev) continue;
        for (int p = 0; p < ls[k].n_params; p++) {
            if (skip_trained && gp_param_trained(&ls[k].params[p])) continue;
            xs[i] = gp_f32(&ls[k].params[p].value);
            ns[i++] = gp_tensor_numel(&ls[k].params[p].value);
        }
    }
    gp_status st = i ? gp_dev_nonfinite_or_many(dev, xs, ns, i, flag) : GP_OK;
    free(xs);
    free(ns);
    return st;
}

gp_status gp_layers_name_nonfinite(const gp_layer *ls, int count, const char *when)
{
    for (int k = 0; k < count; k++) GP_TRY(gp_layer_check_finite(&ls[k], when));
    return GP_OK;
}

void gp_layer_grads_begin(gp_layer *l) { l->grads_stale = true; }

gp_status gp_layer_grads_finish(gp_layer *l)
{
    return l->grads_stale ? gp_layer_zero_grad(l) : GP_OK;
}

int64_t gp_layer_param_count(const gp_layer *l)
{
    int64_t n = 0;
    for (int p = 0; p < l->n_params; p++)
        if (!l->params[p].is_buffer) n += gp_tensor_numel(&l->params[p].value);
    return n;
}

int64_t gp_layer_tied_count(const gp_layer *l)
{
    int64_t n = 0;
    for (int p = 0; p < l->n_params; p++)
        if (l->params[p].tied) n += gp_tensor_numel(&l->params[p].value);
    return n;
}

int gp_layer_tensor_count(const gp_layer *l)
{
    int n = 0;
    for (int p = 0; p < l->n_params; p++) n += gp_param_trained(&l->params[p]);
    return n;
}

int64_t gp_layer_buffer_count(const gp_layer *l)
{
    int64_t n = 0;
    for (int p = 0; p < l->n_params; p++)
        if (l->params[p].is_buffer) n += gp_tensor_numel(&l->params[p].value);
    return n;
}

/* Channels [d0, d0 + c) of dst (N, dc, HW) = channels [s0, s0 + c) of src
 * (N, sc, HW): concatenation and its gradient's slices. */
gp_status gp_layers_copy(gp_device *dev, void *dst, const gp_tensor *src)
{
    size_t bytes = gp_tensor_bytes(src);
    if (bytes == 0 || dst == gp_tensor_mem(src)) return GP_OK;
    return gp_dev_copy_d2d(dev, dst, gp_tensor_mem(src), bytes);
}

gp_status gp_layers_copy_channels(gp_device *dev, gp_tensor *dst, int64_t d0,
                                  const gp_tensor *src, int64_t s0, int64_t c)
{
    GP_ASSERT(dst->ndim == 4 && src->ndim == 4 && dst->dtype == src->dtype &&
              dst->dims[0] == src->dims[0] && dst->dims[2] * dst->dims[3] == src->dims[2] * src->dims[3]);
    const int64_t n = dst->dims[0], hw = dst->dims[2] * dst->dims[3];
    const int64_t dc = dst->dims[1], sc = src->dims[1];
    if (n * c * hw == 0) return GP_OK;
    const int64_t ds[4] = {dc * hw, hw, hw, 1}, ss[4] = {sc * hw, hw, hw, 1};
    const int64_t dims[4] = {n, c, 1, hw};
    const size_t es = gp_dtype_size(dst->dtype);
    return gp_dev_copy_box_es(dev, (char *)gp_tensor_mem(dst) + (size_t)(d0 * hw) * es, ds,
                              (const char *)gp_tensor_mem(src) + (size_t)(s0 * hw) * es, ss, dims,
                              es);
}

/* ---- saved tensors -------------------------------------------------------- */

gp_status gp_layers_saved_alloc(gp_saved *s, int slot, gp_device *dev, const gp_shape *shape)
{
    return gp_layers_saved_alloc_as(s, slot, dev, shape, GP_F32);
}

gp_status gp_layers_saved_alloc_as(gp_saved *s, int slot, gp_device *dev, const gp_shape *shape,
                                   gp_dtype dt)
{
    GP_ASSERT(slot >= 0 && slot < GP_SAVED_MAX && gp_tensor_mem(&s->t[slot]) == NULL);
    return gp_tensor_alloc_as(&s->t[slot], dev, shape, dt, GP_MEM_ACTIVATIONS);
}

void gp_saved_free(gp_saved *s)
{
    if (!s) return;
    for (int k = 0; k < GP_SAVED_MAX; k++) gp_tensor_free(&s->t[k]);
    if (s->ws) gp_dev_free(s->ws_dev, s->ws, s->ws_bytes, GP_MEM_ACTIVATIONS);
    for (int k = 0; k < s->n_sub; k++) gp_saved_free(&s->sub[k]);
    free(s->sub);
    memset(s, 0, sizeof *s);
}

size_t gp_saved_bytes(const gp_saved *s)
{
    size_t b = s->ws ? s->ws_bytes : 0;
    for (int k = 0; k < GP_SAVED_MAX; k++)
        if (s->t[k].owned) b += gp_tensor_bytes(&s->t[k]);
    for (int k = 0; k < s->n_sub; k++) b += gp_saved_bytes(&s->sub[k]);
    return b;
}

/* ---- forward / backward wrappers ----------------------------------------- */

static gp_status check_input(const gp_layer *l, const gp_tensor *x)
{
    int64_t n = x[0].ndim ? x[0].dims[0] : 0;
    for (int q = 0; q < l->n_in; q++) {
        gp_shape xs = gp_tensor_shape(&x[q]);
        gp_shape want = gp_shape_with_batch(q ? &l->pop_shape[q - 1] : &l->in_shape, n);
        if (gp_shape_equal(&xs, &want) && x[q].dev == l->dev) continue;
        char a[96], b[96], what[GP_SKIP_NAME + 16];
        if (q) snprintf(what, sizeof what, "popped '%s'", l->spec.pop[q - 1]);
        else snprintf(what, sizeof what, "input");
        if (x[q].dev != l->dev)
            return gp_layer_spec_error(l, "%s is on %s but the layer is on %s", what,
                                       x[q].dev ? x[q].dev->name : "no device", l->dev->name);
        return gp_layer_spec_error(l, "%s has shape %s but the layer was built for %s", what,
                                   gp_shape_str(&xs, a, sizeof a),
                                   gp_layers_shape_n(&want, b, sizeof b));
    }
    return GP_OK;
}

/* dx[q] allocated like x[q] (its shape and element type), for every
 * input; all freed on failure.  dx[0] as a view of *take (shaped as x)
 * where the layer hands dy on unchanged and *take owns its memory, of x's
 * element type; the others allocated. */
static bool takes_as(const gp_tensor *take, const gp_tensor *x)
{
    return take->dtype == x->dtype && gp_tensor_numel(take) == gp_tensor_numel(x);
}

/* Whether every input's gradient is dy itself (ops->dx_all_dy): each dx[q]
 * a view of *take. */
static bool all_take(const gp_layer *l, const gp_tensor *x, const gp_tensor *take, bool views)
{
    if (!views || !take || !take->owned || !l->ops->dx_all_dy || !l->ops->dx_all_dy(l)) return false;
    for (int q = 0; q < l->n_in; q++)
        if (!takes_as(take, &x[q])) return false;
    return true;
}

static gp_status alloc_dx(const gp_layer *l, const gp_tensor *x, gp_tensor *dx,
                          const gp_tensor *take, bool views, const gp_tensor *into)
{
    int from = 0;
    if (into) { /* dx[0] adds into another gradient of x (ctx->dx_into) */
        GP_ASSERT(gp_layer_dx_adds(l, &x[0], into));
        gp_shape xs = gp_tensor_shape(&x[0]);
        dx[0] = gp_tensor_reshape(into, &xs);
        dx[0].owned = false;
        from = 1;
    } else if (take && l->ops->dx_is_dy && take->owned && takes_as(take, &x[0])) {
        gp_shape xs = gp_tensor_shape(&x[0]);
        dx[0] = gp_tensor_reshape(take, &xs);
        from = 1;
    }
    if (from && all_take(l, x, take, views)) { /* the views only: no copy (took) */
        for (int q = 1; q < l->n_in; q++) {
            gp_shape xs = gp_tensor_shape(&x[q]);
            dx[q] = gp_tensor_reshape(take, &xs);
        }
        return GP_OK;
    }
    for (int q = from; q < l->n_in; q++) {
        gp_shape xs = gp_tensor_shape(&x[q]);
        gp_status st = gp_tensor_alloc_as(&dx[q], l->dev, &xs, x[q].dtype, GP_MEM_ACTIVATIONS);
        if (st != GP_OK) {
            for (int r = 0; r < q; r++) gp_tensor_free(&dx[r]);
            return st;
        }
    }
    return GP_OK;
}

static void free_dx(const gp_layer *l, gp_tensor *dx)
{
    for (int q = 0; q < l->n_in; q++) gp_tensor_free(&dx[q]); /* a view: only emptied */
}

/* After a successful backward: a dx[0] that is a view of *take becomes
 * the owner of take's memory, and *take is left empty.  Where every dx[q]
 * views it (dx_all_dy), the last input's owns it and the others stay
 * views: a pop's gradient lives until its stash reads it, after the main
 * input's gradient (dx[0]) has been read by the layer before, whose
 * backward comes first (checkpoint.c add_stash_grad). */
static void took(const gp_layer *l, gp_tensor *dx, gp_tensor *take)
{
    if (!take || !dx[0].mem || dx[0].owned || dx[0].mem != take->mem) return;
    int owner = 0, pops = 0;
    for (int q = 1; q < l->n_in; q++)
        if (dx[q].mem == take->mem && !dx[q].owned) owner = q, pops++;
    /* One pop at most shares the main input's gradient (the plain add's
     * one): checkpoint.c add_stash_grad settles a view against the one
     * skip gradient that owns its memory, adding into it and handing it
     * on; a second pop's gradient, a view of the same memory, would be
     * read after that (its stash's gradient summed twice, or read freed). */
    GP_ASSERT(pops <= 1);
    dx[owner].owned = true;
    *take = (gp_tensor){0};
}

/* ---- the storage adapter (gp_layer.out_dtype, layers.h) ---------------- */

gp_status gp_layers_accumulate(gp_device *dev, gp_tensor *g, const gp_tensor *sg)
{
    int64_t n = gp_tensor_numel(g);
    GP_ASSERT(gp_tensor_numel(sg) == n && g->dtype == sg->dtype);
    if (n == 0) return GP_OK;
    if (g->dtype == GP_F32) return gp_dev_axpy(dev, 1.0f, gp_f32(sg), gp_f32(g), n);
    if (g->dtype == GP_BF16 && dev->iface->add_bf16) /* one pass, the same bits */
        return gp_dev_add_bf16(dev, gp_bf16(g), gp_bf16(sg), gp_bf16(g), n);
    gp_tensor gf, sf = {0};
    GP_TRY(gp_tensor_as(&gf, g, GP_F32, GP_MEM_ACTIVATIONS));
    gp_status st = gp_tensor_as(&sf, sg, GP_F32, GP_MEM_ACTIVATIONS);
    if (st == GP_OK) st = gp_dev_axpy(dev, 1.0f, gp_f32(&sf), gp_f32(&gf), n);
    if (st == GP_OK) st = gp_tensor_convert(g, &gf);
    gp_tensor_free(&sf);
    gp_tensor_free(&gf);
    return st;
}

/* Whether layer l runs through the adapter for inputs x: its output or an
 * input is not FP32, and its ops cannot take them as they are (any
 * dtype, or bf16 where its device has the kernels: takes_bf16). */
static bool adapts(const gp_layer *l, const gp_tensor *x)
{
    bool f32 = l->out_dtype == GP_F32, same = true;
    for (int q = 0; q < l->n_in; q++) {
        bool data = q == 0 && l->ops->data_input && x[q].dtype == GP_F32;
        f32 = f32 && x[q].dtype == GP_F32;
        same = same && (data || x[q].dtype == l->out_dtype);
    }
    if (f32) return false;
    bool takes = l->ops->any_dtype ||
                 (l->out_dtype == GP_BF16 && l->ops->takes_bf16 && l->ops->takes_bf16(l));
    return !(takes && same);
}

gp_dtype gp_layer_kernel_dtype(const gp_layer *l, gp_dtype dt)
{
    GP_ASSERT(l->n_in == 1);
    gp_tensor x = {.dtype = dt};
    return adapts(l, &x) ? GP_F32 : dt;
}

static void free_all(gp_tensor *t, int n)
{
    for (int q = 0; q < n; q++) gp_tensor_free(&t[q]);
}

/* wide[q] = t[q] as FP32 (views where they are; shapes alone where
 * `shape_only` says the layer reads no values), freed by free_all. */
static gp_status widen(const gp_tensor *t, int n, const bool *shape_only, gp_tensor *wide)
{
    for (int q = 0; q < n; q++) {
        gp_status st = GP_OK;
        if (shape_only && shape_only[q]) {
            wide[q] = t[q];
            wide[q].mem = NULL;
            wide[q].owned = false;
            wide[q].dtype = GP_F32;
        } else {
            st = gp_tensor_as(&wide[q], &t[q], GP_F32, GP_MEM_ACTIVATIONS);
            if (st == GP_OK && t[q].dtype != GP_F32) /* a copy, not a view */
                gp_dev_count_adapter(t[q].dev, gp_tensor_bytes(&wide[q]));
        }
        if (st != GP_OK) {
            free_all(wide, q);
            return st;
        }
    }
    return GP_OK;
}

/* *out = the FP32 *f (owned, consumed either way) as element type dt: f
 * itself when dt is FP32, else rounded into a new tensor. */
static gp_status narrow(gp_tensor *f, gp_dtype dt, gp_tensor *out)
{
    if (dt == GP_F32) {
        *out = *f;
        *f = (gp_tensor){0};
        return GP_OK;
    }
    gp_dev_count_adapter(f->dev, gp_tensor_bytes(f)); /* an FP32 result to round */
    gp_status st = gp_tensor_as(out, f, dt, GP_MEM_ACTIVATIONS);
    gp_tensor_free(f);
    return st;
}

static gp_status forward_wide(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              const gp_shape *ys, gp_tensor *y, gp_saved *s)
{
    gp_tensor xf[1 + GP_MAX_POPS], yf = {0};
    GP_TRY(widen(x, l->n_in, NULL, xf));
    gp_status st = gp_tensor_alloc(&yf, l->dev, ys, GP_MEM_ACTIVATIONS);
    if (st == GP_OK) st = l->ops->forward(l, ctx, xf, &yf, s);
    free_all(xf, l->n_in);
    if (st == GP_OK) return narrow(&yf, l->out_dtype, y);
    gp_tensor_free(&yf);
    return st;
}

gp_status gp_layer_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                           gp_tensor *y, gp_saved *s)
{
    GP_TRY(check_input(l, x));
    gp_shape ys = gp_shape_with_batch(&l->out_shape, x->dims[0]);
    if (adapts(l, x)) return forward_wide(l, ctx, x, &ys, y, s);
    GP_TRY(gp_tensor_alloc_as(y, l->dev, &ys, l->out_dtype, GP_MEM_ACTIVATIONS));
    gp_status st = l->ops->forward(l, ctx, x, y, s);
    if (st != GP_OK) gp_tensor_free(y);
    return st;
}

/* A view of t with shape `sh` (the same element count). */
static gp_tensor view_as(const gp_tensor *t, const gp_shape *sh)
{
    gp_tensor v = *t;
    v.ndim = sh->ndim;
    for (int i = 0; i < sh->ndim; i++) v.dims[i] = sh->dims[i];
    v.owned = false;
    return v;
}

gp_status gp_layer_forward_inplace(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   gp_tensor *y, gp_saved *s)
{
    GP_ASSERT(l->ops->inplace != GP_INPLACE_NO && l->n_in == 1);
    GP_TRY(check_input(l, x));
    gp_shape ys = gp_shape_with_batch(&l->out_shape, x->dims[0]);
    GP_ASSERT(gp_shape_numel(&ys) == gp_tensor_numel(x));
    /* a relu whose batch norm did its work (gp_layers_relu_fused) has
     * nothing to widen or round either */
    if (adapts(l, x) && !l->relu_done) {
        /* the values widened, the layer run in place over them, rounded
         * back into x's memory: the output's own storage */
        GP_ASSERT(x[0].dtype == l->out_dtype);
        gp_tensor xf;
        GP_TRY(widen(x, 1, NULL, &xf));
        gp_tensor yf = view_as(&xf, &ys);
        gp_status st = l->ops->forward(l, ctx, &xf, &yf, s);
        *y = view_as(x, &ys);
        if (st == GP_OK) st = gp_tensor_convert(y, &yf);
        gp_tensor_free(&xf);
        if (st != GP_OK) *y = (gp_tensor){0};
        return st;
    }
    *y = view_as(x, &ys);
    gp_status st = l->ops->forward(l, ctx, x, y, s);
    if (st != GP_OK) *y = (gp_tensor){0};
    return st;
}

void gp_layer_specs_link(gp_layer_spec *specs, int count)
{
    for (int k = 0; k < count; k++) {
        if (specs[k].type != GP_LAYER_INSTANCE_NORM) continue;
        const gp_layer_spec *n = k + 1 < count ? &specs[k + 1] : NULL;
        specs[k].leaky_after =
            n && n->type == GP_LAYER_LEAKY_RELU && n->slope > 0.0f && isfinite(n->slope)
                ? n->slope
                : 0.0f;
    }
}

/* An instance norm whose backward reads its output (or the leaky relu's in
 * place over it), never its input (gp_layer_specs_link). */
static bool norm_leaky(const gp_layer_spec *s)
{
    return s->type == GP_LAYER_INSTANCE_NORM && s->leaky_after > 0.0f;
}

bool gp_layer_spec_ignores_y(const gp_layer_spec *s)
{
    const gp_layer_ops *o = gp_layer_ops_for(s->type);
    return o && o->bwd_ignores_y && !norm_leaky(s);
}

bool gp_layer_spec_ignores_x(const gp_layer_spec *s)
{
    const gp_layer_ops *o = gp_layer_ops_for(s->type);
    return o && (o->bwd_ignores_x || norm_leaky(s));
}

bool gp_layer_spec_end_unread(const gp_layer_spec *s)
{
    return !s->stash[0] && gp_layer_spec_ignores_y(s);
}

/* ---- composite layers' children (gp_layers_child_forward, _backward) ---- */

gp_status gp_layers_child_forward(gp_layer *c, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                  gp_tensor *y, gp_saved *s)
{
    GP_ASSERT(y->dtype == c->out_dtype);
    if (!adapts(c, x)) return c->ops->forward(c, ctx, x, y, s);
    gp_tensor xf[1 + GP_MAX_POPS], yf = {0};
    GP_TRY(widen(x, c->n_in, NULL, xf));
    gp_shape ys = gp_tensor_shape(y);
    gp_status st = gp_tensor_alloc(&yf, c->dev, &ys, GP_MEM_ACTIVATIONS);
    if (st == GP_OK) st = c->ops->forward(c, ctx, xf, &yf, s);
    if (st == GP_OK) st = gp_tensor_convert(y, &yf); /* y may be x's memory (relu) */
    gp_tensor_free(&yf);
    free_all(xf, c->n_in);
    return st;
}

static gp_status child_halves(gp_layer *c, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                              gp_saved *s)
{
    if (dx) GP_TRY(c->ops->backward_data(c, ctx, x, y, dy, dx, s));
    if (c->ops->backward_weights) GP_TRY(c->ops->backward_weights(c, ctx, x, y, dy, s));
    return GP_OK;
}

gp_status gp_layers_child_backward(gp_layer *c, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                   gp_saved *s)
{
    if (!adapts(c, x)) return child_halves(c, ctx, x, y, dy, dx, s);
    GP_ASSERT(c->n_in == 1);
    bool xs = gp_layer_spec_ignores_x(&c->spec), ys = gp_layer_spec_ignores_y(&c->spec);
    gp_tensor xf, yf = {0}, dyf, dxf = {0};
    GP_TRY(widen(x, 1, &xs, &xf));
    gp_status st = y ? widen(y, 1, &ys, &yf) : GP_OK;
    if (st == GP_OK) st = widen(dy, 1, NULL, &dyf);
    if (st == GP_OK) {
        gp_shape xsh = gp_tensor_shape(x);
        if (dx) st = gp_tensor_alloc(&dxf, c->dev, &xsh, GP_MEM_ACTIVATIONS);
        if (st == GP_OK) st = child_halves(c, ctx, &xf, y ? &yf : NULL, &dyf, dx ? &dxf : NULL, s);
        if (st == GP_OK && dx) st = gp_tensor_convert(dx, &dxf);
        gp_tensor_free(&dxf);
        gp_tensor_free(&dyf);
    }
    if (y) gp_tensor_free(&yf);
    gp_tensor_free(&xf);
    return st;
}

/* The rule over specs `stride` bytes apart (an array of specs, or the
 * specs inside an array of layers). */
static void inplace_rule(const char *spec0, size_t stride, int count, bool *inplace)
{
#define SPEC(k) ((const gp_layer_spec *)(const void *)(spec0 + (size_t)(k) * stride))
    for (int c = 0; c < count; c++) {
        const gp_layer_ops *ops = gp_layer_ops_for(SPEC(c)->type);
        bool ok = c > 0 && ops && ops->inplace != GP_INPLACE_NO && SPEC(c)->n_pop == 0;
        /* every earlier layer whose output shares the memory: c - 1, and
         * back through the in-place ones to the one that allocated it */
        for (int k = c - 1; ok && k >= 0; k--) {
            if (SPEC(k)->stash[0]) ok = false;
            /* the linked norm reads the leaky relu's output in place of its own */
            bool over_norm = k == c - 1 && norm_leaky(SPEC(k)) &&
                             SPEC(c)->type == GP_LAYER_LEAKY_RELU &&
                             SPEC(c)->slope == SPEC(k)->leaky_after;
            if (ops->inplace == GP_INPLACE_VALUES && !gp_layer_spec_ignores_y(SPEC(k)) &&
                !over_norm)
                ok = false;
            if (!inplace[k]) break;
        }
        inplace[c] = ok;
    }
#undef SPEC
}

/* A layer that may sit between two convolutions in a chain of block blk
 * (a batch norm's blocked loops give each task a unit of channels,
 * gp_blk_unit: fewer units than threads would leave threads idle). */
static bool blocks_through(const gp_layer *l, const gp_device *dev, int64_t blk)
{
    if (l->dev != dev) return false;
    /* a residual sum: element-wise, its popped input in the same layout or
     * through a projection that reads the popped one (gp_layers_blocked
     * makes sure of both) */
    if (l->spec.type == GP_LAYER_ADD) return l->n_in == 2;
    if (l->n_in != 1) return false;
    switch (l->spec.type) {
    case GP_LAYER_IDENTITY: return true;
    case GP_LAYER_BATCHNORM:
        return l->in_shape.ndim == 4 && l->in_shape.dims[1] / gp_blk_unit(blk) >= dev->threads;
    case GP_LAYER_RELU:
    case GP_LAYER_LEAKY_RELU:
    case GP_LAYER_MAXPOOL2D:
    case GP_LAYER_AVGPOOL2D:
    case GP_LAYER_GLOBAL_AVGPOOL: return true;
    default: return false;
    }
}

static bool is_pool(const gp_layer *l)
{
    return l->spec.type == GP_LAYER_MAXPOOL2D || l->spec.type == GP_LAYER_AVGPOOL2D ||
           l->spec.type == GP_LAYER_GLOBAL_AVGPOOL;
}

/* The blocks of a residual block (residual.c: conv1 3x3 stride s, bn1,
 * relu, conv2 3x3, bn2, + x or the downsample's 1x1 conv and bn, relu) as
 * one convolution of a chain: the block conv1 (and the downsample) read
 * x in, and the one conv1, conv2 (and the downsample) write, which its
 * norms run in (blocks_through's rule); an identity shortcut adds x to
 * the output, so both are one block there.  0 both where any differs. */
static int64_t res_block(const gp_layer *l, bool output)
{
    gp_conv_desc c[3]; /* conv1, conv2, the downsample's (gp_residual_convs) */
    int nc = gp_residual_convs(l, c);
    if (nc < 2) return 0;
    int64_t i = gp_dev_act_block(l->dev, &c[0], false), o = gp_dev_act_block(l->dev, &c[0], true);
    bool ok = i && o && gp_dev_act_block(l->dev, &c[1], false) == o &&
              gp_dev_act_block(l->dev, &c[1], true) == o &&
              c[1].k / gp_blk_unit(o) >= l->dev->threads;
    if (nc == 3)
        ok = ok && gp_dev_act_block(l->dev, &c[2], false) == i &&
             gp_dev_act_block(l->dev, &c[2], true) == o;
    else
        ok = ok && i == o;
    return ok ? (output ? o : i) : 0;
}

static bool is_res_block(const gp_layer *l)
{
    return l->spec.type == GP_LAYER_RESIDUAL && l->n_in == 1 && l->dev;
}

/* A residual block with an identity shortcut, whose x and y must share a
 * layout (res_block). */
static bool res_identity(const gp_layer *l)
{
    gp_conv_desc c[3];
    return is_res_block(l) && gp_residual_convs(l, c) == 2;
}

static int64_t conv_block(const gp_layer *l, bool output)
{
    if (is_res_block(l)) return res_block(l, output);
    if (l->spec.type != GP_LAYER_CONV2D || l->n_in != 1 || !l->dev) return 0;
    gp_conv_desc d = gp_conv2d_desc(l, 1);
    d.xblk = d.yblk = 0;
    return gp_dev_act_block(l->dev, &d, output);
}

/* conv_block in plan_chains: a residual block barred (bar_misfits), or
 * with no skip map to bar one by, takes none. */
static int64_t chain_block(const gp_layer *layers, int k, const bool *bar, bool output)
{
    if (is_res_block(&layers[k]) && (!bar || bar[k])) return 0;
    return conv_block(&layers[k], output);
}

/* The layout a residual sum p in a chain of block blk wants its popped
 * input in: blk without a projection; with one (skip.c: a 1x1 convolution,
 * stride spec.stride, then a batch norm, on the popped tensor), the block
 * its convolution reads, where that convolution writes blk and the norm
 * may run in it (blocks_through's rule), else -1 (no layout fits). */
static int64_t pop_wants(const gp_layer *p, int64_t blk)
{
    if (p->spec.out == 0 || !blk) return blk;
    const gp_shape *ps = &p->pop_shape[0];
    gp_conv_desc d = {.n = 1, .c = ps->dims[1], .h = ps->dims[2], .w = ps->dims[3],
                      .k = p->spec.out, .kh = 1, .kw = 1, .sh = p->spec.stride.h,
                      .sw = p->spec.stride.w, .oh = p->out_shape.dims[2],
                      .ow = p->out_shape.dims[3]};
    int64_t in = gp_dev_act_block(p->dev, &d, false);
    bool ok = in && gp_dev_act_block(p->dev, &d, true) == blk &&
              p->spec.out / gp_blk_unit(blk) >= p->dev->threads;
    return ok ? in : -1;
}

/* One pass of gp_layers_blocked's chains.  bar[k] (gp_layers_blocked; NULL:
 * all set) keeps chains away from skips: a layer that stashes its output
 * ends its chain there, and one that pops a stashed tensor joins none. */
static void plan_chains(gp_layer *layers, int count, const bool *bar)
{
#define STOPS(k) (layers[k].spec.stash[0] && (!bar || bar[k]))
#define JOINS(k, a, blk)                                                                      \
    (blocks_through(&layers[k], layers[a].dev, blk) &&                                        \
     !(layers[k].spec.n_pop > 0 && (!bar || bar[k])))
    for (int c = 0; c < count; c++) layers[c].in_blk = layers[c].out_blk = 0;
    for (int a = 0; a < count; a++) {
        int64_t blk = chain_block(layers, a, bar, true);
        if (!blk) continue;
        int b = a + 1;
        while (b < count && !STOPS(b - 1) && JOINS(b, a, blk)) b++;
        int end = b; /* the layer that reads the chain's last blocked output */
        if (b >= count || STOPS(b - 1) || layers[b].dev != layers[a].dev ||
            chain_block(layers, b, bar, false) != blk) {
            /* no convolution to take it: the chain may end in its last pool,
             * which writes plain */
            end = b - 1;
            while (end > a && !is_pool(&layers[end])) end--;
            if (end == a) continue;
        }
        for (int c = a; c < end; c++) layers[c].out_blk = blk;
        for (int c = a + 1; c <= end; c++) layers[c].in_blk = blk;
    }
#undef JOINS
#undef STOPS
}

/* The skips of a run, for gp_layers_blocked: src[p * GP_MAX_POPS + q] the
 * layer before p that stashed p's pop q last (-1: none in the run, the
 * tensor comes from another stage, plain); popped[k] whether a layer of
 * the run pops what k stashes; bar[] as plan_chains takes it. */
typedef struct skip_map {
    int *src;
    bool *popped, *bar;
} skip_map;

static bool skip_map_make(const gp_layer *layers, int count, skip_map *m)
{
    m->src = malloc((size_t)count * GP_MAX_POPS * sizeof *m->src);
    m->popped = calloc(2 * (size_t)count, sizeof *m->popped);
    m->bar = m->popped ? m->popped + count : NULL;
    if (!m->src || !m->popped) return false;
    for (int p = 0; p < count; p++)
        for (int q = 0; q < layers[p].spec.n_pop; q++) {
            int k = p - 1;
            while (k >= 0 && strcmp(layers[k].spec.stash, layers[p].spec.pop[q])) k--;
            m->src[p * GP_MAX_POPS + q] = k;
            if (k >= 0) m->popped[k] = true;
        }
    return true;
}

/* Skips that break the plan: bar[] set (and true returned) for a stash whose
 * blocked output is popped by a layer reading another layout or by none in
 * the run (it would leave the stage blocked, and stages take plain
 * tensors), for a popping layer in a chain whose popped tensor is in
 * another layout, and for an identity residual block between two layouts. */
static bool bar_misfits(const gp_layer *layers, int count, skip_map *m)
{
    bool more = false;
    for (int p = 0; p < count; p++)
        for (int q = 0; q < layers[p].spec.n_pop; q++) {
            int k = m->src[p * GP_MAX_POPS + q];
            int64_t from = k >= 0 ? layers[k].out_blk : 0;
            if (from == (layers[p].spec.type == GP_LAYER_ADD ? pop_wants(&layers[p],
                                                                         layers[p].in_blk)
                                                             : layers[p].in_blk))
                continue;
            if (k >= 0 && from && !m->bar[k]) m->bar[k] = more = true;
            if (layers[p].in_blk && !m->bar[p]) m->bar[p] = more = true;
        }
    for (int k = 0; k < count; k++)
        if (layers[k].spec.stash[0] && layers[k].out_blk && !m->popped[k] && !m->bar[k])
            m->bar[k] = more = true;
    /* an identity residual block whose input and output chains differ
     * (one of them plain: a chain that cannot go on after it, or none
     * before it) computes plain */
    for (int k = 0; k < count; k++)
        if (res_identity(&layers[k]) && layers[k].in_blk != layers[k].out_blk && !m->bar[k])
            m->bar[k] = more = true;
    return more;
}

void gp_layers_blocked(gp_layer *layers, int count)
{
    /* A chain may run through a residual sum and the stash it pops (a flat
     * ResNet's identity ... add) where both hold the same block; each
     * round bars the skips that do not fit and plans again (one more
     * barred a round: at most 2 count rounds).  No room to decide: every
     * skip ends its chain, as before 2026-11-28. */
    skip_map m = {NULL, NULL, NULL};
    bool ok = count > 0 && skip_map_make(layers, count, &m);
    plan_chains(layers, count, ok ? m.bar : NULL);
    while (ok && bar_misfits(layers, count, &m)) plan_chains(layers, count, m.bar);
    for (int p = 0; p < count; p++) { /* what each pop now reads */
        int k = ok && layers[p].spec.n_pop > 0 ? m.src[p * GP_MAX_POPS] : -1;
        layers[p].pop_blk = k >= 0 ? layers[k].out_blk : 0;
    }
    free(m.src);
    free(m.popped);
}

void gp_layers_inplace(const gp_layer *layers, int count, bool *inplace)
{
    if (count <= 0) return;
    inplace_rule((const char *)&layers[0].spec, sizeof *layers, count, inplace);
}

static void unkept_rule(const char *spec0, size_t stride, int count, const bool *inplace,
                        bool *unkept)
{
#define SPEC(k) ((const gp_layer_spec *)(const void *)(spec0 + (size_t)(k) * stride))
    /* Layer c's output memory, and the in-place layers' over it (their
     * outputs are that memory), is read by no backward when c's does not
     * read its y, the in-place ones read neither x nor y, and the first
     * layer after them that runs out of place does not read its x.  Until
     * 2026-11-25 no in-place layer could be in between: torchgpipe's
     * U-Net unit conv, dropout2d (in place), instance_norm kept the
     * convolution's output for a norm that now reads its own. */
    for (int c = 0; c < count; c++) {
        unkept[c] = false;
        if (inplace[c] || SPEC(c)->stash[0] || !gp_layer_spec_ignores_y(SPEC(c))) continue;
        int r = c + 1;
        bool ok = true;
        for (; r < count && inplace[r] && ok; r++)
            ok = !SPEC(r)->stash[0] && gp_layer_spec_ignores_x(SPEC(r)) &&
                 gp_layer_spec_ignores_y(SPEC(r));
        unkept[c] = ok && r < count && gp_layer_spec_ignores_x(SPEC(r));
    }
#undef SPEC
}

void gp_layers_norm_leaky(gp_layer *layers, int count, const bool *inplace)
{
    for (int c = 0; c < count; c++)
        layers[c].leaky_inplace = norm_leaky(&layers[c].spec) && c + 1 < count && inplace[c + 1];
}

void gp_layers_unkept(const gp_layer *layers, int count, const bool *inplace, bool *unkept)
{
    if (count <= 0) return;
    unkept_rule((const char *)&layers[0].spec, sizeof *layers, count, inplace, unkept);
}

void gp_layer_specs_unkept(const gp_layer_spec *specs, int count, const bool *inplace,
                           bool *unkept)
{
    if (count <= 0) return;
    unkept_rule((const char *)specs, sizeof *specs, count, inplace, unkept);
}

/* The fusions' switches, each on unless its variable is "0", read once. */
enum { FUSE_RELU, FUSE_ADD_NORM, FUSE_GELU, FUSE_LOSS, FUSE_COUNT };
static bool fuse_on[FUSE_COUNT];
static pthread_once_t fuse_once = PTHREAD_ONCE_INIT;
static void fuse_read(void)
{
    static const char *const names[FUSE_COUNT] = {"GPIPE_FUSE_RELU", "GPIPE_FUSE_ADD_NORM",
                                                  "GPIPE_FUSE_GELU", "GPIPE_FUSE_LOSS"};
    for (int k = 0; k < FUSE_COUNT; k++) {
        const char *e = getenv(names[k]);
        fuse_on[k] = !e || strcmp(e, "0") != 0;
    }
}

static bool fusion_on(int k)
{
    pthread_once(&fuse_once, fuse_read);
    return fuse_on[k];
}

bool gp_layers_fuse_relu_on(void) { return fusion_on(FUSE_RELU); }

/* The rule of gp_layers_relu_fused over specs `stride` bytes apart. */
static void relu_fused_rule(const char *spec0, size_t stride, int count, const bool *inplace,
                            bool *fused)
{
#define SPEC(k) ((const gp_layer_spec *)(const void *)(spec0 + (size_t)(k) * stride))
    bool on = gp_layers_fuse_relu_on();
    for (int c = 0; c < count; c++) {
        const gp_layer_spec *b = c >= 1 ? SPEC(c - 1) : NULL;
        fused[c] = on && b && SPEC(c)->type == GP_LAYER_RELU && inplace[c] &&
                   b->type == GP_LAYER_BATCHNORM && b->n_pop == 0 && !b->stash[0];
    }
#undef SPEC
}

void gp_layer_specs_relu_fused(const gp_layer_spec *specs, int count, const bool *inplace,
                               bool *fused)
{
    if (count > 0) relu_fused_rule((const char *)specs, sizeof *specs, count, inplace, fused);
}

/* A relu in place after a linear layer whose output nothing else reads:
 * the linear's forward applies it (forward only: the relu's backward
 * runs). */
static bool relu_after_linear(const gp_layer *layers, int c, const bool *inplace)
{
    const gp_layer_spec *b = c >= 1 ? &layers[c - 1].spec : NULL;
    return gp_layers_fuse_relu_on() && b && layers[c].spec.type == GP_LAYER_RELU && inplace[c] &&
           b->type == GP_LAYER_LINEAR && b->n_pop == 0 && !b->stash[0];
}

void gp_layers_relu_fused(gp_layer *layers, int count, const bool *inplace, bool *fused)
{
    if (count <= 0) return;
    relu_fused_rule((const char *)&layers[0].spec, sizeof *layers, count, inplace, fused);
    for (int c = 0; c < count; c++) {
        layers[c].relu_done = fused[c] || relu_after_linear(layers, c, inplace);
        layers[c].relu_after =
            c + 1 < count && (fused[c + 1] || relu_after_linear(layers, c + 1, inplace));
    }
}

bool gp_layers_add_norm(const gp_layer *layers, int count, int c, const bool *inplace)
{
    if (!fusion_on(FUSE_ADD_NORM) || c < 0 || c + 1 >= count) return false;
    const gp_layer *a = &layers[c], *n = &layers[c + 1];
    return a->spec.type == GP_LAYER_ADD && a->n_in == 2 && a->ops->dx_all_dy &&
           a->ops->dx_all_dy(a) && n->spec.type == GP_LAYER_LAYER_NORM && n->n_in == 1 &&
           !inplace[c + 1] && a->dev && a->dev == n->dev && a->out_dtype == n->out_dtype &&
           gp_dev_add_norm_has(a->dev, a->out_dtype);
}

/* The outputs of a pair that runs as one call: y for `a` (its output
 * shape and type), y2 for `b` after it; *go false (nothing allocated, no
 * error) where these inputs take the layers' own forwards: `a` adapts them,
 * x[0 .. n) are not its output's type, or they are empty. */
static gp_status pair_outputs(gp_layer *a, gp_layer *b, const gp_tensor *x, int n, gp_tensor *y,
                              gp_tensor *y2, bool *go)
{
    *go = false;
    if (adapts(a, x) || gp_tensor_numel(&x[0]) == 0) return GP_OK;
    for (int q = 0; q < n; q++)
        if (x[q].dtype != a->out_dtype) return GP_OK;
    GP_TRY(check_input(a, x));
    gp_shape ys = gp_shape_with_batch(&a->out_shape, x->dims[0]);
    GP_TRY(gp_tensor_alloc_as(y, a->dev, &ys, a->out_dtype, GP_MEM_ACTIVATIONS));
    gp_status st = check_input(b, y);
    if (st == GP_OK && adapts(b, y)) {
        gp_tensor_free(y);
        return GP_OK;
    }
    gp_shape ys2 = gp_shape_with_batch(&b->out_shape, x->dims[0]);
    if (st == GP_OK) st = gp_tensor_alloc_as(y2, b->dev, &ys2, b->out_dtype, GP_MEM_ACTIVATIONS);
    if (st != GP_OK) {
        gp_tensor_free(y);
        return st;
    }
    *go = true;
    return GP_OK;
}

gp_status gp_layer_add_norm_forward(gp_layer *add, gp_layer *norm, const gp_fwd_ctx *ctx,
                                    const gp_tensor *x, gp_tensor *y, gp_tensor *y2,
                                    gp_saved *s2, bool *done)
{
    (void)ctx;
    GP_TRY(pair_outputs(add, norm, x, 2, y, y2, done));
    if (!*done) return GP_OK; /* the two layers' own forwards */
    gp_status st = gp_layers_norm_forward_add(norm, &x[0], &x[1], y, y2, s2);
    if (st != GP_OK) {
        *done = false;
        gp_tensor_free(y);
        gp_tensor_free(y2);
        gp_saved_free(s2);
    }
    return st;
}

bool gp_layers_logits_over_on(void) { return fusion_on(FUSE_LOSS); }

static bool gelu_fusion_on(void) { return fusion_on(FUSE_GELU); }

bool gp_layers_linear_gelu(const gp_layer *layers, int count, int c, const bool *inplace)
{
    if (!gelu_fusion_on() || c < 0 || c + 1 >= count) return false;
    const gp_layer *a = &layers[c], *g = &layers[c + 1];
    return a->spec.type == GP_LAYER_LINEAR && a->n_in == 1 && !a->spec.stash[0] &&
           !a->relu_after && g->spec.type == GP_LAYER_GELU && g->n_in == 1 && !inplace[c + 1] &&
           a->dev && a->dev == g->dev && a->out_dtype == g->out_dtype &&
           gp_dev_linear_gelu_has(a->dev, a->out_dtype);
}

gp_status gp_layer_linear_gelu_forward(gp_layer *lin, gp_layer *gelu, const gp_fwd_ctx *ctx,
                                       const gp_tensor *x, gp_tensor *y, gp_tensor *y2,
                                       bool *done)
{
    (void)ctx;
    GP_TRY(pair_outputs(lin, gelu, x, 1, y, y2, done));
    if (!*done) return GP_OK; /* the two layers' own forwards */
    gp_status st = gp_layers_linear_forward_gelu(lin, &x[0], y, y2);
    if (st != GP_OK) {
        *done = false;
        gp_tensor_free(y);
        gp_tensor_free(y2);
    }
    return st;
}

bool gp_layers_gelu_linear(const gp_layer *layers, int count, int c, const gp_tensor *x)
{
    if (!gelu_fusion_on() || c < 0 || c + 1 >= count || !gp_tensor_mem(x)) return false;
    const gp_layer *g = &layers[c], *a = &layers[c + 1];
    return g->spec.type == GP_LAYER_GELU && g->n_in == 1 && !g->spec.stash[0] &&
           a->spec.type == GP_LAYER_LINEAR && a->n_in == 1 && a->dev == g->dev &&
           x->dtype == g->out_dtype && a->out_dtype == g->out_dtype && !adapts(g, x) &&
           !adapts(a, x) && gp_dev_linear_gelu_has(a->dev, x->dtype);
}

bool gp_layer_dx_adds(const gp_layer *l, const gp_tensor *x, const gp_tensor *into)
{
    /* (the residual's sum in the norm's backward: GPIPE_FUSE_ADD_NORM's too) */
    return fusion_on(FUSE_ADD_NORM) && l->ops->dx_adds && l->n_in == 1 && !adapts(l, x) &&
           gp_tensor_mem(into) &&
           into->dtype == x->dtype && gp_tensor_numel(into) == gp_tensor_numel(x) &&
           l->ops->dx_adds(l, x->dtype);
}

gp_status gp_layers_commit(gp_layer *layers, int count, gp_device *dev, int *bad)
{
    GP_TRY(gp_dev_bn_commit_begin(dev));
    gp_status st = GP_OK;
    for (int c = 0; c < count && st == GP_OK; c++)
        if (layers[c].ops->commit) {
            st = layers[c].ops->commit(&layers[c]);
            if (st != GP_OK && bad) *bad = c;
        }
    /* the commits that came before a failure are issued, as one at a
     * time would have issued them (their layers count them as done) */
    gp_status e = gp_dev_bn_commit_end(dev);
    if (st == GP_OK && e != GP_OK && bad) *bad = count - 1;
    return st != GP_OK ? st : e;
}

void gp_layers_discard(gp_layer *layers, int count)
{
    for (int c = 0; c < count; c++)
        if (layers[c].ops->discard) layers[c].ops->discard(&layers[c]);
}

void gp_layer_specs_inplace(const gp_layer_spec *specs, int count, bool *inplace)
{
    if (count <= 0) return;
    inplace_rule((const char *)specs, sizeof *specs, count, inplace);
}

/* The halves of a backward as asked (dx NULL: no data half; `weights`:
 * the weights half), on tensors the layer's ops take as they are. */
static gp_status run_backward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                              gp_saved *s, gp_tensor *take, bool views, bool weights)
{
    if (dx) {
        GP_TRY(alloc_dx(l, x, dx, take, views, ctx->dx_into));
        gp_status st = l->ops->backward_data(l, ctx, x, y, dy, dx, s);
        if (st != GP_OK) {
            free_dx(l, dx);
            return st;
        }
    }
    if (weights && l->ops->backward_weights) {
        gp_status st = l->ops->backward_weights(l, ctx, x, y, dy, s);
        if (st != GP_OK) {
            if (dx) free_dx(l, dx);
            return st;
        }
    }
    if (dx) took(l, dx, take);
    return GP_OK;
}

/* run_backward through the storage adapter where the layer needs it: x, y
 * and dy widened (the values its backward reads: the main input's shape
 * alone where it ignores x, y's where it ignores y, ignores_x / ignores_y:
 * the linked instance norm reads its output), each input's
 * gradient rounded to that input's type.  Nothing is handed on (take). */
static gp_status backward_as(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                             const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx, gp_saved *s,
                             gp_tensor *take, bool views, bool weights)
{
    if (!adapts(l, x)) return run_backward(l, ctx, x, y, dy, dx, s, take, views, weights);
    /* checkpoint.c asks these only where nothing adapts */
    GP_ASSERT(!ctx->dx_into && !ctx->gelu_in);
    bool xs[1 + GP_MAX_POPS] = {gp_layer_spec_ignores_x(&l->spec)};
    bool ys = gp_layer_spec_ignores_y(&l->spec);
    gp_tensor xf[1 + GP_MAX_POPS], yf, dyf, dxf[1 + GP_MAX_POPS] = {{0}};
    GP_TRY(widen(x, l->n_in, xs, xf));
    gp_status st = widen(y, 1, &ys, &yf);
    if (st == GP_OK) {
        st = widen(dy, 1, NULL, &dyf);
        if (st == GP_OK) {
            st = run_backward(l, ctx, xf, &yf, &dyf, dx ? dxf : NULL, s, NULL, false, weights);
            for (int q = 0; dx && q < l->n_in; q++) {
                if (st == GP_OK) st = narrow(&dxf[q], x[q].dtype, &dx[q]);
                if (st != GP_OK) free_all(dx, q);
                gp_tensor_free(&dxf[q]);
            }
            gp_tensor_free(&dyf);
        }
        gp_tensor_free(&yf);
    }
    free_all(xf, l->n_in);
    return st;
}

static gp_status backward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                         const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx, gp_saved *s,
                         gp_tensor *take, bool views)
{
    GP_ASSERT(gp_tensor_numel(dy) == gp_tensor_numel(y));
    gp_fwd_ctx c = *ctx;
    c.grads_overwrite = false;
    if (l->grads_stale) {
        if (l->ops->overwrites_grads) c.grads_overwrite = true;
        else GP_TRY(gp_layer_zero_grad(l));
    }
    GP_TRY(backward_as(l, &c, x, y, dy, dx, s, take, views, true));
    l->grads_stale = false;
    return GP_OK;
}

gp_status gp_layer_backward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                            const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                            gp_saved *s)
{
    return backward(l, ctx, x, y, dy, dx, s, NULL, false);
}

/* The split backward accumulates from the first micro-batch on (stale
 * gradients are zeroed here), so that backward-data of micro-batch i + 1
 * may run before backward-weights of micro-batch i.  A layer whose
 * backward-data writes no gradient and whose backward-weights can write
 * instead of add (ops->overwrites_grads: the products) is left stale until
 * its first backward-weights, which overwrites: zeroing a stage's product
 * gradients in its first backward-data of a step made that one 30-40%
 * slower (4.5 products of 2048 x 2048: 5 ms more, on the schedule's
 * critical path; bench/README.md, "Schedules in a V"). */
static bool split_overwrites(const gp_layer *l)
{
    return l->ops->overwrites_grads && l->ops->backward_weights;
}

static gp_status split_begin(gp_layer *l)
{
    if (!l->grads_stale) return GP_OK;
    GP_TRY(gp_layer_zero_grad(l));
    l->grads_stale = false;
    return GP_OK;
}

static gp_status backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx, gp_saved *s,
                              gp_tensor *take)
{
    GP_ASSERT(gp_tensor_numel(dy) == gp_tensor_numel(y));
    if (!split_overwrites(l)) GP_TRY(split_begin(l));
    gp_fwd_ctx c = *ctx;
    c.grads_overwrite = false;
    if (!dx) return GP_OK;
    return backward_as(l, &c, x, y, dy, dx, s, take, false, false);
}

gp_status gp_layer_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                 gp_saved *s)
{
    return backward_data(l, ctx, x, y, dy, dx, s, NULL);
}

gp_status gp_layer_backward_take(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                 const gp_tensor *y, gp_tensor *dy, gp_tensor *dx,
                                 bool data_only, bool views, gp_saved *s)
{
    /* the data half's dx[0] is kept for the weights half of the layer
     * before: no views of a pop's gradient there */
    return data_only ? backward_data(l, ctx, x, y, dy, dx, s, dy)
                     : backward(l, ctx, x, y, dy, dx, s, dy, views);
}

gp_status gp_layer_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    gp_fwd_ctx c = *ctx;
    /* the step's first backward-weights of a product: dW = (no fill first) */
    c.grads_overwrite = l->grads_stale && split_overwrites(l);
    if (!c.grads_overwrite) GP_TRY(split_begin(l));
    if (!l->ops->backward_weights) return GP_OK;
    GP_TRY(backward_as(l, &c, x, y, dy, NULL, s, NULL, false, true));
    l->grads_stale = false;
    return GP_OK;
}

/* ---- the loss ------------------------------------------------------------ */

/* The errors of a bad label or target, the same from the device's check
 * and the host's. */
static gp_status bad_label(double v, int64_t row, int64_t cols)
{
    if (v >= 0 && v < (double)cols) /* in range, but no whole number (or NaN: below) */
        return gp_error_set(GP_ERR_DATA,
                            "label %g in row %lld of the batch is not a whole number: class "
                            "labels are the integers 0 .. %lld; the labels are corrupt or not "
                            "class ids", v, (long long)row, (long long)cols - 1);
    if (v != v)
        return gp_error_set(GP_ERR_DATA,
                            "label NaN in row %lld of the batch: class labels are the integers "
                            "0 .. %lld; the labels are corrupt", (long long)row,
                            (long long)cols - 1);
    return gp_error_set(GP_ERR_DATA,
                        "label %g in row %lld of the batch is not a class index in [0, %lld): "
                        "the data has more classes than the model's last layer outputs "
                        "(raise its out to the number of classes) or the labels are corrupt",
                        v, (long long)row, (long long)cols);
}

/* at: the element within rows starting at row0 of the batch (ts: their
 * shape); said as the batch's element and index. */
static gp_status bad_target(double v, int64_t at, const gp_shape *ts, int64_t row0)
{
    char where[96] = "", idx[80];
    int64_t per = ts->ndim > 0 && ts->dims[0] > 0 ? gp_shape_numel(ts) / ts->dims[0] : 1;
    if (ts->ndim > 1) /* also as an index of the target's shape */
        snprintf(where, sizeof where, " %s", gp_shape_index_str(ts, 0, at, row0, idx, sizeof idx));
    return gp_error_set(GP_ERR_DATA,
                        "target %g at element %lld%s of the batch is not in [0, 1]: binary "
                        "cross-entropy takes probabilities (masks of 0 and 1); rescale "
                        "the targets or check the data",
                        v, (long long)(at + row0 * per), where);
}

/* The shapes a loss takes: logits (N, classes) and N labels, or one target
 * per logit. */
/* Cross-entropy's rows: every sample of (N, classes), every position of
 * (N, T, classes); its classes are the last dimension. */
static int64_t xent_cols(const gp_tensor *logits) { return logits->dims[logits->ndim - 1]; }
static int64_t xent_rows(const gp_tensor *logits)
{
    int64_t c = xent_cols(logits);
    return c > 0 ? gp_tensor_numel(logits) / c : 0;
}

static gp_status loss_shapes(gp_device *dev, gp_loss_kind k, const gp_tensor *logits,
                             const gp_tensor *targets, const gp_tensor *dlogits)
{
    if (k == GP_LOSS_CROSS_ENTROPY) {
        if (logits->ndim != 2 && logits->ndim != 3) {
            char b[96];
            gp_shape ls = gp_tensor_shape(logits);
            return gp_error_set(GP_ERR_INVALID,
                                "cross_entropy needs logits (N, classes) or (N, T, classes) but "
                                "got %s; end the model with flatten and a linear layer",
                                gp_shape_str(&ls, b, sizeof b));
        }
        GP_ASSERT(gp_tensor_numel(targets) == xent_rows(logits));
    } else {
        GP_ASSERT(k == GP_LOSS_BCE_WITH_LOGITS);
        if (gp_tensor_numel(targets) != gp_tensor_numel(logits)) {
            char a[96], b[96];
            gp_shape ls = gp_tensor_shape(logits), ts = gp_tensor_shape(targets);
            return gp_error_set(GP_ERR_INVALID,
                                "binary cross-entropy needs one target per logit, but the "
                                "logits are %s and the targets %s; make the model's last "
                                "layer output the target's shape",
                                gp_shape_str(&ls, a, sizeof a), gp_shape_str(&ts, b, sizeof b));
        }
    }
    GP_ASSERT(!dlogits || gp_tensor_numel(dlogits) == gp_tensor_numel(logits));
    GP_ASSERT(logits->dev == dev && targets->dev == dev && (!dlogits || dlogits->dev == dev));
    return GP_OK;
}

/* A bad label (of `classes`) or target the device reported at `bad`: its
 * value, read back, in the error. */
static gp_status bad_on_device(gp_device *dev, gp_loss_kind k, int64_t classes,
                               const gp_tensor *targets, int64_t bad)
{
    float v = NAN;
    GP_TRY(gp_dev_download(dev, &v, gp_f32(targets) + bad, 1));
    GP_TRY(gp_dev_synchronize(dev));
    gp_shape ts = gp_tensor_shape(targets);
    return k == GP_LOSS_CROSS_ENTROPY ? bad_label(v, bad, classes)
                                      : bad_target(v, bad, &ts, 0);
}

/* The classes a cross-entropy reads of logits whose rows are `cols` wide:
 * the first `classes` (a padded vocabulary), or all of them (0). */
static int64_t xent_classes(int64_t classes, int64_t cols)
{
    GP_ASSERT(classes <= cols);
    return classes > 0 ? classes : cols;
}

static gp_status xent_valid(gp_device *dev, int64_t classes, const gp_tensor *logits,
                            const gp_tensor *labels, float smoothing, float grad_scale,
                            gp_tensor *dlogits, gp_loss_out *out)
{
    memset(out, 0, sizeof *out);
    GP_TRY(loss_shapes(dev, GP_LOSS_CROSS_ENTROPY, logits, labels, dlogits));
    int64_t rows = xent_rows(logits), ld = xent_cols(logits), cols = xent_classes(classes, ld);
    double loss = 0.0;
    int64_t correct = 0, bad = -1;
    if (rows > 0)
        GP_TRY(gp_dev_xent_ld(dev, gp_f32(logits), gp_f32(labels), rows, cols, ld, grad_scale,
                              smoothing, dlogits ? gp_f32(dlogits) : NULL, &loss, &correct,
                              &bad));
    if (bad >= 0) return bad_on_device(dev, GP_LOSS_CROSS_ENTROPY, cols, labels, bad);
    out->loss_sum = loss;
    out->correct = correct;
    out->count = rows;
    return GP_OK;
}

gp_status gp_cross_entropy(gp_device *dev, const gp_tensor *logits, const gp_tensor *labels,
                           float smoothing, float grad_scale, gp_tensor *dlogits,
                           gp_loss_out *out)
{
    return xent_valid(dev, 0, logits, labels, smoothing, grad_scale, dlogits, out);
}

gp_status gp_bce_with_logits(gp_device *dev, const gp_tensor *logits, const gp_tensor *targets,
                             float grad_scale, gp_tensor *dlogits, gp_loss_out *out)
{
    memset(out, 0, sizeof *out);
    GP_TRY(loss_shapes(dev, GP_LOSS_BCE_WITH_LOGITS, logits, targets, dlogits));
    int64_t n = gp_tensor_numel(logits);
    double loss = 0.0;
    int64_t correct = 0, bad = -1;
    GP_TRY(gp_dev_bce_logits(dev, gp_f32(logits), gp_f32(targets), n, grad_scale,
                             dlogits ? gp_f32(dlogits) : NULL, &loss, &correct, &bad));
    if (bad >= 0) return bad_on_device(dev, GP_LOSS_BCE_WITH_LOGITS, 0, targets, bad);
    out->loss_sum = loss;
    out->correct = correct;
    out->count = n;
    return GP_OK;
}

/* The losses on bf16 logits (activation storage, gp_layer.out_dtype):
 * widened to FP32, the loss, its sums and the gradient computed in FP32,
 * the gradient rounded once into the bf16 dlogits.  `res` (device
 * results) or `out` (host results). */
static gp_status loss_wide(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                           const gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                           gp_tensor *dlogits, gp_loss_result *res, gp_loss_out *out)
{
    gp_tensor lf, df = {0};
    GP_TRY(gp_tensor_as(&lf, logits, GP_F32, GP_MEM_ACTIVATIONS));
    gp_status st = GP_OK;
    if (dlogits) st = gp_tensor_as(&df, dlogits, GP_F32, GP_MEM_ACTIVATIONS);
    if (st == GP_OK)
        st = res ? gp_loss_dev(dev, k, smoothing, classes, &lf, targets, grad_scale,
                               dlogits ? &df : NULL, res)
                 : gp_loss(dev, k, smoothing, classes, &lf, targets, grad_scale,
                           dlogits ? &df : NULL, out);
    if (st == GP_OK && dlogits) st = gp_tensor_convert(dlogits, &df);
    gp_tensor_free(&df);
    gp_tensor_free(&lf);
    return st;
}

static bool loss_f32(const gp_tensor *logits, const gp_tensor *dlogits)
{
    return logits->dtype == GP_F32 && (!dlogits || dlogits->dtype == GP_F32);
}

gp_status gp_loss_dev(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                      const gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                      gp_tensor *dlogits, gp_loss_result *out)
{
    GP_ASSERT(k == GP_LOSS_CROSS_ENTROPY || (smoothing == 0.0f && classes == 0));
    if (k == GP_LOSS_CROSS_ENTROPY && logits->dtype == GP_BF16 &&
        (!dlogits || dlogits->dtype == GP_BF16) && dev->iface->xent_bf16) {
        /* bf16 logits as they are: no FP32 copy of (B, T, vocab) */
        GP_TRY(loss_shapes(dev, k, logits, targets, dlogits));
        int64_t ld = xent_cols(logits);
        return gp_dev_xent_bf16(dev, gp_bf16(logits), gp_f32(targets), xent_rows(logits),
                                xent_classes(classes, ld), ld, grad_scale, smoothing,
                                dlogits ? gp_bf16(dlogits) : NULL, out);
    }
    if (!loss_f32(logits, dlogits))
        return loss_wide(dev, k, smoothing, classes, logits, targets, grad_scale, dlogits, out,
                         NULL);
    GP_TRY(loss_shapes(dev, k, logits, targets, dlogits));
    float *dl = dlogits ? gp_f32(dlogits) : NULL;
    int64_t ld = xent_cols(logits);
    if (k == GP_LOSS_CROSS_ENTROPY)
        return gp_dev_xent_dev_ld(dev, gp_f32(logits), gp_f32(targets), xent_rows(logits),
                                  xent_classes(classes, ld), ld, grad_scale, smoothing, dl, out);
    return gp_dev_bce_logits_dev(dev, gp_f32(logits), gp_f32(targets), gp_tensor_numel(logits),
                                 grad_scale, dl, out);
}

gp_status gp_loss_check_targets(gp_loss_kind k, int64_t classes, const float *t,
                                const gp_shape *out, int64_t row0)
{
    if (k == GP_LOSS_CROSS_ENTROPY) { /* (N, classes) or (N, T, classes): rows N or N*T */
        GP_ASSERT(out->ndim == 2 || out->ndim == 3);
        int64_t ld = out->dims[out->ndim - 1], rows = gp_shape_numel(out) / ld;
        int64_t per = rows / out->dims[0]; /* row0 counts samples */
        int64_t cols = xent_classes(classes, ld);
        for (int64_t r = 0; r < rows; r++)
            if (!gp_ew_label_ok(t[r], cols)) return bad_label(t[r], row0 * per + r, cols);
        return GP_OK;
    }
    int64_t n = gp_shape_numel(out);
    for (int64_t e = 0; e < n; e++)
        if (!gp_ew_bce_target_ok(t[e])) return bad_target(t[e], e, out, row0);
    return GP_OK;
}

static const char *const loss_names[GP_LOSS_COUNT] = {"cross_entropy", "bce_with_logits"};

const char *gp_loss_name(gp_loss_kind k)
{
    return (unsigned)k < GP_LOSS_COUNT ? loss_names[k] : "?";
}

int64_t gp_loss_targets_per_sample(gp_loss_kind k, const gp_shape *out)
{
    gp_shape one = gp_shape_with_batch(out, 1);
    if (k != GP_LOSS_BCE_WITH_LOGITS) /* a class id per row: 1, or T of (N, T, classes) */
        return out->ndim == 3 ? out->dims[1] : 1;
    return gp_shape_numel(&one);
}

gp_shape gp_loss_targets_shape(gp_loss_kind k, const gp_shape *out, int64_t n)
{
    if (k == GP_LOSS_BCE_WITH_LOGITS) return gp_shape_with_batch(out, n);
    return out->ndim == 3 ? gp_shape_2d(n, out->dims[1]) : (gp_shape){1, {n, 0, 0, 0}};
}

/* gp_loss on bf16 logits through xent_bf16: its device result read back
 * (one host wait, as the FP32 slot's). */
static gp_status xent_bf16_host(gp_device *dev, int64_t classes, const gp_tensor *logits,
                                const gp_tensor *labels, float smoothing, float grad_scale,
                                gp_tensor *dlogits, gp_loss_out *out)
{
    _Static_assert(sizeof(gp_loss_result) % sizeof(float) == 0, "read back as floats");
    const int64_t nf = (int64_t)(sizeof(gp_loss_result) / sizeof(float));
    memset(out, 0, sizeof *out);
    GP_TRY(loss_shapes(dev, GP_LOSS_CROSS_ENTROPY, logits, labels, dlogits));
    int64_t rows = xent_rows(logits), ld = xent_cols(logits), cols = xent_classes(classes, ld);
    void *mem;
    GP_TRY(gp_dev_alloc(dev, sizeof(gp_loss_result), GP_MEM_WORKSPACE, &mem));
    gp_loss_result r = {0};
    gp_status st = gp_dev_xent_bf16(dev, gp_bf16(logits), gp_f32(labels), rows, cols, ld,
                                    grad_scale, smoothing, dlogits ? gp_bf16(dlogits) : NULL, mem);
    if (st == GP_OK) st = gp_dev_download(dev, (float *)(void *)&r, mem, nf);
    if (st == GP_OK) st = gp_dev_synchronize(dev);
    gp_dev_free(dev, mem, sizeof(gp_loss_result), GP_MEM_WORKSPACE);
    GP_TRY(st);
    if (r.bad >= 0) return bad_on_device(dev, GP_LOSS_CROSS_ENTROPY, cols, labels, r.bad);
    out->loss_sum = r.loss_sum;
    out->correct = r.correct;
    out->count = rows;
    return GP_OK;
}

gp_status gp_loss(gp_device *dev, gp_loss_kind k, float smoothing, int64_t classes,
                  const gp_tensor *logits, const gp_tensor *targets, float grad_scale,
                  gp_tensor *dlogits, gp_loss_out *out)
{
    if (k == GP_LOSS_CROSS_ENTROPY && logits->dtype == GP_BF16 &&
        (!dlogits || dlogits->dtype == GP_BF16) && dev->iface->xent_bf16)
        return xent_bf16_host(dev, classes, logits, targets, smoothing, grad_scale, dlogits,
                              out);
    if (!loss_f32(logits, dlogits))
        return loss_wide(dev, k, smoothing, classes, logits, targets, grad_scale, dlogits, NULL,
                         out);
    if (k == GP_LOSS_BCE_WITH_LOGITS) {
        GP_ASSERT(smoothing == 0.0f && classes == 0);
        return gp_bce_with_logits(dev, logits, targets, grad_scale, dlogits, out);
    }
    GP_ASSERT(k == GP_LOSS_CROSS_ENTROPY);
    return xent_valid(dev, classes, logits, targets, smoothing, grad_scale, dlogits, out);
}

int gp_layers_first_trainable(const gp_layer *layers, int n)
{
    for (int k = 0; k < n; k++)
        if (gp_layer_param_count(&layers[k]) > 0) return k;
    return n;
}

int gp_layer_counters(gp_layer *l, const char **names, int64_t **values, int max)
{
    return l->ops->counters ? l->ops->counters(l, names, values, max) : 0;
}
