#!/usr/bin/python3
"""test_llama_hf.py — issue 66's transformers parity bar: a Hugging Face
Llama folder read by model.init_from gives transformers' own loss.

Hugging Face transformers (PyPI's 4.44.2 in a venv over Debian's torch 1.13,
made here by gpt_util.ensure_libs where it is not importable; the test
skips, saying why, only where PyPI cannot be reached) makes a small random
LlamaForCausalLM with grouped-query attention (4 query heads over 2 k/v
heads) and Llama 3's rope scaling (factor 8, original 16 positions, so
all three bands of wavelength occur), its norms' weights random too, and
save_pretrained writes it: once whole (model.safetensors, FP32, tied head),
once sharded (model-0000k-of-0000n.safetensors with the index, BF16,
untied head), and once tied in FP32 as an untied model's start (no
lm_head.weight: the head starts as the embedding).  On a token file written
here (windows of T + 1 = 17):

1. parity: gpipe-train (model.llama of the folder's sizes, model.init_from
   = the folder, SGD at lr 0 for one step) reports the first batch's loss
   within 1e-5 relative of transformers' mean cross-entropy over the same
   windows (the folder read by from_pretrained in FP32), on 1 device and on
   2 CPU stages;
2. the folder out: 20 AdamW steps in gpipe from the whole (tied) or the
   sharded (untied) folder, then
   --export-weights DIR --export-format hf (tied, one file; untied, in
   shards with the index): LlamaForCausalLM.from_pretrained loads the
   folder as it is, and its loss on the validation windows is gpipe's final
   test loss within 1e-5 relative; the folder read back by model.init_from
   gives that loss again; --export-format hf-bf16 writes the same folder
   with BF16 tensors (torch_dtype bfloat16, about half the bytes), whose
   from_pretrained loss is gpipe's on it within 1e-5 and the FP32
   export's within 2e-2;
3. greedy continuations: gpipe-sample from each folder (model.input
   raised to 64 positions) continues a 5-token prompt for 50 tokens at
   temperature 0 with the KV cache and with the window (--no-cache), on 1
   device and on 2 stages, with exactly the ids of transformers' greedy
   argmax over the same folder in FP32;
4. sizes from config.json: a YAML whose model.llama gives none of the
   folder's sizes (`llama: {}`) takes them all from its config.json (heads,
   k/v heads, width, intermediate, vocabulary, positions, rope_theta, Llama
   3's rope_scaling, rms_eps, the tie) and gives the parity loss again;
   one given in the YAML still wins, and a wrong one is refused;
5. Qwen2 (issue 77): a Qwen2ForCausalLM folder under `llama: {}` takes its
   q, k, v biases from model_type, gives transformers' loss, and exports a
   folder that AutoModelForCausalLM loads as Qwen2ForCausalLM at that loss;
6. a key config.json leaves out is its model type's default, as
   transformers' own classes take it (issue hfdef: gpipe took
   LlamaConfig's for Mistral and Qwen2 too): for each of llama, mistral
   and qwen2 and each key gpipe reads, the value `--dry-run -v` says
   model.llama takes is the one AutoConfig.from_pretrained reads from the
   same file, and the sequence is refused for a sliding window exactly
   where transformers has one shorter than it; a MistralForCausalLM and a
   Qwen2ForCausalLM whose num_key_value_heads, intermediate_size (Mistral),
   max_position_embeddings and sliding window are their classes' defaults,
   those keys taken out of config.json, load under `llama: {}` at
   transformers' loss (gpipe built 16 k/v heads for Mistral's 8 and refused
   the folder);
7. errors: config.json naming other sizes is refused with each difference
   and the model.llama key that sets it; a folder without one of the
   model's tensors, or with a tensor the model has no place for, is refused
   naming the tensor.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from gpt_util import check, ensure_libs, finish, write_tokens
from gpt_util import gpipe_greedy as gpipe_greedy_at
from gpt_util import hf_greedy
from gpt_util import hf_loss as hf_loss_of

SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
NAME = "test_llama_hf"

V, C, L, H, G, I, T, B = 61, 32, 2, 4, 2, 40, 16, 4
THETA, EPS = 500000.0, 1e-5


def hf_model(tie, seed):
    import torch
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=C, intermediate_size=I, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=G, max_position_embeddings=64,
        rms_norm_eps=EPS, rope_theta=THETA, tie_word_embeddings=tie,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        attn_implementation="eager")
    m = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.2)
    return m


def hf_loss(m, windows):
    return hf_loss_of(m, windows, T, V)


def dry_notes(d, yaml_text):
    """gpipe-train --dry-run -v on yaml_text: (exit, output, {model.llama key: value})."""
    import re
    cfgp = os.path.join(d, "dry.yaml")
    with open(cfgp, "w") as f:
        f.write(yaml_text)
    r = subprocess.run([os.path.join(BIN, "gpipe-train"), cfgp, "--dry-run", "-v"],
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    return r.returncode, out, dict(re.findall(r"^model\.llama\.(\w+) = (\S+) ", out, re.M))


def type_defaults(d, data, windows):
    """Each key a config.json of each model type leaves out: gpipe's value against
    transformers' AutoConfig reading the same file; then two folders transformers loads
    with such keys left out, at its loss (item 6)."""
    import torch
    import transformers
    folder = os.path.join(d, "types")
    os.makedirs(folder, exist_ok=True)
    base = {"hidden_size": 64, "num_attention_heads": 32, "num_key_value_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": True}
    ours = {"num_hidden_layers": "layers", "num_attention_heads": "heads",
            "num_key_value_heads": "kv_heads", "hidden_size": "width",
            "intermediate_size": "intermediate", "vocab_size": "vocab",
            "max_position_embeddings": "positions", "rope_theta": "rope_theta",
            "rms_norm_eps": "rms_eps", "tie_word_embeddings": "tie"}

    def yaml_for(t):
        return ("model:\n  input: [%d]\n  llama: {}\n  init_from: %s\n  loss: cross_entropy\n"
                "data: {dataset: tokens, path: %s}\ntrain: {steps: 1, batch_size: 4}\n"
                % (t, folder, data))

    def put(cfg):
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(cfg, f)
        return transformers.AutoConfig.from_pretrained(folder)

    for t in ("llama", "mistral", "qwen2"):
        for key, gkey in ours.items():
            c = dict(base, model_type=t)
            del c[key]
            want = getattr(put(c), key)
            rc, out, got = dry_notes(d, yaml_for(T))
            g = got.get(gkey)
            ok = (g == ("true" if want else "false") if isinstance(want, bool) else
                  g is not None and abs(float(g) - want) <= 1e-6 * abs(want))
            check(rc == 0 and ok, "model_type %s without %s: model.llama.%s = %s, transformers' "
                  "%r: exit %d %s" % (t, key, gkey, g, want, rc, out[-400:]))
        # the window: transformers' (None: none) against a sequence one past it
        c = {k: v for k, v in base.items() if k != "max_position_embeddings"}
        c.update(model_type=t, max_position_embeddings=1 << 16)
        window = getattr(put(c), "sliding_window", None)
        longer = (window or transformers.MistralConfig().sliding_window) + 1
        rc, out, _ = dry_notes(d, yaml_for(longer))
        check((rc == 0) == (window is None) and (window is None or "sliding_window = %d" % window
                                                 in out),
              "model_type %s without sliding_window or use_sliding_window: transformers' window "
              "%r, T %d: exit %d %s" % (t, window, longer, rc, out[-400:]))

    # folders transformers loads with those keys left out, at its loss: the
    # model made with the class's own defaults for them, under twice as many
    # query heads 2 wide (k/v heads: Mistral's 8 under 16, Qwen2's 32 under
    # 64; LlamaConfig's rule, as many as the heads, is another model)
    for t, cls, drop in (
            ("mistral", "Mistral", ("num_key_value_heads", "intermediate_size",
                                    "max_position_embeddings", "sliding_window")),
            ("qwen2", "Qwen2", ("num_key_value_heads", "max_position_embeddings",
                                "sliding_window", "use_sliding_window", "max_window_layers"))):
        cfg_cls = getattr(transformers, cls + "Config")
        kv = cfg_cls().num_key_value_heads
        kw = dict(vocab_size=V, num_hidden_layers=L, rms_norm_eps=EPS, rope_theta=THETA,
                  tie_word_embeddings=True, attn_implementation="eager",
                  num_attention_heads=2 * kv, hidden_size=4 * kv,
                  intermediate_size=I)
        for k in drop:  # (the rest: the class's defaults anyway)
            kw.pop(k, None)
        torch.manual_seed(5)
        m = getattr(transformers, cls + "ForCausalLM")(cfg_cls(**kw)).float().eval()
        with torch.no_grad():
            for pn, p in m.named_parameters():
                if pn.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                else:
                    p.normal_(0.0, 0.2)
        f = os.path.join(d, "%s-defaults" % t)
        m.save_pretrained(f, safe_serialization=True)
        with open(os.path.join(f, "config.json")) as fh:
            cj = json.load(fh)
        for k in drop:
            cj.pop(k, None)
        with open(os.path.join(f, "config.json"), "w") as fh:
            json.dump(cj, fh)
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            f, torch_dtype=torch.float32, attn_implementation="eager").eval()
        want = hf_loss(ref, windows)
        text = bare_config(data, f)
        rc, out, got = gpipe(d, text)
        check(rc == 0 and got is not None and abs(got - want) <= 1e-5 * abs(want),
              "a %s folder without %s under llama: {}: loss %s, transformers' %.8f (exit %d) %s"
              % (cls, ", ".join(drop), got, want, rc, out[-800:]))


def gpipe_greedy(d, yaml_text, prompt, n, extra=()):
    return gpipe_greedy_at(BIN, d, yaml_text, prompt, n, 64, extra)


def config(d, init, tie, devices, extra=""):
    devs = "[cpu:0]" if devices == 1 else "[cpu:0, cpu:1]"
    return "\n".join([
        "model:",
        "  input: [%d]" % T,
        "  llama: {layers: %d, heads: %d, kv_heads: %d, width: %d, intermediate: %d, vocab: %d,"
        % (L, H, G, C, I, V),
        "          positions: 64, rope_theta: %g, rms_eps: %g, tie: %s%s," % (
            THETA, EPS, "true" if tie else "false", extra),
        "          rope_scaling: {factor: 8, original_positions: 16}}",
        "  init_from: %s" % init,
        "pipeline: {devices: %s, chunks: 2}" % devs,
        "data: {dataset: tokens, path: %s, shuffle: false}" % d,
        "train: {steps: 1, batch_size: %d, seed: 1, eval_each_epoch: false," % B,
        "        optimizer: {type: sgd, lr: 0.0},",
        "        snapshot: {every_steps: 0, dir: %s/snaps}}" % d, ""])


def bare_config(d, init):
    """config()'s text (tied, one device) with `llama: {}`: every size from the
    folder's config.json."""
    text = config(d, init, True, 1)
    start, end = text.index("  llama: {"), text.index("  init_from:")
    return text[:start] + "  llama: {}\n" + text[end:]


