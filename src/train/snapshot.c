/*
 * snapshot.c — a model to and from safetensors files: gathering every
 * layer's tensors from its device to the host under PyTorch state_dict()
 * names, putting them back (shape-checked, all or nothing), and the
 * snapshot files of a run (naming, saving with pruning, finding the newest
 * that verifies, the config a snapshot was made with).
 *
 * Weights are stored per layer, never per stage, so a snapshot taken on n
 * devices resumes on any other placement.
 */
#include "train/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_COUNTERS 32 /* batch norms in one layer (an AmoebaNet cell has up to 20) */
#define SNAP_PREFIX "snapshot-"
#define SNAP_SUFFIX ".safetensors"

/* ---- gather ------------------------------------------------------------ */

/* The copies off the devices a snapshot in the background makes on its
 * writer thread (deferred: the model's tensors are host memory, and its
 * gate holds back whatever writes them until the copies are made). */
typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} snap_copy;

typedef struct {
    snap_copy *items;
    int n, cap;
} snap_copies;

static gp_status defer_copy(snap_copies *c, void *dst, const void *src, size_t bytes)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        snap_copy *ni = realloc(c->items, (size_t)cap * sizeof *ni);
        if (!ni) return gp_error_set(GP_ERR_OOM, "out of host memory for a snapshot");
        c->items = ni;
        c->cap = cap;
    }
    c->items[c->n++] = (snap_copy){dst, src, bytes};
    return GP_OK;
}

/* Tensor t of a layer that rank `owner` trains into the writer.  With
 * processes, every rank walks the same tensors in the same order: with
 * `gather`, the owner sends its copy to rank 0, which writes it (w is NULL
 * elsewhere); without, each rank adds its own tensors to its own part. */
static gp_status add_device_tensor(gp_st_writer *w, const char *name, const gp_tensor *t,
                                   int owner, bool gather, float **scratch, size_t *cap,
                                   snap_copies *defer)
{
    int me = gp_procs_size() > 1 ? gp_procs_rank() : 0;
    if (me != owner && (me != 0 || !gather)) return GP_OK;
    int64_t n = gp_tensor_numel(t);
    if (me == owner && (me == 0 || !gather)) { /* its own: straight into w's buffer */
        void *dst;
        GP_TRY(gp_st_writer_slot(w, name, GP_ST_F32, t->ndim, t->dims, (size_t)n * sizeof(float),
                                 &dst));
        if (defer) return defer_copy(defer, dst, gp_f32(t), (size_t)n * sizeof(float));
        GP_TRY(gp_dev_download(t->dev, dst, gp_f32(t), n));
        return gp_dev_synchronize(t->dev);
    }
    if ((size_t)n > *cap) {
        float *ns = realloc(*scratch, (size_t)n * sizeof *ns);
        if (!ns) return gp_error_set(GP_ERR_OOM, "out of host memory gathering '%s'", name);
        *scratch = ns;
        *cap = (size_t)n;
    }
    if (me == owner) {
        GP_TRY(gp_dev_download(t->dev, *scratch, gp_f32(t), n));
        GP_TRY(gp_dev_synchronize(t->dev));
        if (me != 0 && gather)
            return gp_procs_send_bytes(*scratch, (size_t)n * sizeof(float), 0, 0);
    } else {
        GP_TRY(gp_procs_recv_bytes(*scratch, (size_t)n * sizeof(float), owner, 0));
    }
    return gp_st_writer_add(w, name, GP_ST_F32, t->ndim, t->dims, *scratch,
                            (size_t)n * sizeof(float));
}

/* Optimizer state q of parameter p of layer k where each replica keeps
 * only its chunk (ZeRO stage 1, gp_optim_create_sharded): the whole tensor
 * written, assembled from the chunks.  In one process from every replica's
 * optimizer (deferred like add_device_tensor's copies); with processes the
 * ranks of replicas 1 .. R-1 send their chunks to the layer's rank in
 * replica 0 (its owner), which writes the whole as add_device_tensor does
 * (to rank 0 with `gather`). */
static gp_status add_state_chunks(gp_model *m, gp_st_writer *w, const char *name, int k, int p,
                                  int q, bool gather, float **scratch, size_t *cap,
                                  snap_copies *defer)
{
    const gp_tensor *pv = &m->layers[k].params[p].value;
    int64_t n = gp_tensor_numel(pv);
    if (!m->proc_comm) {
        void *dst;
        GP_TRY(gp_st_writer_slot(w, name, GP_ST_F32, pv->ndim, pv->dims, (size_t)n * sizeof(float),
                                 &dst));
        int R = m->n_replicas > 1 ? m->n_replicas : 1;
        for (int r = 0; r < R; r++) {
            gp_model *mr = r ? &m->replicas[r - 1] : m;
            const gp_tensor *c = gp_optim_state(mr->optim, k, p, q);
            int64_t lo, hi;
            gp_optim_state_range(mr->optim, k, p, &lo, &hi);
            if (hi <= lo) continue;
            float *d = (float *)dst + lo;
            if (defer) {
                GP_TRY(defer_copy(defer, d, gp_f32(c), (size_t)(hi - lo) * sizeof(float)));
                continue;
            }
            GP_TRY(gp_dev_download(c->dev, d, gp_f32(c), hi - lo));
            GP_TRY(gp_dev_synchronize(c->dev));
        }
        return GP_OK;
    }
    int me = gp_procs_rank(), nd = m->n_devices, R = m->proc_replicas;
    int owner = gp_model_layer_rank(m, k), rho = me / nd;
    bool mine = me % nd == owner; /* this rank runs the layer in its replica */
    if (!mine && (me != 0 || !gather)) return GP_OK;
    if ((size_t)n > *cap) {
        float *ns = realloc(*scratch, (size_t)(n > 0 ? n : 1) * sizeof *ns);
        if (!ns) return gp_error_set(GP_ERR_OOM, "out of host memory gathering '%s'", name);
        *scratch = ns;
        *cap = (size_t)n;
    }
    if (mine) {
        const gp_tensor *c = gp_optim_state(m->optim, k, p, q);
        int64_t lo, hi;
        gp_optim_state_range(m->optim, k, p, &lo, &hi);
        if (hi > lo) {
            GP_TRY(gp_dev_download(c->dev, *scratch + lo, gp_f32(c), hi - lo));
            GP_TRY(gp_dev_synchronize(c->dev));
        }
        if (rho > 0) /* to the owner: its chunk alone */
            return hi > lo ? gp_procs_send_bytes(*scratch + lo, (size_t)(hi - lo) * sizeof(float),
                                                 owner, 0)
                           : GP_OK;
        for (int r = 1; r < R; r++) { /* the owner: every replica's chunk */
            int64_t a, b;
            gp_comm_chunk(n, R, r, &a, &b);
            if (b > a)
                GP_TRY(gp_procs_recv_bytes(*scratch + a, (size_t)(b - a) * sizeof(float),
                                           r * nd + owner, 0));
        }
        if (gather && me != 0) return gp_procs_send_bytes(*scratch, (size_t)n * sizeof(float), 0, 0);
    } else { /* rank 0 writing the whole file: the owner's assembled tensor */
        GP_TRY(gp_procs_recv_bytes(*scratch, (size_t)n * sizeof(float), owner, 0));
    }
    return gp_st_writer_add(w, name, GP_ST_F32, pv->ndim, pv->dims, *scratch,
                            (size_t)n * sizeof(float));
}

/* Processes: a rank of replica 1 .. R-1 sends its chunk of every sharded
 * state to the layer's rank in replica 0, in the order collect walks them
 * there (add_state_chunks). */
static gp_status send_state_chunks(gp_model *m)
{
    float *scratch = NULL;
    size_t cap = 0;
    gp_status s = GP_OK;
    for (int k = 0; k < m->n_layers && s == GP_OK; k++)
        for (int p = 0; p < m->layers[k].n_params && s == GP_OK; p++)
            for (int q = 0; s == GP_OK && gp_optim_state(m->optim, k, p, q); q++) {
                int64_t lo, hi;
                if (gp_optim_state_range(m->optim, k, p, &lo, &hi))
                    s = add_state_chunks(m, NULL, "", k, p, q, false, &scratch, &cap, NULL);
            }
    free(scratch);
    return s;
}

/* How tensors are named: "<layer>.<param>", where <layer> is the layer's
 * name when every layer has one (PyTorch's nn.Sequential(OrderedDict(...)):
 * the built-in models, named as torchgpipe's modules) and its index
 * otherwise (nn.Sequential(*layers)), as PyTorch's state_dict() names them.
 * Optimizer state is "<state>.<layer>.<param>": "momentum" (SGD),
 * "exp_avg" and "exp_avg_sq" (Adam), PyTorch's names. */
typedef enum { NAME_BY_INDEX = 0, NAME_BY_NAME } naming;

static naming model_naming(const gp_model *m)
{
    return gp_weights_by_name(m->layers, m->n_layers) ? NAME_BY_NAME : NAME_BY_INDEX;
}

/* "<prefix><layer>.<what>" into buf (of GP_ST_NAME_MAX bytes). */
static const char *tensor_name(char *buf, size_t len, const char *prefix, const gp_model *m, int k,
                               naming nm, const char *what)
{
    return gp_weights_tensor_name(buf, len, prefix, m->layers, k, nm == NAME_BY_NAME, what);
}

/* "momentum." (SGD), "exp_avg." or "exp_avg_sq." (Adam): the prefix of
 * optimizer state q's tensors, PyTorch's state names. */
static const char *state_prefix(const gp_model *m, int q, char *buf, size_t len)
{
    snprintf(buf, len, "%s.", gp_optim_state_name(gp_optim_options(m->optim), q));
    return buf;
}

/* "gpipe.optimizer" of a snapshot: "sgd" (plain: no state),
 * "sgd+momentum", "adam" or "adamw". */
static const char *optimizer_tag(const gp_model *m)
{
    const gp_optim_opts *o = gp_optim_options(m->optim);
    if (o->kind == GP_OPTIM_ADAM) return "adam";
    if (o->kind == GP_OPTIM_ADAMW) return "adamw";
    return gp_optim_states_per_param(o) ? "sgd+momentum" : "sgd";
}

/* Whether a tensor name is an optimizer state's (any optimizer's). */
static bool is_state_name(const char *tn)
{
    return !strncmp(tn, "momentum.", 9) || !strncmp(tn, "exp_avg.", 8) ||
           !strncmp(tn, "exp_avg_sq.", 11);
}

static gp_status meta_i64(gp_st_writer *w, const char *key, int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)v);
    return gp_st_writer_meta(w, key, b);
}

/* The layers' types, "flatten,linear,relu" (gpipe.layers; cut short past
 * 2000 characters, the same way every time). */
static void layer_types(const gp_model *m, char *types, size_t len)
{
    int off = 0;
    types[0] = '\0';
    for (int k = 0; k < m->n_layers && off < (int)len - 24; k++)
        off += snprintf(types + off, len - (size_t)off, "%s%s", k ? "," : "",
                        gp_layer_type_name(m->layers[k].spec.type));
}

/* v in the fewest digits that read back as the same float ("0.2", not
 * %.9g's "0.200000003"). */
static const char *float_str(float v, char *buf, size_t len)
{
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, len, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    return buf;
}

/* The options that change what a layer computes without changing a
 * tensor's shape, "4 dropout p=0.2;6 leaky_relu slope=0.01"
 * (gpipe.layer_options): a resume compares them, since the tensors would
 * load into the changed model without a word. */
/* model.input as the config writes it: "1, 28, 28", or "128" for a
 * language model's [T] (gpipe.input: a resume compares it). */
static const char *input_str(const gp_config *cfg, char *buf, size_t len)
{
    const int64_t *in = cfg->model.input;
    if (in[1] == 1 && in[2] == 1) snprintf(buf, len, "%lld", (long long)in[0]);
    else snprintf(buf, len, "%lld, %lld, %lld", (long long)in[0], (long long)in[1],
                  (long long)in[2]);
    return buf;
}

/* Version 2 (gpipe.layer_options_version, 2026-12-01) adds attention's
 * heads and rope's settings; a snapshot without it is compared as
 * version 1 was written. */
#define LAYER_OPTIONS_VERSION 2
static void layer_options(const gp_model *m, int version, char *buf, size_t len)
{
    size_t off = 0;
    /* version 1 stopped 80 bytes short of a 4096-byte buffer: compared as it
     * was written, or a long model's (ResNet-152's batch norms) never
     * matches and every resume warns of another model */
    size_t margin = version < 2 ? 80 : 200;
    if (version < 2 && len > 4096) len = 4096;
    buf[0] = '\0';
    for (int k = 0; k < m->n_layers && off + margin < len; k++) {
        const gp_layer_spec *sp = &m->layers[k].spec;
        char opt[160], x[24], y[24], z[24];
        switch (sp->type) {
        case GP_LAYER_ATTENTION:
            if (version < 2) continue;
            snprintf(opt, sizeof opt, "heads=%lld kv_heads=%lld", (long long)sp->heads,
                     (long long)(sp->kv_heads ? sp->kv_heads : sp->heads));
            break;
        case GP_LAYER_ROPE:
            if (version < 2) continue;
            snprintf(opt, sizeof opt, "heads=%lld kv_heads=%lld theta=%s", (long long)sp->heads,
                     (long long)(sp->kv_heads ? sp->kv_heads : sp->heads),
                     float_str(sp->rope_theta, x, 24));
            if (sp->rope_llama3) {
                size_t o = strlen(opt);
                snprintf(opt + o, sizeof opt - o, " llama3 factor=%s low=%s high=%s orig=%lld",
                         float_str(sp->rope_factor, x, 24), float_str(sp->rope_low_freq, y, 24),
                         float_str(sp->rope_high_freq, z, 24),
                         (long long)sp->rope_orig_positions);
            }
            break;
        case GP_LAYER_DROPOUT:
        case GP_LAYER_DROPOUT2D: snprintf(opt, sizeof opt, "p=%s", float_str(sp->p, x, 24)); break;
        case GP_LAYER_LEAKY_RELU:
            snprintf(opt, sizeof opt, "slope=%s", float_str(sp->slope, x, 24));
            break;
        case GP_LAYER_BATCHNORM:
            snprintf(opt, sizeof opt, "momentum=%s eps=%s", float_str(sp->momentum, x, 24),
                     float_str(sp->eps, y, 24));
            break;
        case GP_LAYER_INSTANCE_NORM:
        case GP_LAYER_LAYER_NORM:
        case GP_LAYER_RMS_NORM:
            snprintf(opt, sizeof opt, "eps=%s", float_str(sp->eps, x, 24));
            break;
        default: continue;
        }
        off += (size_t)snprintf(buf + off, len - off, "%s%d %s %s", off ? ";" : "", k,
                                gp_layer_type_name(sp->type), opt);
    }
}

