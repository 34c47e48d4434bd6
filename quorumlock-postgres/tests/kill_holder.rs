//! `kill -9` of a holder process, on the real server: the lock is free
//! within a few TTLs, and once the next grant (which purges the dead
//! session's entries first) has been made and released, the tables hold
//! no row of the killed session: not its session row, not its entry, not
//! a fence. The holder is this test binary again, running the conformance
//! crate's holder (`quorumlock_conformance::faults::process::holder_child`).

mod common;

use std::process::Stdio;
use std::time::Duration;

use quorumlock_conformance::faults::process::{holder_child, CHILD_ENV};
use quorumlock_conformance::faults::FaultTarget;
use quorumlock_conformance::scratch::{remove_scratch, scratch_key};
use quorumlock_postgres::DEFAULT_SCHEMA;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use uuid::Uuid;

/// Settling time: wide, only hit on a failure.
const SETTLE: Duration = Duration::from_secs(20);

fn target() -> Option<FaultTarget> {
    FaultTarget::from_env(
        "postgres",
        "QUORUMLOCK_TEST_POSTGRES_URL",
        |url| async move {
            Ok(
                std::sync::Arc::new(quorumlock_postgres::PostgresBackend::connect(&url).await?)
                    as _,
            )
        },
    )
    .map(|t| t.with_option("ttl", "2s"))
}

/// The holder process (run by `a_killed_holder_leaves_nothing_once_the_next_grant_purged`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the holder process of a_killed_holder_leaves_nothing_once_the_next_grant_purged"]
async fn killed_holder_child() {
    let Some(t) = target() else { return };
    holder_child(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_leaves_nothing_once_the_next_grant_purged() {
    let Some(t) = target() else { return };
    let base = common::base_url().expect("the target's URL");
    let ns = common::namespace("qlkill");
    let admin = t.client(&ns).await;
    let ttl = admin.backend().capabilities().session_ttl;
    let key = scratch_key(admin.backend().as_ref(), &ns, "p");
    let db = common::sql(&base).await;
    let s = DEFAULT_SCHEMA;

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "killed_holder_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{} {ns}", t.name()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawning the holder process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let token: u64 = tokio::time::timeout(SETTLE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(t) = line.split("HELD ").nth(1) {
                return t.trim().parse().unwrap();
            }
        }
        panic!("the holder process ended before it held the lock");
    })
    .await
    .expect("the holder process did not take the lock in time");

    // Its session, as the server has it.
    let state = admin.inspect("p").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.holders[0].token, token);
    let session = Uuid::try_parse(&state.holders[0].session).unwrap();
    let rows = |table: &'static str, col: &'static str| {
        let db = &db;
        async move {
            db.query_one(
                &format!("SELECT count(*) FROM \"{s}\".{table} WHERE {col} = $1"),
                &[&session],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        }
    };
    assert_eq!(rows("sessions", "id").await, 1);
    assert_eq!(rows("entries", "session").await, 1);

    // SIGKILL (tokio's kill), while it holds and writes.
    child.kill().await.expect("SIGKILL of the holder process");
    let killed = tokio::time::Instant::now();
    let g = admin
        .lock("p")
        .unwrap()
        .acquire_timeout(ttl * 4 + SETTLE)
        .await
        .expect("the killed holder's lock was never freed");
    let free_after = killed.elapsed();
    assert!(g.token() > token, "{} after {token}", g.token());
    g.release().await.unwrap();
    eprintln!(
        "the killed holder's lock was granted again {free_after:?} after the kill (TTL {ttl:?})"
    );

    // The grant purged it: nothing of the killed session is left.
    assert_eq!(rows("sessions", "id").await, 0, "its session row is left");
    assert_eq!(rows("entries", "session").await, 0, "its entry is left");
    assert_eq!(rows("fences", "session").await, 0, "a fence of it is left");
    let under: i64 = db
        .query_one(
            &format!("SELECT count(*) FROM \"{s}\".entries WHERE lock LIKE $1"),
            &[&format!("{ns}/%")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(under, 0, "entries left under the namespace");

    remove_scratch(&admin, &key).await;
    admin.close().await;
    assert!(admin.backend().leftovers().await.unwrap().is_empty());
}
