#!/usr/bin/python3
"""test_schedule_file.py — schedules as text (issue 78, items 2 and 3):
pipeline.schedule: {file: F} runs a schedule written as PyTorch's per-rank
action CSV, and gpipe-balance --write-schedule writes one.

  - PyTorch's own schedules (tests/data/schedules, written by PyTorch 2.15's
    schedule code with make_torch_csv.py: ZB-V on 2 and 4 ranks, interleaved
    1F1B, interleaved zero bubble and DualPipeV on 2, compute-only, with its sends
    and receives, and three as PyTorch's runtime dumps them (its waits,
    UNSHARD / RESHARD and REDUCE_GRAD among them)) run configs/tiny-gpt.yaml
    and give the one-device run's losses and weight bytes (the one device
    adds micro-batches in order, as every one of these does);
  - gpipe's own zb-v and dualpipe-v, written by --write-schedule, have
    PyTorch's ZB-V and DualPipeV computations in PyTorch's order on every
    rank (DualPipe's overlapped pairs one after the other), each send's wait
    where PyTorch's compute_comms reader needs it, and zb-v's runs to the
    same bits as pipeline.schedule: zb-v;
  - bad files are refused before anything runs, each naming the file, the
    rank and its line (and the column and action where there is one): a
    missing receive, a forward twice, a W before its I, a deadlock (the
    cycle named), a stage the others do not reach, a truncated action, a
    truncated row, a stage on two ranks, a receive after what reads it, a
    placement neither in loops nor in a V, too many rows, and micro-batches
    that are not pipeline.chunks; two receives missing (the first one's
    rank named), a send of a stage or micro-batch no computation has, a row
    longer than any schedule's, a missing SEND_B (its own rank named), a
    backward-data (I) without its W, a send between two stages of one
    rank, a whole backward (B) beside a
    backward-data (I), a send before the forward that makes its data;
  - the memory check before the first step, for zb-v and for a file: a
    pipeline.memory below what a device holds at least by the simulator's
    estimate is refused at start-up naming the device and schedule (and the
    same run with GPIPE_MEMORY_CHECK=0 does run out of memory in its step),
    one at 1.5x the estimated peak trains.

Needs GPIPE_BINARY_DIR (set by CTest) and GPIPE_SOURCE_DIR.  Prints
"test_schedule_file: N passed, N failed" last.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from gpt_util import check, finish

SRC = os.environ.get("GPIPE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINDIR = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
DATA = os.path.join(SRC, "tests", "data", "schedules")
CFG = os.path.join(SRC, "configs", "tiny-gpt.yaml")
COMMON = ["data.dataset=synthetic", "train.steps=2", "train.batch_size=8",
          "train.snapshot.every_steps=0", "pipeline.threads=1"]
# Under the sanitizers (CI's ASan stage sets GPIPE_SANITIZED) each run is
# 10-30x slower: the same GPT with 2 blocks of width 32 over 32 positions.
if os.environ.get("GPIPE_SANITIZED"):
    COMMON += ["model.input=[32]", "model.gpt={layers: 2, heads: 2, width: 32, positions: 32, "
               "vocab: 256, tie: true}"]


def gpipe(tmp, args, sets, tool="gpipe-train", env=None):
    cmd = [os.path.join(BINDIR, tool)] + args
    for s in COMMON + sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, errors="replace",
                       timeout=600, stdin=subprocess.DEVNULL, env=env)
    return r.returncode, r.stdout + r.stderr


def train(tmp, name, sets):
    metrics, weights = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".st")
    rc, out = gpipe(tmp, [CFG, "-q", "--metrics", metrics, "--export-weights", weights], sets)
    if rc != 0:
        return None, None, out
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l and '"step"' in l]
    return losses, open(weights, "rb").read(), out


def rows(path):
    """The file's rows of actions, DualPipe's overlapped pairs one after the other."""
    out = []
    for l in open(path):
        if not l.strip():
            continue
        r = []
        for c in l.strip().split(","):
            m = re.fullmatch(r"\((.*)\)OVERLAP_F_B", c)
            r += m.group(1).split(";") if m else ([c] if c else [])
        out.append(r)
    return out


def send_waits_bad(path):
    """What PyTorch's compute_comms reader (_validate_send_waits, 2.15) would
    refuse in a written file, and where _add_wait_send puts each wait: every
    SEND has one WAIT_SEND after it on its row, a forward's right after the
    row's backward (I or B) of its stage and micro-batch where there is one.
    Without the waits PyTorch 2.15 loaded none of gpipe's files."""
    bad = []
    for r, row in enumerate(rows(path)):
        pending = []
        for k, a in enumerate(row):
            m = re.fullmatch(r"(\d+)(SEND_F|SEND_B|WAIT_SEND_F|WAIT_SEND_B|I|B)(\d+)", a)
            if not m:
                continue
            j, kind, i = int(m.group(1)), m.group(2), int(m.group(3))
            if kind.startswith("SEND"):
                pending.append((kind, j, i))
            elif kind.startswith("WAIT"):
                key = (kind[5:], j, i)
                if key not in pending:
                    bad.append("row %d: %s waits for no send" % (r, a))
                else:
                    pending.remove(key)
            elif ("SEND_F", j, i) in pending and row[k + 1:k + 2] != ["%dWAIT_SEND_F%d" % (j, i)]:
                bad.append("row %d: %s not followed by the wait of its forward's send" % (r, a))
        bad += ["row %d: %s%s%d has no wait" % (r, j, kind, i) for kind, j, i in pending]
    return bad


