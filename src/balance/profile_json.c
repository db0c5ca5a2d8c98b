/*
 * profile_json.c — a profile to and from JSON (balance.h), through the
 * JSON reader and writer of core/json.h.
 *
 * Unknown keys are ignored so that later versions can add fields; missing
 * required ones are an error naming the key.
 *
 * Version 2 (version 1 had no model identity) records the model it was
 * taken of: "input" [C, H, W], "model_hash" (16 hex digits) and per layer
 * "spec" (gp_profile_layer_spec).  A loaded profile's hash must match its
 * own input and specs; whether they match a config is for the caller
 * (gp_profile_check_model).  An older version is refused, with how to
 * make a new one.
 */
#include "balance/balance.h"
#include "balance/balance_impl.h"
#include "core/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PROFILE_FORMAT "gpipe-profile"
#define PROFILE_VERSION 2

/* ---- writer ---------------------------------------------------------------- */

/* A measurement that came out NaN or infinite is saved as 0, as it always
 * was: the file stays loadable and the planner sees a free layer rather
 * than failing on a profile that --profile-out just wrote. */
static void put_time(gp_json_writer *w, const char *key, double v)
{
    gp_json_put_num(w, key, isfinite(v) ? v : 0.0);
}

static void put_time_list(gp_json_writer *w, const char *key, const double *v, int n)
{
    gp_json_open_array(w, key);
    for (int z = 0; z < n; z++) put_time(w, NULL, v[z]);
    gp_json_close(w);
}

static void put_profile(gp_json_writer *w, const gp_profile *p)
{
    gp_json_open_object(w, NULL);
    gp_json_put_str(w, "format", PROFILE_FORMAT);
    gp_json_put_int(w, "version", PROFILE_VERSION);
    gp_json_open_array(w, "input");
    for (int d = 0; d < 3; d++) gp_json_put_int(w, NULL, p->input[d]);
    gp_json_close(w);
    char hash[24];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)p->model_hash);
    gp_json_put_str(w, "model_hash", hash);
    gp_json_put_str(w, "device", p->device);
    gp_json_put_int(w, "threads", p->threads);
    gp_json_put_int(w, "contend", p->contend);
    gp_json_put_int(w, "evict_bytes", p->evict_bytes);
    gp_json_put_int(w, "batch", p->batch);
    gp_json_put_int(w, "chunks", p->chunks);
    gp_json_put_int(w, "first_trainable", p->first_trainable);
    if (p->n_skips) { /* [[from, to], ...]; absent: none */
        gp_json_open_array(w, "skips");
        for (int t = 0; t < p->n_skips; t++) {
            gp_json_open_array(w, NULL);
            gp_json_put_int(w, NULL, p->skips[t].from);
            gp_json_put_int(w, NULL, p->skips[t].to);
            gp_json_close(w);
        }
        gp_json_close(w);
    }
    gp_json_put_bool(w, "timed", p->timed);
    if (p->precision >= 0)
        gp_json_put_str(w, "precision", gp_precision_name((gp_precision)p->precision));
    if (p->optim_slots >= 0) gp_json_put_int(w, "optim_slots", p->optim_slots);
    gp_json_put_int(w, "warmup", p->warmup);
    gp_json_put_int(w, "reps", p->reps);
    gp_json_open_array(w, "sizes");
    for (int z = 0; z < p->n_sizes; z++) gp_json_put_int(w, NULL, p->sizes[z]);
    gp_json_close(w);
    put_time_list(w, "loss", p->loss, p->n_sizes);
    put_time_list(w, "upload", p->upload, p->n_sizes);
    gp_json_open_array(w, "layers");
    for (int k = 0; k < p->L; k++) {
        const gp_layer_mem *m = &p->mem[k];
        gp_json_open_object(w, NULL);
        gp_json_put_str(w, "desc", m->desc);
        gp_json_put_str(w, "spec", m->spec);
        gp_json_put_uint(w, "param_bytes", m->param_bytes);
        gp_json_put_uint(w, "grad_bytes", m->grad_bytes);
        gp_json_put_uint(w, "optim_bytes", m->optim_bytes);
        gp_json_put_uint(w, "workspace_bytes", m->workspace_bytes);
        put_time(w, "in_per_sample", m->in_per_sample);
        put_time(w, "out_per_sample", m->out_per_sample);
        put_time(w, "keep_per_sample", m->keep_per_sample);
        gp_json_put_bool(w, "inplace", m->inplace);
        gp_json_put_bool(w, "unkept", m->unkept);
        gp_json_put_bool(w, "fused", m->fused);
        gp_json_put_bool(w, "end_unread", m->end_unread);
        gp_json_put_bool(w, "in_unread", m->in_unread);
        if (m->x_chain) gp_json_put_int(w, "x_chain_from", m->x_from);
        if (m->y_chain) gp_json_put_int(w, "y_chain_to", m->y_to);
        put_time(w, "flops_per_sample", m->flops_per_sample);
        put_time(w, "update", m->update);
        gp_json_open_array(w, "times");
        for (int z = 0; z < p->n_sizes; z++) {
            const gp_layer_times *t = &p->t[(size_t)z * (size_t)p->L + (size_t)k];
            gp_json_open_object(w, NULL);
            put_time(w, "fwd", t->fwd);
            put_time(w, "bwd_data", t->bwd_data);
            put_time(w, "bwd_weights", t->bwd_weights);
            put_time(w, "bwd_alone", t->bwd_alone);
            put_time(w, "recompute", t->recompute);
            put_time(w, "copy", t->copy);
            gp_json_close(w);
        }
        gp_json_close(w);
        gp_json_close(w);
    }
    gp_json_close(w);
    gp_json_close(w);
    gp_json_put_raw(w, "\n");
}

