#!/usr/bin/env bash
# chaos.sh — run quorumlock's fault scenarios for a while against each
# store and print, per backend and scenario: cycles, faults injected,
# double-holder overlaps, stale writes rejected/accepted, the longest
# loss-detection delay and leaked entries.
#
#   scripts/chaos.sh [--minutes N] [--backend B]... [--keep-results FILE]
#
#   --minutes N   total wall time to spend (default 10), shared by the
#                 backends: each store 4 parts, mem (the in-process
#                 reference) 1. In its share a backend first runs the
#                 fault explorer (random schedules under random faults,
#                 checked by the history checker) for nineteen twentieths
#                 of it, QUORUMLOCK_EXPLORE_AT_ONCE schedules in flight
#                 (default here 20; ZooKeeper 10: the test server keeps
#                 its default of 60 connections per client address, and
#                 twenty schedules' clients and operators need more;
#                 Consul 36: its schedules are the slowest, with session
#                 TTLs of 10 s), each
#                 QUORUMLOCK_EXPLORE_RUN_SECONDS long (default here 3);
#                 then passes of the scripted scenarios (at least one),
#                 each repeating its rounds for QUORUMLOCK_CHAOS_SECONDS,
#                 while they fit.
#   --backend B   mem, etcd, zk, consul, redis or postgres (repeatable; default: all).
#   --keep-results FILE   append the raw rows (TSV) to FILE.
#   --no-clusters  skip the three-node cluster scenarios.
#
# After its timed passes, each real backend with a cluster target runs its
# cluster scenarios and explorer rounds on a three-node cluster (each round
# kills the leader, pauses the whole cluster past the TTL or kills a
# follower under 12 schedules, QUORUMLOCK_EXPLORE_CLUSTER_AT_ONCE) once (clusters on
# 127.0.0.2-4, started and stopped by the tests; about 20 s for etcd, 2-3
# min for ZooKeeper and Consul), through quorumlock-<B>/tests/fault_cluster.rs
# (one `cluster_fault_suite!(...)`); this time is not part of --minutes.
#
# The real stores come from `scripts/stores.sh up` unless the
# QUORUMLOCK_TEST_<STORE>_URL variables are already set; this script never
# stops them. A backend runs its fault suite through its test target:
#   mem      quorumlock-conformance/tests/faults_mem.rs
#   etcd     quorumlock-etcd/tests/fault_suite.rs
#   zk       quorumlock-zk/tests/fault_suite.rs
#   consul   quorumlock-consul/tests/fault_suite.rs
#   redis    quorumlock-redis/tests/fault_suite.rs
#   postgres quorumlock-postgres/tests/fault_suite.rs
# (each of those is one `quorumlock_conformance::fault_suite!(...)` line).
# QUORUMLOCK_CHAOS_SUITE_<B> / QUORUMLOCK_CHAOS_CLUSTER_<B> (B upper-case)
# replace the cargo arguments that select a suite, e.g.
# "--manifest-path /elsewhere/Cargo.toml --test etcd".
# Exit status: 0 when every row is ok and every test passed.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=10
backends=()
keep=""
clusters=1
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --minutes=*) minutes=${1#*=}; shift ;;
    --backend) backends+=("$2"); shift 2 ;;
    --backend=*) backends+=("${1#*=}"); shift ;;
    --keep-results) keep=$2; shift 2 ;;
    --no-clusters) clusters=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#backends[@]} -gt 0 ] || backends=(mem etcd zk consul redis postgres)
case "$minutes" in ''|*[!0-9.]*) echo "chaos.sh: --minutes takes a number" >&2; exit 2 ;; esac

SCENARIOS=12   # scripted scenarios in quorumlock_conformance::fault_suite!
log() { printf 'chaos.sh: %s\n' "$*" >&2; }

need_stores=0
for b in "${backends[@]}"; do
  case "$b" in
    mem) ;;
    etcd) [ -n "${QUORUMLOCK_TEST_ETCD_URL:-}" ] || need_stores=1 ;;
    zk) [ -n "${QUORUMLOCK_TEST_ZK_URL:-}" ] || need_stores=1 ;;
    consul) [ -n "${QUORUMLOCK_TEST_CONSUL_URL:-}" ] || need_stores=1 ;;
    redis) [ -n "${QUORUMLOCK_TEST_REDIS_URL:-}" ] || need_stores=1 ;;
    postgres) [ -n "${QUORUMLOCK_TEST_POSTGRES_URL:-}" ] || need_stores=1 ;;
    *) echo "chaos.sh: unknown backend $b (mem, etcd, zk, consul, redis, postgres)" >&2; exit 2 ;;
  esac
done
if [ "$need_stores" = 1 ]; then
  log "starting the stores (scripts/stores.sh up; they are left running)"
  eval "$(scripts/stores.sh up)"
