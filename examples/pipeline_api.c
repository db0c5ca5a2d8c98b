/*
 * pipeline_api.c — gpipe from your own C program, with your own data.
 *
 * Describes a model in YAML, places it on two CPU devices as a two-stage
 * pipeline with 4 micro-batches, and trains it with gp_run_step on a toy
 * problem generated here (which quadrant of a 4x4 image is brightest).
 * Evaluates it on a held-out batch (gp_run_evaluate).  Exits non-zero
 * unless the loss falls by half and the held-out accuracy passes 90%, so
 * the test suite runs it.
 *
 * Built by CMake as example_pipeline_api (the test suite runs it); against
 * an installed gpipe:
 *
 *   cc pipeline_api.c $(pkg-config --cflags --libs gpipe) -o pipeline_api
 */
#include <gpipe.h>

#include <stdio.h>
#include <stdlib.h>

static const char *yaml =
    "model:\n"
    "  input: [1, 4, 4]\n"
    "  layers: [flatten, {linear: {out: 32}}, relu, {linear: {out: 32}}, relu,\n"
    "           {linear: {out: 4}}]\n"
    "pipeline:\n"
    "  devices: [cpu:0, cpu:1]\n"
    "  chunks: 4\n"
    "  checkpoint: except_last\n"
    "train:\n"
    "  batch_size: 32\n"
    "  optimizer: {lr: 0.1, momentum: 0.9}\n";

/* A batch of 4x4 images; the label is the brightest quadrant. */
static void make_batch(unsigned *seed, float *x, float *y, int n)
{
    for (int i = 0; i < n; i++) {
        int label = (int)(rand_r(seed) % 4);
        for (int p = 0; p < 16; p++) {
            int quad = (p / 8) * 2 + (p % 4) / 2;
            float noise = (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
            x[i * 16 + p] = noise + (quad == label ? 1.0f : 0.0f);
        }
        y[i] = (float)label;
    }
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "usage: %s (no arguments): trains a two-stage pipeline on a toy problem "
                        "and exits 1 unless it learned it\n", argv[0]);
        return 2;
    }
    gp_run *run;
    if (gp_run_parse("example", yaml, NULL, 0, &run) != GP_OK) {
        fprintf(stderr, "example: %s\n", gp_last_error());
        return 1;
    }
    enum { N = 32, STEPS = 80 };
    float x[N * 16], y[N];
    unsigned seed = 7;
    double first = 0, last = 0;
    gp_metrics m;
    for (int s = 0; s < STEPS; s++) {
        make_batch(&seed, x, y, N);
        if (gp_run_step(run, x, y, N, STEPS, &m) != GP_OK) {
            fprintf(stderr, "example: step %d: %s\n", s, gp_last_error());
            gp_run_free(run);
            return 1;
        }
        if (s == 0) first = m.loss;
        last = m.loss;
        if (s % 20 == 0 || s == STEPS - 1)
            printf("step %3lld  loss %.4f  accuracy %.2f  lr %.4f\n", (long long)m.step, m.loss,
                   m.accuracy, m.lr);
    }
    /* a held-out batch, in evaluation mode */
    enum { TEST_N = 256 };
    static float tx[TEST_N * 16], ty[TEST_N];
    make_batch(&seed, tx, ty, TEST_N);
    double test_loss, test_acc;
    if (gp_run_evaluate(run, tx, ty, TEST_N, &test_loss, &test_acc) != GP_OK) {
        fprintf(stderr, "example: evaluate: %s\n", gp_last_error());
        gp_run_free(run);
        return 1;
    }
    printf("held-out batch of %d: loss %.4f, accuracy %.2f\n", TEST_N, test_loss, test_acc);
    for (int j = 0; j < gp_run_devices(run); j++) {
        const char *name;
        size_t peak, cur;
        if (gp_run_device_memory(run, j, &name, &peak, &cur) != GP_OK) {
            fprintf(stderr, "example: device %d: %s\n", j, gp_last_error());
            gp_run_free(run);
            return 1;
        }
        printf("%s: peak %zu bytes, now %zu bytes\n", name, peak, cur);
    }
    gp_run_free(run);
    if (!(last < 0.5 * first)) {
        fprintf(stderr, "example: loss went from %.4f to %.4f, expected it to halve\n", first, last);
        return 1;
    }
    if (!(test_acc > 0.9)) {
        fprintf(stderr, "example: held-out accuracy %.3f, expected over 0.9\n", test_acc);
        return 1;
    }
    printf("example: loss %.4f -> %.4f\n", first, last);
    return 0;
}
