//! One ZooKeeper session per client: the Curator lock recipe, the holder
//! watches, and the one keepalive task.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use lockcore::backend::{
    AcquireRequest, Acquired, DelayQueue, EntrySignals, GrantMemory, SessionLiveness, StoreSession,
    HELD_WATCH_DELAY,
};
use lockcore::{Error, ErrorKind, LockKind, LossReason, Result};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use zookeeper_client as zk;

use crate::config::deadline_ttl;
use crate::core::{self, Shared, Shutdown};
use crate::error::map;
use crate::layout::{self, Role, BREAK_MESSAGE, LOCK_MARKER, REVOKE_MESSAGE};

/// A lock session: one ZooKeeper session, shared by every lock of a client.
pub(crate) struct ZkSession {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    /// `None` once closed; every task holds a clone only while it runs.
    client: Mutex<Option<zk::Client>>,
    id: zk::SessionId,
    timeout: Duration,
    liveness: Arc<SessionLiveness>,
    stop: CancellationToken,
    state: zk::StateWatcher,
    /// Held entries by contender id, watched by the session's one watch
    /// dispatcher. An entry is removed before we delete our own node, so
    /// that its deletion is not reported as a loss.
    held: Mutex<HashMap<uuid::Uuid, HeldEntry>>,
    /// Tells the dispatcher to watch a newly held entry.
    arm: mpsc::UnboundedSender<uuid::Uuid>,
    /// Per lock directory, by the sequence number of our node when it was
    /// the only child: what lets the next acquire skip the listing (see
    /// [`ParentWatch`]). At most [`CHAINS_KEPT`].
    chains: GrantMemory<Option<ParentWatch>>,
}

/// How many lock directories a session remembers a lone grant for.
const CHAINS_KEPT: usize = 256;

/// A repeat acquire of an uncontended lock knows that it is first without
/// listing the children, so that its cycle is one create and one delete,
/// like the floor.
///
/// ZooKeeper numbers a sequential node with the count of children ever
/// created under the parent (deletes do not count; the `cversion` it shows
/// does, so it cannot stand in). If our new node's number is one past our
/// last one's, nobody created a child in between, so the children are
/// those we saw beside our last node (none), minus deletions: ours alone.
/// That holds while the parent is the same node: a container parent is
/// reaped once empty and may be created anew with a fresh count. A watch
/// on the parent says so; the session state says whether a reconnect
/// happened, after which events may arrive late. The watch is armed on
/// the second acquire, so that a lock taken once costs no watch.
///
/// A watch on a lock directory, and the session state since it was set.
struct ParentWatch {
    fired: Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>,
    state: zk::StateWatcher,
    /// Set once the watch fired or the state changed; never polled again.
    spent: bool,
}

impl ParentWatch {
    /// Whether the directory is the one the watch was set on and the
    /// connection has not broken since. The client library hands a watch
    /// event over before the reply to any later request, so once that
    /// reply is in, this sees every event that came before it.
    fn intact(&mut self) -> bool {
        if !self.spent {
            self.spent = self.state.changed().now_or_never().is_some()
                || self.fired.as_mut().now_or_never().is_some();
        }
        !self.spent
    }
}

/// The sequence number at the end of a contender node's name.
fn sequence_of(node: &str) -> Option<u64> {
    let digits = node.len() - node.bytes().rev().take_while(u8::is_ascii_digit).count();
    node[digits..].parse().ok()
}

/// A created contender node.
struct Created {
    node: String,
    seq: u64,
    stat: zk::Stat,
    /// The children, when listed right behind the create (or looked up
    /// after a connection loss).
    listed: Option<Vec<String>>,
    /// The directory's creation zxid, when listed right behind the create.
    dir_czxid: Option<i64>,
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.inner.id)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

fn create_options() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

/// Errors the library makes up for requests in flight when a connection
/// breaks: the request may or may not have been applied.
fn is_connection_trouble(e: &zk::Error) -> bool {
    use zk::Error as E;
    matches!(e, E::ConnectionLoss | E::Timeout | E::Custom(_))
}

/// Errors after which the session is over for good.
fn is_terminal(e: &zk::Error) -> bool {
    use zk::Error as E;
    matches!(
        e,
        E::SessionExpired | E::SessionMoved | E::AuthFailed | E::ClientClosed
    )
}

fn lost_session(why: &str) -> Error {
    Error::new(ErrorKind::SessionLost, why.to_string())
}

