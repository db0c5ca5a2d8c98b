#!/usr/bin/python3
"""timeline.py — summarise, compare and draw pipeline timelines.

Runs with Debian's /usr/bin/python3 and its python3-matplotlib (installed by
scripts/install-deps.sh); a python3 from elsewhere on PATH may lack
matplotlib, hence the absolute interpreter.  `summary` needs only the
standard library; `gantt` and `compare` draw with matplotlib.

    scripts/timeline.py summary run.json [--json]
    scripts/timeline.py compare lockstep.json free.json [-o compare.png]
    scripts/timeline.py gantt run.json -o run.png [--steps A:B]
    scripts/timeline.py merge all.json run.json run.rank1.json ...

Inputs (detected by content, not by extension):
  * gpipe's Chrome trace JSON (gpipe-train --trace FILE): one process per
    device, tid 0 compute / tid 1 copy, slices "F3 s1", "B3 s1", "R3 s1",
    "copy a3 s0->s1", "copy g3 s2->s1", "wait", and the end of the step:
    "all-reduce s1", "reduce-scatter s1", "reduce_stats s1", "barrier s1",
    "commit s1", "update s1" (or "update (fused) s0", "update (shard) s1"),
    "gather s1"; args.step per slice, a "step N" instant before each step's
    slices.  Other names are ignored.
  * Nsight Systems SQLite exports (nsys export --type sqlite): NVTX push/pop
    ranges from NVTX_EVENTS (text, or textId -> StringIds.value) named like
    gpipe's slices (gpipe pushes them under CUDA, src/pipeline/nvtx.h);
    kernels from CUPTI_ACTIVITY_KIND_KERNEL (shortName -> StringIds) and
    copies from CUPTI_ACTIVITY_KIND_MEMCPY, both per deviceId.  gpipe
    pushes one NVTX range per instruction, so there a copy's range includes
    the time it waited (no separate "wait" slice); the GPU memcpy shows the
    transfer itself.

A slice that lies far outside the rest of its step (more than a second,
and more than ten times the rest's span, before or after them: a bad
timestamp) is left out of the metrics and the pictures, with a warning
that names it.

A trace cut off by a crash (gpipe-train killed while writing it: the JSON
ends anywhere, mid-event or mid-string) is read up to its last complete
event, with a warning.  Its last step is left out of the metrics, since its
slices may be only partly written, unless the file shows the step was
followed by another or it is the only step (then its metrics are partial,
and the warning says so).

Pipeline: a reader per format -> Trace (devices + a flat list of Slice) ->
metrics() -> text tables / Gantt pictures.

Metrics, per recorded step s: the step's window is [first slice start, last
slice end] over all devices, end-of-step slices (reductions, barrier,
update) included; its wall time is the window's length; "wall" below is the
sum over steps (time between steps — the loss, data loading, writing the
trace — is not pipeline time and is left out).  Per device: busy = length
of the union of its work (compute slices, copies, end-of-step work, GPU
kernels and memcpys; not waits and not the barrier, where a device only
waits for the others), idle = wall - busy, bubble fraction = idle / wall,
copy, wait, end (end-of-step work) and barrier = summed durations of those
slices.  Overlap factor = sum of busy over devices / wall (1 = no overlap,
n = every device busy all the time).

`merge` puts the traces of a run under mpirun (one per rank: run.json,
run.rank1.json, ...) on one time axis, rank 0's: each file records where
its ts = 0 is on its clock (otherData.origin_s) and its clock's offset from
rank 0's (clock_offset_s, measured by gpipe at start-up), and each keeps
only the devices it ran.  The result is a trace like one process's, for
summary, gantt, compare and Perfetto.

Errors: a bad input or argument (missing, unreadable or empty file, not
JSON, not a trace, no events, a bad --steps, an -o that cannot be written)
ends with one line on stderr, "timeline.py: SUBJECT: PROBLEM", and exit
status 2.  Output paths are checked before any trace is read.
"""
import argparse
import json
import math
import os
import re
import sqlite3
import sys
import urllib.request
from dataclasses import dataclass, field

# the shared command-line code beside this file, wherever it is run from
# (runpy.run_path, another folder)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# (png_size too: tests/test_timeline.py reads its PNGs with it)
from gp_script_common import (ScriptError, check_output, parser_raising,  # noqa: E402,F401
                              png_size, print_compare_table, run_cli, unexpected)

KINDS = ("forward", "backward", "weights", "recompute", "copy", "wait", "end", "barrier",
         "kernel")
