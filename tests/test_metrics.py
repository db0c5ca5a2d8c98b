#!/usr/bin/python3
"""test_metrics.py — scripts/metrics.py (plot, summary, compare) on metrics
files written here with known values, and on a real gpipe-train run.

  (a) summary --json and the text table against numbers computed here from
      the records the test wrote (sorted-list medians and quartiles, maxima,
      the last and best evaluation), for a file holding a resumed run: a
      second run appended from step 21 on, whose records replace the first
      run's from there (and the first run's evaluation at step 30 with
      them); a NaN loss written as null;
  (b) compare: B twice as fast as A -> "B ... is 2.000x as fast", the
      ratio's range from the middle halves, not within the spread; two runs
      whose spreads overlap -> "within the spread"; --json's verdict;
  (c) plot --describe: the seven panels, each run's lines in each (train
      and test for loss and accuracy, one line per device for memory), the
      resumed run as one line of 40 steps; a PNG of the --size asked;
  (d) a real gpipe-train run (2 CPU devices, clipping, an evaluation):
      summary's peak per device and final test accuracy equal the file's,
      and plot draws every panel with data;
  (e) every kind of bad input or argument (empty, cut inside its first
      record, foreign JSON Lines, one JSON document, not JSON, a missing
      key, a wrong type, a directory, unreadable, missing, not UTF-8, an
      unknown subcommand, compare with one file, an -o that cannot be
      written, --size abc) exits 2 with one line on stderr naming the file
      or argument, never a traceback;
  (f) a last line cut short (a file copied mid-write) is left out with one
      warning, the records before it read;
  (g) null (NaN) epochs and losses among numbers.

Runs with Debian's /usr/bin/python3 (matplotlib from python3-matplotlib).
Needs GPIPE_BINARY_DIR (set by CTest) for gpipe-train.  Prints
"test_metrics: N passed, N failed" last; exits non-zero on any failure.
"""
import math
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

from gpt_util import check, close, finish

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.dirname(HERE))
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
SCRIPT = os.path.join(SRC, "scripts", "metrics.py")
PANELS = ["loss", "accuracy", "learning rate", "samples/s", "data wait (ms)", "grad norm",
          "peak memory (MiB)"]

def script(*args):
    return subprocess.run(["/usr/bin/python3", SCRIPT] + list(args), capture_output=True,
                          text=True)


def out_json(r, first_line=False):
    """The JSON a run printed, or {} (a failure the checks then report)."""
    try:
        return json.loads(r.stdout.splitlines()[0] if first_line else r.stdout)
    except (ValueError, IndexError):
        print("(no JSON from metrics.py: %r)" % r.stderr[-300:])
        return {}


# The oracle: plain sorted-list order statistics, numpy's default (linear)
# interpolation written out, not the script's code.
def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def pct(xs, q):
    s = sorted(xs)
    pos = (len(s) - 1) * q
    i = int(pos)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (pos - i)


def step_record(step, rng, speed=1.0, loss=None):
    secs = rng.uniform(0.09, 0.11) / speed
    return {"step": step, "epoch": 1 + (step - 1) // 20,
            "loss": rng.uniform(0.2, 2.0) if loss is None else loss,
            "accuracy": rng.uniform(0, 1), "lr": 0.01 * step,
            "samples_per_s": round(64 / secs, 1), "step_seconds": round(secs, 6),
            "data_wait_seconds": round(rng.uniform(0, 0.01), 6),
            "grad_norm": rng.uniform(1, 5),
            "devices": [{"name": "cpu:0", "peak_bytes": rng.randrange(1 << 20, 1 << 24),
                         "current_bytes": 100, "host_waits": 1},
                        {"name": "cpu:1", "peak_bytes": rng.randrange(1 << 20, 1 << 24),
                         "current_bytes": 100, "host_waits": 1}]}