gp_status gp_profile_save(const gp_profile *p, const char *path)
{
    /* the top level and each layer on a line of its own */
    gp_json_writer w = {.pretty = 2};
    put_profile(&w, p);
    if (w.oom) {
        gp_json_writer_free(&w);
        return gp_error_set(GP_ERR_OOM, "out of host memory writing profile '%s'", path);
    }
    /* whole or not at all: a full disk leaves an older profile there as it
     * was (it was written in place, and left torn) */
    gp_atomic_file a;
    gp_status s = gp_atomic_open(path, &a);
    if (s == GP_OK) {
        bool ok = gp_json_flush(&w, a.f);
        s = gp_atomic_commit(&a, ok ? 0 : errno ? errno : EIO);
    }
    gp_json_writer_free(&w);
    if (s != GP_OK) gp_error_wrap(s, "profile");
    return s;
}

/* ---- reader ---------------------------------------------------------------- */

/* The first error of a load; later look-ups do nothing once it is set. */
typedef struct {
    const char *path;
    gp_status st;
} jctx;

/* A number (true and false count as 1 and 0), or NAN for anything else. */
static double num_of(const gp_json_value *v)
{
    if (!v) return NAN;
    if (v->kind == GP_JSON_NUMBER) return v->num;
    if (v->kind == GP_JSON_TRUE || v->kind == GP_JSON_FALSE) return v->kind == GP_JSON_TRUE;
    return NAN;
}

static double jnum_req(jctx *c, const gp_json_value *o, const char *key, const char *where)
{
    const gp_json_value *v = gp_json_get(o, key);
    if (c->st != GP_OK) return 0;
    if (isnan(num_of(v))) {
        c->st = gp_error_set(GP_ERR_DATA, "profile '%s': %s%s\"%s\" is missing or not a number; "
                             "re-create the profile with gpipe-balance --profile-out",
                             c->path, where, where[0] ? ": " : "", key);
        return 0;
    }
    return num_of(v);
}

/* jnum_req for an amount (bytes, seconds, FLOPs): finite, 0 .. 1e18, so
 * that the casts and sums of the memory model stay defined. */
