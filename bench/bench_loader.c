/*
 * bench_loader.c — the image_folder loader's throughput: decode + random
 * resized crop + flip + normalise into float batches, as training sees it.
 *
 *   bench_loader FOLDER [--workers N] [--batches N] [--batch N] [--size S]
 *                       [--eval]
 *
 * FOLDER holds train/<class>/<image>.jpg (scripts/make-image-folder.py writes
 * one; bench/bench_loader.py writes ImageNet-like JPEGs and runs this
 * beside PyTorch's DataLoader).  Prints one line: images/s, images/s per
 * worker, the processor.  The first batch (thread start, the index) is
 * not timed.
 */
#include "bench_util.h"
#include "data/data.h"

#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: bench_loader FOLDER [--workers N] [--batches N] [--batch N] "
                        "[--size S] [--eval]\n");
        return argc < 2 ? 2 : 0;
    }
    int workers = 1, batches = 20, batch = 64, size = 224;
    bool eval = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) batches = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc) size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--eval")) eval = true;
        else {
            fprintf(stderr, "bench_loader: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    gp_data_config dc = {.dataset = GP_DATASET_IMAGE_FOLDER, .normalize = true, .shuffle = true,
                         .hflip = true, .rrc = true, .rrc_scale = {0.08f, 1.0f},
                         .rrc_ratio = {0.75f, 4.0f / 3.0f}, .masks_binary = true,
                         .image_shape = {3, size, size}};
    snprintf(dc.path, sizeof dc.path, "%s", argv[1]);
    gp_dataset ds = {0};
    if (gp_dataset_load(&dc, true, 0, &ds) != GP_OK) {
        fprintf(stderr, "bench_loader: %s\n", gp_last_error());
        return 1;
    }
    gp_loader_opts o = {.batch_size = batch, .shuffle = true, .augment = !eval, .prefetch = 4,
                        .seed = 1, .workers = workers};
    gp_loader *ld = NULL;
    if (gp_loader_create(&ds, &dc, &o, &ld) != GP_OK) {
        fprintf(stderr, "bench_loader: %s\n", gp_last_error());
        return 1;
    }
    gp_batch b;
    if (gp_loader_next(ld, &b) != GP_OK) {
        fprintf(stderr, "bench_loader: %s\n", gp_last_error());
        return 1;
    }
    double t0 = gp_now();
    int64_t images = 0;
    double sum = 0;
    for (int k = 0; k < batches; k++) {
        if (gp_loader_next(ld, &b) != GP_OK) {
            fprintf(stderr, "bench_loader: %s\n", gp_last_error());
            return 1;
        }
        images += b.n;
        sum += b.x[0]; /* read the batch */
    }
    double dt = gp_now() - t0;
    char cpu[256];
    gp_bench_cpu_name(cpu, sizeof cpu);
    printf("gpipe loader: %d workers, %lld images of %s in %.2f s: %.1f images/s, %.1f per "
           "worker (%s; checksum %.3f)\n", workers, (long long)images,
           eval ? "resize+centre crop" : "random resized crop+flip", dt, images / dt,
           images / dt / workers, cpu, sum);
    gp_loader_destroy(ld);
    gp_dataset_free(&ds);
    return 0;
}