impl ZkSession {
    pub(crate) fn start(
        shared: Arc<Shared>,
        client: zk::Client,
        liveness: Arc<SessionLiveness>,
    ) -> Self {
        let (arm, armed) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            id: client.session_id(),
            timeout: client.session_timeout(),
            state: client.state_watcher(),
            client: Mutex::new(Some(client)),
            shared,
            liveness,
            stop: CancellationToken::new(),
            held: Mutex::new(HashMap::new()),
            arm,
            chains: GrantMemory::new(CHAINS_KEPT),
        });
        let span = tracing::debug_span!("keepalive", session = %inner.id);
        tokio::spawn(keepalive(inner.clone()).instrument(span));
        let span = tracing::debug_span!("holder_watches", session = %inner.id);
        tokio::spawn(watch_dispatcher(inner.clone(), armed).instrument(span));
        ZkSession { inner }
    }

    /// For `kill_session`: stops this session's tasks and drops its
    /// client, so that the library closes the session on the server.
    pub(crate) fn shutdown_handle(&self) -> Shutdown {
        let weak = Arc::downgrade(&self.inner);
        Arc::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.stop.cancel();
                inner.client.lock().expect("poisoned").take();
            }
        })
    }
}

impl Inner {
    fn client(&self) -> Result<zk::Client> {
        self.client
            .lock()
            .expect("poisoned")
            .clone()
            .ok_or_else(|| Error::new(ErrorKind::SessionLost, "the ZooKeeper session was closed"))
    }

    /// Counts `n` requests about to be sent and returns the send time.
    fn send(&self, n: u64) -> Instant {
        self.shared.count(n);
        Instant::now()
    }

    /// A reply to a request that the LEADER answered (a write, or a
    /// `sync`) proves that the session was alive on the leader after the
    /// request left: confirm the local deadline from the send time. A
    /// follower forwards writes and syncs to the leader and answers them
    /// only once the leader has, after applying every earlier commit
    /// (a `closeSession` of our expired session included, which ends our
    /// connection first). Answers to reads prove nothing (see
    /// [`Inner::heard_read`]). Only answers the server itself gives count;
    /// the library also fails in-flight requests with errors of its own
    /// when a connection breaks (`ConnectionLoss`, `Timeout`, I/O errors
    /// as `Custom`), and those prove nothing. A terminal session error is
    /// a loss.
    fn heard<T>(&self, sent: Instant, r: &std::result::Result<T, zk::Error>) {
        use zk::Error as E;
        match r {
            Ok(_) => self.liveness.confirm(sent, deadline_ttl(self.timeout)),
            Err(
                E::NoNode
                | E::NodeExists
                | E::NotEmpty
                | E::BadVersion
                | E::NoAuth
                | E::NoChildrenForEphemerals,
            ) => self.liveness.confirm(sent, deadline_ttl(self.timeout)),
            _ => self.heard_read(r),
        }
    }

    /// A reply to a read: a follower answers it from its own copy, also
    /// while it is cut off from the leader (until `syncLimit x tickTime`),
    /// when the leader may already have expired our session and handed
    /// our locks to others. So it never moves the deadline; only a
    /// terminal session error counts (as a loss).
    fn heard_read<T>(&self, r: &std::result::Result<T, zk::Error>) {
        use zk::Error as E;
        if let Err(E::SessionExpired | E::SessionMoved | E::AuthFailed) = r {
            self.liveness.lose(LossReason::SessionExpired)
        }
    }

    async fn list(&self, c: &zk::Client, dir: &str) -> Result<Option<Vec<String>>> {
        self.send(1);
        let r = c.list_children(dir).await;
        self.heard_read(&r);
        match r {
            Ok(children) => Ok(Some(children)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(e, "listing contenders")),
        }
    }

    /// Creates the missing ancestors of `dir` (and `dir`) as containers,
    /// as Curator's `creatingParentContainersIfNeeded` does. All creates
    /// are sent at once; ZooKeeper applies them in order.
    async fn make_parents(&self, c: &zk::Client, dir: &str) -> Result<()> {
        let opts = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        let mut paths = Vec::new();
        for (i, ch) in dir.char_indices().skip(1) {
            if ch == '/' {
                paths.push(&dir[..i]);
            }
        }
        paths.push(dir);
        let sent = self.send(paths.len() as u64);
        let futs: Vec<_> = paths.iter().map(|p| c.create(p, &[], &opts)).collect();
        for r in futures::future::join_all(futs).await {
            self.heard(sent, &r);
            match r {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(map(e, "creating the lock's parent nodes")),
            }
        }
        Ok(())
    }

