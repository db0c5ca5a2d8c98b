#!/usr/bin/python3
"""api_doc.py — docs/api.md, the C API's reference, made from
include/gpipe.h's own comments (one source: the page cannot say what the
header does not).

  scripts/api_doc.py [OUT]

reads include/gpipe.h and writes OUT (default docs/api.md).
tests/test_api_doc.py makes it again and fails when the kept page differs
from what the header says now: run this script after changing gpipe.h.

What is read: the header's opening comment (the overview: memory, threads,
processes); its sections, a comment at the margin that starts "---- title
----" (the text before the first one is "Status, errors and version"); and
in each, blocks: a comment at the margin and the declarations right after
it (functions, types, macros; up to a blank line or the next comment), or
declarations alone.  Each block becomes an entry headed by the names it
declares, with the declarations as C and the comment as text.  The include
guard and the extern "C" lines are left out.  Python 3 of the standard
library only (Debian's /usr/bin/python3).
"""
import os
import re
import sys

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(SRC, "include", "gpipe.h")
FIRST_SECTION = "Status, errors and version"
SKIP = re.compile(r"^(#ifndef GPIPE_H|#define GPIPE_H|#endif|#ifdef __cplusplus|}\s*$|"
                  r"extern \"C\" \{|#include )")


def uncomment(text):
    """A /* ... */ comment's text, its frame removed, lines kept."""
    text = re.sub(r"^/\*+ ?", "", text.strip())
    text = re.sub(r"\s*\*/$", "", text)
    out = []
    for line in text.split("\n"):
        out.append(re.sub(r"^\s*\* ?", "", line).rstrip())
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return out


def names(code):
    """The names a block of declarations declares, in order."""
    found = []
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    while re.search(r"\{[^{}]*\}", code): # struct and enum bodies
        code = re.sub(r"\{[^{}]*\}", "", code)
    for stmt in code.split(";"):
        stmt = stmt.strip()
        for m in re.finditer(r"^#define (\w+)", stmt, re.M):
            found.append(m.group(1))
        stmt = re.sub(r"^#.*$", "", stmt, flags=re.M).strip()
        if not stmt:
            continue
        if stmt.startswith("typedef"):
            m = re.search(r"(\w+)\s*$", stmt)
        else:
            m = re.search(r"(\w+)\s*\(", stmt)
        if m:
            found.append(m.group(1))
    return found


def blocks(lines):
    """[(section title, section text lines, [(comment lines, code)])] and the
    overview's lines."""
    i = 0
    # the overview: the opening comment
    end = next(k for k, l in enumerate(lines) if l.rstrip().endswith("*/"))
    overview = uncomment("\n".join(lines[:end + 1]))
    # the first line of each /* comment and what follows
    sections = [(FIRST_SECTION, [], [])]
    i = end + 1
    comment = None
    code = []

    def flush():
        nonlocal comment, code
        if code:
            sections[-1][2].append((comment or [], "\n".join(code).rstrip()))
        elif comment:
            sections[-1][2].append((comment, ""))
        comment, code = None, []

    while i < len(lines):
        line = lines[i]
        if line.startswith("/*"):
            flush()
            j = i
            while not lines[j].rstrip().endswith("*/"):
                j += 1
            text = uncomment("\n".join(lines[i:j + 1]))
            head = re.match(r"^-{3,}\s*(.*?)\s*-*$", text[0]) if text else None
            if head:
                title = head.group(1)
                sections.append((title[0].upper() + title[1:], text[1:], []))
            else:
                comment = text
            i = j + 1
            continue
        if not line.strip():
            flush()
        elif not SKIP.match(line):
            code.append(line)
        i += 1
    flush()
    return overview, sections


def text_lines(lines):
    """A comment's lines as Markdown text: what Markdown would read as
    markup (emphasis, HTML, a heading or quote at a line's start) escaped."""
    out = []
    for line in lines:
        line = line.replace("\\", "\\\\").replace("*", "\\*").replace("<", "\\<")
        line = re.sub(r"(?<![A-Za-z0-9])_", r"\\_", line)  # (_ex): not inside a word
        out.append(re.sub(r"^(\s*)([#>+-]|\d+\.)(\s)", r"\1\\\2\3", line))
    return out


def anchor(title):
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def page(text):
    overview, sections = blocks(text.split("\n"))
    out = ["# The C API (`<gpipe.h>`)", "",
           "<!-- Made by scripts/api_doc.py from include/gpipe.h; edit the header's comments, "
           "not this page. -->", "",
           "Every function, type and macro of include/gpipe.h with the header's own comment, "
           "in the header's order.  [c-library.md](c-library.md) is the guide (building "
           "against the library, examples/); this is the reference.", "",
           "Contents: " + ", ".join("[%s](#%s)" % (t, anchor(t))
                                    for t in ["Overview"] + [s[0] for s in sections]), "",
           "## Overview", ""] + text_lines(overview)
    for title, intro, entries in sections:
        out += ["", "## " + title, ""]
        if intro:
            out += text_lines(intro) + [""]
        for comment, code in entries:
            decl = names(code)
            if decl:
                out += ["### " + ", ".join("`%s`" % n for n in decl), ""]
            if code:
                out += ["```c", code, "```", ""]
            if comment:
                out += text_lines(comment) + [""]
        while out and not out[-1]:
            out.pop()
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        # (an option is not an output path: --help once wrote a file of that name)
        print(__doc__.strip())
        return 0 if sys.argv[1:] in (["-h"], ["--help"]) else 2
    dest = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SRC, "docs", "api.md")
    with open(HEADER) as f:
        text = page(f.read())
    with open(dest, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