def eval_record(step, acc, final=False):
    r = {"eval": True, "step": step, "epoch": 1 + (step - 1) // 20, "test_loss": 1 - acc,
         "test_accuracy": acc}
    if final:
        r["final"] = True
    return r


def write(path, records, tail=""):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, allow_nan=False) if not isinstance(r, str) else r)
            f.write("\n")
        f.write(tail)


def resumed_file(tmp, rng):
    """Steps 1..30 (evaluations at 20 and 30), then a run resumed from the
    snapshot of step 20 appending steps 21..40 (evaluation at 40, final).
    -> (path, the records a single run would have left)."""
    first = [step_record(s, rng) for s in range(1, 31)]
    ev1 = [eval_record(20, 0.61), eval_record(30, 0.97)]   # 0.97: dropped with its run
    second = [step_record(s, rng) for s in range(21, 41)]
    second[4]["loss"] = None                                 # NaN, as gpipe writes it
    ev2 = [eval_record(40, 0.74, final=True)]
    recs = first[:20] + [ev1[0]] + first[20:] + [ev1[1]] + second + ev2
    path = os.path.join(tmp, "resumed.jsonl")
    write(path, recs)
    return path, first[:20] + second, [ev1[0], ev2[0]]


def test_summary(tmp):
    rng = random.Random(52)
    path, steps, evals = resumed_file(tmp, rng)
    r = script("summary", path, "--json")
    check(r.returncode == 0, "summary --json exits 0: %s" % r.stderr)
    s = (out_json(r) or [{}])[0]
    check(s["steps"] == 40 and s["first_step"] == 1 and s["last_step"] == 40,
          "the resumed file is one run of steps 1..40: %r" % s["steps"])
    check(s["restarts"] == 1, "one resume seen")
    w = 40 // 10
    check(s["warmup_steps"] == w, "warm-up: the first 10%% of the steps (%d)" % w)
    secs = [x["step_seconds"] for x in steps[w:]]
    sps = [x["samples_per_s"] for x in steps[w:]]
    check(close(s["step_seconds_median"], median(secs)), "median step time after warm-up")
    check(close(s["step_seconds_p25"], pct(secs, 0.25)) and
          close(s["step_seconds_p75"], pct(secs, 0.75)), "step time quartiles")
    check(close(s["samples_per_s_median"], median(sps)), "median samples/s after warm-up")
    check(close(s["data_wait_share"], sum(x["data_wait_seconds"] for x in steps[w:]) / sum(secs)),
          "data wait share of the step time")
    check(close(s["final_test_accuracy"], 0.74) and s["final_test_step"] == 40,
          "final test accuracy: the resumed run's final evaluation")
    check(close(s["best_test_accuracy"], 0.74) and s["best_test_step"] == 40,
          "best test accuracy: 0.74, not the replaced run's 0.97 at step 30")
    for d in ("cpu:0", "cpu:1"):
        want = max(x["devices"][int(d[-1])]["peak_bytes"] for x in steps)
        check(s["peak_bytes"].get(d) == want, "peak memory of %s: %r vs %r"
              % (d, s["peak_bytes"].get(d), want))
    check(close(s["final_loss"], steps[-1]["loss"]), "final train loss")
    check(close(s["final_test_loss"], 1 - 0.74) and close(s["lowest_test_loss"], 1 - 0.74)
          and s["lowest_test_step"] == 40,
          "final and lowest validation loss: the resumed run's (not the replaced 0.03)")
    r = script("summary", path, "--warmup", "10", "--json")
    s10 = (out_json(r) or [{}])[0]
    check(s10["warmup_steps"] == 10 and close(
        s10["step_seconds_median"], median([x["step_seconds"] for x in steps[10:]])),
        "--warmup 10 leaves out the first 10 steps")
    # a warm-up as long as the run: clipped to leave one step, and said
    r = script("summary", path, "--warmup", "100000", "--json")
    sw = (out_json(r) or [{}])[0]
    check(r.returncode == 0 and sw.get("warmup_steps") == len(steps) - 1 and
          "--warmup 100000 would leave none to time; left out %d" % (len(steps) - 1) in r.stderr,
          "--warmup past the run's steps: clipped and warned: %r %r" % (sw.get("warmup_steps"),
                                                                      r.stderr[-300:]))
    # the text table says the same numbers
    r = script("summary", path)
    check(r.returncode == 0, "summary exits 0")
    out = r.stdout
    check("final test accuracy      0.7400 (step 40)" in out, "table: final test accuracy")
    check("final test loss          %.4f (%.4f bits; step 40)" % (0.26, 0.26 / math.log(2))
          in out, "table: the validation loss a language model is judged by, and its bits: %r"
          % out)
    check("%.3f ms" % (median(secs) * 1e3) in out, "table: median step time in ms")
    check("%.1f (middle half" % median(sps) in out, "table: median samples/s")
    check("peak memory cpu:1        %.1f MiB" % (s["peak_bytes"]["cpu:1"] / 2**20) in out,
          "table: peak memory per device")
    # two runs: one table each, in the order given
    other = os.path.join(tmp, "other.jsonl")
    write(other, [step_record(s, rng) for s in range(1, 6)])
    r = script("summary", path, other)
    check(r.returncode == 0 and r.stdout.count("final test accuracy") == 2 and
          r.stdout.index("resumed (") < r.stdout.index("other ("),
          "summary of several runs prints a table each: %r" % r.stdout[:200])
    return path


