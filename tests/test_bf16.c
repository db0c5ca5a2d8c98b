/*
 * test_bf16.c — activations stored in bfloat16 (train.activations: bf16;
 * gp_layer.out_dtype, layers.h), on a CPU device, FP32 math: the storage
 * contract every backend keeps, checked layer by layer.
 *
 *   - conversions: gp_tensor_convert rounds as gp_ew_bf16_bits (which
 *     test_backend checks against a reference) and widens exactly; an odd
 *     bf16 count is stored in whole words whose last half is zero;
 *     gp_tensor_as is a view where nothing changes, a shape where there are
 *     no values;
 *   - the storage adapter, for every kind of layer (element-wise, norms,
 *     pools, products, the layers that pop, upsample, dropout, causal
 *     attention): forward on bf16 inputs gives bit for bit the FP32
 *     layer's output on the widened inputs, rounded once; backward gives
 *     each input's gradient as the FP32 backward's on the widened x, stored
 *     y and dy, rounded once, and the parameters' gradients bit for bit;
 *     in place (relu over its input's memory) the same values;
 *   - the layers that move values without reading them (identity,
 *     flatten) take bf16 as it is: the same bits, no rounding;
 *   - a composite residual block keeps its inner maps in bf16: bit for
 *     bit its children run as stand-alone bf16 layers, one after another,
 *     but for its second norm's fused sum and relu (one rounding: the FP32
 *     norm's output plus the widened shortcut, relu'd, rounded);
 *   - the losses on bf16 logits: the FP32 loss of the widened logits, its
 *     gradient rounded once; two gradients of one activation added in FP32
 *     and rounded once (gp_layers_accumulate).
 */
#include "layers/layers_impl.h"
#include "backend/elementwise.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static gp_device *dev;

/* n values in (-2, 2), some of them with more than bf16's 8 bits. */
static void randn_host(float *h, int64_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = ((float)(s >> 8) / (float)(1u << 24)) * 4.0f - 2.0f;
    }
}

/* A bf16 tensor of shape sh holding random values rounded. */
static gp_tensor rand_bf16(const gp_shape *sh, uint32_t seed)
{
    int64_t n = gp_shape_numel(sh);
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    randn_host(h, n, seed);
    gp_tensor f = gpt_upload(dev, sh, h), b;
    CHECK_OK(gp_tensor_as(&b, &f, GP_BF16, GP_MEM_ACTIVATIONS));
    gp_tensor_free(&f);
    free(h);
    return b;
}

/* t's values as floats on the host (widened where bf16). */
static float *values(const gp_tensor *t)
{
    gp_tensor f;
    CHECK_OK(gp_tensor_as(&f, t, GP_F32, GP_MEM_ACTIVATIONS));
    float *h = gpt_download(&f);
    gp_tensor_free(&f);
    return h;
}

/* Elements where the bf16 tensor b does not hold f's FP32 values rounded
 * to nearest even. */
static int64_t rounded_mismatches(const gp_tensor *b, const gp_tensor *f)
{
    CHECK(b->dtype == GP_BF16 && f->dtype == GP_F32);
    int64_t n = gp_tensor_numel(f), bad = 0;
    float *hb = values(b), *hf = gpt_download(f);
    for (int64_t i = 0; i < n; i++) {
        float r = gp_ew_bf16_value(gp_ew_bf16_bits(hf[i]));
        if (memcmp(&r, &hb[i], sizeof r) != 0) bad++;
    }
    free(hb);
    free(hf);
    return bad;
}

static bool same_bits(const gp_tensor *a, const gp_tensor *b)
{
    if (gp_tensor_numel(a) != gp_tensor_numel(b) || a->dtype != b->dtype) return false;
    CHECK_OK(gp_dev_synchronize(dev));
    return memcmp(gp_tensor_mem(a), gp_tensor_mem(b), gp_tensor_bytes(a)) == 0; /* host memory */
}

static void conversions(void)
{
    float h[7] = {1.0f, 1.00390625f, 1.01171875f, -3.3f, 0.0f, -0.0f, 65504.7f};
    gp_shape sh = {1, {7}};
    gp_tensor f = gpt_upload(dev, &sh, h), b, w, v;
    CHECK_OK(gp_tensor_as(&b, &f, GP_BF16, GP_MEM_ACTIVATIONS));
    CHECK(b.owned && b.dtype == GP_BF16 && gp_tensor_bytes(&b) == 14);
    CHECK(gp_tensor_storage_bytes(&b) == 16 && gp_tensor_words(&b) == 4);
    CHECK_OK(gp_dev_synchronize(dev));
    const uint16_t *bits = gp_bf16(&b);
    int bad = 0;
    for (int i = 0; i < 7; i++) bad += bits[i] != gp_ew_bf16_bits(h[i]);
    CHECK_MSG(bad == 0, "%d of 7 values rounded otherwise than gp_ew_bf16_bits", bad);
    CHECK_MSG(bits[7] == 0, "the half word after an odd count holds %#x, not zero", bits[7]);
    CHECK(bits[1] == 0x3f80 && bits[2] == 0x3f82); /* a tie to even, and one above it */
    CHECK_OK(gp_tensor_as(&w, &b, GP_F32, GP_MEM_ACTIVATIONS));
    float *hw = gpt_download(&w);
    for (int i = 0; i < 7; i++) bad += hw[i] != gp_ew_bf16_value(bits[i]);
    CHECK_MSG(bad == 0, "%d of 7 values widened otherwise than exactly", bad);
    free(hw);
    CHECK_OK(gp_tensor_as(&v, &b, GP_BF16, GP_MEM_ACTIVATIONS)); /* nothing to change: a view */
    CHECK(!v.owned && gp_tensor_mem(&v) == gp_tensor_mem(&b));
    gp_tensor shape = b;
    shape.mem = NULL;
    shape.owned = false;
    CHECK_OK(gp_tensor_as(&v, &shape, GP_F32, GP_MEM_ACTIVATIONS)); /* no values: the shape */
    CHECK(!v.owned && !gp_tensor_mem(&v) && v.dtype == GP_F32 && gp_tensor_numel(&v) == 7);
    gp_tensor_free(&w);
    gp_tensor_free(&b);
    gp_tensor_free(&f);
}

/* One layer of `spec` on inputs of batch-1 shapes in[0 .. n_in), batch
 * `batch`: the bf16 layer (through the adapter) against the same layer in
 * FP32 on the widened inputs. */
static void adapter_case(const char *what, gp_layer_spec spec, const gp_shape *in, int n_in,
                         int64_t batch)
{
    gp_layer lb, lf;
    if (gp_layer_create(&spec, 2, in, dev, 11, &lb) != GP_OK ||
        gp_layer_create(&spec, 2, in, dev, 11, &lf) != GP_OK) {
        CHECK_MSG(0, "%s: %s", what, gp_last_error());
        return;
    }
    lb.out_dtype = GP_BF16;
    gp_tensor xb[1 + GP_MAX_POPS], xw[1 + GP_MAX_POPS], yb, yf, yw, dyb, dyw;
    gp_tensor dxb[1 + GP_MAX_POPS] = {{0}}, dxf[1 + GP_MAX_POPS] = {{0}};
    for (int q = 0; q < n_in; q++) {
        gp_shape s = gp_shape_with_batch(&in[q], batch);
        xb[q] = rand_bf16(&s, 3u + (uint32_t)q);
        CHECK_OK(gp_tensor_as(&xw[q], &xb[q], GP_F32, GP_MEM_ACTIVATIONS));
    }
    gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = batch};
    gp_saved sb = {0}, sf = {0};
    CHECK_OK(gp_layer_forward(&lb, &ctx, xb, &yb, &sb));
    CHECK_OK(gp_layer_forward(&lf, &ctx, xw, &yf, &sf));
    int64_t bad = rounded_mismatches(&yb, &yf);
    CHECK_MSG(bad == 0, "%s forward: %lld of %lld outputs are not the FP32 output rounded", what,
              (long long)bad, (long long)gp_tensor_numel(&yf));
    gp_shape ys = gp_tensor_shape(&yb);
    dyb = rand_bf16(&ys, 9);
    CHECK_OK(gp_tensor_as(&dyw, &dyb, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_as(&yw, &yb, GP_F32, GP_MEM_ACTIVATIONS)); /* what backward reads: y stored */
    CHECK_OK(gp_layer_backward(&lb, &ctx, xb, &yb, &dyb, dxb, &sb));
    CHECK_OK(gp_layer_backward(&lf, &ctx, xw, &yw, &dyw, dxf, &sf));
    for (int q = 0; q < n_in; q++) {
        bad = rounded_mismatches(&dxb[q], &dxf[q]);
        CHECK_MSG(bad == 0, "%s backward: %lld of %lld of input %d's gradient are not the FP32 "
                  "gradient rounded", what, (long long)bad, (long long)gp_tensor_numel(&dxf[q]), q);
    }
    for (int p = 0; p < lb.n_params; p++) {
        if (lb.params[p].is_buffer) continue;
        CHECK_MSG(same_bits(&lb.params[p].grad, &lf.params[p].grad),
                  "%s backward: the gradient of %s differs from FP32's on the same values", what,
                  lb.params[p].name);
    }
    for (int q = 0; q < n_in; q++) {
        gp_tensor_free(&xb[q]);
        gp_tensor_free(&xw[q]);
        gp_tensor_free(&dxb[q]);
        gp_tensor_free(&dxf[q]);
    }
    gp_tensor_free(&yb);
    gp_tensor_free(&yf);
    gp_tensor_free(&yw);
    gp_tensor_free(&dyb);
    gp_tensor_free(&dyw);
    gp_saved_free(&sb);
    gp_saved_free(&sf);
    gp_layer_destroy(&lb);
    gp_layer_destroy(&lf);
}

