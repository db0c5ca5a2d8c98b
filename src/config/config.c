/*
 * config.c — the entry points: the YAML tree (config_impl.h) with the
 * overrides applied, walked into the structs of config.h section by section
 * (config_model.c, config_pipeline.c, config_data.c, config_train.c, on the
 * helpers of config_walk.c), then the checks across sections; validation,
 * defaults and messages point at the file.
 *
 * Every section first checks its keys against one schema table (k_schema),
 * so an unknown key is an error with the best hint we can find: the same
 * key elsewhere in the schema ("did you mean 'optimizer.lr'?"), else the
 * nearest known key by edit distance, else the list of keys allowed there.
 * Then each option is read by a typed getter that knows its default and
 * range and, for top-level options, records "x.y = v (default)" in
 * cfg->defaults_applied when the key is absent (darknet's lesson: say what
 * you assumed).  Cross-field checks run last.
 *
 * A YAML null (`key:` with nothing, or `~`) means "not given": the default
 * applies, and for maps (layer options, sections) it is an empty map.
 *
 * Memory: the tree is freed before returning; on error *out is left zeroed
 * (gp_config_free on it is a no-op).
 */
#include "config/config.h"
#include "config/config_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the whole config ----------------------------------------------------- */

static gp_status walk_root(gp_cfg_walk *w, const gp_ynode *root, gp_config *c)
{
    char got[96];
    if (root->kind == GP_YNODE_NULL)
        return gp_cfg_bad(w, root, "the config is empty; it needs at least model.input and "
                          "model.layers");
    if (root->kind != GP_YNODE_MAP)
        return gp_cfg_bad(w, root, "expected a map with the sections model, pipeline, data and "
                          "train at the top of the config, got %s",
                          gp_cfg_describe(root, got, sizeof got));
    GP_TRY(gp_cfg_check_keys(w, root, ""));
    GP_TRY(gp_cfg_parse_model(w, root, &c->model));
    GP_TRY(gp_cfg_parse_pipeline(w, root, &c->pipeline));
    GP_TRY(gp_cfg_parse_data(w, root, &c->model, &c->data));
    GP_TRY(gp_cfg_parse_train(w, root, &c->train));

    /* cross-field checks */
    int reps = gp_pipeline_replicas(&c->pipeline);
    if ((int64_t)c->pipeline.chunks * reps > c->train.batch_size) {
        const gp_ynode *pm = gp_ymap_get(root, "pipeline");
        const gp_ynode *n = gp_ymap_get(pm, "chunks");
        if (!n) n = gp_ymap_get(gp_ymap_get(root, "train"), "batch_size");
        if (reps == 1)
            return gp_cfg_bad(w, n, "pipeline.chunks (%d) must be <= train.batch_size (%lld): "
                              "every micro-batch needs at least one sample", c->pipeline.chunks,
                              (long long)c->train.batch_size);
        return gp_cfg_bad(w, n, "pipeline.chunks x pipeline.replicas (%d x %d = %lld) must be <= "
                          "train.batch_size (%lld): every replica's every micro-batch needs at "
                          "least one sample", c->pipeline.chunks, reps,
                          (long long)c->pipeline.chunks * reps, (long long)c->train.batch_size);
    }
    /* the interleaved schedule's shape (schedule.c checks it again): here
     * it names the line, before data or profiles are loaded */
    const gp_pipeline_config *pc = &c->pipeline;
    if (pc->schedule == GP_SCHEDULE_INTERLEAVED && (pc->n_devices < 2 || pc->chunks % pc->n_devices)) {
        const gp_ynode *pm = gp_ymap_get(root, "pipeline");
        const gp_ynode *n = gp_ymap_get(pm, pc->n_devices < 2 ? "devices" : "chunks");
        if (!n) n = gp_ymap_get(pm, "schedule");
        return gp_cfg_bad(w, n, "pipeline.schedule: interleaved needs 2 or more devices and "
                          "pipeline.chunks a multiple of their number (got %d device%s, chunks "
                          "%d); %s", pc->n_devices, pc->n_devices == 1 ? "" : "s", pc->chunks,
                          pc->n_devices < 2 ? "list more devices or use another schedule"
                                            : "set chunks to a multiple of the devices");
    }
    /* stages against layers, here to name the line or --set of each
     * (gp_model_balance checks them again for configs built in C) */
    {
        const gp_pipeline_config *pp = &c->pipeline;
        const gp_ynode *pm = gp_ymap_get(root, "pipeline");
        int L = c->model.n_layers;
        int stages = pp->n_devices * gp_schedule_stages_per_device(pp->schedule,
                                                                   pp->virtual_stages);
        if (pp->n_balance > 0) {
            int64_t sum = 0; /* entries up to INT_MAX each: no wrap */
            for (int j = 0; j < pp->n_balance; j++) sum += pp->balance[j];
            if (sum != L)
                return gp_cfg_bad(w, gp_ymap_get(pm, "balance"), "pipeline.balance sums to %lld "
                                  "layers but the model has %d; make the entries add up to %d, "
                                  "or use balance: auto", (long long)sum, L, L);
        }
        if (L >= 1 && stages > L) {
            const gp_ynode *n = gp_ymap_get(pm, stages > pp->n_devices ? "virtual" : "devices");
            if (!n) n = gp_ymap_get(pm, "devices");
            return gp_cfg_bad(w, n ? n : pm, "%d stages (pipeline.devices%s) for a model of %d "
                              "layer%s: every stage needs at least one layer; use at most %d "
                              "stages", stages,
                              gp_schedule_v_shape(pp->schedule) ? " x 2, in a V"
                              : stages > pp->n_devices ? " x pipeline.virtual" : "",
                              L, L == 1 ? "" : "s", L);
        }
    }
    return GP_OK;
}

