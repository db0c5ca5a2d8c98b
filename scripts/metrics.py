#!/usr/bin/python3
"""metrics.py — training curves, summaries and comparisons of gpipe runs.

Runs with Debian's /usr/bin/python3 and its python3-matplotlib (installed by
scripts/install-deps.sh), as scripts/timeline.py does; `summary` and
`compare` need only the standard library, `plot` draws with matplotlib.

    scripts/metrics.py plot RUN.jsonl... -o curves.png [--size WxH] [--describe]
    scripts/metrics.py summary RUN.jsonl... [--warmup N] [--json]
    scripts/metrics.py compare A.jsonl B.jsonl [--warmup N] [--json]

Input: the JSON Lines that `gpipe-train --metrics FILE` writes
(docs/timelines-and-metrics.md): one record per step ({"step", "epoch", "loss", "accuracy",
"lr", "samples_per_s", "step_seconds", "data_wait_seconds", optional
"grad_norm", and "devices": [{"name", "peak_bytes", ...}]}) and one per
evaluation ({"eval": true, "step", "epoch", "test_loss", "test_accuracy",
optional "final": true}).  NaN is written as null and read as NaN.

A resumed run's file is one run: where a step's record comes again (a run
resumed from an earlier snapshot, appending to the same file), the later
records replace the earlier ones from that step on, as gpipe-train itself
does when it resumes into the file.  A last line cut short (a file copied
while the run was writing it) is left out with one warning line; every
other line must be a whole record.

plot: one panel each for loss (train, and test at each evaluation),
accuracy (likewise), learning rate, samples per second, data wait per step,
grad norm (recorded with train.clip_grad_norm) and per-device peak memory,
against step; several runs overlaid, each in its own colour with its name
(the file name without .jsonl).  Noisy per-step series (loss, accuracy,
samples/s, data wait, grad norm) are drawn faint with a running mean over
about 1/50 of the run on top.  --describe prints the panels and their lines
as JSON (what the tests check).

summary: per run, a table: steps, final and best test accuracy, the final
and lowest test (validation) loss in nats and bits, final train
loss, median step time and samples/s after warm-up with their middle half
(25th..75th percentile), data wait as a share of step time, and each
device's peak memory (the largest peak_bytes of any step).

compare: the same numbers for A and B side by side with B/A, then one line
saying which run is faster by median samples/s after warm-up, by how much,
and the range the ratio spans between the runs' middle halves; where those
halves overlap it says the difference is within the spread.

Warm-up: the first 10% of a run's steps (at least one where it has two or
more) are left out of step times and samples/s; --warmup N leaves out the
first N instead (never all of them).

Errors: a bad input or argument (a missing, unreadable or empty file, a
directory, not JSON Lines, not a gpipe metrics file, a record missing a key
or with a value of the wrong type, a file cut short inside its first
record, an unknown subcommand or option, an -o that cannot be written)
ends with one line on stderr, "metrics.py: SUBJECT: PROBLEM", and exit
status 2, never a traceback.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

# the shared command-line code beside this file, wherever it is run from
# (runpy.run_path, another folder)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gp_script_common import (ScriptError, check_output, parser_raising,  # noqa: E402
                              print_compare_table, run_cli)

TRAIN_KEYS = ("step", "epoch", "loss", "accuracy", "lr", "samples_per_s", "step_seconds")
EVAL_KEYS = ("step", "epoch", "test_loss", "test_accuracy")
OPTIONAL_NUMBERS = ("data_wait_seconds", "grad_norm", "allreduce_seconds", "bad_files")
PANELS = ("loss", "accuracy", "learning rate", "samples/s", "data wait (ms)", "grad norm",
          "peak memory (MiB)")


class MetricsError(ScriptError):
    """A problem the user can fix (a bad file or argument).  The command
    line prints it as one line, "metrics.py: SUBJECT: PROBLEM", and exits 2."""


class Run:
    """One metrics file, read: train records by step, evaluations in order."""

    def __init__(self, path, name):
        self.path, self.name = path, name
        self.steps = []        # train records, sorted by step, one per step
        self.evals = []        # eval records, sorted by step (final last)
        self.restarts = 0      # places where the steps went back (a resume)
        self.cut_off = False   # a torn last line was left out

    def devices(self):
        names = []
        for r in self.steps:
            for d in r.get("devices", []):
                if d["name"] not in names:
                    names.append(d["name"])
        return names


# ----------------------------------------------------------------- reading --
def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise MetricsError(path, "file not found")
    except IsADirectoryError:
        raise MetricsError(path, "is a directory, not a metrics file (gpipe-train --metrics "
                           "FILE writes one)")
    except OSError as e:
        raise MetricsError(path, "cannot read: %s" % (e.strerror or e))


def _jtype(v):
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    return {dict: "an object", list: "an array", str: "a string"}.get(type(v), "a number")


def _number(path, n, rec, key, required):
    """rec[key] as a float (null: NaN); None where an optional key is absent."""
    if key not in rec:
        if required:
            raise MetricsError(path, "line %d: a step's record without \"%s\" (it has %s): not "
                               "a gpipe --metrics record, or a damaged one"
                               % (n, key, ", ".join(sorted(rec))[:120] or "no keys"))
        return None
    v = rec[key]
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MetricsError(path, "line %d: \"%s\" is %s, expected a number" % (n, key, _jtype(v)))
    return float(v)


def _step(path, n, rec):
    v = rec["step"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MetricsError(path, "line %d: \"step\" is %s, expected a whole number >= 0"
                           % (n, json.dumps(v)))
    return v


def _train(path, n, rec):
    r = {k: _number(path, n, rec, k, True) for k in TRAIN_KEYS if k != "step"}
    r["step"] = _step(path, n, rec)
    for k in OPTIONAL_NUMBERS:
        v = _number(path, n, rec, k, False)
        if v is not None:
            r[k] = v
    devs = rec.get("devices", [])
    if not isinstance(devs, list):
        raise MetricsError(path, "line %d: \"devices\" is %s, expected an array"
                           % (n, _jtype(devs)))
    r["devices"] = []
    for d in devs:
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise MetricsError(path, "line %d: a device in \"devices\" without a \"name\"" % n)
        r["devices"].append({"name": d["name"],
                             "peak_bytes": _number(path, n, d, "peak_bytes", True)})
    return r


def _eval(path, n, rec):
    r = {k: _number(path, n, rec, k, True) for k in EVAL_KEYS if k != "step"}
    r["step"] = _step(path, n, rec)
    r["final"] = rec.get("final") is True
    return r


def read_run(path, name=None):
    """A metrics file -> Run; a MetricsError for what a user can fix."""
    data = _read_bytes(path)
    run = Run(path, name or run_name(path))
    if not data.strip():
        raise MetricsError(path, "empty: no records (gpipe-train --metrics FILE writes one "
                           "line per step; did the run reach its first step?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise MetricsError(path, "not JSON Lines: line %d is not UTF-8 text (a binary file?)"
                           % line)
    lines = text.split("\n")
    torn = not text.endswith("\n")   # the last line has no end
    records, first_keys = [], None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if torn and n == len(lines):
                if not records:
                    raise MetricsError(path, "cut short inside its first record (line %d ends "
                                       "without a newline): no complete record" % n)
                run.cut_off = True
                break
            if n == 1:
                try:
                    json.loads(text)
                    raise MetricsError(path, "one JSON document, not JSON Lines: not a gpipe "
                                       "--metrics file (a --trace? scripts/timeline.py reads "
                                       "those)")
                except (json.JSONDecodeError, RecursionError):
                    pass
            raise MetricsError(path, "not JSON Lines: line %d column %d: %s"
                               % (n, e.colno, e.msg))
        if not isinstance(rec, dict):
            raise MetricsError(path, "line %d is %s, not a record (an object): not a gpipe "
                               "--metrics file" % (n, _jtype(rec)))
        if first_keys is None:
            first_keys = sorted(rec)
        if "step" not in rec:
            raise MetricsError(path, "line %d has no \"step\" (keys: %s): not a gpipe --metrics "
                               "file" % (n, ", ".join(sorted(rec))[:120] or "none"))
        records.append((n, rec))
    if run.cut_off:
        print("metrics.py: %s: warning: its last line is cut short (copied while the run was "
              "writing it?); read the %d complete records before it" % (path, len(records)),
              file=sys.stderr)
    _merge(run, records)
    if not run.steps:
        raise MetricsError(path, "no step records (only evaluations): nothing to plot or "
                           "summarise")
    return run


def _merge(run, records):
    """Records in file order -> run.steps / run.evals, a resumed run as one:
    a step's record that comes again replaces it and every record after it."""
    steps, evals = {}, []
    last = -1
    for n, rec in records:
        if rec.get("eval") is True:
            e = _eval(run.path, n, rec)
            evals = [x for x in evals if (x["step"], x["final"]) != (e["step"], e["final"])]
            evals.append(e)
            continue
        r = _train(run.path, n, rec)
        if r["step"] <= last:   # the run went back: a resume into the same file
            run.restarts += 1
            steps = {k: v for k, v in steps.items() if k < r["step"]}
            evals = [x for x in evals if x["step"] < r["step"]]
        steps[r["step"]] = r
        last = r["step"]
    run.steps = [steps[k] for k in sorted(steps)]
    run.evals = sorted(evals, key=lambda x: (x["step"], x["final"]))


