//! The one-statement steps on the server (`enqueue_3` and `remove_3` of
//! the schema) against the one queue rule every store follows
//! (`quorumlock_core::backend::holds`): for every queue of up to three
//! entries of the mutex-like kinds, and every queue of up to four single
//! permits of a semaphore of 1 to 3, with each entry's session alive or
//! dead, the head's release and a new entry's acquire (waiting, and
//! not), run by the server, leave the queue the rule says: dead entries
//! purged, the entries that hold granted (tokens kept, new ones above
//! every earlier token and growing along the queue), the new entry held,
//! waiting or not added. A queue with an entry of another kind is left to
//! the transactions: answered `slow` (null), nothing written.

mod common;

use std::sync::Arc;

use quorumlock_conformance::support::open_session;
use quorumlock_core::backend::holds;
use quorumlock_core::{LockClient, LockKind};
use quorumlock_postgres::PostgresBackend;
use tokio_postgres::Client;
use uuid::Uuid;

/// The server's release step.
const REMOVE: &str = "remove_3";

/// The server's acquire step.
const ENQUEUE: &str = "enqueue_3";

/// The stored kind codes of the mutex-like kinds and what they are.
const MUTEX_LIKE: [(&str, LockKind); 4] = [
    ("x", LockKind::Exclusive),
    ("w", LockKind::Write),
    ("e", LockKind::Election),
    ("u", LockKind::Upgradeable),
];

/// One queue: each entry's stored kind, permits, and whether its session
/// lives.
#[derive(Debug, Clone)]
struct Case {
    entries: Vec<(&'static str, i32, LockKind, bool)>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut kinds: Vec<Vec<(&'static str, i32, LockKind)>> = vec![Vec::new()];
    for _ in 0..3 {
        kinds = kinds
            .iter()
            .flat_map(|q| {
                MUTEX_LIKE.iter().map(move |&(c, k)| {
                    let mut q = q.clone();
                    q.push((c, 0, k));
                    q
                })
            })
            .collect();
        out.extend(with_lives(&kinds));
    }
    for permits in 1..=3 {
        let k = LockKind::Semaphore { permits };
        for len in 1..=4 {
            out.extend(with_lives(&[vec![("s", permits as i32, k); len]]));
        }
    }
    out
}

