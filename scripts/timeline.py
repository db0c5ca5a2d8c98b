#!/usr/bin/python3
"""timeline.py — summarise, compare and draw pipeline timelines.

Runs with Debian's /usr/bin/python3 and its python3-matplotlib (installed by
scripts/install-deps.sh); a python3 from elsewhere on PATH may lack
matplotlib, hence the absolute interpreter.  `summary` needs only the
standard library; `gantt` and `compare` draw with matplotlib.

    scripts/timeline.py summary run.json [--json]
    scripts/timeline.py compare lockstep.json free.json [-o compare.png]
    scripts/timeline.py gantt run.json -o run.png [--steps A:B]

Inputs (detected by content, not by extension):
  * gpipe's Chrome trace JSON (gpipe-train --trace FILE): one process per
    device, tid 0 compute / tid 1 copy, slices "F3 s1", "B3 s1", "R3 s1",
    "copy a3 s0->s1", "copy g3 s2->s1", "wait", args.step per slice.
  * Nsight Systems SQLite exports (nsys export --type sqlite): NVTX push/pop
    ranges from NVTX_EVENTS (text, or textId -> StringIds.value) named like
    gpipe's slices (gpipe pushes them under CUDA, src/pipeline/nvtx.h);
    kernels from CUPTI_ACTIVITY_KIND_KERNEL (shortName -> StringIds) and
    copies from CUPTI_ACTIVITY_KIND_MEMCPY, both per deviceId.  gpipe
    pushes one NVTX range per instruction, so there a copy's range includes
    the time it waited (no separate "wait" slice); the GPU memcpy shows the
    transfer itself.

Pipeline: a reader per format -> Trace (devices + a flat list of Slice) ->
metrics() -> text tables / Gantt pictures.

Metrics, per recorded step s: the step's window is [first slice start, last
slice end] over all devices; its wall time is the window's length; "wall"
below is the sum over steps (time between steps — optimizer, data loading —
is not pipeline time and is left out).  Per device: busy = length of the
union of its work (compute slices, copies, GPU kernels and memcpys; not
waits), idle = wall - busy, bubble fraction = idle / wall, copy and wait =
summed durations of copy and wait slices.  Overlap factor = sum of busy over
devices / wall (1 = no overlap, n = every device busy all the time).
"""
import argparse
import json
import os
import re
import sqlite3
import struct
import sys
from dataclasses import dataclass, field

KINDS = ("forward", "backward", "recompute", "copy", "wait", "kernel")
COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "recompute": "#8172B3",
    "copy": "#55A868",
    "wait": "#C8C8C8",
    "kernel": "#937860",
}
NAME_RE = re.compile(r"^(?P<k>[FBR])(?P<i>\d+) s(?P<j>\d+)$")
COPY_RE = re.compile(r"^copy (?P<what>[ag])(?P<i>\d+) s(?P<src>\d+)->s(?P<dst>\d+)$")


# --------------------------------------------------------------- the model --
@dataclass
class Slice:
    device: int          # row index (gpipe: the stage's device)
    track: str           # "compute", "copy" or "gpu"
    kind: str            # one of KINDS
    name: str
    start: float         # seconds
    end: float
    step: int = -1
    micro_batch: int = -1
    stage: int = -1
    src: int = -1        # copies: source and destination stage
    dst: int = -1
    bytes: int = 0
    gtid: int = 0        # nsys: the thread that pushed the range


@dataclass
class Trace:
    path: str
    fmt: str
    devices: dict = field(default_factory=dict)   # index -> display name
    slices: list = field(default_factory=list)

    def steps(self):
        return sorted({s.step for s in self.slices if s.step >= 0})


def parse_name(name):
    """gpipe's slice name -> (kind, micro_batch, stage, src, dst) or None."""
    m = NAME_RE.match(name)
    if m:
        kind = {"F": "forward", "B": "backward", "R": "recompute"}[m["k"]]
        return kind, int(m["i"]), int(m["j"]), -1, -1
    m = COPY_RE.match(name)
    if m:
        return "copy", int(m["i"]), int(m["dst"]), int(m["src"]), int(m["dst"])
    if name == "wait":
        return "wait", -1, -1, -1, -1
    return None