def run_name(path):
    base = os.path.basename(path)
    return base[:-6] if base.endswith(".jsonl") else base


def load(paths):
    """Several files -> Runs with names unique among them (a repeated file
    name is told apart by its folder)."""
    base = [run_name(p) for p in paths]
    # (counted in the names as given: renaming the first of a pair in place
    # left the second without its folder until 2026-12-01)
    names = [os.path.join(os.path.basename(os.path.dirname(os.path.abspath(p))), base[i])
             if base.count(base[i]) > 1 else base[i] for i, p in enumerate(paths)]
    given, seen = list(names), {}
    for i, n in enumerate(given):  # the same file twice: numbered
        if given.count(n) > 1:
            seen[n] = seen.get(n, 0) + 1
            names[i] = "%s #%d" % (n, seen[n])
    return [read_run(p, names[i]) for i, p in enumerate(paths)]


# ----------------------------------------------------------------- numbers --
def _finite(xs):
    return [x for x in xs if x is not None and math.isfinite(x)]


def quantile(xs, q):
    """Linear interpolation between order statistics (numpy's default)."""
    xs = sorted(xs)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def warmup_count(n, warmup):
    """How many first steps of n are warm-up: `warmup`, or 10% (at least one
    where n >= 2); never all of them."""
    w = n // 10 if warmup is None else warmup
    if warmup is None and n >= 2:
        w = max(1, w)
    return max(0, min(w, n - 1))


