#!/usr/bin/env bash
# quickstart.sh — the README's main command. Runs the quickstart example on
# the embedded mem:// store, or on the store in QUORUMLOCK_URL
# (etcd://, zk://, consul://). Installs protoc first if it is missing (the
# etcd client needs it to build).
set -euo pipefail
cd "$(dirname "$0")/.."
# protoc and the well-known .proto files (libprotobuf-dev: etcd-client's
# build includes google/protobuf/descriptor.proto).
if ! command -v protoc >/dev/null || [ ! -e /usr/include/google/protobuf/descriptor.proto ]; then
  echo "quickstart.sh: installing protobuf-compiler and libprotobuf-dev (needed to build the etcd client)" >&2
  pkgs="protobuf-compiler libprotobuf-dev"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $pkgs >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq $pkgs >/dev/null; fi
fi
exec cargo run -q -p quorumlock --all-features --example quickstart