    /// Makes the server's view include every write the leader had
    /// acknowledged (or was about to commit) when it answered: a `sync`.
    /// A follower that our session moved to after a connection loss may
    /// not yet have applied a create that the old server passed on, so a
    /// listing without it can miss our own node.
    async fn sync_dir(&self, c: &zk::Client, dir: &str) -> Result<()> {
        let sent = self.send(1);
        let r = c.sync(dir).await;
        self.heard(sent, &r);
        match r {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(map(e, "syncing with the leader")),
        }
    }

    /// Our contender node among `children`, found by its GUID, if it is a
    /// node of THIS session (never one of an older session: CURATOR-604).
    /// If several nodes of this session carry the GUID (a create whose
    /// reply was lost, made again), the first in the queue is kept and
    /// the others deleted, so that we never wait behind our own orphan.
    /// Returns the kept node and `children` without the deleted ones.
    async fn keep_ours(
        &self,
        c: &zk::Client,
        dir: &str,
        guid_prefix: &str,
        mut children: Vec<String>,
    ) -> Result<(Option<(String, zk::Stat)>, Vec<String>)> {
        let mut mine: Vec<String> = children
            .iter()
            .filter(|n| n.starts_with(guid_prefix))
            .cloned()
            .collect();
        mine.sort_by_key(|n| sequence_of(n));
        let mut kept = None;
        for child in mine {
            let path = format!("{dir}/{child}");
            self.send(1);
            let r = c.check_stat(&path).await;
            self.heard_read(&r);
            match r {
                Ok(Some(st)) if st.ephemeral_owner == self.id.0 => {
                    if kept.is_none() {
                        kept = Some((path, st));
                    } else {
                        tracing::info!(node = %path, "deleting a second contender node of ours (a create whose reply was lost)");
                        self.delete(c, &path).await?;
                        children.retain(|n| *n != child);
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(map(e, "reading our contender node")),
            }
        }
        Ok((kept, children))
    }

    /// Deletes the nodes in `sorted` (a listing of `dir`) that carry our
    /// GUID but are not `ours`: orphans of a create whose reply was lost,
    /// seen only now. Left in place, one ahead of us would make us wait
    /// for ourselves forever (and a reader's would hold a read lock until
    /// the session ends). Whether any was deleted (then list again).
    async fn delete_orphans(
        &self,
        c: &zk::Client,
        dir: &str,
        sorted: &[String],
        guid_prefix: &str,
        ours: &str,
    ) -> Result<bool> {
        let mut deleted = false;
        for orphan in sorted
            .iter()
            .filter(|n| n.starts_with(guid_prefix) && *n != ours)
        {
            let node = format!("{dir}/{orphan}");
            tracing::info!(%node, "deleting a second contender node of ours");
            self.delete(c, &node).await?;
            deleted = true;
        }
        Ok(deleted)
    }

    /// Creates our contender node and, if `list`, lists the lock's
    /// children. With pipelining, the listing is sent right behind the
    /// create (one round trip); ZooKeeper answers one session's requests
    /// in order, so the listing already contains our node.
    ///
    /// After a connection loss during the create, our node is looked up by
    /// its GUID instead of creating a second one (Curator's protection,
    /// CURATOR-498).
    async fn create_contender(
        &self,
        c: &zk::Client,
        dir: &str,
        marker: &str,
        data: &[u8],
        req: &AcquireRequest,
        list: bool,
    ) -> Result<Created> {
        let guid_prefix = format!("_c_{}-", req.contender.hyphenated());
        let prefix = format!("{dir}/{guid_prefix}{marker}");
        let opts = create_options();
        let mut attempts = 0;
        loop {
            attempts += 1;
            if !self.liveness.is_alive() {
                return Err(lost_session(
                    "session lost while creating the contender node",
                ));
            }
            let (created, listed) = if list && self.shared.config.pipeline {
                let sent = self.send(2);
                let create = c.create(&prefix, data, &opts);
                let list = c.get_children(dir);
                let (cr, lr) = futures::join!(create, list);
                self.heard(sent, &cr);
                (cr, lr.ok())
            } else {
                let sent = self.send(1);
                let cr = c.create(&prefix, data, &opts).await;
                self.heard(sent, &cr);
                (cr, None)
            };
            match created {
                Ok((stat, seq)) => {
                    return Ok(Created {
                        node: format!("{prefix}{seq}"),
                        seq: seq.into_i64() as u64,
                        stat,
                        dir_czxid: listed.as_ref().map(|(_, st)| st.czxid),
                        listed: listed.map(|(children, _)| children),
                    });
                }
                Err(zk::Error::NoNode) if attempts < 8 => self.make_parents(c, dir).await?,
                Err(e) if is_connection_trouble(&e) && attempts < 8 => {
                    // The create may have been applied: find our node by
                    // its GUID. Create again only once a listing proves it
                    // absent (a request of the old connection is applied
                    // before the session moves, or rejected). The listing
                    // follows a `sync`: the server we reconnected to may
                    // not have applied that create yet; once the leader
                    // answers the sync, it has.
                    let mut tries = 0u32;
                    loop {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(20) * tries).await;
                        if !self.liveness.is_alive() {
                            return Err(lost_session(
                                "session lost while looking for our contender node",
                            ));
                        }
                        let listed = match self.sync_dir(c, dir).await {
                            Ok(()) => self.list(c, dir).await,
                            Err(e) => Err(e),
                        };
                        match listed {
                            Ok(Some(children)) => {
                                if let (Some((node, stat)), children) =
                                    self.keep_ours(c, dir, &guid_prefix, children).await?
                                {
                                    tracing::debug!(%node, "found our contender node after a connection loss");
                                    return Ok(Created {
                                        seq: sequence_of(&node).unwrap_or(u64::MAX),
                                        node,
                                        stat,
                                        listed: Some(children),
                                        dir_czxid: None,
                                    });
                                }
                                break; // not applied: create it again
                            }
                            Ok(None) => break, // no lock node, so no node of ours
                            Err(e) if e.kind() == ErrorKind::Connection && tries < 10 => {}
                            // The client layer abandons (finds by GUID, deletes).
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(e) => return Err(map(e, "creating the contender node")),
            }
        }
    }

    /// Hands a held node to the session's watch dispatcher.
    fn watch_holder(&self, node: String, req: &AcquireRequest) {
        let entry = HeldEntry {
            node: node.into_boxed_str(),
            signals: req.signals.clone(),
        };
        self.held
            .lock()
            .expect("poisoned")
            .insert(req.contender, entry);
        let _ = self.arm.send(req.contender);
    }

    /// Stops watching the entry of `contender` (our own delete is not a
    /// loss).
    fn mark_released(&self, contender: &uuid::Uuid) {
        self.held.lock().expect("poisoned").remove(contender);
    }

    /// Deletes our node; whether it was still there.
    async fn delete(&self, c: &zk::Client, node: &str) -> Result<bool> {
        let sent = self.send(1);
        let r = c.delete(node, None).await;
        self.heard(sent, &r);
        match r {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(map(e, "deleting our contender node")),
        }
    }

    /// Sets a watch on `dir` (sent at once) and gives its creation zxid.
    fn watch_parent<'a>(
        &'a self,
        c: &'a zk::Client,
        dir: &'a str,
    ) -> impl Future<Output = Option<(i64, ParentWatch)>> + 'a {
        // Before the request: a reconnect from now on shows.
        let mut state = self.state.clone();
        state.state();
        self.send(1);
        let watch = c.check_and_watch_stat(dir);
        async move {
            let r = watch.await;
            self.heard_read(&r);
            match r {
                Ok((Some(st), watcher)) => {
                    let fired = Box::pin(watcher.changed());
                    let spent = false;
                    Some((
                        st.czxid,
                        ParentWatch {
                            fired,
                            state,
                            spent,
                        },
                    ))
                }
                _ => None,
            }
        }
    }
}

impl Inner {
    /// Lists `dir`, retrying in place while the connection is down and the
    /// session alive (a waiter keeps its place in the queue).
    async fn list_retrying(&self, c: &zk::Client, dir: &str) -> Result<Vec<String>> {
        let mut backoff = Duration::from_millis(20);
        loop {
            match self.list(c, dir).await {
                Ok(ch) => return Ok(ch.unwrap_or_default()),
                Err(e) if e.kind() == ErrorKind::Connection && self.liveness.is_alive() => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits for a change of `node` (deleted or written), after showing its
    /// data, as read when the watch was set, to `on_data` (an error from it
    /// ends the wait). Returns at once if the node is gone already, and
    /// after a backoff if the watch could not be set (connection trouble):
    /// the caller lists again either way.
    async fn wait_for(
        &self,
        c: &zk::Client,
        node: &str,
        backoff: &mut Duration,
        on_data: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.send(1);
        let r = c.get_and_watch_data(node).await;
        self.heard_read(&r);
        match r {
            Ok((data, _, watcher)) => {
                on_data(&data)?;
                let _ev = watcher.changed().await;
                self.shared.count_watch_event();
                *backoff = Duration::from_millis(20);
            }
            Err(zk::Error::NoNode) => {} // gone already: list again
            Err(e) if !is_terminal(&e) && self.liveness.is_alive() => {
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(map(e, "watching the contender ahead")),
        }
        Ok(())
    }

    /// Whether `dir` has a semaphore with leases (a mutex or read-write
    /// contender on the same node is then a conflict).
    async fn has_leases(&self, c: &zk::Client, dir: &str) -> Result<bool> {
        let leases = format!("{dir}/{}", layout::SEM_LEASES);
        Ok(self.list(c, &leases).await?.is_some_and(|l| !l.is_empty()))
    }

    /// Mutex, read and write entries: one queue under the lock node,
    /// ordered by sequence number (Curator's mutex and read-write layouts).
    /// A repeat acquire of a lock we last found free sends only the create
    /// (see [`ParentWatch`]).
    async fn acquire_queue(&self, req: &AcquireRequest) -> Result<Acquired> {
        let role = Role::of(req.kind);
        let dir = self.shared.lock_dir(&req.name)?;
        let c = self.client()?;
        let mut chain = self.chains.take_released(&dir);
        let repeat = chain
            .as_mut()
            .and_then(|(_, parent)| parent.as_mut())
            .is_some_and(ParentWatch::intact);
        // The second acquire arms the parent watch, sent before the create.
        let arming = match chain {
            Some(_) if !repeat => Some(self.watch_parent(&c, &dir)),
            _ => None,
        };
        let created = self
            .create_contender(&c, &dir, role.marker(), &[], req, !repeat)
            .await?;
        let armed = match arming {
            Some(f) => f.await,
            None => None,
        };
        let node = created.node;
        let our_name = node.rsplit('/').next().expect("a path").to_string();
        let guid_prefix = format!("_c_{}-", req.contender.hyphenated());
        let mut listed = created.listed;
        let mut parent = None;
        match (chain, armed) {
            (Some((last_seq, mut watch)), _) if repeat && listed.is_none() => {
                let next = last_seq.checked_add(1) == Some(created.seq);
                if next && watch.as_mut().is_some_and(ParentWatch::intact) {
                    listed = Some(vec![our_name.clone()]);
                    parent = watch;
                }
            }
            (_, Some((czxid, watch))) if created.dir_czxid == Some(czxid) => parent = Some(watch),
            _ => {}
        }
        let mut backoff = Duration::from_millis(20);
        let mut first = true;
        loop {
            let children = match listed.take() {
                Some(ch) => ch,
                None => self.list_retrying(&c, &dir).await?,
            };
            let alone = std::mem::take(&mut first) && children == [our_name.as_str()];
            if children.iter().any(|n| n == layout::SEM_LEASES) && self.has_leases(&c, &dir).await?
            {
                self.delete(&c, &node).await?;
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!("{} is used as a semaphore", req.name),
                ));
            }
            let sorted = layout::sort_contenders(children);
            if self
                .delete_orphans(&c, &dir, &sorted, &guid_prefix, &our_name)
                .await?
            {
                continue;
            }
            let Some(index) = sorted.iter().position(|n| *n == our_name) else {
                // Deleted behind our back, or our session ended: never grant.
                return Err(lost_session(
                    "our contender node is gone (session expired or node deleted)",
                ));
            };
            let Some(ahead) = layout::blocker(&sorted, index, role) else {
                if alone {
                    self.chains.keep(&dir, created.seq, parent.take());
                }
                self.watch_holder(node.clone(), req);
                return Ok(Acquired {
                    token: created.stat.czxid as u64,
                    entry: node,
                });
            };
            if !req.wait {
                self.delete(&c, &node).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("lock {} is held", req.name),
                ));
            }
            // Watch only what we wait for (herd-free): the predecessor, or
            // for a reader the nearest writer ahead.
            let pred = format!("{dir}/{}", sorted[ahead]);
            self.wait_for(&c, &pred, &mut backoff, |_| Ok(())).await?;
        }
    }

    /// Curator's `InterProcessSemaphoreV2`: queue on the internal mutex
    /// `P/locks`, then (holding it) create a lease `P/leases/..-lease-` and
    /// wait until at most `permits` leases exist; then leave the mutex.
    async fn acquire_semaphore(&self, req: &AcquireRequest, permits: u32) -> Result<Acquired> {
        let dir = self.shared.lock_dir(&req.name)?;
        let locks_dir = format!("{dir}/{}", layout::SEM_LOCKS);
        let leases_dir = format!("{dir}/{}", layout::SEM_LEASES);
        let data = layout::permits_data(permits);
        let c = self.client()?;
        let Created {
            node: lock_node,
            mut listed,
            ..
        } = self
            .create_contender(&c, &locks_dir, LOCK_MARKER, &data, req, true)
            .await?;
        let our_lock = lock_node.rsplit('/').next().expect("a path").to_string();
        let guid_prefix = format!("_c_{}-", req.contender.hyphenated());
        let mut backoff = Duration::from_millis(20);
        let conflict = |why: String| Error::new(ErrorKind::Conflict, why);
        // 1. The internal mutex, FIFO and herd-free as any mutex.
        loop {
            let children = match listed.take() {
                Some(ch) => ch,
                None => self.list_retrying(&c, &locks_dir).await?,
            };
            let sorted = layout::sort_by_marker(children, LOCK_MARKER);
            if self
                .delete_orphans(&c, &locks_dir, &sorted, &guid_prefix, &our_lock)
                .await?
            {
                continue;
            }
            let Some(index) = sorted.iter().position(|n| *n == our_lock) else {
                return Err(lost_session(
                    "our contender node is gone (session expired or node deleted)",
                ));
            };
            if index == 0 {
                break;
            }
            if !req.wait {
                self.delete(&c, &lock_node).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("semaphore {} has no free permit", req.name),
                ));
            }
            let pred = format!("{locks_dir}/{}", sorted[index - 1]);
            let waited = self
                .wait_for(&c, &pred, &mut backoff, |d| {
                    match layout::parse_permits(d) {
                        Some(p) if p != permits => Err(conflict(format!(
                            "semaphore {} is used with {p} permits, not {permits}",
                            req.name
                        ))),
                        _ => Ok(()),
                    }
                })
                .await;
            if let Err(e) = waited {
                if e.kind() == ErrorKind::Conflict {
                    self.delete(&c, &lock_node).await?;
                }
                return Err(e);
            }
        }
        // 2. We hold the internal mutex: check the kind and the permit
        // count before creating our lease.
        self.send(2);
        let (top, leases) = futures::join!(c.list_children(&dir), c.list_children(&leases_dir));
        self.heard_read(&top);
        let top = top.map_err(|e| map(e, "listing the semaphore node"))?;
        let leases = match leases {
            Ok(l) => layout::sort_by_marker(l, layout::LEASE_MARKER),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, "listing leases")),
        };
        let mut refuse = None;
        if top.iter().any(|n| layout::classify(n).is_some()) {
            refuse = Some(conflict(format!(
                "{} is used as a mutex or read-write lock",
                req.name
            )));
        }
        for lease in leases.iter().take(3) {
            if refuse.is_some() {
                break;
            }
            self.send(1);
            let r = c.get_data(&format!("{leases_dir}/{lease}")).await;
            self.heard_read(&r);
            match r {
                Ok((d, _)) => match layout::parse_permits(&d) {
                    Some(p) if p != permits => {
                        refuse = Some(conflict(format!(
                            "semaphore {} is used with {p} permits, not {permits}",
                            req.name
                        )))
                    }
                    Some(_) => break,
                    None => {} // Curator's lease, or revoked: look at the next
                },
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map(e, "reading a lease")),
            }
        }
        if refuse.is_none() && !req.wait && leases.len() >= permits as usize {
            refuse = Some(Error::new(
                ErrorKind::WouldBlock,
                format!("semaphore {} has no free permit", req.name),
            ));
        }
        if let Some(e) = refuse {
            self.delete(&c, &lock_node).await?;
            return Err(e);
        }
        let Created {
            node: lease_node,
            stat,
            mut listed,
            ..
        } = self
            .create_contender(&c, &leases_dir, layout::LEASE_MARKER, &data, req, true)
            .await?;
        let our_lease = lease_node.rsplit('/').next().expect("a path").to_string();
        // 3. Wait (the only waiter on the leases, herd-free) until our
        // lease is among at most `permits`.
        loop {
            let (children, watcher) = match listed.take() {
                Some(ch) => (ch, None),
                None => {
                    self.send(1);
                    let r = c.list_and_watch_children(&leases_dir).await;
                    self.heard_read(&r);
                    match r {
                        Ok((ch, w)) => (ch, Some(w)),
                        Err(e) if !is_terminal(&e) && self.liveness.is_alive() => {
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                            continue;
                        }
                        Err(e) => return Err(map(e, "watching the leases")),
                    }
                }
            };
            if !children.contains(&our_lease) {
                return Err(lost_session(
                    "our lease node is gone (session expired or node deleted)",
                ));
            }
            if children.len() <= permits as usize {
                // Leave the internal mutex: the next waiter may take a lease.
                self.delete(&c, &lock_node).await?;
                self.watch_holder(lease_node.clone(), req);
                return Ok(Acquired {
                    token: stat.czxid as u64,
                    entry: lease_node,
                });
            }
            if !req.wait {
                self.delete(&c, &lease_node).await?;
                self.delete(&c, &lock_node).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("semaphore {} has no free permit", req.name),
                ));
            }
            if let Some(w) = watcher {
                let _ev = w.changed().await;
                self.shared.count_watch_event();
            }
        }
    }
}

