//! Checks for a backend whose repeat acquire infers "nobody else is in
//! line" from a cluster-wide write counter (etcd's revision, Consul's raft
//! index; `quorumlock_core::backend::QuietGrants`) instead of reading the lock. Any write
//! on the server changes what such an acquire does, so these run one at a
//! time ([`serially`]) and from [`quiet_repeat_suite!`](crate::quiet_repeat_suite).

use std::future::Future;

use quorumlock_core::LockClient;

use crate::Harness;

/// Runs `f` while no other caller of `serially` in this process runs: the
/// tests of one binary run in parallel, and each one's writes would break
/// the others' quiet cycles.
pub async fn serially<F: Future>(f: F) -> F::Output {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one_at_a_time = SERIAL.lock().await;
    f.await
}

/// One try-acquire and release of the mutex `name`: the store requests it
/// sent.
pub async fn cycle(client: &LockClient, name: &str) -> u64 {
    let before = client.backend().requests_sent();
    let g = client.lock(name).unwrap().try_acquire().await.unwrap();
    g.release().await.unwrap();
    client.backend().requests_sent() - before
}

/// A repeat acquire leaves out its read only after a cycle that found the
/// cluster quiet: a write anywhere in between (here another client's
/// lock) makes it read the lock after all, one request more (3 for the
/// cycle); with a write before every cycle (a busy cluster) the read stays
/// in the acquire and every cycle is two requests. Call it [`serially`].
pub async fn reads_only_after_quiet_cycles(h: &Harness) {
    let case = h.case();
    let (ours, other) = (case.client().await, case.client().await);
    let write_elsewhere = || async {
        cycle(&other, "elsewhere").await;
    };
    cycle(&ours, "repeat").await; // opens the session
    let mut after_write = Vec::new();
    for _ in 0..10 {
        cycle(&ours, "repeat").await;
        cycle(&ours, "repeat").await; // quiet: the next one skips its read
        write_elsewhere().await;
        after_write.push(cycle(&ours, "repeat").await);
    }
    let mut busy = Vec::new();
    for _ in 0..10 {
        write_elsewhere().await;
        busy.push(cycle(&ours, "repeat").await);
    }
    eprintln!("requests per cycle after a write: {after_write:?}, busy: {busy:?}");
    // The server's own writes (a lease or session of an earlier test
    // expiring) may also come in between: most, not all.
    let threes = after_write.iter().filter(|n| **n == 3).count();
    assert!(threes >= 7, "cycles after another write: {after_write:?}");
    assert!(busy[1..].iter().all(|n| *n == 2), "busy cycles: {busy:?}");
    case.finish().await;
}

/// The conformance cases that put another client in line between a
/// client's repeated cycles, run [`serially`](crate::repeat::serially):
/// on a quiet server the inference is really used (in the parallel suite
/// other cases' writes often keep it from being), and must not grant.
/// `$harness`: an `Option<Harness>` expression, as for [`suite!`](crate::suite).
#[macro_export]
macro_rules! quiet_repeat_suite {
    ($harness:expr) => {
        mod quiet_repeat {
            use super::*;
            $crate::__quorumlock_conformance_quiet!($harness;
                holder_between_repeated_cycles,
                rw_reader_between_repeated_mutex_cycles,
                rw_writer_after_reads_shared_with_another_client
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __quorumlock_conformance_quiet {
    ($h:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::repeat::serially(async {
                    let Some(harness) = $h else { return };
                    $crate::cases::$case(&harness).await;
                })
                .await;
            }
        )*
    };
}