static void adapter_layers(void)
{
    gp_shape map = gp_shape_4d(1, 5, 7, 9), vec = gp_shape_2d(1, 37);
    gp_shape two[2] = {map, map};
    gp_layer_spec s;
    adapter_case("relu", gp_layer_spec_default(GP_LAYER_RELU), &map, 1, 3);
    s = gp_layer_spec_default(GP_LAYER_LEAKY_RELU);
    s.slope = 0.2f;
    adapter_case("leaky_relu", s, &map, 1, 3);
    adapter_case("batchnorm", gp_layer_spec_default(GP_LAYER_BATCHNORM), &map, 1, 3);
    adapter_case("instance_norm", gp_layer_spec_default(GP_LAYER_INSTANCE_NORM), &map, 1, 3);
    /* linked to a leaky relu after it: native_unet */
    s = gp_layer_spec_default(GP_LAYER_MAXPOOL2D);
    s.kernel = gp_hw_square(3);
    s.stride = gp_hw_square(2);
    s.padding = gp_hw_square(1);
    adapter_case("maxpool2d", s, &map, 1, 3);
    s.type = GP_LAYER_AVGPOOL2D;
    adapter_case("avgpool2d", s, &map, 1, 3);
    adapter_case("global_avgpool", gp_layer_spec_default(GP_LAYER_GLOBAL_AVGPOOL), &map, 1, 3);
    s = gp_layer_spec_default(GP_LAYER_DROPOUT);
    s.p = 0.3f;
    adapter_case("dropout", s, &vec, 1, 4);
    s = gp_layer_spec_default(GP_LAYER_UPSAMPLE);
    adapter_case("upsample", s, &map, 1, 2);
    s = gp_layer_spec_default(GP_LAYER_LINEAR);
    s.out = 19;
    adapter_case("linear", s, &vec, 1, 5);
    s = gp_layer_spec_default(GP_LAYER_CONV2D);
    s.out = 6;
    s.kernel = gp_hw_square(3);
    s.padding = gp_hw_square(1);
    adapter_case("conv2d", s, &map, 1, 3);
    s = gp_layer_spec_default(GP_LAYER_ADD);
    s.n_pop = 1;
    snprintf(s.pop[0], sizeof s.pop[0], "a");
    adapter_case("add", s, two, 2, 3);
    s.type = GP_LAYER_CONCAT; /* takes bf16 as it is (moves bits), the same values */
    adapter_case("concat", s, two, 2, 3);
    gp_shape padded[2] = {gp_shape_4d(1, 3, 5, 8), map}; /* U-Net's: padded up to 7 x 9 */
    adapter_case("concat, padded", s, padded, 2, 3);
    s = gp_layer_spec_default(GP_LAYER_ATTENTION);
    s.heads = 2;
    gp_shape qkv = gp_shape_4d(1, 1, 7, 12); /* T = 7, 3C = 12: head dim 2 */
    adapter_case("attention", s, &qkv, 1, 3);
}

/* Layers that move values without reading them take bf16 as it is, and a
 * relu in place rounds into its input's memory. */
static void as_they_are(void)
{
    gp_shape map = gp_shape_4d(1, 3, 4, 5);
    for (int k = 0; k < 2; k++) {
        gp_layer_spec spec = gp_layer_spec_default(k ? GP_LAYER_FLATTEN : GP_LAYER_IDENTITY);
        gp_layer l;
        CHECK_OK(gp_layer_create(&spec, 0, &map, dev, 1, &l));
        l.out_dtype = GP_BF16;
        gp_shape xs = gp_shape_with_batch(&map, 2);
        gp_tensor x = rand_bf16(&xs, 4), y, dx = {0};
        gp_fwd_ctx ctx = {.training = true, .batch_total = 2};
        gp_saved s = {0};
        CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &s));
        CHECK_MSG(y.dtype == GP_BF16 && gp_tensor_numel(&y) == gp_tensor_numel(&x) &&
                      memcmp(gp_tensor_mem(&y), gp_tensor_mem(&x), gp_tensor_bytes(&x)) == 0,
                  "%s: bf16 out is not bf16 in, bit for bit", gp_layer_type_name(spec.type));
        gp_shape ys = gp_tensor_shape(&y);
        gp_tensor dy = rand_bf16(&ys, 6);
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, &dx, &s));
        CHECK_MSG(dx.dtype == GP_BF16 &&
                      memcmp(gp_tensor_mem(&dx), gp_tensor_mem(&dy), gp_tensor_bytes(&dy)) == 0,
                  "%s: bf16 dx is not bf16 dy, bit for bit", gp_layer_type_name(spec.type));
        gp_tensor_free(&dx);
        gp_tensor_free(&dy);
        gp_tensor_free(&y);
        gp_tensor_free(&x);
        gp_saved_free(&s);
        gp_layer_destroy(&l);
    }
    gp_layer_spec rs = gp_layer_spec_default(GP_LAYER_RELU);
    gp_layer l;
    CHECK_OK(gp_layer_create(&rs, 0, &map, dev, 1, &l));
    l.out_dtype = GP_BF16;
    gp_shape xs = gp_shape_with_batch(&map, 2);
    gp_tensor x = rand_bf16(&xs, 8), xw, y, yf;
    CHECK_OK(gp_tensor_as(&xw, &x, GP_F32, GP_MEM_ACTIVATIONS));
    gp_fwd_ctx ctx = {.training = true, .batch_total = 2};
    gp_saved s = {0};
    l.out_dtype = GP_F32;
    CHECK_OK(gp_layer_forward(&l, &ctx, &xw, &yf, &s));
    l.out_dtype = GP_BF16;
    CHECK_OK(gp_layer_forward_inplace(&l, &ctx, &x, &y, &s));
    CHECK(gp_tensor_mem(&y) == gp_tensor_mem(&x) && !y.owned && y.dtype == GP_BF16);
    CHECK_MSG(rounded_mismatches(&y, &yf) == 0, "relu in place: not the FP32 relu rounded");
    gp_tensor_free(&yf);
    gp_tensor_free(&xw);
    gp_tensor_free(&x);
    gp_saved_free(&s);
    gp_layer_destroy(&l);
}

/* Activations on bf16 storage without the adapter (act_bf16): the CPU's
 * relu and leaky relu kernels give, on special values too (signed zeros,
 * infinities, NaN, subnormals, bf16's largest), the bits of the FP32 slot
 * on the widened values rounded once; so does GELU, oneDNN's primitive on
 * bf16 memory, but for a NaN's payload and subnormal results, which its
 * conversion flushes to zero; and a relu layer on bf16 allocates no FP32
 * temporary (its activations' peak is its output, where the adapter's
 * would add 4 bytes a value twice). */
static void native_activations(void)
{
    CHECK(gp_dev_act_bf16_has(dev, GP_ACT_RELU) && gp_dev_act_bf16_has(dev, GP_ACT_LEAKY_RELU) &&
          gp_dev_act_bf16_has(dev, GP_ACT_GELU));
    enum { N = 4099 }; /* odd, past the threads' split */
    static uint16_t x[N], dy[N], out[N];
    static float xf[N], dyf[N], yf[N];
    static const uint16_t special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x0001,
                                       0x8001, 0x7f7f, 0xff7f, 0x3f80, 0xbf80};
    uint32_t r = 12345u;
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = i < (int)(sizeof special / sizeof *special) ? special[i] : (uint16_t)(r >> 16);
        r = r * 1664525u + 1013904223u;
        dy[i] = (uint16_t)(r >> 16);
        xf[i] = gp_ew_bf16_value(x[i]);
        dyf[i] = gp_ew_bf16_value(dy[i]);
    }
    static const char *const names[] = {"relu", "leaky_relu", "gelu"};
    for (int kind = 0; kind < 3; kind++)
        for (int bwd = 0; bwd < 2; bwd++) {
            gp_act_kind k = kind == 2 ? GP_ACT_GELU : kind ? GP_ACT_LEAKY_RELU : GP_ACT_RELU;
            float slope = kind == 1 ? 0.2f : 0.0f;
            CHECK_OK(gp_dev_act_bf16(dev, k, x, bwd ? dy : NULL, out, N, slope));
            if (!bwd && kind == 2) CHECK_OK(gp_dev_gelu_fwd(dev, xf, yf, N));
            if (!bwd && kind == 1) CHECK_OK(gp_dev_leaky_relu_fwd(dev, xf, yf, N, slope));
            if (!bwd && !kind) CHECK_OK(gp_dev_relu_fwd(dev, xf, yf, N));
            if (bwd && kind == 2) CHECK_OK(gp_dev_gelu_bwd(dev, xf, dyf, yf, N));
            if (bwd && kind == 1) CHECK_OK(gp_dev_leaky_relu_bwd(dev, xf, dyf, yf, N, slope));
            if (bwd && !kind) CHECK_OK(gp_dev_relu_bwd(dev, xf, dyf, yf, N));
            CHECK_OK(gp_dev_synchronize(dev));
            int bad = 0, first = -1;
            for (int i = 0; i < N; i++) {
                uint16_t want = gp_ew_bf16_bits(yf[i]);
                /* GELU (oneDNN's rounding): a NaN is a NaN, whatever its payload */
                bool nan2 = kind == 2 && (want & 0x7fff) > 0x7f80 && (out[i] & 0x7fff) > 0x7f80;
                /* and a subnormal result may be flushed to a zero of its sign */
                bool ftz = kind == 2 && (want & 0x7fff) <= 0x0080 && out[i] == (want & 0x8000);
                if (out[i] != want && !nan2 && !ftz) {
                    bad++;
                    if (first < 0) first = i;
                }
            }
            CHECK_MSG(bad == 0, "bf16 %s %s: %d of %d differ from the FP32 slot rounded "
                      "(first at %d: x %#x)", names[kind],
                      bwd ? "backward" : "forward", bad, N, first, first >= 0 ? x[first] : 0);
        }
    /* in place (out = xy) gives the same bits */
    memcpy(out, x, sizeof out);
    CHECK_OK(gp_dev_act_bf16(dev, GP_ACT_RELU, out, NULL, out, N, 0.0f));
    CHECK_OK(gp_dev_relu_fwd(dev, xf, yf, N));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += out[i] != gp_ew_bf16_bits(yf[i]);
    CHECK_MSG(bad == 0, "bf16 relu in place: %d of %d differ", bad, N);
    /* the layer: no FP32 temporaries */
    gp_shape map = gp_shape_4d(1, 8, 16, 16);
    gp_layer_spec rs = gp_layer_spec_default(GP_LAYER_RELU);
    gp_layer l;
    CHECK_OK(gp_layer_create(&rs, 0, &map, dev, 1, &l));
    l.out_dtype = GP_BF16;
    gp_shape xs = gp_shape_with_batch(&map, 4);
    gp_tensor xt = rand_bf16(&xs, 21), y, dyt = rand_bf16(&xs, 22), dx = {0};
    gp_fwd_ctx ctx = {.training = true, .batch_total = 4};
    gp_saved sv = {0};
    size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS], bytes = gp_tensor_bytes(&xt);
    gp_allocator_reset_peak(&dev->alloc);
    CHECK_OK(gp_layer_forward(&l, &ctx, &xt, &y, &sv));
    CHECK_OK(gp_layer_backward(&l, &ctx, &xt, &y, &dyt, &dx, &sv));
    size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
    CHECK_MSG(peak <= 2 * bytes, "a bf16 relu's forward and backward peaked at %zu bytes of "
              "activations over its input's %zu: the adapter's FP32 temporaries", peak, bytes);
    CHECK(y.dtype == GP_BF16 && dx.dtype == GP_BF16);
    gp_tensor_free(&dx);
    gp_tensor_free(&dyt);
    gp_tensor_free(&y);
    gp_tensor_free(&xt);
    gp_saved_free(&sv);
    gp_layer_destroy(&l);
}

