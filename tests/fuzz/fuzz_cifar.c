/* fuzz_cifar.c — the CIFAR-10 binary batch reader. */
#include "fuzz_util.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = fuzz_file(data, size);
    gp_dataset ds;
    memset(&ds, 0, sizeof ds);
    if (gp_cifar10_read(&p, 1, &ds) != GP_OK && !gp_last_error()[0]) abort();
    gp_dataset_free(&ds);
    return 0;
}
