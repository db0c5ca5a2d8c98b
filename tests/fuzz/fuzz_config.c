/* fuzz_config.c — the YAML config loader (libyaml -> node tree -> the
 * validated walk).  An input with a NUL byte is YAML before it and one
 * --set override after it, so overrides are fuzzed too; a config that
 * loads is written back with its override (gp_config_text_applied) and
 * must load again, to the same values (dump).  Then the model's shapes
 * (every layer inferred, its parameters counted, nothing allocated) and the --dry-run's balance by
 * FLOPs: sizes whose products overflow and balances that wrap must be
 * errors with messages, not crashes. */
#include "fuzz_util.h"
#include "config/config.h"
#include "train/train.h"

#define G "%.17g"

static void dump_layer(FILE *o, int i, const gp_layer_spec *s)
{
    fprintf(o, "L%d t%d name'%s' tie'%s' in%lld out%lld k%lldx%lld s%lldx%lld p%lldx%lld b%d "
            "cip%d init%d std" G " mom" G " eps" G " sync%d p" G " sl" G " sc%lld red%d\n",
            i, s->type, s->name, s->tie, (long long)s->in, (long long)s->out,
            (long long)s->kernel.h, (long long)s->kernel.w, (long long)s->stride.h,
            (long long)s->stride.w, (long long)s->padding.h, (long long)s->padding.w, s->bias,
            s->count_include_pad, s->init, s->std, s->momentum, s->eps, s->sync, s->p,
            s->slope, (long long)s->scale, s->reduction);
    fprintf(o, "  h%lld kv%lld th" G " l3%d f" G " lf" G " hf" G " op%lld v%lld d%lld pos%lld "
            "stash'%s' np%d", (long long)s->heads, (long long)s->kv_heads, s->rope_theta,
            s->rope_llama3, s->rope_factor, s->rope_low_freq, s->rope_high_freq,
            (long long)s->rope_orig_positions, (long long)s->vocab, (long long)s->dim,
            (long long)s->positions, s->stash, s->n_pop);
    for (int q = 0; q < s->n_pop; q++) fprintf(o, " pop'%s'", s->pop[q]);
    fputc('\n', o);
}

static void dump_pipeline(FILE *o, const gp_pipeline_config *p)
{
    fprintf(o, "pipe n%d rep%d chunks%d ck%d keep%u lock%d/%d sched%d v%d thr%d mem%zu cp%d "
            "pt" G " path'%s' nb%d:", p->n_devices, p->replicas, p->chunks, p->checkpoint,
            (unsigned)p->checkpoint_keep, p->lockstep, p->lockstep_given, p->schedule,
            p->virtual_stages, p->threads, p->memory, p->copy_precision, p->peer_timeout,
            p->schedule_path, p->n_balance);
    for (int j = 0; j < p->n_balance; j++) fprintf(o, " %d", p->balance[j]);
    fputc('\n', o);
    for (int j = 0; j < gp_pipeline_devices_total(p); j++)
        fprintf(o, " dev %s %zu %d\n", p->devices[j].name, p->devices[j].memory,
                p->devices[j].threads);
}

static void dump_data(FILE *o, const gp_data_config *d)
{
    fprintf(o, "data ds%d path'%s' sh%d norm%d nmean%d", d->dataset, d->path, d->shuffle,
            d->normalize, d->n_mean);
    for (int j = 0; j < d->n_mean; j++) fprintf(o, " " G "/" G, d->mean[j], d->std[j]);
    fprintf(o, " crop%d hf%d pf%d tl%lld el%lld st%lld se%lld cls%d masks%d shape%lld,%lld,%lld "
            "layout%d mb%d w%d skip%d cache'%s'\n", d->crop_padding, d->hflip, d->prefetch,
            (long long)d->train_limit, (long long)d->test_limit, (long long)d->synthetic_train,
            (long long)d->synthetic_test, d->synthetic_classes, d->synthetic_masks,
            (long long)d->synthetic_shape[0], (long long)d->synthetic_shape[1],
            (long long)d->synthetic_shape[2], d->layout, d->masks_binary, d->workers,
            d->skip_bad_files, d->cache_dir);
    fprintf(o, "  rrc%d " G " " G " " G " " G " rs%d vocab%lld\n", d->rrc, d->rrc_scale[0],
            d->rrc_scale[1], d->rrc_ratio[0], d->rrc_ratio[1], d->resize,
            (long long)d->token_vocab);
}

