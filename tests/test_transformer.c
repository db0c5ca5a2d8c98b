/*
 * test_transformer.c — what issue 53's layers add beyond test_layers' generic
 * checks (which cover gelu, layer_norm and linear on (N, T, C) against
 * reference loops and finite differences), on a CPU device:
 *
 *   - embedding: forward against wte[id] + wpe[position] in double, on odd
 *     shapes with repeated ids; its weight gradients against the naive
 *     scatter-add of dy and against central finite differences; dW += (two
 *     backwards give twice one); parameter names (wte.weight, wpe.weight)
 *     and counts; an id out of [0, vocab), negative, fractional or NaN is
 *     an error naming the layer, the row in the mini-batch and the
 *     position; an embedding that is not the model's first layer, a 3-D
 *     input and too few positions are refused with what to change;
 *   - cross-entropy over (N, T, V) logits with (N, T) targets: the loss and
 *     gradient against a double reference, bit for bit the 2-D loss over the
 *     (N*T, V) view, targets per sample T, and a bad target named by its
 *     row (sample * T + position);
 *   - a tiny GPT-shaped model (embedding -> layer_norm -> linear -> gelu ->
 *     linear -> layer_norm -> linear to the vocabulary) through the public
 *     API on two pipeline stages: its parameter count, a few steps on a
 *     next-token task bring the loss down, a bad id mid-run is named and the
 *     run goes on, and balance: auto profiles it (the embedding's made-up
 *     input is ids).
 */
#include "layers/layers_impl.h"
#include "test_util.h"
#include "test_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static gp_fwd_ctx ctx_train(void)
{
    gp_fwd_ctx c;
    memset(&c, 0, sizeof c);
    c.training = true;
    c.seed = 1;
    return c;
}

static gp_layer_spec embedding_spec(int64_t vocab, int64_t dim, int64_t positions)
{
    gp_layer_spec sp = gp_layer_spec_default(GP_LAYER_EMBEDDING);
    sp.vocab = vocab;
    sp.dim = dim;
    sp.positions = positions;
    return sp;
}

/* L = sum(y * r) of the layer's forward, in double */
static double emb_loss(gp_layer *l, const gp_tensor *x, const double *r)
{
    gp_fwd_ctx c = ctx_train();
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(l, &c, x, &y, &s));
    float *h = gpt_download(&y);
    double L = 0;
    for (int64_t i = 0; i < gp_tensor_numel(&y); i++) L += (double)h[i] * r[i];
    free(h);
    gp_saved_free(&s);
    gp_tensor_free(&y);
    return L;
}

/* positions: 0 (issue 66: a Llama's positions are its rope layers'): one
 * table, y = wte[id] exactly, its gradient the scatter-add of dy, and no
 * limit on T from a position table. */
static void test_embedding_no_positions(gp_device *dev)
{
    enum { N = 2, T = 9, D = 5, V = 7 };
    gp_layer_spec sp = embedding_spec(V, D, 0);
    gp_shape in = gp_shape_2d(N, T);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 3, &l));
    CHECK(l.n_params == 1 && !strcmp(l.params[0].name, "wte.weight"));
    CHECK(gp_layer_param_count(&l) == (int64_t)V * D);
    float ids[N * T];
    for (int i = 0; i < N * T; i++) ids[i] = (float)((i * 5) % V);
    gp_tensor x = gpt_upload(dev, &in, ids), y = {0};
    gp_fwd_ctx c = ctx_train();
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&l, &c, &x, &y, &s));
    float *wte = gpt_download(&l.params[0].value), *yh = gpt_download(&y);
    int off = 0;
    for (int r = 0; r < N * T; r++)
        for (int j = 0; j < D; j++) off += yh[r * D + j] != wte[(int)ids[r] * D + j];
    CHECK_MSG(off == 0, "embedding without positions: %d values are not wte[id]", off);
    float rf[N * T * D];
    double ref[V * D] = {0};
    hrng rng = {9};
    for (int i = 0; i < N * T * D; i++) rf[i] = (float)hrng_sym(&rng);
    for (int q = 0; q < N * T; q++)
        for (int j = 0; j < D; j++) ref[(int)ids[q] * D + j] += rf[q * D + j];
    gp_shape ys = gp_tensor_shape(&y);
    gp_tensor dy = gpt_upload(dev, &ys, rf);
    CHECK_OK(gp_layer_zero_grad(&l));
    CHECK_OK(gp_layer_backward(&l, &c, &x, &y, &dy, NULL, &s));
    float *g = gpt_download(&l.params[0].grad);
    double worst = 0;
    for (int i = 0; i < V * D; i++) worst = fmax(worst, fabs(g[i] - ref[i]));
    CHECK_MSG(worst < 1e-5, "embedding without positions: gradient off by %.3g", worst);
    free(wte); free(yh); free(g);
    gp_saved_free(&s);
    gp_tensor_free(&dy); gp_tensor_free(&y); gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

