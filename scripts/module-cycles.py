#!/usr/bin/env python3
"""Fails if the modules of a crate import each other in a cycle.

For each crate directory given (default: every workspace member), reads
the `.rs` files under `src/`, maps each file to its module path
(`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`), collects every
`crate::...`, `super::...` and `self::...` path in the code (`use`
lines with their `{...}` groups, and paths written inline), resolves each
to the deepest module it names, and looks for cycles between modules.

What counts:
- Test code (`#[cfg(test)] mod ...` to the end of the file) does not:
  tests may look anywhere.
- A module and its ancestors form one unit: a parent re-exporting its
  children and children using their parent's helpers (`use super::*`) is
  the normal shape of a Rust module tree, not a cycle. A cycle is between
  modules that are not nested in one another, e.g. `backend` ->
  `session` -> `backend`.

Equivalent in purpose to `cargo modules dependencies --acyclic`, without
compiling cargo-modules in CI. `--self-test` checks the checker.

Usage: scripts/module-cycles.py [--self-test] [CRATE_DIR ...]
"""

import os
import re
import sys
import tempfile

PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*\w+)+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)\s*::[^;]*);", re.S)
TEST_MOD = re.compile(r"^#\[cfg\(test\)\]\s*\n\s*(pub(\([^)]*\))?\s+)?mod\s", re.M)


def strip(code):
    """Code without comments, string literals and test modules."""
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)
    code = re.sub(r'r#*"(?:.|\n)*?"#*', '""', code)
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
    m = TEST_MOD.search(code)
    return code[: m.start()] if m else code


def modules(src):
    """Module path (tuple) of every .rs file under `src`."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out[os.path.join(root, f)] = tuple(parts)
    return out


def expand(tree):
    """`a::{b, c::{d}}` -> ["a::b", "a::c::d"] (`self` inside a group
    names the group's own path)."""
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    head, depth, parts, cur = tree[:i], 0, [], ""
    for ch in tree[i + 1 : tree.rfind("}")]:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in filter(None, parts):
        for e in expand(p):
            out.append(head.rstrip(":") if e == "self" else head + e)
    return out


def resolve(path, here, known):
    """The deepest known module that `path` (as written in module `here`)
    names, or None."""
    segs = [s for s in re.split(r"\s*::\s*", path) if s]
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    else:
        base = list(here)
        while segs and segs[0] in ("self", "super"):
            if segs.pop(0) == "super":
                if not base:
                    return None
                base.pop()
    target = tuple(base)
    for s in segs:
        if target + (s,) in known:
            target = target + (s,)
        else:
            break
    return target


def nested(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def edges(crate_dir):
    files = modules(os.path.join(crate_dir, "src"))
    known = set(files.values())
    graph = {m: set() for m in known}
    for path, here in files.items():
        with open(path, encoding="utf-8") as fh:
            code = strip(fh.read())
        paths = []
        for u in USE.findall(code):
            paths.extend(expand(u))
        code = USE.sub("", code)
        paths.extend(a + b for a, b in PATH.findall(code))
        for p in paths:
            t = resolve(p, here, known)
            if t is not None and not nested(t, here):
                graph[here].add(t)
    return graph


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "crate"


def check(crate_dirs):
    failed = False
    for d in crate_dirs:
        graph = edges(d)
        for comp in cycles(graph):
            failed = True
            members = set(comp)
            print(f"{d}: module cycle: {', '.join(name(m) for m in comp)}")
            for m in comp:
                for t in sorted(graph[m] & members):
                    print(f"    {name(m)} -> {name(t)}")
    return not failed


def self_test():
    def crate(files):
        d = tempfile.mkdtemp()
        for rel, text in files.items():
            p = os.path.join(d, "src", rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as fh:
                fh.write(text)
        return d

    cyclic = crate({
        "lib.rs": "mod backend;\nmod session;\n",
        "backend.rs": "use crate::session::Session;\n",
        "session.rs": "use crate::{backend::{self, Shared}, layout};\n",
    })
    assert cycles(edges(cyclic)) == [[("backend",), ("session",)]], edges(cyclic)
    via_super = crate({
        "lib.rs": "mod mem;\n",
        "mem/mod.rs": "mod backend;\nmod session;\n",
        "mem/backend.rs": "fn f() { super::session::open(); }\n",
        "mem/session.rs": "use super::backend::MemBackend;\n",
    })
    assert cycles(edges(via_super)) == [[("mem", "backend"), ("mem", "session")]]
    one_way = crate({
        "lib.rs": "mod backend;\nmod session;\nmod core;\npub use backend::B;\n",
        "backend.rs": "use crate::session::S;\nuse crate::core;\n",
        "session.rs": "use crate::core::{self, C};\n// use crate::backend;\n"
        "const S: &str = \"crate::backend\";\n"
        "#[cfg(test)]\nmod tests {\n    use crate::backend::B;\n}\n",
        "core.rs": "use super::*;\n",
        "cases/mod.rs": "mod a;\npub use a::*;\nfn helper() {}\n",
        "cases/a.rs": "use super::*;\nfn f() { super::helper() }\n",
    })
    assert cycles(edges(one_way)) == [], edges(one_way)
    print("module-cycles: self-test passed")


def workspace_members(root):
    with open(os.path.join(root, "Cargo.toml"), encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    return [os.path.join(root, x) for x in re.findall(r'"([^"]+)"', m.group(1))]


def main(argv):
    if argv[:1] == ["--self-test"]:
        self_test()
        argv = argv[1:]
        if not argv:
            return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = argv or workspace_members(root)
    if not check(dirs):
        return 1
    print(f"module-cycles: no cycle in {len(dirs)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
