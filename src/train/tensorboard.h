/*
 * tensorboard.h — TensorBoard event files (--tensorboard DIR, or
 * train.tensorboard): every record of the --metrics file, as it is written,
 * also as one TensorBoard Event of scalars at the record's step, so a
 * running job can be watched in TensorBoard.
 *
 * Format: TFRecord framing (length, masked CRC32C of it, the Event, masked
 * CRC32C of it) around Event protobufs encoded by protobuf-c from
 * tensorboard.proto (TensorBoard's own field numbers).  Each record is
 * written with write(2) as it is made, nothing kept back in a buffer; a
 * write that fails part way is cut back to the last whole record.
 *
 * Names (the metrics file's keys, left, as TensorBoard tags):
 *   loss, accuracy, grad_norm      train/loss, train/accuracy, train/grad_norm
 *   lr, epoch                      lr, epoch
 *   samples_per_s                  throughput/samples_per_s
 *   step_seconds, data_wait_seconds, allreduce_seconds
 *                                  time/step_seconds, ...
 *   bad_files                      data/bad_files
 *   devices[]: host_waits          host_waits/<device>
 *   devices[]: launches            launches/<device>
 *   devices[]: any other number    memory/<device>/<key> (peak_bytes,
 *                                  current_bytes, peak_params, ...)
 *   an evaluation's test_loss, test_accuracy, epoch
 *                                  test/loss, test/accuracy, test/epoch
 *   any other number K             K
 * Values are TensorBoard's simple_value, a 32-bit float (null, a NaN loss,
 * is written as NaN); the record's "step" is the Event's step.
 *
 * A run owns DIR's event files (events.out.tfevents.*, the directory's
 * own, not its subdirectories'): a fresh run removes those there, as
 * --metrics replaces its file; a resumed run cuts them back to the steps
 * its snapshot holds and writes a new file after them, so no step is in
 * them twice.
 *
 * Thread safety: a gp_tboard belongs to one thread.
 */
#ifndef GP_TENSORBOARD_H
#define GP_TENSORBOARD_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gp_tboard gp_tboard;

/* Open DIR (made if missing) for this run's events.  resume_step < 0: a
 * fresh run (the event files there are removed).  Otherwise the run goes
 * on from step resume_step: records of later steps are cut off the files
 * there, and so are the evaluations at resume_step when drop_evals (this
 * run writes them again), and a torn last record; `lost` (a metrics record
 * the snapshot kept, or NULL) is written first where the files lack
 * resume_step's record.  `what` names the flag or key that gave DIR, for
 * messages.  GP_ERR_IO naming the file and what to do. */
gp_status gp_tboard_open(const char *dir, const char *what, int64_t resume_step,
                         bool drop_evals, const char *lost, gp_tboard **out);
/* One metrics record (a JSON object, len bytes, as trainer.c writes it) as
 * one Event.  GP_ERR_IO where it cannot be written (the file is cut back
 * to its last whole record); GP_ERR_INVALID for text that is not such a
 * record (a bug in the caller). */
gp_status gp_tboard_record(gp_tboard *tb, const char *json, size_t len);
/* Close and free; NULL is a no-op.  GP_ERR_IO where closing fails. */
gp_status gp_tboard_close(gp_tboard *tb);

/* The masked CRC32C of TFRecord framing (for tests). */
uint32_t gp_tboard_masked_crc(const void *data, size_t len);

#endif /* GP_TENSORBOARD_H */
