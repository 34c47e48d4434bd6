//! The scripts' queue rule (`holds` in [`super::LIB`]) against the one
//! rule every store follows, `quorumlock_core::backend::holds`: every
//! queue of up to five entries of the mutex-like kinds, and every
//! semaphore queue of up to five permits, decided by the script on a real
//! Redis and by the shared function, must agree entry by entry. A mutant
//! of the script's rule must disagree somewhere (so this test can fail).

use quorumlock_core::backend::{holds, holds_linked, holds_together};
use quorumlock_core::LockKind;

use super::{with_lib, LIB};
use crate::layout::kind_code;

/// Runs the script's `holds` on `live` (built from the kinds) and returns
/// each entry's answer.
const PROBE: &str = r#"
local live = {}
for i = 2, #ARGV, 3 do
  live[#live + 1] = {kind = ARGV[i], permits = tonumber(ARGV[i + 1]), id = ARGV[i + 2]}
end
local out = {}
for i = 1, #live do
  if holds(live, i) then out[i] = 1 else out[i] = 0 end
end
return out
"#;

/// The queues to decide: every sequence of up to 5 of mutex, election,
/// reader and writer; every semaphore queue of up to 5 entries of 1 to 3
/// permits (a semaphore queue holds one count: `LockKind::conflicts_with`).
fn queues() -> Vec<Vec<LockKind>> {
    let kinds = [
        LockKind::Exclusive,
        LockKind::Election,
        LockKind::Read,
        LockKind::Write,
    ];
    let mut out: Vec<Vec<LockKind>> = vec![Vec::new()];
    out.extend(sequences(&kinds, 5));
    for permits in 1..=3 {
        for len in 1..=5 {
            out.push(vec![LockKind::Semaphore { permits }; len]);
        }
    }
    out.retain(|q| !q.is_empty());
    out
}

/// Semaphore queues of requests for several permits at once: every
/// sequence of request sizes (1 to `permits`) of up to 5 entries, for 1 to
/// 3 permits; each entry with the request it belongs to.
fn grouped_queues() -> Vec<(Vec<LockKind>, Vec<usize>)> {
    let mut out = Vec::new();
    for permits in 1..=3u32 {
        let mut level: Vec<Vec<u32>> = vec![Vec::new()];
        for _ in 0..5 {
            level = level
                .iter()
                .flat_map(|sizes| {
                    (1..=permits).map(move |k| {
                        let mut s = sizes.clone();
                        s.push(k);
                        s
                    })
                })
                .filter(|s| s.iter().sum::<u32>() <= 5)
                .collect();
            for sizes in &level {
                let request: Vec<usize> = sizes
                    .iter()
                    .enumerate()
                    .flat_map(|(r, k)| std::iter::repeat_n(r, *k as usize))
                    .collect();
                out.push((
                    vec![LockKind::Semaphore { permits }; request.len()],
                    request,
                ));
            }
        }
    }
    out
}

/// Read-write queues with upgrades: every sequence of up to 4 of reader,
/// writer, upgradeable reader and mutex, then, where an upgradeable entry
/// holds, its upgrade, and after it up to 1 more reader or writer; each
/// entry with the index of the entry it upgrades.
fn upgrade_queues() -> Vec<(Vec<LockKind>, Vec<Option<usize>>)> {
    use LockKind::*;
    let mut out = Vec::new();
    for q in sequences(&[Read, Write, Upgradeable, Exclusive], 4) {
        let Some(u) = (0..q.len()).find(|&i| q[i] == Upgradeable && holds(&q, i)) else {
            continue;
        };
        for tail in [None, Some(Read), Some(Write)] {
            let mut kinds = q.clone();
            kinds.push(Upgrade);
            kinds.extend(tail);
            let mut links = vec![None; kinds.len()];
            links[q.len()] = Some(u);
            out.push((kinds, links));
        }
    }
    out
}

/// Every sequence of 1 to `max` of `kinds`, shortest first.
fn sequences(kinds: &[LockKind], max: usize) -> Vec<Vec<LockKind>> {
    let mut out = Vec::new();
    let mut level: Vec<Vec<LockKind>> = vec![Vec::new()];
    for _ in 0..max {
        level = level
            .iter()
            .flat_map(|q| {
                kinds.iter().map(move |k| {
                    let mut q = q.clone();
                    q.push(*k);
                    q
                })
            })
            .collect();
        out.extend(level.iter().cloned());
    }
    out
}

/// Entry `i`'s id as the scripts name it: `r<n>` for the last entry of
/// request `n`, `r<n>.<j>.<k>` for its j-th of k before.
fn entry_id(request: &[usize], i: usize) -> String {
    let r = request[i];
    let k = request.iter().filter(|&&x| x == r).count();
    let j = request[..=i].iter().filter(|&&x| x == r).count();
    if j == k {
        format!("r{r}")
    } else {
        format!("r{r}.{j}.{k}")
    }
}

/// Where the script with `lib` and the shared rule disagree.
fn disagreements(con: &mut redis::Connection, lib: &str) -> Vec<String> {
    let script = redis::Script::new(&with_lib(lib, PROBE));
    let mut out = Vec::new();
    let plain = queues().into_iter().map(|q| {
        let request = (0..q.len()).collect::<Vec<_>>();
        (q, request)
    });
    for (q, request) in plain.chain(grouped_queues()) {
        let mut inv = script.prepare_invoke();
        inv.arg("");
        for (i, k) in q.iter().enumerate() {
            let (code, permits) = kind_code(*k);
            inv.arg(code).arg(permits).arg(entry_id(&request, i));
        }
        let by_script: Vec<i64> = inv.invoke(con).expect("the probe script runs");
        for (i, got) in by_script.iter().enumerate() {
            let want = holds_together(&q, i, |a, b| request[a] == request[b]);
            assert_eq!(
                holds_linked(&q, i, |a, b| request[a] == request[b], |_, _| false),
                want,
                "without upgrades the linked rule is the plain one"
            );
            assert_eq!(
                holds_together(&q, i, |a, b| a == b),
                holds(&q, i),
                "one entry per request is the plain rule"
            );
            if (*got == 1) != want {
                out.push(format!(
                    "{q:?} requests {request:?} entry {i}: script {got}, rule {want}"
                ));
            }
        }
    }
    for (q, links) in upgrade_queues() {
        // Ids in hex, as the scripts' `upgraded` reads them: `a<i>`, an
        // upgrade `a<i>ga<j>`.
        let id = |i: usize| match links[i] {
            Some(j) => format!("a{i}ga{j}"),
            None => format!("a{i}"),
        };
        let mut inv = script.prepare_invoke();
        inv.arg("");
        for (i, k) in q.iter().enumerate() {
            let (code, permits) = kind_code(*k);
            inv.arg(code).arg(permits).arg(id(i));
        }
        let by_script: Vec<i64> = inv.invoke(con).expect("the probe script runs");
        for (i, got) in by_script.iter().enumerate() {
            let want = holds_linked(&q, i, |a, b| a == b, |a, b| links[a] == Some(b));
            if (*got == 1) != want {
                out.push(format!(
                    "{q:?} upgrades {links:?} entry {i}: script {got}, rule {want}"
                ));
            }
        }
    }
    out
}

fn redis() -> Option<redis::Connection> {
    let url = match std::env::var("QUORUMLOCK_TEST_REDIS_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            if std::env::var("QUORUMLOCK_TEST_REQUIRE").as_deref() == Ok("1") {
                panic!("QUORUMLOCK_TEST_REDIS_URL is unset and QUORUMLOCK_TEST_REQUIRE=1");
            }
            eprintln!("SKIPPED: QUORUMLOCK_TEST_REDIS_URL is unset");
            return None;
        }
    };
    let client = redis::Client::open(url.as_str()).expect("a redis:// URL");
    Some(client.get_connection().expect("Redis answers"))
}

