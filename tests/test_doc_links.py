#!/usr/bin/python3
"""test_doc_links.py — every link in README.md and docs/*.md resolves
(issue 80's bar): a relative link names a file or folder of the tree, and
an anchor (#section, alone or after a .md file) names a heading of that
page, by GitHub's rule for heading anchors (lower case, punctuation but
hyphens and underscores dropped, spaces to hyphens, repeats numbered -1,
-2, ...).  Links to the web (http, https, mailto) are not fetched: CI has
no network.  Links inside code spans and fenced code blocks are not links.  And
CHANGELOG.md's newest version is the one gpipe-train --version prints.  And
README.md stays a front door: at most 350 lines, opening with its two
commands (train the default config; run the test suite) byte for byte as
they were when the README became one (issue 80's bar).

Needs GPIPE_SOURCE_DIR (set by CTest), else the tree this file is in.
Prints "test_doc_links: N passed, N failed" last.
"""
import glob
import os
import re
import subprocess
import sys

from gpt_util import check, finish

SRC = os.environ.get("GPIPE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def strip_code(text):
    """The text with fenced blocks and code spans blanked (lines kept)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^\s*(```|~~~)", line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            out.append("")
            continue
        out.append("" if fence else re.sub(r"`[^`]*`", "", line))
    return out


def anchors(path):
    """GitHub's anchors of the headings of a Markdown file."""
    seen, out = {}, set()
    raw = open(path, encoding="utf-8").read().split("\n")
    for line, kept in zip(raw, strip_code("\n".join(raw))):
        if not re.match(r"^#{1,6}\s", kept):   # not a heading, or inside a fence
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        # a code span in a heading keeps its text (GitHub drops only the backticks)
        slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower().strip()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else "%s-%d" % (slug, n))
    return out


def links(path):
    """(line, target) of every Markdown link and image in the file."""
    raw = open(path, encoding="utf-8").read().split("\n")
    fence = None
    for no, line in enumerate(raw, 1):
        m = re.match(r"^\s*(```|~~~)", line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence:
            continue
        bare = re.sub(r"`[^`]*`", "", line)
        for t in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", bare):
            yield no, t
        for t in re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", bare):  # reference definitions
            yield no, t


# README.md's opening: its title and the two commands, unchanged.
README_OPENING = (
    "# gpipe\n"
    "\n"
    "```sh\n"
    "scripts/install-deps.sh && make train   # installs what is missing (Debian), builds Release, trains configs/default.yaml\n"
    "scripts/install-deps.sh && make test    # builds and runs the whole test suite (ctest)\n"
    "```\n")
README_MAX_LINES = 350


def readme_front():
    """README.md is at most README_MAX_LINES lines and opens with the two commands."""
    text = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    check(lines <= README_MAX_LINES, "README.md has %d lines, more than %d: move the detail "
          "into a guide under docs/" % (lines, README_MAX_LINES))
    check(text.startswith(README_OPENING), "README.md no longer opens with its two commands "
          "as they were:\n%s" % README_OPENING)


def main():
    pages = [os.path.join(SRC, "README.md")] + sorted(glob.glob(os.path.join(SRC, "docs", "*.md")))
    cache = {}
    total = 0
    for page in pages:
        rel = os.path.relpath(page, SRC)
        for no, target in links(page):
            if re.match(r"^(https?|mailto|ftp):", target):
                continue
            total += 1
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            ok = os.path.exists(dest)
            why = "no such file or folder"
            if ok and frag and dest.endswith(".md"):
                if dest not in cache:
                    cache[dest] = anchors(dest)
                ok = frag.lower() in cache[dest]
                why = "no heading with that anchor in %s" % os.path.relpath(dest, SRC)
            check(ok, "%s:%d: the link '%s' does not resolve: %s" % (rel, no, target, why))
    check(total > 20, "only %d links found in README.md and docs/: is the parser right?" % total)
    changelog_version()
    readme_front()
    return finish("test_doc_links")


def changelog_version():
    """CHANGELOG.md's newest entry is include/gpipe.h's version, which the
    built gpipe-train's --version prints."""
    h = open(os.path.join(SRC, "include", "gpipe.h")).read()
    v = ".".join(re.search(r"#define GPIPE_VERSION_%s (\d+)" % k, h).group(1)
                 for k in ("MAJOR", "MINOR", "PATCH"))
    path = os.path.join(SRC, "CHANGELOG.md")
    top = None
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            m = re.match(r"^## (\d+\.\d+\.\d+)\b", line)
            if m:
                top = m.group(1)
                break
    check(top == v, "CHANGELOG.md's newest version is %s, include/gpipe.h's %s: add an entry "
          "for it" % (top, v))
    binary = os.path.join(os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build")),
                          "gpipe-train")
    if os.path.exists(binary):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        check(out.strip() == "gpipe-train " + v, "gpipe-train --version says %r, not %s"
              % (out.strip(), v))
    else:
        check(False, "no %s to ask its --version (set GPIPE_BINARY_DIR)" % binary)


if __name__ == "__main__":
    sys.exit(main())
