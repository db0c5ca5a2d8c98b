#!/usr/bin/python3
"""man.py — the manual pages of gpipe-train, gpipe-balance and gpipe-sample,
made from their own --help (one source for both: a page cannot say what
--help does not), as roff for man(1).

  scripts/man.py BUILD_DIR [OUT_DIR]

runs BUILD_DIR/<tool> --help for each tool and writes OUT_DIR/<tool>.1
(default docs/man/, where the pages are kept and from where `make install`
puts them in share/man/man1).  tests/test_man.py makes them again and fails
when a kept page differs from what --help says now: run this script after
changing a tool's --help.

The --help text's layout is what is read: "usage:" lines, the paragraphs
before "options:" (the description), the option entries (a line indented
by two spaces that starts with "-", continued by deeper-indented lines),
and further sections as a line "word words: text" at the margin after a
blank line (environment:, signals:, exit status:, ...).  Python 3 of the standard
library only (Debian's /usr/bin/python3).
"""
import os
import re
import subprocess
import sys

TOOLS = {
    "gpipe-train": "train a sequential model pipelined over devices",
    "gpipe-balance": "profile a model and balance its layers over devices",
    "gpipe-sample": "continue a prompt with a trained language model",
}
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def version():
    text = open(os.path.join(SRC, "include", "gpipe.h")).read()
    v = [re.search(r"#define GPIPE_VERSION_%s (\d+)" % k, text).group(1)
         for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(v)


def esc(s):
    """A line of text as roff: backslashes escaped, no request at its start."""
    s = s.replace("\\", "\\e")
    if s.startswith(".") or s.startswith("'"):
        s = "\\&" + s
    return s


def sections(help_text):
    """(synopsis lines, description lines, options [(tag, lines)], [(title, lines)])."""
    lines = help_text.rstrip("\n").split("\n")
    synopsis, desc, options, rest = [], [], [], []
    i = 0
    while i < len(lines) and (lines[i].startswith("usage:") or
                              (synopsis and lines[i].startswith("       "))):
        synopsis.append(re.sub(r"^(usage:)?\s*", "", lines[i]))
        i += 1
    mode, blank = "desc", True
    for line in lines[i:]:
        # a section starts at the margin after a blank line ("balance: auto
        # ..." inside a paragraph is not one)
        head = re.match(r"^([a-z][a-z ]*):\s*(.*)$", line) if blank else None
        blank = not line.strip()
        if head:
            if head.group(1) == "options":
                mode = "options"
                continue
            mode = "rest"
            rest.append((head.group(1), [head.group(2)] if head.group(2) else []))
            continue
        if mode == "desc":
            desc.append(line)
        elif mode == "options":
            opt = re.match(r"^ {1,3}(-\S.*?)(?: {2,}(.*))?$", line)
            if opt and (not options or not line.startswith("    ")):
                if len(opt.group(1).split()) > 3: # (a tag runs into its text)
                    raise ValueError("the option line '%s' has one space between the option "
                                     "and its text: give two, or the text on the next line"
                                     % line.strip())
                options.append((opt.group(1), [opt.group(2)] if opt.group(2) else []))
            elif options:
                options[-1][1].append(line.strip())
            else:
                desc.append(line)
        else:
            rest[-1][1].append(line)
    return synopsis, desc, options, rest


def paragraphs(lines):
    """Lines as roff paragraphs: a blank line between paragraphs."""
    out, para = [], []
    for line in lines + [""]:
        if line.strip():
            para.append(esc(line.strip()))
        elif para:
            out += [".PP"] + para
            para = []
    return out


def page(tool, help_text):
    synopsis, desc, options, rest = sections(help_text)
    out = ['.\\" Made by scripts/man.py from "%s --help"; edit the --help text, not this.' % tool,
           '.TH %s 1 "" "gpipe %s" "gpipe manual"' % (tool.upper(), version()),
           ".SH NAME", "%s \\- %s" % (tool, TOOLS[tool]), ".SH SYNOPSIS"]
    for s in synopsis:
        out += [".nf", esc(s), ".fi"]
    out += [".SH DESCRIPTION"] + paragraphs(desc)
    if options:
        out.append(".SH OPTIONS")
        for tag, text in options:
            out += [".TP", ".B " + esc(tag)] + [esc(t) for t in text if t]
    for title, text in rest:
        out += [".SH " + esc(title.upper())] + paragraphs(text)
    others = [t for t in TOOLS if t != tool]
    out += [".SH SEE ALSO", ", ".join("\\fB%s\\fR(1)" % t for t in others) + ";",
            "README.md, the guides in docs/ and docs/config.md (every config key)",
            "in gpipe's source tree."]
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: scripts/man.py BUILD_DIR [OUT_DIR]\n")
        return 2
    build = sys.argv[1]
    dest = sys.argv[2] if len(sys.argv) > 2 else os.path.join(SRC, "docs", "man")
    os.makedirs(dest, exist_ok=True)
    for tool in TOOLS:
        r = subprocess.run([os.path.join(build, tool), "--help"], capture_output=True, text=True)
        if r.returncode != 0 or not r.stdout.startswith("usage:"):
            sys.stderr.write("man.py: %s --help failed (exit %d): %s\n"
                             % (tool, r.returncode, (r.stdout + r.stderr)[-300:]))
            return 1
        try:
            text = page(tool, r.stdout)
        except ValueError as e:
            sys.stderr.write("man.py: %s --help: %s\n" % (tool, e))
            return 1
        with open(os.path.join(dest, tool + ".1"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