/* An override's key: *k and its length, blanks around it left out. */
static size_t override_key(const char *o, const char **k)
{
    const char *eq = strchr(o, '=');
    size_t n = eq ? (size_t)(eq - o) : strlen(o);
    while (n > 0 && (*o == ' ' || *o == '\t')) o++, n--;
    while (n > 0 && (o[n - 1] == ' ' || o[n - 1] == '\t')) n--;
    *k = o;
    return n;
}

/* An override that replaces a whole map an earlier one set a key inside
 * (--set train.optimizer.lr=0.003 --set train.optimizer=adamw: the lr is
 * gone) is a warning: the later wins, as documented, but silently losing
 * a value someone typed is rarely meant. */
static void warn_shadowed(gp_cfg_walk *w, const char *const *ov, int n)
{
    for (int j = 1; j < n && ov; j++) {
        if (!ov[j]) continue;
        const char *kj;
        size_t lj = override_key(ov[j], &kj);
        for (int i = 0; i < j && lj; i++) {
            const char *ki;
            if (!ov[i]) continue;
            size_t li = override_key(ov[i], &ki);
            if (li <= lj || strncmp(ki, kj, lj) || ki[lj] != '.') continue;
            gp_ynode at = {.set = ov[j]};
            gp_cfg_warn(w, &at, "replaces '%.*s' and with it the earlier %s %s; give that "
                        "one after this, or both as one map", (int)lj, kj,
                        gp_opt_name(GP_OPT_SET), ov[i]);
            break;
        }
    }
}

gp_status gp_config_parse(const char *name, const char *text, size_t len,
                          const char *const *overrides, int n_overrides, gp_config *out)
{
    return gp_config_parse_with(name, text, len, overrides, n_overrides, NULL, out);
}

