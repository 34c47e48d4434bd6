//! A [`ChangeFeed`] for stores that notify every change a request makes
//! but not a session that expires (Redis, PostgreSQL): their entries of a
//! dead session go only when a request next reads the queue, so the feed
//! also wakes when the first session owning an entry is due to expire,
//! unless that session's renewal was heard first.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
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
/// due, and after [`FEED_HEARTBEAT`] without a word. A renewal heard
/// ([`Notice::Renewed`]) moves its session's expiry and costs no read:
/// while nothing changes and every holder renews, nothing is sent. A
/// renewal missed costs the read it would have saved. A read that fails
/// or a subscription that ends is yielded as `Err` and ends the stream.
pub fn notified_feed<M>(
    open: impl Future<Output = Result<(M, SessionExpiries)>> + Send + 'static,
) -> ChangeFeed
where
    M: Stream<Item = Notice> + Send + Unpin + 'static,
{
    futures::stream::once(async move {
        let (messages, read) = open.await?;
        let expiries = read().await?.into_iter().collect();
        Ok::<_, Error>(Following {
            messages,
            read,
            expiries,
            stale: false,
        })
    })
    .flat_map(|opened| match opened {
        Err(e) => futures::stream::once(futures::future::ready(Err(e))).boxed(),
        Ok(following) => futures::stream::once(futures::future::ready(Ok(())))
            .chain(futures::stream::unfold(Some(following), next))
            .boxed(),
    })
    .boxed()
}

struct Following<M> {
    messages: M,
    read: SessionExpiries,
    /// When each session of the lock's entries expires unless renewed.
    expiries: HashMap<String, Instant>,
    /// The expiries are to be read again (an item was just taken).
    stale: bool,
}

impl<M> Following<M> {
    /// When the first session of the lock's entries expires.
    fn due(&self) -> Option<Instant> {
        self.expiries.values().min().copied()
    }

    /// Takes a renewal in; `true` for a change.
    fn hear(&mut self, notice: Notice) -> bool {
        match notice {
            Notice::Changed => true,
            Notice::Renewed { session, remaining } => {
                // Only sessions read last: one that came since came with
                // a change, whose read will show it.
                if let Some(at) = self.expiries.get_mut(&session) {
                    *at = Instant::now() + remaining;
                }
                false
            }
        }
    }
}

async fn next<M>(following: Option<Following<M>>) -> Option<(Result<()>, Option<Following<M>>)>
where
    M: Stream<Item = Notice> + Send + Unpin + 'static,
{
    let mut f = following?;
    loop {
        if std::mem::take(&mut f.stale) {
            match (f.read)().await {
                Ok(e) => f.expiries = e.into_iter().collect(),
                Err(e) => return Some((Err(e), None)),
            }
        }
        let heartbeat = Instant::now() + FEED_HEARTBEAT;
        let wake = f.due().map_or(heartbeat, |d| d.min(heartbeat));
        tokio::select! {
            msg = f.messages.next() => {
                let Some(notice) = msg else {
                    let e = Error::new(
                        ErrorKind::Connection,
                        "the subscription to the lock's changes ended",
                    );
                    return Some((Err(e), None));
                };
                let mut changed = f.hear(notice);
                while let Some(Some(notice)) = f.messages.next().now_or_never() {
                    changed |= f.hear(notice);
                }
                if changed {
                    f.stale = true;
                    return Some((Ok(()), Some(f)));
                }
            }
            _ = tokio::time::sleep_until(wake) => {
                match (f.read)().await {
                    Ok(e) => {
                        f.expiries = e.into_iter().collect();
                        // A session expired: the next read purges it.
                        if f.due().is_some_and(|at| at <= Instant::now()) {
                            f.stale = true;
                            return Some((Ok(()), Some(f)));
                        }
                    }
                    Err(e) => return Some((Err(e), None)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use futures::channel::mpsc;

    use super::*;

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

    /// A feed over a channel of notices whose expiry reads answer what
    /// `sessions` holds (a live session `ttl` from the read, a dead one
    /// now) and are counted.
    struct Rig {
        tx: mpsc::UnboundedSender<Notice>,
        reads: Arc<AtomicU64>,
        sessions: Arc<Mutex<Vec<(&'static str, bool)>>>,
        feed: ChangeFeed,
    }

    fn rig(ttl: Duration, sessions: &[&'static str]) -> Rig {
        let (tx, rx) = mpsc::unbounded();
        let reads = Arc::new(AtomicU64::new(0));
        let sessions: Vec<_> = sessions.iter().map(|s| (*s, true)).collect();
        let sessions = Arc::new(Mutex::new(sessions));
        let (r, s) = (reads.clone(), sessions.clone());
        let read: SessionExpiries = Box::new(move || {
            r.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            let list = s
                .lock()
                .unwrap()
                .iter()
                .map(|(s, live)| (s.to_string(), if *live { now + ttl } else { now }))
                .collect();
            Box::pin(async move { Ok(list) })
        });
        let feed = notified_feed(async move { Ok((rx, read)) });
        Rig {
            tx,
            reads,
            sessions,
            feed,
        }
    }

    fn renewed(session: &str, remaining: Duration) -> Notice {
        Notice::Renewed {
            session: session.into(),
            remaining,
        }
    }

    /// The holder's renewals heard, the feed reads nothing while nothing
    /// changes; without them it reads at each due expiry.
    #[tokio::test(start_paused = true)]
    async fn a_heard_renewal_saves_the_expiry_read() {
        let ttl = Duration::from_secs(3);
        let mut heard = rig(ttl, &["s1"]);
        let mut missed = rig(ttl, &["s1"]);
        for r in [&mut heard, &mut missed] {
            assert!(matches!(r.feed.next().await, Some(Ok(()))));
            assert_eq!(r.reads.load(Ordering::Relaxed), 1);
        }
        let tx = heard.tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                if tx.unbounded_send(renewed("s1", ttl)).is_err() {
                    return;
                }
            }
        });
        let quiet = async {
            tokio::select! {
                i = heard.feed.next() => panic!("an item while nothing changed: {i:?}"),
                i = missed.feed.next() => panic!("an item while nothing changed: {i:?}"),
                _ = tokio::time::sleep(ttl * 10) => {}
            }
        };
        quiet.await;
        assert_eq!(heard.reads.load(Ordering::Relaxed), 1, "renewals heard");
        assert!(
            missed.reads.load(Ordering::Relaxed) >= 10,
            "renewals missed: {} reads",
            missed.reads.load(Ordering::Relaxed)
        );
    }

    /// A renewal of another session does not postpone the read of the
    /// first one due: that session's expiry is reported.
    #[tokio::test(start_paused = true)]
    async fn another_sessions_renewal_does_not_hide_an_expiry() {
        let ttl = Duration::from_secs(3);
        let mut r = rig(ttl, &["s1"]);
        assert!(matches!(r.feed.next().await, Some(Ok(()))));
        let started = Instant::now();
        r.tx.unbounded_send(renewed("s2", ttl * 100)).unwrap();
        // s1 dies: the read at its due expiry answers it expired.
        r.sessions.lock().unwrap()[0].1 = false;
        let tx = r.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ttl / 2).await;
            let _ = tx.unbounded_send(renewed("s2", ttl * 100));
        });
        let item = tokio::time::timeout(ttl * 2, r.feed.next()).await;
        assert!(
            matches!(item, Ok(Some(Ok(())))),
            "no item at s1's expiry: {item:?}"
        );
        assert!(started.elapsed() >= ttl);
    }
}