def test_compare(tmp):
    rng = random.Random(7)
    a = [step_record(s, rng, speed=1.0) for s in range(1, 51)]
    b = [step_record(s, rng, speed=2.0) for s in range(1, 51)]
    pa, pb = os.path.join(tmp, "a.jsonl"), os.path.join(tmp, "b.jsonl")
    write(pa, a + [eval_record(50, 0.8, True)])
    write(pb, b + [eval_record(50, 0.9, True)])
    sa = [x["samples_per_s"] for x in a[5:]]
    sb = [x["samples_per_s"] for x in b[5:]]
    ratio = median(sb) / median(sa)
    lo, hi = pct(sb, 0.25) / pct(sa, 0.75), pct(sb, 0.75) / pct(sa, 0.25)
    r = script("compare", pa, pb)
    check(r.returncode == 0, "compare exits 0: %s" % r.stderr)
    want = "B (b) is %.3fx as fast as A (a): median %.1f vs %.1f samples/s" % (
        ratio, median(sb), median(sa))
    check(want in r.stdout, "compare says B is faster and by how much: %r in %r"
          % (want, r.stdout[-400:]))
    check("spans %.3fx..%.3fx" % (lo, hi) in r.stdout, "compare gives the ratio's spread")
    check("within the spread" not in r.stdout, "2x apart is not within the spread")
    row = [l for l in r.stdout.splitlines() if l.startswith("median step time")]
    sta = median([x["step_seconds"] for x in a[5:]])
    stb = median([x["step_seconds"] for x in b[5:]])
    check(row and row[0].split()[-1] == "%.3f" % ((stb * 1e3) / (sta * 1e3)),
          "compare's step time B/A: %r" % row)
    row = [l for l in r.stdout.splitlines() if l.startswith("warm-up left out")]
    check(row and row[0].split()[-1] == "-", "no ratio of the warm-up's counts: %r" % row)
    r = script("compare", pa, pb, "--json")
    v = out_json(r).get("verdict", {})
    check(v["faster"] == "B" and close(v["ratio"], ratio) and not v["within_spread"],
          "compare --json verdict: %r" % v)
    # A against a run of the same speed: the spreads overlap
    c = [step_record(s, rng, speed=1.0) for s in range(1, 51)]
    pc = os.path.join(tmp, "c.jsonl")
    write(pc, c)
    r = script("compare", pa, pc)
    check(r.returncode == 0 and "within the spread" in r.stdout,
          "same-speed runs: within the spread: %r" % r.stdout[-300:])
    # B as A: A is faster
    r = script("compare", pb, pa)
    check(r.stdout.splitlines()[-1].startswith("A (b) is %.3fx as fast as B (a)" % ratio),
          "compare the other way round names A: %r" % r.stdout.splitlines()[-1])
    # two runs of one file name are told apart by their folders, both of
    # them (the second kept the bare name); the same file twice by number
    for sub in ("r1", "r2"):
        os.makedirs(os.path.join(tmp, sub), exist_ok=True)
        write(os.path.join(tmp, sub, "run.jsonl"), a)
    r = script("compare", os.path.join(tmp, "r1", "run.jsonl"),
               os.path.join(tmp, "r2", "run.jsonl"))
    check(r.returncode == 0 and "A = r1/run " in r.stdout and "B = r2/run " in r.stdout,
          "one file name in two folders: %r" % r.stdout[:300])
    r = script("compare", pa, pa)
    check(r.returncode == 0 and "A = %s/a #1 " % os.path.basename(tmp) in r.stdout and
          "B = %s/a #2 " % os.path.basename(tmp) in r.stdout,
          "one file twice: %r" % r.stdout[:300])
    return pa, pb


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def test_plot(tmp, resumed, pa):
    png = os.path.join(tmp, "curves.png")
    r = script("plot", resumed, pa, "-o", png, "--size", "900x1000", "--describe")
    check(r.returncode == 0, "plot exits 0: %s" % r.stderr)
    d = out_json(r, True) or {"panels": []}
    titles = [p["title"] for p in d["panels"]]
    check(titles == PANELS, "plot draws the seven panels: %r" % titles)
    byt = {p["title"]: p["lines"] for p in d["panels"]}
    for t in PANELS:
        runs = {ln["run"] for ln in byt[t]}
        check(runs == {"resumed", "a"}, "panel %s has both runs: %r" % (t, runs))
    loss = [(ln["run"], ln["label"], ln["points"]) for ln in byt["loss"]]
    check(("resumed", "train", 40) in loss and ("resumed", "test", 2) in loss and
          ("a", "train", 50) in loss and ("a", "test", 1) in loss,
          "loss: train per step and test per evaluation, the resumed run as one: %r" % loss)
    mem = [(ln["run"], ln["label"]) for ln in byt["peak memory (MiB)"]]
    check(sorted(mem) == [("a", "cpu:0"), ("a", "cpu:1"), ("resumed", "cpu:0"),
                          ("resumed", "cpu:1")], "one memory line per run and device: %r" % mem)
    check(png_size(png) == (900, 1000), "a PNG of the size asked: %r" % (png_size(png),))