# ----------------------------------------------------------------- readers --
def read_gpipe_json(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        # A run that died before gp_trace_close leaves the array open.
        doc = json.loads(text.rstrip().rstrip(",") + "\n]}")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    tr = Trace(path, "gpipe-json")
    for e in events:
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "process_name":
            tr.devices[int(e["pid"])] = e["args"]["name"]
        if ph != "X":
            continue
        parsed = parse_name(e.get("name", ""))
        if parsed is None:
            continue
        kind, i, j, src, dst = parsed
        args = e.get("args", {})
        dev = int(e["pid"])
        if kind == "wait":
            i = int(args.get("micro_batch", -1))
            j = int(args.get("stage", dev))
        t0 = float(e["ts"]) * 1e-6
        tr.slices.append(Slice(
            device=dev, track="copy" if int(e.get("tid", 0)) == 1 else "compute",
            kind=kind, name=e["name"], start=t0, end=t0 + float(e.get("dur", 0)) * 1e-6,
            step=int(args.get("step", -1)), micro_batch=i, stage=j, src=src, dst=dst,
            bytes=int(args.get("bytes", 0))))
        tr.devices.setdefault(dev, "device %d" % dev)
    return tr


def _tables(db):
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(db, table):
    return {r[1] for r in db.execute("PRAGMA table_info(%s)" % table)}


def read_nsys_sqlite(path):
    """NVTX ranges named like gpipe's slices become the host view of each
    stage (device row = stage j; a copy range lives on the receiving
    stage's worker, as in gpipe's JSON).  GPU kernels and memcpys go to a
    "gpu" track of the row of their deviceId: the stage whose worker thread
    launched them (CUPTI_ACTIVITY_KIND_RUNTIME correlationId -> globalTid)
    when the export has the runtime table, else the i-th distinct deviceId
    is stage i (gpipe places stage i on the i-th listed device).
    Timestamps are nanoseconds."""
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    tables = _tables(db)
    strings = {}
    if "StringIds" in tables:
        strings = dict(db.execute("SELECT id, value FROM StringIds"))
    tr = Trace(path, "nsys-sqlite")
    tid_stage = {}
    if "NVTX_EVENTS" in tables:
        cols = _columns(db, "NVTX_EVENTS")
        text = "text" if "text" in cols else "NULL"
        text_id = "textId" if "textId" in cols else "NULL"
        tid = "globalTid" if "globalTid" in cols else "0"
        # eventType 59 = push/pop range, 60 = start/end range; marks (34)
        # have no end.
        where = "WHERE eventType IN (59, 60)" if "eventType" in cols else ""
        rows = db.execute('SELECT start, "end", %s, %s, %s FROM NVTX_EVENTS %s'
                          % (text, text_id, tid, where))
        votes = {}
        for start, end, txt, tid_v, gtid in rows:
            name = txt if txt is not None else strings.get(tid_v)
            if name is None or end is None or end < start:
                continue
            parsed = parse_name(name)
            if parsed is None:
                continue
            kind, i, j, src, dst = parsed
            tr.slices.append(Slice(device=j, track="copy" if kind in ("copy", "wait")
                                   else "compute", kind=kind, name=name, start=start * 1e-9,
                                   end=end * 1e-9, micro_batch=i, stage=j, src=src, dst=dst))
            if j >= 0:
                votes.setdefault(gtid, {}).setdefault(j, 0)
                votes[gtid][j] += 1
            tr.slices[-1].gtid = gtid
        for gtid, v in votes.items():
            tid_stage[gtid] = max(v, key=v.get)
        # A wait range carries no stage in its name: it is the stage of its
        # thread, and it precedes that thread's next copy.
        for s in tr.slices:
            if s.kind == "wait":
                s.device = s.stage = tid_stage.get(s.gtid, 0)
    for j in {s.device for s in tr.slices}:
        tr.devices[j] = "stage %d" % j

    # GPU activity.
    dev_stage = {}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and tid_stage:
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
            if table in tables:
                q = ("SELECT a.deviceId, r.globalTid, COUNT(*) FROM %s a JOIN "
                     "CUPTI_ACTIVITY_KIND_RUNTIME r ON a.correlationId = r.correlationId "
                     "GROUP BY a.deviceId, r.globalTid" % table)
                for dev, gtid, cnt in db.execute(q):
                    if gtid in tid_stage:
                        dev_stage.setdefault(dev, {}).setdefault(tid_stage[gtid], 0)
                        dev_stage[dev][tid_stage[gtid]] += cnt
        dev_stage = {d: max(v, key=v.get) for d, v in dev_stage.items()}
    gpu = []
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        cols = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
        nm = "shortName" if "shortName" in cols else ("demangledName" if "demangledName" in cols
                                                      else "NULL")
        for start, end, dev, name_id in db.execute(
                'SELECT start, "end", deviceId, %s FROM CUPTI_ACTIVITY_KIND_KERNEL' % nm):
            gpu.append((dev, "kernel", strings.get(name_id, "kernel"), start, end, 0))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        # copyKind (CUpti_ActivityMemcpyKind): 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP.
        kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
        for start, end, dev, nbytes, ck in db.execute(
                'SELECT start, "end", deviceId, bytes, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY'):
            gpu.append((dev, "copy", "memcpy %s" % kinds.get(ck, str(ck)), start, end, nbytes))
    devs = sorted({g[0] for g in gpu})
    for rank, dev in enumerate(devs):
        dev_stage.setdefault(dev, rank)
    for dev in devs:
        j = dev_stage[dev]
        base = tr.devices.get(j, "stage %d" % j)
        if "cuda:" not in base:
            tr.devices[j] = "cuda:%d (%s)" % (dev, base)
    for dev, kind, name, start, end, nbytes in gpu:
        tr.slices.append(Slice(device=dev_stage[dev], track="gpu", kind=kind, name=name,
                               start=start * 1e-9, end=end * 1e-9, bytes=int(nbytes or 0)))
    db.close()
    assign_steps(tr)
    return tr


def assign_steps(tr):
    """Steps for traces without a step field: a step begins with "F0 s0".
    Every slice of step s ends before step s+1 begins, so a slice belongs to
    the last boundary at or before its end.  GPU activity outside the
    pipeline's (NVTX) windows — evaluation, set-up — is dropped."""
    bounds = sorted(s.start for s in tr.slices if s.kind == "forward" and s.micro_batch == 0
                    and s.stage == 0)
    if not bounds:
        return
    import bisect
    host = [s for s in tr.slices if s.track != "gpu"]
    for s in host:
        s.step = max(0, bisect.bisect_right(bounds, s.end) - 1)
    win = {}
    for s in host:
        lo, hi = win.get(s.step, (s.start, s.end))
        win[s.step] = (min(lo, s.start), max(hi, s.end))
    keep = host
    for s in tr.slices:
        if s.track != "gpu":
            continue
        k = max(0, bisect.bisect_right(bounds, s.start) - 1)
        if k in win and s.start >= win[k][0] and s.start <= win[k][1]:
            s.step = k
            s.end = min(s.end, win[k][1]) if s.end > win[k][1] else s.end
            keep.append(s)
    tr.slices = keep


def read_trace(path):
    with open(path, "rb") as f:
        magic = f.read(16)
    if magic.startswith(b"SQLite format 3"):
        return read_nsys_sqlite(path)
    return read_gpipe_json(path)


def select_steps(tr, spec):
    """Keep steps [A, B] of a trace ("A:B", "A", "A:", ":B", "all")."""
    if spec in (None, "all"):
        return tr
    steps = tr.steps()
    if ":" in spec:
        a, b = spec.split(":", 1)
        lo = int(a) if a else -1
        hi = int(b) if b else 1 << 62
    else:
        lo = hi = int(spec)
    sel = [s for s in steps if lo <= s <= hi]
    if not sel:
        raise SystemExit("timeline: %s has no step in %s (steps: %s)" % (tr.path, spec, steps))
    out = Trace(tr.path, tr.fmt, dict(tr.devices),
                [s for s in tr.slices if lo <= s.step <= hi])
    return out


# ----------------------------------------------------------------- metrics --
def union_length(intervals):
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def metrics(tr):
    steps = tr.steps()
    windows = {}
    for s in tr.slices:
        if s.step < 0:
            continue
        lo, hi = windows.get(s.step, (s.start, s.end))
        windows[s.step] = (min(lo, s.start), max(hi, s.end))
    step_wall = {k: windows[k][1] - windows[k][0] for k in steps}
    wall = sum(step_wall.values())
    devices = {}
    for d in sorted(tr.devices):
        mine = [s for s in tr.slices if s.device == d and s.step >= 0]
        busy = sum(union_length([(s.start, s.end) for s in mine
                                 if s.step == k and s.kind != "wait"]) for k in steps)
        row = {
            "name": tr.devices[d],
            "busy": busy,
            "idle": wall - busy,
            "bubble": (wall - busy) / wall if wall > 0 else 0.0,
            "copy": sum(s.end - s.start for s in mine if s.kind == "copy"),
            "wait": sum(s.end - s.start for s in mine if s.kind == "wait"),
            "forward": sum(s.end - s.start for s in mine if s.kind == "forward"),
            "backward": sum(s.end - s.start for s in mine if s.kind == "backward"),
            "recompute": sum(s.end - s.start for s in mine if s.kind == "recompute"),
        }
        if any(s.kind == "kernel" for s in mine):
            row["kernel"] = sum(s.end - s.start for s in mine if s.kind == "kernel")
        devices[d] = row
    sum_busy = sum(r["busy"] for r in devices.values())
    return {
        "path": tr.path,
        "format": tr.fmt,
        "steps": steps,
        "step_wall": step_wall,
        "wall": wall,
        "mean_step_wall": wall / len(steps) if steps else 0.0,
        "devices": devices,
        "overlap": sum_busy / wall if wall > 0 else 0.0,
    }


# ------------------------------------------------------------------ tables --
def _ms(x):
    return "%.3f" % (x * 1e3)


def metric_rows(m):
    """(label, value, kind) rows shared by summary and compare."""
    rows = []
    for d, r in m["devices"].items():
        for key in ("busy", "idle", "copy", "wait"):
            rows.append(("%s %s ms" % (r["name"], key), r[key], "time"))
        if "kernel" in r:
            rows.append(("%s kernel ms" % r["name"], r["kernel"], "time"))
        rows.append(("%s bubble fraction" % r["name"], r["bubble"], "frac"))
    rows.append(("mean step wall ms", m["mean_step_wall"], "time"))
    rows.append(("overlap factor (sum busy / wall)", m["overlap"], "frac"))
    return rows


def _fmt(v, kind):
    return _ms(v) if kind == "time" else "%.3f" % v


def print_summary(m, out=None):
    out = out or sys.stdout
    print("%s (%s): %d step(s) %s, wall %s ms" % (m["path"], m["format"], len(m["steps"]),
                                                  _steps_str(m["steps"]), _ms(m["wall"])),
          file=out)
    hdr = "%-22s %10s %10s %8s %10s %10s" % ("device", "busy ms", "idle ms", "bubble",
                                            "copy ms", "wait ms")
    print(hdr, file=out)
    for r in m["devices"].values():
        print("%-22s %10s %10s %8.3f %10s %10s" % (r["name"], _ms(r["busy"]), _ms(r["idle"]),
                                                  r["bubble"], _ms(r["copy"]), _ms(r["wait"])),
              file=out)
    print("per-step wall ms: %s" % ", ".join("%d: %s" % (k, _ms(v))
                                              for k, v in m["step_wall"].items()), file=out)
    print("mean step wall %s ms; overlap factor %.3f (sum busy / wall, %d devices)"
          % (_ms(m["mean_step_wall"]), m["overlap"], len(m["devices"])), file=out)


def _steps_str(steps):
    if not steps:
        return "-"
    return "%d..%d" % (steps[0], steps[-1]) if len(steps) > 1 else str(steps[0])


def print_compare(ma, mb, out=None):
    out = out or sys.stdout
    ra, rb = metric_rows(ma), metric_rows(mb)
    la = {r[0]: r for r in ra}
    lb = {r[0]: r for r in rb}
    labels = [r[0] for r in ra] + [r[0] for r in rb if r[0] not in la]
    na, nb = os.path.basename(ma["path"]), os.path.basename(mb["path"])
    w = max(len(x) for x in labels + ["metric"])
    print("A = %s\nB = %s" % (ma["path"], mb["path"]), file=out)
    ha, hb = "A " + na[:30], "B " + nb[:30]
    cw = max(14, len(ha), len(hb))
    print("%-*s %*s %*s %8s" % (w, "metric", cw, ha, cw, hb, "B/A"), file=out)
    for lab in labels:
        a, b = la.get(lab), lb.get(lab)
        kind = (a or b)[2]
        va = _fmt(a[1], kind) if a else "-"
        vb = _fmt(b[1], kind) if b else "-"
        ratio = "%.3f" % (b[1] / a[1]) if a and b and a[1] != 0 else "-"
        print("%-*s %*s %*s %8s" % (w, lab, cw, va, cw, vb, ratio), file=out)


# -------------------------------------------------------------------- plots --
def rows_of(tr):
    """Gantt rows: one per device; a device with GPU activity gets a second
    row for it (kernels and memcpys overlap its host ranges)."""
    rows = []
    for d in sorted(tr.devices):
        rows.append((d, ("compute", "copy"), tr.devices[d]))
        if any(s.device == d and s.track == "gpu" for s in tr.slices):
            rows.append((d, ("gpu",), tr.devices[d] + " GPU"))
    return rows


def draw(ax, tr, title, t_origin):
    rows = rows_of(tr)
    span = max((s.end for s in tr.slices), default=0) - t_origin
    for y, (d, tracks, _) in enumerate(rows):
        for kind in KINDS:
            bars = [((s.start - t_origin) * 1e3, (s.end - s.start) * 1e3) for s in tr.slices
                    if s.device == d and s.track in tracks and s.kind == kind]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=COLORS[kind],
                               edgecolors="white", linewidth=0.3)
        for s in tr.slices:
            if (s.device == d and s.track in tracks and s.micro_batch >= 0
                    and s.kind in ("forward", "backward", "recompute", "copy")
                    and span > 0 and (s.end - s.start) > 0.012 * span):
                ax.text((s.start + s.end - 2 * t_origin) / 2 * 1e3, y, str(s.micro_batch),
                        ha="center", va="center", fontsize=7,
                        color="white" if s.kind != "copy" else "black")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[2] for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)