/* Every tensor of the model into w, then the metadata.  Processes: with
 * `gather` rank 0 writes the whole model (the others send theirs and
 * return); without, each rank's w gets its own layers' tensors, and rank 0's
 * the metadata too: the parts of a snapshot (gp_snapshot_save).  With
 * `defer`, the tensors' bytes are not copied but listed there, for the
 * writer thread to copy (gp_snapshot_save_async). */
static gp_status collect(gp_model *m, const gp_config *cfg, const gp_snapshot_pos *pos,
                         gp_st_writer *w, bool gather, snap_copies *defer)
{
    /* Replicas with sharded updates each hold their own chunk of the
     * momentum: assemble it in replica 0, which is what is written. */
    if (pos && !m->proc_comm) GP_TRY(gp_model_gather_momentum(m)); /* (processes: done) */
    float *scratch = NULL;
    size_t cap = 0;
    gp_status s = GP_OK;
    char name[256];
    const naming nm = model_naming(m);
    int me = gp_procs_size() > 1 ? gp_procs_rank() : 0;
    for (int k = 0; k < m->n_layers && s == GP_OK; k++) {
        gp_layer *l = &m->layers[k];
        int owner = gp_model_layer_rank(m, k);
        for (int p = 0; p < l->n_params && s == GP_OK; p++) {
            if (l->params[p].tied) continue; /* stored once, under its owner's name */
            tensor_name(name, sizeof name, "", m, k, nm, l->params[p].name);
            s = add_device_tensor(w, name, &l->params[p].value, owner, gather, &scratch, &cap,
                                  defer);
        }
        const char *cn[MAX_COUNTERS];
        int64_t *cv[MAX_COUNTERS];
        int nc = gp_layer_counters(l, cn, cv, MAX_COUNTERS);
        GP_ASSERT(nc <= MAX_COUNTERS);
        for (int c = 0; c < nc && s == GP_OK; c++) {
            tensor_name(name, sizeof name, "", m, k, nm, cn[c]);
            if (me != owner && (me != 0 || !gather)) continue;
            int64_t v = me == owner ? *cv[c] : 0;
            if (owner != 0 && me == owner && gather) { /* to rank 0, like the tensors */
                s = gp_procs_send_bytes(&v, sizeof v, 0, 0);
                continue;
            }
            if (owner != 0 && me == 0 && gather) s = gp_procs_recv_bytes(&v, sizeof v, owner, 0);
            if (s == GP_OK) s = gp_st_writer_add(w, name, GP_ST_I64, 0, NULL, &v, sizeof v);
        }
    }
    if (pos) {
        for (int k = 0; k < m->n_layers && s == GP_OK; k++) {
            gp_layer *l = &m->layers[k];
            for (int p = 0; p < l->n_params && s == GP_OK; p++)
                for (int q = 0; s == GP_OK && gp_optim_state(m->optim, k, p, q); q++) {
                    char pre[24];
                    tensor_name(name, sizeof name, state_prefix(m, q, pre, sizeof pre), m, k, nm,
                                l->params[p].name);
                    int64_t lo, hi;
                    if (gp_optim_state_range(m->optim, k, p, &lo, &hi))
                        s = add_state_chunks(m, w, name, k, p, q, gather, &scratch, &cap, defer);
                    else
                        s = add_device_tensor(w, name, gp_optim_state(m->optim, k, p, q),
                                              gp_model_layer_rank(m, k), gather, &scratch, &cap,
                                              defer);
                }
        }
    }
    free(scratch);
    GP_TRY(s);
    /* processes: rank 0 has the metadata; a part names its step, so that a
     * part copied over from another snapshot is refused, not mixed in */
    if (me != 0) return pos && !gather ? meta_i64(w, "gpipe.step", m->step) : GP_OK;
    /* "format": "pt" is what safetensors.torch writes; loaders look for it. */
    GP_TRY(gp_st_writer_meta(w, "format", "pt"));
    GP_TRY(gp_st_writer_meta(w, "gpipe.kind", pos ? "snapshot" : "weights"));
    GP_TRY(meta_i64(w, "gpipe.format_version", GP_SNAPSHOT_FORMAT_VERSION));
    GP_TRY(gp_st_writer_meta(w, "gpipe.version", gp_version()));
    char types[2048];
    layer_types(m, types, sizeof types);
    GP_TRY(gp_st_writer_meta(w, "gpipe.layers", types));
    GP_TRY(meta_i64(w, "gpipe.step", m->step));
    if (pos) {
        /* which optimizer state the file holds (a resume checks it) */
        GP_TRY(gp_st_writer_meta(w, "gpipe.optimizer", optimizer_tag(m)));
        GP_TRY(meta_i64(w, "gpipe.epoch", pos->epoch));
        GP_TRY(meta_i64(w, "gpipe.batch", pos->batch));
        GP_TRY(meta_i64(w, "gpipe.batch_size", pos->batch_size));
        if (pos->total > 0) {
            char lr[40];
            snprintf(lr, sizeof lr, "%.17g", gp_lr_at(&cfg->train, pos->step, pos->total));
            GP_TRY(meta_i64(w, "gpipe.total_steps", pos->total));
            GP_TRY(gp_st_writer_meta(w, "gpipe.lr_next", lr));
        }
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)cfg->train.seed);
        GP_TRY(gp_st_writer_meta(w, "gpipe.seed", seed));
        char opts[8192];
        layer_options(m, LAYER_OPTIONS_VERSION, opts, sizeof opts);
        GP_TRY(gp_st_writer_meta(w, "gpipe.layer_options", opts));
        GP_TRY(meta_i64(w, "gpipe.layer_options_version", LAYER_OPTIONS_VERSION));
        char in[96];
        GP_TRY(gp_st_writer_meta(w, "gpipe.input", input_str(cfg, in, sizeof in)));
        GP_TRY(meta_i64(w, "gpipe.devices", cfg->pipeline.n_devices));
        GP_TRY(meta_i64(w, "gpipe.chunks", cfg->pipeline.chunks));
        GP_TRY(meta_i64(w, "gpipe.replicas", gp_pipeline_replicas(&cfg->pipeline)));
        GP_TRY(gp_st_writer_meta(w, "gpipe.config_path", cfg->path));
        GP_TRY(gp_st_writer_meta(w, "gpipe.config", cfg->text ? cfg->text : ""));
        GP_TRY(gp_st_writer_meta(w, "gpipe.overrides", cfg->overrides ? cfg->overrides : ""));
        /* where the run's first weights came from ("": drawn): a resume
         * with another model.init_from says it is not read */
        GP_TRY(gp_st_writer_meta(w, "gpipe.init_from", cfg->model.init_from));
        if (pos->metrics) GP_TRY(gp_st_writer_meta(w, "gpipe.metrics_record", pos->metrics));
        /* model.init_from's config.json, where the sizes came from it: the
         * run resumes without that folder (gp_snapshot_hf_config) */
        if (cfg->model.hf_config) {
            GP_TRY(gp_st_writer_meta(w, "gpipe.hf_config", cfg->model.hf_config));
            GP_TRY(gp_st_writer_meta(w, "gpipe.hf_config_of", cfg->model.init_from));
        }
    }
    return GP_OK;
}

gp_status gp_snapshot_collect(gp_model *m, const gp_config *cfg, const gp_snapshot_pos *pos,
                              gp_st_writer *w)
{
    return collect(m, cfg, pos, w, true, NULL);
}

/* ---- parts (processes) ---------------------------------------------------- */

/* A snapshot of a run under mpirun: rank 0's file is the snapshot (its own
 * stage's tensors, all the metadata, and gpipe.parts: the other ranks'
 * files, relative to it), written only after every other rank's part is
 * durable; the parts are <dir>/snapshot-<step>.parts/rank<r>.safetensors.
 * A run killed while writing leaves parts without the file that names
 * them: no snapshot, and the next run that holds the directory removes
 * them. */
#define PARTS_KEY "gpipe.parts"
/* A snapshot gp_run_save wrote: its loader position (epoch 0, batch 0) is
 * not one (the caller's loop kept its own). */
#define SAVED_BY_KEY "gpipe.saved_by"
#define SAVED_BY_LIBRARY "gp_run_save"
#define PARTS_SUFFIX ".parts"

static void parts_dir(const char *dir, int64_t step, char *out, size_t len)
{
    snprintf(out, len, "%s/" SNAP_PREFIX "%09lld" PARTS_SUFFIX, dir, (long long)step);
}

/* Remove a parts directory and what is in it (best effort, warned):
 * whether pdir is gone (false: not a directory, or not all of it could be
 * deleted, said in a warning). */
static bool remove_parts(const char *pdir)
{
    DIR *d = opendir(pdir);
    if (!d) return false;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", pdir, e->d_name);
        if (unlink(p) != 0) GP_WARN("cannot delete %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(pdir) == 0) return true;
    GP_WARN("cannot delete %s: %s", pdir, strerror(errno));
    return false;
}

static bool meta_int(const gp_st_file *f, const char *key, int64_t *v);

/* The parts a snapshot names, their headers read and their tensors
 * appended to f's (data NULL, part = its index): a process reads a part
 * whole only when one of its layers needs a tensor of it (load_part).  A
 * file written by one process names none. */
static gp_status attach_parts(const char *path, gp_st_file *f)
{
    const char *list = gp_st_meta(f, PARTS_KEY);
    if (!list || !*list) return GP_OK;
    char dir[1024];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        int len = comma ? (int)(comma - p) : (int)strlen(p);
        char full[1400];
        snprintf(full, sizeof full, "%s/%.*s", dir, len, p);
        gp_st_file *parts = realloc(f->parts, (size_t)(f->n_parts + 1) * sizeof *parts);
        if (parts) f->parts = parts;
        char **paths = parts ? realloc(f->part_paths, (size_t)(f->n_parts + 1) * sizeof *paths)
                             : NULL;
        if (paths) f->part_paths = paths;
        if (!parts || !paths) return gp_error_set(GP_ERR_OOM, "out of host memory reading %s", path);
        int q = f->n_parts;
        gp_st_file *part = &f->parts[q];
        memset(part, 0, sizeof *part);
        f->part_paths[q] = strdup(full);
        gp_status s = f->part_paths[q] ? gp_st_read_header(full, part)
                                       : gp_error_set(GP_ERR_OOM, "out of host memory");
        f->n_parts++;
        /* checked now, streamed (so --resume latest passes over a snapshot
         * with a damaged part), held only when needed */
        if (s == GP_OK) s = gp_st_verify_file(part, full);
        int64_t step, part_step; /* (parts from before 2026-11-25 name none) */
        if (s == GP_OK && meta_int(f, "gpipe.step", &step) &&
            meta_int(part, "gpipe.step", &part_step) && part_step != step)
            s = gp_error_set(GP_ERR_DATA, "it holds step %lld, the snapshot step %lld (a part "
                             "of another snapshot)", (long long)part_step, (long long)step);
        if (s != GP_OK)
            return gp_error_wrap(s, "%s: its part %s (written by another process of the run "
                                 "under mpirun) cannot be used; resume from an older "
                                 "snapshot", path, full);
        gp_st_tensor *all = realloc(f->tensors, (size_t)(f->n + part->n) * sizeof *all);
        if (!all) return gp_error_set(GP_ERR_OOM, "out of host memory reading %s", path);
        f->tensors = all;
        for (int i = 0; i < part->n; i++) {
            if (gp_st_find(f, part->tensors[i].name))
                return gp_error_set(GP_ERR_DATA, "%s: tensor '%s' is in two of its parts",
                                    path, part->tensors[i].name);
            f->tensors[f->n] = part->tensors[i];
            f->tensors[f->n].part = q;
            f->tensors[f->n].name = strdup(part->tensors[i].name);
            if (!f->tensors[f->n].name)
                return gp_error_set(GP_ERR_OOM, "out of host memory reading %s", path);
            f->n++;
        }
        p += len;
        if (*p == ',') p++;
    }
    return GP_OK;
}

/* Part q of f read whole and checked; its tensors' data then points into
 * it. */
