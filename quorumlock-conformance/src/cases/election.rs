//! Leader election: campaign, the next candidate waits, resign hands
//! over, proclaim changes what observers see, observe streams the
//! changes, and leadership ends with the leader's session.

use futures::StreamExt;
use quorumlock_core::Leader;

use super::*;

fn proclaims(c: &LockClient) -> bool {
    c.backend().capabilities().proclaim
}

async fn leader_value(c: &LockClient, name: &str) -> Option<Vec<u8>> {
    c.election(name)
        .unwrap()
        .leader()
        .await
        .expect("leader")
        .map(|l| l.value)
}

/// The first candidate leads with its value; the second waits (its value
/// is not the leader's) until the first resigns, then leads with a larger
/// token; proclaim changes the value another client reads, token kept.
pub async fn election_campaign_resign_and_proclaim(h: &Harness) {
    let case = h.case();
    let (a, b, o) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    let mut first = a
        .election("leader")
        .unwrap()
        .campaign("node-a")
        .await
        .unwrap();
    assert!(first.is_leader());
    assert_eq!(
        leader_value(&o, "leader").await.as_deref(),
        Some(&b"node-a"[..])
    );
    let eb = b.election("leader").unwrap();
    let second = tokio::spawn(async move { eb.campaign("node-b").await });
    eventually("the second candidate to queue", || async {
        waiters(&o, "leader").await == 1
    })
    .await;
    assert!(!second.is_finished(), "two leaders at once");
    assert_eq!(
        leader_value(&o, "leader").await.as_deref(),
        Some(&b"node-a"[..])
    );

    let token = first.token();
    if proclaims(&a) {
        first.proclaim("node-a v2").await.unwrap();
        assert_eq!(first.value(), b"node-a v2");
        let now = crate::support::leader_of(&o, "leader").await;
        assert_eq!(now.value, b"node-a v2");
        assert_eq!(now.token, token, "proclaim keeps the token");
        assert!(first.is_leader(), "a proclaim is not a revoke or a loss");
        assert!(
            !first.guard().is_revoke_requested(),
            "a proclaim is not a revoke request"
        );
        assert!(!second.is_finished());
    } else {
        assert_kind(
            first.proclaim("node-a v2").await,
            ErrorKind::InvalidArgument,
            "proclaim where the store cannot",
        );
        assert_eq!(
            leader_value(&o, "leader").await.as_deref(),
            Some(&b"node-a"[..])
        );
    }

    first.resign().await.unwrap();
    let second = tokio::time::timeout(SOON, second)
        .await
        .expect("the next candidate did not lead after a resign")
        .unwrap()
        .unwrap();
    assert!(second.token() > token);
    assert_eq!(
        leader_value(&o, "leader").await.as_deref(),
        Some(&b"node-b"[..])
    );
    second.resign().await.unwrap();
    assert_eq!(leader_value(&o, "leader").await, None);
    case.finish().await;
}

/// `observe` yields the leader now, then each change: a new leader, a
/// proclaimed value, nobody.
pub async fn election_observe_sees_changes(h: &Harness) {
    let case = h.case();
    let (a, b, o) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    let stream = o.election("watched").unwrap().observe();
    let mut stream = Box::pin(stream);
    macro_rules! next {
        () => {
            tokio::time::timeout(SOON, stream.next())
                .await
                .expect("no change observed")
                .expect("stream ended")
                .expect("observe failed")
                .map(|l: Leader| l.value)
        };
    }
    assert_eq!(next!(), None);
    let mut g = a
        .election("watched")
        .unwrap()
        .campaign("one")
        .await
        .unwrap();
    assert_eq!(next!().as_deref(), Some(&b"one"[..]));
    if proclaims(&a) {
        g.proclaim("one again").await.unwrap();
        assert_eq!(next!().as_deref(), Some(&b"one again"[..]));
    }
    g.resign().await.unwrap();
    // Nobody, then (maybe quickly) the next leader.
    assert_eq!(next!(), None);
    let g = b
        .election("watched")
        .unwrap()
        .campaign("two")
        .await
        .unwrap();
    assert_eq!(next!().as_deref(), Some(&b"two"[..]));
    g.resign().await.unwrap();
    drop(stream); // its watch ends with it (on ZooKeeper, a session)
    case.finish().await;
}