def render(traces, titles, out, size):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    width, height = size
    dpi = 100
    nrows = [max(1, len(rows_of(t))) for t in traces]
    fig, axes = plt.subplots(len(traces), 1, sharex=True, squeeze=False,
                             figsize=(width / dpi, height / dpi), dpi=dpi,
                             gridspec_kw={"height_ratios": nrows})
    for ax, tr, title in zip(axes[:, 0], traces, titles):
        t0 = min((s.start for s in tr.slices), default=0.0)
        draw(ax, tr, title, t0)
    end = max((s.end - min(x.start for x in tr.slices) for tr in traces if tr.slices
               for s in tr.slices), default=1e-3)
    axes[-1, 0].set_xlim(0, end * 1e3 * 1.01)
    axes[-1, 0].set_xlabel("time since the first shown step began (ms)")
    kinds = [k for k in KINDS if any(s.kind == k for t in traces for s in t.slices)]
    fig.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper right",
               ncol=len(kinds), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.16, right=0.98, top=1 - 60 / height, bottom=55 / height,
                        hspace=0.35)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def default_size(traces):
    rows = sum(max(1, len(rows_of(t))) for t in traces)
    return 1200, 120 + 60 * len(traces) + 45 * rows


def parse_size(s):
    try:
        w, h = s.lower().split("x")
        return int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError("expected WIDTHxHEIGHT in pixels, e.g. 1200x600")


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError("%s is not a PNG" % path)
    return struct.unpack(">II", head[16:24])