static void dump_train(FILE *o, const gp_train_config *t)
{
    fprintf(o, "train ep%lld st%lld bs%lld seed%llu prec%d act%d det%d opt %s " G " " G " %d "
            G " " G " " G " " G " %d\n", (long long)t->epochs, (long long)t->steps,
            (long long)t->batch_size, (unsigned long long)t->seed, t->precision, t->activations,
            t->deterministic, t->optim.type, t->optim.lr, t->optim.momentum, t->optim.nesterov,
            t->optim.beta1, t->optim.beta2, t->optim.eps, t->optim.weight_decay,
            t->optim.decay_bias_and_norm);
    fprintf(o, "sched %d %lld " G " %lld " G " " G " scal%d bb%lld log%lld eval%d ebs%lld clip"
            G " snap %lld " G " %lld '%s' tb'%s'\n", t->sched.kind,
            (long long)t->sched.warmup_steps, t->sched.warmup_start,
            (long long)t->sched.step_size, t->sched.gamma, t->sched.min_lr, t->lr_scaling,
            (long long)t->base_batch, (long long)t->log_every, t->eval_each_epoch,
            (long long)t->eval_batch_size, t->clip_grad_norm, (long long)t->snapshot.every_steps,
            t->snapshot.every_minutes, (long long)t->snapshot.keep, t->snapshot.dir,
            t->tensorboard);
}

/* The resolved config's values that a write-back must keep, as text (after
 * the config review's round-trip harness): a value the writer changes, as
 * a NEL folded inside quotes did, differs here though both texts load. */
static void dump(FILE *o, const gp_config *c)
{
    const gp_model_config *m = &c->model;
    fprintf(o, "input %lld %lld %lld loss %d ls " G " init_from '%s' family '%s'\n",
            (long long)m->input[0], (long long)m->input[1], (long long)m->input[2], m->loss,
            m->label_smoothing, m->init_from, m->family);
    for (int i = 0; i < m->n_layers; i++) dump_layer(o, i, &m->layers[i]);
    dump_pipeline(o, &c->pipeline);
    dump_data(o, &c->data);
    dump_train(o, &c->train);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gp_log_set_level(GP_LOG_QUIET);
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    char *ov = NULL;
    if (nul) {
        size_t k = size - len - 1;
        ov = malloc(k + 1);
        if (!ov) return 0;
        memcpy(ov, nul + 1, k);
        ov[k] = '\0';
    }
    const char *sets[1] = {ov};
    gp_config cfg;
    if (gp_config_parse("fuzz.yaml", (const char *)data, len, sets, ov ? 1 : 0, &cfg) == GP_OK) {
        /* written back with its override (gpipe-balance --write), it loads */
        char *t = NULL;
        gp_config w;
        if (gp_config_text_applied(&cfg, NULL, &t) != GP_OK ||
            gp_config_parse("written.yaml", t, strlen(t), NULL, 0, &w) != GP_OK)
            abort();
        char *da = NULL, *db = NULL;
        size_t la = 0, lb = 0;
        FILE *fa = open_memstream(&da, &la), *fb = open_memstream(&db, &lb);
        if (!fa || !fb) abort();
        dump(fa, &cfg);
        dump(fb, &w);
        fclose(fa);
        fclose(fb);
        if (strcmp(da, db)) {
            fprintf(stderr, "written back, the config reads otherwise:\n--- given\n%s--- "
                    "written\n%s--- text\n%s\n", da, db, t);
            abort();
        }
        free(da);
        free(db);
        gp_config_free(&w);
        free(t);
        int64_t np = 0;
        if (gp_model_count_params(&cfg, &np) != GP_OK && !gp_last_error()[0]) abort();
        int stages = cfg.pipeline.n_devices * (cfg.pipeline.virtual_stages > 1
                                                   ? cfg.pipeline.virtual_stages : 1);
        int bal[GP_MAX_DEVICES];
        /* a given balance is checked (gp_model_balance); auto, split by FLOPs */
        if (stages > 1 && stages <= GP_MAX_DEVICES && np > 0 &&
            (cfg.pipeline.n_balance > 0 ? gp_model_balance(&cfg, stages, bal, true)
                                        : gp_model_balance_flops(&cfg, stages, bal)) != GP_OK &&
            !gp_last_error()[0])
            abort();
        gp_config_free(&cfg);
    } else if (!gp_last_error()[0]) {
        abort(); /* every error has a message */
    }
    free(ov);
    return 0;
}
