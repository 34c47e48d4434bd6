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
//! When the stream breaks, the task alone reconnects (with a [`Backoff`])
//! and creates every live watch again from its start revision, so an
//! outage costs one new stream and one create per watch, not a read per
//! lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    EventType, KeyValue, WatchClient, WatchFilterType, WatchOptions, WatchRequestSender,
    WatchResponse, WatchResponseStream,
};
use quorumlock_core::backend::{Backoff, DelayQueue, HELD_WATCH_DELAY};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a subscriber hears about its watch.
#[derive(Debug)]
pub(crate) enum WatchEvent {
    /// etcd created the watch; it reports every event after this revision
    /// (the store's revision when it was created). Sent again when the
    /// watch is created anew on a new stream.
    Created(i64),
    /// The key was written; the new key-value.
    Put(KeyValue),
    /// The key was deleted (or expired with its lease).
    Delete,
    /// etcd cancelled the watch (its start revision was compacted): re-read
    /// the state instead of trusting it.
    Lost,
    /// etcd refused to create the watch (e.g. no read permission on the
    /// key): there is no watch.
    /// Re-read the state, and wait a while before watching again: the
    /// next create may be refused too.
    Refused,
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

    /// An event that came already, if any (without waiting).
    pub(crate) fn ready(&mut self) -> Option<WatchEvent> {
        self.rx.try_recv().ok()
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

    /// Watches `key` from `start_revision` (inclusive; 0: from the
    /// revision etcd has when it creates the watch, which etcd serves as a
    /// "synced" watcher, at once, where a start in the past waits for its
    /// 100 ms catch-up loop) for deletes only (`NoPut`) or puts only
    /// (`NoDelete`). The subscriber hears [`WatchEvent::Created`] first.
    pub(crate) fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        start_revision: i64,
        filter: WatchFilterType,
    ) -> Watch {
        let (tx, rx) = mpsc::unbounded_channel();
        let sub = Sub::new(key.into(), start_revision, Some(filter), Arc::new(tx));
        self.channel_watch(sub, rx)
    }

    /// Creates `sub` (its sink the sender of `rx`) as a [`Watch`].
    fn channel_watch(&self, sub: Sub, rx: mpsc::UnboundedReceiver<WatchEvent>) -> Watch {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.create(id, sub, false);
        Watch {
            id,
            rx,
            cmd: self.cmd.clone(),
        }
    }

    /// Watches every key under `prefix` (every event) from now, and on a
    /// new stream from the revision etcd has then: what changed while the
    /// stream was down is not replayed, so the subscriber re-reads on each
    /// [`WatchEvent::Created`] (a follower of a lock's changes, which
    /// wants to know that something changed, not every event).
    pub(crate) fn watch_prefix(&self, prefix: impl Into<Vec<u8>>) -> Watch {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut sub = Sub::new(prefix.into(), 0, None, Arc::new(tx));
        sub.prefix = true;
        self.channel_watch(sub, rx)
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

/// Watch creates sent on one stream and not answered yet, at most: the
/// task keeps reading answers while it sends, and never has more creates
/// out than this, so a reconnect with tens of thousands of watches cannot
/// fill the stream's flow-control windows with answers nobody reads
/// (issue 17, finding 5).
const CREATES_IN_FLIGHT: usize = 64;

struct Stream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
    /// Watches to create on this stream, not sent yet, in order.
    to_create: VecDeque<i64>,
    /// Watches to cancel on this stream, not sent yet.
    to_cancel: VecDeque<i64>,
    /// Creates sent and not answered yet, in send order. etcd answers
    /// the creates of a stream in order, and a refusal carries watch id
    /// -1: the front of this queue is the watch it refuses.
    unanswered: VecDeque<i64>,
}

/// One watch as the task keeps it: enough to create it again on a new
/// stream.
struct Sub {
    key: Box<[u8]>,
    start_revision: i64,
    filter: Option<WatchFilterType>,
    sink: Arc<dyn Sink>,
    /// Its create was sent on the current stream (a cancel must be too).
    sent: bool,
    /// Every key under `key`, always from now (never pinned to a start
    /// revision): see [`WatchHub::watch_prefix`].
    prefix: bool,
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
            sent: false,
            prefix: false,
        }
    }

    fn options(&self, id: i64) -> WatchOptions {
        let o = WatchOptions::new()
            .with_start_revision(self.start_revision)
            .with_watch_id(id);
        let o = if self.prefix { o.with_prefix() } else { o };
        match self.filter {
            Some(f) => o.with_filters([f]),
            None => o,
        }
    }
}