static gp_status load_part(gp_st_file *f, int q)
{
    gp_st_file whole;
    gp_status s = gp_st_read(f->part_paths[q], &whole);
    if (s == GP_OK) s = gp_st_verify(&whole, true);
    if (s == GP_OK && whole.n != f->parts[q].n)
        s = gp_error_set(GP_ERR_DATA, "%s changed while it was read", f->part_paths[q]);
    if (s != GP_OK) {
        if (whole.image) gp_st_free(&whole);
        return gp_error_wrap(s, "%s: its part %s (written by another process of the run under "
                             "mpirun) cannot be used; resume from an older snapshot", f->source,
                             f->part_paths[q]);
    }
    gp_st_free(&f->parts[q]);
    f->parts[q] = whole;
    for (int i = 0; i < f->n; i++)
        if (f->tensors[i].part == q) {
            const gp_st_tensor *t = gp_st_find(&f->parts[q], f->tensors[i].name);
            if (!t || t->begin != f->tensors[i].begin || t->end != f->tensors[i].end)
                return gp_error_set(GP_ERR_DATA, "%s changed while it was read",
                                    f->part_paths[q]);
            f->tensors[i].data = t->data;
        }
    return GP_OK;
}

/* The tensor `name` of f with its data, its part read if it was not
 * (NULL: no such tensor, for expect() to report). */
static gp_status need(gp_st_file *f, const char *name)
{
    const gp_st_tensor *t = gp_st_find(f, name);
    if (!t || t->data || t->part < 0) return GP_OK;
    return load_part(f, t->part);
}

/* ---- apply ---------------------------------------------------------------- */

/* t's data: as it is, or a lazy tensor's (gp_st_file.fetch) fetched into
 * *tmp, which the caller frees; NULL with s set on a failure, or where
 * there is none (another rank's part). */
static const uint8_t *data_of(const gp_st_file *f, const gp_st_tensor *t, uint8_t **tmp,
                              gp_status *s)
{
    *tmp = NULL;
    *s = GP_OK;
    if (t->data || !f->fetch || t->part >= 0) return t->data;
    size_t bytes = (size_t)(t->end - t->begin);
    *tmp = malloc(bytes ? bytes : 1);
    if (!*tmp) {
        *s = gp_error_set(GP_ERR_OOM, "out of host memory (%zu bytes) reading '%s' of %s", bytes,
                          t->name, f->source);
        return NULL;
    }
    *s = f->fetch(f, (int)(t - f->tensors), *tmp);
    if (*s != GP_OK) {
        free(*tmp);
        *tmp = NULL;
    }
    return *tmp;
}


typedef struct {
    char *s;
    size_t n, cap;
    int count;
} namelist;

