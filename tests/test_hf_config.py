#!/usr/bin/python3
"""test_hf_config.py — a Hugging Face folder's config.json is read in one
place and every problem in it is an error naming the file, never
LlamaConfig's defaults (issue 77, items 1, 2, 4, 5 and 7's duplicate keys).

A YAML with `llama: {}` and model.init_from = a folder takes its sizes from
the folder's config.json.  For each broken config.json, gpipe-train
--dry-run (and, for the FIFO, gpipe-sample and gpipe-balance too) must:
finish within 20 s (a FIFO blocked every tool for ever before), exit
non-zero and not by a signal (num_attention_heads 0 died of SIGFPE), and
say on stderr the file's path and what is wrong (the key, or "not valid
JSON" with a line and column, or "not a regular file"), never build
LlamaConfig's Llama 2 7B (its 6.7 G parameters were the "plan" before).
Valid files must work: one larger than 1 MiB (a long id2label map, as
transformers loads), and a key given twice takes the last value (Python's
rule; gpipe took the first); the sizes the YAML gives still win over the
file's; a folder without config.json is an error only where the YAML
leaves a size out.  What the sizes do not show is refused by name too:
another model_type than llama, mistral or qwen2, a hidden_act other than
silu, a head_dim other than hidden_size / num_attention_heads, a sliding
window shorter than the sequence (Mistral's; Qwen2's under
use_sliding_window).

A key the file leaves out takes its model type's default, as transformers
takes it (type_defaults): LlamaConfig's, MistralConfig's or Qwen2Config's,
read from tests/data/hf_llama_defaults.json (scripts/hf_llama_defaults.py
made it with transformers, and it is checked against transformers itself
where build/hf-venv has it); each such key left out of a config.json of
each type builds that default (gpipe took LlamaConfig's for all three: a
Mistral without intermediate_size was 11008 wide, not 14336, one without
max_position_embeddings refused a 4096-token sequence), or is refused
naming it where that default does not fit (MistralConfig's 8 k/v heads
for 4 heads).  A Mistral file without sliding_window has a window of
MistralConfig's default; a Qwen2 one without use_sliding_window none.

Needs GPIPE_BINARY_DIR (set by CTest).  Prints "test_hf_config: N passed,
N failed" last.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from gpt_util import check, finish, hf_llama_default, hf_llama_defaults

BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(os.path.dirname(__file__), "..", "build"))
SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))

GOOD = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
        "vocab_size": 256, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "rope_scaling": None}
# Parameters of GOOD's model: embedding 256 x 64 (tied head), per block two
# norms 2 x 64, q 64 x 64, k and v 2 x (64 x 32), o 64 x 64, gate, up
# 2 x (64 x 128), down 128 x 64; the final norm 64.
GOOD_PARAMS = 256 * 64 + 3 * (2 * 64 + 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 64


def run(tool, args, timeout=20):
    try:
        r = subprocess.run([os.path.join(BIN, tool)] + args, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %d s" % timeout


def yaml(d, folder, llama="{}", t=16):
    p = os.path.join(d, "c.yaml")
    with open(p, "w") as f:
        f.write("model:\n  input: [%d]\n  llama: %s\n  init_from: %s\n  loss: cross_entropy\n"
                "data: {dataset: tokens, path: %s}\ntrain: {steps: 1, batch_size: 4}\n"
                % (t, llama, folder, os.path.join(d, "tok")))
    return p


def refused(d, cfg, name, needles, tools=("gpipe-train",)):
    for tool in tools:
        args = {"gpipe-train": [cfg, "--dry-run"], "gpipe-sample": [cfg, "--prompt-ids", "1,2"],
                "gpipe-balance": [cfg]}[tool]
        rc, out, err = run(tool, args)
        check(rc is not None, "%s, %s: finishes (%s)" % (name, tool, err))
        if rc is None:
            continue
        check(rc > 0, "%s, %s: exits non-zero, not by a signal: rc %s %r" % (name, tool, rc,
                                                                                err[-300:]))
        for n in needles:
            check(n in err, "%s, %s: the error says %r: %r" % (name, tool, n, err[-500:]))
        check("6738415616" not in out and "6.7 G" not in out,
              "%s, %s: no Llama 2 7B plan" % (name, tool))


def params_of(out):
    for line in out.splitlines():
        if line.startswith("total:"):
            return int(line.split()[1])
    return None


def llama_params(v, c, layers, heads, kv, inter, tied, qkv_bias):
    """model.llama's parameter count: embedding, per block two norms, q, k, v (their
    biases: Qwen2's), o and the MLP, the final norm, the head where untied (test_llama.c's
    closed form)."""
    kvw = c // heads * kv
    return (v * c + layers * (2 * c + c * c + 2 * c * kvw + c * c + 3 * c * inter +
                              ((c + 2 * kvw) if qkv_bias else 0)) + c + (0 if tied else v * c))


def notes(text):
    """--dry-run -v's "model.llama.KEY = VALUE (WHERE)" lines: {KEY: (VALUE, WHERE)}."""
    out = {}
    for m in re.finditer(r"^model\.llama\.(\w+) = (\S+) \((.*)\)$", text, re.M):
        out[m.group(1)] = (m.group(2), m.group(3))
    return out


