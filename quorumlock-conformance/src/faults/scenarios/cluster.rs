//! Whole-cluster faults (chaos.sh): the leader killed, the cluster paused or restarted while a lock is held.

use super::super::Cluster;
use super::*;

/// The leader of a three-node cluster is killed (-9) while a holder holds
/// and two waiters queue, then restarted. The holder either keeps its
/// lock or is told it lost it; the waiters are served afterwards; no
/// overlap, nothing left behind.
pub async fn leader_killed_while_held(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    let mut s = Scene::new(t, "leader_killed_while_held").await;
    let (a, b, c) = (s.client().await, s.client().await, s.client().await);
    let ga = acquire(&a, s.soon()).await;
    let tra = s.history.track("a", &ga);
    s.register.write("a", ga.token()).expect("first write");
    let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
    let wb = s.waiter_retrying(&b, "b", s.soon() * 3, Some(retries.clone()));
    s.until_waiters(1).await;
    let wc = s.waiter_retrying(&c, "c", s.soon() * 3, Some(retries.clone()));
    s.until_waiters(2).await;
    let leader = cluster.leader().await.expect("a leader");
    let kill_at = Instant::now();
    cluster.kill(leader);
    s.row.faults += 1;
    let new_leader = cluster
        .wait_leader(Duration::from_secs(60))
        .await
        .expect("a new leader");
    s.row.note(format!(
        "leader n{leader} killed, n{new_leader} elected in {:?}",
        kill_at.elapsed()
    ));
    tokio::time::sleep(s.ttl).await;
    if ga.is_held() {
        if s.register.write("a", ga.token()).is_err() {
            s.row
                .violation("the holder's write was rejected while it still held");
        }
        s.row.note("the holder kept its lock");
    } else {
        s.row
            .note(format!("the holder lost its lock: {:?}", ga.loss()));
        if let Some(l) = tra.lost_at() {
            s.row.loss_delay(l - kill_at);
        }
    }
    cluster.restart(leader).expect("restart the old leader");
    cluster
        .wait_leader(Duration::from_secs(60))
        .await
        .expect("a leader after the restart");
    tra.releasing();
    let _ = ga.release().await;
    // Both waiters may have lost their sessions in the election and
    // queued again in either order: serve whichever is granted first.
    let (mut wb, mut wc) = (wb, wc);
    let limit = s.soon() * 3;
    let (b_first, got) = tokio::select! {
        g = wb.holds(limit, "waiter b after the leader change") => (true, g),
        g = wc.holds(limit, "waiter c after the leader change") => (false, g),
    };
    let (first, mut second, second_who) = if b_first {
        (wb, wc, "c")
    } else {
        (wc, wb, "b")
    };
    let mut order = vec![(got.acquired, got.token)];
    first.release().await.ok();
    let got = second
        .holds(
            limit,
            &format!("waiter {second_who} after the leader change"),
        )
        .await;
    order.push((got.acquired, got.token));
    second.release().await.ok();
    // In grant order: both may have been granted before this looks (one
    // of them then lost with its session), and `select!` takes either.
    order.sort();
    let tokens: Vec<u64> = order.iter().map(|(_, t)| *t).collect();
    if tokens.windows(2).any(|w| w[0] >= w[1]) {
        s.row.violation(format!(
            "waiter tokens not increasing in grant order: {tokens:?}"
        ));
    }
    let r = std::mem::take(&mut *retries.lock().unwrap());
    if !r.is_empty() {
        s.row.note(format!("waiters retried {} time(s)", r.len()));
    }
    s.row.cycles = 3;
    s.finish().await
}

/// Every node of the cluster is stopped (SIGSTOP) for longer than the
/// TTL while held: the holder's loss fires from its local deadline; once
/// the nodes continue, the waiter is granted after that loss and the old
/// holder's late write is rejected.
pub async fn cluster_paused_while_held(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    cluster_down_while_held(t, cluster, false).await
}

/// Every node is killed (-9) while held, and restarted after longer than
/// the TTL: as [`cluster_paused_while_held`].
pub async fn cluster_restarted_while_held(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    cluster_down_while_held(t, cluster, true).await
}

