/* fuzz_idx.c — the IDX (MNIST) readers, raw or gzip.  The first byte picks
 * images (even) or labels (odd); the rest is the file. */
#include "fuzz_util.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *p = fuzz_file(data + 1, size - 1);
    gp_dataset ds;
    memset(&ds, 0, sizeof ds);
    gp_status s = (data[0] & 1) ? gp_idx_read_labels(p, &ds) : gp_idx_read_images(p, &ds);
    if (s != GP_OK && !gp_last_error()[0]) abort();
    gp_dataset_free(&ds);
    return 0;
}
