/*
 * snapshot.h — snapshots (save, verify, resume) and weight files of
 * gpipe's own, in the safetensors format (weights/weights.h has the
 * format, and the files of other programs).
 *
 * Names follow PyTorch's state_dict() of the equivalent nn.Sequential (see
 * docs/snapshots.md): "<layer>.weight", "<layer>.running_mean",
 * "<layer>.num_batches_tracked" (I64 scalar), a residual block's inner names
 * as torchvision's BasicBlock ("3.conv1.weight", "3.downsample.1.bias"), an
 * add layer's projection as torchgpipe's @skippable Residual
 * ("layer1_0_residual.module.downsample.0.weight").
 * A snapshot adds the optimizer's state of each trainable tensor under
 * PyTorch's names, "momentum.<name>" (SGD) or "exp_avg.<name>" and
 * "exp_avg_sq.<name>" (Adam), and metadata "gpipe.*" (step, loader
 * position, seed, config text, the optimizer, format version, CRC-32 of
 * the data section).
 *
 * Thread safety: none needed; a model is gathered by the thread that drives
 * it, between steps (the pipeline drained).
 */
#ifndef GP_SNAPSHOT_H
#define GP_SNAPSHOT_H

#include "train/train.h"
#include "weights/weights.h"

#define GP_SNAPSHOT_FORMAT_VERSION 1

/* ---- models <-> files -------------------------------------------------- */

typedef struct gp_snapshot_pos {
    int64_t step;               /* optimizer steps done */
    int64_t epoch, batch;       /* the loader's next batch */
    int64_t batch_size;         /* to map the position if the batch size changed */
    /* The run's length in steps and the learning rate its step `step`
     * takes ("gpipe.total_steps", "gpipe.lr_next"): a resume whose schedule
     * goes on at another rate says so.  total 0: not known (gp_run_save,
     * files before 2026-12-01), nothing written or compared. */
    int64_t total;
    double lr;
    /* The --metrics record of step `step` that its file could not take (a
     * full disk, ulimit -f), kept in the snapshot ("gpipe.metrics_record")
     * for the run that resumes it to write again.  gp_snapshot_save reads
     * it (NULL: none); gp_snapshot_prepare sets it (malloc'd, the caller
     * frees it) and nothing else does. */
    char *metrics;
} gp_snapshot_pos;

/* Gather the model (parameters, buffers, batch-norm counters; with
 * `optimizer` also the optimizer's state) from its devices to the host into w, with the
 * metadata of a weights file ("gpipe.kind": "weights"), or of a snapshot
 * when pos != NULL (position, seed, config text and overrides). */
gp_status gp_snapshot_collect(gp_model *m, const gp_config *cfg, const gp_snapshot_pos *pos,
                              gp_st_writer *w);
/* Put the tensors of f into the model.  Every name the model has must be in
 * f with dtype F32 (I64 for counters) and the same shape; with `optimizer`
 * so must the optimizer's state of every trainable tensor ("momentum.<name>",
 * or "exp_avg.<name>" and "exp_avg_sq.<name>"), and a snapshot saved by
 * another optimizer is refused (its "gpipe.optimizer", or for older files
 * its state's names).  Names in f the model does not have are an error too
 * (except optimizer state when !optimizer or the run keeps none).
 * Nothing is changed unless everything matches; the message lists the
 * missing, mismatched and unexpected names (GP_ERR_INVALID).  Then the
 * values: a NaN or Inf in any tensor that would be loaded, or a negative
 * "running_var", is GP_ERR_DATA naming f->source, the first such tensor
 * and element index, and how many bad values there are. */
gp_status gp_snapshot_apply(gp_model *m, gp_st_file *f, bool optimizer);

/* Read, verify (CRC required) and check a snapshot; fills pos. */
gp_status gp_snapshot_open(const char *path, gp_st_file *f, gp_snapshot_pos *pos);
/* Before anything is made: --resume latest needs train.snapshot.dir to
 * exist (the run makes it, so afterwards it always would), --resume of a
 * directory says how to resume the newest snapshot in it, and --resume of
 * a file needs the file. */
