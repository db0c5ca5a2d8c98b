#!/usr/bin/python3
"""test_config_doc.py — docs/config.md documents exactly the keys the
parser knows (issue 80's bar: a key cannot exist undocumented, or be
documented and gone).  The parser's keys are `gpipe-train --help-config`,
printed from the table the parser checks keys and getters against
(src/config/config_keys.c; tests/test_config_keys.c holds the table to the
getters).

docs/config.md's key tables (a first column `key`) each follow a line
<!-- keys: PREFIX --> that says whose keys they are (`model.resnet` for
`depth`); a key table without one fails.  Then, in both directions:
- every key of the table is a row of docs/config.md (a section such as
  `train.snapshot` counts as documented by its keys' rows);
- every row of docs/config.md is a key of the table;
- where the table's default is a plain value, the row's default cell starts
  with it (0.0 and 0 agree, backticks dropped);
- every layer type is a row of docs/config.md's layer table ("### Layers"),
  whose options cell names (as `option`) every option the type takes, and
  names as `option (...)` no option of another type only, with the
  parser's default where it gives a value there (`p` (0.5, ...)); `name`
  and `stash`, which every layer takes, are named in the model section.

Needs GPIPE_BINARY_DIR (set by CTest) and GPIPE_SOURCE_DIR.  Prints
"test_config_doc: N passed, N failed" last.
"""
import os
import re
import subprocess
import sys

from gpt_util import check, finish