async fn cluster_down_while_held(t: &FaultTarget, cluster: &mut Cluster, kill: bool) -> Row {
    let name = if kill {
        "cluster_restarted_while_held"
    } else {
        "cluster_paused_while_held"
    };
    let mut s = Scene::new(t, name).await;
    let (a, b) = (s.client().await, s.client().await);
    let ga = acquire(&a, s.soon()).await;
    let tra = s.history.track("a", &ga);
    s.register.write("a", ga.token()).expect("first write");
    let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut wb = s.waiter_retrying(&b, "b", s.soon() * 4, Some(retries.clone()));
    s.until_waiters(1).await;
    let down = Instant::now();
    for i in 0..3 {
        if kill {
            cluster.kill(i);
        } else {
            cluster.stop(i);
        }
    }
    s.row.faults += 3;
    let lost = tokio::time::timeout(s.ttl * 2 + Duration::from_secs(10), ga.lost()).await;
    let lost_at_local = Instant::now();
    for i in 0..3 {
        if kill {
            cluster.restart(i).expect("restart");
        } else {
            cluster.cont(i);
        }
    }
    match lost {
        Ok(_) => s.row.loss_delay(lost_at_local - down),
        Err(_) => s
            .row
            .violation("no loss signalled while the whole cluster was down"),
    }
    cluster
        .wait_leader(Duration::from_secs(90))
        .await
        .expect("a leader again");
    let got = wb
        .holds(s.soon() * 4, "waiter after the cluster came back")
        .await;
    if got.token <= ga.token() {
        s.row
            .violation(format!("token {} after {}", got.token, ga.token()));
    }
    if s.register.write("a", ga.token()).is_ok() {
        s.row.violation("the old holder's late write was accepted");
    }
    tra.releasing();
    let _ = ga.release().await;
    wb.release().await.ok();
    let r = std::mem::take(&mut *retries.lock().unwrap());
    if let Some(last) = r.last() {
        s.row.note(format!(
            "the waiter retried {} time(s), last: {last}",
            r.len()
        ));
    }
    s.row.cycles = 2;
    s.finish().await
}

/// A follower cut from its leader (both directions of their peer link
/// blackholed; the third member still reaches both) while the holder's
/// client talks to that follower alone and a waiter's to the leader. The
/// follower keeps answering its clients from its own copy, but nothing it
/// says may keep the holder believing: the holder is told of its loss
/// before the waiter is granted (the history judges), its late write is
/// refused, and once the link heals nothing is left behind. Needs a
/// cluster from [`Cluster::start_linked`].
pub async fn follower_cut_from_leader(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    let mut s = Scene::new(t, "follower_cut_from_leader").await;
    let leader = cluster.leader().await.expect("a leader");
    let follower = (leader + 1) % 3;
    let a = s.client_of(&t.on_member(cluster, follower)).await;
    let b = s.client_of(&t.on_member(cluster, leader)).await;
    let ga = acquire(&a, s.soon()).await;
    let tra = s.history.track("a", &ga);
    s.register.write("a", ga.token()).expect("first write");
    let mut wb = s.waiter(&b, "b", s.soon() * 3);
    s.until_waiters(1).await;
    let cut_at = Instant::now();
    cluster.cut(follower, leader);
    s.row.faults += 1;
    s.row.note(format!(
        "n{follower} (the holder's) cut from its leader n{leader}"
    ));
    match tokio::time::timeout(s.ttl * 2 + Duration::from_secs(10), ga.lost()).await {
        Ok(_) => s.row.loss_delay(cut_at.elapsed()),
        Err(_) => s
            .row
            .violation("the holder on the cut follower was not told of its loss"),
    }
    let got = wb.holds(s.soon() * 2, "the waiter on the leader").await;
    if got.token <= ga.token() {
        s.row
            .violation(format!("token {} after {}", got.token, ga.token()));
    }
    if s.register.write("a", ga.token()).is_ok() {
        s.row.violation("the cut holder's late write was accepted");
    }
    cluster.heal(follower, leader);
    cluster
        .wait_serving(Duration::from_secs(90))
        .await
        .expect("every member serving after the heal");
    tra.releasing();
    let _ = ga.release().await;
    wb.release().await.ok();
    s.row.cycles = 2;
    s.finish().await
}

/// Starts a linked cluster of `kind` ([`Cluster::start_linked`]), connects
/// through `factory` with `key=value` added to the URL, and runs
/// [`follower_cut_from_leader`] on it. `mutant`: `factory` makes mutated
/// backends, whose row is the test's to judge ([`FaultTarget::as_mutant`]).
pub async fn on_linked_cluster<F, Fut>(
    kind: super::super::StoreKind,
    key: &str,
    value: &str,
    factory: F,
    mutant: bool,
) -> Row
where
    F: Fn(quorumlock_core::url::Url) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = quorumlock_core::Result<Arc<dyn quorumlock_core::backend::Backend>>>
        + Send
        + 'static,
{
    let (cluster, turn) = Cluster::start_linked(kind)
        .await
        .expect("starting a three-node cluster");
    // Dropped in reverse order, also on a panic: the cluster first.
    let _turn = turn;
    let mut cluster = cluster;
    let mut target = FaultTarget::for_cluster(&cluster, factory).with_option(key, value);
    if mutant {
        target = target.as_mutant();
    }
    follower_cut_from_leader(&target, &mut cluster).await
}
