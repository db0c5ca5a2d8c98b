/*
 * bench_util.h — small helpers the benchmark programs share (header-only:
 * each benchmark is one executable).
 */
#ifndef GP_BENCH_UTIL_H
#define GP_BENCH_UTIL_H

#include "train/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int gp_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static inline double gp_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, gp_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Make cfg's pipeline n CPU devices cpu:0..cpu:n-1, one math thread each,
 * no memory cap (the benchmarks' standard placement). */
static inline void gp_bench_cpu_devices(gp_config *cfg, int n)
{
    cfg->pipeline.n_devices = n;
    for (int j = 0; j < n; j++) {
        snprintf(cfg->pipeline.devices[j].name, sizeof cfg->pipeline.devices[j].name, "cpu:%d", j);
        cfg->pipeline.devices[j].threads = 1;
        cfg->pipeline.devices[j].memory = 0;
    }
}

/* A host batch of b samples of `per` floats: uniform [0, 1) inputs from the
 * counter-based RNG stream (seed, stream) and labels i % 10.  The caller
 * frees *x and *y. */
static inline void gp_bench_random_batch(int64_t b, int64_t per, uint64_t seed, uint64_t stream,
                                         float **x, float **y)
{
    *x = malloc((size_t)(b * per) * sizeof **x);
    *y = malloc((size_t)b * sizeof **y);
    gp_rng_uniform_fill(seed, stream, 0, *x, b * per);
    for (int64_t i = 0; i < b; i++) (*y)[i] = (float)(i % 10);
}

/* A random batch for the model m: inputs uniform in [0, 1), targets class
 * ids i % 10 (cross-entropy) or per-pixel 0/1 (binary cross-entropy: the
 * input's first channel above 1/2); a language model (an embedding first)
 * gets token ids and a target id per position. */
static inline void gp_bench_model_batch(const gp_model *m, int64_t b, float **x, float **y)
{
    int64_t per = gp_shape_numel(&m->input), t = m->targets;
    gp_bench_random_batch(b, per, 5, 6, x, y);
    if (m->n_layers > 0 && m->layers[0].spec.type == GP_LAYER_EMBEDDING) {
        /* a language model: token ids in, the next position's id out */
        int64_t v = m->layers[0].spec.vocab;
        free(*y);
        *y = malloc((size_t)(b * t) * sizeof **y);
        for (int64_t i = 0; i < b * per; i++) (*x)[i] = (float)((i * 7919) % v);
        for (int64_t i = 0; i < b * t; i++) (*y)[i] = (float)((i * 7919 + 7919) % v);
        return;
    }
    if (m->loss != GP_LOSS_BCE_WITH_LOGITS) return;
    free(*y);
    *y = malloc((size_t)(b * t) * sizeof **y);
    for (int64_t i = 0; i < b; i++)
        for (int64_t p = 0; p < t; p++) (*y)[i * t + p] = (*x)[i * per + p % per] > 0.5f;
}

/* The processor, for every table of CPU numbers: "Intel(R) Xeon(R) ...
 * (avx2, avx512f)" from /proc/cpuinfo's first model name and flags, then
 * "; CPU devices compute in AVX2 (capped by GPIPE_CPU_ISA)": the set
 * oneDNN's kernels and gpipe's choices use, and the switch that caps it
 * (bench_cpu_peer.py --isa avx2 runs an AVX-512 machine that way), then the
 * instruction set
 * gpipe's own loops picked (gp_cpu_loops_isa; a build with
 * -DGPIPE_ISA_CLONES=3 stops at AVX2). */
static inline void gp_bench_cpu_name(char *buf, size_t len)
{
    snprintf(buf, len, "unknown processor");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[4096];
    bool named = false, avx2 = false, avx512 = false, bf16 = false, amx = false;
    while (fgets(line, sizeof line, f)) {
        if (!named && !strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                snprintf(buf, len, "%s", c + 2);
                buf[strcspn(buf, "\n")] = '\0';
                named = true;
            }
        }
        if (!strncmp(line, "flags", 5)) {
            avx2 = strstr(line, " avx2") != NULL;
            avx512 = strstr(line, " avx512f") != NULL;
            bf16 = strstr(line, " avx512_bf16") != NULL;
            amx = strstr(line, " amx") != NULL;
            break;
        }
    }
    fclose(f);
    size_t l = strlen(buf);
    snprintf(buf + l, len - l, " (%s%s%s%s)", avx2 ? "avx2" : "no avx2", avx512 ? ", avx512f" : "",
             bf16 ? ", avx512_bf16" : "", amx ? ", amx" : "");
    /* what CPU devices compute in: the processor's, or GPIPE_CPU_ISA's /
     * ONEDNN_MAX_CPU_ISA's cap (cpu_isa.c), which moves oneDNN and every
     * choice gpipe makes from the processor together */
    const char *cap = gp_cpu_isa_switch();
    l = strlen(buf);
    snprintf(buf + l, len - l, "; CPU devices compute in %s%s%s%s", gp_cpu_isa_name(),
             cap ? " (capped by " : "", cap ? cap : "", cap ? ")" : "");
    l = strlen(buf);
    snprintf(buf + l, len - l, "; gpipe's loops in %s", gp_cpu_loops_isa());
}

#endif
