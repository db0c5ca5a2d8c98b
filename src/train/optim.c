/*
 * optim.c — the learning-rate schedule and micro-batch sizes: small pure
 * functions the trainer (and the pipeline) share.
 */
#include "train/train.h"

#include <math.h>

double gp_lr_at(const gp_train_config *t, int64_t step, int64_t total_steps)
{
    double base = t->optim.lr;
    if (t->lr_scaling == GP_LR_SCALING_LINEAR && t->base_batch > 0)
        base *= (double)t->batch_size / (double)t->base_batch;
    const gp_sched_config *s = &t->sched;
    if (step < s->warmup_steps) {
        double start = s->warmup_start * base;
        return start + (base - start) * (double)step / (double)s->warmup_steps;
    }
    int64_t after = step - s->warmup_steps;
    switch (s->kind) {
    case GP_SCHED_CONSTANT:
        return base;
    case GP_SCHED_STEP:
        return base * pow(s->gamma, (double)(s->step_size > 0 ? after / s->step_size : 0));
    case GP_SCHED_COSINE: {
        int64_t span = total_steps - s->warmup_steps;
        double tt = span > 0 ? (double)after / (double)span : 1.0;
        if (tt > 1) tt = 1;
        return s->min_lr + (base - s->min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * tt));
    }
    }
    return base;
}

gp_status gp_microbatch_split(int64_t n, int m, int64_t *sizes)
{
    if (m < 1)
        return gp_error_set(GP_ERR_INVALID, "pipeline.chunks must be >= 1, got %d", m);
    if (m > n)
        return gp_error_set(GP_ERR_INVALID,
                            "pipeline.chunks = %d is larger than the batch of %lld samples; "
                            "use chunks <= batch size",
                            m, (long long)n);
    for (int i = 0; i < m; i++) sizes[i] = n / m + (i < n % m ? 1 : 0);
    return GP_OK;
}
