//! What the PostgreSQL tests that start their own processes share: the
//! test server's URL, the server binaries of `scripts/stores.sh`, running
//! a program as the `postgres` user when we are root (PostgreSQL and
//! pgbouncer refuse to run as root), scratch directories it owns, free
//! ports, and waiting for an event with a deadline.

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Whether a missing store or binary must fail the test.
pub fn require() -> bool {
    std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1")
}

/// The shared test server's URL, or a loud skip (a panic under
/// `QUORUMLOCK_TEST_REQUIRE=1`).
pub fn base_url() -> Option<String> {
    match std::env::var("QUORUMLOCK_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if require() => {
            panic!("QUORUMLOCK_TEST_POSTGRES_URL is not set and QUORUMLOCK_TEST_REQUIRE=1")
        }
        _ => {
            eprintln!("SKIPPED: QUORUMLOCK_TEST_POSTGRES_URL is not set");
            None
        }
    }
}

/// A program the test needs: `$var`, else `default`; missing, a loud
/// skip (a panic under `QUORUMLOCK_TEST_REQUIRE=1`).
pub fn binary(var: &str, default: &str) -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var(var).unwrap_or_else(|_| default.to_string()));
    if p.is_file() {
        return Some(p);
    }
    let why = format!(
        "{} is missing (set {var}, or install it with scripts/stores.sh install postgres)",
        p.display()
    );
    if require() {
        panic!("{why}; QUORUMLOCK_TEST_REQUIRE=1");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// The PostgreSQL server binaries (`initdb`, `pg_ctl`, `pg_basebackup`).
pub fn pg_bin_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(
        std::env::var("QUORUMLOCK_PG_BIN_DIR")
            .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_string()),
    );
    for b in ["initdb", "pg_ctl", "pg_basebackup"] {
        if !dir.join(b).is_file() {
            let why = format!(
                "{} is missing (set QUORUMLOCK_PG_BIN_DIR, or run scripts/stores.sh install postgres)",
                dir.join(b).display()
            );
            if require() {
                panic!("{why}; QUORUMLOCK_TEST_REQUIRE=1");
            }
            eprintln!("SKIPPED: {why}");
            return None;
        }
    }
    Some(dir)
}

fn is_root() -> bool {
    // No libc here: /proc/self/status has the effective uid second.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `program args...`, as the `postgres` user when we are root (as
/// scripts/stores.sh runs the server: setpriv execs, so the process is
/// the program itself).
pub fn as_postgres(program: impl AsRef<Path>) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ]);
        c.arg(program.as_ref());
        c
    } else {
        Command::new(program.as_ref())
    }
}

/// Runs `cmd` to its end; panics with its output if it failed.
pub fn run(mut cmd: Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A scratch directory under the temp dir, owned by the `postgres` user
/// when we are root (mode 0700), removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "quorumlock-{what}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let s = Scratch(dir);
        s.own();
        s
    }

    /// Hands everything in it to the `postgres` user (after writing
    /// files into it as root).
    pub fn own(&self) {
        if is_root() {
            let mut c = Command::new("chown");
            c.args(["-R", "postgres:postgres"]).arg(&self.0);
            run(c);
        }
        let mut c = Command::new("chmod");
        c.arg("700").arg(&self.0);
        run(c);
    }

    pub fn path(&self, leaf: &str) -> PathBuf {
        self.0.join(leaf)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `probe` every 50 ms until it gives `Some`, for at most `within`
/// (a wide bound: the event is what the test waits for).
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let give_up = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plain connection of the test's own (no lock backend), its messages
/// driven by a task.
pub async fn sql(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(conn);
    c
}

/// The server's current WAL timeline, as the backend puts it into tokens.
pub async fn timeline(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// A plain connection, or `None` while the server does not answer.
pub async fn try_sql(url: &str) -> Option<tokio_postgres::Client> {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(c)
}

/// A namespace of its own for one test.
pub fn namespace(what: &str) -> String {
    format!(
        "{what}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Steps the server's clock forward by `by` for the sessions of namespace
/// `ns` and under it, in the default schema, on the server of
/// `QUORUMLOCK_TEST_POSTGRES_URL`: each session's `expires` (an absolute
/// time of the server's clock) moves `by` earlier, as a step of that
/// clock acts on it. The fault explorer's clock step.
pub async fn step_namespace_clock(ns: String, by: std::time::Duration) -> Result<(), String> {
    let base = base_url().ok_or("QUORUMLOCK_TEST_POSTGRES_URL is not set")?;
    let (c, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let stepped = c
        .execute(
            "UPDATE quorumlock.sessions \
             SET expires = expires - $2::bigint * interval '1 millisecond' \
             WHERE prefix LIKE $1 || '/%'",
            &[&ns, &(by.as_millis() as i64)],
        )
        .await
        .map_err(|e| e.to_string())?;
    match stepped {
        0 => Err(format!("no session of {ns}")),
        _ => Ok(()),
    }
}