def stats(run, warmup=None):
    """The numbers summary and compare print, as a dict (--json)."""
    st = run.steps
    w = warmup_count(len(st), warmup)
    if warmup is not None and w < warmup:
        sys.stderr.write("metrics.py: warning: %s has %d step(s): --warmup %d would leave none "
                         "to time; left out %d\n" % (run.path, len(st), warmup, w))
    kept = st[w:]
    secs = _finite(r["step_seconds"] for r in kept)
    sps = _finite(r["samples_per_s"] for r in kept)
    waits = [r["data_wait_seconds"] for r in kept if "data_wait_seconds" in r]
    tests = [e for e in run.evals if math.isfinite(e["test_accuracy"])]
    best = max(tests, key=lambda e: e["test_accuracy"]) if tests else None
    losses = [e for e in run.evals if math.isfinite(e["test_loss"])]
    lowest = min(losses, key=lambda e: e["test_loss"]) if losses else None
    final = run.evals[-1] if run.evals else None
    peaks = {}
    for r in st:
        for d in r["devices"]:
            if math.isfinite(d["peak_bytes"]):
                peaks[d["name"]] = max(peaks.get(d["name"], 0.0), d["peak_bytes"])
    return {
        "name": run.name, "path": run.path, "steps": len(st),
        "first_step": st[0]["step"], "last_step": st[-1]["step"],
        "epochs": int(max(_finite(r["epoch"] for r in st) or [0])) or None,
        "restarts": run.restarts, "warmup_steps": w,
        "final_loss": st[-1]["loss"],
        "final_test_accuracy": final["test_accuracy"] if final else None,
        "final_test_step": final["step"] if final else None,
        "best_test_accuracy": best["test_accuracy"] if best else None,
        "best_test_step": best["step"] if best else None,
        # the loss a language model is judged by (validation nats per
        # token; / ln 2: bits, per byte for a byte-level model)
        "final_test_loss": final["test_loss"] if final else None,
        "lowest_test_loss": lowest["test_loss"] if lowest else None,
        "lowest_test_step": lowest["step"] if lowest else None,
        "evaluations": len(run.evals),
        "step_seconds_median": statistics.median(secs) if secs else None,
        "step_seconds_p25": quantile(secs, 0.25) if secs else None,
        "step_seconds_p75": quantile(secs, 0.75) if secs else None,
        "samples_per_s_median": statistics.median(sps) if sps else None,
        "samples_per_s_p25": quantile(sps, 0.25) if sps else None,
        "samples_per_s_p75": quantile(sps, 0.75) if sps else None,
        "data_wait_share": (sum(waits) / sum(secs)) if waits and secs and sum(secs) > 0
        else None,
        "peak_bytes": peaks,
    }


