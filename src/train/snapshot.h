/*
 * snapshot.h — snapshots (save, verify, resume) and weight files, both in
 * the safetensors format, plus the format's reader and writer on their own.
 *
 * The format (https://github.com/huggingface/safetensors):
 *   8 bytes   N, little-endian u64: the header's length
 *   N bytes   JSON object: {"<name>": {"dtype": "F32", "shape": [..],
 *             "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
 *             (may end in spaces; ours is padded to a multiple of 8)
 *   rest      the data section: every tensor's raw little-endian bytes, row
 *             major, at [begin, end) relative to the section's start; the
 *             tensors tile the section without holes or overlap.
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
 * Memory: gp_st_file owns the whole file image; its tensors point into it.
 * gp_st_writer owns host copies of what was added.  Both have _free.
 * Thread safety: none needed; a model is gathered by the thread that drives
 * it, between steps (the pipeline drained).
 */
#ifndef GP_SNAPSHOT_H
#define GP_SNAPSHOT_H

#include "train/train.h"

/* ---- the format -------------------------------------------------------- */

#define GP_ST_MAX_DIMS 8
#define GP_ST_MAX_HEADER ((uint64_t)100000000) /* the reference library's limit */
#define GP_SNAPSHOT_FORMAT_VERSION 1

/* Dtypes we read and write.  A file with any other dtype parses (so its
 * names can be listed) but its tensors cannot be loaded into a model. */
typedef enum { GP_ST_F32 = 0, GP_ST_I64, GP_ST_OTHER } gp_st_dtype;

typedef struct gp_st_tensor {
    char *name;                 /* owned */
    gp_st_dtype dtype;
    char dtype_name[8];         /* as written: "F32", "BF16", ... */
    int ndim;                   /* 0 = scalar */
    int64_t dims[GP_ST_MAX_DIMS];
    const uint8_t *data;        /* into the file image, end - begin bytes;
                                   NULL while its part is not read */
    int part;                   /* -1, or the part (gp_st_file.parts) it is in */
    uint64_t begin, end;        /* offsets in the data section */
} gp_st_tensor;

typedef struct gp_st_file {
    gp_st_tensor *tensors;      /* n, in header order */
    int n;
    char **meta;                /* n_meta (key, value) pairs: meta[2i], meta[2i+1] */
    int n_meta;
    uint8_t *image;             /* the whole file, owned */
    const uint8_t *data;        /* the data section inside image */
    uint64_t data_len;
    char source[512];           /* path or name, for messages */
    /* A snapshot written by several processes: the other ranks' parts
     * (gpipe.parts), whose tensors were appended to `tensors` (part = its
     * index), read as headers only; gp_snapshot_apply reads a part whole
     * (and checks its checksum) when a layer of this process needs one of
     * its tensors, then data points into that part's image, owned here. */
    struct gp_st_file *parts;
    int n_parts;
    char **part_paths;          /* [n_parts], owned */
    /* Lazy tensors (a converted file: data NULL, part -1): fetch fills dst,
     * end - begin bytes, with tensor i's data, read and converted as it is
     * asked for, so that loading holds one tensor at a time beside the
     * model; gp_snapshot_apply takes them so.  fetch_free frees fetch_ctx
     * (gp_st_free). */
    gp_status (*fetch)(const struct gp_st_file *f, int i, uint8_t *dst);
    void *fetch_ctx;
    void (*fetch_free)(void *ctx);
} gp_st_file;

/* Parse a file image (copied).  Everything is checked: header length and
 * JSON syntax, dtypes and shapes against offsets, offsets inside the data
 * section and tiling it, unique names, metadata values being strings.
 * Errors are GP_ERR_DATA naming `name` and the damage. */
gp_status gp_st_parse(const char *name, const uint8_t *buf, size_t len, gp_st_file *out);
/* Read and parse a file (GP_ERR_IO if it cannot be read). */
gp_status gp_st_read(const char *path, gp_st_file *out);
/* Only the header: names, dtypes, shapes and metadata, every tensor's data
 * NULL (the data section's length is checked against the file's size, not
 * read).  For the parts of a snapshot a process may not need. */
gp_status gp_st_read_header(const char *path, gp_st_file *out);
/* The checksum (gpipe.crc32 in hdr, required) of the data section of the
 * file at path, read in 1 MiB pieces: a part checked without holding it. */
gp_status gp_st_verify_file(const gp_st_file *hdr, const char *path);
void gp_st_free(gp_st_file *f);
const gp_st_tensor *gp_st_find(const gp_st_file *f, const char *name);
/* bytes at off of the open file fd (named path for the message) into
 * buf, whole, or GP_ERR_IO naming path: the lazy weight readers' pread
 * (gpt_weights.c, hf_llama.c). */
