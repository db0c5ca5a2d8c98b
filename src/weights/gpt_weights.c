/*
 * gpt_weights.c — GPT-2's weight files as other programs write them, read
 * by model.init_from and written by --export-format: Hugging Face's
 * model.safetensors and llm.c's checkpoint (gpt2_124M.bin).
 *
 * gpipe's own names for a GPT-2 whose layers are named as Hugging Face's
 * modules (docs/config.md): "transformer.wte.weight" (V, C),
 * "transformer.wpe.weight" (maxT, C), per block i "transformer.h.i.ln_1.*",
 * "transformer.h.i.attn.c_attn.*" (3C, C), "transformer.h.i.attn.c_proj.*"
 * (C, C), "transformer.h.i.ln_2.*", "transformer.h.i.mlp.c_fc.*" (4C, C),
 * "transformer.h.i.mlp.c_proj.*" (C, 4C), "transformer.ln_f.*", and an
 * untied head's "lm_head.weight" (V, C).  Linear weights are (out, in).
 *
 * Hugging Face: the same names, with or without "transformer." (GPT2Model's
 * state_dict has none, GPT2LMHeadModel's has it); c_attn, c_proj and c_fc
 * are Conv1D modules whose weights are stored (in, out), transposed here;
 * the attn.bias / attn.masked_bias buffers (the causal mask) are dropped;
 * no lm_head.weight means the head is tied to wte (and one equal to wte's
 * is dropped for a model whose head is tied).  Such a file is known
 * by its h.0.attn.c_attn.weight of shape (C, 3C), where gpipe's is (3C, C).
 *
 * llm.c (train_gpt2.c's gpt2_build_from_checkpoint): 256 little-endian
 * int32 (magic 20240326, version 3 = FP32 or 5 = BF16, maxT, V, L, NH, C,
 * Vp), then 16 arrays, each over all L layers where it is per layer: wte
 * (Vp, C) (the vocabulary padded to Vp with zero rows), wpe (maxT, C),
 * ln1w ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C),
 * attprojb (L, C), ln2w ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw
 * (L, C, 4C), fcprojb (L, C), lnfw lnfb (C).  Its weights are (out, in), as
 * gpipe's; its head is always wte's.
 *
 * A padded vocabulary (model.gpt.vocab_pad: wte.weight and lm_head.weight
 * of Vp rows, the real V first): both formats hold GPT-2's V rows
 * (Hugging Face) or llm.c's own padding to a multiple of 128 (llm.c's
 * header says V), so reading takes the file's first V rows and zeros the
 * model's rows past them, and writing cuts back to V (and llm.c's 128):
 * an export of a padded model loads into an unpadded one, and the other
 * way round.  A file whose rows past the model's V are not zero holds
 * tokens: a padded model refuses it, and for an unpadded one
 * gp_snapshot_apply names the mismatched shape.
 *
 * A Hugging Face folder (save_pretrained's: config.json and
 * model.safetensors) is read through its model.safetensors, and
 * --export-format hf to a path that does not end in .safetensors writes
 * one: config.json with GPT2LMHeadModel's sizes and the tie (an untied
 * head said untied, which transformers' default would not) and
 * model.safetensors.
 *
 * Reading converts into a gp_st_file with gpipe's names, which
 * gp_snapshot_apply then checks against the model (missing, unexpected
 * and mis-shaped names, NaN) as for any weights file.  Everything is on
 * the host; the thread that drives the model calls these between steps.
 */
#include "core/hf_config.h"
#include "core/json.h"
#include "weights/weights.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240326
#define LLMC_HEADER 256
#define LLMC_PAD 128 /* llm.c pads the vocabulary to a multiple of 128 */
#define TX "transformer."

/* The four Conv1D weights of a block, by their name after "h.<i>.". */
static bool conv1d_weight(const char *block_rest)
{
    return !strcmp(block_rest, "attn.c_attn.weight") || !strcmp(block_rest, "attn.c_proj.weight") ||
           !strcmp(block_rest, "mlp.c_fc.weight") || !strcmp(block_rest, "mlp.c_proj.weight");
}

/* For a name without "transformer.": what follows "h.<i>." (NULL if it is
 * not a block's tensor). */
static const char *block_rest(const char *base)
{
    if (strncmp(base, "h.", 2)) return NULL;
    const char *p = base + 2;
    if (*p < '0' || *p > '9') return NULL;
    while (*p >= '0' && *p <= '9') p++;
    return *p == '.' ? p + 1 : NULL;
}

static const char *strip_tx(const char *name)
{
    return strncmp(name, TX, strlen(TX)) ? name : name + strlen(TX);
}

/* One value of t as a float (F32 or BF16: gp_st_widen). */
static float value_at(const gp_st_tensor *t, bool bf16, int64_t i)
{
    return gp_st_widen(t->data, bf16 ? GP_ST_WIDE_BF16 : GP_ST_WIDE_F32, i);
}

static int64_t numel(int ndim, const int64_t *dims)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= dims[d];
    return n;
}

/* The shape tensor t (of the file named `source`) takes in FP32,
 * transposed when `transpose` (2-D: (a, b) -> (b, a)), into dims; an error
 * where it cannot be converted. */
static gp_status converted_shape(const char *source, const gp_st_tensor *t, bool transpose,
                                 int64_t dims[GP_ST_MAX_DIMS])
{
    if (t->dtype != GP_ST_F32 && strcmp(t->dtype_name, "BF16"))
        return gp_error_set(GP_ERR_DATA, "%s: tensor '%s' is %s; GPT-2's weights are read as F32 "
                            "or BF16: save them as float32 (model.float()) and try again",
                            source, t->name, t->dtype_name);
    if (transpose && t->ndim != 2)
        return gp_error_set(GP_ERR_DATA, "%s: tensor '%s' has %d dimensions; a Conv1D weight is "
                            "(in, out)", source, t->name, t->ndim);
    memcpy(dims, t->dims, GP_ST_MAX_DIMS * sizeof *dims);
    if (transpose) dims[0] = t->dims[1], dims[1] = t->dims[0];
    return GP_OK;
}

/* Add tensor t of f as `name`, in FP32, transposed when `transpose`. */
static gp_status add_converted(gp_st_writer *w, const gp_st_file *f, const gp_st_tensor *t,
                               const char *name, bool transpose)
{
    bool bf16 = !strcmp(t->dtype_name, "BF16");
    int64_t dims[GP_ST_MAX_DIMS];
    GP_TRY(converted_shape(f->source, t, transpose, dims));
    int64_t n = numel(t->ndim, t->dims);
    float *out;
    GP_TRY(gp_st_writer_slot(w, name, GP_ST_F32, t->ndim, dims, (size_t)n * sizeof(float),
                             (void **)&out));
    if (transpose) {
        int64_t a = t->dims[0], b = t->dims[1];
        for (int64_t r = 0; r < a; r++)
            for (int64_t c = 0; c < b; c++) out[c * a + r] = value_at(t, bf16, r * b + c);
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = value_at(t, bf16, i);
    }
    return GP_OK;
}

/* The real rows of m's vocabulary (its embedding's valid rows), or -1
 * without an embedding first. */
static int64_t model_vocab(const gp_wmodel *m)
{
    if (m->n_layers < 1 || m->layers[0].spec.type != GP_LAYER_EMBEDDING) return -1;
    return gp_layer_spec_valid_rows(&m->layers[0].spec, m->layers[0].spec.vocab);
}

