#!/usr/bin/python3
"""test_doc_examples.py — every shell block of README.md and docs/*.md that
is marked runnable runs (issue 80, item 5).

A block is marked in its fence's info string, after the language:

    ```sh runnable
    build/gpipe-train configs/gpt2.yaml --dry-run | grep "language model"
    ```

(GitHub highlights it as sh; the word after is the mark).  A block that
trains or profiles for a minute under the sanitizers is also marked
`long` (```` ```sh runnable long ````): CI's sanitizer stages
(GPIPE_SANITIZED set) leave those out, since the README and AVX2 passes
run every block and the sanitizer stages run the same code paths in
test_e2e_gpt, test_e2e and test_plan; at most a quarter of the blocks may
be long.  Under the sanitizers gpipe-train also validates on the first
256 test samples only (data.test_limit, added to its command line by a
wrapper in build/): the final validation over the 10000 samples of
Fashion-MNIST was two thirds of each short run under ASan (16.1 s of
README.md's 1F1B block, 4.0 s without).  Each block runs
with bash -e -o pipefail in a fresh directory of its own, in which the
source tree's configs/, scripts/, tests/ and bench/ and the build directory
(as build/) are links, so the commands read as a user at the top of a
checkout types them and everything they write stays in that directory.  A
block that fails is named by its file and line, with its exit status and
the end of its output.  Blocks that train for minutes carry the small
sizes (--set train.steps=...) the page says they do.

Needs GPIPE_SOURCE_DIR and GPIPE_BINARY_DIR (set by CTest).  Prints
"test_doc_examples: N passed, N failed" last.
"""
import glob
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
LINKED = ("configs", "scripts", "tests", "bench", "include", "examples")


def blocks(path):
    """(line of the fence, text, long) of every runnable block in a Markdown
    file."""
    out, cur, start, long_ = [], None, 0, False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if cur is None:
            m = re.match(r"^```(\w+)\s+(.*)$", line.rstrip("\n"))
            if m and m.group(1) in ("sh", "bash") and "runnable" in m.group(2).split():
                cur, start, long_ = [], no, "long" in m.group(2).split()
            continue
        if line.startswith("```"):
            out.append((start, "".join(cur), long_))
            cur = None
        else:
            cur.append(line)
    return out


def wrapped_build(dest):
    """build/ for a block under a sanitizer: the build directory's entries
    as links, but gpipe-train a script that runs it with
    --set data.test_limit=256 last."""
    os.mkdir(dest)
    real = os.path.abspath(BINDIR)
    for name in os.listdir(real):
        if name != "gpipe-train":
            os.symlink(os.path.join(real, name), os.path.join(dest, name))
    script = os.path.join(dest, "gpipe-train")
    with open(script, "w") as f:
        f.write('#!/bin/sh\nexec "%s/gpipe-train" "$@" --set data.test_limit=256\n' % real)
    os.chmod(script, 0o755)


def main():
    pages = [os.path.join(SRC, "README.md")] + sorted(glob.glob(os.path.join(SRC, "docs", "*.md")))
    found, nlong, left = 0, 0, []
    sanitized = bool(os.environ.get("GPIPE_SANITIZED"))
    for page in pages:
        rel = os.path.relpath(page, SRC)
        for line, text, long_ in blocks(page):
            found += 1
            nlong += long_
            if long_ and sanitized:
                left.append("%s:%d" % (rel, line))
                continue
            work = tempfile.mkdtemp(prefix="gpipe_example_")
            try:
                for d in LINKED:
                    if os.path.isdir(os.path.join(SRC, d)):
                        os.symlink(os.path.join(SRC, d), os.path.join(work, d))
                if sanitized:
                    wrapped_build(os.path.join(work, "build"))
                else:
                    os.symlink(os.path.abspath(BINDIR), os.path.join(work, "build"))
                env = dict(os.environ, GPIPE_PROFILE_CACHE="off")
                try:
                    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=work,
                                       capture_output=True, text=True, errors="replace",
                                       timeout=600, stdin=subprocess.DEVNULL, env=env)
                    rc, out = r.returncode, r.stdout + r.stderr
                except subprocess.TimeoutExpired:
                    rc, out = None, "timed out after 600 s"
                check(rc == 0, "%s:%d: the runnable block exited %s; its output ends:\n%s"
                      % (rel, line, rc, out[-1500:]))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    check(found >= 3, "only %d runnable blocks in README.md and docs/" % found)
    check(4 * nlong <= found, "%d of the %d runnable blocks are marked long: at most a quarter "
          "may be (the sanitizer stages leave them out)" % (nlong, found))
    print("test_doc_examples: %d runnable blocks, %d marked long" % (found, nlong))
    if left:
        print("under a sanitizer: left out the long blocks %s (the plain build runs them)"
              % ", ".join(left))
    return finish("test_doc_examples")


if __name__ == "__main__":
    sys.exit(main())