gp_status gp_st_pread(int fd, const char *path, uint64_t off, uint8_t *buf, size_t bytes);
/* The element kinds the weight readers widen to FP32 (gp_st_wide_of:
 * from a tensor's dtype; NONE for any other), and element i of data of
 * kind k (little-endian, maybe unaligned) as a float. */
typedef enum { GP_ST_WIDE_F32, GP_ST_WIDE_BF16, GP_ST_WIDE_F16, GP_ST_WIDE_NONE } gp_st_wide;
gp_st_wide gp_st_wide_of(const gp_st_tensor *t);
float gp_st_widen(const uint8_t *data, gp_st_wide k, int64_t i);
const char *gp_st_meta(const gp_st_file *f, const char *key); /* NULL if absent */
/* If the file carries "gpipe.crc32", check it against the data section
 * (GP_ERR_DATA "checksum mismatch" otherwise); `required` makes its absence
 * an error too. */
gp_status gp_st_verify(const gp_st_file *f, bool required);

typedef struct gp_st_writer {
    gp_st_tensor *tensors;      /* data owned (malloc), offsets set on add */
    int n, cap;
    char **meta;
    int n_meta, meta_cap;
    uint64_t data_len;
    int n_kept;                 /* tensors[0 .. n_kept) hold the buffers of the
                                   write before gp_st_writer_reuse (owned) */
    bool crc_known;             /* crc is the data's CRC-32, computed by the
                                   caller as it filled the buffers (a snapshot's
                                   writer thread: gp_st_crc over each chunk it
                                   copies, while it is in the cache); cleared by
                                   every slot and by gp_st_writer_reuse */
    uint32_t crc;
} gp_st_writer;

/* zlib's CRC-32 `crc` carried on over n more bytes (0 to start); ISA-L's
 * where the build has it, the same value. */
uint32_t gp_st_crc(uint32_t crc, const void *p, uint64_t n);

/* Copy `bytes` of host data as tensor `name` (dtype F32 or I64). */
gp_status gp_st_writer_add(gp_st_writer *w, const char *name, gp_st_dtype dtype, int ndim,
                           const int64_t *dims, const void *data, size_t bytes);
/* Add tensor `name` of `bytes` and return its buffer, for the caller to
 * fill (a device's tensor downloaded straight into it). */
gp_status gp_st_writer_slot(gp_st_writer *w, const char *name, gp_st_dtype dtype, int ndim,
                            const int64_t *dims, size_t bytes, void **data);
/* Empty w for the next file, keeping the tensors' buffers: the k-th tensor
 * added next reuses the k-th buffer when its name and size are the same
 * (a snapshot's host copies, kept from one snapshot to the next, so that
 * copying them is a memcpy into pages already there). */
void gp_st_writer_reuse(gp_st_writer *w);
gp_status gp_st_writer_meta(gp_st_writer *w, const char *key, const char *value);
/* Write to `path` atomically: a temporary file in the same directory,
 * fsync, rename over `path`, fsync of the directory.  Adds "gpipe.crc32"
 * over the data section first.  On failure `path` is untouched.  The
 * test-only environment variable GPIPE_SNAPSHOT_SLOW_WRITE_MS sleeps that
 * long halfway through the data, so a test can kill the writer there. */
gp_status gp_st_write_atomic(gp_st_writer *w, const char *path);
/* The serialised file in memory (tests, fuzz seeds); *out is malloc'd. */
gp_status gp_st_serialize(gp_st_writer *w, uint8_t **out, size_t *len);
/* The file w holds, as a parsed gp_st_file named `source` in messages:
 * each tensor's buffer is freed once it is copied into the image (w keeps
 * only names), so converting a file never holds its tensors twice. */
gp_status gp_st_writer_to_file(gp_st_writer *w, const char *source, gp_st_file *out);
void gp_st_writer_free(gp_st_writer *w);

/* ---- models <-> files -------------------------------------------------- */