static bool vocab_tensor(const char *name)
{
    return !strcmp(name, TX "wte.weight") || !strcmp(name, "lm_head.weight");
}

/* Tensor t of f (rows, C) as m's `name` (wte.weight or lm_head.weight) of
 * model rows (a padded vocabulary, or none): the first V (model_vocab)
 * rows of t and zeros after them, where t has them all and nothing but
 * zeros past them; else t as it is, for gp_snapshot_apply to judge. */
static gp_status add_vocab(gp_st_writer *w, const gp_wmodel *m, const gp_st_file *f,
                           const gp_st_tensor *t, const char *name)
{
    int nd = 0;
    int64_t d[GP_ST_MAX_DIMS] = {0}, V = model_vocab(m);
    bool bf16 = !strcmp(t->dtype_name, "BF16");
    bool shaped = V > 0 && gp_weights_has(m, name, &nd, d) && nd == 2 && t->ndim == 2 &&
                  t->dims[1] == d[1] && t->dims[0] >= V && V <= d[0] &&
                  (t->dtype == GP_ST_F32 || bf16);
    bool zero = shaped; /* the file's rows past V: its own padding only */
    for (int64_t i = V * t->dims[1]; zero && i < t->dims[0] * t->dims[1]; i++)
        zero = value_at(t, bf16, i) == 0.0f;
    /* a padded model would take a larger vocabulary's rows as its padding
     * where the sizes happen to agree: tokens the loss never reads */
    if (shaped && !zero && V < d[0])
        return gp_error_set(GP_ERR_INVALID, "%s: tensor '%s' has %lld rows, and those past this "
                            "model's vocabulary of %lld are not 0: the file's vocabulary is "
                            "larger; set model.gpt.vocab to the file's (vocab_pad pads it)",
                            f->source, t->name, (long long)t->dims[0], (long long)V);
    if (!shaped || !zero || t->dims[0] == d[0]) return add_converted(w, f, t, name, false);
    float *out;
    GP_TRY(gp_st_writer_slot(w, name, GP_ST_F32, 2, d, (size_t)(d[0] * d[1]) * sizeof(float),
                             (void **)&out));
    for (int64_t i = 0; i < d[0] * d[1]; i++) out[i] = i < V * d[1] ? value_at(t, bf16, i) : 0.0f;
    return GP_OK;
}


bool gp_gpt_is_hf(const gp_st_file *f)
{
    const gp_st_tensor *t = gp_st_find(f, "h.0.attn.c_attn.weight");
    if (!t) t = gp_st_find(f, TX "h.0.attn.c_attn.weight");
    /* (divided, not 3 * dims[0]: a header's dims go to 2^63 - 1) */
    return t && t->ndim == 2 && t->dims[1] % 3 == 0 && t->dims[1] / 3 == t->dims[0];
}


/* A Conv1D weight t, (in, out), against the model's `name`, (out, in):
 * a mismatch named in the file's own layout (gp_snapshot_apply would name
 * the transposed shape). */
static gp_status conv1d_fits(const gp_wmodel *m, const gp_st_file *f, const gp_st_tensor *t,
                             const char *name)
{
    int nd = 0;
    int64_t d[GP_ST_MAX_DIMS] = {0};
    if (!gp_weights_has(m, name, &nd, d) || nd != 2 || t->ndim != 2 ||
        (t->dims[0] == d[1] && t->dims[1] == d[0]))
        return GP_OK; /* (a missing or other tensor: gp_snapshot_apply lists it) */
    return gp_error_set(GP_ERR_INVALID, "%s: tensor '%s' is (%lld, %lld), a Conv1D weight (in, "
                        "out), but this model's %s takes (in %lld, out %lld): the file is of "
                        "another GPT-2 size; set the model's dimensions to the file's", f->source,
                        t->name, (long long)t->dims[0], (long long)t->dims[1], name,
                        (long long)d[1], (long long)d[0]);
}


static int32_t le32(const uint8_t *b)
{
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24);
}

typedef struct llmc_dims {
    int64_t maxT, V, L, NH, C, Vp;
} llmc_dims;

/* The 16 arrays of llm.c's checkpoint, in its order: gpipe's name (with
 * %d for the block; NULL for wte, taken apart), per block or not, and the
 * shape of one block's (or the whole) array. */
typedef struct llmc_array {
    const char *name;
    bool per_block;
    int64_t rows, cols; /* cols 0: 1-D */
} llmc_array;

static int llmc_arrays(const llmc_dims *d, llmc_array a[16])
{
    int64_t C = d->C;
    const llmc_array t[16] = {
        {NULL, false, d->Vp, C},
        {TX "wpe.weight", false, d->maxT, C},
        {TX "h.%d.ln_1.weight", true, C, 0},
        {TX "h.%d.ln_1.bias", true, C, 0},
        {TX "h.%d.attn.c_attn.weight", true, 3 * C, C},
        {TX "h.%d.attn.c_attn.bias", true, 3 * C, 0},
        {TX "h.%d.attn.c_proj.weight", true, C, C},
        {TX "h.%d.attn.c_proj.bias", true, C, 0},
        {TX "h.%d.ln_2.weight", true, C, 0},
        {TX "h.%d.ln_2.bias", true, C, 0},
        {TX "h.%d.mlp.c_fc.weight", true, 4 * C, C},
        {TX "h.%d.mlp.c_fc.bias", true, 4 * C, 0},
        {TX "h.%d.mlp.c_proj.weight", true, C, 4 * C},
        {TX "h.%d.mlp.c_proj.bias", true, C, 0},
        {TX "ln_f.weight", false, C, 0},
        {TX "ln_f.bias", false, C, 0},
    };
    memcpy(a, t, sizeof t);
    return 16;
}

static int64_t array_numel(const llmc_array *a) { return a->rows * (a->cols ? a->cols : 1); }

/* The heads of m's attention layers: NH, or -1 where they differ or
 * there are none. */
static int64_t model_heads(const gp_wmodel *m)
{
    int64_t h = -1;
    for (int k = 0; k < m->n_layers; k++) {
        if (m->layers[k].spec.type != GP_LAYER_ATTENTION) continue;
        if (h >= 0 && h != m->layers[k].spec.heads) return -1;
        h = m->layers[k].spec.heads;
    }
    return h;
}

/* The llm.c array at p, of shape dims, as tensor `name` (wte and
 * lm_head.weight fitted to the model's vocabulary rows: add_vocab). */
static gp_status add_llmc(gp_st_writer *w, const gp_wmodel *m, const char *name,
                          const uint8_t *p, bool bf16, int ndim, const int64_t *dims)
{
    gp_st_tensor t = {.dtype = bf16 ? GP_ST_OTHER : GP_ST_F32, .ndim = ndim, .data = p};
    snprintf(t.dtype_name, sizeof t.dtype_name, "%s", bf16 ? "BF16" : "F32");
    memcpy(t.dims, dims, (size_t)ndim * sizeof *dims);
    t.name = (char *)name;
    gp_st_file f = {0};
    snprintf(f.source, sizeof f.source, "llm.c");
    return vocab_tensor(name) ? add_vocab(w, m, &f, &t, name)
                              : add_converted(w, &f, &t, name, false);
}