/// Every queue of `queues` with every choice of live and dead sessions.
fn with_lives(queues: &[Vec<(&'static str, i32, LockKind)>]) -> Vec<Case> {
    let mut out = Vec::new();
    for q in queues {
        for mask in 0..(1u32 << q.len()) {
            out.push(Case {
                entries: q
                    .iter()
                    .enumerate()
                    .map(|(i, &(c, p, k))| (c, p, k, mask & (1 << i) == 0))
                    .collect(),
            });
        }
    }
    out
}

struct Db {
    client: Client,
    s: String,
    timeline: i64,
}

/// An entry as written: its contender and token.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    contender: Uuid,
    token: Option<i64>,
}

impl Db {
    /// A session row, alive for an hour or dead a second ago.
    async fn session(&self, alive: bool) -> Uuid {
        self.session_row(Uuid::new_v4(), alive).await
    }

    /// [`Self::session`] with the id `id`.
    async fn session_row(&self, id: Uuid, alive: bool) -> Uuid {
        let secs: f64 = if alive { 3600.0 } else { -1.0 };
        self.client
            .execute(
                &format!(
                    "INSERT INTO {}.sessions (id, prefix, ttl_ms, expires) VALUES \
                     ($1, '', 3600000, clock_timestamp() + $2::float8 * interval '1 second')",
                    self.s
                ),
                &[&id, &secs],
            )
            .await
            .unwrap();
        id
    }

    /// Writes `case` as the queue of `lock`, its holders by the rule
    /// granted (in queue order): the rows.
    async fn build(&self, lock: &str, case: &Case) -> Vec<Row> {
        let kinds: Vec<LockKind> = case.entries.iter().map(|e| e.2).collect();
        let mut rows = Vec::new();
        for (i, &(code, permits, _, alive)) in case.entries.iter().enumerate() {
            let session = self.session(alive).await;
            let contender = Uuid::new_v4();
            let granted = holds(&kinds, i);
            let row = self
                .client
                .query_one(
                    &format!(
                        "INSERT INTO {s}.entries (lock, seq, contender, session, kind, permits, \
                         token, value) VALUES ($1, nextval('{s}.seq'), $2, $3, $4, $5, \
                         CASE WHEN $6 THEN ($7::bigint << 40) + nextval('{s}.seq') END, '') \
                         RETURNING token",
                        s = self.s
                    ),
                    &[
                        &lock,
                        &contender,
                        &session,
                        &code,
                        &permits,
                        &granted,
                        &self.timeline,
                    ],
                )
                .await
                .unwrap();
            rows.push(Row {
                contender,
                token: row.get(0),
            });
        }
        rows
    }

    /// The server's release step of `contender`: how many it removed,
    /// null for `slow`.
    async fn remove(&self, lock: &str, contender: Uuid) -> Option<i64> {
        self.client
            .query_one(
                &format!("SELECT {}.{REMOVE}($1, $2)", self.s),
                &[&lock, &contender],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// The server's acquire step of a new entry `me` of a live session:
    /// the outcome, the token, and when the entry ahead expires (ms).
    async fn enqueue(
        &self,
        lock: &str,
        me: Uuid,
        code: &str,
        permits: i32,
        wait: bool,
    ) -> (String, Option<i64>, Option<i64>) {
        let session = self.session(true).await;
        self.enqueue_in(lock, me, session, code, permits, wait)
            .await
    }

    /// [`Self::enqueue`] in the session `session`.
    async fn enqueue_in(
        &self,
        lock: &str,
        me: Uuid,
        session: Uuid,
        code: &str,
        permits: i32,
        wait: bool,
    ) -> (String, Option<i64>, Option<i64>) {
        let row = self
            .client
            .query_one(
                &format!(
                    "SELECT outcome, granted, ahead_ms \
                     FROM {}.{ENQUEUE}($1, $2, $3, $4, $5, ''::bytea, $6)",
                    self.s
                ),
                &[&lock, &me, &session, &code, &permits, &wait],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// Closes the client and drops the schema.
    async fn finish(self, client: LockClient) {
        client.close().await;
        self.client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.s))
            .await
            .unwrap();
    }

    async fn rows(&self, lock: &str) -> Vec<Row> {
        self.client
            .query(
                &format!(
                    "SELECT contender, token FROM {}.entries WHERE lock = $1 ORDER BY seq",
                    self.s
                ),
                &[&lock],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| Row {
                contender: r.get(0),
                token: r.get(1),
            })
            .collect()
    }
}

/// The name of a schema of the test's own.
fn scratch_schema() -> String {
    format!("qlsteps_{}", &Uuid::new_v4().simple().to_string()[..12])
}

/// A lock client of its own on `url`.
async fn connect(url: &str) -> LockClient {
    LockClient::new(Arc::new(PostgresBackend::connect(url).await.unwrap()))
}

/// A schema of its own, its tables and functions made by a client (kept
/// to the end); a plain connection to write and read it.
async fn scratch(base: &str) -> (LockClient, Db) {
    let schema = scratch_schema();
    let client = connect(&format!("{base}?schema={schema}")).await;
    open_session(&client).await;
    let raw = common::sql(base).await;
    let timeline = common::timeline(&raw).await;
    let db = Db {
        client: raw,
        s: format!("\"{schema}\""),
        timeline,
    };
    (client, db)
}

/// Checks that `after` is `expected` (the entries that should be left, in
/// order, with their kinds) granted by the rule: holders have tokens
/// (kept from `before`, or new ones above every token of `before` and
/// growing along the queue), waiters none.
fn check_granted(what: &str, before: &[Row], expected: &[(Uuid, LockKind)], after: &[Row]) {
    let contenders: Vec<Uuid> = after.iter().map(|r| r.contender).collect();
    let want: Vec<Uuid> = expected.iter().map(|e| e.0).collect();
    assert_eq!(contenders, want, "{what}: the entries left");
    let kinds: Vec<LockKind> = expected.iter().map(|e| e.1).collect();
    let highest = before.iter().filter_map(|r| r.token).max().unwrap_or(0);
    let mut last_new = highest;
    for (i, row) in after.iter().enumerate() {
        let was = before.iter().find(|r| r.contender == row.contender);
        match (holds(&kinds, i), row.token, was.and_then(|r| r.token)) {
            (true, Some(t), Some(old)) => assert_eq!(t, old, "{what}: entry {i} kept its token"),
            (true, Some(t), None) => {
                assert!(
                    t > last_new,
                    "{what}: entry {i}'s new token {t} after {last_new}"
                );
                last_new = t;
            }
            (holds, token, _) => assert!(
                !holds && token.is_none(),
                "{what}: entry {i} holds by the rule: {holds}, has token {token:?}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_steps_follow_the_queue_rule() {
    let Some(base) = common::base_url() else {
        return;
    };
    let (client, db) = scratch(&base).await;
    let cases = cases();
    for (n, case) in cases.iter().enumerate() {
        let what = |op: &str| format!("{op} on {:?}", case.entries);
        let survivors = |rows: &[Row], skip_head: bool| -> Vec<(Uuid, LockKind)> {
            rows.iter()
                .zip(&case.entries)
                .enumerate()
                .filter(|(i, (_, e))| e.3 && !(skip_head && *i == 0))
                .map(|(_, (r, e))| (r.contender, e.2))
                .collect()
        };

        // The head releases.
        let lock = format!("r{n}");
        let before = db.build(&lock, case).await;
        let removed = db.remove(&lock, before[0].contender).await;
        assert_eq!(removed, Some(1), "{}", what("release"));
        let after = db.rows(&lock).await;
        check_granted(&what("release"), &before, &survivors(&before, true), &after);

        // A new entry of the head's kind, waiting and not.
        for wait in [true, false] {
            let lock = format!("a{n}{wait}");
            let before = db.build(&lock, case).await;
            let (code, permits, kind, _) = case.entries[0];
            let me = Uuid::new_v4();
            let (outcome, granted, ahead_ms) = db.enqueue(&lock, me, code, permits, wait).await;
            let mut expected = survivors(&before, false);
            expected.push((me, kind));
            let kinds: Vec<LockKind> = expected.iter().map(|e| e.1).collect();
            let i = expected.len() - 1;
            let what = what(&format!("acquire (wait {wait})"));
            match (holds(&kinds, i), wait) {
                (true, _) => {
                    assert_eq!(outcome, "held", "{what}");
                    assert!(granted.is_some(), "{what}");
                }
                (false, true) => {
                    assert_eq!((outcome.as_str(), granted), ("wait", None), "{what}");
                    // The one it waits for lives an hour.
                    let ahead = ahead_ms.unwrap();
                    assert!((3_500_000..=3_600_000).contains(&ahead), "{what}: {ahead}");
                }
                (false, false) => {
                    assert_eq!(outcome, "busy", "{what}");
                    expected.pop();
                }
            }
            let after = db.rows(&lock).await;
            check_granted(&what, &before, &expected, &after);
            if let Some(t) = granted {
                assert_eq!(after.last().unwrap().token, Some(t), "{what}");
            }
        }
    }

    // A queue with a reader, an upgrade or a request of several permits:
    // left to the transactions, nothing written.
    for entries in [
        vec![("x", 0), ("r", 0)],
        vec![("r", 0), ("w", 0)],
        vec![("u", 0), ("gdeadbeef", 0)],
        vec![("s+", 2), ("s", 2)],
        vec![("s", 2), ("s", 3)],
    ] {
        let lock = format!("slow{entries:?}");
        let case = Case {
            entries: entries
                .iter()
                .map(|&(c, p)| (c, p, LockKind::Exclusive, true))
                .collect(),
        };
        // Written as given (granted by a mutex's rule: the head).
        let before = db.build(&lock, &case).await;
        let removed = db.remove(&lock, before[0].contender).await;
        let (code, p) = match entries[0] {
            ("s" | "s+", p) => ("s", p),
            _ => ("x", 0),
        };
        let (outcome, _, _) = db.enqueue(&lock, Uuid::new_v4(), code, p, true).await;
        assert_eq!((removed, outcome.as_str()), (None, "slow"), "{entries:?}");
        assert_eq!(db.rows(&lock).await, before, "{entries:?}: nothing written");
    }
    db.finish(client).await;
}

/// A release whose entry a session's end (a kill, `close`: they do not
/// take the queue's lock) removes while the release's step waits for the
/// row answers 0 removed, as the transaction counts it (the release then
/// fails with `LockLost`), not 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_entry_a_kill_removed_meanwhile_removes_nothing() {
    let Some(base) = common::base_url() else {
        return;
    };
    let (client, db) = scratch(&base).await;
    let case = Case {
        entries: vec![("x", 0, LockKind::Exclusive, true)],
    };
    let held = db.build("killed", &case).await;
    // The kill's transaction, its delete of the entry not committed yet.
    let mut killer = common::sql(&base).await;
    let kill = killer.transaction().await.unwrap();
    let deleted = kill
        .execute(
            &format!("DELETE FROM {}.entries WHERE contender = $1", db.s),
            &[&held[0].contender],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    // The release's step, waiting for the row.
    let release = tokio::spawn({
        let (url, s, contender) = (base.clone(), db.s.clone(), held[0].contender);
        async move {
            let c = common::sql(&url).await;
            c.query_one(
                &format!("SELECT {s}.{REMOVE}($1, $2)"),
                &[&"killed", &contender],
            )
            .await
            .unwrap()
            .get::<_, Option<i64>>(0)
        }
    });
    common::wait_for(
        "the release's step waits for the row",
        std::time::Duration::from_secs(10),
        || async {
            let waiting: i64 = db
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND query LIKE '%' || $1 || '%'",
                    &[&REMOVE],
                )
                .await
                .unwrap()
                .get(0);
            (waiting > 0).then_some(())
        },
    )
    .await;
    kill.commit().await.unwrap();
    assert_eq!(
        release.await.unwrap(),
        Some(0),
        "the release removed nothing"
    );
    db.finish(client).await;
}

/// Functions dropped while clients run (or that this user may not run):
/// the steps go to the transactions, and locks keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_when_the_functions_are_gone() {
    let Some(base) = common::base_url() else {
        return;
    };
    let schema = scratch_schema();
    let url = format!("{base}?schema={schema}");
    let (a, b) = (connect(&url).await, connect(&url).await);
    let held = a.lock("x").unwrap().acquire().await.unwrap();
    let raw = common::sql(&base).await;
    raw.batch_execute(&format!(
        "DROP FUNCTION \"{schema}\".{ENQUEUE}(text, uuid, uuid, text, integer, bytea, boolean); \
         DROP FUNCTION \"{schema}\".{REMOVE}(text, uuid)"
    ))
    .await
    .unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("x").unwrap().acquire().await }
    });
    common::wait_for(
        "the waiter queued",
        std::time::Duration::from_secs(10),
        || async { (a.inspect("x").await.unwrap().waiters.len() == 1).then_some(()) },
    )
    .await;
    held.release().await.unwrap();
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not granted")
        .unwrap()
        .unwrap();
    assert!(next.token() > 0);
    next.release().await.unwrap();
    assert!(a.inspect("x").await.unwrap().is_free());
    a.close().await;
    b.close().await;
    raw.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

/// A grant by the server's steps tells the token in its message to a
/// session of this version (its id a UUID of version 8), whose waiter
/// then reads nothing, and the contender alone to a session of an older
/// client (version 4), as the functions of version 2 did: clients of both
/// versions share a schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_tells_its_token_only_to_sessions_of_this_version() {
    use futures::StreamExt;
    use tokio_postgres::AsyncMessage;
    let Some(base) = common::base_url() else {
        return;
    };
    let (client, db) = scratch(&base).await;
    let (listener, mut conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut told) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
            }
        }
    });
    let this_version = uuid::Builder::from_custom_bytes(Uuid::new_v4().into_bytes()).into_uuid();
    for (session, with_token) in [(this_version, true), (Uuid::new_v4(), false)] {
        let lock = format!("told-{with_token}");
        let holder = Uuid::new_v4();
        assert_eq!(db.enqueue(&lock, holder, "x", 0, true).await.0, "held");
        db.session_row(session, true).await;
        let channel = format!("ql_{}", session.simple());
        listener
            .batch_execute(&format!("LISTEN \"{channel}\""))
            .await
            .unwrap();
        let waiter = Uuid::new_v4();
        let queued = db.enqueue_in(&lock, waiter, session, "x", 0, true).await;
        assert_eq!(queued.0, "wait");
        assert_eq!(db.remove(&lock, holder).await, Some(1));
        let message = tokio::time::timeout(std::time::Duration::from_secs(30), told.recv())
            .await
            .expect("no grant message within 30 s")
            .unwrap();
        let token = db.rows(&lock).await[0].token.expect("the waiter holds");
        let want = if with_token {
            format!("g {} {token}", waiter.simple())
        } else {
            format!("g {}", waiter.simple())
        };
        assert_eq!(message, (channel.clone(), want), "version 8: {with_token}");
        listener
            .batch_execute(&format!("UNLISTEN \"{channel}\""))
            .await
            .unwrap();
    }
    db.finish(client).await;
}

