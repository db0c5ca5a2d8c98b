#!/usr/bin/python3
"""test_man.py — the manual pages (docs/man/*.1, installed by `make
install`) say what each tool's --help says now: scripts/man.py makes them
again from the built tools, and every kept page must equal its remake (run
scripts/man.py BUILD_DIR after changing a --help text); each page names
every option its --help lists, and groff reads it without a warning.

Needs GPIPE_BINARY_DIR (set by CTest) and GPIPE_SOURCE_DIR.  Prints
"test_man: N passed, N failed" last.
"""
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
TOOLS = ("gpipe-train", "gpipe-balance", "gpipe-sample")


def main():
    tmp = tempfile.mkdtemp(prefix="gpipe_man_")
    try:
        r = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "scripts", "man.py"), BINDIR,
                            tmp], capture_output=True, text=True)
        check(r.returncode == 0, "scripts/man.py: exit %d: %s" % (r.returncode, r.stderr[-500:]))
        for tool in TOOLS:
            kept = os.path.join(SRC, "docs", "man", tool + ".1")
            made = os.path.join(tmp, tool + ".1")
            if not (os.path.exists(kept) and os.path.exists(made)):
                check(False, "%s: no page (kept %s, made %s)" % (tool, os.path.exists(kept),
                                                                 os.path.exists(made)))
                continue
            same = open(kept).read() == open(made).read()
            check(same, "docs/man/%s.1 is not what %s --help says now: run scripts/man.py %s"
                  % (tool, tool, BINDIR))
            # every option of --help is on the page
            helptext = subprocess.run([os.path.join(BINDIR, tool), "--help"],
                                      capture_output=True, text=True).stdout
            opts = set(re.findall(r"^\s{1,3}(--?[a-z][-a-z0-9]*)", helptext, re.M))
            page = open(kept).read()
            missing = [o for o in opts if o.replace("-", "\\-") not in page and o not in page]
            check(len(opts) >= 8 and not missing,
                  "%s: %d options in --help, missing from its page: %s" % (tool, len(opts),
                                                                        missing))
            g = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", kept],
                               capture_output=True, text=True)
            check(g.returncode == 0 and not g.stderr.strip(),
                  "groff on docs/man/%s.1: exit %d: %s" % (tool, g.returncode, g.stderr[-500:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish("test_man")


if __name__ == "__main__":
    sys.exit(main())
