/*
 * cpu_pool.c — max and average pooling on plain NCHW with OpenMP loops over
 * the N*C planes.
 *
 * Why not oneDNN: on plain layouts its training forward is the reference
 * `simple_nchw` kernel (4.2 ms forward + 4.5 ms backward for 2x2 max
 * pooling of (128, 64, 28, 28) on 2 cores); one plane (a few KiB) at a time
 * stays in L1 here, so the tensor is read once and written once.
 *
 * Max pooling keeps, per output element, the position of the (first)
 * maximum inside its window in the workspace: one byte when the window has
 * at most 256 elements, else an int32.  Average pooling divides by the
 * number of elements inside the image (GP_POOL_AVG, PyTorch's
 * count_include_pad=False) or by kh * kw (GP_POOL_AVG_INCLUDE_PAD, the
 * padded window, PyTorch's default) and needs no workspace.  Every axis
 * has its own kernel, stride and padding.
 *
 * On a channel-blocked layout (backend.h; a stage's chain between two
 * convolutions) one loop serves every kind: each window is scanned in the
 * plain loops' order for the block's channels at once, so the maximum, its
 * position (the first on ties) and the sums are those of the plain layout,
 * bit for bit; the workspace then lies in the blocked order too.  With
 * plain_out the output (and dy) is plain: a chain that ends in a pool
 * (conv -> bn -> relu -> max pool -> flatten) converts as it pools.
 */
#include "backend/cpu/cpu_impl.h"
#include "backend/elementwise.h"

#include <omp.h>
#include <string.h>

static gp_status pool_check(gp_device *dev, const gp_pool_desc *d)
{
    if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->kh <= 0 || d->kw <= 0 ||
        d->sh <= 0 || d->sw <= 0 || d->ph < 0 || d->pw < 0 || d->oh <= 0 || d->ow <= 0 ||
        d->ph >= d->kh || d->pw >= d->kw || (d->oh - 1) * d->sh - d->ph >= d->h ||
        (d->ow - 1) * d->sw - d->pw >= d->w || (d->oh - 1) * d->sh + d->kh > d->h + 2 * d->ph ||
        (d->ow - 1) * d->sw + d->kw > d->w + 2 * d->pw ||
        (d->kind != GP_POOL_MAX && d->kind != GP_POOL_AVG &&
         d->kind != GP_POOL_AVG_INCLUDE_PAD) ||
        !gp_blk_valid(d->blk, d->c) || (d->plain_out && !d->blk))
        return gp_error_set(GP_ERR_INVALID,
                            "device %s: invalid pooling (kind %d n=%lld c=%lld h=%lld w=%lld "
                            "kernel %lldx%lld stride %lldx%lld pad %lldx%lld output %lldx%lld, "
                            "block %lld%s); padding must be smaller than the kernel, every "
                            "window must overlap the image and end inside the padding, a "
                            "channel block is 8 or 16 and divides the channels (or is all of "
                            "them, a multiple of 8: channels-last), and a plain output needs a "
                            "blocked input",
                            dev->name, (int)d->kind, (long long)d->n, (long long)d->c,
                            (long long)d->h, (long long)d->w, (long long)d->kh, (long long)d->kw,
                            (long long)d->sh, (long long)d->sw, (long long)d->ph,
                            (long long)d->pw, (long long)d->oh, (long long)d->ow,
                            (long long)d->blk, d->plain_out ? ", plain out" : "");
    return GP_OK;
}

static int ws_wide(const gp_pool_desc *d) { return d->kh * d->kw > 256; }

/* The divisor of an average window clipped to the image (pool_check has
 * made sure no window reaches past the padding). */
static inline float avg_count(const gp_pool_desc *d, int64_t rows, int64_t cols)
{
    return d->kind == GP_POOL_AVG_INCLUDE_PAD ? (float)(d->kh * d->kw) : (float)(rows * cols);
}

size_t gp_cpu_pool_ws_bytes(gp_device *dev, const gp_pool_desc *d)
{
    if (d->kind != GP_POOL_MAX) return 0;
    return (size_t)(d->n * d->c * d->oh * d->ow) * (ws_wide(d) ? sizeof(int32_t) : 1);
}

