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