/// A held entry: its node and where to report loss and revoke requests.
struct HeldEntry {
    node: Box<str>,
    signals: EntrySignals,
}

/// What one watch future of the dispatcher ended with.
enum Step {
    /// `getData` with a watch on the holder's node answered.
    Armed(
        uuid::Uuid,
        u32,
        std::result::Result<(Vec<u8>, zk::Stat, zk::OneshotWatcher), zk::Error>,
    ),
    /// The watch on the holder's node fired.
    Fired(uuid::Uuid, zk::WatchedEvent),
    /// The entry was released (or the session closed) before the watch was set.
    Gone,
}

type StepFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Step> + Send>>;

/// Sets (or re-sets, after `attempt` failures) the watch on a held node.
fn arm(inner: &Arc<Inner>, key: uuid::Uuid, attempt: u32) -> StepFuture {
    let inner = inner.clone();
    Box::pin(async move {
        if attempt > 0 {
            let wait = Duration::from_millis(20) * 2u32.pow(attempt.min(6));
            tokio::time::sleep(wait.min(Duration::from_secs(1))).await;
        }
        let node = match inner.held.lock().expect("poisoned").get(&key) {
            Some(h) if !h.signals.is_finished() => h.node.clone(),
            _ => return Step::Gone,
        };
        let Ok(c) = inner.client() else {
            return Step::Gone;
        };
        inner.send(1);
        let r = c.get_and_watch_data(&node).await;
        inner.heard_read(&r);
        Step::Armed(key, attempt, r)
    })
}