SRC = os.environ.get("GPIPE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINDIR = os.environ.get("GPIPE_BINARY_DIR", os.path.join(SRC, "build"))
DOC = os.path.join(SRC, "docs", "config.md")
ENTRY = re.compile(r"^([a-z][a-z0-9_.#-]*)(?: = (.*?))?  \((.*)\)$")


def table_keys():
    """{key: (default or None, type text)}, layer types, {option: [types]}
    from gpipe-train --help-config."""
    r = subprocess.run([os.path.join(BINDIR, "gpipe-train"), "--help-config"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "gpipe-train --help-config: exit %d: %s" % (r.returncode,
                                                                          r.stderr[-300:]))
    keys, types, takes, last = {}, [], {}, None
    for line in r.stdout.split("\n"):
        m = ENTRY.match(line)
        if m:
            last = m.group(1)
            keys[last] = (m.group(2), m.group(3))
            continue
        t = re.match(r"^    layer types: (.*)$", line)
        if t:
            types = t.group(1).split(", ")
        t = re.match(r"^    layers: (.*)$", line)
        if t and last:
            takes[last.rsplit(".", 1)[1]] = t.group(1).split(", ")
    return keys, types, takes


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def doc_rows(text):
    """{dotted key: (default cell, line number)} of every key table, and the
    key tables that have no <!-- keys: --> line."""
    rows, unmarked = {}, []
    lines = text.split("\n")
    prefix, fence = None, False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        m = re.match(r"^<!-- keys: (\S+) -->$", line.strip())
        if m:
            prefix = m.group(1)
            continue
        if re.match(r"^\|\s*key\s*\|", line):
            if prefix is None:
                unmarked.append(i + 1)
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                c = cells(lines[j])
                # one key, or several sharing a row ("`mean`, `std`"), their
                # defaults then in the same order ("1024, 256") or shared
                names = re.findall(r"`([a-z0-9_.]+)`", c[0])
                whole = re.sub(r"`[a-z0-9_.]+`|,|\s|and", "", c[0]) == ""
                default = c[1] if len(c) > 1 else ""
                parts = default.split(", ")
                for q, name in enumerate(names if whole and prefix else []):
                    rows[prefix + "." + name] = (parts[q] if len(parts) == len(names) else default,
                                                 j + 1)
                j += 1
            prefix = None
        elif line.startswith("#"):
            prefix = None
    return rows, unmarked


def same_default(table, cell):
    """The doc's default cell starts with the table's default."""
    cell = cell.replace("`", "").strip()
    if cell.startswith(table):
        return True
    first = re.split(r"[ (,]", cell, 1)[0]
    try:
        return float(first) == float(table)
    except ValueError:
        return False


def plain(default):
    """A default that is one value (a number, a word, true/false), not words
    about other keys ("batch_size", "heads", "per dataset")."""
    return bool(re.match(r"^[-+0-9.e]+$|^(true|false)$|^[a-z0-9_-]+$", default)) and \
        default not in ("heads", "batch_size")


def check_layers(text, types, takes, defaults):
    """The layer table of "### Layers" against the layer types and options."""
    sect = text.split("\n### Layers\n", 1)[-1].split("\n### ", 1)[0]
    opts_of = {t: "" for t in types}
    for line in sect.split("\n"):
        if not line.startswith("| `"):
            continue
        c = cells(line)
        named = re.findall(r"`([a-z0-9_]+)`", c[0])
        for t in named:
            check(t in opts_of, "docs/config.md's layer table names `%s`, which is no layer type"
                  % t)
            if t in opts_of:
                opts_of[t] += " " + c[1]
    model = text.split("\n## model\n", 1)[-1].split("\n## ", 1)[0]
    for t in types:
        check(opts_of[t] != "", "layer type %s has no row in docs/config.md's layer table" % t)
    for opt, ts in takes.items():
        if ts == ["every layer"]:
            check("`%s`" % opt in model, "every layer's option `%s` is not named in "
                  "docs/config.md's model section" % opt)
            continue
        for t in ts:
            if t in opts_of:
                check("`%s`" % opt in opts_of[t], "docs/config.md's layer table: %s takes `%s`, "
                      "which its row does not name" % (t, opt))
    every = set(takes)
    for t, cell in opts_of.items():
        for opt, val in re.findall(r"`([a-z0-9_]+)` \(([^,;)]*)", cell):
            mine = [o for o, ts in takes.items() if t in ts or ts == ["every layer"]]
            check(opt not in every or opt in mine, "docs/config.md's layer table gives %s an "
                  "option `%s` it does not take" % (t, opt))
            # "`p` (0.5, ...)": a value where the doc gives one
            default = defaults.get(opt)
            if default and plain(default) and re.match(r"^(`|[-+0-9.]|true|false)", val):
                check(same_default(default, val), "docs/config.md's layer table: %s's `%s` "
                      "defaults to '%s' there and %s in the parser" % (t, opt, val, default))


def main():
    keys, types, takes = table_keys()
    check(len(keys) > 100 and len(types) > 10, "--help-config: %d keys, %d layer types" %
          (len(keys), len(types)))
    text = open(DOC).read()
    rows, unmarked = doc_rows(text)
    for ln in unmarked:
        check(False, "docs/config.md:%d: a key table without a <!-- keys: PREFIX --> line "
              "before it" % ln)
    outer = {k: v for k, v in keys.items() if "#" not in k}
    for k, (default, ty) in sorted(outer.items()):
        documented = k in rows or any(r.startswith(k + ".") for r in rows)
        check(documented, "config key %s (%s) is not in docs/config.md: add its row to the "
              "table of its section" % (k, ty))
    for k, (cell, ln) in sorted(rows.items(), key=lambda kv: kv[1][1]):
        check(k in keys, "docs/config.md:%d documents %s, which gpipe-train --help-config "
              "does not know: remove the row or add the key to src/config/config_keys.c" % (ln, k))
        if k not in keys or keys[k][0] is None:
            continue
        default = keys[k][0]
        if plain(default):
            check(same_default(default, cell), "docs/config.md:%d: %s's default is '%s' in the "
                  "doc and %s in the parser" % (ln, k, cell, default))
    # device options: named in the devices row
    dev = [k.rsplit(".", 1)[1] for k in keys if k.startswith("pipeline.devices.#.")]
    devrow = rows.get("pipeline.devices", ("", 0))
    line = text.split("\n")[devrow[1] - 1] if devrow[1] else ""
    for opt in dev:
        check(opt in line, "pipeline.devices' row in docs/config.md does not name a device's "
              "`%s`" % opt)
    layer_defaults = {k.rsplit(".", 1)[1]: v[0] for k, v in keys.items()
                      if k.startswith("model.layers.#.")}
    check_layers(text, types, takes, layer_defaults)
    return finish("test_config_doc")


if __name__ == "__main__":
    sys.exit(main())