/* ---- lazy conversion: each tensor read and converted when it is loaded ----
 *
 * gp_gpt_read returns a converted file whose tensors have no data: each
 * is read from the source file (pread) and converted by the same
 * add_converted / add_vocab / add_llmc as the tensor is taken
 * (gp_st_file.fetch), so loading GPT-2 holds the model and one tensor at
 * a time, not the file and a converted copy of it. */

typedef enum { LZ_CONVERT, LZ_VOCAB, LZ_LLMC } lazy_kind;

typedef struct lazy_tensor {
    lazy_kind kind;
    bool transpose;          /* LZ_CONVERT: a Conv1D weight */
    gp_st_tensor src;        /* the source's dtype and shape (name owned, data NULL) */
    uint64_t off;            /* its bytes in the file: off .. off + src.end - src.begin */
} lazy_tensor;

typedef struct lazy_ctx {
    int fd;
    const gp_wmodel *m;
    char path[512];
    lazy_tensor *t;          /* [n]: the converted file's tensor i from t[i] */
    int n, cap;
} lazy_ctx;

static void lazy_free(void *arg)
{
    lazy_ctx *c = arg;
    if (!c) return;
    for (int i = 0; i < c->n; i++) free(c->t[i].src.name);
    free(c->t);
    if (c->fd >= 0) close(c->fd);
    free(c);
}

/* bytes at off of the file into buf, whole or an error naming the file */
static gp_status read_at(const lazy_ctx *c, uint64_t off, uint8_t *buf, size_t bytes)
{
    return gp_st_pread(c->fd, c->path, off, buf, bytes);
}

/* Tensor i of lt's kind into w, from its source bytes `data`. */
static gp_status lazy_convert(const lazy_ctx *c, const lazy_tensor *lt, const char *name,
                              const uint8_t *data, gp_st_writer *w)
{
    gp_st_file sf = {0};
    snprintf(sf.source, sizeof sf.source, "%s", c->path);
    gp_st_tensor src = lt->src;
    src.data = data;
    if (lt->kind == LZ_LLMC)
        return add_llmc(w, c->m, name, data, !strcmp(src.dtype_name, "BF16"), src.ndim, src.dims);
    return lt->kind == LZ_VOCAB ? add_vocab(w, c->m, &sf, &src, name)
                                : add_converted(w, &sf, &src, name, lt->transpose);
}

static gp_status lazy_fetch(const gp_st_file *f, int i, uint8_t *dst)
{
    const lazy_ctx *c = f->fetch_ctx;
    const lazy_tensor *lt = &c->t[i];
    const gp_st_tensor *t = &f->tensors[i];
    size_t bytes = (size_t)(lt->src.end - lt->src.begin);
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", c->path);
    gp_st_writer w = {0};
    gp_status s = read_at(c, lt->off, buf, bytes);
    if (s == GP_OK) s = lazy_convert(c, lt, t->name, buf, &w);
    free(buf);
    if (s == GP_OK && (w.n != 1 || w.tensors[0].end - w.tensors[0].begin != t->end - t->begin))
        s = gp_error_set(GP_ERR_DATA, "%s: tensor '%s' converted to another size than its "
                         "header said (the file changed while it was read?)", c->path, t->name);
    if (s == GP_OK) memcpy(dst, w.tensors[0].data, (size_t)(t->end - t->begin));
    gp_st_writer_free(&w);
    return s;
}

/* (gp_st_file.where) element e of converted tensor i in the source file:
 * a Conv1D weight's transposed, a vocabulary's rows as they are (a
 * padding row past the source's is no element of it); llm.c's arrays not
 * said. */
static bool lazy_where(const gp_st_file *f, int i, int64_t e, char *buf, size_t len)
{
    const lazy_ctx *c = f->fetch_ctx;
    const lazy_tensor *lt = &c->t[i];
    const gp_st_tensor *s = &lt->src;
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->dims[d];
    if (lt->kind == LZ_LLMC || e >= n) return false;
    if (lt->kind == LZ_CONVERT && lt->transpose && s->ndim == 2) /* (rows, cols) of the source */
        e = (e % s->dims[0]) * s->dims[1] + e / s->dims[0];
    snprintf(buf, len, "'%s'[%lld] of %s", s->name, (long long)e, c->path);
    return true;
}

/* The shape tensor `name` converts to, with the checks the conversion
 * makes that need no data (a vocabulary tensor's rows past the model's
 * vocabulary are read: they decide its shape). */
static gp_status lazy_shape(const lazy_ctx *c, const lazy_tensor *lt, const char *name,
                            int *ndim, int64_t *dims)
{
    const gp_st_tensor *t = &lt->src;
    bool bf16 = !strcmp(t->dtype_name, "BF16");
    GP_TRY(converted_shape(c->path, t, lt->transpose, dims)); /* add_converted's checks */
    *ndim = t->ndim;
    int nd = 0;
    int64_t d[GP_ST_MAX_DIMS] = {0}, V = model_vocab(c->m);
    if (!vocab_tensor(name) || V <= 0 || !gp_weights_has(c->m, name, &nd, d) || nd != 2 ||
        t->ndim != 2 || t->dims[1] != d[1] || t->dims[0] < V || V > d[0] ||
        t->dims[0] == d[0])
        return GP_OK; /* as it is (add_vocab's "not shaped") */
    /* the rows past V: zeros (the file's own padding) give the model's rows */
    size_t esz = bf16 ? 2 : 4, past = (size_t)((t->dims[0] - V) * t->dims[1]) * esz;
    uint8_t *buf = malloc(past ? past : 1);
    if (!buf) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", c->path);
    gp_status s = read_at(c, lt->off + (uint64_t)(V * t->dims[1]) * esz, buf, past);
    /* (as add_vocab judges them: values equal to 0, -0 too) */
    gp_st_tensor rows = *t;
    rows.data = buf;
    bool zero = true;
    for (int64_t i = 0; s == GP_OK && zero && i < (int64_t)(past / esz); i++)
        zero = value_at(&rows, bf16, i) == 0.0f;
    free(buf);
    GP_TRY(s);
    if (zero) memcpy(dims, d, sizeof d);
    return GP_OK;
}

/* One more tensor of the converted file: `name`, from the source tensor
 * src at file offset off. */
static gp_status lazy_add(lazy_ctx *c, lazy_kind kind, bool transpose, const gp_st_tensor *src,
                          uint64_t off, const char *name, gp_st_file *out)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        lazy_tensor *t = realloc(c->t, (size_t)cap * sizeof *t);
        gp_st_tensor *o = realloc(out->tensors, (size_t)cap * sizeof *o);
        if (t) c->t = t;
        if (o) out->tensors = o;
        if (!t || !o) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", c->path);
        c->cap = cap;
    }
    lazy_tensor *lt = &c->t[c->n];
    *lt = (lazy_tensor){.kind = kind, .transpose = transpose, .src = *src, .off = off};
    lt->src.data = NULL;
    lt->src.name = strdup(src->name ? src->name : name);
    gp_st_tensor *t = &out->tensors[c->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    c->n++;
    out->n = c->n;
    if (!lt->src.name || !t->name)
        return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", c->path);
    t->dtype = GP_ST_F32;
    snprintf(t->dtype_name, sizeof t->dtype_name, "F32");
    t->part = -1;
    GP_TRY(lazy_shape(c, lt, name, &t->ndim, t->dims));
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->dims[d];
    t->begin = out->data_len;
    t->end = t->begin + (uint64_t)n * sizeof(float);
    out->data_len = t->end;
    return GP_OK;
}

