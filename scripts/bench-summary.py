#!/usr/bin/env python3
"""Prints the benchmark summary from bench-results/*.json (one run of
scripts/bench.sh): one row per store, each figure as a ratio to that
store's own floor measured in the same run, beside the targets of the
performance issue (cycle <= 1.10x its floor; handoff p99 <= 1.5x the
handoff floor's p99 with 4 to 64 waiters; 32 clients >= 0.9x the
handoffs/s of 8; 10,000 locks on one client <= 1.5x the floor), and beside
the handoff and contention lines the store's own lock recipe done raw by
as many parties (what the store itself does with that much contention)."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-results")
order = ["mem", "etcd34", "etcd35", "zk", "consul", "redis", "postgres"]


def load(name):
    f = out / f"{name}.json"
    return json.loads(f.read_text()) if f.exists() else None


def num(x, fmt="{:.2f}"):
    return "—" if x is None else fmt.format(x)


def ratio(a, b):
    return None if a is None or not b else a / b


runs = [(n, r) for n in order if (r := load(n)) is not None]

print("| store | floor p50 ms | cycle p50 ms | cycle / floor (target <= 1.10) | cycle / the naive lock's floor | requests per handoff, N = 1 / 4 / 16 / 64 | 10,000 held: acquire all s (floor s) | ours / floor, 1,000 / 10,000 held (target <= 1.5) | ours / floor with each lock's loss watch (etcd, ZooKeeper) | loss seen after break / session kill, p50 ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, r in runs:
    floor = r["floor"]["p50_ms"] if r["floor"] else None
    hand = " / ".join(f"{h['requests_per_handoff']:.1f}" for h in r["handoff"])
    s, l = r["scale"] or {}, r["loss_detection"] or {}
    small = r.get("scale_small") or {}
    took, floor_took = s.get("acquire_all_s"), s.get("floor_acquire_all_s")
    small_ratio = ratio(small.get("acquire_all_s"), small.get("floor_acquire_all_s"))
    watched = " / ".join(
        num(ratio(x.get("acquire_all_s"), x.get("floor_watched_acquire_all_s"))) for x in (small, s)
    )
    print(
        f"| {name} | {num(floor)} | {num(r['cycle']['p50_ms'], '{:.3f}')} | {num(r['cycle_over_floor_p50'])} | {num(r.get('cycle_over_naive_floor_p50'))} | {hand} | "
        f"{num(took)} ({num(floor_took)}) | {num(small_ratio)} / {num(ratio(took, floor_took))} | {watched} | "
        f"{num(l.get('break', {}).get('p50_ms'), '{:.1f}')} / {num(l.get('session_kill', {}).get('p50_ms'), '{:.1f}')} |"
    )

print()
print("| store | handoff floor p50 / p99 ms | ours p99 ms at 4 / 16 / 64 waiters | ours p99 / floor p99 (target <= 1.5) | the store's recipe raw, p99 ms at 4 / 16 / 64 parties | ours p99 / recipe p99 | our queue raw, handoffs overlapping (etcd): p99 ms at 4 / 16 parties | ours p99 / that, 4 / 16 |")
print("|---|---|---|---|---|---|---|---|")
for name, r in runs:
    hf = r.get("handoff_floor")
    by_waiters = {h["waiters"]: h["gap"]["p99_ms"] for h in r["handoff"]}
    p99s = [by_waiters.get(w) for w in (4, 16, 64)]
    floor_p99 = hf["p99_ms"] if hf else None
    by_parties = {h["parties"]: h["gap"]["p99_ms"] for h in r.get("recipe") or []}
    raw = [by_parties.get(w) for w in (4, 16, 64)]
    by_queue = {h["parties"]: h["gap"]["p99_ms"] for h in r.get("handoff_floor_queue") or []}
    queue = [by_queue.get(w) for w in (4, 16)]
    print(
        f"| {name} | {num(hf and hf['p50_ms'])} / {num(floor_p99)} | {' / '.join(num(p) for p in p99s)} | "
        f"{' / '.join(num(ratio(p, floor_p99)) for p in p99s)} | {' / '.join(num(p) for p in raw)} | "
        f"{' / '.join(num(ratio(p, q)) for p, q in zip(p99s, raw))} | {' / '.join(num(q) for q in queue)} | "
        f"{' / '.join(num(ratio(p, q)) for p, q in zip(p99s[:2], queue))} |"
    )

print()
print("| store | handoffs/s, 8 clients | 32 clients | 32 / 8 (target >= 0.9) | requests per handoff, 8 / 32 | each client its own process: handoffs/s, 8 / 32 (in the bench's process / in processes) | all clients in one other process: handoffs/s, 8 / 32 (in the bench's process / in the other) | the store's recipe raw: handoffs/s, 8 / 32 parties | recipe 32 / 8 | recipe requests per handoff, 8 / 32 | the bench's user CPU per handoff, us, 8 / 32: ours (the recipe's) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name, r in runs:
    by_clients = {c["clients"]: c for c in r["contended"]}
    a, b = by_clients.get(8), by_clients.get(32)
    if not a or not b:
        continue
    by_parties = {h["parties"]: h for h in r.get("recipe") or []}
    ra, rb = by_parties.get(8), by_parties.get(32)
    procs = {c["clients"]: c for c in r.get("contended_processes") or []}
    other = {c["clients"]: c for c in r.get("contended_one_process") or []}
    rate = lambda x: x and x["handoffs_per_s"]
    reqs = lambda x: x and x["requests_per_handoff"]
    user = lambda x: x and (x.get("cpu_us_per_handoff") or {}).get("user")
    print(
        f"| {name} | {a['handoffs_per_s']:.0f} | {b['handoffs_per_s']:.0f} | "
        f"{b['handoffs_per_s'] / a['handoffs_per_s']:.2f} | "
        f"{a['requests_per_handoff']:.1f} / {b['requests_per_handoff']:.1f} | "
        f"{num(rate(procs.get(8)), '{:.0f}')} / {num(rate(procs.get(32)), '{:.0f}')} "
        f"({num(ratio(a['handoffs_per_s'], rate(procs.get(8))))} / {num(ratio(b['handoffs_per_s'], rate(procs.get(32))))}) | "
        f"{num(rate(other.get(8)), '{:.0f}')} / {num(rate(other.get(32)), '{:.0f}')} "
        f"({num(ratio(a['handoffs_per_s'], rate(other.get(8))))} / {num(ratio(b['handoffs_per_s'], rate(other.get(32))))}) | "
        f"{num(rate(ra), '{:.0f}')} / {num(rate(rb), '{:.0f}')} | {num(ratio(rate(rb), rate(ra)))} | "
        f"{num(reqs(ra), '{:.1f}')} / {num(reqs(rb), '{:.1f}')} | "
        f"{num(user(a), '{:.0f}')} / {num(user(b), '{:.0f}')} ({num(user(ra), '{:.0f}')} / {num(user(rb), '{:.0f}')}) |"
    )
