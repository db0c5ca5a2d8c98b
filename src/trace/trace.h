/*
 * trace.h — timelines of pipeline steps as Chrome trace JSON (opens in
 * Perfetto and chrome://tracing).
 *
 * Layout: one process per device ("cpu:1 (stage 1)") with a "compute" track
 * and a "copy" track; one slice per executed instruction, named
 * F3 s1 / R3 s1 / B3 s1 (micro-batch 3 on stage 1), "copy a3 s0->s1" for an
 * activation, "copy g3 s2->s1" for a gradient, and "wait" for the time a copy
 * waited for its source or the lockstep barrier; args carry step, stage,
 * micro-batch, layer range and bytes.  Times are device time where the
 * pipeline recorded it (gp_pipeline_set_device_time, which gpipe-train
 * turns on for traced steps): when the device's stream ran the
 * instruction, the wait being the time the copy stream waited for the
 * producer, with args "time": "device" and "issued_us" (when the host
 * issued it); elsewhere host time.  (args "clock" is the schedule's clock
 * number k, on every slice.)  Flow arrows go from the slice that
 * produced a copied tensor to the copy that consumed it.  Each step begins
 * with a global instant event; a counter per device tracks allocated bytes.
 *
 * Owns: the trace file.  May call: core, backend (device names) and
 * pipeline (the executed instructions, gp_event_name).  The pipeline knows
 * nothing of it: NVTX ranges are the pipeline's own (pipeline/nvtx.h).
 *
 * Memory: gp_trace owns its FILE; gp_trace_close flushes and frees.
 * Thread safety: called by the training thread between steps.
 */
#ifndef GP_TRACE_H
#define GP_TRACE_H

#include "pipeline/pipeline.h"

typedef struct gp_trace gp_trace;

/* Record steps [first, last] (0-based; last < 0 = no end) into `path`. */
gp_status gp_trace_open(const char *path, int64_t first, int64_t last, gp_trace **out);
/* Whether `step` is to be recorded. */
bool gp_trace_wants(const gp_trace *t, int64_t step);
/* Append the last step of pipeline p (its event log) as step `step`;
 * devs[j] is its device j.  With data-parallel replicas (`replicas` > 1)
 * each replica's pipeline is added with its index: its devices are the
 * trace's processes replica x devices + j, named "cpu:2 (replica 1, stage
 * 0)", so that the replicas' traces of a run in processes merge; replica
 * 0's adds the step marker. */
gp_status gp_trace_add_step(gp_trace *t, const gp_pipeline *p, gp_device *const *devs,
                            int64_t step, int replica, int replicas);
/* Finish the JSON and close; reports a write error. NULL is fine. */
gp_status gp_trace_close(gp_trace *t);

/* Parse "A:B", "A:", ":B" or "A" into [first, last]. */
bool gp_trace_parse_range(const char *s, int64_t *first, int64_t *last);

#endif /* GP_TRACE_H */
