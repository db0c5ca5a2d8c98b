#!/usr/bin/python3
"""test_hf_folder.py — a Hugging Face Llama folder whose tensors do not fit
the model is refused by name, as transformers refuses it (issue 77, items
6 and 7), outputs never replace a folder's files (item 13), and the
export's environment variable is checked (item 10).

A small untied Llama (2 blocks, 4 heads over 2 k/v heads of 8, width 32,
MLP 64, vocabulary 256) trains one step and is exported with
--export-format hf; the folder is then rewritten here (safetensors written
by hand, no torch) and given to model.init_from:

  6. q, k and v of 40, 12 and 12 rows instead of 32, 16 and 16, and gate
     and up of 60 and 68 instead of 64 and 64 (the stacked totals the
     same, which was all gpipe checked): refused, naming the tensor, its
     rows and the model's;
  7. the untied folder (an lm_head of its own), its config.json saying
     tie_word_embeddings true, under a tied model (model.llama.tie:
     true): refused, naming lm_head.weight and tie
     (gpipe dropped the head without a word; transformers keeps it); the
     same folder with lm_head.weight = the embedding's bits (a tied
     model's save that kept the copy) loads, and so does the untied model
     from the untied folder.

13. An output inside the input folder (gpipe-sample --weights D --out
    D/model.safetensors; gpipe-train --export-weights D/model.safetensors
    or --metrics there with model.init_from D; an hf export to D with
    model.init_from D/model.safetensors; a hard link of D's file) is
    refused and the folder left byte for byte; a file it is not made of
    (metrics.jsonl) may go there.
A NaN in k_proj.weight, and one in a GPT-2 file's c_attn.weight (a Conv1D
weight gpipe transposes), is named as the user's file has it: its tensor,
element and file, beside gpipe's own name (it named gpipe's qkv_proj, which
no file has, until 2026-12-01).
16. A run that fails while loading its weights leaves an existing --metrics
    file as it was (it was emptied).
17. An export past `ulimit -f` says "File too large" (the errno was
    dropped: "Input/output error").
14. An export replaces the folder as a whole: one file, then sharded,
    then one file again leaves each time that export's files only (a
    stale model.safetensors beside shards was loaded by transformers); an
    export that fails part way (ulimit -f) leaves the earlier one byte for
    byte and none of its own files.
19. A tensor in two shards is refused naming it and both shards.
23. The export's config.json keeps what the source folder's said that
    gpipe does not decide (bos_token_id 254 came back as 1), and a
    generation_config.json is written: the source's as it was, else one
    with the token ids.
18. A run's snapshots resume (gpipe-train and gpipe-sample --resume) once
    its model.init_from folder is gone (gpipe-sample loaded the folder
    before the snapshot replaced it), also where model.llama: {} took
    every size from the folder's config.json: the snapshot keeps that
    file, and an export made then keeps its keys.
3. `--convert` of a Llama whose weights are 1.5 times the machine's memory
    is refused before it builds the model, as a run's start-up is.
10. Environment variables are read as options are: GPIPE_HF_SHARD_BYTES=-5
    and ='20 kB' are refused naming the variable (-5 was taken), =20kB is
    20,000 bytes (it was read as 20: fewer shards than =20 gives),
    GPIPE_TEST_FAIL_STEP=1x is refused, and so is any GPIPE_* switch set to
    a word it does not take (GPIPE_FUSE_GELU=no, GPIPE_CPU_CONV=blockd,
    GPIPE_LOG=verbose) or a number out of range (GPIPE_CPU_COPY_DELAY_US=-4).

config.json is read as transformers reads it (config_json, config_types,
config_arch, gpt_config): a key left out takes the model type's default
(tie_word_embeddings false for a Llama; a Mistral's intermediate_size
MistralConfig's 14336, not LlamaConfig's 11008: the defaults are
tests/data/hf_llama_defaults.json's, made with transformers and checked
against it where build/hf-venv has it), a missing or mistyped size is
named as such, and what model.llama and model.gpt do not build (another
model_type, activation, head_dim, a sliding window within the sequence,
GPT-2's layer-scaled attention) is refused by name, also where no YAML
names the folder (gpipe-sample --weights).  A killed export's temporary
is removed by the next export (export_leftovers).

Needs GPIPE_BINARY_DIR (set by CTest).  Prints "test_hf_folder: N passed,
N failed" last.
"""
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile

from gpt_util import check, finish, hf_llama_default, hf_llama_defaults

BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(os.path.dirname(__file__), "..", "build"))
SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
SIZES = "layers: 2, heads: 4, kv_heads: 2, width: 32, intermediate: 64, vocab: 256, positions: 16"


def yaml(d, name, tie, init=None):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write("model:\n  input: [16]\n  llama: {%s, tie: %s}\n%s  loss: cross_entropy\n"
                "data: {dataset: synthetic}\ntrain: {steps: 1, batch_size: 4, log_every: 1}\n"
                % (SIZES, "true" if tie else "false",
                   "  init_from: %s\n" % init if init else ""))
    return p


def gpipe(args, env=None):
    r = subprocess.run([os.path.join(BIN, "gpipe-train")] + args, capture_output=True, text=True, errors="replace",
                       timeout=120, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, **env) if env else None)
    return r.returncode, r.stderr


def st_read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", None)
    data = b[8 + n:]
    ts = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
          for k, v in h.items()}
    return ts, meta


