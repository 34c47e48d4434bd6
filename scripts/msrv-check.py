#!/usr/bin/env python3
"""msrv-check.py: fails if a package of the locked dependency tree (every
feature of every workspace member on, dev-dependencies included) declares a
`rust-version` newer than the workspace's, or if a member claims another one.

Reads `cargo metadata --format-version 1 --all-features --locked` on stdin
(scripts/msrv-check.sh runs it). Prints the newest rust-version in the tree
and which packages set it.
"""
import json
import sys


def version(v):
    """'1.88' or '1.88.0' as a comparable tuple."""
    parts = [int(p) for p in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    meta = json.load(sys.stdin)
    members = set(meta["workspace_members"])
    packages = {p["id"]: p for p in meta["packages"]}
    in_tree = {n["id"] for n in meta["resolve"]["nodes"]}

    claims = {packages[m]["name"]: packages[m].get("rust_version") for m in members}
    distinct = set(claims.values())
    if len(distinct) != 1 or None in distinct:
        print(f"msrv-check: workspace members disagree on rust-version: {claims}", file=sys.stderr)
        return 1
    claim = distinct.pop()

    deps = [packages[i] for i in in_tree if i not in members]
    declared = [p for p in deps if p.get("rust_version")]
    newest = max(version(p["rust_version"]) for p in declared)
    setters = sorted(
        f"{p['name']} {p['version']}" for p in declared if version(p["rust_version"]) == newest
    )
    too_new = sorted(
        (version(p["rust_version"]), p["name"], p["version"], p["rust_version"])
        for p in declared
        if version(p["rust_version"]) > version(claim)
    )
    newest_s = ".".join(str(x) for x in newest).removesuffix(".0")
    print(
        f"msrv-check: workspace rust-version {claim}; {len(deps)} dependencies "
        f"({len(declared)} declare one), newest {newest_s}: {', '.join(setters)}"
    )
    if too_new:
        for _, name, ver, rv in too_new:
            print(f"msrv-check: {name} {ver} needs Rust {rv}, newer than {claim}", file=sys.stderr)
        print(
            "msrv-check: raise rust-version in Cargo.toml's [workspace.package], or pin "
            "the dependency lower (cargo update -p NAME --precise VERSION)",
            file=sys.stderr,
        )
        return 1
    if version(claim) > newest:
        print(
            f"msrv-check: note: no dependency needs more than {newest_s}; the claim "
            f"{claim} is only true if the workspace's own code needs it"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