def _mib(b):
    return "%.1f MiB" % (b / 2**20)


def _num(v, fmt):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt % v


def rows(s):
    """(label, text, value or None) rows of one run's table."""
    out = [("steps", "%d (%d..%d)%s" % (s["steps"], s["first_step"], s["last_step"],
                                         ", resumed %d time(s)" % s["restarts"]
                                         if s["restarts"] else ""), s["steps"])]
    if s["final_test_accuracy"] is None:
        out.append(("final test accuracy", "- (no evaluation in the file)", None))
        out.append(("best test accuracy", "-", None))
    else:
        out.append(("final test accuracy", "%.4f (step %d)" % (s["final_test_accuracy"],
                                                             s["final_test_step"]),
                    s["final_test_accuracy"]))
        out.append(("best test accuracy", _num(s["best_test_accuracy"], "%.4f")
                    + ("" if s["best_test_step"] is None else " (step %d)" % s["best_test_step"]),
                    s["best_test_accuracy"]))
    if s["final_test_loss"] is not None:
        fl = s["final_test_loss"]
        out.append(("final test loss", "-" if not math.isfinite(fl) else
                    "%.4f (%.4f bits; step %d)" % (fl, fl / math.log(2), s["final_test_step"]),
                    fl))
        lo = s["lowest_test_loss"]
        out.append(("lowest test loss", "-" if lo is None else "%.4f (%.4f bits; step %d)"
                    % (lo, lo / math.log(2), s["lowest_test_step"]), lo))
    out.append(("final train loss", _num(s["final_loss"], "%.4f"), s["final_loss"]))
    med = s["step_seconds_median"]
    out.append(("median step time", "-" if med is None else "%.3f ms (middle half %.3f..%.3f)"
                % (med * 1e3, s["step_seconds_p25"] * 1e3, s["step_seconds_p75"] * 1e3),
                None if med is None else med * 1e3))
    sps = s["samples_per_s_median"]
    out.append(("median samples/s", "-" if sps is None else "%.1f (middle half %.1f..%.1f)"
                % (sps, s["samples_per_s_p25"], s["samples_per_s_p75"]), sps))
    # (no ratio: a count of steps left out says nothing of B against A)
    out.append(("warm-up left out", "%d step(s)" % s["warmup_steps"], None))
    share = s["data_wait_share"]
    out.append(("data wait", _num(None if share is None else share * 100,
                                  "%.1f%% of step time"), share))
    for d, b in s["peak_bytes"].items():
        out.append(("peak memory %s" % d, _mib(b), b))
    return out


def print_summary(ss, out=None):
    out = out or sys.stdout
    for i, s in enumerate(ss):
        if i:
            print(file=out)
        print("%s (%s)" % (s["name"], s["path"]), file=out)
        for label, text, _ in rows(s):
            print("  %-24s %s" % (label, text), file=out)


def verdict(a, b):
    """Which of A, B is faster by median samples/s after warm-up, by how
    much, and the spread: -> (one line, dict for --json)."""
    ma, mb = a["samples_per_s_median"], b["samples_per_s_median"]
    if ma is None or mb is None:
        return "no samples/s to compare", {"faster": None}
    fast, slow = (b, a) if mb >= ma else (a, b)
    fl, sl = ("B", "A") if mb >= ma else ("A", "B")

    def div(x, y):   # 0 samples/s (a foreign writer's; gpipe never writes 0)
        return x / y if y > 0 else (1.0 if x == y else math.inf)
    ratio = div(fast["samples_per_s_median"], slow["samples_per_s_median"])
    lo = div(fast["samples_per_s_p25"], slow["samples_per_s_p75"])
    hi = div(fast["samples_per_s_p75"], slow["samples_per_s_p25"])
    overlap = fast["samples_per_s_p25"] <= slow["samples_per_s_p75"]
    if ma == mb:
        line = "A and B are as fast: median %.1f samples/s after warm-up" % ma
        fl = None
    elif not math.isfinite(ratio):
        line = ("%s (%s) is faster: %s (%s) has a median of 0 samples/s after warm-up"
                % (fl, fast["name"], sl, slow["name"]))
    else:
        def x(v):
            return "%.3fx" % v if math.isfinite(v) else "no bound"
        line = ("%s (%s) is %s as fast as %s (%s): median %.1f vs %.1f samples/s after "
                "warm-up; the ratio of their middle halves spans %s..%s"
                % (fl, fast["name"], x(ratio), sl, slow["name"], fast["samples_per_s_median"],
                   slow["samples_per_s_median"], x(lo), x(hi)))
    if overlap:
        line += "; within the spread (the runs' middle halves overlap)"
    return line, {"faster": fl, "ratio": ratio, "ratio_low": lo, "ratio_high": hi,
                  "within_spread": overlap}


