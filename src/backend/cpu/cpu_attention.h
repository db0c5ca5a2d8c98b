/*
 * cpu_attention.h — what the attention slots (cpu_attention.c) share with
 * their kernels, compiled once per vector width (cpu_attention_body.h in
 * cpu_attention_w16.c and cpu_attention_w8.c): the tile sizes, a task's
 * dimensions and sources, its scratch, and the kernels of each width.
 */
#ifndef GP_CPU_ATTENTION_H
#define GP_CPU_ATTENTION_H

#include "backend/cpu/cpu_impl.h"

#include <math.h>

#define ATT_BK 64    /* keys per tile */
#define ATT_BQ 32    /* queries per chunk (backward's dk, dv sums): a multiple of ATT_QB */
#define ATT_LANES 16 /* partial sums of a tile's probabilities */
#define ATT_QB 4     /* queries a block of att_tile_q / att_rows_q */

typedef struct att_dims {
    int64_t t, tp, heads, c, d, row; /* tp: t padded to whole tiles; row: c + 2 kvh d */
    int64_t kvh, rep;                /* k's and v's heads; query heads per k, v head */
    int64_t vc;                      /* v's first column (k's: c) */
    float scale;                     /* 1 / sqrt(d) */
} att_dims;

/* Where one forward task reads and writes: queries i = 0 .. nq - 1 at
 * positions pos + i, each attending keys 0 .. pos + i of the L = pos + nq
 * keys and values (rows R apart: x's own rows in training, the KV cache's
 * in decoding), q rows QR apart, the output's rows c apart. */
typedef struct att_src {
    const void *q, *k, *v;
    void *y;
    int64_t nq, pos, QR, KR;
} att_src;

/* A task's dimensions: t positions, heads over kv_heads k and v heads, c = heads d. */
static inline att_dims att_dims_of(int64_t t, int64_t heads, int64_t kv_heads, int64_t c)
{
    att_dims a = {.t = t, .heads = heads, .c = c, .d = c / heads, .kvh = kv_heads,
                  .rep = heads / kv_heads};
    a.row = c + 2 * kv_heads * a.d;
    a.vc = c + kv_heads * a.d;
    a.tp = (t + ATT_BK - 1) / ATT_BK * ATT_BK;
    a.scale = 1.0f / sqrtf((float)a.d);
    return a;
}

/* The floats a thread's forward tiles take (bf16: the values widened too). */
/* The causal keys of query position i in the tile of keys starting at j0
 * (j0 <= i): those at or before i, at most a tile's ATT_BK. */
static inline int att_keys(int64_t i, int64_t j0)
{
    return (int)(i + 1 - j0 < ATT_BK ? i + 1 - j0 : ATT_BK);
}

static inline int64_t att_fwd_floats(const att_dims *a, bool b16)
{
    return a->d * a->tp + ATT_QB * (ATT_BK + 2 * a->d) + (b16 ? a->t * a->d : 0);
}

/* The floats a thread's backward tiles take. */
static inline int64_t att_bwd_floats(const att_dims *a, bool b16)
{
    return 2 * a->d * a->tp + a->rep * a->t + 2 * ATT_BK * (a->d + ATT_BQ) +
           (b16 ? 2 * ATT_BQ * a->d + (1 + a->rep) * a->t * a->d : 0);
}

/* One task's kernels, at each width: the forward of (batch row bi, head
 * h) of x's own rows, the backward of (batch row bi, k and v head g), and
 * the forward of src's queries against a KV cache; buf holds the floats
 * above; b16: x, y, dy, dx bf16 storage, else FP32.  The _w16 ones need
 * AVX-512; gp_cpu_att_w16_built says whether this build has them (else
 * they call the _w8 ones). */
bool gp_cpu_att_w16_built(void);
void gp_cpu_att_fwd_w16(const att_dims *a, const void *x, void *y, float *lse, int64_t bi,
                        int64_t h, float *buf, bool b16);
void gp_cpu_att_bwd_w16(const att_dims *a, const void *x, const void *y, const float *lse,
                        const void *dy, void *dx, int64_t bi, int64_t g, float *buf, bool b16);
void gp_cpu_att_cached_w16(const att_dims *a, const att_src *src, float *buf, bool b16);
void gp_cpu_att_fwd_w8(const att_dims *a, const void *x, void *y, float *lse, int64_t bi,
                       int64_t h, float *buf, bool b16);
void gp_cpu_att_bwd_w8(const att_dims *a, const void *x, const void *y, const float *lse,
                       const void *dy, void *dx, int64_t bi, int64_t g, float *buf, bool b16);
void gp_cpu_att_cached_w8(const att_dims *a, const att_src *src, float *buf, bool b16);

#endif /* GP_CPU_ATTENTION_H */