/// The one task that watches every held node of a session: deletion by
/// someone else (or the `__BREAK__` mark) is a loss, `__REVOKE__` data is
/// a revoke request (Curator's `Revoker` protocol). Per held lock it keeps
/// only a map entry and one small pending future, not a task.
async fn watch_dispatcher(inner: Arc<Inner>, mut armed: mpsc::UnboundedReceiver<uuid::Uuid>) {
    use futures::StreamExt;
    let mut pending = futures::stream::FuturesUnordered::<StepFuture>::new();
    // Fresh grants wait HELD_WATCH_DELAY before their watch is set: a short
    // hold costs no read. The read shows what happened meanwhile (a gone
    // node, a break or revoke mark), so nothing is missed.
    let mut fresh = DelayQueue::new(HELD_WATCH_DELAY);
    // Reports a loss for `key` unless it was released or finished, and
    // forgets it.
    let lose = |key: &uuid::Uuid, why: &str| {
        let entry = inner.held.lock().expect("poisoned").remove(key);
        if let Some(h) = entry {
            if !h.signals.is_finished() {
                tracing::info!(node = %h.node, why, "held lock node deleted");
                h.signals.lose(LossReason::EntryDeleted);
            }
        }
    };
    loop {
        let step = tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = inner.liveness.lost() => return,
            key = armed.recv() => match key {
                Some(key) => {
                    fresh.push(key);
                    continue;
                }
                None => return,
            },
            _ = tokio::time::sleep_until(fresh.next_due().unwrap_or_else(Instant::now)), if !fresh.is_empty() => {
                while let Some(key) = fresh.pop_due() {
                    pending.push(arm(&inner, key, 0));
                }
                continue;
            }
            Some(step) = pending.next(), if !pending.is_empty() => step,
        };
        match step {
            Step::Gone => {}
            Step::Armed(key, _, Ok((data, _, watcher))) => {
                let signals = match inner.held.lock().expect("poisoned").get(&key) {
                    Some(h) if !h.signals.is_finished() => h.signals.clone(),
                    _ => continue, // released meanwhile: drop the watch
                };
                if data == BREAK_MESSAGE {
                    lose(&key, "marked for a forced break");
                    continue;
                }
                // Leases keep their permit count after the marker.
                if data.starts_with(REVOKE_MESSAGE) && !signals.is_revoke_requested() {
                    tracing::info!(%key, "revoke requested");
                    signals.request_revoke();
                }
                pending.push(Box::pin(async move {
                    Step::Fired(key, watcher.changed().await)
                }));
            }
            Step::Armed(key, _, Err(zk::Error::NoNode)) => lose(&key, "NoNode"),
            Step::Armed(key, _, Err(e)) if is_terminal(&e) => {
                // The session is over: liveness reports it.
                inner.held.lock().expect("poisoned").remove(&key);
            }
            // Connection trouble: the local deadline fires the loss if this
            // lasts; keep trying to re-arm the watch until then.
            Step::Armed(key, attempt, Err(_)) => pending.push(arm(&inner, key, attempt + 1)),
            Step::Fired(key, ev) => match ev.event_type {
                zk::EventType::NodeDeleted => lose(&key, "NodeDeleted"),
                zk::EventType::Session if ev.session_state.is_terminated() => {
                    inner.held.lock().expect("poisoned").remove(&key);
                }
                _ => pending.push(arm(&inner, key, 0)), // data changed, or a reconnect
            },
        }
    }
}

