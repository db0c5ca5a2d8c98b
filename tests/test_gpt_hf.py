#!/usr/bin/python3
"""test_gpt_hf.py — GPT-2 against Hugging Face transformers' own
GPT2LMHeadModel, and GPT-2's Hugging Face folders both ways (issue 66,
point 3: "and, for GPT, GPT2LMHeadModel.from_pretrained loads it as it
is").

transformers (PyPI's 4.44.2 in build/hf-venv over Debian's torch 1.13,
made by gpt_util.ensure_libs where it is not importable; skipped, saying
why, only where PyPI cannot be reached) makes a small random
GPT2LMHeadModel (2 blocks, C 32, 4 heads, vocabulary 61, 64 positions,
weights normal(0, 0.2)), tied and untied, and save_pretrained writes its
folder.  On a token file written here (windows of T + 1 = 17):

1. parity: gpipe (model.gpt of those sizes, model.init_from = the folder
   itself) evaluates the validation windows to transformers' mean
   cross-entropy within 1e-5 relative, on 1 device and on 2 CPU stages;
2. greedy continuations: gpipe-sample (model.input raised to 64)
   continues a 5-token prompt for 50 tokens at temperature 0, with the KV
   cache and with the window (--no-cache), on 1 device and 2 stages, with
   exactly the ids of transformers' greedy argmax;
3. the folder out: 20 AdamW steps from each folder, then
   --export-weights DIR --export-format hf writes config.json and
   model.safetensors; config.json says the tie as the model has it (an
   untied head said untied: transformers' default would tie it and load
   the wrong head silently), and GPT2LMHeadModel.from_pretrained(DIR)
   gives gpipe's final test loss within 1e-5; an OUT ending in
   .safetensors is still the one file; --export-format hf-bf16 (a Llama's
   folder in bf16) is refused for a GPT-2 before any step.
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
NAME = "test_gpt_hf"

V, C, L, H, T, POS = 61, 32, 2, 4, 16, 64


def hf_model(tie, seed):
    import torch
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=POS, n_embd=C, n_layer=L, n_head=H,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  tie_word_embeddings=tie)
    m = transformers.GPT2LMHeadModel(cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".ln_" in name or "ln_f" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.2)
    return m


def hf_loss(m, windows):
    return hf_loss_of(m, windows, T, V)


def gpipe_greedy(d, yaml_text, prompt, n, extra=()):
    return gpipe_greedy_at(BIN, d, yaml_text, prompt, n, 64, extra)


def config(d, init, tie, devices, steps=1, opt="{type: sgd, lr: 0.0}"):
    devs = "[cpu:0]" if devices == 1 else "[cpu:0, cpu:1]"
    return "\n".join([
        "model:",
        "  input: [%d]" % T,
        "  gpt: {layers: %d, heads: %d, width: %d, positions: %d, vocab: %d, tie: %s}"
        % (L, H, C, POS, V, "true" if tie else "false"),
        "  init_from: %s" % init,
        "  loss: cross_entropy",
        "pipeline: {devices: %s, chunks: 2}" % devs,
        "data: {dataset: tokens, path: %s, shuffle: false}" % d,
        "train: {steps: %d, batch_size: 4, eval_batch_size: 4, seed: 1, optimizer: %s}"
        % (steps, opt), ""])


def gpipe(d, yaml_text, args=()):
    """gpipe-train on yaml_text: (exit, output, the final test loss)."""
    cfgp = os.path.join(d, "run.yaml")
    with open(cfgp, "w") as f:
        f.write(yaml_text)
    m = os.path.join(d, "m.jsonl")
    if os.path.exists(m):
        os.remove(m)
    r = subprocess.run([os.path.join(BIN, "gpipe-train"), cfgp, "--metrics", m, "-q",
                        "--no-progress"] + list(args), capture_output=True, text=True,
                       timeout=300)
    loss = None
    if r.returncode == 0 and os.path.exists(m):
        for line in open(m):
            rec = json.loads(line)
            if rec.get("eval") and rec.get("final"):
                loss = rec["test_loss"]
    return r.returncode, r.stdout + r.stderr, loss


def main():
    ensure_libs(NAME, ["transformers", "safetensors"], os.path.join(BIN, "hf-venv"),
                ["transformers==4.44.2", "safetensors"], "GPIPE_HF_VENV")
    import random
    import torch
    import transformers
    print("%s: transformers %s, torch %s" % (NAME, transformers.__version__, torch.__version__))
    rnd = random.Random(5)
    toks = [rnd.randrange(V) for _ in range(8 * 4 * (T + 1))]
    val = [toks[i * (T + 1):(i + 1) * (T + 1)] for i in range(4)]
    d = tempfile.mkdtemp(prefix="gpipe-gpt-hf-")
    try:
        write_tokens(os.path.join(d, "t_train.bin"), toks)
        write_tokens(os.path.join(d, "t_val.bin"), toks[:4 * (T + 1)])
        data = os.path.join(d, "t_train.bin")
        for tie in (True, False):
            name = "tied" if tie else "untied"
            m = hf_model(tie, seed=7 if tie else 8)
            folder = os.path.join(d, name)
            m.save_pretrained(folder, safe_serialization=True)
            want = hf_loss(m, val)
            for devices in (1, 2):
                rc, out, got = gpipe(d, config(data, folder, tie, devices))
                ok = rc == 0 and got is not None and abs(got - want) <= 1e-5 * abs(want)
                check(ok, "%s on %d device(s): gpipe's test loss %s, transformers' %.8f (exit %d)"
                      " %s" % (name, devices, got, want, rc, "" if rc == 0 else out[-1500:]))
                print("%s, %d device(s): gpipe %.8f, transformers %.8f" % (name, devices,
                                                                             got or 0.0, want))
            prompt = toks[:5]
            want_ids = hf_greedy(m, prompt, 50)
            for devices in (1, 2):
                for extra in ((), ("--no-cache",)):
                    got_ids, err = gpipe_greedy(d, config(data, folder, tie, devices), prompt, 50,
                                                extra)
                    first = next((i for i in range(50) if got_ids and got_ids[i] != want_ids[i]),
                                 None)
                    check(got_ids == want_ids, "%s, %d device(s)%s: gpipe's 50 greedy ids are "
                          "transformers' (first difference at %s) %s"
                          % (name, devices, " " + extra[0] if extra else "", first, err))
            print("%s: 50 greedy ids as transformers', cache and window, 1 and 2 stages" % name)

            # the folder out
            out_dir = os.path.join(d, "export-" + name)
            rc, out, final = gpipe(d, config(data, folder, tie, 2, steps=20,
                                             opt="{type: adamw, lr: 0.01, weight_decay: 0.1}"),
                                   ["--export-weights", out_dir, "--export-format", "hf"])
            check(rc == 0 and final is not None, "20 steps and the export (%s): exit %d %s"
                  % (name, rc, out[-1500:]))
            if rc != 0:
                continue
            files = sorted(os.listdir(out_dir))
            check(files == ["config.json", "model.safetensors"], "the export's files: %s" % files)
            with open(os.path.join(out_dir, "config.json")) as f:
                cj = json.load(f)
            check(cj.get("tie_word_embeddings") == tie and cj.get("n_layer") == L and
                  cj.get("n_head") == H and cj.get("vocab_size") == V and
                  cj.get("n_positions") == POS, "config.json (%s): %s" % (name, cj))
            back = transformers.GPT2LMHeadModel.from_pretrained(
                out_dir, torch_dtype=torch.float32).eval()
            got = hf_loss(back, val)
            check(abs(final - got) <= 1e-5 * abs(got),
                  "exported (%s): from_pretrained's loss %.8f, gpipe's final test loss %.8f"
                  % (name, got, final))
            print("export %s: gpipe %.8f, transformers %.8f" % (name, final, got))
            one = os.path.join(d, "one-%s.safetensors" % name)
            rc, out, _ = gpipe(d, config(data, folder, tie, 1),
                               ["--export-weights", one, "--export-format", "hf"])
            check(rc == 0 and os.path.isfile(one),
                  "an OUT ending in .safetensors is the one file: exit %d %s" % (rc, out[-800:]))
            rc, out, _ = gpipe(d, config(data, folder, tie, 1),
                               ["--export-weights", os.path.join(d, "b16"), "--export-format",
                                "hf-bf16"])
            check(rc == 2 and "hf-bf16 writes a Llama's folder" in out and "step" not in
                  out.split("hf-bf16")[0], "hf-bf16 of a GPT-2, refused before any step: exit "
                  "%d %s" % (rc, out[-800:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return finish(NAME)


if __name__ == "__main__":
    sys.exit(main())