/// A request sent on the stream.
#[derive(Debug, Clone, Copy)]
enum Out {
    Create(i64),
    Cancel(i64),
}

/// What happened on the stream.
enum Io {
    Response(Result<Option<WatchResponse>, etcd_client::Error>),
    Sent(Out, Result<(), etcd_client::Error>),
}

/// Reads the next answer, or sends the next request (cancels first, then
/// creates while fewer than [`CREATES_IN_FLIGHT`] are unanswered),
/// whichever comes first; answers first when both are ready. Never when
/// there is no stream.
///
/// # Cancel safety
/// Dropping it sends nothing and loses nothing: a request leaves its queue
/// only when [`Io::Sent`] is handled (a send into the stream's channel
/// that is dropped midway sends nothing).
async fn io(stream: &mut Option<Stream>, subs: &HashMap<i64, Sub>) -> Io {
    let Some(s) = stream else {
        return std::future::pending().await;
    };
    // Creates of watches dropped before they were sent: skip them.
    while s.to_create.front().is_some_and(|id| !subs.contains_key(id)) {
        s.to_create.pop_front();
    }
    let out = match s.to_cancel.front() {
        Some(&id) => Some(Out::Cancel(id)),
        None if s.unanswered.len() < CREATES_IN_FLIGHT => {
            s.to_create.front().map(|&id| Out::Create(id))
        }
        None => None,
    };
    let sender = &mut s.sender;
    let send = async move {
        match out {
            Some(Out::Cancel(id)) => sender.cancel(id).await,
            Some(Out::Create(id)) => {
                let sub = &subs[&id];
                sender.watch(sub.key.to_vec(), Some(sub.options(id))).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        r = s.responses.message() => Io::Response(r),
        r = send => Io::Sent(out.expect("sent something"), r),
    }
}

/// The watch task. While the stream is up, creates and cancels go to it in
/// order, interleaved with reading its answers. When it breaks, the task
/// waits (100 ms, doubling up to 2 s, with jitter; from 100 ms again once
/// a stream answers), opens a new stream and creates every live watch
/// again from its start revision: subscribers hear nothing of it (an event
/// they already had may come twice, which every subscriber tolerates). A
/// watch the server cancels (compaction past its start revision) reports
/// [`WatchEvent::Lost`], one it refuses to create [`WatchEvent::Refused`].
async fn run(
    mut client: WatchClient,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    requests: Arc<AtomicU64>,
    open_timeout: Duration,
) {
    let mut subs: HashMap<i64, Sub> = HashMap::new();
    let mut later: DelayQueue<(i64, Sub)> = DelayQueue::new(HELD_WATCH_DELAY);
    let mut stream: Option<Stream> = None;
    // When the stream is down: when to try again, and the next pause.
    let mut reopen_at: Option<Instant> = None;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    // Whether a pause was taken since a stream last answered.
    let mut backed_off = false;
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
                        start(&mut stream, &mut subs, &mut reopen_at, id, sub);
                    }
                }
                Some(Cmd::Cancel(id)) => {
                    if let Some(sub) = subs.remove(&id) {
                        cancel(&mut stream, &sub, id);
                    }
                }
            },
            io = io(&mut stream, &subs) => match io {
                Io::Response(Ok(Some(resp))) => {
                    if std::mem::take(&mut backed_off) {
                        backoff.reset();
                    }
                    let s = stream.as_mut().expect("answered on a stream");
                    if let Some(id) = dispatch(resp, &mut subs, &mut s.unanswered) {
                        // The sink is done with it, or etcd cancelled it
                        // and keeps its id: cancel on the stream too.
                        s.to_cancel.push_back(id);
                    }
                }
                Io::Response(Ok(None) | Err(_)) | Io::Sent(_, Err(_)) => {
                    let error = match io {
                        Io::Response(Err(e)) | Io::Sent(_, Err(e)) => Some(e),
                        _ => None,
                    };
                    tracing::debug!(?error, watches = subs.len(), "etcd watch stream broke");
                    stream = None;
                    reopen_at = Some(Instant::now() + backoff.next_delay());
                    backed_off = true;
                }
                Io::Sent(out, Ok(())) => {
                    requests.fetch_add(1, Ordering::Relaxed);
                    let s = stream.as_mut().expect("sent on a stream");
                    match out {
                        Out::Cancel(_) => {
                            s.to_cancel.pop_front();
                        }
                        Out::Create(id) => {
                            s.to_create.pop_front();
                            s.unanswered.push_back(id);
                            if let Some(sub) = subs.get_mut(&id) {
                                sub.sent = true;
                            }
                        }
                    }
                }
            },
            _ = tokio::time::sleep_until(later.next_due().unwrap_or_else(Instant::now)), if !later.is_empty() => {
                while let Some((id, sub)) = later.pop_due() {
                    if !sub.sink.closed() {
                        start(&mut stream, &mut subs, &mut reopen_at, id, sub);
                    }
                }
            }
            _ = tokio::time::sleep_until(reopen.unwrap_or_else(Instant::now)), if reopen.is_some() => {
                subs.retain(|_, sub| !sub.sink.closed());
                subs.shrink_to_fit();
                match open(&mut client, &mut subs, &requests, open_timeout).await {
                    Ok(s) => {
                        stream = Some(s);
                        reopen_at = None;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "opening the etcd watch stream failed");
                        reopen_at = Some(Instant::now() + backoff.next_delay());
                        backed_off = true;
                    }
                }
            }
        }
    }
}

