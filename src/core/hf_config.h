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

/* The defaults transformers applies where a Llama-family folder's
 * config.json leaves a key out: its model type's own config class's
 * (LlamaConfig, MistralConfig, Qwen2Config: transformers 4.44.2, the parity
 * reference; 5.x has the same numbers), not LlamaConfig's for all three (a
 * Mistral folder without intermediate_size is 14336 wide, not 11008).  The
 * config parser's model.llama defaults (LlamaConfig's where there is no
 * config.json) and the weights loader's comparison both take them from
 * here, so a key left out means the same to both.  tie_word_embeddings is
 * false for all three, not PretrainedConfig's true; num_key_value_heads
 * null is as many as num_attention_heads for all three, but absent it is
 * MistralConfig's 8 and Qwen2Config's 32. */
typedef struct gp_hf_llama_defaults {
    const char *model_type;   /* "llama", "mistral", "qwen2" */
    const char *config_class; /* "LlamaConfig"...: for messages */
    int64_t layers;           /* num_hidden_layers */
    int64_t heads;            /* num_attention_heads */
    int64_t kv_heads;         /* num_key_value_heads absent (0: as many as the heads) */
    int64_t width;            /* hidden_size */
    int64_t intermediate;     /* intermediate_size */
    int64_t vocab;            /* vocab_size */
    int64_t positions;        /* max_position_embeddings */
    double rope_theta;        /* rope_theta */
    double rms_eps;           /* rms_norm_eps */
    bool tie;                 /* tie_word_embeddings */
    int64_t window;           /* sliding_window absent (0: the type has no sliding window) */
    const char *window_switch; /* the key that turns it on, default off (Qwen2's
                                  use_sliding_window); NULL: on unless sliding_window is
                                  null (Mistral's) */
} gp_hf_llama_defaults;

/* The defaults of c's model_type (c NULL, or a file without model_type
 * or with another type, which gp_hf_llama_supported refuses: LlamaConfig's).
 * Static storage; thread-safe. */
const gp_hf_llama_defaults *gp_hf_llama_defaults_of(const gp_hf_config *c);

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