#[test]
fn the_scripts_queue_rule_is_the_shared_one() {
    let Some(mut con) = redis() else { return };
    assert_eq!(queues().len(), 4 + 16 + 64 + 256 + 1024 + 15);
    assert!(upgrade_queues().len() > 100, "{}", upgrade_queues().len());
    let wrong = disagreements(&mut con, LIB);
    assert!(wrong.is_empty(), "the script's rule differs: {wrong:#?}");
}

/// Each mutant of the script's rule is caught: a permit one short, the
/// entries of a request that hold one by one, a reader that waits only
/// for writers (not for a mutex ahead), a mutex that holds second.
#[test]
fn a_mutant_of_the_scripts_rule_is_caught() {
    let Some(mut con) = redis() else { return };
    for (from, to) in [
        (
            "return i + after(e.id) <= e.permits",
            "return i + after(e.id) < e.permits",
        ),
        (
            "return i + after(e.id) <= e.permits",
            "return i <= e.permits",
        ),
        (
            "if live[j].kind ~= 'r' then return false end",
            "if live[j].kind == 'w' then return false end",
        ),
        ("  return i == 1\nend", "  return i <= 2\nend"),
        // A reader waits for an upgradeable reader; an upgrade waits only
        // for writers, or for its own entry too.
        (
            "if k ~= 'r' and k ~= 'u' then return false end",
            "if k ~= 'r' then return false end",
        ),
        (
            "      elseif holds(live, j) then",
            "      elseif live[j].kind ~= 'r' and holds(live, j) then",
        ),
        ("      if live[j].id == of then\n", "      if false then\n"),
        // An upgrade granted while a reader waits between it and its
        // entry.
        (
            "if live[j].kind == 'r' and not holds(live, j) then return false end",
            "if false then return false end",
        ),
    ] {
        assert!(LIB.contains(from), "the rule's text changed: {from:?}");
        let mutant = LIB.replacen(from, to, 1);
        let wrong = disagreements(&mut con, &mutant);
        assert!(!wrong.is_empty(), "the mutant {to:?} was not caught");
    }
}
