#!/usr/bin/env python3
"""test_tensorboard.py - gpipe-train's --tensorboard event files read by
TensorBoard's own reader, against the --metrics file of the same run.

For every run below, each event file must be whole records to its end,
each record's masked CRC32C the one TensorBoard computes; TensorBoard's
record reader (LegacyEventFileLoader) reads every event file of the
directory, in the order TensorBoard does; each (tag, step) must occur once,
and the set of (tag, step, value) must be exactly the metrics file's, each
number under the name docs/config.md gives it, as a 32-bit float (null as
NaN).  TensorBoard's EventAccumulator, what its UI reads, must list the
same tags with the same values.
  1. a plain run: two devices, three epochs with an evaluation each,
     gradient clipping (grad_norm), train.tensorboard as the config key;
  2. a run stopped and resumed: the snapshots after step 8 are removed, as
     a kill at step 21 leaves the files (events and metrics past the newest
     snapshot; step 8 ends an epoch, so its evaluation is taken again), then
     --resume latest goes on in the same directory with --tensorboard;
  3. an event file that cannot grow (ulimit -f): the run stops with the
     file and step named, cut back to its last whole record, the final
     snapshot keeping the step's record; the resumed run (after a record
     torn at the file's end, as a kill leaves one) writes it;
  4. a fresh run into the directory replaces the earlier run's files;
  5. a directory that cannot be made is refused before any work;
  6. under mpirun -np 2 with the config key on every rank, rank 0 alone
     writes the files (where mpirun is installed, as in CI).

Needs TensorBoard: from the interpreter running this script if it has it,
else from a venv made under GPIPE_BINARY_DIR (pip, from PyPI); exits 77
(skipped) if neither works.
"""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

from gpt_util import SKIP, ensure_libs

SRC = os.environ.get("GPIPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
TENSORBOARD = "tensorboard==2.21.0"
TRAIN = os.path.join(BIN, "gpipe-train")


failures = []
passed = 0


def check(ok, what):
    global passed
    if ok:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what)


# The names docs/config.md (train.tensorboard) gives the metrics' keys.
TOP = {"loss": "train/loss", "accuracy": "train/accuracy", "grad_norm": "train/grad_norm",
       "samples_per_s": "throughput/samples_per_s", "step_seconds": "time/step_seconds",
       "data_wait_seconds": "time/data_wait_seconds",
       "allreduce_seconds": "time/allreduce_seconds", "bad_files": "data/bad_files",
       "bubble": "pipeline/bubble", "pipeline_seconds": "time/pipeline_seconds"}


def f32(v):
    return float("nan") if v is None else struct.unpack("f", struct.pack("f", v))[0]


def expected(metrics_path):
    """{(tag, step): value} from the metrics file; a (tag, step) twice fails."""
    want = {}
    with open(metrics_path) as f:
        for line in f:
            rec = json.loads(line)
            step = rec["step"]
            pairs = []
            for k, v in rec.items():
                if k in ("step", "eval", "final"):
                    continue
                if k == "devices":
                    for d in v:
                        for dk, dv in d.items():
                            if dk == "name":
                                continue
                            tag = ("%s/%s" % (dk, d["name"]) if dk in ("host_waits", "launches")
                                   else "pipeline/%s/%s" % (d["name"], dk)
                                   if dk in ("busy_seconds", "idle_seconds")
                                   else "memory/%s/%s" % (d["name"], dk))
                            pairs.append((tag, dv))
                elif rec.get("eval"):
                    pairs.append(("test/" + (k[5:] if k.startswith("test_") else k), v))
                else:
                    pairs.append((TOP.get(k, k), v))
            for tag, v in pairs:
                check((tag, step) not in want, "metrics %s: %s at step %d twice"
                      % (metrics_path, tag, step))
                want[(tag, step)] = f32(v)
    return want


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def read_raw(logdir):
    """{(tag, step): value} through TensorBoard's record reader, every file."""
    from tensorboard.backend.event_processing import event_file_loader, io_wrapper
    got, dups = {}, []
    files = sorted(f for f in glob.glob(os.path.join(logdir, "*"))
                   if io_wrapper.IsTensorFlowEventsFile(f))
    versions = 0
    for path in files:
        for ev in event_file_loader.LegacyEventFileLoader(path).Load():
            if ev.HasField("file_version"):
                versions += 1
                check(ev.file_version == "brain.Event:2", "file_version %r" % ev.file_version)
                continue
            for v in ev.summary.value:
                key = (v.tag, ev.step)
                if key in got:
                    dups.append(key)
                got[key] = v.simple_value
    return got, dups, files, versions