static double jnum_amount(jctx *c, const gp_json_value *o, const char *key, const char *where)
{
    double v = jnum_req(c, o, key, where);
    if (c->st == GP_OK && !(v >= 0 && v <= 1e18))
        c->st = gp_error_set(GP_ERR_DATA, "profile '%s': %s%s\"%s\" is %g, not an amount "
                             "(0 .. 1e18); re-create the profile with gpipe-balance "
                             "--profile-out", c->path, where, where[0] ? ": " : "", key, v);
    return c->st == GP_OK ? v : 0;
}

/* v as a count: a whole number in [lo, hi], checked before the cast (1e300
 * cast to an integer is undefined; issue 77: a cached profile's "batch":
 * 1e300 became a batch of -2^63 in every later run).  The error names
 * where, key and, for a list item (z >= 0), its index; 0 after an error. */
static int64_t jwhole(jctx *c, double v, int64_t lo, int64_t hi, const char *where,
                      const char *key, int z)
{
    if (c->st == GP_OK && !(v == floor(v) && v >= (double)lo && v <= (double)hi)) {
        char item[16] = "";
        if (z >= 0) snprintf(item, sizeof item, "[%d]", z);
        c->st = gp_error_set(GP_ERR_DATA, "profile '%s': %s%s\"%s\"%s is %g, not a whole number "
                             "from %lld to %lld; re-create the profile with gpipe-balance "
                             "--profile-out", c->path, where, where[0] ? ": " : "", key, item, v,
                             (long long)lo, (long long)hi);
    }
    return c->st == GP_OK ? (int64_t)v : 0;
}

/* jnum_req for a count: a whole number in [lo, hi]. */
static int64_t jint_req(jctx *c, const gp_json_value *o, const char *key, int64_t lo, int64_t hi,
                        const char *where)
{
    double v = jnum_req(c, o, key, where);
    return jwhole(c, v, lo, hi, where, key, -1);
}

/* A list (of n items unless n < 0). */
static const gp_json_value *jarr_req(jctx *c, const gp_json_value *o, const char *key, int n,
                                     const char *where)
{
    const gp_json_value *v = gp_json_get(o, key);
    if (c->st != GP_OK) return NULL;
    if (!v || v->kind != GP_JSON_ARRAY || (n >= 0 && v->n != n)) {
        c->st = gp_error_set(GP_ERR_DATA, "profile '%s': %s%s\"%s\" is missing or not a list%s",
                             c->path, where, where[0] ? ": " : "", key,
                             n >= 0 ? " of the right length" : "");
        return NULL;
    }
    return v;
}

/* Item z of a list of numbers. */
static double jitem_req(jctx *c, const gp_json_value *list, int z, const char *key)
{
    double v = num_of(&list->items[z]);
    if (c->st == GP_OK && isnan(v))
        c->st = gp_error_set(GP_ERR_DATA, "profile '%s': \"%s\"[%d] is not a number; re-create "
                             "the profile with gpipe-balance --profile-out", c->path, key, z);
    return c->st == GP_OK ? v : 0;
}

/* A list item that is a whole number in [lo, hi]; 0 after an error. */
static int64_t jitem_int(jctx *c, const gp_json_value *list, int z, const char *key, int64_t lo,
                         int64_t hi)
{
    double v = jitem_req(c, list, z, key);
    return jwhole(c, v, lo, hi, "", key, z);
}