/// One leadership: its token and value.
type Leadership = (u64, Vec<u8>);

/// An observer's reports so far: how many, and each leader with the
/// number of the report that showed it.
#[derive(Default)]
struct Reports {
    count: usize,
    leaders: Vec<(Leadership, usize)>,
}

/// Waits, at most [`SOON`], until `found` finds something in an
/// observer's reports, and gives it; panics naming `what` if not, or if
/// the observer ended first.
async fn until<T>(
    reports: &tokio::sync::watch::Receiver<Reports>,
    what: &str,
    mut found: impl FnMut(&Reports) -> Option<T>,
) -> T {
    let mut reports = reports.clone();
    let mut it = None;
    // The reports' read guard is let go at once: the observer's task
    // needs it to write.
    let waited = tokio::time::timeout(
        SOON,
        reports.wait_for(|r| {
            it = found(r);
            it.is_some()
        }),
    )
    .await
    .map(|r| r.map(drop));
    match waited {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => panic!("the observer ended before {what}"),
        Err(_) => panic!("no {what} within {SOON:?}"),
    }
    it.expect("found")
}

/// Leadership changes for 10 s among three candidates, each leader
/// resigning as soon as `observe` has reported it: `observe` reports
/// every leader, in token order, exactly as the candidates themselves
/// record winning (a `None` in between is allowed: some stores show no
/// holder while one hands over), each while it still leads; never two
/// candidates lead at once. An observer that polls every 250 ms (the
/// previous `observe`) misses most of them.
///
/// Each leader waits for the report (with a wide bound) rather than
/// holding for a fixed time: `observe` reads after each change, so a
/// leadership shorter than that read may be merged into the next one (as
/// `watch` documents), and a fixed 20 ms hold failed whenever the
/// observer's read came later than that on a busy machine. A candidate
/// campaigns again only once `observe` reported what followed its
/// resign, so no later change makes up for a lost notification: the
/// case waits in vain and fails. The candidates start once both
/// observers have reported the election's state (nobody): `observe` owes
/// no leadership that ended before it started.
pub async fn election_observe_sees_every_short_leadership(h: &Harness) {
    const RUN: Duration = Duration::from_secs(10);
    let case = h.case();
    let candidates = case.clients(3).await;
    let (o, p) = (case.client().await, case.client().await);
    let followed = Box::pin(o.election("short").unwrap().observe());
    let polled = Box::pin(
        p.election("short")
            .unwrap()
            .with_observe_interval(quorumlock_core::DEFAULT_POLL_INTERVAL)
            .observe(),
    );
    let history: Arc<Mutex<Vec<Leadership>>> = Arc::default();
    // Each observer's reports; ends at the `None` after the last leader
    // (see below).
    let seen = |mut s: std::pin::Pin<
        Box<dyn futures::Stream<Item = quorumlock_core::Result<Option<Leader>>> + Send>,
    >| {
        let (reports, seen) = tokio::sync::watch::channel(Reports::default());
        let task = tokio::spawn(async move {
            while let Some(next) = s.next().await {
                let mut last = false;
                reports.send_modify(|r| {
                    r.count += 1;
                    match next {
                        Ok(Some(l)) => r.leaders.push(((l.token, l.value), r.count)),
                        Ok(None) => last = r.leaders.last().is_some_and(|((_, v), _)| v == b"last"),
                        Err(e) => panic!("observe failed: {e}"),
                    }
                });
                if last {
                    break;
                }
            }
        });
        (seen, task)
    };
    let (followed, followed_task) = seen(followed);
    let (polled, polled_task) = seen(polled);
    for (who, reports) in [("observer", &followed), ("poller", &polled)] {
        until(reports, &format!("the {who}'s first report"), |r| {
            (r.count > 0).then_some(())
        })
        .await;
    }
    // The number of the report that showed leadership `l`.
    let reported = |reports: &tokio::sync::watch::Receiver<Reports>, l: Leadership| {
        let reports = reports.clone();
        async move {
            let what = format!("report of leader {}:{}", l.0, String::from_utf8_lossy(&l.1));
            until(&reports, &what, |r| {
                r.leaders
                    .iter()
                    .find(|(seen, _)| *seen == l)
                    .map(|(_, at)| *at)
            })
            .await
        }
    };
    let deadline = Instant::now() + RUN;
    // Leaders now, as the candidates themselves know it: never two.
    let leading = AtomicUsize::new(0);
    let runs = candidates.iter().enumerate().map(|(i, c)| {
        let (c, history, followed, reported, leading) =
            (c.clone(), history.clone(), &followed, &reported, &leading);
        async move {
            let e = c.election("short").unwrap();
            let mut n = 0;
            while Instant::now() < deadline {
                let value = format!("c{i}-{n}");
                let g = e.campaign(value.clone()).await.expect("campaign");
                let others = leading.fetch_add(1, Ordering::SeqCst);
                assert_eq!(others, 0, "{value} won while another candidate led");
                let leadership = (g.token(), value.clone().into_bytes());
                history.lock().unwrap().push(leadership.clone());
                let at = reported(followed, leadership).await;
                // Before the resign: the next leader wins only after it.
                leading.fetch_sub(1, Ordering::SeqCst);
                g.resign().await.expect("resign");
                // Campaigning again is a change that would make up for a
                // lost notification of the resign: first its report.
                let what = format!("report after {value}'s resign");
                until(followed, &what, |r| (r.count > at).then_some(())).await;
                n += 1;
            }
        }
    });
    futures::future::join_all(runs).await;
    // One last leader, then nobody: both observers end at that `None`.
    let c = &candidates[0];
    let g = c.election("short").unwrap().campaign("last").await.unwrap();
    let last = (g.token(), b"last".to_vec());
    history.lock().unwrap().push(last.clone());
    reported(&followed, last.clone()).await;
    reported(&polled, last).await;
    g.resign().await.unwrap();
    let mut history = history.lock().unwrap().clone();
    history.sort();
    tokio::time::timeout(SOON, followed_task)
        .await
        .expect("the observer to see the end")
        .unwrap();
    tokio::time::timeout(SOON, polled_task)
        .await
        .expect("the poller to see the end")
        .unwrap();
    let leaders = |r: &tokio::sync::watch::Receiver<Reports>| -> Vec<Leadership> {
        r.borrow().leaders.iter().map(|(l, _)| l.clone()).collect()
    };
    let (followed, polled) = (leaders(&followed), leaders(&polled));
    // Each leader waits for its report: an `observe` that polled every
    // 250 ms would allow some 40.
    assert!(
        history.len() > 100,
        "only {} leaderships in {RUN:?}: observe is slow to report them",
        history.len()
    );
    // Each was reported while it led (above); here, in order and none
    // that nobody held.
    if let Some(i) =
        (0..followed.len().max(history.len())).find(|&i| followed.get(i) != history.get(i))
    {
        let around = |v: &[(u64, Vec<u8>)]| {
            v[i.saturating_sub(2).min(v.len())..(i + 3).min(v.len())]
                .iter()
                .map(|(t, v)| format!("{t}:{}", String::from_utf8_lossy(v)))
                .collect::<Vec<_>>()
        };
        panic!(
            "observe reported leaders out of order or ones nobody held, at {i}: \
             observed {:?}, held {:?}",
            around(&followed),
            around(&history)
        );
    }
    eprintln!(
        "{} leaderships: observe saw all; polling every {:?} saw {}",
        history.len(),
        quorumlock_core::DEFAULT_POLL_INTERVAL,
        polled.len()
    );
    assert!(
        polled.len() * 2 < history.len(),
        "polling saw {} of {}: the leaderships were not short",
        polled.len(),
        history.len()
    );
    case.finish().await;
}

