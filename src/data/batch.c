/*
 * batch.c — turning uint8 samples into normalised float batches; used by
 * the prefetching loader and by evaluation so both normalise identically.
 */
#include "data/data.h"

void gp_data_norm(const gp_data_config *cfg, int64_t channels, float *mean, float *std)
{
    float dm[GP_MAX_CHANNELS], ds[GP_MAX_CHANNELS];
    gp_dataset_default_norm(cfg->dataset, channels, dm, ds);
    for (int64_t c = 0; c < channels && c < GP_MAX_CHANNELS; c++) {
        if (cfg->n_mean > 0) {
            int64_t i = c < cfg->n_mean ? c : cfg->n_mean - 1;
            mean[c] = cfg->mean[i];
            std[c] = cfg->std[i];
        } else {
            mean[c] = dm[c];
            std[c] = ds[c];
        }
    }
}

void gp_data_norm_affine(bool normalize, const float *mean, const float *std, int c, float *a,
                         float *b)
{
    *a = 1.0f / 255.0f;
    *b = 0.0f;
    /* channels past the per-channel table (a flat input of F features is F
     * channels of 1 x 1) share its last entry: the loader allows that only
     * where all channels have one mean and std */
    if (c >= GP_MAX_CHANNELS) c = GP_MAX_CHANNELS - 1;
    if (normalize) {
        *a = 1.0f / (255.0f * std[c]);
        *b = -mean[c] / std[c];
    }
}

void gp_data_assemble(const gp_dataset *ds, int64_t first, int64_t n, bool normalize,
                      const float *mean, const float *std, bool masks, float *x, float *y)
{
    GP_ASSERT(!masks || ds->masks);
    if (ds->tokens) { /* window k: input tokens k (T + 1) + t, targets the next */
        int64_t T = ds->c;
        for (int64_t i = 0; i < n; i++) {
            const uint32_t *t = ds->tokens + (first + i) * (T + 1);
            for (int64_t p = 0; p < T; p++) {
                x[i * T + p] = (float)t[p];
                y[i * T + p] = (float)t[p + 1];
            }
        }
        return;
    }
    int64_t hw = ds->h * ds->w, per = ds->c * hw;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *src = ds->images + (first + i) * per;
        float *dst = x + i * per;
        for (int64_t c = 0; c < ds->c; c++) {
            float a, b;
            gp_data_norm_affine(normalize, mean, std, (int)c, &a, &b);
            for (int64_t p = 0; p < hw; p++) dst[c * hw + p] = (float)src[c * hw + p] * a + b;
        }
        if (!masks) {
            y[i] = (float)ds->labels[first + i];
            continue;
        }
        const uint8_t *mk = ds->masks + (first + i) * hw;
        for (int64_t p = 0; p < hw; p++) y[i * hw + p] = (float)mk[p];
    }
}
