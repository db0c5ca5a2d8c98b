/*
 * test_checkpoint.c — the checkpoint module on its own:
 *   - the policy, against a table written out by hand for each mode;
 *   - a checkpointed forward holds exactly its input and output (measured
 *     by gp_stash_bytes and by the device allocator), a kept one holds more;
 *   - RNG replay: forward without keeping, then recompute, gives bit for bit
 *     the layer outputs of the forward that kept them (dropout's mask is the
 *     same), and batch norm's running statistics are those of one forward,
 *     not two (the oracle: an identical model that ran only the kept
 *     forward);
 *   - backward after a recompute gives bit for bit the input gradient and
 *     parameter gradients of backward after the kept forward, and frees
 *     every byte of the step;
 *   - in-place layers (gp_layers_inplace) and outputs no backward reads
 *     (gp_layers_unkept): which, against the rules written out for a
 *     U-Net-like stage; a kept forward then holds exactly those outputs'
 *     bytes less than the naive out-of-place loop (the oracle: gp_layer_forward /
 *     gp_layer_backward layer by layer), and the output, input gradient and
 *     parameter gradients are bit for bit the oracle's, kept, checkpointed
 *     and recomputed, and in evaluation;
 *   - in-place activated instance norm (gp_layer_specs_link): a U-Net
 *     unit's relu runs in place over its norm's output and the
 *     convolution's output is kept by nobody; the bytes a kept forward
 *     holds, and bit for bit the oracle's output and gradients, kept,
 *     recomputed and with a stage boundary between the norm and its relu;
 *   - a stage's ends in a forward that keeps: the input its first layer
 *     does not read and the output its last does not read are freed early
 *     (stage_ends), the same bits;
 *   - a kept forward's backward frees each layer's output and gradient as
 *     it goes (measured by the allocator's peak);
 *   - a non-finite loss is an error that says what to do.
 */
#include "checkpoint/checkpoint.h"
#include "test.h"

#include <math.h>

enum { B = 5, IN = 6, L = 5 };

static void policy(void)
{
    /* true where a micro-batch keeps only its input, by mode and by
     * whether its backward is its device's next computation (GPipe's and
     * torchgpipe's except_last: the one whose backward follows at once);
     * which micro-batches those are on each schedule: test_schedule */
    static const bool want[3][2] = {
        {true, true},  /* always */
        {true, false}, /* except_last */
        {false, false} /* never */
    };
    for (int mode = 0; mode < 3; mode++)
        for (int next = 0; next < 2; next++)
            CHECK_MSG(gp_ckpt_checkpointed((gp_checkpoint_mode)mode, next) == want[mode][next],
                      "mode %d, backward next %d", mode, next);
}

/* linear 6 -> 8, batch norm, relu, dropout 0.4, linear 8 -> 3 */
static void build(gp_device *dev, gp_layer *layers)
{
    gp_layer_spec sp[L] = {gp_layer_spec_default(GP_LAYER_LINEAR),
                           gp_layer_spec_default(GP_LAYER_BATCHNORM),
                           gp_layer_spec_default(GP_LAYER_RELU),
                           gp_layer_spec_default(GP_LAYER_DROPOUT),
                           gp_layer_spec_default(GP_LAYER_LINEAR)};
    sp[0].out = 8;
    sp[3].p = 0.4f;
    sp[4].out = 3;
    gp_shape cur = gp_shape_2d(1, IN);
    for (int k = 0; k < L; k++) {
        CHECK_OK(gp_layer_create(&sp[k], k, &cur, dev, 11, &layers[k]));
        cur = layers[k].out_shape;
    }
}

static void upload_random(gp_device *dev, gp_tensor *t, const gp_shape *sh, uint64_t stream,
                          gp_mem_category cat)
{
    float h[512];
    int64_t n = gp_shape_numel(sh);
    GP_ASSERT(n <= 512);
    gp_rng_uniform_fill(7, stream, 0, h, n);
    for (int64_t q = 0; q < n; q++) h[q] = 2 * h[q] - 1;
    CHECK_OK(gp_tensor_alloc(t, dev, sh, cat));
    CHECK_OK(gp_dev_upload(dev, gp_f32(t), h, n));
}

/* Two stashes of `count` layers with the same random input (stream). */
static void two_stashes(gp_device *dev, int count, const gp_shape *xs, uint64_t stream,
                        gp_stash *a, gp_stash *b)
{
    CHECK_OK(gp_stash_init(a, count, NULL, 0));
    CHECK_OK(gp_stash_init(b, count, NULL, 0));
    upload_random(dev, &a->in, xs, stream, GP_MEM_ACTIVATIONS);
    upload_random(dev, &b->in, xs, stream, GP_MEM_ACTIVATIONS);
}

static bool same(const gp_tensor *a, const gp_tensor *b)
{
    int64_t n = gp_tensor_numel(a);
    if (n != gp_tensor_numel(b)) return false;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    CHECK_OK(gp_dev_download(a->dev, x, gp_f32(a), n));
    CHECK_OK(gp_dev_download(b->dev, y, gp_f32(b), n));
    CHECK_OK(gp_dev_synchronize(a->dev));
    bool eq = !memcmp(x, y, (size_t)n * sizeof *x);
    free(x);
    free(y);
    return eq;
}

/* The step's gradients of layers a[0 .. n) and b[0 .. n) finished, and
 * every trained parameter's equal bit for bit (what: which runs, for the
 * message).  Returns how many it compared. */
static int same_grads(gp_layer *a, gp_layer *b, int n, const char *what)
{
    int compared = 0;
    for (int k = 0; k < n; k++) {
        CHECK_OK(gp_layer_grads_finish(&a[k]));
        CHECK_OK(gp_layer_grads_finish(&b[k]));
        for (int p = 0; p < a[k].n_params; p++) {
            if (a[k].params[p].is_buffer) continue;
            CHECK_MSG(same(&a[k].params[p].grad, &b[k].params[p].grad),
                      "%s: layer %d %s: gradients differ", what, k, a[k].params[p].name);
            compared++;
        }
    }
    return compared;
}

static void replay(void)
{
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_layer kept[L], ckpt[L]; /* identical models (same seed) */
    build(dev, kept);
    build(dev, ckpt);
    gp_stash a, b;
    gp_shape xs = gp_shape_2d(B, IN);
    two_stashes(dev, L, &xs, 1, &a, &b);
    gp_fwd_ctx ctx = {.training = true, .seed = 99, .step = 3, .sample_offset = 10,
                      .batch_total = 40};
    for (int k = 0; k < L; k++) {
        gp_layer_grads_begin(&kept[k]);
        gp_layer_grads_begin(&ckpt[k]);
    }
    int bad = -1;
    size_t before = gp_allocator_current(&dev->alloc);
    CHECK_OK(gp_ckpt_forward(kept, &ctx, GP_FWD_KEEP, &a, &bad));
    size_t after_kept = gp_allocator_current(&dev->alloc);
    CHECK_OK(gp_ckpt_forward(ckpt, &ctx, GP_FWD_INPUT, &b, &bad));
    size_t after_ckpt = gp_allocator_current(&dev->alloc);
    /* what each holds: the checkpointed one exactly its input and output */
    size_t in_b = gp_tensor_bytes(&b.in), out_b = gp_tensor_bytes(&b.out);
    CHECK_MSG(gp_stash_bytes(&b) == in_b + out_b && b.out.owned && !b.live,
              "checkpointed stash holds %zu bytes, want %zu", gp_stash_bytes(&b), in_b + out_b);
    CHECK_MSG(after_ckpt - after_kept == out_b,
              "the allocator grew by %zu bytes for a checkpointed forward, want %zu",
              after_ckpt - after_kept, out_b);
    CHECK_MSG(gp_stash_bytes(&a) == gp_tensor_bytes(&a.in) + (after_kept - before) && a.live,
              "kept stash: %zu bytes, allocator grew by %zu", gp_stash_bytes(&a),
              after_kept - before);
    CHECK(gp_stash_bytes(&a) > gp_stash_bytes(&b) + out_b); /* what checkpointing saves */
    CHECK_MSG(same(&a.out, &b.out), "checkpointed forward's output differs from the kept one");
    /* evaluation keeps nothing but the output, not even the input */
    {
        gp_stash e;
        CHECK_OK(gp_stash_init(&e, L, NULL, 0));
        upload_random(dev, &e.in, &xs, 1, GP_MEM_ACTIVATIONS);
        gp_fwd_ctx ev = ctx;
        ev.training = false;
        size_t e0 = gp_allocator_current(&dev->alloc);
        CHECK_OK(gp_ckpt_forward(kept, &ev, GP_FWD_NOTHING, &e, &bad));
        CHECK_MSG(gp_stash_bytes(&e) == gp_tensor_bytes(&e.out) && !gp_tensor_mem(&e.in) &&
                      gp_allocator_current(&dev->alloc) + in_b == e0 + gp_tensor_bytes(&e.out),
                  "an evaluation stash holds %zu bytes, want only its output's %zu",
                  gp_stash_bytes(&e), gp_tensor_bytes(&e.out));
        gp_stash_destroy(&e);
    }
    /* the recompute replays every layer's output bit for bit (dropout too) */
    CHECK_OK(gp_ckpt_recompute(ckpt, &ctx, &b, &bad));
    CHECK(b.live && b.out.owned);
    for (int c = 1; c <= L; c++)
        CHECK_MSG(same(&a.acts[c], &b.acts[c]), "recomputed output of layer %d differs", c - 1);
    /* backward: the same gradients */
    gp_shape ys = gp_tensor_shape(&a.out);
    gp_tensor dya, dyb, dxa = {0}, dxb = {0};
    upload_random(dev, &dya, &ys, 2, GP_MEM_ACTIVATIONS);
    upload_random(dev, &dyb, &ys, 2, GP_MEM_ACTIVATIONS);
    CHECK_OK(gp_ckpt_backward(kept, &ctx, &a, &dya, 0, &dxa, &bad));
    CHECK_OK(gp_ckpt_backward(ckpt, &ctx, &b, &dyb, 0, &dxb, &bad));
    CHECK_MSG(gp_tensor_mem(&dxa) && same(&dxa, &dxb), "input gradients differ after the recompute");
    /* two linear layers' and batch norm's weight and bias */
    CHECK(same_grads(kept, ckpt, L, "after the recompute") == 6);
    /* batch norm counted one forward's statistics, not the recompute's too */
    CHECK_OK(kept[1].ops->commit(&kept[1]));
    CHECK_OK(ckpt[1].ops->commit(&ckpt[1]));
    for (int p = 0; p < kept[1].n_params; p++)
        if (kept[1].params[p].is_buffer)
            CHECK_MSG(same(&kept[1].params[p].value, &ckpt[1].params[p].value),
                      "batch norm %s differs: the recompute was counted",
                      kept[1].params[p].name);
    /* the stashes hold nothing now; only the input gradients remain */
    CHECK(gp_stash_bytes(&a) == 0 && gp_stash_bytes(&b) == 0 && !a.live && !b.live);
    gp_tensor_free(&dxa);
    gp_tensor_free(&dxb);
    CHECK_MSG(dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0 && dev->alloc.cur_by[GP_MEM_COPIES] == 0,
              "%zu activation bytes left after backward",
              (size_t)dev->alloc.cur_by[GP_MEM_ACTIVATIONS]);
    gp_stash_destroy(&a);
    gp_stash_destroy(&b);
    for (int k = 0; k < L; k++) {
        gp_layer_destroy(&kept[k]);
        gp_layer_destroy(&ckpt[k]);
    }
    gp_device_close(dev);
}