/* The embedding on bf16 storage through its own slots (embed_fwd /
 * embed_bwd with the element type): the ids stay FP32 (data_input), the
 * output is the FP32 layer's rounded once, the gradients of wte and wpe
 * from a bf16 dy are the FP32 layer's from the widened dy bit for bit, and
 * no FP32 copy of the output or of dy is made (the adapter's would be 4
 * bytes a value). */
static void native_embedding(void)
{
    enum { B = 3, T = 7, V = 11, C = 24 };
    gp_layer_spec spec = gp_layer_spec_default(GP_LAYER_EMBEDDING);
    spec.vocab = V;
    spec.dim = C;
    spec.positions = T;
    gp_shape in = gp_shape_2d(1, T); /* ids (N, T) */
    gp_layer lb, lf;
    CHECK_OK(gp_layer_create(&spec, 0, &in, dev, 5, &lb));
    CHECK_OK(gp_layer_create(&spec, 0, &in, dev, 5, &lf));
    lb.out_dtype = GP_BF16;
    float ids[B * T];
    for (int i = 0; i < B * T; i++) ids[i] = (float)((i * 7 + 3) % V);
    gp_shape xs = gp_shape_2d(B, T);
    gp_tensor x = gpt_upload(dev, &xs, ids), yb, yf, dxb = {0}, dxf = {0};
    gp_fwd_ctx ctx = {.training = true, .batch_total = B};
    gp_saved sb = {0}, sf = {0};
    size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS];
    gp_allocator_reset_peak(&dev->alloc);
    CHECK_OK(gp_layer_forward(&lb, &ctx, &x, &yb, &sb));
    size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
    CHECK_MSG(yb.dtype == GP_BF16 && peak <= gp_tensor_bytes(&yb),
              "a bf16 embedding's forward: output %s, %zu bytes of activations at its peak for a "
              "%zu-byte output (an FP32 copy would add twice that)", gp_dtype_name(yb.dtype), peak,
              gp_tensor_bytes(&yb));
    CHECK_OK(gp_layer_forward(&lf, &ctx, &x, &yf, &sf));
    CHECK(rounded_mismatches(&yb, &yf) == 0);
    gp_shape ys = gp_tensor_shape(&yb);
    gp_tensor dyb = rand_bf16(&ys, 77), dyf;
    CHECK_OK(gp_tensor_as(&dyf, &dyb, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_layer_backward_weights(&lb, &ctx, &x, &yb, &dyb, &sb));
    CHECK_OK(gp_layer_backward_weights(&lf, &ctx, &x, &yf, &dyf, &sf));
    for (int p = 0; p < 2; p++) {
        float *gb = gpt_download(&lb.params[p].grad), *gf = gpt_download(&lf.params[p].grad);
        CHECK_MSG(!memcmp(gb, gf, (size_t)gp_tensor_numel(&lf.params[p].grad) * sizeof(float)),
                  "bf16 embedding: %s's gradient differs from the FP32 layer's on the widened dy",
                  lf.params[p].name);
        free(gb);
        free(gf);
    }
    gp_tensor_free(&dxb);
    gp_tensor_free(&dxf);
    gp_tensor_free(&dyb);
    gp_tensor_free(&dyf);
    gp_tensor_free(&yb);
    gp_tensor_free(&yf);
    gp_tensor_free(&x);
    gp_saved_free(&sb);
    gp_saved_free(&sf);
    gp_layer_destroy(&lb);
    gp_layer_destroy(&lf);
}

/* One batch-norm layer on bf16 storage through its own slots (no
 * adapter): forward (training or inference) and, training, backward with
 * dx and without (the first layer's scratch), against the same layer in
 * FP32 on the widened values: outputs and dx the FP32 ones rounded, the
 * statistics and the parameters' gradients bit for bit; and no FP32 copy
 * of a whole tensor among the activations (the adapter's would be 4 bytes
 * a value). */
