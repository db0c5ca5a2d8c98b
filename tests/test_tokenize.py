#!/usr/bin/python3
"""test_tokenize.py — scripts/tokenize_text.py (encode, decode, encodings).

  (a) byte-level round trip: files holding every byte value, UTF-8 text and
      an empty line encode and decode back to their concatenation exactly;
      the header's words (magic 20240520, version 1, the count, 253 zeros)
      and the split (the last round(n x --val) tokens are validation) are
      read back here with struct, not through the script;
  (b) the corpus the docs name, /usr/share/common-licenses, round trips,
      and the unigram entropy encode prints is the one computed here;
  (c) gpipe's reader takes the files: gpipe-train --dry-run finds both
      splits, and a run reads them and stops at the loss check (a model
      without per-position logits), not at the data;
  (d) bad inputs and arguments (a missing file, a directory, --val 0 and
      1.5, too little text, a bad magic, a truncated file, a token that is
      not a byte) exit 2 with one line on stderr, never a traceback;
  (e) gpt2: round trip where tiktoken and its cached files are here; where
      not, encode refuses with a line naming what is missing;
  (f) --tokenizer (issue 66): a Hugging Face tokenizer.json of 70,000 ids
      made here with the `tokenizers` library (PyPI's, in a venv over
      Debian's Python, made on the first run; skipped, saying why, only
      where PyPI cannot be reached) encodes a text whose ids pass 65,535
      into llm.c's Llama 3 files (magic 20240801, version 7, uint32: read
      back here with struct), decode gives the text back, and gpipe-train
      trains a model.llama of that vocabulary on them, reading the ids
      past 65,535 exactly (a window's targets, checked through the
      metrics' loss being finite and the run's data line).

Runs with Debian's /usr/bin/python3 (under the venv for (f)).
"""
import glob
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

from gpt_util import check, ensure_libs, finish

SRC = os.environ.get("GPIPE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
SCRIPT = os.path.join(SRC, "scripts", "tokenize_text.py")


def script(*args):
    # (the interpreter this test runs under: Debian's, or the venv over it
    # that has `tokenizers`)
    return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True)


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    return list(struct.unpack_from("<256i", data)), data[1024:]


def one_line_error(r, needle, what):
    err = r.stderr.decode("utf-8", "replace")
    check(r.returncode == 2 and needle in err and err.count("\n") == 1
          and "Traceback" not in err,
          "%s: exit 2 with one line containing %r: rc %d, %r" % (what, needle, r.returncode, err))