static void bad_loss(void)
{
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_shape ls = gp_shape_2d(2, 3), ys = {1, {2, 0, 0, 0}};
    gp_tensor logits, labels, dl = {0};
    float h[6] = {1, NAN, 0, 0, 1, 2}, y[2] = {0, 2};
    CHECK_OK(gp_tensor_alloc(&logits, dev, &ls, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_alloc(&labels, dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&logits), h, 6));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&labels), y, 2));
    gp_loss_out lo = {0};
    CHECK_ERR(gp_ckpt_loss(dev, GP_LOSS_CROSS_ENTROPY, 0.0f, 0, &logits, &labels, 0.5f, &dl,
                           &lo),
              GP_ERR_NUMERIC, "lower train.optimizer.lr");
    gp_tensor_free(&dl);
    h[1] = 0;
    CHECK_OK(gp_dev_upload(dev, gp_f32(&logits), h, 6));
    CHECK_OK(gp_ckpt_loss(dev, GP_LOSS_CROSS_ENTROPY, 0.0f, 0, &logits, &labels, 0.5f, &dl, &lo));
    /* -log softmax, in double: row 0 label 0 of (1, 0, 0); row 1 label 2 of (0, 1, 2) */
    double want = -(1 - log(exp(1) + 2)) - (2 - log(1 + exp(1) + exp(2)));
    CHECK_NEAR(lo.loss_sum, want, 1e-5, 1e-6);
    gp_tensor_free(&dl);
    gp_tensor_free(&logits);
    gp_tensor_free(&labels);
    gp_device_close(dev);
}

/* The gradient over the logits (gp_ckpt_loss_dev's `over`, issue 64): the
 * loss and its gradient the bits of the separate tensor's, the gradient in
 * the logits' memory, owning it where the logits did; FP32 and bf16 logits
 * on a padded width (ld 7 of 5 classes), with label smoothing too. */
static void loss_over_logits(void)
{
    gp_device_opts o = {.threads = 2};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    enum { R = 33, LD = 7, CL = 5 };
    gp_shape ls = gp_shape_2d(R, LD), ys = {1, {R, 0, 0, 0}};
    float h[R * LD], y[R];
    for (int i = 0; i < R * LD; i++) h[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
    for (int r = 0; r < R; r++) y[r] = (float)((r * 3) % CL);
    gp_tensor labels;
    CHECK_OK(gp_tensor_alloc(&labels, dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&labels), y, R));
    for (int b16 = 0; b16 < 2; b16++)
        for (int smooth = 0; smooth < 2; smooth++)
            for (int owned = 0; owned < 2; owned++) {
                gp_dtype dt = b16 ? GP_BF16 : GP_F32;
                gp_tensor a, b, f;
                CHECK_OK(gp_tensor_alloc(&f, dev, &ls, GP_MEM_ACTIVATIONS));
                CHECK_OK(gp_dev_upload(dev, gp_f32(&f), h, R * LD));
                CHECK_OK(gp_tensor_alloc_as(&a, dev, &ls, dt, GP_MEM_ACTIVATIONS));
                CHECK_OK(gp_tensor_alloc_as(&b, dev, &ls, dt, GP_MEM_ACTIVATIONS));
                CHECK_OK(gp_tensor_convert(&a, &f));
                CHECK_OK(gp_tensor_convert(&b, &f));
                gp_tensor view = b; /* the stage's output: a view of its owner's */
                view.owned = false;
                gp_tensor *lb = owned ? &b : &view;
                void *mem = gp_tensor_mem(&b);
                gp_tensor d1 = {0}, d2 = {0};
                gp_loss_result r1, r2;
                float sm = smooth ? 0.1f : 0.0f;
                CHECK_OK(gp_ckpt_loss_dev(dev, GP_LOSS_CROSS_ENTROPY, sm, CL, &a, &labels, 0.25f,
                                          &d1, false, &r1));
                CHECK_OK(gp_ckpt_loss_dev(dev, GP_LOSS_CROSS_ENTROPY, sm, CL, lb, &labels, 0.25f,
                                          &d2, true, &r2));
                CHECK(gp_tensor_mem(&d1) != gp_tensor_mem(&a));
                CHECK_MSG(gp_tensor_mem(&d2) == mem && d2.owned == (owned != 0) &&
                              !gp_tensor_mem(lb) == (owned != 0),
                          "the gradient over the logits (%s, %s): not in their memory, or the "
                          "ownership not moved", gp_dtype_name(dt), owned ? "owned" : "a view");
                CHECK_MSG(r1.loss_sum == r2.loss_sum && r1.correct == r2.correct &&
                              !memcmp(gp_tensor_mem(&d1), gp_tensor_mem(&d2), gp_tensor_bytes(&d1)),
                          "the gradient over the logits (%s, smoothing %g): not the separate "
                          "tensor's bits", gp_dtype_name(dt), (double)sm);
                gp_tensor_free(&d1);
                gp_tensor_free(&d2);
                gp_tensor_free(&a);
                gp_tensor_free(&b);
                gp_tensor_free(&f);
            }
    gp_tensor_free(&labels);
    gp_device_close(dev);
}

/* ---- in place ------------------------------------------------------------- */

enum { IPL = 12, IP_SKIP_FROM = 4, IP_SKIP_TO = 8 };

/* A U-Net-like stage on (2, 3, 6, 6): a conv block, a stashing identity,
 * what may not run in place after it, a concatenation popping the stash,
 * and a head. */
static void ip_specs(gp_layer_spec *sp)
{
    static const gp_layer_type t[IPL] = {
        GP_LAYER_CONV2D,   GP_LAYER_LEAKY_RELU, GP_LAYER_INSTANCE_NORM, GP_LAYER_DROPOUT2D,
        GP_LAYER_IDENTITY, GP_LAYER_RELU,      GP_LAYER_DROPOUT,       GP_LAYER_CONV2D,
        GP_LAYER_CONCAT,   GP_LAYER_RELU,      GP_LAYER_FLATTEN,       GP_LAYER_LINEAR};
    for (int k = 0; k < IPL; k++) sp[k] = gp_layer_spec_default(t[k]);
    sp[0].out = 4;
    sp[0].kernel = gp_hw_square(3);
    sp[0].padding = gp_hw_square(1);
    sp[3].p = 0.3f;
    sp[6].p = 0.4f;
    sp[7].out = 4;
    sp[7].kernel = gp_hw_square(1);
    sp[11].out = 5;
    snprintf(sp[IP_SKIP_FROM].stash, GP_SKIP_NAME, "s");
    snprintf(sp[IP_SKIP_TO].pop[0], GP_SKIP_NAME, "s");
    sp[IP_SKIP_TO].n_pop = 1;
}

