"""gp_script_common.py — what scripts/metrics.py and scripts/timeline.py
share: the one-line error a user can fix (ScriptError, exit 2), argparse's
usage errors as such a line, the check of an -o picture before any work,
a PNG's size, the table `compare` prints of two runs, and the command
line's wrapper that turns every failure into one line on stderr, never a
traceback.

Imported by the scripts from their own folder (Python puts a script's
folder first on sys.path); not a script itself.
"""
import argparse
import os
import struct
import sys
import traceback


class ScriptError(Exception):
    """A problem the user can fix (a bad file or argument).  run_cli prints
    it as one line, "PROG: SUBJECT: PROBLEM", and exits 2."""

    def __init__(self, subject, problem):
        super().__init__(subject, problem)
        self.subject, self.problem = subject, problem

    def __str__(self):
        return "%s: %s" % (self.subject, self.problem) if self.subject else self.problem


def parser_raising(error):
    """An ArgumentParser class whose usage errors are an `error`
    (a ScriptError class): one line, like every other error."""
    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise error(None, "%s (%s -h for usage)" % (message, self.prog))
    return Parser


def unexpected(e):
    """An exception nobody foresaw, in one line: type, message and where."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = " (%s line %d)" % (os.path.basename(where.filename), where.lineno) if where else ""
    return "%s: %s%s" % (type(e).__name__, e, at)


def check_output(path, error, alone=""):
    """Before any work: matplotlib is there, knows the picture format, and
    the path can be written (a file created to find out is removed); an
    `error` (a ScriptError class) otherwise.  alone: how to get the numbers
    without a picture, said when matplotlib is missing."""
    what = "-o %s" % path
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as e:
        raise error(what, "cannot draw: %s; run with Debian's /usr/bin/python3 and its "
                    "python3-matplotlib (scripts/install-deps.sh)%s" % (e, alone))
    ext = os.path.splitext(path)[1][1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if ext and ext not in formats:
        raise error(what, "cannot write: unknown picture format .%s (one of: %s)"
                    % (ext, ", ".join(sorted(formats))))
    existed = os.path.lexists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise error(what, "cannot write: %s" % (e.strerror or e))
    if not existed:
        try:
            os.remove(path)
        except OSError:
            pass


def png_size(path):
    """A PNG file's (width, height) from its header; ValueError if not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError("%s is not a PNG" % path)
    return struct.unpack(">II", head[16:24])


def print_compare_table(rows_a, rows_b, cell, ratio, heads=("A", "B"), out=None):
    """The table `compare` prints: a line per metric, rows_a's labels (each
    row's first item) in their order, then those only rows_b has; columns
    A and B hold cell(row) ("-" without a row), B/A holds ratio(row_a,
    row_b) (either may be None).  The columns are as wide as their widest
    value or heading, 14 at least."""
    out = out or sys.stdout
    la = {r[0]: r for r in rows_a}
    lb = {r[0]: r for r in rows_b}
    labels = [r[0] for r in rows_a] + [r[0] for r in rows_b if r[0] not in la]
    lines = []
    for lab in labels:
        x, y = la.get(lab), lb.get(lab)
        lines.append((lab, "-" if x is None else cell(x), "-" if y is None else cell(y),
                      ratio(x, y)))
    w = max(len(x) for x in labels + ["metric"])
    cw = max([14, len(heads[0]), len(heads[1])] + [len(c) for l in lines for c in l[1:3]])
    print("%-*s %*s %*s %8s" % (w, "metric", cw, heads[0], cw, heads[1], "B/A"), file=out)
    for lab, va, vb, r in lines:
        print("%-*s %*s %*s %8s" % (w, lab, cw, va, cw, vb, r), file=out)


def run_cli(prog, main, argv=None, nested=None):
    """main(argv) with every failure as one line on stderr, "PROG: ...":
    exit 2 for a bad input or argument (a ScriptError), and for anything
    unforeseen (with its type and line here, to report); never a traceback.
    nested: the message for a RecursionError (input nested too deeply),
    where the script expects one; otherwise it is unforeseen."""
    def fail(msg, rc=2):
        print("%s: %s" % (prog, msg.replace("\n", "\\n")), file=sys.stderr)
        return rc
    try:
        rc = main(argv)
        if sys.stdout is not None:   # None: started with stdout closed
            sys.stdout.flush()
        return rc
    except ScriptError as e:
        return fail(str(e))
    except BrokenPipeError:
        # The reader of stdout went away (| head): say nothing more there.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except OSError as e:
        # Files are opened where they are named (a ScriptError); one without
        # a name is stdout (a full disk, a closed descriptor).
        return fail("%s: cannot write: %s" % (e.filename or "stdout", e.strerror or e))
    except RecursionError as e:
        if nested is None:
            return fail("unexpected error, please report: %s" % unexpected(e))
        return fail(nested)
    except Exception as e:
        return fail("unexpected error, please report: %s" % unexpected(e))
