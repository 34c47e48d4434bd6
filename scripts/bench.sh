#!/usr/bin/env bash
# bench.sh — the benchmark program against every store, one after the
# other on this machine, each compared with its own floor in the same run.
# Starts the stores if needed (scripts/stores.sh) and leaves them as found.
#
#   scripts/bench.sh                 # all stores, full sizes
#   scripts/bench.sh --quick         # small sizes (a smoke run)
#   scripts/bench.sh -- ARGS         # extra arguments for the bench binary
#
# Writes bench-results/<store>.json and bench-results/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
if [ "${1:-}" = "--quick" ]; then
  args=(--warm-up-secs 2 --cycles 100 --handoffs 40 --scale-locks 500 --scale-small 100 --loss-rounds 2 --recipe 4,8 --contended-secs 1); shift
fi
if [ "${1:-}" = "--" ]; then shift; args+=("$@"); fi

started=0
if ! scripts/stores.sh status >/dev/null 2>&1; then
  started=1
  trap 'scripts/stores.sh down || true' EXIT
fi
eval "$(scripts/stores.sh up)"

cargo build -q --release -p quorumlock-bench --bin bench
out=bench-results
mkdir -p "$out"
{
  echo "# quorumlock benchmark"
  echo
  echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB, $(uname -sr); stores are single local nodes on loopback."
  echo "Run: $(date -u +%Y-%m-%dT%H:%MZ), \`scripts/bench.sh ${args[*]:-}\`"
  echo
} > "$out/RESULTS.md"

# Long TTLs so that keepalives do not blur the request counts.
for pair in "mem:mem://bench?ttl=10s" \
            "etcd34:$QUORUMLOCK_TEST_ETCD_URL/bench?ttl=10s" \
            "etcd35:$QUORUMLOCK_TEST_ETCD35_URL/bench?ttl=10s" \
            "zk:$QUORUMLOCK_TEST_ZK_URL/bench" \
            "consul:$QUORUMLOCK_TEST_CONSUL_URL/bench?ttl=15s" \
            "redis:$QUORUMLOCK_TEST_REDIS_URL/bench?ttl=10s" \
            "postgres:$QUORUMLOCK_TEST_POSTGRES_URL/bench?ttl=10s"; do
  name=${pair%%:*}; url=${pair#*:}
  echo "bench.sh: $name" >&2
  "${CARGO_TARGET_DIR:-target}/release/bench" --url "$url" --json "$out/$name.json" "${args[@]}" \
    | sed '/^```json/,$d' >> "$out/RESULTS.md"
  echo >> "$out/RESULTS.md"
done
[ "$started" = 1 ] || trap - EXIT
cat "$out/RESULTS.md"