def print_compare(a, b, out=None):
    out = out or sys.stdout
    print("A = %s (%s)\nB = %s (%s)" % (a["name"], a["path"], b["name"], b["path"]), file=out)

    def ratio(x, y):
        if x and y and x[2] and y[2] is not None and not math.isnan(x[2]) \
                and not math.isnan(y[2]):
            return "%.3f" % (y[2] / x[2])
        return "-"
    print_compare_table(rows(a), rows(b), lambda r: r[1].split(" (")[0], ratio, out=out)
    line, _ = verdict(a, b)
    print(line, file=out)


# -------------------------------------------------------------------- plots --
def running_mean(xs, w):
    """Mean of the last w finite values at each point (NaN until one is)."""
    out, acc, q = [], 0.0, []
    for x in xs:
        if x is not None and math.isfinite(x):
            q.append(x)
            acc += x
            if len(q) > w:
                acc -= q.pop(0)
        out.append(acc / len(q) if q else math.nan)
    return out


def series(run):
    """Panel title -> [(label, steps, values, noisy, style)] for one run."""
    st = run.steps
    x = [r["step"] for r in st]
    ev = [e for e in run.evals]
    ex = [e["step"] for e in ev]
    s = {p: [] for p in PANELS}
    s["loss"].append(("train", x, [r["loss"] for r in st], True, "-"))
    s["accuracy"].append(("train", x, [r["accuracy"] for r in st], True, "-"))
    if ev:
        s["loss"].append(("test", ex, [e["test_loss"] for e in ev], False, "o--"))
        s["accuracy"].append(("test", ex, [e["test_accuracy"] for e in ev], False, "o--"))
    s["learning rate"].append(("", x, [r["lr"] for r in st], False, "-"))
    s["samples/s"].append(("", x, [r["samples_per_s"] for r in st], True, "-"))
    dw = [(r["step"], r["data_wait_seconds"] * 1e3) for r in st if "data_wait_seconds" in r]
    if dw:
        s["data wait (ms)"].append(("", [p[0] for p in dw], [p[1] for p in dw], True, "-"))
    gn = [(r["step"], r["grad_norm"]) for r in st if "grad_norm" in r]
    if gn:
        s["grad norm"].append(("", [p[0] for p in gn], [p[1] for p in gn], True, "-"))
    styles = ["-", "--", ":", "-."]
    for k, d in enumerate(run.devices()):
        pts = [(r["step"], dv["peak_bytes"] / 2**20) for r in st for dv in r["devices"]
               if dv["name"] == d]
        s["peak memory (MiB)"].append((d, [p[0] for p in pts], [p[1] for p in pts], False,
                                       styles[k % len(styles)]))
    return s


EMPTY_NOTES = {"grad norm": "no grad_norm: recorded with train.clip_grad_norm",
               "data wait (ms)": "no data_wait_seconds in these files"}