def same(a, b):
    if isinstance(b, bool):
        return a == ("true" if b else "false")
    try:
        return abs(float(a) - b) <= 1e-6 * abs(b)
    except ValueError:
        return False


# model.llama's keys, the config.json keys they come from, and what the file
# must also say for the type's default to build (MistralConfig's 8 k/v heads
# need heads they divide); hidden_size is refused left out (4096 / 4 heads
# are 1024 wide: test_hf_folder.py checks that one against the loader)
TYPE_KEYS = (("layers", "num_hidden_layers", {}), ("heads", "num_attention_heads", {}),
             ("kv_heads", "num_key_value_heads", {"num_attention_heads": 32}),
             ("intermediate", "intermediate_size", {}), ("vocab", "vocab_size", {}),
             ("positions", "max_position_embeddings", {}), ("rope_theta", "rope_theta", {}),
             ("rms_eps", "rms_norm_eps", {}), ("tie", "tie_word_embeddings", {}))


def type_defaults(d, folder, put):
    """Each key config.json leaves out takes its model type's default, as transformers
    takes it, not LlamaConfig's for all three."""
    cj = os.path.join(folder, "config.json")
    defaults = hf_llama_defaults(SRC, BIN, check, "test_hf_config")
    cfg = yaml(d, folder)
    for t in ("llama", "mistral", "qwen2"):
        cls = defaults[t]["config_class"]
        for key, jkey, extra in TYPE_KEYS:
            c = dict(GOOD, model_type=t, **extra)
            del c[jkey]
            put(json.dumps(c))
            want = hf_llama_default(defaults, t, jkey, c)
            rc, out, err = run("gpipe-train", [cfg, "--dry-run", "-v"])
            got = notes(out + err).get(key, ("?", ""))
            where = ("%s: tie_word_embeddings" % cj if key == "tie"
                     else "%s's default: %s has no %s" % (cls, cj, jkey))
            check(rc == 0 and same(got[0], want) and got[1] == where,
                  "model_type %s without %s: model.llama.%s = %r (%s), want %r (%s): rc %s %r"
                  % (t, jkey, key, got[0], got[1], want, where, rc, err[-300:]))
            v = {"layers": c.get("num_hidden_layers"), "heads": c.get("num_attention_heads"),
                 "kv_heads": c.get("num_key_value_heads"), "vocab": c.get("vocab_size"),
                 "intermediate": c.get("intermediate_size"), "tie": c.get("tie_word_embeddings")}
            if key in v:
                v[key] = want
                n = llama_params(v["vocab"], GOOD["hidden_size"], v["layers"], v["heads"],
                                 v["kv_heads"], v["intermediate"], v["tie"], t == "qwen2")
                check(params_of(out) == n, "model_type %s without %s: %d parameters: %r"
                      % (t, jkey, n, params_of(out)))
    # a default that does not fit is refused naming it: MistralConfig's and
    # Qwen2Config's k/v heads do not divide 4 heads (transformers builds no
    # such model either); LlamaConfig's are the 4 heads
    for t in ("mistral", "qwen2"):
        c = dict(GOOD, model_type=t)
        del c["num_key_value_heads"]
        put(json.dumps(c))
        want = hf_llama_default(defaults, t, "num_key_value_heads", c)
        refused(d, cfg, "model_type %s without num_key_value_heads" % t,
                ["kv_heads = %d (%s's default num_key_value_heads" %
                 (want, defaults[t]["config_class"]), "heads = 4"])
    # every size in the YAML, over a Mistral's or Qwen2's file: the YAML's (the
    # key table's LlamaConfig defaults are still the getters', never a
    # model type's: a getter called with another default aborts)
    every = ("{layers: 3, heads: 4, kv_heads: 2, width: 64, intermediate: 128, vocab: 256, "
             "positions: 64, rope_theta: 10000, rms_eps: 1e-5, tie: true, qkv_bias: false}")
    for t in ("mistral", "qwen2"):
        put(json.dumps(dict(GOOD, model_type=t)))
        rc, out, err = run("gpipe-train", [yaml(d, folder, every), "--dry-run"])
        check(rc == 0 and params_of(out) == GOOD_PARAMS,
              "model_type %s, every size in the YAML: plans the YAML's model: rc %s %r %r"
              % (t, rc, params_of(out), err[-300:]))
    # the sequence against the type's max_position_embeddings and sliding
    # window, neither in the file: Mistral's window is MistralConfig's
    # default, Qwen2's is off without use_sliding_window
    mw = defaults["mistral"]["sliding_window"]
    lp = defaults["llama"]["max_position_embeddings"]
    base = {k: v for k, v in GOOD.items() if k != "max_position_embeddings"}
    for t, length, ok, needles in (
            ("llama", lp + 1, False, ["positions = %d (max_position_embeddings)" % lp]),
            ("mistral", lp + 1, True, []),
            ("mistral", mw, True, []),
            ("mistral", mw + 1, False, ["sliding_window = %d (absent: MistralConfig's default)"
                                        % mw, "at most %d" % mw]),
            ("qwen2", mw + 1, True, [])):
        put(json.dumps(dict(base, model_type=t)))
        long_cfg = yaml(d, folder, t=length)
        name = "model_type %s, neither max_position_embeddings nor sliding_window, T %d" % (
            t, length)
        if ok:
            rc, out, err = run("gpipe-train", [long_cfg, "--dry-run"])
            check(rc == 0, "%s: plans: rc %s %r" % (name, rc, err[-300:]))
        else:
            refused(d, long_cfg, name, needles)
    yaml(d, folder)


