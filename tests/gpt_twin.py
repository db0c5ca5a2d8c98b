#!/usr/bin/python3
"""gpt_twin.py — a PyTorch twin of gpipe's GPT-2, the oracle of
test_gpt_parity (issue 53's parity bar).

The model is Hugging Face's GPT-2 written out small: its module names
(transformer.wte, transformer.h.<i>.attn.c_attn, ..., lm_head), its Conv1D
projections whose weights are stored (in, out), pre-norm blocks, causal
attention with q, k, v side by side in c_attn's output and each head a run
of C/H columns of each, GPT-2's tanh GELU, LayerNorm eps 1e-5, FP32.  No
Hugging Face package is needed: the files are written and read here with
the standard library and torch.

    gpt_twin.py init OUTDIR --vocab V --dim C --layers L --heads H
                --positions P [--head own|copy|tied] [--seed S]
        random weights (every tensor, biases and norms included, so a
        tensor put in the wrong place shows) into OUTDIR/twin.safetensors
        (Hugging Face's layout and names, without "transformer.", with the
        attn.bias mask buffers and, but for --head copy, lm_head.weight) and
        OUTDIR/twin.bin (llm.c's version 3 checkpoint, vocabulary padded to
        a multiple of 128); and the weights rounded to bfloat16 as
        twin-bf16.safetensors (BF16) and twin-bf16.bin (llm.c's version 5),
        beside twin-bf16-f32.* holding the same values in FP32.
    gpt_twin.py train WEIGHTS DATADIR --heads H --seq T --batch B
                --steps N --lr LR --momentum MU [--head ...]
        loads WEIGHTS (either format, or gpipe's export of them), trains N
        steps of torch.optim.SGD on the windows of DATADIR/twin_train.bin
        in order (T + 1 tokens each, B a step), and prints one JSON line:
        {"losses": [...]}.
    gpt_twin.py eval WEIGHTS DATADIR --heads H --seq T [--head ...]
        prints {"loss": mean cross-entropy over every window of
        DATADIR/twin_val.bin, as one batch}.

--head: own = lm_head is a parameter of its own (read from the file, or
wte's copy where the file has none, as llm.c's has none); copy = always
wte's copy, a parameter of its own; tied = the same parameter as wte.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

LLMC_MAGIC = 20240326
TOKENS_MAGIC = 20240520
# The attention written out (the parity tests' oracle, and PyTorch 1.13's
# only path) or, set True by bench/bench_gpt_gpu.py, torch's fused
# scaled_dot_product_attention, what a PyTorch 2 user's GPU run takes.
FUSED_ATTENTION = False
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: y = x @ weight + bias, weight (in, out)."""

    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.empty(nout))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(c, 3 * c)
        self.c_proj = Conv1D(c, c)

    def forward(self, x):
        n, t, c = x.shape
        hs = c // self.heads
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(n, t, self.heads, hs).transpose(1, 2) for z in (q, k, v))
        if FUSED_ATTENTION:  # PyTorch 2's fused kernel (flash attention on a GPU)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(n, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(c, 4 * c)
        self.c_proj = Conv1D(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.attn = Attention(c, heads)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, c, layers, heads, positions, head):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, c), wpe=nn.Embedding(positions, c),
            h=nn.ModuleList(Block(c, heads) for _ in range(layers)),
            ln_f=nn.LayerNorm(c, eps=1e-5)))
        self.lm_head = nn.Linear(c, vocab, bias=False)
        if head == "tied":
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for b in self.transformer.h:
            x = b(x)
        return self.lm_head(self.transformer.ln_f(x))


# ---- files ----------------------------------------------------------------

def bf16_bytes(a):
    """a (float32) as bfloat16: its upper 16 bits (a already rounded)."""
    return (np.ascontiguousarray(a, "<f4").view("<u4") >> 16).astype("<u2").tobytes()


def bf16_round(a):
    """a's values made bfloat16's (to nearest, ties to even), as float32."""
    u = np.ascontiguousarray(a, "<f4").view("<u4").astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype("<u4").view("<f4")