static void native_bn_case(const char *what, gp_shape in, int64_t batch, int64_t blk,
                           bool relu, bool training)
{
    gp_layer_spec spec = gp_layer_spec_default(GP_LAYER_BATCHNORM);
    gp_layer lb, lf;
    CHECK_OK(gp_layer_create(&spec, 1, &in, dev, 7, &lb));
    CHECK_OK(gp_layer_create(&spec, 1, &in, dev, 7, &lf));
    lb.out_dtype = GP_BF16;
    lb.in_blk = lb.out_blk = lf.in_blk = lf.out_blk = blk;
    lb.relu_after = lf.relu_after = relu;
    if (!training) { /* running statistics that are not 0 and 1 */
        gp_shape cs = {1, {in.dims[1], 0, 0, 0}};
        for (int p = 2; p < 4; p++) {
            gp_tensor r = rand_bf16(&cs, 40u + (uint32_t)p), rf;
            CHECK_OK(gp_tensor_as(&rf, &r, GP_F32, GP_MEM_ACTIVATIONS));
            float *h = values(&rf);
            for (int64_t c = 0; c < in.dims[1]; c++) h[c] = p == 3 ? 0.5f + h[c] * h[c] : h[c];
            CHECK_OK(gp_dev_upload(dev, gp_f32(&lb.params[p].value), h, in.dims[1]));
            CHECK_OK(gp_dev_upload(dev, gp_f32(&lf.params[p].value), h, in.dims[1]));
            free(h);
            gp_tensor_free(&rf);
            gp_tensor_free(&r);
        }
    }
    gp_shape xs = gp_shape_with_batch(&in, batch);
    gp_tensor xb = rand_bf16(&xs, 31), dyb = rand_bf16(&xs, 32), xw, dyw, yb, yf, dxb = {0},
              dxf = {0};
    CHECK_OK(gp_tensor_as(&xw, &xb, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_as(&dyw, &dyb, GP_F32, GP_MEM_ACTIVATIONS));
    gp_fwd_ctx ctx = {.training = training, .seed = 5, .step = 1, .batch_total = batch};
    gp_saved sb = {0}, sf = {0};
    size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS], bytes = gp_tensor_bytes(&xb);
    gp_allocator_reset_peak(&dev->alloc);
    CHECK_OK(gp_layer_forward(&lb, &ctx, &xb, &yb, &sb));
    if (training) CHECK_OK(gp_layer_backward(&lb, &ctx, &xb, &yb, &dyb, &dxb, &sb));
    size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
    size_t stats = training ? 2 * (size_t)in.dims[1] * sizeof(float) : 0; /* mean, var */
    CHECK_MSG(peak <= 2 * bytes + stats, "%s: the bf16 norm peaked at %zu bytes of activations "
              "over its input's %zu (y, dx and %zu of statistics): FP32 temporaries", what, peak,
              bytes, stats);
    CHECK(yb.dtype == GP_BF16 && (!training || dxb.dtype == GP_BF16));
    CHECK_OK(gp_layer_forward(&lf, &ctx, &xw, &yf, &sf));
    int64_t bad = rounded_mismatches(&yb, &yf);
    CHECK_MSG(bad == 0, "%s forward: %lld of %lld outputs are not the FP32 output rounded",
              what, (long long)bad, (long long)gp_tensor_numel(&yf));
    if (training) {
        for (int k = 0; k < 2; k++)
            CHECK_MSG(same_bits(&sb.t[k], &sf.t[k]), "%s: the batch %s differs from FP32's",
                      what, k ? "variance" : "mean");
        gp_tensor yw;
        CHECK_OK(gp_tensor_as(&yw, &yb, GP_F32, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_layer_backward(&lf, &ctx, &xw, &yw, &dyw, &dxf, &sf));
        bad = rounded_mismatches(&dxb, &dxf);
        CHECK_MSG(bad == 0, "%s backward: %lld of %lld of dx are not the FP32 dx rounded", what,
                  (long long)bad, (long long)gp_tensor_numel(&dxf));
        for (int p = 0; p < 2; p++)
            CHECK_MSG(same_bits(&lb.params[p].grad, &lf.params[p].grad),
                      "%s backward: the gradient of %s differs from FP32's", what,
                      lb.params[p].name);
        /* no dx (the model's first layer): the same parameter gradients
         * again, added to the first ones */
        gp_saved s2b = {0}, s2f = {0};
        gp_tensor y2b, y2f;
        CHECK_OK(gp_layer_forward(&lb, &ctx, &xb, &y2b, &s2b));
        CHECK_OK(gp_layer_forward(&lf, &ctx, &xw, &y2f, &s2f));
        CHECK_OK(gp_layer_backward(&lb, &ctx, &xb, &y2b, &dyb, NULL, &s2b));
        CHECK_OK(gp_layer_backward(&lf, &ctx, &xw, &y2f, &dyw, NULL, &s2f));
        gp_tensor_free(&y2b);
        gp_tensor_free(&y2f);
        gp_saved_free(&s2b);
        gp_saved_free(&s2f);
        for (int p = 0; p < 2; p++)
            CHECK_MSG(same_bits(&lb.params[p].grad, &lf.params[p].grad),
                      "%s backward without dx: the gradient of %s differs from FP32's", what,
                      lb.params[p].name);
        gp_tensor_free(&yw);
    }
    gp_tensor *all[] = {&xb, &dyb, &xw, &dyw, &yb, &yf, &dxb, &dxf};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
    gp_saved_free(&sb);
    gp_saved_free(&sf);
    gp_layer_destroy(&lb);
    gp_layer_destroy(&lf);
}

/* Batch norm takes bf16 storage through bn_*_bf16 on a CPU device: small
 * maps and many channels (several channels a task), a map larger than a
 * task's 64 Ki values (a channel a task, the threads splitting the
 * channels), the blocked layouts (channels-last too), the relu after it,
 * inference. */
static void native_norms(void)
{
    CHECK(gp_dev_bn_bf16_has(dev));
    native_bn_case("batchnorm (3, 70, 5, 7)", gp_shape_4d(1, 70, 5, 7), 3, 0, false, true);
    native_bn_case("batchnorm (2, 5, 190, 190)", gp_shape_4d(1, 5, 190, 190), 2, 0, false, true);
    native_bn_case("batchnorm 1-d (9, 300)", gp_shape_2d(1, 300), 9, 0, false, true);
    native_bn_case("batchnorm + relu", gp_shape_4d(1, 24, 9, 11), 4, 0, true, true);
    native_bn_case("batchnorm nChw8c", gp_shape_4d(1, 24, 9, 11), 4, 8, false, true);
    native_bn_case("batchnorm nChw16c + relu", gp_shape_4d(1, 48, 13, 13), 5, 16, true, true);
    native_bn_case("batchnorm, inference", gp_shape_4d(1, 24, 9, 11), 4, 0, false, false);
    native_bn_case("batchnorm nChw8c + relu, inference", gp_shape_4d(1, 16, 6, 6), 3, 8, true,
                   false);
    /* channels-last (a GPU's layout): pixels of 40 channels in units of 8,
     * 48 in units of 16 */
    native_bn_case("batchnorm nhwc 40 + relu", gp_shape_4d(1, 40, 7, 5), 3, 40, true, true);
    native_bn_case("batchnorm nhwc 48", gp_shape_4d(1, 48, 6, 6), 2, 48, false, true);
    native_bn_case("batchnorm nhwc 24, inference", gp_shape_4d(1, 24, 5, 5), 3, 24, false, false);
    /* the slot refuses a residual sum, whose blocks keep FP32 inside */
    gp_bn_desc d = {.n = 1, .c = 1, .s = 2, .eps = 1e-5f, .add = (const float *)&d};
    uint16_t x[2] = {0}, y[2];
    float m, v;
    CHECK(gp_dev_bn_fwd_train_bf16(dev, &d, x, NULL, NULL, y, &m, &v) == GP_ERR_INVALID);
    gp_error_clear();
}

/* One pooling layer on bf16 storage through pool_*_bf16: forward and
 * backward against the FP32 layer on the widened values (outputs and dx
 * the FP32 ones rounded), x in channel block `blk` (0 plain) and y plain
 * where `plain_out`; and no FP32 copies among the activations (the peak is
 * y, dx and the workspace). */
static void native_pool_case(const char *what, gp_layer_spec spec, gp_shape in, int64_t batch,
                             int64_t blk, bool plain_out)
{
    gp_layer lb, lf;
    CHECK_OK(gp_layer_create(&spec, 1, &in, dev, 7, &lb));
    CHECK_OK(gp_layer_create(&spec, 1, &in, dev, 7, &lf));
    lb.out_dtype = GP_BF16;
    lb.in_blk = lf.in_blk = blk;
    lb.out_blk = lf.out_blk = plain_out ? 0 : blk;
    gp_shape xs = gp_shape_with_batch(&in, batch), ys = gp_shape_with_batch(&lb.out_shape, batch);
    gp_tensor xb = rand_bf16(&xs, 51), dyb = rand_bf16(&ys, 52), xw, dyw, yb, yf, yw, dxb = {0},
              dxf = {0};
    CHECK_OK(gp_tensor_as(&xw, &xb, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_as(&dyw, &dyb, GP_F32, GP_MEM_ACTIVATIONS));
    gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = batch};
    gp_saved sb = {0}, sf = {0};
    size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS];
    gp_allocator_reset_peak(&dev->alloc);
    CHECK_OK(gp_layer_forward(&lb, &ctx, &xb, &yb, &sb));
    CHECK_OK(gp_layer_backward(&lb, &ctx, &xb, &yb, &dyb, &dxb, &sb));
    size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
    size_t bound = gp_tensor_bytes(&xb) + gp_tensor_bytes(&dyb) + sb.ws_bytes;
    CHECK_MSG(peak <= bound, "%s: the bf16 pool peaked at %zu bytes of activations, over y, dx "
              "and its workspace's %zu: FP32 temporaries", what, peak, bound);
    CHECK(yb.dtype == GP_BF16 && dxb.dtype == GP_BF16);
    CHECK_OK(gp_layer_forward(&lf, &ctx, &xw, &yf, &sf));
    int64_t bad = rounded_mismatches(&yb, &yf);
    CHECK_MSG(bad == 0, "%s forward: %lld of %lld outputs are not the FP32 output rounded",
              what, (long long)bad, (long long)gp_tensor_numel(&yf));
    CHECK_OK(gp_tensor_as(&yw, &yb, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_layer_backward(&lf, &ctx, &xw, &yw, &dyw, &dxf, &sf));
    bad = rounded_mismatches(&dxb, &dxf);
    CHECK_MSG(bad == 0, "%s backward: %lld of %lld of dx are not the FP32 dx rounded", what,
              (long long)bad, (long long)gp_tensor_numel(&dxf));
    gp_tensor *all[] = {&xb, &dyb, &xw, &dyw, &yb, &yf, &yw, &dxb, &dxf};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
    gp_saved_free(&sb);
    gp_saved_free(&sf);
    gp_layer_destroy(&lb);
    gp_layer_destroy(&lf);
}

/* Pooling takes bf16 storage through pool_*_bf16 on a CPU device: max
 * pooling's 2x2 loop and its generic one (ties: bf16 values repeat), a
 * window over 256 values (the int32 workspace), the averages with and
 * without the padding counted, global average pooling, the blocked
 * layouts (channels-last too) and a blocked chain's plain output. */
static void native_pools(void)
{
    CHECK(gp_dev_pool_bf16_has(dev));
    gp_shape map = gp_shape_4d(1, 6, 30, 34), big = gp_shape_4d(1, 16, 20, 20);
    gp_layer_spec s = gp_layer_spec_default(GP_LAYER_MAXPOOL2D);
    s.kernel = gp_hw_square(2);
    native_pool_case("maxpool2d 2x2", s, map, 3, 0, false);
    native_pool_case("maxpool2d 2x2 nChw8c", s, big, 2, 8, false);
    native_pool_case("maxpool2d 2x2 nhwc 24", s, gp_shape_4d(1, 24, 10, 12), 2, 24, false);
    s.kernel = gp_hw_square(3);
    s.stride = gp_hw_square(2);
    s.padding = gp_hw_square(1);
    native_pool_case("maxpool2d 3x3/2 pad 1", s, map, 3, 0, false);
    native_pool_case("maxpool2d 3x3/2 pad 1 nChw16c, plain out", s, big, 2, 16, true);
    s.type = GP_LAYER_AVGPOOL2D;
    native_pool_case("avgpool2d 3x3/2 pad 1", s, map, 3, 0, false);
    native_pool_case("avgpool2d 3x3/2 pad 1 nChw8c", s, big, 2, 8, false);
    native_pool_case("avgpool2d 3x3/2 pad 1 nhwc 40, plain out", s, gp_shape_4d(1, 40, 9, 9), 2,
                     40, true);
    native_pool_case("avgpool2d 3x3/2 pad 1 nhwc 48", s, gp_shape_4d(1, 48, 8, 8), 2, 48, false);
    s.count_include_pad = false;
    native_pool_case("avgpool2d without the padding", s, map, 3, 0, false);
    s = gp_layer_spec_default(GP_LAYER_MAXPOOL2D);
    s.kernel = gp_hw_square(17);
    s.stride = gp_hw_square(3);
    native_pool_case("maxpool2d 17x17 (int32 workspace)", s, big, 2, 0, false);
    native_pool_case("global_avgpool", gp_layer_spec_default(GP_LAYER_GLOBAL_AVGPOOL), map, 3, 0,
                     false);
}

/* The add layer (a skip's sum) on bf16 storage through add_bf16: the FP32
 * sum of the widened inputs rounded once, in place too, both gradients dy
 * as it is, and no FP32 temporaries (the adapter's would be 4 bytes a
 * value for each input and the sum). */
static void native_add(void)
{
    CHECK(dev->iface->add_bf16 != NULL);
    gp_shape map = gp_shape_4d(1, 6, 30, 34), two[2] = {map, map};
    gp_layer_spec spec = gp_layer_spec_default(GP_LAYER_ADD);
    spec.n_pop = 1;
    snprintf(spec.pop[0], sizeof spec.pop[0], "a");
    gp_layer l;
    CHECK_OK(gp_layer_create(&spec, 1, two, dev, 7, &l));
    l.out_dtype = GP_BF16;
    gp_shape xs = gp_shape_with_batch(&map, 3);
    gp_tensor x[2] = {rand_bf16(&xs, 61), rand_bf16(&xs, 62)}, dy = rand_bf16(&xs, 63), y,
              dx[2] = {{0}};
    gp_fwd_ctx ctx = {.training = true, .batch_total = 3};
    gp_saved sv = {0};
    size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS], bytes = gp_tensor_bytes(&dy);
    gp_allocator_reset_peak(&dev->alloc);
    CHECK_OK(gp_layer_forward(&l, &ctx, x, &y, &sv));
    CHECK_OK(gp_layer_backward(&l, &ctx, x, &y, &dy, dx, &sv));
    size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
    CHECK_MSG(peak <= 3 * bytes, "a bf16 add peaked at %zu bytes of activations over y and "
              "dx's %zu: FP32 temporaries", peak, 3 * bytes);
    float *a = values(&x[0]), *b = values(&x[1]), *r = values(&y), *g = values(&dy);
    float *g0 = values(&dx[0]), *g1 = values(&dx[1]);
    int64_t n = gp_tensor_numel(&y), bad = 0, moved = 0;
    for (int64_t i = 0; i < n; i++) {
        bad += gp_ew_bf16_bits(r[i]) != gp_ew_bf16_bits(a[i] + b[i]);
        moved += g0[i] != g[i] || g1[i] != g[i];
    }
    CHECK_MSG(bad == 0 && y.dtype == GP_BF16, "bf16 add: %lld of %lld sums are not the FP32 sum "
              "rounded", (long long)bad, (long long)n);
    CHECK_MSG(moved == 0, "bf16 add backward: %lld of %lld gradients are not dy", (long long)moved,
              (long long)n);
    /* in place over its first input (the executor's accumulate does this) */
    CHECK_OK(gp_dev_add_bf16(dev, gp_bf16(&x[0]), gp_bf16(&x[1]), gp_bf16(&x[0]), n));
    float *ip = values(&x[0]);
    bad = 0;
    for (int64_t i = 0; i < n; i++) bad += ip[i] != r[i];
    CHECK_MSG(bad == 0, "bf16 add in place: %lld of %lld differ", (long long)bad, (long long)n);
    float *fs[] = {a, b, r, g, g0, g1, ip};
    for (size_t k = 0; k < sizeof fs / sizeof *fs; k++) free(fs[k]);
    gp_tensor *all[] = {&x[0], &x[1], &dy, &y, &dx[0], &dx[1]};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
    gp_saved_free(&sv);
    gp_layer_destroy(&l);
}

