//! Failover on a real primary with a streaming standby, both started here
//! from the server binaries of `scripts/stores.sh` (as the `postgres`
//! user), the standby made by `pg_basebackup`:
//!
//! - synchronous replication (`synchronous_standby_names`,
//!   `synchronous_commit = on`): a lock is held, the standby promoted and
//!   the old primary stopped; a client of the new primary finds the lock
//!   held by the old grant (its token), and the next grant's token is
//!   above it;
//! - asynchronous replication, grants made while the standby's stream is
//!   cut (so they are certainly not replicated), more than the 32
//!   sequence values the standby's last sequence record logged ahead:
//!   after the promotion the holders are told of their loss (their
//!   session cannot renew on the stopped primary), the lock is free on
//!   the new primary, and every token granted there is above every lost
//!   grant's (the new timeline is in the token's high bits).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{NetControl, NetMode, TcpProxy};
use quorumlock_conformance::support::free_port;
use quorumlock_core::LockClient;
use quorumlock_postgres::PostgresBackend;

const SETTLE: Duration = Duration::from_secs(20);
const TTL: &str = "2s";

/// One server: its data directory and port; stopped (immediate) on drop.
struct Server {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    running: bool,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres{path}", self.port)
    }

    fn pg_ctl(&self) -> Command {
        let mut c = common::as_postgres(self.bin.join("pg_ctl"));
        c.arg("-D").arg(&self.data);
        c
    }

    /// Starts it and waits until it accepts connections.
    fn start(&mut self, sockets: &Path, settings: &[String]) {
        let mut o = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c fsync=off -c full_page_writes=off -c max_connections=100 -c shared_buffers=16MB",
            self.port,
            sockets.display()
        );
        for s in settings {
            o.push_str(" -c ");
            o.push_str(s);
        }
        let mut c = self.pg_ctl();
        c.arg("-l")
            .arg(self.data.with_extension("log"))
            .args(["-w", "-t", "60", "-o", &o, "start"]);
        common::run(c);
        self.running = true;
    }

    /// `pg_ctl stop -m immediate`: as a crash (no shutdown checkpoint).
    fn stop(&mut self) {
        let mut c = self.pg_ctl();
        c.args(["-m", "immediate", "-w", "stop"]);
        common::run(c);
        self.running = false;
    }

    fn promote(&self) {
        let mut c = self.pg_ctl();
        c.args(["-w", "-t", "60", "promote"]);
        common::run(c);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.running {
            let _ = self
                .pg_ctl()
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
    }
}

/// A primary and its standby (which streams from `upstream` of the
/// primary's port: a proxy in between, or the primary itself).
struct Pair {
    primary: Server,
    standby: Server,
    _dir: common::Scratch,
}

impl Pair {
    /// The primary on `port` (initdb, started with `settings`), then the
    /// standby by `pg_basebackup`, streaming as `application_name =
    /// standby` from `upstream` (the primary's port, or a proxy's to it).
    /// `None`: the binaries are missing (a loud skip).
    async fn start(
        settings: &[String],
        port: u16,
        upstream: u16,
        sync_state: &str,
    ) -> Option<Pair> {
        let bin = common::pg_bin_dir()?;
        let dir = common::Scratch::new("failover");
        let mut primary = Server {
            bin: bin.clone(),
            data: dir.path("primary"),
            port,
            running: false,
        };
        let mut initdb = common::as_postgres(bin.join("initdb"));
        initdb.arg("-D").arg(&primary.data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        common::run(initdb);
        primary.start(&dir.0, settings);

        let mut standby = Server {
            bin: bin.clone(),
            data: dir.path("standby"),
            port: free_port(),
            running: false,
        };
        let mut backup = common::as_postgres(bin.join("pg_basebackup"));
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ])
            .arg("-p")
            .arg(primary.port.to_string())
            .arg("-D")
            .arg(&standby.data);
        common::run(backup);
        std::fs::write(standby.data.join("standby.signal"), "").unwrap();
        // The standby's own settings, last in its auto.conf (which
        // pg_basebackup copied from the primary): no synchronous standby
        // of its own once promoted.
        let mut auto =
            std::fs::read_to_string(standby.data.join("postgresql.auto.conf")).unwrap_or_default();
        auto.push_str(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={upstream} user=postgres application_name=standby'\n\
             synchronous_standby_names = ''\n"
        ));
        std::fs::write(standby.data.join("postgresql.auto.conf"), auto).unwrap();
        dir.own();
        standby.start(&dir.0, &[]);

        let pair = Pair {
            primary,
            standby,
            _dir: dir,
        };
        let db = common::sql(&pair.primary.url("")).await;
        common::wait_for("the standby streaming", SETTLE, || async {
            let r = db
                .query_opt(
                    "SELECT sync_state FROM pg_stat_replication \
                     WHERE application_name = 'standby' AND state = 'streaming'",
                    &[],
                )
                .await
                .unwrap()?;
            (r.get::<_, String>(0) == sync_state).then_some(())
        })
        .await;
        Some(pair)
    }
}

