/*
 * hf_llama.c — a Hugging Face Llama model folder read by model.init_from
 * (issue 66): config.json, and model.safetensors or the shards
 * model-0000k-of-0000n.safetensors that model.safetensors.index.json maps,
 * in F32, BF16 or F16, as LlamaForCausalLM.save_pretrained writes them.
 *
 * gpipe's model.llama (config_family.c) names its layers as HF's modules,
 * with two differences: q_proj, k_proj and v_proj are one linear layer,
 * self_attn.qkv_proj, their rows stacked in that order, and gate_proj and
 * up_proj one, mlp.gate_up_proj; the embedding's table is
 * model.embed_tokens.wte.weight.  A folder without lm_head.weight (a tied
 * model's save) gives an untied model's head the embedding's rows.  The
 * rotary_emb.inv_freq buffers of older saves are computed, not read.
 *
 * The tensors stream: the converted file's tensors have no data, each is
 * read from its shards (pread) and converted to FP32 when the model takes
 * it (gp_st_file.fetch), so an 8B model in bf16 (16 GB in 4 shards) loads
 * holding the model and one tensor, never the folder.  config.json, where
 * the folder has one, is checked against the model first: each size that
 * differs is named, with the model.llama key that sets it.
 */
#include "backend/elementwise.h"
#include "core/hf_config.h"
#include "core/json.h"
#include "weights/weights.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_MAX_SRC 3 /* q, k and v */
/* An export's files are written under this prefix, then renamed into place. */

typedef struct hf_shard {
    char path[700];
    int fd;
    gp_st_file hdr;
    uint64_t base; /* the data section's first byte */
} hf_shard;

typedef struct hf_src {
    int shard;
    const gp_st_tensor *t; /* in its shard's header */
} hf_src;

typedef struct hf_out {
    int n;
    hf_src s[HF_MAX_SRC]; /* stacked along the rows, in order */
} hf_out;

typedef struct hf_ctx {
    hf_shard *sh;
    int n_sh;
    hf_out *o; /* [out->n] */
    int cap;
    char dir[600];
} hf_ctx;