IDLE_KINDS = ("wait", "barrier")   # a device waiting: not busy
COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "weights": "#DA8BC3",
    "recompute": "#8172B3",
    "copy": "#55A868",
    "wait": "#C8C8C8",
    "end": "#C44E52",
    "barrier": "#E6C9A8",
    "kernel": "#937860",
}
LABELS = {"end": "end of step", "weights": "backward-weights (zero bubble)"}
NAME_RE = re.compile(r"^(?P<k>[FBRW])(?P<i>\d+) s(?P<j>\d+)$")
# Copies: an activation (a), a gradient (g), a skip's tensor (k) and its
# gradient (kg).  The names are src/pipeline/schedule.c's gp_instr_name.
COPY_RE = re.compile(r"^copy (?P<what>a|g|k|kg)(?P<i>\d+) s(?P<src>\d+)->s(?P<dst>\d+)$")
# The end of the step: reductions, the all-finite check of the gradients,
# the clip, the update and what follows it.
END_RE = re.compile(r"^(?P<what>all-reduce|reduce-scatter|reduce_stats|barrier|commit|check|"
                    r"clip|update(?: \((?:fused|shard)\))?|gather) s(?P<j>\d+)$")


class TraceError(ScriptError):
    """A problem the user can fix (a bad file or argument).  The command line
    prints it as one line, "timeline.py: SUBJECT: PROBLEM", and exits 2."""


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
    ref: str = ""        # where it is in the file, for messages ("traceEvents[12]")


@dataclass
class Trace:
    path: str
    fmt: str
    devices: dict = field(default_factory=dict)   # index -> display name
    slices: list = field(default_factory=list)
    events: int = 0          # events (JSON) or rows (SQLite) read
    cut_off: bool = False    # the JSON ended before its last event did
    partial_step: int = -1   # cut off: the last step, which may be incomplete
    left_out: list = field(default_factory=list)  # slices with bad times (leave_out_strays)

    def steps(self):
        return sorted({s.step for s in self.slices if s.step >= 0})


def parse_name(name):
    """gpipe's slice name -> (kind, micro_batch, stage, src, dst) or None."""
    m = NAME_RE.match(name)
    if m:
        kind = {"F": "forward", "B": "backward", "R": "recompute", "W": "weights"}[m["k"]]
        return kind, int(m["i"]), int(m["j"]), -1, -1
    m = COPY_RE.match(name)
    if m:
        return "copy", int(m["i"]), int(m["dst"]), int(m["src"]), int(m["dst"])
    if name == "wait":
        return "wait", -1, -1, -1, -1
    m = END_RE.match(name)
    if m:
        return "barrier" if m["what"] == "barrier" else "end", -1, int(m["j"]), -1, -1
    return None


# ----------------------------------------------------------------- readers --
def _jtype(v):
    """The JSON name of a decoded value's type, for messages."""
    if isinstance(v, bool) or v is None:
        return "literal %s" % json.dumps(v)
    return {dict: "an object", list: "an array", str: "a string"}.get(type(v), "a number")


_WS = re.compile(r"[ \t\n\r]*")
# What may follow the point where a JSON decoder gave up if the text simply
# ran out inside a value: nothing, or the start of a literal, a number or a
# \uXXXX escape ("Unterminated string" is the text ending inside a string).
_PARTIAL = re.compile(r"[ \t\n\r]*(?:t(?:ru?)?|f(?:a(?:ls?)?)?|n(?:ul?)?|[-+.eE0-9]+|"
                      r"u[0-9a-fA-F]{0,3})?\Z")


def _ran_out(text, err):
    """Whether a JSONDecodeError is the text ending, not a syntax error."""
    return err.msg.startswith("Unterminated string") or bool(_PARTIAL.match(text, err.pos))


def _read_cut(path, text, err0):
    """The complete events of a JSON trace that json.loads refused (err0),
    if the text is a trace cut off mid-way: -> (list of events, whether the
    event array was closed: only the final "}" missing).  Walks the
    document by hand, decoding one event at a time, up to the point where
    the text runs out.  Anything else wrong with the text is a TraceError
    carrying json.loads' message."""
    dec = json.JSONDecoder()

    def bad():
        return TraceError(path, "not JSON: line %d column %d: %s"
                          % (err0.lineno, err0.colno, err0.msg))

    def value(pos):
        """-> (decoded value, position after it), or (None, None) where the
        text runs out inside the value."""
        try:
            return dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            if _ran_out(text, e):
                return None, None
            raise bad()

    end = len(text)
    pos = _WS.match(text).end()
    in_object = text.startswith("{", pos)
    if not in_object and not text.startswith("[", pos):
        raise bad()
    pos = _WS.match(text, pos + 1).end()
    if in_object:
        # {"displayTimeUnit": ..., "otherData": {...}, "traceEvents": [ ...
        while True:
            if pos == end:
                return [], False
            key, pos = value(pos)
            if pos is None:
                return [], False
            if not isinstance(key, str):
                raise bad()
            pos = _WS.match(text, pos).end()
            if pos == end:
                return [], False
            if text[pos] != ":":
                raise bad()
            pos = _WS.match(text, pos + 1).end()
            if pos == end:
                return [], False
            if key == "traceEvents":
                if text[pos] != "[":
                    raise bad()
                pos = _WS.match(text, pos + 1).end()
                break
            _, pos = value(pos)
            if pos is None:
                return [], False
            pos = _WS.match(text, pos).end()
            if pos == end:
                return [], False
            if text[pos] != ",":
                raise bad()  # "}" here: an object without traceEvents, then junk
            pos = _WS.match(text, pos + 1).end()
    events = []
    while pos < end:
        if text[pos] == "]":
            # The array closed: only the object's "}" may be missing.
            if in_object and not text[pos + 1:].strip():
                return events, True
            raise bad()
        ev, pos = value(pos)
        if pos is None:
            return events, False
        events.append(ev)
        pos = _WS.match(text, pos).end()
        if pos < end and text[pos] == ",":
            pos = _WS.match(text, pos + 1).end()
        elif pos < end and text[pos] != "]":
            raise bad()
    return events, False


