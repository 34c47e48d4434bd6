#!/usr/bin/env python3
"""Prints the README's benchmark summary from bench-results/*.json (one run
of scripts/bench.sh): one row per store, ratios to that store's floor."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-results")
order = ["mem", "etcd34", "etcd35", "zk", "consul"]
print("| store | floor p50 ms | cycle p50 ms | cycle / floor | requests per handoff, N = 1 / 4 / 16 / 64 | 10,000 held: acquire all | keepalives per TTL, 1 vs 10,000 held | client bytes per held lock | loss seen after break / session kill of a lock held 100 ms, p50 ms |")
print("|---|---|---|---|---|---|---|---|---|")
for name in order:
    f = out / f"{name}.json"
    if not f.exists():
        continue
    r = json.loads(f.read_text())
    floor = r["floor"]["p50_ms"] if r["floor"] else None
    ratio = r["cycle_over_floor_p50"]
    hand = " / ".join(f"{h['requests_per_handoff']:.1f}" for h in r["handoff"])
    s, l = r["scale"], r["loss_detection"]
    print(
        f"| {name} | {floor:.2f} | {r['cycle']['p50_ms']:.2f} | {ratio:.2f} | {hand} | "
        f"{s['acquire_all_s']:.1f} s | {s['requests_per_ttl_one_lock']} vs {s['requests_per_ttl_all_locks']} | "
        f"{s['client_bytes_per_lock']:.0f} | {l['break']['p50_ms']:.1f} / {l['session_kill']['p50_ms']:.1f} |"
        if floor is not None else
        f"| {name} | — | {r['cycle']['p50_ms']:.3f} | — | {hand} | "
        f"{s['acquire_all_s']:.2f} s | {s['requests_per_ttl_one_lock']} vs {s['requests_per_ttl_all_locks']} | "
        f"{s['client_bytes_per_lock']:.0f} | {l['break']['p50_ms']:.3f} / {l['session_kill']['p50_ms']:.3f} |"
    )