static void ctx_free(void *arg)
{
    hf_ctx *c = arg;
    if (!c) return;
    for (int i = 0; i < c->n_sh; i++) {
        if (c->sh[i].fd >= 0) close(c->sh[i].fd);
        gp_st_free(&c->sh[i].hdr);
    }
    free(c->sh);
    free(c->o);
    free(c);
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- the shards ------------------------------------------------------------ */

static gp_status add_shard(hf_ctx *c, const char *path)
{
    for (int i = 0; i < c->n_sh; i++)
        if (!strcmp(c->sh[i].path, path)) return GP_OK;
    hf_shard *sh = realloc(c->sh, (size_t)(c->n_sh + 1) * sizeof *sh);
    if (!sh) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    c->sh = sh;
    hf_shard *s = &c->sh[c->n_sh];
    memset(s, 0, sizeof *s);
    s->fd = -1;
    snprintf(s->path, sizeof s->path, "%s", path);
    c->n_sh++;
    GP_TRY(gp_st_read_header(path, &s->hdr));
    s->base = 8;
    for (int b = 0; b < 8; b++) s->base += (uint64_t)s->hdr.image[b] << (8 * b);
    s->fd = gp_open_regular(path);
    if (s->fd < 0)
        return gp_error_set(GP_ERR_IO, "cannot open '%s': %s", path, gp_open_strerror(errno));
    return GP_OK;
}

/* The folder's shards: the index's files, or model.safetensors; or the one
 * file `path`. */
static gp_status open_shards(hf_ctx *c, const char *path)
{
    char p[700];
    if (!is_dir(path)) {
        snprintf(c->dir, sizeof c->dir, "%s", path);
        return add_shard(c, path);
    }
    snprintf(c->dir, sizeof c->dir, "%s", path);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
    if (!exists(p)) {
        snprintf(p, sizeof p, "%s/model.safetensors", path);
        if (!exists(p))
            return gp_error_set(GP_ERR_IO, "%s: no model.safetensors and no "
                                "model.safetensors.index.json: a Hugging Face model folder "
                                "(save_pretrained's) has one of them", path);
        return add_shard(c, p);
    }
    gp_hf_config idx; /* (config.json's reader and its checks) */
    gp_status rs = gp_hf_json_read(p, &idx);
    if (rs == GP_OK && !idx.json) /* (gone since exists()) */
        rs = gp_error_set(GP_ERR_IO, "cannot open '%s': %s", p, strerror(ENOENT));
    if (rs != GP_OK) {
        gp_hf_config_free(&idx);
        return rs;
    }
    const gp_json_value *wm = gp_json_get(idx.json, "weight_map");
    gp_status s = GP_OK;
    if (!wm || wm->kind != GP_JSON_OBJECT)
        s = gp_error_set(GP_ERR_DATA, "%s: no \"weight_map\" object; write the index again with "
                         "save_pretrained", p);
    for (int i = 0; s == GP_OK && i < wm->n; i++) {
        const gp_json_value *f = &wm->items[i];
        if (f->kind != GP_JSON_STRING || strchr(f->str, '/')) {
            s = gp_error_set(GP_ERR_DATA, "%s: weight_map[\"%s\"] is not a file name of the "
                             "folder", p, wm->keys[i]);
            break;
        }
        char sp[700];
        snprintf(sp, sizeof sp, "%s/%s", path, f->str);
        s = add_shard(c, sp);
    }
    gp_hf_config_free(&idx);
    return s;
}

/* The tensor named `name` in the shards, or false. */
static bool find_src(const hf_ctx *c, const char *name, hf_src *out)
{
    for (int i = 0; i < c->n_sh; i++) {
        const gp_st_tensor *t = gp_st_find(&c->sh[i].hdr, name);
        if (t) {
            *out = (hf_src){i, t};
            return true;
        }
    }
    return false;
}

/* ---- conversion -------------------------------------------------------------- */

/* The source's element kind (gp_st_wide_of), or an error naming it. */
static gp_status src_kind(const hf_ctx *c, const hf_src *s, gp_st_wide *k)
{
    *k = gp_st_wide_of(s->t);
    if (*k == GP_ST_WIDE_NONE)
        return gp_error_set(GP_ERR_DATA, "%s: tensor '%s' is %s; a Llama's weights are read as "
                            "F32, BF16 or F16", c->sh[s->shard].path, s->t->name,
                            s->t->dtype_name);
    return GP_OK;
}

static gp_status fetch(const gp_st_file *f, int i, uint8_t *dst)
{
    const hf_ctx *c = f->fetch_ctx;
    const hf_out *o = &c->o[i];
    float *out = (float *)dst;
    for (int q = 0; q < o->n; q++) {
        const hf_src *s = &o->s[q];
        const hf_shard *sh = &c->sh[s->shard];
        gp_st_wide k;
        GP_TRY(src_kind(c, s, &k));
        size_t bytes = (size_t)(s->t->end - s->t->begin);
        size_t n = bytes / (k == GP_ST_WIDE_F32 ? 4 : 2);
        uint8_t *buf = malloc(bytes ? bytes : 1);
        if (!buf) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", sh->path);
        gp_status st = gp_st_pread(sh->fd, sh->path, sh->base + s->t->begin, buf, bytes);
        for (size_t e = 0; st == GP_OK && e < n; e++) out[e] = gp_st_widen(buf, k, (int64_t)e);
        free(buf);
        GP_TRY(st);
        out += n;
    }
    return GP_OK;
}

/* (gp_st_file.where) element e of gpipe's tensor i: which HF tensor of
 * its stack, and its element there */
static bool where(const gp_st_file *f, int i, int64_t e, char *buf, size_t len)
{
    const hf_ctx *c = f->fetch_ctx;
    const hf_out *o = &c->o[i];
    for (int q = 0; q < o->n; q++) {
        const gp_st_tensor *t = o->s[q].t;
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->dims[d];
        if (e < n) {
            snprintf(buf, len, "'%s'[%lld] of %s", t->name, (long long)e,
                     c->sh[o->s[q].shard].path);
            return true;
        }
        e -= n;
    }
    return false;
}

/* gpipe's tensor `name` stacked from the n HF tensors src (rows want[q]
 * each, their own shape checked: a folder whose q, k and v, or gate and
 * up, split the stacked rows otherwise is another model, as transformers
 * says, even where the total matches). */
static gp_status add_out(hf_ctx *c, gp_st_file *out, const char *name, const hf_src *src, int n,
                         const int64_t *want)
{
    if (out->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        hf_out *o = realloc(c->o, (size_t)cap * sizeof *o);
        gp_st_tensor *t = realloc(out->tensors, (size_t)cap * sizeof *t);
        if (o) c->o = o;
        if (t) out->tensors = t;
        if (!o || !t) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", c->dir);
        c->cap = cap;
    }
    const gp_st_tensor *a = src[0].t;
    int64_t rows = 0;
    for (int q = 0; q < n; q++) {
        gp_st_wide k;
        GP_TRY(src_kind(c, &src[q], &k));
        const gp_st_tensor *b = src[q].t;
        bool same = b->ndim == a->ndim && b->ndim >= 1;
        for (int d = 1; same && d < a->ndim; d++) same = b->dims[d] == a->dims[d];
        if (!same)
            return gp_error_set(GP_ERR_DATA, "%s: tensors '%s' and '%s' do not stack into "
                                "gpipe's %s (their shapes differ past the first axis)", c->dir,
                                a->name, b->name, name);
        if (n > 1 && want[q] >= 0 && b->dims[0] != want[q])
            return gp_error_set(GP_ERR_DATA, "%s: tensor '%s' has %lld rows where this model "
                                "takes %lld (its %s stacks %d tensors of %s): the folder is of "
                                "another model; set model.llama's heads, kv_heads, width and "
                                "intermediate to its config.json's", c->dir, b->name,
                                (long long)b->dims[0], (long long)want[q], name, n,
                                n == 3 ? "heads x head size, then k's and v's kv_heads x head "
                                         "size" : "the intermediate size each");
        rows += b->dims[0];
    }
    gp_st_tensor *t = &out->tensors[out->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", c->dir);
    t->dtype = GP_ST_F32;
    snprintf(t->dtype_name, sizeof t->dtype_name, "F32");
    t->part = -1;
    t->ndim = a->ndim;
    memcpy(t->dims, a->dims, sizeof t->dims);
    t->dims[0] = rows;
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= t->dims[d];
    t->begin = out->data_len;
    t->end = t->begin + (uint64_t)numel * sizeof(float);
    out->data_len = t->end;
    c->o[out->n] = (hf_out){.n = n};
    memcpy(c->o[out->n].s, src, (size_t)n * sizeof *src);
    out->n++;
    return GP_OK;
}

/* Whether shard i's tensor t holds the bits of the folder's
 * model.embed_tokens.weight (same type and shape): a tied model's save
 * that kept the head's copy.  Read in 16 MiB pieces. */
static gp_status same_as_embedding(const hf_ctx *c, int i, const gp_st_tensor *t, bool *same)
{
    *same = false;
    hf_src e;
    if (!find_src(c, "model.embed_tokens.weight", &e)) return GP_OK;
    const gp_st_tensor *et = e.t;
    if (strcmp(t->dtype_name, et->dtype_name) || t->ndim != et->ndim ||
        t->end - t->begin != et->end - et->begin)
        return GP_OK;
    for (int d = 0; d < t->ndim; d++)
        if (t->dims[d] != et->dims[d]) return GP_OK;
    const size_t piece = (size_t)16 << 20;
    uint8_t *a = malloc(piece), *b = malloc(piece);
    gp_status s = a && b ? GP_OK : gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'",
                                                c->dir);
    bool eq = true;
    for (uint64_t off = 0; s == GP_OK && eq && off < t->end - t->begin; off += piece) {
        size_t n = (size_t)(t->end - t->begin - off < piece ? t->end - t->begin - off : piece);
        s = gp_st_pread(c->sh[i].fd, c->sh[i].path, c->sh[i].base + t->begin + off, a, n);
        if (s == GP_OK)
            s = gp_st_pread(c->sh[e.shard].fd, c->sh[e.shard].path,
                            c->sh[e.shard].base + et->begin + off, b, n);
        if (s == GP_OK) eq = !memcmp(a, b, n);
    }
    free(a);
    free(b);
    if (s == GP_OK) *same = eq;
    return s;
}

/* ---- config.json against the model ------------------------------------------ */

static const gp_layer *first_of(const gp_wmodel *m, gp_layer_type t)
{
    for (int k = 0; k < m->n_layers; k++)
        if (m->layers[k].spec.type == t) return &m->layers[k];
    return NULL;
}

/* The model's blocks (its attention layers), and whether its lm_head ties
 * its weight to the embedding's: config.json's num_hidden_layers and
 * tie_word_embeddings, read and written. */
static int llama_blocks(const gp_wmodel *m)
{
    int n = 0;
    for (int k = 0; k < m->n_layers; k++) n += m->layers[k].spec.type == GP_LAYER_ATTENTION;
    return n;
}

static bool llama_tied(const gp_wmodel *m)
{
    for (int k = 0; k < m->n_layers; k++)
        if (!strcmp(m->layers[k].spec.name, "lm_head")) return m->layers[k].spec.tie[0] != '\0';
    return false;
}

/* config.json against the model: its differences, in msg. */
typedef struct cfg_cmp {
    const gp_hf_config *hc;
    const gp_hf_llama_defaults *def; /* its model type's, for the keys it leaves out */
    char msg[1500];
} cfg_cmp;

enum {
    CMP_BOOL = 1,       /* true or false (else a number) */
    CMP_NULL_DEF = 2,   /* null reads as absent (num_key_value_heads) */
    CMP_LLAMA3_DEF = 4, /* the default is Llama 3's (rope_scaling's keys), not the config
                           class's */
};

static void cmp_note(cfg_cmp *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cmp_note(cfg_cmp *c, const char *fmt, ...)
{
    size_t at = strlen(c->msg);
    if (at + 3 >= sizeof c->msg) return;
    if (at) at += (size_t)snprintf(c->msg + at, sizeof c->msg - at, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + at, sizeof c->msg - at, fmt, ap);
    va_end(ap);
}

static const char *cmp_value(char *buf, size_t len, int flags, double v)
{
    if (flags & CMP_BOOL) snprintf(buf, len, "%s", v != 0 ? "true" : "false");
    else snprintf(buf, len, "%.10g", v);
    return buf;
}

/* config.json's `key` in obj (the file's object where NULL), shown as
 * `label`, against the model's value, set by model.llama key `ours`: a
 * difference noted, with the file's value or, where the file leaves the
 * key out, the one transformers takes then (def: the config parser's
 * default, the model type's, c->def); a value of the wrong type is an error naming
 * the file, its line and column and the type (issue: a missing or wrong
 * value read as -1, "vocab_size -1"). */
static gp_status cmp_key(cfg_cmp *c, const gp_json_value *obj, const char *key, const char *label,
                         int flags, double def, double model, const char *ours)
{
    const gp_json_value *v = gp_json_get(obj ? obj : c->hc->json, key);
    bool absent = !v || ((flags & CMP_NULL_DEF) && v->kind == GP_JSON_NULL);
    double file = def;
    if (!absent && (flags & CMP_BOOL)) {
        bool b;
        GP_TRY(gp_hf_config_bool(c->hc, obj, key, def != 0, &b));
        file = b;
    } else if (!absent) {
        GP_TRY(gp_hf_config_num(c->hc, obj, key, def, -INFINITY, INFINITY, false, &file));
    }
    if (fabs(file - model) <= 1e-6 * fmax(fabs(file), fabs(model))) return GP_OK;
    char fv[32], mv[32];
    cmp_value(fv, sizeof fv, flags, file);
    cmp_value(mv, sizeof mv, flags, model);
    if (!absent) cmp_note(c, "%s %s (this model: %s %s)", label, fv, ours, mv);
    else if (flags & CMP_LLAMA3_DEF)
        cmp_note(c, "%s absent (taken as Llama 3's %s; this model: %s %s)", label, fv, ours, mv);
    else
        cmp_note(c, "%s absent (transformers uses %s's %s; this model: %s %s)", label,
                 c->def->config_class, fv, ours, mv);
    return GP_OK;
}

/* The sizes: embedding, blocks, attention, MLP, norm. */
static gp_status cmp_sizes(cfg_cmp *c, const gp_wmodel *m)
{
    const gp_layer *emb = first_of(m, GP_LAYER_EMBEDDING), *att = first_of(m, GP_LAYER_ATTENTION);
    const gp_layer *rms = first_of(m, GP_LAYER_RMS_NORM), *sw = first_of(m, GP_LAYER_SWIGLU);
    const gp_hf_llama_defaults *d = c->def;
    if (emb) {
        GP_TRY(cmp_key(c, NULL, "hidden_size", "hidden_size", 0, (double)d->width,
                       (double)emb->spec.dim, "model.llama.width"));
        GP_TRY(cmp_key(c, NULL, "vocab_size", "vocab_size", 0, (double)d->vocab,
                       (double)emb->spec.vocab, "model.llama.vocab"));
    }
    GP_TRY(cmp_key(c, NULL, "num_hidden_layers", "num_hidden_layers", 0, (double)d->layers,
                   llama_blocks(m), "model.llama.layers"));
    if (att) {
        double h = (double)d->heads;
        GP_TRY(gp_hf_config_num(c->hc, NULL, "num_attention_heads", h, -INFINITY, INFINITY,
                                false, &h));
        GP_TRY(cmp_key(c, NULL, "num_attention_heads", "num_attention_heads", 0,
                       (double)d->heads, (double)att->spec.heads, "model.llama.heads"));
        /* null: as many as the heads, for every type; absent: the type's
         * default (MistralConfig's 8, Qwen2Config's 32; LlamaConfig's the heads) */
        const gp_json_value *kv = gp_json_get(c->hc->json, "num_key_value_heads");
        double kv_def = !kv && d->kv_heads ? (double)d->kv_heads : h;
        GP_TRY(cmp_key(c, NULL, "num_key_value_heads", "num_key_value_heads", CMP_NULL_DEF,
                       kv_def, (double)(att->spec.kv_heads ? att->spec.kv_heads : att->spec.heads),
                       "model.llama.kv_heads"));
    }
    if (sw && sw->out_shape.ndim > 0)
        GP_TRY(cmp_key(c, NULL, "intermediate_size", "intermediate_size", 0,
                       (double)d->intermediate, (double)sw->out_shape.dims[sw->out_shape.ndim - 1],
                       "model.llama.intermediate"));
    if (rms)
        GP_TRY(cmp_key(c, NULL, "rms_norm_eps", "rms_norm_eps", 0, d->rms_eps,
                       (double)rms->spec.eps, "model.llama.rms_eps"));
    return GP_OK;
}

/* rope_theta and rope_scaling (transformers 5: rope_parameters). */
static gp_status cmp_rope(cfg_cmp *c, const gp_layer *rope)
{
    const gp_json_value *cfg = c->hc->json;
    const gp_json_value *rs = gp_json_get(cfg, "rope_scaling");
    const gp_json_value *rp = gp_json_get(cfg, "rope_parameters"); /* transformers 5 */
    bool theta_rp = !gp_json_get(cfg, "rope_theta") && rp && rp->kind == GP_JSON_OBJECT &&
                    gp_json_get(rp, "rope_theta");
    GP_TRY(cmp_key(c, theta_rp ? rp : NULL, "rope_theta", "rope_theta", 0,
                   c->def->rope_theta, (double)rope->spec.rope_theta,
                   "model.llama.rope_theta"));
    const gp_json_value *sc = rs && rs->kind == GP_JSON_OBJECT   ? rs
                              : rp && rp->kind == GP_JSON_OBJECT ? rp
                                                                 : NULL;
    const gp_json_value *ty = sc ? gp_json_get(sc, "rope_type") : NULL;
    if (!ty && sc) ty = gp_json_get(sc, "type");
    bool l3 = ty && ty->kind == GP_JSON_STRING && !strcmp(ty->str, "llama3");
    bool other = ty && ty->kind == GP_JSON_STRING && !l3 && strcmp(ty->str, "default");
    if (other) cmp_note(c, "rope_scaling of rope_type '%s' (gpipe has llama3's)", ty->str);
    if (l3 != rope->spec.rope_llama3)
        cmp_note(c, "rope_scaling (llama3) %s (this model: model.llama.rope_scaling %s)",
                 l3 ? "given" : "not given", rope->spec.rope_llama3 ? "given" : "not given");
    if (!l3 || !rope->spec.rope_llama3) return GP_OK;
    GP_TRY(cmp_key(c, sc, "factor", "rope_scaling.factor", CMP_LLAMA3_DEF, 8,
                   rope->spec.rope_factor, "model.llama.rope_scaling.factor"));
    GP_TRY(cmp_key(c, sc, "low_freq_factor", "rope_scaling.low_freq_factor", CMP_LLAMA3_DEF, 1,
                   rope->spec.rope_low_freq, "model.llama.rope_scaling.low_freq_factor"));
    GP_TRY(cmp_key(c, sc, "high_freq_factor", "rope_scaling.high_freq_factor", CMP_LLAMA3_DEF,
                   4, rope->spec.rope_high_freq, "model.llama.rope_scaling.high_freq_factor"));
    return cmp_key(c, sc, "original_max_position_embeddings",
                   "rope_scaling.original_max_position_embeddings", CMP_LLAMA3_DEF, 8192,
                   (double)rope->spec.rope_orig_positions,
                   "model.llama.rope_scaling.original_positions");
}

/* dir's config.json against the model: every size that differs named,
 * with the model.llama key that sets it. */
static gp_status check_config(const gp_wmodel *m, const char *dir)
{
    gp_hf_config hc; /* the one reader of config.json (core/hf_config.h) */
    gp_status st = gp_hf_config_read(dir, &hc);
    if (st != GP_OK || !hc.json) { /* (none: the tensors' shapes are checked as they load) */
        gp_hf_config_free(&hc);
        return st;
    }
    cfg_cmp c = {.hc = &hc, .def = gp_hf_llama_defaults_of(&hc)};
    const gp_layer *rope = first_of(m, GP_LAYER_ROPE), *emb = first_of(m, GP_LAYER_EMBEDDING);
    /* the architecture first: a Gemma's sizes would be named, not Gemma */
    st = gp_hf_llama_supported(&hc, emb ? emb->in_shape.dims[1] : 0);
    if (st == GP_OK) st = cmp_sizes(&c, m);
    if (st == GP_OK && rope) st = cmp_rope(&c, rope);
    if (st == GP_OK)
        st = cmp_key(&c, NULL, "tie_word_embeddings", "tie_word_embeddings", CMP_BOOL,
                     c.def->tie, llama_tied(m), "model.llama.tie");
    if (st == GP_OK && c.msg[0])
        st = gp_error_set(GP_ERR_INVALID, "%s does not describe this model: %s; set the "
                          "model.llama keys named to the folder's values", hc.path, c.msg);
    gp_hf_config_free(&hc);
    return st;
}

/* ---- the names --------------------------------------------------------------- */

/* Whether `s` ends with `tail`; then *base = s without it. */
static bool ends(const char *s, const char *tail, char *base, size_t len)
{
    size_t n = strlen(s), t = strlen(tail);
    if (n < t || strcmp(s + n - t, tail)) return false;
    snprintf(base, len, "%.*s", (int)(n - t), s);
    return true;
}

/* The HF tensors gpipe's layer `ln` parameter `pn` is made of (1 to 3). */
static int hf_names(const char *ln, const char *pn, char names[HF_MAX_SRC][320])
{
    char base[256];
    if (!strcmp(ln, "model.embed_tokens") && !strcmp(pn, "wte.weight")) {
        snprintf(names[0], 320, "model.embed_tokens.weight");
        return 1;
    }
    if (ends(ln, "qkv_proj", base, sizeof base)) {
        snprintf(names[0], 320, "%sq_proj.%s", base, pn);
        snprintf(names[1], 320, "%sk_proj.%s", base, pn);
        snprintf(names[2], 320, "%sv_proj.%s", base, pn);
        return 3;
    }
    if (ends(ln, "gate_up_proj", base, sizeof base)) {
        snprintf(names[0], 320, "%sgate_proj.%s", base, pn);
        snprintf(names[1], 320, "%sup_proj.%s", base, pn);
        return 2;
    }
    snprintf(names[0], 320, "%s.%s", ln, pn);
    return 1;
}

bool gp_llama_is_hf(const char *path)
{
    if (is_dir(path)) return true;
    gp_st_file h;
    if (gp_st_read_header(path, &h) != GP_OK) {
        gp_error_clear();
        return false;
    }
    bool yes = gp_st_find(&h, "model.embed_tokens.weight") != NULL &&
               gp_st_find(&h, "model.layers.0.self_attn.q_proj.weight") != NULL;
    gp_st_free(&h);
    return yes;
}

gp_status gp_llama_read(const gp_wmodel *m, const char *path, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    hf_ctx *c = calloc(1, sizeof *c);
    if (!c) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    snprintf(out->source, sizeof out->source, "%s", path);
    out->fetch = fetch;
    out->fetch_ctx = c;
    out->fetch_free = ctx_free;
    out->where = where;
    gp_status s = is_dir(path) ? check_config(m, path) : GP_OK;
    if (s == GP_OK) s = open_shards(c, path);
    /* a tensor in two shards is said as such, naming both (issue 77: it read
     * as one the model has no place for, naming one shard or the other) */
    for (int i = 0; s == GP_OK && i < c->n_sh; i++)
        for (int j = i + 1; s == GP_OK && j < c->n_sh; j++)
            for (int t = 0; s == GP_OK && t < c->sh[j].hdr.n; t++) {
                const char *nm = c->sh[j].hdr.tensors[t].name;
                if (gp_st_find(&c->sh[i].hdr, nm))
                    s = gp_error_set(GP_ERR_DATA, "%s: tensor '%s' is in two shards, %s and %s; "
                                     "a folder holds each tensor once (the index names its "
                                     "shard): the folder is damaged or mixes two exports",
                                     path, nm, c->sh[i].path, c->sh[j].path);
            }
    bool *used = NULL;
    int n_file = 0;
    for (int i = 0; s == GP_OK && i < c->n_sh; i++) n_file += c->sh[i].hdr.n;
    if (s == GP_OK && !(used = calloc((size_t)(n_file ? n_file : 1), sizeof *used)))
        s = gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    bool named = false;
    for (int k = 0; s == GP_OK && k < m->n_layers; k++) {
        const gp_layer *l = &m->layers[k];
        for (int p = 0; s == GP_OK && p < l->n_params; p++) {
            if (l->params[p].tied) continue; /* the owner's tensor */
            char names[HF_MAX_SRC][320], ours[300];
            snprintf(ours, sizeof ours, "%s.%s", l->spec.name, l->params[p].name);
            if (!gp_weights_has(m, ours, NULL, NULL)) continue;
            named = true;
            int n = hf_names(l->spec.name, l->params[p].name, names);
            hf_src src[HF_MAX_SRC] = {{0, NULL}};
            for (int q = 0; s == GP_OK && q < n; q++) {
                bool got = find_src(c, names[q], &src[q]);
                /* a tied save has no lm_head.weight: the untied model's
                 * head starts as the embedding */
                if (!got && !strcmp(names[q], "lm_head.weight"))
                    got = find_src(c, "model.embed_tokens.weight", &src[q]);
                if (!got)
                    s = gp_error_set(GP_ERR_DATA, "%s has no tensor '%s', which this model's "
                                     "%s takes; the folder is of another model (its layers "
                                     "or biases differ)", path, names[q], ours);
            }
            /* the rows each part takes: q heads d, k and v kv_heads d (the
             * model's attention layer); gate and up half each */
            int64_t want[HF_MAX_SRC] = {-1, -1, -1}, dims[8] = {0};
            int nd = 0;
            if (n > 1 && gp_weights_has(m, ours, &nd, dims) && nd >= 1) {
                const gp_layer *att = first_of(m, GP_LAYER_ATTENTION);
                int64_t h = att ? att->spec.heads : 0;
                int64_t kv = att ? (att->spec.kv_heads ? att->spec.kv_heads : h) : 0;
                if (n == 3 && h > 0 && dims[0] % (h + 2 * kv) == 0) {
                    int64_t d = dims[0] / (h + 2 * kv);
                    want[0] = h * d, want[1] = kv * d, want[2] = kv * d;
                } else if (n == 2 && dims[0] % 2 == 0) {
                    want[0] = want[1] = dims[0] / 2;
                }
            }
            if (s == GP_OK) s = add_out(c, out, ours, src, n, want);
            for (int q = 0; s == GP_OK && q < n; q++) {
                int at = 0;
                for (int i = 0; i < src[q].shard; i++) at += c->sh[i].hdr.n;
                used[at + (int)(src[q].t - c->sh[src[q].shard].hdr.tensors)] = true;
            }
        }
    }
    if (s == GP_OK && !named)
        s = gp_error_set(GP_ERR_INVALID, "%s is a Hugging Face Llama folder, but this model's "
                         "layers are not named as Llama's modules: give the model as "
                         "model.llama (docs/config.md)", path);
    /* what the folder holds beyond the model: another model's tensors */
    for (int i = 0, at = 0; s == GP_OK && i < c->n_sh; i++)
        for (int j = 0; s == GP_OK && j < c->sh[i].hdr.n; j++, at++) {
            const char *nm = c->sh[i].hdr.tensors[j].name;
            char b[256];
            if (used[at] || ends(nm, "rotary_emb.inv_freq", b, sizeof b)) continue;
            /* a tied model's save may hold the head as the embedding's copy;
             * a head of its own is an untied model's, which transformers
             * keeps: dropping it would train another model */
            if (!strcmp(nm, "lm_head.weight") &&
                !gp_weights_has(m, "lm_head.weight", NULL, NULL)) {
                bool same = false;
                s = same_as_embedding(c, i, &c->sh[i].hdr.tensors[j], &same);
                if (s == GP_OK && !same)
                    s = gp_error_set(GP_ERR_DATA, "%s holds an lm_head.weight of its own, not "
                                     "model.embed_tokens.weight's copy, but this model ties its "
                                     "head to the embedding: the folder's model is untied "
                                     "(transformers keeps that head); set model.llama.tie: false",
                                     c->sh[i].path);
                continue;
            }
            s = gp_error_set(GP_ERR_DATA, "%s holds '%s', which this model has no place for; "
                             "the folder is of another model (set model.llama to its "
                             "config.json's sizes)", c->sh[i].path, nm);
        }
    free(used);
    if (s != GP_OK) gp_st_free(out);
    return s;
}

/* ---- export: a folder LlamaForCausalLM.from_pretrained loads ---------------- */

/* One tensor of the export: rows [r0, r0 + rows) of the model's parameter
 * (layer k, parameter p), as HF's `name`. */
typedef struct hf_part {
    char name[320];
    int k, p;
    int64_t r0, rows, cols;
    int shard;
    uint64_t begin, end; /* in its shard's data section */
} hf_part;

bool gp_llama_is_model(const gp_wmodel *m)
{
    return gp_weights_has(m, "model.embed_tokens.wte.weight", NULL, NULL);
}

/* The export's tensors in the model's order, q, k, v and gate, up split. */
static gp_status export_parts(const gp_wmodel *m, hf_part **out, int *n_out)
{
    const gp_layer *att = first_of(m, GP_LAYER_ATTENTION);
    int64_t H = att ? att->spec.heads : 1, G = att && att->spec.kv_heads ? att->spec.kv_heads : H;
    int cap = 16, n = 0;
    hf_part *v = malloc((size_t)cap * sizeof *v);
    if (!v) return gp_error_set(GP_ERR_OOM, "out of host memory exporting");
    for (int k = 0; k < m->n_layers; k++) {
        const gp_layer *l = &m->layers[k];
        for (int p = 0; p < l->n_params; p++) {
            if (l->params[p].tied) continue;
            const gp_tensor *t = &l->params[p].value;
            char names[HF_MAX_SRC][320];
            int ns = hf_names(l->spec.name, l->params[p].name, names);
            int64_t rows = t->dims[0], cols = t->ndim > 1 ? t->dims[1] : 1, split[HF_MAX_SRC];
            if (ns == 3) { /* q, k, v: H d, G d, G d rows */
                int64_t d = rows / (H + 2 * G);
                split[0] = H * d, split[1] = split[2] = G * d;
            } else if (ns == 2) {
                split[0] = split[1] = rows / 2;
            } else {
                split[0] = rows;
            }
            for (int q = 0, r0 = 0; q < ns; r0 += (int)split[q], q++) {
                if (n == cap) {
                    hf_part *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                    if (!nv) {
                        free(v);
                        return gp_error_set(GP_ERR_OOM, "out of host memory exporting");
                    }
                    v = nv;
                }
                v[n] = (hf_part){.k = k, .p = p, .r0 = r0, .rows = split[q], .cols = cols};
                memcpy(v[n].name, names[q], sizeof v[n].name);
                v[n].name[sizeof v[n].name - 1] = '\0';
                if (t->ndim == 1) v[n].cols = 0; /* a 1-D tensor: (rows) */
                n++;
            }
        }
    }
    *out = v;
    *n_out = n;
    return GP_OK;
}

static void shard_name(char *buf, size_t len, int i, int n)
{
    if (n == 1) snprintf(buf, len, "model.safetensors");
    else snprintf(buf, len, "model-%05d-of-%05d.safetensors", i + 1, n);
}

/* One shard: the safetensors header of its parts, then their FP32 bytes,
 * each parameter downloaded from its device as it is written. */
static gp_status write_shard(const gp_wmodel *m, const char *dir, const hf_part *v, int n,
                             int shard, int n_shards, bool bf16)
{
    char fn[64], path[1100];
    shard_name(fn, sizeof fn, shard, n_shards);
    snprintf(path, sizeof path, "%s/" GP_HF_STAGE "%s", dir, fn);
    gp_json_writer w = {0};
    gp_json_open_object(&w, NULL);
    gp_json_open_object(&w, "__metadata__");
    gp_json_put_str(&w, "format", "pt");
    gp_json_close(&w);
    for (int i = 0; i < n; i++) {
        if (v[i].shard != shard) continue;
        gp_json_open_object(&w, v[i].name);
        gp_json_put_str(&w, "dtype", bf16 ? "BF16" : "F32");
        gp_json_open_array(&w, "shape");
        gp_json_put_int(&w, NULL, v[i].rows);
        if (v[i].cols) gp_json_put_int(&w, NULL, v[i].cols);
        gp_json_close(&w);
        gp_json_open_array(&w, "data_offsets");
        gp_json_put_uint(&w, NULL, v[i].begin);
        gp_json_put_uint(&w, NULL, v[i].end);
        gp_json_close(&w);
        gp_json_close(&w);
    }
    gp_json_close(&w);
    while (!w.oom && w.len % 8) gp_json_put_raw(&w, " ");
    if (w.oom) {
        gp_json_writer_free(&w);
        return gp_error_set(GP_ERR_OOM, "out of host memory exporting to %s", path);
    }
    gp_atomic_file af;
    gp_status s = gp_atomic_open(path, &af);
    if (s != GP_OK) {
        gp_json_writer_free(&w);
        return s;
    }
    uint8_t lb[8];
    for (int b = 0; b < 8; b++) lb[b] = (uint8_t)((uint64_t)w.len >> (8 * b));
    /* a failed write keeps its errno (ENOSPC, EFBIG under ulimit -f), which
     * the commit's message names (issue 77: it read "Input/output error") */
    errno = 0;
    int err = fwrite(lb, 1, 8, af.f) == 8 && fwrite(w.text, 1, w.len, af.f) == w.len
                  ? 0
                  : (errno ? errno : EIO);
    gp_json_writer_free(&w);
    float *buf = NULL;
    int held_k = -1, held_p = -1;
    for (int i = 0; i < n && !err && s == GP_OK; i++) {
        if (v[i].shard != shard) continue;
        const gp_param *pr = &m->layers[v[i].k].params[v[i].p];
        if (v[i].k != held_k || v[i].p != held_p) { /* the whole parameter, once */
            int64_t all = gp_tensor_numel(&pr->value);
            free(buf);
            buf = malloc((size_t)(all ? all : 1) * sizeof *buf);
            if (!buf) {
                s = gp_error_set(GP_ERR_OOM, "out of host memory exporting to %s", path);
                break;
            }
            s = gp_dev_synchronize(pr->value.dev);
            if (s == GP_OK) s = gp_dev_download(pr->value.dev, buf, gp_f32(&pr->value), all);
            if (s == GP_OK) s = gp_dev_synchronize(pr->value.dev);
            held_k = v[i].k, held_p = v[i].p;
        }
        int64_t per = v[i].cols ? v[i].cols : 1;
        size_t cnt = (size_t)(v[i].rows * per);
        errno = 0;
        if (s == GP_OK && !bf16 && fwrite(buf + v[i].r0 * per, sizeof *buf, cnt, af.f) != cnt)
            err = errno ? errno : EIO;
        for (size_t e = 0; s == GP_OK && bf16 && !err && e < cnt; e += 4096) {
            uint16_t b16[4096]; /* rounded to nearest even as written */
            size_t c = cnt - e < 4096 ? cnt - e : 4096;
            for (size_t q = 0; q < c; q++) b16[q] = gp_ew_bf16_bits(buf[v[i].r0 * per + e + q]);
            errno = 0;
            if (fwrite(b16, sizeof *b16, c, af.f) != c) err = errno ? errno : EIO;
        }
    }
    free(buf);
    if (s != GP_OK) {
        gp_atomic_abort(&af);
        return s;
    }
    return gp_atomic_commit(&af, err);
}

/* config.json: what LlamaForCausalLM.from_pretrained needs to build this
 * model (every size, rope_theta and rope_scaling, eps, the tie). */
/* A value of a source file (its text: a number keeps its form, 1.0 a
 * float, 1 an integer) written as it was. */
static void put_value(gp_json_writer *w, const char *key, const gp_json_value *v,
                      const char *text)
{
    switch (v->kind) {
    case GP_JSON_OBJECT:
        gp_json_open_object(w, key);
        for (int i = 0; i < v->n; i++) put_value(w, v->keys[i], &v->items[i], text);
        gp_json_close(w);
        break;
    case GP_JSON_ARRAY:
        gp_json_open_array(w, key);
        for (int i = 0; i < v->n; i++) put_value(w, NULL, &v->items[i], text);
        gp_json_close(w);
        break;
    case GP_JSON_STRING: gp_json_put_str(w, key, v->str); break;
    case GP_JSON_NUMBER: {
        const char *t = text ? text + v->offset : "";
        size_t n = strspn(t, "+-0123456789.eE");
        bool real = memchr(t, '.', n) || memchr(t, 'e', n) || memchr(t, 'E', n);
        if (!real && v->num == floor(v->num) && fabs(v->num) < 9e15)
            gp_json_put_int(w, key, (int64_t)v->num);
        else if (real && v->num == floor(v->num) && fabs(v->num) < 1e15)
            gp_json_put_fixed(w, key, v->num, 1);
        else
            gp_json_put_num(w, key, v->num);
        break;
    }
    case GP_JSON_TRUE:
    case GP_JSON_FALSE: gp_json_put_bool(w, key, v->kind == GP_JSON_TRUE); break;
    default: gp_json_put_null(w, key); break;
    }
}

/* The keys write_config writes itself (what gpipe's model decides). */
static bool config_key_ours(const char *k)
{
    static const char *const ours[] = {
        "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
        "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
        "rope_parameters", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act",
        "initializer_range", "torch_dtype", "dtype"};
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
        if (!strcmp(k, ours[i])) return true;
    return false;
}

static gp_status write_config(const gp_wmodel *m, const char *dir, bool bf16,
                              const gp_hf_config *src)
{
    const gp_layer *emb = first_of(m, GP_LAYER_EMBEDDING), *att = first_of(m, GP_LAYER_ATTENTION);
    const gp_layer *rope = first_of(m, GP_LAYER_ROPE), *rms = first_of(m, GP_LAYER_RMS_NORM);
    const gp_layer *sw = first_of(m, GP_LAYER_SWIGLU);
    if (!emb || !att || !rope || !rms || !sw)
        return gp_error_set(GP_ERR_INVALID, "--export-format hf: this model is not a whole "
                            "Llama (model.llama): it lacks an embedding, attention, rope, "
                            "rms_norm or swiglu layer");
    int blocks = llama_blocks(m);
    bool tied = llama_tied(m);
    /* q, k and v biases (qkv_bias): Qwen2's layout, which only
     * Qwen2ForCausalLM loads (LlamaForCausalLM's attention_bias also puts
     * one on o_proj) */
    bool qwen2 = false;
    for (int k = 0; k < m->n_layers && !qwen2; k++) {
        char b[256];
        qwen2 = ends(m->layers[k].spec.name, "qkv_proj", b, sizeof b) && m->layers[k].spec.bias;
    }
    gp_json_writer w = {.pretty = 2};
    gp_json_open_object(&w, NULL);
    gp_json_open_array(&w, "architectures");
    gp_json_put_str(&w, NULL, qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    gp_json_close(&w);
    gp_json_put_str(&w, "model_type", qwen2 ? "qwen2" : "llama");
    gp_json_put_int(&w, "hidden_size", emb->spec.dim);
    gp_json_put_int(&w, "intermediate_size", sw->out_shape.dims[sw->out_shape.ndim - 1]);
    gp_json_put_int(&w, "num_hidden_layers", blocks);
    gp_json_put_int(&w, "num_attention_heads", att->spec.heads);
    gp_json_put_int(&w, "num_key_value_heads",
                    att->spec.kv_heads ? att->spec.kv_heads : att->spec.heads);
    gp_json_put_int(&w, "head_dim", emb->spec.dim / att->spec.heads);
    gp_json_put_int(&w, "vocab_size", emb->spec.vocab);
    gp_json_put_int(&w, "max_position_embeddings",
                    rope->spec.positions > 0 ? rope->spec.positions : 2048);
    gp_json_put_float(&w, "rms_norm_eps", (double)rms->spec.eps);
    gp_json_put_float(&w, "rope_theta", (double)rope->spec.rope_theta);
    if (rope->spec.rope_llama3) {
        gp_json_open_object(&w, "rope_scaling");
        gp_json_put_str(&w, "rope_type", "llama3");
        gp_json_put_float(&w, "factor", (double)rope->spec.rope_factor);
        gp_json_put_float(&w, "low_freq_factor", (double)rope->spec.rope_low_freq);
        gp_json_put_float(&w, "high_freq_factor", (double)rope->spec.rope_high_freq);
        gp_json_put_int(&w, "original_max_position_embeddings", rope->spec.rope_orig_positions);
        gp_json_close(&w);
    } else {
        gp_json_put_null(&w, "rope_scaling");
    }
    gp_json_put_bool(&w, "tie_word_embeddings", tied);
    if (!qwen2) { /* (Qwen2Config has neither: its q, k, v always have biases) */
        gp_json_put_bool(&w, "attention_bias", false);
        gp_json_put_bool(&w, "mlp_bias", false);
    }
    gp_json_put_str(&w, "hidden_act", "silu");
    gp_json_put_float(&w, "initializer_range", 0.02);
    gp_json_put_str(&w, "torch_dtype", bf16 ? "bfloat16" : "float32");
    /* what the source folder said that gpipe does not decide (bos and eos
     * token ids, which generate stops at; pad, the transformers version...)
     * goes through as it was (issue 77: bos 254 came back as 1) */
    bool use_cache = false;
    if (src && src->json)
        for (int i = 0; i < src->json->n; i++) {
            const char *k = src->json->keys[i];
            if (config_key_ours(k) || gp_json_get(src->json, k) != &src->json->items[i])
                continue; /* ours, or a key given twice: its last value only */
            put_value(&w, k, &src->json->items[i], src->text);
            use_cache |= !strcmp(k, "use_cache");
        }
    if (!use_cache) gp_json_put_bool(&w, "use_cache", true);
    gp_json_close(&w);
    char path[1100];
    snprintf(path, sizeof path, "%s/" GP_HF_STAGE "config.json", dir);
    return gp_weights_write_json(&w, path);
}

/* generation_config.json: the source folder's as it was, else one with the
 * token ids config.json names (GenerationConfig.from_model_config's), else
 * none.  *wrote says whether one was staged. */
static gp_status write_generation_config(const char *dir, const char *source,
                                         const gp_hf_config *src, bool *wrote)
{
    *wrote = false;
    char path[1100];
    snprintf(path, sizeof path, "%s/" GP_HF_STAGE "generation_config.json", dir);
    if (source) {
        char from[1100];
        snprintf(from, sizeof from, "%s/generation_config.json", source);
        gp_hf_config g;
        gp_status rs = gp_hf_json_read(from, &g); /* (the config reader's checks) */
        if (rs == GP_OK && g.json) {
            gp_json_writer w = {.pretty = 2};
            put_value(&w, NULL, g.json, g.text);
            gp_hf_config_free(&g);
            *wrote = true;
            return gp_weights_write_json(&w, path);
        }
        if (rs != GP_OK) {
            GP_WARN("%s; the export writes a generation_config.json of its own", gp_last_error());
            gp_error_clear();
        }
        gp_hf_config_free(&g);
    }
    const gp_json_value *bos = src && src->json ? gp_json_get(src->json, "bos_token_id") : NULL;
    const gp_json_value *eos = src && src->json ? gp_json_get(src->json, "eos_token_id") : NULL;
    if (!bos && !eos) return GP_OK;
    gp_json_writer w = {.pretty = 2};
    gp_json_open_object(&w, NULL);
    gp_json_put_bool(&w, "_from_model_config", true);
    if (bos) put_value(&w, "bos_token_id", bos, src->text);
    if (eos) put_value(&w, "eos_token_id", eos, src->text);
    gp_json_close(&w);
    *wrote = true;
    return gp_weights_write_json(&w, path);
}

gp_status gp_llama_export_check(const gp_wmodel *m)
{
    if (!gp_llama_is_model(m))
        return gp_error_set(GP_ERR_INVALID, "--export-format hf: this model is not a "
                            "model.llama (no model.embed_tokens)");
    if (m->procs)
        return gp_error_set(GP_ERR_UNSUPPORTED, "--export-format hf: a Llama's folder is written "
                            "by one process; convert the run's snapshot afterwards with "
                            "gpipe-train CONFIG --resume SNAPSHOT --convert --export-weights DIR "
                            "--export-format hf");
    return GP_OK; /* (q, k and v biases: a Qwen2ForCausalLM folder, write_config) */
}

/* Whether `name` is a temporary gp_atomic_open made for a staged file,
 * "." GP_HF_STAGE "<name>.tmp.<pid>", of a process that is gone (or of this
 * one, which holds none while it removes them).  Exports into one folder
 * are not locked against each other, so a running one's is left alone. */
static bool stale_stage_tmp(const char *name)
{
    if (name[0] != '.' || strncmp(name + 1, GP_HF_STAGE, strlen(GP_HF_STAGE))) return false;
    const char *t = strstr(name, ".tmp.");
    if (!t) return false;
    for (const char *n; (n = strstr(t + 1, ".tmp.")) != NULL;) t = n; /* (the last) */
    char *end;
    errno = 0;
    long pid = strtol(t + 5, &end, 10);
    if (*end || end == t + 5 || pid <= 0 || errno) return false;
    return pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

void gp_hf_remove_staged(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, GP_HF_STAGE, strlen(GP_HF_STAGE)) && !stale_stage_tmp(e->d_name))
            continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

gp_status gp_hf_folder_commit(const char *dir, const char *const *names, int k, gp_status s)
{
    for (int i = 0; i < k && s == GP_OK; i++) {
        char from[1200], to[1200];
        snprintf(from, sizeof from, "%.1000s/" GP_HF_STAGE "%.47s", dir, names[i]);
        snprintf(to, sizeof to, "%.1000s/%.47s", dir, names[i]);
        if (rename(from, to) != 0)
            s = gp_error_set(GP_ERR_IO, "cannot rename %s to %s: %s%s", from, to,
                             strerror(errno), i ? "; the files renamed before it are this "
                                                  "export's, the rest the earlier one's: "
                                                  "export again" : "");
    }
    if (s != GP_OK) {
        gp_hf_remove_staged(dir);
        return s;
    }
    /* what an earlier export left that this one does not have */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (!gp_hf_export_name(e->d_name)) continue;
        bool ours = false;
        for (int i = 0; i < k && !ours; i++) ours = !strcmp(e->d_name, names[i]);
        if (ours) continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0 && errno != ENOENT && s == GP_OK)
            s = gp_error_set(GP_ERR_IO, "cannot remove %s, an earlier export's file this one "
                             "does not have: %s", p, strerror(errno));
    }
    if (d) closedir(d);
    return s;
}

/*
 * The folder is written as a whole (issue 77): every file goes to a staged
 * name beside its own (GP_HF_STAGE + name, each written atomically), and only
 * when all are there are they renamed into place, the shards first and
 * config.json last; then the files of an earlier export that this one does
 * not have (model.safetensors after a sharded export, shards and an index
 * after a one-file one, shards of another count) are removed.  A failure
 * or a kill while writing (the long part) leaves the earlier export as it
 * was, and its staged files, and the temporary it was writing one through
 * (gp_atomic_open's ".<staged name>.tmp.PID"), are removed by the next
 * export (gp_hf_remove_staged).  (The renames
 * take milliseconds; one that fails after the first leaves the shards
 * renamed so far beside the earlier config.json, and says which.)
 */
gp_status gp_llama_export(const gp_wmodel *m, const char *dir, bool bf16, const char *source,
                          const char *source_config)
{
    GP_TRY(gp_llama_export_check(m));
    GP_TRY(gp_make_dirs(dir, "--export-weights (a Hugging Face folder)"));
    gp_hf_remove_staged(dir); /* a killed export's */
    hf_part *v = NULL;
    int n = 0;
    GP_TRY(export_parts(m, &v, &n));
    /* shards of at most GPIPE_HF_SHARD_BYTES (default 5 GB, save_pretrained's
     * max_shard_size), tensors in the model's order */
    uint64_t limit = 5000000000ull, at = 0, total = 0;
    int64_t env_limit;
    gp_status s = gp_env_bytes("GPIPE_HF_SHARD_BYTES", (int64_t)limit, 1, (int64_t)1 << 50,
                               &env_limit);
    if (s != GP_OK) {
        free(v);
        return s;
    }
    limit = (uint64_t)env_limit;
    int shard = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)(v[i].rows * (v[i].cols ? v[i].cols : 1)) * (bf16 ? 2 : 4);
        if (at > 0 && at + bytes > limit) shard++, at = 0;
        v[i].shard = shard;
        v[i].begin = at;
        v[i].end = at + bytes;
        at += bytes;
        total += bytes;
    }
    int n_shards = shard + 1;
    /* the source folder's config.json (model.init_from), whose keys gpipe
     * does not decide go through */
    gp_hf_config src = {0};
    struct stat st;
    bool from_dir = source && source[0] && stat(source, &st) == 0 && S_ISDIR(st.st_mode);
    gp_status rs = GP_OK;
    if (from_dir) {
        rs = gp_hf_config_read(source, &src);
    } else if (source_config) { /* the folder is gone: the copy its run kept */
        char name[1100];
        snprintf(name, sizeof name, "%s/config.json (as the run keeps it)", source);
        rs = gp_hf_config_parse(name, source_config, strlen(source_config), &src);
    }
    if (rs != GP_OK) {
        GP_WARN("the export's config.json takes nothing from %s: %s", source, gp_last_error());
        gp_error_clear();
        gp_hf_config_free(&src);
    }
    bool gen = false;
    for (int q = 0; q < n_shards && s == GP_OK; q++)
        s = write_shard(m, dir, v, n, q, n_shards, bf16);
    if (s == GP_OK && n_shards > 1) {
        gp_json_writer w = {.pretty = 1};
        gp_json_open_object(&w, NULL);
        gp_json_open_object(&w, "metadata");
        gp_json_put_uint(&w, "total_size", total);
        gp_json_close(&w);
        gp_json_open_object(&w, "weight_map");
        for (int i = 0; i < n; i++) {
            char fn[64];
            shard_name(fn, sizeof fn, v[i].shard, n_shards);
            gp_json_put_str(&w, v[i].name, fn);
        }
        gp_json_close(&w);
        gp_json_close(&w);
        char idx[1100];
        snprintf(idx, sizeof idx, "%s/" GP_HF_STAGE "model.safetensors.index.json", dir);
        s = gp_weights_write_json(&w, idx);
    }
    if (s == GP_OK) s = write_generation_config(dir, from_dir ? source : NULL, &src, &gen);
    if (s == GP_OK) s = write_config(m, dir, bf16, &src);
    gp_hf_config_free(&src);
    /* everything is written: into place, config.json last */
    typedef struct { char s[48]; } fname;
    fname *names = calloc((size_t)n_shards + 3, sizeof *names);
    const char **np = calloc((size_t)n_shards + 3, sizeof *np);
    int k = 0;
    if ((!names || !np) && s == GP_OK) s = gp_error_set(GP_ERR_OOM, "out of host memory exporting");
    if (names && np) {
        for (int q = 0; q < n_shards; q++) shard_name(names[k++].s, sizeof names[0].s, q, n_shards);
        if (n_shards > 1) snprintf(names[k++].s, sizeof names[0].s, "model.safetensors.index.json");
        if (gen) snprintf(names[k++].s, sizeof names[0].s, "generation_config.json");
        snprintf(names[k++].s, sizeof names[0].s, "config.json");
        for (int i = 0; i < k; i++) np[i] = names[i].s;
    }
    s = gp_hf_folder_commit(dir, np, k, s);
    free(np);
    free(names);
    free(v);
    return s;
}