static void ip_build(gp_device *dev, const gp_layer_spec *sp, const gp_skip_map *map,
                     gp_layer *layers)
{
    gp_shape input = gp_shape_4d(1, 3, 6, 6), outs[IPL], in[1 + GP_MAX_POPS];
    for (int k = 0; k < IPL; k++) {
        gp_skip_map_inputs(map, k, &input, outs, in);
        CHECK_OK(gp_layer_create(&sp[k], k, in, dev, 5, &layers[k]));
        outs[k] = layers[k].out_shape;
    }
}

/* The oracle: every layer out of place, in order; act[c + 1] = layer c's
 * output, kept (ip_oracle_backward frees them).  Returns the bytes the
 * forward keeps (outputs and saved). */
static size_t ip_oracle_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *in,
                                gp_tensor *act, gp_saved *sv)
{
    act[0] = *in;
    act[0].owned = false;
    size_t kept = 0;
    for (int c = 0; c < IPL; c++) {
        gp_tensor x[2] = {act[c], act[IP_SKIP_FROM + 1]};
        sv[c] = (gp_saved){0};
        CHECK_OK(gp_layer_forward(&l[c], ctx, x, &act[c + 1], &sv[c]));
        kept += gp_tensor_bytes(&act[c + 1]) + gp_saved_bytes(&sv[c]);
    }
    return kept;
}

static void ip_oracle_backward(gp_layer *l, const gp_fwd_ctx *ctx, gp_tensor *act, gp_saved *sv,
                               const gp_tensor *dy, gp_tensor *dx)
{
    gp_tensor g, skip_g = {0};
    gp_shape ys = gp_tensor_shape(dy);
    CHECK_OK(gp_tensor_alloc(&g, dy->dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&g, dy));
    for (int c = IPL - 1; c >= 0; c--) {
        if (c == IP_SKIP_FROM)
            CHECK_OK(gp_dev_axpy(g.dev, 1.0f, gp_f32(&skip_g), gp_f32(&g), gp_tensor_numel(&g)));
        gp_tensor x[2] = {act[c], act[IP_SKIP_FROM + 1]}, d[2] = {{0}};
        CHECK_OK(gp_layer_backward(&l[c], ctx, x, &act[c + 1], &g, d, &sv[c]));
        if (c == IP_SKIP_TO) skip_g = d[1];
        gp_tensor_free(&g);
        g = d[0];
        gp_saved_free(&sv[c]);
    }
    gp_tensor_free(&skip_g);
    for (int c = 1; c <= IPL; c++) gp_tensor_free(&act[c]);
    *dx = g;
}

static void ip_grads_begin(gp_layer *l)
{
    for (int k = 0; k < IPL; k++) gp_layer_grads_begin(&l[k]);
}

/* Every trained parameter's gradient of a equals b's, bit for bit. */

static void inplace(void)
{
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_layer_spec sp[IPL];
    ip_specs(sp);
    gp_skip_map map;
    CHECK_OK(gp_skip_map_build(sp, IPL, &map));
    gp_layer ref[IPL], run[IPL]; /* identical: the oracle's and the stash's */
    ip_build(dev, sp, &map, ref);
    ip_build(dev, sp, &map, run);

    /* the rules: 1 (leaky relu after conv, which does not read its
     * output), 3 (dropout2d after instance norm, likewise), 4 (the identity
     * views dropout2d's output), 9 (relu after concat) and 10 (flatten) run
     * in place; 5 does not (relu would overwrite the stashed skip, though
     * no backward back to the instance norm reads the values), nor 6
     * (dropout would overwrite the output relu's backward reads), nor 0
     * (the stage input), 8 (two inputs) or the layers that are not
     * element-wise */
    bool ip[IPL], want[IPL] = {false, true,  false, true,  true,  false,
                               false, false, false, true,  true,  false};
    gp_layers_inplace(run, IPL, ip);
    for (int c = 0; c < IPL; c++)
        CHECK_MSG(ip[c] == want[c], "layer %d (%s): in place %d, want %d", c,
                  gp_layer_type_name(run[c].spec.type), ip[c], want[c]);
    /* outputs no backward reads: only the convolution's before the concat
     * (the concatenation reads its inputs' shapes; the other candidates
     * run in place, or are read by relu, a convolution or a stash's pop) */
    bool uk[IPL];
    gp_layers_unkept(run, IPL, ip, uk);
    for (int c = 0; c < IPL; c++)
        CHECK_MSG(uk[c] == (c == 7), "layer %d (%s): output unkept %d", c,
                  gp_layer_type_name(run[c].spec.type), uk[c]);
    /* a stage that starts at the dropout2d: its first layer never does */
    bool ip3[IPL - 3];
    gp_layers_inplace(run + 3, IPL - 3, ip3);
    CHECK(!ip3[0] && ip3[1] && !ip3[2]);

    gp_fwd_ctx ctx = {.training = true, .seed = 99, .step = 3, .sample_offset = 2,
                      .batch_total = 8};
    gp_shape xs = gp_shape_4d(2, 3, 6, 6);
    float h[216];
    gp_rng_uniform_fill(7, 1, 0, h, 216);
    for (int q = 0; q < 216; q++) h[q] = 2 * h[q] - 1;
    gp_tensor in;
    CHECK_OK(gp_tensor_alloc(&in, dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&in), h, 216));

    /* the oracle's forward and backward */
    gp_tensor act[IPL + 1], dx_ref = {0};
    gp_saved sv[IPL];
    ip_grads_begin(ref);
    size_t oracle_kept = ip_oracle_forward(ref, &ctx, &in, act, sv);
    size_t inplace_bytes = 0;
    for (int c = 0; c < IPL; c++)
        if (want[c] || c == 7) inplace_bytes += gp_tensor_bytes(&act[c + 1]);
    gp_shape ys = gp_tensor_shape(&act[IPL]);
    gp_tensor out_ref, dy;
    CHECK_OK(gp_tensor_alloc(&out_ref, dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&out_ref, &act[IPL]));
    CHECK_OK(gp_tensor_alloc(&dy, dev, &ys, GP_MEM_ACTIVATIONS));
    gp_rng_uniform_fill(7, 2, 0, h, gp_shape_numel(&ys));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&dy), h, gp_shape_numel(&ys)));

    /* kept: the stash holds the oracle's bytes less the in-place outputs */
    gp_stash a;
    CHECK_OK(gp_stash_init(&a, IPL, &map, 0));
    CHECK_OK(gp_tensor_alloc(&a.in, dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&a.in, &in));
    ip_grads_begin(run);
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(run, &ctx, GP_FWD_KEEP, &a, &bad));
    size_t held = gp_stash_bytes(&a) - gp_tensor_bytes(&a.in);
    CHECK_MSG(held + inplace_bytes == oracle_kept,
              "a kept forward holds %zu bytes; the out-of-place one %zu, less %zu in place "
              "or unkept", held, oracle_kept, inplace_bytes);
    CHECK(!gp_tensor_mem(&a.acts[8]) && gp_tensor_numel(&a.acts[8]) == gp_tensor_numel(&act[8]));
    CHECK_MSG(same(&a.out, &out_ref), "kept in place: the output differs");
    gp_tensor dya = {0}, dxa = {0};
    CHECK_OK(gp_tensor_alloc(&dya, dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&dya, &dy));
    CHECK_OK(gp_ckpt_backward(run, &ctx, &a, &dya, 0, &dxa, &bad));
    ip_oracle_backward(ref, &ctx, act, sv, &dy, &dx_ref);
    CHECK_MSG(gp_tensor_mem(&dxa) && same(&dxa, &dx_ref), "kept in place: the input gradient differs");
    /* two convolutions' and the linear layer's weight and bias */
    CHECK(same_grads(run, ref, IPL, "kept in place, against out of place") == 6);
    gp_tensor_free(&dxa);

    /* checkpointed (the memory moves on from layer to layer), recomputed,
     * then backward: the same bits again */
    ip_grads_begin(run);
    CHECK_OK(gp_tensor_alloc(&a.in, dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&a.in, &in));
    CHECK_OK(gp_ckpt_forward(run, &ctx, GP_FWD_INPUT, &a, &bad));
    CHECK_MSG(gp_stash_bytes(&a) == gp_tensor_bytes(&a.in) + gp_tensor_bytes(&a.out) &&
                  a.out.owned,
              "a checkpointed in-place forward holds %zu bytes, want its input and output",
              gp_stash_bytes(&a));
    CHECK_MSG(same(&a.out, &out_ref), "checkpointed in place: the output differs");
    CHECK_OK(gp_ckpt_recompute(run, &ctx, &a, &bad));
    CHECK_OK(gp_tensor_alloc(&dya, dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&dya, &dy));
    CHECK_OK(gp_ckpt_backward(run, &ctx, &a, &dya, 0, &dxa, &bad));
    CHECK_MSG(gp_tensor_mem(&dxa) && same(&dxa, &dx_ref), "recomputed in place: the input gradient differs");
    ip_grads_begin(ref); /* the oracle's gradients again: same_grads finished both */
    ip_oracle_forward(ref, &ctx, &in, act, sv);
    gp_tensor dxr2 = {0};
    ip_oracle_backward(ref, &ctx, act, sv, &dy, &dxr2);
    CHECK(same_grads(run, ref, IPL, "recomputed in place, against out of place") == 6);
    gp_tensor_free(&dxr2);
    gp_tensor_free(&dxa);

    /* evaluation: dropouts are identities, done in place by doing nothing */
    gp_fwd_ctx ev = ctx;
    ev.training = false;
    ip_oracle_forward(ref, &ev, &in, act, sv);
    CHECK_OK(gp_tensor_alloc(&a.in, dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&a.in, &in));
    CHECK_OK(gp_ckpt_forward(run, &ev, GP_FWD_NOTHING, &a, &bad));
    CHECK_MSG(same(&a.out, &act[IPL]), "evaluation in place: the output differs");
    gp_stash_release(&a);
    for (int c = 0; c < IPL; c++) gp_saved_free(&sv[c]);
    for (int c = 1; c <= IPL; c++) gp_tensor_free(&act[c]);
    gp_tensor_free(&dx_ref);
    gp_tensor_free(&out_ref);
    gp_tensor_free(&dy);
    gp_tensor_free(&in);
    CHECK_MSG(dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0,
              "%zu activation bytes left after the in-place runs",
              (size_t)dev->alloc.cur_by[GP_MEM_ACTIVATIONS]);
    gp_stash_destroy(&a);
    for (int k = 0; k < IPL; k++) {
        gp_layer_destroy(&ref[k]);
        gp_layer_destroy(&run[k]);
    }
    gp_skip_map_free(&map);
    gp_device_close(dev);
}

