//! A [`ChangeFeed`] for stores that notify every change a request makes
//! but not a session that expires (Redis, PostgreSQL): their entries of a
//! dead session go only when a request next reads the queue, so the feed
//! also wakes when the first session owning an entry is due to expire.

use std::future::Future;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio::time::Instant;

use super::ChangeFeed;
use crate::{Error, ErrorKind, Result};

/// Reads when the first session owning an entry of the followed lock
/// expires unless renewed (now if one is dead already); `None` if the
/// lock has no entry.
pub type SoonestExpiry = Box<dyn Fn() -> BoxFuture<'static, Result<Option<Instant>>> + Send>;

/// The feed of one lock: `open` subscribes and answers its notifications
/// (`()` each; the stream ends with the subscription) and the read of
/// [`SoonestExpiry`]. Items: one once subscribed (after the first read of
/// the expiry), one per burst of notifications (those already come are
/// one), and one when a session of the lock's entries expired; a wake-up
/// that finds the session renewed only sets the next one. A read that
/// fails or a subscription that ends is yielded as `Err` and ends the
/// stream.
pub fn notified_feed<M>(
    open: impl Future<Output = Result<(M, SoonestExpiry)>> + Send + 'static,
) -> ChangeFeed
where
    M: Stream<Item = ()> + Send + Unpin + 'static,
{
    futures::stream::once(async move {
        let (messages, soonest) = open.await?;
        let due = soonest().await?;
        Ok::<_, Error>((messages, soonest, due))
    })
    .flat_map(|opened| match opened {
        Err(e) => futures::stream::once(futures::future::ready(Err(e))).boxed(),
        Ok(following) => futures::stream::once(futures::future::ready(Ok(())))
            .chain(futures::stream::unfold(Some(following), next))
            .boxed(),
    })
    .boxed()
}

type Following<M> = (M, SoonestExpiry, Option<Instant>);

async fn next<M>(following: Option<Following<M>>) -> Option<(Result<()>, Option<Following<M>>)>
where
    M: Stream<Item = ()> + Send + Unpin + 'static,
{
    let (mut messages, soonest, mut due) = following?;
    loop {
        tokio::select! {
            msg = messages.next() => {
                if msg.is_none() {
                    let e = Error::new(
                        ErrorKind::Connection,
                        "the subscription to the lock's changes ended",
                    );
                    return Some((Err(e), None));
                }
                while let Some(Some(())) = messages.next().now_or_never() {}
            }
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                match soonest().await {
                    Ok(Some(at)) if at > Instant::now() => {
                        due = Some(at);
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => return Some((Err(e), None)),
                }
            }
        }
        return match soonest().await {
            Ok(at) => Some((Ok(()), Some((messages, soonest, at)))),
            Err(e) => Some((Err(e), None)),
        };
    }
}