def test_bytes(tmp):
    texts = [bytes(range(256)) * 3, "naïve café — “quotes”\n\nend\n".encode("utf-8"), b"\n"]
    paths = []
    for k, t in enumerate(texts):
        paths.append(os.path.join(tmp, "t%d.txt" % k))
        with open(paths[-1], "wb") as f:
            f.write(t)
    out = os.path.join(tmp, "out")
    r = script("encode", "-o", out, "--name", "mix", "--val", "0.25", *paths)
    check(r.returncode == 0, "encode: rc %d %r" % (r.returncode, r.stderr))
    joined = b"".join(texts)
    n = len(joined)
    n_val = int(round(n * 0.25))
    parts = []
    for split, want in (("train", n - n_val), ("val", n_val)):
        path = os.path.join(out, "mix_%s.bin" % split)
        hdr, body = read_file(path)
        check(hdr[:3] == [20240520, 1, want] and hdr[3:] == [0] * 253,
              "%s header: %r, want [20240520, 1, %d] then zeros" % (split, hdr[:4], want))
        check(len(body) == 2 * want, "%s: %d bytes of tokens for %d" % (split, len(body), want))
        toks = struct.unpack("<%dH" % (len(body) // 2), body)
        parts.append(bytes(toks))
        d = script("decode", path)
        check(d.returncode == 0 and d.stdout == bytes(toks),
              "decode %s gives the file's tokens as bytes" % split)
    check(parts[0] + parts[1] == joined, "train + val tokens are the input bytes, in order")
    # ids: a prompt's ids, comma-separated, for gpipe-sample --prompt-ids
    # (it advised encode, which writes two binary splits and prints none)
    r = script("ids", "naïve")
    check(r.returncode == 0 and r.stdout == b"110,97,195,175,118,101\n",
          "ids of 'naïve' as bytes: %r %r" % (r.stdout, r.stderr))
    r = subprocess.run([sys.executable, SCRIPT, "ids", "-"], input=b"ab\n", capture_output=True)
    check(r.returncode == 0 and r.stdout == b"97,98,10\n", "ids from stdin: %r" % r.stdout)
    # bytes that are not UTF-8 on the command line: the bytes' ids, as from
    # stdin (it was an "unexpected error": argv's surrogateescape)
    r = subprocess.run([sys.executable, SCRIPT, "ids", b"a\xffb"], capture_output=True)
    check(r.returncode == 0 and r.stdout == b"97,255,98\n",
          "ids of a\\xffb from argv: %r %r" % (r.stdout, r.stderr))
    one_line_error(script("ids", ""), "is empty", "ids of nothing")
    return out


def test_corpus(tmp):
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        check(False, "/usr/share/common-licenses (base-files) is missing")
        return None
    out = os.path.join(tmp, "lic")
    r = script("encode", "-o", out, "--name", "licenses", *files)
    check(r.returncode == 0, "encode the licences: %r" % r.stderr)
    text = b"".join(open(f, "rb").read() for f in files)
    got = b"".join(script("decode", os.path.join(out, "licenses_%s.bin" % s)).stdout
                   for s in ("train", "val"))
    check(got == text, "the licences round trip (%d bytes, got %d)" % (len(text), len(got)))
    # the unigram entropy it prints, against the bytes' own (in double here)
    counts = {}
    for b in text:
        counts[b] = counts.get(b, 0) + 1
    h = -sum(c / len(text) * math.log(c / len(text)) for c in counts.values())
    said = re.search(rb"unigram entropy: ([0-9.]+) nats per token over the corpus", r.stdout)
    check(said is not None and abs(float(said.group(1)) - h) < 1e-4,
          "encode's unigram entropy %r, computed here %.4f" % (said and said.group(1), h))
    return out


def test_gpipe(tmp, out):
    exe = os.path.join(BIN, "gpipe-train")
    if not os.path.exists(exe):
        check(False, "%s is not built" % exe)
        return
    cfg = os.path.join(tmp, "tok.yaml")
    with open(cfg, "w") as f:
        f.write("model: {input: [32], layers: [flatten, {linear: {out: 256}}]}\n"
                "data: {dataset: tokens, path: '%s'}\n"
                "train: {batch_size: 4, epochs: 1}\npipeline: {devices: [cpu:0]}\n" % out)
    r = subprocess.run([exe, cfg, "--dry-run"], capture_output=True, text=True)
    check(r.returncode == 0 and "data: tokens, %s/licenses_train.bin and %s/licenses_val.bin"
          % (out, out) in r.stdout, "--dry-run finds both splits: %r %r"
          % (r.stdout[-300:], r.stderr[-300:]))
    r = subprocess.run([exe, cfg], capture_output=True, text=True)
    check(r.returncode != 0 and "gives 32 next-token targets per sample" in r.stderr,
          "a run reads the files and stops at the loss: %r" % r.stderr[-400:])


def test_bad(tmp, out):
    one_line_error(script("encode", "-o", tmp, os.path.join(tmp, "nope.txt")), "nope.txt",
                   "a missing file")
    one_line_error(script("encode", "-o", tmp, tmp), "is a directory", "a directory")
    small = os.path.join(tmp, "small.txt")
    with open(small, "wb") as f:
        f.write(b"ab")
    one_line_error(script("encode", "-o", tmp, "--val", "0", small), "--val", "--val 0")
    one_line_error(script("encode", "-o", tmp, "--val", "1.5", small), "--val", "--val 1.5")
    one_line_error(script("encode", "-o", tmp, "--val", "0.1", small), "too few", "2 bytes")
    one_line_error(script("encode", small), "required", "no -o")
    src = os.path.join(out, "mix_train.bin")
    data = open(src, "rb").read()
    bad = os.path.join(tmp, "bad.bin")
    with open(bad, "wb") as f:
        f.write(struct.pack("<i", 1234) + data[4:])
    one_line_error(script("decode", bad), "bad magic 1234", "a bad magic")
    with open(bad, "wb") as f:
        f.write(data[:-3])
    one_line_error(script("decode", bad), "but the file has", "a truncated file")
    with open(bad, "wb") as f:
        f.write(data[:1024] + struct.pack("<H", 300) + data[1026:])
    one_line_error(script("decode", bad), "token 300 is not a byte", "a non-byte token")
    # issue 77 item 15: an output that is an input is refused, the input kept
    text = os.path.join(tmp, "same_train.bin")
    with open(text, "wb") as f:
        f.write(b"some text that is both the input and an output's name " * 4)
    before = open(text, "rb").read()
    one_line_error(script("encode", "-o", tmp, "--name", "same", text), "would replace",
                   "an output naming the input")
    check(open(text, "rb").read() == before, "the input named as an output is unchanged")
    # ... and a write that fails leaves the earlier file (written beside, renamed)
    prev = os.path.join(out, "mix_train.bin")
    kept = open(prev, "rb").read()
    import resource
    r = subprocess.run([sys.executable, SCRIPT, "encode", "-o", out, "--name", "mix",
                        os.path.join(tmp, "small.txt")] + [text] * 40, capture_output=True,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1100, 1100)))
    check(r.returncode != 0 and open(prev, "rb").read() == kept and
          not [f for f in os.listdir(out) if ".tmp." in f],
          "an encode whose write fails leaves the earlier file whole: rc %d %r"
          % (r.returncode, r.stderr[-300:]))