/* Batch norm with the relu after it (gp_layers_relu_fused): in a stage
 * conv, bn, relu, conv, relu, bn, relu, flatten, linear, relu, linear the
 * relus after the norms (2 and 6) are fused and skip their forward and
 * backward, the one after the conv (4) is not, the one after the first
 * linear (9) skips its forward only (the linear's epilogue); kept,
 * checkpointed and recomputed, and in evaluation, the output, input
 * gradient and parameter gradients are bit for bit those of the layers run
 * one by one out of place (no fusion there). */
enum { FZ = 11 };
static void fz_build(gp_device *dev, gp_layer *layers)
{
    static const gp_layer_type t[FZ] = {
        GP_LAYER_CONV2D, GP_LAYER_BATCHNORM, GP_LAYER_RELU, GP_LAYER_CONV2D, GP_LAYER_RELU,
        GP_LAYER_BATCHNORM, GP_LAYER_RELU, GP_LAYER_FLATTEN, GP_LAYER_LINEAR, GP_LAYER_RELU,
        GP_LAYER_LINEAR};
    gp_layer_spec sp[FZ];
    for (int k = 0; k < FZ; k++) sp[k] = gp_layer_spec_default(t[k]);
    sp[0].out = 4;
    sp[0].kernel = gp_hw_square(3);
    sp[0].padding = gp_hw_square(1);
    sp[3].out = 4;
    sp[3].kernel = gp_hw_square(3);
    sp[3].padding = gp_hw_square(1);
    sp[8].out = 5;
    sp[10].out = 3;
    gp_shape in = gp_shape_4d(1, 3, 6, 6);
    for (int k = 0; k < FZ; k++) {
        CHECK_OK(gp_layer_create(&sp[k], k, &in, dev, 11, &layers[k]));
        in = layers[k].out_shape;
    }
}

/* The oracle for a chain of `count` single-input layers (at most
 * CHAIN_MAX): out of place, layer by layer; the output in *out and, with
 * dy, the input gradient in *dx.  Returns the bytes its forward keeps
 * (every output and what each layer saved). */
enum { CHAIN_MAX = 16 };
static size_t chain_oracle(gp_layer *l, int count, const gp_fwd_ctx *ctx, const gp_tensor *in,
                           const gp_tensor *dy, gp_tensor *out, gp_tensor *dx)
{
    GP_ASSERT(count <= CHAIN_MAX);
    gp_tensor act[CHAIN_MAX + 1];
    gp_saved sv[CHAIN_MAX];
    size_t kept = 0;
    act[0] = *in;
    act[0].owned = false;
    for (int c = 0; c < count; c++) {
        sv[c] = (gp_saved){0};
        act[c + 1] = (gp_tensor){0};
        CHECK_OK(gp_layer_forward(&l[c], ctx, &act[c], &act[c + 1], &sv[c]));
        kept += gp_tensor_bytes(&act[c + 1]) + gp_saved_bytes(&sv[c]);
    }
    gp_shape ys = gp_tensor_shape(&act[count]);
    CHECK_OK(gp_tensor_alloc(out, in->dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(out, &act[count]));
    gp_tensor g = {0};
    if (dy) {
        CHECK_OK(gp_tensor_alloc(&g, in->dev, &ys, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_tensor_copy(&g, dy));
        for (int c = count - 1; c >= 0; c--) {
            gp_tensor d = {0};
            CHECK_OK(gp_layer_backward(&l[c], ctx, &act[c], &act[c + 1], &g, &d, &sv[c]));
            gp_tensor_free(&g);
            g = d;
        }
    }
    for (int c = 0; c < count; c++) gp_saved_free(&sv[c]);
    for (int c = 1; c <= count; c++) gp_tensor_free(&act[c]);
    *dx = g;
    return kept;
}

static void fused(void)
{
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_layer ref[FZ], run[FZ];
    fz_build(dev, ref);
    fz_build(dev, run);
    bool ip[FZ], fz[FZ];
    gp_layers_inplace(run, FZ, ip);
    gp_layers_relu_fused(run, FZ, ip, fz);
    for (int c = 0; c < FZ; c++) {
        bool want = c == 2 || c == 6;
        CHECK_MSG(fz[c] == want && run[c].relu_done == (want || c == 9) &&
                      run[c].relu_after == (c == 1 || c == 5 || c == 8),
                  "layer %d (%s): fused %d, relu_done %d, relu_after %d", c,
                  gp_layer_type_name(run[c].spec.type), fz[c], run[c].relu_done,
                  run[c].relu_after);
    }
    /* a stage that starts at the first relu: not fused (its norm is in the
     * stage before, and the stage input is not overwritten) */
    gp_layers_inplace(run + 2, FZ - 2, ip);
    gp_layers_relu_fused(run + 2, FZ - 2, ip, fz);
    CHECK(!fz[0] && !run[2].relu_done);

    gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = 2};
    gp_shape xs = gp_shape_4d(2, 3, 6, 6), ys = gp_shape_2d(2, 3);
    float h[216];
    gp_rng_uniform_fill(3, 1, 0, h, 216);
    for (int q = 0; q < 216; q++) h[q] = 2 * h[q] - 1;
    gp_tensor in, dy, out_ref, dx_ref;
    CHECK_OK(gp_tensor_alloc(&in, dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&in), h, 216));
    CHECK_OK(gp_tensor_alloc(&dy, dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&dy), h + 100, 6));
    for (int k = 0; k < FZ; k++) gp_layer_grads_begin(&ref[k]);
    chain_oracle(ref, FZ, &ctx, &in, &dy, &out_ref, &dx_ref);

    gp_stash a;
    CHECK_OK(gp_stash_init(&a, FZ, NULL, 0));
    /* kept; checkpointed and recomputed; kept with the split backward of
     * the zero-bubble schedules (data, then weights) */
    for (int mode = 0; mode < 3; mode++) {
        for (int k = 0; k < FZ; k++) gp_layer_grads_begin(&run[k]);
        uint64_t sk2 = run[2].relu_skipped, sk4 = run[4].relu_skipped, sk6 = run[6].relu_skipped,
                 sk9 = run[9].relu_skipped;
        CHECK_OK(gp_tensor_alloc(&a.in, dev, &xs, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_tensor_copy(&a.in, &in));
        int bad = -1;
        CHECK_OK(gp_ckpt_forward(run, &ctx, mode == 1 ? GP_FWD_INPUT : GP_FWD_KEEP, &a, &bad));
        CHECK_MSG(same(&a.out, &out_ref), "fused, mode %d: the output differs", mode);
        int rc = mode == 1;
        if (rc) CHECK_OK(gp_ckpt_recompute(run, &ctx, &a, &bad));
        CHECK_MSG(run[2].relu_skipped == sk2 + 1 + rc && run[6].relu_skipped == sk6 + 1 + rc &&
                      run[9].relu_skipped == sk9 + 1 + rc && run[4].relu_skipped == sk4,
                  "mode %d: relu forwards skipped %llu, %llu, %llu, %llu", mode,
                  (unsigned long long)(run[2].relu_skipped - sk2),
                  (unsigned long long)(run[4].relu_skipped - sk4),
                  (unsigned long long)(run[6].relu_skipped - sk6),
                  (unsigned long long)(run[9].relu_skipped - sk9));
        gp_tensor dya, dxa = {0};
        CHECK_OK(gp_tensor_alloc(&dya, dev, &ys, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_tensor_copy(&dya, &dy));
        uint64_t bk2 = run[2].relu_bwd_skipped, bk4 = run[4].relu_bwd_skipped,
                 bk6 = run[6].relu_bwd_skipped, bk9 = run[9].relu_bwd_skipped;
        if (mode < 2) {
            CHECK_OK(gp_ckpt_backward(run, &ctx, &a, &dya, 0, &dxa, &bad));
        } else {
            CHECK_OK(gp_ckpt_backward_data(run, &ctx, &a, &dya, 0, &dxa, &bad));
            CHECK_OK(gp_ckpt_backward_weights(run, &ctx, &a, 0, true, &bad));
        }
        /* the fused relus' backwards were the norms' (in place: dx is dy) */
        CHECK_MSG(run[2].relu_bwd_skipped == bk2 + 1 && run[6].relu_bwd_skipped == bk6 + 1 &&
                      run[4].relu_bwd_skipped == bk4 && run[9].relu_bwd_skipped == bk9,
                  "mode %d: relu backwards skipped %llu, %llu, %llu", mode,
                  (unsigned long long)(run[2].relu_bwd_skipped - bk2),
                  (unsigned long long)(run[4].relu_bwd_skipped - bk4),
                  (unsigned long long)(run[6].relu_bwd_skipped - bk6));
        CHECK_MSG(gp_tensor_mem(&dxa) && same(&dxa, &dx_ref), "fused, mode %d: the input gradient differs",
                  mode);
        /* two convolutions, two norms and two linear layers: weight and bias */
        CHECK_MSG(same_grads(run, ref, FZ, "fused") == 12, "fused, mode %d: gradients", mode);
        for (int k = 0; k < FZ; k++) gp_layer_grads_begin(&ref[k]);
        gp_tensor o2, d2;
        gp_tensor_free(&out_ref);
        gp_tensor_free(&dx_ref);
        chain_oracle(ref, FZ, &ctx, &in, &dy, &o2, &d2); /* same_grads finished the oracle's too */
        out_ref = o2;
        dx_ref = d2;
        gp_tensor_free(&dxa);
    }
    /* evaluation: the norms normalise with the running statistics */
    gp_fwd_ctx ev = ctx;
    ev.training = false;
    gp_tensor oe, de;
    chain_oracle(ref, FZ, &ev, &in, NULL, &oe, &de);
    CHECK_OK(gp_tensor_alloc(&a.in, dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&a.in, &in));
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(run, &ev, GP_FWD_NOTHING, &a, &bad));
    CHECK_MSG(same(&a.out, &oe), "fused, evaluation: the output differs");
    gp_stash_release(&a);
    gp_stash_destroy(&a);
    gp_tensor_free(&oe);
    gp_tensor_free(&out_ref);
    gp_tensor_free(&dx_ref);
    gp_tensor_free(&in);
    gp_tensor_free(&dy);
    for (int k = 0; k < FZ; k++) {
        gp_layer_destroy(&ref[k]);
        gp_layer_destroy(&run[k]);
    }
    gp_device_close(dev);
}

