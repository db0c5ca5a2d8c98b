/*
 * config_train.c — the train section: length, batch, seed, the optimizer,
 * the learning-rate schedule and scaling, logging, evaluation and
 * snapshots.
 */
#include "config/config_impl.h"

#include <math.h>
#include <stdio.h>

static const char *const k_optim_names[] = {"sgd", "adam", "adamw"}; /* gp_optim_kind order */
static const char *const k_sched_names[] = {"constant", "step", "cosine"};
static const char *const k_scaling_names[] = {"none", "linear"};
/* gp_precision's order (backend.h) */
static const char *const k_precision_names[] = {"fp32", "tf32", "bf16"};
/* gp_act_storage's order (config.h) */
static const char *const k_act_names[] = {"auto", "fp32", "bf16"};

/* `key: name` is shorthand for `key: {type: name}`. */
static gp_status get_typed_map(gp_cfg_walk *w, const gp_ynode *m, const char *key,
                               const char *example, const gp_ynode **map,
                               const gp_ynode **type_scalar)
{
    const gp_ynode *n = gp_ymap_get(m, key);
    *map = NULL;
    *type_scalar = NULL;
    if (n && n->kind == GP_YNODE_SCALAR) {
        *type_scalar = n;
        return GP_OK;
    }
    GP_TRY(gp_cfg_get_map(w, m, "train", key, example, map));
    char sect[64];
    gp_cfg_join(sect, sizeof sect, "train", key);
    return gp_cfg_check_keys(w, *map, sect);
}

/* train.optimizer.betas: [b1, b2], each in [0, 1) (Adam's moment decays). */
static gp_status get_betas(gp_cfg_walk *w, const gp_ynode *om, float *out)
{
    gp_cfg_key_agrees("train.optimizer.betas", GP_CFG_OTHER, 0, NULL, 0, 1, GP_CFG_HI_OPEN, NULL,
                      0);
    const gp_ynode *n = gp_ymap_get(om, "betas");
    if (gp_cfg_absent(n)) {
        gp_cfg_note(w, "train.optimizer.betas = [%g, %g] (default)", out[0], out[1]);
        return GP_OK;
    }
    if (n->kind != GP_YNODE_SEQ || n->n != 2)
        return gp_cfg_bad(w, n, "train.optimizer.betas must be a pair [b1, b2] (PyTorch's "
                          "default [0.9, 0.999])");
    for (int i = 0; i < 2; i++) {
        double d;
        char nm[48];
        snprintf(nm, sizeof nm, "train.optimizer.betas.%d", i);
        GP_TRY(gp_cfg_parse_float(w, n->items[i], nm, &d));
        GP_TRY(gp_cfg_to_float(w, n->items[i], nm, d, 0, 1, GP_CFG_HI_OPEN, &out[i]));
    }
    return GP_OK;
}

double gp_lr_base(const gp_train_config *t)
{
    double base = t->optim.lr;
    if (t->lr_scaling == GP_LR_SCALING_LINEAR && t->base_batch > 0)
        base *= (double)t->batch_size / (double)t->base_batch;
    return base;
}

