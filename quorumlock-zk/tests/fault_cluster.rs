//! The shared cluster scenarios (leader killed, whole cluster paused or
//! restarted while a lock is held) on a three-server ZooKeeper ensemble
//! that the test starts on 127.0.0.2-4 (tickTime 200 ms). Runs only with
//! `cargo test -- --include-ignored` (scripts/chaos.sh). Sessions ask for 4 s: an election takes
//! well under that here, so a holder usually keeps its lock through a
//! leader's death, and the pause and restart scenarios stay short.

quorumlock_conformance::cluster_fault_suite!(
    quorumlock_conformance::faults::StoreKind::Zk,
    |url| async move { Ok(std::sync::Arc::new(quorumlock_zk::ZkBackend::connect(&url).await?) as _) },
    "session_timeout",
    "4s"
);