/* A residual block's own fusions (gp_residual_fuse: bn1 with its relu,
 * forward and backward; bn2 with the shortcut's sum and the final relu)
 * against the same block (same seed) with them off: the output in training
 * and evaluation, the input gradient and every parameter gradient bit for
 * bit, with the identity shortcut (6 -> 6) and with a downsample (stride
 * 2, 5 -> 8); inputs with exact zeros and a NaN-free spread around 0. */
static void residual_fused(void)
{
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    for (int q = 0; q < 2; q++) {
        gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_RESIDUAL);
        sp.out = q ? 8 : 6;
        if (q) sp.stride = gp_hw_square(2);
        gp_shape in = gp_shape_4d(3, q ? 5 : 6, 6, 6);
        gp_layer lay[2];
        for (int k = 0; k < 2; k++) CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 17, &lay[k]));
        gp_residual_fuse(&lay[0], false);
        gp_residual_fuse(&lay[1], true);
        gp_shape ys = lay[0].out_shape;
        ys.dims[0] = 3;
        int64_t nx = gp_shape_numel(&in), ny = gp_shape_numel(&ys);
        float *h = malloc((size_t)(nx + ny) * sizeof *h);
        gp_rng_uniform_fill(9, 2, 0, h, nx + ny);
        for (int64_t i = 0; i < nx + ny; i++) h[i] = 2 * h[i] - 1;
        for (int64_t i = 0; i < nx; i += 7) h[i] = 0.0f;
        gp_tensor x, dy, y[2], dx[2];
        CHECK_OK(gp_tensor_alloc(&x, dev, &in, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_dev_upload(dev, gp_f32(&x), h, nx));
        CHECK_OK(gp_tensor_alloc(&dy, dev, &ys, GP_MEM_ACTIVATIONS));
        CHECK_OK(gp_dev_upload(dev, gp_f32(&dy), h + nx, ny));
        gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = 3};
        for (int k = 0; k < 2; k++) {
            gp_saved sv = {0};
            y[k] = (gp_tensor){0};
            dx[k] = (gp_tensor){0};
            gp_layer_grads_begin(&lay[k]);
            CHECK_OK(gp_layer_forward(&lay[k], &ctx, &x, &y[k], &sv));
            CHECK_OK(gp_layer_backward(&lay[k], &ctx, &x, &y[k], &dy, &dx[k], &sv));
            gp_saved_free(&sv);
        }
        const char *what = q ? "residual with a downsample" : "residual";
        CHECK_MSG(same(&y[1], &y[0]), "%s, fused: the output differs", what);
        CHECK_MSG(same(&dx[1], &dx[0]), "%s, fused: the input gradient differs", what);
        CHECK_MSG(same_grads(&lay[1], &lay[0], 1, what) == (q ? 9 : 6),
                  "%s: the parameters compared", what);
        int pos = 0, zero = 0;
        float *hy = malloc((size_t)ny * sizeof *hy);
        CHECK_OK(gp_dev_download(dev, hy, gp_f32(&y[1]), ny));
        for (int64_t i = 0; i < ny; i++) pos += hy[i] > 0, zero += hy[i] == 0;
        CHECK_MSG(pos > ny / 8 && zero > ny / 8, "%s: %d positive, %d zero of %lld", what, pos,
                  zero, (long long)ny);
        free(hy);
        for (int k = 0; k < 2; k++) { /* evaluation: running statistics */
            gp_fwd_ctx ev = ctx;
            ev.training = false;
            gp_saved sv = {0};
            gp_tensor_free(&y[k]);
            y[k] = (gp_tensor){0};
            CHECK_OK(gp_layer_forward(&lay[k], &ev, &x, &y[k], &sv));
            gp_saved_free(&sv);
        }
        CHECK_MSG(same(&y[1], &y[0]), "%s, fused, evaluation: the output differs", what);
        for (int k = 0; k < 2; k++) {
            gp_tensor_free(&y[k]);
            gp_tensor_free(&dx[k]);
            gp_layer_destroy(&lay[k]);
        }
        gp_tensor_free(&x);
        gp_tensor_free(&dy);
        free(h);
    }
    gp_device_close(dev);
}

/* ---- in-place activated instance norm ----------------------------------------- */

/* Two U-Net units, conv (no bias), dropout2d, instance_norm, leaky_relu,
 * with the specs linked (gp_layer_specs_link): each relu runs in place over
 * its norm's output (the norm's backward reads the relu's output), each
 * dropout2d over its convolution's, and the convolutions' outputs are kept
 * by nobody (gp_layers_unkept: the norm never reads its input).  A kept
 * forward holds exactly the oracle's bytes less the in-place and unkept
 * outputs; kept, checkpointed and recomputed, and cut into two stages
 * between the first norm and its relu (the norm then reads its own output,
 * its stage's output), the output, input gradient and weight gradients are
 * bit for bit those of the layers run one by one out of place (where every
 * norm reads its own output). */
enum { NL = 8 };