gp_status gp_snapshot_resume_check(const char *resume, const char *dir);
/* A run that starts afresh (resume NULL) with snapshots on refuses a
 * train.snapshot.dir that already holds snapshots (they would mix), saying
 * how to go on: --resume latest, or, where the config starts from
 * model.init_from (a fine-tune, which a resume would not read), another
 * directory.  So does a run that resumes a file from another folder (that
 * directory's snapshots are another run's: its pruning deleted them).
 * Checked before anything is made, and again when the run places its
 * weights (gp_snapshot_prepare). */
gp_status gp_snapshot_fresh_check(const gp_config *cfg, const char *resume);
/* The newest snapshot in dir that verifies ("snapshot-<step>.safetensors");
 * broken ones are skipped with a warning.  GP_ERR_IO if there is none. */
gp_status gp_snapshot_latest(const char *dir, char *path, size_t len);
/* gp_config_sources.hf_config for a run resumed from `resume` (a
 * snapshot's path, or "latest" for dir's newest): the config.json of
 * model.init_from that the snapshot keeps (gpipe.hf_config, written where
 * the run's model.llama sizes came from it), where it keeps one of that
 * init_from. */
gp_status gp_snapshot_hf_config(void *resume, const char *init_from, const char *dir,
                                char **text, char *from, size_t from_len);
/* The config a snapshot was made with, with `overrides` applied after its
 * own (and gp_snapshot_hf_config for model.init_from's config.json). */
gp_status gp_snapshot_read_config(const char *path, const char *const *overrides, int n_overrides,
                             gp_config *out);

/* ---- one run per snapshot directory ------------------------------------ */

/* A snapshot directory belongs to one run at a time.  The run holds an
 * exclusive flock(2) on "<dir>/.gpipe.lock" from its start to its end; the
 * file holds one line, "pid P on host H, started T", for the message a
 * second run gets.  Everything that deletes or moves files in the
 * directory (a dead writer's temporary files, pruning, moving later
 * snapshots aside) takes the lock handle, so it happens only under it.
 * There is no stale lock: the kernel drops a dead process's flock (a
 * SIGKILLed run's line stays in the file, but a run that finds the lock
 * free overwrites it, and one that ends normally empties it).  The file
 * itself stays, empty.  A lock handle is used by one thread. */
typedef struct gp_snapshot_lock gp_snapshot_lock;

/* Lock `dir` (which must exist), then remove the temporary files of
 * writers that died there.  A directory another process (or another open
 * in this one) holds is GP_ERR_IO naming the directory and the holder's
 * pid, host and start time.  On a file system without flock() this warns
 * and returns a handle that locks nothing (and removes no temporaries). */
gp_status gp_snapshot_lock_dir(const char *dir, gp_snapshot_lock **out);
/* What gp_train_run takes before anything else: with snapshots on
 * (train.snapshot.every_steps or every_minutes), train.snapshot.dir (made
 * if missing); else with resume == "latest", that directory if it exists
 * and is writable; else nothing (*out = NULL, GP_OK). */
gp_status gp_snapshot_lock_run(const gp_config *cfg, const char *resume, gp_snapshot_lock **out);
/* Unlock; NULL is a no-op. */
void gp_snapshot_lock_release(gp_snapshot_lock *lock);

/* Snapshot file path for a step: "<dir>/snapshot-<step, 9 digits>.safetensors". */
void gp_snapshot_path(const char *dir, int64_t step, char *path, size_t len);
/* Save a snapshot of the model at pos into cfg->train.snapshot.dir (made if
 * missing), then delete the older snapshots beyond train.snapshot.keep.
 * `lock` is that directory's (a bug otherwise). */
gp_status gp_snapshot_save(gp_model *m, const gp_config *cfg, const gp_snapshot_pos *pos,
                           const gp_snapshot_lock *lock);
/* gp_snapshot_save with the write in the background: here the model is
 * copied off its devices into host buffers that `lock` keeps from one
 * snapshot to the next; a thread then writes, fsyncs, renames and prunes
 * while training goes on.  At most one write is in flight: one still
 * under way is waited for first, and its failure is this call's status
 * (nothing new is started then).  Under mpirun (the parts, then the file
 * that names them), without a lock, or where no thread can be started, it
 * writes in the foreground, as gp_snapshot_save.  gp_snapshot_save and
 * gp_snapshot_lock_release wait for the write in flight too. */
