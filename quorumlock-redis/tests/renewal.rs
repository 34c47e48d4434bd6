//! The renewal of a session that holds many locks: Redis runs one command
//! (or script) at a time, so a renewal that named every entry of the
//! session in one script kept every other client of the server waiting
//! while it ran (10,000 held locks: 55 ms, every third of a TTL).

mod common;

use std::time::Duration;

use common::{client, plain_client, raw, url_with};
use futures::{stream, StreamExt};
use quorumlock_conformance::support::{env_or_skip as env, unique_namespace};

/// How many entries one request of a renewal may name (the backend's
/// `RENEWAL_PART`), and the other arguments of the largest such request
/// (`EVALSHA`, its hash, 0 keys, and the reconciliation's five).
const PART: usize = 512;
const OTHER_ARGS: usize = 8;

/// The arguments of one `MONITOR` line (`<time> [<db> <client>] "CMD"
/// "arg"...`), without the command; `None` for a command a script ran
/// (`[0 lua]`), which is part of its script's step.
fn arguments(line: &str) -> Option<usize> {
    let (source, command) = line.split_once("] ")?;
    if source.ends_with(" lua") {
        return None;
    }
    Some(command.matches("\" \"").count())
}

/// A session with more entries than one request of a renewal names: each
/// request of its renewals names at most that many (a renewal still
/// keeps every lock), where the whole list in one script did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_of_many_held_locks_is_sent_in_parts() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let ns = unique_namespace("qlrenewparts");
    let ttl_ms = 3000;
    let a = client(&url_with(&base, &ns, Some(&format!("ttl={ttl_ms}ms")))).await;
    let count = 3 * PART;
    let guards: Vec<_> = stream::iter(0..count)
        .map(|i| {
            let a = a.clone();
            async move { a.lock(format!("l{i}")).unwrap().acquire().await.unwrap() }
        })
        // In order: guards[i] holds l{i}.
        .buffered(64)
        .collect()
        .await;
    let sid = a.session_id().await.unwrap();

    // From one renewal's start to the next one's: a whole renewal. Each
    // starts with the session id and the TTL in ms, in a row.
    let start = format!("\"{sid}\" \"{ttl_ms}\"");
    let mut lines = Box::pin(
        plain_client(&base)
            .get_async_monitor()
            .await
            .unwrap()
            .into_on_message::<String>(),
    );
    let mut renewal = Vec::new();
    let mut starts = 0;
    let watched = async {
        while let Some(line) = lines.next().await {
            if arguments(&line).is_some() && line.contains(&start) {
                starts += 1;
                if starts == 2 {
                    return;
                }
            }
            if starts == 1 && (line.contains(&sid) || line.contains(&ns)) {
                renewal.push(line);
            }
        }
        panic!("the monitor ended");
    };
    tokio::time::timeout(Duration::from_millis(4 * ttl_ms), watched)
        .await
        .expect("no two renewals within four TTLs");
    drop(lines);

    let widest = renewal
        .iter()
        .filter_map(|l| arguments(l).map(|n| (n, l)))
        .max_by_key(|(n, _)| *n)
        .expect("the renewal sent nothing");
    assert!(
        widest.0 <= PART + OTHER_ARGS,
        "a request of a renewal of {count} held locks named {} arguments: {}...",
        widest.0,
        &widest.1[..widest.1.len().min(300)]
    );
    for g in &guards {
        assert!(g.is_held(), "{:?} lost across renewals", g.name());
    }

    // The checks of the renewal read the held entries: one gone behind
    // the client's back is reported lost, wherever it is in the parts.
    let mut conn = raw(&base).await;
    let gone: Vec<usize> = (0..count).step_by(37).collect();
    for &i in &gone {
        redis::cmd("DEL")
            .arg(format!("{ns}/l{i}/.e"))
            .query_async::<i64>(&mut conn)
            .await
            .unwrap();
    }
    for &i in &gone {
        tokio::time::timeout(Duration::from_millis(2 * ttl_ms), guards[i].lost())
            .await
            .unwrap_or_else(|_| panic!("l{i}: its entry was deleted, no loss reported"));
    }
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_held(), !gone.contains(&i), "l{i}");
    }
    a.close().await;
}