static void nl_add(namelist *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void nl_add(namelist *l, const char *fmt, ...)
{
    l->count++;
    if (l->count > 12) return; /* the message lists the first dozen */
    char b[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    size_t k = strlen(b);
    if (l->n + k + 3 > l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 512;
        while (nc < l->n + k + 3) nc *= 2;
        char *ns = realloc(l->s, nc);
        if (!ns) return;
        l->s = ns;
        l->cap = nc;
    }
    l->n += (size_t)snprintf(l->s + l->n, l->cap - l->n, "%s%s", l->n ? ", " : "", b);
}

/* Every tensor name the model expects, sorted once filled, for the names
 * in a file that it does not. */
typedef struct {
    char **v;
    int n, cap;
    bool oom;
} nameset;

static void ns_add(nameset *ns, const char *name)
{
    if (ns->n == ns->cap) {
        int nc = ns->cap ? 2 * ns->cap : 256;
        char **nv = realloc(ns->v, (size_t)nc * sizeof *nv);
        if (!nv) {
            ns->oom = true;
            return;
        }
        ns->v = nv;
        ns->cap = nc;
    }
    char *c = strdup(name);
    if (!c) ns->oom = true;
    else ns->v[ns->n++] = c;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ns_has(const nameset *ns, const char *name)
{
    /* (an empty set: no call, as bsearch and qsort take no NULL array) */
    return ns->n > 0 && bsearch(&name, ns->v, (size_t)ns->n, sizeof *ns->v, cmp_str) != NULL;
}

static void ns_free(nameset *ns)
{
    for (int i = 0; i < ns->n; i++) free(ns->v[i]);
    free(ns->v);
    memset(ns, 0, sizeof *ns);
}

static const char *nl_str(const namelist *l, char *buf, size_t len)
{
    if (l->count > 12)
        snprintf(buf, len, "%s and %d more", l->s ? l->s : "", l->count - 12);
    else snprintf(buf, len, "%s", l->s ? l->s : "");
    return buf;
}

static const char *shape_of(const gp_st_tensor *t, char *b, size_t len)
{
    int off = snprintf(b, len, "%s (", t->dtype_name);
    for (int d = 0; d < t->ndim && off < (int)len - 24; d++)
        off += snprintf(b + off, len - (size_t)off, "%s%lld", d ? ", " : "", (long long)t->dims[d]);
    snprintf(b + off, len - (size_t)off, ")");
    return b;
}

/* Values a model may not be given, found while checking a file: the first
 * one (for the message) and how many in all. */
typedef struct {
    char name[128];             /* the first bad value's tensor */
    int64_t index;              /* its element, row-major */
    int at;                     /* its index in the file's tensors (-1: a part's) */
    float value;
    const char *rule;           /* the rule it breaks */
    int64_t count;              /* bad values in all */
    int tensors;                /* in this many tensors */
} bad_values;

/* Every element of the F32 tensor t must be finite; a running variance's
 * and Adam's second moment's (exp_avg_sq.*) also >= 0.  A NaN here would
 * otherwise train on silently (SGD keeps it), and a running variance < 0
 * gives the square root of a negative number in every evaluation, a
 * negative second moment in every Adam step. */
static void scan_values(const gp_st_tensor *t, const char *name, bad_values *b)
{
    size_t nl = strlen(name), vl = strlen("running_var");
    const char *sign = nl >= vl && !strcmp(name + nl - vl, "running_var") &&
                               (nl == vl || name[nl - vl - 1] == '.')
                           ? "a running variance must be >= 0"
                       : !strncmp(name, "exp_avg_sq.", 11)
                           ? "Adam's second moment (exp_avg_sq) must be >= 0"
                           : NULL; /* the rule for a negative value, if any */
    int64_t n = (int64_t)((t->end - t->begin) / sizeof(float)), here = 0;
    for (int64_t e = 0; e < n; e++) {
        float v;
        /* memcpy: the data section need not be 4-byte aligned in the image */
        memcpy(&v, t->data + (size_t)e * sizeof v, sizeof v);
        if (isfinite(v) && !(sign && v < 0)) continue;
        if (b->count == 0 && here == 0) {
            snprintf(b->name, sizeof b->name, "%s", name);
            b->index = e;
            b->value = v;
            b->rule = isfinite(v) ? sign
                                  : "parameters, buffers and optimizer state must be finite";
        }
        here++;
    }
    if (here) {
        b->count += here;
        b->tensors++;
    }
}

/* scan_values over t, fetched where lazy. */
static gp_status scan_tensor(const gp_st_file *f, const gp_st_tensor *t, const char *name,
                             bad_values *b)
{
    uint8_t *tmp;
    gp_status s;
    const uint8_t *d = data_of(f, t, &tmp, &s);
    if (d) {
        gp_st_tensor v = *t;
        v.data = d;
        bool first = b->count == 0;
        scan_values(&v, name, b);
        if (first && b->count) b->at = t >= f->tensors && t < f->tensors + f->n
                                           ? (int)(t - f->tensors) : -1;
    }
    free(tmp);
    return s;
}

/* t (F32) uploaded into dst, n floats, fetched where lazy. */
/* Elements [lo, lo + n) of the file's tensor t into dst on dev. */
static gp_status upload_range(const gp_st_file *f, const gp_st_tensor *t, gp_device *dev,
                              float *dst, int64_t lo, int64_t n)
{
    uint8_t *tmp;
    gp_status s;
    const uint8_t *d = data_of(f, t, &tmp, &s);
    if (s == GP_OK && n > 0) s = gp_dev_upload(dev, dst, (const float *)d + lo, n);
    if (s == GP_OK) s = gp_dev_synchronize(dev);
    free(tmp);
    return s;
}

static gp_status upload_tensor(const gp_st_file *f, const gp_st_tensor *t, gp_device *dev,
                               float *dst, int64_t n)
{
    uint8_t *tmp;
    gp_status s;
    const uint8_t *d = data_of(f, t, &tmp, &s);
    if (s == GP_OK) s = gp_dev_upload(dev, dst, (const float *)d, n);
    if (s == GP_OK) s = gp_dev_synchronize(dev);
    free(tmp);
    return s;
}

/* The file's optimizer state t into state q of parameter p of layer k:
 * whole, or where each replica keeps its chunk (ZeRO stage 1) each replica
 * of this process its own chunk (processes: this rank's replica's). */
static gp_status upload_state(gp_model *m, const gp_st_file *f, const gp_st_tensor *t, int k,
                              int p, int q)
{
    int64_t lo, hi;
    if (!gp_optim_state_range(m->optim, k, p, &lo, &hi)) {
        gp_tensor *mt = gp_optim_state(m->optim, k, p, q);
        return upload_tensor(f, t, mt->dev, gp_f32(mt), gp_tensor_numel(mt));
    }
    int R = !m->proc_comm && m->n_replicas > 1 ? m->n_replicas : 1;
    for (int r = 0; r < R; r++) {
        gp_model *mr = r ? &m->replicas[r - 1] : m;
        gp_tensor *c = gp_optim_state(mr->optim, k, p, q);
        gp_optim_state_range(mr->optim, k, p, &lo, &hi);
        GP_TRY(upload_range(f, t, c->dev, gp_f32(c), lo, hi - lo));
    }
    return GP_OK;
}

static gp_status bad_values_error(const gp_st_file *f, const bad_values *b)
{
    char val[48], more[96] = "";
    if (isnan(b->value)) snprintf(val, sizeof val, "NaN");
    else if (isinf(b->value)) snprintf(val, sizeof val, "%sInf", b->value < 0 ? "-" : "+");
    else snprintf(val, sizeof val, "%.9g", (double)b->value);
    if (b->count > 1)
        snprintf(more, sizeof more, " (%lld bad values in %d tensor%s)", (long long)b->count,
                 b->tensors, b->tensors == 1 ? "" : "s");
    /* a converted file (a Hugging Face folder, a GPT-2 file): the tensor
     * the user's files have, not gpipe's stacked or transposed one */
    char src[900];
    if (f->where && b->at >= 0 && f->where(f, b->at, b->index, src, sizeof src))
        return gp_error_set(GP_ERR_DATA, "%s: tensor %s is %s (gpipe's '%s'[%lld]): %s; the "
                            "file is corrupt or from a diverged run%s", f->source, src, val,
                            b->name, (long long)b->index, b->rule, more);
    return gp_error_set(GP_ERR_DATA, "%s: tensor '%s'[%lld] is %s: %s; the file is corrupt or "
                        "from a diverged run%s", f->source, b->name, (long long)b->index, val,
                        b->rule, more);
}

/* Check one expected tensor; *out = the file's tensor if it matches. */
static void expect(const gp_st_file *f, const char *name, gp_st_dtype dtype, int ndim,
                   const int64_t *dims, namelist *missing, namelist *bad,
                   const gp_st_tensor **out)
{
    *out = NULL;
    const gp_st_tensor *t = gp_st_find(f, name);
    if (!t) {
        nl_add(missing, "%s", name);
        return;
    }
    bool ok = t->dtype == dtype && t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->dims[d] == dims[d];
    if (!ok) {
        char got[96], want[96];
        gp_st_tensor w = {.dtype = dtype, .ndim = ndim};
        snprintf(w.dtype_name, sizeof w.dtype_name, "%s", dtype == GP_ST_I64 ? "I64" : "F32");
        for (int d = 0; d < ndim; d++) w.dims[d] = dims[d];
        nl_add(bad, "%s: file %s, model %s", name, shape_of(t, got, sizeof got),
               shape_of(&w, want, sizeof want));
        return;
    }
    *out = t;
}

/* Tensor `what` of layer k, as f names it, into name (256 bytes).  gpipe
 * named an add layer's projection shortcut without torchgpipe's "module."
 * ("layer1_0_residual.downsample.0.weight") before 2026-11-26: a name
 * starting "<layer>.module." that f lacks is looked for there without it
 * (snapshots and exports of older versions go on loading); *old counts the
 * names found so, and `first` (512 bytes) says the first. */
static const char *file_name(const gp_st_file *f, char *name, const char *prefix,
                             const gp_model *m, int k, naming nm, const char *what, int *old,
                             char *first)
{
    tensor_name(name, 256, prefix, m, k, nm, what);
    if (strncmp(what, "module.", 7) || gp_st_find(f, name)) return name;
    char was[256];
    tensor_name(was, sizeof was, prefix, m, k, nm, what + 7);
    if (!gp_st_find(f, was)) return name;
    if ((*old)++ == 0) snprintf(first, 512, "'%.250s' as '%.250s'", was, name);
    return memcpy(name, was, sizeof was);
}

/* The names the file uses: the model's own naming, or by layer index (a
 * file from before the layers had names, or made so), which loads too. */
static naming file_naming(gp_model *m, gp_st_file *f)
{
    char name[256];
    naming nm = model_naming(m);
    int k0 = 0;
    while (k0 < m->n_layers && m->layers[k0].n_params == 0) k0++;
    if (nm == NAME_BY_NAME && k0 < m->n_layers) {
        const char *p0 = m->layers[k0].params[0].name;
        if (!gp_st_find(f, tensor_name(name, sizeof name, "", m, k0, nm, p0)) &&
            gp_st_find(f, tensor_name(name, sizeof name, "", m, k0, NAME_BY_INDEX, p0)))
            nm = NAME_BY_INDEX;
    }
    return nm;
}

/* A snapshot resumed: its optimizer's state must be this one's (Adam's
 * moments for Adam, momentum for SGD with momentum); a change the state
 * allows is said. */
static gp_status check_optimizer_state(gp_model *m, gp_st_file *f)
{
    if (m->inference) return GP_OK; /* the weights alone are read (gpipe-sample) */
    bool mom = false, adam = false;
    const char *tag = gp_st_meta(f, "gpipe.optimizer"); /* older snapshots: none */
    if (tag) {
        adam = !strncmp(tag, "adam", 4);
        mom = !strcmp(tag, "sgd+momentum");
    } else { /* from the names (a layer named "exp_avg" would confuse this) */
        for (int i = 0; i < f->n; i++) {
            mom = mom || !strncmp(f->tensors[i].name, "momentum.", 9);
            adam = adam || !strncmp(f->tensors[i].name, "exp_avg.", 8);
        }
    }
    const char *kind = gp_st_meta(f, "gpipe.kind");
    bool snap = kind && !strcmp(kind, "snapshot");
    bool want_adam = gp_optim_options(m->optim)->kind != GP_OPTIM_SGD;
    const char *saved = tag && !strcmp(tag, "adam")    ? "Adam (train.optimizer.type: adam)"
                        : tag && !strcmp(tag, "adamw") ? "AdamW (train.optimizer.type: adamw)"
                        : adam ? "Adam (train.optimizer.type: adam or adamw)"
                        : mom  ? "SGD with momentum (train.optimizer.type: sgd)"
                               : "plain SGD (train.optimizer.type: sgd, momentum: 0)";
    if (snap && want_adam != adam)
        return gp_error_set(GP_ERR_INVALID,
                            "%s %s: it was saved by %s; resume it with that optimizer, or "
                            "start from its weights with %s", f->source,
                            adam ? "holds Adam's state (exp_avg.*, exp_avg_sq.*)"
                                 : "holds no Adam state (missing: exp_avg.*, exp_avg_sq.*)",
                            saved, gp_opt_name(GP_OPT_INIT_FROM));
    if (snap && gp_optim_has_state(m->optim) && !want_adam && !mom)
        return gp_error_set(GP_ERR_INVALID,
                            "%s holds no momentum (missing: momentum.*): it was saved by plain "
                            "SGD (train.optimizer.momentum: 0); resume it with momentum 0, or "
                            "start from its weights with %s",
                            f->source, gp_opt_name(GP_OPT_INIT_FROM));
    /* allowed, but not what the snapshot's run did: say so */
    const char *own = optimizer_tag(m);
    if (snap && tag && strcmp(tag, own))
        GP_WARN("%s was saved by %s and resumes with %s: %s", f->source, tag, own,
                adam ? "the moments carry over, the update rule changes (Adam adds the "
                       "weight decay to the gradient, AdamW decays the weights)"
                     : "its momentum is dropped");
    return GP_OK;
}

/* The file's names do not fit the model: what is missing, mismatched and
 * not in the model, said at once (the lists freed). */
static gp_status names_mismatch(const gp_model *m, const gp_st_file *f, int expected,
                                namelist *missing, namelist *bad, namelist *extra,
                                const char *tie)
{
    char a[2048], b[2048], c[2048];
    const char *types = gp_st_meta(f, "gpipe.layers");
    gp_status s = gp_error_set(
        GP_ERR_INVALID,
        "%s does not fit this model (%d layers, %d tensors expected)%s%s%s%s%s%s%s%s%s%s",
        f->source, m->n_layers, expected, missing->count ? "; missing: " : "",
        missing->count ? nl_str(missing, a, sizeof a) : "",
        bad->count ? "; mismatched: " : "", bad->count ? nl_str(bad, b, sizeof b) : "",
        extra->count ? "; not in the model: " : "",
        extra->count ? nl_str(extra, c, sizeof c) : "",
        types ? ". The file was made from the layers [" : "", types ? types : "",
        types ? "]; check that the config describes that model (model.layers, or the sizes "
                "under model.gpt or model.llama)" : "", tie);
    free(missing->s);
    free(bad->s);
    free(extra->s);
    return s;
}

/* A weight the model ties to another (GPT-2's LM head to wte) that the
 * file holds on its own: the file's model was untied.  Said into hint
 * ("" when there is none). */
static void untied_hint(const gp_model *m, const gp_st_file *f, naming nm, char *hint,
                        size_t len)
{
    char name[256], first_old[512] = "";
    int old = 0;
    hint[0] = '\0';
    for (int k = 0; k < m->n_layers && !hint[0]; k++)
        for (int p = 0; p < m->layers[k].n_params && !hint[0]; p++) {
            const gp_param *pr = &m->layers[k].params[p];
            if (!pr->tied) continue;
            file_name(f, name, "", m, k, nm, pr->name, &old, first_old);
            if (!gp_st_find(f, name)) continue;
            const gp_layer *o = &m->layers[pr->tie_layer];
            snprintf(hint, len, ". %s is tied to %s.%s in this model, but the file holds a "
                     "weight of its own (its model was untied): load it into an untied model "
                     "(model.gpt.tie: false, or no tie: on layer %s)", name, o->spec.name,
                     o->params[pr->tie_param].name, m->layers[k].spec.name);
        }
}

/* Whether the file holds every weight of the model under its name and
 * shape (the optimizer's state aside).  Only then is the state checked: a
 * snapshot of another model is said as that, not as another optimizer's
 * (which sent a user to change the optimizer, to be told then of the
 * model). */
static bool weights_fit(const gp_model *m, const gp_st_file *f, naming nm)
{
    namelist missing = {0}, bad = {0};
    char name[256], first_old[512] = "";
    int old = 0;
    for (int k = 0; k < m->n_layers; k++)
        for (int p = 0; p < m->layers[k].n_params; p++) {
            const gp_param *pr = &m->layers[k].params[p];
            const gp_st_tensor *t;
            if (pr->tied) continue;
            file_name(f, name, "", m, k, nm, pr->name, &old, first_old);
            expect(f, name, GP_ST_F32, pr->value.ndim, pr->value.dims, &missing, &bad, &t);
        }
    bool fit = !missing.count && !bad.count;
    free(missing.s);
    free(bad.s);
    return fit;
}

/* Whether state tensor mt of parameter p of layer k is this process's to
 * check and upload, and (*part) whether it holds a replica's chunk alone
 * (ZeRO stage 1: the file holds the whole, shaped as the parameter).
 * Where the parameter is this process's and the state sharded over its
 * replicas (threads of this process), replica 0's chunk of a tensor
 * smaller than the replicas is empty (no memory) while the others' are
 * not: theirs are uploaded too (they were left at zero, and the resumed
 * run went another way).  (Under mpirun each rank loads its own chunk.) */
static bool state_ours(const gp_model *m, int k, int p, const gp_param *pr, const gp_tensor *mt,
                       bool *part)
{
    int64_t lo, hi;
    *part = gp_optim_state_range(m->optim, k, p, &lo, &hi);
    bool threads = !m->proc_comm && m->n_replicas > 1;
    return gp_tensor_mem(mt) || (*part && threads && gp_tensor_mem(&pr->value));
}

gp_status gp_snapshot_apply(gp_model *m, gp_st_file *f, bool optimizer)
{
    /* Pass 1 checks every name and value; pass 2 uploads.  So a failed
     * load leaves the model as it was. */
    gp_gate_wait(m->gate); /* a snapshot's copy of the state, first */
    namelist missing = {0}, bad = {0}, extra = {0};
    bad_values values = {0};
    char name[256], first_old[512] = "";
    int expected = 0, old = 0;
    /* The model's own naming; a file by layer index loads too. */
    naming nm = file_naming(m, f);
    /* the state checked where the weights fit (another model said as that: weights_fit) */
    if (optimizer && !weights_fit(m, f, nm)) optimizer = false;
    if (optimizer) GP_TRY(check_optimizer_state(m, f));
    /* every name the model expects, for the names in the file it does not */
    nameset known = {0};
    gp_status fs = GP_OK; /* a lazy tensor's read (gp_st_file.fetch) */
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < m->n_layers; k++) {
            gp_layer *l = &m->layers[k];
            for (int p = 0; p < l->n_params; p++) {
                gp_param *pr = &l->params[p];
                const gp_st_tensor *t;
                if (pr->tied) continue; /* its owner's entry; gp_model_tie_sync below */
                file_name(f, name, "", m, k, nm, pr->name, &old, first_old);
                if (pass == 0 && gp_tensor_mem(&pr->value)) GP_TRY(need(f, name)); /* this process's */
                expect(f, name, GP_ST_F32, pr->value.ndim, pr->value.dims, &missing, &bad, &t);
                if (pass == 0) {
                    expected++;
                    ns_add(&known, name);
                }
                if (pass == 0 && t && (t->data || f->fetch) && fs == GP_OK) /* (read: ours) */
                    fs = scan_tensor(f, t, name, &values);
                if (pass == 1 && gp_tensor_mem(&pr->value)) /* processes: not another rank's */
                    GP_TRY(upload_tensor(f, t, pr->value.dev, gp_f32(&pr->value),
                                         gp_tensor_numel(&pr->value)));
                if (!optimizer || pr->is_buffer) continue;
                gp_tensor *mt; /* its optimizer states (none for plain SGD) */
                for (int q = 0; (mt = gp_optim_state(m->optim, k, p, q)); q++) {
                    char pre[24];
                    file_name(f, name, state_prefix(m, q, pre, sizeof pre), m, k, nm, pr->name,
                              &old, first_old);
                    bool part, ours = state_ours(m, k, p, pr, mt, &part);
                    if (pass == 0 && ours) GP_TRY(need(f, name));
                    const gp_tensor *shape = part ? &pr->value : mt;
                    expect(f, name, GP_ST_F32, shape->ndim, shape->dims, &missing, &bad, &t);
                    if (pass == 0) {
                        expected++;
                        ns_add(&known, name);
                    }
                    if (pass == 0 && t && (t->data || f->fetch) && fs == GP_OK)
                        fs = scan_tensor(f, t, name, &values);
                    if (pass == 1 && ours) GP_TRY(upload_state(m, f, t, k, p, q));
                }
            }
            const char *cn[MAX_COUNTERS];
            int64_t *cv[MAX_COUNTERS];
            int nc = gp_layer_counters(l, cn, cv, MAX_COUNTERS);
            GP_ASSERT(nc <= MAX_COUNTERS);
            for (int c = 0; c < nc; c++) {
                const gp_st_tensor *t;
                file_name(f, name, "", m, k, nm, cn[c], &old, first_old);
                if (pass == 0 && !l->meta) GP_TRY(need(f, name));
                expect(f, name, GP_ST_I64, 0, NULL, &missing, &bad, &t);
                if (pass == 0) {
                    expected++;
                    ns_add(&known, name);
                    int64_t v = 0;
                    if (t && t->data) memcpy(&v, t->data, sizeof v);
                    if (v < 0 || v > ((int64_t)1 << 48)) /* a count of steps */
                        nl_add(&bad, "%s: %lld, not a count (0 .. 2^48)", name, (long long)v);
                }
                if (pass == 1 && !l->meta) /* little-endian host */
                    memcpy(cv[c], t->data, sizeof(int64_t));
            }
        }
        if (pass == 1) break;
        if (fs != GP_OK) {
            ns_free(&known);
            free(missing.s);
            free(bad.s);
            return fs;
        }
        /* Names in the file the model does not have. */
        if (known.oom) {
            ns_free(&known);
            free(missing.s);
            free(bad.s);
            return gp_error_set(GP_ERR_OOM, "out of host memory checking %s", f->source);
        }
        if (known.n > 0) qsort(known.v, (size_t)known.n, sizeof *known.v, cmp_str);
        for (int i = 0; i < f->n; i++) {
            const char *tn = f->tensors[i].name;
            if (is_state_name(tn) && (!optimizer || !gp_optim_has_state(m->optim)))
                continue; /* (a snapshot with momentum resumed as plain SGD: dropped) */
            if (!ns_has(&known, tn)) nl_add(&extra, "%s", tn);
        }
        ns_free(&known);
        if (missing.count || bad.count || extra.count) {
            char tie[700];
            untied_hint(m, f, nm, tie, sizeof tie);
            return names_mismatch(m, f, expected, &missing, &bad, &extra, tie);
        }
        /* The names fit (a mismatch is the message that helps most); now
         * the values. */
        if (values.count) return bad_values_error(f, &values);
    }
    free(missing.s);
    free(bad.s);
    free(extra.s);
    if (old) /* (counted in both passes) */
        GP_INFO("%s names %d tensor(s) of projection shortcuts as gpipe did before 2026-11-26, "
                "without torchgpipe's 'module.': loaded by their old names (%s, ...); weights "
                "exported and snapshots saved from now on have torchgpipe's names", f->source,
                old / 2, first_old);
    return gp_model_tie_sync(m); /* tied replicas: their owners, as loaded */
}

/* ---- snapshot files ------------------------------------------------------------ */

static bool meta_int(const gp_st_file *f, const char *key, int64_t *v)
{
    const char *s = gp_st_meta(f, key);
    if (!s || !*s) return false;
    char *e;
    errno = 0;
    long long x = strtoll(s, &e, 10);
    if (errno || *e) return false;
    *v = x;
    return true;
}

gp_status gp_snapshot_open(const char *path, gp_st_file *f, gp_snapshot_pos *pos)
{
    GP_TRY(gp_st_read(path, f));
    gp_status s = GP_OK;
    const char *kind = gp_st_meta(f, "gpipe.kind");
    int64_t ver = 0;
    /* one rank's part of a snapshot in processes ("S.parts/rankR.safetensors")
     * carries no gpipe.kind: S is what resumes */
    const char *parts = strstr(path, PARTS_SUFFIX "/rank");
    if (!kind && parts)
        s = gp_error_set(GP_ERR_DATA, "%s: one rank's part of snapshot %.*s.safetensors, not a "
                         "snapshot itself: resume that file (it reads its parts)", path,
                         (int)(parts - path), path);
    else if (!kind || strcmp(kind, "snapshot"))
        s = gp_error_set(GP_ERR_DATA, "%s: not a gpipe snapshot (%s); to start from a weights "
                         "file use %s", path,
                         kind ? "it holds weights only" : "no gpipe.kind in its metadata",
                         gp_opt_name(GP_OPT_INIT_FROM));
    else if (!meta_int(f, "gpipe.format_version", &ver) || ver != GP_SNAPSHOT_FORMAT_VERSION)
        s = gp_error_set(GP_ERR_DATA, "%s: snapshot format version %s, this gpipe reads %d",
                         path, gp_st_meta(f, "gpipe.format_version") ?
                         gp_st_meta(f, "gpipe.format_version") : "(none)",
                         GP_SNAPSHOT_FORMAT_VERSION);
    if (s == GP_OK) s = gp_st_verify(f, true);
    if (s == GP_OK) s = attach_parts(path, f);
    if (s == GP_OK && (!meta_int(f, "gpipe.step", &pos->step) ||
                       !meta_int(f, "gpipe.epoch", &pos->epoch) ||
                       !meta_int(f, "gpipe.batch", &pos->batch) ||
                       !meta_int(f, "gpipe.batch_size", &pos->batch_size) || pos->step < 0 ||
                       pos->epoch < 0 || pos->batch < 0 || pos->batch_size < 1 ||
                       /* bounds that keep the arithmetic on them in 64 bits
                        * (a file from before gpipe.header_crc32 is not checked) */
                       pos->step > ((int64_t)1 << 48) || pos->epoch > ((int64_t)1 << 40) ||
                       pos->batch > ((int64_t)1 << 40) || pos->batch_size > (1 << 24)))
        s = gp_error_set(GP_ERR_DATA, "%s: the snapshot's position (gpipe.step, epoch, batch, "
                         "batch_size) is missing or malformed", path);
    /* the schedule's place (absent before 2026-12-01 and from gp_run_save) */
    const char *lr = s == GP_OK ? gp_st_meta(f, "gpipe.lr_next") : NULL;
    char *end = NULL;
    pos->lr = lr ? strtod(lr, &end) : 0;
    if (!lr || end == lr || *end || !meta_int(f, "gpipe.total_steps", &pos->total) ||
        pos->total < 1 || !isfinite(pos->lr))
        pos->total = 0;
    if (s != GP_OK) gp_st_free(f);
    return s;
}

void gp_snapshot_path(const char *dir, int64_t step, char *path, size_t len)
{
    snprintf(path, len, "%s/" SNAP_PREFIX "%09lld" SNAP_SUFFIX, dir, (long long)step);
}

/* Step of a snapshot file name, -1 if the name is not one. */
static int64_t snap_step(const char *name)
{
    size_t pl = strlen(SNAP_PREFIX), sl = strlen(SNAP_SUFFIX), n = strlen(name);
    if (n <= pl + sl || strncmp(name, SNAP_PREFIX, pl) || strcmp(name + n - sl, SNAP_SUFFIX))
        return -1;
    int64_t v = 0;
    for (size_t i = pl; i < n - sl; i++) {
        if (name[i] < '0' || name[i] > '9' || v > INT64_MAX / 10 - 9) return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

/* Steps of the snapshot files in dir, newest first.  Only reads: what
 * deletes or moves files is done under the directory's lock. */
static int list_steps(const char *dir, int64_t **steps)
{
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = snap_step(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *ns = realloc(*steps, (size_t)cap * sizeof *ns);
            if (!ns) break;
            *steps = ns;
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort, newest first */
        for (int k = i; k > 0 && (*steps)[k] > (*steps)[k - 1]; k--) {
            int64_t t = (*steps)[k];
            (*steps)[k] = (*steps)[k - 1];
            (*steps)[k - 1] = t;
        }
    return n;
}

int gp_snapshot_count(const char *dir)
{
    int64_t *steps;
    int n = list_steps(dir, &steps);
    free(steps);
    return n;
}

gp_status gp_snapshot_resume_check(const char *resume, const char *dir)
{
    struct stat st;
    if (!resume) return GP_OK;
    if (!strcmp(resume, "latest")) {
        if (stat(dir, &st) != 0)
            return gp_error_set(GP_ERR_IO, "%s: train.snapshot.dir '%s' does not exist (%s); "
                                "give the directory the earlier run wrote its snapshots to "
                                "(%s train.snapshot.dir=DIR)", gp_opt_name(GP_OPT_RESUME_LATEST),
                                dir, strerror(errno), gp_opt_name(GP_OPT_SET));
        return GP_OK;
    }
    if (stat(resume, &st) == 0 && S_ISDIR(st.st_mode)) {
        char given[1200];
        return gp_error_set(GP_ERR_INVALID, "%s is a directory; give a snapshot file, or "
                            "resume the newest one in it with %s and train.snapshot.dir=%s in "
                            "the config",
                            gp_opt_value(GP_OPT_RESUME, resume, given, sizeof given),
                            gp_opt_name(GP_OPT_RESUME_LATEST), resume);
    }
    /* a missing file said now, not after balance: auto's profile (minutes
     * on a large model) and the data's loading */
    if (stat(resume, &st) != 0)
        return gp_error_set(GP_ERR_IO, "%s: cannot open '%s': %s", gp_opt_name(GP_OPT_RESUME),
                            resume, strerror(errno));
    return GP_OK;
}

gp_status gp_snapshot_latest(const char *dir, char *path, size_t len)
{
    int64_t *steps;
    int n = list_steps(dir, &steps);
    for (int i = 0; i < n; i++) {
        gp_snapshot_path(dir, steps[i], path, len);
        gp_st_file f;
        gp_snapshot_pos pos;
        if (gp_snapshot_open(path, &f, &pos) == GP_OK) {
            gp_st_free(&f);
            free(steps);
            return GP_OK;
        }
        GP_WARN("skipping a snapshot that does not verify: %s", gp_error_message());
    }
    free(steps);
    return gp_error_set(GP_ERR_IO, "no complete snapshot in '%s'%s", dir,
                        n ? " (every one there failed to load; the warnings above say why: "
                            "a missing part file or another format version can be put "
                            "right, and the run then resumes; a damaged file cannot, and "
                            "the run starts again without resuming, into an empty "
                            "train.snapshot.dir, the damaged files left there to look at)" :
                            "; nothing to resume (a run takes snapshots with "
                            "train.snapshot.every_steps or every_minutes, and one stopped "
                            "before its first leaves none: start it again without resuming)");
}

/* ---- the directory lock ------------------------------------------------ */

#define LOCK_NAME ".gpipe.lock"
#define LOCK_INFO_MAX 400

/* A run's snapshot writer: the host copies of the newest snapshot (kept
 * from one snapshot to the next) and the thread that writes them.  The
 * thread that drives the run starts a write and waits for it; the writer
 * thread only reads w and dir and sets status and msg, which the driving
 * thread reads after pthread_join.  `finished` is set by the writer last
 * (release), so a poll that sees it joins without waiting. */
struct snap_writer {
    gp_st_writer w;             /* the snapshot being written, or the last one's buffers */
    snap_copies copies;         /* deferred: the model's tensors into w's buffers, first */
    gp_gate *gate;              /* deferred: the model's, opened once they are copied */
    long slow_copy_ms;          /* tests: the deferred copy first sleeps this long
                                   (GPIPE_SNAPSHOT_SLOW_COPY_MS), so that the next
                                   step reaches its update before it is made */
    pthread_t thread;
    bool in_flight;             /* started, not joined */
    atomic_bool finished;       /* the writer thread is done with it */
    int64_t step;
    int keep;
    char dir[1024];
    char path[1100];
    gp_status status;           /* the write's; msg its message */
    char msg[2048];
};

struct gp_snapshot_lock {
    int fd;                     /* the lock file, flock()ed until released; -1 where the
                                 * file system has no locks (warned) */
    char dir[1024];
    char made[1024];            /* the outermost directory this run created for
                                   dir ("" if dir existed): removed again if the run
                                   ends without a snapshot in it */
    struct snap_writer *bg;     /* the run's writer thread (gp_snapshot_save_async), made
                                   at its first snapshot; NULL before */
};

/* The outermost missing ancestor of dir (dir itself if only it is
 * missing), or "" if dir exists. */
static void first_missing(const char *dir, char *out, size_t len)
{
    struct stat st;
    out[0] = '\0';
    if (stat(dir, &st) == 0 || strlen(dir) >= len) return;
    snprintf(out, len, "%s", dir);
    for (;;) {
        char *slash = strrchr(out, '/');
        if (!slash || slash == out) return;
        *slash = '\0';
        if (stat(out, &st) == 0) {
            *slash = '/';
            return;
        }
    }
}

/* Wait a little: the holder writes its line right after taking the lock. */
static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* The holder's line ("pid 4242 on host h, started ..."), printable, in buf;
 * false if the file is empty. */
static bool read_holder(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);
    if (n <= 0) return false;
    buf[n] = '\0';
    for (char *p = buf; *p; p++) {
        if (*p == '\n') {
            *p = '\0';
            break;
        }
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
    }
    return buf[0] != '\0';
}

/* Delete what writers that died left: ".snapshot-*.safetensors.tmp.<pid>".
 * Only under the lock, where no other writer can be at work. */
static void remove_temporaries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "." SNAP_PREFIX, strlen(SNAP_PREFIX) + 1) ||
            !strstr(e->d_name, SNAP_SUFFIX ".tmp."))
            continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) == 0) removed++;
        else GP_WARN("cannot delete %s, left by a run that was stopped: %s", p, strerror(errno));
    }
    closedir(d);
    /* parts whose snapshot file was never written (processes) */
    d = opendir(dir);
    while (d && (e = readdir(d))) {
        size_t nl = strlen(e->d_name), sl = strlen(PARTS_SUFFIX);
        if (strncmp(e->d_name, SNAP_PREFIX, strlen(SNAP_PREFIX)) || nl <= sl ||
            strcmp(e->d_name + nl - sl, PARTS_SUFFIX))
            continue;
        char snap[1400], pdir[1400];
        snprintf(pdir, sizeof pdir, "%s/%s", dir, e->d_name);
        snprintf(snap, sizeof snap, "%s/%.*s" SNAP_SUFFIX, dir, (int)(nl - sl), e->d_name);
        if (access(snap, F_OK) == 0) continue;
        removed += remove_parts(pdir); /* (a file of that name is not a run's: left) */
    }
    if (d) closedir(d);
    if (removed)
        GP_INFO("removed %d unfinished snapshot file%s in '%s' left by a run that was stopped "
                "while writing", removed, removed == 1 ? "" : "s", dir);
}