def _decode(path, data):
    """A JSON trace's bytes -> (its list of events, cut off?, event array
    closed?)."""
    if not data.strip():
        raise TraceError(path, "empty file")
    if b"\0" in data:
        raise TraceError(path, "binary data, not JSON")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # Only a multi-byte character cut in half at the very end is a cut.
        if e.reason != "unexpected end of data" or e.end != len(data):
            raise TraceError(path, "binary data, not JSON (not UTF-8 at byte %d)" % e.start)
        text = data[:e.start].decode("utf-8")
    text = text.lstrip("\ufeff")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        events, closed = _read_cut(path, text, e)
        return events, True, closed
    except RecursionError:
        raise TraceError(path, "not a gpipe trace: JSON nested too deeply")
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceError(path, "not a gpipe trace: no traceEvents")
        events = doc["traceEvents"]
        if not isinstance(events, list):
            raise TraceError(path, "not a gpipe trace: traceEvents is %s, not an array"
                             % _jtype(events))
        return events, False, True
    if isinstance(doc, list):
        return doc, False, True
    raise TraceError(path, "not a gpipe trace: the JSON is %s, not an object with "
                     "traceEvents or an array of events" % _jtype(doc))


def read_gpipe_json(path, data):
    events, cut, closed = _decode(path, data)
    if not events:
        raise TraceError(path, "cut off before its first complete event" if cut
                         else "no events")
    tr = Trace(path, "gpipe-json", events=len(events), cut_off=cut)
    last_step = -1   # the highest step any event names (markers included)

    def field_of(n, e, obj, key, conv, default=None):
        v = obj.get(key, default)
        what = "traceEvents[%d] (%s)" % (n, json.dumps(e.get("name"))[:40])
        if v is None:
            raise TraceError(path, "%s: no %s" % (what, key))
        try:
            x = conv(v)
        except (TypeError, ValueError, OverflowError):
            raise TraceError(path, "%s: %s is %s, not a number"
                             % (what, key, json.dumps(v)[:40]))
        if isinstance(x, float) and not math.isfinite(x):
            raise TraceError(path, "%s: %s is %s" % (what, key, x))
        return x

    for n, e in enumerate(events):
        if not isinstance(e, dict):
            raise TraceError(path, "traceEvents[%d] is %s, not an object" % (n, _jtype(e)))
        ph, name = e.get("ph"), e.get("name")
        args = e.get("args", {})
        if not isinstance(args, dict):
            raise TraceError(path, "traceEvents[%d] (%s): args is %s, not an object"
                             % (n, json.dumps(name)[:40], _jtype(args)))
        if "step" in args:
            last_step = max(last_step, field_of(n, e, args, "step", int))
        if ph == "M" and name == "process_name":
            pid = field_of(n, e, e, "pid", int)
            tr.devices[pid] = str(args.get("name", "device %d" % pid))
        if ph != "X" or not isinstance(name, str):
            continue
        parsed = parse_name(name)
        if parsed is None:
            continue
        kind, i, j, src, dst = parsed
        dev = field_of(n, e, e, "pid", int)
        if kind == "wait":
            i = field_of(n, e, args, "micro_batch", int, -1)
            j = field_of(n, e, args, "stage", int, dev)
        t0 = field_of(n, e, e, "ts", float) * 1e-6
        dur = field_of(n, e, e, "dur", float, 0) * 1e-6
        if dur < 0:
            raise TraceError(path, "traceEvents[%d] (%s): negative dur" % (n, json.dumps(name)))
        tr.slices.append(Slice(
            device=dev, track="copy" if field_of(n, e, e, "tid", int, 0) == 1 else "compute",
            kind=kind, name=name, start=t0, end=t0 + dur,
            step=field_of(n, e, args, "step", int, -1), micro_batch=i, stage=j, src=src,
            dst=dst, bytes=field_of(n, e, args, "bytes", int, 0), ref="traceEvents[%d]" % n))
        tr.devices.setdefault(dev, "device %d" % dev)
    steps = tr.steps()
    if cut and not closed and steps and last_step <= steps[-1]:
        # Nothing read after the last step's slices (not even the next
        # step's marker): the crash may have cut them short.
        tr.partial_step = steps[-1]
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
    uri = "file:%s?mode=ro" % urllib.request.pathname2url(os.path.abspath(path))
    try:
        db = sqlite3.connect(uri, uri=True)
        try:
            tr = _read_nsys(db, path)
        finally:
            db.close()
    except sqlite3.Error as e:
        raise TraceError(path, "not a readable Nsight Systems export: %s" % e)
    if not tr.events:
        raise TraceError(path, "no events (no NVTX ranges, kernels or memcpys)")
    assign_steps(tr)
    return tr


