//! Small helpers the backends' own tests share: the store variables under
//! `QUORUMLOCK_TEST_REQUIRE`, fresh namespaces and free ports for servers
//! a test starts itself.

pub use crate::harness::require;

/// The value of `var`, or a loud skip (`None`); a panic when
/// `QUORUMLOCK_TEST_REQUIRE=1`.
pub fn env_or_skip(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if require() => panic!("{var} is not set and QUORUMLOCK_TEST_REQUIRE=1"),
        _ => {
            eprintln!("SKIPPED: {var} is not set; start the stores with scripts/stores.sh up");
            None
        }
    }
}

/// A namespace no other test uses: `prefix-` and 12 hex digits.
pub fn unique_namespace(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A loopback port free right now, for a server the test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// With `QUORUMLOCK_TEST_LOG` set (a `tracing` filter, e.g.
/// `quorumlock_etcd=debug,quorumlock_core=debug`), the clients' diagnostics go to
/// stderr: what a failing fault scenario needs to be understood.
pub fn trace_from_env() {
    if let Ok(filter) = std::env::var("QUORUMLOCK_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// The current leader of election `name` as `client` reads it; panics if
/// there is none (the election tests compare its value and token).
pub async fn leader_of(
    client: &quorumlock_core::LockClient,
    name: &str,
) -> quorumlock_core::Leader {
    client
        .election(name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("election {name} has no leader"))
}