static void test_embedding(gp_device *dev)
{
    enum { N = 3, T = 5, D = 7, V = 11, P = 6 };
    gp_layer_spec sp = embedding_spec(V, D, P);
    gp_shape in = gp_shape_2d(N, T);
    gp_layer l;
    CHECK_OK(gp_layer_create(&sp, 0, &in, dev, 99, &l));
    gp_shape want = {3, {1, T, D, 0}};
    CHECK(gp_shape_equal(&l.out_shape, &want));
    CHECK(l.n_params == 2 && !strcmp(l.params[0].name, "wte.weight") &&
          !strcmp(l.params[1].name, "wpe.weight"));
    CHECK(gp_layer_param_count(&l) == (int64_t)V * D + (int64_t)P * D);
    CHECK(l.params[0].value.dims[0] == V && l.params[0].value.dims[1] == D);
    CHECK(l.params[1].value.dims[0] == P && l.params[1].value.dims[1] == D);
    /* the init's scales: llm.c's 0.02 and 0.01 (loose, 77 and 42 values) */
    float *wte = gpt_download(&l.params[0].value), *wpe = gpt_download(&l.params[1].value);
    double ste = 0, spe = 0;
    for (int i = 0; i < V * D; i++) ste += (double)wte[i] * wte[i];
    for (int i = 0; i < P * D; i++) spe += (double)wpe[i] * wpe[i];
    ste = sqrt(ste / (V * D));
    spe = sqrt(spe / (P * D));
    CHECK_MSG(ste > 0.012 && ste < 0.03 && spe > 0.006 && spe < 0.015,
              "init std wte %.4f wpe %.4f", ste, spe);

    /* ids with repeats (0, V - 1 and 4 several times) */
    float ids[N * T];
    hrng rng = {5};
    for (int i = 0; i < N * T; i++) ids[i] = (float)(int)(hrng_unit(&rng) * V);
    ids[0] = 0.0f, ids[1] = (float)(V - 1), ids[6] = ids[9] = ids[13] = 4.0f;
    gp_tensor x = gpt_upload(dev, &in, ids);
    gp_fwd_ctx c = ctx_train();
    gp_tensor y = {0};
    gp_saved s = {0};
    CHECK_OK(gp_layer_forward(&l, &c, &x, &y, &s));
    float *yh = gpt_download(&y);
    double worst = 0;
    for (int r = 0; r < N * T; r++)
        for (int j = 0; j < D; j++) {
            double ref = (double)wte[(int)ids[r] * D + j] + (double)wpe[(r % T) * D + j];
            worst = fmax(worst, fabs(yh[r * D + j] - ref));
        }
    CHECK_MSG(worst < 1e-7, "embedding forward off by %.3g", worst);

    /* backward: the scatter-add of dy, and finite differences */
    double r[N * T * D];
    float rf[N * T * D];
    for (int i = 0; i < N * T * D; i++) r[i] = rf[i] = hrng_sym(&rng);
    gp_shape ys = gp_tensor_shape(&y);
    gp_tensor dy = gpt_upload(dev, &ys, rf);
    CHECK_OK(gp_layer_zero_grad(&l));
    CHECK_OK(gp_layer_backward(&l, &c, &x, &y, &dy, NULL, &s));
    float *gte = gpt_download(&l.params[0].grad), *gpe = gpt_download(&l.params[1].grad);
    double rte[V * D] = {0}, rpe[P * D] = {0};
    for (int q = 0; q < N * T; q++)
        for (int j = 0; j < D; j++) {
            rte[(int)ids[q] * D + j] += r[q * D + j];
            rpe[(q % T) * D + j] += r[q * D + j];
        }
    worst = 0;
    for (int i = 0; i < V * D; i++) worst = fmax(worst, fabs(gte[i] - rte[i]));
    for (int i = 0; i < P * D; i++) worst = fmax(worst, fabs(gpe[i] - rpe[i]));
    CHECK_MSG(worst < 1e-5, "embedding gradients off the scatter-add by %.3g", worst);
    /* rows of wpe past T and tokens never seen get nothing */
    CHECK(gpe[(P - 1) * D] == 0.0f);
    /* central differences on a few weights of each table */
    const int probe[4][2] = {{0, 0}, {0, 4 * D + 3}, {1, 2 * D + 6}, {1, 4 * D}};
    for (int k = 0; k < 4; k++) {
        gp_tensor *t = &l.params[probe[k][0]].value;
        int i = probe[k][1];
        float orig, v;
        CHECK_OK(gp_dev_download(dev, &orig, gp_f32(t) + i, 1));
        v = orig + 1e-2f;
        CHECK_OK(gp_dev_upload(dev, gp_f32(t) + i, &v, 1));
        double lp = emb_loss(&l, &x, r);
        v = orig - 1e-2f;
        CHECK_OK(gp_dev_upload(dev, gp_f32(t) + i, &v, 1));
        double lm = emb_loss(&l, &x, r);
        CHECK_OK(gp_dev_upload(dev, gp_f32(t) + i, &orig, 1));
        double step = (double)(orig + 1e-2f) - (double)(orig - 1e-2f);
        float an = probe[k][0] ? gpe[i] : gte[i];
        CHECK_NEAR(an, (lp - lm) / step, 1e-4, 1e-3);
    }
    /* dW +=: a second backward doubles */
    CHECK_OK(gp_layer_backward(&l, &c, &x, &y, &dy, NULL, &s));
    float *g2 = gpt_download(&l.params[0].grad);
    worst = 0;
    for (int i = 0; i < V * D; i++) worst = fmax(worst, fabs(g2[i] - 2.0 * gte[i]));
    CHECK_MSG(worst < 1e-5, "two backwards are not twice one (%.3g)", worst);
    free(g2);
    /* the input is data: a dx, where a caller asks one, is zeros */
    gp_tensor dx = {0};
    CHECK_OK(gp_layer_backward(&l, &c, &x, &y, &dy, &dx, &s));
    float *dxh = gpt_download(&dx);
    int nonzero = 0;
    for (int i = 0; i < N * T; i++) nonzero += dxh[i] != 0.0f;
    CHECK(gp_tensor_numel(&dx) == N * T && nonzero == 0);
    free(dxh);
    gp_tensor_free(&dx);

    /* bad ids: the layer, the mini-batch row (sample_offset counted) and
     * the position */
    const float bad[4] = {(float)V, -1.0f, 2.5f, NAN};
    const char *said[4] = {"token id 11 at row 3 of the mini-batch, position 2",
                           "token id -1 at row 3", "token id 2.5 at row 3", "token id nan"};
    for (int k = 0; k < 4; k++) {
        float b[N * T];
        memcpy(b, ids, sizeof b);
        b[1 * T + 2] = bad[k];
        gp_tensor xb = gpt_upload(dev, &in, b);
        gp_tensor yb = {0};
        gp_saved sb = {0};
        gp_fwd_ctx cb = ctx_train();
        cb.sample_offset = 2;
        CHECK_ERR(gp_layer_forward(&l, &cb, &xb, &yb, &sb), GP_ERR_INVALID, said[k]);
        CHECK(strstr(gp_last_error(), "layer 0 (embedding)") != NULL);
        gp_saved_free(&sb);
        gp_tensor_free(&yb);
        gp_tensor_free(&xb);
    }

    /* shapes and place */
    gp_layer e;
    CHECK_ERR(gp_layer_create(&sp, 2, &in, dev, 1, &e), GP_ERR_INVALID,
              "layer 2 (embedding): an embedding takes token ids, the model's input data, so "
              "it must be the model's first layer");
    gp_shape in3 = {3, {N, T, 2, 0}};
    CHECK_ERR(gp_layer_create(&sp, 0, &in3, dev, 1, &e), GP_ERR_INVALID,
              "expected token ids (N, T) but got (N, 5, 2); set model.input to [T]");
    gp_shape in4 = gp_shape_4d(N, T, 2, 1);
    CHECK_ERR(gp_layer_create(&sp, 0, &in4, dev, 1, &e), GP_ERR_INVALID,
              "expected token ids (N, T) but got (N, 5, 2, 1)");
    gp_shape longer = gp_shape_2d(N, P + 1);
    CHECK_ERR(gp_layer_create(&sp, 0, &longer, dev, 1, &e), GP_ERR_INVALID,
              "the input has 7 positions but positions = 6");
    gp_layer_spec none = embedding_spec(0, D, P);
    CHECK_ERR(gp_layer_create(&none, 0, &in, dev, 1, &e), GP_ERR_INVALID,
              "vocab = 0 (in [1, 2^24]: ids are floats)");

    free(yh);
    free(gte);
    free(gpe);
    free(wte);
    free(wpe);
    gp_saved_free(&s);
    gp_tensor_free(&dy);
    gp_tensor_free(&y);
    gp_tensor_free(&x);
    gp_layer_destroy(&l);
}