def _read_nsys(db, path):
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
            tr.events += 1
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
            tr.events += 1
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        # copyKind (CUpti_ActivityMemcpyKind): 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP.
        kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
        for start, end, dev, nbytes, ck in db.execute(
                'SELECT start, "end", deviceId, bytes, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY'):
            gpu.append((dev, "copy", "memcpy %s" % kinds.get(ck, str(ck)), start, end, nbytes))
            tr.events += 1
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


SQLITE_MAGIC = b"SQLite format 3"


def _read_bytes(path, sqlite_head_only=False):
    """A file's bytes (of an SQLite database, with sqlite_head_only, only
    its first 16: its reader opens it itself); a TraceError for a missing,
    unreadable or directory path."""
    try:
        with open(path, "rb") as f:
            data = f.read(16)
            if not (sqlite_head_only and data.startswith(SQLITE_MAGIC)):
                data += f.read()
            return data
    except FileNotFoundError:
        raise TraceError(path, "file not found")
    except IsADirectoryError:
        raise TraceError(path, "is a directory")
    except OSError as e:
        raise TraceError(path, "cannot read: %s" % (e.strerror or e))


def read_trace(path):
    """Any supported timeline -> Trace; a TraceError for what a user can fix.
    A cut-off JSON trace gives what was read (Trace.cut_off, .partial_step);
    complete_steps() is the command line's policy on its last step."""
    data = _read_bytes(path, sqlite_head_only=True)
    if data.startswith(SQLITE_MAGIC):
        tr, what = read_nsys_sqlite(path), "NVTX ranges, kernels and memcpys"
    else:
        tr, what = read_gpipe_json(path, data), "events"
    leave_out_strays(tr)
    if not any(s.step >= 0 for s in tr.slices):
        if tr.cut_off:
            raise TraceError(path, "cut off after %d complete events, before its first "
                             "pipeline step" % tr.events)
        raise TraceError(path, "no pipeline steps: none of its %s (%d) is one of gpipe's slices "
                         "(F0 s0, B0 s0, copy a0 s0->s1, ...) with a step" % (what, tr.events))
    return tr


# A slice further than this from the rest of its step (before their first
# start or after their last end) is a bad timestamp: the larger of a second
# and ten times the rest's span.  A step's slices all lie in one executor
# step, one after another, so no stall of a busy machine puts one that far.
STRAY_MIN_S = 1.0
STRAY_SPANS = 10.0


def leave_out_strays(tr):
    """Slices whose times lie far outside the rest of their step (a bad
    timestamp: one slice at -1e9 or 1e300 us would make that step's wall,
    and every bubble, absurd) move from tr.slices to tr.left_out as
    (slice, rest_start, rest_end), the most distant first, until none is
    left; the command line warns about them."""
    by_step = {}
    for s in tr.slices:
        if s.step >= 0:
            by_step.setdefault(s.step, []).append(s)
    strays = set()
    for sl in by_step.values():
        while len(sl) > 2:
            starts = sorted(range(len(sl)), key=lambda q: sl[q].start)[:2]
            ends = sorted(range(len(sl)), key=lambda q: -sl[q].end)[:2]
            worst = None
            for q, s in enumerate(sl):
                lo = sl[starts[1] if q == starts[0] else starts[0]].start
                hi = sl[ends[1] if q == ends[0] else ends[0]].end
                gap = max(lo - s.start, s.end - hi)
                if gap > max(STRAY_MIN_S, STRAY_SPANS * (hi - lo)):
                    if worst is None or gap > worst[0]:
                        worst = (gap, q, lo, hi)
            if worst is None:
                break
            _, q, lo, hi = worst
            tr.left_out.append((sl[q], lo, hi))
            strays.add(id(sl[q]))
            del sl[q]
    if strays:
        tr.slices = [s for s in tr.slices if id(s) not in strays]


def stray_note(tr):
    """One line about tr.left_out, naming its first slice, or None."""
    if not tr.left_out:
        return None
    s, lo, hi = tr.left_out[0]
    more = len(tr.left_out) - 1
    return ("%s (%s, step %d) runs %.6g .. %.6g ms, far outside the rest of its step "
            "(%.3f .. %.3f ms): a bad timestamp, left out of the metrics%s"
            % (s.ref or "a slice", json.dumps(s.name), s.step, s.start * 1e3, s.end * 1e3,
               lo * 1e3, hi * 1e3, " with %d more such slice%s" % (more, "s" if more > 1 else "")
               if more else ""))