/// The one background task of a session: a `sync` every third of the
/// negotiated timeout, answered through the leader, confirms the local
/// deadline from its send time;
/// a terminal session state (expired, auth failed, closed) is a loss.
async fn keepalive(inner: Arc<Inner>) {
    let mut state = inner.state.clone();
    let period = inner.timeout / 3;
    let mut next = Instant::now() + period;
    loop {
        let s = state.peek_state();
        if s.is_terminated() {
            tracing::info!(session = %inner.id, state = %s, "ZooKeeper session ended");
            inner.liveness.lose(LossReason::SessionExpired);
            return;
        }
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = inner.liveness.lost() => {
                // Every guard has been told. End the session on the server
                // now: the library would otherwise keep it alive with its
                // own pings once the servers are back, and our nodes with
                // it, so waiters would wait until this client is dropped.
                tracing::info!(session = %inner.id, "session lost locally; closing it");
                inner.stop.cancel();
                inner.client.lock().expect("poisoned").take();
                return;
            }
            _ = state.changed() => continue,
            _ = tokio::time::sleep_until(next) => {}
        }
        next = Instant::now() + period;
        let Ok(c) = inner.client() else { return };
        inner.shared.count_keepalive();
        let sent = Instant::now();
        // A `sync`, not a read: the leader answers it (see `Inner::heard`).
        let r = tokio::select! {
            r = c.sync("/") => r,
            _ = inner.stop.cancelled() => return,
        };
        drop(c);
        inner.heard(sent, &r);
        if let Err(e) = r {
            tracing::debug!(error = %e, "keepalive sync failed");
        }
    }
}

