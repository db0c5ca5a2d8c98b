/*
 * lr_schedule.c — the learning-rate schedule and the throughput's windows:
 * small pure functions.
 */
#include "train/train.h"

#include <math.h>

double gp_lr_at(const gp_train_config *t, int64_t step, int64_t total_steps)
{
    double base = gp_lr_base(t);
    const gp_sched_config *s = &t->sched;
    if (step < s->warmup_steps) {
        /* step k (from 0) takes (k + 1) / warmup_steps of the way, as llm.c
         * and nanoGPT: the first step learns (at k / warmup_steps it took
         * warmup_start's lr, 0 by default: a step that changed nothing) */
        double start = s->warmup_start * base;
        return start + (base - start) * (double)(step + 1) / (double)s->warmup_steps;
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

void gp_throughput_add(gp_throughput *w, int64_t samples, double now, bool run_first, bool last)
{
    w->samples += samples;
    bool closes = now - w->start > 0.5 || last || run_first;
    if ((closes || w->first) && now > w->start) {
        w->sps = (double)w->samples / (now - w->start);
        w->wait_share = w->wait / (now - w->start);
    }
    if (closes) {
        w->start = now;
        w->samples = 0;
        w->wait = 0;
        w->first = run_first; /* (the steps since the first: so far, until a window closes) */
    }
}

void gp_throughput_pause(gp_throughput *w, double seconds)
{
    if (seconds > 0) w->start += seconds;
}