static void nl_build(gp_device *dev, gp_layer *layers)
{
    static const gp_layer_type t[4] = {GP_LAYER_CONV2D, GP_LAYER_DROPOUT2D,
                                       GP_LAYER_INSTANCE_NORM, GP_LAYER_LEAKY_RELU};
    gp_layer_spec sp[NL];
    for (int k = 0; k < NL; k++) {
        sp[k] = gp_layer_spec_default(t[k % 4]);
        if (t[k % 4] == GP_LAYER_CONV2D) {
            sp[k].out = 4;
            sp[k].kernel = gp_hw_square(3);
            sp[k].padding = gp_hw_square(1);
            sp[k].bias = false;
        }
        if (t[k % 4] == GP_LAYER_DROPOUT2D) sp[k].p = 0.3f;
    }
    gp_layer_specs_link(sp, NL);
    CHECK(sp[2].leaky_after == 0.01f && sp[6].leaky_after == 0.01f);
    gp_shape in = gp_shape_4d(1, 3, 6, 6);
    for (int k = 0; k < NL; k++) {
        CHECK_OK(gp_layer_create(&sp[k], k, &in, dev, 13, &layers[k]));
        in = layers[k].out_shape;
    }
}

/* Layers [first, first + count) as one stage from a copy of `in`: forward
 * (kept, or checkpointed and recomputed), output into *out; then backward
 * from a copy of dy, input gradient into *dx.  Returns the bytes the
 * stash held after its forward (recompute) beyond its input. */
static size_t nl_stage_fwd(gp_layer *l, int count, const gp_fwd_ctx *ctx, const gp_tensor *in,
                           bool ckpt, gp_stash *a, gp_tensor *out)
{
    gp_shape xs = gp_tensor_shape(in);
    CHECK_OK(gp_stash_init(a, count, NULL, 0));
    CHECK_OK(gp_tensor_alloc(&a->in, in->dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&a->in, in));
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(l, ctx, ckpt ? GP_FWD_INPUT : GP_FWD_KEEP, a, &bad));
    gp_shape ys = gp_tensor_shape(&a->out);
    CHECK_OK(gp_tensor_alloc(out, in->dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(out, &a->out));
    if (ckpt) CHECK_OK(gp_ckpt_recompute(l, ctx, a, &bad));
    return gp_stash_bytes(a) - gp_tensor_bytes(&a->in);
}

static void nl_stage_bwd(gp_layer *l, const gp_fwd_ctx *ctx, gp_stash *a, const gp_tensor *dy,
                         gp_tensor *dx)
{
    gp_shape ys = gp_tensor_shape(dy);
    gp_tensor g;
    CHECK_OK(gp_tensor_alloc(&g, dy->dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_tensor_copy(&g, dy));
    int bad = -1;
    *dx = (gp_tensor){0};
    CHECK_OK(gp_ckpt_backward(l, ctx, a, &g, 0, dx, &bad));
    gp_stash_release(a);
    gp_stash_destroy(a);
}

static void norm_leaky(void)
{
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_layer ref[NL], run[NL];
    nl_build(dev, ref);
    nl_build(dev, run);
    bool ip[NL], uk[NL];
    gp_layers_inplace(run, NL, ip);
    gp_layers_unkept(run, NL, ip, uk);
    for (int c = 0; c < NL; c++)
        CHECK_MSG(ip[c] == (c % 2 == 1) && uk[c] == (c % 4 == 0),
                  "layer %d (%s): in place %d, unkept %d", c,
                  gp_layer_type_name(run[c].spec.type), ip[c], uk[c]);
    /* unlinked, the norm's backward reads its input: the convolution's
     * output is kept (the relu still runs in place: that norm ignores y) */
    for (int c = 0; c < NL; c++) run[c].spec.leaky_after = 0.0f;
    gp_layers_inplace(run, NL, ip);
    gp_layers_unkept(run, NL, ip, uk);
    for (int c = 0; c < NL; c++)
        CHECK_MSG(ip[c] == (c % 2 == 1) && !uk[c], "unlinked, layer %d: in place %d, unkept %d",
                  c, ip[c], uk[c]);
    for (int c = 2; c < NL; c += 4) run[c].spec.leaky_after = 0.01f;

    gp_fwd_ctx ctx = {.training = true, .seed = 8, .step = 2, .batch_total = 2};
    gp_shape xs = gp_shape_4d(2, 3, 6, 6), ys = gp_shape_4d(2, 4, 6, 6);
    float h[288];
    gp_rng_uniform_fill(4, 1, 0, h, 288);
    for (int q = 0; q < 288; q++) h[q] = 2 * h[q] - 1;
    gp_tensor in, dy, out_ref, dx_ref;
    CHECK_OK(gp_tensor_alloc(&in, dev, &xs, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&in), h, 216));
    CHECK_OK(gp_tensor_alloc(&dy, dev, &ys, GP_MEM_ACTIVATIONS));
    CHECK_OK(gp_dev_upload(dev, gp_f32(&dy), h, 288));
    for (int k = 0; k < NL; k++) gp_layer_grads_begin(&ref[k]);
    size_t oracle_kept = chain_oracle(ref, NL, &ctx, &in, &dy, &out_ref, &dx_ref);
    /* what a stage does not keep: the four in-place outputs (each the
     * memory before it) and the two convolutions' */
    size_t spared = 6 * (size_t)gp_shape_numel(&ys) * sizeof(float);

    for (int mode = 0; mode < 3; mode++) { /* kept; checkpointed; two stages */
        for (int k = 0; k < NL; k++) gp_layer_grads_begin(&run[k]);
        gp_stash a, b;
        gp_tensor out = {0}, mid = {0}, dmid = {0}, dx = {0};
        if (mode < 2) {
            size_t held = nl_stage_fwd(run, NL, &ctx, &in, mode == 1, &a, &out);
            /* recomputed, the output it handed on is held besides */
            if (mode == 1) held -= gp_tensor_bytes(&out);
            CHECK_MSG(held + spared == oracle_kept,
                      "mode %d: the stage holds %zu bytes; out of place %zu, less %zu", mode,
                      held, oracle_kept, spared);
            CHECK_MSG(run[2].leaky_inplace && run[6].leaky_inplace,
                      "mode %d: the relus did not run in place", mode);
            nl_stage_bwd(run, &ctx, &a, &dy, &dx);
        } else {
            /* [conv, dropout2d, norm] | [relu, conv, dropout2d, norm, relu] */
            nl_stage_fwd(run, 3, &ctx, &in, true, &a, &mid);
            CHECK(!run[2].leaky_inplace);
            nl_stage_fwd(run + 3, NL - 3, &ctx, &mid, true, &b, &out);
            CHECK(run[6].leaky_inplace);
            nl_stage_bwd(run + 3, &ctx, &b, &dy, &dmid);
            nl_stage_bwd(run, &ctx, &a, &dmid, &dx);
        }
        CHECK_MSG(same(&out, &out_ref), "mode %d: the output differs", mode);
        CHECK_MSG(gp_tensor_mem(&dx) && same(&dx, &dx_ref), "mode %d: the input gradient differs", mode);
        CHECK_MSG(same_grads(run, ref, NL, "linked norms") == 2, "mode %d: weight gradients",
                  mode);
        for (int k = 0; k < NL; k++) gp_layer_grads_begin(&ref[k]);
        gp_tensor_free(&out_ref);
        gp_tensor_free(&dx_ref);
        chain_oracle(ref, NL, &ctx, &in, &dy, &out_ref, &dx_ref); /* same_grads finished it */
        gp_tensor_free(&out);
        gp_tensor_free(&mid);
        gp_tensor_free(&dmid);
        gp_tensor_free(&dx);
    }
    gp_tensor_free(&out_ref);
    gp_tensor_free(&dx_ref);
    gp_tensor_free(&dy);
    gp_tensor_free(&in);
    CHECK_MSG(dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0,
              "%zu activation bytes left after the linked-norm runs",
              (size_t)dev->alloc.cur_by[GP_MEM_ACTIVATIONS]);
    for (int k = 0; k < NL; k++) {
        gp_layer_destroy(&ref[k]);
        gp_layer_destroy(&run[k]);
    }
    gp_device_close(dev);
}


/* ---- selective recompute (pipeline.checkpoint.keep) ---------------------------- */

/* A Transformer's MLP-like chain on (b, 6) rows: layer norm, linear + GELU
 * (one call, gp_layers_linear_gelu, where both are kept or neither),
 * linear, dropout, layer norm, linear. */
enum { TX = 7 };
static void tx_build(gp_device *dev, gp_layer *layers)
{
    static const gp_layer_type t[TX] = {GP_LAYER_LAYER_NORM, GP_LAYER_LINEAR, GP_LAYER_GELU,
                                        GP_LAYER_LINEAR, GP_LAYER_DROPOUT, GP_LAYER_LAYER_NORM,
                                        GP_LAYER_LINEAR};
    static const int64_t outs[TX] = {0, 8, 0, 6, 0, 0, 4};
    gp_layer_spec sp[TX];
    gp_shape in = gp_shape_2d(1, 6);
    for (int k = 0; k < TX; k++) {
        sp[k] = gp_layer_spec_default(t[k]);
        if (outs[k]) sp[k].out = outs[k];
        if (t[k] == GP_LAYER_DROPOUT) sp[k].p = 0.25f;
        CHECK_OK(gp_layer_create(&sp[k], k, &in, dev, 21, &layers[k]));
        in = layers[k].out_shape;
    }
}