REAL = """\
model:
  input: [1, 8, 8]
  layers:
    - flatten
    - linear: {out: 32}
    - relu
    - linear: {out: 10}
  loss: cross_entropy
pipeline: {devices: [cpu:0, cpu:1], chunks: 2}
data: {dataset: synthetic, synthetic: {train: 256, test: 64, shape: [1, 8, 8]}}
train: {steps: 12, batch_size: 16, seed: 1, clip_grad_norm: 1.0,
        optimizer: {type: sgd, lr: 0.05}}
"""


def test_real(tmp):
    cfg = os.path.join(tmp, "real.yaml")
    with open(cfg, "w") as f:
        f.write(REAL)
    met = os.path.join(tmp, "real.jsonl")
    r = subprocess.run([os.path.join(BIN, "gpipe-train"), cfg, "--metrics", met,
                        "--no-progress"], capture_output=True, text=True)
    check(r.returncode == 0, "gpipe-train exits 0: %s" % r.stderr[-600:])
    if r.returncode != 0:
        return
    recs = [json.loads(l) for l in open(met)]
    steps = [x for x in recs if not x.get("eval")]
    evals = [x for x in recs if x.get("eval")]
    check(len(steps) == 12 and evals, "the real run wrote 12 steps and an evaluation")
    r = script("summary", met, "--json")
    check(r.returncode == 0, "summary of a real run exits 0: %s" % r.stderr)
    s = (out_json(r) or [{}])[0]
    for d in ("cpu:0", "cpu:1"):
        want = max(dv["peak_bytes"] for x in steps for dv in x["devices"] if dv["name"] == d)
        check(s["peak_bytes"].get(d) == want, "real run: peak of %s" % d)
    check(close(s["final_test_accuracy"], evals[-1]["test_accuracy"]),
          "real run: final test accuracy")
    check(close(s["step_seconds_median"], median([x["step_seconds"] for x in steps[1:]])),
          "real run: median step time after one warm-up step")
    png = os.path.join(tmp, "real.png")
    r = script("plot", met, "-o", png, "--describe")
    check(r.returncode == 0, "plot of a real run exits 0: %s" % r.stderr)
    d = out_json(r, True) or {"panels": []}
    empty = [p["title"] for p in d["panels"] if not p["lines"]]
    check(not empty, "a real run with clipping fills every panel (empty: %r)" % empty)
    check(png_size(png) is not None, "plot of a real run writes a PNG")


