#!/usr/bin/python3
"""tokenize_text.py — text files into llm.c's token files, the data of
gpipe-train's `data.dataset: tokens`, and back.

  scripts/tokenize_text.py encode -o DIR [--name NAME] [--val FRACTION]
                      [--encoding bytes|gpt2 | --tokenizer tokenizer.json] TEXT...
      writes DIR/NAME_train.bin and DIR/NAME_val.bin: the texts joined in
      the order given, as tokens; the last FRACTION of the tokens (default
      0.1) is the validation split, the rest the training split.
  scripts/tokenize_text.py decode [--encoding bytes|gpt2 | --tokenizer T] FILE.bin
      writes the file's tokens as text to stdout.
  scripts/tokenize_text.py ids [--encoding bytes|gpt2 | --tokenizer T] TEXT
      prints the ids of TEXT ('-': stdin), comma-separated, as a document
      of encode's (gpt2's <|endoftext|> or a tokenizer's <s> first): what
      gpipe-sample --prompt-ids takes.
  scripts/tokenize_text.py encodings
      says which encodings this machine has.

A token file is a header of 256 little-endian int32 (magic 20240520,
version 1, the token count, the rest 0), then the tokens as little-endian
uint16: what llm.c's dev/data scripts write and train_gpt2 reads.  A
vocabulary past 65,536 ids (Llama 3's 128,256) is written as llm.c's
Llama 3 files: magic 20240801, version 7, uint32 tokens.  decode reads
both.

Encodings: `bytes` (the default) is byte-level, a vocabulary of 256: each
byte of the file is a token, so any file encodes and decode(encode(f)) is
f exactly; nothing to download.  `gpt2` is GPT-2's BPE (50257 tokens)
through tiktoken, only where tiktoken is installed and its GPT-2 files are
already in its cache (TIKTOKEN_CACHE_DIR): this script never downloads, and
says so when they are missing.  Like llm.c, gpt2 puts <|endoftext|> (50256)
before each file.  `--tokenizer FILE` is a Hugging Face tokenizer.json (a
Llama's, from its model folder) through the `tokenizers` library where it
is installed (pip install tokenizers; it reads the file, never the Hub);
each text file is encoded with the tokenizer's special tokens (Llama 3's
<|begin_of_text|> first).

A corpus every Debian machine has: the licence texts of base-files,
    scripts/tokenize_text.py encode -o data/licenses --name licenses \\
        /usr/share/common-licenses/*
(303 kB of English: 303,076 byte tokens, 10% of them for validation).
encode also prints the corpus's unigram entropy and the validation split's
cross-entropy under the training split's frequencies: the losses to beat.

Errors are one line on stderr naming the file or option, exit 2.
Runs with Debian's /usr/bin/python3; tiktoken is optional.
"""
import math
import os
import struct
import sys

from gp_script_common import ScriptError, parser_raising, run_cli

MAGIC = 20240520
VERSION = 1
MAGIC32, VERSION32 = 20240801, 7  # llm.c's Llama 3 files: uint32 tokens
HEADER_WORDS = 256
GPT2_EOT = 50256


class TokError(ScriptError):
    pass


def gpt2_encoding():
    """tiktoken's GPT-2 encoding from its cache, or a TokError saying why
    not; tiktoken's downloader is replaced by a refusal first."""
    try:
        import tiktoken
        import tiktoken.load
    except ImportError:
        raise TokError("--encoding gpt2", "tiktoken is not installed (pip install tiktoken, "
                       "and put its GPT-2 files in TIKTOKEN_CACHE_DIR); use --encoding bytes")

    def refuse(blobpath):
        raise TokError("--encoding gpt2", "tiktoken's GPT-2 file %s is not in its cache "
                       "(TIKTOKEN_CACHE_DIR=%s) and this script does not download; copy the "
                       "cache from a machine that has it, or use --encoding bytes"
                       % (blobpath, os.environ.get("TIKTOKEN_CACHE_DIR", "unset")))
    tiktoken.load.read_file = refuse
    return tiktoken.get_encoding("gpt2")


def hf_tokenizer(path):
    """A Hugging Face tokenizer.json through `tokenizers`, or a TokError."""
    try:
        import tokenizers
    except ImportError:
        raise TokError("--tokenizer", "the tokenizers library is not installed (pip install "
                       "tokenizers); use --encoding bytes or gpt2")
    try:
        return tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # (its errors are its own Exception types)
        raise TokError(path, "not a tokenizer.json that `tokenizers` reads: %s" % e)


