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
#include "core/json.h"
#include "train/snapshot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_MAX_SRC 3 /* q, k and v */

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

/* The whole of a small text file (config.json, the index), NUL-ended. */
static gp_status read_text(const char *path, char **text, size_t *len)
{
    FILE *f = gp_fopen_regular(path);
    if (!f)
        return gp_error_set(GP_ERR_IO, "cannot open '%s': %s", path,
                            gp_open_strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t got = fread(b + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        char *nb = realloc(b, cap * 2);
        if (!nb) free(b);
        b = nb;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!b) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    if (err) {
        free(b);
        return gp_error_set(GP_ERR_IO, "cannot read '%s'", path);
    }
    b[n] = '\0';
    *text = b;
    *len = n;
    return GP_OK;
}

static gp_status parse_json(const char *path, gp_json_value **v)
{
    char *text = NULL;
    size_t len = 0;
    GP_TRY(read_text(path, &text, &len));
    gp_json_reader r;
    *v = gp_json_parse(text, len, &r);
    gp_status s = GP_OK;
    if (!*v) {
        int line = 0, col = 0;
        gp_json_where(&r, r.err_at, &line, &col);
        s = gp_error_set(GP_ERR_DATA, "%s:%d:%d: %s", path, line, col, r.err);
    }
    free(text);
    return s;
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
    gp_json_value *idx;
    GP_TRY(parse_json(p, &idx));
    const gp_json_value *wm = gp_json_get(idx, "weight_map");
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
    gp_json_value_free(idx);
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

static float f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                       : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

static gp_status src_kind(const hf_ctx *c, const hf_src *s, int *esz)
{
    const gp_st_tensor *t = s->t;
    if (t->dtype == GP_ST_F32) *esz = 4;
    else if (!strcmp(t->dtype_name, "BF16") || !strcmp(t->dtype_name, "F16")) *esz = 2;
    else
        return gp_error_set(GP_ERR_DATA, "%s: tensor '%s' is %s; a Llama's weights are read as "
                            "F32, BF16 or F16", c->sh[s->shard].path, t->name, t->dtype_name);
    return GP_OK;
}

static gp_status read_at(const hf_shard *sh, uint64_t off, uint8_t *buf, size_t bytes)
{
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = pread(sh->fd, buf + got, bytes - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return gp_error_set(GP_ERR_IO, "cannot read %zu bytes at %llu of '%s': %s", bytes,
                                (unsigned long long)off, sh->path,
                                r < 0 ? strerror(errno) : "the file is shorter");
        got += (size_t)r;
    }
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
        int esz = 4;
        GP_TRY(src_kind(c, s, &esz));
        size_t bytes = (size_t)(s->t->end - s->t->begin), n = bytes / (size_t)esz;
        uint8_t *buf = malloc(bytes ? bytes : 1);
        if (!buf) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", sh->path);
        gp_status st = read_at(sh, sh->base + s->t->begin, buf, bytes);
        bool bf16 = !strcmp(s->t->dtype_name, "BF16");
        for (size_t k = 0; st == GP_OK && k < n; k++) {
            if (esz == 4) {
                memcpy(&out[k], buf + 4 * k, 4);
            } else {
                uint16_t h;
                memcpy(&h, buf + 2 * k, 2);
                if (bf16) {
                    uint32_t u = (uint32_t)h << 16;
                    memcpy(&out[k], &u, 4);
                } else {
                    out[k] = f16_value(h);
                }
            }
        }
        free(buf);
        GP_TRY(st);
        out += n;
    }
    return GP_OK;
}

/* One tensor of the converted file, `name`, from the sources stacked. */
static gp_status add_out(hf_ctx *c, gp_st_file *out, const char *name, const hf_src *src, int n)
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
        int esz;
        GP_TRY(src_kind(c, &src[q], &esz));
        const gp_st_tensor *b = src[q].t;
        bool same = b->ndim == a->ndim && b->ndim >= 1;
        for (int d = 1; same && d < a->ndim; d++) same = b->dims[d] == a->dims[d];
        if (!same)
            return gp_error_set(GP_ERR_DATA, "%s: tensors '%s' and '%s' do not stack into "
                                "gpipe's %s (their shapes differ past the first axis)", c->dir,
                                a->name, b->name, name);
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

/* ---- config.json against the model ------------------------------------------ */

static const gp_layer *first_of(const gp_model *m, gp_layer_type t)
{
    for (int k = 0; k < m->n_layers; k++)
        if (m->layers[k].spec.type == t) return &m->layers[k];
    return NULL;
}

/* Each difference appended to msg: "name = file (model.llama.key: model)". */
static void differ(char *msg, size_t len, const char *key, double file, double model,
                   const char *ours)
{
    bool same = fabs(file - model) <= 1e-6 * fmax(fabs(file), fabs(model));
    if (same) return;
    size_t at = strlen(msg);
    snprintf(msg + at, len - at, "%s%s %.10g (this model: %s %.10g)", at ? "; " : "", key, file,
             ours, model);
}

static double num_of(const gp_json_value *cfg, const char *key, double def)
{
    const gp_json_value *v = gp_json_get(cfg, key);
    if (v && v->kind == GP_JSON_NUMBER) return v->num;
    if (v && (v->kind == GP_JSON_TRUE || v->kind == GP_JSON_FALSE)) return v->kind == GP_JSON_TRUE;
    return def;
}

static gp_status check_config(const gp_model *m, const char *dir)
{
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (!exists(p)) return GP_OK; /* the tensors' shapes are checked as they load */
    gp_json_value *cfg;
    GP_TRY(parse_json(p, &cfg));
    const gp_layer *emb = first_of(m, GP_LAYER_EMBEDDING), *att = first_of(m, GP_LAYER_ATTENTION);
    const gp_layer *rope = first_of(m, GP_LAYER_ROPE), *rms = first_of(m, GP_LAYER_RMS_NORM);
    const gp_layer *sw = first_of(m, GP_LAYER_SWIGLU);
    int blocks = 0;
    for (int k = 0; k < m->n_layers; k++) blocks += m->layers[k].spec.type == GP_LAYER_ATTENTION;
    bool tied = false;
    for (int k = 0; k < m->n_layers; k++) tied |= !strcmp(m->layers[k].spec.name, "lm_head") &&
                                                  m->layers[k].spec.tie[0];
    char msg[1500] = "";
    if (emb) {
        differ(msg, sizeof msg, "hidden_size", num_of(cfg, "hidden_size", -1),
               (double)emb->spec.dim, "model.llama.width");
        differ(msg, sizeof msg, "vocab_size", num_of(cfg, "vocab_size", -1),
               (double)emb->spec.vocab, "model.llama.vocab");
    }
    differ(msg, sizeof msg, "num_hidden_layers", num_of(cfg, "num_hidden_layers", -1), blocks,
           "model.llama.layers");
    if (att) {
        double h = num_of(cfg, "num_attention_heads", -1);
        differ(msg, sizeof msg, "num_attention_heads", h, (double)att->spec.heads,
               "model.llama.heads");
        differ(msg, sizeof msg, "num_key_value_heads", num_of(cfg, "num_key_value_heads", h),
               (double)(att->spec.kv_heads ? att->spec.kv_heads : att->spec.heads),
               "model.llama.kv_heads");
    }
    if (sw && sw->out_shape.ndim > 0)
        differ(msg, sizeof msg, "intermediate_size", num_of(cfg, "intermediate_size", -1),
               (double)sw->out_shape.dims[sw->out_shape.ndim - 1], "model.llama.intermediate");
    if (rms)
        differ(msg, sizeof msg, "rms_norm_eps", num_of(cfg, "rms_norm_eps", 1e-6),
               (double)rms->spec.eps, "model.llama.rms_eps");
    const gp_json_value *rs = gp_json_get(cfg, "rope_scaling");
    const gp_json_value *rp = gp_json_get(cfg, "rope_parameters"); /* transformers 5 */
    double theta = num_of(cfg, "rope_theta", rp ? num_of(rp, "rope_theta", 10000) : 10000);
    if (rope) {
        differ(msg, sizeof msg, "rope_theta", theta, (double)rope->spec.rope_theta,
               "model.llama.rope_theta");
        const gp_json_value *sc = rs && rs->kind == GP_JSON_OBJECT ? rs
                                  : rp && rp->kind == GP_JSON_OBJECT ? rp
                                                                       : NULL;
        const gp_json_value *ty = sc ? gp_json_get(sc, "rope_type") : NULL;
        if (!ty && sc) ty = gp_json_get(sc, "type");
        bool l3 = ty && ty->kind == GP_JSON_STRING && !strcmp(ty->str, "llama3");
        bool other = ty && ty->kind == GP_JSON_STRING && !l3 && strcmp(ty->str, "default");
        if (other) {
            size_t at = strlen(msg);
            snprintf(msg + at, sizeof msg - at, "%srope_scaling of rope_type '%s' (gpipe has "
                     "llama3's)", at ? "; " : "", ty->str);
        }
        differ(msg, sizeof msg, "rope_scaling (llama3)", l3, rope->spec.rope_llama3,
               "model.llama.rope_scaling given");
        if (l3 && rope->spec.rope_llama3) {
            differ(msg, sizeof msg, "rope_scaling.factor", num_of(sc, "factor", 8),
                   rope->spec.rope_factor, "model.llama.rope_scaling.factor");
            differ(msg, sizeof msg, "rope_scaling.low_freq_factor",
                   num_of(sc, "low_freq_factor", 1), rope->spec.rope_low_freq,
                   "model.llama.rope_scaling.low_freq_factor");
            differ(msg, sizeof msg, "rope_scaling.high_freq_factor",
                   num_of(sc, "high_freq_factor", 4), rope->spec.rope_high_freq,
                   "model.llama.rope_scaling.high_freq_factor");
            differ(msg, sizeof msg, "rope_scaling.original_max_position_embeddings",
                   num_of(sc, "original_max_position_embeddings", 8192),
                   (double)rope->spec.rope_orig_positions,
                   "model.llama.rope_scaling.original_positions");
        }
    }
    differ(msg, sizeof msg, "tie_word_embeddings", num_of(cfg, "tie_word_embeddings", 1), tied,
           "model.llama.tie");
    gp_json_value_free(cfg);
    if (!msg[0]) return GP_OK;
    return gp_error_set(GP_ERR_INVALID, "%s does not describe this model: %s; set the model.llama "
                        "keys named to the folder's values", p, msg);
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

gp_status gp_llama_read(const gp_model *m, const char *path, gp_st_file *out)
{
    memset(out, 0, sizeof *out);
    hf_ctx *c = calloc(1, sizeof *c);
    if (!c) return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", path);
    snprintf(out->source, sizeof out->source, "%s", path);
    out->fetch = fetch;
    out->fetch_ctx = c;
    out->fetch_free = ctx_free;
    gp_status s = is_dir(path) ? check_config(m, path) : GP_OK;
    if (s == GP_OK) s = open_shards(c, path);
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
            if (!gp_snapshot_model_has(m, ours, NULL, NULL)) continue;
            named = true;
            int n = hf_names(l->spec.name, l->params[p].name, names);
            hf_src src[HF_MAX_SRC];
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
            if (s == GP_OK) s = add_out(c, out, ours, src, n);
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
            /* a tied model's save may hold the head as the embedding's copy */
            if (!strcmp(nm, "lm_head.weight") &&
                !gp_snapshot_model_has(m, "lm_head.weight", NULL, NULL))
                continue;
            s = gp_error_set(GP_ERR_DATA, "%s holds '%s', which this model has no place for; "
                             "the folder is of another model (set model.llama to its "
                             "config.json's sizes)", c->sh[i].path, nm);
        }
    free(used);
    if (s != GP_OK) gp_st_free(out);
    return s;
}
