#!/usr/bin/env python3
"""Import circles between the modules of each workspace crate.

A module is one source file. Module A imports B when A names a path into B: a `use` (public
re-exports included), or a `crate::`/`super::`/`self::` path in code. A path is resolved to the
module that defines the item: when it ends at a name another module re-exports (`pub use`), the
re-export is followed to where the item lives, so a facade (`lib.rs`, a room's `mod.rs`) that
only re-exports its children never closes a circle, and a circle hidden behind a re-export is
still found. `mod x;` declarations are not imports; nor is anything under `#[cfg(test)]` after
the line that opens it (a test module may reach anywhere).

In the crates whose top modules are rooms in an order (ROOMS below: the model crate's, lowest
first), an import from a room into a higher one is reported too, even where it closes no circle.

Prints every circle (a strongly connected set of modules, with one edge each way named) and
every upward import, and exits 1 when there is one. Usage: scripts/import-circles.py [CRATE_SRC_DIR ...]
(default: every crates/*/src).
"""
import re
import sys
from pathlib import Path

USE_RE = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)
PATH_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:[A-Za-z_][A-Za-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING_RE = re.compile(r'"(?:\\.|[^"\\])*"')


def strip(text: str) -> str:
    text = STRING_RE.sub('""', text)
    text = COMMENT_RE.sub("", text)
    cut = re.search(r"#\[cfg\(test\)\]", text)
    return text[: cut.start()] if cut else text


def inline_modules(text: str):
    """For a position in `text`, the names of the inline `mod x { ... }` blocks around it."""
    opens = []  # (start, end, name)
    for match in re.finditer(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{", text):
        depth, i = 0, match.end() - 1
        while i < len(text):
            depth += text[i] == "{"
            depth -= text[i] == "}"
            if depth == 0:
                break
            i += 1
        opens.append((match.end(), i, match.group(1)))

    def around(pos: int) -> tuple:
        return tuple(name for start, end, name in opens if start <= pos < end)

    return around


def expand_use(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (names after `as` dropped)."""
    tree = re.sub(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*", "", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix: str, t: str):
        if "{" not in t:
            out.append(prefix + t)
            return
        head, body = t.split("{", 1)
        body = body[: body.rfind("}")]
        depth, cur = 0, ""
        for ch in body:
            if ch == "," and depth == 0:
                if cur:
                    walk(prefix + head, cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            walk(prefix + head, cur)

    walk("", tree)
    return [p for p in out if p]


class Crate:
    def __init__(self, root: Path):
        """The modules reachable by `mod x;` declarations from the crate root file `root`."""
        self.files = {}
        pending = [((), root)]
        while pending:
            module, file = pending.pop()
            text = strip(file.read_text())
            self.files[module] = text
            here = file.parent if file.name in ("lib.rs", "main.rs", "mod.rs") else file.with_suffix("")
            for name in re.findall(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text):
                for child in (here / f"{name}.rs", here / name / "mod.rs"):
                    if child.is_file():
                        pending.append((module + (name,), child))
                        break
        self.modules = set(self.files)
        # name -> absolute path of what a module re-exports
        self.reexports = {m: {} for m in self.modules}
        self.uses = {m: [] for m in self.modules}
        for m, text in self.files.items():
            inline = inline_modules(text)
            for match in USE_RE.finditer(text):
                here = m + inline(match.start())
                for p in expand_use(match.group(1)):
                    absolute = self.absolute(here, p)
                    if absolute is None:
                        continue
                    self.uses[m].append(absolute)
                    leaf = absolute[-1]
                    if leaf not in ("*", "self"):
                        self.reexports[m][leaf] = absolute
            for match in PATH_RE.finditer(USE_RE.sub(lambda u: " " * len(u.group(0)), text)):
                absolute = self.absolute(m + inline(match.start()), match.group(1))
                if absolute is not None:
                    self.uses[m].append(absolute)

    def absolute(self, here: tuple, path: str):
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base = here
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
            rest = segs
        else:
            # `use child::X` relative to this module (2018 paths): only when `child` is a module.
            if here + (segs[0],) in self.modules:
                base, rest = here, segs
            else:
                return None
        return tuple(base) + tuple(rest)

    def resolve(self, path: tuple, seen=None):
        """The module that defines what `path` names."""
        seen = seen or set()
        k = len(path)
        while k > 0 and path[:k] not in self.modules:
            k -= 1
        module = path[:k]
        rest = path[k:]
        if rest and rest[0] in self.reexports.get(module, {}) and (module, rest[0]) not in seen:
            seen.add((module, rest[0]))
            target = self.reexports[module][rest[0]]
            if target != path:
                return self.resolve(target + rest[1:], seen)
        return module

    def graph(self):
        edges = {m: {} for m in self.modules}
        for m, paths in self.uses.items():
            for p in paths:
                t = self.resolve(p)
                if t != m and t in self.modules:
                    edges[m].setdefault(t, "::".join(p))
        return edges


def circles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


# A room may import the rooms before it in its list, never those after it.
ROOMS = {"model": ["fast_math", "error", "arch", "sample", "optim", "gpu", "nn", "cpu"]}


def upward(label: str, edges) -> list:
    order = ROOMS.get(label)
    if not order:
        return []
    rank = {room: i for i, room in enumerate(order)}
    found = []
    for a, targets in sorted(edges.items()):
        for b, via in sorted(targets.items()):
            if a and b and a[0] in rank and b[0] in rank and rank[b[0]] > rank[a[0]]:
                found.append(f"upward import in {label}: {name(label, a)} -> {name(label, b)}  ({via})")
    return found


def name(crate: str, m: tuple) -> str:
    return crate + ("::" + "::".join(m) if m else "")


def main():
    root = Path(__file__).resolve().parent.parent
    dirs = [Path(a) for a in sys.argv[1:]] or sorted((root / "crates").glob("*/src"))
    found = 0
    roots = [(src.parent.name, src / "lib.rs") for src in dirs]
    roots += [(src.parent.name + " (binary)", src / "main.rs") for src in dirs]
    roots = [(label, root) for label, root in roots if root.is_file()]
    for label, root in roots:
        crate = Crate(root)
        edges = crate.graph()
        for line in upward(label, edges):
            found += 1
            print(line)
        for comp in circles(edges):
            found += 1
            members = set(comp)
            print(f"circle in {label}: " + ", ".join(name(label, m) for m in comp))
            for a in comp:
                for b, via in sorted(edges[a].items()):
                    if b in members:
                        print(f"  {name(label, a)} -> {name(label, b)}  ({via})")
    if found:
        print(f"{found} import circle(s) or upward import(s)")
        return 1
    print(
        f"no import circle in {len(roots)} crate root(s) ({', '.join(l for l, _ in roots)}), "
        f"no upward import between rooms ({', '.join(ROOMS)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