def st_write(path, ts, meta):
    h, off, blobs = {}, 0, []
    for k, (dt, shape, raw) in ts.items():
        h[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    if meta:
        h["__metadata__"] = meta
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def resplit(ts, names, rows, cols):
    """The tensors `names` re-cut from their bytes in order into `rows`."""
    raw = b"".join(ts[n][2] for n in names)
    at = 0
    for n, r in zip(names, rows):
        ts[n] = (ts[n][0], [r, cols], raw[at:at + r * cols * 4])
        at += r * cols * 4


def config_variant(d, src, name, edit):
    """A copy of folder src whose config.json edit(dict) rewrote."""
    v = os.path.join(d, name)
    shutil.copytree(src, v)
    p = os.path.join(v, "config.json")
    c = json.load(open(p))
    edit(c)
    json.dump(c, open(p, "w"))
    return v


def config_json(d, src):
    """The folder's config.json against the model, as transformers reads it: a key left out
    takes LlamaConfig's default (tie_word_embeddings false: the untied folder without it
    loads; gpipe took true and refused it), and a missing or mistyped size is named as such
    (it read as -1: "vocab_size -1")."""
    v = config_variant(d, src, "notie", lambda c: c.pop("tie_word_embeddings"))
    rc, err = gpipe([yaml(d, "nt.yaml", False, v)])
    check(rc == 0, "a folder without tie_word_embeddings loads untied: rc %s %r" % (rc, err[-300:]))
    v = config_variant(d, src, "novocab", lambda c: c.pop("vocab_size"))
    rc, err = gpipe([yaml(d, "nv.yaml", False, v)])
    want = "vocab_size absent (transformers uses LlamaConfig's 32000; this model: " \
        "model.llama.vocab 256)"
    check(rc > 0 and want in err, "no vocab_size: %r: rc %s %r" % (want, rc, err[-400:]))
    v = config_variant(d, src, "strsize", lambda c: c.update(hidden_size="32"))
    rc, err = gpipe([yaml(d, "ss.yaml", False, v)])
    check(rc > 0 and "config.json:" in err and "hidden_size is a string" in err and "-1" not in err,
          "hidden_size \"32\" is named a string: rc %s %r" % (rc, err[-400:]))



def sample_weights(cfg, folder):
    """gpipe-sample --weights folder under cfg, a YAML that gives every size: the loader's
    check of its config.json against them."""
    r = subprocess.run([os.path.join(BIN, "gpipe-sample"), cfg,
                        "--weights", folder, "--prompt-ids", "1,2", "--tokens", "1"],
                       capture_output=True, text=True, errors="replace", timeout=120,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr


def config_types(d, src):
    """The loader compares a key config.json leaves out with its model type's default, as
    transformers takes it (it took LlamaConfig's for Mistral and Qwen2 too: a Mistral folder
    without num_key_value_heads was compared as 4 k/v heads, MistralConfig's are 8): the
    folder's model loads where that default is the model's, and is refused naming the key
    and the default where it is not."""
    defaults = hf_llama_defaults(SRC, BIN, check, "test_hf_folder")
    # (no q, k, v biases: the folder has none, though a Qwen2's would)
    cfg = os.path.join(d, "types.yaml")
    with open(cfg, "w") as f:
        f.write("model:\n  input: [16]\n  llama: {%s, tie: false, qkv_bias: false}\n"
                "  loss: cross_entropy\ndata: {dataset: synthetic}\n" % SIZES)
    base = json.load(open(os.path.join(src, "config.json")))
    base.pop("head_dim")  # (hidden_size / num_attention_heads, whatever the two are)
    for t in ("llama", "mistral", "qwen2"):
        cls = defaults[t]["config_class"]
        for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "hidden_size", "intermediate_size", "vocab_size", "rms_norm_eps",
                    "rope_theta", "tie_word_embeddings"):
            c = dict(base, model_type=t)
            del c[key]
            v = config_variant(d, src, "types_%s_%s" % (t, key),
                               lambda j, c=c: (j.clear(), j.update(c)))
            want, model = hf_llama_default(defaults, t, key, c), base[key]
            rc, err = sample_weights(cfg, v)
            if want == model:
                check(rc == 0, "model_type %s without %s (%s's %r, the model's): loads: rc %s %r"
                      % (t, key, cls, want, rc, err[-300:]))
            else:
                say = ("true" if want else "false") if isinstance(want, bool) else "%.10g" % want
                needle = "%s absent (transformers uses %s's %s; this model: " % (key, cls, say)
                check(rc > 0 and needle in err, "model_type %s without %s: refused naming %r: "
                      "rc %s %r" % (t, key, needle, rc, err[-400:]))
            shutil.rmtree(v)
        # num_key_value_heads null, not left out: as many as the heads for every type
        # (MistralConfig's 8 and Qwen2Config's 32 are for the key left out)
        c = dict(base, model_type=t, num_key_value_heads=None)
        v = config_variant(d, src, "types_%s_kvnull" % t, lambda j, c=c: (j.clear(), j.update(c)))
        rc, err = sample_weights(cfg, v)
        needle = "num_key_value_heads absent (transformers uses %s's %d; this model: " % (
            cls, base["num_attention_heads"])
        check(rc > 0 and needle in err, "model_type %s, num_key_value_heads null: refused naming "
              "%r: rc %s %r" % (t, needle, rc, err[-400:]))
        shutil.rmtree(v)


def rope_defaults(d, src):
    """A llama3 rope_scaling whose config.json leaves out high_freq_factor: the model built
    from the folder (llama: {}) and the loader's check of config.json take the same Llama 3
    value for it (4), so the folder loads."""
    v = config_variant(d, src, "rope_nohigh", lambda c: c.update(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 16}))
    y = os.path.join(d, "rope.yaml")
    with open(y, "w") as f:
        f.write("model:\n  input: [16]\n  llama: {}\n  init_from: %s\n  loss: cross_entropy\n"
                "data: {dataset: synthetic}\ntrain: {steps: 1, batch_size: 4}\n" % v)
    rc, err = gpipe([y])
    check(rc == 0, "llama3 rope_scaling without high_freq_factor loads (Llama 3's 4 on both "
          "sides): rc %s %r" % (rc, err[-400:]))