def render(runs, out, size):
    """Draw the panels into `out`; -> what was drawn, for --describe."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dpi = 100
    fig, axes = plt.subplots(4, 2, figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    axes = list(axes.flat)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = []
    per_run = [series(r) for r in runs]
    for p, title in enumerate(PANELS):
        ax = axes[p]
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
        lines = []
        for ri, run in enumerate(runs):
            c = colors[ri % len(colors)]
            for label, xs, ys, noisy, style in per_run[ri][title]:
                name = run.name + (" " + label if label else "")
                if noisy and len(xs) > 20:
                    ax.plot(xs, ys, style, color=c, alpha=0.2, linewidth=0.6)
                    w = max(2, len(xs) // 50)
                    ax.plot(xs, running_mean(ys, w), style, color=c, linewidth=1.2,
                            label=name)
                elif "o" in style:   # evaluations: few points, drawn to stand out
                    ax.plot(xs, ys, style, color=c, linewidth=1.2, markersize=6,
                            markeredgecolor="black", zorder=3, label=name)
                else:
                    ax.plot(xs, ys, style, color=c, linewidth=1.2, label=name)
                lines.append({"run": run.name, "label": label, "points": len(xs)})
        if lines:
            ax.legend(fontsize=7, loc="best")
            if title == "peak memory (MiB)":
                ax.set_ylim(bottom=0)   # a small step up is not a climb
            if title == "loss":
                ys = [y for s in per_run for _, _, v, _, _ in s["loss"] for y in v]
                fin = sorted(_finite(ys))
                if fin and fin[-1] > 20 * quantile(fin, 0.5):
                    ax.set_yscale("log")   # the first steps' loss would flatten the rest
        else:
            ax.text(0.5, 0.5, EMPTY_NOTES.get(title, "no data"), ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="gray")
        drawn.append({"title": title, "lines": lines})
    axes[-1].axis("off")
    axes[-1].text(0.0, 0.9, "\n".join("%s: %s" % (r.name, r.path) for r in runs)[:2000],
                  fontsize=8, va="top", transform=axes[-1].transAxes, wrap=True)
    fig.suptitle("gpipe training curves", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return drawn


def parse_size(spec):
    m = re.fullmatch(r"(\d+)x(\d+)", spec or "")
    if not m or not (200 <= int(m[1]) <= 20000 and 200 <= int(m[2]) <= 20000):
        raise MetricsError("--size %s" % spec, "expected WIDTHxHEIGHT pixels, each 200 to "
                           "20000, e.g. 1200x1400")
    return int(m[1]), int(m[2])


# ---------------------------------------------------------------------- CLI --
def _clean(v):
    """NaN/Inf as null, so --json output is JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def main(argv=None):
    ap = parser_raising(MetricsError)(prog="metrics.py", description=__doc__.split("\n")[0],
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plot", help="loss, accuracy, lr, samples/s, data wait, grad norm and "
                       "peak memory against step, runs overlaid")
    p.add_argument("runs", nargs="+", metavar="RUN.jsonl")
    p.add_argument("-o", "--output", required=True, help="the picture (.png, .svg, .pdf)")
    p.add_argument("--size", default="1200x1400", help="WIDTHxHEIGHT pixels (1200x1400)")
    p.add_argument("--describe", action="store_true",
                   help="also print the panels and their lines as JSON")
    for name, hlp in (("summary", "a table per run"),
                      ("compare", "A and B side by side, B/A, and which is faster")):
        p = sub.add_parser(name, help=hlp)
        if name == "summary":
            p.add_argument("runs", nargs="+", metavar="RUN.jsonl")
        else:
            p.add_argument("a", metavar="A.jsonl", help="run A (the ratios' denominator)")
            p.add_argument("b", metavar="B.jsonl")
        p.add_argument("--warmup", type=int, metavar="N",
                       help="leave out the first N steps (default: 10%% of them)")
        p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args(argv)
    if getattr(args, "warmup", None) is not None and args.warmup < 0:
        raise MetricsError("--warmup %d" % args.warmup, "expected a number of steps >= 0")
    if args.cmd == "plot":
        size = parse_size(args.size)
        check_output(args.output, MetricsError, "; summary and compare need no matplotlib")
        runs = load(args.runs)
        try:
            drawn = render(runs, args.output, size)
        except OSError as e:
            raise MetricsError("-o %s" % args.output, "cannot write: %s" % (e.strerror or e))
        if args.describe:
            print(json.dumps({"output": args.output, "panels": drawn}))
        print("wrote %s" % args.output)
        return 0
    if args.cmd == "summary":
        ss = [stats(r, args.warmup) for r in load(args.runs)]
        if args.json:
            print(json.dumps(_clean(ss), indent=1))
        else:
            print_summary(ss)
        return 0
    ra, rb = load([args.a, args.b])
    a, b = stats(ra, args.warmup), stats(rb, args.warmup)
    if args.json:
        print(json.dumps(_clean({"a": a, "b": b, "verdict": verdict(a, b)[1]}), indent=1))
    else:
        print_compare(a, b)
    return 0


def cli(argv=None):
    return run_cli("metrics.py", main, argv,
                   nested="input nested too deeply to be a gpipe metrics file")


if __name__ == "__main__":
    sys.exit(cli())