/* ---- the residual block on bf16 storage ----------------------------------
 * Its children as stand-alone bf16 layers (each rounding its own output and
 * dx, the adapter's where a child has no bf16 kernel: the convolutions on
 * this CPU), one after another, with the block's parameters: conv1, bn1,
 * relu, conv2, bn2, the shortcut (x, or downsample.0 and .1), add, relu.
 * The block must give their bits: forward, dx and every parameter's
 * gradient; and keep its inner maps in bf16 (gp_saved_bytes).  Its output
 * is bn2's, which adds the shortcut and applies the relu in its own pass
 * (gp_bn_desc.add16, unless GPIPE_FUSE_RELU=0): bits(relu(the FP32 bn2 of
 * the widened a2 + the widened shortcut)), once rounded where the chain
 * rounds three times.  Under the storage adapter (the block's insides
 * FP32, the output rounded once) the bits differ, and so they do unfused. */

enum { RC_CONV1, RC_BN1, RC_RELU1, RC_CONV2, RC_BN2, RC_DCONV, RC_DBN, RC_ADD, RC_RELU2, RC_N };

static void residual_chain(const gp_layer *blk, gp_shape in, bool down, gp_layer *c)
{
    static const char *const prefix[RC_N] = {"conv1", "bn1", NULL, "conv2", "bn2",
                                             "downsample.0", "downsample.1", NULL, NULL};
    gp_shape mid = blk->out_shape, two[2] = {mid, mid};
    for (int k = 0; k < RC_N; k++) {
        if ((k == RC_DCONV || k == RC_DBN) && !down) {
            c[k] = (gp_layer){0};
            continue;
        }
        bool conv = k == RC_CONV1 || k == RC_CONV2 || k == RC_DCONV;
        bool bn = k == RC_BN1 || k == RC_BN2 || k == RC_DBN;
        gp_layer_spec sp = gp_layer_spec_default(conv ? GP_LAYER_CONV2D
                                                 : bn ? GP_LAYER_BATCHNORM
                                                 : k == RC_ADD ? GP_LAYER_ADD
                                                               : GP_LAYER_RELU);
        const gp_shape *x = k == RC_CONV1 || k == RC_DCONV ? &in : k == RC_ADD ? two : &mid;
        if (conv) {
            sp.out = blk->spec.out;
            sp.bias = false;
            sp.kernel = gp_hw_square(k == RC_DCONV ? 1 : 3);
            sp.padding = gp_hw_square(k == RC_DCONV ? 0 : 1);
            sp.stride = k == RC_CONV2 ? gp_hw_square(1) : blk->spec.stride;
        }
        if (k == RC_ADD) {
            sp.n_pop = 1;
            snprintf(sp.pop[0], sizeof sp.pop[0], "shortcut");
        }
        CHECK_OK(gp_layer_create(&sp, k, x, dev, 3, &c[k]));
        c[k].out_dtype = GP_BF16;
        for (int p = 0; prefix[k] && p < c[k].n_params; p++) { /* the block's values */
            char name[96];
            snprintf(name, sizeof name, "%s.%s", prefix[k], c[k].params[p].name);
            const gp_param *bp = NULL;
            for (int q = 0; q < blk->n_params; q++)
                if (!strcmp(blk->params[q].name, name)) bp = &blk->params[q];
            CHECK_MSG(bp != NULL, "the block has no parameter %s", name);
            if (bp) CHECK_OK(gp_tensor_copy(&c[k].params[p].value, &bp->value));
        }
    }
}