def complete_steps(tr):
    """A cut-off trace without its last step where that step may be
    incomplete (Trace.partial_step), unless it is the only one: -> (Trace,
    a one-line note for the warning)."""
    steps = tr.steps()
    if tr.partial_step < 0:
        return tr, "the metrics cover steps %s" % _steps_str(steps)
    if len(steps) == 1:
        return tr, "step %d, the only one, may be incomplete: its metrics are partial" % steps[0]
    out = Trace(tr.path, tr.fmt, dict(tr.devices),
                [s for s in tr.slices if s.step != tr.partial_step], tr.events, tr.cut_off)
    return out, ("step %d may be incomplete and is left out: the metrics cover steps %s"
                 % (tr.partial_step, _steps_str(out.steps())))


def load(path):
    """read_trace for the command line: a cut-off trace is reported in one
    warning line on stderr and loses its possibly incomplete last step."""
    try:
        tr = read_trace(path)
    except TraceError:
        raise
    except Exception as e:   # a reader's bug, or an input nobody foresaw
        raise TraceError(path, "cannot read: %s" % unexpected(e))
    note = stray_note(tr)
    if note:
        print("timeline.py: %s: warning: %s" % (path, note), file=sys.stderr)
    if tr.cut_off:
        tr, note = complete_steps(tr)
        print("timeline.py: %s: warning: cut off (did the run stop before closing it?): read "
              "%d complete events; %s" % (path, tr.events, note), file=sys.stderr)
    return tr


STEPS_RE = re.compile(r"(\d+)(:(\d*))?|:(\d+)")


def parse_steps(option, spec):
    """--steps A:B, A, A:, :B or "all" -> (first, last, the option as given,
    for messages), or None for all steps."""
    if spec is None or spec == "all":
        return None
    what = "%s %s" % (option, spec)
    m = STEPS_RE.fullmatch(spec.strip())
    if not m:
        raise TraceError(what, "expected A:B, A:, :B or A")
    if m[4] is not None:
        return -1, int(m[4]), what
    lo = int(m[1])
    hi = lo if m[2] is None else (int(m[3]) if m[3] else 1 << 62)
    if hi < lo:
        raise TraceError(what, "the first step is after the last")
    return lo, hi, what


def first_step(tr):
    k = tr.steps()[0]
    return k, k, "step %d" % k