def config_arch(d, src):
    """What the sizes do not show, checked by the loader too, where no YAML names the folder
    (gpipe-sample --weights D): another family, activation, head width or a sliding window
    within the sequence is refused naming the key (each loaded and gave another loss, or a
    shape error about q_proj); test_hf_config.py has the parser's cases."""
    for name, edit, needle in (("gelu", {"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
                               ("gemma", {"model_type": "gemma"}, "model_type = 'gemma'"),
                               ("headdim", {"head_dim": 16}, "head_dim = 16"),
                               ("window", {"model_type": "mistral", "sliding_window": 8},
                                "sliding_window = 8")):
        v = config_variant(d, src, "arch_" + name, lambda c: c.update(edit))
        r = subprocess.run([os.path.join(BIN, "gpipe-sample"), yaml(d, "as.yaml", False),
                            "--weights", v, "--prompt-ids", "1,2", "--tokens", "1"],
                           capture_output=True, text=True, errors="replace", timeout=120)
        check(r.returncode > 0 and needle in r.stderr and "config.json" in r.stderr,
              "gpipe-sample --weights, %s: refused naming %r: rc %s %r"
              % (name, needle, r.returncode, r.stderr[-400:]))
    v = config_variant(d, src, "arch_ok", lambda c: c.update(model_type="mistral",
                                                             sliding_window=16, head_dim=8))
    rc, err = gpipe([yaml(d, "ao.yaml", False, v)])
    check(rc == 0, "a Mistral folder whose window spans the sequence loads: rc %s %r"
          % (rc, err[-300:]))


def gpt_config(d, g):
    """A GPT-2 folder's config.json is checked against the model as a Llama's is (only its
    model.safetensors was read: n_head 4 for 2, erf's GELU, layer-scaled attention loaded and
    gave another loss); a folder without one loads, checked by its tensors' shapes."""
    src = os.path.join(d, "gpt2_folder")
    rc, err = gpipe([g, "--export-weights", src, "--export-format", "hf"])
    check(rc == 0, "GPT-2 exports a folder: rc %s %r" % (rc, err[-300:]))
    if rc != 0:
        return
    for name, edit, needle in (
            ("heads", {"n_head": 4}, "n_head 4 (this model: model.gpt.heads 2)"),
            ("positions", {"n_positions": None}, "n_positions is null"),
            ("nopos", {"n_positions": "drop"},
             "n_positions absent (transformers uses 1024; this model: model.gpt.positions 16)"),
            ("gelu", {"activation_function": "gelu"}, "activation_function 'gelu'"),
            ("eps", {"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon 1e-06"),
            ("layerscale", {"scale_attn_by_inverse_layer_idx": True},
             "scale_attn_by_inverse_layer_idx is true"),
            ("noscale", {"scale_attn_weights": False}, "scale_attn_weights is false"),
            ("neo", {"model_type": "gpt_neo"}, "model_type 'gpt_neo'")):
        def apply(c, e=edit):
            for k, v in e.items():
                if v == "drop":
                    c.pop(k, None)
                else:
                    c[k] = v
        v = config_variant(d, src, "gpt_" + name, apply)
        rc, err = gpipe([g, "--set", "model.init_from=" + v])
        check(rc > 0 and needle in err and "config.json" in err,
              "GPT-2 folder, %s: refused naming %r: rc %s %r" % (name, needle, rc, err[-400:]))
    v = config_variant(d, src, "gpt_ok", lambda c: c.update(
        activation_function="gelu_pytorch_tanh", reorder_and_upcast_attn=True))
    rc, err = gpipe([g, "--set", "model.init_from=" + v])
    check(rc == 0, "GPT-2 folder with gelu_pytorch_tanh loads: rc %s %r" % (rc, err[-300:]))
    # layer_norm_epsilon left out: GPT2Config's 1e-5, the model's
    v2 = config_variant(d, src, "gpt_noeps", lambda c: c.pop("layer_norm_epsilon"))
    rc, err = gpipe([g, "--set", "model.init_from=" + v2])
    check(rc == 0, "GPT-2 folder without layer_norm_epsilon loads: rc %s %r" % (rc, err[-300:]))
    os.remove(os.path.join(v, "config.json"))
    rc, err = gpipe([g, "--set", "model.init_from=" + v])
    check(rc == 0, "GPT-2 folder without config.json loads: rc %s %r" % (rc, err[-300:]))


def export_leftovers(d):
    """A killed export's temporary (gp_atomic_open's ".<staged name>.tmp.PID", as large as the
    file) is removed by the next export where its process is gone; a live process's is left.
    (Its name starts "..gpipe-export.", which the staged files' prefix did not match: each
    killed export left one for good.)"""
    out = os.path.join(d, "leftovers")
    one = [yaml(d, "a.yaml", False), "--export-weights", out, "--export-format", "hf"]
    rc, err = gpipe(one)
    check(rc == 0, "an export to leftovers/: rc %s %r" % (rc, err[-300:]))
    p = subprocess.Popen(["true"])
    p.wait()
    dead = os.path.join(out, "..gpipe-export.model.safetensors.tmp.%d" % p.pid)
    live = os.path.join(out, "..gpipe-export.config.json.tmp.%d" % os.getpid())
    staged = os.path.join(out, ".gpipe-export.config.json")
    for f in (dead, live, staged):
        with open(f, "wb") as fh:
            fh.write(b"\0" * 4096)
    rc, err = gpipe(one)
    check(rc == 0 and not os.path.exists(dead) and not os.path.exists(staged),
          "the next export removes a dead export's temporary and staged file: rc %s, %s"
          % (rc, sorted(os.listdir(out))))
    check(os.path.exists(live), "... and leaves a running process's temporary")
    os.remove(live)


def main():
    d = tempfile.mkdtemp(prefix="gpipe_hffolder_")
    try:
        src = os.path.join(d, "untied")
        rc, err = gpipe([yaml(d, "a.yaml", False), "--export-weights", src, "--export-format",
                         "hf"])
        check(rc == 0 and os.path.exists(os.path.join(src, "model.safetensors")),
              "the untied model exports a folder: rc %s %r" % (rc, err[-300:]))
        st = os.path.join(src, "model.safetensors")
        ts, meta = st_read(st)
        check(ts["model.layers.0.self_attn.q_proj.weight"][1] == [32, 32] and
              ts["model.layers.0.self_attn.k_proj.weight"][1] == [16, 32],
              "the export's q and k are 32 and 16 rows")
        # hf-bf16 of the same run: each tensor the FP32 export's rounded to
        # nearest even (the embedding's 8192 values span two of the writer's
        # blocks of 4096)
        b16 = os.path.join(d, "untied-bf16")
        rc, err = gpipe([yaml(d, "a.yaml", False), "--export-weights", b16, "--export-format",
                         "hf-bf16"])
        check(rc == 0, "the untied model exports a bf16 folder: rc %s %r" % (rc, err[-300:]))
        if rc == 0:
            t16, _ = st_read(os.path.join(b16, "model.safetensors"))
            bad = []
            for k, (dt, shape, raw) in ts.items():
                u = struct.unpack("<%dI" % (len(raw) // 4), raw)
                want = struct.pack("<%dH" % len(u),
                                   *[(x + 0x7fff + ((x >> 16) & 1)) >> 16 for x in u])
                if k not in t16 or t16[k][:2] != ("BF16", shape) or t16[k][2] != want:
                    bad.append(k)
            check(not bad and len(t16) == len(ts),
                  "hf-bf16: the FP32 export's tensors rounded to nearest even; not %s" % bad[:3])
        rc, err = gpipe([yaml(d, "u.yaml", False, src)])
        check(rc == 0, "the untied model loads the untied folder: rc %s %r" % (rc, err[-300:]))
        config_json(d, src)
        config_types(d, src)
        rope_defaults(d, src)
        config_arch(d, src)
        export_leftovers(d)

        def variant(name, edit):
            v = os.path.join(d, name)
            shutil.copytree(src, v)
            t2 = dict(ts)
            edit(t2)
            st_write(os.path.join(v, "model.safetensors"), t2, meta)
            return v

        # 6: each tensor's own rows
        qkv = ["model.layers.1.self_attn.%s_proj.weight" % x for x in "qkv"]
        v = variant("qkv", lambda t: resplit(t, qkv, [40, 12, 12], 32))
        rc, err = gpipe([yaml(d, "q.yaml", False, v)])
        check(rc not in (0, None) and rc > 0, "q/k/v of 40/12/12 rows refused: rc %s" % rc)
        for needle in ("q_proj.weight", "40 rows", "takes 32"):
            check(needle in err, "the q/k/v error says %r: %r" % (needle, err[-400:]))
        # 16: a run that fails while loading its weights spares an existing metrics file
        kept = os.path.join(d, "kept.jsonl")
        with open(kept, "w") as f:
            f.write('{"step": 1, "loss": 5.5}\n')
        rc, err = gpipe([yaml(d, "q.yaml", False, v), "--metrics", kept])
        check(rc > 0 and open(kept).read() == '{"step": 1, "loss": 5.5}\n',
              "a run failing at its weights leaves --metrics as it was: rc %s %r"
              % (rc, open(kept).read()))
        # a k_proj of the rows this model takes but another width's columns
        # (16 x 31): refused as not stacking, not read into q/k/v's rows
        def narrow_k(t):
            dt, (r, c), raw = t[qkv[1]]
            t[qkv[1]] = (dt, [r, c - 1],
                         b"".join(raw[i * c * 4:(i * c + c - 1) * 4] for i in range(r)))
        v = variant("kcols", narrow_k)
        rc, err = gpipe([yaml(d, "k.yaml", False, v)])
        check(rc > 0 and "do not stack" in err and "k_proj.weight" in err,
              "a k_proj of 31 columns refused: rc %s %r" % (rc, err[-400:]))
        gu = ["model.layers.0.mlp.%s_proj.weight" % x for x in ("gate", "up")]
        v = variant("gateup", lambda t: resplit(t, gu, [60, 68], 32))
        rc, err = gpipe([yaml(d, "g.yaml", False, v)])
        check(rc > 0, "gate/up of 60/68 rows refused: rc %s" % rc)
        for needle in ("gate_proj.weight", "60 rows", "takes 64"):
            check(needle in err, "the gate/up error says %r: %r" % (needle, err[-400:]))

        # a NaN in k_proj is named as the folder has it (its tensor, element
        # and file), not as gpipe's stacked qkv_proj (element 16 x 32 + 5)
        def nan_at(t, name, e):
            dt, shape, raw = t[name]
            t[name] = (dt, shape, raw[:4 * e] + struct.pack("<f", float("nan")) +
                       raw[4 * e + 4:])
        k0 = "model.layers.0.self_attn.k_proj.weight"
        v = variant("nan", lambda t: nan_at(t, k0, 5))
        rc, err = gpipe([yaml(d, "n.yaml", False, v)])
        want = ("tensor '%s'[5] of %s/model.safetensors is NaN (gpipe's "
                "'model.layers.0.self_attn.qkv_proj.weight'[1029])" % (k0, v))
        check(rc > 0 and want in err, "a NaN in k_proj named in the folder's terms: rc %s %r"
              % (rc, err[-500:]))

        # and in a GPT-2's file, whose Conv1D weights gpipe transposes:
        # c_attn's element 5 (row 0, column 5 of [in, out]) is gpipe's 5 x 32
        g = os.path.join(d, "g.yaml")
        with open(g, "w") as f:
            f.write("model:\n  input: [16]\n  gpt: {layers: 1, heads: 2, width: 32, positions: "
                    "16, vocab: 64, tie: true}\n  loss: cross_entropy\ndata: {dataset: "
                    "synthetic}\ntrain: {steps: 1, batch_size: 4}\n")
        gst = os.path.join(d, "gpt2.safetensors")
        rc, err = gpipe([g, "--export-weights", gst, "--export-format", "hf"])
        ca = "transformer.h.0.attn.c_attn.weight"
        if rc == 0:
            gts, gmeta = st_read(gst)
            check(gts[ca][1] == [32, 96], "GPT-2's c_attn is [in, out]: %s" % gts[ca][1])
            nan_at(gts, ca, 5)
            # (as a file written elsewhere: no gpipe checksum to mismatch)
            st_write(gst, gts, {k: v for k, v in (gmeta or {}).items() if "crc" not in k})
            rc, err = gpipe([g, "--set", "model.init_from=" + gst])
        want = "tensor '%s'[5] of %s is NaN (gpipe's '%s'[160])" % (ca, gst, ca)
        check(rc > 0 and want in err, "a NaN in GPT-2's c_attn named as the file has it: rc %s "
              "%r" % (rc, err[-500:]))
        gpt_config(d, g)

        # 7: a tied model and a folder with its own head, whose config.json
        # says tied (else that check names tie_word_embeddings first)
        def tied_config(folder):
            p = os.path.join(folder, "config.json")
            c = json.load(open(p))
            c["tie_word_embeddings"] = True
            json.dump(c, open(p, "w"))
            return folder
        v = tied_config(variant("ownhead", lambda t: None))
        rc, err = gpipe([yaml(d, "t.yaml", True, v)])
        check(rc > 0, "a tied model refuses the untied folder: rc %s" % rc)
        for needle in ("lm_head.weight", "tie: false"):
            check(needle in err, "the tie error says %r: %r" % (needle, err[-400:]))

        def copy_head(t):
            e = t["model.embed_tokens.weight"]
            t["lm_head.weight"] = (e[0], list(e[1]), e[2])
        v = tied_config(variant("tiedcopy", copy_head))
        rc, err = gpipe([yaml(d, "tc.yaml", True, v)])
        check(rc == 0, "a tied model loads a folder whose lm_head is the embedding's copy: rc %s "
              "%r" % (rc, err[-300:]))

        # 13: an output inside an input folder, or a hard link of one of its
        # files, is refused and the input left byte for byte
        member = os.path.join(src, "model.safetensors")
        before = open(member, "rb").read()
        link = os.path.join(d, "hard.safetensors")
        os.link(member, link)
        r = subprocess.run([os.path.join(BIN, "gpipe-sample"), yaml(d, "s.yaml", False, src),
                            "--weights", src, "--out", member, "--prompt-ids", "1,2",
                            "--tokens", "2"], capture_output=True, text=True, errors="replace", timeout=120)
        check(r.returncode > 0 and "--out" in r.stderr and "replace" in r.stderr,
              "gpipe-sample --weights D --out D/model.safetensors refused: rc %s %r"
              % (r.returncode, r.stderr[-300:]))
        for name, args in (("--export-weights D/model.safetensors",
                            [yaml(d, "o.yaml", False, src), "--export-weights", member]),
                           ("init_from D/model.safetensors, --export-weights D (hf)",
                            [yaml(d, "o.yaml", False, member), "--export-weights", src,
                             "--export-format", "hf"]),
                           ("--export-weights a hard link of D's file",
                            [yaml(d, "o.yaml", False, src), "--export-weights", link]),
                           ("--metrics D/model.safetensors",
                            [yaml(d, "o.yaml", False, src), "--metrics", member])):
            rc, err = gpipe(args)
            check(rc > 0 and "replace what the run reads" in err,
                  "%s with model.init_from D refused: rc %s %r" % (name, rc, err[-300:]))
        check(open(member, "rb").read() == before, "the input folder's file is unchanged")
        os.remove(link)
        metrics = os.path.join(src, "metrics.jsonl")
        rc, err = gpipe([yaml(d, "m.yaml", False, src), "--metrics", metrics])
        check(rc == 0 and os.path.exists(metrics),
              "a file the folder is not made of (metrics.jsonl) may go in it: rc %s %r"
              % (rc, err[-300:]))
        os.remove(metrics)

        # 17: a write that fails says why (ulimit -f: "File too large")
        r = subprocess.run([os.path.join(BIN, "gpipe-train"), yaml(d, "a.yaml", False),
                            "--export-weights", os.path.join(d, "small"), "--export-format", "hf"],
                           capture_output=True, text=True, errors="replace", timeout=120,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                 (65536, 65536)))
        check(r.returncode > 0 and "File too large" in r.stderr and
              "Input/output error" not in r.stderr,
              "an export past ulimit -f names the reason: rc %s %r" % (r.returncode,
                                                                      r.stderr[-400:]))

        # 14: an export replaces the folder as a whole
        import hashlib

        def files(folder):
            return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest()
                    for f in sorted(os.listdir(folder))}
        out = os.path.join(d, "again")
        one = [yaml(d, "a.yaml", False), "--export-weights", out, "--export-format", "hf"]
        rc1, _ = gpipe(one)
        rc2, _ = gpipe(one, {"GPIPE_HF_SHARD_BYTES": "40kB"})
        sharded = sorted(files(out))
        rc3, _ = gpipe(one)
        single = sorted(files(out))
        check(rc1 == 0 and rc2 == 0 and rc3 == 0 and "model.safetensors" not in sharded and
              "model.safetensors.index.json" in sharded and
              single == ["config.json", "model.safetensors"],
              "one file, sharded, one file again: each export's files only: %r, then %r"
              % (sharded, single))
        before = files(out)
        r = subprocess.run([os.path.join(BIN, "gpipe-train")] + one, capture_output=True,
                           text=True, errors="replace", timeout=120,
                           env=dict(os.environ, GPIPE_HF_SHARD_BYTES="10kB"),
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                 (20000, 20000)))
        check(r.returncode > 0 and files(out) == before,
              "an export that fails part way leaves the earlier one whole, no file of its own "
              "left: rc %s, %r" % (r.returncode, sorted(files(out))))

        # 19: a tensor in two shards is named as such, with both shards
        sh = os.path.join(d, "dup")
        rc, _ = gpipe([yaml(d, "a.yaml", False), "--export-weights", sh, "--export-format",
                       "hf"], {"GPIPE_HF_SHARD_BYTES": "40kB"})
        parts = sorted(f for f in os.listdir(sh) if f.endswith(".safetensors")) if rc == 0 else []
        if len(parts) >= 2:
            t1, m1 = st_read(os.path.join(sh, parts[0]))
            t2, m2 = st_read(os.path.join(sh, parts[1]))
            name = sorted(t1)[0]
            t2[name] = t1[name]
            st_write(os.path.join(sh, parts[1]), t2, m2)
            rc, err = gpipe([yaml(d, "dup.yaml", False, sh)])
            check(rc > 0 and "is in two shards" in err and parts[0] in err and parts[1] in err
                  and name in err, "a tensor in two shards: rc %s %r" % (rc, err[-400:]))
        else:
            check(False, "the sharded export for the duplicate case: rc %s, %r" % (rc, parts))

        # 23: what the source's config.json says that gpipe does not decide survives
        src2 = os.path.join(d, "withids")
        shutil.copytree(src, src2)
        cj = os.path.join(src2, "config.json")
        c = json.load(open(cj))
        c.update({"bos_token_id": 254, "eos_token_id": 255, "pad_token_id": None,
                  "custom_field": {"a": [1, 2.5, None]}})
        json.dump(c, open(cj, "w"))
        # a float written with a capital E (1E3: 1000.0, not the integer 1000)
        text = open(cj).read()
        open(cj, "w").write(text.replace('"custom_field":', '"big": 1E3, "custom_field":', 1))
        out2 = os.path.join(d, "fromids")
        rc, err = gpipe([yaml(d, "i.yaml", False, src2), "--export-weights", out2,
                         "--export-format", "hf"])
        got = json.load(open(os.path.join(out2, "config.json"))) if rc == 0 else {}
        check(rc == 0 and got.get("bos_token_id") == 254 and got.get("eos_token_id") == 255 and
              "pad_token_id" in got and got.get("custom_field") == {"a": [1, 2.5, None]} and
              got.get("num_hidden_layers") == 2 and isinstance(got.get("big"), float) and
              got["big"] == 1000.0,
              "the export keeps the source's bos, eos, pad and other keys: rc %s %r %r"
              % (rc, got, err[-300:]))
        gen = os.path.join(out2, "generation_config.json")
        g = json.load(open(gen)) if os.path.exists(gen) else {}
        check(g.get("bos_token_id") == 254 and g.get("eos_token_id") == 255,
              "a generation_config.json with the token ids: %r" % g)
        text = open(os.path.join(out2, "config.json")).read() if rc == 0 else ""
        check(text.count('"initializer_range"') == 1,
              "no key twice in the exported config.json (initializer_range)")
        with open(os.path.join(src2, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 254, "eos_token_id": [255, 7], "do_sample": True,
                       "temperature": 1.0}, f)
        rc, err = gpipe([yaml(d, "i.yaml", False, src2), "--export-weights", out2,
                         "--export-format", "hf"])
        g = json.load(open(gen)) if os.path.exists(gen) else {}
        check(rc == 0 and g == {"bos_token_id": 254, "eos_token_id": [255, 7], "do_sample": True,
                                "temperature": 1.0} and isinstance(g["temperature"], float),
              "the source's generation_config.json goes through as it was (1.0 a float): %r"
              % g)
        # an export into a folder of snapshots converts one of them (only the
        # export's own names count as what it would replace)
        sd = os.path.join(d, "snapfolder")
        rc, err = gpipe([yaml(d, "sn.yaml", False), "--set",
                         "train.snapshot.every_steps=1", "--set",
                         "train.snapshot.dir=%s" % sd, "-q"])
        snaps = sorted(f for f in os.listdir(sd) if f.startswith("snapshot-")) if rc == 0 else []
        if snaps:
            rc, err = gpipe([yaml(d, "sn.yaml", False), "--resume", os.path.join(sd, snaps[-1]),
                             "--convert", "--export-weights", sd, "--export-format", "hf"])
            check(rc == 0 and os.path.exists(os.path.join(sd, "config.json")) and
                  os.path.exists(os.path.join(sd, snaps[-1])),
                  "--convert of a snapshot into its own folder: rc %s %r" % (rc, err[-300:]))
        else:
            check(False, "snapshots for the convert case: rc %s %r" % (rc, err[-300:]))

        # 18: a run's snapshots resume and sample once its init_from folder is gone
        moved = os.path.join(d, "moved")
        shutil.copytree(src, moved)
        ry = os.path.join(d, "r.yaml")
        with open(ry, "w") as f:
            f.write("model:\n  input: [16]\n  llama: {%s, tie: false}\n  init_from: %s\n"
                    "  loss: cross_entropy\ndata: {dataset: synthetic}\n"
                    "train: {steps: 2, batch_size: 4, snapshot: {every_steps: 2, dir: %s}}\n"
                    % (SIZES, moved, os.path.join(d, "rsnaps")))
        rc, err = gpipe([ry, "-q"])
        shutil.rmtree(moved)
        rc2, err2 = gpipe([ry, "--resume", "latest", "--set", "train.steps=4", "-q"])
        r = subprocess.run([os.path.join(BIN, "gpipe-sample"), ry, "--resume", "latest",
                            "--prompt-ids", "1,2", "--tokens", "2", "--ids"],
                           capture_output=True, text=True, errors="replace", timeout=120)
        check(rc == 0 and rc2 == 0 and r.returncode == 0 and len(r.stdout.split()) == 5,
              "init_from's folder gone: --resume and gpipe-sample --resume go on: rc %s %s %s "
              "%r %r" % (rc, rc2, r.returncode, err2[-300:], r.stderr[-300:]))

        # 18, sizes from the folder: llama: {} takes them from init_from's
        # config.json, which the snapshots keep (the run built LlamaConfig's
        # defaults, or stopped, once the folder was gone)
        moved2 = os.path.join(d, "moved2")
        shutil.copytree(src2, moved2)
        ey = os.path.join(d, "e.yaml")
        esnaps = os.path.join(d, "esnaps")
        with open(ey, "w") as f:
            f.write("model:\n  input: [16]\n  llama: {}\n  init_from: %s\n"
                    "  loss: cross_entropy\ndata: {dataset: synthetic}\n"
                    "train: {steps: 2, batch_size: 4, snapshot: {every_steps: 2, dir: %s}}\n"
                    % (moved2, esnaps))
        rc, err = gpipe([ey, "-q"])
        shutil.rmtree(moved2)
        rc0, err0 = gpipe([ey, "--set", "train.steps=4", "-q"])
        check(rc == 0 and rc0 > 0 and "moved2' cannot be read" in err0 and "--resume" in err0,
              "folder gone, no snapshot given: refused, saying a snapshot keeps its "
              "config.json: rc %s %s %r" % (rc, rc0, err0[-400:]))
        rc2, err2 = gpipe([ey, "--resume", "latest", "--set", "train.steps=4"])
        check(rc2 == 0 and "is gone" in err2 and "snapshot-000000002" in err2,
              "llama: {}, folder gone: --resume latest takes the sizes the snapshot keeps, "
              "saying so: rc %s %r" % (rc2, err2[-400:]))
        snap4 = os.path.join(esnaps, "snapshot-000000004.safetensors")
        rc3, err3 = gpipe(["--resume", snap4, "--set", "train.steps=6", "-q"])
        check(rc3 == 0, "--resume SNAPSHOT alone (no config), folder gone: rc %s %r"
              % (rc3, err3[-300:]))
        r = subprocess.run([os.path.join(BIN, "gpipe-sample"), ey, "--resume", snap4,
                            "--prompt-ids", "1,2", "--tokens", "2", "--ids"],
                           capture_output=True, text=True, errors="replace", timeout=120)
        check(r.returncode == 0 and len(r.stdout.split()) == 5,
              "gpipe-sample --resume, folder gone, sizes from the snapshot: rc %s %r %r"
              % (r.returncode, r.stdout, r.stderr[-300:]))
        out3 = os.path.join(d, "out3")
        rc4, err4 = gpipe([ey, "--resume", snap4, "--convert", "--export-weights", out3,
                           "--export-format", "hf", "-q"])
        got = json.load(open(os.path.join(out3, "config.json"))) if rc4 == 0 else {}
        check(rc4 == 0 and got.get("custom_field") == {"a": [1, 2.5, None]} and
              got.get("bos_token_id") == 254,
              "an export after the folder is gone keeps its config.json's keys (the copy the "
              "run kept): rc %s %r %r" % (rc4, got, err4[-300:]))

        # 3: --convert checks the memory before it builds the model: a Llama
        # whose weights are 1.5 times this machine's memory (no ulimit -v: the
        # sanitizers' shadow memory cannot live under one)
        ram = 0
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
        per_layer = 4 * (4 * 8192 * 8192 + 3 * 8192 * 28672)  # bytes of a block's weights
        layers = max(1, int(1.5 * ram / per_layer) + 1)
        huge = os.path.join(d, "huge.yaml")
        with open(huge, "w") as f:
            f.write("model:\n  input: [16]\n  llama: {layers: %d, heads: 64, width: 8192, "
                    "intermediate: 28672, vocab: 32000, positions: 64, tie: true}\n"
                    "  loss: cross_entropy\ndata: {dataset: synthetic}\n"
                    "train: {steps: 1, batch_size: 4}\n" % layers)
        import time
        t0 = time.time()
        r = subprocess.run([os.path.join(BIN, "gpipe-train"), huge, "--resume",
                            os.path.join(d, "nowhere.safetensors"), "--convert",
                            "--export-weights", os.path.join(d, "huge.safetensors")],
                           capture_output=True, text=True, errors="replace", timeout=120)
        check(r.returncode > 0 and "--convert holds the model's" in r.stderr and
              time.time() - t0 < 30,
              "--convert of a model past the machine's memory is refused before it is built: "
              "rc %s, %.1f s, %r" % (r.returncode, time.time() - t0, r.stderr[-300:]))

        # 10: environment variables checked as options
        def shards(val):
            out = os.path.join(d, "sh_" + val.replace("-", "m"))
            rc, err = gpipe([yaml(d, "a.yaml", False), "--export-weights", out,
                             "--export-format", "hf"], {"GPIPE_HF_SHARD_BYTES": val})
            n = len([f for f in os.listdir(out) if f.endswith(".safetensors")]) \
                if os.path.isdir(out) else 0
            return rc, err, n
        rc, err, _ = shards("-5")
        check(rc > 0 and "GPIPE_HF_SHARD_BYTES='-5'" in err,
              "GPIPE_HF_SHARD_BYTES=-5 refused, naming it: rc %s %r" % (rc, err[-300:]))
        rc, err, _ = shards("20 kB")
        check(rc > 0 and "GPIPE_HF_SHARD_BYTES" in err, "GPIPE_HF_SHARD_BYTES='20 kB' refused")
        rc1, err1, n_bytes = shards("20")
        rc2, err2, n_kb = shards("20kB")
        check(rc1 == 0 and rc2 == 0 and 1 < n_kb < n_bytes,
              "GPIPE_HF_SHARD_BYTES=20kB is 20,000 bytes, not 20: %d shards against 20's %d "
              "(%s %s)" % (n_kb, n_bytes, err1[-200:], err2[-200:]))
        # at 20 bytes every tensor is past the limit: each alone in a shard,
        # none empty (the first too), and the index names every shard
        if rc1 == 0:
            out20 = os.path.join(d, "sh_20")
            idx = json.load(open(os.path.join(out20, "model.safetensors.index.json")))
            files20 = sorted(f for f in os.listdir(out20) if f.endswith(".safetensors"))
            empty = [f for f in files20 if not st_read(os.path.join(out20, f))[0]]
            check(not empty and sorted(set(idx["weight_map"].values())) == files20,
                  "GPIPE_HF_SHARD_BYTES=20: no empty shard (%s), each in the index" % empty)
        for var, val, needle in (("GPIPE_FUSE_GELU", "no", "not one of 0, 1"),
                                 ("GPIPE_CPU_CONV", "blockd", "not one of auto, plain, blocked"),
                                 ("GPIPE_LOG", "verbose", "not one of debug"),
                                 ("GPIPE_CPU_COPY_DELAY_US", "-4", "not a whole number")):
            rc, err = gpipe([yaml(d, "a.yaml", False), "--dry-run"], {var: val})
            check(rc == 2 and "%s='%s'" % (var, val) in err and needle in err,
                  "%s=%s refused at start-up: rc %s %r" % (var, val, rc, err[-300:]))
        rc, err = gpipe([yaml(d, "a.yaml", False)], {"GPIPE_TEST_FAIL_STEP": "1x"})
        check(rc > 0 and "GPIPE_TEST_FAIL_STEP='1x'" in err,
              "GPIPE_TEST_FAIL_STEP=1x refused: rc %s %r" % (rc, err[-300:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(finish("test_hf_folder"))


if __name__ == "__main__":
    main()
