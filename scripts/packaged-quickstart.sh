#!/usr/bin/env bash
# packaged-quickstart.sh — what a user of the published crates gets: builds a
# project outside the workspace that depends on the *packaged* `quorumlock`
# (the .crate files `cargo package` writes, not the source folders) with the
# `etcd` feature, and runs the quickstart example from that package against
# the etcd in QUORUMLOCK_TEST_ETCD_URL. The same project depends on
# quorumlock-core and quorumlock-etcd by their package names too, and a second
# program of it imports them as `quorumlock_core` and `quorumlock_etcd`, the
# names a user expects (checked against `cargo metadata` first: every library
# target of the workspace is named after its package).
#
#   scripts/packaged-quickstart.sh     # scripts/test.sh runs it
#
# The sibling crates are not on crates.io yet, so the project reaches them
# through [patch.crates-io] entries pointing at the unpacked .crate files;
# every other dependency comes from crates.io at the workspace's locked
# versions (Cargo.lock is copied). Builds in the workspace's target dir, so
# that the dependencies `cargo package --workspace` built for quorumlock-etcd
# (same versions, same features) are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${QUORUMLOCK_TEST_ETCD_URL:?set it (scripts/stores.sh up prints it)}"
target=${CARGO_TARGET_DIR:-$PWD/target}
version=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "quorumlock"))')
# Every library is named after its package (`quorumlock-core` -> `quorumlock_core`).
cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
bad = [(p["name"], t["name"]) for p in json.load(sys.stdin)["packages"]
       for t in p["targets"] if "lib" in t["kind"] and t["name"] != p["name"].replace("-", "_")]
if bad:
    sys.exit("packaged-quickstart.sh: libraries not named after their package: %r" % bad)
'
crates=(quorumlock quorumlock-core quorumlock-etcd quorumlock-zk quorumlock-consul quorumlock-redis quorumlock-postgres)

# The .crate files, as `cargo publish` would upload them (no build here:
# `cargo package --workspace` in scripts/test.sh builds each one).
# quorumlock-conformance too: the backends name it as a dev-dependency.
cargo package -q --locked --no-verify --allow-dirty "${crates[@]/#/-p}" -p quorumlock-conformance

dir=$target/packaged-quickstart
rm -rf "$dir/crates" "$dir/app"
mkdir -p "$dir/crates" "$dir/app/src/bin"
for c in "${crates[@]}"; do tar -xzf "$target/package/$c-$version.crate" -C "$dir/crates"; done
cp "$dir/crates/quorumlock-$version/examples/quickstart.rs" "$dir/app/src/main.rs"
cp Cargo.lock "$dir/app/Cargo.lock"
# The crates by their own names: a name checked by quorumlock-core, the
# schemes quorumlock-etcd serves.
cat >"$dir/app/src/bin/by-name.rs" <<'RS'
fn main() {
    let name = quorumlock_core::LockName::new("jobs/nightly").expect("a valid name");
    let schemes: &[&str] = quorumlock_etcd::SCHEMES;
    println!("name {name} schemes {}", schemes.join(","));
}
RS
cat >"$dir/app/Cargo.toml" <<TOML
[package]
name = "packaged-quickstart"
default-run = "packaged-quickstart"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
quorumlock = { version = "$version", features = ["etcd"] }
quorumlock-core = "$version"
quorumlock-etcd = "$version"
tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }

[patch.crates-io]
$(for c in "${crates[@]}"; do printf '%s = { path = "../crates/%s-%s" }\n' "$c" "$c" "$version"; done)

[workspace]
TOML

echo "packaged-quickstart.sh: building $dir/app on the packaged quorumlock $version (features: etcd)" >&2
CARGO_TARGET_DIR=$target cargo build -q --manifest-path "$dir/app/Cargo.toml"
by_name=$("$target/debug/by-name")
[ "$by_name" = "name jobs/nightly schemes etcd,etcds" ] ||
  { echo "packaged-quickstart.sh: by-name printed '$by_name'" >&2; exit 1; }
out=$(QUORUMLOCK_URL=$QUORUMLOCK_TEST_ETCD_URL/packaged-quickstart "$target/debug/packaged-quickstart")
printf '%s\n' "$out"
grep -q '^store: .*etcd' <<<"$out" || { echo "packaged-quickstart.sh: the quickstart did not run on etcd" >&2; exit 1; }
grep -q '^all workers done' <<<"$out" || { echo "packaged-quickstart.sh: the quickstart did not finish" >&2; exit 1; }
echo "packaged-quickstart.sh: ok" >&2
