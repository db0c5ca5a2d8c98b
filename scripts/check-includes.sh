#!/usr/bin/env bash
# check-includes.sh — the include graph of src/ goes only down the module
# order, and has no cycle.
#
# The modules of src/, lowest first (a module may include itself, a module
# below it, and include/gpipe.h, the public header; src/backend/cpu and
# src/backend/cuda are part of backend):
#
#   core < backend < layers < checkpoint < optim < pipeline < balance
#        < trace < config < data < weights < train
#
# Every `#include "..."` in src/**/*.{c,h,cu,cuh} is resolved the way the
# compiler does (the including file's folder, then src/, then include/).
# An arrow from a module to one above it fails the check with file:line and
# the arrow; so does a folder of src/ that has no place in the order (add it
# to ORDER below, at its level), and a cycle among files.  On success it
# prints one line: "include graph: N arrows, no arrow up the order, no cycle".
#
#   scripts/check-includes.sh              check this repository's src/
#   scripts/check-includes.sh DIR          check DIR (a src/ folder)
#   scripts/check-includes.sh --self-test  check the check: a tree with an
#                                          upward arrow and a cycle must fail
#
# Exit status: 0 clean, 1 violations (or a failed self-test), 2 usage.
# CTest runs both forms (label "lint"), so `make test` and CI run them.
# Debian's interpreter on purpose: only the standard library is used, and
# the check must not depend on whichever python3 is first on PATH.
set -euo pipefail
GP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export GP_ROOT
exec /usr/bin/python3 - "$@" <<'PY'
import os
import re
import shutil
import sys
import tempfile

ORDER = ["core", "backend", "layers", "checkpoint", "optim", "pipeline", "balance",
         "trace", "config", "data", "weights", "train"]
RANK = {m: r for r, m in enumerate(ORDER)}
EXTS = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
PUBLIC = "(public)"


def module_of(path, src):
    """The module of a file under src (its first folder), PUBLIC for a file
    of the public include folder, None for anything else."""
    rel = os.path.relpath(path, src)
    if not rel.startswith(".."):
        parts = rel.split(os.sep)
        return parts[0] if len(parts) > 1 else None
    inc = os.path.join(os.path.dirname(src), "include")
    if not os.path.relpath(path, inc).startswith(".."):
        return PUBLIC
    return None


def resolve(name, includer, src):
    """The file `#include "name"` in `includer` reads, or None (a header
    from outside the project)."""
    for base in (os.path.dirname(includer), src,
                 os.path.join(os.path.dirname(src), "include")):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(p):
            return p
    return None


