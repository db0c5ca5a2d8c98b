/*
 * api.c — the public gp_run API of include/gpipe.h over the config, model,
 * pipeline and trainer modules.
 */
#include "gpipe.h"
#include "train/train.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct gp_run {
    gp_config cfg;
    gp_device *devs[GP_MAX_DEVICES];
    int n_dev;
    gp_model model;
    bool prepared;
    gp_metrics last;
    _Atomic int stop;   /* gp_run_stop's signal; 0 = go on */
};

/* gp_run_stop may be called from a signal handler: only a lock-free
 * atomic is safe there. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "gp_run_stop needs a lock-free atomic int");

static gp_status run_new(gp_config *cfg, gp_run **out)
{
    gp_run *r = calloc(1, sizeof *r);
    if (!r) {
        gp_config_free(cfg);
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    r->cfg = *cfg;
    r->last.test_loss = NAN;
    r->last.test_accuracy = NAN;
    *out = r;
    return GP_OK;
}

gp_status gp_run_load(const char *path, const char *const *overrides, int n_overrides,
                      gp_run **out)
{
    *out = NULL;
    gp_config cfg;
    GP_TRY(gp_config_load(path, overrides, n_overrides, &cfg));
    return run_new(&cfg, out);
}

gp_status gp_run_parse(const char *name, const char *yaml, const char *const *overrides,
                       int n_overrides, gp_run **out)
{
    *out = NULL;
    gp_config cfg;
    GP_TRY(gp_config_parse(name, yaml, strlen(yaml), overrides, n_overrides, &cfg));
    return run_new(&cfg, out);
}

void gp_run_free(gp_run *r)
{
    if (!r) return;
    gp_model_free(&r->model);
    for (int j = 0; j < r->n_dev; j++) gp_device_close(r->devs[j]);
    gp_config_free(&r->cfg);
    free(r);
}

gp_status gp_run_prepare(gp_run *r)
{
    if (r->prepared) return GP_OK;
    GP_TRY(gp_train_open(&r->cfg, r->devs, &r->model, true));
    r->n_dev = gp_pipeline_devices_total(&r->cfg.pipeline);
    r->prepared = true;
    return GP_OK;
}

gp_status gp_run_step(gp_run *r, const float *x, const float *y, int64_t n,
                      int64_t total_steps, gp_metrics *out)
{
    GP_TRY(gp_run_prepare(r));
    double lr = gp_lr_at(&r->cfg.train, r->model.step, total_steps > 0 ? total_steps : 1);
    if (total_steps <= 0) lr = r->cfg.train.optim.lr;
    gp_step_stats st;
    GP_TRY(gp_model_pipeline_step(&r->model, &r->cfg, x, y, n, lr, &st));
    r->last.step = r->model.step;
    r->last.loss = st.loss;
    r->last.accuracy = st.accuracy;
    r->last.lr = lr;
    r->last.seconds = st.seconds;
    if (out) *out = r->last;
    return GP_OK;
}

gp_status gp_run_train(gp_run *r, const char *metrics_path, gp_metrics *out)
{
    gp_train_opts o = {.metrics_path = metrics_path, .progress = 0, .quiet = false,
                       .stop = &r->stop};
    gp_train_result res;
    GP_TRY(gp_train_run(&r->cfg, &o, &res));
    r->last.step = res.steps;
    r->last.loss = res.final_loss;
    r->last.test_loss = res.test_loss;
    r->last.test_accuracy = res.test_accuracy;
    if (out) *out = r->last;
    return GP_OK;
}

void gp_run_stop(gp_run *r, int signo)
{
    atomic_store(&r->stop, signo > 0 ? signo : 1);
}

int gp_run_devices(const gp_run *r) { return r->prepared ? r->n_dev : 0; }

gp_status gp_run_device_memory(const gp_run *r, int j, const char **name, size_t *peak,
                               size_t *current)
{
    if (!r->prepared || j < 0 || j >= r->n_dev)
        return gp_error_set(GP_ERR_INVALID, "device %d does not exist (the run has %d; call "
                            "gp_run_prepare first)", j, r->prepared ? r->n_dev : 0);
    gp_allocator a;
    gp_allocator_snapshot(&r->devs[j]->alloc, &a);
    if (name) *name = r->devs[j]->name;
    if (peak) *peak = a.peak;
    if (current) *current = a.current;
    return GP_OK;
}