#[async_trait]
impl StoreSession for ZkSession {
    fn id(&self) -> String {
        core::session_text(self.inner.id.0)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        match req.kind {
            LockKind::Semaphore { permits } => self.inner.acquire_semaphore(req, permits).await,
            _ => self.inner.acquire_queue(req).await,
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        self.inner.mark_released(&req.contender);
        let c = self.inner.client()?;
        let deleted = self.inner.delete(&c, &held.entry).await?;
        // Only a node we deleted ourselves lets the next acquire skip the
        // listing (one a breaker deleted does not).
        if let (Some((dir, _)), Some(seq)) = (held.entry.rsplit_once('/'), sequence_of(&held.entry))
        {
            self.inner.chains.released(dir, seq, deleted);
        }
        Ok(())
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let inner = &self.inner;
        inner.mark_released(&req.contender);
        let dir = inner.shared.lock_dir(&req.name)?;
        let c = inner.client()?;
        let prefix_name = format!("_c_{}-", req.contender.hyphenated());
        let dirs = match req.kind {
            // The lease first: it counts against the permits.
            LockKind::Semaphore { .. } => vec![
                format!("{dir}/{}", layout::SEM_LEASES),
                format!("{dir}/{}", layout::SEM_LOCKS),
            ],
            _ => vec![dir],
        };
        for dir in dirs {
            // As after a lost create: the server may not have applied a
            // create of ours yet; after a sync it has.
            inner.sync_dir(&c, &dir).await?;
            let Some(children) = inner.list(&c, &dir).await? else {
                continue;
            };
            for child in children.iter().filter(|n| n.starts_with(&prefix_name)) {
                tracing::debug!(node = %child, "removing an abandoned contender node");
                inner.delete(&c, &format!("{dir}/{child}")).await?;
            }
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        let inner = &self.inner;
        inner.stop.cancel();
        let client = inner.client.lock().expect("poisoned").take();
        if let Some(c) = client {
            let state = c.state_watcher();
            if !state.peek_state().is_terminated() {
                inner.shared.count(1); // closeSession, sent once every clone is gone
            }
            drop(c);
            if !core::wait_terminal(state, inner.shared.config.connect_timeout).await {
                tracing::warn!(session = %inner.id, "session did not close in time; it will expire");
            }
        }
        core::unregister_session(inner.id);
        Ok(())
    }
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        self.inner.stop.cancel();
        // Dropping the last client clone closes the session in the
        // library's background task.
        self.inner.client.lock().expect("poisoned").take();
    }
}