def test_bad(tmp, good):
    def f(name, text, mode="w"):
        p = os.path.join(tmp, name)
        with open(p, mode) as fh:
            fh.write(text)
        return p
    line = json.dumps(step_record(1, random.Random(1)))
    no_loss = json.loads(line)
    del no_loss["loss"]
    wrong = json.loads(line)
    wrong["step_seconds"] = "fast"
    d = os.path.join(tmp, "adir.jsonl")
    os.mkdir(d)
    unreadable = f("unreadable.jsonl", line + "\n")
    if os.geteuid() == 0:
        unreadable = "/proc/self/mem"   # opens, but reading it fails (root reads anything)
    else:
        os.chmod(unreadable, 0)
    cases = [
        ("empty", ["summary", f("empty.jsonl", "")], "empty: no records"),
        ("cut inside its first record", ["summary", f("cut.jsonl", line[:57])],
         "cut short inside its first record"),
        ("foreign JSON Lines", ["summary", f("foreign.jsonl", '{"name": "x", "value": 1}\n')],
         "not a gpipe --metrics"),
        ("one JSON document (a trace)", ["summary", f("trace.json",
                                                      '{\n "traceEvents": []\n}\n')],
         "one JSON document"),
        ("not JSON", ["summary", f("text.jsonl", "step 1 loss 2.3\n")], "not JSON Lines: line 1"),
        ("an array per line", ["summary", f("arr.jsonl", "[1, 2]\n")],
         "line 1 is an array, not a record"),
        ("a missing key", ["summary", f("noloss.jsonl", json.dumps(no_loss) + "\n")],
         'without "loss"'),
        ("a wrong type", ["compare", good, f("wrong.jsonl", json.dumps(wrong) + "\n")],
         '"step_seconds" is a string'),
        ("only evaluations", ["summary", f("evals.jsonl",
                                           json.dumps(eval_record(1, 0.5)) + "\n")],
         "no step records"),
        ("a directory", ["plot", d, "-o", os.path.join(tmp, "x.png")], "is a directory"),
        ("unreadable", ["summary", unreadable], "cannot read"),
        ("missing", ["summary", os.path.join(tmp, "nope.jsonl")], "file not found"),
        ("not UTF-8", ["summary", f("bin.jsonl", b"\x89PNG\r\n\x1a\n\xff\xfe", "wb")],
         "not UTF-8"),
        ("an unknown subcommand", ["plots", good], "invalid choice"),
        ("compare with one file", ["compare", good], "required"),
        ("plot without -o", ["plot", good], "-o"),
        ("an -o that cannot be written", ["plot", good, "-o",
                                          os.path.join(tmp, "no", "dir", "c.png")],
         "cannot write"),
        ("an unknown picture format", ["plot", good, "-o", os.path.join(tmp, "c.xyz")],
         "unknown picture format"),
        ("--size abc", ["plot", good, "-o", os.path.join(tmp, "c.png"), "--size", "abc"],
         "--size abc"),
        ("--warmup -1", ["summary", good, "--warmup", "-1"], "--warmup"),
    ]
    for what, args, says in cases:
        r = script(*args)
        lines = r.stderr.splitlines()
        ok = (r.returncode == 2 and len(lines) == 1 and lines[0].startswith("metrics.py: ")
              and "Traceback" not in r.stderr and says in lines[0] and not r.stdout)
        check(ok, "bad input, %s: exit 2 and one line saying %r (got %d, %r)"
              % (what, says, r.returncode, r.stderr[-300:]))
    check(len(cases) >= 10, "at least 10 kinds of bad input")
    check(not os.path.exists(os.path.join(tmp, "c.png")), "a refused plot leaves no file")