def test_gpt2(tmp):
    text = os.path.join(tmp, "g.txt")
    with open(text, "w") as f:
        f.write("Hello, world. A pipeline trains GPT-2.\n" * 20)
    r = script("encodings")
    have = b"gpt2: yes" in r.stdout
    check(r.returncode == 0 and b"bytes: yes" in r.stdout, "encodings: %r" % r.stdout)
    out = os.path.join(tmp, "g")
    e = script("encode", "--encoding", "gpt2", "-o", out, "--name", "g", text)
    if not have:
        one_line_error(e, "gpt2", "gpt2 where tiktoken or its files are missing")
        print("test_tokenize: gpt2 not on this machine (%s); its refusal checked"
              % [ln for ln in r.stdout.decode().splitlines() if ln.startswith("gpt2:")])
        return
    check(e.returncode == 0, "gpt2 encode: %r" % e.stderr)
    got = b"".join(script("decode", "--encoding", "gpt2", os.path.join(out, "g_%s.bin" % s)).stdout
                   for s in ("train", "val"))
    check(got == open(text, "rb").read(), "gpt2 round trip")


def test_tokenizer(tmp):
    import tokenizers
    from tokenizers import models, pre_tokenizers, processors
    vocab = {"[UNK]": 0, "<s>": 1}
    for i in range(2, 70000):
        vocab["w%d" % i] = i
    tk = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(["<s>"])
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tk.decoder = tokenizers.decoders.WordPiece(prefix="##")  # (joins words with spaces)
    tj = os.path.join(tmp, "tokenizer.json")
    tk.save(tj)
    ids = [(i * 7919) % 69990 + 5 for i in range(700)] + [65535, 65536, 69999]
    text = os.path.join(tmp, "w.txt")
    with open(text, "w") as f:
        f.write(" ".join("w%d" % i for i in ids))
    out = os.path.join(tmp, "u32")
    e = script("encode", "--tokenizer", tj, "-o", out, "--name", "w", "--val", "0.1", text)
    check(e.returncode == 0 and b"uint32 files" in e.stdout, "--tokenizer encode: %r %r"
          % (e.stdout, e.stderr))
    toks = []
    for split in ("train", "val"):
        words, body = read_file(os.path.join(out, "w_%s.bin" % split))
        magic, version, n = words[:3]
        check(magic == 20240801 and version == 7 and len(body) == 4 * n and
              not any(words[3:]), "%s: magic %d version %d, %d tokens in %d bytes"
              % (split, magic, version, n, len(body)))
        toks += list(struct.unpack_from("<%dI" % n, body))
    check(toks == [1] + ids, "the uint32 tokens: %s ... (want <s> then the words' ids)"
          % toks[:5])
    d = b"".join(script("decode", "--tokenizer", tj, os.path.join(out, "w_%s.bin" % s)).stdout
                 for s in ("train",))
    want = " ".join("w%d" % i for i in ids[:len(toks) - 1 - int(round(len(toks) * 0.1))])
    check(d.decode().strip() == want[:len(d.decode().strip())] and len(d) > 1000,
          "decode --tokenizer: %r" % d[:80])
    # ids: a prompt's ids as gpipe-sample --prompt-ids takes them, as encode
    # writes a document (the tokenizer's <s> first)
    r = script("ids", "--tokenizer", tj, "w7 w65536")
    check(r.returncode == 0 and r.stdout == b"1,7,65536\n", "ids --tokenizer: %r %r"
          % (r.stdout, r.stderr))
    # issue 77: ids past the tokenizer's vocabulary are an error, not nothing
    # printed with exit 0; a uint32 file without --tokenizer names it
    big = os.path.join(tmp, "past.bin")
    words, body = read_file(os.path.join(out, "w_val.bin"))
    with open(big, "wb") as f:
        f.write(struct.pack("<%di" % len(words), 20240801, 7, 2, *words[3:]) +
                struct.pack("<2I", 5, 80000))
    one_line_error(script("decode", "--tokenizer", tj, big), "past", "an id past the vocabulary")
    one_line_error(script("decode", os.path.join(out, "w_val.bin")), "--tokenizer",
                   "a uint32 file decoded without --tokenizer suggests it")
    exe = os.path.join(BIN, "gpipe-train")
    cfg = os.path.join(tmp, "l.yaml")
    with open(cfg, "w") as f:
        f.write("model: {input: [16], llama: {layers: 1, heads: 2, width: 16, intermediate: 24,"
                " vocab: 70000, positions: 16}}\n"
                "data: {dataset: tokens, path: '%s', shuffle: false}\n"
                "train: {batch_size: 4, steps: 2, eval_each_epoch: false,"
                " snapshot: {every_steps: 0, dir: '%s/snaps'}}\n"
                "pipeline: {devices: [cpu:0]}\n" % (out, tmp))
    r = subprocess.run([exe, cfg, "--no-progress"], capture_output=True, text=True)
    check(r.returncode == 0 and "final: validation loss" in r.stderr + r.stdout,
          "a Llama of 70,000 ids trains on the uint32 files: %r" % (r.stderr[-600:]))
    r = subprocess.run([exe, cfg, "--set", "model.llama.vocab=65536", "--no-progress"],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "the model's vocabulary is 65536 (model.llama.vocab)"
          in r.stderr, "ids past a smaller vocabulary are refused: %r" % r.stderr[-400:])


def test_no_stdlib_names():
    """No script in scripts/ is named as a standard-library module: the
    folder is first on a script's path, so linecache's `import tokenize`
    (behind every traceback) took scripts/tokenize.py once and broke
    metrics.py and timeline.py."""
    names = getattr(sys, "stdlib_module_names", None)
    check(names is not None, "this Python (%s) lists no stdlib_module_names" % sys.version)
    clash = [f for f in sorted(os.listdir(os.path.join(SRC, "scripts")))
             if f.endswith(".py") and names and f[:-3] in names]
    check(not clash, "scripts named as standard-library modules: %s" % clash)


def main():
    ensure_libs("test_tokenize", ["tokenizers"], os.path.join(BIN, "tok-venv"),
                ["tokenizers==0.19.1"], "GPIPE_TOK_VENV")
    test_no_stdlib_names()
    with tempfile.TemporaryDirectory(prefix="gpipe-tokenize-") as tmp:
        out = test_bytes(tmp)
        lic = test_corpus(tmp)
        if lic:
            test_gpipe(tmp, lic)
        test_bad(tmp, out)
        test_gpt2(tmp)
        test_tokenizer(tmp)
    return finish("test_tokenize")


if __name__ == "__main__":
    sys.exit(main())