def whole(name, logdir):
    """Every event file is whole records to its last byte, each CRC right
    by TensorBoard's own masked_crc32c (its reader stops at a torn record
    silently, as a file still being written may end in one)."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        with open(path, "rb") as f:
            b = f.read()
        at = 0
        while at + 16 <= len(b):
            n = struct.unpack("<Q", b[at:at + 8])[0]
            if (struct.unpack("<I", b[at + 8:at + 12])[0] != masked_crc32c(b[at:at + 8]) or
                    at + 16 + n > len(b) or struct.unpack("<I", b[at + 12 + n:at + 16 + n])[0]
                    != masked_crc32c(b[at + 12:at + 12 + n])):
                break
            at += 16 + n
        check(at == len(b), "%s: %s is whole records to its end (%d of %d bytes)"
              % (name, os.path.basename(path), at, len(b)))


def compare(name, logdir, metrics_path):
    whole(name, logdir)
    want = expected(metrics_path)
    got, dups, files, versions = read_raw(logdir)
    check(len(want) > 0, "%s: the metrics file has records" % name)
    check(not dups, "%s: (tag, step) written more than once: %s" % (name, dups[:5]))
    check(versions == len(files) and files, "%s: each of %d files starts with its version"
          % (name, len(files)))
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    check(not missing, "%s: not in the event files: %s" % (name, missing[:5]))
    check(not extra, "%s: in the event files, not in the metrics: %s" % (name, extra[:5]))
    differ = [(k, want[k], got[k]) for k in want if k in got and not same(want[k], got[k])]
    check(not differ, "%s: values differ (tag, step), metrics, events: %s" % (name, differ[:5]))
    # what TensorBoard's UI reads: every tag listed, the same values
    from tensorboard.backend.event_processing import event_accumulator as ea
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    check(tags == {t for t, _ in want}, "%s: EventAccumulator lists %d tags, metrics have %d"
          % (name, len(tags), len({t for t, _ in want})))
    bad = [(t, e.step) for t in tags for e in acc.Scalars(t)
           if not same(want.get((t, e.step), float("inf")), e.value)]
    check(not bad, "%s: EventAccumulator's values differ: %s" % (name, bad[:5]))
    for tag in ("train/loss", "test/accuracy", "lr", "throughput/samples_per_s",
                "train/grad_norm", "memory/cpu:0/peak_bytes", "memory/cpu:1/peak_bytes"):
        check(tag in tags, "%s: tag %s listed" % (name, tag))
    return want, files


def run(args, env=None, shell=None):
    cmd = shell if shell else [TRAIN] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, shell=bool(shell))
    return r.returncode, r.stdout + r.stderr


CONFIG = """
model:
  input: [1, 4, 4]
  layers: [flatten, {linear: {out: 8}}, relu, {linear: {out: 3}}]
pipeline: {devices: [cpu:0, cpu:1], chunks: 2}
data: {dataset: synthetic, synthetic: {train: 64, test: 8, classes: 3, shape: [1, 4, 4]}}
train:
  batch_size: 8
  epochs: 3
  seed: 3
  clip_grad_norm: 10
  tensorboard: %s
  snapshot: {every_steps: 4, keep: 10, dir: %s}
