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
- with the KV cache (the default) and with the window (--no-cache) the
  same greedy ids within T and the same 40 bytes past it, on 2 stages and
  on 1 device;
- at temperature 1 with top-k 3 and a seed prints the same text twice,
  --samples 3 gives three continuations, and nearly all of their bytes
  follow the pattern (a sampler that ignored the logits would not);
- --out writes an llm.c token file that scripts/tokenize_text.py decodes
  back to the printed text (with --samples 3, the three samples in turn,
  issue 77); past 65,536 ids llm.c's uint32 file;
- sampling builds the model without gradients or optimizer state, and the
  start-up memory check counts the weights alone (issue 77): a Llama whose
  AdamW training does not fit a pipeline.memory cap samples under it;
- weights whose logits overflow are an error naming the sample and
  position, with and without the cache, not a token drawn from NaN;
- refuses what it cannot do, saying what to give instead: a prompt id
  outside the vocabulary, a model that is not a language model, --prompt
  and --prompt-ids together;
- nothing lost (issue 65): --out naming the config, the --weights file or
  the snapshot read is refused and leaves it byte for byte; a bad --out
  (a directory, under /proc) fails with exit 3 and the system's reason
  before anything is generated; under `ulimit -f` the write fails with
  its reason (exit 3), not SIGXFSZ; a fraction for an integer option of
  any tool is refused (gpipe-sample's four, gpipe-balance's three,
  gpipe-train's --trace-steps); --resume latest reads the newest
  snapshot; --weights errors say --weights; --ids prints no note about
  token ids.
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


def run(*args, timeout=300):
    r = subprocess.run(list(args), capture_output=True, timeout=timeout)
    return r.returncode, r.stdout.decode("latin-1"), r.stderr.decode("latin-1")


def overflow_weights(src, dst):
    """src's weights with the final norm's gain at 3e38: every logit
    overflows (inf, or NaN where infinities cancel)."""
    import json
    import struct
    b = open(src, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    data = bytearray(b[8 + n:])
    names = [k for k in h if k != "__metadata__" and "ln_f" in k and k.endswith("weight")]
    assert names, sorted(h)
    lo, hi = h[names[0]]["data_offsets"]
    assert h[names[0]]["dtype"] == "F32"
    data[lo:hi] = struct.pack("<f", 3e38) * ((hi - lo) // 4)
    # the data changed: its checksum goes (a file without one loads as PyTorch's do)
    meta = h.get("__metadata__", {})
    for k in [k for k in meta if "crc" in k.lower() or "checksum" in k.lower()]:
        del meta[k]
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + bytes(data))


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
        # the KV cache (the default) against the window (--no-cache), issue 66:
        # within T the same tokens, past it both the pattern
        rc, win, err = sample(cfg, "--resume", snap, "--prompt", "cde", "--tokens", "40",
                              "--temperature", "0", "--no-cache")
        check(rc == 0 and win == out, "--no-cache's 40 greedy bytes as the cache's: %r %r (%s)"
              % (win, out, err))
        for extra in ([], ["--set", "pipeline.devices=[cpu:0]", "--set", "pipeline.balance=[13]",
                           "--set", "pipeline.chunks=1"]):
            rc, a, err = sample(cfg, "--resume", snap, "--prompt-ids", "99,100,101,32,97",
                                "--tokens", "11", "--temperature", "0", "--ids", *extra)
            rc2, b, err2 = sample(cfg, "--resume", snap, "--prompt-ids", "99,100,101,32,97",
                                  "--tokens", "11", "--temperature", "0", "--ids", "--no-cache",
                                  *extra)
            check(rc == 0 and rc2 == 0 and a == b and len(a.split()) == 17,
                  "greedy ids within T, cache and window (%s): %r %r (%s %s)"
                  % ("1 device" if extra else "2 stages", a, b, err, err2))

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

        # top-k keeps the k best ids: at a temperature that makes them
        # nearly equal, 60 draws of one token show all k, the top 2 among
        # the top 3, the greedy one among both (top_k_ids' heap, 2026-12-01)
        def drawn(k):
            rc, text, err = sample(cfg, "--resume", snap, "--prompt-ids", "99,100,101",
                                   "--tokens", "1", "--samples", "60", "--temperature", "100",
                                   "--top-k", str(k), "--seed", "3", "--ids")
            return rc, {line.split("|")[1].strip() for line in text.splitlines()
                        if "|" in line}
        rc3, top3 = drawn(3)
        rc2, top2 = drawn(2)
        rc, greedy, err = sample(cfg, "--resume", snap, "--prompt-ids", "99,100,101",
                                 "--tokens", "1", "--temperature", "0", "--ids")
        g = greedy.split("|")[1].strip() if "|" in greedy else None
        check(rc3 == 0 and rc2 == 0 and rc == 0 and len(top3) == 3 and len(top2) == 2 and
              top2 < top3 and g in top2, "top-k 3 and 2 over 60 draws: %s, %s; greedy %s"
              % (sorted(top3), sorted(top2), g))

        tok = os.path.join(d, "out.bin")
        rc, out, err = sample(cfg, "--resume", snap, "--prompt", "cde", "--tokens", "20",
                              "--temperature", "0", "--out", tok)
        rc2, dec, err2 = run("/usr/bin/python3", os.path.join(SRC, "scripts", "tokenize_text.py"),
                             "decode", tok)
        check(rc == 0 and rc2 == 0 and dec.rstrip("\n") == out.rstrip("\n"),
              "--out decodes to the printed text: %r %r (%s %s)" % (dec, out, err, err2))

        # issue 77: --samples N --out writes every sample, in turn
        tok3 = os.path.join(d, "out3.bin")
        rc, many, err = sample(*args, "--samples", "3", "--out", tok3)
        rc2, dec, err2 = run("/usr/bin/python3", os.path.join(SRC, "scripts", "tokenize_text.py"),
                             "decode", tok3)
        texts = [p.split("\n", 1)[1].rstrip("\n") for p in many.split("--- sample ") if p]
        check(rc == 0 and rc2 == 0 and len(texts) == 3 and dec.rstrip("\n") == "".join(texts),
              "--samples 3 --out: the file holds the three samples in turn: %r %r (%s %s)"
              % (dec, texts, err, err2))
        # issue 77: logits that are not finite are an error, not a token drawn from them
        nan_w = os.path.join(d, "overflow.safetensors")
        overflow_weights(weights, nan_w)
        for extra in ([], ["--no-cache"]):
            rc, bad, err = sample(cfg, "--weights", nan_w, "--prompt", "cde", "--tokens", "5",
                                  "--temperature", "0", *extra)
            check(rc == 4 and "not finite" in err and bad == "",
                  "weights whose logits overflow %s: refused (exit 4, a failure while "
                  "generating; it was 3, a file error), nothing printed: rc %s %r %r"
                  % (extra, rc, bad, err[-300:]))
        # -q: errors only, as its --help says (a config's warning came through)
        rc, _, err = sample(cfg, "--resume", snap, "--prompt", "cde", "--tokens", "2",
                            "--temperature", "0", "--set", "pipeline.threads=64")
        check(rc == 0 and "warning" not in err, "-q with a warning to give: rc %d %r" % (rc, err))
        rc, _, err = sample(cfg, "--resume", snap, "--prompt-ids", "97,300")
        check(rc == 2 and "[0, 256)" in err, "an id outside the vocabulary: %s" % err)
        rc, _, err = sample(cfg, "--resume", snap, "--prompt", "a", "--prompt-ids", "97")
        check(rc == 2 and "--prompt" in err, "--prompt and --prompt-ids: %s" % err)
        mlp = os.path.join(SRC, "configs", "mlp.yaml")
        rc, _, err = sample(mlp, "--prompt-ids", "1", "--set", "data.dataset=synthetic")
        check(rc == 2 and "not a language model" in err, "an MLP is refused: %s" % err)
        # issue 77 item 9: sampling holds the weights alone, and its memory
        # check asks for that: a 10.5M-parameter Llama under a 100 MiB cap
        # (42 MiB of weights; training's AdamW would hold 200 MiB)
        big = os.path.join(d, "big.yaml")
        with open(big, "w") as f:
            f.write("model:\n  input: [16]\n  llama: {layers: 2, heads: 8, width: 512, "
                    "intermediate: 1536, vocab: 8192, positions: 64, tie: true}\n"
                    "  loss: cross_entropy\npipeline: {memory: 100MiB}\n"
                    "data: {dataset: synthetic}\n"
                    "train: {steps: 1, batch_size: 4, optimizer: {type: adamw, lr: 0.001}}\n")
        rc, ids, err = sample(big, "--prompt-ids", "1,2", "--tokens", "3", "--ids")
        check(rc == 0 and len(ids.split()) == 6,
              "gpipe-sample fits the weights in a cap that training's state does not: rc %d "
              "%r %s" % (rc, ids, err[-300:]))
        rc, _, err = run(os.path.join(BIN, "gpipe-train"), big, "--dry-run")
        rc2, _, err2 = run(os.path.join(BIN, "gpipe-train"), big)
        check(rc2 != 0 and "Adam's moments" in err2,
              "... where gpipe-train, which holds AdamW's state, is refused: rc %d %r"
              % (rc2, err2[-300:]))
        nothing_lost(d, cfg, snap, weights, out)
        wide_vocab(d)
    return finish("test_sample")


def wide_vocab(d):
    """A vocabulary past 65,536 ids (Llama 3's 128,256): --out writes llm.c's
    uint32 token file (magic 20240801, version 7) holding the printed ids."""
    import struct
    text = "\n".join(["model:", "  input: [8]", "  loss: cross_entropy",
                      "  llama: {layers: 1, heads: 2, width: 8, intermediate: 8, vocab: 70000,",
                      "          positions: 8}",
                      "data: {dataset: synthetic}", "train: {batch_size: 2, seed: 1}", ""])
    cfg = os.path.join(d, "wide.yaml")
    with open(cfg, "w") as f:
        f.write(text)
    out = os.path.join(d, "wide.bin")
    rc, printed, err = sample(cfg, "--prompt-ids", "69999,5", "--tokens", "3", "--temperature",
                              "0", "--ids", "--out", out)
    ok = rc == 0 and os.path.exists(out)
    ids = [int(t) for t in printed.replace("|", " ").split()] if ok else []
    if ok:
        with open(out, "rb") as f:
            hdr = struct.unpack("<256i", f.read(1024))
            body = f.read()
        ok = (hdr[0], hdr[1], hdr[2]) == (20240801, 7, 5) and \
            list(struct.unpack("<%dI" % (len(body) // 4), body)) == ids and ids[0] == 69999
    check(ok, "--out with 70,000 ids: a uint32 token file of the printed ids %r (rc %d %s)"
          % (ids, rc, err))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def nothing_lost(d, cfg, snap, weights, greedy):
    """Issue 65: gpipe-sample's outputs, integer options, --resume latest."""
    base = ("--prompt", "cde", "--tokens", "5", "--temperature", "0")
    for victim, how in ((cfg, ("--resume", snap)), (weights, ("--weights", weights)),
                        (snap, ("--resume", snap))):
        before = read(victim)
        rc, out, err = sample(cfg, *how, *base, "--out", victim)
        check(rc != 0 and out == "" and read(victim) == before and "replace" in err,
              "--out %s (an input) refused, the file kept: rc %d %r" % (victim, rc, err))
    for bad in (d, "/proc/gpipe-sample-out.bin"):
        rc, out, err = sample(cfg, "--resume", snap, *base, "--out", bad)
        check(rc == 3 and out == "" and "--out" in err and ("directory" in err or
                                                           "No such file" in err),
              "--out %s fails before any work, exit 3, with a reason: rc %d %r %r"
              % (bad, rc, out, err))
    big = os.path.join(d, "limited.bin")
    r = subprocess.run(["sh", "-c", 'ulimit -f 1; exec "$@"', "sh",
                        os.path.join(BIN, "gpipe-sample"), cfg, "--resume", snap, *base,
                        "--out", big, "-q"], capture_output=True, timeout=300)
    err = r.stderr.decode("latin-1")
    check(r.returncode == 3 and "File too large" in err and not os.path.exists(big),
          "ulimit -f: exit 3 and the reason, no partial file: rc %d %r" % (r.returncode, err))
    check(not [f for f in os.listdir(d) if ".tmp." in f], "no temporary file left behind")

    for opt, val in (("--seed", "1.9"), ("--top-k", "1.5"), ("--samples", "2.7"),
                     ("--tokens", "3.0")):
        rc, out, err = sample(cfg, "--resume", snap, *base[:2], opt, val)
        check(rc == 2 and opt in err and "whole number" in err and out == "",
              "gpipe-sample %s %s refused: rc %d %r" % (opt, val, rc, err))
    for opt, val in (("--devices", "1.5"), ("--chunks", "2.5"), ("--reps", "1.5")):
        rc, _, err = run(os.path.join(BIN, "gpipe-balance"), cfg, opt, val)
        check(rc == 2 and opt in err and "integer" in err,
              "gpipe-balance %s %s refused: rc %d %r" % (opt, val, rc, err))
    rc, _, err = run(os.path.join(BIN, "gpipe-train"), cfg, "--dry-run", "--trace", "t.json",
                     "--trace-steps", "1.5")
    check(rc == 2 and "--trace-steps" in err, "gpipe-train --trace-steps 1.5 refused: %r" % err)

    rc, out, err = sample(cfg, "--resume", "latest", "--prompt", "cde", "--tokens", "20",
                          "--temperature", "0")
    check(rc == 0 and out == greedy, "--resume latest: the newest snapshot's text: %r %r (%s)"
          % (out, greedy, err))
    rc, _, err = sample(cfg, "--weights", os.path.join(d, "missing.safetensors"), *base)
    check(rc == 3 and "--weights" in err and "model.init_from" not in err,
          "a --weights error names --weights: %r" % err)

    # a FIFO as an input is refused at once, not a blocked open deaf to
    # signals
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    train = os.path.join(BIN, "gpipe-train")
    for tool, args in ((train, (cfg, "--set", "model.init_from=" + fifo, "--set",
                                "train.snapshot.dir=" + os.path.join(d, "fifo-snaps"))),
                       (train, (cfg, "--resume", fifo)),
                       (os.path.join(BIN, "gpipe-sample"), (cfg, "--weights", fifo) + base),
                       (os.path.join(BIN, "gpipe-sample"), (cfg, "--resume", fifo) + base)):
        try:
            rc, _, err = run(tool, *args)
        except subprocess.TimeoutExpired:
            rc, err = -1, "hung"
        check(rc == 3 and "not a regular file" in err and "gp_run_" not in err,
              "a FIFO as %s: refused, in the tool's words: rc %d %r" % (args[1:3], rc, err))

    # a token id past the vocabulary, in either split, is found when the
    # files are opened, naming the file, the offset and the id
    for split in ("train", "val"):
        bad = os.path.join(d, "bad" + split)
        os.mkdir(bad)
        for s in ("train", "val"):
            toks = list((PATTERN * 30)[:300])
            if s == split:
                toks[123] = 300
            write_tokens(os.path.join(bad, "b_%s.bin" % s), toks)
        rc, _, err = run(train, cfg, "--set", "data.path=" + bad, "--set", "train.steps=4",
                         "--set", "train.snapshot.dir=" + os.path.join(bad, "snaps"))
        check(rc == 3 and "b_%s.bin" % split in err and "token 123 (byte offset 1270) is id "
              "300" in err and "vocabulary is 256" in err,
              "an id past the vocabulary in the %s split, found at start: rc %d %r"
              % (split, rc, err))

    # --convert: a snapshot's weights written, nothing trained, no data read
    # (the data path does not exist): the very bytes the run exported
    conv = os.path.join(d, "conv.safetensors")
    rc, _, err = run(train, "--resume", snap, "--export-weights", conv, "--convert", "--set",
                     "data.path=" + os.path.join(d, "no-such-data"))
    check(rc == 0 and read(conv) == read(weights) and "nothing trained" in err,
          "--convert writes the snapshot's weights: rc %d %r" % (rc, err))
    rc, _, err = run(train, cfg, "--resume", "latest", "--convert")
    check(rc == 2 and "--export-weights" in err, "--convert without an output: %r" % err)
    rc, _, err = run(train, "--resume", snap, "--export-weights", snap, "--convert")
    check(rc != 0 and "replace" in err, "--convert onto its own snapshot refused: %r" % err)

    lm = os.path.join(d, "v300.yaml")
    with open(lm, "w") as f:
        f.write("model:\n  input: [8]\n  loss: cross_entropy\n"
                "  gpt: {layers: 1, heads: 1, width: 8, positions: 8, vocab: 300}\n"
                "data: {dataset: tokens, path: %s}\n"
                "pipeline: {devices: [cpu:0]}\n" % d)
    tool = os.path.join(BIN, "gpipe-sample")
    rc, out, err = run(tool, lm, "--prompt-ids", "1,2", "--tokens", "2", "--ids")
    check(rc == 0 and "these are token ids" not in err, "--ids: no note: %r" % err)
    rc, out, err = run(tool, lm, "--prompt-ids", "1,2", "--tokens", "2")
    check(rc == 0 and "these are token ids" in err, "ids without --ids: the note: %r" % err)


if __name__ == "__main__":
    sys.exit(main())