typedef struct gp_snapshot_pos {
    int64_t step;               /* optimizer steps done */
    int64_t epoch, batch;       /* the loader's next batch */
    int64_t batch_size;         /* to map the position if the batch size changed */
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
 * exist (the run makes it, so afterwards it always would), and --resume
 * of a directory says how to resume the newest snapshot in it. */
gp_status gp_snapshot_resume_check(const char *resume, const char *dir);
/* The newest snapshot in dir that verifies ("snapshot-<step>.safetensors");
 * broken ones are skipped with a warning.  GP_ERR_IO if there is none. */
gp_status gp_snapshot_latest(const char *dir, char *path, size_t len);
/* The config a snapshot was made with, with `overrides` applied after its
 * own. */
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
 * expressed in the config's batch size over `train_n` samples.  A fresh
 * run with snapshots on refuses a directory that already holds snapshots
 * (they would be mixed with, and pruned by, the new run's).  A resumed run
 * with snapshots on moves the snapshots of later steps in its directory
 * into "<dir>/abandoned-<YYYYmmdd-HHMMSS>/" (one info line says so), so
 * the next --resume latest goes on with this run.  pos->metrics is the
 * snapshot's kept metrics record, or NULL.  `lock` is
 * gp_snapshot_lock_run's (required with snapshots on). */
gp_status gp_snapshot_prepare(gp_model *m, const gp_config *cfg, const char *resume,
                              int64_t train_n, const gp_snapshot_lock *lock, bool quiet,
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
/* Whether m has a tensor of that name, as snapshots name them (a
 * parameter or buffer); its shape into ndim, dims (may be NULL). */
bool gp_snapshot_model_has(const gp_model *m, const char *name, int *ndim, int64_t *dims);

/* ---- GPT-2's weights as other programs write them (gpt_weights.c) ------ */

typedef enum {
    GP_WEIGHTS_GPIPE = 0, /* gpipe's safetensors (--export-weights) */
    GP_WEIGHTS_HF,        /* Hugging Face's GPT-2 model.safetensors */
    GP_WEIGHTS_LLMC       /* llm.c's gpt2_124M.bin checkpoint (FP32) */
} gp_weights_format;

/* Whether the file at path starts with llm.c's checkpoint magic. */
bool gp_gpt_is_llmc(const char *path);
/* Whether f is a Hugging Face GPT-2 file (h.0.attn.c_attn.weight, with or
 * without "transformer.", stored (C, 3C) as Conv1D does). */
bool gp_gpt_is_hf(const gp_st_file *f);
/* model.init_from's read: an llm.c checkpoint or a Hugging Face GPT-2 file
 * converted to gpipe's names and layouts for m (*converted), else the
 * safetensors file as it is.  Errors name path and the tensor. */
gp_status gp_gpt_read(const gp_model *m, const char *path, gp_st_file *f, bool *converted);
/* gp_snapshot_export in format fmt (hf, llmc: the model must be a GPT-2
 * named as Hugging Face's modules; llmc: its head tied or equal to wte). */
gp_status gp_gpt_export(gp_model *m, const gp_config *cfg, const char *path,
                        gp_weights_format fmt);
/* Before a run that will export in fmt: whether m can be written so (its
 * names; llmc: one number of heads, and no head of its own when the run
 * `trains`, which would make it differ from wte), said before any step. */
gp_status gp_gpt_export_check(const gp_model *m, gp_weights_format fmt, bool trains);
/* Whether --export-format hf of a GPT-2 to `path` writes a Hugging Face
 * folder (config.json and model.safetensors): a path that does not end in
 * .safetensors; one that does is the model.safetensors file alone. */
bool gp_gpt_hf_folder_path(const char *path);

/* ---- Hugging Face Llama folders (hf_llama.c, issue 66) ------------------ */

/* Whether model.init_from's path is a Hugging Face model folder (a
 * directory) or one Llama model.safetensors (model.embed_tokens.weight and
 * model.layers.0.self_attn.q_proj.weight in its header). */
bool gp_llama_is_hf(const char *path);
/* The folder's (or file's) tensors as model.llama's names and layouts for
 * m, lazily: q, k and v stacked into qkv_proj, gate and up into
 * gate_up_proj, each read from its shard and converted to FP32 as it is
 * loaded.  config.json, where there is one, is checked against m first,
 * each difference named.  Errors name the folder and the tensor. */
gp_status gp_llama_read(const gp_model *m, const char *path, gp_st_file *out);
/* --export-format hf for a model.llama: the folder `dir` (made if missing)
 * with config.json and model.safetensors, or shards of at most 5 GB
 * (GPIPE_HF_SHARD_BYTES) with model.safetensors.index.json, FP32, HF's
 * names (qkv_proj and gate_up_proj split), each parameter downloaded and
 * written in turn (the model plus one tensor held).  The check: an error
 * where the folder could not hold m.  gp_llama_is_model: whether m is a
 * model.llama (its model.embed_tokens.wte.weight). */
bool gp_llama_is_model(const gp_model *m);
gp_status gp_llama_export_check(const gp_model *m);
gp_status gp_llama_export(const gp_model *m, const char *dir);

#endif /* GP_SNAPSHOT_H */
