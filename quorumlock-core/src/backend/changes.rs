//! A [`ChangeFeed`] for stores that notify every change a request makes
//! but not a session that expires (Redis, PostgreSQL): their entries of a
//! dead session go only when a request next reads the queue, so the feed
//! also wakes when the first session owning an entry is due to expire.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio::time::Instant;

use super::ChangeFeed;
use crate::{Error, ErrorKind, Result};

/// Reads when the first session owning an entry of the followed lock
/// expires unless renewed (now if one is dead already); `None` if the
/// lock has no entry. It also proves the subscription's connection alive
/// (it runs on it, or pings it first): it is the feed's heartbeat.
pub type SoonestExpiry = Box<dyn Fn() -> BoxFuture<'static, Result<Option<Instant>>> + Send>;

/// How long a feed goes without a word on its connection: then it reads
/// [`SoonestExpiry`] anyway, so that a connection that died silently (a
/// NAT's idle timeout, a half-open TCP link) is found within this and the
/// request timeout, not never.
pub const FEED_HEARTBEAT: Duration = Duration::from_secs(30);

/// The feed of one lock: `open` subscribes and answers its notifications
/// (`()` each; the stream ends with the subscription) and the read of
/// [`SoonestExpiry`]. Items: one once subscribed, one per burst of
/// notifications (those already come are one), and one when a session of
/// the lock's entries expired. The expiry is read once subscribed, after
/// each later item is taken (not before: the item's reader comes first), at each due
/// expiry (a session renewed meanwhile only sets the next one), and after
/// [`FEED_HEARTBEAT`] of quiet. A read that fails or a subscription that
/// ends is yielded as `Err` and ends the stream.
pub fn notified_feed<M>(
    open: impl Future<Output = Result<(M, SoonestExpiry)>> + Send + 'static,
) -> ChangeFeed
where
    M: Stream<Item = ()> + Send + Unpin + 'static,
{
    futures::stream::once(async move {
        let (messages, soonest) = open.await?;
        let due = soonest().await?;
        Ok::<_, Error>(Following {
            messages,
            soonest,
            due,
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
    soonest: SoonestExpiry,
    /// When the first session of the lock's entries expires.
    due: Option<Instant>,
    /// `due` is to be read again (an item was just taken).
    stale: bool,
}

async fn next<M>(following: Option<Following<M>>) -> Option<(Result<()>, Option<Following<M>>)>
where
    M: Stream<Item = ()> + Send + Unpin + 'static,
{
    let mut f = following?;
    loop {
        if std::mem::take(&mut f.stale) {
            match (f.soonest)().await {
                Ok(at) => f.due = at,
                Err(e) => return Some((Err(e), None)),
            }
        }
        let heartbeat = Instant::now() + FEED_HEARTBEAT;
        let wake = f.due.map_or(heartbeat, |d| d.min(heartbeat));
        tokio::select! {
            msg = f.messages.next() => {
                if msg.is_none() {
                    let e = Error::new(
                        ErrorKind::Connection,
                        "the subscription to the lock's changes ended",
                    );
                    return Some((Err(e), None));
                }
                while let Some(Some(())) = f.messages.next().now_or_never() {}
                f.stale = true;
                return Some((Ok(()), Some(f)));
            }
            _ = tokio::time::sleep_until(wake) => {
                match (f.soonest)().await {
                    // A session expired: the next read purges it.
                    Ok(Some(at)) if at <= Instant::now() => {
                        f.stale = true;
                        return Some((Ok(()), Some(f)));
                    }
                    Ok(at) => f.due = at,
                    Err(e) => return Some((Err(e), None)),
                }
            }
        }
    }
}