def devices(n):
    return "pipeline.devices=[" + ", ".join("cpu:%d" % d for d in range(n)) + "]"


def main():
    tmp = tempfile.mkdtemp(prefix="gpipe_schedfile_")
    try:
        refs = {}
        for m in (4, 8):
            refs[m] = train(tmp, "one%d" % m, ["pipeline.devices=[cpu:0]", "pipeline.chunks=%d" % m,
                                               "pipeline.schedule=1f1b"])
            check(refs[m][0] is not None, "one device, m = %d: %s" % (m, refs[m][2][-400:]))
        # PyTorch's schedules, as its own code wrote them
        for stem in ("zbv_n2_m4", "zbv_n2_m8", "zbv_n4_m8", "interleaved_n2_m4",
                     "interleaved_zb_n2_m4", "dualpipev_n2_m4", "dualpipev_n2_m8"):
            n, m = (int(x) for x in re.search(r"_n(\d+)_m(\d+)", stem).groups())
            # (_runtime: as PyTorch 2.15's runtime writes a user's dump, its
            # waits, UNSHARD / RESHARD and REDUCE_GRAD among the actions)
            runtime = stem in ("zbv_n2_m4", "interleaved_n2_m4", "dualpipev_n2_m4")
            for suffix in ("", "_comms") + (("_runtime",) if runtime else ()):
                path = os.path.join(DATA, stem + suffix + ".csv")
                got, w, out = train(tmp, stem + suffix, [devices(n), "pipeline.chunks=%d" % m,
                                                         "pipeline.schedule={file: %s}" % path])
                ref, ref_w, _ = refs[m]
                check(got is not None and got == ref and w == ref_w,
                      "%s%s: losses %r (one device %r), weights %s: %s"
                      % (stem, suffix, got, ref, "same" if w == ref_w else "DIFFER", out[-600:]))
        # the same with recomputation (except_last: every forward but a
        # stage's last before its backward recomputed, I and W apart), the
        # one device's bits still: configs/tiny-gpt.yaml recomputes nothing
        # since 2026-11-30, and these runs inherited that
        for stem in ("zbv_n2_m4", "zbv_n4_m8", "interleaved_zb_n2_m4", "dualpipev_n2_m4"):
            n, m = (int(x) for x in re.search(r"_n(\d+)_m(\d+)", stem).groups())
            path = os.path.join(DATA, stem + ".csv")
            got, w, out = train(tmp, stem + "_ck", [devices(n), "pipeline.chunks=%d" % m,
                                                    "pipeline.checkpoint=except_last",
                                                    "pipeline.schedule={file: %s}" % path])
            ref, ref_w, _ = refs[m]
            check(got is not None and got == ref and w == ref_w,
                  "%s, except_last: losses %r (one device %r), weights %s: %s"
                  % (stem, got, ref, "same" if w == ref_w else "DIFFER", out[-600:]))
        # gpipe's zb-v written out: PyTorch's order, and the same run
        mine = os.path.join(tmp, "mine.csv")
        rc, out = gpipe(tmp, [CFG, "-q", "--write-schedule", mine],
                        [devices(2), "pipeline.chunks=8", "pipeline.schedule=zb-v"],
                        "gpipe-balance")
        check(rc == 0 and os.path.exists(mine), "--write-schedule: %s" % out[-600:])
        if rc == 0:
            compute = [[a for a in r if re.fullmatch(r"\d+[FIWB]\d+", a)] for r in rows(mine)]
            check(compute == rows(os.path.join(DATA, "zbv_n2_m8.csv")),
                  "gpipe's zb-v is PyTorch's ZB-V, rank by rank: %r" % compute)
            check(not send_waits_bad(mine), "zb-v's file, as PyTorch's compute_comms reader "
                  "takes it: %s" % send_waits_bad(mine)[:3])
            a = train(tmp, "builtin", [devices(2), "pipeline.chunks=8", "pipeline.schedule=zb-v"])
            b = train(tmp, "written", [devices(2), "pipeline.chunks=8",
                                       "pipeline.schedule={file: %s}" % mine])
            check(a[0] is not None and a[:2] == b[:2] and a[0] == refs[8][0],
                  "zb-v and its written file: %r %r" % (a[0], b[0]))
        # gpipe's dualpipe-v is PyTorch's DualPipeV (its overlapped pairs in order)
        for m in (4, 8):
            mine = os.path.join(tmp, "dp%d.csv" % m)
            rc, out = gpipe(tmp, [CFG, "-q", "--write-schedule", mine],
                            [devices(2), "pipeline.chunks=%d" % m, "pipeline.schedule=dualpipe-v"],
                            "gpipe-balance")
            compute = [[a for a in r if re.fullmatch(r"\d+[FIWB]\d+", a)] for r in rows(mine)] \
                if rc == 0 else None
            check(compute == rows(os.path.join(DATA, "dualpipev_n2_m%d.csv" % m)),
                  "gpipe's dualpipe-v, m = %d, is PyTorch's DualPipeV: %r %s"
                  % (m, compute, out[-300:]))
            check(rc == 0 and not send_waits_bad(mine), "dualpipe-v's file, as PyTorch's "
                  "compute_comms reader takes it: %s" % (send_waits_bad(mine)[:3] if rc == 0
                                                         else out[-300:]))
        # gpipe-balance's table for a V: each stage's column is its share of
        # the device, and the devices' own peaks and memory follow (the
        # share was printed as "capacity", a split that fits shown over it)
        rc, out = gpipe(tmp, [CFG, "--by", "size"], [devices(2), "pipeline.chunks=4",
                                                     "pipeline.schedule=zb-v",
                                                     "pipeline.memory=1GiB"], "gpipe-balance")
        check(rc == 0 and "share of dev" in out and "512.0 MiB" in out and
              re.search(r"each device's peak, its 2 stages together: device 0 [\d.]+ \w*B of "
                        r"1\.0 GiB, device 1 [\d.]+ \w*B of 1\.0 GiB", out),
              "gpipe-balance --by size of a V: %s" % out[-600:])
        # the simulator runs a file's schedule too: the run's last words
        path = os.path.join(DATA, "zbv_n2_m4.csv")
        r = subprocess.run([os.path.join(BINDIR, "gpipe-train"), CFG] + sum(
            (["--set", x] for x in COMMON + [devices(2), "pipeline.chunks=4", "pipeline.balance=auto",
                                             "pipeline.schedule={file: %s}" % path]), []),
            cwd=tmp, capture_output=True, text=True, timeout=600,
            env=dict(os.environ, GPIPE_PROFILE_CACHE=os.path.join(tmp, "cache")))
        check(r.returncode == 0 and "(schedule file %s, 4 micro-batches); the simulator's" % path
              in r.stderr, "a file's bubble beside the simulator's: %s" % r.stderr[-600:])
        # gpipe-balance --write keeps a file schedule whose path has a quote
        # and a backslash (it wrote them bare into a double-quoted scalar)
        odd = os.path.join(tmp, 'q"uo\\te.csv')
        shutil.copy(os.path.join(DATA, "zbv_n2_m4.csv"), odd)
        written = os.path.join(tmp, "written.yaml")
        rc, out = gpipe(tmp, [CFG, "--by", "size", "-q", "--write", written],
                        [devices(2), "pipeline.chunks=4", "pipeline.schedule={file: '%s'}" % odd],
                        "gpipe-balance")
        rc2, out2 = gpipe(tmp, [written, "--dry-run"], []) if rc == 0 else (rc, out)
        check(rc == 0 and rc2 == 0 and odd in out2,
              "--write of a file schedule with a quote in its path: %d %d %s %s"
              % (rc, rc2, out[-300:], out2[-300:]))
        # --by both predicts the step of a file's schedule on both splits
        # (it printed nothing: the file was not passed to the simulator)
        rc, out = gpipe(tmp, [CFG, "--by", "both", "-q", "--reps", "1"],
                        [devices(2), "pipeline.chunks=4",
                         "pipeline.schedule={file: %s}" % os.path.join(DATA, "zbv_n2_m4.csv")],
                        "gpipe-balance", env=dict(os.environ, GPIPE_PROFILE_CACHE="off"))
        check(rc == 0 and re.search(r"predicted step: by time [\d.]+ ms, by size [\d.]+ ms", out),
              "--by both with a schedule file: exit %d: %s" % (rc, out[-500:]))
        # with replicas: the file as the built-in on each replica
        rep = [devices(2), "pipeline.replicas=2", "pipeline.chunks=4"]
        a = train(tmp, "repfile", rep + ["pipeline.schedule={file: %s}"
                                         % os.path.join(DATA, "zbv_n2_m4.csv")])
        b = train(tmp, "repzbv", rep + ["pipeline.schedule=zb-v"])
        check(a[0] is not None and a[:2] == b[:2],
              "2 replicas: the file's zb-v and the built-in: %r %r %s" % (a[0], b[0], a[2][-300:]))
        # bad files, refused before anything runs, naming the rank and line
        base = rows(os.path.join(DATA, "zbv_n2_m4_comms.csv"))

        def variant(name, change, want, n=2, m=4):
            r = [list(x) for x in base]
            change(r)
            path = os.path.join(tmp, name + ".csv")
            with open(path, "w") as f:
                f.write("\n".join(",".join(x) for x in r) + "\n")
            rc, out = gpipe(tmp, [CFG, "--dry-run"], [devices(n), "pipeline.chunks=%d" % m,
                                                       "pipeline.schedule={file: %s}" % path])
            check(rc == 2 and (name + ".csv") in out and all(w in out for w in want),
                  "%s: exit %d, wanted %r in: %s" % (name, rc, want, out[-700:]))

        def drop(r, q, act):
            r[q].remove(act)

        def swap(r, q, a, b):
            i, j = r[q].index(a), r[q].index(b)
            r[q][i], r[q][j] = r[q][j], r[q][i]

        variant("missing_recv", lambda r: drop(r, 1, "1RECV_F2"), ["rank 1", ":2:", "RECV_F"])
        variant("forward_twice", lambda r: r[0].insert(5, "0F1"), ["rank 0", ":1:", "'0F1'",
                                                                  "a second time"])
        variant("w_before_i", lambda r: swap(r, 0, "3I0", "3W0"), ["rank 0", ":1:", "'3W0'",
                                                                  "before the backward-data"])
        variant("unknown_stage", lambda r: r[0].append("7F0"), ["rank 0", ":1:", "'7F0'",
                                                               "no rank runs stage 4"])
        variant("truncated_action", lambda r: r[1].__setitem__(len(r[1]) - 1, "1W"),
                ["rank 1", ":2:", "'1W'", "not an action"])
        # a relative path that is not there: read from the working directory, said
        rc, out = gpipe(tmp, [CFG, "--dry-run"], [devices(2), "pipeline.chunks=4",
                                                  "pipeline.schedule={file: nosuch.csv}"])
        check(rc == 2 and "cannot read the schedule 'nosuch.csv'" in out and
              "read from the working directory, %s," % os.path.realpath(tmp) in out,
              "a missing relative file: exit %d: %s" % (rc, out[-400:]))
        # binary bytes in an action: quoted \xNN, never echoed to the terminal
        variant("control_bytes", lambda r: r[1].__setitem__(2, "\x1b[31m\x07x"),
                ["rank 1", ":2:", "'\\x1b[31m\\x07x'", "not an action"])
        variant("truncated_row", lambda r: r.__setitem__(1, r[1][:len(r[1]) // 2]),
                ["rank 1", ":2:"])
        variant("stage_two_ranks", lambda r: r[1].insert(0, r[0].pop(0)),
                ["rank 1", ":2:", "'0F0'", "stage 0 runs on rank 1 here and on rank 0"])
        variant("recv_after_use", lambda r: swap(r, 0, "3RECV_F0", "3F0"),
                ["rank 0", ":1:", "'3RECV_F0'", "received after the forward"])
        variant("too_many_rows", lambda r: r.append(list(r[1])), ["3 rows", "lists 2"])
        variant("chunks", lambda r: None, ["runs 4 micro-batches", "set chunks: 4"], m=8)
        # rank 1's RECV_F and rank 0's RECV_B of micro-batch 2 gone: the
        # first missing is rank 1's (it named rank 0, the other's)
        variant("two_missing", lambda r: (drop(r, 1, "1RECV_F2"), drop(r, 0, "0RECV_B2")),
                ["rank 1 has no RECV_F", ":2:"])
        # a send of a stage or micro-batch no computation names
        variant("send_no_stage", lambda r: r[0].append("5SEND_F0"),
                ["rank 0", ":1:", "'5SEND_F0'", "no stage 5"])
        variant("send_no_mb", lambda r: r[0].append("0SEND_F9"),
                ["rank 0", ":1:", "'0SEND_F9'", "no micro-batch 9", "0 .. 3"])
        # rank 1's SEND_B of micro-batch 2 gone (its RECV_F there): rank 1
        # named, whose send it is, not rank 0 across the crossing
        variant("missing_send_b", lambda r: drop(r, 1, "1SEND_B2"),
                ["rank 1 has no SEND_B", ":2:"])
        # a send between two stages of one rank (1 and 2 of the V)
        variant("send_same_rank", lambda r: r[1].append("1SEND_F0"),
                ["rank 1", ":2:", "'1SEND_F0'", "both on rank 1"])
        # a backward-data without its backward-weights: the weights would
        # never get that micro-batch's gradient
        variant("missing_w", lambda r: drop(r, 0, "3W0"),
                ["rank 0", ":1:", "no backward-weights (W) after its I", "stage 3"])
        # a whole backward of a micro-batch that has its backward-data too
        variant("b_after_i", lambda r: r[0].append("3B0"),
                ["rank 0", ":1:", "'3B0'", "also has a backward-data", "give B, or I and W"])
        # a send before the forward that makes its data
        variant("send_before_forward", lambda r: swap(r, 0, "0F1", "0SEND_F1"),
                ["rank 0", ":1:", "'0SEND_F1'", "sent before the forward"])
        # a forward of a micro-batch past the others' (a typo: 0F9 for 0F1):
        # named as such, not as micro-batch 4's missing forward
        variant("mb_gap", lambda r: r[0].insert(1, "0F9"),
                ["rank 0", ":1:", "'0F9'", "no computation names micro-batch 4",
                 "mistyped"])
        # a row longer than any schedule's (7 actions a stage and micro-batch)
        variant("long_row", lambda r: r[0].extend(["0F0"] * 7 * 1024 * 64),
                ["rank 0", ":1:", "more than 458752 actions in one row"])
        # a deadlock: rank 0 runs stage 0's backward-data before stage 3's
        # forward, whose backward it waits for through rank 1
        dl = [["0F0", "0I0", "3F0", "3I0", "3W0", "0W0"], ["1F0", "2F0", "2I0", "2W0", "1I0", "1W0"]]
        path = os.path.join(tmp, "cycle.csv")
        with open(path, "w") as f:
            f.write("\n".join(",".join(x) for x in dl) + "\n")
        rc, out = gpipe(tmp, [CFG, "--dry-run"], [devices(2), "pipeline.chunks=1",
                                                   "pipeline.schedule={file: %s}" % path])
        check(rc == 2 and "deadlocks" in out and "rank 0, '0I0' waits for '1I0' on rank 1" in out
              and "rank 1" in out and "cycle.csv:1:" in out,
              "a cycle named: exit %d: %s" % (rc, out[-900:]))
        # a spreadsheet's byte-order mark (PyTorch's csv.writer ends lines in
        # CRLF already): the same file
        path = os.path.join(tmp, "bom.csv")
        with open(path, "wb") as f:
            f.write(b"\xef\xbb\xbf" + open(os.path.join(DATA, "zbv_n2_m4.csv"), "rb").read())
        rc, out = gpipe(tmp, [CFG, "--dry-run"], [devices(2), "pipeline.chunks=4",
                                                   "pipeline.schedule={file: %s}" % path])
        check(rc == 0, "a byte-order mark: exit %d: %s" % (rc, out[-500:]))
        # a placement neither in loops nor in a V
        bad = [["0F0", "1F0", "1B0", "0B0"], ["2F0", "3F0", "3B0", "2B0"]]
        path = os.path.join(tmp, "blocks.csv")
        with open(path, "w") as f:
            f.write("\n".join(",".join(x) for x in bad) + "\n")
        rc, out = gpipe(tmp, [CFG, "--dry-run"], [devices(2), "pipeline.chunks=1",
                                                   "pipeline.schedule={file: %s}" % path])
        check(rc == 2 and "in loops" in out and "in a V" in out and "rank 0" in out,
              "stages in blocks refused: exit %d: %s" % (rc, out[-700:]))
        memory_check(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish("test_schedule_file")


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def peaks(out):
    """--dry-run's line of each device's bytes at a step's peak: (what it
    says, the estimated peaks, what each device holds at least)."""
    m = re.search(r"memory at a step's peak \((.*?)\):(.*)", out)
    if not m:
        return None, [], []
    dev = re.findall(r"cpu:\d+ ([\d.]+) (\w+)(?: \(at least ([\d.]+) (\w+)\))?", m.group(2))
    pk = [float(v) * UNITS[u] for v, u, _, _ in dev]
    low = [float(a) * UNITS[b] if a else float(v) * UNITS[u] for v, u, a, b in dev]
    return m.group(1), pk, low


def memory_check(tmp):
    """Item 3's memory check: before the first step, each device's peak under
    the run's own schedule (built-in or from a file) against its
    pipeline.memory.  Below what a device holds at least the run stops at
    start-up naming the device and the schedule; with the check off the same
    run stops in its first step, out of memory (the check was right to
    refuse); at 1.5x the estimated peak it trains."""
    # the split by estimated FLOPs, the one --dry-run shows (balance:
    # auto's profile could split otherwise, and its planner refuses a
    # capacity no split fits before the check is reached)
    flops = dict(os.environ, GPIPE_BALANCE="flops")
    for name, sched in (("zb-v", "pipeline.schedule=zb-v"),
                        ("file", "pipeline.schedule={file: %s}"
                         % os.path.join(DATA, "zbv_n2_m4.csv"))):
        sets = [devices(2), "pipeline.chunks=4", sched, "train.steps=1"]
        rc, out = gpipe(tmp, [CFG, "--dry-run"], sets, env=flops)
        what, pk, low = peaks(out)
        check(rc == 0 and len(pk) == 2 and all(0 < a <= p for a, p in zip(low, pk))
              and what is not None
              and ("zb-v" in what if name == "zb-v" else "zbv_n2_m4.csv" in what),
              "%s: --dry-run gives each device's peak: exit %d: %s" % (name, rc, out[-600:]))
        if len(pk) != 2:
            continue
        # below what a device holds at least (two stages a device: each
        # stage's peak beside the other's weights; the estimated sum errs
        # high, and a run that fits is never refused)
        tight = "pipeline.memory=%dKiB" % int(max(low) * 0.9 / 1024)
        rc, out = gpipe(tmp, [CFG, "-q"], sets + [tight], env=flops)
        want = "the schedule in " if name == "file" else "schedule zb-v"
        check(rc == 4 and "at a step's peak" in out and want in out and "step 1" not in out
              and "GPIPE_MEMORY_CHECK=0" in out,
              "%s: refused before the first step at 0.9x its peak: exit %d: %s"
              % (name, rc, out[-700:]))
        rc2, out2 = gpipe(tmp, [CFG, "--dry-run"], sets + [tight], env=flops)
        check(rc2 == 0 and "a run would stop at start-up" in out2,
              "%s: --dry-run notes the device that would not fit: %s" % (name, out2[-600:]))
        env = dict(flops, GPIPE_MEMORY_CHECK="0")
        cmd = [os.path.join(BINDIR, "gpipe-train"), CFG, "-q"]
        for x in COMMON + sets + [tight]:
            cmd += ["--set", x]
        r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, errors="replace",
                           timeout=600, stdin=subprocess.DEVNULL, env=env)
        check(r.returncode == 4 and "out of memory on device" in r.stdout + r.stderr,
              "%s: with the check off the run runs out of memory in its step: exit %d: %s"
              % (name, r.returncode, (r.stdout + r.stderr)[-600:]))
        roomy = "pipeline.memory=%dKiB" % int(max(pk) * 1.5 / 1024)
        rc, out = gpipe(tmp, [CFG, "-q"], sets + [roomy], env=flops)
        check(rc == 0, "%s: trains within 1.5x its estimated peak: exit %d: %s"
              % (name, rc, out[-600:]))


if __name__ == "__main__":
    sys.exit(main())