/* ---- cross-entropy over (N, T, V) ------------------------------------------ */

static void test_xent_3d(gp_device *dev)
{
    enum { N = 3, T = 4, V = 9 };
    hrng rng = {17};
    float z[N * T * V], t[N * T];
    for (int i = 0; i < N * T * V; i++) z[i] = 3.0f * hrng_sym(&rng);
    for (int i = 0; i < N * T; i++) t[i] = (float)(int)(hrng_unit(&rng) * V);
    gp_shape zs = {3, {N, T, V, 0}}, z2 = gp_shape_2d(N * T, V), ts = gp_shape_2d(N, T);
    gp_shape t1 = gp_shape_2d(N * T, 1);
    t1.ndim = 1;
    gp_tensor lz = gpt_upload(dev, &zs, z), lz2 = gpt_upload(dev, &z2, z);
    gp_tensor lt = gpt_upload(dev, &ts, t), lt1 = gpt_upload(dev, &t1, t);
    gp_tensor dz = gpt_upload(dev, &zs, z), dz2 = gpt_upload(dev, &z2, z);
    const float scale = 1.0f / (N * T);
    gp_loss_out o3, o2;
    CHECK_OK(gp_cross_entropy(dev, &lz, &lt, 0.0f, scale, &dz, &o3));
    CHECK_OK(gp_cross_entropy(dev, &lz2, &lt1, 0.0f, scale, &dz2, &o2));
    CHECK(o3.count == N * T);
    /* the double reference, and its gradient (softmax - onehot) / (N T) */
    double loss = 0, worst = 0;
    int64_t correct = 0;
    float *g = gpt_download(&dz), *g2 = gpt_download(&dz2);
    for (int r = 0; r < N * T; r++) {
        const float *zr = z + r * V;
        double m = zr[0], se = 0;
        int arg = 0;
        for (int k = 1; k < V; k++)
            if (zr[k] > m) m = zr[k], arg = k;
        for (int k = 0; k < V; k++) se += exp(zr[k] - m);
        loss += log(se) + m - zr[(int)t[r]];
        correct += arg == (int)t[r];
        for (int k = 0; k < V; k++) {
            double want = (exp(zr[k] - m) / se - (k == (int)t[r])) * scale;
            worst = fmax(worst, fabs(g[r * V + k] - want));
        }
    }
    CHECK_NEAR(o3.loss_sum, loss, 1e-4, 1e-5);
    CHECK(o3.correct == correct);
    CHECK_MSG(worst < 1e-6, "3-D cross-entropy gradient off by %.3g", worst);
    CHECK(o3.loss_sum == o2.loss_sum && o3.correct == o2.correct);
    CHECK(!memcmp(g, g2, sizeof(float) * N * T * V));
    /* a target per position */
    gp_shape per = {3, {1, T, V, 0}};
    CHECK(gp_loss_targets_per_sample(GP_LOSS_CROSS_ENTROPY, &per) == T);
    gp_shape flat = gp_shape_2d(1, V);
    CHECK(gp_loss_targets_per_sample(GP_LOSS_CROSS_ENTROPY, &flat) == 1);
    /* a bad one names its row (sample * T + position), on the device and
     * on the host */
    t[2 * T + 1] = (float)V;
    CHECK_OK(gp_dev_upload(dev, gp_f32(&lt), t, N * T));
    CHECK_ERR(gp_cross_entropy(dev, &lz, &lt, 0.0f, scale, NULL, &o3), GP_ERR_DATA,
              "label 9 in row 9 of the batch is not a class index in [0, 9)");
    CHECK_ERR(gp_loss_check_targets(GP_LOSS_CROSS_ENTROPY, 0, t, &zs, 0), GP_ERR_DATA,
              "label 9 in row 9 of the batch");
    CHECK_ERR(gp_loss_check_targets(GP_LOSS_CROSS_ENTROPY, 0, t + T,
                                    &(gp_shape){3, {2, T, V, 0}}, 1),
              GP_ERR_DATA, "label 9 in row 9 of the batch");
    free(g);
    free(g2);
    gp_tensor_free(&lz);
    gp_tensor_free(&lz2);
    gp_tensor_free(&lt);
    gp_tensor_free(&lt1);
    gp_tensor_free(&dz);
    gp_tensor_free(&dz2);
}

