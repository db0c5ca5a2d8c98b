/* fuzz_safetensors.c — the safetensors reader: parse, checksum, look-ups,
 * and the snapshot metadata checks a resume makes. */
#include "fuzz_util.h"
#include "train/snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gp_log_set_level(GP_LOG_QUIET);
    gp_st_file f;
    if (gp_st_parse("fuzz.safetensors", data, size, &f) != GP_OK) {
        if (!gp_last_error()[0]) abort();
        return 0;
    }
    (void)gp_st_verify(&f, false);
    (void)gp_st_meta(&f, "gpipe.step");
    for (int i = 0; i < f.n; i++) {
        const gp_st_tensor *t = gp_st_find(&f, f.tensors[i].name);
        if (!t) abort();
        volatile uint8_t sink = 0;
        for (uint64_t k = t->begin; k < t->end; k++) sink ^= t->data[k - t->begin];
        (void)sink;
    }
    gp_st_free(&f);
    /* the same bytes as a file, through the snapshot checks */
    gp_snapshot_pos pos;
    if (gp_snapshot_open(fuzz_file(data, size), &f, &pos) == GP_OK) gp_st_free(&f);
    return 0;
}