/// While nothing changes, a watch sends nothing beyond its watch: an
/// observer of a held election and a `watch` of a held lock cost no more
/// requests over three idle seconds than a client that watches nothing
/// (its session's keepalives), but for the watch's own request; a poller
/// costs a read per interval.
pub async fn watch_sends_nothing_while_nothing_changes(h: &Harness) {
    const IDLE: Duration = Duration::from_secs(3);
    let case = h.case();
    let holder = case.client().await;
    let _leader = holder
        .election("idle")
        .unwrap()
        .campaign("here")
        .await
        .unwrap();
    let _held = holder.lock("idle-lock").unwrap().acquire().await.unwrap();
    let (o, w, p, idle) = (
        case.client().await,
        case.client().await,
        case.client().await,
        case.client().await,
    );
    // Every client reads once, so each has what a first request opens.
    for c in [&o, &w, &p, &idle] {
        c.inspect("idle").await.unwrap();
    }
    let mut observed = Box::pin(o.election("idle").unwrap().observe());
    let mut watched = Box::pin(
        w.watch("idle-lock", quorumlock_core::Follow::Notifications)
            .unwrap(),
    );
    let mut polled = Box::pin(
        p.watch(
            "idle-lock",
            quorumlock_core::Follow::Poll(Duration::from_millis(100)),
        )
        .unwrap(),
    );
    let first = tokio::time::timeout(SOON, observed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.map(|l| l.value), Some(b"here".to_vec()));
    let state = tokio::time::timeout(SOON, watched.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(state.holders.len(), 1);
    tokio::time::timeout(SOON, polled.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let sent = |c: &LockClient| c.backend().requests_sent();
    let before = [sent(&o), sent(&w), sent(&p), sent(&idle)];
    let quiet = tokio::time::timeout(IDLE, async {
        tokio::select! {
            l = observed.next() => panic!("the observer reported {l:?} while nothing changed"),
            s = watched.next() => panic!("the watch reported {s:?} while nothing changed"),
            _ = async { loop { polled.next().await; } } => unreachable!(),
        }
    })
    .await;
    assert!(quiet.is_err());
    let after = [sent(&o), sent(&w), sent(&p), sent(&idle)];
    let d: Vec<u64> = before.iter().zip(after).map(|(b, a)| a - b).collect();
    // The watch itself may be one request in the window: a blocking
    // query (Consul) is sent once the first read is done, and renewed
    // every 5 minutes.
    assert!(
        d[0] <= d[3] + 1 && d[1] <= d[3] + 1,
        "over {IDLE:?} with nothing changing: observer {} requests, watch {}, an idle client {}",
        d[0],
        d[1],
        d[3]
    );
    assert!(
        d[2] >= d[3] + 10,
        "the poller sent {} requests, the idle client {}",
        d[2],
        d[3]
    );
    drop((observed, watched, polled)); // their watches end with them
    case.finish().await;
}

/// The leader's session ends: its `lost()` fires, a proclaim is refused
/// and writes nothing, and the waiting candidate leads.
pub async fn election_leader_lost_with_its_session(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let mut g = a
        .election("expiring")
        .unwrap()
        .campaign("old")
        .await
        .unwrap();
    let eb = b.election("expiring").unwrap();
    let next = tokio::spawn(async move { eb.campaign("new").await });
    eventually("the candidate to queue", || async {
        waiters(&b, "expiring").await == 1
    })
    .await;
    b.backend()
        .kill_session(&g.guard().session_id())
        .await
        .expect("kill session");
    tokio::time::timeout(SOON, g.lost())
        .await
        .expect("leadership loss not reported");
    assert!(!g.is_leader());
    if proclaims(&a) {
        assert_kind(
            g.proclaim("zombie").await,
            ErrorKind::LockLost,
            "proclaim after loss",
        );
    }
    let g2 = tokio::time::timeout(SOON, next)
        .await
        .expect("the candidate did not lead")
        .unwrap()
        .unwrap();
    assert!(g2.token() > g.token());
    assert_eq!(
        leader_value(&b, "expiring").await.as_deref(),
        Some(&b"new"[..])
    );
    assert_kind(g.resign().await, ErrorKind::LockLost, "resign after loss");
    g2.resign().await.unwrap();
    case.finish().await;
}

/// A leader makes fenced writes through its guard (what
/// [`quorumlock_core::LeaderGuard::guard`] is for), also after a proclaim and
/// with a candidate waiting; once its leadership is broken the store
/// refuses them and nothing changes.
pub async fn election_leader_makes_fenced_writes(h: &Harness) {
    let case = h.case();
    let (a, b, o) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    let key = crate::scratch::scratch_key(a.backend().as_ref(), case.namespace(), "lead");
    let mut leader = a.election("fl").unwrap().campaign("a").await.unwrap();
    leader
        .guard()
        .fenced_put(key.as_str(), b"1".to_vec())
        .await
        .unwrap_or_else(|e| panic!("a leader's fenced write: {e}"));
    let eb = b.election("fl").unwrap();
    let second = tokio::spawn(async move { eb.campaign("b").await });
    eventually("the second candidate to queue", || async {
        waiters(&o, "fl").await == 1
    })
    .await;
    if proclaims(&a) {
        leader.proclaim("a2").await.unwrap();
    }
    leader
        .guard()
        .fenced_put(key.as_str(), b"2".to_vec())
        .await
        .unwrap_or_else(|e| panic!("a leader's fenced write after a proclaim: {e}"));
    assert_eq!(o.read_key(&key).await.unwrap().as_deref(), Some(&b"2"[..]));

    let lost = leader.lost();
    assert!(o.break_lock("fl").await.unwrap());
    tokio::time::timeout(SOON, lost)
        .await
        .expect("the broken leader was not told");
    let e = leader
        .guard()
        .fenced_put(key.as_str(), b"3".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert_eq!(
        o.read_key(&key).await.unwrap().as_deref(),
        Some(&b"2"[..]),
        "a broken leader's write changed the key"
    );
    let _ = leader.resign().await;
    let second = tokio::time::timeout(SOON, second)
        .await
        .expect("the next candidate did not lead")
        .unwrap()
        .unwrap();
    second
        .guard()
        .fenced_put(key.as_str(), b"4".to_vec())
        .await
        .unwrap();
    second.resign().await.unwrap();
    crate::scratch::remove_scratch(&o, &key).await;
    case.finish().await;
}

/// A revoke request reaches the leader without changing what observers
/// see (its value stays), and a resign after it hands over as any resign
/// does: the waiting candidate leads at once.
pub async fn election_revoke_then_resign_hands_over(h: &Harness) {
    let case = h.case();
    let (a, b, o) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    let first = a.election("rv").unwrap().campaign("node-a").await.unwrap();
    let eb = b.election("rv").unwrap();
    let second = tokio::spawn(async move { eb.campaign("node-b").await });
    eventually("the second candidate to queue", || async {
        waiters(&o, "rv").await == 1
    })
    .await;
    let asked = first.guard().revoke_requested();
    assert!(o.request_revoke("rv").await.unwrap());
    tokio::time::timeout(SOON, asked)
        .await
        .expect("the leader did not hear the revoke request");
    assert!(first.is_leader(), "a revoke request is not a loss");
    assert_eq!(
        leader_value(&o, "rv").await.as_deref(),
        Some(&b"node-a"[..]),
        "the revoke request changed the leader's value"
    );
    let token = first.token();
    first.resign().await.unwrap();
    let second = tokio::time::timeout(SOON, second)
        .await
        .expect("the next candidate did not lead after a revoke and a resign")
        .unwrap()
        .unwrap();
    assert!(second.token() > token);
    assert_eq!(
        leader_value(&o, "rv").await.as_deref(),
        Some(&b"node-b"[..])
    );
    second.resign().await.unwrap();
    case.finish().await;
}
