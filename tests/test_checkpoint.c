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
 *   - a non-finite loss is an error that says what to do.
 */
#include "checkpoint/checkpoint.h"
#include "test.h"

#include <math.h>

enum { B = 5, IN = 6, L = 5 };

static void policy(void)
{
    /* m = 4 micro-batches, n = 3 stages: true where (i, j) keeps only its
     * input, as GPipe / torchgpipe define the modes. */
    static const bool want[3][4] = {
        {true, true, true, true},    /* always */
        {true, true, true, false},   /* except_last: the last micro-batch keeps all */
        {false, false, false, false} /* never */
    };
    for (int mode = 0; mode < 3; mode++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++)
                CHECK_MSG(gp_ckpt_checkpointed((gp_checkpoint_mode)mode, i, j, 4, 3) ==
                              want[mode][i],
                          "mode %d, (i, j) = (%d, %d)", mode, i, j);
    /* one micro-batch under except_last is the last one: kept */
    CHECK(!gp_ckpt_checkpointed(GP_CKPT_EXCEPT_LAST, 0, 0, 1, 2));
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
    float h[64];
    int64_t n = gp_shape_numel(sh);
    GP_ASSERT(n <= 64);
    gp_rng_uniform_fill(7, stream, 0, h, n);
    for (int64_t q = 0; q < n; q++) h[q] = 2 * h[q] - 1;
    CHECK_OK(gp_tensor_alloc(t, dev, sh, cat));
    CHECK_OK(gp_dev_upload(dev, t->data, h, n));
}

static bool same(const gp_tensor *a, const gp_tensor *b)
{
    int64_t n = gp_tensor_numel(a);
    if (n != gp_tensor_numel(b)) return false;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    CHECK_OK(gp_dev_download(a->dev, x, a->data, n));
    CHECK_OK(gp_dev_download(b->dev, y, b->data, n));
    CHECK_OK(gp_dev_synchronize(a->dev));
    bool eq = !memcmp(x, y, (size_t)n * sizeof *x);
    free(x);
    free(y);
    return eq;
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
    CHECK_OK(gp_stash_init(&a, L, NULL, 0));
    CHECK_OK(gp_stash_init(&b, L, NULL, 0));
    gp_shape xs = gp_shape_2d(B, IN);
    upload_random(dev, &a.in, &xs, 1, GP_MEM_ACTIVATIONS);
    upload_random(dev, &b.in, &xs, 1, GP_MEM_ACTIVATIONS);
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
        CHECK_MSG(gp_stash_bytes(&e) == gp_tensor_bytes(&e.out) && !e.in.data &&
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
    CHECK_MSG(dxa.data && same(&dxa, &dxb), "input gradients differ after the recompute");
    int grads = 0;
    for (int k = 0; k < L; k++) {
        CHECK_OK(gp_layer_grads_finish(&kept[k]));
        CHECK_OK(gp_layer_grads_finish(&ckpt[k]));
        for (int p = 0; p < kept[k].n_params; p++) {
            if (kept[k].params[p].is_buffer) continue;
            CHECK_MSG(same(&kept[k].params[p].grad, &ckpt[k].params[p].grad),
                      "layer %d param %s: gradients differ", k, kept[k].params[p].name);
            grads++;
        }
    }
    CHECK(grads == 6); /* two linear layers' and batch norm's weight and bias */
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
    CHECK_OK(gp_dev_upload(dev, logits.data, h, 6));
    CHECK_OK(gp_dev_upload(dev, labels.data, y, 2));
    gp_loss_out lo = {0};
    CHECK_ERR(gp_ckpt_loss(dev, GP_LOSS_CROSS_ENTROPY, &logits, &labels, 0.5f, &dl, &lo),
              GP_ERR_NUMERIC, "lower train.optimizer.lr");
    gp_tensor_free(&dl);
    h[1] = 0;
    CHECK_OK(gp_dev_upload(dev, logits.data, h, 6));
    CHECK_OK(gp_ckpt_loss(dev, GP_LOSS_CROSS_ENTROPY, &logits, &labels, 0.5f, &dl, &lo));
    /* -log softmax, in double: row 0 label 0 of (1, 0, 0); row 1 label 2 of (0, 1, 2) */
    double want = -(1 - log(exp(1) + 2)) - (2 - log(1 + exp(1) + exp(2)));
    CHECK_NEAR(lo.loss_sum, want, 1e-5, 1e-6);
    gp_tensor_free(&dl);
    gp_tensor_free(&logits);
    gp_tensor_free(&labels);
    gp_device_close(dev);
}

int main(void)
{
    policy();
    replay();
    bad_loss();
    return gpt_finish("test_checkpoint");
}