gp_status gp_profile_load(const char *path, gp_profile *out)
{
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    /* (a profile is about a kilobyte a layer: 1 GiB is a million layers) */
    int rr = gp_read_regular(path, (size_t)1 << 30, &buf, &len);
    if (rr > 0)
        return gp_error_set(GP_ERR_DATA, "profile '%s' is more than 1 GiB: is it a profile?",
                            path);
    if (rr < 0)
        return gp_error_set(errno == ENOMEM ? GP_ERR_OOM : GP_ERR_IO, "cannot read profile "
                            "'%s': %s", path, gp_open_strerror(errno));
    gp_json_reader r;
    gp_json_value *root = gp_json_parse(buf, len, &r);
    int line = 0, column = 0;
    if (!root) gp_json_where(&r, r.err_at, &line, &column); /* it reads buf */
    free(buf);
    if (!root)
        return gp_error_set(r.oom ? GP_ERR_OOM : GP_ERR_DATA, "profile '%s': not valid JSON: "
                            "line %d, column %d: %s", path, line, column, r.err);
    jctx c = {path, GP_OK};
    const gp_json_value *fmt = gp_json_get(root, "format");
    if (!fmt || fmt->kind != GP_JSON_STRING || strcmp(fmt->str, PROFILE_FORMAT)) {
        gp_json_value_free(root);
        return gp_error_set(GP_ERR_DATA, "profile '%s': not a gpipe profile (no \"format\": "
                            "\"%s\")", path, PROFILE_FORMAT);
    }
    int version = (int)jint_req(&c, root, "version", 0, 1 << 20, "");
    if (c.st == GP_OK && version != PROFILE_VERSION)
        c.st = gp_error_set(GP_ERR_DATA, "profile '%s' has version %d; this gpipe reads version "
                            "%d%s: re-create it with gpipe-balance CONFIG.yaml --profile-out %s",
                            path, version, PROFILE_VERSION,
                            version < PROFILE_VERSION ? ", which records the model it was taken "
                                                        "of" : "", path);
    const gp_json_value *in = jarr_req(&c, root, "input", 3, "");
    for (int d = 0; c.st == GP_OK && d < 3; d++) {
        out->input[d] = jitem_int(&c, in, d, "input", 1, (int64_t)1 << 40);
    }
    const gp_json_value *mh = gp_json_get(root, "model_hash");
    if (c.st == GP_OK) {
        char *end = NULL;
        bool ok = mh && mh->kind == GP_JSON_STRING && strlen(mh->str) == 16 &&
                  strspn(mh->str, "0123456789abcdef") == 16;
        if (ok) out->model_hash = strtoull(mh->str, &end, 16);
        if (!ok)
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"model_hash\" is missing or not 16 "
                                "hex digits; re-create the profile with gpipe-balance "
                                "--profile-out", path);
    }
    const gp_json_value *dv = gp_json_get(root, "device");
    if (dv && dv->kind == GP_JSON_STRING) snprintf(out->device, sizeof out->device, "%s", dv->str);
    out->threads = (int)jint_req(&c, root, "threads", 0, 1 << 16, "");
    /* absent before 2026-11-22: 0; present, a count in range (1e300 was
     * cast to int, undefined) */
    out->contend = gp_json_get(root, "contend")
                       ? (int)jint_req(&c, root, "contend", 0, 1 << 16, "") : 0;
    out->evict_bytes = gp_json_get(root, "evict_bytes")
                           ? jint_req(&c, root, "evict_bytes", 0, (int64_t)1 << 50, "") : 0;
    out->batch = jint_req(&c, root, "batch", 1, (int64_t)1 << 40, "");
    out->chunks = (int)jint_req(&c, root, "chunks", 1, 1 << 20, "");
    out->first_trainable = (int)jint_req(&c, root, "first_trainable", 0, 1 << 20, "");
    const gp_json_value *sk = gp_json_get(root, "skips"); /* absent: no skips */
    if (c.st == GP_OK && sk) {
        if (sk->kind != GP_JSON_ARRAY) {
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"skips\" must be a list of "
                                "[from, to] pairs", path);
        } else if (sk->n > 0) {
            out->skips = calloc((size_t)sk->n, sizeof *out->skips);
            if (!out->skips) c.st = gp_error_set(GP_ERR_OOM, "out of host memory");
            else out->n_skips = sk->n;
            for (int t = 0; c.st == GP_OK && t < sk->n; t++) {
                const gp_json_value *e = &sk->items[t];
                bool pair = e->kind == GP_JSON_ARRAY && e->n == 2;
                if (pair) {
                    out->skips[t].from = (int)jitem_int(&c, e, 0, "skips", 0, 1 << 20);
                    out->skips[t].to = (int)jitem_int(&c, e, 1, "skips", 0, 1 << 20);
                }
                if (c.st == GP_OK && (!pair || out->skips[t].from < 0 ||
                                      out->skips[t].to <= out->skips[t].from))
                    c.st = gp_error_set(GP_ERR_DATA, "profile '%s': skips[%d] is not a [from, "
                                        "to] pair with from < to", path, t);
            }
        }
    }
    out->timed = jnum_req(&c, root, "timed", "") != 0;
    const gp_json_value *pr = gp_json_get(root, "precision"); /* absent before 2026-11-25 */
    out->precision = -1;
    if (c.st == GP_OK && pr) {
        for (int q = GP_PRECISION_FP32; q <= GP_PRECISION_BF16; q++)
            if (pr->kind == GP_JSON_STRING && !strcmp(pr->str, gp_precision_name((gp_precision)q)))
                out->precision = q;
        if (out->precision < 0)
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"precision\" must be \"fp32\", "
                                "\"tf32\" or \"bf16\"", path);
    }
    out->optim_slots = -1; /* absent before 2026-12-01 */
    if (c.st == GP_OK && gp_json_get(root, "optim_slots"))
        out->optim_slots = (int)jint_req(&c, root, "optim_slots", 0, 2, "");
    out->warmup = (int)jint_req(&c, root, "warmup", 0, 1 << 20, "");
    out->reps = (int)jint_req(&c, root, "reps", 0, 1 << 20, "");
    const gp_json_value *sizes = jarr_req(&c, root, "sizes", -1, "");
    if (c.st == GP_OK && (sizes->n < 1 || sizes->n > GP_PROFILE_MAX_SIZES))
        c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"sizes\" needs 1..%d entries", path,
                            GP_PROFILE_MAX_SIZES);
    const gp_json_value *loss = NULL, *upload = NULL, *layers = NULL;
    if (c.st == GP_OK) {
        out->n_sizes = sizes->n;
        loss = jarr_req(&c, root, "loss", sizes->n, "");
        upload = jarr_req(&c, root, "upload", sizes->n, "");
        layers = jarr_req(&c, root, "layers", -1, "");
    }
    for (int z = 0; c.st == GP_OK && z < out->n_sizes; z++) {
        double sz = jitem_req(&c, sizes, z, "sizes");
        out->sizes[z] = sz >= 1 && sz <= 1e12 && sz == floor(sz) ? (int64_t)sz : 0;
        out->loss[z] = jitem_req(&c, loss, z, "loss");
        out->upload[z] = jitem_req(&c, upload, z, "upload");
        if (c.st == GP_OK && !(out->loss[z] >= 0 && out->loss[z] <= 1e18 &&
                               out->upload[z] >= 0 && out->upload[z] <= 1e18))
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"loss\"[%d] or \"upload\"[%d] is "
                                "not a time (0 .. 1e18 s); re-create the profile with "
                                "gpipe-balance --profile-out", path, z, z);
        if (c.st == GP_OK && (out->sizes[z] < 1 || (z > 0 && out->sizes[z] <= out->sizes[z - 1])))
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"sizes\" must be ascending and >= 1",
                                path);
    }
    if (c.st == GP_OK) {
        out->L = layers->n;
        out->mem = calloc((size_t)(out->L ? out->L : 1), sizeof *out->mem);
        out->t = calloc((size_t)(out->L ? out->L : 1) * (size_t)out->n_sizes, sizeof *out->t);
        if (!out->mem || !out->t) c.st = gp_error_set(GP_ERR_OOM, "out of host memory");
        if (out->L < 1) c.st = gp_error_set(GP_ERR_DATA, "profile '%s' has no layers", path);
        if (c.st == GP_OK && out->first_trainable > out->L)
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"first_trainable\" is %d, past its "
                                "%d layers; re-create the profile with gpipe-balance "
                                "--profile-out", path, out->first_trainable, out->L);
    }
    for (int k = 0; c.st == GP_OK && k < out->L; k++) {
        char where[32];
        snprintf(where, sizeof where, "layers[%d]", k);
        const gp_json_value *o = &layers->items[k];
        gp_layer_mem *m = &out->mem[k];
        const gp_json_value *d = gp_json_get(o, "desc");
        if (d && d->kind == GP_JSON_STRING) snprintf(m->desc, sizeof m->desc, "%s", d->str);
        const gp_json_value *sp = gp_json_get(o, "spec");
        if (!sp || sp->kind != GP_JSON_STRING || !sp->str[0] ||
            strlen(sp->str) >= sizeof m->spec)
            c.st = gp_error_set(GP_ERR_DATA, "profile '%s': %s: \"spec\" is missing or not a "
                                "layer's spec; re-create the profile with gpipe-balance "
                                "--profile-out", path, where);
        else
            memcpy(m->spec, sp->str, strlen(sp->str) + 1);
        m->param_bytes = (size_t)jnum_amount(&c, o, "param_bytes", where);
        m->grad_bytes = (size_t)jnum_amount(&c, o, "grad_bytes", where);
        m->optim_bytes = (size_t)jnum_amount(&c, o, "optim_bytes", where);
        m->workspace_bytes = (size_t)jnum_amount(&c, o, "workspace_bytes", where);
        m->in_per_sample = jnum_amount(&c, o, "in_per_sample", where);
        m->out_per_sample = jnum_amount(&c, o, "out_per_sample", where);
        m->keep_per_sample = jnum_amount(&c, o, "keep_per_sample", where);
        /* optional: profiles from before in-place layers count every output */
        const gp_json_value *ip = gp_json_get(o, "inplace");
        m->inplace = ip && ip->kind == GP_JSON_TRUE;
        const gp_json_value *uk = gp_json_get(o, "unkept");
        m->unkept = uk && uk->kind == GP_JSON_TRUE;
        const gp_json_value *fz = gp_json_get(o, "fused"); /* absent before: unfused */
        m->fused = fz && fz->kind == GP_JSON_TRUE;
        /* absent before 2026-11-29: every stage output kept to its backward */
        const gp_json_value *eu = gp_json_get(o, "end_unread");
        m->end_unread = eu && eu->kind == GP_JSON_TRUE;
        const gp_json_value *iu = gp_json_get(o, "in_unread");
        m->in_unread = iu && iu->kind == GP_JSON_TRUE;
        /* absent before 2026-11-29 (and where no chain ends at the layer):
         * no reorder at a cut */
        m->x_chain = gp_json_get(o, "x_chain_from") != NULL;
        m->y_chain = gp_json_get(o, "y_chain_to") != NULL;
        if (m->x_chain) m->x_from = (int)jint_req(&c, o, "x_chain_from", 0, k - 1, where);
        if (m->y_chain) m->y_to = (int)jint_req(&c, o, "y_chain_to", k + 1, out->L - 1, where);
        m->flops_per_sample = jnum_amount(&c, o, "flops_per_sample", where);
        m->update = jnum_amount(&c, o, "update", where);
        const gp_json_value *ts = jarr_req(&c, o, "times", out->n_sizes, where);
        for (int z = 0; c.st == GP_OK && z < out->n_sizes; z++) {
            gp_layer_times *t = &out->t[(size_t)z * (size_t)out->L + (size_t)k];
            const gp_json_value *e = &ts->items[z];
            t->fwd = jnum_amount(&c, e, "fwd", where);
            t->bwd_data = jnum_amount(&c, e, "bwd_data", where);
            t->bwd_weights = jnum_amount(&c, e, "bwd_weights", where);
            t->bwd_alone = jnum_amount(&c, e, "bwd_alone", where);
            t->recompute = jnum_amount(&c, e, "recompute", where);
            t->copy = jnum_amount(&c, e, "copy", where);
        }
    }
    gp_json_value_free(root);
    if (c.st == GP_OK && gp_profile_stored_hash(out) != out->model_hash)
        c.st = gp_error_set(GP_ERR_DATA, "profile '%s': \"model_hash\" %016llx does not match "
                            "its input and layer specs (%016llx): the file was edited or is "
                            "damaged; re-create it with gpipe-balance --profile-out", path,
                            (unsigned long long)out->model_hash,
                            (unsigned long long)gp_profile_stored_hash(out));
    if (c.st != GP_OK) gp_profile_free(out);
    return c.st;
}