gp_status gp_config_parse_with(const char *name, const char *text, size_t len,
                               const char *const *overrides, int n_overrides,
                               const gp_config_sources *src, gp_config *out)
{
    memset(out, 0, sizeof *out);
    if (!name) name = "<config>";
    if (!text && len) return gp_error_set(GP_ERR_INVALID, "%s: no config text given", name);
    GP_TRY(gp_env_check()); /* the environment is checked as the options are */
    if (strlen(name) >= sizeof out->path)
        return gp_error_set(GP_ERR_INVALID, "%.80s...: the config's path is too long (at "
                            "most %zu characters)", name, sizeof out->path - 1);
    gp_ynode *root = NULL;
    GP_TRY(gp_ytree_parse(name, NULL, text ? text : "", len, &root, NULL));
    /* An empty (or comment-only) file with overrides: what is missing is
     * the file's, not the last override's, which the walk would name. */
    bool empty = root->kind == GP_YNODE_NULL, set = false;
    for (int i = 0; i < n_overrides; i++) {
        if (!overrides || !overrides[i]) continue;
        set = true;
        gp_status s = gp_ytree_override(&root, overrides[i]);
        if (s != GP_OK) {
            gp_ynode_free(root);
            return s;
        }
    }
    empty = empty && set;
    if (empty && gp_cfg_absent(gp_ymap_get(root, "model"))) {
        gp_ynode_free(root);
        return gp_error_set(GP_ERR_INVALID, "%s:1:1: the config is empty; it needs at least "
                            "model.input and model.layers (no %s gives a model)",
                            name, gp_opt_name(GP_OPT_SET));
    }
    gp_cfg_walk w = {.file = name, .record = true, .root = root, .src = src};
    warn_shadowed(&w, overrides, n_overrides);
    gp_status s = walk_root(&w, root, out);
    gp_ynode_free(root);
    if (s != GP_OK && empty)
        gp_error_wrap(s, "%s:1:1: the config is empty, and the %s values alone do not make "
                      "one", name, gp_opt_name(GP_OPT_SET));
    if (s != GP_OK) {
        free(w.defaults);
        free(w.warnings);
        gp_config_free(out);
        return s;
    }
    snprintf(out->path, sizeof out->path, "%s", name);
    size_t olen = 1;
    for (int i = 0; i < n_overrides; i++)
        if (overrides && overrides[i]) olen += strlen(overrides[i]) + 1;
    out->text = malloc(len + 1);
    out->overrides = malloc(olen);
    if (out->text) {
        if (len) memcpy(out->text, text, len);
        out->text[len] = '\0';
    }
    if (out->overrides) {
        size_t at = 0;
        for (int i = 0; i < n_overrides; i++) {
            if (!overrides || !overrides[i]) continue;
            size_t k = strlen(overrides[i]);
            memcpy(out->overrides + at, overrides[i], k);
            at += k;
            out->overrides[at++] = '\n';
        }
        out->overrides[at] = '\0';
    }
    if (!out->text || !out->overrides) {
        free(w.defaults);
        free(w.warnings);
        gp_config_free(out);
        return gp_error_set(GP_ERR_INVALID, "out of memory reading the config");
    }
    out->defaults_applied = w.defaults ? w.defaults : calloc(1, 1);
    out->warnings = w.warnings ? w.warnings : calloc(1, 1);
    if (!out->defaults_applied || !out->warnings) {
        gp_config_free(out);
        return gp_error_set(GP_ERR_INVALID, "out of memory reading the config");
    }
    for (const char *l = out->warnings; *l;) {
        const char *e = strchr(l, '\n');
        GP_WARN("%.*s", (int)(e - l), l);
        l = e + 1;
    }
    return GP_OK;
}

gp_status gp_config_load(const char *path, const char *const *overrides, int n_overrides,
                         gp_config *out)
{
    return gp_config_load_with(path, overrides, n_overrides, NULL, out);
}

gp_status gp_config_load_with(const char *path, const char *const *overrides,
                              int n_overrides, const gp_config_sources *src, gp_config *out)
{
    memset(out, 0, sizeof *out);
    if (!path) return gp_error_set(GP_ERR_INVALID, "no config path given");
    char *buf;
    size_t len;
    int r = gp_read_regular(path, GP_CONFIG_MAX_BYTES, &buf, &len);
    if (r > 0)
        return gp_error_set(GP_ERR_INVALID, "%s: larger than %zu MiB; is this a config?", path,
                            GP_CONFIG_MAX_BYTES >> 20);
    if (r < 0 && errno == ENOMEM)
        return gp_error_set(GP_ERR_IO, "%s: out of memory reading the config", path);
    if (r < 0)
        return gp_error_set(GP_ERR_IO, "%s: cannot open the config: %s", path,
                            gp_open_strerror(errno));
    gp_status s = gp_config_parse_with(path, buf, len, overrides, n_overrides, src, out);
    free(buf);
    return s;
}

void gp_config_free(gp_config *c)
{
    if (!c) return;
    free(c->model.layers);
    free(c->model.hf_config);
    if (c->pipeline.schedule_file) {
        gp_schedule_file_free(c->pipeline.schedule_file);
        free(c->pipeline.schedule_file);
        c->pipeline.schedule_file = NULL;
    }
    free(c->defaults_applied);
    free(c->warnings);
    free(c->text);
    free(c->overrides);
    memset(c, 0, sizeof *c);
}