/* Whether the file's lm_head.weight (src) is wte's bits, for a tied model:
 * a state_dict saved whole holds it twice (tied_copy, read from the file). */
static gp_status lazy_tied_copy(const lazy_ctx *c, const gp_st_tensor *head,
                                const gp_st_tensor *wte, uint64_t base, bool *same)
{
    *same = false;
    size_t bytes = (size_t)(head->end - head->begin);
    if (gp_weights_has(c->m, "lm_head.weight", NULL, NULL) || !wte ||
        bytes != (size_t)(wte->end - wte->begin) || strcmp(head->dtype_name, wte->dtype_name))
        return GP_OK;
    uint8_t *a = malloc(bytes ? bytes : 1), *b = malloc(bytes ? bytes : 1);
    gp_status s = a && b ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'",
                                                c->path);
    if (s == GP_OK) s = read_at(c, base + head->begin, a, bytes);
    if (s == GP_OK) s = read_at(c, base + wte->begin, b, bytes);
    if (s == GP_OK) *same = !memcmp(a, b, bytes);
    free(a);
    free(b);
    return s;
}

/* An empty lazy file for path, its context open (the file read by fd). */
static gp_status lazy_open(const gp_wmodel *m, const char *path, gp_st_file *out, lazy_ctx **cp)
{
    memset(out, 0, sizeof *out);
    lazy_ctx *c = calloc(1, sizeof *c);
    if (!c) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    c->fd = gp_open_regular(path);
    c->m = m;
    snprintf(c->path, sizeof c->path, "%s", path);
    if (c->fd < 0) {
        int e = errno;
        free(c);
        return gp_error_set(GP_ERR_IO, "cannot open '%s': %s; check the path", path,
                            gp_open_strerror(e));
    }
    snprintf(out->source, sizeof out->source, "%s", path);
    out->fetch = lazy_fetch;
    out->fetch_ctx = c;
    out->fetch_free = lazy_free;
    out->where = lazy_where;
    *cp = c;
    return GP_OK;
}

/* A Hugging Face GPT-2 file (src: its header) as gpipe's names and
 * layouts, lazily (the tensors read as they are loaded). */
static gp_status lazy_hf(const gp_wmodel *m, const char *path, const gp_st_file *src,
                         gp_st_file *out)
{
    lazy_ctx *c;
    GP_TRY(lazy_open(m, path, out, &c));
    uint64_t base = 8;
    for (int b = 0; b < 8; b++) base += (uint64_t)src->image[b] << (8 * b); /* + the header */
    gp_status s = GP_OK;
    const gp_st_tensor *wte = NULL;
    bool head = false;
    char name[300];
    const gp_st_tensor *w = gp_st_find(src, "wte.weight");
    if (!w) w = gp_st_find(src, TX "wte.weight");
    for (int i = 0; i < src->n && s == GP_OK; i++) {
        const gp_st_tensor *t = &src->tensors[i];
        const char *bn = strip_tx(t->name), *rest = block_rest(bn);
        if (rest && (!strcmp(rest, "attn.bias") || !strcmp(rest, "attn.masked_bias")))
            continue; /* the causal mask, a buffer: the attention layer is causal */
        if (!strcmp(bn, "lm_head.weight")) {
            head = true;
            bool same = false;
            s = lazy_tied_copy(c, t, w, base, &same);
            if (s != GP_OK || same) continue; /* a tied head written out: it is wte */
            snprintf(name, sizeof name, "lm_head.weight");
        } else {
            snprintf(name, sizeof name, TX "%s", bn);
        }
        if (!strcmp(bn, "wte.weight")) wte = t;
        bool conv = rest && conv1d_weight(rest);
        if (conv) s = conv1d_fits(m, src, t, name);
        if (s == GP_OK)
            s = lazy_add(c, vocab_tensor(name) ? LZ_VOCAB : LZ_CONVERT, conv, t,
                         base + t->begin, name, out);
    }
    /* no lm_head.weight: tied to wte (save_pretrained leaves it out) */
    if (s == GP_OK && !head && wte && gp_weights_has(m, "lm_head.weight", NULL, NULL))
        s = lazy_add(c, LZ_VOCAB, false, wte, base + wte->begin, "lm_head.weight", out);
    return s;
}