/* The window of output (oh, ow) clipped to the image: rows [i0, i1), cols
 * [j0, j1); the window's own origin is (oh*sh - ph, ow*sw - pw). */
typedef struct win { int64_t r0, c0, i0, i1, j0, j1; } win;

static inline win window(const gp_pool_desc *d, int64_t oh, int64_t ow)
{
    win v;
    v.r0 = oh * d->sh - d->ph;
    v.c0 = ow * d->sw - d->pw;
    v.i0 = v.r0 < 0 ? 0 : v.r0;
    v.j0 = v.c0 < 0 ? 0 : v.c0;
    v.i1 = v.r0 + d->kh < d->h ? v.r0 + d->kh : d->h;
    v.j1 = v.c0 + d->kw < d->w ? v.c0 + d->kw : d->w;
    return v;
}

/* Where max-pooling's workspace position a (row-major in the window) lies
 * from the window's origin in a plane of rows w apart: the backward's
 * divisions by kw done once for the window's at most 256 positions (the
 * uint8 workspace; a wider window divides per element). */
typedef struct arg_offs { int64_t o[256]; } arg_offs;

static inline void arg_offsets(const gp_pool_desc *d, arg_offs *t)
{
    for (int64_t a = 0; a < d->kh * d->kw && a < 256; a++) t->o[a] = a / d->kw * d->w + a % d->kw;
}

/* ---- blocked layouts ------------------------------------------------------ */

#define POOL_MAX_BLOCK 16

/* B channels of one block plane (P channels of one sample: the block, or
 * a channels-last C, each pixel's P values contiguous): x (H, W, P), y
 * (OH, OW, P), or with plain_out y as P plain planes (P, OH, OW): output
 * pixel q of lane b at yp[q * ys + b * yl].  The workspace is (OH, OW, P)
 * either way; xp, yp and wsp point at the unit's first channel. */
static inline __attribute__((always_inline)) void
fwd_block(const gp_pool_desc *d, const float *xp, float *yp, void *wsp, int wide, const int64_t B,
          const int64_t P, int64_t ys, int64_t yl)
{
    const int max = d->kind == GP_POOL_MAX;
    for (int64_t oh = 0; oh < d->oh; oh++)
        for (int64_t ow = 0; ow < d->ow; ow++) {
            win v = window(d, oh, ow);
            int64_t q = oh * d->ow + ow, o = q * P;
            if (max) {
                float best[POOL_MAX_BLOCK];
                int32_t arg[POOL_MAX_BLOCK];
                const float *f = xp + (v.i0 * d->w + v.j0) * P;
                int32_t a0 = (int32_t)((v.i0 - v.r0) * d->kw + (v.j0 - v.c0));
#pragma omp simd
                for (int64_t b = 0; b < B; b++) best[b] = f[b], arg[b] = a0;
                for (int64_t i = v.i0; i < v.i1; i++)
                    for (int64_t j = v.j0; j < v.j1; j++) {
                        const float *e = xp + (i * d->w + j) * P;
                        int32_t a = (int32_t)((i - v.r0) * d->kw + (j - v.c0));
#pragma omp simd
                        for (int64_t b = 0; b < B; b++) {
                            bool gt = e[b] > best[b];
                            best[b] = gt ? e[b] : best[b];
                            arg[b] = gt ? a : arg[b];
                        }
                    }
                for (int64_t b = 0; b < B; b++) yp[q * ys + b * yl] = best[b];
                if (wsp) {
                    if (wide)
                        for (int64_t b = 0; b < B; b++) ((int32_t *)wsp)[o + b] = arg[b];
                    else
                        for (int64_t b = 0; b < B; b++) ((uint8_t *)wsp)[o + b] = (uint8_t)arg[b];
                }
            } else {
                float sum[POOL_MAX_BLOCK];
                for (int64_t b = 0; b < B; b++) sum[b] = 0.0f;
                for (int64_t i = v.i0; i < v.i1; i++)
                    for (int64_t j = v.j0; j < v.j1; j++) {
                        const float *e = xp + (i * d->w + j) * P;
#pragma omp simd
                        for (int64_t b = 0; b < B; b++) sum[b] += e[b];
                    }
                float cnt = avg_count(d, v.i1 - v.i0, v.j1 - v.j0);
                for (int64_t b = 0; b < B; b++) yp[q * ys + b * yl] = sum[b] / cnt;
            }
        }
}