gp_status gp_snapshot_lock_dir(const char *dir, gp_snapshot_lock **out)
{
    *out = NULL;
    gp_snapshot_lock *l = calloc(1, sizeof *l);
    if (!l) return gp_error_set(GP_ERR_OOM, "out of host memory");
    l->fd = -1;
    char path[1100];
    if (strlen(dir) >= sizeof l->dir) {
        free(l);
        return gp_error_set(GP_ERR_INVALID, "path too long: '%.80s...'", dir);
    }
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
    /* O_CLOEXEC: a program this one starts must not hold the lock on. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(l);
        return gp_error_set(GP_ERR_IO, "cannot open the lock file '%s': %s; check that the "
                            "snapshot directory is writable", path, strerror(e));
    }
    /* Retry a little: the holder may have just taken the lock and not yet
     * written its line, or be releasing it (it empties the file first). */
    char holder[LOCK_INFO_MAX] = "";
    bool locked = false, no_locks = false;
    for (int tries = 0; tries < 50 && !locked; tries++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            locked = true;
            break;
        }
        int e = errno;
        if (e == EINTR) continue;
        if (e != EWOULDBLOCK) {
            if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS) {
                no_locks = true;
                GP_WARN("cannot lock '%s' (%s): this file system has no flock(); a second run "
                        "on '%s' would not be stopped", path, strerror(e), dir);
                break;
            }
            close(fd);
            free(l);
            return gp_error_set(GP_ERR_IO, "cannot lock '%s': %s", path, strerror(e));
        }
        if (read_holder(fd, holder, sizeof holder)) break;
        nap_ms(20);
    }
    if (!locked && !no_locks) {
        if (!holder[0]) snprintf(holder, sizeof holder, "it has not written its pid to " LOCK_NAME);
        close(fd);
        free(l);
        return gp_error_set(GP_ERR_IO, "the snapshot directory '%s' is in use by another run "
                            "(%s); two runs on one directory would delete each other's "
                            "snapshots. Wait for it to end, or set train.snapshot.dir to "
                            "another directory", dir, holder);
    }
    if (locked) {
        char host[256] = "?", when[64] = "?";
        if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
        host[sizeof host - 1] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %z", &tm);
        char line[LOCK_INFO_MAX];
        int n = snprintf(line, sizeof line, "pid %ld on host %.64s, started %s\n",
                         (long)getpid(), host, when);
        /* Only for the message of a run that finds the lock taken. */
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
            GP_WARN("cannot write to %s: %s (a second run's message will not name this one)",
                    path, strerror(errno));
        l->fd = fd;
        /* Under the lock no other writer is at work: a temporary file
         * here is a dead one's.  Without a lock that cannot be known. */
        remove_temporaries(dir);
    } else {
        close(fd);
    }
    *out = l;
    return GP_OK;
}

