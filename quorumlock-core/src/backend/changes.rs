//! A [`ChangeFeed`] for stores that notify every change a request makes
//! but not a session that expires (Redis, PostgreSQL): their entries of a
//! dead session go only when a request next reads the queue, so the feed
//! also wakes when the first session owning an entry is due to expire,
//! unless that session's renewal was heard first.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::ChangeFeed;
use crate::{Error, ErrorKind, Result};

/// What a feed's subscription hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Something of the lock changed: it is to be read.
    Changed,
    /// A session was renewed.
    Renewed {
        /// The session, as [`SessionExpiries`] names it.
        session: String,
        /// How long it lives from when the store sent this, at least.
        remaining: Duration,
    },
}

impl Notice {
    /// The notice a message's payload carries: `r <session> <ms>` is a
    /// renewal (what the stores' renewals send on the channel of each
    /// followed lock they have an entry of), anything else a change.
    pub fn parse(payload: &str) -> Notice {
        let renewal = payload.strip_prefix("r ").and_then(|rest| {
            let (session, ms) = rest.rsplit_once(' ')?;
            let ms = ms.parse::<u64>().ok()?;
            Some(Notice::Renewed {
                session: session.to_string(),
                remaining: Duration::from_millis(ms),
            })
        });
        renewal.unwrap_or(Notice::Changed)
    }
}

/// Reads when each session owning an entry of the followed lock expires
/// unless renewed (now for one that is dead already); empty if the lock
/// has no entry. It also proves the subscription's connection alive (it
/// runs on it, or pings it first): it is the feed's heartbeat.
pub type SessionExpiries =
    Box<dyn Fn() -> BoxFuture<'static, Result<Vec<(String, Instant)>>> + Send>;

/// How long a feed goes without a word on its connection: then it reads
/// [`SessionExpiries`] anyway, so that a connection that died silently (a
/// NAT's idle timeout, a half-open TCP link) is found within this and the
/// request timeout, not never.
pub const FEED_HEARTBEAT: Duration = Duration::from_secs(30);

/// The feed of one lock: `open` subscribes and answers its notices (the
/// stream ends with the subscription) and the read of [`SessionExpiries`].
/// Items: one once subscribed, one per burst of changes (those already
/// come are one), and one when a session of the lock's entries expired.
/// The expiries are read once subscribed, after each later item is taken
/// (not before: the item's reader comes first), when the first of them is
/// due, and after [`FEED_HEARTBEAT`] without a word.
///
/// A task takes the notices in as they come, whether the stream is
/// polled or not: a change sets a flag, a renewal ([`Notice::Renewed`])
/// the expiry of its session as of when it was heard (so a renewal heard
/// long before the feed is next polled says no more than it did then);
/// what waits is one flag and one instant per session, however long the
/// stream is left alone. A renewal of a session the last read named
/// moves its expiry and costs no read: while nothing changes and every
/// holder renews, nothing is sent. A renewal missed costs the read it
/// would have saved. A read that fails or a subscription that ends is
/// yielded as `Err` and ends the stream.
pub fn notified_feed<M>(
    open: impl Future<Output = Result<(M, SessionExpiries)>> + Send + 'static,
) -> ChangeFeed
where
    M: Stream<Item = Notice> + Send + Unpin + 'static,
{
    futures::stream::once(async move {
        let (messages, read) = open.await?;
        let mailbox = Arc::new(Mailbox::default());
        let listener = tokio::spawn(listen(messages, mailbox.clone()));
        let mut following = Following {
            mailbox,
            listener,
            read,
            expiries: HashMap::new(),
            stale: false,
            check: false,
            last_word: Instant::now(),
        };
        following.read_expiries().await?;
        Ok::<_, Error>(following)
    })
    .flat_map(|opened| match opened {
        Err(e) => futures::stream::once(futures::future::ready(Err(e))).boxed(),
        Ok(following) => futures::stream::once(futures::future::ready(Ok(())))
            .chain(futures::stream::unfold(Some(following), next))
            .boxed(),
    })
    .boxed()
}

/// What the listener heard and the feed has not taken yet.
#[derive(Default)]
struct Inbox {
    changed: bool,
    /// Per session, when it expires by its latest renewal heard.
    renewed: HashMap<String, Instant>,
    /// When the last notice came.
    heard: Option<Instant>,
    /// The subscription ended.
    ended: bool,
}

#[derive(Default)]
struct Mailbox {
    inbox: Mutex<Inbox>,
    wake: Notify,
}

/// Takes every notice in as it comes (see [`notified_feed`]).
async fn listen<M>(mut messages: M, mailbox: Arc<Mailbox>)
where
    M: Stream<Item = Notice> + Send + Unpin + 'static,
{
    while let Some(notice) = messages.next().await {
        let now = Instant::now();
        {
            let mut inbox = mailbox.inbox.lock().expect("poisoned");
            inbox.heard = Some(now);
            match notice {
                Notice::Changed => inbox.changed = true,
                Notice::Renewed { session, remaining } => {
                    let at = now + remaining;
                    let e = inbox.renewed.entry(session).or_insert(at);
                    *e = (*e).max(at);
                }
            }
        }
        mailbox.wake.notify_one();
    }
    mailbox.inbox.lock().expect("poisoned").ended = true;
    mailbox.wake.notify_one();
}

