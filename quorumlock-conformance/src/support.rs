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

/// Opens `client`'s session (a session opens with the first acquire) by
/// taking and giving back a lock `warm` of its own, so that what a test
/// does or measures next does not pay for it.
pub async fn open_session(client: &quorumlock_core::LockClient) {
    let warm = client.lock("warm").unwrap().acquire().await.unwrap();
    warm.release().await.unwrap();
}

/// A namespace no other test uses: `prefix-` and 12 hex digits.
pub fn unique_namespace(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Where [`free_port`] looks: below Linux's ephemeral range (see
/// [`server_ports`]), above the stores' fixed ports (`scripts/stores.sh`:
/// 2181 to 18500; `docker/compose-cluster.yml`: up to 24793) and
/// Consul's Connect ranges (21000 to 21755).
const SERVER_PORTS: std::ops::Range<u16> = 25_000..32_000;

/// [`SERVER_PORTS`], cut where this machine's ephemeral range begins
/// (`ip_local_port_range`; 32768 by default). A machine whose range
/// begins lower than that leaves the whole of it: there, an outgoing
/// connection can take a port handed out before the server binds it.
fn server_ports() -> std::ops::Range<u16> {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok());
    match ephemeral {
        Some(low) if low > SERVER_PORTS.start + 1_000 => {
            SERVER_PORTS.start..SERVER_PORTS.end.min(low)
        }
        _ => SERVER_PORTS,
    }
}

/// A loopback port for a server the test starts: free now, and one that
/// nothing else takes before the server binds it. A port from `bind(0)`
/// is an ephemeral one, which the kernel also gives to any outgoing
/// connection (a probe, a peer's dial) and to a proxy's `bind(0)`: a
/// ZooKeeper ensemble member whose election port goes that way exits
/// (code 14) and its ensemble never serves, as one did in a full run.
/// This one lies outside that range, and this process never hands it out
/// twice.
pub fn free_port() -> u16 {
    use rand::Rng;
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let mut given = GIVEN.get_or_init(Mutex::default).lock().unwrap();
    let mut rng = rand::thread_rng();
    let ports = server_ports();
    for _ in 0..1000 {
        let port = rng.gen_range(ports.clone());
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {ports:?} after 1000 tries");
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
