#!/usr/bin/python3
"""test_sample.py — gpipe-sample (issue 53, point 5) continues a prompt
with what the model learned.

A one-block byte-level GPT (vocabulary 256, T = 16) trained on 2 CPU
stages on a text that repeats "abcdefghij " (every byte says which comes
next) learns it; then gpipe-sample, from the run's snapshot:

- at temperature 0 continues "cde" for 40 bytes (past T, so the context
  slides) exactly as the pattern goes on, on the 2 stages it trained on
  and on 1 device alike;
- with --weights (the run's exported weights: model.init_from's reader)
  prints the same;
- at temperature 1 with top-k 3 and a seed prints the same text twice,
  --samples 3 gives three continuations, and nearly all of their bytes
  follow the pattern (a sampler that ignored the logits would not);
- --out writes an llm.c token file that scripts/tokenize_text.py decodes
  back to the printed text;
- refuses what it cannot do, saying what to give instead: a prompt id
  outside the vocabulary, a model that is not a language model, --prompt
  and --prompt-ids together.
"""
import os
import subprocess
import sys
import tempfile

from gpt_util import check, finish, write_tokens

SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
PATTERN = b"abcdefghij "
C = 32



def config(d):
    h = "transformer.h.0."
    layers = ["- embedding: {vocab: 256, dim: %d, positions: 16, name: transformer, stash: x}" % C,
              "- layer_norm: {name: %sln_1}" % h,
              "- linear: {out: %d, name: %sattn.c_attn}" % (3 * C, h),
              "- attention: {heads: 2, name: %sattn}" % h,
              "- linear: {out: %d, name: %sattn.c_proj}" % (C, h),
              "- add: {pop: x, stash: x, name: %sadd_1}" % h,
              "- layer_norm: {name: %sln_2}" % h,
              "- linear: {out: %d, name: %smlp.c_fc}" % (4 * C, h),
              "- gelu: {name: %smlp.gelu}" % h,
              "- linear: {out: %d, name: %smlp.c_proj}" % (C, h),
              "- add: {pop: x, name: %sadd_2}" % h,
              "- layer_norm: {name: transformer.ln_f}",
              "- linear: {out: 256, bias: false, name: lm_head}"]
    text = "\n".join(
        ["model:", "  input: [16]", "  loss: cross_entropy", "  layers:"] +
        ["    " + x for x in layers] +
        ["data: {dataset: tokens, path: %s}" % d,
         "train: {batch_size: 8, steps: 200, seed: 1, log_every: 0, eval_each_epoch: false, "
         "optimizer: {type: adam, lr: 0.01}, snapshot: {every_steps: 200, dir: %s/snaps}}" % d,
         "pipeline: {devices: [cpu:0, cpu:1], chunks: 2, balance: [6, 7]}"]) + "\n"
    path = os.path.join(d, "tiny.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run(*args):
    r = subprocess.run(list(args), capture_output=True, timeout=300)
    return r.returncode, r.stdout.decode("latin-1"), r.stderr.decode("latin-1")


def sample(*args):
    return run(os.path.join(BIN, "gpipe-sample"), *args, "-q")


def follows(text):
    """The share of bytes in text that follow the byte before them as the
    pattern does."""
    nxt = {PATTERN[i]: PATTERN[(i + 1) % len(PATTERN)] for i in range(len(PATTERN))}
    b = text.encode("latin-1")
    ok = sum(1 for i in range(1, len(b)) if nxt.get(b[i - 1]) == b[i])
    return ok / max(1, len(b) - 1)


def main():
    with tempfile.TemporaryDirectory(prefix="gpipe-sample-") as d:
        write_tokens(os.path.join(d, "p_train.bin"), (PATTERN * 300)[:3000])
        write_tokens(os.path.join(d, "p_val.bin"), (PATTERN * 30)[:300])
        cfg = config(d)
        weights = os.path.join(d, "w.safetensors")
        rc, _, err = run(os.path.join(BIN, "gpipe-train"), cfg, "-q", "--export-weights", weights)
        check(rc == 0, "the tiny GPT trains: %s" % err)
        if rc:
            return finish("test_sample")
        snap = os.path.join(d, "snaps", "snapshot-000000200.safetensors")
        start = PATTERN.index(b"c")
        want = (PATTERN * 8)[start:start + 3 + 40].decode()

        rc, out, err = sample(cfg, "--resume", snap, "--prompt", "cde", "--tokens", "40",
                              "--temperature", "0")
        check(rc == 0 and out == want + "\n", "greedy on 2 stages: %r, the pattern %r (%s)"
              % (out, want, err))
        rc, out1, err = sample(cfg, "--resume", snap, "--prompt", "cde", "--tokens", "40",
                               "--temperature", "0", "--set", "pipeline.devices=[cpu:0]",
                               "--set", "pipeline.balance=[13]", "--set", "pipeline.chunks=1")
        check(rc == 0 and out1 == out, "1 device samples as 2 stages: %r %r (%s)"
              % (out1, out, err))
        rc, out2, err = sample(cfg, "--weights", weights, "--prompt", "cde", "--tokens", "40",
                               "--temperature", "0")
        check(rc == 0 and out2 == out, "--weights as --resume: %r (%s)" % (out2, err))

        args = (cfg, "--resume", snap, "--prompt", "abc", "--tokens", "60", "--temperature", "1",
                "--top-k", "3", "--seed", "7")
        rc, a, err = sample(*args)
        rc2, b, _ = sample(*args)
        check(rc == 0 and rc2 == 0 and a == b and len(a) == 64,
              "a seed gives the same text: %r %r (%s)" % (a, b, err))
        check(follows(a) >= 0.9, "sampled text follows the pattern (%.2f): %r" % (follows(a), a))
        rc, many, err = sample(*args, "--samples", "3")
        parts = [p for p in many.split("--- sample ") if p]
        check(rc == 0 and len(parts) == 3 and all(follows(p.split("\n", 1)[1]) >= 0.9
                                                  for p in parts),
              "--samples 3: three continuations that follow the pattern: %r (%s)" % (many, err))

        tok = os.path.join(d, "out.bin")
        rc, out, err = sample(cfg, "--resume", snap, "--prompt", "cde", "--tokens", "20",
                              "--temperature", "0", "--out", tok)
        rc2, dec, err2 = run("/usr/bin/python3", os.path.join(SRC, "scripts", "tokenize_text.py"),
                             "decode", tok)
        check(rc == 0 and rc2 == 0 and dec.rstrip("\n") == out.rstrip("\n"),
              "--out decodes to the printed text: %r %r (%s %s)" % (dec, out, err, err2))

        rc, _, err = sample(cfg, "--resume", snap, "--prompt-ids", "97,300")
        check(rc == 2 and "[0, 256)" in err, "an id outside the vocabulary: %s" % err)
        rc, _, err = sample(cfg, "--resume", snap, "--prompt", "a", "--prompt-ids", "97")
        check(rc == 2 and "--prompt" in err, "--prompt and --prompt-ids: %s" % err)
        mlp = os.path.join(SRC, "configs", "mlp.yaml")
        rc, _, err = sample(mlp, "--prompt-ids", "1", "--set", "data.dataset=synthetic")
        check(rc == 2 and "not a language model" in err, "an MLP is refused: %s" % err)
    return finish("test_sample")


if __name__ == "__main__":
    sys.exit(main())