gp_status gp_snapshot_lock_run(const gp_config *cfg, const char *resume, gp_snapshot_lock **out)
{
    *out = NULL;
    if (gp_procs_rank() != 0) return GP_OK; /* processes: rank 0 holds it and writes */
    const gp_snapshot_config *sc = &cfg->train.snapshot;
    char made[1024] = "";
    if (sc->every_steps > 0 || sc->every_minutes > 0) {
        first_missing(sc->dir, made, sizeof made);
        GP_TRY(gp_make_dirs(sc->dir, "snapshot directory"));
    } else {
        struct stat st;
        /* Not writing snapshots: only `--resume latest` reads the directory,
         * and one that does not exist has nothing to lock (nor to resume:
         * gp_snapshot_prepare says so).  A run that only reads needs no
         * lock where it cannot take one (a read-only copy of a directory). */
        if (!resume || strcmp(resume, "latest") || stat(sc->dir, &st) != 0 ||
            access(sc->dir, W_OK) != 0)
            return GP_OK;
    }
    gp_status s = gp_snapshot_lock_dir(sc->dir, out);
    if (s == GP_OK) snprintf((*out)->made, sizeof (*out)->made, "%s", made);
    return s;
}

/* Remove the directories this run made for a snapshot dir it never wrote
 * to: dir holds nothing but the lock file. */
static void unmake_dir(const gp_snapshot_lock *l)
{
    if (!l->made[0]) return;
    DIR *d = opendir(l->dir);
    if (!d) return;
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d)) != NULL;)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                !strcmp(e->d_name, LOCK_NAME);
    closedir(d);
    if (!empty) return;
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", l->dir, LOCK_NAME);
    unlink(p);
    snprintf(p, sizeof p, "%s", l->dir);
    for (;;) { /* dir, then its parents up to the outermost one made */
        if (rmdir(p) != 0) return;
        if (!strcmp(p, l->made)) return;
        char *slash = strrchr(p, '/');
        if (!slash) return;
        *slash = '\0';
    }
}

void gp_snapshot_lock_release(gp_snapshot_lock *l)
{
    if (!l) return;
    if (l->bg) { /* a run that ends on another error: its snapshot in flight is written
                  * first, and a failure of it is said, not lost */
        if (gp_snapshot_wait(l, false) != GP_OK) GP_WARN("%s", gp_error_message());
        gp_st_writer_free(&l->bg->w);
        free(l->bg->copies.items);
        free(l->bg);
    }
    if (l->fd >= 0) {
        /* Empty it first, so a stale pid is never reported (the kernel
         * drops the lock of a process that dies, not the line). */
        if (ftruncate(l->fd, 0) != 0) GP_DEBUG("cannot empty the lock file: %s", strerror(errno));
        unmake_dir(l); /* still holding the lock: nobody else is in there */
        close(l->fd);
    }
    free(l);
}

/* Write w as the snapshot of `step` at path (in dir), then prune the older
 * ones beyond `keep`: the write of gp_snapshot_save, in the thread that
 * calls it or in a run's writer thread (gp_snapshot_save_async).  s: how
 * gathering w went (a failure is said as the write's). */
static gp_status write_and_prune(gp_status s, gp_st_writer *w, const char *dir, int keep,
                                 int64_t step, const char *path)
{
    /* what is there to resume from, listed before the write: the failure
     * may be one of too many open files, which listing would meet too */
    int64_t *before, newest = -1;
    errno = 0;
    int n_before = list_steps(dir, &before);
    int unlisted = n_before == 0 ? errno : 0; /* (opendir's) */
    for (int i = 0; i < n_before && newest < 0; i++)
        if (before[i] < step) newest = before[i];
    free(before);
    if (s == GP_OK) s = gp_st_write_atomic(w, path);
    int e = errno;
    if (s != GP_OK) { /* say what is still there to resume from */
        char *why = strdup(gp_error_message());
        char tail[1300] = "";
        if (newest >= 0) {
            char np[1100];
            gp_snapshot_path(dir, newest, np, sizeof np);
            snprintf(tail, sizeof tail, "; the newest snapshot there, of step %lld, is as it "
                     "was (%s)", (long long)newest, np);
        } else if (unlisted) {
            snprintf(tail, sizeof tail, "; the snapshots there could not be listed (%s)",
                     strerror(unlisted));
        } else {
            snprintf(tail, sizeof tail, "; no earlier snapshot is there");
        }
        /* (the disk full: the snapshots there are what a user can free) */
        if (s == GP_ERR_IO && (e == ENOSPC || e == EDQUOT) && newest >= 0)
            snprintf(tail + strlen(tail), sizeof tail - strlen(tail), "; older snapshots can "
                     "go (a run prunes them only after its next snapshot is written)");
        gp_error_set(s, "snapshot at step %lld: %s%s", (long long)step,
                     why ? why : "out of host memory", tail);
        free(why);
        return s;
    }
    /* Only now that the new one is complete: drop the older ones beyond
     * `keep`, with their parts.  Snapshots of later steps are not counted or
     * touched (there are none: gp_snapshot_prepare moved those of a resumed
     * run aside). */
    int64_t *steps;
    int n = list_steps(dir, &steps), kept = 1;
    for (int i = 0; i < n; i++) {
        if (steps[i] >= step) continue;
        if (kept < keep) {
            kept++;
            continue;
        }
        char old[1100], oldp[1100];
        gp_snapshot_path(dir, steps[i], old, sizeof old);
        if (unlink(old) != 0) GP_WARN("cannot delete old snapshot %s: %s", old, strerror(errno));
        parts_dir(dir, steps[i], oldp, sizeof oldp);
        remove_parts(oldp);
    }
    free(steps);
    GP_DEBUG("snapshot %s", path);
    return GP_OK;
}

/* ---- saving ------------------------------------------------------------------ */

gp_status gp_snapshot_save(gp_model *m, const gp_config *cfg, const gp_snapshot_pos *pos,
                           const gp_snapshot_lock *lock)
{
    const gp_snapshot_config *sc = &cfg->train.snapshot;
    GP_TRY(gp_snapshot_wait(lock, false)); /* the one in flight (of an earlier step) first */
    int me = m->local_device >= 0 ? gp_procs_rank() : 0;
    int N = m->local_device >= 0 ? gp_procs_size() : 1;
    char path[1100], pdir[1100];
    gp_snapshot_path(sc->dir, pos->step, path, sizeof path);
    parts_dir(sc->dir, pos->step, pdir, sizeof pdir);
    gp_st_writer w = {0};
    gp_status s = GP_OK;
    /* processes with replicas: the momentum's chunks from every replica,
     * on every rank; replica 0's ranks (0 .. n - 1) then write (a sharded
     * optimizer's, ZeRO stage 1: the other replicas' ranks send their
     * chunks to them as they write, add_state_chunks) */
    if (m->proc_comm) s = gp_model_gather_momentum(m);
    if (me >= m->n_devices && m->local_device >= 0) {
        if (s == GP_OK && gp_optim_shards(m->optim, NULL) > 1) s = send_state_chunks(m);
        int bad = s != GP_OK;
        gp_status as = gp_procs_max_int(&bad);
        return s != GP_OK ? s : as;
    }
    if (me > 0) { /* processes: this rank's part, then say how it went */
        char part[1300];
        snprintf(part, sizeof part, "%s/rank%d" SNAP_SUFFIX, pdir, me);
        if (s == GP_OK) s = gp_make_dirs(pdir, "snapshot parts directory");
        if (s == GP_OK) { /* the parts directory's own entry durable too */
            int dfd = open(sc->dir, O_RDONLY);
            if (dfd >= 0) {
                fsync(dfd);
                close(dfd);
            }
        }
        if (s == GP_OK) s = collect(m, cfg, pos, &w, false, NULL);
        if (s == GP_OK) s = gp_st_write_atomic(&w, part);
        gp_st_writer_free(&w);
        /* (the rank is named where the failure is said) */
        if (s != GP_OK) gp_error_wrap(s, "snapshot at step %lld", (long long)pos->step);
        int bad = s != GP_OK;
        gp_status as = gp_procs_max_int(&bad);
        if (s == GP_OK) s = as;
        return s;
    }
    /* Pruning below deletes files: only the run that owns the directory. */
    GP_ASSERT(lock && !strcmp(lock->dir, sc->dir));
    if (s == GP_OK) s = gp_make_dirs(sc->dir, "snapshot directory");
    /* (assembled before the ranks agree: a sharded optimizer's chunks
     * arrive from the other replicas' ranks meanwhile) */
    if (s == GP_OK) s = collect(m, cfg, pos, &w, N == 1, NULL);
    if (N > 1) { /* every other part durable before the file that makes the snapshot */
        int bad = 0;
        gp_status as = gp_procs_max_int(&bad);
        if (s == GP_OK) s = as;
        if (s == GP_OK && bad)
            s = gp_error_set(GP_ERR_IO, "another rank could not write its part (its message "
                             "says why); no snapshot was made");
    }
    if (s == GP_OK && N > 1 && m->n_devices > 1) {
        char list[4096];
        int off = 0;
        const char *base = strrchr(pdir, '/') + 1;
        for (int r = 1; r < m->n_devices && off < (int)sizeof list - 1; r++) /* replica 0's */
            off += snprintf(list + off, sizeof list - (size_t)off, "%s%s/rank%d" SNAP_SUFFIX,
                            r > 1 ? "," : "", base, r);
        if (off >= (int)sizeof list - 1)
            s = gp_error_set(GP_ERR_INVALID, "too many processes (%d) to name their parts", N);
        else s = gp_st_writer_meta(&w, PARTS_KEY, list);
    }
    s = write_and_prune(s, &w, sc->dir, sc->keep, pos->step, path);
    gp_st_writer_free(&w);
    return s;
}

/* ---- in the background ------------------------------------------------------- */


/* The deferred copies off the devices, each 4 MiB chunk's CRC-32 taken
 * while it is still in the cache (the file's checksum without a pass of
 * its own over the data: gp_st_writer.crc), then the model's gate open:
 * its next commit and update may write what they read. */
static void copy_state(struct snap_writer *bg)
{
    if (!bg->gate) return;
    if (bg->slow_copy_ms > 0)
        nanosleep(&(struct timespec){bg->slow_copy_ms / 1000, bg->slow_copy_ms % 1000 * 1000000L},
                  NULL);
    const size_t chunk = (size_t)4 << 20;
    gp_st_writer *w = &bg->w;
    uint32_t crc = 0;
    int k = 0; /* the copies are in the order of the tensors they fill */
    for (int i = 0; i < w->n; i++) {
        uint8_t *dst = (uint8_t *)w->tensors[i].data;
        size_t bytes = (size_t)(w->tensors[i].end - w->tensors[i].begin);
        const snap_copy *c = k < bg->copies.n && bg->copies.items[k].dst == dst
                                 ? &bg->copies.items[k++] : NULL;
        GP_ASSERT(!c || c->bytes == bytes);
        for (size_t off = 0; off < bytes; off += chunk) {
            size_t n = bytes - off < chunk ? bytes - off : chunk;
            if (c) memcpy(dst + off, (const uint8_t *)c->src + off, n);
            crc = gp_st_crc(crc, dst + off, n);
        }
    }
    GP_ASSERT(k == bg->copies.n);
    w->crc = crc;
    w->crc_known = true;
    bg->copies.n = 0;
    gp_gate_open(bg->gate);
    bg->gate = NULL; /* (the model's: not touched again) */
}

static void *writer_main(void *arg)
{
    struct snap_writer *bg = arg;
    copy_state(bg);
    bg->status = write_and_prune(GP_OK, &bg->w, bg->dir, bg->keep, bg->step, bg->path);
    if (bg->status != GP_OK) snprintf(bg->msg, sizeof bg->msg, "%s", gp_error_message());
    atomic_store_explicit(&bg->finished, true, memory_order_release);
    return NULL;
}

int64_t gp_snapshot_in_flight(const gp_snapshot_lock *lock, char *path, size_t len)
{
    if (!lock || !lock->bg || !lock->bg->in_flight) return -1;
    if (path) snprintf(path, len, "%s", lock->bg->path);
    return lock->bg->step;
}

gp_status gp_snapshot_wait(const gp_snapshot_lock *lock, bool say)
{
    struct snap_writer *bg = lock ? lock->bg : NULL;
    if (!bg || !bg->in_flight) return GP_OK;
    if (say && !atomic_load_explicit(&bg->finished, memory_order_acquire))
        GP_INFO("waiting for the snapshot of step %lld to be written (%s)", (long long)bg->step,
                bg->path);
    pthread_join(bg->thread, NULL);
    bg->in_flight = false;
    if (bg->status == GP_OK) return GP_OK;
    return gp_error_set(bg->status, "the snapshot of step %lld (%s), written in the "
                        "background, failed: %s", (long long)bg->step, bg->path, bg->msg);
}

gp_status gp_snapshot_poll(const gp_snapshot_lock *lock)
{
    struct snap_writer *bg = lock ? lock->bg : NULL;
    if (!bg || !bg->in_flight || !atomic_load_explicit(&bg->finished, memory_order_acquire))
        return GP_OK;
    return gp_snapshot_wait(lock, false);
}