struct Following {
    mailbox: Arc<Mailbox>,
    listener: JoinHandle<()>,
    read: SessionExpiries,
    /// When each session of the lock's entries expires unless renewed.
    expiries: HashMap<String, Instant>,
    /// The expiries are to be read again (an item was just taken, or one
    /// of them is due).
    stale: bool,
    /// The read is at a due time: an item if one has passed.
    check: bool,
    /// When the connection last proved alive (a read or a notice).
    last_word: Instant,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// What [`Following::take`] found waiting.
struct Taken {
    changed: bool,
    ended: bool,
}

impl Following {
    /// When the first session of the lock's entries expires.
    fn due(&self) -> Option<Instant> {
        self.expiries.values().min().copied()
    }

    /// Takes the inbox: renewals move the expiries of sessions the last
    /// read named (one that came since came with a change, whose read
    /// will show it; an expiry only moves later: a renewal heard before
    /// the read says less than the read did).
    fn take(&mut self) -> Taken {
        let mut inbox = self.mailbox.inbox.lock().expect("poisoned");
        for (session, at) in inbox.renewed.drain() {
            if let Some(e) = self.expiries.get_mut(&session) {
                *e = (*e).max(at);
            }
        }
        if let Some(heard) = inbox.heard.take() {
            self.last_word = self.last_word.max(heard);
        }
        Taken {
            changed: std::mem::take(&mut inbox.changed),
            ended: inbox.ended,
        }
    }

    async fn read_expiries(&mut self) -> Result<()> {
        let expiries = (self.read)().await?;
        self.expiries = expiries.into_iter().collect();
        self.last_word = Instant::now();
        Ok(())
    }
}

async fn next(following: Option<Following>) -> Option<(Result<()>, Option<Following>)> {
    let mut f = following?;
    loop {
        if std::mem::take(&mut f.stale) {
            if let Err(e) = f.read_expiries().await {
                return Some((Err(e), None));
            }
        }
        let taken = f.take();
        if taken.ended {
            let e = Error::new(
                ErrorKind::Connection,
                "the subscription to the lock's changes ended",
            );
            return Some((Err(e), None));
        }
        let expired =
            std::mem::take(&mut f.check) && f.due().is_some_and(|at| at <= Instant::now());
        if taken.changed || expired {
            // A change, or a session expired (the next read purges it).
            f.stale = true;
            return Some((Ok(()), Some(f)));
        }
        let heartbeat = f.last_word + FEED_HEARTBEAT;
        let wake = f.due().map_or(heartbeat, |d| d.min(heartbeat));
        tokio::select! {
            // A due expiry first: the read decides, not renewals queued
            // behind it.
            biased;
            _ = tokio::time::sleep_until(wake) => {
                f.stale = true;
                f.check = true;
            }
            _ = f.mailbox.wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use futures::channel::mpsc;

    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    #[test]
    fn payloads_parse_to_notices() {
        assert_eq!(Notice::parse(""), Notice::Changed);
        assert_eq!(Notice::parse("r"), Notice::Changed);
        assert_eq!(Notice::parse("r x"), Notice::Changed);
        assert_eq!(Notice::parse("r x y"), Notice::Changed);
        assert_eq!(
            Notice::parse("r app one.session/ab 3000"),
            Notice::Renewed {
                session: "app one.session/ab".into(),
                remaining: Duration::from_millis(3000)
            }
        );
    }

    /// A store's sessions: each expires [`TTL`] after its last renewal.
    #[derive(Default)]
    struct Store {
        renewed: Mutex<HashMap<&'static str, Instant>>,
        reads: AtomicU64,
    }

    impl Store {
        fn new(sessions: &[&'static str]) -> Arc<Store> {
            let store = Store::default();
            let now = Instant::now();
            for s in sessions {
                store.renewed.lock().unwrap().insert(*s, now);
            }
            Arc::new(store)
        }

        fn reads(&self) -> u64 {
            self.reads.load(Ordering::Relaxed)
        }

        /// A feed of this store and the channel its notices come on.
        fn feed(self: &Arc<Store>) -> (mpsc::UnboundedSender<Notice>, ChangeFeed) {
            let (tx, rx) = mpsc::unbounded();
            let store = self.clone();
            let read: SessionExpiries = Box::new(move || {
                store.reads.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                let list = store
                    .renewed
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(s, at)| (s.to_string(), (*at + TTL).max(now)))
                    .collect();
                Box::pin(async move { Ok(list) })
            });
            (tx, notified_feed(async move { Ok((rx, read)) }))
        }

        /// `session` renews every third of the TTL for `lasting`, telling
        /// `tx` of each renewal if given.
        fn renew(
            self: &Arc<Store>,
            session: &'static str,
            lasting: Duration,
            tx: Option<mpsc::UnboundedSender<Notice>>,
        ) {
            let store = self.clone();
            let until = Instant::now() + lasting;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(TTL / 3).await;
                    if Instant::now() > until {
                        return;
                    }
                    store
                        .renewed
                        .lock()
                        .unwrap()
                        .insert(session, Instant::now());
                    if let Some(tx) = &tx {
                        let _ = tx.unbounded_send(renewed(session, TTL));
                    }
                }
            });
        }
    }

