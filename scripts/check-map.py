#!/usr/bin/env python3
"""The map in docs/architecture.md against the source tree: every file and folder under
crates/*/src is in the map, and the map names nothing that is not there.

The map is the ```text blocks of docs/architecture.md that start with a crate's source root
(`crates/NAME/src/`; a block may hold several, each unindented). Under a root, one line an
entry: the name indented two spaces a level (a
folder's name ends in `/`, its entries one level deeper), at least two spaces, then what it
owns. An entry without its line of description is reported too.

Prints what is missing from the map, what the map names that does not exist, and entries
without a description; exits 1 when there is any. Usage: scripts/check-map.py [ROOT]
(default: the repository this script is in).
"""
import re
import sys
from pathlib import Path

ROOT_RE = re.compile(r"^(crates/[A-Za-z0-9_-]+/src/)\s*$")
ENTRY_RE = re.compile(r"^( *)(\S+?)(?:\s{2,}(\S.*))?$")


def blocks(text: str):
    """The lines of each ```text block."""
    for match in re.finditer(r"^```text\n(.*?)^```", text, re.S | re.M):
        yield match.group(1).splitlines()


def mapped(doc: str):
    """(paths the map names, problems found while reading it)."""
    paths, problems = {}, []
    for lines in blocks(doc):
        lines = [line for line in lines if line.strip()]
        if not lines or not ROOT_RE.match(lines[0]):
            continue
        root, stack = None, []  # the crate, and the folders above the current line
        for line in lines:
            if ROOT_RE.match(line):
                root, stack = ROOT_RE.match(line).group(1), []
                paths[root] = "the crate's sources"
                continue
            entry = ENTRY_RE.match(line)
            indent = len(entry.group(1)) if entry else -1
            if not entry or indent % 2 or indent // 2 - 1 > len(stack) or indent == 0:
                problems.append(f"{root}: cannot read the map line {line.strip()!r}")
                continue
            level = indent // 2 - 1
            del stack[level:]
            name, what = entry.group(2), entry.group(3)
            path = root + "".join(stack) + name
            if not what:
                problems.append(f"{path}: no description")
            if path in paths:
                problems.append(f"{path}: named twice")
            paths[path] = what
            if name.endswith("/"):
                stack.append(name)
    return paths, problems


def on_disk(root: Path, crates):
    """Every file and folder under each crate's src/, as the map spells them."""
    out = set()
    for src in crates:
        for path in sorted((root / src).rglob("*")):
            rel = path.relative_to(root).as_posix()
            out.add(rel + "/" if path.is_dir() else rel)
    return out


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    doc = (root / "docs/architecture.md").read_text()
    paths, problems = mapped(doc)
    crates = sorted(p.relative_to(root).as_posix() + "/" for p in root.glob("crates/*/src"))
    roots = {p for p in paths if ROOT_RE.match(p)}
    missing_roots = [c for c in crates if not any(p.startswith(c) for p in paths)]
    problems += [f"{c}: the map has no block for this crate" for c in missing_roots]
    disk = on_disk(root, crates)
    named = set(paths) - roots
    problems += [f"{p}: not in the map" for p in sorted(disk - named)]
    problems += [f"{p}: in the map, not in the tree" for p in sorted(named - disk)]
    for problem in problems:
        print(f"docs/architecture.md: {problem}")
    if problems:
        print(f"{len(problems)} problem(s): docs/architecture.md's map must name every file and "
              "folder under crates/*/src, one line each with what it owns")
        return 1
    print(f"docs/architecture.md's map names the {len(disk)} files and folders of "
          f"{len(crates)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
