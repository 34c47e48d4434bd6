//! One etcd watch stream per backend, multiplexing every watch of it.
//!
//! etcd serves any number of watches on one gRPC `Watch` stream, each
//! with an id the client picks (etcd >= 3.4). A client that holds 10,000
//! locks therefore has one stream with 10,000 watches (its own key: a
//! delete is a loss, a put a revoke request), not 10,000 streams. One task owns the stream: it
//! sends create and cancel requests, and routes events to the subscriber
//! of each watch id: a channel for a waiter ([`Watch`]), or a [`Sink`]
//! called in place for a held entry (no task and no channel per held
//! lock: that is what keeps a held lock at a few hundred bytes).
//!
//! When the stream breaks, the task alone reconnects (with a backoff) and
//! creates every live watch again from its start revision, so an outage
//! costs one new stream and one create per watch, not a read per lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    EventType, KeyValue, WatchClient, WatchFilterType, WatchOptions, WatchRequestSender,
    WatchResponse, WatchResponseStream,
};
use lockcore::{DelayQueue, HELD_WATCH_DELAY};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a subscriber hears about its watch.
#[derive(Debug)]
pub(crate) enum WatchEvent {
    /// The key was written; the new key-value.
    Put(KeyValue),
    /// The key was deleted (or expired with its lease).
    Delete,
    /// etcd cancelled the watch (its start revision was compacted, or the
    /// watch was refused): re-read the state instead of trusting it.
    Lost,
}

/// Where a watch's events go. Called on the watch task: must not block.
pub(crate) trait Sink: Send + Sync {
    /// One event; `false` ends the watch.
    fn event(&self, ev: WatchEvent) -> bool;
    /// Nobody listens any more: the watch may be dropped.
    fn closed(&self) -> bool;
}

impl Sink for mpsc::UnboundedSender<WatchEvent> {
    fn event(&self, ev: WatchEvent) -> bool {
        self.send(ev).is_ok()
    }
    fn closed(&self) -> bool {
        self.is_closed()
    }
}

enum Cmd {
    Create {
        id: i64,
        sub: Sub,
        /// Start it [`HELD_WATCH_DELAY`] from now, if the sink still
        /// wants it then.
        later: bool,
    },
    Cancel(i64),
}

/// The handle to the backend's watch task.
#[derive(Debug)]
pub(crate) struct WatchHub {
    cmd: mpsc::UnboundedSender<Cmd>,
    next_id: AtomicI64,
}

/// One watch; dropping it cancels the watch on the stream.
#[derive(Debug)]
pub(crate) struct Watch {
    id: i64,
    rx: mpsc::UnboundedReceiver<WatchEvent>,
    cmd: mpsc::UnboundedSender<Cmd>,
}

impl Watch {
    /// The next event; [`WatchEvent::Lost`] once the watch is dead.
    pub(crate) async fn next(&mut self) -> WatchEvent {
        self.rx.recv().await.unwrap_or(WatchEvent::Lost)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.cmd.send(Cmd::Cancel(self.id));
    }
}

impl WatchHub {
    /// Starts the watch task; it opens the stream on the first watch and
    /// ends when the hub and all its watches are dropped.
    pub(crate) fn new(
        client: WatchClient,
        requests: Arc<AtomicU64>,
        open_timeout: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(client, rx, requests, open_timeout));
        WatchHub {
            cmd: tx,
            next_id: AtomicI64::new(1),
        }
    }

    /// Watches `key` from `start_revision` (inclusive) for deletes only
    /// (`NoPut`) or puts only (`NoDelete`).
    pub(crate) fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        start_revision: i64,
        filter: WatchFilterType,
    ) -> Watch {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let sub = Sub::new(key.into(), start_revision, Some(filter), Arc::new(tx));
        self.create(id, sub, false);
        Watch {
            id,
            rx,
            cmd: self.cmd.clone(),
        }
    }

    /// Watches `key` (every event) from `start_revision`, delivering to
    /// `sink` in place until the sink says it is done or etcd cancels the
    /// watch. `later`: start the watch [`HELD_WATCH_DELAY`] from now,
    /// unless the sink is done by then (a short hold costs no watch; the
    /// start revision replays what happened meanwhile). Every call takes a
    /// fresh watch id: etcd keeps the id of a watch it cancelled for
    /// compaction registered on the stream and refuses a create that
    /// reuses it (with watch id -1, which no subscriber could be told
    /// about).
    pub(crate) fn subscribe(
        &self,
        key: impl Into<Vec<u8>>,
        start_revision: i64,
        sink: Arc<dyn Sink>,
        later: bool,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.create(id, Sub::new(key.into(), start_revision, None, sink), later);
    }

    fn create(&self, id: i64, sub: Sub, later: bool) {
        if self.cmd.send(Cmd::Create { id, sub, later }).is_err() {
            tracing::warn!("etcd watch task is gone");
        }
    }
}

