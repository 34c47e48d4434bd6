//! Watches while nothing changes: what an observer sends, counted on its link.

use futures::StreamExt;
use quorumlock_core::Follow;

use super::*;

/// The election observed (the lock watched is [`LOCK`]).
const ELECTION: &str = "leader";

/// An observer of a held election and a `watch` of a held lock send no
/// more over three idle seconds, counted on their links (the proxy, not
/// the client's own counter), than a client that watches nothing: its
/// session's keepalives, and the watch's own request at most (on Redis
/// and PostgreSQL, which cannot tell a follower that a session expired,
/// the holder's renewals are heard on the watch: no read of its expiry).
/// A poller on the same kind of link sends a read per interval, so the
/// count sees a poll. Then the leader resigns and the lock is released: the observer
/// and the watch report it, so they were quiet, not dead.
pub async fn idle_watch_sends_nothing_on_its_link(t: &FaultTarget) -> Row {
    const IDLE: Duration = Duration::from_secs(3);
    const POLL: Duration = Duration::from_millis(100);
    let mut s = Scene::new(t, "idle_watch_sends_nothing_on_its_link").await;
    let within = s.soon();
    let holder = s.client().await;
    let leader = holder
        .election(ELECTION)
        .unwrap()
        .campaign("here")
        .await
        .unwrap();
    let held = holder.lock(LOCK).unwrap().acquire().await.unwrap();
    let (observer, observer_link) = s.faulty().await;
    let (watcher, watcher_link) = s.faulty().await;
    let (poller, poller_link) = s.faulty().await;
    let (idle, idle_link) = s.faulty().await;
    // Each client reads once, so each has opened what a first request opens.
    for c in [&observer, &watcher, &poller, &idle] {
        c.inspect(LOCK).await.unwrap();
    }
    let mut observed = Box::pin(observer.election(ELECTION).unwrap().observe());
    let mut watched = Box::pin(watcher.watch(LOCK, Follow::Notifications).unwrap());
    let mut polled = Box::pin(poller.watch(LOCK, Follow::Poll(POLL)).unwrap());
    let first = next_within(&mut observed, within, "the observer").await;
    assert_eq!(first.map(|l| l.value), Some(b"here".to_vec()));
    let state = next_within(&mut watched, within, "the watch").await;
    assert_eq!(state.holders.len(), 1);
    next_within(&mut polled, within, "the poller").await;
    let links = [&observer_link, &watcher_link, &poller_link, &idle_link];
    let before = links.map(|l| l.requests());
    let quiet = tokio::time::timeout(IDLE, async {
        tokio::select! {
            l = observed.next() => panic!("the observer reported {l:?} while nothing changed"),
            w = watched.next() => panic!("the watch reported {w:?} while nothing changed"),
            _ = async { loop { polled.next().await; } } => unreachable!(),
        }
    })
    .await;
    assert!(quiet.is_err());
    let after = links.map(|l| l.requests());
    let [observer_sent, watcher_sent, poller_sent, idle_sent] =
        [0, 1, 2, 3].map(|i| after[i] - before[i]);
    s.row.note(format!(
        "sent over {IDLE:?} idle: observer {observer_sent}, watch {watcher_sent}, \
         poller {poller_sent}, a client watching nothing {idle_sent}"
    ));
    // Slack of two: the watch's own request (a blocking query is sent
    // again once the first read is answered) and a keepalive or ping
    // falling on one side of the window's edge and not the other.
    let allowed = idle_sent + 2;
    for (who, sent) in [("observer", observer_sent), ("watch", watcher_sent)] {
        assert!(
            sent <= allowed,
            "{}: over {IDLE:?} with nothing changing the {who} sent {sent} messages \
             on its link (at most {allowed}), a client watching nothing {idle_sent}",
            t.name()
        );
    }
    let polls = (IDLE.as_millis() / POLL.as_millis()) as u64;
    assert!(
        poller_sent >= idle_sent + polls / 3,
        "{}: a poller every {POLL:?} sent {poller_sent} messages over {IDLE:?}, \
         a client watching nothing {idle_sent}: the link does not count requests",
        t.name()
    );
    drop(polled);
    leader.resign().await.unwrap();
    let next = next_within(
        &mut observed,
        within,
        "the observer, after the resignation,",
    )
    .await;
    assert!(next.is_none(), "a leader after the resignation: {next:?}");
    held.release().await.unwrap();
    let freed = tokio::time::timeout(within, async {
        loop {
            let state = watched
                .next()
                .await
                .expect("the watch ended")
                .expect("the watch failed");
            if state.holders.is_empty() {
                return;
            }
        }
    })
    .await;
    assert!(freed.is_ok(), "the watch did not report the release");
    drop((observed, watched));
    s.finish().await
}

/// The next report of `stream` (`who` in the panics), within `within`.
async fn next_within<T, S>(stream: &mut S, within: Duration, who: &str) -> T
where
    S: futures::Stream<Item = quorumlock_core::Result<T>> + Unpin,
{
    tokio::time::timeout(within, stream.next())
        .await
        .unwrap_or_else(|_| panic!("{who} reported nothing"))
        .unwrap_or_else(|| panic!("{who} ended"))
        .unwrap_or_else(|e| panic!("{who} failed: {e}"))
}
