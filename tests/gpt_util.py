"""gpt_util.py — what the Python tests share, as tests/test_util.h is for
the C ones: a check that counts passes and failures, its last line and
exit status, a relative closeness test, a venv for a test whose
packages the interpreter lacks, and transformers' defaults for a
Llama-family config.json's keys.

Imported by the tests from their own folder (Python puts a script's
folder first on sys.path, in a venv's interpreter too); not a test itself.
"""
import importlib
import json
import os
import struct
import subprocess
import sys

SKIP = 77   # CTest's SKIP_RETURN_CODE for the tests that set it

passed = failed = 0


def check(cond, what):
    """Count a check; a failed one is printed as "FAIL: what"."""
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s" % what, flush=True)
    return cond


def finish(name):
    """The last line, "NAME: N passed, N failed", and the exit status: 1 on
    any failure."""
    print("%s: %d passed, %d failed" % (name, passed, failed))
    return 1 if failed else 0


def write_tokens(path, toks):
    """An llm.c token file (data.dataset: tokens): a 256-int32 header
    (magic 20240520, version 1, the count), then the tokens as uint16."""
    hdr = [0] * 256
    hdr[:3] = [20240520, 1, len(toks)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))


def close(a, b, tol=1e-9):
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def ensure_libs(name, imports, venv, packages, reexec):
    """Returns where `imports` (a list of module names) import here; else
    runs the test again (sys.argv) under a venv at venv (made with the
    system's packages, `packages` installed into it with pip from PyPI)
    and exits with its status.  Exits SKIP, saying why, where the venv
    cannot be made or still lacks them.  reexec: the environment variable
    that marks the second run."""
    try:
        for m in imports:
            importlib.import_module(m)
        return
    except ImportError:
        pass
    if os.environ.get(reexec):
        print("%s: skipped: %s missing in the venv" % (name, "/".join(imports)))
        sys.exit(SKIP)
    py = os.path.join(venv, "bin", "python")
    # one test at a time makes the venv and installs into it (ctest -j runs
    # two tests that share one)
    import fcntl
    os.makedirs(os.path.dirname(os.path.abspath(venv)), exist_ok=True)
    lock = open(venv.rstrip("/") + ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(py):
        r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                           capture_output=True)
        if r.returncode != 0:
            print("%s: skipped: cannot make a venv:" % name, r.stderr.decode()[-300:])
            sys.exit(SKIP)
    r = subprocess.run([py, "-c", "import " + ", ".join(imports)], capture_output=True)
    if r.returncode != 0:
        r = subprocess.run([py, "-m", "pip", "install", "-q"] + packages, capture_output=True)
        if r.returncode != 0:
            print("%s: skipped: pip install %s failed:" % (name, " ".join(packages)),
                  r.stderr.decode()[-300:])
            sys.exit(SKIP)
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    env = dict(os.environ, **{reexec: "1"})
    sys.exit(subprocess.run([py, os.path.abspath(sys.argv[0])] + sys.argv[1:],
                            env=env).returncode)


def hf_loss(m, windows, t, v):
    """A transformers causal LM's mean cross-entropy (double) over windows
    of t + 1 ids: positions 0 .. t - 1 predict 1 .. t; v the vocabulary."""
    import torch
    import torch.nn.functional as F
    with torch.no_grad():
        x = torch.tensor(windows, dtype=torch.long)
        logits = m(input_ids=x[:, :t]).logits.double()
        return F.cross_entropy(logits.reshape(-1, v), x[:, 1:].reshape(-1)).item()


def hf_greedy(m, prompt, n):
    """transformers' greedy continuation: the argmax of the last position's
    logits over the whole sequence so far, n times (no cache, no
    generate(): the reference itself)."""
    import torch
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = m(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0, -1]
            ids.append(int(torch.argmax(logits).item()))
    return ids[len(prompt):]


def gpipe_greedy(binary_dir, d, yaml_text, prompt, n, positions, extra=()):
    """gpipe-sample's greedy ids for yaml_text's model with model.input
    [positions]: (ids, "") or (None, the end of its stderr)."""
    cfgp = os.path.join(d, "sample.yaml")
    with open(cfgp, "w") as f:
        f.write(yaml_text)
    r = subprocess.run([os.path.join(binary_dir, "gpipe-sample"), cfgp, "--set",
                        "model.input=[%d]" % positions, "--prompt-ids",
                        ",".join(map(str, prompt)), "--tokens", str(n), "--temperature", "0",
                        "--ids", "-q"] + list(extra), capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0 or " | " not in r.stdout:
        return None, r.stderr[-800:]
    return [int(t) for t in r.stdout.split(" | ")[1].split()], ""


def hf_llama_defaults(src, bin_dir, check, name):
    """What transformers takes where a Llama-family config.json leaves a key
    out, by model_type: {"llama": {"intermediate_size": 11008, ...},
    "mistral": ..., "qwen2": ...}: the fixture tests/data/hf_llama_defaults.json
    that scripts/hf_llama_defaults.py made with transformers, checked (with
    `check`, the test's) against the same read from bin_dir/hf-venv now where
    that has transformers; test `name` says where it has not."""
    with open(os.path.join(src, "tests", "data", "hf_llama_defaults.json")) as f:
        fixture = json.load(f)
    py = os.path.join(bin_dir, "hf-venv", "bin", "python")
    why = "no %s" % py
    if os.path.exists(py):
        r = subprocess.run([py, os.path.join(src, "scripts", "hf_llama_defaults.py")],
                           capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
        if r.returncode == 0:
            live = json.loads(r.stdout)
            fixture = dict(fixture, transformers=live["transformers"])
            check(live == fixture, "tests/data/hf_llama_defaults.json is transformers %s's: %r"
                  % (live.get("transformers"), live))
            return fixture
        why = r.stderr.strip()[-300:]
    print("%s: transformers' defaults from the fixture only (%s)" % (name, why))
    return fixture


def hf_llama_default(defaults, model_type, key, cfg):
    """The value transformers gives `key` of a config.json `cfg` (a dict)
    of model_type that leaves it out: the type's default, where that is
    null the one it derives (num_key_value_heads: num_attention_heads)."""
    d = defaults[model_type]
    v = d.get(key)
    if key == "num_key_value_heads" and v is None:
        v = cfg.get("num_attention_heads", d["num_attention_heads"])
    return v