fi

results=$(mktemp -t quorumlock-chaos.XXXXXX)
logs=$(mktemp -d -t quorumlock-chaos-logs.XXXXXX)
export QUORUMLOCK_CHAOS_RESULTS=$results
export QUORUMLOCK_TEST_REQUIRE=1
export CARGO_TERM_COLOR=never

# Seconds per backend (weight: mem 1, a store 4): nineteen twentieths for
# the explorer's random schedules, the rest for passes of the scripted
# scenarios (one pass runs even when it does not fit).
weight() { if [ "$1" = mem ]; then echo 1; else echo 4; fi; }
weights=0
for b in "${backends[@]}"; do weights=$((weights + $(weight "$b"))); done
slice_of() { awk -v m="$minutes" -v w="$(weight "$1")" -v t="$weights" 'BEGIN { printf "%d", m * 60 * w / t }'; }
# Schedules in flight: given, or 20 (ZooKeeper 10, Consul 36). The given value is read
# once, here: the loop below exports a value per backend.
given_at_once=${QUORUMLOCK_EXPLORE_AT_ONCE:-}
at_once_of() {
  if [ -n "$given_at_once" ]; then echo "$given_at_once"
  elif [ "$1" = consul ]; then echo 36
  elif [ "$1" = zk ]; then echo 10; else echo 20; fi
}
cluster_at_once=${QUORUMLOCK_EXPLORE_CLUSTER_AT_ONCE:-12}
export QUORUMLOCK_EXPLORE_RUN_SECONDS=${QUORUMLOCK_EXPLORE_RUN_SECONDS:-3}
log "${#backends[@]} backend(s), ${minutes} min: a store $(slice_of etcd)s, mem $(slice_of mem)s; explorer 19/20 of it (${QUORUMLOCK_EXPLORE_RUN_SECONDS}s schedules), then the scripted scenarios"

# add_missing_rows BACKEND LOG FIRST_LINE: a FAIL row for every test that
# failed in LOG without recording its own row (rows from line FIRST_LINE on).
add_missing_rows() {
  local b=$1 out=$2 first=$3 name
  for name in $(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$out"); do
    if ! tail -n +"$first" "$results" | grep -q "^$b	$name	"; then
      printf '%s\t%s\t0\t0\t0\t0\t0\t-\t0\tFAIL\tpanicked before recording its row (see %s)\n' "$b" "$name" "$out" >>"$results"
    fi
  done
}

failed_tests=0
for b in "${backends[@]}"; do
  case "$b" in
    mem) file=quorumlock-conformance/tests/faults_mem.rs; suite=(-p quorumlock-conformance --test faults_mem) ;;
    *) file=quorumlock-$b/tests/fault_suite.rs; suite=(-p "quorumlock-$b" --test fault_suite) ;;
  esac
  cfile=quorumlock-$b/tests/fault_cluster.rs
  cluster=(-p "quorumlock-$b" --test fault_cluster)
  B=$(printf '%s' "$b" | tr '[:lower:]' '[:upper:]')
  o=QUORUMLOCK_CHAOS_SUITE_$B; if [ -n "${!o:-}" ]; then read -ra suite <<<"${!o}"; file=/dev/null; fi
  o=QUORUMLOCK_CHAOS_CLUSTER_$B; if [ -n "${!o:-}" ]; then read -ra cluster <<<"${!o}"; cfile=/dev/null; fi
  if [ ! -e "$file" ]; then
    log "$b: $file is missing: the fault suite is not wired for this backend"
    printf '%s\t(not wired: %s missing)\t0\t0\t0\t0\t0\t-\t0\tSKIP\t\n' "$b" "$file" >>"$results"
    continue
  fi
  log "$b: building"
  cargo test -q "${suite[@]}" --no-run >&2
  slice=$(slice_of "$b")
  explore_share=$(( slice * 19 / 20 ))
  export QUORUMLOCK_CHAOS_SECONDS
  QUORUMLOCK_CHAOS_SECONDS=$(awk -v s="$slice" -v e="$explore_share" -v k="$SCENARIOS" 'BEGIN { p = (s - e) / k; printf "%d", (p < 1 ? 1 : p) }')
  export QUORUMLOCK_EXPLORE_AT_ONCE
  QUORUMLOCK_EXPLORE_AT_ONCE=$(at_once_of "$b")
  start=$(date +%s)
  # The explorer first: its share split between the explorer tests of the
  # target (etcd has one per version), which run one after the other.
  n_explore=$(cargo test -q "${suite[@]}" -- --list 2>/dev/null | grep -c 'explore_random_schedules[a-z_]*: test' || true)
  [ "$n_explore" -gt 0 ] || n_explore=1
  out=$logs/$b.explore.log
  log "$b: explorer, ${explore_share}s over $n_explore target(s), $QUORUMLOCK_EXPLORE_AT_ONCE at once (log: $out); then ${QUORUMLOCK_CHAOS_SECONDS}s per scenario per pass"
  first=$(( $(wc -l <"$results") + 1 ))
  if ! QUORUMLOCK_EXPLORE_SECONDS=$(( explore_share / n_explore )) \
      cargo test "${suite[@]}" -- explore_random_schedules --test-threads=1 >"$out" 2>&1; then
    failed_tests=1
    add_missing_rows "$b" "$out" "$first"
    grep -E 'panicked at' -A2 "$out" | head -20 >&2 || true
  fi
  pass=0
  while :; do
    pass=$((pass + 1))
    out=$logs/$b.$pass.log
    log "$b: pass $pass (log: $out)"
    first=$(( $(wc -l <"$results") + 1 ))
    if ! cargo test "${suite[@]}" -- --skip explore_random_schedules --test-threads=1 >"$out" 2>&1; then
      failed_tests=1
      add_missing_rows "$b" "$out" "$first"
      grep -E 'panicked at' -A2 "$out" | head -20 >&2 || true
    fi
    now=$(date +%s)
    [ $((now - start)) -lt "$slice" ] || break
    # Another pass only if it fits.
    [ $(( (now - start) / pass + now - start )) -le "$slice" ] || break
  done
  if [ "$b" != mem ] && [ "$clusters" = 1 ]; then
    if [ -e "$cfile" ]; then
      out=$logs/$b.cluster.log
      log "$b: cluster scenarios (log: $out)"
      first=$(( $(wc -l <"$results") + 1 ))
      if ! QUORUMLOCK_CHAOS_SECONDS=0 QUORUMLOCK_EXPLORE_SECONDS=0 QUORUMLOCK_EXPLORE_AT_ONCE=$cluster_at_once \
          cargo test "${cluster[@]}" -- --include-ignored --test-threads=1 >"$out" 2>&1; then
        failed_tests=1
        add_missing_rows "$b-cluster" "$out" "$first"
        grep -E 'panicked at' -A2 "$out" | head -20 >&2 || true
      fi
    else
      log "$b: $cfile is missing: no cluster scenarios"
    fi
  fi