static void residual_case(const char *what, gp_shape in, int64_t out, int64_t stride,
                          int64_t batch)
{
    gp_layer_spec spec = gp_layer_spec_default(GP_LAYER_RESIDUAL);
    spec.out = out;
    spec.stride = gp_hw_square(stride);
    gp_layer blk, c[RC_N];
    CHECK_OK(gp_layer_create(&spec, 0, &in, dev, 9, &blk));
    blk.out_dtype = GP_BF16;
    bool down = stride != 1 || in.dims[1] != out;
    residual_chain(&blk, in, down, c);
    gp_shape xs = gp_shape_with_batch(&in, batch), ys = gp_shape_with_batch(&blk.out_shape, batch);
    gp_tensor x = rand_bf16(&xs, 71), dy = rand_bf16(&ys, 72), y, dx = {0};
    gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = batch};
    gp_saved sb = {0};
    CHECK_OK(gp_layer_forward(&blk, &ctx, &x, &y, &sb));
    CHECK_OK(gp_layer_backward(&blk, &ctx, &x, &y, &dy, &dx, &sb));
    /* the inner maps it keeps: a1, r1, a2 (and the shortcut's) in bf16 */
    size_t map = (size_t)gp_shape_numel(&ys) * 2, stats = 2 * (size_t)out * sizeof(float);
    size_t want = (down ? 4 : 3) * map + (down ? 3 : 2) * stats;
    CHECK_MSG(gp_saved_bytes(&sb) == want && blk.ops->saved_bytes(&blk, batch) == want,
              "%s: the block keeps %zu bytes (saved_bytes says %zu), not its bf16 maps' %zu",
              what, gp_saved_bytes(&sb), blk.ops->saved_bytes(&blk, batch), want);
    /* the chain, forward */
    gp_tensor t[RC_N] = {{0}};
    gp_saved ss[RC_N];
    memset(ss, 0, sizeof ss);
    CHECK_OK(gp_layer_forward(&c[RC_CONV1], &ctx, &x, &t[RC_CONV1], &ss[RC_CONV1]));
    CHECK_OK(gp_layer_forward(&c[RC_BN1], &ctx, &t[RC_CONV1], &t[RC_BN1], &ss[RC_BN1]));
    CHECK_OK(gp_layer_forward(&c[RC_RELU1], &ctx, &t[RC_BN1], &t[RC_RELU1], &ss[RC_RELU1]));
    CHECK_OK(gp_layer_forward(&c[RC_CONV2], &ctx, &t[RC_RELU1], &t[RC_CONV2], &ss[RC_CONV2]));
    CHECK_OK(gp_layer_forward(&c[RC_BN2], &ctx, &t[RC_CONV2], &t[RC_BN2], &ss[RC_BN2]));
    const gp_tensor *sc = &x;
    if (down) {
        CHECK_OK(gp_layer_forward(&c[RC_DCONV], &ctx, &x, &t[RC_DCONV], &ss[RC_DCONV]));
        CHECK_OK(gp_layer_forward(&c[RC_DBN], &ctx, &t[RC_DCONV], &t[RC_DBN], &ss[RC_DBN]));
        sc = &t[RC_DBN];
    }
    gp_tensor sum_in[2] = {t[RC_BN2], *sc};
    CHECK_OK(gp_layer_forward(&c[RC_ADD], &ctx, sum_in, &t[RC_ADD], &ss[RC_ADD]));
    CHECK_OK(gp_layer_forward(&c[RC_RELU2], &ctx, &t[RC_ADD], &t[RC_RELU2], &ss[RC_RELU2]));
    if (gp_layers_fuse_relu_on()) {
        /* bn2 adds the shortcut and applies the relu in its own pass
         * (gp_bn_desc.add16), one rounding: y = bits(relu(FP32 bn2 of the
         * widened a2 + the widened shortcut)) */
        gp_layer_spec bs = gp_layer_spec_default(GP_LAYER_BATCHNORM);
        gp_layer bnf;
        gp_shape mid = blk.out_shape;
        CHECK_OK(gp_layer_create(&bs, 9, &mid, dev, 3, &bnf));
        for (int p = 0; p < bnf.n_params; p++) {
            char name[96];
            snprintf(name, sizeof name, "bn2.%s", bnf.params[p].name);
            for (int q = 0; q < blk.n_params; q++)
                if (!strcmp(blk.params[q].name, name))
                    CHECK_OK(gp_tensor_copy(&bnf.params[p].value, &blk.params[q].value));
        }
        gp_tensor a2w, vf = {0};
        gp_saved sf = {0};
        CHECK_OK(gp_tensor_as(&a2w, &t[RC_CONV2], GP_F32, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_layer_forward(&bnf, &ctx, &a2w, &vf, &sf));
        float *v = gpt_download(&vf), *s = values(sc);
        int64_t ny = gp_tensor_numel(&vf);
        for (int64_t i = 0; i < ny; i++) v[i] = gp_ew_bf16_value(gp_ew_bf16_bits(gp_ew_relu(v[i] + s[i])));
        gp_tensor yw = gpt_upload(dev, &ys, v), wantb;
        CHECK_OK(gp_tensor_as(&wantb, &yw, GP_BF16, GP_MEM_ACTIVATIONS));
        gp_tensor_free(&t[RC_RELU2]); /* the output the block's backward sees */
        t[RC_RELU2] = wantb;
        free(v);
        free(s);
        gp_tensor *tf[] = {&a2w, &vf, &yw};
        for (int q = 0; q < 3; q++) gp_tensor_free(tf[q]);
        gp_saved_free(&sf);
        gp_layer_destroy(&bnf);
    }
    CHECK_MSG(y.dtype == GP_BF16 && same_bits(&y, &t[RC_RELU2]),
              "%s forward: the block's output is not its children's in bf16%s", what,
              gp_layers_fuse_relu_on() ? " (bn2 adding the shortcut, relu, one rounding)" : "");
    /* the chain, backward */
    gp_tensor g = {0}, gs[2] = {{0}}, d2 = {0}, d3 = {0}, d4 = {0}, d5 = {0}, dxc = {0};
    CHECK_OK(gp_layer_backward(&c[RC_RELU2], &ctx, &t[RC_ADD], &t[RC_RELU2], &dy, &g,
                               &ss[RC_RELU2]));
    CHECK_OK(gp_layer_backward(&c[RC_ADD], &ctx, sum_in, &t[RC_ADD], &g, gs, &ss[RC_ADD]));
    CHECK_OK(gp_layer_backward(&c[RC_BN2], &ctx, &t[RC_CONV2], &t[RC_BN2], &gs[0], &d2,
                               &ss[RC_BN2]));
    CHECK_OK(gp_layer_backward(&c[RC_CONV2], &ctx, &t[RC_RELU1], &t[RC_CONV2], &d2, &d3,
                               &ss[RC_CONV2]));
    CHECK_OK(gp_layer_backward(&c[RC_RELU1], &ctx, &t[RC_BN1], &t[RC_RELU1], &d3, &d4,
                               &ss[RC_RELU1]));
    CHECK_OK(gp_layer_backward(&c[RC_BN1], &ctx, &t[RC_CONV1], &t[RC_BN1], &d4, &d5,
                               &ss[RC_BN1]));
    CHECK_OK(gp_layer_backward(&c[RC_CONV1], &ctx, &x, &t[RC_CONV1], &d5, &dxc, &ss[RC_CONV1]));
    if (down) {
        gp_tensor e1 = {0}, e2 = {0};
        CHECK_OK(gp_layer_backward(&c[RC_DBN], &ctx, &t[RC_DCONV], &t[RC_DBN], &gs[1], &e1,
                                   &ss[RC_DBN]));
        CHECK_OK(gp_layer_backward(&c[RC_DCONV], &ctx, &x, &t[RC_DCONV], &e1, &e2,
                                   &ss[RC_DCONV]));
        CHECK_OK(gp_layers_accumulate(dev, &dxc, &e2));
        gp_tensor_free(&e1);
        gp_tensor_free(&e2);
    } else {
        CHECK_OK(gp_layers_accumulate(dev, &dxc, &gs[1]));
    }
    CHECK_MSG(dx.dtype == GP_BF16 && same_bits(&dx, &dxc),
              "%s backward: the block's dx is not its children's in bf16", what);
    static const char *const prefix[RC_N] = {"conv1", "bn1", NULL, "conv2", "bn2",
                                             "downsample.0", "downsample.1", NULL, NULL};
    for (int k = 0; k < RC_N; k++)
        for (int p = 0; prefix[k] && c[k].ops && p < c[k].n_params; p++) {
            if (c[k].params[p].is_buffer) continue;
            char name[96];
            snprintf(name, sizeof name, "%s.%s", prefix[k], c[k].params[p].name);
            for (int q = 0; q < blk.n_params; q++)
                if (!strcmp(blk.params[q].name, name))
                    CHECK_MSG(same_bits(&blk.params[q].grad, &c[k].params[p].grad),
                              "%s backward: the gradient of %s is not its child's", what, name);
        }
    gp_tensor *all[] = {&x, &dy, &y, &dx, &g, &gs[0], &gs[1], &d2, &d3, &d4, &d5, &dxc};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
    for (int k = 0; k < RC_N; k++) {
        gp_tensor_free(&t[k]);
        gp_saved_free(&ss[k]);
        if (c[k].ops) gp_layer_destroy(&c[k]);
    }
    gp_saved_free(&sb);
    gp_layer_destroy(&blk);
}

static void native_residual(void)
{
    residual_case("residual (identity)", gp_shape_4d(1, 6, 9, 9), 6, 1, 3);
    residual_case("residual (downsample)", gp_shape_4d(1, 5, 9, 11), 8, 2, 2);
    residual_case("residual (channels)", gp_shape_4d(1, 4, 6, 6), 7, 1, 4);
}

/* A model of residual blocks (identity and downsample) on bf16 storage,
 * split over 2 devices, m = 2, every checkpoint mode: bit for bit the
 * one-device run (the blocks' inner maps round where the one-device run
 * rounds them; a recompute rounds them again the same way). */
static void residual_pipeline(void)
{
    static const char text[] =
        "model:\n  input: [3, 8, 8]\n  layers:\n"
        "    - conv2d: {out: 8, kernel: 3, padding: 1, bias: false}\n"
        "    - batchnorm\n    - relu\n"
        "    - residual: {out: 8}\n    - residual: {out: 12, stride: 2}\n"
        "    - residual: {out: 12}\n"
        "    - global_avgpool\n    - flatten\n    - linear: {out: 5}\n"
        "  loss: cross_entropy\n"
        "data: {dataset: synthetic, synthetic: {train: 8, test: 8, classes: 5}}\n"
        "train: {batch_size: 8, seed: 3, activations: bf16}\n";
    gp_config c;
    CHECK_OK(gp_config_parse("r.yaml", text, strlen(text), NULL, 0, &c));
    gp_device *two[2];
    gpt_open_cpu_devices(two, 2, 1);
    static const int bal[2] = {4, 5};
    for (int ck = 0; ck < 3; ck++) {
        c.pipeline.chunks = 2;
        c.pipeline.checkpoint = (gp_checkpoint_mode)ck;
        gp_model ref, pip;
        CHECK_OK(gp_model_build(&c, two[0], &ref));
        CHECK_OK(gp_model_build_placed(&c, two, 2, bal, &pip));
        CHECK(pip.layers[4].out_dtype == GP_BF16);
        bool same[3];
        gpt_compare_steps(&c, &ref, &pip, 8, 3, same);
        CHECK_MSG(same[0] && same[1] && same[2],
                  "bf16 residual model on 2 stages, checkpoint %s: loss %d, grads %d, params %d",
                  gp_checkpoint_mode_name((gp_checkpoint_mode)ck), same[0], same[1], same[2]);
        gp_model_free(&ref);
        gp_model_free(&pip);
    }
    for (int k = 0; k < 2; k++) gp_device_close(two[k]);
    gp_config_free(&c);
}

/* U-Net's layers on bf16 storage (upsample_*_bf16, instance norm through
 * batch norm's bf16 slots and norm_leaky_bwd_bf16): no FP32 activations
 * (the peak is y, dx and the statistics); the values are checked against
 * FP32 on the widened values by adapter_layers.  The instance norm linked
 * to the leaky relu after it: its gradient is the same bits from its own
 * output (the relu in the next stage) and from the relu's bf16 output in
 * place over it, and is the FP32 backward from that widened relu output,
 * rounded once. */
