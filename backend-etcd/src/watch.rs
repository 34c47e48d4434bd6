//! One etcd watch stream per backend, multiplexing every watch of it.
//!
//! etcd serves any number of watches on one gRPC `Watch` stream, each
//! with an id the client picks (etcd >= 3.4). A client that holds 10,000
//! locks therefore has one stream with 20,000 watches (own key + revoke
//! marker per lock), not 20,000 streams. One task owns the stream: it
//! sends create and cancel requests, and routes events to the subscriber
//! of each watch id.
//!
//! When the stream breaks, every subscriber gets [`WatchEvent::Lost`] and
//! decides for itself (re-read, then watch again); the next create opens a
//! new stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    EventType, KeyValue, WatchClient, WatchFilterType, WatchOptions, WatchRequestSender,
    WatchResponse, WatchResponseStream,
};
use tokio::sync::mpsc;

/// What a subscriber hears about its watch.
#[derive(Debug)]
pub(crate) enum WatchEvent {
    /// The key was written; the new key-value.
    Put(KeyValue),
    /// The key was deleted (or expired with its lease).
    Delete,
    /// The watch ended without an event we can trust to be complete
    /// (stream broken, compaction, server cancel): re-read the state.
    Lost,
}

enum Cmd {
    Create {
        id: i64,
        key: Vec<u8>,
        start_revision: i64,
        filter: WatchFilterType,
        tx: mpsc::UnboundedSender<WatchEvent>,
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
        if self
            .cmd
            .send(Cmd::Create {
                id,
                key: key.into(),
                start_revision,
                filter,
                tx,
            })
            .is_err()
        {
            tracing::warn!("etcd watch task is gone");
        }
        Watch {
            id,
            rx,
            cmd: self.cmd.clone(),
        }
    }
}

struct Stream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
}

async fn next_response(
    stream: &mut Option<Stream>,
) -> Result<Option<WatchResponse>, etcd_client::Error> {
    match stream {
        Some(s) => s.responses.message().await,
        None => std::future::pending().await,
    }
}

async fn run(
    mut client: WatchClient,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    requests: Arc<AtomicU64>,
    open_timeout: Duration,
) {
    let mut subs: HashMap<i64, mpsc::UnboundedSender<WatchEvent>> = HashMap::new();
    let mut stream: Option<Stream> = None;
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return,
                Some(Cmd::Create { id, key, start_revision, filter, tx }) => {
                    if tx.is_closed() {
                        continue; // dropped before we got to it
                    }
                    let opts = WatchOptions::new()
                        .with_start_revision(start_revision)
                        .with_watch_id(id)
                        .with_filters([filter]);
                    requests.fetch_add(1, Ordering::Relaxed);
                    let sent = match &mut stream {
                        Some(s) => s.sender.watch(key, Some(opts)).await.map_err(|e| {
                            tracing::debug!(error = %e, "etcd watch stream closed");
                        }),
                        None => match tokio::time::timeout(open_timeout, client.watch(key, Some(opts)))
                            .await
                            .unwrap_or_else(|_| Err(etcd_client::Error::WatchError("opening the watch stream timed out".into())))
                        {
                            Ok(ws) => {
                                let (sender, responses) = ws.split();
                                stream = Some(Stream { sender, responses });
                                Ok(())
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "opening the etcd watch stream failed");
                                let _ = tx.send(WatchEvent::Lost);
                                continue;
                            }
                        },
                    };
                    match sent {
                        Ok(()) => {
                            subs.insert(id, tx);
                        }
                        Err(()) => {
                            let _ = tx.send(WatchEvent::Lost);
                            break_stream(&mut stream, &mut subs);
                        }
                    }
                }
                Some(Cmd::Cancel(id)) => {
                    if subs.remove(&id).is_some() {
                        if let Some(s) = &mut stream {
                            requests.fetch_add(1, Ordering::Relaxed);
                            if s.sender.cancel(id).await.is_err() {
                                break_stream(&mut stream, &mut subs);
                            }
                        }
                    }
                }
            },
            msg = next_response(&mut stream) => match msg {
                Ok(Some(resp)) => dispatch(resp, &mut subs),
                Ok(None) => {
                    tracing::debug!("etcd watch stream ended");
                    break_stream(&mut stream, &mut subs);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "etcd watch stream failed");
                    break_stream(&mut stream, &mut subs);
                }
            },
        }
    }
}

fn break_stream(
    stream: &mut Option<Stream>,
    subs: &mut HashMap<i64, mpsc::UnboundedSender<WatchEvent>>,
) {
    *stream = None;
    for (_, tx) in subs.drain() {
        let _ = tx.send(WatchEvent::Lost);
    }
}

fn dispatch(resp: WatchResponse, subs: &mut HashMap<i64, mpsc::UnboundedSender<WatchEvent>>) {
    let id = resp.watch_id();
    if let Some(tx) = subs.get(&id) {
        for ev in resp.events() {
            let e = match ev.event_type() {
                EventType::Put => match ev.kv() {
                    Some(kv) => WatchEvent::Put(kv.clone()),
                    None => continue,
                },
                EventType::Delete => WatchEvent::Delete,
            };
            let _ = tx.send(e);
        }
    }
    if resp.canceled() {
        if let Some(tx) = subs.remove(&id) {
            tracing::debug!(
                watch = id,
                compact_revision = resp.compact_revision(),
                reason = resp.cancel_reason(),
                "etcd cancelled a watch"
            );
            let _ = tx.send(WatchEvent::Lost);
        }
    }
}