/* fwd_block's backward: dp (H, W, P) zeroed by the caller. */
static inline __attribute__((always_inline)) void
bwd_block(const gp_pool_desc *d, const float *gp, float *dp, const void *wsp, int wide,
          const int64_t B, const int64_t P, int64_t ys, int64_t yl)
{
    const int max = d->kind == GP_POOL_MAX;
    arg_offs t;
    if (max && !wide) arg_offsets(d, &t);
    for (int64_t oh = 0; oh < d->oh; oh++)
        for (int64_t ow = 0; ow < d->ow; ow++) {
            win v = window(d, oh, ow);
            int64_t q = oh * d->ow + ow, o = q * P, org = v.r0 * d->w + v.c0;
            if (max && !wide) {
                const uint8_t *a = (const uint8_t *)wsp + o;
                for (int64_t b = 0; b < B; b++)
                    dp[(org + t.o[a[b]]) * P + b] += gp[q * ys + b * yl];
            } else if (max) {
                for (int64_t b = 0; b < B; b++) {
                    int64_t arg = ((const int32_t *)wsp)[o + b];
                    int64_t i = v.r0 + arg / d->kw, j = v.c0 + arg % d->kw;
                    dp[(i * d->w + j) * P + b] += gp[q * ys + b * yl];
                }
            } else {
                float g[POOL_MAX_BLOCK];
                float cnt = avg_count(d, v.i1 - v.i0, v.j1 - v.j0);
                for (int64_t b = 0; b < B; b++) g[b] = gp[q * ys + b * yl] / cnt;
                for (int64_t i = v.i0; i < v.i1; i++)
                    for (int64_t j = v.j0; j < v.j1; j++) {
                        float *e = dp + (i * d->w + j) * P;
#pragma omp simd
                        for (int64_t b = 0; b < B; b++) e[b] += g[b];
                    }
            }
        }
}

/* One block plane, a unit of 16 or 8 channels at a time (one unit for
 * nChw16c and nChw8c, whose pixel stride is then a constant); forward and
 * backward apart, each body inlined four times. */
#define POOL_UNITS(body)                                                                      \
    const int wide = ws_wide(d);                                                              \
    const int64_t P = d->blk, B = gp_blk_unit(P), ohw = d->oh * d->ow;                        \
    const int64_t ys = d->plain_out ? 1 : P, yl = d->plain_out ? ohw : 1;                     \
    const size_t wsz = wide ? sizeof(int32_t) : 1;                                            \
    for (int64_t u = 0; u < P; u += B) {                                                      \
        void *w = ws ? (char *)ws + (size_t)u * wsz : NULL;                                   \
        CPU_BLK_CALL(P, body);                                                                \
    }

GP_CPU_LOOPS
static void pool_block_fwd(const gp_pool_desc *d, const float *in, float *out, void *ws)
{
#define FWD_UNIT(b, p) fwd_block(d, in + u, out + u * yl, w, wide, b, p, ys, yl)
    POOL_UNITS(FWD_UNIT)
#undef FWD_UNIT
}

GP_CPU_LOOPS
static void pool_block_bwd(const gp_pool_desc *d, const float *in, float *out, void *ws)
{
    memset(out, 0, (size_t)(d->h * d->w * d->blk) * sizeof(float));
#define BWD_UNIT(b, p) bwd_block(d, in + u * yl, out + u, w, wide, b, p, ys, yl)
    POOL_UNITS(BWD_UNIT)
#undef BWD_UNIT
}
#undef POOL_UNITS

static void pool_block_plane(const gp_pool_desc *d, bool fwd, const float *in, float *out,
                             void *ws)
{
    if (fwd) pool_block_fwd(d, in, out, ws);
    else pool_block_bwd(d, in, out, ws);
}

/* The maximum of a 2x2 window read in scan order (a, b / c, e), and its
 * position: the first on ties, as the generic loop. */