gp_status gp_cfg_parse_train(gp_cfg_walk *w, const gp_ynode *root, gp_train_config *tc)
{
    const gp_ynode *m;
    GP_TRY(gp_cfg_get_map(w, root, "", "train", "{epochs: 3, batch_size: 64}", &m));
    GP_TRY(gp_cfg_check_keys(w, m, "train"));
    GP_TRY(gp_cfg_get_int(w, m, "train", "steps", 0, 0, INT64_MAX, &tc->steps));
    bool rec = w->record;
    w->record = rec && tc->steps == 0;
    gp_status s = gp_cfg_get_int(w, m, "train", "epochs", 1, 1, (int64_t)1 << 40, &tc->epochs);
    w->record = rec;
    GP_TRY(s);
    if (tc->steps > 0 && !gp_cfg_absent(gp_ymap_get(m, "epochs")))
        gp_cfg_note(w, "train.epochs = %lld is ignored: train.steps = %lld is given",
                    (long long)tc->epochs, (long long)tc->steps);
    GP_TRY(gp_cfg_get_int(w, m, "train", "batch_size", 64, 1, 1 << 24, &tc->batch_size));
    GP_TRY(gp_cfg_get_u64(w, m, "train", "seed", 0, &tc->seed));
    GP_TRY(gp_cfg_get_enum(w, m, "train", "precision", k_precision_names,
                           GP_COUNT(k_precision_names), 0, &tc->precision));
    GP_TRY(gp_cfg_get_enum(w, m, "train", "activations", k_act_names, GP_COUNT(k_act_names), 0,
                           &tc->activations));
    GP_TRY(gp_cfg_get_bool(w, m, "train", "deterministic", false, &tc->deterministic));

    const gp_ynode *om, *ot;
    GP_TRY(get_typed_map(w, m, "optimizer", "{type: sgd, lr: 0.1}", &om, &ot));
    const char *os = "train.optimizer";
    int k = 0;
    if (ot)
        GP_TRY(gp_cfg_parse_enum(w, ot, os, k_optim_names, GP_COUNT(k_optim_names), &k));
    else
        GP_TRY(gp_cfg_get_enum(w, om, os, "type", k_optim_names, GP_COUNT(k_optim_names), 0, &k));
    snprintf(tc->optim.type, sizeof tc->optim.type, "%s", k_optim_names[k]);
    tc->optim.kind = k;
    bool sgd = k == 0;
    /* PyTorch's defaults: SGD lr 0.01 here (PyTorch has none), Adam 1e-3
     * with betas (0.9, 0.999) and eps 1e-8, AdamW's weight decay 0.01. */
    GP_TRY(gp_cfg_get_double(w, om, os, "lr", sgd ? 0.01 : 0.001, 0, INFINITY, 0,
                             &tc->optim.lr));
    static const char *const sgd_only[] = {"momentum", "nesterov"};
    static const char *const adam_only[] = {"betas", "eps"};
    for (int i = 0; i < 2; i++) {
        const char *key = sgd ? adam_only[i] : sgd_only[i];
        const gp_ynode *bad = gp_ymap_get(om, key);
        if (gp_cfg_absent(bad)) continue;
        /* a type set by --set over the file's optimizer: the message is
         * the file's line, the cause the override, so name both */
        const gp_ynode *tn = ot ? ot : gp_ymap_get(om, "type");
        char why[400] = "";
        if (tn && tn->set && !bad->set) {
            char v[96], ex[128];
            snprintf(v, sizeof v, "train.optimizer={type: %s, lr: 0.001}", k_optim_names[k]);
            snprintf(why, sizeof why, " (the type comes from %s %.120s; to change the "
                     "optimizer replace the whole map, e.g. %s)", gp_opt_name(GP_OPT_SET),
                     tn->set, gp_opt_value(GP_OPT_SET, v, ex, sizeof ex));
        }
        return gp_cfg_bad(w, bad, "train.optimizer.%s is for %s; type %s takes %s%s", key,
                          sgd ? "adam and adamw" : "sgd", k_optim_names[k],
                          sgd ? "momentum and nesterov" : "betas: [b1, b2] and eps", why);
    }
    rec = w->record;
    w->record = rec && sgd;
    s = gp_cfg_get_float(w, om, os, "momentum", 0.9f, 0, 1, GP_CFG_HI_OPEN,
                                   &tc->optim.momentum);
    if (s == GP_OK) s = gp_cfg_get_bool(w, om, os, "nesterov", false, &tc->optim.nesterov);
    if (!sgd) tc->optim.momentum = 0, tc->optim.nesterov = false;
    w->record = rec && !sgd;
    float betas[2] = {0.9f, 0.999f};
    if (s == GP_OK) s = get_betas(w, om, betas);
    tc->optim.beta1 = betas[0];
    tc->optim.beta2 = betas[1];
    if (s == GP_OK)
        s = gp_cfg_get_float(w, om, os, "eps", 1e-8f, 0, INFINITY, GP_CFG_LO_OPEN,
                             &tc->optim.eps);
    w->record = rec;
    GP_TRY(s);
    GP_TRY(gp_cfg_get_float(w, om, os, "weight_decay", k == 2 ? 0.01f : 0.0f, 0, INFINITY, 0,
                            &tc->optim.weight_decay));
    GP_TRY(gp_cfg_get_bool(w, om, os, "decay_bias_and_norm", false,
                           &tc->optim.decay_bias_and_norm));
    if (tc->optim.nesterov && tc->optim.momentum <= 0)
        return gp_cfg_bad(w, gp_ymap_get(om, "nesterov"), "train.optimizer.nesterov needs "
                          "momentum > 0 (Nesterov momentum with no momentum is plain SGD)");

    const gp_ynode *sm, *st;
    GP_TRY(get_typed_map(w, m, "schedule", "{type: cosine, warmup_steps: 100}", &sm, &st));
    const char *ss = "train.schedule";
    if (st)
        GP_TRY(gp_cfg_parse_enum(w, st, ss, k_sched_names, GP_COUNT(k_sched_names), &k));
    else
        GP_TRY(gp_cfg_get_enum(w, sm, ss, "type", k_sched_names, GP_COUNT(k_sched_names),
                               GP_SCHED_CONSTANT, &k));
    tc->sched.kind = (gp_sched_kind)k;
    GP_TRY(gp_cfg_get_int(w, sm, ss, "warmup_steps", 0, 0, INT64_MAX, &tc->sched.warmup_steps));
    GP_TRY(gp_cfg_get_double(w, sm, ss, "warmup_start", 0, 0, 1, 0, &tc->sched.warmup_start));
    rec = w->record;
    w->record = rec && tc->sched.kind == GP_SCHED_STEP;
    s = gp_cfg_get_int(w, sm, ss, "step_size", 1000, 1, INT64_MAX, &tc->sched.step_size);
    if (s == GP_OK)
        s = gp_cfg_get_double(w, sm, ss, "gamma", 0.1, 0, INFINITY, GP_CFG_LO_OPEN,
                              &tc->sched.gamma);
    w->record = rec && tc->sched.kind == GP_SCHED_COSINE;
    if (s == GP_OK)
        s = gp_cfg_get_double(w, sm, ss, "min_lr", 0, 0, INFINITY, 0, &tc->sched.min_lr);
    w->record = rec;
    GP_TRY(s);
    /* A key that another schedule type reads is ignored here; most often
     * the type was changed (by --set, say) and its old keys stayed, and
     * the run would train on a schedule the user did not expect. */
    static const struct {
        const char *key;
        gp_sched_kind kind;
    } k_sched_keys[] = {{"step_size", GP_SCHED_STEP}, {"gamma", GP_SCHED_STEP},
                        {"min_lr", GP_SCHED_COSINE}};
    for (int i = 0; i < GP_COUNT(k_sched_keys); i++) {
        const gp_ynode *n = gp_ymap_get(sm, k_sched_keys[i].key);
        if (!gp_cfg_absent(n) && tc->sched.kind != k_sched_keys[i].kind)
            gp_cfg_warn(w, n, "train.schedule.%s is ignored: only type %s uses it, and the "
                        "schedule is %s", k_sched_keys[i].key,
                        k_sched_names[k_sched_keys[i].kind], k_sched_names[tc->sched.kind]);
    }
    const gp_ynode *wsn = gp_ymap_get(sm, "warmup_start");
    if (!gp_cfg_absent(wsn) && tc->sched.warmup_steps == 0)
        gp_cfg_warn(w, wsn, "train.schedule.warmup_start is ignored: warmup_steps is 0, so "
                    "there is no warmup; give warmup_steps too");

    GP_TRY(gp_cfg_get_enum(w, m, "train", "lr_scaling", k_scaling_names, GP_COUNT(k_scaling_names),
                           GP_LR_SCALING_NONE, &k));
    tc->lr_scaling = (gp_lr_scaling)k;
    rec = w->record;
    w->record = false;
    s = gp_cfg_get_int(w, m, "train", "base_batch", tc->batch_size, 1, 1 << 24, &tc->base_batch);
    w->record = rec;
    GP_TRY(s);
    const gp_ynode *bbn = gp_ymap_get(m, "base_batch");
    if (gp_cfg_absent(bbn) && tc->lr_scaling == GP_LR_SCALING_LINEAR)
        gp_cfg_note(w, "train.base_batch = %lld (default: train.batch_size)",
                    (long long)tc->base_batch);
    else if (!gp_cfg_absent(bbn) && tc->lr_scaling != GP_LR_SCALING_LINEAR)
        gp_cfg_warn(w, bbn, "train.base_batch is ignored: it scales the learning rate only "
                    "with train.lr_scaling: linear (lr_scaling is none)");
    /* cosine's floor above the rate it decays from: it rises instead */
    double base = gp_lr_base(tc);
    const gp_ynode *mln = gp_ymap_get(sm, "min_lr");
    if (!gp_cfg_absent(mln) && tc->sched.kind == GP_SCHED_COSINE && tc->sched.min_lr > base)
        gp_cfg_warn(w, mln, "train.schedule.min_lr = %g is above the learning rate it decays "
                    "from (%g): the cosine schedule rises to it instead; give a min_lr below "
                    "the rate", tc->sched.min_lr, base);
    GP_TRY(gp_cfg_get_int(w, m, "train", "log_every", 50, 0, INT64_MAX, &tc->log_every));
    GP_TRY(gp_cfg_get_bool(w, m, "train", "eval_each_epoch", true, &tc->eval_each_epoch));
    /* 0: the training batch (evaluation holds no more than a step's
     * forward; 1000 sequences of a language model's logits did) */
    GP_TRY(gp_cfg_get_int(w, m, "train", "eval_batch_size", 0, 1, 1 << 24,
                          &tc->eval_batch_size));
    GP_TRY(gp_cfg_get_float(w, m, "train", "clip_grad_norm", 0, 0, INFINITY, 0,
                            &tc->clip_grad_norm));
    GP_TRY(gp_cfg_get_str(w, m, "train", "tensorboard", "", tc->tensorboard,
                          sizeof tc->tensorboard));

    const gp_ynode *snm;
    GP_TRY(gp_cfg_get_map(w, m, "train", "snapshot",
                          "{every_steps: 1000, keep: 3, dir: snapshots}", &snm));
    GP_TRY(gp_cfg_check_keys(w, snm, "train.snapshot"));
    const char *sn = "train.snapshot";
    rec = w->record;
    if (!snm) /* its keys' defaults are not listed one by one: what they add up to */
        gp_cfg_note(w, "train.snapshot: off (default; train.snapshot.every_steps or "
                       "every_minutes turns it on, into dir snapshots, keeping 3)");
    w->record = rec && snm;
    s = gp_cfg_get_int(w, snm, sn, "every_steps", 0, 0, INT64_MAX, &tc->snapshot.every_steps);
    if (s == GP_OK)
        s = gp_cfg_get_float(w, snm, sn, "every_minutes", 0, 0, INFINITY, 0,
                             &tc->snapshot.every_minutes);
    if (s == GP_OK) s = gp_cfg_get_int(w, snm, sn, "keep", 3, 1, 1 << 20, &tc->snapshot.keep);
    if (s == GP_OK)
        s = gp_cfg_get_str(w, snm, sn, "dir", "snapshots", tc->snapshot.dir,
                           sizeof tc->snapshot.dir);
    w->record = rec;
    GP_TRY(s);
    if (snm && tc->snapshot.dir[0] == '\0')
        return gp_cfg_bad(w, gp_ymap_get(snm, "dir"), "train.snapshot.dir is empty; give a "
                          "directory");
    return GP_OK;
}