def check(src, out):
    """Check the tree under src; write problems and the summary to out.
    Returns the number of problems."""
    src = os.path.abspath(src)
    if not os.path.isdir(src):
        out.write("check-includes: %s is not a folder\n" % src)
        return 1
    root = os.path.dirname(src)
    problems = 0
    arrows = 0
    edges = {}   # file -> [(file, line)]
    unranked = set()
    files = []
    for d, _, names in os.walk(src):
        for n in sorted(names):
            if n.endswith(EXTS):
                files.append(os.path.join(d, n))
    files.sort()
    for f in files:
        mod = module_of(f, src)
        shown = os.path.relpath(f, root)
        if mod is not None and mod not in RANK and mod not in unranked:
            unranked.add(mod)
            problems += 1
            out.write("%s: module '%s' has no place in the order %s; add it to ORDER in "
                      "scripts/check-includes.sh at its level\n"
                      % (shown, mod, " < ".join(ORDER)))
        with open(f, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                name = m.group(1)
                target = resolve(name, f, src)
                if target is not None:
                    tmod = module_of(target, src)
                    edges.setdefault(f, []).append((target, lineno))
                else:
                    # Not there (yet): a "module/..." name still names its module.
                    first = name.split("/")[0]
                    tmod = first if "/" in name and first in RANK else None
                if tmod is None:
                    continue
                arrows += 1
                if tmod == PUBLIC or tmod == mod or mod not in RANK or tmod not in RANK:
                    continue
                if RANK[tmod] > RANK[mod]:
                    problems += 1
                    out.write('%s:%d: %s -> %s (#include "%s"): %s is below %s in %s\n'
                              % (shown, lineno, mod, tmod, name, mod, tmod,
                                 " < ".join(ORDER)))

    # Cycles among files: Tarjan's strongly connected components.
    index = {}
    low = {}
    stack = []
    on_stack = set()
    cycles = []
    counter = [0]

    def strongconnect(v):
        work = [(v, iter(edges.get(v, ())))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w, _ in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges.get(w, ()))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                self_loop = any(t == node for t, _ in edges.get(node, ()))
                if len(comp) > 1 or self_loop:
                    cycles.append(sorted(comp))

    for f in sorted(edges):
        if f not in index:
            strongconnect(f)
    for comp in cycles:
        problems += 1
        members = set(comp)
        # Walk one cycle through the component, starting from its first file.
        path = [comp[0]]
        seen = {comp[0]: 0}
        while True:
            nxt = next(t for t, _ in edges[path[-1]] if t in members)
            if nxt in seen:
                path = path[seen[nxt]:] + [nxt]
                break
            seen[nxt] = len(path)
            path.append(nxt)
        first, second = path[0], path[1]
        line = next(n for t, n in edges[first] if t == second)
        out.write("%s:%d: include cycle: %s\n"
                  % (os.path.relpath(first, root), line,
                     " -> ".join(os.path.relpath(p, root) for p in path)))
    if problems == 0:
        out.write("include graph: %d arrows, no arrow up the order, no cycle\n" % arrows)
    return problems


def self_test():
    """The check must reject an upward arrow, a cycle and an unknown
    module, name them, and accept a clean tree."""
    class Buf:
        def __init__(self):
            self.text = ""

        def write(self, s):
            self.text += s

    made = []

    def tree(files):
        d = tempfile.mkdtemp(prefix="gp-check-includes-")
        made.append(d)
        for rel, body in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as fh:
                fh.write(body)
        return d

    failed = []
    good = {
        "include/gpipe.h": "\n",
        "src/core/core.h": '#include "gpipe.h"\n',
        "src/core/tensor.c": '#include "core/core.h"\n',
        "src/backend/backend.h": '#include "core/core.h"\n',
        "src/backend/cpu/cpu_impl.h": '#include "backend/backend.h"\n',
        "src/backend/cpu/cpu_device.c": '#include "cpu_impl.h"\n#include <stdio.h>\n',
        "src/train/train.h": '#include "backend/backend.h"\n#include "trace/trace.h"\n',
    }
    b = Buf()
    if check(os.path.join(tree(good), "src"), b) != 0 or "no arrow up the order" not in b.text:
        failed.append("a clean tree was rejected:\n" + b.text)

    bad = dict(good)
    bad["src/core/tensor.c"] = '#include "core/core.h"\n\n#include "backend/backend.h"\n'
    bad["src/pipeline/pipeline.c"] = '#include "trace/trace.h"\n'
    bad["src/trace/trace.h"] = '#include "core/core.h"\n'
    bad["src/layers/a.h"] = '#include "layers/b.h"\n'
    bad["src/layers/b.h"] = '#include "a.h"\n'
    bad["src/extra/x.c"] = '#include "core/core.h"\n'
    b = Buf()
    n = check(os.path.join(tree(bad), "src"), b)
    want = [
        'src/core/tensor.c:3: core -> backend (#include "backend/backend.h")',
        'src/pipeline/pipeline.c:1: pipeline -> trace (#include "trace/trace.h")',
        "include cycle: src/layers/a.h -> src/layers/b.h -> src/layers/a.h",
        "module 'extra' has no place in the order",
    ]
    if n != len(want):
        failed.append("expected %d problems, got %d:\n%s" % (len(want), n, b.text))
    for w in want:
        if w not in b.text:
            failed.append("missing from the report: %s\nreport:\n%s" % (w, b.text))
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
    for f in failed:
        sys.stderr.write("check-includes self-test: " + f + "\n")
    print("check-includes self-test: %s" % ("FAILED" if failed else
          "a clean tree passes; an upward arrow, a cycle and an unknown module fail"))
    return 1 if failed else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        sys.stderr.write("usage: scripts/check-includes.sh [SRC_DIR | --self-test]\n")
        return 2
    src = argv[1] if len(argv) == 2 else os.path.join(os.environ["GP_ROOT"], "src")
    if not os.path.isdir(src):
        sys.stderr.write("check-includes.sh: %s is not a directory; give the source tree "
                         "(default: src/ of the repository)\n" % src)
        return 2
    return 1 if check(src, sys.stdout) else 0


sys.exit(main(sys.argv))
PY