static void native_unet(void)
{
    gp_shape map = gp_shape_4d(1, 6, 10, 12);
    for (int k = 0; k < 3; k++) {
        gp_layer_spec spec = gp_layer_spec_default(k < 2 ? GP_LAYER_UPSAMPLE : GP_LAYER_INSTANCE_NORM);
        if (k == 1) spec.scale = 3;
        gp_layer l;
        CHECK_OK(gp_layer_create(&spec, 1, &map, dev, 7, &l));
        l.out_dtype = GP_BF16;
        CHECK(l.ops->takes_bf16 && l.ops->takes_bf16(&l));
        gp_shape xs = gp_shape_with_batch(&map, 3), ys = gp_shape_with_batch(&l.out_shape, 3);
        gp_tensor x = rand_bf16(&xs, 81), dy = rand_bf16(&ys, 82), y, dx = {0};
        gp_fwd_ctx ctx = {.training = true, .batch_total = 3};
        gp_saved sv = {0};
        size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS];
        gp_allocator_reset_peak(&dev->alloc);
        CHECK_OK(gp_layer_forward(&l, &ctx, &x, &y, &sv));
        CHECK_OK(gp_layer_backward(&l, &ctx, &x, &y, &dy, &dx, &sv));
        size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
        size_t want = gp_tensor_bytes(&y) + gp_tensor_bytes(&dx) + gp_saved_bytes(&sv);
        CHECK_MSG(peak <= want && y.dtype == GP_BF16 && dx.dtype == GP_BF16,
                  "bf16 %s: peaked at %zu bytes of activations over y, dx and what it keeps "
                  "(%zu): FP32 temporaries", gp_layer_type_name(spec.type), peak, want);
        gp_tensor *all[] = {&x, &dy, &y, &dx};
        for (size_t q = 0; q < sizeof all / sizeof *all; q++) gp_tensor_free(all[q]);
        gp_saved_free(&sv);
        gp_layer_destroy(&l);
    }
    /* the linked norm */
    const float slope = 0.2f;
    gp_layer_spec ns = gp_layer_spec_default(GP_LAYER_INSTANCE_NORM);
    ns.leaky_after = slope;
    gp_layer_spec rs = gp_layer_spec_default(GP_LAYER_LEAKY_RELU);
    rs.slope = slope;
    gp_layer lb, lf, relu;
    CHECK_OK(gp_layer_create(&ns, 1, &map, dev, 7, &lb));
    CHECK_OK(gp_layer_create(&ns, 1, &map, dev, 7, &lf));
    CHECK_OK(gp_layer_create(&rs, 2, &map, dev, 7, &relu));
    lb.out_dtype = relu.out_dtype = GP_BF16;
    CHECK(lb.ops->takes_bf16(&lb) && relu.ops->takes_bf16(&relu));
    gp_shape xs = gp_shape_with_batch(&map, 3);
    gp_tensor x = rand_bf16(&xs, 91), dz = rand_bf16(&xs, 92), y, z, g = {0}, dx1 = {0},
              dx2 = {0}, xw, yf, zw, gw, dxf = {0};
    gp_fwd_ctx ctx = {.training = true, .batch_total = 3};
    gp_saved sb = {0}, sr = {0}, sf = {0};
    CHECK_OK(gp_layer_forward(&lb, &ctx, &x, &y, &sb));
    CHECK_OK(gp_layer_forward(&relu, &ctx, &y, &z, &sr)); /* out of place: y kept */
    CHECK_OK(gp_layer_backward(&relu, &ctx, &y, &z, &dz, &g, &sr));
    lb.leaky_inplace = false; /* from y: the relu in the next stage */
    CHECK_OK(gp_layer_backward(&lb, &ctx, &x, &y, &g, &dx1, &sb));
    lb.leaky_inplace = true; /* from z, in y's place (the relu in place over it) */
    CHECK_OK(gp_layer_backward(&lb, &ctx, &x, &z, &g, &dx2, &sb));
    CHECK_MSG(same_bits(&dx1, &dx2), "bf16 instance norm + leaky relu: the norm's gradient "
              "from its output differs from the one from the relu's output over it");
    CHECK_OK(gp_tensor_as(&xw, &x, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_as(&zw, &z, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_as(&gw, &g, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_layer_forward(&lf, &ctx, &xw, &yf, &sf));
    CHECK(same_bits(&sf.t[1], &sb.t[1])); /* the variance: batch norm's bf16 slot's */
    lf.leaky_inplace = true;
    CHECK_OK(gp_layer_backward(&lf, &ctx, &xw, &zw, &gw, &dxf, &sf));
    int64_t bad = rounded_mismatches(&dx1, &dxf);
    CHECK_MSG(bad == 0, "bf16 instance norm + leaky relu: %lld of %lld of dx are not the FP32 "
              "backward's from the widened relu output, rounded", (long long)bad,
              (long long)gp_tensor_numel(&dxf));
    gp_tensor *all[] = {&x, &dz, &y, &z, &g, &dx1, &dx2, &xw, &yf, &zw, &gw, &dxf};
    for (size_t q = 0; q < sizeof all / sizeof *all; q++) gp_tensor_free(all[q]);
    gp_saved *ss[] = {&sb, &sr, &sf};
    for (int q = 0; q < 3; q++) gp_saved_free(ss[q]);
    gp_layer_destroy(&lb);
    gp_layer_destroy(&lf);
    gp_layer_destroy(&relu);
}

/* Layer norm on bf16 storage through layer_norm_*_bf16: forward and
 * backward against the FP32 layer on the widened values (y and dx the FP32
 * ones rounded, the parameters' gradients and the saved statistics bit for
 * bit), on rows split across threads and not, and no FP32 activations (the
 * peak is y, dx and the statistics). */
static void native_layer_norm(void)
{
    CHECK(gp_dev_layer_norm_bf16_has(dev));
    for (int big = 0; big < 2; big++) {
        gp_shape in = {3, {1, big ? 64 : 7, big ? 96 : 50, 0}};
        int64_t batch = big ? 8 : 3;
        gp_layer_spec spec = gp_layer_spec_default(GP_LAYER_LAYER_NORM);
        gp_layer lb, lf;
        CHECK_OK(gp_layer_create(&spec, 1, &in, dev, 7, &lb));
        CHECK_OK(gp_layer_create(&spec, 1, &in, dev, 7, &lf));
        lb.out_dtype = GP_BF16;
        for (int p = 0; p < 2; p++) { /* weights that are not 1 and 0 */
            gp_shape cs = {1, {in.dims[2], 0, 0, 0}};
            gp_tensor r = rand_bf16(&cs, 80u + (uint32_t)p), rf;
            CHECK_OK(gp_tensor_as(&rf, &r, GP_F32, GP_MEM_ACTIVATIONS));
            CHECK_OK(gp_tensor_copy(&lb.params[p].value, &rf));
            CHECK_OK(gp_tensor_copy(&lf.params[p].value, &rf));
            gp_tensor_free(&rf);
            gp_tensor_free(&r);
        }
        gp_shape xs = gp_shape_with_batch(&in, batch);
        gp_tensor xb = rand_bf16(&xs, 81), dyb = rand_bf16(&xs, 82), xw, dyw, yb, yf, yw;
        gp_tensor dxb = {0}, dxf = {0};
        CHECK_OK(gp_tensor_as(&xw, &xb, GP_F32, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_tensor_as(&dyw, &dyb, GP_F32, GP_MEM_ACTIVATIONS));
        gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = batch};
        gp_saved sb = {0}, sf = {0};
        size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS], bytes = gp_tensor_bytes(&xb);
        size_t stats = 2 * (size_t)(batch * in.dims[1]) * sizeof(float);
        gp_allocator_reset_peak(&dev->alloc);
        CHECK_OK(gp_layer_forward(&lb, &ctx, &xb, &yb, &sb));
        CHECK_OK(gp_layer_backward(&lb, &ctx, &xb, &yb, &dyb, &dxb, &sb));
        size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
        CHECK_MSG(peak <= 2 * bytes + stats, "bf16 layer norm peaked at %zu bytes of "
                  "activations over y, dx and the statistics' %zu: FP32 temporaries", peak,
                  2 * bytes + stats);
        CHECK_OK(gp_layer_forward(&lf, &ctx, &xw, &yf, &sf));
        CHECK_OK(gp_tensor_as(&yw, &yb, GP_F32, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_layer_backward(&lf, &ctx, &xw, &yw, &dyw, &dxf, &sf));
        int64_t bad = rounded_mismatches(&yb, &yf), bad_dx = rounded_mismatches(&dxb, &dxf);
        CHECK_MSG(bad == 0 && bad_dx == 0, "bf16 layer norm (%s): %lld outputs and %lld of dx "
                  "are not the FP32 ones rounded", big ? "threads" : "small", (long long)bad,
                  (long long)bad_dx);
        CHECK_MSG(same_bits(&sb.t[0], &sf.t[0]) && same_bits(&sb.t[1], &sf.t[1]),
                  "bf16 layer norm: the statistics differ from FP32's");
        for (int p = 0; p < 2; p++)
            CHECK_MSG(same_bits(&lb.params[p].grad, &lf.params[p].grad),
                      "bf16 layer norm: the gradient of %s differs from FP32's",
                      lb.params[p].name);
        gp_tensor *all[] = {&xb, &dyb, &xw, &dyw, &yb, &yf, &yw, &dxb, &dxf};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
        gp_saved_free(&sb);
        gp_saved_free(&sf);
        gp_layer_destroy(&lb);
        gp_layer_destroy(&lf);
    }
}

/* Dropout and dropout2d on bf16 storage (dropout_apply_bf16,
 * mul_rows_bf16): the FP32 layer's mask on the widened values, rounded
 * once, forward and backward, in place too, and no FP32 activations (the
 * peak is y, dx and dropout2d's channel mask). */
static void native_dropouts(void)
{
    CHECK(dev->iface->dropout_apply_bf16 && dev->iface->mul_rows_bf16);
    for (int two = 0; two < 2; two++)
        for (int inplace = 0; inplace < 2; inplace++) {
            gp_layer_spec spec = gp_layer_spec_default(two ? GP_LAYER_DROPOUT2D : GP_LAYER_DROPOUT);
            spec.p = 0.3f;
            gp_shape in = two ? gp_shape_4d(1, 24, 30, 34) : gp_shape_2d(1, 9001);
            int64_t batch = 5;
            gp_layer lb, lf;
            CHECK_OK(gp_layer_create(&spec, 4, &in, dev, 7, &lb));
            CHECK_OK(gp_layer_create(&spec, 4, &in, dev, 7, &lf));
            lb.out_dtype = GP_BF16;
            gp_shape xs = gp_shape_with_batch(&in, batch);
            gp_tensor xb = rand_bf16(&xs, 91), dyb = rand_bf16(&xs, 92), xw, dyw, yb, yf, yw;
            gp_tensor dxb = {0}, dxf = {0}, x0 = rand_bf16(&xs, 91);
            CHECK_OK(gp_tensor_as(&xw, &xb, GP_F32, GP_MEM_ACTIVATIONS));
            CHECK_OK(gp_tensor_as(&dyw, &dyb, GP_F32, GP_MEM_ACTIVATIONS));
            gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 3, .batch_total = batch};
            gp_saved sb = {0}, sf = {0};
            /* an odd count of bf16 values takes whole 4-byte words */
            size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS];
            size_t bytes = (gp_tensor_bytes(&xb) + 3) & ~(size_t)3;
            size_t mask = two ? (size_t)(batch * 24) * sizeof(float) : 0;
            gp_allocator_reset_peak(&dev->alloc);
            if (inplace)
                CHECK_OK(gp_layer_forward_inplace(&lb, &ctx, &xb, &yb, &sb)); /* over xb */
            else
                CHECK_OK(gp_layer_forward(&lb, &ctx, &xb, &yb, &sb));
            CHECK_OK(gp_layer_backward(&lb, &ctx, &x0, &yb, &dyb, &dxb, &sb));
            size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
            CHECK_MSG(peak <= 2 * bytes + mask, "bf16 %s peaked at %zu bytes of activations "
                      "over y, dx and the mask's %zu: FP32 temporaries", two ? "dropout2d" :
                      "dropout", peak, 2 * bytes + mask);
            CHECK_OK(gp_layer_forward(&lf, &ctx, &xw, &yf, &sf));
            CHECK_OK(gp_tensor_as(&yw, &yb, GP_F32, GP_MEM_ACTIVATIONS));
            CHECK_OK(gp_layer_backward(&lf, &ctx, &xw, &yw, &dyw, &dxf, &sf));
            int64_t bad = rounded_mismatches(&yb, &yf), bad_dx = rounded_mismatches(&dxb, &dxf);
            CHECK_MSG(bad == 0 && bad_dx == 0, "bf16 %s%s: %lld outputs and %lld of dx are not "
                      "the FP32 ones rounded", two ? "dropout2d" : "dropout",
                      inplace ? " in place" : "", (long long)bad, (long long)bad_dx);
            if (!inplace) gp_tensor_free(&yb); /* in place: yb is a view of xb */
            gp_tensor *all[] = {&xb, &dyb, &xw, &dyw, &yf, &yw, &dxb, &dxf, &x0};
            for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
            gp_saved_free(&sb);
            gp_saved_free(&sf);
            gp_layer_destroy(&lb);
            gp_layer_destroy(&lf);
        }
}

