#!/usr/bin/env bash
# msrv-check.sh — fails if any package of the locked dependency tree (all
# features, dev-dependencies included) needs a newer Rust than the
# workspace's `rust-version` claims. Cheap: reads `cargo metadata`, builds
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --all-features --locked | python3 scripts/msrv-check.py