def gpipe(d, yaml_text, args=(), env=None, final=False):
    """gpipe-train on yaml_text: (exit, output, the first step's loss, or
    with final the final evaluation's test loss)."""
    cfgp = os.path.join(d, "run.yaml")
    with open(cfgp, "w") as f:
        f.write(yaml_text)
    m = os.path.join(d, "m.jsonl")
    if os.path.exists(m):
        os.remove(m)
    r = subprocess.run([os.path.join(BIN, "gpipe-train"), cfgp, "--metrics", m, "-q",
                        "--no-progress"] + list(args), capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, **(env or {})))
    loss = None
    if r.returncode == 0:
        for line in open(m):
            rec = json.loads(line)
            if final and rec.get("eval") and rec.get("final"):
                loss = rec["test_loss"]
            if not final and "loss" in rec and not rec.get("eval"):
                loss = loss if loss is not None else rec["loss"]
    return r.returncode, r.stdout + r.stderr, loss


def main():
    ensure_libs(NAME, ["transformers", "safetensors"], os.path.join(BIN, "hf-venv"),
                ["transformers==4.44.2", "safetensors"], "GPIPE_HF_VENV")
    import random
    import torch
    import transformers
    print("%s: transformers %s, torch %s" % (NAME, transformers.__version__, torch.__version__))
    rnd = random.Random(3)
    toks = [rnd.randrange(V) for _ in range(8 * B * (T + 1))]
    windows = [toks[i * (T + 1):(i + 1) * (T + 1)] for i in range(B)]
    d = tempfile.mkdtemp(prefix="gpipe-llama-hf-")
    try:
        write_tokens(os.path.join(d, "t_train.bin"), toks)
        write_tokens(os.path.join(d, "t_val.bin"), toks[:4 * (T + 1)])
        data = os.path.join(d, "t_train.bin")
        cases = [  # (folder, HF model tied, saved as, gpipe model tied)
            ("whole-tied", True, dict(), True),
            ("sharded-untied-bf16", False, dict(max_shard_size="20KB"), False),
            ("tied-into-untied", True, dict(), False),
        ]
        for name, hf_tie, save, tie in cases:
            m = hf_model(hf_tie, seed=len(name))
            folder = os.path.join(d, name)
            if "bf16" in name:
                m = m.to(torch.bfloat16)
            m.save_pretrained(folder, safe_serialization=True, **save)
            # the reference: the folder as from_pretrained reads it, in FP32
            # (a bf16 model's weights widened as gpipe reads them, and its
            # rope frequencies computed again in FP32, as gpipe's are: the
            # model cast to bf16 holds them rounded)
            ref = transformers.LlamaForCausalLM.from_pretrained(
                folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
            want = hf_loss(ref, windows)
            shards = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
            if save:
                check(len(shards) > 1 and os.path.exists(
                    os.path.join(folder, "model.safetensors.index.json")),
                    "%s: save_pretrained made %d shard(s)" % (name, len(shards)))
            if name == "tied-into-untied":  # the config says tied; this model is not
                with open(os.path.join(folder, "config.json")) as f:
                    cj = json.load(f)
                cj["tie_word_embeddings"] = False
                with open(os.path.join(folder, "config.json"), "w") as f:
                    json.dump(cj, f)
            for devices in (1, 2):
                rc, out, got = gpipe(d, config(data, folder, tie, devices))
                ok = rc == 0 and got is not None and abs(got - want) <= 1e-5 * abs(want)
                check(ok, "%s on %d device(s): gpipe's loss %s, transformers' %.8f (exit %d) %s"
                      % (name, devices, got, want, rc, "" if rc == 0 else out[-1500:]))
                print("%s, %d device(s): gpipe %.8f, transformers %.8f" % (name, devices,
                                                                             got or 0.0, want))
            # greedy continuations, 50 tokens past a 5-token prompt
            prompt = toks[:5]
            want_ids = hf_greedy(ref, prompt, 50)
            for devices in (1, 2):
                for extra in ((), ("--no-cache",)):
                    got_ids, err = gpipe_greedy(d, config(data, folder, tie, devices), prompt,
                                                50, extra)
                    same = got_ids == want_ids
                    first = next((i for i in range(50) if got_ids and got_ids[i] != want_ids[i]),
                                 None)
                    check(same, "%s, %d device(s)%s: gpipe's 50 greedy ids are transformers' "
                          "(first difference at %s) %s" % (name, devices, " " + extra[0] if extra
                                                           else "", first, err))
            print("%s: 50 greedy ids as transformers', cache and window, 1 and 2 stages" % name)

        # the folder out: 20 AdamW steps, exported, loaded by from_pretrained
        val = [toks[i * (T + 1):(i + 1) * (T + 1)] for i in range(4)]
        for tie, shards in ((True, None), (False, "40000")):
            out_dir = os.path.join(d, "export-%s" % ("tied" if tie else "untied"))
            start = os.path.join(d, "whole-tied" if tie else "sharded-untied-bf16")
            # the fine-tune workflow (docs/language-models.md): a schedule, snapshots
            # kept, the folder written at the end
            y = config(data, start, tie, 2).replace(
                "train: {steps: 1,", "train: {steps: 20, eval_batch_size: 4,").replace(
                "optimizer: {type: sgd, lr: 0.0}",
                "optimizer: {type: adamw, lr: 0.01, weight_decay: 0.1},\n"
                "        schedule: {type: cosine, warmup_steps: 5, min_lr: 0.001}").replace(
                "snapshot: {every_steps: 0, dir: %s/snaps}" % data,
                "snapshot: {every_steps: 10, keep: 2, dir: %s/snaps-%s}" % (d, tie))
            rc, out, final = gpipe(d, y, ["--export-weights", out_dir, "--export-format", "hf"],
                                   env={"GPIPE_HF_SHARD_BYTES": shards} if shards else None,
                                   final=True)
            check(rc == 0 and final is not None, "20 steps and the export (%s): exit %d %s" % (
                "tied" if tie else "untied", rc, out[-1500:]))
            if rc != 0:
                continue
            snaps = sorted(os.listdir(os.path.join(d, "snaps-%s" % tie)))
            check([f for f in snaps if f.endswith(".safetensors")] ==
                  ["snapshot-000000010.safetensors", "snapshot-000000020.safetensors"],
                  "the fine-tune's snapshots: %s" % snaps)
            files = sorted(os.listdir(out_dir))
            check(("model.safetensors.index.json" in files) == (shards is not None) and
                  "config.json" in files, "the export's files: %s" % files)
            with open(os.path.join(out_dir, "config.json")) as f:
                cj = json.load(f)
            check(cj["tie_word_embeddings"] == tie and cj["num_key_value_heads"] == G and
                  cj["rope_scaling"]["rope_type"] == "llama3", "config.json: %s" % cj)
            back = transformers.LlamaForCausalLM.from_pretrained(
                out_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
            want = hf_loss(back, val)
            check(abs(final - want) <= 1e-5 * abs(want),
                  "exported (%s): from_pretrained's loss %.8f, gpipe's final test loss %.8f"
                  % ("tied" if tie else "untied", want, final))
            print("export %s: gpipe %.8f, transformers %.8f" % ("tied" if tie else "untied",
                                                                final, want))
            rc, out, again = gpipe(d, config(data, out_dir, tie, 1).replace(
                "train: {steps: 1,", "train: {steps: 1, eval_batch_size: 4,"), final=True)
            check(rc == 0 and again is not None and abs(again - final) <= 1e-6 * abs(final),
                  "the export read back: test loss %s, was %s (exit %d) %s" % (
                      again, final, rc, out[-800:]))
            # the same weights in bf16 (--export-format hf-bf16, converting the
            # run's last snapshot): BF16 tensors, torch_dtype bfloat16, and
            # from_pretrained's loss is gpipe's on the folder read back
            b16_dir = out_dir + "-bf16"
            snap = os.path.join(d, "snaps-%s" % tie, "snapshot-000000020.safetensors")
            with open(os.path.join(d, "conv.yaml"), "w") as f:
                f.write(y)
            r = subprocess.run([os.path.join(BIN, "gpipe-train"), os.path.join(d, "conv.yaml"),
                                "-q", "--resume", snap, "--convert", "--export-weights", b16_dir,
                                "--export-format", "hf-bf16"], capture_output=True, text=True,
                               timeout=300)
            rc, out = r.returncode, r.stdout + r.stderr
            check(rc == 0, "--export-format hf-bf16: exit %d %s" % (rc, out[-800:]))
            if rc == 0:
                from safetensors import safe_open
                shards = [f for f in os.listdir(b16_dir) if f.endswith(".safetensors")]
                dts = set()
                for f in shards:
                    with safe_open(os.path.join(b16_dir, f), "pt") as sf:
                        dts |= {str(sf.get_tensor(k).dtype) for k in sf.keys()}
                with open(os.path.join(b16_dir, "config.json")) as f:
                    cj = json.load(f)
                check(dts == {"torch.bfloat16"} and cj["torch_dtype"] == "bfloat16" and
                      sum(os.path.getsize(os.path.join(b16_dir, f)) for f in shards) <
                      0.55 * sum(os.path.getsize(os.path.join(out_dir, f))
                                 for f in os.listdir(out_dir) if f.endswith(".safetensors")),
                      "the bf16 folder: dtypes %s, torch_dtype %s" % (dts, cj["torch_dtype"]))
                b16 = transformers.LlamaForCausalLM.from_pretrained(
                    b16_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
                want16 = hf_loss(b16, val)
                rc, out, got16 = gpipe(d, config(data, b16_dir, tie, 1).replace(
                    "train: {steps: 1,", "train: {steps: 1, eval_batch_size: 4,"), final=True)
                check(rc == 0 and got16 is not None and abs(got16 - want16) <= 1e-5 * want16 and
                      abs(want16 - final) <= 2e-2 * final,
                      "bf16 export: from_pretrained %.8f, gpipe reading it %s, FP32's %.8f %s"
                      % (want16, got16, final, out[-400:]))

        # sizes from config.json where the YAML leaves them out
        folder = os.path.join(d, "whole-tied")
        ref = transformers.LlamaForCausalLM.from_pretrained(
            folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
        want = hf_loss(ref, windows)
        bare = bare_config(data, folder)
        rc, out, got = gpipe(d, bare)
        check(rc == 0 and got is not None and abs(got - want) <= 1e-5 * abs(want),
              "llama: {} with the folder's config.json: loss %s, transformers' %.8f (exit %d) %s"
              % (got, want, rc, out[-800:]))
        n_params = sum(p.numel() for p in ref.parameters())
        with open(os.path.join(d, "bare.yaml"), "w") as f:
            f.write(bare)
        r = subprocess.run([os.path.join(BIN, "gpipe-train"), os.path.join(d, "bare.yaml"),
                            "--dry-run"], capture_output=True, text=True, timeout=300)
        rc, out = r.returncode, r.stdout + r.stderr
        check(rc == 0 and "total: %d parameters" % n_params in out,
              "--dry-run of llama: {} counts transformers' %d parameters: exit %d %s"
              % (n_params, rc, out[-600:]))
        rc, out, _ = gpipe(d, bare.replace("llama: {}", "llama: {intermediate: %d}" % (I + 8)))
        check(rc != 0 and "intermediate_size 40 (this model: model.llama.intermediate 48)" in out,
              "a size given in the YAML wins, and is checked: exit %d: %s" % (rc, out[-800:]))

        # Qwen2 (issue 77 item 21): llama: {} takes q, k, v biases from the
        # folder's model_type, trains at transformers' loss, and exports a
        # Qwen2ForCausalLM folder that from_pretrained loads at that loss
        torch.manual_seed(11)
        qcfg = transformers.Qwen2Config(
            vocab_size=V, hidden_size=C, intermediate_size=I, num_hidden_layers=L,
            num_attention_heads=H, num_key_value_heads=G, max_position_embeddings=64,
            rms_norm_eps=EPS, rope_theta=THETA, tie_word_embeddings=True,
            attn_implementation="eager")
        qm = transformers.Qwen2ForCausalLM(qcfg).float().eval()
        with torch.no_grad():
            for pn, p in qm.named_parameters():
                if pn.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                else:
                    p.normal_(0.0, 0.2)
        qfolder = os.path.join(d, "qwen2")
        qm.save_pretrained(qfolder, safe_serialization=True)
        qref = transformers.Qwen2ForCausalLM.from_pretrained(
            qfolder, torch_dtype=torch.float32, attn_implementation="eager").eval()
        want = hf_loss(qref, windows)
        qbare = bare_config(data, qfolder)
        qout = os.path.join(d, "qwen2-out")
        rc, out, got = gpipe(d, qbare, ["--export-weights", qout, "--export-format", "hf"])
        check(rc == 0 and got is not None and abs(got - want) <= 1e-5 * abs(want),
              "a Qwen2 folder under llama: {}: loss %s, transformers' %.8f (exit %d) %s"
              % (got, want, rc, out[-800:]))
        if rc == 0:
            with open(os.path.join(qout, "config.json")) as f:
                cj = json.load(f)
            back = transformers.AutoModelForCausalLM.from_pretrained(
                qout, torch_dtype=torch.float32, attn_implementation="eager").eval()
            again = hf_loss(back, windows)
            check(cj["model_type"] == "qwen2" and type(back).__name__ == "Qwen2ForCausalLM" and
                  abs(again - want) <= 1e-5 * abs(want),
                  "the Qwen2 run's export: %s, %s, loss %.8f against %.8f"
                  % (cj["model_type"], type(back).__name__, again, want))

        type_defaults(d, data, windows)

        # errors: other sizes in config.json, a missing tensor, one too many
        rc, out, _ = gpipe(d, config(data, folder, True, 1).replace(
            "intermediate: %d" % I, "intermediate: %d" % (I + 8)))
        check(rc != 0 and "config.json does not describe this model" in out and
              "intermediate_size 40 (this model: model.llama.intermediate 48)" in out,
              "other sizes: exit %d: %s" % (rc, out[-800:]))
        bad = os.path.join(d, "bad")
        shutil.copytree(folder, bad)
        os.remove(os.path.join(bad, "config.json"))
        from safetensors.torch import load_file, save_file
        sd = load_file(os.path.join(bad, "model.safetensors"))
        del sd["model.layers.1.self_attn.k_proj.weight"]
        save_file(sd, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
        rc, out, _ = gpipe(d, config(data, bad, True, 1))
        check(rc != 0 and "has no tensor 'model.layers.1.self_attn.k_proj.weight'" in out,
              "a missing tensor: exit %d: %s" % (rc, out[-800:]))
        sd = load_file(os.path.join(folder, "model.safetensors"))
        sd["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2)
        save_file(sd, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
        rc, out, _ = gpipe(d, config(data, bad, True, 1))
        check(rc != 0 and "'model.layers.0.mlp.extra.weight', which this model has no place"
              in out, "an extra tensor: exit %d: %s" % (rc, out[-800:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return finish(NAME)


if __name__ == "__main__":
    sys.exit(main())