/* ---- a tiny GPT-shaped model through the public API ------------------------ */

enum { TV = 13, TT = 8, TB = 16 };

static const char *k_tiny =
    "model:\n"
    "  input: [8]\n"
    "  layers:\n"
    "    - embedding: {vocab: 13, dim: 24, positions: 8}\n"
    "    - layer_norm\n"
    "    - linear: {out: 48}\n"
    "    - gelu\n"
    "    - linear: {out: 24}\n"
    "    - layer_norm: {eps: 1.0e-6}\n"
    "    - linear: {out: 13}\n"
    "  loss: cross_entropy\n"
    "data:\n"
    "  dataset: synthetic\n"
    "  synthetic: {train: 64, test: 16, classes: 13, shape: [8]}\n"
    "pipeline: {devices: [cpu:0, cpu:1], chunks: 4, threads: 1, balance: [3, 4]}\n"
    "train:\n"
    "  batch_size: 16\n"
    "  steps: 40\n"
    "  seed: 3\n"
    "  log_every: 0\n"
    "  optimizer: {type: adam, lr: 0.01}\n";

/* Sequences that count up by a per-sequence stride modulo TV: the next
 * token follows from the current one and the stride (seen at position 0
 * onward), which a model of this size learns in a few dozen steps. */
static void tiny_batch(unsigned *seed, float *x, float *y)
{
    for (int i = 0; i < TB; i++) {
        int a = (int)(rand_r(seed) % TV), d = 1 + (int)(rand_r(seed) % 2);
        for (int p = 0; p < TT; p++) {
            x[i * TT + p] = (float)((a + d * p) % TV);
            y[i * TT + p] = (float)((a + d * (p + 1)) % TV);
        }
    }
}