/// Cancels a watch on the stream if its create was sent there.
fn cancel(stream: &mut Option<Stream>, sub: &Sub, id: i64) {
    if let Some(s) = stream {
        if sub.sent {
            s.to_cancel.push_back(id);
        }
    }
}

/// Queues watch `id`'s create on the stream, or keeps it for the next
/// stream.
fn start(
    stream: &mut Option<Stream>,
    subs: &mut HashMap<i64, Sub>,
    reopen_at: &mut Option<Instant>,
    id: i64,
    sub: Sub,
) {
    subs.insert(id, sub);
    match stream {
        Some(s) => s.to_create.push_back(id),
        None => {
            if reopen_at.is_none() {
                *reopen_at = Some(Instant::now());
            }
        }
    }
}

/// Opens a stream with the first watch; every other one is queued to be
/// created on it (see [`io`]).
async fn open(
    client: &mut WatchClient,
    subs: &mut HashMap<i64, Sub>,
    requests: &AtomicU64,
    open_timeout: Duration,
) -> Result<Stream, etcd_client::Error> {
    let Some((&id, first)) = subs.iter().next() else {
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
    let (sender, responses) = ws.split();
    let mut to_create = VecDeque::with_capacity(subs.len() - 1);
    for (&other, sub) in subs.iter_mut() {
        sub.sent = other == id;
        if other != id {
            to_create.push_back(other);
        }
    }
    tracing::debug!(watches = subs.len(), "etcd watch stream opened");
    Ok(Stream {
        sender,
        responses,
        to_create,
        to_cancel: VecDeque::new(),
        unanswered: VecDeque::from([id]),
    })
}

/// Routes one response; returns a watch id to cancel on the stream: one its
/// sink no longer wants, or one etcd cancelled (for compaction etcd keeps
/// the id registered until the client cancels it, as Go's client does).
/// `unanswered`: the stream's creates not answered yet, oldest first.
fn dispatch(
    resp: WatchResponse,
    subs: &mut HashMap<i64, Sub>,
    unanswered: &mut VecDeque<i64>,
) -> Option<i64> {
    let id = resp.watch_id();
    if resp.created() {
        // etcd answers creates in the order they were sent.
        let asked = unanswered.pop_front();
        if !resp.canceled() {
            if let Some(sub) = subs.get_mut(&id) {
                // A watch "from now" is pinned to the revision it was
                // created at, so a new stream creates it again from there
                // and misses nothing in between.
                let at = resp.header().map_or(0, |h| h.revision());
                if sub.start_revision == 0 && at > 0 && !sub.prefix {
                    sub.start_revision = at + 1;
                }
                if !sub.sink.event(WatchEvent::Created(at)) {
                    subs.remove(&id);
                    return Some(id);
                }
            }
        }
        if resp.canceled() {
            // Refused (with watch id -1): etcd has no such watch, so there
            // is nothing to cancel, but the subscriber must know.
            tracing::warn!(
                watch = ?asked,
                reason = resp.cancel_reason(),
                "etcd refused a watch"
            );
            if let Some(sub) = asked.and_then(|a| subs.remove(&a)) {
                sub.sink.event(WatchEvent::Refused);
            }
            return None;
        }
        if asked != Some(id) {
            tracing::warn!(
                watch = id,
                ?asked,
                "etcd answered a watch create out of order"
            );
        }
    }
    if resp.canceled() && !subs.contains_key(&id) {
        return None; // the echo of our own cancel
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