"""


def without_protobuf():
    """A build without protobuf-c: --tensorboard is refused at start-up,
    naming the flag and what to install, and nothing is written; then the
    test has nothing more to check (exit 77: CI builds with it)."""
    tmp = tempfile.mkdtemp(prefix="gp-tb-")
    try:
        cfg = os.path.join(tmp, "c.yaml")
        tb = os.path.join(tmp, "tb")
        with open(cfg, "w") as f:
            f.write(CONFIG % (os.path.join(tmp, "unused"), os.path.join(tmp, "snaps")))
        rc, out = run([cfg, "--no-progress", "-q", "--tensorboard", tb])
        check(rc != 0 and "built without TensorBoard" in out and "--tensorboard" in out
              and "libprotobuf-c-dev" in out and not os.path.exists(tb),
              "without protobuf-c, --tensorboard is refused clearly: rc %d: %s" % (rc, out[-400:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        sys.exit(1)
    print("test_tensorboard: built without protobuf-c (GPIPE_TENSORBOARD): the refusal checked;"
          " skipped")
    sys.exit(SKIP)


def main():
    if os.environ.get("GPIPE_HAVE_TENSORBOARD", "ON").upper() in ("OFF", "0", "FALSE", "NO"):
        without_protobuf()
    ensure_libs("test_tensorboard", ["tensorboard"], os.path.join(BIN, "tb-venv"), [TENSORBOARD],
                "GPIPE_TB_REEXEC")
    tmp = tempfile.mkdtemp(prefix="gp-tb-")
    try:
        cfg = os.path.join(tmp, "c.yaml")
        tb = os.path.join(tmp, "tb")
        snaps = os.path.join(tmp, "snaps")
        with open(cfg, "w") as f:
            f.write(CONFIG % (tb, snaps))
        m = os.path.join(tmp, "m.jsonl")

        # 1. a plain run, the directory from the config key (made by the run)
        rc, out = run([cfg, "--no-progress", "-q", "--metrics", m])
        check(rc == 0, "plain run: exit %d: %s" % (rc, out[-600:]))
        want, files = compare("plain run", tb, m)
        check(len(files) == 1, "plain run: one event file, not %d" % len(files))
        check(sum(1 for t, _ in want if t == "test/loss") == 3, "plain run: 3 evaluations")

        # 2. stopped and resumed: as a kill at step 21 leaves it, the
        # snapshots after step 8 gone; --tensorboard (the flag) names the
        # same directory
        for p in glob.glob(os.path.join(snaps, "snapshot-*")):
            if int(os.path.basename(p)[9:18]) > 8:
                os.remove(p)
        rc, out = run([cfg, "--no-progress", "-q", "--metrics", m, "--resume", "latest",
                       "--tensorboard", tb, "--set", "train.tensorboard=" + os.path.join(tmp, "else")])
        check(rc == 0, "resumed run: exit %d: %s" % (rc, out[-600:]))
        check(not os.path.exists(os.path.join(tmp, "else")), "resumed run: the flag wins over the key")
        want, files = compare("stopped and resumed", tb, m)
        check(len(files) == 2, "resumed run: a second event file, %d files" % len(files))
        check(sorted((s for t, s in want if t == "train/loss")) == list(range(1, 25)),
              "resumed run: steps 1 to 24 once each")

        # 3. an event file that cannot grow: each record is some 750 bytes
        # (the metrics' 650), so 8 KiB stops the run at about step 10
        shutil.rmtree(snaps)
        rc, out = run(None, shell="ulimit -f 8; exec %s %s --no-progress -q --metrics %s"
                      % (TRAIN, cfg, m))
        check(rc == 3 and "writing TensorBoard event file" in out and "File too large" in out
              and "cut back to its last whole record" in out
              and "make room for the TensorBoard event file (or give train.tensorboard" in out,
              "full event file: exit %d: %s" % (rc, out[-900:]))
        got, dups, files, _ = read_raw(tb)
        whole("full event file", tb)
        check(len(files) == 1 and not dups, "full event file: one whole file")
        last = max(s for _, s in got)
        check(os.path.exists(os.path.join(snaps, "snapshot-%09d.safetensors" % (last + 1))),
              "full event file: the final snapshot holds step %d, the one not written"
              % (last + 1))
        # (and a record torn by a kill after it: its first 20 bytes)
        ev = glob.glob(os.path.join(tb, "events.out.tfevents.*"))[0]
        with open(ev, "rb") as f:
            head = f.read(20)
        with open(ev, "ab") as f:
            f.write(head)
        rc, out = run([cfg, "--no-progress", "-q", "--metrics", m, "--resume", "latest"])
        check(rc == 0, "resumed after the full file: exit %d: %s" % (rc, out[-600:]))
        want, files = compare("full event file, resumed", tb, m)
        check(sorted((s for t, s in want if t == "train/loss")) == list(range(1, 25)),
              "full event file, resumed: steps 1 to 24 once each")
        check(("train/loss", last + 1) in want, "the kept record of step %d written" % (last + 1))

        # 4. a fresh run replaces the earlier run's event files
        shutil.rmtree(snaps)
        rc, out = run([cfg, "--no-progress", "-q", "--metrics", m, "--set", "train.epochs=1"])
        check(rc == 0, "fresh run: exit %d: %s" % (rc, out[-600:]))
        want, files = compare("fresh run over an old one", tb, m)
        check(len(files) == 1, "fresh run: one event file, not %d" % len(files))

        # 5. a directory that cannot be made, or a file, is refused before
        # any work (no metrics file begun), naming the flag or key
        afile = os.path.join(tmp, "afile")
        open(afile, "w").close()
        m2 = os.path.join(tmp, "m2.jsonl")
        for args, what in ((["--tensorboard", os.path.join(afile, "tb")], "--tensorboard"),
                           (["--set", "train.tensorboard=" + afile], "train.tensorboard")):
            rc, out = run([cfg, "--no-progress", "-q", "--metrics", m2] + args)
            check(rc == 3 and out.startswith("gpipe-train: " + what) and
                  "afile" in out and not os.path.exists(m2),
                  "bad directory %s: exit %d: %s" % (args, rc, out[-400:]))

        # 6. under mpirun (2 ranks, a device each), the config key given to
        # every rank: rank 0 alone writes, as it alone writes the metrics
        if shutil.which("mpirun"):
            shutil.rmtree(snaps)
            # (Open MPI's plugins leave allocations at exit that
            # LeakSanitizer cannot attribute: the ranks run without leak
            # detection, as in test_procs; the single-process runs keep it)
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1",
                       ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
            rc, out = run(None, env=env, shell="exec mpirun -np 2 --oversubscribe %s %s "
                          "--no-progress -q --metrics %s --set train.epochs=2"
                          % (TRAIN, cfg, m))
            check(rc == 0, "mpirun -np 2: exit %d: %s" % (rc, out[-600:]))
            want, files = compare("mpirun -np 2", tb, m)
            check(len(files) == 1, "mpirun -np 2: one event file (rank 0's), not %d"
                  % len(files))
        else:
            print("test_tensorboard: no mpirun here: the 2-rank case did not run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_tensorboard: %d passed, %d failed" % (passed, len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