def test_torn(tmp):
    rng = random.Random(3)
    recs = [step_record(s, rng) for s in range(1, 11)]
    p = os.path.join(tmp, "torn.jsonl")
    write(p, recs, tail=json.dumps(step_record(11, rng))[:40])
    r = script("summary", p, "--json")
    warn = r.stderr.splitlines()
    check(r.returncode == 0 and len(warn) == 1 and "warning" in warn[0] and
          "10 complete records" in warn[0], "a torn last line: one warning: %r" % r.stderr)
    if r.returncode == 0:
        s = (out_json(r) or [{}])[0]
        check(s["steps"] == 10 and s["last_step"] == 10, "the torn line is left out")


def test_nulls(tmp):
    """NaN is written as null: a null epoch or loss among numbers is read
    as NaN and left out of maxima, not a crash (int(max(NaN, 1)) was)."""
    rng = random.Random(5)
    recs = [step_record(s, rng) for s in range(1, 6)]
    recs[0]["epoch"] = None
    recs[-1]["loss"] = None
    p = os.path.join(tmp, "nulls.jsonl")
    write(p, recs)
    r = script("summary", p, "--json")
    check(r.returncode == 0, "nulls: summary exits 0: %r" % r.stderr)
    s = (out_json(r) or [{}])[0]
    check(s.get("epochs") == 1 and s.get("final_loss", 0) is None,
          "nulls: epochs from the numbers, a NaN final loss as null: %r" % s)
    # samples/s of 0 in most steps of B (a foreign writer's; gpipe never
    # writes 0): compare still says which is faster, its range open-ended
    for x in recs[:4]:
        x["samples_per_s"] = 0
    q = os.path.join(tmp, "zeros.jsonl")
    write(q, recs)
    r = script("compare", os.path.join(tmp, "a.jsonl"), q)
    check(r.returncode == 0 and "A (a) is faster: B (zeros) has a median of 0" in r.stdout,
          "zero samples/s: compare names A faster, the spread open: %r %r"
          % (r.stdout[-200:], r.stderr))


def main():
    def guarded(fn, *args):
        """A part that raises (metrics.py printed no JSON, or none of what
        it should) is a failure, and the other parts still run."""
        try:
            return fn(*args)
        except Exception as e:
            check(False, "%s raised %s: %s" % (fn.__name__, type(e).__name__, e))
            return None
    with tempfile.TemporaryDirectory(prefix="gpipe-metrics-") as tmp:
        resumed = guarded(test_summary, tmp) or os.path.join(tmp, "resumed.jsonl")
        pa = (guarded(test_compare, tmp) or (os.path.join(tmp, "a.jsonl"),))[0]
        guarded(test_plot, tmp, resumed, pa)
        guarded(test_real, tmp)
        guarded(test_bad, tmp, pa)
        guarded(test_torn, tmp)
        guarded(test_nulls, tmp)
    return finish("test_metrics")


if __name__ == "__main__":
    sys.exit(main())
