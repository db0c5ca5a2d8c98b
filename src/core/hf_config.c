/*
 * hf_config.c — a Hugging Face folder's config.json, read and checked in
 * one place (hf_config.h).
 */
#include "core/hf_config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gp_hf_config_free(gp_hf_config *c)
{
    gp_json_value_free(c->json);
    free(c->text);
    c->json = NULL;
    c->text = NULL;
    c->len = 0;
}

/* Why a text that does not parse may not be JSON at all. */
static const char *encoding_hint(const unsigned char *t, size_t n)
{
    if (n >= 3 && t[0] == 0xEF && t[1] == 0xBB && t[2] == 0xBF)
        return " (the file starts with a UTF-8 byte-order mark, which JSON does not allow: save "
               "it without one)";
    if (n >= 2 && ((t[0] == 0xFF && t[1] == 0xFE) || (t[0] == 0xFE && t[1] == 0xFF)))
        return " (the file is UTF-16; JSON files are UTF-8: save it as UTF-8)";
    if (n >= 2 && (t[0] == 0 || t[1] == 0)) return " (the file holds NUL bytes: not a text file)";
    return "";
}

static gp_status parse_text(gp_hf_config *c);

gp_status gp_hf_config_read(const char *dir, gp_hf_config *c)
{
    char path[sizeof c->path];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return gp_hf_json_read(path, c);
}

gp_status gp_hf_json_read(const char *path, gp_hf_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", path);
    int r = gp_read_regular(c->path, GP_HF_CONFIG_MAX, &c->text, &c->len);
    if (r < 0 && errno == ENOENT) return GP_OK;
    if (r > 0)
        return gp_error_set(GP_ERR_DATA, "'%s' is more than %zu MiB, more than any Hugging Face "
                            "config.json: is it the right file?", c->path,
                            GP_HF_CONFIG_MAX >> 20);
    if (r < 0 && errno == ENOMEM)
        return gp_error_set(GP_ERR_OOM, "out of host memory reading '%s'", c->path);
    if (r < 0)
        return gp_error_set(GP_ERR_IO, "cannot read '%s': %s", c->path, gp_open_strerror(errno));
    return parse_text(c);
}

gp_status gp_hf_config_parse(const char *name, const char *text, size_t len, gp_hf_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", name);
    if (len > GP_HF_CONFIG_MAX)
        return gp_error_set(GP_ERR_DATA, "%s is %zu bytes, more than any Hugging Face "
                            "config.json", c->path, len);
    c->text = malloc(len + 1);
    if (!c->text) return gp_error_set(GP_ERR_OOM, "out of host memory reading %s", c->path);
    memcpy(c->text, text, len);
    c->text[len] = '\0';
    c->len = len;
    return parse_text(c);
}

/* c->text as one JSON object. */
static gp_status parse_text(gp_hf_config *c)
{
    size_t n = c->len;
    gp_json_reader r;
    c->json = gp_json_parse(c->text, n, &r);
    if (!c->json) {
        int line = 0, col = 0;
        gp_json_where(&r, r.err_at, &line, &col);
        return gp_error_set(GP_ERR_DATA, "%s:%d:%d: not valid JSON: %s%s", c->path, line, col,
                            r.err, encoding_hint((const unsigned char *)c->text, n));
    }
    if (c->json->kind != GP_JSON_OBJECT)
        return gp_error_set(GP_ERR_DATA, "'%s' is not a JSON object ({\"key\": value, ...}), as "
                            "a Hugging Face folder's JSON files are", c->path);
    return GP_OK;
}

/* "path:line:column: key" of v, into buf. */
static const char *where(const gp_hf_config *c, const gp_json_value *v, const char *key,
                         char *buf, size_t len)
{
    gp_json_reader r;
    gp_json_reader_init(&r, c->text ? c->text : "", c->len);
    int line = 0, col = 0;
    gp_json_where(&r, v->offset, &line, &col);
    snprintf(buf, len, "%s:%d:%d: %s", c->path, line, col, key);
    return buf;
}

static const char *kind_name(gp_json_kind k)
{
    switch (k) {
    case GP_JSON_STRING: return "a string";
    case GP_JSON_NULL: return "null";
    case GP_JSON_TRUE:
    case GP_JSON_FALSE: return "a boolean";
    case GP_JSON_ARRAY: return "an array";
    case GP_JSON_OBJECT: return "an object";
    default: return "not a number";
    }
}

