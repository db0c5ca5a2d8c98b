/*
 * test_cuda_graphs.c — cuDNN graphs the CUDA backend builds, checked
 * without a GPU (built only where the CUDA backend is: tests/CMakeLists.txt).
 *
 * cuDNN's backend API validates every tensor and operation descriptor when
 * it is finalized, and an operation graph's connectivity when that is,
 * without a device; only the engines need one.  So the fused attention's
 * graphs (src/backend/cuda/cuda_sdpa.c: cudnn-frontend's lowering of
 * sdpa() and sdpa_backward() for a causal mask) are built here for GPT-2's
 * shapes and odd ones, through the plugin's test hook, in CI's CUDA stage
 * on a machine with no GPU: a descriptor cuDNN refuses, a wrong attribute
 * type or count, a dangling tensor or a builder that runs out of room
 * fails here instead of on the next GPU (the last one did, unseen, until a
 * review).  Whether cuDNN has an engine for them is test_cuda's, on a GPU.
 */
#include "backend/backend.h"
#include "test.h"

#include <dlfcn.h>
#include <stdint.h>

typedef int (*conv_check_fn)(const gp_conv_desc *d, int bf16, int nhwc, int dir);
typedef int (*check_fn)(int64_t b, int64_t t, int64_t heads, int64_t c, int dir, int *n_ops,
                        int *n_desc, char *why, size_t len);

int main(void)
{
    const char *dir = getenv("GPIPE_BINARY_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/libgpipe-cuda.so", dir ? dir : GPIPE_BINARY_DIR);
    void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL); /* (the plugin's calls into gpipe
                                                     are bound on use: the hook makes none) */
    CHECK_MSG(h != NULL, "dlopen %s: %s", path, dlerror());
    if (!h) return gpt_finish("test_cuda_graphs");
    check_fn check = (check_fn)(uintptr_t)dlsym(h, "gp_cuda_sdpa_graph_check");
    CHECK_MSG(check != NULL, "the plugin has no gp_cuda_sdpa_graph_check");
    if (!check) return gpt_finish("test_cuda_graphs");
    /* (b, t, heads, c): GPT-2 124M's micro-batch, test_cuda's, one token,
     * GPT-2 XL's heads of 64 and a head of 128 */
    static const int64_t shapes[][4] = {
        {16, 1024, 12, 768}, {2, 200, 2, 128}, {1, 1, 1, 8}, {3, 64, 25, 1600}, {4, 96, 4, 512}};
    /* the operations of each direction (cuda_sdpa.c's top comment): a count
     * that changes means the graph is no longer the frontend's lowering */
    static const int want_ops[2] = {14, 21};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int d = 0; d < 2; d++) {
            int ops = -1, desc = -1;
            char why[256] = "";
            int s = check(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], d, &ops, &desc,
                          why, sizeof why);
            CHECK_MSG(s == 0, "fused attention %s graph (b=%lld t=%lld heads=%lld c=%lld): cuDNN "
                      "status %d at %s", d ? "backward" : "forward", (long long)shapes[i][0],
                      (long long)shapes[i][1], (long long)shapes[i][2], (long long)shapes[i][3],
                      s, why);
            CHECK_MSG(ops == want_ops[d], "fused attention %s graph: %d operations, want %d",
                      d ? "backward" : "forward", ops, want_ops[d]);
        }
    /* Convolutions' one-operation graphs (cuda_graph.c), each direction, in
     * FP32 and bf16, plain and channels-last (issue 67: NHWC strides, KRSC
     * weights): ResNet's stem, a 3x3 of a bottleneck, a strided 1x1
     * projection, and AmoebaNet's 1x7. */
    conv_check_fn conv = (conv_check_fn)(uintptr_t)dlsym(h, "gp_cuda_conv_graph_check");
    CHECK_MSG(conv != NULL, "the plugin has no gp_cuda_conv_graph_check");
    static const gp_conv_desc convs[] = {
        {.n = 32, .c = 3, .h = 224, .w = 224, .k = 64, .kh = 7, .kw = 7, .sh = 2, .sw = 2,
         .ph = 3, .pw = 3, .oh = 112, .ow = 112},
        {.n = 32, .c = 64, .h = 56, .w = 56, .k = 64, .kh = 3, .kw = 3, .sh = 1, .sw = 1,
         .ph = 1, .pw = 1, .oh = 56, .ow = 56, .has_bias = 1},
        {.n = 32, .c = 256, .h = 56, .w = 56, .k = 512, .kh = 1, .kw = 1, .sh = 2, .sw = 2,
         .oh = 28, .ow = 28},
        {.n = 8, .c = 40, .h = 14, .w = 14, .k = 40, .kh = 1, .kw = 7, .sh = 1, .sw = 1,
         .ph = 0, .pw = 3, .oh = 14, .ow = 14}};
    for (size_t i = 0; conv && i < sizeof convs / sizeof *convs; i++)
        for (int v = 0; v < 4; v++)
            for (int dn = 0; dn < 3; dn++) {
                int bf16 = v & 1, nhwc = v >> 1;
                int s = conv(&convs[i], bf16, nhwc, dn);
                CHECK_MSG(s == 0, "convolution graph c%lld k%lld %lldx%lld direction %d %s%s: "
                          "cuDNN status %d", (long long)convs[i].c, (long long)convs[i].k,
                          (long long)convs[i].kh, (long long)convs[i].kw, dn,
                          bf16 ? "bf16" : "fp32", nhwc ? " channels-last" : "", s);
            }
    dlclose(h);
    return gpt_finish("test_cuda_graphs");
}
