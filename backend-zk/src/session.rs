//! One ZooKeeper session per client: the Curator lock recipe, the holder
//! watches, and the one keepalive task.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireRequest, Acquired, EntrySignals, Error, ErrorKind, LossReason, Result, SessionLiveness,
    StoreSession,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use zookeeper_client as zk;

use crate::backend::{self, Shared, BREAK_MESSAGE, REVOKE_MESSAGE};
use crate::error::map;

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
    /// Holder watches by contender id: the flag is set before we delete
    /// our own node, so that its deletion is not reported as a loss.
    released: Mutex<HashMap<uuid::Uuid, Arc<AtomicBool>>>,
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
        let inner = Arc::new(Inner {
            id: client.session_id(),
            timeout: client.session_timeout(),
            state: client.state_watcher(),
            client: Mutex::new(Some(client)),
            shared,
            liveness,
            stop: CancellationToken::new(),
            released: Mutex::new(HashMap::new()),
        });
        let span = tracing::debug_span!("keepalive", session = %inner.id);
        tokio::spawn(keepalive(inner.clone()).instrument(span));
        ZkSession { inner }
    }

    /// For `kill_session`: stops this session's tasks and drops its
    /// client, so that the library closes the session on the server.
    pub(crate) fn shutdown_handle(&self) -> backend::Shutdown {
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

    /// Any reply from the server proves the session was alive when the
    /// request left: confirm the local deadline from the send time. Only
    /// answers the server itself gives count; the library also fails
    /// in-flight requests with errors of its own when a connection breaks
    /// (`ConnectionLoss`, `Timeout`, I/O errors as `Custom`), and those
    /// prove nothing. A terminal session error is a loss.
    fn heard<T>(&self, sent: Instant, r: &std::result::Result<T, zk::Error>) {
        use zk::Error as E;
        match r {
            Ok(_) => self.liveness.confirm(sent, self.timeout),
            Err(E::SessionExpired | E::SessionMoved | E::AuthFailed) => {
                self.liveness.lose(LossReason::SessionExpired)
            }
            Err(
                E::NoNode
                | E::NodeExists
                | E::NotEmpty
                | E::BadVersion
                | E::NoAuth
                | E::NoChildrenForEphemerals,
            ) => self.liveness.confirm(sent, self.timeout),
            Err(_) => {}
        }
    }

    async fn list(&self, c: &zk::Client, dir: &str) -> Result<Option<Vec<String>>> {
        let sent = self.send(1);
        let r = c.list_children(dir).await;
        self.heard(sent, &r);
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

    /// Our contender node among `children`, found by its GUID, if it is a
    /// node of THIS session (never one of an older session: CURATOR-604).
    async fn find_ours(
        &self,
        c: &zk::Client,
        dir: &str,
        prefix_name: &str,
        children: &[String],
    ) -> Result<Option<(String, zk::Stat)>> {
        for child in children.iter().filter(|n| n.starts_with(prefix_name)) {
            let path = format!("{dir}/{child}");
            let sent = self.send(1);
            let r = c.check_stat(&path).await;
            self.heard(sent, &r);
            match r {
                Ok(Some(st)) if st.ephemeral_owner == self.id.0 => return Ok(Some((path, st))),
                Ok(_) => {}
                Err(e) => return Err(map(e, "reading our contender node")),
            }
        }
        Ok(None)
    }

    /// Creates our contender node and lists the lock's children. With
    /// pipelining, the listing is sent right behind the create (one round
    /// trip); ZooKeeper answers one session's requests in order, so the
    /// listing already contains our node.
    ///
    /// After a connection loss during the create, our node is looked up by
    /// its GUID instead of creating a second one (Curator's protection,
    /// CURATOR-498).
    async fn create_contender(
        &self,
        c: &zk::Client,
        dir: &str,
        req: &AcquireRequest,
    ) -> Result<(String, zk::Stat, Option<Vec<String>>)> {
        let prefix_name = format!("_c_{}-{}", req.contender.hyphenated(), backend::LOCK_MARKER);
        let prefix = format!("{dir}/{prefix_name}");
        let opts = create_options();
        let mut attempts = 0;
        loop {
            attempts += 1;
            if !self.liveness.is_alive() {
                return Err(lost_session(
                    "session lost while creating the contender node",
                ));
            }
            let (created, listed) = if self.shared.config.pipeline {
                let sent = self.send(2);
                let create = c.create(&prefix, &[], &opts);
                let list = c.list_children(dir);
                let (cr, lr) = futures::join!(create, list);
                self.heard(sent, &cr);
                (cr, lr.ok())
            } else {
                let sent = self.send(1);
                let cr = c.create(&prefix, &[], &opts).await;
                self.heard(sent, &cr);
                (cr, None)
            };
            match created {
                Ok((stat, seq)) => {
                    let node = format!("{prefix}{seq}");
                    return Ok((node, stat, listed));
                }
                Err(zk::Error::NoNode) if attempts < 8 => self.make_parents(c, dir).await?,
                Err(e) if is_connection_trouble(&e) && attempts < 8 => {
                    // The create may have been applied: find our node by
                    // its GUID. Create again only once a listing proves it
                    // absent (a request of the old connection is applied
                    // before the session moves, or rejected).
                    let mut tries = 0u32;
                    loop {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(20) * tries).await;
                        if !self.liveness.is_alive() {
                            return Err(lost_session(
                                "session lost while looking for our contender node",
                            ));
                        }
                        match self.list(c, dir).await {
                            Ok(Some(children)) => {
                                if let Some((node, stat)) =
                                    self.find_ours(c, dir, &prefix_name, &children).await?
                                {
                                    tracing::debug!(%node, "found our contender node after a connection loss");
                                    return Ok((node, stat, Some(children)));
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

    fn watch_holder(self: &Arc<Self>, c: zk::Client, node: String, req: &AcquireRequest) {
        let released = Arc::new(AtomicBool::new(false));
        self.released
            .lock()
            .expect("poisoned")
            .insert(req.contender, released.clone());
        let span = tracing::debug_span!("holder_watch", %node);
        tokio::spawn(
            holder_watch(
                self.clone(),
                c,
                node,
                req.signals.clone(),
                released,
                req.contender,
            )
            .instrument(span),
        );
    }

    /// Marks the holder watch of `contender` as released (our own delete
    /// is not a loss).
    fn mark_released(&self, contender: &uuid::Uuid) {
        if let Some(flag) = self.released.lock().expect("poisoned").remove(contender) {
            flag.store(true, Ordering::Release);
        }
    }

    async fn delete(&self, c: &zk::Client, node: &str) -> Result<()> {
        let sent = self.send(1);
        let r = c.delete(node, None).await;
        self.heard(sent, &r);
        match r {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(map(e, "deleting our contender node")),
        }
    }
}

/// Watches a held node until the entry is finished: deletion by someone
/// else is a loss, `__REVOKE__` data is a revoke request (Curator's
/// `Revoker` protocol).
async fn holder_watch(
    inner: Arc<Inner>,
    c: zk::Client,
    node: String,
    signals: EntrySignals,
    released: Arc<AtomicBool>,
    contender: uuid::Uuid,
) {
    let mut backoff = Duration::from_millis(20);
    let gone = |why: &str| {
        if !released.load(Ordering::Acquire) && !signals.is_finished() {
            tracing::info!(%node, why, "held lock node deleted");
            signals.lose(LossReason::EntryDeleted);
        }
    };
    loop {
        if released.load(Ordering::Acquire) || signals.is_finished() {
            break;
        }
        let sent = inner.send(1);
        let r = tokio::select! {
            r = c.get_and_watch_data(&node) => r,
            _ = inner.stop.cancelled() => break,
            _ = signals.finished() => break,
        };
        inner.heard(sent, &r);
        match r {
            Ok((data, _stat, watcher)) => {
                backoff = Duration::from_millis(20);
                if data == BREAK_MESSAGE {
                    gone("marked for a forced break");
                    break;
                }
                if data == REVOKE_MESSAGE && !signals.is_revoke_requested() {
                    tracing::info!(%node, "revoke requested");
                    signals.request_revoke();
                }
                let ev = tokio::select! {
                    ev = watcher.changed() => ev,
                    _ = inner.stop.cancelled() => break,
                    _ = signals.finished() => break,
                };
                match ev.event_type {
                    zk::EventType::NodeDeleted => {
                        gone("NodeDeleted");
                        break;
                    }
                    zk::EventType::Session if ev.session_state.is_terminated() => break,
                    _ => continue, // data changed, or a reconnect: read again
                }
            }
            Err(zk::Error::NoNode) => {
                gone("NoNode");
                break;
            }
            Err(e) if is_terminal(&e) => break, // session over: liveness reports it
            Err(_) => {
                // Connection trouble: the local deadline fires the loss if
                // this lasts; keep trying to re-arm the watch until then.
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = inner.stop.cancelled() => break,
                    _ = signals.finished() => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
    inner.released.lock().expect("poisoned").remove(&contender);
}

/// The one background task of a session: a light read every third of the
/// negotiated timeout confirms the local deadline from its send time;
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
            _ = inner.liveness.lost() => return,
            _ = state.changed() => continue,
            _ = tokio::time::sleep_until(next) => {}
        }
        next = Instant::now() + period;
        let Ok(c) = inner.client() else { return };
        inner.shared.count_keepalive();
        let sent = Instant::now();
        let r = tokio::select! {
            r = c.check_stat("/") => r,
            _ = inner.stop.cancelled() => return,
        };
        drop(c);
        inner.heard(sent, &r);
        if let Err(e) = r {
            tracing::debug!(error = %e, "keepalive read failed");
        }
    }
}

#[async_trait]
impl StoreSession for ZkSession {
    fn id(&self) -> String {
        backend::session_text(self.inner.id.0)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        let inner = &self.inner;
        let dir = inner.shared.lock_dir(&req.name)?;
        let c = inner.client()?;
        let (node, stat, mut listed) = inner.create_contender(&c, &dir, req).await?;
        let our_name = node.rsplit('/').next().expect("a path").to_string();
        let mut backoff = Duration::from_millis(20);
        loop {
            let children = match listed.take() {
                Some(ch) => ch,
                None => match inner.list(&c, &dir).await {
                    Ok(ch) => ch.unwrap_or_default(),
                    Err(e) if e.kind() == ErrorKind::Connection && inner.liveness.is_alive() => {
                        // Keep our place in the queue: the library
                        // reconnects with the same session.
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            let sorted = backend::sort_contenders(children);
            let Some(index) = sorted.iter().position(|n| *n == our_name) else {
                // Deleted behind our back, or our session ended: never grant.
                return Err(lost_session(
                    "our contender node is gone (session expired or node deleted)",
                ));
            };
            if index == 0 {
                inner.watch_holder(c.clone(), node.clone(), req);
                return Ok(Acquired {
                    token: stat.czxid as u64,
                    entry: node,
                });
            }
            if !req.wait {
                inner.delete(&c, &node).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("lock {} is held", req.name),
                ));
            }
            // Watch only the contender just before us (herd-free).
            let pred = format!("{dir}/{}", sorted[index - 1]);
            let sent = inner.send(1);
            let r = c.get_and_watch_data(&pred).await;
            inner.heard(sent, &r);
            match r {
                Ok((_, _, watcher)) => {
                    let _ev = watcher.changed().await;
                    inner.shared.count_watch_event();
                }
                Err(zk::Error::NoNode) => {} // gone already: list again
                Err(e) if !is_terminal(&e) && inner.liveness.is_alive() => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(map(e, "watching the previous contender")),
            }
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        self.inner.mark_released(&req.contender);
        let c = self.inner.client()?;
        self.inner.delete(&c, &held.entry).await
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let inner = &self.inner;
        inner.mark_released(&req.contender);
        let dir = inner.shared.lock_dir(&req.name)?;
        let c = inner.client()?;
        let prefix_name = format!("_c_{}-", req.contender.hyphenated());
        let Some(children) = inner.list(&c, &dir).await? else {
            return Ok(());
        };
        for child in children.iter().filter(|n| n.starts_with(&prefix_name)) {
            tracing::debug!(node = %child, "removing an abandoned contender node");
            inner.delete(&c, &format!("{dir}/{child}")).await?;
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
            if !backend::wait_terminal(state, inner.shared.config.connect_timeout).await {
                tracing::warn!(session = %inner.id, "session did not close in time; it will expire");
            }
        }
        backend::unregister_session(inner.id);
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