/// A waiter of this version, woken by its grant's message, holds on the
/// token the message told: it sends nothing between the holder's release
/// and its grant (before, it read its token in a statement of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_holds_without_a_statement_of_its_own() {
    let Some(base) = common::base_url() else {
        return;
    };
    let schema = scratch_schema();
    // Renewals every 8 hours: none inside the handoff.
    let url = format!("{base}?schema={schema}&ttl=24h");
    let (a, b) = (connect(&url).await, connect(&url).await);
    for c in [&a, &b] {
        open_session(c).await;
    }
    let held = a.lock("x").unwrap().acquire().await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("x").unwrap().acquire().await }
    });
    let raw = common::sql(&base).await;
    let entries = format!("SELECT count(*) FROM \"{schema}\".entries");
    common::wait_for(
        "the waiter's entry",
        std::time::Duration::from_secs(30),
        || async {
            let n: i64 = raw.query_one(&entries, &[]).await.unwrap().get(0);
            (n == 2).then_some(())
        },
    )
    .await;
    let before = b.backend().requests_sent();
    let first = held.token();
    held.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert_eq!(
        b.backend().requests_sent() - before,
        0,
        "statements the woken waiter sent"
    );
    let stored: i64 = raw
        .query_one(&format!("SELECT token FROM \"{schema}\".entries"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(granted.token(), stored as u64);
    assert!(granted.token() > first);
    granted.release().await.unwrap();
    for c in [a, b] {
        c.close().await;
    }
    raw.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

impl Db {
    /// One acquire and release of `lock` by `session` in a transaction of
    /// their own: the index entries of the queue's key that their scans
    /// returned, as the server counts them for that transaction
    /// (`pg_stat_get_xact_tuples_returned`, local to this connection, so
    /// no wait for the statistics to be flushed).
    async fn entries_read_by_one_cycle(&self, lock: &str, session: Uuid) -> i64 {
        // The backend's count not yet sent to the statistics (it is sent
        // only when the connection idles, never inside a transaction).
        let count = format!(
            "SELECT pg_stat_get_xact_tuples_returned('{}.entries_pkey'::regclass)",
            self.s
        );
        self.client.batch_execute("BEGIN").await.unwrap();
        let before: i64 = self.client.query_one(&count, &[]).await.unwrap().get(0);
        self.cycle(lock, session).await;
        let after: i64 = self.client.query_one(&count, &[]).await.unwrap().get(0);
        self.client.batch_execute("COMMIT").await.unwrap();
        after - before
    }

    /// One acquire of the free mutex `lock` by `session` (held at once),
    /// and its release, by the server's steps.
    async fn cycle(&self, lock: &str, session: Uuid) {
        let me = Uuid::new_v4();
        let (outcome, ..) = self.enqueue_in(lock, me, session, "x", 0, true).await;
        assert_eq!(outcome, "held", "the lock is free");
        assert_eq!(self.remove(lock, me).await, Some(1));
    }

    /// A table never analyzed (a new schema, autovacuum not yet come),
    /// grown by 20,000 entries of other locks that came and went: the
    /// planner takes a queue for 0.5 % of the table's rows, about a
    /// hundred, and reads one with a bitmap scan unless told not to.
    /// Autovacuum is kept off this table so it stays so for the test.
    async fn grow_with_dead_entries(&self, session: Uuid) {
        self.client
            .batch_execute(&format!(
                "ALTER TABLE {s}.entries SET (autovacuum_enabled = false); \
                 INSERT INTO {s}.entries (lock, seq, contender, session, kind, permits, value) \
                   SELECT 'other/' || i, nextval('{s}.seq'), gen_random_uuid(), '{session}', \
                          'x', 0, '' FROM generate_series(1, 20000) i; \
                 DELETE FROM {s}.entries WHERE lock LIKE 'other/%'",
                s = self.s
            ))
            .await
            .unwrap();
    }
}

/// Cycles of one lock in the tests of dead entries.
const CYCLES: i64 = 2_000;

/// Each acquire and release of a lock leaves a dead entry until a vacuum
/// removes it; a lock taken and given back thousands of times a second
/// has thousands. The steps' scans of the queue must not return each of
/// them at every call: a plain index scan marks the dead entries it meets
/// so that the next scan skips them, where a bitmap scan (the planner's
/// choice for a queue it thinks small) returns them all, every time, and
/// each step got slower until autovacuum came (one lock's acquire went
/// from 0.18 to 0.35 ms over 9,000 cycles, measured from a plain client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_locks_dead_entries_are_not_read_at_every_step() {
    let Some(base) = common::base_url() else {
        return;
    };
    let (client, db) = scratch(&base).await;
    let session = db.session(true).await;
    db.grow_with_dead_entries(session).await;
    for _ in 0..CYCLES {
        db.cycle("busy", session).await;
    }
    // A dead entry is marked only once no transaction can still see it:
    // another test's open transaction may hold that off for a while, so
    // look again until one cycle reads few (or give up with the count).
    let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut read = db.entries_read_by_one_cycle("busy", session).await;
    while read >= CYCLES / 20 && tokio::time::Instant::now() < give_up {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        read = db.entries_read_by_one_cycle("busy", session).await;
    }
    assert!(
        read < CYCLES / 20,
        "one acquire and release of a lock with {CYCLES} dead entries read {read} of its index's entries"
    );
    assert!(read > 0, "the server counts what the scans read");
    db.finish(client).await;
}

/// The same for the steps the transactions in Rust take (a reader here;
/// upgrades and requests of several permits too, and every step where
/// the functions could not be made): their purge and their read of the
/// queue run on the client's own connections. Counted from the server's
/// statistics of the queue's index, which a connection sends once idle
/// (within ten seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_read_locks_dead_entries_are_not_read_at_every_step() {
    let Some(base) = common::base_url() else {
        return;
    };
    let (client, db) = scratch(&base).await;
    let session = db.session(true).await;
    db.grow_with_dead_entries(session).await;
    let returned = format!(
        "SELECT idx_tup_read FROM pg_stat_user_indexes \
         WHERE indexrelid = '{}.entries_pkey'::regclass",
        db.s
    );
    let read = || async {
        db.client
            .query_one(&returned, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let before = read().await;
    let lock = client.rwlock("busy").unwrap();
    for _ in 0..CYCLES {
        lock.read().await.unwrap().release().await.unwrap();
    }
    // Sent once the client's connections idle: wait until the count
    // stops moving for longer than the server waits to send it.
    let mut after = read().await;
    let mut still_since = tokio::time::Instant::now();
    let give_up = still_since + std::time::Duration::from_secs(60);
    while still_since.elapsed() < std::time::Duration::from_secs(12)
        && tokio::time::Instant::now() < give_up
    {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let now = read().await;
        if now != after {
            (after, still_since) = (now, tokio::time::Instant::now());
        }
    }
    let per_cycle = (after - before) / CYCLES;
    assert!(
        per_cycle < CYCLES / 20,
        "{CYCLES} read locks taken and given back read {per_cycle} of the queue's index \
         entries each, with up to {CYCLES} of them dead"
    );
    assert!(after > before, "the server counts what the scans read");
    db.finish(client).await;
}

/// A schema whose steps an earlier version made, without
/// `enable_bitmapscan = off` (see the test above) or without
/// `plan_cache_mode = force_generic_plan`: the first client of this
/// version replaces them, and locks go on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_made_without_a_setting_of_this_version_are_replaced() {
    let Some(base) = common::base_url() else {
        return;
    };
    let schema = scratch_schema();
    let url = format!("{base}?schema={schema}");
    let old = connect(&url).await;
    open_session(&old).await;
    let raw = common::sql(&base).await;
    for (setting, value) in [
        ("enable_bitmapscan", "off"),
        ("plan_cache_mode", "force_generic_plan"),
    ] {
        let settings = format!(
            "SELECT count(*) FROM pg_proc WHERE oid IN \
             ('\"{schema}\".{ENQUEUE}(text,uuid,uuid,text,integer,bytea,boolean)'::regprocedure, \
              '\"{schema}\".{REMOVE}(text,uuid)'::regprocedure) \
             AND '{setting}={value}' = ANY(proconfig)"
        );
        let with_setting = || async {
            raw.query_one(&settings, &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
        };
        assert_eq!(with_setting().await, 2, "made with {setting}");
        raw.batch_execute(&format!(
            "ALTER FUNCTION \"{schema}\".{ENQUEUE}(text, uuid, uuid, text, integer, bytea, boolean) \
               RESET {setting}; \
             ALTER FUNCTION \"{schema}\".{REMOVE}(text, uuid) RESET {setting}"
        ))
        .await
        .unwrap();
        assert_eq!(with_setting().await, 0, "as an earlier version made them");
        let new = connect(&url).await;
        let g = new.lock("x").unwrap().acquire().await.unwrap();
        assert_eq!(
            with_setting().await,
            2,
            "{setting} put back by the new client"
        );
        g.release().await.unwrap();
        new.close().await;
        // The client that found them current when it started goes on
        // using them as they are now.
        let g = old.lock("x").unwrap().acquire().await.unwrap();
        g.release().await.unwrap();
    }
    old.close().await;
    raw.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}