/* An llm.c checkpoint as gpipe's names, lazily. */
static gp_status lazy_llmc(const gp_wmodel *m, const char *path, gp_st_file *out)
{
    const char *what = "an llm.c GPT-2 checkpoint (train_gpt2.py's write_model)";
    lazy_ctx *c;
    GP_TRY(lazy_open(m, path, out, &c));
    struct stat st;
    uint64_t len = fstat(c->fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    if (len < 4 * LLMC_HEADER)
        return gp_error_set(GP_ERR_DATA, "%s: %llu bytes, shorter than the 1024-byte header of "
                            "%s", path, (unsigned long long)len, what);
    uint8_t buf[4 * LLMC_HEADER];
    GP_TRY(read_at(c, 0, buf, sizeof buf));
    int32_t version = le32(buf + 4);
    if (version != 3 && version != 5)
        return gp_error_set(GP_ERR_DATA, "%s: version %d; %s is version 3 (FP32) or 5 (BF16): "
                            "write it again with llm.c's train_gpt2.py", path, version, what);
    llmc_dims d = {le32(buf + 8), le32(buf + 12), le32(buf + 16), le32(buf + 20),
                   le32(buf + 24), le32(buf + 28)};
    if (d.maxT < 1 || d.V < 1 || d.L < 1 || d.NH < 1 || d.C < 1 || d.Vp < d.V || d.C % d.NH)
        return gp_error_set(GP_ERR_DATA, "%s: header maxT %lld, V %lld, L %lld, NH %lld, C %lld, "
                            "Vp %lld: each must be >= 1, Vp >= V and NH must divide C; the file "
                            "is damaged or not %s", path, (long long)d.maxT, (long long)d.V,
                            (long long)d.L, (long long)d.NH, (long long)d.C, (long long)d.Vp,
                            what);
    llmc_array a[16];
    int na = llmc_arrays(&d, a);
    size_t esz = version == 3 ? 4 : 2;
    /* the bytes the header makes, in unsigned arithmetic checked at each
     * step and stopped as soon as they pass the file's (issue: signed
     * products that overflowed, undefined, wrapped a crafted 1024-byte
     * header's 2^64 + 1024 bytes to the file's 1024, and the arrays' sizes
     * then drove allocations without bound) */
    uint64_t want = 4 * LLMC_HEADER;
    bool over = false;
    for (int q = 0; q < na && !over; q++) {
        uint64_t n, bytes;
        over = __builtin_mul_overflow((uint64_t)a[q].rows, (uint64_t)(a[q].cols ? a[q].cols : 1),
                                      &n) ||
               __builtin_mul_overflow(n, (uint64_t)(a[q].per_block ? d.L : 1), &n) ||
               __builtin_mul_overflow(n, (uint64_t)esz, &bytes) ||
               __builtin_add_overflow(want, bytes, &want) || want > len;
    }
    if (over)
        return gp_error_set(GP_ERR_DATA, "%s: its header (L %lld, C %lld, V %lld padded to %lld, "
                            "maxT %lld, %s) makes more than the file's %llu bytes: the file is "
                            "cut short or damaged, or not %s", path, (long long)d.L, (long long)d.C,
                            (long long)d.V, (long long)d.Vp, (long long)d.maxT,
                            esz == 4 ? "FP32" : "BF16", (unsigned long long)len, what);
    if (len != want)
        return gp_error_set(GP_ERR_DATA, "%s: %llu bytes, but its header (L %lld, C %lld, V %lld "
                            "padded to %lld, maxT %lld, %s) makes %llu: the file is cut short or "
                            "damaged; download or write it again", path, (unsigned long long)len,
                            (long long)d.L, (long long)d.C, (long long)d.V, (long long)d.Vp,
                            (long long)d.maxT, esz == 4 ? "FP32" : "BF16",
                            (unsigned long long)want);
    int64_t heads = model_heads(m);
    if (heads > 0 && heads != d.NH)
        return gp_error_set(GP_ERR_INVALID, "%s: the checkpoint's model has %lld heads, this "
                            "model's attention layers %lld: set heads to %lld", path,
                            (long long)d.NH, (long long)heads, (long long)d.NH);
    gp_status s = GP_OK;
    uint64_t off = 4 * LLMC_HEADER, wte = off;
    char name[300];
    gp_st_tensor t = {.dtype = esz == 2 ? GP_ST_OTHER : GP_ST_F32};
    snprintf(t.dtype_name, sizeof t.dtype_name, "%s", esz == 2 ? "BF16" : "F32");
    for (int q = 0; q < na && s == GP_OK; q++) {
        int64_t n = array_numel(&a[q]);
        t.ndim = a[q].cols ? 2 : 1;
        t.dims[0] = a[q].rows;
        t.dims[1] = a[q].cols;
        if (!a[q].name) { /* wte: the file's V rows (add_llmc fits them to the model's) */
            t.dims[0] = d.V;
            t.name = (char *)TX "wte.weight";
            t.end = (uint64_t)(d.V * d.C) * esz;
            s = lazy_add(c, LZ_LLMC, false, &t, off, t.name, out);
            off += (uint64_t)n * esz;
            continue;
        }
        for (int64_t b = 0; b < (a[q].per_block ? d.L : 1) && s == GP_OK; b++) {
            snprintf(name, sizeof name, a[q].name, (int)b);
            t.name = name;
            t.end = (uint64_t)n * esz;
            s = lazy_add(c, LZ_LLMC, false, &t, off, name, out);
            off += (uint64_t)n * esz;
        }
    }
    if (s == GP_OK && gp_weights_has(m, "lm_head.weight", NULL, NULL)) {
        t.ndim = 2; /* llm.c's head is wte */
        t.dims[0] = d.V;
        t.dims[1] = d.C;
        t.name = (char *)"lm_head.weight";
        t.end = (uint64_t)(d.V * d.C) * esz;
        s = lazy_add(c, LZ_LLMC, false, &t, wte, t.name, out);
    }
    return s;
}


bool gp_gpt_is_llmc(const char *path)
{
    FILE *fp = gp_fopen_regular(path);
    uint8_t b[4];
    bool yes = fp && fread(b, 1, 4, fp) == 4 && le32(b) == LLMC_MAGIC;
    if (fp) fclose(fp);
    return yes;
}

/* t of f copied as it is (a counter: I64), under its own name. */
static gp_status add_raw(gp_st_writer *w, const gp_st_tensor *t)
{
    if (t->dtype == GP_ST_OTHER)
        return gp_error_set(GP_ERR_DATA, "tensor '%s' is %s, which gpipe does not load", t->name,
                            t->dtype_name);
    void *out;
    GP_TRY(gp_st_writer_slot(w, t->name, t->dtype, t->ndim, t->dims, (size_t)(t->end - t->begin),
                             &out));
    memcpy(out, t->data, (size_t)(t->end - t->begin));
    return GP_OK;
}

/* Whether f, gpipe's own file of a GPT, holds a vocabulary tensor whose
 * rows are not m's: one of them padded (model.gpt.vocab_pad), the other
 * not, or padded otherwise. */
static bool vocab_rows_differ(const gp_wmodel *m, const gp_st_file *f)
{
    if (model_vocab(m) <= 0) return false;
    for (int i = 0; i < f->n; i++) {
        const gp_st_tensor *t = &f->tensors[i];
        int nd = 0;
        int64_t d[GP_ST_MAX_DIMS] = {0};
        if (vocab_tensor(t->name) && t->ndim == 2 &&
            gp_weights_has(m, t->name, &nd, d) && nd == 2 && d[1] == t->dims[1] &&
            d[0] != t->dims[0])
            return true;
    }
    return false;
}

/* gpipe's own file (an export or a snapshot) of a GPT whose vocabulary
 * rows are not m's (vocab_rows_differ): wte.weight and lm_head.weight
 * given m's rows as Hugging Face's files are (add_vocab: the first V, and
 * zeros past them, which the file's rows past V must be), every other
 * tensor and the metadata as they are, after the file's checksum is
 * checked (the copy carries none).  A snapshot of a run in processes
 * (its parts apart) is left as it is. */
static gp_status own_vocab(const gp_wmodel *m, gp_st_file *f, bool *converted)
{
    if (!vocab_rows_differ(m, f) || gp_st_meta(f, "gpipe.parts")) return GP_OK;
    GP_TRY(gp_st_verify(f, false));
    gp_st_writer w = {0};
    gp_status s = GP_OK;
    for (int i = 0; i < f->n_meta && s == GP_OK; i++) {
        const char *key = f->meta[2 * i];
        if (strcmp(key, "gpipe.crc32") && strcmp(key, "gpipe.header_crc32"))
            s = gp_st_writer_meta(&w, key, f->meta[2 * i + 1]);
    }
    for (int i = 0; i < f->n && s == GP_OK; i++) {
        const gp_st_tensor *t = &f->tensors[i];
        bool fl = t->dtype == GP_ST_F32 || !strcmp(t->dtype_name, "BF16");
        s = vocab_tensor(t->name) ? add_vocab(&w, m, f, t, t->name)
            : fl                  ? add_converted(&w, f, t, t->name, false)
                                  : add_raw(&w, t);
    }
    /* the source freed before the converted image is made: the tensors
     * are never held three times */
    char source[sizeof f->source];
    memcpy(source, f->source, sizeof source);
    gp_st_free(f);
    memset(f, 0, sizeof *f);
    if (s == GP_OK) s = gp_st_writer_to_file(&w, source, f);
    gp_st_writer_free(&w);
    if (s != GP_OK) return s;
    *converted = true;
    return GP_OK;
}

gp_status gp_gpt_read(const gp_wmodel *m, const char *path, gp_st_file *f, bool *converted)
{
    *converted = false;
    memset(f, 0, sizeof *f); /* what the caller frees, whatever fails */
    /* llm.c's and Hugging Face's files are converted lazily: each tensor
     * read and converted as the model takes it (gp_st_file.fetch), so the
     * model and one tensor are held, not the file and a converted copy
     * (4.01 GiB for GPT-2 124M from llm.c's file where a fresh init
     * takes 2.48) */
    gp_status s;
    if (gp_gpt_is_llmc(path)) {
        s = lazy_llmc(m, path, f);
    } else {
        gp_st_file hdr;
        GP_TRY(gp_st_read_header(path, &hdr));
        if (!gp_gpt_is_hf(&hdr)) { /* gpipe's own: read whole, as snapshots are */
            gp_st_free(&hdr);
            GP_TRY(gp_st_read(path, f));
            return own_vocab(m, f, converted);
        }
        /* gpipe's hf export carries a CRC: checked streaming */
        s = gp_st_meta(&hdr, "gpipe.crc32") ? gp_st_verify_file(&hdr, path) : GP_OK;
        if (s == GP_OK) s = lazy_hf(m, path, &hdr, f);
        gp_st_free(&hdr);
    }
    if (s != GP_OK) {
        gp_st_free(f);
        return s;
    }
    *converted = true;
    return GP_OK;
}

/* ---- export -------------------------------------------------------------- */

/* t of g, which must be there (F32), for an export to `fmt`. */
static gp_status need(const gp_st_file *g, const char *name, const char *fmt, int ndim,
                      const gp_st_tensor **t)
{
    *t = gp_st_find(g, name);
    if (!*t || (*t)->dtype != GP_ST_F32 || (*t)->ndim != ndim)
        return gp_error_set(GP_ERR_INVALID, "%s needs a GPT-2 whose layers are named as Hugging "
                            "Face's modules (docs/config.md, \"GPT-2's weights\"), but this model "
                            "has no %d-D tensor '%s'", fmt, ndim, name);
    return GP_OK;
}

/* A vocabulary tensor (wte.weight, lm_head.weight) cut to the first V
 * rows of a padded model (model_vocab): what GPT-2's V-row files hold.
 * Others as they are. */
static gp_st_tensor vocab_cut(const gp_wmodel *m, const gp_st_tensor *t)
{
    gp_st_tensor c = *t;
    int64_t V = model_vocab(m);
    if (vocab_tensor(t->name) && t->ndim == 2 && V > 0 && V < t->dims[0]) c.dims[0] = V;
    return c;
}

static gp_status export_hf(const gp_wmodel *m, const gp_st_file *g, const char *path)
{
    const char *fmt = "--export-format hf";
    const gp_st_tensor *t;
    GP_TRY(need(g, TX "h.0.attn.c_attn.weight", fmt, 2, &t));
    gp_st_writer w = {0};
    gp_status s = gp_st_writer_meta(&w, "format", "pt");
    for (int i = 0; i < g->n && s == GP_OK; i++) {
        t = &g->tensors[i];
        const char *rest = block_rest(strip_tx(t->name));
        if (strncmp(t->name, TX, strlen(TX)) && strcmp(t->name, "lm_head.weight"))
            s = gp_error_set(GP_ERR_INVALID, "%s: tensor '%s' is not one of GPT-2's (they are "
                             "transformer.* and lm_head.weight); name the layers as Hugging "
                             "Face's modules, or export with --export-format gpipe", fmt, t->name);
        else {
            gp_st_tensor c = vocab_cut(m, t); /* a padded vocabulary: GPT-2's V rows */
            s = add_converted(&w, g, &c, t->name, rest && conv1d_weight(rest));
        }
    }
    if (s == GP_OK) s = gp_st_write_atomic(&w, path);
    gp_st_writer_free(&w);
    return s;
}

/* The first layer of type t whose name ends in `tail` ("" any), or NULL. */
static const gp_layer *layer_named(const gp_wmodel *m, gp_layer_type t, const char *tail)
{
    size_t n = strlen(tail);
    for (int k = 0; k < m->n_layers; k++) {
        const char *ln = m->layers[k].spec.name;
        size_t l = strlen(ln);
        if (m->layers[k].spec.type == t && l >= n && !strcmp(ln + l - n, tail))
            return &m->layers[k];
    }
    return NULL;
}

/* ---- a Hugging Face folder's config.json against the model -------------- */

/* config.json's number `key` against the model's (set by model.gpt key
 * `ours`), a difference appended to msg; absent: GPT2Config's default. */
static gp_status gpt_cmp(const gp_hf_config *hc, const char *key, double def, double model,
                         const char *ours, char *msg, size_t len)
{
    const gp_json_value *v = gp_json_get(hc->json, key);
    bool absent = !v || (v->kind == GP_JSON_NULL && !strcmp(key, "n_inner"));
    double file = def;
    if (!absent) GP_TRY(gp_hf_config_num(hc, NULL, key, def, -INFINITY, INFINITY, false, &file));
    if (fabs(file - model) <= 1e-6 * fmax(fabs(file), fabs(model))) return GP_OK;
    size_t at = strlen(msg);
    if (absent)
        snprintf(msg + at, len - at, "%s%s absent (transformers uses %.10g; this model: %s "
                 "%.10g)", at ? "; " : "", key, file, ours, model);
    else
        snprintf(msg + at, len - at, "%s%s %.10g (this model: %s %.10g)", at ? "; " : "", key,
                 file, ours, model);
    return GP_OK;
}

/* What GPT-2's sizes do not show: the activation, attention's scaling, the
 * family. */
static gp_status gpt_supported(const gp_hf_config *hc)
{
    const gp_json_value *ty = gp_json_get(hc->json, "model_type");
    const gp_json_value *act = gp_json_get(hc->json, "activation_function");
    if (ty && (ty->kind != GP_JSON_STRING || strcmp(ty->str, "gpt2")))
        return gp_error_set(GP_ERR_UNSUPPORTED, "%s: model_type %s%s%s: model.gpt builds GPT-2 "
                            "(model_type gpt2)", hc->path, ty->kind == GP_JSON_STRING ? "'" : "",
                            ty->kind == GP_JSON_STRING ? ty->str : "not a string",
                            ty->kind == GP_JSON_STRING ? "'" : "");
    /* (gpipe's GELU is GPT-2's tanh form: gp_ew_gelu; these three compute
     * it, "gelu" is erf's) */
    if (act && (act->kind != GP_JSON_STRING ||
                (strcmp(act->str, "gelu_new") && strcmp(act->str, "gelu_pytorch_tanh") &&
                 strcmp(act->str, "gelu_fast"))))
        return gp_error_set(GP_ERR_UNSUPPORTED, "%s: activation_function %s%s%s: model.gpt's "
                            "MLP has GELU's tanh form, GPT-2's (activation_function gelu_new, "
                            "gelu_pytorch_tanh or gelu_fast); gpipe has no other", hc->path,
                            act->kind == GP_JSON_STRING ? "'" : "",
                            act->kind == GP_JSON_STRING ? act->str : "not a string",
                            act->kind == GP_JSON_STRING ? "'" : "");
    bool scale, by_layer;
    GP_TRY(gp_hf_config_bool(hc, NULL, "scale_attn_weights", true, &scale));
    GP_TRY(gp_hf_config_bool(hc, NULL, "scale_attn_by_inverse_layer_idx", false, &by_layer));
    if (!scale || by_layer)
        return gp_error_set(GP_ERR_UNSUPPORTED, "%s: %s: gpipe's attention scales its scores "
                            "by 1 / sqrt(head size) alone, as GPT-2's does (scale_attn_weights "
                            "true, scale_attn_by_inverse_layer_idx false)", hc->path,
                            !scale ? "scale_attn_weights is false"
                                   : "scale_attn_by_inverse_layer_idx is true");
    /* (reorder_and_upcast_attn computes the same scores in FP32, which
     * gpipe's attention is: it changes nothing to check) */
    return GP_OK;
}

gp_status gp_gpt_check_config(const gp_wmodel *m, const char *dir)
{
    gp_hf_config hc; /* the one reader of config.json (core/hf_config.h) */
    gp_status st = gp_hf_config_read(dir, &hc);
    if (st != GP_OK || !hc.json) { /* (none: the tensors' shapes are checked as they load) */
        gp_hf_config_free(&hc);
        return st;
    }
    const gp_layer *emb = m->n_layers > 0 && m->layers[0].spec.type == GP_LAYER_EMBEDDING
                              ? &m->layers[0]
                              : NULL;
    const gp_layer *ln = layer_named(m, GP_LAYER_LAYER_NORM, "ln_1");
    const gp_layer *fc = layer_named(m, GP_LAYER_LINEAR, "mlp.c_fc");
    int64_t blocks = 0, heads = model_heads(m);
    for (int k = 0; k < m->n_layers; k++) blocks += m->layers[k].spec.type == GP_LAYER_ATTENTION;
    char msg[1500] = "";
    st = gpt_supported(&hc);
    if (st == GP_OK)
        st = gpt_cmp(&hc, "n_layer", 12, (double)blocks, "model.gpt.layers", msg, sizeof msg);
    if (st == GP_OK && heads > 0)
        st = gpt_cmp(&hc, "n_head", 12, (double)heads, "model.gpt.heads", msg, sizeof msg);
    if (st == GP_OK && emb)
        st = gpt_cmp(&hc, "n_embd", 768, (double)emb->spec.dim, "model.gpt.width", msg,
                     sizeof msg);
    if (st == GP_OK && emb)
        st = gpt_cmp(&hc, "vocab_size", 50257, (double)model_vocab(m), "model.gpt.vocab", msg,
                     sizeof msg);
    if (st == GP_OK && emb)
        st = gpt_cmp(&hc, "n_positions", 1024, (double)emb->spec.positions,
                     "model.gpt.positions", msg, sizeof msg);
    if (st == GP_OK && emb && fc) /* (null or absent: 4 n_embd; model.gpt's is) */
        st = gpt_cmp(&hc, "n_inner", 4.0 * (double)emb->spec.dim, (double)fc->spec.out,
                     "4 model.gpt.width", msg, sizeof msg);
    if (st == GP_OK && ln)
        st = gpt_cmp(&hc, "layer_norm_epsilon", 1e-5, (double)ln->spec.eps,
                     "its layer norms' eps", msg, sizeof msg);
    if (st == GP_OK && msg[0])
        st = gp_error_set(GP_ERR_INVALID, "%s does not describe this model: %s; set the "
                          "model.gpt keys named to the folder's values", hc.path, msg);
    gp_hf_config_free(&hc);
    return st;
}

/* config.json of a GPT2LMHeadModel folder for m, whose tensors g holds,
 * staged in dir (gp_hf_folder_commit). */
static gp_status write_gpt_config(const gp_wmodel *m, const gp_st_file *g, const char *dir)
{
    const char *fmt = "--export-format hf";
    const gp_st_tensor *wte, *wpe;
    GP_TRY(need(g, TX "wte.weight", fmt, 2, &wte));
    GP_TRY(need(g, TX "wpe.weight", fmt, 2, &wpe));
    const gp_layer *ln = layer_named(m, GP_LAYER_LAYER_NORM, "ln_1");
    const gp_layer *fc = layer_named(m, GP_LAYER_LINEAR, "mlp.c_fc");
    int64_t L = 0, heads = model_heads(m);
    char name[300];
    for (;; L++) {
        snprintf(name, sizeof name, TX "h.%lld.ln_1.weight", (long long)L);
        if (!gp_st_find(g, name)) break;
    }
    if (L < 1 || heads < 1 || !fc)
        return gp_error_set(GP_ERR_INVALID, "%s: config.json holds GPT-2's sizes, and this "
                            "model has %lld blocks (transformer.h.<i>), %s and %s", fmt,
                            (long long)L, heads < 1 ? "no one number of heads" : "its heads",
                            fc ? "its MLP" : "no mlp.c_fc layer");
    bool tied = gp_st_find(g, "lm_head.weight") == NULL;
    gp_json_writer w = {.pretty = 2};
    gp_json_open_object(&w, NULL);
    gp_json_open_array(&w, "architectures");
    gp_json_put_str(&w, NULL, "GPT2LMHeadModel");
    gp_json_close(&w);
    gp_json_put_str(&w, "model_type", "gpt2");
    gp_json_put_int(&w, "vocab_size", vocab_cut(m, wte).dims[0]);
    gp_json_put_int(&w, "n_positions", wpe->dims[0]);
    gp_json_put_int(&w, "n_ctx", wpe->dims[0]);
    gp_json_put_int(&w, "n_embd", wte->dims[1]);
    gp_json_put_int(&w, "n_layer", L);
    gp_json_put_int(&w, "n_head", heads);
    gp_json_put_int(&w, "n_inner", fc->spec.out);
    gp_json_put_str(&w, "activation_function", "gelu_new");
    gp_json_put_float(&w, "layer_norm_epsilon", ln ? (double)ln->spec.eps : 1e-5);
    gp_json_put_float(&w, "initializer_range", 0.02);
    gp_json_put_float(&w, "resid_pdrop", 0.0);
    gp_json_put_float(&w, "embd_pdrop", 0.0);
    gp_json_put_float(&w, "attn_pdrop", 0.0);
    gp_json_put_bool(&w, "scale_attn_weights", true);
    gp_json_put_bool(&w, "tie_word_embeddings", tied);
    gp_json_put_str(&w, "torch_dtype", "float32");
    gp_json_put_bool(&w, "use_cache", true);
    gp_json_close(&w);
    char path[1100];
    snprintf(path, sizeof path, "%s/" GP_HF_STAGE "config.json", dir);
    return gp_weights_write_json(&w, path);
}

bool gp_gpt_hf_folder_path(const char *path)
{
    size_t n = strlen(path), t = strlen(".safetensors");
    return !(n >= t && !strcmp(path + n - t, ".safetensors"));
}

/* --export-format hf to a folder, as a whole: model.safetensors and
 * config.json staged, then renamed into place in that order (until
 * 2026-12-01 config.json went first, and a failed model.safetensors left
 * it beside the earlier export's weights, or alone). */
static gp_status export_hf_folder(const gp_wmodel *m, const gp_st_file *g, const char *dir)
{
    GP_TRY(gp_make_dirs(dir, "--export-weights (a Hugging Face folder)"));
    gp_hf_remove_staged(dir); /* a killed export's */
    char file[1100];
    snprintf(file, sizeof file, "%s/" GP_HF_STAGE "model.safetensors", dir);
    gp_status s = export_hf(m, g, file);
    if (s == GP_OK) s = write_gpt_config(m, g, dir);
    static const char *const names[] = {"model.safetensors", "config.json"};
    return gp_hf_folder_commit(dir, names, 2, s);
}

/* GP_ERR_IO with *err the errno of a short write (EIO where it set none) */
static gp_status write_f32(FILE *fp, const float *v, int64_t n, int *err)
{
    if (fwrite(v, sizeof *v, (size_t)n, fp) == (size_t)n) return GP_OK;
    *err = errno ? errno : EIO;
    return GP_ERR_IO;
}

static gp_status export_llmc(const gp_wmodel *m, const gp_st_file *g, const char *path)
{
    const char *fmt = "--export-format llmc";
    const gp_st_tensor *wte, *wpe, *t;
    GP_TRY(need(g, TX "wte.weight", fmt, 2, &wte));
    GP_TRY(need(g, TX "wpe.weight", fmt, 2, &wpe));
    /* V: a padded vocabulary's real rows; llm.c pads them again its way */
    llmc_dims d = {.maxT = wpe->dims[0], .V = vocab_cut(m, wte).dims[0], .C = wte->dims[1],
                   .NH = model_heads(m)};
    d.Vp = (d.V + LLMC_PAD - 1) / LLMC_PAD * LLMC_PAD;
    char name[300];
    for (d.L = 0;; d.L++) {
        snprintf(name, sizeof name, TX "h.%lld.ln_1.weight", (long long)d.L);
        if (!gp_st_find(g, name)) break;
    }
    if (d.L < 1 || d.NH < 1)
        return gp_error_set(GP_ERR_INVALID, "%s needs a GPT-2 (blocks named transformer.h.<i>, "
                            "attention layers with one number of heads); this model has %lld "
                            "blocks and %s", fmt, (long long)d.L,
                            d.NH < 1 ? "no single number of heads" : "them");
    const gp_st_tensor *head = gp_st_find(g, "lm_head.weight");
    if (head && (head->end - head->begin != wte->end - wte->begin ||
                 memcmp(head->data, wte->data, (size_t)(wte->end - wte->begin))))
        return gp_error_set(GP_ERR_INVALID, "%s: llm.c's checkpoint has no head of its own "
                            "(GPT-2's is tied to wte), but this model's lm_head.weight differs "
                            "from transformer.wte.weight; tie them (tie: transformer) or "
                            "export with --export-format hf", fmt);
    if (wpe->dims[1] != d.C)
        return gp_error_set(GP_ERR_INVALID, "%s: wpe is %lld wide, wte %lld", fmt,
                            (long long)wpe->dims[1], (long long)d.C);
    llmc_array a[16];
    int na = llmc_arrays(&d, a);
    /* every array is there, with its shape, before anything is written */
    for (int q = 1; q < na; q++)
        for (int64_t b = 0; b < (a[q].per_block ? d.L : 1); b++) {
            snprintf(name, sizeof name, a[q].name, (int)b);
            GP_TRY(need(g, name, fmt, a[q].cols ? 2 : 1, &t));
            if (t->dims[0] != a[q].rows || (a[q].cols && t->dims[1] != a[q].cols))
                return gp_error_set(GP_ERR_INVALID, "%s: '%s' is not the shape of GPT-2's (C = "
                                    "%lld: (%lld%s%lld)); the model is not a GPT-2", fmt, name,
                                    (long long)d.C, (long long)a[q].rows, a[q].cols ? ", " : "",
                                    (long long)a[q].cols);
        }
    int32_t hdr[LLMC_HEADER] = {LLMC_MAGIC, 3, (int32_t)d.maxT, (int32_t)d.V, (int32_t)d.L,
                                (int32_t)d.NH, (int32_t)d.C, (int32_t)d.Vp};
    gp_atomic_file af;
    GP_TRY(gp_atomic_open(path, &af));
    /* the errno of a short write, for the commit's advice (a full disk, a
     * file-size limit; it said "Input/output error" for every one) */
    int err = 0;
    errno = 0;
    gp_status s = fwrite(hdr, sizeof hdr, 1, af.f) == 1 ? GP_OK : GP_ERR_IO;
    if (s != GP_OK) err = errno ? errno : EIO;
    if (s == GP_OK) s = write_f32(af.f, (const float *)wte->data, d.V * d.C, &err);
    for (int64_t r = d.V; r < d.Vp && s == GP_OK; r++) { /* the padding rows: zeros */
        static const float zero[1] = {0};
        for (int64_t c = 0; c < d.C && s == GP_OK; c++) s = write_f32(af.f, zero, 1, &err);
    }
    for (int q = 1; q < na && s == GP_OK; q++)
        for (int64_t b = 0; b < (a[q].per_block ? d.L : 1) && s == GP_OK; b++) {
            snprintf(name, sizeof name, a[q].name, (int)b);
            t = gp_st_find(g, name);
            s = write_f32(af.f, (const float *)t->data, array_numel(&a[q]), &err);
        }
    return gp_atomic_commit(&af, s == GP_OK ? 0 : err);
}

gp_status gp_gpt_export_check(const gp_wmodel *m, gp_weights_format fmt, bool trains)
{
    if (fmt == GP_WEIGHTS_GPIPE) return GP_OK;
    if ((fmt == GP_WEIGHTS_HF || fmt == GP_WEIGHTS_HF_BF16) && gp_llama_is_model(m))
        return gp_llama_export_check(m); /* a Llama's folder (hf_llama.c) */
    if (fmt == GP_WEIGHTS_HF_BF16)
        return gp_error_set(GP_ERR_UNSUPPORTED, "--export-format hf-bf16 writes a Llama's folder "
                            "(model.llama) in bf16; this model is not one: export a GPT-2 with "
                            "--export-format hf (FP32)");
    const char *f = fmt == GP_WEIGHTS_HF ? "--export-format hf" : "--export-format llmc";
    const char *names[3] = {TX "wte.weight", TX "wpe.weight", TX "h.0.attn.c_attn.weight"};
    for (int q = 0; q < 3; q++)
        if (!gp_weights_has(m, names[q], NULL, NULL))
            return gp_error_set(GP_ERR_INVALID, "%s needs a GPT-2 whose layers are named as "
                                "Hugging Face's modules (docs/config.md, \"GPT-2's weights\")%s, "
                                "but this model has no tensor '%s'%s", f,
                                fmt == GP_WEIGHTS_HF ? " or a Llama (model.llama)" : "", names[q],
                                fmt == GP_WEIGHTS_HF ? "" : "; a Llama exports with "
                                "--export-format hf, any model with gpipe");
    for (int k = 0; k < m->n_layers; k++) {
        const char *ln = m->layers[k].spec.name;
        if (m->layers[k].n_params > 0 && strncmp(ln, TX, strlen(TX)) && strcmp(ln, "lm_head") &&
            strcmp(ln, "transformer"))
            return gp_error_set(GP_ERR_INVALID, "%s: layer %d '%s' has parameters but is not "
                                "one of GPT-2's modules (transformer.*, lm_head); the file "
                                "could not hold it: export with --export-format gpipe", f, k, ln);
    }
    if (fmt == GP_WEIGHTS_LLMC && model_heads(m) < 1)
        return gp_error_set(GP_ERR_INVALID, "%s: llm.c's header holds one number of heads, and "
                            "this model's attention layers have none or several", f);
    if (fmt == GP_WEIGHTS_LLMC && trains && gp_weights_has(m, "lm_head.weight", NULL, NULL))
        return gp_error_set(GP_ERR_INVALID, "%s: llm.c's checkpoint has no head of its own "
                            "(GPT-2's is tied to wte), and this model's lm_head has a weight of "
                            "its own that training would make differ from wte's; tie it (tie: "
                            "transformer) or use --export-format hf", f);
    return GP_OK;
}

gp_status gp_gpt_write(const gp_wmodel *m, const gp_st_file *g, const char *path,
                       gp_weights_format fmt)
{
    if (fmt == GP_WEIGHTS_LLMC) return export_llmc(m, g, path);
    return gp_gpt_hf_folder_path(path) ? export_hf_folder(m, g, path) : export_hf(m, g, path);
}