static void test_tiny_model(void)
{
    gp_run *run = NULL;
    CHECK_OK(gp_run_parse("tiny.yaml", k_tiny, NULL, 0, &run));
    if (!run) return;
    gp_run_info info;
    CHECK_OK(gp_run_describe(run, &info));
    CHECK(info.input_numel == TT && info.target_numel == TT);
    /* embedding 13*24 + 8*24, two norms 2*24 each, linears 24*48+48,
     * 48*24+24, 24*13+13 */
    int64_t params = 13 * 24 + 8 * 24 + 4 * 24 + 24 * 48 + 48 + 48 * 24 + 24 + 24 * 13 + 13;
    CHECK_MSG(info.parameters == params, "parameters %lld, expected %lld",
              (long long)info.parameters,
              (long long)params);
    float x[TB * TT], y[TB * TT];
    unsigned seed = 7;
    double first = 0, last = 0;
    for (int s = 0; s < 40; s++) {
        tiny_batch(&seed, x, y);
        gp_metrics m;
        CHECK_OK(gp_run_step(run, x, y, TB, 0, &m));
        if (s < 3) first += m.loss / 3;
        if (s >= 37) last += m.loss / 3;
    }
    /* a uniform guess is log 13 = 2.56 nats */
    CHECK_MSG(first > 2.0 && last < 0.5 * first, "loss %.3f over the first steps, %.3f over "
              "the last", first, last);
    /* an id the vocabulary does not have: the layer, the row and the
     * position, and the run goes on */
    tiny_batch(&seed, x, y);
    x[5 * TT + 3] = 13.0f;
    CHECK_ERR(gp_run_step(run, x, y, TB, 0, NULL), GP_ERR_INVALID,
              "token id 13 at row 5 of the mini-batch, position 3");
    x[5 * TT + 3] = 0.0f;
    CHECK_OK(gp_run_step(run, x, y, TB, 0, NULL));
    gp_run_free(run);

    /* balance: auto profiles every layer on made-up inputs: the
     * embedding's must be ids */
    const char *ov[1] = {"pipeline.balance=auto"};
    run = NULL;
    CHECK_OK(gp_run_parse("tiny.yaml", k_tiny, ov, 1, &run));
    if (!run) return;
    tiny_batch(&seed, x, y);
    CHECK_OK(gp_run_step(run, x, y, TB, 0, NULL));
    gp_run_free(run);
}

int main(void)
{
    gp_device *dev = NULL;
    gp_device_opts opts = {.threads = 2};
    if (gp_device_open("cpu:0", &opts, &dev) != GP_OK) {
        fprintf(stderr, "cannot open cpu:0: %s\n", gp_last_error());
        return 1;
    }
    gp_device_bind_thread(dev);
    test_embedding(dev);
    test_embedding_no_positions(dev);
    test_xent_3d(dev);
    for (int c = 0; c < GP_MEM_COUNT; c++) {
        if (c == GP_MEM_WORKSPACE) continue;
        CHECK_MSG(dev->alloc.cur_by[c] == 0, "leaked %zu bytes of %s", dev->alloc.cur_by[c],
                  gp_mem_category_name((gp_mem_category)c));
    }
    gp_device_close(dev);
    test_tiny_model();
    return gpt_finish("test_transformer");
}