gp_status gp_snapshot_save_async(gp_model *m, const gp_config *cfg, const gp_snapshot_pos *pos,
                                 gp_snapshot_lock *lock);
/* Wait for the lock's write in flight, if any (NULL: none); its status,
 * a failure naming the step and the file.  `say`: an info line says that
 * the run waits, and for which file, if it is not written yet. */
gp_status gp_snapshot_wait(const gp_snapshot_lock *lock, bool say);
/* Without waiting: GP_OK while the write in flight is under way or when
 * it was written; its failure once it is known (gp_snapshot_wait's). */
gp_status gp_snapshot_poll(const gp_snapshot_lock *lock);
/* The step of the write in flight (its file into path), or -1. */
int64_t gp_snapshot_in_flight(const gp_snapshot_lock *lock, char *path, size_t len);
/* Number of snapshot files in dir (0 if it does not exist).  Reads only. */
int gp_snapshot_count(const char *dir);

/* model.init_from: the weights (and batch-norm statistics) of a weights
 * file or snapshot at `path` into m, nothing else (errors name the key). */
gp_status gp_snapshot_init_from(gp_model *m, const char *path);
/* Before training (gp_train_run): with `resume` (a path, or "latest" for
 * the newest complete snapshot in train.snapshot.dir) restore the model
 * from that snapshot; otherwise apply model.init_from if given.  *pos is
 * where training goes on (all zero for a fresh run), the loader position
 * expressed in the config's batch size over the loader's `per_epoch`
 * batches an epoch (a last batch it drops not counted).  A fresh run with
 * snapshots on refuses a directory that already holds snapshots (they
 * would be mixed with, and pruned by, the new run's), and so does a run
 * that resumes a snapshot from outside it (gp_snapshot_fresh_check).  A resumed run
 * with snapshots on moves the snapshots of later steps in its directory
 * into "<dir>/abandoned-<YYYYmmdd-HHMMSS>/" (one info line says so), so
 * the next --resume latest goes on with this run.  pos->metrics is the
 * snapshot's kept metrics record, or NULL.  `lock` is
 * gp_snapshot_lock_run's (required with snapshots on). */
gp_status gp_snapshot_prepare(gp_model *m, const gp_config *cfg, const char *resume,
                              int64_t per_epoch, const gp_snapshot_lock *lock, bool quiet,
                              gp_snapshot_pos *pos);
/* Restore m from the snapshot at `path`: weights, buffers, optimizer state
 * and step (replicas included), all or nothing (gp_snapshot_apply); warns
 * when it was made with another train.seed.  *pos is the position it
 * records; *positioned (may be NULL) is false for one gp_run_save wrote,
 * whose position is not a loader's.  `quiet`: no info lines. */
gp_status gp_snapshot_restore(gp_model *m, const gp_config *cfg, const char *path, bool quiet,
                              gp_snapshot_pos *pos, bool *positioned);
/* gp_run_save: the model, its optimizer state and step as a snapshot at
 * `path` (atomically), marked as recording no loader position.  One
 * process only (the caller checks). */
gp_status gp_snapshot_save_file(gp_model *m, const gp_config *cfg, const char *path);
/* Write the model's weights (no optimizer state) to `path` atomically. */
gp_status gp_snapshot_export(gp_model *m, const gp_config *cfg, const char *path);
/* m as the weight formats see it (weights/weights.h). */
static inline gp_wmodel gp_model_weights(const gp_model *m)
{
    return (gp_wmodel){.layers = m->layers, .n_layers = m->n_layers,
                       .procs = m->local_device >= 0};
}
/* gp_snapshot_export in format fmt (hf, llmc: the model must be a GPT-2
 * named as Hugging Face's modules, or a model.llama for hf; llmc: its head
 * tied or equal to wte): gathered here, written by gp_gpt_write or
 * gp_llama_export. */
gp_status gp_gpt_export(gp_model *m, const gp_config *cfg, const char *path,
                        gp_weights_format fmt);

#endif /* GP_SNAPSHOT_H */
