#!/usr/bin/env python3
"""docs-check.py: every path the docs name must exist in the repository.

Reads README.md, docs/*.md and every README.md below the root (the crate
READMEs, docker/, quorumlock-conformance/src/faults/), and checks:

- markdown links `[text](target)` and reference definitions `[x]: target`:
  a relative target must exist (relative to the file), inside the
  repository; an anchor (`guide.md#lock-names`) must name a heading of the
  target file; a link to this repository's own URL
  (https://github.com/quorumlock/quorumlock/blob/main/PATH) must name an
  existing PATH;
- a crate's README (rustdoc shows it as the crate's page on docs.rs, and
  crates.io shows it too) must not link relatively at all: those links
  break there, so they must go to the repository URL;
- paths in backticks and in code blocks that look like the repository's
  own (`scripts/chaos.sh`, `quorumlock-etcd/tests/interop.rs`,
  `quorumlock-conformance/src/faults`, `quorumlock-*/README.md`): the first
  segment is a top-level entry of the repository; in a crate's README,
  `src/...`, `tests/...`, `examples/...` are taken from that crate, and
  elsewhere they must exist in at least one crate ("each backend's
  `tests/connect.rs`").

Prints every missing path as FILE:LINE: ... and exits 1 if there was one.

  python3 scripts/docs-check.py              # check the repository
  python3 scripts/docs-check.py --self-test  # check the checker
"""

import glob
import os
import re
import sys
import tempfile

REPO_URL = "https://github.com/quorumlock/quorumlock"
SKIP_DIRS = {".git", "target", "node_modules", ".ci"}
CRATE_SUBDIRS = {"src", "tests", "examples", "benches"}


def doc_files(root):
    files = {"README.md"} if os.path.exists(os.path.join(root, "README.md")) else set()
    files.update(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        if "README.md" in filenames:
            files.add(os.path.relpath(os.path.join(dirpath, "README.md"), root))
    return sorted(files)


def crate_dirs(root):
    out = []
    for entry in sorted(os.listdir(root)):
        if entry.startswith(".") or entry in SKIP_DIRS:
            continue
        if os.path.isfile(os.path.join(root, entry, "Cargo.toml")):
            out.append(entry)
    return out


def slug(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen, fence = set(), {}, None
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"^\s*(```+|~~~+)", line)
                if m:
                    if fence is None:
                        fence = m.group(1)[:3]
                    elif line.strip().startswith(fence):
                        fence = None
                    continue
                if fence is None:
                    h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
                    if h:
                        s = slug(h.group(1))
                        n = seen.get(s, 0)
                        seen[s] = n + 1
                        found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]


def split_markdown(text):
    """(prose, code): the file's text with code blocks blanked out, and the
    code blocks' lines (with their line numbers); line numbers are kept."""
    prose, code, fence = [], [], None
    for no, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m and (fence is None or line.strip().startswith(fence)):
            fence = m.group(1)[:3] if fence is None else None
            prose.append("")
            continue
        if fence is None:
            prose.append(line)
        else:
            prose.append("")
            code.append((no, line))
    return "\n".join(prose), code


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


WORD_STRIP = "\"'()[]{},;:.!?<>"


def path_words(snippet):
    """The words of a code snippet that may be paths."""
    for word in snippet.split():
        if "=" in word:  # VAR=value, --flag=value: the value
            word = word.split("=", 1)[1]
        word = word.lstrip("\"'([{<").rstrip(WORD_STRIP)
        if not word or "/" not in word:
            continue
        if "://" in word or word.startswith(("/", "~", "$", "-")) or "..." in word or "…" in word:
            continue
        if any(c in word for c in "<>{}|`\\@%#&?"):
            continue
        yield word