typedef struct {
    const char *name;
    int count;
    void (*build)(gp_device *dev, gp_layer *layers);
    gp_shape in; /* a micro-batch's input */
} sel_stage;

/* Every non-buffer parameter gradient of layers[0 .. count), finished,
 * end to end on the host (*n floats). */
static float *host_grads(gp_layer *l, int count, int64_t *n)
{
    int64_t total = 0;
    for (int k = 0; k < count; k++) {
        CHECK_OK(gp_layer_grads_finish(&l[k]));
        for (int q = 0; q < l[k].n_params; q++)
            if (!l[k].params[q].is_buffer) total += gp_tensor_numel(&l[k].params[q].grad);
    }
    float *h = malloc((size_t)(total ? total : 1) * sizeof *h);
    int64_t at = 0;
    for (int k = 0; k < count; k++)
        for (int q = 0; q < l[k].n_params; q++) {
            const gp_tensor *g = &l[k].params[q].grad;
            if (l[k].params[q].is_buffer) continue;
            CHECK_OK(gp_dev_download(g->dev, h + at, gp_f32(g), gp_tensor_numel(g)));
            at += gp_tensor_numel(g);
        }
    *n = total;
    return h;
}

/* One micro-batch through a fresh stage: forward keeping everything
 * (keep < 0), or checkpointed keeping the layer types of `keep` and then
 * recomputed with ctx's seed + reseed; then backward.  The output, the
 * input gradient and the parameter gradients go to the host; returns the
 * bytes the stash held after the forward. */
typedef struct {
    float *out, *dx, *grads;
    int64_t n_out, n_dx, n_grads;
} sel_result;

static size_t sel_run(gp_device *dev, const sel_stage *st, int64_t keep, uint64_t reseed,
                      sel_result *r)
{
    gp_layer l[CHAIN_MAX];
    st->build(dev, l);
    for (int k = 0; k < st->count; k++) gp_layer_grads_begin(&l[k]);
    gp_stash a;
    CHECK_OK(gp_stash_init(&a, st->count, NULL, 0));
    a.keep = keep < 0 ? 0 : (gp_ckpt_keep)keep;
    upload_random(dev, &a.in, &st->in, 7, GP_MEM_ACTIVATIONS);
    gp_fwd_ctx ctx = {.training = true, .seed = 31, .step = 2, .batch_total = st->in.dims[0]};
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(l, &ctx, keep < 0 ? GP_FWD_KEEP : GP_FWD_INPUT, &a, &bad));
    size_t held = gp_stash_bytes(&a);
    r->n_out = gp_tensor_numel(&a.out);
    r->out = malloc((size_t)r->n_out * sizeof *r->out);
    CHECK_OK(gp_dev_download(dev, r->out, gp_f32(&a.out), r->n_out));
    gp_shape ys = gp_tensor_shape(&a.out);
    gp_tensor dy = {0}, dx = {0};
    upload_random(dev, &dy, &ys, 8, GP_MEM_ACTIVATIONS);
    if (keep >= 0) {
        if (a.out.owned) gp_tensor_free(&a.out); /* handed on (a kept one stays) */
        gp_fwd_ctx rc = ctx;
        rc.seed += reseed;
        CHECK_OK(gp_ckpt_recompute(l, &rc, &a, &bad));
    }
    CHECK_OK(gp_ckpt_backward(l, &ctx, &a, &dy, 0, &dx, &bad));
    r->n_dx = gp_tensor_numel(&dx);
    r->dx = malloc((size_t)r->n_dx * sizeof *r->dx);
    CHECK_OK(gp_dev_download(dev, r->dx, gp_f32(&dx), r->n_dx));
    r->grads = host_grads(l, st->count, &r->n_grads);
    CHECK_MSG(gp_stash_bytes(&a) == 0, "%s, keep %#llx: the backward left %zu bytes", st->name,
              (long long)keep, gp_stash_bytes(&a));
    gp_tensor_free(&dx);
    gp_tensor_free(&dy);
    gp_stash_destroy(&a);
    for (int k = 0; k < st->count; k++) gp_layer_destroy(&l[k]);
    return held;
}

static bool sel_same(const sel_result *a, const sel_result *b)
{
    return a->n_out == b->n_out && a->n_dx == b->n_dx && a->n_grads == b->n_grads &&
           !memcmp(a->out, b->out, (size_t)a->n_out * sizeof *a->out) &&
           !memcmp(a->dx, b->dx, (size_t)a->n_dx * sizeof *a->dx) &&
           !memcmp(a->grads, b->grads, (size_t)a->n_grads * sizeof *a->grads);
}

static void sel_free(sel_result *r)
{
    free(r->out);
    free(r->dx);
    free(r->grads);
}

/* Selective recompute: for every subset of the layer types of a stage
 * (CNN with in-place and fused relus; U-Net units with unkept outputs and
 * dropout2d in place; a Transformer MLP with the linear + GELU pair), a
 * checkpointed forward keeping those types, its recompute and backward
 * give the output, input gradient and parameter gradients of the forward
 * that keeps everything, bit for bit; the stash holds what the kept forward
 * holds for all of them, less for none, and between the two for the rest
 * (plus the outputs no backward reads, which may stay for a recompute).  And a kept layer does not run again: with
 * the recompute's seed changed, the gradients still match where every
 * dropout is kept, and differ where one is recomputed. */
static void selective(void)
{
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    const sel_stage stages[] = {
        {"conv/bn/relu stage", FZ, fz_build, gp_shape_4d(2, 3, 6, 6)},
        {"U-Net units", NL, nl_build, gp_shape_4d(2, 3, 6, 6)},
        {"Transformer MLP", TX, tx_build, gp_shape_2d(5, 6)},
    };
    int subsets = 0;
    for (size_t q = 0; q < sizeof stages / sizeof *stages; q++) {
        const sel_stage *st = &stages[q];
        gp_layer l[CHAIN_MAX];
        st->build(dev, l);
        gp_layer_type types[CHAIN_MAX], of[CHAIN_MAX];
        bool ip[CHAIN_MAX];
        int nt = 0;
        gp_layers_inplace(l, st->count, ip);
        /* the outputs a kept forward frees early (no backward reads them) */
        bool uk[CHAIN_MAX];
        gp_layers_unkept(l, st->count, ip, uk);
        size_t early = 0;
        for (int k = 0; k + 1 < st->count; k++)
            if (uk[k] && !ip[k])
                early += (size_t)(gp_shape_numel(&l[k].out_shape) / l[k].out_shape.dims[0] *
                                  st->in.dims[0]) * sizeof(float);
        for (int k = 0; k < st->count; k++) {
            gp_layer_type t = of[k] = l[k].spec.type;
            bool seen = false;
            for (int u = 0; u < nt; u++) seen = seen || types[u] == t;
            if (!seen) types[nt++] = t;
            gp_layer_destroy(&l[k]);
        }
        sel_result ref;
        size_t full = sel_run(dev, st, -1, 0, &ref);
        size_t *held = calloc((size_t)1 << nt, sizeof *held);
        for (uint32_t sub = 0; sub < 1u << nt; sub++, subsets++) {
            int64_t keep = 0;
            for (int u = 0; u < nt; u++)
                if (sub >> u & 1) keep |= 1ll << types[u];
            sel_result r;
            held[sub] = sel_run(dev, st, keep, 0, &r);
            CHECK_MSG(sel_same(&r, &ref), "%s, keep %#llx: not the bits of the kept forward",
                      st->name, (long long)keep);
            sel_free(&r);
            /* (an output no backward reads, which the kept forward frees
             * early, stays for the recompute of the layer after it unless
             * that one is kept too) */
            CHECK_MSG(held[sub] >= held[0] && held[sub] <= full + early,
                      "%s: keeping %#x holds %zu bytes, outside [%zu, %zu + %zu]", st->name,
                      sub, held[sub], held[0], full, early);
            /* which layers it keeps (a dropout in place over a kept
             * output is kept with it) */
            bool kept[CHAIN_MAX], drop = false, kept_all = true;
            for (int k = 0; k < st->count; k++) kept[k] = keep >> of[k] & 1;
            gp_ckpt_kept(ip, st->count, kept);
            for (int k = 0; k < st->count; k++)
                if (of[k] == GP_LAYER_DROPOUT || of[k] == GP_LAYER_DROPOUT2D) {
                    drop = true;
                    kept_all = kept_all && kept[k];
                }
            if (drop) { /* the recompute with another seed */
                sel_result x;
                sel_run(dev, st, keep, 1000, &x);
                CHECK_MSG(sel_same(&x, &ref) == kept_all,
                          "%s, keep %#llx, recomputed with another seed: %s", st->name,
                          (long long)keep, kept_all ? "a kept dropout ran again"
                                                    : "the dropout was not recomputed");
                sel_free(&x);
            }
        }
        CHECK_MSG(held[(1u << nt) - 1] == full,
                  "%s: keeping every type holds %zu bytes, the kept forward %zu", st->name,
                  held[(1u << nt) - 1], full);
        CHECK_MSG(held[0] < full, "%s: keeping nothing holds %zu bytes of %zu", st->name,
                  held[0], full);
        free(held);
        sel_free(&ref);
    }
    CHECK(subsets == 32 + 16 + 16);
    gp_device_close(dev);
}

