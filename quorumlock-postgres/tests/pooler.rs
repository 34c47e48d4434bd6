//! A real pgbouncer (Debian's, installed by `scripts/stores.sh`) between
//! the backend and the test server, started here as the `postgres` user
//! (it refuses to run as root) from a config in a scratch directory:
//! in transaction mode `connect()` refuses it with `InvalidArgument` (a
//! session's statements would be split over server connections); in
//! session mode locks work, wake-ups by `LISTEN`/`NOTIFY` included.

mod common;

use std::process::Stdio;
use std::time::Duration;

use quorumlock_conformance::support::free_port;
use quorumlock_core::{ErrorKind, LockClient};
use quorumlock_postgres::PostgresBackend;
use tokio::process::{Child, Command};

const SETTLE: Duration = Duration::from_secs(20);

/// A pgbouncer in `mode` in front of the server of `base`; killed on
/// drop.
struct Bouncer {
    _child: Child,
    port: u16,
    database: String,
    dir: common::Scratch,
}

impl Bouncer {
    async fn start(base: &str, mode: &str) -> Option<Bouncer> {
        let bin = common::binary("QUORUMLOCK_PGBOUNCER", "/usr/sbin/pgbouncer")?;
        let url = quorumlock_core::url::parse(base).unwrap();
        let (host, port) = (url.host_str().unwrap(), url.port().unwrap_or(5432));
        let database = url.path().trim_start_matches('/').to_string();
        let user = match url.username() {
            "" => "postgres",
            u => u,
        };
        let dir = common::Scratch::new("pgbouncer");
        let listen = free_port();
        // Authentication is the server's: trust on loopback for the test
        // server, so the pooler trusts the users it lists.
        std::fs::write(dir.path("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        std::fs::write(
            dir.path("pgbouncer.ini"),
            format!(
                "[databases]\n\
                 {database} = host={host} port={port} dbname={database}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {listen}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = {mode}\n\
                 max_client_conn = 200\n\
                 default_pool_size = 100\n",
                users = dir.path("users.txt").display(),
            ),
        )
        .unwrap();
        dir.own();
        let log = std::fs::File::create(dir.path("log")).unwrap();
        let mut cmd: Command = common::as_postgres(&bin).into();
        let child = cmd
            .arg(dir.path("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting pgbouncer");
        let b = Bouncer {
            _child: child,
            port: listen,
            database,
            dir,
        };
        common::wait_for("pgbouncer listening", SETTLE, || async {
            tokio::net::TcpStream::connect(("127.0.0.1", listen))
                .await
                .ok()
                .map(drop)
        })
        .await;
        Some(b)
    }

    fn url(&self, ns: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}/{ns}?ttl=3s",
            self.port, self.database
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path("log")).unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_is_refused_at_connect() {
    let Some(base) = common::base_url() else {
        return;
    };
    let Some(bouncer) = Bouncer::start(&base, "transaction").await else {
        return;
    };
    let err = PostgresBackend::connect(bouncer.url(&common::namespace("qlpool")))
        .await
        .expect_err("connect() accepted a pooler in transaction mode");
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidArgument,
        "{err}\npgbouncer's log:\n{}",
        bouncer.log()
    );
    assert!(err.to_string().contains("pool_mode = session"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_works() {
    let Some(base) = common::base_url() else {
        return;
    };
    let Some(bouncer) = Bouncer::start(&base, "session").await else {
        return;
    };
    let ns = common::namespace("qlpool");
    let connect = || async {
        PostgresBackend::connect(bouncer.url(&ns))
            .await
            .unwrap_or_else(|e| panic!("{e}\npgbouncer's log:\n{}", bouncer.log()))
    };
    let a = LockClient::new(std::sync::Arc::new(connect().await));
    let b = LockClient::new(std::sync::Arc::new(connect().await));
    let held = a.lock("p").unwrap().acquire().await.unwrap();
    // A waiter behind the holder: woken by the release's NOTIFY, which
    // reaches its listener through the pooler.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("p").unwrap().acquire_timeout(SETTLE).await })
    };
    common::wait_for("the waiter queued", SETTLE, || async {
        let s = a.inspect("p").await.unwrap();
        (s.waiters.len() == 1).then_some(())
    })
    .await;
    let first = held.token();
    held.release().await.unwrap();
    let next = waiter.await.unwrap().expect("the waiter was not granted");
    assert!(next.token() > first, "{} after {first}", next.token());
    assert!(next.is_held());
    next.release().await.unwrap();
    a.close().await;
    b.close().await;
    assert!(a.backend().leftovers().await.unwrap().is_empty());
}