class Checker:
    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.top = {e for e in os.listdir(self.root) if not e.startswith(".") and e not in SKIP_DIRS}
        self.crates = crate_dirs(self.root)
        self.problems = []

    def report(self, where, msg):
        self.problems.append(f"{where}: {msg}")

    def exists(self, path):
        full = os.path.join(self.root, path)
        if any(c in path for c in "*?["):
            return bool(glob.glob(full))
        return os.path.exists(full)

    def inside(self, full):
        full = os.path.realpath(full)
        return full == self.root or full.startswith(self.root + os.sep)

    def check_link(self, md, no, target, in_crate_readme):
        where = f"{md}:{no}"
        target = target.strip().strip("<>")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            for kind in ("blob", "tree"):
                prefix = f"{REPO_URL}/{kind}/"
                if target.startswith(prefix):
                    rest = target[len(prefix):].split("/", 1)  # the branch, then the path
                    path = rest[1] if len(rest) > 1 else ""
                    self.check_target(where, path, os.path.join(self.root, path.split("#")[0]),
                                      f"link to {target}")
            return
        if target.startswith("#"):
            self.check_anchor(where, os.path.join(self.root, md), target[1:], f"anchor {target}")
            return
        if in_crate_readme:
            self.report(where, f"relative link ({target}) in a crate README: it breaks on docs.rs "
                        f"and crates.io; link to {REPO_URL}/blob/main/... instead")
        base = os.path.dirname(os.path.join(self.root, md))
        self.check_target(where, target, os.path.join(base, target.split("#")[0].split("?")[0]),
                          f"link ({target})")

    def check_target(self, where, target, full, what):
        if not self.inside(full):
            self.report(where, f"{what}: outside the repository")
        elif not os.path.exists(full):
            self.report(where, f"{what}: no such path")
        elif "#" in target and full.endswith(".md"):
            self.check_anchor(where, full, target.split("#", 1)[1], what)

    def check_anchor(self, where, full, anchor, what):
        if anchor and anchor not in anchors(full):
            self.report(where, f"{what}: no heading with that anchor")

    def check_word(self, md, no, word, code_block):
        first = word.split("/", 1)[0]
        md_dir = os.path.dirname(md)
        if first in (".", ".."):
            if code_block:  # ./deploy.sh in an example command: the user's own file
                return
            full = os.path.join(self.root, md_dir, word)
            if not self.inside(full):
                self.report(f"{md}:{no}", f"`{word}`: outside the repository")
            elif not os.path.exists(full):
                self.report(f"{md}:{no}", f"`{word}`: no such path")
        elif first in self.top:
            if not self.exists(word):
                self.report(f"{md}:{no}", f"`{word}`: no such path")
        elif first in CRATE_SUBDIRS and not code_block:
            if md_dir in self.crates:
                if not self.exists(os.path.join(md_dir, word)):
                    self.report(f"{md}:{no}", f"`{word}`: no such path in {md_dir}/")
            elif md_dir and self.exists(os.path.join(md_dir, word)):
                pass
            elif not any(self.exists(os.path.join(c, word)) for c in self.crates):
                self.report(f"{md}:{no}", f"`{word}`: no crate has such a path")

    def check_file(self, md):
        with open(os.path.join(self.root, md), encoding="utf-8") as f:
            text = f.read()
        in_crate_readme = os.path.dirname(md) in self.crates and os.path.basename(md) == "README.md"
        prose, code = split_markdown(text)
        # Links, reference definitions, then inline code (per paragraph, so a
        # code span may wrap a line).
        for m in re.finditer(r"\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)", prose):
            self.check_link(md, line_of(prose, m.start()), m.group(1), in_crate_readme)
        for m in re.finditer(r"(?m)^\s{0,3}\[[^\]]+\]:\s*(\S+)", prose):
            self.check_link(md, line_of(prose, m.start()), m.group(1), in_crate_readme)
        for m in re.finditer(r"(?<!`)`([^`]+?)`(?!`)", prose):
            if "\n\n" in m.group(1):
                continue
            for word in path_words(m.group(1)):
                self.check_word(md, line_of(prose, m.start()), word, False)
        for no, line in code:
            for word in path_words(line):
                self.check_word(md, no, word, True)

    def run(self, files):
        for md in files:
            self.check_file(md)
        return self.problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(d, path)) or d, exist_ok=True)
            with open(os.path.join(d, path), "w", encoding="utf-8") as f:
                f.write(text)
        write("scripts/a.sh", "")
        write("crate/Cargo.toml", "")
        write("crate/src/lib.rs", "")
        write("docs/guide.md", "# Guide\n\n## Lock names\n")
        write("README.md", "\n".join([
            "[guide](docs/guide.md) [names](docs/guide.md#lock-names) [bad](docs/guide.md#nope)",
            "[gone](docs/gone.md) [out](../x.md) [web](https://example.com/x)",
            f"[repo]({REPO_URL}/blob/main/scripts/a.sh) [repo2]({REPO_URL}/blob/main/scripts/b.sh)",
            "Run `scripts/a.sh` and `scripts/b.sh --flag`; `crate/tests/x.rs`; `crate/*/lib.rs`;",
            "`jobs/nightly`, `etcd://h/x`, `/etc/x`, each crate's `src/lib.rs` and `src/nope.rs`;",
            "`X=scripts/c.sh`, `../shared/x.md`, `./scripts/a.sh`, a `wrapped",
            "scripts/d.sh`.",
            "```sh", "scripts/a.sh && scripts/e.sh ./deploy.sh  # src/no.rs is not checked in code", "```",
        ]) + "\n")
        write("crate/README.md", "# crate\n\n[rel](../README.md) `src/lib.rs` `tests/y.rs`\n")
        problems = Checker(d).run(doc_files(d))
        expected = [
            "README.md:1: link (docs/guide.md#nope): no heading with that anchor",
            "README.md:2: link (docs/gone.md): no such path",
            "README.md:2: link (../x.md): outside the repository",
            f"README.md:3: link to {REPO_URL}/blob/main/scripts/b.sh: no such path",
            "README.md:4: `scripts/b.sh`: no such path",
            "README.md:4: `crate/tests/x.rs`: no such path",
            "README.md:5: `src/nope.rs`: no crate has such a path",
            "README.md:6: `scripts/c.sh`: no such path",
            "README.md:6: `../shared/x.md`: outside the repository",
            "README.md:6: `scripts/d.sh`: no such path",
            "README.md:9: `scripts/e.sh`: no such path",
            "crate/README.md:3: relative link (../README.md) in a crate README: it breaks on docs.rs "
            f"and crates.io; link to {REPO_URL}/blob/main/... instead",
            "crate/README.md:3: `tests/y.rs`: no such path in crate/",
        ]
        if sorted(problems) != sorted(expected):
            print("docs-check self-test failed:", file=sys.stderr)
            for p in sorted(set(problems) - set(expected)):
                print(f"  unexpected: {p}", file=sys.stderr)
            for p in sorted(set(expected) - set(problems)):
                print(f"  missed:     {p}", file=sys.stderr)
            return 1
    print("docs-check self-test: ok", file=sys.stderr)
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    files = doc_files(root)
    problems = Checker(root).run(files)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"docs-check: {len(problems)} missing or broken path(s) in the docs above", file=sys.stderr)
        return 1
    print(f"docs-check: every path named in {len(files)} markdown files exists", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