/* Cross-entropy on bf16 logits with its results on the device
 * (gp_loss_dev, the step's path): through xent_bf16, the FP32 loss, hits
 * and gradient of the widened logits, the gradient rounded once, on
 * (N, T, vocab) logits with a padded vocabulary and label smoothing; no
 * FP32 copy of the logits among the activations; a bad label reported as
 * the FP32 path reports it. */
static void native_xent(void)
{
    CHECK(dev->iface->xent_bf16 != NULL);
    for (int ls = 0; ls < 2; ls++) {
        const int64_t n = 3, t = 5, v = 203, classes = ls ? 197 : 0;
        gp_shape lsh = {3, {n, t, v, 0}}, tsh = {2, {n, t, 0, 0}};
        gp_tensor lb = rand_bf16(&lsh, 71u + (uint32_t)ls), lw, db, dw, tg;
        float lab[15];
        for (int i = 0; i < 15; i++) lab[i] = (float)((i * 37 + 11) % (ls ? 197 : 203));
        tg = gpt_upload(dev, &tsh, lab);
        CHECK_OK(gp_tensor_as(&lw, &lb, GP_F32, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_tensor_alloc_as(&db, dev, &lsh, GP_BF16, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_tensor_alloc(&dw, dev, &lsh, GP_MEM_ACTIVATIONS));
        gp_loss_result rb, rw;
        float smooth = ls ? 0.1f : 0.0f;
        size_t before = dev->alloc.cur_by[GP_MEM_ACTIVATIONS];
        gp_allocator_reset_peak(&dev->alloc);
        CHECK_OK(gp_loss_dev(dev, GP_LOSS_CROSS_ENTROPY, smooth, classes, &lb, &tg, 0.5f, &db,
                             &rb));
        size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS] - before;
        CHECK_MSG(peak == 0, "cross-entropy on bf16 logits allocated %zu bytes of activations "
                  "(FP32 copies)", peak);
        CHECK_OK(gp_loss_dev(dev, GP_LOSS_CROSS_ENTROPY, smooth, classes, &lw, &tg, 0.5f, &dw,
                             &rw));
        CHECK_OK(gp_dev_synchronize(dev));
        CHECK_MSG(rb.loss_sum == rw.loss_sum && rb.correct == rw.correct && rb.bad == -1 &&
                      rw.bad == -1,
                  "cross-entropy on bf16 logits (smoothing %g): %.17g, %lld right against "
                  "%.17g, %lld on the widened logits", (double)smooth, rb.loss_sum,
                  (long long)rb.correct, rw.loss_sum, (long long)rw.correct);
        int64_t bad = rounded_mismatches(&db, &dw);
        CHECK_MSG(bad == 0, "cross-entropy on bf16 logits (smoothing %g): %lld of %lld of the "
                  "gradient are not the FP32 gradient rounded", (double)smooth, (long long)bad,
                  (long long)gp_tensor_numel(&dw));
        /* a label out of range: the row, as FP32's */
        lab[7] = (float)v;
        gp_tensor tb = gpt_upload(dev, &tsh, lab);
        CHECK_OK(gp_loss_dev(dev, GP_LOSS_CROSS_ENTROPY, smooth, classes, &lb, &tb, 0.5f, &db,
                             &rb));
        CHECK_OK(gp_loss_dev(dev, GP_LOSS_CROSS_ENTROPY, smooth, classes, &lw, &tb, 0.5f, &dw,
                             &rw));
        CHECK_MSG(rb.bad == 7 && rw.bad == 7, "a bad label in row 7: bf16 says %lld, FP32 %lld",
                  (long long)rb.bad, (long long)rw.bad);
        gp_tensor *all[] = {&lb, &lw, &db, &dw, &tg, &tb};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
    }
}

/* The losses on bf16 logits, and gradients added up. */
static void losses_and_sums(void)
{
    gp_shape ls = gp_shape_2d(6, 7), ts = {1, {6}};
    gp_tensor lb = rand_bf16(&ls, 12), lw, db, dw;
    float lab[6] = {0, 3, 6, 2, 2, 5};
    gp_tensor t = gpt_upload(dev, &ts, lab);
    CHECK_OK(gp_tensor_as(&lw, &lb, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc_as(&db, dev, &ls, GP_BF16, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc(&dw, dev, &ls, GP_MEM_ACTIVATIONS));
    gp_loss_out ob = {0}, ow = {0};
    CHECK_OK(gp_loss(dev, GP_LOSS_CROSS_ENTROPY, 0.1f, 0, &lb, &t, 0.25f, &db, &ob));
    CHECK_OK(gp_loss(dev, GP_LOSS_CROSS_ENTROPY, 0.1f, 0, &lw, &t, 0.25f, &dw, &ow));
    CHECK_MSG(ob.loss_sum == ow.loss_sum && ob.correct == ow.correct && ob.count == 6,
              "cross-entropy on bf16 logits: %.17g (%lld right) against %.17g (%lld) on the "
              "widened ones", ob.loss_sum, (long long)ob.correct, ow.loss_sum, (long long)ow.correct);
    CHECK_MSG(rounded_mismatches(&db, &dw) == 0, "cross-entropy on bf16 logits: the gradient is "
              "not the FP32 gradient rounded");
    /* g += sg in bf16: the FP32 sum of the two, rounded */
    gp_tensor g = rand_bf16(&ls, 21), sg = rand_bf16(&ls, 22), gw, sw;
    CHECK_OK(gp_tensor_as(&gw, &g, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_as(&sw, &sg, GP_F32, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_layers_accumulate(dev, &g, &sg));
    CHECK_OK(gp_layers_accumulate(dev, &gw, &sw));
    CHECK_MSG(rounded_mismatches(&g, &gw) == 0, "bf16 gradients added: not the FP32 sum rounded");
    int64_t moved = 0;
    float *a = values(&g), *b = values(&sg);
    for (int i = 0; i < 42; i++) moved += a[i] != b[i];
    CHECK_MSG(moved > 30, "bf16 gradients added: %lld of 42 values changed", (long long)moved);
    free(a);
    free(b);
    gp_tensor *all[] = {&lb, &lw, &db, &dw, &t, &g, &sg, &gw, &sw};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) gp_tensor_free(all[k]);
}

int main(void)
{
    gpt_open_cpu_devices(&dev, 1, 1);
    conversions();
    adapter_layers();
    as_they_are();
    native_activations();
    native_embedding();
    native_norms();
    native_pools();
    native_add();
    native_residual();
    residual_pipeline();
    native_unet();
    native_xent();
    native_layer_norm();
    native_dropouts();
    losses_and_sums();
    /* every byte came back (the backend's own scratch arena aside) */
    for (int c = 0; c < GP_MEM_COUNT; c++)
        CHECK_MSG(c == GP_MEM_WORKSPACE || dev->alloc.cur_by[c] == 0, "leaked %zu bytes of %s",
                  dev->alloc.cur_by[c], gp_mem_category_name((gp_mem_category)c));
    gp_device_close(dev);
    return gpt_finish("test_bf16");
}
