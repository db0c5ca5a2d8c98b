/*
 * bench_products.c — the single-precision products of bench/mlp.yaml and
 * configs/tiny-gpt.yaml, forward and both backward products, through every
 * matrix library a user can install from Debian or PyPI (issue 76, item 3):
 *
 *   gpipe    gp_dev_gemm on a CPU device: the path training takes today
 *            (oneDNN's sgemm, a short wide A B^T run transposed)
 *   onednn   oneDNN's dnnl_sgemm as is (Debian's libdnnl 2.6)
 *   matmul   oneDNN's matmul primitive (f32, plain strides), made once per
 *            shape
 *   openblas OpenBLAS's cblas_sgemm (Debian's libopenblas0-pthread 0.3.21)
 *   blis     BLIS's cblas_sgemm (Debian's libblis4-pthread 0.9.0)
 *   mkl      MKL's cblas_sgemm (PyPI's `mkl` wheel: libmkl_rt, GNU OpenMP
 *            threading so it shares gpipe's libgomp)
 *
 * The libraries other than oneDNN are opened with dlopen, so a missing one
 * is a row that says so, never a build failure.  Every call is checked
 * against a double-precision reference on a sample of entries (the largest
 * relative error is printed), then timed: median of repetitions after
 * warm-ups, 2 threads by default.  Per model, the sum over one training
 * step's products (each shape times its count in the step, from a logged
 * run) for every library, and for the best library per shape.
 *
 *   bench_products [--threads N] [--isa native|avx2] [--mkl PATH]
 *                  [--only mlp|gpt] [--interleave]
 *
 * --interleave times the libraries in turn, one call each a round, rather
 * than each library's repetitions back to back: what a step that took
 * each shape from a different library would see, each library's idle
 * threads spinning beside the next one's (OpenBLAS's pthreads against
 * libgomp's on 2 cores: bench/README.md).
 *
 * --isa avx2 caps every library at AVX2 as an AVX2-only processor would run
 * it: GPIPE_CPU_ISA=avx2 (oneDNN), OPENBLAS_CORETYPE=Haswell,
 * BLIS_ARCH_TYPE=haswell's id, MKL_ENABLE_INSTRUCTIONS=AVX2; each library's
 * own report of the kernel it picked is printed where it has one.  This caps
 * instruction sets, not caches: the figures say "capped".  Never fails.
 */
#include "backend/backend.h"
#include "bench_util.h"

#include <dlfcn.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);

typedef struct prod {
    const char *model, *what;
    int ta, tb;
    int64_t m, n, k;
    int count; /* calls in one training step */
} prod;

/* One training step's products (row-major C(m, n) = op(A) op(B)), as
 * gp_dev_gemm sees them: bench/mlp.yaml at batch 256 on one device, and
 * configs/tiny-gpt.yaml on one device of batch 32 x 128 positions, one
 * micro-batch (bench_gpt_cpu.py's one-device layout). */
static const prod prods[] = {
    {"mlp", "linear 2048 fwd", 0, 1, 256, 2048, 2048, 6},
    {"mlp", "linear 2048 bwd-data", 0, 0, 256, 2048, 2048, 6},
    {"mlp", "linear 2048 bwd-weights", 1, 0, 2048, 2048, 256, 6},
    {"mlp", "linear 784 fwd", 0, 1, 256, 2048, 784, 1},
    {"mlp", "linear 784 bwd-weights", 1, 0, 2048, 784, 256, 1},
    {"gpt", "qkv fwd", 0, 1, 4096, 384, 128, 4},
    {"gpt", "proj fwd", 0, 1, 4096, 128, 128, 4},
    {"gpt", "fc fwd", 0, 1, 4096, 512, 128, 4},
    {"gpt", "fc2 fwd", 0, 1, 4096, 128, 512, 4},
    {"gpt", "head fwd", 0, 1, 4096, 256, 128, 1},
    {"gpt", "qkv bwd-data", 0, 0, 4096, 128, 384, 4},
    {"gpt", "proj bwd-data", 0, 0, 4096, 128, 128, 4},
    {"gpt", "fc bwd-data", 0, 0, 4096, 128, 512, 4},
    {"gpt", "fc2 bwd-data", 0, 0, 4096, 512, 128, 4},
    {"gpt", "head bwd-data", 0, 0, 4096, 128, 256, 1},
    {"gpt", "qkv bwd-weights", 1, 0, 384, 128, 4096, 4},
    {"gpt", "proj bwd-weights", 1, 0, 128, 128, 4096, 4},
    {"gpt", "fc bwd-weights", 1, 0, 512, 128, 4096, 4},
    {"gpt", "fc2 bwd-weights", 1, 0, 128, 512, 4096, 4},
    {"gpt", "head bwd-weights", 1, 0, 256, 128, 4096, 1},
};
#define NPRODS (int)(sizeof prods / sizeof prods[0])