async fn client(url: &str) -> LockClient {
    LockClient::new(Arc::new(PostgresBackend::connect(url).await.unwrap()))
}

/// The sequence of tokens as one server has it: `(last_value, log_cnt,
/// is_called)`.
async fn sequence(url: &str) -> (i64, i64, bool) {
    let db = common::sql(url).await;
    let r = db
        .query_one(
            "SELECT last_value, log_cnt, is_called FROM quorumlock.seq",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_standby_keeps_the_grant() {
    if common::base_url().is_none() {
        return;
    }
    let settings = [
        "synchronous_standby_names=standby".to_string(),
        "synchronous_commit=on".to_string(),
    ];
    let port = free_port();
    let Some(mut pair) = Pair::start(&settings, port, port, "sync").await else {
        return;
    };
    let ns = common::namespace("qlfail");
    let holder = client(&pair.primary.url(&format!("/{ns}?ttl={TTL}"))).await;
    let g = holder.lock("f").unwrap().acquire().await.unwrap();
    let token = g.token();

    pair.standby.promote();
    pair.primary.stop();

    // Nothing lost: the new primary has the old grant.
    let next = client(&pair.standby.url(&format!("/{ns}?ttl={TTL}"))).await;
    let state = next.inspect("f").await.unwrap();
    assert_eq!(state.holders.len(), 1, "the grant was lost: {state:?}");
    assert_eq!(state.holders[0].token, token);
    // The old holder cannot renew on the stopped primary: it is told,
    // and the next grant on the new primary comes after its session
    // expired there, with a token above the old one.
    let reason = tokio::time::timeout(SETTLE, g.lost())
        .await
        .expect("the holder was not told of its loss");
    eprintln!("the holder's loss: {reason:?}");
    let g2 = next
        .lock("f")
        .unwrap()
        .acquire_timeout(SETTLE)
        .await
        .unwrap();
    assert!(!g.is_held());
    assert!(g2.token() > token, "token {} after {token}", g2.token());
    g2.release().await.unwrap();
    next.close().await;
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_standby_loses_the_grant_the_holder_is_told_tokens_stay_above() {
    if common::base_url().is_none() {
        return;
    }
    let settings = ["synchronous_commit=on".to_string()];
    let port = free_port();
    // The standby streams through a proxy, to cut its stream at will.
    let proxy = Arc::new(
        TcpProxy::start(([127, 0, 0, 1], port).into())
            .await
            .unwrap(),
    );
    let upstream = proxy.addr().port();
    let Some(mut pair) = Pair::start(&settings, port, upstream, "async").await else {
        return;
    };
    let ns = common::namespace("qlfail");
    let url = |s: &Server| s.url(&format!("/{ns}?ttl={TTL}"));
    let holder = client(&url(&pair.primary)).await;
    // A first grant, replicated: the standby has it and the sequence's
    // state that gave its token.
    let first = holder.lock("warm").unwrap().acquire().await.unwrap();
    let replicated = first.token();
    first.release().await.unwrap();
    let primary_db = common::sql(&pair.primary.url("")).await;
    let lsn: String = primary_db
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let standby_db = common::sql(&pair.standby.url("")).await;
    common::wait_for("the standby replayed the first grant", SETTLE, || async {
        let r = standby_db
            .query_one(
                "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                &[&lsn],
            )
            .await
            .unwrap();
        r.get::<_, bool>(0).then_some(())
    })
    .await;

    // The stream cut: the walsender gone from the primary.
    proxy.set_mode(NetMode::Cut);
    common::wait_for("the standby's stream cut", SETTLE, || async {
        primary_db
            .query_opt(
                "SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby'",
                &[],
            )
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    // Two grants lost with the stream: one within the 32 values the
    // standby's sequence record logged ahead, one past them (after 40
    // more values, 20 lock cycles, on the primary alone).
    let g = holder.lock("f").unwrap().acquire().await.unwrap();
    let lost_token = g.token();
    for _ in 0..20 {
        let c = holder.lock("burst").unwrap().acquire().await.unwrap();
        c.release().await.unwrap();
    }
    let far = holder.lock("far").unwrap().acquire().await.unwrap();
    let far_token = far.token();
    let on_primary = sequence(&pair.primary.url("")).await;
    let on_standby = sequence(&pair.standby.url("")).await;
    eprintln!(
        "tokens: replicated grant {replicated}, unreplicated grants {lost_token} and {far_token}; \
         sequence (last_value, log_cnt, is_called) on the primary {on_primary:?}, \
         on the standby {on_standby:?}"
    );
    // The scenario goes past what the standby's sequence has: the
    // sequence part of the far grant's token (its low 40 bits) is above
    // the standby's `last_value`, which a promoted standby continues from.
    assert!(
        (far_token & ((1 << 40) - 1)) as i64 > on_standby.0,
        "the unreplicated grants did not go past the standby's sequence: {far_token}, {on_standby:?}"
    );
    drop(primary_db);
    drop(standby_db);

    pair.standby.promote();
    pair.primary.stop();
    // The timeline the grants read (the WAL insert timeline) is the new
    // one at once; the last checkpoint's may still be the old one until
    // the end-of-recovery checkpoint is done.
    let new_db = common::sql(&pair.standby.url("")).await;
    let r = new_db
        .query_one(
            "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint, \
               (pg_control_checkpoint()).timeline_id::int8",
            &[],
        )
        .await
        .unwrap();
    let (timeline, checkpoint): (i64, i64) = (r.get(0), r.get(1));
    eprintln!(
        "after the promotion: WAL insert timeline {timeline}, last checkpoint's {checkpoint}"
    );
    assert_eq!(timeline, 2);

    // The loss is reported to the holder.
    let reason = tokio::time::timeout(SETTLE, g.lost())
        .await
        .expect("the holder was not told of its loss");
    eprintln!("the holder's loss: {reason:?}");
    assert!(!g.is_held());
    tokio::time::timeout(SETTLE, far.lost())
        .await
        .expect("the second holder was not told of its loss");

    // The grant is gone on the new primary: the lock is free at once.
    let next = client(&url(&pair.standby)).await;
    let state = next.inspect("f").await.unwrap();
    assert!(state.holders.is_empty(), "{state:?}");
    let g2 = next
        .lock("f")
        .unwrap()
        .acquire_timeout(SETTLE)
        .await
        .unwrap();
    eprintln!(
        "next token on the promoted standby {}, the lost grant's {lost_token}",
        g2.token()
    );
    assert!(g2.token() > replicated, "{} after {replicated}", g2.token());
    // The line: the next token is above the lost grants', both
    // the one within the 32 values the standby's sequence record logged
    // ahead and the one past them (the sequence alone, before the
    // timeline was in the token, gave 37 here after a lost 46).
    let highest_lost = lost_token.max(far_token);
    assert!(
        g2.token() > highest_lost,
        "the promoted standby's token {} is not above the lost grants' {lost_token} and {far_token}",
        g2.token()
    );
    let far2 = next
        .lock("far")
        .unwrap()
        .acquire_timeout(SETTLE)
        .await
        .unwrap();
    eprintln!(
        "next token of \"far\" on the promoted standby {}, its lost grant's {far_token}",
        far2.token()
    );
    assert!(
        far2.token() > highest_lost,
        "the promoted standby's token {} is not above the lost grant's {far_token}",
        far2.token()
    );
    // Each token carries its server's timeline above the sequence: the
    // old primary's 1, the promoted standby's 2.
    assert_eq!(highest_lost >> 40, 1, "{highest_lost}");
    assert_eq!(g2.token() >> 40, 2, "{}", g2.token());
    assert_eq!(far2.token() >> 40, 2, "{}", far2.token());
    far2.release().await.unwrap();
    g2.release().await.unwrap();
    next.close().await;
    drop(holder);
}