/* Whether a snapshot in the background may copy m's state on its writer
 * thread, after the step: every device's memory is the host's (CPU
 * devices), one process, no replicas (whose updates and momentum
 * gathering have no gate). */
static bool can_defer(const gp_model *m)
{
    if (m->local_device >= 0 || m->n_replicas > 1 || m->n_devices < 1) return false;
    for (int j = 0; j < m->n_devices; j++)
        if (!m->devs[j] || m->devs[j]->kind != GP_DEV_CPU) return false;
    return true;
}

gp_status gp_snapshot_save_async(gp_model *m, const gp_config *cfg, const gp_snapshot_pos *pos,
                                 gp_snapshot_lock *lock)
{
    /* processes: the parts, then the file that names them, agreed between
     * the ranks as gp_snapshot_save does, in the foreground */
    if (!lock || (m->local_device >= 0 && gp_procs_size() > 1))
        return gp_snapshot_save(m, cfg, pos, lock);
    const gp_snapshot_config *sc = &cfg->train.snapshot;
    GP_ASSERT(!strcmp(lock->dir, sc->dir));
    GP_TRY(gp_snapshot_wait(lock, false)); /* at most one write in flight */
    if (!lock->bg) {
        lock->bg = calloc(1, sizeof *lock->bg);
        if (!lock->bg) return gp_error_set(GP_ERR_OOM, "out of host memory for a snapshot");
    }
    struct snap_writer *bg = lock->bg;
    gp_st_writer_reuse(&bg->w);
    bg->step = pos->step;
    bg->keep = sc->keep;
    snprintf(bg->dir, sizeof bg->dir, "%s", sc->dir);
    gp_snapshot_path(sc->dir, pos->step, bg->path, sizeof bg->path);
    gp_status s = gp_make_dirs(sc->dir, "snapshot directory");
    /* The copy off the devices: here, or (deferred) on the writer thread
     * while the next step's forward and backward run, its commit and
     * update held at the model's gate until it is made. */
    bg->copies.n = 0;
    bg->gate = s == GP_OK && can_defer(m) ? gp_model_gate(m) : NULL;
    for (int j = 0; bg->gate && s == GP_OK && j < m->n_devices; j++)
        s = gp_dev_synchronize(m->devs[j]); /* (the step's last writes done) */
    if (s == GP_OK) s = collect(m, cfg, pos, &bg->w, true, bg->gate ? &bg->copies : NULL);
    if (s != GP_OK) {
        bg->gate = NULL;
        return write_and_prune(s, &bg->w, bg->dir, bg->keep, bg->step, bg->path);
    }
    if (bg->gate) {
        GP_DEBUG("snapshot of step %lld: %d tensors copied in the background",
                 (long long)pos->step, bg->copies.n);
        int64_t slow = 0; /* a test hook, read on the way to the writer's thread,
                           * which has no error path: a bad value is warned of */
        if (gp_env_int("GPIPE_SNAPSHOT_SLOW_COPY_MS", 0, 0, 3600000, &slow) != GP_OK) {
            GP_WARN("%s; no pause", gp_last_error());
            gp_error_clear();
        }
        bg->slow_copy_ms = slow;
        gp_gate_close(bg->gate);
    }
    atomic_store(&bg->finished, false);
    bg->status = GP_OK;
    bg->msg[0] = '\0';
    int e = pthread_create(&bg->thread, NULL, writer_main, bg);
    if (e != 0) { /* no thread: written here, as before */
        GP_DEBUG("no snapshot writer thread (%s): writing in the foreground", strerror(e));
        copy_state(bg);
        return write_and_prune(GP_OK, &bg->w, bg->dir, bg->keep, bg->step, bg->path);
    }
    bg->in_flight = true;
    return GP_OK;
}

gp_status gp_snapshot_hf_config(void *resume, const char *init_from, const char *dir,
                                char **text, char *from, size_t from_len)
{
    *text = NULL;
    const char *r = resume;
    if (!r || !*r) return GP_OK;
    char path[4200];
    if (!strcmp(r, "latest")) {
        if (gp_snapshot_latest(dir, path, sizeof path) != GP_OK) { /* none: nothing kept */
            gp_error_clear();
            return GP_OK;
        }
    } else {
        snprintf(path, sizeof path, "%s", r);
    }
    gp_st_file f; /* the header: the resume reads and verifies the whole */
    GP_TRY(gp_st_read_header(path, &f));
    const char *t = gp_st_meta(&f, "gpipe.hf_config"), *of = gp_st_meta(&f, "gpipe.hf_config_of");
    gp_status s = GP_OK;
    if (t && *t && of && !strcmp(of, init_from)) {
        *text = strdup(t);
        if (!*text) s = gp_error_set(GP_ERR_OOM, "out of host memory");
        snprintf(from, from_len, "%s", path);
    }
    gp_st_free(&f);
    return s;
}

gp_status gp_snapshot_read_config(const char *path, const char *const *overrides, int n_overrides,
                             gp_config *out)
{
    memset(out, 0, sizeof *out);
    gp_st_file f;
    gp_snapshot_pos pos;
    GP_TRY(gp_snapshot_open(path, &f, &pos));
    const char *text = gp_st_meta(&f, "gpipe.config");
    const char *ov = gp_st_meta(&f, "gpipe.overrides");
    const char *cpath = gp_st_meta(&f, "gpipe.config_path");
    if (!text || !*text) {
        gp_st_free(&f);
        return gp_error_set(GP_ERR_DATA, "%s: the snapshot holds no config text; give the "
                                         "config file as well", path);
    }
    /* its own overrides, one per line, then the caller's */
    int n_own = 0;
    for (const char *p = ov; p && *p; p++) n_own += *p == '\n';
    char *ovcopy = strdup(ov ? ov : "");
    const char **all = calloc((size_t)(n_own + n_overrides + 1), sizeof *all);
    if (!ovcopy || !all) {
        free(ovcopy);
        free(all);
        gp_st_free(&f);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    int k = 0;
    for (char *p = ovcopy; *p;) {
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = '\0';
        all[k++] = p;
        p = nl + 1;
    }
    for (int i = 0; i < n_overrides; i++) all[k++] = overrides[i];
    char name[600];
    snprintf(name, sizeof name, "%s", cpath && *cpath ? cpath : path);
    gp_config_sources src = {.hf_config = gp_snapshot_hf_config, .ctx = (void *)path};
    gp_status s = gp_config_parse_with(name, text, strlen(text), all, k, &src, out);
    free(all);
    free(ovcopy);
    gp_st_free(&f);
    if (s != GP_OK) gp_error_wrap(s, "the config stored in %s", path);
    return s;
}

gp_status gp_snapshot_export(gp_model *m, const gp_config *cfg, const char *path)
{
    /* processes: every other rank sends its tensors to rank 0 */
    if (m->local_device >= 0 && gp_procs_rank() != 0)
        return gp_snapshot_collect(m, cfg, NULL, NULL);
    gp_st_writer w = {0};
    gp_status s = gp_snapshot_collect(m, cfg, NULL, &w);
    if (s == GP_OK) s = gp_st_write_atomic(&w, path);
    gp_st_writer_free(&w);
    if (s != GP_OK) gp_error_wrap(s, "exporting weights");
    return s;
}

gp_status gp_gpt_export(gp_model *m, const gp_config *cfg, const char *path,
                        gp_weights_format fmt)
{
    if (fmt == GP_WEIGHTS_GPIPE) return gp_snapshot_export(m, cfg, path);
    gp_wmodel v = gp_model_weights(m);
    if ((fmt == GP_WEIGHTS_HF || fmt == GP_WEIGHTS_HF_BF16) && gp_llama_is_model(&v)) {
        gp_status ls = gp_llama_export(&v, path, fmt == GP_WEIGHTS_HF_BF16, cfg->model.init_from,
                                       cfg->model.hf_config);
        if (ls != GP_OK) gp_error_wrap(ls, "exporting weights to %s", path);
        return ls;
    }
    /* processes: every other rank sends its tensors to rank 0 */
    if (m->local_device >= 0 && gp_procs_rank() != 0)
        return gp_snapshot_collect(m, cfg, NULL, NULL);
    gp_st_writer w = {0};
    gp_st_file g = {0};
    gp_status s = gp_snapshot_collect(m, cfg, NULL, &w);
    if (s == GP_OK) s = gp_st_writer_to_file(&w, path, &g);
    gp_st_writer_free(&w);
    if (s == GP_OK) s = gp_gpt_write(&v, &g, path, fmt);
    gp_st_free(&g);
    if (s != GP_OK) gp_error_wrap(s, "exporting weights to %s", path);
    return s;
}

gp_status gp_snapshot_init_from(gp_model *m, const char *path)
{
    gp_st_file f;
    bool converted = true; /* GPT-2's weights from Hugging Face or llm.c, a Llama's from HF */
    /* a Hugging Face folder of another model than a Llama (GPT-2's
     * save_pretrained): its model.safetensors */
    char file[1100];
    struct stat st;
    gp_wmodel v = gp_model_weights(m);
    gp_status s = GP_OK;
    if (!gp_llama_is_model(&v) && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        s = gp_gpt_check_config(&v, path); /* (its config.json, as a Llama's is checked) */
        snprintf(file, sizeof file, "%s/model.safetensors", path);
        path = file;
    }
    if (s == GP_OK)
        s = gp_llama_is_hf(path) ? gp_llama_read(&v, path, &f)
                                 : gp_gpt_read(&v, path, &f, &converted);
    else
        memset(&f, 0, sizeof f);
    if (s == GP_OK && !converted) s = gp_st_verify(&f, false);
    if (s == GP_OK && !converted) s = attach_parts(path, &f); /* a run in processes' */
    if (s == GP_OK) s = gp_snapshot_apply(m, &f, false);
    gp_st_free(&f);
    if (s != GP_OK) return gp_error_wrap(s, "%s", gp_opt_name(GP_OPT_INIT_FROM));
    return GP_OK;
}

/* Whether a layer of m keeps batch-norm running statistics: its buffers
 * (batch norm's, a composite's children's included, are the only ones). */
static bool has_batch_norm(const gp_model *m)
{
    for (int k = 0; k < m->n_layers; k++)
        if (gp_layer_buffer_count(&m->layers[k]) > 0) return true;
    return false;
}

/* Item `k` of a list of items separated by `sep` ("" past its end), into
 * buf. */
static const char *list_item(const char *list, char sep, int k, char *buf, size_t len)
{
    for (; k > 0 && list; k--) {
        list = strchr(list, sep);
        if (list) list++;
    }
    const char *end = list ? strchr(list, sep) : NULL;
    snprintf(buf, len, "%.*s", list ? (end ? (int)(end - list) : (int)strlen(list)) : 0,
             list ? list : "");
    return buf;
}

static int list_count(const char *list, char sep)
{
    if (!*list) return 0;
    int n = 1;
    for (; *list; list++) n += *list == sep;
    return n;
}

/* A changed parameter-free layer (relu -> leaky_relu, one added or taken
 * away) or a layer's option (a dropout's p) loads the same tensors and
 * goes on with another model: say so, naming the first difference, as for
 * a changed seed.  Snapshots before gpipe.layer_options have no options to
 * compare. */
static void warn_changed_layers(const gp_model *m, const gp_st_file *f, const char *path)
{
    const char *was = gp_st_meta(f, "gpipe.layers");
    char now[2048], a[256], b[256], where[400];
    layer_types(m, now, sizeof now);
    if (was && strcmp(was, now)) {
        int n_was = list_count(was, ','), k = 0;
        while (!strcmp(list_item(was, ',', k, a, sizeof a), list_item(now, ',', k, b, sizeof b)))
            k++;
        if (k < m->n_layers)
            gp_layer_describe(&m->layers[k], where, sizeof where);
        else
            snprintf(where, sizeof where, "layer %d", k);
        GP_WARN("%s was made with other layers (%d, this run has %d): %s: %s%s here, %s%s in the "
                "snapshot's run. Its weights now train another model; put model.layers back as "
                "they were to go on with the same one",
                path, n_was, m->n_layers, where, b[0] ? "a " : "none", b,
                a[0] ? "a " : "none", a);
        return;
    }
    const char *was_opts = gp_st_meta(f, "gpipe.layer_options");
    if (!was_opts) return;
    char opts[8192];
    int64_t version = 1;
    (void)meta_int(f, "gpipe.layer_options_version", &version);
    layer_options(m, (int)version, opts, sizeof opts);
    if (!strcmp(was_opts, opts)) return;
    int k = 0;
    while (!strcmp(list_item(was_opts, ';', k, a, sizeof a),
                   list_item(opts, ';', k, b, sizeof b)))
        k++;
    int layer = atoi(b[0] ? b : a);
    if (layer >= 0 && layer < m->n_layers)
        gp_layer_describe(&m->layers[layer], where, sizeof where);
    else
        snprintf(where, sizeof where, "layer %d", layer);
    const char *bo = strchr(strchr(b, ' ') ? strchr(b, ' ') + 1 : b, ' ');
    const char *ao = strchr(strchr(a, ' ') ? strchr(a, ' ') + 1 : a, ' ');
    GP_WARN("%s was made with other layer options: %s has %s, the snapshot's run had %s: "
            "the snapshot's weights now train another model; put the option back to go on "
            "with the same one",
            path, where, bo ? bo + 1 : "(none)", ao ? ao + 1 : "(none)");
}

gp_status gp_snapshot_restore(gp_model *m, const gp_config *cfg, const char *path, bool quiet,
                              gp_snapshot_pos *pos, bool *positioned)
{
    gp_st_file f;
    GP_TRY(gp_snapshot_open(path, &f, pos));
    gp_status s = gp_snapshot_apply(m, &f, true);
    const char *seed = gp_st_meta(&f, "gpipe.seed");
    char mine[32];
    snprintf(mine, sizeof mine, "%llu", (unsigned long long)cfg->train.seed);
    if (s == GP_OK && seed && strcmp(seed, mine))
        GP_WARN("%s was made with train.seed = %s, this run has %s: the data order and dropout "
                "masks from here on differ from the original run's", path, seed, mine);
    if (s == GP_OK) warn_changed_layers(m, &f, path);
    /* another model.input: the same tensors (a Transformer's context T
     * shapes none of them), another model and other samples per position */
    const char *was_in = gp_st_meta(&f, "gpipe.input"); /* (absent before 2026-12-01) */
    char now_in[96];
    input_str(cfg, now_in, sizeof now_in);
    if (s == GP_OK && was_in && strcmp(was_in, now_in))
        GP_WARN("%s was made with model.input [%s], this run has [%s]: the snapshot's weights "
                "now train on samples of another shape (the data's position in its epoch, "
                "and a Transformer's context, no longer the original run's); put model.input "
                "back to go on with the same one", path, was_in, now_in);
    const char *init = gp_st_meta(&f, "gpipe.init_from"); /* (absent before 2026-12-01) */
    /* (one file however spelt: ./w.safetensors is w.safetensors) */
    if (s == GP_OK && init && cfg->model.init_from[0] && strcmp(init, cfg->model.init_from) &&
        !gp_same_file(init, cfg->model.init_from))
        GP_WARN("model.init_from (%s) is not read: %s goes on from the weights of its run, "
                "which started from %s; to start from %s, run afresh with another "
                "train.snapshot.dir", cfg->model.init_from, path,
                init[0] ? init : "fresh random weights", cfg->model.init_from);
    int64_t dev = 0, chunks = 0, reps = 1;
    int my_reps = gp_pipeline_replicas(&cfg->pipeline);
    (void)meta_int(&f, "gpipe.replicas", &reps); /* (absent before 2026-11-25: 1 assumed) */
    if (s == GP_OK && !quiet && meta_int(&f, "gpipe.devices", &dev) &&
        meta_int(&f, "gpipe.chunks", &chunks) &&
        (dev != cfg->pipeline.n_devices || chunks != cfg->pipeline.chunks || reps != my_reps)) {
        char was[64] = "", now[64] = "";
        if (reps > 1) snprintf(was, sizeof was, " x %lld replicas", (long long)reps);
        if (my_reps > 1) snprintf(now, sizeof now, " x %d replicas", my_reps);
        GP_INFO("resuming a snapshot of %lld device(s)%s, %lld chunk(s) on %d device(s)%s, %d "
                "chunk(s): numerically equivalent, not bit for bit the original run",
                (long long)dev, was, (long long)chunks, cfg->pipeline.n_devices, now,
                cfg->pipeline.chunks);
        /* Batch norm normalises each micro-batch with its own statistics:
         * split another number of ways, a step computes another function,
         * which is more than rounding. */
        int64_t was_mb = chunks * reps, now_mb = (int64_t)cfg->pipeline.chunks * my_reps;
        if (was_mb != now_mb && has_batch_norm(m))
            GP_WARN("batch norm normalised micro-batches of about %lld samples in the original "
                    "run (%lld chunk(s) x %lld replica(s)) and now of about %lld: training goes "
                    "on along another path, not only in rounding; give pipeline.chunks x "
                    "pipeline.replicas = %lld to keep them",
                    (long long)(cfg->train.batch_size / was_mb), (long long)chunks,
                    (long long)reps, (long long)(cfg->train.batch_size / now_mb),
                    (long long)was_mb);
    }
    const char *by = gp_st_meta(&f, SAVED_BY_KEY);
    if (positioned) *positioned = !by || strcmp(by, SAVED_BY_LIBRARY);
    gp_st_free(&f);
    if (s != GP_OK) return s;
    m->step = pos->step;
    /* replicas already stepped hold the old state: replica 0's to all */
    return gp_model_sync_replicas(m);
}

gp_status gp_snapshot_save_file(gp_model *m, const gp_config *cfg, const char *path)
{
    gp_snapshot_pos pos = {.step = m->step, .batch_size = cfg->train.batch_size};
    gp_st_writer w = {0};
    gp_status s = gp_snapshot_collect(m, cfg, &pos, &w);
    if (s == GP_OK) s = gp_st_writer_meta(&w, SAVED_BY_KEY, SAVED_BY_LIBRARY);
    if (s == GP_OK) s = gp_st_write_atomic(&w, path);
    gp_st_writer_free(&w);
    return s;
}

/* Move the snapshots of steps after `step` in the locked directory into a
 * new subdirectory "abandoned-<local time>", so that `--resume latest` can
 * only find this run's.  Renames within one file system: nothing is copied,
 * nothing is lost. */
static gp_status move_later_aside(const gp_snapshot_lock *lock, int64_t step)
{
    int64_t *steps;
    int n = list_steps(lock->dir, &steps), later = 0;
    while (later < n && steps[later] > step) later++; /* newest first */
    if (later == 0) {
        free(steps);
        return GP_OK;
    }
    char sub[1200], stamp[32] = "0";
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm)) strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    int made = -1, e = 0;
    for (int k = 1; k < 100 && made != 0; k++) {
        if (k == 1) snprintf(sub, sizeof sub, "%s/abandoned-%s", lock->dir, stamp);
        else snprintf(sub, sizeof sub, "%s/abandoned-%s-%d", lock->dir, stamp, k);
        made = mkdir(sub, 0755);
        e = errno;
        if (made != 0 && e != EEXIST) break;
    }
    if (made != 0) {
        free(steps);
        return gp_error_set(GP_ERR_IO, "cannot create '%s' to move the snapshots after step "
                            "%lld aside: %s", sub, (long long)step, strerror(e));
    }
    for (int i = 0; i < later; i++) {
        char from[1100], to[1300];
        gp_snapshot_path(lock->dir, steps[i], from, sizeof from);
        snprintf(to, sizeof to, "%s/%s", sub, strrchr(from, '/') + 1);
        if (rename(from, to) != 0) {
            e = errno;
            free(steps);
            return gp_error_set(GP_ERR_IO, "cannot move %s to %s: %s; move the snapshots after "
                                "step %lld out of '%s' by hand, then resume again", from, sub,
                                strerror(e), (long long)step, lock->dir);
        }
        parts_dir(lock->dir, steps[i], from, sizeof from); /* and its parts, if any */
        snprintf(to, sizeof to, "%s/%s", sub, strrchr(from, '/') + 1);
        if (rename(from, to) != 0 && errno != ENOENT)
            GP_WARN("cannot move %s to %s: %s", from, sub, strerror(errno));
    }
    int dfd = open(lock->dir, O_RDONLY);
    if (dfd >= 0) {
        fsync(dfd); /* the renames are durable from here */
        close(dfd);
    }
    char which[64];
    if (later == 1) snprintf(which, sizeof which, "step %lld", (long long)steps[0]);
    else snprintf(which, sizeof which, "steps %lld to %lld", (long long)steps[later - 1],
                  (long long)steps[0]);
    GP_INFO("moved %d later snapshot%s (%s) to %s/ so that %s goes on with this run from "
            "step %lld; delete that directory once you do not need them", later,
            later == 1 ? "" : "s", which, sub, gp_opt_name(GP_OPT_RESUME_LATEST),
            (long long)step);
    free(steps);
    return GP_OK;
}