def read_input(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except IsADirectoryError:
        raise TokError(path, "is a directory; name the text files in it")
    except OSError as e:
        raise TokError(path, "cannot read: %s" % (e.strerror or e))


def encode_bytes(data, where, enc, hf):
    """One document's ids, as encode writes them: a tokenizer's (with its
    special tokens), GPT-2's after its end-of-text, or the bytes."""
    if hf is not None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TokError(where, "not UTF-8 at byte %d (a tokenizer takes text)" % e.start)
        return list(hf.encode(text, add_special_tokens=True).ids)
    if enc is None:
        return list(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokError(where, "not UTF-8 at byte %d (GPT-2's BPE takes text); use --encoding "
                       "bytes for any file" % e.start)
    return [GPT2_EOT] + enc.encode_ordinary(text)


def encoders(encoding, tokenizer):
    return (gpt2_encoding() if encoding == "gpt2" and not tokenizer else None,
            hf_tokenizer(tokenizer) if tokenizer else None)


def encode_files(paths, encoding, tokenizer=None):
    toks = []
    enc, hf = encoders(encoding, tokenizer)
    for p in paths:
        toks.extend(encode_bytes(read_input(p), p, enc, hf))
    return toks


def write_tokens(path, toks, wide=None):
    """A token file; uint32 (llm.c's Llama 3 format) where wide, or where
    wide is None and an id is past 65,535."""
    if wide is None:
        wide = bool(toks) and max(toks) > 65535
    header = [0] * HEADER_WORDS
    header[0], header[1], header[2] = (MAGIC32, VERSION32, len(toks)) if wide else \
        (MAGIC, VERSION, len(toks))
    # written beside it and renamed over it: a full disk or a kill leaves
    # whatever was there (issue 77: the earlier file was truncated first)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<%di" % HEADER_WORDS, *header))
            f.write(struct.pack("<%d%s" % (len(toks), "I" if wide else "H"), *toks))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def read_tokens(path):
    """The tokens of a token file, checked as gpipe's reader checks it."""
    data = read_input(path)
    if len(data) < 4 * HEADER_WORDS:
        raise TokError(path, "truncated header: %d of %d bytes" % (len(data), 4 * HEADER_WORDS))
    magic, version, n = struct.unpack_from("<3i", data)
    if magic not in (MAGIC, MAGIC32):
        raise TokError(path, "bad magic %d, expected %d or %d: not a token file"
                       % (magic, MAGIC, MAGIC32))
    wide = magic == MAGIC32
    if version != (VERSION32 if wide else VERSION):
        raise TokError(path, "version %d, but magic %d files are version %d"
                       % (version, magic, VERSION32 if wide else VERSION))
    want = 4 * HEADER_WORDS + (4 if wide else 2) * n
    if n < 0 or len(data) != want:
        raise TokError(path, "its header counts %d tokens (%d bytes with the header) but the "
                       "file has %d bytes" % (n, want, len(data)))
    return list(struct.unpack_from("<%d%s" % (n, "I" if wide else "H"), data,
                                   4 * HEADER_WORDS))


def decode_tokens(toks, encoding, path, tokenizer=None):
    if tokenizer:
        tk = hf_tokenizer(tokenizer)
        n = tk.get_vocab_size(with_added_tokens=True)
        bad = [t for t in toks if t >= n]
        if bad:  # (the library decodes them as nothing, exit 0: issue 77)
            raise TokError(path, "token %d is past %s's vocabulary of %d: the file was not "
                           "encoded with this tokenizer" % (bad[0], tokenizer, n))
        return tk.decode(toks, skip_special_tokens=True).encode("utf-8")
    if encoding == "gpt2":
        enc = gpt2_encoding()
        return enc.decode([t for t in toks if t != GPT2_EOT]).encode("utf-8")
    bad = [t for t in toks if t > 255]
    if bad:
        if max(toks) > 50256:  # past GPT-2's vocabulary: a Llama 3's or another's ids
            raise TokError(path, "token %d is not a byte, nor in GPT-2's vocabulary: decode it "
                           "with the tokenizer it was encoded with (--tokenizer "
                           "tokenizer.json, from the model's folder)" % max(toks))
        raise TokError(path, "token %d is not a byte: the file is not byte-level (try "
                       "--encoding gpt2, or --tokenizer tokenizer.json)" % bad[0])
    return bytes(toks)


def cmd_encode(a):
    if not 0 < a.val < 1:
        raise TokError("--val", "%g must be between 0 and 1 (the validation fraction)" % a.val)
    if "/" in a.name:
        raise TokError("--name", "'%s' names a file in -o's folder; no '/'" % a.name)
    toks = encode_files(a.text, a.encoding, a.tokenizer)
    n_val = int(round(len(toks) * a.val))
    if n_val < 1 or n_val >= len(toks):
        raise TokError(None, "%d tokens in all: too few to split %g of them off for "
                       "validation; give more text" % (len(toks), a.val))
    try:
        os.makedirs(a.output, exist_ok=True)
    except OSError as e:
        raise TokError(a.output, "cannot make the output folder: %s" % (e.strerror or e))
    train = os.path.join(a.output, "%s_train.bin" % a.name)
    val = os.path.join(a.output, "%s_val.bin" % a.name)
    for out in (train, val):  # an output never replaces an input (issue 77)
        for t in a.text + ([a.tokenizer] if a.tokenizer else []):
            if os.path.exists(out) and os.path.exists(t) and os.path.samefile(out, t):
                raise TokError(out, "is the input %s: writing it would replace it; give -o or "
                               "--name another value" % t)
    cut = len(toks) - n_val
    # both splits in one format: uint32 where the vocabulary passes 65,536
    wide = max(toks) > 65535 or (a.tokenizer is not None and
                                 hf_tokenizer(a.tokenizer).get_vocab_size() > 65536)
    for path, part in ((train, toks[:cut]), (val, toks[cut:])):
        try:
            write_tokens(path, part, wide)
        except OSError as e:
            raise TokError(path, "cannot write: %s" % (e.strerror or e))
    print("%s: %d tokens, %s: %d tokens (%s, largest id %d%s)"
          % (train, cut, val, n_val, a.tokenizer or a.encoding, max(toks),
             ", uint32 files" if wide else ""))
    h, x = unigram_entropy(toks, toks[:cut], toks[cut:])
    print("unigram entropy: %.4f nats per token over the corpus; the validation split's "
          "cross-entropy under the training split's frequencies: %.4f (the losses of a model "
          "that knows only how often each token occurs)" % (h, x))
    return 0


def unigram_entropy(toks, train, val):
    """The entropy of the token frequencies of toks (the whole corpus), and
the validation split's cross-entropy under the training split's
frequencies (add-one smoothed over the tokens either split has, so a token
the training split lacks costs a finite amount), both in nats per
token."""
    def counts(seq):
        c = {}
        for t in seq:
            c[t] = c.get(t, 0) + 1
        return c
    whole, tr = counts(toks), counts(train)
    n = len(toks)
    h = -sum(c / n * math.log(c / n) for c in whole.values())
    total = len(train) + len(set(tr) | set(val))
    x = -sum(math.log((tr.get(t, 0) + 1) / total) for t in val) / max(len(val), 1)
    return h, x


def cmd_decode(a):
    out = decode_tokens(read_tokens(a.file), a.encoding, a.file, a.tokenizer)
    sys.stdout.buffer.write(out)
    return 0


def cmd_ids(a):
    """The ids of a prompt, comma-separated, as gpipe-sample --prompt-ids
    takes them (a document's start, as encode writes one)."""
    # the argument's bytes as given: Python decoded argv with
    # surrogateescape, which .encode("utf-8") cannot undo for bytes not UTF-8
    data = sys.stdin.buffer.read() if a.text == "-" else os.fsencode(a.text)
    enc, hf = encoders(a.encoding, a.tokenizer)
    toks = encode_bytes(data, "the text" if a.text != "-" else "stdin", enc, hf)
    if not toks:
        raise TokError("the text", "is empty; give at least one character")
    print(",".join(str(t) for t in toks))
    return 0


def cmd_encodings(a):
    print("bytes: yes (byte-level, 256 tokens)")
    try:
        gpt2_encoding()
        print("gpt2: yes (tiktoken, cached)")
    except TokError as e:
        print("gpt2: no: %s" % e.problem)
    try:
        import tokenizers
        print("--tokenizer: yes (tokenizers %s reads a tokenizer.json)" % tokenizers.__version__)
    except ImportError:
        print("--tokenizer: no: the tokenizers library is not installed (pip install tokenizers)")
    return 0


def main(argv=None):
    p = parser_raising(TokError)(prog="tokenize_text.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="text files -> NAME_train.bin and NAME_val.bin")
    e.add_argument("text", nargs="+", help="text files, joined in this order")
    e.add_argument("-o", "--output", required=True, help="the folder to write the splits in")
    e.add_argument("--name", default="tokens", help="file name prefix (default tokens)")
    e.add_argument("--val", type=float, default=0.1,
                   help="the fraction of the tokens, from the end, for validation (0.1)")
    e.add_argument("--encoding", choices=("bytes", "gpt2"), default="bytes")
    e.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (instead of --encoding)")
    d = sub.add_parser("decode", help="a token file -> text on stdout")
    d.add_argument("file")
    d.add_argument("--encoding", choices=("bytes", "gpt2"), default="bytes")
    d.add_argument("--tokenizer", help="the tokenizer.json the file was encoded with")
    i = sub.add_parser("ids", help="a prompt -> its ids, comma-separated, for gpipe-sample "
                       "--prompt-ids")
    i.add_argument("text", help="the prompt itself ('-': read it from stdin)")
    i.add_argument("--encoding", choices=("bytes", "gpt2"), default="bytes")
    i.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (instead of --encoding)")
    sub.add_parser("encodings", help="which encodings this machine has")
    a = p.parse_args(argv)
    return {"encode": cmd_encode, "decode": cmd_decode, "ids": cmd_ids,
            "encodings": cmd_encodings}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(run_cli("tokenize_text.py", main))