static inline __attribute__((always_inline)) float max4(float a, float b, float c, float e,
                                                        uint8_t *pos)
{
    float m = a;
    uint8_t k = 0;
    k = b > m ? 1 : k; m = b > m ? b : m;
    k = c > m ? 2 : k; m = c > m ? c : m;
    k = e > m ? 3 : k; m = e > m ? e : m;
    *pos = k;
    return m;
}

/* 2x2 stride-2 max pooling without padding (the common case): branch-free
 * selects over a row of outputs, which the compiler vectorises. */
GP_CPU_LOOPS
static void max2x2_plane(const gp_pool_desc *d, const float *xp, float *yp, uint8_t *wp)
{
    for (int64_t oh = 0; oh < d->oh; oh++) {
        const float *r0 = xp + 2 * oh * d->w, *r1 = r0 + d->w;
        float *yo = yp + oh * d->ow;
        uint8_t *wo = wp ? wp + oh * d->ow : NULL;
#pragma omp simd
        for (int64_t ow = 0; ow < d->ow; ow++) {
            uint8_t k;
            yo[ow] = max4(r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1], &k);
            if (wo) wo[ow] = k;
        }
    }
}

/* 2x2 stride-2 max pooling without padding on a plane of short rows (ow
 * under 16, less than one AVX-512 vector: max2x2_plane's loop then ran
 * only its scalar tail, a branch per output, which after a relu
 * mispredicts half the time: 0.31 ms a call for (16, 64, 14, 14) inside a
 * pipeline's stage, 3.7x the blocked layout's; bench/README.md, "Chains
 * cut at a stage's edge"): every output of the plane in one loop, its
 * window's top-left at tab[o] (gather_table), the same selects in the same
 * order, so the same bits.  Not cloned: the x86-64 baseline's four lanes
 * load each element on their own, which on this processor ran the shape
 * above in 0.056 ms, AVX2's gathers in 0.060, AVX-512's in 0.107. */
static inline __attribute__((always_inline)) void
max2x2_gather_run(int64_t n, int32_t w, const int32_t *restrict tab, const float *restrict xp,
                  float *restrict yp, uint8_t *restrict wp, const bool keep)
{
#pragma omp simd
    for (int64_t o = 0; o < n; o++) {
        int32_t i = tab[o];
        uint8_t k;
        yp[o] = max4(xp[i], xp[i + 1], xp[i + w], xp[i + w + 1], &k);
        if (keep) wp[o] = k;
    }
}

/* (a function of its own, not inlined into the OpenMP region, and the
 * workspace's store decided outside the loop: either way GCC left it
 * scalar) */
static __attribute__((noinline)) void max2x2_gather(const gp_pool_desc *d, const int32_t *tab,
                                                    const float *xp, float *yp, uint8_t *wp)
{
    const int64_t n = d->oh * d->ow;
    if (wp) max2x2_gather_run(n, (int32_t)d->w, tab, xp, yp, wp, true);
    else max2x2_gather_run(n, (int32_t)d->w, tab, xp, yp, NULL, false);
}

enum { GATHER_MAX = 4096 }; /* outputs of a plane max2x2_gather takes */

static bool is_max2x2(const gp_pool_desc *d)
{
    return d->kind == GP_POOL_MAX && d->kh == 2 && d->kw == 2 && d->sh == 2 && d->sw == 2 &&
           d->ph == 0 && d->pw == 0;
}

/* tab[o]: output o's window's top-left in its plane, where a plain forward
 * takes max2x2_gather (false: it does not). */
static bool gather_table(const gp_pool_desc *d, bool fwd, int32_t *tab)
{
    if (d->blk || !fwd || !is_max2x2(d) || d->ow >= 16 || d->oh * d->ow > GATHER_MAX)
        return false;
    for (int64_t r = 0; r < d->oh; r++)
        for (int64_t c = 0; c < d->ow; c++) tab[r * d->ow + c] = (int32_t)(2 * r * d->w + 2 * c);
    return true;
}