gp_status gp_snapshot_fresh_check(const gp_config *cfg, const char *resume)
{
    const gp_train_config *tc = &cfg->train;
    bool snapping = tc->snapshot.every_steps > 0 || tc->snapshot.every_minutes > 0;
    if (!snapping || gp_snapshot_count(tc->snapshot.dir) == 0) return GP_OK;
    /* a snapshot resumed from another folder: this one's are another
     * run's, which this run's pruning (train.snapshot.keep) would delete
     * and whose later ones it would move aside, without a word */
    struct stat rs;
    if (resume && strcmp(resume, "latest") && stat(resume, &rs) == 0 && S_ISREG(rs.st_mode) &&
        !gp_path_in_dir(resume, tc->snapshot.dir)) /* (what is no file is refused when read) */
        return gp_error_set(GP_ERR_INVALID,
                            "'%s' holds snapshots of another run than %s, which lies outside "
                            "it: this run's snapshots would mix with them, and pruning would "
                            "delete them; set train.snapshot.dir to another directory (or "
                            "move %s into '%s' to go on with that folder's run)",
                            tc->snapshot.dir, resume, resume, tc->snapshot.dir);
    if (resume) return GP_OK;
    if (cfg->model.init_from[0]) /* a fine-tune: resuming would not read init_from */
        return gp_error_set(GP_ERR_INVALID,
                            "'%s' already holds snapshots of an earlier run; to start from "
                            "model.init_from (%s), set train.snapshot.dir to another directory "
                            "(%s would go on from those snapshots' weights, not init_from's)",
                            tc->snapshot.dir, cfg->model.init_from,
                            gp_opt_name(GP_OPT_RESUME_LATEST));
    return gp_error_set(GP_ERR_INVALID,
                        "'%s' already holds snapshots of an earlier run; continue it with %s, "
                        "or set train.snapshot.dir to another directory (a fresh run would mix "
                        "with them)", tc->snapshot.dir, gp_opt_name(GP_OPT_RESUME_LATEST));
}

gp_status gp_snapshot_prepare(gp_model *m, const gp_config *cfg, const char *resume,
                              int64_t per_epoch, const gp_snapshot_lock *lock, bool quiet,
                              gp_snapshot_pos *pos)
{
    const gp_train_config *tc = &cfg->train;
    memset(pos, 0, sizeof *pos);
    pos->batch_size = tc->batch_size;
    bool snapping = tc->snapshot.every_steps > 0 || tc->snapshot.every_minutes > 0;
    GP_TRY(gp_snapshot_fresh_check(cfg, resume));
    if (!resume) {
        if (cfg->model.init_from[0]) {
            GP_TRY(gp_snapshot_init_from(m, cfg->model.init_from));
            if (!quiet) GP_INFO("initial weights from %s", cfg->model.init_from);
        }
        return GP_OK;
    }
    char path[1100];
    if (!strcmp(resume, "latest")) GP_TRY(gp_snapshot_latest(tc->snapshot.dir, path, sizeof path));
    else snprintf(path, sizeof path, "%s", resume);
    gp_snapshot_pos sp;
    bool positioned;
    gp_status s = gp_snapshot_restore(m, cfg, path, quiet, &sp, &positioned);
    if (s != GP_OK) return gp_error_wrap(s, "%s", gp_opt_name(GP_OPT_RESUME));
    if (!positioned)
        GP_WARN("%s was saved by gp_run_save, which records no data position: this run's data "
                "starts at epoch 1's first batch", path);
    *pos = sp;
    pos->batch_size = tc->batch_size;
    /* the metrics record a full disk kept from its file (the header alone:
     * the restore has freed the file) */
    pos->metrics = NULL;
    gp_st_file hdr;
    if (gp_st_read_header(path, &hdr) == GP_OK) {
        const char *rec = gp_st_meta(&hdr, "gpipe.metrics_record");
        if (rec) pos->metrics = strdup(rec);
        gp_st_free(&hdr);
    }
    if (sp.batch_size != tc->batch_size) {
        /* Go on from the batch that holds the first sample not yet seen in
         * this epoch (the samples before it in that batch are seen again). */
        int64_t seen = sp.batch * sp.batch_size;
        pos->batch = seen / tc->batch_size;
        int64_t again = seen - pos->batch * tc->batch_size;
        char twice[96] = "";
        if (again > 0)
            snprintf(twice, sizeof twice, " (its first %lld sample%s, seen before the snapshot, "
                     "again)", (long long)again, again == 1 ? "" : "s");
        GP_WARN("%s was made with train.batch_size = %lld, this run has %lld: going on from "
                "epoch %lld, batch %lld%s", path, (long long)sp.batch_size,
                (long long)tc->batch_size, (long long)pos->epoch + 1, (long long)pos->batch,
                twice);
    }
    if (pos->batch >= per_epoch) {
        pos->epoch++;
        pos->batch = 0;
    }
    if (!quiet)
        GP_INFO("resuming from %s: step %lld, epoch %lld, batch %lld", path, (long long)sp.step,
                (long long)pos->epoch + 1, (long long)pos->batch);
    /* This run's snapshots go into the directory: later ones of the run it
     * resumed from an earlier point would mix with them, be taken for the
     * newest by the next --resume latest, and be overwritten step by step.
     * A run that will train nothing (resumed at or past its last step)
     * writes none, and leaves them where they are.  (per_epoch is the
     * loader's: until 2026-12-01 it was rounded up here, and a position at
     * an epoch's last batch that a new pipeline.chunks drops was not
     * carried to the next epoch; the loader refused it.) */
    int64_t total = gp_train_total_steps(tc, per_epoch);
    if (snapping && gp_procs_rank() == 0 && sp.step < total) { /* processes: the writer */
        GP_ASSERT(lock && !strcmp(lock->dir, tc->snapshot.dir));
        GP_TRY(move_later_aside(lock, sp.step));
    }
    return GP_OK;
}
