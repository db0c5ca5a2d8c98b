/*
 * hf_config.h — a Hugging Face folder's config.json, read and checked in
 * one place for everyone who reads it: the config parser (model.llama's
 * sizes where the YAML leaves them to model.init_from's folder) and the
 * weights loader (the folder's sizes against the model's).  Issue 77: it
 * was read twice, and the parser's copy turned every problem (a FIFO that
 * blocked for ever, a file over 1 MiB, JSON that does not parse, a value of
 * the wrong type or out of range) into LlamaConfig's defaults, so a run
 * built Llama 2 7B without a word about the file.
 *
 * Every error names the file, and where it is about one value, its line
 * and column and its key: "D/config.json:4:28: num_attention_heads = 0 is
 * out of range: it must be 1 to 65536".
 */
#ifndef GP_HF_CONFIG_H
#define GP_HF_CONFIG_H

#include "core/core.h"
#include "core/json.h"

/* Larger than any config.json Hugging Face has (the largest known are
 * about 2 MB, with long id2label maps); a bigger file is refused as not
 * one, never read in part. */
#define GP_HF_CONFIG_MAX ((size_t)64 << 20)

typedef struct gp_hf_config {
    char path[1100];    /* DIR/config.json */
    gp_json_value *json; /* its object; NULL where the folder has none */
    char *text;          /* the file, for the line and column of a value */
    size_t len;
} gp_hf_config;

/* Read DIR/config.json into c.  GP_OK with c->json NULL where the folder
 * has no config.json (the caller says what that means for it); otherwise
 * an error naming the file: not a regular file (a folder, a FIFO or a
 * device: never opened for reading, so never a hang), larger than
 * GP_HF_CONFIG_MAX, not JSON (file:line:column and why, with a hint for a
 * byte-order mark and UTF-16), or not an object.  Free with
 * gp_hf_config_free, also after an error. */
gp_status gp_hf_config_read(const char *dir, gp_hf_config *c);
/* The same for any JSON object file of such a folder (path itself:
 * generation_config.json). */
gp_status gp_hf_json_read(const char *path, gp_hf_config *c);
/* The same for a config.json's text kept elsewhere (a snapshot keeps the
 * one its run was made from); name stands for the file in messages. */
gp_status gp_hf_config_parse(const char *name, const char *text, size_t len, gp_hf_config *c);
void gp_hf_config_free(gp_hf_config *c);

/* obj's (c->json where NULL) member `key` as an integer in [lo, hi]; def
 * where it is absent.  An error naming the file, line, column and key for
 * a value that is not a whole number (a string, null, 1.5) or is out of
 * range. */
gp_status gp_hf_config_int(const gp_hf_config *c, const gp_json_value *obj, const char *key,
                           int64_t def, int64_t lo, int64_t hi, int64_t *out);
/* The same for a number in [lo, hi] (lo excluded where lo_open). */
gp_status gp_hf_config_num(const gp_hf_config *c, const gp_json_value *obj, const char *key,
                           double def, double lo, double hi, bool lo_open, double *out);
/* The same for true or false (0 and 1 read as false and true, as Python's
 * truth would). */
gp_status gp_hf_config_bool(const gp_hf_config *c, const gp_json_value *obj, const char *key,
                            bool def, bool *out);

/* LlamaConfig's defaults (transformers), which transformers applies to a
 * Llama-family folder's config.json (Llama, Mistral, Qwen2) where it leaves
 * the key out: the config parser's model.llama defaults and the weights
 * loader's comparison both take them from here, so a key left out means
 * the same to both (tie_word_embeddings: LlamaConfig's and Qwen2Config's
 * false, not PretrainedConfig's true). */
#define GP_HF_LLAMA_LAYERS 32          /* num_hidden_layers */
#define GP_HF_LLAMA_HEADS 32           /* num_attention_heads */
#define GP_HF_LLAMA_WIDTH 4096         /* hidden_size */
#define GP_HF_LLAMA_INTERMEDIATE 11008 /* intermediate_size */
#define GP_HF_LLAMA_VOCAB 32000        /* vocab_size */
#define GP_HF_LLAMA_POSITIONS 2048     /* max_position_embeddings */
#define GP_HF_LLAMA_ROPE_THETA 10000.0 /* rope_theta */
#define GP_HF_LLAMA_RMS_EPS 1e-6       /* rms_norm_eps */
#define GP_HF_LLAMA_TIE false          /* tie_word_embeddings */

/* Whether c, a Llama-family folder's config.json, describes what model.llama
 * builds, beyond the sizes (a folder that does not loaded and gave another
 * loss): model_type llama, mistral or qwen2, or none (Gemma's, Phi's and
 * others' have tensors of the same names that are used otherwise);
 * hidden_act silu (SwiGLU's silu(gate) * up); head_dim absent, null or
 * hidden_size / num_attention_heads (gpipe's heads are that wide); and no
 * sliding window (Mistral's sliding_window, Qwen2's under
 * use_sliding_window) shorter than T, the longest sequence the model
 * attends over (within T a window of T or more masks nothing).  An error
 * naming the file, the key, its value and what gpipe builds. */
gp_status gp_hf_llama_supported(const gp_hf_config *c, int64_t T);

#endif