/* One plain plane, forward: the generic window loop. */
GP_CPU_LOOPS
static void fwd_plane(const gp_pool_desc *d, const float *xp, float *yp, void *wsp)
{
    const int max = d->kind == GP_POOL_MAX, wide = ws_wide(d);
    for (int64_t oh = 0; oh < d->oh; oh++)
        for (int64_t ow = 0; ow < d->ow; ow++) {
            win v = window(d, oh, ow);
            int64_t o = oh * d->ow + ow;
            if (max) {
                float best = xp[v.i0 * d->w + v.j0];
                int64_t arg = (v.i0 - v.r0) * d->kw + (v.j0 - v.c0);
                for (int64_t i = v.i0; i < v.i1; i++)
                    for (int64_t j = v.j0; j < v.j1; j++)
                        if (xp[i * d->w + j] > best) {
                            best = xp[i * d->w + j];
                            arg = (i - v.r0) * d->kw + (j - v.c0);
                        }
                yp[o] = best;
                if (wsp) {
                    if (wide) ((int32_t *)wsp)[o] = (int32_t)arg;
                    else ((uint8_t *)wsp)[o] = (uint8_t)arg;
                }
            } else {
                float sum = 0.0f;
                for (int64_t i = v.i0; i < v.i1; i++)
                    for (int64_t j = v.j0; j < v.j1; j++) sum += xp[i * d->w + j];
                yp[o] = sum / avg_count(d, v.i1 - v.i0, v.j1 - v.j0);
            }
        }
}

/* One plain plane, backward: the plane is in L1; zero it, then add each
 * window's share. */
GP_CPU_LOOPS
static void bwd_plane(const gp_pool_desc *d, const float *gp, float *dp, const void *wsp)
{
    const int max = d->kind == GP_POOL_MAX, wide = ws_wide(d);
    memset(dp, 0, (size_t)(d->h * d->w) * sizeof(float));
    arg_offs t;
    if (max && !wide) arg_offsets(d, &t);
    if (max && !wide && d->ph == 0 && d->pw == 0) {
        /* no padding: every window inside the image, its origin (oh sh,
         * ow sw); the same additions without window()'s clipping (2.6x
         * faster on 14 x 14 planes) */
        for (int64_t oh = 0; oh < d->oh; oh++) {
            float *row = dp + oh * d->sh * d->w;
            const float *g = gp + oh * d->ow;
            const uint8_t *k = (const uint8_t *)wsp + oh * d->ow;
            for (int64_t ow = 0; ow < d->ow; ow++) row[ow * d->sw + t.o[k[ow]]] += g[ow];
        }
        return;
    }
    for (int64_t oh = 0; oh < d->oh; oh++)
        for (int64_t ow = 0; ow < d->ow; ow++) {
            win v = window(d, oh, ow);
            int64_t o = oh * d->ow + ow;
            if (max && !wide) {
                dp[v.r0 * d->w + v.c0 + t.o[((const uint8_t *)wsp)[o]]] += gp[o];
            } else if (max) {
                int64_t arg = ((const int32_t *)wsp)[o];
                int64_t i = v.r0 + arg / d->kw, j = v.c0 + arg % d->kw;
                dp[i * d->w + j] += gp[o];
            } else {
                float g = gp[o] / avg_count(d, v.i1 - v.i0, v.j1 - v.j0);
                for (int64_t i = v.i0; i < v.i1; i++)
                    for (int64_t j = v.j0; j < v.j1; j++) dp[i * d->w + j] += g;
            }
        }
}

/* The planes the loops run over: (n, c) plain, (n, c / B) blocked, each
 * reading `in_len` values from in + p in_len and writing `out_len` at out
 * + p out_len (plain_out: a blocked plane's B channels' planes follow each
 * other), its workspace at p oh ow B of ws_wide's size. */
typedef struct {
    int64_t planes, in_len, out_len;
    size_t ws_len;
} pool_planes;

static pool_planes planes_of(const gp_pool_desc *d, bool fwd)
{
    const int64_t B = d->blk ? d->blk : 1, hw = d->h * d->w * B, ohw = d->oh * d->ow * B;
    pool_planes q = {d->n * (d->c / B), fwd ? hw : ohw, fwd ? ohw : hw, 0};
    q.ws_len = (size_t)ohw * (ws_wide(d) ? sizeof(int32_t) : 1);
    return q;
}

/* Plane p: forward from x's plane into y's (and its workspace), or
 * backward from dy's plane into dx's. */