def title_of(tr, m):
    return "%s — %d step(s) %s, mean step %s ms, overlap %.2f" % (
        os.path.basename(tr.path), len(m["steps"]), _steps_str(m["steps"]),
        _ms(m["mean_step_wall"]), m["overlap"])


# ---------------------------------------------------------------------- CLI --
def main(argv=None):
    ap = argparse.ArgumentParser(prog="timeline.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("summary", help="per-device busy/idle/bubble/copy/wait, step walls")
    p.add_argument("trace")
    p.add_argument("--steps", help="A:B, A, A:, :B (default: all recorded steps)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p = sub.add_parser("compare", help="two runs side by side, ratios B/A, stacked Gantt")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("-o", "--output", default="compare.png")
    p.add_argument("--steps", help="steps summarised (default: all recorded)")
    p.add_argument("--plot-steps", help="steps drawn (default: each trace's first)")
    p.add_argument("--size", type=parse_size, help="WIDTHxHEIGHT pixels")
    p = sub.add_parser("gantt", help="one timeline picture")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--steps", help="steps drawn (default: the first recorded step)")
    p.add_argument("--size", type=parse_size, help="WIDTHxHEIGHT pixels")
    args = ap.parse_args(argv)

    if args.cmd == "summary":
        tr = select_steps(read_trace(args.trace), args.steps)
        m = metrics(tr)
        if args.json:
            print(json.dumps(m, indent=1))
        else:
            print_summary(m)
        return 0
    if args.cmd == "gantt":
        tr = read_trace(args.trace)
        spec = args.steps or (str(tr.steps()[0]) if tr.steps() else None)
        tr = select_steps(tr, spec)
        render([tr], [title_of(tr, metrics(tr))], args.output,
               args.size or default_size([tr]))
        print("wrote %s" % args.output)
        return 0
    # compare
    ta, tb = read_trace(args.a), read_trace(args.b)
    ma, mb = metrics(select_steps(ta, args.steps)), metrics(select_steps(tb, args.steps))
    print_compare(ma, mb)
    pa = select_steps(ta, args.plot_steps or (str(ta.steps()[0]) if ta.steps() else None))
    pb = select_steps(tb, args.plot_steps or (str(tb.steps()[0]) if tb.steps() else None))
    render([pa, pb], ["A: " + title_of(pa, metrics(pa)), "B: " + title_of(pb, metrics(pb))],
           args.output, args.size or default_size([pa, pb]))
    print("wrote %s" % args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