struct Stream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
}

/// One watch as the task keeps it: enough to create it again on a new
/// stream.
struct Sub {
    key: Box<[u8]>,
    start_revision: i64,
    filter: Option<WatchFilterType>,
    sink: Arc<dyn Sink>,
}

impl Sub {
    fn new(
        key: Vec<u8>,
        start_revision: i64,
        filter: Option<WatchFilterType>,
        sink: Arc<dyn Sink>,
    ) -> Sub {
        Sub {
            key: key.into_boxed_slice(),
            start_revision,
            filter,
            sink,
        }
    }

    fn options(&self, id: i64) -> WatchOptions {
        let o = WatchOptions::new()
            .with_start_revision(self.start_revision)
            .with_watch_id(id);
        match self.filter {
            Some(f) => o.with_filters([f]),
            None => o,
        }
    }
}

async fn next_response(
    stream: &mut Option<Stream>,
) -> Result<Option<WatchResponse>, etcd_client::Error> {
    match stream {
        Some(s) => s.responses.message().await,
        None => std::future::pending().await,
    }
}

/// The watch task. While the stream is up, creates and cancels go to it at
/// once. When it breaks, the task waits (100 ms, doubling up to 2 s), opens
/// a new stream and creates every live watch again from its start
/// revision: subscribers hear nothing of it (an event they already had may
/// come twice, which every subscriber tolerates). Only a watch the server
/// cancels (compaction past its start revision) reports
/// [`WatchEvent::Lost`].
async fn run(
    mut client: WatchClient,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    requests: Arc<AtomicU64>,
    open_timeout: Duration,
) {
    const FIRST_RETRY: Duration = Duration::from_millis(100);
    let mut subs: HashMap<i64, Sub> = HashMap::new();
    let mut later: DelayQueue<(i64, Sub)> = DelayQueue::new(HELD_WATCH_DELAY);
    let mut stream: Option<Stream> = None;
    // When the stream is down: when to try again, and the next pause.
    let mut reopen_at: Option<Instant> = None;
    let mut backoff = FIRST_RETRY;
    loop {
        let reopen = reopen_at.filter(|_| stream.is_none() && !subs.is_empty());
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return,
                Some(Cmd::Create { id, sub, later: wait }) => {
                    if sub.sink.closed() {
                        continue; // dropped before we got to it
                    }
                    if wait {
                        later.push((id, sub));
                    } else {
                        start(&mut stream, &mut subs, &mut reopen_at, &requests, id, sub).await;
                    }
                }
                Some(Cmd::Cancel(id)) => {
                    if subs.remove(&id).is_some() {
                        cancel(&mut stream, &mut reopen_at, backoff, &requests, id).await;
                    }
                }
            },
            msg = next_response(&mut stream) => match msg {
                Ok(Some(resp)) => {
                    backoff = FIRST_RETRY;
                    if let Some(id) = dispatch(resp, &mut subs) {
                        // The sink is done with it: cancel on the stream too.
                        cancel(&mut stream, &mut reopen_at, backoff, &requests, id).await;
                    }
                }
                Ok(None) | Err(_) => {
                    tracing::debug!(error = ?msg.err(), watches = subs.len(), "etcd watch stream broke");
                    stream = None;
                    reopen_at = Some(Instant::now() + backoff);
                }
            },
            _ = tokio::time::sleep_until(later.next_due().unwrap_or_else(Instant::now)), if !later.is_empty() => {
                while let Some((id, sub)) = later.pop_due() {
                    if !sub.sink.closed() {
                        start(&mut stream, &mut subs, &mut reopen_at, &requests, id, sub).await;
                    }
                }
            }
            _ = tokio::time::sleep_until(reopen.unwrap_or_else(Instant::now)), if reopen.is_some() => {
                subs.retain(|_, sub| !sub.sink.closed());
                subs.shrink_to_fit();
                match open(&mut client, &subs, &requests, open_timeout).await {
                    Ok(s) => {
                        stream = Some(s);
                        reopen_at = None;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "opening the etcd watch stream failed");
                        reopen_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
        }
    }
}

