#!/usr/bin/python3
"""check-function-size.py — no function in the given C files is longer than
a limit (120 lines by default), so that the trainer stays readable (issue
52, item 4: "no function in src/train over 120 lines").

A function is counted from the first line of its signature to its closing
brace, both included, as the house style lays one out: the signature starts
at column 0, its continuation lines are indented, and the body's braces are
alone on their lines at column 0:

    gp_status gp_train_run(const gp_config *cfg, const gp_train_opts *opts,
                           gp_train_result *res)
    {
        ...
    }

A `{` at column 0 with no signature above it, or with no `}` at column 0
after it, is a layout this check cannot read, and fails it with file:line
(so a function is never skipped unseen).  On success it prints one line:
"function size: N functions in M files, the longest L lines (NAME), none
over LIMIT".

    scripts/check-function-size.py [--max N] FILE.c|DIR...   (a DIR: its *.c)
    scripts/check-function-size.py --self-test   check the check: a function
                                                 one line over must fail, one
                                                 at the limit must pass

Exit status: 0 clean, 1 a function over the limit (or a failed self-test),
2 usage or a file that cannot be read.  CTest runs both forms, the check
over src/train (label "lint"), so `make test` and CI run them.  Debian's interpreter on purpose: only the
standard library is used.
"""
import os
import re
import sys
import tempfile

NAME = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(")


def functions(path, lines):
    """(name, first line, last line, 1-based) of each function in lines;
    raises ValueError naming file:line for a layout it cannot read."""
    out = []
    i = 0
    while i < len(lines):
        if lines[i].rstrip("\n") != "{":
            i += 1
            continue
        start = i - 1
        while start >= 0 and (not lines[start].strip() or lines[start][0] in " \t"):
            start -= 1
        m = NAME.search(lines[start]) if start >= 0 else None
        if not m:
            raise ValueError(f"{path}:{i + 1}: a '{{' at column 0 with no function signature "
                             "above it; lay the function out as the house style does")
        end = i + 1
        while end < len(lines) and lines[end].rstrip("\n") != "}":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{i + 1}: function {m.group(1)} has no '}}' at column 0; "
                             "lay the function out as the house style does")
        out.append((m.group(1), start + 1, end + 1))
        i = end + 1
    return out


def check(paths, limit):
    """0 clean, 1 a function over the limit, 2 unreadable; says which."""
    count, longest, over = 0, (0, ""), []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
            found = functions(path, lines)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"check-function-size: {e}", file=sys.stderr)
            return 2
        for name, first, last in found:
            n = last - first + 1
            count += 1
            longest = max(longest, (n, name))
            if n > limit:
                over.append(f"{path}:{first}: {name} is {n} lines, over {limit}: split it into "
                            "named steps, each its own static function")
    for line in over:
        print(line, file=sys.stderr)
    if over:
        return 1
    print(f"function size: {count} functions in {len(paths)} files, the longest "
          f"{longest[0]} lines ({longest[1]}), none over {limit}")
    return 0


def self_test():
    def body(n):  # a function of n lines in all: signature, braces, n - 3 statements
        return "static int f(int x,\n                 int y)\n{\n" + \
               "    x++;\n" * (n - 5) + "    return x + y;\n}\n"
    ok = True
    with tempfile.TemporaryDirectory() as d:
        cases = [("at the limit", body(10), 0), ("one line over", body(11), 1),
                 ("no closing brace", "int g(void)\n{\n    return 0;\n", 2)]
        for what, text, want in cases:
            p = os.path.join(d, "t.c")
            with open(p, "w", encoding="utf-8") as f:
                f.write("/* a file */\n#include <stdio.h>\n\n" + text)
            got = check([p], 10)
            if got != want:
                print(f"self-test: a function {what} gave exit {got}, not {want}",
                      file=sys.stderr)
                ok = False
    print("check-function-size self-test: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    limit = 120
    if len(argv) >= 2 and argv[0] == "--max":
        try:
            limit = int(argv[1])
        except ValueError:
            limit = -1
        argv = argv[2:]
    if limit < 1 or not argv:
        print("usage: check-function-size.py [--max N] FILE.c|DIR... | --self-test",
              file=sys.stderr)
        return 2
    paths = []
    for a in argv:  # a folder: its C files, in name order
        paths += sorted(os.path.join(a, n) for n in os.listdir(a)
                        if n.endswith(".c")) if os.path.isdir(a) else [a]
    return check(paths, limit)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