done

[ -z "$keep" ] || cat "$results" >>"$keep"

echo
echo "quorumlock chaos: ${minutes} min, $(date -u +%Y-%m-%dT%H:%MZ)"
awk -F'\t' '
  {
    k = $1 "\t" $2
    if (!(k in runs)) order[n++] = k
    runs[k]++
    cyc[k] += $3; flt[k] += $4; ovl[k] += $5; rej[k] += $6; acc[k] += $7; leak[k] += $9
    if ($8 != "-") { if (!(k in loss)) loss[k] = $8; else if ($8 + 0 > loss[k] + 0) loss[k] = $8 }
    if (!(k in res) || res[k] == "ok") res[k] = $10
    if ($10 == "FAIL") res[k] = "FAIL"
    if ($11 != "" && !(k in note)) note[k] = $11
  }
  END {
    fmt = "%-14s %-38s %5s %8s %7s %8s %9s %9s %10s %6s  %s\n"
    printf fmt, "backend", "scenario", "runs", "cycles", "faults", "overlaps", "stale_rej", "stale_acc", "max_loss_ms", "leaked", "result"
    bad = 0
    for (i = 0; i < n; i++) {
      k = order[i]; split(k, p, "\t")
      printf fmt, p[1], p[2], runs[k], cyc[k], flt[k], ovl[k], rej[k], acc[k], (k in loss ? loss[k] : "-"), leak[k], res[k]
      if (res[k] == "FAIL") { bad = 1; if (k in note) printf "        %s\n", substr(note[k], 1, 300) }
    }
    exit bad
  }' "$results" || failed_tests=1
echo
echo "explorer (random schedules; faults by kind):"
awk -F'\t' '$2 ~ /^explore_/ { printf "  %-14s %s  %s\n", $1, $10, substr($11, 1, 300) }' "$results"
echo
echo "schedules per store (single node and cluster explorer rows together):"
awk -F'\t' '$2 ~ /^explore_/ {
    store = $1; sub(/-.*$/, "", store); sub(/[0-9]+$/, "", store)
    n = $11; sub(/ schedules.*$/, "", n)
    if (!(store in total)) order[k++] = store
    total[store] += n; bad[store] += ($10 == "ok" ? 0 : 1)
  }
  END { for (i = 0; i < k; i++) { s = order[i]; printf "  %-8s %6d schedules, %d explorer row(s) not ok\n", s, total[s], bad[s] } }' "$results"
echo
echo "raw rows: $results   logs: $logs"
exit "$failed_tests"