gp_status gp_hf_config_num(const gp_hf_config *c, const gp_json_value *obj, const char *key,
                           double def, double lo, double hi, bool lo_open, double *out)
{
    const gp_json_value *v = gp_json_get(obj ? obj : c->json, key);
    if (!v) {
        *out = def;
        return GP_OK;
    }
    char at[1300];
    if (v->kind != GP_JSON_NUMBER)
        return gp_error_set(GP_ERR_DATA, "%s is %s; it must be a number", where(c, v, key, at,
                            sizeof at), kind_name(v->kind));
    if (!(lo_open ? v->num > lo : v->num >= lo) || !(v->num <= hi)) {
        char range[96];
        if (isinf(hi)) snprintf(range, sizeof range, "%s %g", lo_open ? "above" : "at least", lo);
        else snprintf(range, sizeof range, "%s %g and at most %g", lo_open ? "above" : "at least",
                      lo, hi);
        return gp_error_set(GP_ERR_DATA, "%s = %.17g is out of range: it must be %s",
                            where(c, v, key, at, sizeof at), v->num, range);
    }
    *out = v->num;
    return GP_OK;
}

gp_status gp_hf_config_int(const gp_hf_config *c, const gp_json_value *obj, const char *key,
                           int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    const gp_json_value *v = gp_json_get(obj ? obj : c->json, key);
    if (!v) {
        *out = def;
        return GP_OK;
    }
    char at[1300];
    if (v->kind != GP_JSON_NUMBER)
        return gp_error_set(GP_ERR_DATA, "%s is %s; it must be a whole number from %lld to %lld",
                            where(c, v, key, at, sizeof at), kind_name(v->kind), (long long)lo,
                            (long long)hi);
    if (v->num != floor(v->num) || v->num < (double)lo || v->num > (double)hi)
        return gp_error_set(GP_ERR_DATA, "%s = %.17g is out of range: it must be a whole number "
                            "from %lld to %lld", where(c, v, key, at, sizeof at), v->num,
                            (long long)lo, (long long)hi);
    *out = (int64_t)v->num;
    return GP_OK;
}

gp_status gp_hf_config_bool(const gp_hf_config *c, const gp_json_value *obj, const char *key,
                            bool def, bool *out)
{
    const gp_json_value *v = gp_json_get(obj ? obj : c->json, key);
    if (!v) {
        *out = def;
        return GP_OK;
    }
    if (v->kind == GP_JSON_TRUE || v->kind == GP_JSON_FALSE) {
        *out = v->kind == GP_JSON_TRUE;
        return GP_OK;
    }
    if (v->kind == GP_JSON_NUMBER && (v->num == 0 || v->num == 1)) {
        *out = v->num == 1;
        return GP_OK;
    }
    char at[1300];
    return gp_error_set(GP_ERR_DATA, "%s is %s; it must be true or false",
                        where(c, v, key, at, sizeof at),
                        v->kind == GP_JSON_NUMBER ? "a number other than 0 and 1" : kind_name(v->kind));
}

/* config.json's string `key` (NULL where absent or null), or an error. */
static gp_status str_of(const gp_hf_config *c, const char *key, const char **out)
{
    const gp_json_value *v = gp_json_get(c->json, key);
    *out = NULL;
    if (!v || v->kind == GP_JSON_NULL) return GP_OK;
    char at[1300];
    if (v->kind != GP_JSON_STRING)
        return gp_error_set(GP_ERR_DATA, "%s is %s; it must be a string",
                            where(c, v, key, at, sizeof at),
                            v->kind == GP_JSON_NUMBER ? "a number" : kind_name(v->kind));
    *out = v->str;
    return GP_OK;
}

/* transformers 4.44.2's models/{llama,mistral,qwen2}/configuration_*.py,
 * their __init__'s keyword defaults (5.24's dataclass fields are the same
 * numbers).  tests/test_hf_config.py and test_hf_folder.py check gpipe's
 * use of each against transformers' own classes where build/hf-venv has
 * them. */
static const gp_hf_llama_defaults hf_llama_defaults[] = {
    {.model_type = "llama", .config_class = "LlamaConfig", .layers = 32, .heads = 32,
     .kv_heads = 0, .width = 4096, .intermediate = 11008, .vocab = 32000, .positions = 2048,
     .rope_theta = 10000.0, .rms_eps = 1e-6, .tie = false, .window = 0},
    {.model_type = "mistral", .config_class = "MistralConfig", .layers = 32, .heads = 32,
     .kv_heads = 8, .width = 4096, .intermediate = 14336, .vocab = 32000,
     .positions = 4096 * 32, .rope_theta = 10000.0, .rms_eps = 1e-6, .tie = false,
     .window = 4096},
    {.model_type = "qwen2", .config_class = "Qwen2Config", .layers = 32, .heads = 32,
     .kv_heads = 32, .width = 4096, .intermediate = 22016, .vocab = 151936,
     .positions = 32768, .rope_theta = 10000.0, .rms_eps = 1e-6, .tie = false, .window = 4096,
     .window_switch = "use_sliding_window"},
};