enum { L_GPIPE, L_ONEDNN, L_MATMUL, L_OPENBLAS, L_BLIS, L_MKL, NLIBS };
static const char *lib_names[NLIBS] = {"gpipe", "onednn", "matmul", "openblas", "blis", "mkl"};
static cblas_sgemm_fn cblas[NLIBS];
static gp_device *dev;
static int threads = 2;

static void *open_lib(const char **paths, const char *what)
{
    for (int i = 0; paths[i]; i++) {
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    printf("  %-8s not found (%s)\n", what, paths[0]);
    return NULL;
}

static void open_libs(const char *mkl_path)
{
    const char *ob[] = {"/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
                        "libopenblas.so.0", NULL};
    void *h = open_lib(ob, "openblas");
    if (h) {
        cblas[L_OPENBLAS] = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
        void (*set)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
        char *(*core)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
        if (set) set(threads);
        printf("  openblas core %s\n", core ? core() : "?");
    }
    const char *bl[] = {"/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4", "libblis.so.4",
                        NULL};
    h = open_lib(bl, "blis");
    if (h) {
        cblas[L_BLIS] = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
        void (*set)(long) = (void (*)(long))dlsym(h, "bli_thread_set_num_threads");
        int (*id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
        const char *(*name)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
        if (set) set(threads);
        if (id && name) printf("  blis arch %s\n", name(id()));
    }
    const char *mk[] = {mkl_path, "/opt/gpipe-mkl/lib/libmkl_rt.so.3",
                        "/opt/gpipe-mkl/lib/libmkl_rt.so.2", "libmkl_rt.so.3", "libmkl_rt.so.2",
                        NULL};
    h = open_lib(mkl_path ? mk : mk + 1, "mkl");
    if (h) {
        cblas[L_MKL] = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
        void (*set)(int) = (void (*)(int))dlsym(h, "MKL_Set_Num_Threads");
        if (set) set(threads);
        void (*ver)(char *, int) = (void (*)(char *, int))dlsym(h, "MKL_Get_Version_String");
        if (ver) {
            char v[256];
            ver(v, sizeof v);
            printf("  mkl %s\n", v);
        }
    }
}

/* oneDNN's matmul primitive for one shape: A, B, C plain row-major with the
 * transposes as strides. */
typedef struct mm { dnnl_primitive_t p; dnnl_engine_t eng; dnnl_stream_t st; } mm;

static bool mm_make(mm *x, const prod *p)
{
    memset(x, 0, sizeof *x);
    if (dnnl_engine_create(&x->eng, dnnl_cpu, 0) != dnnl_success) return false;
    if (dnnl_stream_create(&x->st, x->eng, dnnl_stream_default_flags) != dnnl_success) return false;
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t ad = {p->m, p->k}, bd = {p->k, p->n}, cd = {p->m, p->n};
    dnnl_dims_t as = {p->ta ? 1 : p->k, p->ta ? p->m : 1};
    dnnl_dims_t bs = {p->tb ? 1 : p->n, p->tb ? p->k : 1};
    dnnl_dims_t cs = {p->n, 1};
    dnnl_memory_desc_init_by_strides(&a, 2, ad, dnnl_f32, as);
    dnnl_memory_desc_init_by_strides(&b, 2, bd, dnnl_f32, bs);
    dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs);
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) != dnnl_success) return false;
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_desc_create(&pd, &md, NULL, x->eng, NULL) != dnnl_success) return false;
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    static int said;
    if (!said++) printf("  matmul impl %s\n", impl ? impl : "?");
    bool ok = dnnl_primitive_create(&x->p, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    return ok;
}

