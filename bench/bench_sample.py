#!/usr/bin/python3
"""bench_sample.py — sampling speed with a KV cache: gpipe-sample against
Hugging Face transformers' generate on the same model and the same cores
(issue 66's bar: 100 tokens within 2x of transformers' generate with its
cache).

    /opt/gpipe-torch/bin/python bench/bench_sample.py [--model gpt|llama]
        [--layers 6] [--width 256] [--heads 8] [--kv-heads 4] [--vocab 8192]
        [--positions 256] [--tokens 100] [--prompt 8] [--threads 2]
        [--rounds 3]

transformers makes the model (GPT2LMHeadModel or LlamaForCausalLM of
those sizes, a random init with weights normal(0, 0.2) so that the greedy
choices are clear), save_pretrained writes it, and gpipe reads that very
folder (model.init_from: Hugging Face's GPT-2 safetensors, or a Llama
folder), so both run the same weights in FP32 on --threads threads
(torch.set_num_threads; gpipe on one CPU device with pipeline.threads).

Timed, the best of --rounds (the programs alternate):
  - transformers: model.generate(prompt, max_new_tokens = N, greedy,
    use_cache) with the end-of-text token off, in this process (no start-up,
    no load), for N = --tokens and N = 1;
  - gpipe: the whole gpipe-sample process (start, config, reading the
    weights, then the tokens) for --tokens and for 1 token, with the cache
    (the default) and with --no-cache (the window of T = --positions).
The bar is the whole gpipe-sample process for --tokens against generate's
--tokens; "per token" is (time for N - time for 1) / (N - 1) on each side,
the cost of a new token once the prompt is in.  The greedy ids of both
are compared and printed (equal, or where they part).  The first lines
name the processor and the versions.  Prints; never fails a build.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, HERE)

from bench_loader import cpu_name  # noqa: E402  (the processor line of every CPU table)


def hf_model(a):
    import torch
    import transformers
    torch.manual_seed(1)
    if a.model == "gpt":
        cfg = transformers.GPT2Config(vocab_size=a.vocab, n_positions=a.positions,
                                      n_embd=a.width, n_layer=a.layers, n_head=a.heads,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        m = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=a.vocab, hidden_size=a.width, intermediate_size=a.width * 11 // 4,
            num_hidden_layers=a.layers, num_attention_heads=a.heads,
            num_key_value_heads=a.kv_heads, max_position_embeddings=a.positions,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
            attn_implementation="sdpa")
        m = transformers.LlamaForCausalLM(cfg)
    m = m.float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name or name.endswith("ln_1.weight") or name.endswith("ln_2.weight") \
                    or name.endswith("ln_f.weight"):
                continue
            p.normal_(0.0, 0.2 if p.dim() > 1 else 0.02)
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return m


def gpipe_yaml(a, folder):
    if a.model == "gpt":
        fam = ("  gpt: {layers: %d, heads: %d, width: %d, positions: %d, vocab: %d, tie: true}"
               % (a.layers, a.heads, a.width, a.positions, a.vocab))
        init = os.path.join(folder, "model.safetensors")
    else:
        fam = ("  llama: {layers: %d, heads: %d, kv_heads: %d, width: %d, intermediate: %d,"
               " vocab: %d, positions: %d, rope_theta: 500000, rms_eps: 1e-5, tie: true}"
               % (a.layers, a.heads, a.kv_heads, a.width, a.width * 11 // 4, a.vocab,
                  a.positions))
        init = folder
    return "\n".join(["model:", "  input: [%d]" % a.positions, fam, "  init_from: %s" % init,
                      "  loss: cross_entropy",
                      "pipeline: {devices: [cpu:0], threads: %d}" % a.threads,
                      "data: {dataset: synthetic}", "train: {batch_size: 1, seed: 1}", ""])


def gpipe_run(cfg, prompt, n, extra=()):
    t0 = time.perf_counter()
    r = subprocess.run([os.path.join(BIN, "gpipe-sample"), cfg, "--prompt-ids",
                        ",".join(map(str, prompt)), "--tokens", str(n), "--temperature", "0",
                        "--ids", "-q"] + list(extra), capture_output=True, text=True,
                       timeout=3600)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit("gpipe-sample failed: %s" % r.stderr[-2000:])
    return dt, [int(t) for t in r.stdout.split(" | ")[1].split()]


def hf_run(m, prompt, n):
    import torch
    x = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = m.generate(x, max_new_tokens=n, do_sample=False, use_cache=True)
        dt = time.perf_counter() - t0
    return dt, out[0, len(prompt):].tolist()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["gpt", "llama"], default="llama")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--positions", type=int, default=256)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    import torch
    import transformers
    torch.set_num_threads(a.threads)
    print("%s; torch %s, transformers %s; %d threads" % (
        cpu_name(), torch.__version__, transformers.__version__, a.threads))
    m = hf_model(a)
    params = sum(p.numel() for p in m.parameters())
    print("model: %s, %d layers, width %d, %d heads%s, vocabulary %d, T %d: %.2fM parameters "
          "(tied)" % (a.model, a.layers, a.width, a.heads,
                      " (%d k/v)" % a.kv_heads if a.model == "llama" else "", a.vocab,
                      a.positions, params / 1e6))
    prompt = [(7 * i + 3) % a.vocab for i in range(a.prompt)]
    with tempfile.TemporaryDirectory(prefix="gpipe-bench-sample-") as d:
        folder = os.path.join(d, "hf")
        m.save_pretrained(folder, safe_serialization=True)
        cfg = os.path.join(d, "m.yaml")
        with open(cfg, "w") as f:
            f.write(gpipe_yaml(a, folder))
        best = {}
        ids = {}
        for r in range(a.rounds):
            for key, fn in (("hf", lambda n: hf_run(m, prompt, n)),
                            ("cache", lambda n: gpipe_run(cfg, prompt, n)),
                            ("window", lambda n: gpipe_run(cfg, prompt, n, ["--no-cache"]))):
                if key == "window" and r > 0 and best.get(("window", a.tokens), 0) > 60:
                    continue  # one round of a slow window is enough
                for n in (1, a.tokens):
                    dt, got = fn(n)
                    best[(key, n)] = min(best.get((key, n), dt), dt)
                    if n == a.tokens:
                        ids[key] = got
        N = a.tokens
        per = {k: (best[(k, N)] - best[(k, 1)]) / (N - 1) for k in ("hf", "cache", "window")}
        print("%d tokens after a prompt of %d, best of %d:" % (N, a.prompt, a.rounds))
        print("  transformers generate (cache):  %7.3f s  (1 token %.3f s; %.2f ms a token)"
              % (best[("hf", N)], best[("hf", 1)], 1e3 * per["hf"]))
        for k, what in (("cache", "gpipe-sample (cache)"), ("window", "gpipe-sample --no-cache")):
            print("  %-31s %7.3f s  (1 token %.3f s; %.2f ms a token): whole process %.2fx "
                  "generate's time, per token %.2fx" % (
                      what + ":", best[(k, N)], best[(k, 1)], 1e3 * per[k],
                      best[(k, N)] / best[("hf", N)], per[k] / per["hf"]))
        for k in ("cache", "window"):
            same = ids[k] == ids["hf"]
            first = next((i for i in range(N) if ids[k][i] != ids["hf"][i]), None)
            print("  greedy ids, gpipe %s against transformers: %s" % (
                k, "equal" if same else "part at token %s" % first))


if __name__ == "__main__":
    main()