const gp_hf_llama_defaults *gp_hf_llama_defaults_of(const gp_hf_config *c)
{
    const gp_json_value *t = c && c->json ? gp_json_get(c->json, "model_type") : NULL;
    if (t && t->kind == GP_JSON_STRING)
        for (size_t k = 0; k < sizeof hf_llama_defaults / sizeof *hf_llama_defaults; k++)
            if (!strcmp(t->str, hf_llama_defaults[k].model_type)) return &hf_llama_defaults[k];
    return &hf_llama_defaults[0];
}

/* The sliding window transformers applies (0: none); *absent where the
 * file has no sliding_window and the type's default applies. */
static gp_status sliding_window(const gp_hf_config *c, const gp_hf_llama_defaults *d,
                                int64_t *window, bool *absent)
{
    *window = 0;
    *absent = false;
    bool use = d->window > 0;
    if (use && d->window_switch) GP_TRY(gp_hf_config_bool(c, NULL, d->window_switch, false, &use));
    if (!use) return GP_OK;
    const gp_json_value *v = gp_json_get(c->json, "sliding_window");
    if (v && v->kind == GP_JSON_NULL) return GP_OK; /* MistralConfig's and Qwen2Config's none */
    *absent = !v;
    return gp_hf_config_int(c, NULL, "sliding_window", d->window, 1, INT64_MAX, window);
}

gp_status gp_hf_llama_supported(const gp_hf_config *c, int64_t T)
{
    const char *type, *act;
    char at[1300];
    GP_TRY(str_of(c, "model_type", &type));
    const gp_hf_llama_defaults *def = gp_hf_llama_defaults_of(c);
    if (type && strcmp(type, "llama") && strcmp(type, "mistral") && strcmp(type, "qwen2"))
        return gp_error_set(GP_ERR_UNSUPPORTED, "%s = '%s': model.llama builds Llama, Mistral "
                            "and Qwen2 (model_type llama, mistral or qwen2); another family's "
                            "tensors have the same names and are used otherwise (Gemma's "
                            "embedding is scaled by sqrt(hidden_size), its norms by 1 + "
                            "weight), so they would load into another model",
                            where(c, gp_json_get(c->json, "model_type"), "model_type", at,
                                  sizeof at), type);
    GP_TRY(str_of(c, "hidden_act", &act));
    if (act && strcmp(act, "silu") && strcmp(act, "swish")) /* (the same in transformers) */
        return gp_error_set(GP_ERR_UNSUPPORTED, "%s = '%s': model.llama's MLP is SwiGLU, "
                            "silu(gate_proj(x)) * up_proj(x) (hidden_act silu); gpipe has no "
                            "other activation there",
                            where(c, gp_json_get(c->json, "hidden_act"), "hidden_act", at,
                                  sizeof at), act);
    const gp_json_value *hd = gp_json_get(c->json, "head_dim");
    if (hd && hd->kind != GP_JSON_NULL) {
        int64_t d, width, heads;
        GP_TRY(gp_hf_config_int(c, NULL, "head_dim", 0, 1, 1 << 20, &d));
        GP_TRY(gp_hf_config_int(c, NULL, "hidden_size", def->width, 1, (int64_t)1 << 20,
                                &width));
        GP_TRY(gp_hf_config_int(c, NULL, "num_attention_heads", def->heads, 1, 1 << 16,
                                &heads));
        if (d * heads != width)
            return gp_error_set(GP_ERR_UNSUPPORTED, "%s = %lld, but hidden_size / "
                                "num_attention_heads is %lld / %lld: model.llama's heads are "
                                "hidden_size / num_attention_heads wide (it has no head_dim "
                                "of its own), and the folder's q_proj, %lld x %lld, does not "
                                "fit it", where(c, hd, "head_dim", at, sizeof at), (long long)d,
                                (long long)width, (long long)heads, (long long)(d * heads),
                                (long long)width);
    }
    int64_t window;
    bool absent;
    GP_TRY(sliding_window(c, def, &window, &absent));
    char dflt[96] = "", on[96] = "";
    if (absent) snprintf(dflt, sizeof dflt, " (absent: %s's default)", def->config_class);
    if (def->window_switch) snprintf(on, sizeof on, ", %s true", def->window_switch);
    if (window > 0 && window < T)
        return gp_error_set(GP_ERR_UNSUPPORTED, "%s: sliding_window = %lld%s (model_type %s%s): "
                            "each token attends to the %lld up to it, and this model's "
                            "sequences are %lld long, but gpipe's attention sees the whole "
                            "sequence (it has no sliding window): give model.input a length "
                            "of at most %lld", c->path, (long long)window, dflt, type, on,
                            (long long)window, (long long)T, (long long)window);
    return GP_OK;
}