def write_safetensors(path, tensors, bf16=False):
    """tensors: list of (name, float32 numpy array), in that order; bf16:
    stored as BF16 (the values must be bfloat16's already)."""
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, a in tensors:
        b = bf16_bytes(a) if bf16 else np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "BF16" if bf16 else "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        assert d["dtype"] == "F32", (path, name, d["dtype"])
        b, e = d["data_offsets"]
        out[name] = np.frombuffer(buf, "<f4", (e - b) // 4, 8 + n + b).reshape(d["shape"])
    return out


def llmc_order(layers):
    """llm.c's arrays: (state_dict name pattern, per block, transpose from
    Conv1D's (in, out) to llm.c's (out, in))."""
    per = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
           ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
           ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
           ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]
    return ([("transformer.wte.weight", False), ("transformer.wpe.weight", False)] +
            [(["transformer.h.%d.%s" % (i, p) for i in range(layers)], t) for p, t in per] +
            [("transformer.ln_f.weight", False), ("transformer.ln_f.bias", False)])


def write_llmc(path, sd, heads, bf16=False):
    """version 3 (FP32), or 5 (BF16: the values must be bfloat16's)."""
    v, c = sd["transformer.wte.weight"].shape
    layers = sum(1 for k in sd if k.endswith(".ln_1.weight"))
    vp = (v + 127) // 128 * 128
    hdr = [0] * 256
    hdr[:8] = [LLMC_MAGIC, 5 if bf16 else 3, sd["transformer.wpe.weight"].shape[0], v, layers,
               heads, c, vp]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        for names, t in llmc_order(layers):
            for nm in names if isinstance(names, list) else [names]:
                a = sd[nm].T if t else sd[nm]
                if nm == "transformer.wte.weight":
                    a = np.concatenate([a, np.zeros((vp - v, c), np.float32)])
                f.write(bf16_bytes(a) if bf16 else np.ascontiguousarray(a, "<f4").tobytes())


def read_llmc(path):
    with open(path, "rb") as f:
        buf = f.read()
    hdr = struct.unpack("<256i", buf[:1024])
    assert hdr[0] == LLMC_MAGIC and hdr[1] == 3, (path, hdr[:2])
    maxt, v, layers, heads, c, vp = hdr[2:8]
    shapes = {"wte": (vp, c), "wpe": (maxt, c), "ln_1.weight": (c,), "ln_1.bias": (c,),
              "attn.c_attn.weight": (3 * c, c), "attn.c_attn.bias": (3 * c,),
              "attn.c_proj.weight": (c, c), "attn.c_proj.bias": (c,), "ln_2.weight": (c,),
              "ln_2.bias": (c,), "mlp.c_fc.weight": (4 * c, c), "mlp.c_fc.bias": (4 * c,),
              "mlp.c_proj.weight": (c, 4 * c), "mlp.c_proj.bias": (c,), "ln_f.weight": (c,),
              "ln_f.bias": (c,)}
    sd, off = {}, 1024
    for names, t in llmc_order(layers):
        for nm in names if isinstance(names, list) else [names]:
            key = nm.split(".", 3)[-1] if ".h." in nm else nm.split(".", 1)[1]
            key = {"wte.weight": "wte", "wpe.weight": "wpe"}.get(key, key)
            shape = shapes[key]
            cnt = int(np.prod(shape))
            a = np.frombuffer(buf, "<f4", cnt, off).reshape(shape)
            off += 4 * cnt
            sd[nm] = a.T if t else a
    assert off == len(buf), (path, off, len(buf))
    sd["transformer.wte.weight"] = sd["transformer.wte.weight"][:v]
    return sd, heads


def load(path, heads, head):
    """A GPT from a Hugging Face or llm.c file (names with or without
    "transformer."; the attn.bias buffers skipped)."""
    with open(path, "rb") as f:
        magic = struct.unpack("<i", f.read(4))[0]
    if magic == LLMC_MAGIC:
        sd, heads = read_llmc(path)
    else:
        sd = {}
        for k, a in read_safetensors(path).items():
            if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
                continue
            sd[k if k.startswith("transformer.") or k == "lm_head.weight"
               else "transformer." + k] = a
    v, c = sd["transformer.wte.weight"].shape
    layers = sum(1 for k in sd if k.endswith(".ln_1.weight"))
    m = GPT(v, c, layers, heads, sd["transformer.wpe.weight"].shape[0], head)
    if "lm_head.weight" not in sd or head == "copy":
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    if head == "tied":
        del sd["lm_head.weight"]
    own = dict(m.named_parameters())
    assert set(own) == set(sd), (sorted(set(own) ^ set(sd)))
    with torch.no_grad():
        for k, p in own.items():
            p.copy_(torch.from_numpy(np.array(sd[k], np.float32)))
    return m