/// Cancels watch `id` on the stream, if it is up; a failed send drops the
/// stream, to be opened again after `backoff`.
async fn cancel(
    stream: &mut Option<Stream>,
    reopen_at: &mut Option<Instant>,
    backoff: Duration,
    requests: &AtomicU64,
    id: i64,
) {
    if let Some(s) = stream {
        requests.fetch_add(1, Ordering::Relaxed);
        if s.sender.cancel(id).await.is_err() {
            *stream = None;
            *reopen_at = Some(Instant::now() + backoff);
        }
    }
}

/// Creates watch `id` on the stream now, or keeps it for the next stream.
async fn start(
    stream: &mut Option<Stream>,
    subs: &mut HashMap<i64, Sub>,
    reopen_at: &mut Option<Instant>,
    requests: &AtomicU64,
    id: i64,
    sub: Sub,
) {
    if let Some(s) = stream {
        requests.fetch_add(1, Ordering::Relaxed);
        let sent = s
            .sender
            .watch(sub.key.to_vec(), Some(sub.options(id)))
            .await;
        subs.insert(id, sub);
        if sent.is_err() {
            *stream = None;
            *reopen_at = Some(Instant::now());
        }
    } else {
        subs.insert(id, sub);
        if reopen_at.is_none() {
            *reopen_at = Some(Instant::now());
        }
    }
}

/// Opens a stream with the first watch and sends every other one on it.
async fn open(
    client: &mut WatchClient,
    subs: &HashMap<i64, Sub>,
    requests: &AtomicU64,
    open_timeout: Duration,
) -> Result<Stream, etcd_client::Error> {
    let mut all = subs.iter();
    let Some((&id, first)) = all.next() else {
        return Err(etcd_client::Error::WatchError(
            "no watch to open a stream with".into(),
        ));
    };
    requests.fetch_add(1, Ordering::Relaxed);
    let ws = tokio::time::timeout(
        open_timeout,
        client.watch(first.key.to_vec(), Some(first.options(id))),
    )
    .await
    .unwrap_or_else(|_| Err(etcd_client::Error::WatchError("opening timed out".into())))?;
    let (mut sender, responses) = ws.split();
    for (&id, sub) in all {
        requests.fetch_add(1, Ordering::Relaxed);
        sender
            .watch(sub.key.to_vec(), Some(sub.options(id)))
            .await?;
    }
    tracing::debug!(watches = subs.len(), "etcd watch stream opened");
    Ok(Stream { sender, responses })
}

/// Routes one response; returns a watch id to cancel on the stream: one its
/// sink no longer wants, or one etcd cancelled (for compaction etcd keeps
/// the id registered until the client cancels it, as Go's client does).
fn dispatch(resp: WatchResponse, subs: &mut HashMap<i64, Sub>) -> Option<i64> {
    let id = resp.watch_id();
    if resp.canceled() && !subs.contains_key(&id) {
        // A refused create (etcd answers those with id -1) or the echo of
        // our own cancel: nothing of ours is lost, but a refusal would be.
        if resp.created() {
            tracing::warn!(
                watch = id,
                reason = resp.cancel_reason(),
                "etcd refused a watch"
            );
        }
        return None;
    }
    let mut unwanted = None;
    if let Some(sub) = subs.get(&id) {
        for ev in resp.events() {
            let e = match ev.event_type() {
                EventType::Put => match ev.kv() {
                    Some(kv) => WatchEvent::Put(kv.clone()),
                    None => continue,
                },
                EventType::Delete => WatchEvent::Delete,
            };
            if !sub.sink.event(e) {
                unwanted = Some(id);
                break;
            }
        }
    }
    if resp.canceled() {
        let sub = subs.remove(&id)?;
        tracing::debug!(
            watch = id,
            compact_revision = resp.compact_revision(),
            reason = resp.cancel_reason(),
            "etcd cancelled a watch"
        );
        sub.sink.event(WatchEvent::Lost);
        return Some(id);
    }
    if let Some(id) = unwanted {
        subs.remove(&id);
    }
    unwanted
}
