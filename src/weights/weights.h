/*
 * weights.h — the weights module's one header (src/weights): the
 * safetensors format's reader and writer (safetensors.c), and the weight
 * files other programs write and read: Hugging Face's and llm.c's GPT-2
 * (gpt_weights.c) and Hugging Face's Llama folders (hf_llama.c).
 * Snapshots, which are safetensors files of a model's whole state, are
 * train/snapshot.h's; what these files mean for a model (names, shapes,
 * the check against it) goes through gp_snapshot_apply there.
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
 * Memory: gp_st_file owns the whole file image; its tensors point into it.
 * gp_st_writer owns host copies of what was added.  Both have _free.
 * Thread safety: none needed; a model is gathered by the thread that drives
 * it, between steps (the pipeline drained).
 */
#ifndef GP_WEIGHTS_H
#define GP_WEIGHTS_H

#include "config/config.h"
#include "core/json.h"
#include "layers/layers.h"

/* A model as the weight formats see it: its layers in order (a trainer's
 * gp_model gives them: gp_model_weights in train/snapshot.h), and whether
 * other processes run some of them (mpirun: those are shapes only here). */
typedef struct gp_wmodel {
    const gp_layer *layers;
    int n_layers;
    bool procs;
} gp_wmodel;

/* The names tensors have in gpipe's files (snapshots, exports): a model
 * whose layers all have names names them "<layer name>.<what>", else
 * "<layer index>.<what>" (PyTorch's nn.Sequential); buf of at least 256
 * bytes. */
bool gp_weights_by_name(const gp_layer *layers, int n_layers);
const char *gp_weights_tensor_name(char *buf, size_t len, const char *prefix,
                                   const gp_layer *layers, int k, bool by_name,
                                   const char *what);
/* Whether m has a tensor of that name (a parameter or buffer, a tied
 * replica not: its owner's), and its shape into ndim, dims (may be NULL). */
bool gp_weights_has(const gp_wmodel *m, const char *name, int *ndim, int64_t *dims);
/* w's document and a newline written to path atomically (beside it, then
 * renamed: a failure leaves what was there), w freed: config.json and
 * the shards' index of the folders written. */
gp_status gp_weights_write_json(gp_json_writer *w, const char *path);

/* ---- the format -------------------------------------------------------- */

#define GP_ST_MAX_DIMS 8
#define GP_ST_MAX_HEADER ((uint64_t)100000000) /* the reference library's limit */

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
    /* A converted file's element e of tensor i as its source holds it, for
     * messages ("'...k_proj.weight'[5] of DIR/model.safetensors": a
     * Llama's q, k and v are one tensor in gpipe, a GPT-2's Conv1D weights
     * transposed); false where it cannot say (NULL: as named). */
    bool (*where)(const struct gp_st_file *f, int i, int64_t e, char *buf, size_t len);
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

/* ---- GPT-2's weights as other programs write them (gpt_weights.c) ------ */

typedef enum {
    GP_WEIGHTS_GPIPE = 0, /* gpipe's safetensors (--export-weights) */
    GP_WEIGHTS_HF,        /* Hugging Face's GPT-2 model.safetensors */
    GP_WEIGHTS_LLMC,      /* llm.c's gpt2_124M.bin checkpoint (FP32) */
    GP_WEIGHTS_HF_BF16    /* a Llama's Hugging Face folder with BF16 tensors
                             (what save_pretrained writes of a bf16 model:
                             half the bytes) */
} gp_weights_format;

/* Whether the file at path starts with llm.c's checkpoint magic. */
bool gp_gpt_is_llmc(const char *path);
/* Whether f is a Hugging Face GPT-2 file (h.0.attn.c_attn.weight, with or
 * without "transformer.", stored (C, 3C) as Conv1D does). */
