#!/usr/bin/python3
"""test_gpt_parity.py — issue 53's parity bar, and GPT-2's weight files in
and out (model.init_from, --export-format hf / llmc).

A PyTorch twin (tests/gpt_twin.py) makes a small GPT-2 (2 blocks, C 32, 4
heads, vocabulary 61, 24 positions) with every tensor random and writes it
as Hugging Face's model.safetensors (no "transformer." prefix, Conv1D
weights (in, out), the attn.bias mask buffers) and as llm.c's checkpoint
(version 3, vocabulary padded to 128).  On token files written here (a
learnable rule with noise, llm.c's token format, windows of T + 1 = 17):

1. parity: gpipe-train with model.init_from on each file, on 1 device and
   on 3 CPU stages (the embedding on the first, lm_head on the last), gives
   the twin's per-step SGD-with-momentum losses within 1e-5 (relative) at
   step 0 and 2e-3 over 20 steps, FP32;
2. the files back out: gpipe's export of the weights it read (a snapshot
   converted with --resume --export-weights) is the twin's llm.c file byte
   for byte, and the twin's Hugging Face tensors bit for bit; gpipe's hf
   export after 20 steps read in again and exported is the same bits; the
   twin reads that export and its validation loss is gpipe's final test
   loss (within 1e-5: the same logits);
   BF16 files (llm.c's version 5, Hugging Face's BF16 tensors) read as the
   FP32 files of the same values;
3. errors: --export-format llmc for a run that trains an untied lm_head is
   refused before any step; a cut-short llm.c file (exit 3) and a
   mis-shaped Hugging Face tensor (exit 2) are refused naming the file and
   the tensor (exact exit codes: a sanitizer's abort is not a refusal).

TIED is the one switch for the tied head (lm_head's weight shared with
wte, `tie: transformer`) once tied weights are acted on; untied, the head
starts as its own random weight from the Hugging Face file and as wte's
copy from llm.c's, which has none.

Needs Debian's python3-torch (scripts/install-deps.sh --ci): without it the
test fails, as CI must run it.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

from gpt_util import check, close, finish, write_tokens

SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
TWIN = os.path.join(SRC, "tests", "gpt_twin.py")
NAME = "test_gpt_parity"

TIED = True           # the tied head (issue 53, point 2): lm_head shares wte.weight
HEAD = "tied" if TIED else "own"
V, C, L, H, P, T = 61, 32, 2, 4, 24, 16
B, STEPS, LR, MU = 4, 20, 0.1, 0.9
VAL = 8



def make_tokens(d):
    """x' = (5 x + 3) mod V, with one token in 8 random: learnable, not
    noise-free."""
    import random
    rnd = random.Random(7)

    def seq(n):
        out, x = [], 1
        for _ in range(n):
            x = rnd.randrange(V) if rnd.random() < 0.125 else (5 * x + 3) % V
            out.append(x)
        return out
    write_tokens(os.path.join(d, "twin_train.bin"), seq(STEPS * B * (T + 1)))
    write_tokens(os.path.join(d, "twin_val.bin"), seq(VAL * (T + 1)))


def config(d, init, devices=1, lr=LR, steps=STEPS):
    lay = ["    - embedding: {vocab: %d, dim: %d, positions: %d, name: transformer, stash: x}"
           % (V, C, P)]
    for i in range(L):
        h = "transformer.h.%d." % i
        last = i == L - 1
        lay += ["    - layer_norm: {name: %sln_1}" % h,
                "    - linear: {out: %d, name: %sattn.c_attn}" % (3 * C, h),
                "    - attention: {heads: %d, name: %sattn}" % (H, h),
                "    - linear: {out: %d, name: %sattn.c_proj}" % (C, h),
                "    - add: {pop: x, stash: x, name: %sadd_1}" % h,
                "    - layer_norm: {name: %sln_2}" % h,
                "    - linear: {out: %d, name: %smlp.c_fc}" % (4 * C, h),
                "    - gelu: {name: %smlp.gelu}" % h,
                "    - linear: {out: %d, name: %smlp.c_proj}" % (C, h),
                "    - add: {pop: x, %sname: %sadd_2}" % ("" if last else "stash: x, ", h)]
    lay += ["    - layer_norm: {name: transformer.ln_f}",
            "    - linear: {out: %d, bias: false, name: lm_head%s}"
            % (V, ", tie: transformer" if TIED else "")]
    pipe = ("pipeline: {devices: [cpu:0], chunks: 1}" if devices == 1 else
            "pipeline: {devices: [cpu:0, cpu:1, cpu:2], chunks: 2, balance: [%d, %d, 2]}"
            % (1 + 10, 10 * (L - 1)))
    text = "\n".join(
        ["model:", "  input: [%d]" % T, "  init_from: %s" % init, "  loss: cross_entropy",
         "  layers:"] + lay +
        ["data: {dataset: tokens, path: %s, shuffle: false}" % d,
         "train: {batch_size: %d, steps: %d, seed: 1, log_every: 0, eval_each_epoch: false, "
         "eval_batch_size: %d, optimizer: {type: sgd, lr: %r, momentum: %r}}"
         % (B, steps, VAL, lr, MU), pipe]) + "\n"
    path = os.path.join(d, "run-%d.yaml" % abs(hash((init, devices, lr, steps))))
    with open(path, "w") as f:
        f.write(text)
    return path


def gpipe(*args):
    r = subprocess.run([os.path.join(BIN, "gpipe-train")] + list(args), capture_output=True,
                       text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def twin(*args):
    r = subprocess.run(["/usr/bin/python3", TWIN] + list(args), capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def metrics(path):
    steps, final = [], None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("eval"):
                final = rec["test_loss"] if rec.get("final") else final
            else:
                steps.append(rec["loss"])
    return steps, final


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    return {k: (tuple(v["shape"]), buf[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def convert(d, init, fmt, out):
    """gpipe reads init (lr 0: one step changes nothing), snapshots, and
    the snapshot is converted to fmt at out."""
    snaps = os.path.join(d, "snaps-%s" % os.path.basename(out))
    rc, log = gpipe(config(d, init, lr=0.0, steps=1), "-q", "--set", "train.snapshot.every_steps=1",
                    "--set", "train.snapshot.dir=" + snaps)
    check(rc == 0, "gpipe reads %s: %s" % (init, log))
    snap = os.path.join(snaps, "snapshot-000000001.safetensors")
    rc, log = gpipe("--resume", snap, "--export-weights", out, "--export-format", fmt, "-q")
    check(rc == 0, "snapshot of %s converted to %s: %s" % (init, fmt, log))


def parity(d, files):
    for init in files:
        want = twin("train", init, d, "--heads", str(H), "--seq", str(T), "--batch", str(B),
                    "--steps", str(STEPS), "--lr", str(LR), "--momentum", str(MU),
                    "--head", HEAD)
        check(want is not None, "the twin trains from %s" % init)
        if want is None:
            continue
        want = want["losses"]
        for devices in (1, 3):
            m = os.path.join(d, "m-%d-%s.jsonl" % (devices, os.path.basename(init)))
            rc, log = gpipe(config(d, init, devices), "-q", "--metrics", m)
            check(rc == 0, "gpipe-train from %s on %d device(s): %s" % (init, devices, log))
            if rc:
                continue
            got, _ = metrics(m)
            what = "%s, %d device(s)" % (os.path.basename(init), devices)
            check(len(got) == STEPS, "%s: %d steps recorded" % (what, len(got)))
            check(close(got[0], want[0], 1e-5), "%s: step 0 loss %r, twin %r (1e-5)"
                  % (what, got[0], want[0]))
            worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
            check(worst <= 2e-3, "%s: losses within %.2g of the twin's, over 2e-3: gpipe %s twin %s"
                  % (what, worst, got, want))
            check(want[-1] < want[0] - 0.3, "the twin learns (%r -> %r): the check compares "
                  "training, not a flat line" % (want[0], want[-1]))
            print("%s: step 0 %.9g (twin %.9g), worst relative difference %.2g over %d steps"
                  % (what, got[0], want[0], worst, STEPS))


def round_trips(d, hf, llmc):
    # the weights gpipe read, written back: the twin's files
    out = os.path.join(d, "back.bin")
    convert(d, llmc, "llmc", out)
    with open(out, "rb") as a, open(llmc, "rb") as b:
        check(a.read() == b.read(), "llm.c export of the weights read from llm.c's file is that "
              "file byte for byte")
    out = os.path.join(d, "back.safetensors")
    convert(d, hf, "hf", out)
    mine, theirs = read_safetensors(out), read_safetensors(hf)
    want = {(k if k == "lm_head.weight" else "transformer." + k): v for k, v in theirs.items()
            if not k.endswith(".attn.bias") and not (TIED and k == "lm_head.weight")}
    check(set(mine) == set(want), "hf export names: %s" % sorted(set(mine) ^ set(want)))
    check(all(mine[k] == want[k] for k in want if k in mine),
          "hf export of the weights read from the Hugging Face file: the same shapes and bits")
    # BF16 files (llm.c's version 5, Hugging Face's BF16) read as the FP32
    # files of the same values
    d16 = os.path.dirname(hf)
    for src, ref, fmt in (("twin-bf16.bin", "twin-bf16-f32.bin", "llmc"),
                          ("twin-bf16.safetensors", "twin-bf16-f32.safetensors", "hf")):
        a, b = os.path.join(d, "a-" + src), os.path.join(d, "b-" + src)
        convert(d, os.path.join(d16, src), fmt, a)
        convert(d, os.path.join(d16, ref), fmt, b)
        same = (open(a, "rb").read() == open(b, "rb").read() if fmt == "llmc" else
                os.path.exists(a) and read_safetensors(a) == read_safetensors(b))
        check(same, "%s reads as %s" % (src, ref))
    # trained, exported, read in again, exported again: the same bits
    m = os.path.join(d, "trained.jsonl")
    e1, e2 = os.path.join(d, "trained.safetensors"), os.path.join(d, "again.safetensors")
    rc, log = gpipe(config(d, hf), "-q", "--metrics", m, "--export-weights", e1,
                    "--export-format", "hf")
    check(rc == 0, "train and export hf: %s" % log)
    if rc:
        return
    convert(d, e1, "hf", e2)
    check(read_safetensors(e1) == read_safetensors(e2), "hf export -> init_from -> hf export is "
          "bit-identical")
    _, final = metrics(m)
    got = twin("eval", e1, d, "--heads", str(H), "--seq", str(T), "--head", HEAD)
    check(got is not None and close(got["loss"], final, 1e-5),
          "the twin's validation loss from gpipe's export %r, gpipe's final test loss %r"
          % (got and got["loss"], final))
    a = twin("eval", hf, d, "--heads", str(H), "--seq", str(T), "--head", HEAD)
    b = twin("eval", out, d, "--heads", str(H), "--seq", str(T), "--head", HEAD)
    check(a is not None and a == b, "the twin's logits from its file and from gpipe's export "
          "of it: the same loss %r %r" % (a, b))


def errors(d, hf, llmc):
    if not TIED:
        rc, log = gpipe(config(d, hf), "-q", "--export-weights", os.path.join(d, "x.bin"),
                        "--export-format", "llmc")
        check(rc == 2 and "has no head of its own" in log and "tie it" in log and
              "step" not in log.split("--export-format llmc")[0],
              "llmc export of an untied head that trains, refused before any step: %s" % log)
    cut = os.path.join(d, "cut.bin")
    with open(llmc, "rb") as a, open(cut, "wb") as b:
        b.write(a.read()[:-4])
    rc, log = gpipe(config(d, cut), "-q")
    check(rc == 3 and "cut.bin" in log and "cut short" in log, "a cut-short llm.c file: %s" % log)
    bad = os.path.join(d, "bad.safetensors")
    t = read_safetensors(hf)
    header, blobs, off = {}, [], 0
    for k, (shape, data) in t.items():
        if k == "h.1.mlp.c_fc.weight":
            shape, data = (C, 2 * C), data[:C * 2 * C * 4]
        header[k] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(bad, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    rc, log = gpipe(config(d, bad), "-q")
    check(rc == 2 and "bad.safetensors" in log and "'h.1.mlp.c_fc.weight' is (32, 64)" in log
          and "transformer.h.1.mlp.c_fc.weight takes (in 32, out 128)" in log,
          "a mis-shaped Hugging Face tensor is named: %s" % log)


def main():
    try:
        import torch  # noqa: F401  (the twin's)
    except ImportError:
        print("%s: FAIL: /usr/bin/python3 has no torch: install Debian's python3-torch "
              "(scripts/install-deps.sh --ci)" % NAME)
        return 1
    with tempfile.TemporaryDirectory(prefix="gpt-parity-") as d:
        make_tokens(d)
        r = subprocess.run(["/usr/bin/python3", TWIN, "init", d, "--vocab", str(V), "--dim", str(C),
                            "--layers", str(L), "--heads", str(H), "--positions", str(P),
                            "--seed", "1", "--head", HEAD], capture_output=True, text=True)
        check(r.returncode == 0, "the twin writes its files: %s" % r.stderr)
        if r.returncode == 0:
            hf, llmc = os.path.join(d, "twin.safetensors"), os.path.join(d, "twin.bin")
            parity(d, [hf, llmc])
            round_trips(d, hf, llmc)
            errors(d, hf, llmc)
    return finish(NAME)


if __name__ == "__main__":
    sys.exit(main())