def select_steps(tr, rng):
    """Keep steps [first, last] of a trace (rng from parse_steps; None: all)."""
    if rng is None:
        return tr
    lo, hi, what = rng
    if not any(lo <= s <= hi for s in tr.steps()):
        raise TraceError(tr.path, "no step in %s (it has steps %s)"
                         % (what, _steps_str(tr.steps())))
    return Trace(tr.path, tr.fmt, dict(tr.devices),
                 [s for s in tr.slices if lo <= s.step <= hi], tr.events, tr.cut_off)


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
                                 if s.step == k and s.kind not in IDLE_KINDS]) for k in steps)
        row = {
            "name": tr.devices[d],
            "busy": busy,
            "idle": wall - busy,
            "bubble": (wall - busy) / wall if wall > 0 else 0.0,
            "copy": sum(s.end - s.start for s in mine if s.kind == "copy"),
            "wait": sum(s.end - s.start for s in mine if s.kind == "wait"),
            "forward": sum(s.end - s.start for s in mine if s.kind == "forward"),
            "backward": sum(s.end - s.start for s in mine if s.kind == "backward"),
            "weights": sum(s.end - s.start for s in mine if s.kind == "weights"),
            "recompute": sum(s.end - s.start for s in mine if s.kind == "recompute"),
            "end": sum(s.end - s.start for s in mine if s.kind == "end"),
            "barrier": sum(s.end - s.start for s in mine if s.kind == "barrier"),
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


def device_of(name):
    """A device's name without the stages it holds ("cpu:0 (stages 0, 3)"
    -> "cpu:0"): what pairs a device across two schedules."""
    return name.split(" (stage", 1)[0]


def metric_rows(m, label=None):
    """(label, value, kind) rows shared by summary and compare; label(name)
    names a device's rows (its trace name by default)."""
    label = label or (lambda name: name)
    rows = []
    for d, r in m["devices"].items():
        name = label(r["name"])
        for key in ("busy", "idle", "copy", "wait"):
            rows.append(("%s %s ms" % (name, key), r[key], "time"))
        for key in ("end", "barrier"):
            if any(x[key] for x in m["devices"].values()):
                rows.append(("%s %s ms" % (name, key), r[key], "time"))
        if "kernel" in r:
            rows.append(("%s kernel ms" % name, r["kernel"], "time"))
        rows.append(("%s bubble fraction" % name, r["bubble"], "frac"))
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
    # end-of-step work and barrier columns only for traces that have them
    extra = [k for k in ("end", "barrier") if any(r[k] for r in m["devices"].values())]
    print("%-22s %10s %10s %8s %10s %10s" % ("device", "busy ms", "idle ms", "bubble",
                                            "copy ms", "wait ms")
          + "".join(" %10s" % (k + " ms") for k in extra), file=out)
    for r in m["devices"].values():
        print("%-22s %10s %10s %8.3f %10s %10s" % (r["name"], _ms(r["busy"]), _ms(r["idle"]),
                                                  r["bubble"], _ms(r["copy"]), _ms(r["wait"]))
              + "".join(" %10s" % _ms(r[k]) for k in extra), file=out)
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
    na, nb = os.path.basename(ma["path"]), os.path.basename(mb["path"])
    print("A = %s\nB = %s" % (ma["path"], mb["path"]), file=out)
    # two schedules name a device by the stages it holds ("cpu:0 (stage 0)"
    # under 1F1B, "cpu:0 (stages 0, 3)" under zb-v): its rows are paired by
    # the device, each trace's names said first, where each trace names a
    # device once
    names = [[r["name"] for r in m["devices"].values()] for m in (ma, mb)]
    short = [[device_of(x) for x in ns] for ns in names]
    label = None
    if names[0] != names[1] and all(len(set(s)) == len(s) for s in short):
        label = device_of
        for dev in short[0]:
            if dev in short[1]:
                a, b = names[0][short[0].index(dev)], names[1][short[1].index(dev)]
                if a != b:
                    print("%s: A's %s, B's %s" % (dev, a[len(dev):].strip(" ()"),
                                                  b[len(dev):].strip(" ()")), file=out)
    print_compare_table(metric_rows(ma, label), metric_rows(mb, label),
                        lambda r: _fmt(r[1], r[2]),
                        lambda a, b: "%.3f" % (b[1] / a[1]) if a and b and a[1] != 0 else "-",
                        ("A " + na[:30], "B " + nb[:30]), out)


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
    # a device that runs several stages (interleaved) labels each slice
    # with its stage too ("3 s2"), or its stages' micro-batches look alike
    stages = {}
    for s in tr.slices:
        if s.stage >= 0 and s.kind in ("forward", "backward", "weights", "recompute"):
            stages.setdefault(s.device, set()).add(s.stage)
    for y, (d, tracks, _) in enumerate(rows):
        many = len(stages.get(d, ())) > 1
        for kind in KINDS:
            bars = [((s.start - t_origin) * 1e3, (s.end - s.start) * 1e3) for s in tr.slices
                    if s.device == d and s.track in tracks and s.kind == kind]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=COLORS[kind],
                               edgecolors="white", linewidth=0.3)
        for s in tr.slices:
            if (s.device == d and s.track in tracks and s.micro_batch >= 0
                    and s.kind in ("forward", "backward", "weights", "recompute", "copy")
                    and span > 0 and (s.end - s.start) > 0.012 * span):
                text = (str(s.micro_batch) if not many or s.stage < 0 or s.kind == "copy"
                        else "%d s%d" % (s.micro_batch, s.stage))
                ax.text((s.start + s.end - 2 * t_origin) / 2 * 1e3, y, text,
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
    end = max((max(s.end for s in tr.slices) - min(s.start for s in tr.slices)
               for tr in traces if tr.slices), default=1e-3)
    axes[-1, 0].set_xlim(0, end * 1e3 * 1.01)
    axes[-1, 0].set_xlabel("time since the first shown step began (ms)")
    kinds = [k for k in KINDS if any(s.kind == k for t in traces for s in t.slices)]
    fig.legend(handles=[Patch(color=COLORS[k], label=LABELS.get(k, k)) for k in kinds],
               loc="upper right", ncol=len(kinds), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.16, right=0.98, top=1 - 60 / height, bottom=55 / height,
                        hspace=0.35)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def default_size(traces):
    rows = sum(max(1, len(rows_of(t))) for t in traces)
    return 1200, 120 + 60 * len(traces) + 45 * rows


SIZE_RE = re.compile(r"(\d+)[xX](\d+)")


def parse_size(spec):
    """--size WIDTHxHEIGHT -> (width, height) in pixels, or None."""
    if spec is None:
        return None
    m = SIZE_RE.fullmatch(spec.strip())
    # Below 200 pixels the margins (60 and 55 pixels) leave no room to draw.
    if not m or not all(200 <= int(x) <= 20000 for x in m.groups()):
        raise TraceError("--size %s" % spec, "expected WIDTHxHEIGHT in pixels, each 200 to "
                         "20000, e.g. 1200x600")
    return int(m[1]), int(m[2])


def title_of(tr, m):
    return "%s — %d step(s) %s, mean step %s ms, overlap %.2f" % (
        os.path.basename(tr.path), len(m["steps"]), _steps_str(m["steps"]),
        _ms(m["mean_step_wall"]), m["overlap"])


# ---------------------------------------------------------------------- CLI --
def save(traces, titles, out, size):
    try:
        render(traces, titles, out, size)
    except OSError as e:
        raise TraceError("-o %s" % out, "cannot write: %s" % (e.strerror or e))
    except Exception as e:
        raise TraceError("-o %s" % out, "cannot draw: %s" % unexpected(e))



def _head_number(head, key):
    m = re.search(r'"%s"\s*:\s*(-?[0-9][0-9.eE+-]*)' % key, head)
    return float(m.group(1)) if m else None


def _check_merge_output(out, paths):
    """The output of merge is not one of its traces, nor a rank's trace
    already there ('merge r0.json r1.json', the output forgotten, would
    write rank 1 alone over rank 0's)."""
    for path in paths:
        same = os.path.abspath(path) == os.path.abspath(out)
        try:
            same = same or os.path.samefile(path, out)
        except OSError:
            pass
        if same:
            raise TraceError(out, "is one of the traces to merge; the output comes first: "
                             "merge OUTPUT.json TRACE.json TRACE.rank1.json ...")
    try:
        with open(out, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return  # not there (or unreadable: the write will say)
    if '"traceEvents"' in head and '"merged_from"' not in head:
        raise TraceError(out, "already holds a trace that merge did not write (a rank's?); "
                         "the output comes first: merge OUTPUT.json TRACE.json ...; remove it "
                         "first to replace it")


def _last_step(events):
    """The last step marker's step in a trace's events (None: none)."""
    steps = [e.get("args", {}).get("step") for e in events
             if isinstance(e, dict) and e.get("ph") == "i" and isinstance(e.get("args"), dict)]
    steps = [k for k in steps if isinstance(k, int)]
    return max(steps) if steps else None


# Ranks of one run open their traces together, just after an exchange every
# rank takes part in (0.3 ms apart on rank 0's clock, each file's
# clock_offset_s applied, in a 2-rank run here); traces of two runs, started
# one after the other, open at least a run's start-up apart (21 s for two
# 3-step runs of configs/default.yaml).
MERGE_ORIGINS_APART_S = 5.0


def _check_one_run(paths, files, ranks):
    """The traces are the ranks of one run: rank 0's first, each rank once,
    of one count of ranks, the same steps, and clocks that start together.
    A trace of another run merged in gave a 'step' of 8 s and a bubble of
    0.998 without a word; ranks left out are said."""
    rank0, total, last0, cut0 = ranks[0]
    if rank0 not in (None, 0):
        raise TraceError(paths[0], "is rank %d's trace; rank 0's comes first (its time axis "
                         "is the merged one's)" % rank0)
    seen = {}
    for path, (rank, count, last, cut) in zip(paths, ranks):
        if count is not None and total is not None and count != total:
            raise TraceError(path, "is a trace of a run of %d ranks, %s one of %d: traces of "
                             "different runs; merge the ranks of one run"
                             % (count, paths[0], total))
        if rank is not None and rank in seen:
            raise TraceError(path, "is rank %d's trace, as %s is: give each rank's trace once"
                             % (rank, seen[rank]))
        seen[rank] = path
        # a rank cut off (killed mid-run) ends earlier than the others: only
        # a whole trace must end where rank 0's whole one does
        if last is not None and last0 is not None and last != last0 and not (
                (cut and last <= last0) or (cut0 and last0 <= last)):
            raise TraceError(path, "ends at step %d, %s at step %d: traces of different runs "
                             "(or of other --trace-steps); merge the ranks of one run"
                             % (last, paths[0], last0))
    for path, zero, _ in files[1:]:
        if abs(zero - files[0][1]) > MERGE_ORIGINS_APART_S:
            raise TraceError(path, "began %.1f s %s %s on rank 0's clock; the ranks of one run "
                             "begin together: traces of different runs; merge the ranks of one "
                             "run" % (abs(zero - files[0][1]),
                                      "after" if zero > files[0][1] else "before", paths[0]))
    if total is not None and len(paths) < total:
        print("timeline.py: warning: %d of the run's %d ranks merged (%s): the devices of the "
              "others are not in the output" % (len(paths), int(total),
                                               ", ".join(str(int(r)) for r in sorted(seen)
                                                         if r is not None)), file=sys.stderr)


def merge(out, paths):
    """The ranks' traces -> one trace on rank 0's time axis (see the module
    docstring); returns the number of events written."""
    _check_merge_output(out, paths)
    files, ranks = [], []
    for path in paths:
        data = _read_bytes(path)
        events, cut, _ = _decode(path, data)
        head = data[:4096].decode("utf-8", "replace")
        origin = _head_number(head, "origin_s")
        if origin is None:
            raise TraceError(path, "no otherData.origin_s: not a gpipe trace, or one written "
                             "before traces could be merged; record the run again")
        if cut:
            print("timeline.py: %s: warning: cut off; merging its %d complete events"
                  % (path, len(events)), file=sys.stderr)
        files.append((path, origin - (_head_number(head, "clock_offset_s") or 0.0), events))
        ranks.append((_head_number(head, "rank"), _head_number(head, "ranks"),
                      _last_step(events), bool(cut)))
    _check_one_run(paths, files, ranks)
    ref = files[0][1]
    owner, merged = {}, []
    for q, (path, zero, events) in enumerate(files):
        shift = (zero - ref) * 1e6
        own = {e.get("pid") for e in events if isinstance(e, dict) and e.get("ph") == "X"}
        for pid in own:
            if pid in owner:
                raise TraceError(path, "device (pid %s) is also in %s: give each rank's trace "
                                 "once" % (pid, owner[pid]))
            owner[pid] = path
        for e in events:
            if not isinstance(e, dict):
                continue
            ph = e.get("ph")
            if ph == "i":
                if q:   # step markers: rank 0's
                    continue
            elif e.get("pid") not in own:
                continue
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = round(e["ts"] + shift, 3)
            merged.append(e)
    try:
        with open(out, "w") as f:
            f.write('{"displayTimeUnit": "ms", "otherData": {"producer": "gpipe", '
                    '"origin_s": %.9f, "merged_from": %s},\n"traceEvents": [\n'
                    % (ref, json.dumps(paths)))
            f.write(",\n".join(json.dumps(e) for e in merged))
            f.write("\n]}\n")
    except OSError as e:
        raise TraceError(out, "cannot write: %s" % (e.strerror or e))
    return len(merged)


def main(argv=None):
    """The command line; raises TraceError for a bad input or argument (cli()
    prints it).  Arguments and the output path are checked before any trace
    is read."""
    ap = parser_raising(TraceError)(prog="timeline.py", description=__doc__.split("\n")[0],
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("summary", help="per-device busy/idle/bubble/copy/wait, step walls")
    p.add_argument("trace")
    p.add_argument("--steps", help="A:B, A, A:, :B (default: all recorded steps)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p = sub.add_parser("compare", help="two runs side by side, ratios B/A, stacked Gantt")
    p.add_argument("a", help="run A's trace (the ratios' denominator)")
    p.add_argument("b", help="run B's trace")
    p.add_argument("-o", "--output",
                   help="the picture (default compare.png; .png, .svg or .pdf)")
    p.add_argument("--no-plot", action="store_true",
                   help="the table alone, no picture (needs no matplotlib; not with -o)")
    p.add_argument("--steps", help="steps summarised (default: all recorded)")
    p.add_argument("--plot-steps", help="steps drawn (default: each trace's first)")
    p.add_argument("--size", help="WIDTHxHEIGHT pixels")
    p = sub.add_parser("merge", help="the ranks' traces of an mpirun run on one time axis")
    p.add_argument("output", help="the merged trace to write (not one of the traces; a "
                   "rank's trace there is refused)")
    p.add_argument("traces", nargs="+", help="each rank's trace, rank 0's first (run.json "
                   "run.rank1.json ...)")
    p = sub.add_parser("gantt", help="one timeline picture")
    p.add_argument("trace")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--steps", help="steps drawn (default: the first recorded step)")
    p.add_argument("--size", help="WIDTHxHEIGHT pixels")
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        n = merge(args.output, args.traces)
        print("wrote %s: %d events from %d trace%s" % (args.output, n, len(args.traces),
                                                        "" if len(args.traces) == 1 else "s"))
        return 0
    steps = parse_steps("--steps", args.steps)

    if args.cmd == "summary":
        m = metrics(select_steps(load(args.trace), steps))
        if args.json:
            print(json.dumps(m, indent=1))
        else:
            print_summary(m)
        return 0
    size = parse_size(args.size)
    if args.cmd == "gantt":
        check_output(args.output, TraceError)
        tr = load(args.trace)
        tr = select_steps(tr, steps or first_step(tr))
        save([tr], [title_of(tr, metrics(tr))], args.output, size or default_size([tr]))
        print("wrote %s" % args.output)
        return 0
    # compare
    plot_steps = parse_steps("--plot-steps", args.plot_steps)
    if args.no_plot and args.output is not None:
        raise TraceError("-o %s --no-plot" % args.output, "--no-plot draws no picture to "
                         "write; give one of them")
    if args.output is None:
        args.output = "compare.png"
    if not args.no_plot:
        check_output(args.output, TraceError, ", or give --no-plot for the table alone")
    ta, tb = load(args.a), load(args.b)
    ma, mb = metrics(select_steps(ta, steps)), metrics(select_steps(tb, steps))
    print_compare(ma, mb)
    if args.no_plot:
        return 0
    pa = select_steps(ta, plot_steps or first_step(ta))
    pb = select_steps(tb, plot_steps or first_step(tb))
    save([pa, pb], ["A: " + title_of(pa, metrics(pa)), "B: " + title_of(pb, metrics(pb))],
         args.output, size or default_size([pa, pb]))
    print("wrote %s" % args.output)
    return 0


def cli(argv=None):
    return run_cli("timeline.py", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