static void pool_plane(const gp_pool_desc *d, bool fwd, const float *in, float *out, void *ws,
                       const int32_t *tab)
{
    if (d->blk) pool_block_plane(d, fwd, in, out, ws);
    else if (!fwd) bwd_plane(d, in, out, ws);
    else if (tab) max2x2_gather(d, tab, in, out, ws);
    else if (is_max2x2(d)) max2x2_plane(d, in, out, ws);
    else fwd_plane(d, in, out, ws);
}

static void pool_planes_run(gp_device *dev, const gp_pool_desc *d, bool fwd, const float *in,
                            float *out, const void *ws)
{
    const pool_planes q = planes_of(d, fwd);
    int nt = dev->threads;
    int32_t tab[GATHER_MAX];
    const int32_t *t = gather_table(d, fwd, tab) ? tab : NULL;
#pragma omp parallel for schedule(static) num_threads(nt) if (q.planes * q.in_len >= 32768)
    for (int64_t p = 0; p < q.planes; p++)
        pool_plane(d, fwd, in + p * q.in_len, out + p * q.out_len,
                   ws ? (char *)ws + (size_t)p * q.ws_len : NULL, t);
}

static gp_status need_ws(gp_device *dev, const gp_pool_desc *d, const void *ws)
{
    if (d->kind != GP_POOL_MAX || ws) return GP_OK;
    return gp_error_set(GP_ERR_INVALID,
                        "device %s: max-pooling backward needs the workspace written by "
                        "pool_fwd (pool_ws_bytes = %zu bytes)", dev->name,
                        gp_cpu_pool_ws_bytes(dev, d));
}

gp_status gp_cpu_pool_fwd(gp_device *dev, const gp_pool_desc *d, const float *x, float *y,
                          void *ws)
{
    GP_TRY(pool_check(dev, d));
    pool_planes_run(dev, d, true, x, y, ws);
    return GP_OK;
}

gp_status gp_cpu_pool_bwd(gp_device *dev, const gp_pool_desc *d, const float *x,
                          const float *y, const float *dy, float *dx, const void *ws)
{
    GP_TRY(pool_check(dev, d));
    GP_TRY(need_ws(dev, d, ws));
    pool_planes_run(dev, d, false, dy, dx, ws);
    return GP_OK;
}

/* ---- on bf16 storage (backend.h's pool_fwd_bf16, pool_bwd_bf16): each
 * plane widened into an FP32 tile of its thread's (in the arena), pooled
 * by the loops above into a second tile and rounded once: the adapter's
 * bits, with two planes of FP32 per thread instead of whole tensors. */

static gp_status pool_bf16(gp_device *dev, const gp_pool_desc *d, bool fwd, const uint16_t *in,
                           uint16_t *out, void *ws)
{
    const pool_planes q = planes_of(d, fwd);
    const int64_t per = q.in_len + q.out_len;
    const bool par = q.planes * q.in_len >= 32768;
    const int nt = par ? dev->threads : 1;
    GP_TRY(gp_cpu_arena_reserve(dev, (size_t)nt * (size_t)per * sizeof(float)));
    float *arena = gp_cpu_ctx_of(dev)->arena;
    int32_t tab[GATHER_MAX];
    const int32_t *t = gather_table(d, fwd, tab) ? tab : NULL;
#pragma omp parallel num_threads(nt) if (par)
    {
        float *ti = arena + (size_t)omp_get_thread_num() * (size_t)per, *to = ti + q.in_len;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < q.planes; p++) {
            gp_cpu_widen_run(ti, in + p * q.in_len, q.in_len);
            pool_plane(d, fwd, ti, to, ws ? (char *)ws + (size_t)p * q.ws_len : NULL, t);
            gp_cpu_round_run(out + p * q.out_len, to, q.out_len);
        }
    }
    return GP_OK;
}

gp_status gp_cpu_pool_fwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               uint16_t *y, void *ws)
{
    GP_TRY(pool_check(dev, d));
    return pool_bf16(dev, d, true, x, y, ws);
}

gp_status gp_cpu_pool_bwd_bf16(gp_device *dev, const gp_pool_desc *d, const uint16_t *x,
                               const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                               const void *ws)
{
    GP_TRY(pool_check(dev, d));
    GP_TRY(need_ws(dev, d, ws));
    return pool_bf16(dev, d, false, dy, dx, (void *)ws);
}
