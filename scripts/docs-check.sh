#!/usr/bin/env bash
# docs-check.sh — the docs say nothing that points nowhere:
#
#   1. `cargo doc` of the workspace as docs.rs builds it (every feature,
#      --cfg docsrs), with broken and private intra-doc links as errors
#      (an unresolved [`Item`] is otherwise a warning, and a link to a
#      private item a page that docs.rs does not have);
#   2. scripts/docs-check.py: every path that README.md, docs/*.md and the
#      crate READMEs name (markdown links, anchors, links to this
#      repository's URL, backticked paths such as `scripts/chaos.sh` or
#      `quorumlock-etcd/tests/interop.rs`) exists, and no crate README links
#      relatively (that breaks on docs.rs and crates.io).
#
#   scripts/docs-check.sh              # both
#   scripts/docs-check.sh --paths-only # only 2 (no build)
#
# Exit status: non-zero when either fails; each missing path is listed.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 scripts/docs-check.py --self-test
if [ "${1:-}" != "--paths-only" ]; then
  RUSTC_BOOTSTRAP=1 \
    RUSTDOCFLAGS="--cfg docsrs -D warnings -D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links" \
    cargo doc --workspace --all-features --no-deps
fi
python3 scripts/docs-check.py