static void mm_run(mm *x, const prod *p, const float *a, const float *b, float *c)
{
    dnnl_memory_t ma, mb, mc;
    dnnl_dims_t ad = {p->m, p->k}, bd = {p->k, p->n}, cd = {p->m, p->n};
    dnnl_dims_t as = {p->ta ? 1 : p->k, p->ta ? p->m : 1};
    dnnl_dims_t bs = {p->tb ? 1 : p->n, p->tb ? p->k : 1};
    dnnl_dims_t cs = {p->n, 1};
    dnnl_memory_desc_t da, db, dc;
    dnnl_memory_desc_init_by_strides(&da, 2, ad, dnnl_f32, as);
    dnnl_memory_desc_init_by_strides(&db, 2, bd, dnnl_f32, bs);
    dnnl_memory_desc_init_by_strides(&dc, 2, cd, dnnl_f32, cs);
    dnnl_memory_create(&ma, &da, x->eng, (void *)a);
    dnnl_memory_create(&mb, &db, x->eng, (void *)b);
    dnnl_memory_create(&mc, &dc, x->eng, c);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    dnnl_primitive_execute(x->p, x->st, 3, args);
    dnnl_stream_wait(x->st);
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
}

static void mm_free(mm *x)
{
    if (x->p) dnnl_primitive_destroy(x->p);
    if (x->st) dnnl_stream_destroy(x->st);
    if (x->eng) dnnl_engine_destroy(x->eng);
}

static bool run(int lib, const prod *p, mm *x, const float *a, const float *b, float *c)
{
    int64_t lda = p->ta ? p->m : p->k, ldb = p->tb ? p->k : p->n;
    switch (lib) {
    case L_GPIPE:
        return gp_dev_gemm(dev, p->ta, p->tb, p->m, p->n, p->k, 1.0f, a, lda, b, ldb, 0.0f, c,
                           p->n) == GP_OK;
    case L_ONEDNN:
        return dnnl_sgemm(p->ta ? 'T' : 'N', p->tb ? 'T' : 'N', p->m, p->n, p->k, 1.0f, a, lda, b,
                          ldb, 0.0f, c, p->n) == dnnl_success;
    case L_MATMUL:
        if (!x->p) return false;
        mm_run(x, p, a, b, c);
        return true;
    default:
        if (!cblas[lib]) return false;
        cblas[lib](ROW_MAJOR, p->ta ? TRANS : NO_TRANS, p->tb ? TRANS : NO_TRANS, (int)p->m,
                   (int)p->n, (int)p->k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, c, (int)p->n);
        return true;
    }
}

/* Largest |c - ref| / (sum |a||b|) over a sample of entries, in double. */
static double check(const prod *p, const float *a, const float *b, const float *c)
{
    double worst = 0;
    for (int s = 0; s < 64; s++) {
        int64_t i = (s * 7919) % p->m, j = (s * 104729) % p->n;
        double ref = 0, mag = 0;
        for (int64_t l = 0; l < p->k; l++) {
            double x = p->ta ? a[l * p->m + i] : a[i * p->k + l];
            double y = p->tb ? b[j * p->k + l] : b[l * p->n + j];
            ref += x * y;
            mag += fabs(x * y);
        }
        double e = fabs(c[i * p->n + j] - ref) / (mag > 0 ? mag : 1);
        if (e > worst) worst = e;
    }
    return worst;
}