/* A stage's ends in a forward that keeps (2026-11-29): relu 6, linear
 * 6 -> 8, relu, linear 8 -> 3.  The first layer reads its output, not its
 * input, so the stage input is freed after it; the last does not read its
 * output, so gp_stash_hand_out gives the stash the output to free once
 * copied (here at once, as the pipeline's sweep does).  The backward then
 * gives the bits of a stash that held both (a checkpointed forward and its
 * recompute); a stage that ends in a relu keeps its output, and one that
 * starts with a linear its input. */
static void stage_ends(void)
{
    enum { SL = 4 };
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_layer_spec sp[SL] = {gp_layer_spec_default(GP_LAYER_RELU),
                            gp_layer_spec_default(GP_LAYER_LINEAR),
                            gp_layer_spec_default(GP_LAYER_RELU),
                            gp_layer_spec_default(GP_LAYER_LINEAR)};
    sp[1].out = 8;
    sp[3].out = 3;
    gp_layer ends[SL], ref[SL];
    gp_shape cur = gp_shape_2d(1, IN);
    for (int k = 0; k < SL; k++) {
        CHECK_OK(gp_layer_create(&sp[k], k, &cur, dev, 5, &ends[k]));
        CHECK_OK(gp_layer_create(&sp[k], k, &cur, dev, 5, &ref[k]));
        cur = ends[k].out_shape;
        gp_layer_grads_begin(&ends[k]);
        gp_layer_grads_begin(&ref[k]);
    }
    gp_stash a, b;
    gp_shape xs = gp_shape_2d(B, IN);
    two_stashes(dev, SL, &xs, 7, &a, &b);
    gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = 10};
    int bad = -1;
    size_t in_b = gp_tensor_bytes(&a.in), before = gp_allocator_current(&dev->alloc);
    CHECK_OK(gp_ckpt_forward(ends, &ctx, GP_FWD_KEEP, &a, &bad));
    CHECK_MSG(!gp_tensor_mem(&a.in) && !gp_tensor_mem(&a.acts[0]) &&
                  gp_tensor_shape(&a.acts[0]).dims[1] == IN,
              "the stage input a relu does not read was kept (or its shape lost)");
    size_t kept = gp_allocator_current(&dev->alloc);
    CHECK(kept + in_b > before); /* (the input left, the layers' outputs came) */
    size_t out_b = gp_tensor_bytes(&a.out);
    CHECK_MSG(gp_stash_hand_out(&a, ends) && a.out.owned && !gp_tensor_mem(&a.acts[SL]) &&
                  gp_tensor_shape(&a.acts[SL]).dims[1] == 3,
              "a linear's stage output was not handed out");
    CHECK(!gp_stash_hand_out(&a, ends)); /* once */
    CHECK_OK(gp_ckpt_forward(ref, &ctx, GP_FWD_INPUT, &b, &bad));
    CHECK_MSG(same(&a.out, &b.out), "the stage outputs differ");
    gp_tensor_free(&a.out); /* the next stage copied it */
    size_t ref_out = gp_tensor_bytes(&b.out); /* (its input was there before) */
    CHECK_MSG(gp_allocator_current(&dev->alloc) + out_b == kept + ref_out,
              "freeing the handed-out output released %zu bytes, want %zu",
              kept + ref_out - gp_allocator_current(&dev->alloc), out_b);
    CHECK_OK(gp_ckpt_recompute(ref, &ctx, &b, &bad));
    CHECK(!gp_stash_hand_out(&b, ref)); /* a checkpointed forward owns its output already */
    gp_shape ys = gp_shape_2d(B, 3);
    gp_tensor dya, dyb, dxa = {0}, dxb = {0};
    upload_random(dev, &dya, &ys, 8, GP_MEM_ACTIVATIONS);
    upload_random(dev, &dyb, &ys, 8, GP_MEM_ACTIVATIONS);
    CHECK_OK(gp_ckpt_backward(ends, &ctx, &a, &dya, 0, &dxa, &bad));
    CHECK_OK(gp_ckpt_backward(ref, &ctx, &b, &dyb, 0, &dxb, &bad));
    CHECK_MSG(gp_tensor_mem(&dxa) && same(&dxa, &dxb),
              "input gradients differ with the stage's ends freed");
    CHECK(same_grads(ends, ref, SL, "with the stage's ends freed") == 4);
    gp_tensor_free(&dxa);
    gp_tensor_free(&dxb);
    /* the other way round: starts with a linear (reads its input), ends
     * with a relu (reads its output): both stay */
    gp_stash c;
    CHECK_OK(gp_stash_init(&c, 2, NULL, 0));
    upload_random(dev, &c.in, &xs, 9, GP_MEM_ACTIVATIONS);
    CHECK_OK(gp_ckpt_forward(ends + 1, &ctx, GP_FWD_KEEP, &c, &bad));
    CHECK_MSG(gp_tensor_mem(&c.in) && !gp_stash_hand_out(&c, ends + 1) && !c.out.owned,
              "a linear's input or a relu's output was freed");
    gp_stash_destroy(&c);
    gp_stash_destroy(&a);
    gp_stash_destroy(&b);
    for (int k = 0; k < SL; k++) {
        gp_layer_destroy(&ends[k]);
        gp_layer_destroy(&ref[k]);
    }
    CHECK_MSG(dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0, "%zu activation bytes left",
              (size_t)dev->alloc.cur_by[GP_MEM_ACTIVATIONS]);
    gp_device_close(dev);
}

/* A kept forward's backward frees as it goes: each layer's output and
 * its gradient once the layer below has its input's gradient, so the
 * backward of linear 6 -> 64 -> 8 -> 32 never holds more than its start
 * (the outputs, the input and dy) plus the top layer's input gradient, 8
 * values a sample (its 64-wide gradients come after the 32- and 8-wide
 * outputs went).  Outputs held to the backward's end (freed there by
 * release_kept, with the same gradients) raise that to 40. */
static void backward_frees(void)
{
    enum { FL = 3 };
    gp_device_opts o = {.threads = 1};
    gp_device *dev;
    CHECK_OK(gp_device_open("cpu:0", &o, &dev));
    gp_layer_spec sp[FL] = {gp_layer_spec_default(GP_LAYER_LINEAR),
                            gp_layer_spec_default(GP_LAYER_LINEAR),
                            gp_layer_spec_default(GP_LAYER_LINEAR)};
    sp[0].out = 64;
    sp[1].out = 8;
    sp[2].out = 32;
    gp_layer ls[FL];
    gp_shape cur = gp_shape_2d(1, IN);
    for (int k = 0; k < FL; k++) {
        CHECK_OK(gp_layer_create(&sp[k], k, &cur, dev, 5, &ls[k]));
        cur = ls[k].out_shape;
        gp_layer_grads_begin(&ls[k]);
    }
    gp_stash a;
    CHECK_OK(gp_stash_init(&a, FL, NULL, 0));
    gp_shape xs = gp_shape_2d(B, IN), ys = gp_shape_2d(B, 32);
    upload_random(dev, &a.in, &xs, 3, GP_MEM_ACTIVATIONS);
    gp_fwd_ctx ctx = {.training = true, .seed = 5, .step = 1, .batch_total = B};
    int bad = -1;
    CHECK_OK(gp_ckpt_forward(ls, &ctx, GP_FWD_KEEP, &a, &bad));
    gp_tensor dy, dx = {0};
    upload_random(dev, &dy, &ys, 4, GP_MEM_ACTIVATIONS);
    size_t start = dev->alloc.cur_by[GP_MEM_ACTIVATIONS];
    gp_allocator_reset_peak(&dev->alloc);
    CHECK_OK(gp_ckpt_backward(ls, &ctx, &a, &dy, 0, &dx, &bad));
    size_t peak = dev->alloc.peak_by[GP_MEM_ACTIVATIONS], one = (size_t)B * 8 * sizeof(float);
    CHECK_MSG(peak > start && peak - start <= one,
              "the backward held %zu activation bytes above its start of %zu, want at most %zu",
              peak - start, start, one);
    gp_tensor_free(&dx);
    gp_stash_destroy(&a);
    for (int k = 0; k < FL; k++) gp_layer_destroy(&ls[k]);
    CHECK_MSG(dev->alloc.cur_by[GP_MEM_ACTIVATIONS] == 0, "%zu activation bytes left",
              (size_t)dev->alloc.cur_by[GP_MEM_ACTIVATIONS]);
    gp_device_close(dev);
}

int main(void)
{
    policy();
    stage_ends();
    backward_frees();
    fused();
    residual_fused();
    replay();
    inplace();
    norm_leaky();
    selective();
    bad_loss();
    loss_over_logits();
    return gpt_finish("test_checkpoint");
}
