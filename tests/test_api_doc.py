#!/usr/bin/python3
"""test_api_doc.py — docs/api.md, the C API's reference, is what
include/gpipe.h says now: scripts/api_doc.py makes it again from the header
and the kept page must equal its remake (run scripts/api_doc.py after
changing gpipe.h); and, read from the header independently of the script,
every function, type and macro it declares heads an entry of the page.

Needs GPIPE_SOURCE_DIR (set by CTest), else the tree this file is in.
Prints "test_api_doc: N passed, N failed" last.
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


def declared(header):
    """Names include/gpipe.h declares: functions, typedefs, macros."""
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    out = set(re.findall(r"^#define (G\w+)", text, re.M)) - {"GPIPE_H"}
    out |= set(re.findall(r"^[A-Za-z][\w \*]*?\b(gp_\w+)\s*\(", text, re.M))
    out |= set(re.findall(r"^} (gp_\w+);", text, re.M))
    out |= set(re.findall(r"^typedef struct \w+ (gp_\w+);", text, re.M))
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="gpipe_api_")
    try:
        made = os.path.join(tmp, "api.md")
        r = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "scripts", "api_doc.py"), made],
                           capture_output=True, text=True)
        check(r.returncode == 0, "scripts/api_doc.py: exit %d: %s" % (r.returncode,
                                                                      r.stderr[-500:]))
        kept = os.path.join(SRC, "docs", "api.md")
        page = open(kept).read() if os.path.exists(kept) else ""
        check(page != "", "docs/api.md is missing: run scripts/api_doc.py")
        if os.path.exists(made):
            check(page == open(made).read(), "docs/api.md is not what include/gpipe.h says "
                  "now: run scripts/api_doc.py")
        names = declared(open(os.path.join(SRC, "include", "gpipe.h")).read())
        check(len(names) > 30, "%d names read from gpipe.h" % len(names))
        heads = set(re.findall(r"`(\w+)`", "\n".join(l for l in page.split("\n")
                                                      if l.startswith("### "))))
        for n in sorted(names):
            check(n in heads, "%s is declared in include/gpipe.h but heads no entry of "
                  "docs/api.md" % n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish("test_api_doc")


if __name__ == "__main__":
    sys.exit(main())
