#!/usr/bin/env bash
# test.sh — the whole test run, on a fresh machine or a used one:
# installs what is missing (stores, protoc, Curator, a JDK), starts real ZooKeeper,
# etcd 3.4, etcd 3.5, Consul, Redis and PostgreSQL on loopback, runs formatting, lints, every
# test of the workspace against them (skipping is an error), the docs and
# the quickstart on every store, checks the packaging (MSRV, `cargo package`,
# a project outside the workspace on the packaged crates), and stops the
# stores even on failure.
#
#   scripts/test.sh              # everything
#   scripts/test.sh -- ARGS      # extra arguments for `cargo test`
#   scripts/test.sh --repeat N [-- ARGS]
#                                # the stores up, then the test step alone N
#                                # times in a row: each run's counts, and
#                                # every test that failed in any run (a
#                                # flaky test is a defect: exit 1 if any did)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }
repeat=0
if [ "${1:-}" = "--repeat" ]; then
  repeat=${2:?"--repeat needs a number of runs"}
  shift 2
fi
extra=()
if [ "${1:-}" = "--" ]; then shift; extra=("$@"); fi

command -v cargo >/dev/null || { echo "test.sh: cargo is missing (install Rust with rustup)" >&2; exit 1; }

step "installing and starting the stores"
scripts/stores.sh install
trap 'step "stopping the stores"; scripts/stores.sh down || true' EXIT
eval "$(scripts/stores.sh up)"
export QUORUMLOCK_TEST_REQUIRE=1
export CARGO_TERM_COLOR=never

if [ "$repeat" -gt 0 ]; then
  logs=$(mktemp -d)
  for run in $(seq "$repeat"); do
    step "cargo test, run $run of $repeat (log: $logs/run-$run.log)"
    cargo test --workspace --all-features --no-fail-fast -- "${extra[@]}" >"$logs/run-$run.log" 2>&1 || true
    python3 - "$logs/run-$run.log" "$run" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
passed = sum(int(n) for n in re.findall(r"test result: \w+\. (\d+) passed", text))
failed = sum(int(n) for n in re.findall(r"; (\d+) failed", text))
ignored = sum(int(n) for n in re.findall(r"; (\d+) ignored", text))
print(f"run {sys.argv[2]}: {passed} passed, {failed} failed, {ignored} ignored", file=sys.stderr)
PY
  done
  step "tests that failed in any of the $repeat runs"
  if grep -h -E '^test .* \.\.\. FAILED$' "$logs"/run-*.log | sort | uniq -c | sort -rn >&2; then
    echo "test.sh: flaky or failing tests above (logs in $logs)" >&2
    exit 1
  fi
  echo "none: every test passed in all $repeat runs" >&2
  exit 0
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "no module cycle inside a crate (scripts/module-cycles.py)"
# Every workspace member (read from Cargo.toml).
python3 scripts/module-cycles.py --self-test
python3 scripts/module-cycles.py

step "MSRV: no dependency needs a newer Rust than rust-version (scripts/msrv-check.sh)"
scripts/msrv-check.sh

step "cargo clippy (all targets, all features, warnings are errors)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo test (every crate, against the real stores)"
cargo test --workspace --all-features --no-fail-fast -- "${extra[@]}"

step "cargo doc, as docs.rs builds it (--cfg docsrs: each backend module names its feature)"
# RUSTC_BOOTSTRAP lets stable rustdoc take doc_cfg, the nightly feature
# docs.rs uses; one run instead of a plain one and a docs.rs one (the two
# differ only in the cfg_attr(docsrs) lines).
RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="--cfg docsrs -D warnings" cargo doc --workspace --all-features --no-deps
doc=${CARGO_TARGET_DIR:-target}/doc/quorumlock
for feature in mem etcd zk consul redis postgres; do
  grep -q "Available on <strong>crate feature <code>$feature</code></strong> only" "$doc/$feature/index.html" ||
    { echo "test.sh: $doc/$feature/index.html does not name the feature $feature" >&2; exit 1; }
done

step "docs check: no broken intra-doc link, every path the docs name exists (scripts/docs-check.sh)"
scripts/docs-check.sh

step "examples on every store"
out=$(mktemp)
for url in "mem:///examples" "$QUORUMLOCK_TEST_ETCD_URL/examples" "$QUORUMLOCK_TEST_ZK_URL/examples" "$QUORUMLOCK_TEST_CONSUL_URL/examples" "$QUORUMLOCK_TEST_REDIS_URL/examples" "$QUORUMLOCK_TEST_POSTGRES_URL/examples"; do
  for example in quickstart worker_pool swap_store rwlock transfer; do
    echo "--- $example on $url" >&2
    if ! QUORUMLOCK_URL=$url cargo run -q -p quorumlock --all-features --example "$example" >"$out" 2>&1; then
      cat "$out"; echo "example $example failed on $url" >&2; exit 1
    fi
    # The example exited: nothing of its may still be held or awaited (a
    # guard dropped as main returns is never released; the example must
    # release and close). mem:// lives in the example's process only.
    case $url in mem:*) continue ;; esac
    held=$(cargo run -q -p quorumlock-cli --all-features -- list --json --url "$url")
    case $held in
      *'"locks":[]'*) ;;
      *) echo "example $example exited with locks held on $url: $held" >&2; exit 1 ;;
    esac
  done
done
echo "--- transfer_sql on $QUORUMLOCK_TEST_POSTGRES_URL/examples" >&2
if ! QUORUMLOCK_URL=$QUORUMLOCK_TEST_POSTGRES_URL/examples cargo run -q -p quorumlock --all-features --example transfer_sql >"$out" 2>&1; then
  cat "$out"; echo "example transfer_sql failed on PostgreSQL" >&2; exit 1
fi
rm -f "$out"

step "cargo package --workspace (builds every published crate from its .crate file)"
# cargo extracts a local registry's crates under registry/src/-<hash>/ once
# per version and reuses them: a second run on one machine would verify
# against the first run's sources (0.1.0 both times). Drop ours first,
# and what was compiled from them: a registry crate's build is never
# checked against its sources again (a stale quorumlock-core from an
# earlier run failed the verification of a backend using a newer API).
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/quorumlock*
rm -rf "${CARGO_TARGET_DIR:-target}"/debug/.fingerprint/quorumlock-*
cargo package --workspace --exclude quorumlock-bench --locked --allow-dirty

step "a project outside the workspace on the packaged quorumlock (etcd), quickstart on etcd"
scripts/packaged-quickstart.sh

step "all passed"