    fn renewed(session: &str, remaining: Duration) -> Notice {
        Notice::Renewed {
            session: session.into(),
            remaining,
        }
    }

    async fn first(feed: &mut ChangeFeed) {
        assert!(matches!(feed.next().await, Some(Ok(()))));
    }

    /// No item for `long`.
    async fn quiet(feed: &mut ChangeFeed, long: Duration) {
        tokio::select! {
            i = feed.next() => panic!("an item while nothing changed: {i:?}"),
            _ = tokio::time::sleep(long) => {}
        }
    }

    /// The holder's renewals heard, the feed reads nothing while nothing
    /// changes; not heard, it reads at each due expiry.
    #[tokio::test(start_paused = true)]
    async fn a_heard_renewal_saves_the_expiry_read() {
        let (heard, missed) = (Store::new(&["s1"]), Store::new(&["s1"]));
        let (tx, mut heard_feed) = heard.feed();
        let (_tx, mut missed_feed) = missed.feed();
        first(&mut heard_feed).await;
        first(&mut missed_feed).await;
        heard.renew("s1", TTL * 100, Some(tx));
        missed.renew("s1", TTL * 100, None);
        tokio::join!(
            quiet(&mut heard_feed, TTL * 10),
            quiet(&mut missed_feed, TTL * 10)
        );
        assert_eq!(heard.reads(), 1, "renewals heard");
        assert!(
            missed.reads() >= 10,
            "renewals missed: {} reads",
            missed.reads()
        );
    }

    /// A renewal of another session does not postpone the read of the
    /// first one due: that session's expiry is reported.
    #[tokio::test(start_paused = true)]
    async fn another_sessions_renewal_does_not_hide_an_expiry() {
        let store = Store::new(&["s1"]);
        let (tx, mut feed) = store.feed();
        first(&mut feed).await;
        let started = Instant::now();
        tx.unbounded_send(renewed("s2", TTL * 100)).unwrap();
        let item = tokio::time::timeout(TTL * 2, feed.next()).await;
        assert!(
            matches!(item, Ok(Some(Ok(())))),
            "no item at s1's expiry: {item:?}"
        );
        assert!(started.elapsed() >= TTL);
    }

    /// A renewal of a session the last read did not name is not taken in
    /// (here one that would make every moment due).
    #[tokio::test(start_paused = true)]
    async fn an_unnamed_sessions_renewal_is_not_taken_in() {
        let store = Store::new(&["s1"]);
        let (tx, mut feed) = store.feed();
        first(&mut feed).await;
        store.renew("s1", TTL * 100, Some(tx.clone()));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if tx
                    .unbounded_send(renewed("s9", Duration::from_millis(1)))
                    .is_err()
                {
                    return;
                }
            }
        });
        quiet(&mut feed, TTL * 10).await;
        assert_eq!(store.reads(), 1);
    }

    /// Renewals heard while nobody polls the feed, then the holder stops
    /// renewing: its expiry is reported when it comes (its last renewal
    /// plus the TTL), not a TTL after the feed is next polled (the
    /// renewals taken as if heard then).
    #[tokio::test(start_paused = true)]
    async fn renewals_heard_while_nobody_polls_say_what_they_said_then() {
        let store = Store::new(&["s1"]);
        let (tx, mut feed) = store.feed();
        first(&mut feed).await;
        let started = Instant::now();
        // Renewals at 1, 2 and 3 s: the session expires at 6 s.
        store.renew("s1", TTL + Duration::from_millis(500), Some(tx.clone()));
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        let item = tokio::time::timeout(TTL * 2, feed.next()).await;
        assert!(
            matches!(item, Ok(Some(Ok(())))),
            "no item at s1's expiry: {item:?}"
        );
        let at = started.elapsed();
        assert!(
            at >= Duration::from_secs(6) && at <= Duration::from_millis(6_100),
            "the expiry at 6 s reported at {at:?}"
        );
    }

    /// Notices pile up in neither the feed nor its channel while nobody
    /// polls: the listener takes them in, one instant per session.
    #[tokio::test(start_paused = true)]
    async fn notices_do_not_pile_up_while_nobody_polls() {
        let store = Store::new(&["s1"]);
        let (tx, mut feed) = store.feed();
        first(&mut feed).await;
        for _ in 0..10_000 {
            tx.unbounded_send(renewed("s1", TTL)).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The channel is empty: a closed sender's channel reports it at
        // once, while the listener still runs.
        assert!(tx.is_empty(), "the notices wait in the channel");
        drop(feed);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(tx.is_closed(), "the listener outlived its feed");
    }
}