def windows(path, t):
    with open(path, "rb") as f:
        buf = f.read()
    hdr = struct.unpack("<256i", buf[:1024])
    assert hdr[0] == TOKENS_MAGIC and hdr[1] == 1, path
    tok = np.frombuffer(buf, "<u2", hdr[2], 1024).astype(np.int64)
    n = len(tok) // (t + 1)
    return torch.from_numpy(tok[:n * (t + 1)].reshape(n, t + 1))


# ---- commands -------------------------------------------------------------

def cmd_init(a):
    torch.manual_seed(a.seed)
    m = GPT(a.vocab, a.dim, a.layers, a.heads, a.positions, a.head)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                    name.endswith("ln_f.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.02 * torch.randn_like(p) if p.dim() > 1 else 0.05 * torch.randn_like(p))
        if a.head == "copy":
            m.lm_head.weight.copy_(m.transformer.wte.weight)
    sd = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    hf = []
    for k, v in sd.items():
        if k == "lm_head.weight":
            # own: its own weight; tied: wte's, written out as a state_dict
            # saved whole holds it (save_pretrained leaves it out, as the
            # copy head's file does: the reader's other path)
            if a.head != "copy":
                hf.append((k, v))
            continue
        hf.append((k[len("transformer."):], v))
        if k.endswith(".attn.c_proj.bias"):  # the causal mask buffer, as old HF files hold
            mask = np.tril(np.ones((a.positions, a.positions), np.float32))
            hf.append((k[len("transformer."):-len("c_proj.bias")] + "bias",
                       mask.reshape(1, 1, a.positions, a.positions)))
    write_safetensors(a.outdir + "/twin.safetensors", hf)
    write_llmc(a.outdir + "/twin.bin", sd, a.heads)
    # the same weights rounded to bfloat16: as BF16 files, and as F32 ones
    # holding the same values (what reading the BF16 ones must give)
    sd = {k: bf16_round(v) for k, v in sd.items()}
    hf = [(k, bf16_round(v)) for k, v in hf]
    write_safetensors(a.outdir + "/twin-bf16.safetensors", hf, bf16=True)
    write_safetensors(a.outdir + "/twin-bf16-f32.safetensors", hf)
    write_llmc(a.outdir + "/twin-bf16.bin", sd, a.heads, bf16=True)
    write_llmc(a.outdir + "/twin-bf16-f32.bin", sd, a.heads)


def cmd_train(a):
    m = load(a.weights, a.heads, a.head)
    data = windows(a.data + "/twin_train.bin", a.seq)
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=a.momentum)
    losses = []
    for s in range(a.steps):
        w = data[[(s * a.batch + i) % len(data) for i in range(a.batch)]]
        logits = m(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(json.dumps({"losses": losses}))


def cmd_eval(a):
    m = load(a.weights, a.heads, a.head)
    w = windows(a.data + "/twin_val.bin", a.seq)
    with torch.no_grad():
        logits = m(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
    print(json.dumps({"loss": loss.item()}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("outdir")
    for k in ("vocab", "dim", "layers", "heads", "positions"):
        i.add_argument("--" + k, type=int, required=True)
    i.add_argument("--seed", type=int, default=0)
    for name in ("train", "eval"):
        c = sub.add_parser(name)
        c.add_argument("weights")
        c.add_argument("data")
        c.add_argument("--heads", type=int, required=True)
        c.add_argument("--seq", type=int, required=True)
        if name == "train":
            c.add_argument("--batch", type=int, required=True)
            c.add_argument("--steps", type=int, required=True)
            c.add_argument("--lr", type=float, required=True)
            c.add_argument("--momentum", type=float, default=0.0)
    for c in sub.choices.values():
        c.add_argument("--head", choices=("own", "copy", "tied"), default="own")
    a = p.parse_args()
    torch.set_num_threads(1)
    {"init": cmd_init, "train": cmd_train, "eval": cmd_eval}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