int main(int argc, char **argv)
{
    const char *isa = "native", *mkl_path = NULL, *only = NULL;
    bool interleave = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) isa = argv[++i];
        else if (!strcmp(argv[i], "--mkl") && i + 1 < argc) mkl_path = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--interleave")) interleave = true;
        else {
            fprintf(stderr, "usage: bench_products [--threads N] [--isa native|avx2] "
                            "[--mkl PATH] [--only mlp|gpt] [--interleave]\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (threads <= 0) threads = 2;
    if (!strcmp(isa, "avx2")) {
        /* before any library reads its switch (each reads it once, at load) */
        setenv("GPIPE_CPU_ISA", "avx2", 1);
        setenv("OPENBLAS_CORETYPE", "Haswell", 1);
        setenv("BLIS_ARCH_TYPE", "3", 1); /* BLIS 0.9's arch_t: BLIS_ARCH_HASWELL */
        setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2", 1);
    } else if (strcmp(isa, "native")) {
        fprintf(stderr, "bench_products: --isa takes native or avx2\n");
        return 2;
    }
    setenv("MKL_THREADING_LAYER", "GNU", 1);
    gp_log_set_level(GP_LOG_WARN);
    gp_device_opts o = {.threads = threads};
    if (gp_device_open("cpu:0", &o, &dev) != GP_OK) {
        fprintf(stderr, "bench_products: %s\n", gp_last_error());
        return 0;
    }
    gp_device_bind_thread(dev);
    char cpu[512];
    gp_bench_cpu_name(cpu, sizeof cpu);
    printf("bench_products: %d threads, %s\n", threads, cpu);
    open_libs(mkl_path);

    double best_sum[2] = {0}, lib_sum[2][NLIBS] = {{0}};
    int best_count[2][NLIBS] = {{0}};
    printf("\n| model | product | shape (m n k) | %s | fastest |\n", "GFLOP/s: gpipe | onednn | "
           "matmul | openblas | blis | mkl");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int q = 0; q < NPRODS; q++) {
        const prod *p = &prods[q];
        int mi = !strcmp(p->model, "gpt");
        if (only && strcmp(only, p->model)) continue;
        float *a = malloc((size_t)(p->m * p->k) * sizeof *a);
        float *b = malloc((size_t)(p->k * p->n) * sizeof *b);
        float *c = malloc((size_t)(p->m * p->n) * sizeof *c);
        gp_rng_uniform_fill(1, (uint64_t)q, 0, a, p->m * p->k);
        gp_rng_uniform_fill(2, (uint64_t)q, 0, b, p->k * p->n);
        for (int64_t i = 0; i < p->m * p->k; i++) a[i] -= 0.5f;
        for (int64_t i = 0; i < p->k * p->n; i++) b[i] -= 0.5f;
        mm x;
        if (!mm_make(&x, p)) x.p = NULL;
        double flop = 2.0 * (double)p->m * p->n * p->k, t_best = 1e30;
        int l_best = -1;
        printf("| %s | %s | %lld %lld %lld %s%s |", p->model, p->what, (long long)p->m,
               (long long)p->n, (long long)p->k, p->ta ? "T" : "N", p->tb ? "T" : "N");
        char errs[NLIBS][32];
        bool ok[NLIBS];
        static double t[NLIBS][64];
        int nt[NLIBS] = {0};
        for (int l = 0; l < NLIBS; l++) {
            memset(c, 0, (size_t)(p->m * p->n) * sizeof *c);
            ok[l] = run(l, p, &x, a, b, c);
            if (ok[l]) snprintf(errs[l], sizeof errs[l], "%.0e", check(p, a, b, c));
            else snprintf(errs[l], sizeof errs[l], "-");
            if (!ok[l] || interleave) continue;
            double t_end = gp_now() + 0.3;
            for (int w = 0; w < 3; w++) run(l, p, &x, a, b, c);
            while (nt[l] < 64 && (nt[l] < 7 || gp_now() < t_end)) {
                double t0 = gp_now();
                run(l, p, &x, a, b, c);
                t[l][nt[l]++] = gp_now() - t0;
            }
        }
        /* --interleave: every library once a round, in turn, as a step that
         * mixed them would call them (each library's own threads then wait
         * beside the others': 2 warm-up rounds, 15 timed) */
        for (int r = 0; interleave && r < 17; r++)
            for (int l = 0; l < NLIBS; l++) {
                if (!ok[l]) continue;
                double t0 = gp_now();
                run(l, p, &x, a, b, c);
                if (r >= 2) t[l][nt[l]++] = gp_now() - t0;
            }
        for (int l = 0; l < NLIBS; l++) {
            if (!ok[l]) {
                printf(" - |");
                continue;
            }
            double med = gp_bench_median(t[l], nt[l]);
            printf(" %.0f |", flop / med / 1e9);
            lib_sum[mi][l] += med * p->count;
            if (med < t_best) t_best = med, l_best = l;
        }
        best_sum[mi] += t_best * p->count;
        if (l_best >= 0) best_count[mi][l_best]++;
        printf(" %s |\n", l_best >= 0 ? lib_names[l_best] : "-");
        printf("|  |   relative error vs double |  |");
        for (int l = 0; l < NLIBS; l++) printf(" %s |", errs[l]);
        printf("  |\n");
        mm_free(&x);
        free(a); free(b); free(c);
    }
    for (int mi = 0; mi < 2; mi++) {
        if (best_sum[mi] == 0) continue;
        printf("\n%s: one step's products, ms:", mi ? "tiny-gpt" : "mlp");
        for (int l = 0; l < NLIBS; l++)
            if (lib_sum[mi][l] > 0) printf(" %s %.1f", lib_names[l], lib_sum[mi][l] * 1e3);
        printf("; the fastest per shape %.1f (gpipe / that %.2f)\n", best_sum[mi] * 1e3,
               lib_sum[mi][L_GPIPE] / best_sum[mi]);
    }
    gp_device_close(dev);
    return 0;
}