def main():
    d = tempfile.mkdtemp(prefix="gpipe_hfcfg_")
    try:
        folder = os.path.join(d, "D")
        os.mkdir(folder)
        cj = os.path.join(folder, "config.json")
        cfg = yaml(d, folder)

        def put(text, mode="w"):
            if os.path.lexists(cj):
                if os.path.isdir(cj) and not os.path.islink(cj):
                    os.rmdir(cj)
                else:
                    os.remove(cj)
            with open(cj, mode) as f:
                f.write(text)

        good = json.dumps(GOOD)
        put(good)
        rc, out, err = run("gpipe-train", [cfg, "--dry-run", "-v"])
        check(rc == 0, "the good folder plans: rc %s %r" % (rc, err[-400:]))
        check(params_of(out) == GOOD_PARAMS,
              "the good folder's model has %d parameters: %r" % (GOOD_PARAMS, params_of(out)))
        check("model.llama.layers = 3 (%s: num_hidden_layers)" % cj in out + err,
              "-v says where layers came from")
        check("model.llama.rope_scaling = none (%s: rope_scaling null or absent)" % cj
              in out + err and "model.llama.heads = 4 (default)" not in out + err,
              "-v lists rope_scaling and marks no size from the file as a default (item 22)")

        # a folder that leaves tie_word_embeddings out is untied, as
        # transformers' LlamaConfig (and Qwen2Config) take it: its own
        # head's 256 x 64 more parameters (gpipe took PretrainedConfig's true)
        put(json.dumps({k: v for k, v in GOOD.items() if k != "tie_word_embeddings"}))
        rc, out, err = run("gpipe-train", [cfg, "--dry-run", "-v"])
        check(rc == 0 and params_of(out) == GOOD_PARAMS + 256 * 64 and
              "model.llama.tie = false (%s: tie_word_embeddings)" % cj in out + err,
              "no tie_word_embeddings: untied, %r parameters: %r" % (params_of(out), err[-300:]))

        # the architecture the sizes do not show: another family, activation,
        # head width or a sliding window within the 16 positions is refused
        # naming the key and its value (each loaded and gave another loss, or
        # a shape error about q_proj); what model.llama builds plans
        for edit, needles in (({"hidden_act": "gelu"}, ["hidden_act = 'gelu'", "silu"]),
                              ({"model_type": "gemma"},
                               ["model_type = 'gemma'", "llama, mistral or qwen2"]),
                              ({"model_type": 7}, ["model_type is a number; it must be a string"]),
                              ({"head_dim": 32}, ["head_dim = 32", "64 / 4"]),
                              ({"model_type": "mistral", "sliding_window": 8},
                               ["sliding_window = 8", "16 long"]),
                              ({"model_type": "qwen2", "use_sliding_window": True,
                                "sliding_window": 4}, ["sliding_window = 4", "use_sliding_window"])):
            c = dict(GOOD)
            c.update(edit)
            put(json.dumps(c))
            refused(d, cfg, "%r" % edit, [cj] + needles)
        for edit in ({"hidden_act": "silu", "head_dim": 16, "model_type": "llama"},
                     {"model_type": "mistral", "sliding_window": 16},
                     {"model_type": "mistral", "sliding_window": None},
                     {"model_type": "mistral"},  # (MistralConfig's 4096)
                     {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 4},
                     {"model_type": "llama", "sliding_window": 4}):  # (LlamaConfig has none)
            c = dict(GOOD)
            c.update(edit)
            put(json.dumps(c))
            rc, out, err = run("gpipe-train", [cfg, "--dry-run"])
            check(rc == 0, "%r plans: rc %s %r" % (edit, rc, err[-300:]))
        type_defaults(d, folder, put)
        put(good)

        # (1) hangs and crashes: a FIFO in every tool; num_attention_heads 0
        os.remove(cj)
        os.mkfifo(cj)
        refused(d, cfg, "a FIFO", [cj, "not a regular file"],
                tools=("gpipe-train", "gpipe-sample", "gpipe-balance"))
        os.remove(cj)
        # (2), (5) every value checked, naming the file and the key
        for key, val, needle in (("num_attention_heads", 0, "out of range"),
                                 ("hidden_size", "32", "is a string"),
                                 ("hidden_size", None, "is null"),
                                 ("num_hidden_layers", -2, "out of range"),
                                 ("num_hidden_layers", 2.5, "whole number"),
                                 ("vocab_size", 0, "out of range"),
                                 ("rope_theta", 0, "out of range"),
                                 ("rms_norm_eps", -1e-5, "out of range"),
                                 ("max_position_embeddings", 1e20, "out of range"),
                                 ("tie_word_embeddings", "yes", "true or false")):
            c = dict(GOOD)
            c[key] = val
            put(json.dumps(c))
            refused(d, cfg, "%s = %r" % (key, val), [cj + ":1:", key, needle])
        # (4) not JSON, not an object, not a file
        for name, text, needle in (("a trailing comma", good[:-1] + ",}", "not valid JSON"),
                                   ("NaN", good.replace("10000.0", "NaN"), "not valid JSON"),
                                   ("Infinity", good.replace("10000.0", "Infinity"),
                                    "not valid JSON"),
                                   ("a number past double", good.replace("10000.0", "1e999"),
                                    "not valid JSON"),
                                   ("nested too deep", good[:-1] + ', "x": ' + "[" * 200 +
                                    "]" * 200 + "}", "not valid JSON"),
                                   ("an array", "[1, 2]", "not a JSON object"),
                                   ("empty", "", "not valid JSON")):
            put(text)
            refused(d, cfg, name, [cj, needle])
        put(b"\xef\xbb\xbf" + good.encode(), "wb")
        refused(d, cfg, "a BOM", [cj, "byte-order mark"])
        put(good.encode("utf-16"), "wb")
        refused(d, cfg, "UTF-16", [cj, "UTF-16"])
        os.remove(cj)
        os.mkdir(cj)
        refused(d, cfg, "a folder", [cj, "not a regular file"])
        os.rmdir(cj)
        os.symlink("/dev/zero", cj)
        refused(d, cfg, "/dev/zero", [cj, "not a regular file"])
        os.remove(cj)
        refused(d, cfg, "no config.json", [folder, "has no config.json", "layers"])
        # a folder that is not there, with the sizes left to it (issue 77 item 18)
        gone = yaml(d, os.path.join(d, "gone"))
        refused(d, gone, "a missing folder", [os.path.join(d, "gone"), "cannot be read (No such file",
                                             "layers"])
        cfg = yaml(d, folder)
        # ... which the YAML's sizes make no error (the tensors are checked as they load)
        full = yaml(d, folder, "{layers: 3, heads: 4, kv_heads: 2, width: 64, intermediate: "
                    "128, vocab: 256, positions: 64, tie: true}")
        rc, out, err = run("gpipe-train", [full, "--dry-run"])
        check(rc == 0, "no config.json, every size in the YAML: plans: rc %s %r" % (rc, err[-300:]))
        check(params_of(out) == GOOD_PARAMS, "... the YAML's model")
        # valid and larger than 1 MiB (transformers loads it)
        c = dict(GOOD)
        c["id2label"] = {str(i): "label_%d" % i for i in range(80000)}
        put(json.dumps(c))
        check(os.path.getsize(cj) > (1 << 20), "the big file is over 1 MiB")
        cfg = yaml(d, folder)
        rc, out, err = run("gpipe-train", [cfg, "--dry-run"])
        check(rc == 0 and params_of(out) == GOOD_PARAMS,
              "a valid 1.6 MB config.json is read: rc %s, %r %r" % (rc, params_of(out), err[-300:]))
        # (7) a key given twice: the last, as Python's json takes it
        put(good.replace('"num_hidden_layers": 3', '"num_hidden_layers": 2, "num_hidden_layers": 3'))
        rc, out, err = run("gpipe-train", [cfg, "--dry-run"])
        check(rc == 0 and params_of(out) == GOOD_PARAMS,
              "a key given twice takes the last value: %r" % params_of(out))
        put(good.replace('"num_hidden_layers": 3', '"num_hidden_layers": 3, "num_hidden_layers": 0'))
        refused(d, cfg, "a key given twice, the last bad", [cj, "num_hidden_layers"])
        # the YAML's size wins over the file's, and a bad file value it replaces is not read
        c = dict(GOOD)
        c["num_attention_heads"] = 0
        put(json.dumps(c))
        over = yaml(d, folder, "{heads: 4, kv_heads: 2}")
        rc, out, err = run("gpipe-train", [over, "--dry-run"])
        check(rc == 0 and params_of(out) == GOOD_PARAMS,
              "the YAML's heads replace the file's bad one: rc %s %r" % (rc, err[-300:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(finish("test_hf_config"))


if __name__ == "__main__":
    main()