bool gp_gpt_is_hf(const gp_st_file *f);
/* A Hugging Face GPT-2 folder's config.json (dir's) against m, as the
 * Llama folder's is (its model.safetensors alone did not say n_head, an
 * activation or attention scaling gpipe does not have, and loaded into a
 * model of another loss): n_layer, n_head, n_embd, vocab_size,
 * n_positions, n_inner, layer_norm_epsilon, each difference named with
 * the model.gpt key that sets it; an activation_function other than GELU's
 * tanh form (gelu_new, gelu_pytorch_tanh, gelu_fast), scale_attn_weights
 * false, scale_attn_by_inverse_layer_idx true or another model_type than
 * gpt2 refused.  GP_OK where dir has no config.json: the tensors' shapes
 * are checked as they load. */
gp_status gp_gpt_check_config(const gp_wmodel *m, const char *dir);
/* model.init_from's read: an llm.c checkpoint or a Hugging Face GPT-2 file
 * converted to gpipe's names and layouts for m (*converted), else the
 * safetensors file as it is.  Errors name path and the tensor. */
gp_status gp_gpt_read(const gp_wmodel *m, const char *path, gp_st_file *f, bool *converted);
/* g, m's tensors as gpipe names them (gp_snapshot_collect's), written to
 * path in fmt: hf (a folder of config.json and model.safetensors, or the
 * file alone where path ends in .safetensors: gp_gpt_hf_folder_path) or
 * llmc (its head tied or equal to wte).  The model must be a GPT-2 named
 * as Hugging Face's modules.  gp_gpt_export (train/snapshot.h) gathers g
 * and calls this. */
gp_status gp_gpt_write(const gp_wmodel *m, const gp_st_file *g, const char *path,
                       gp_weights_format fmt);
/* Before a run that will export in fmt: whether m can be written so (its
 * names; llmc: one number of heads, and no head of its own when the run
 * `trains`, which would make it differ from wte), said before any step. */
gp_status gp_gpt_export_check(const gp_wmodel *m, gp_weights_format fmt, bool trains);
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
gp_status gp_llama_read(const gp_wmodel *m, const char *path, gp_st_file *out);
/* --export-format hf for a model.llama: the folder `dir` (made if missing)
 * with config.json and model.safetensors, or shards of at most 5 GB
 * (GPIPE_HF_SHARD_BYTES) with model.safetensors.index.json, FP32 (bf16:
 * BF16, each value rounded to nearest even, torch_dtype bfloat16), HF's
 * names (qkv_proj and gate_up_proj split), each parameter downloaded and
 * written in turn (the model plus one tensor held).  The check: an error
 * where the folder could not hold m.  gp_llama_is_model: whether m is a
 * model.llama (its model.embed_tokens.wte.weight).  The keys of source's
 * config.json that gpipe does not decide are carried over (source: the
 * run's model.init_from; where that folder is gone, source_config, the
 * file's text as the run kept it). */
bool gp_llama_is_model(const gp_wmodel *m);
gp_status gp_llama_export_check(const gp_wmodel *m);
gp_status gp_llama_export(const gp_wmodel *m, const char *dir, bool bf16, const char *source,
                          const char *source_config);

/* A Hugging Face folder written as a whole (issue 77; the GPT-2 and Llama
 * exports): each file goes to GP_HF_STAGE + its name in dir (written
 * atomically), and gp_hf_folder_commit renames names[0..k) into place in
 * that order (config.json last), then removes the files of an earlier
 * export (gp_hf_export_name) that this one does not have.  Where s (the
 * caller's status of writing them) is not GP_OK, or a rename fails, the
 * staged files are removed and that status returned: the earlier export
 * is as it was (but for the files renamed before a failed rename, which
 * its message names).  gp_hf_remove_staged: a killed export's staged
 * files removed (before writing), and the temporaries it was writing them
 * through (gp_atomic_open's "." + staged name + ".tmp.PID", full-size: the
 * prefix did not match them, so each kill left one for good) whose
 * process is gone. */
#define GP_HF_STAGE ".gpipe-export."
void gp_hf_remove_staged(const char *dir);
gp_status gp_hf_folder_commit(const char *dir, const char *const *names, int k, gp_status s);

#endif /* GP_WEIGHTS_H */
