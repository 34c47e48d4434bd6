//! One ZooKeeper session per client: opening it, the Curator recipes run
//! on it (the queue of mutexes, readers, writers and election candidates;
//! the semaphore's internal mutex and leases), release, proclaim, abandon
//! and close. Its tasks (keepalive, holder watches) are in `monitor.rs`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use quorumlock_core::backend::{
    refused_upgrade, removed_if_found, upgrade_refused, waits_for, waits_for_linked,
    AcquireRequest, Acquired, Backoff, GrantMemory, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LockKind, Result};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use zookeeper_client as zk;

use crate::config::deadline_ttl;
use crate::contender::{guid_prefix, Created, Listing};
use crate::core::{
    self, is_terminal, lost_session, retry_backoff, ParentWatch, SessionState, Shutdown, ZkCore,
    CHAINS_KEPT,
};
use crate::error::map;
use crate::layout::{self, sequence_of, LOCK_MARKER};
use crate::monitor::{keepalive, watch_dispatcher};

/// A lock session: one ZooKeeper session, shared by every lock of a client.
pub(crate) struct ZkSession {
    state: Arc<SessionState>,
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.state.id)
            .field("timeout", &self.state.timeout)
            .finish()
    }
}

impl ZkSession {
    /// `Backend::open_session`: a new ZooKeeper session, confirmed alive
    /// through the leader, recorded for `leftovers` and `kill_session`,
    /// with its tasks started.
    pub(crate) async fn open(core: &Arc<ZkCore>, liveness: Arc<SessionLiveness>) -> Result<Self> {
        let (client, started) = match core.take_admin().await {
            // The admin session becomes the lock session: it has no nodes
            // and no watches, as a new one; confirmed by a round trip
            // through the leader before it counts as alive.
            Some(admin) => {
                core.count(1);
                let sent = Instant::now();
                match admin.sync("/").await {
                    Ok(_) => (admin, sent),
                    Err(e) => {
                        tracing::debug!(error = %e, "the admin session could not become a lock session");
                        drop(admin);
                        core.connect(None).await?
                    }
                }
            }
            None => core.connect(None).await?,
        };
        let timeout = client.session_timeout();
        // Done at `connect()` unless the backend is lazy: then here, once.
        core.check_ticks(timeout).await?;
        liveness.confirm(started, deadline_ttl(timeout));
        if !liveness.is_alive() {
            // The connect took most of a timeout (hosts tried in turn):
            // confirm with a fresh round trip through the leader (a read
            // would be answered by a follower even when cut off from it).
            core.count(1);
            let sent = Instant::now();
            match client.sync("/").await {
                Ok(_) => liveness.confirm(sent, deadline_ttl(timeout)),
                Err(e) => return Err(map(e, "confirming a new session")),
            }
        }
        core.record_opened(&client, &liveness);
        tracing::debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "ZooKeeper session opened");
        let id = client.session_id();
        let session = ZkSession::start(core.clone(), client, liveness);
        core.set_current(&session.state);
        core::set_shutdown(id, session.shutdown_handle());
        Ok(session)
    }

    fn start(core: Arc<ZkCore>, client: zk::Client, liveness: Arc<SessionLiveness>) -> Self {
        let (arm, armed) = mpsc::unbounded_channel();
        let state = Arc::new(SessionState {
            id: client.session_id(),
            timeout: client.session_timeout(),
            state: client.state_watcher(),
            client: Mutex::new(Some(client)),
            core,
            liveness,
            stop: CancellationToken::new(),
            held: Mutex::new(HashMap::new()),
            arm,
            chains: GrantMemory::new(CHAINS_KEPT),
        });
        let span = tracing::debug_span!("keepalive", session = %state.id);
        tokio::spawn(keepalive(state.clone()).instrument(span));
        let span = tracing::debug_span!("holder_watches", session = %state.id);
        tokio::spawn(watch_dispatcher(state.clone(), armed).instrument(span));
        ZkSession { state }
    }

    /// For `kill_session`: stops this session's tasks and drops its
    /// client, so that the library closes the session on the server.
    pub(crate) fn shutdown_handle(&self) -> Shutdown {
        let weak = Arc::downgrade(&self.state);
        Arc::new(move || {
            if let Some(state) = weak.upgrade() {
                state.stop.cancel();
                state.client.lock().expect("poisoned").take();
            }
        })
    }

    /// Removes every node of attempt `req` in `dir` (found by its GUID).
    /// As after a lost create: the server may not have applied a create
    /// of ours yet; after a sync it has.
    async fn remove_attempt_nodes(
        &self,
        c: &zk::Client,
        req: &AcquireRequest,
        dir: &str,
    ) -> Result<()> {
        let session = &self.state;
        session.sync_dir(c, dir).await?;
        let Some(children) = session.list(c, dir).await? else {
            return Ok(());
        };
        let prefix = guid_prefix(req);
        for child in children.iter().filter(|n| n.starts_with(&prefix)) {
            tracing::debug!(node = %child, "removing an abandoned contender node");
            session.delete(c, &format!("{dir}/{child}")).await?;
        }
        Ok(())
    }

    /// Releases a held request of several permits: each of its leases
    /// deleted as a held node ([`SessionState::delete_held`]), then what
    /// the attempt has in the locks directory. Whether all `req.count`
    /// leases were still ours (none gone, none marked by a break). Our
    /// session sees its own creates, so the listing needs no sync.
    async fn release_leases(&self, req: &AcquireRequest) -> Result<bool> {
        let session = &self.state;
        session.mark_released(&req.contender);
        let dir = session.core.lock_dir(&req.name)?;
        let leases = format!("{dir}/{}", layout::SEM_LEASES);
        let c = session.client()?;
        let prefix = guid_prefix(req);
        let (mut found, mut intact) = (0, true);
        for child in session.list(&c, &leases).await?.unwrap_or_default() {
            if !child.starts_with(&prefix) {
                continue;
            }
            let node = format!("{leases}/{child}");
            let version = session.core.data_version(&node);
            found += 1;
            intact &= session.delete_held(&c, &node, version).await?;
            session.core.forget_version(&node);
        }
        self.remove_attempt_nodes(&c, req, &format!("{dir}/{}", layout::SEM_LOCKS))
            .await?;
        Ok(intact && found >= req.count as usize)
    }
}

impl SessionState {
    /// Lists `dir`, retrying in place while the connection is down and the
    /// session alive (a waiter keeps its place in the queue).
    async fn list_retrying(&self, c: &zk::Client, dir: &str) -> Result<Vec<String>> {
        let mut backoff = retry_backoff();
        loop {
            match self.list(c, dir).await {
                Ok(ch) => return Ok(ch.unwrap_or_default()),
                Err(e) if e.kind() == ErrorKind::Connection && self.liveness.is_alive() => {
                    backoff.wait().await;
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
        backoff: &mut Backoff,
        on_data: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.send(1);
        let r = c.get_and_watch_data(node).await;
        self.heard_read(&r);
        match r {
            Ok((data, _, watcher)) => {
                on_data(&data)?;
                let _ev = watcher.changed().await;
                self.core.count_watch_event();
                backoff.reset();
            }
            Err(zk::Error::NoNode) => {} // gone already: list again
            Err(e) if !is_terminal(&e) && self.liveness.is_alive() => {
                backoff.wait().await;
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
        let marker = layout::create_marker(req);
        let dir = self.core.lock_dir(&req.name)?;
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
        let listing = if repeat {
            Listing::Skip
        } else {
            Listing::OrNewLockNode
        };
        let data = layout::value_data(&req.value);
        let created = self
            .create_contender(&c, &dir, &marker, &data, req, listing)
            .await?;
        let armed = match arming {
            Some(f) => f.await,
            None => None,
        };
        let node = created.node;
        let our_name = node.rsplit('/').next().expect("a path").to_string();
        let guid_prefix = guid_prefix(req);
        let mut listed = created.listed;
        let mut watched = created.watched;
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
        let mut backoff = retry_backoff();
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
            let kinds = layout::kinds(&sorted);
            if upgrade_refused(&kinds, index, layout::links(&sorted)) {
                self.delete(&c, &node).await?;
                return Err(refused_upgrade(&req.name));
            }
            let Some(ahead) = waits_for_linked(&kinds, index, layout::links(&sorted)) else {
                if alone {
                    self.chains.keep(&dir, created.seq, parent.take());
                }
                self.watch_holder(node.clone(), req, watched.take());
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
            // for a reader the nearest writer ahead, for an upgrade the
            // nearest other holder ahead.
            let pred = format!("{dir}/{}", sorted[ahead]);
            self.wait_for(&c, &pred, &mut backoff, |_| Ok(())).await?;
        }
    }

    /// Curator's `InterProcessSemaphoreV2`: queue on the internal mutex
    /// `P/locks`, then (holding it) create a lease `P/leases/..-lease-` and
    /// wait until at most `permits` leases exist; then leave the mutex.
    async fn acquire_semaphore(&self, req: &AcquireRequest, permits: u32) -> Result<Acquired> {
        let dir = self.core.lock_dir(&req.name)?;
        let locks_dir = format!("{dir}/{}", layout::SEM_LOCKS);
        let leases_dir = format!("{dir}/{}", layout::SEM_LEASES);
        let data = layout::permits_data(permits, &layout::value_data(&req.value));
        let c = self.client()?;
        let Created {
            node: lock_node,
            listed,
            ..
        } = self
            .create_contender(&c, &locks_dir, LOCK_MARKER, &data, req, Listing::Behind)
            .await?;
        let mut backoff = retry_backoff();
        self.take_internal_mutex(
            &c,
            req,
            permits,
            &locks_dir,
            &lock_node,
            listed,
            &mut backoff,
        )
        .await?;
        // 2. We hold the internal mutex: check the kind and the permit
        // count before creating our lease.
        let refuse = self
            .semaphore_refusal(&c, req, &dir, &leases_dir, permits)
            .await?;
        if let Some(e) = refuse {
            self.delete(&c, &lock_node).await?;
            return Err(e);
        }
        // One lease per permit; the leases of a request of several (in
        // one transaction) are the newest, side by side.
        let (ours, stat, mut listed) = if req.count > 1 {
            let (paths, stat) = self
                .create_leases(&c, &leases_dir, layout::LEASE_MARKER, &data, req)
                .await?;
            (paths, stat, None)
        } else {
            let Created {
                node, stat, listed, ..
            } = self
                .create_contender(
                    &c,
                    &leases_dir,
                    layout::LEASE_MARKER,
                    &data,
                    req,
                    Listing::Behind,
                )
                .await?;
            (vec![node], stat, listed)
        };
        let lease_node = ours.last().expect("at least one lease").clone();
        let names: Vec<String> = ours
            .iter()
            .map(|p| p.rsplit('/').next().expect("a path").to_string())
            .collect();
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
                            backoff.wait().await;
                            continue;
                        }
                        Err(e) => return Err(map(e, "watching the leases")),
                    }
                }
            };
            if !names.iter().all(|n| children.contains(n)) {
                return Err(lost_session(
                    "our lease node is gone (session expired or node deleted)",
                ));
            }
            // Curator's rule, by the count and not by a place in a queue:
            // held once at most `permits` leases exist. Ours, created
            // under the internal mutex, are the newest leases, so this is
            // `holds` at the place of our last among leases created so;
            // Curator's clients count, and so do we, for one semaphore
            // between both. (Curator's `acquire(qty)` takes its leases one
            // by one, leaving the mutex between them: it holds part of its
            // request while it waits, so two requests for several permits
            // of which one is Curator's can wait for each other for good,
            // as two of Curator's own can. Ours never holds part.)
            if children.len() <= permits as usize {
                // Leave the internal mutex: the next waiter may take a lease.
                self.delete(&c, &lock_node).await?;
                self.watch_holder(lease_node.clone(), req, None);
                return Ok(Acquired {
                    token: stat.czxid as u64,
                    entry: lease_node,
                });
            }
            if !req.wait {
                for lease in &ours {
                    self.delete(&c, lease).await?;
                }
                self.delete(&c, &lock_node).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("semaphore {} has no free permit", req.name),
                ));
            }
            if let Some(w) = watcher {
                let _ev = w.changed().await;
                self.core.count_watch_event();
            }
        }
    }

    /// Step 1 of [`SessionState::acquire_semaphore`]: the internal mutex of
    /// Curator's `InterProcessSemaphoreV2`, FIFO and herd-free as any
    /// mutex. A try that finds it taken, or a waiter that meets another
    /// permit count, deletes our node `lock_node` and returns the error.
    #[allow(clippy::too_many_arguments)]
    async fn take_internal_mutex(
        &self,
        c: &zk::Client,
        req: &AcquireRequest,
        permits: u32,
        locks_dir: &str,
        lock_node: &str,
        mut listed: Option<Vec<String>>,
        backoff: &mut Backoff,
    ) -> Result<()> {
        let our_lock = lock_node.rsplit('/').next().expect("a path").to_string();
        let guid_prefix = guid_prefix(req);
        let conflict = |why: String| Error::new(ErrorKind::Conflict, why);
        loop {
            let children = match listed.take() {
                Some(ch) => ch,
                None => self.list_retrying(c, locks_dir).await?,
            };
            let sorted = layout::sort_by_marker(children, LOCK_MARKER);
            if self
                .delete_orphans(c, locks_dir, &sorted, &guid_prefix, &our_lock)
                .await?
            {
                continue;
            }
            let Some(index) = sorted.iter().position(|n| *n == our_lock) else {
                return Err(lost_session(
                    "our contender node is gone (session expired or node deleted)",
                ));
            };
            // The internal mutex is a mutex: its nodes are one queue of
            // mutex entries.
            let kinds = vec![LockKind::Exclusive; sorted.len()];
            let Some(ahead) = waits_for(&kinds, index) else {
                break;
            };
            if !req.wait {
                self.delete(c, lock_node).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("semaphore {} has no free permit", req.name),
                ));
            }
            let pred = format!("{locks_dir}/{}", sorted[ahead]);
            let waited = self
                .wait_for(c, &pred, backoff, |d| match layout::parse_permits(d) {
                    Some(p) if p != permits => Err(conflict(format!(
                        "semaphore {} is used with {p} permits, not {permits}",
                        req.name
                    ))),
                    _ => Ok(()),
                })
                .await;
            if let Err(e) = waited {
                if e.kind() == ErrorKind::Conflict {
                    self.delete(c, lock_node).await?;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Step 2 of [`SessionState::acquire_semaphore`], holding the internal mutex:
    /// why our lease must not be created (`Conflict`: the name is used as
    /// another kind or with another permit count; `WouldBlock`: a try with
    /// no free permit), if anything.
    async fn semaphore_refusal(
        &self,
        c: &zk::Client,
        req: &AcquireRequest,
        dir: &str,
        leases_dir: &str,
        permits: u32,
    ) -> Result<Option<Error>> {
        let conflict = |why: String| Error::new(ErrorKind::Conflict, why);
        self.send(2);
        let (top, leases) = futures::join!(c.list_children(dir), c.list_children(leases_dir));
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
        if refuse.is_none()
            && !req.wait
            && leases.len() + req.count.max(1) as usize > permits as usize
        {
            refuse = Some(Error::new(
                ErrorKind::WouldBlock,
                format!("semaphore {} has no free permit", req.name),
            ));
        }
        Ok(refuse)
    }
}

#[async_trait]
impl StoreSession for ZkSession {
    fn id(&self) -> String {
        core::session_text(self.state.id.0)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        match req.kind {
            LockKind::Semaphore { permits } => self.state.acquire_semaphore(req, permits).await,
            _ => self.state.acquire_queue(req).await,
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        if req.count > 1 {
            return removed_if_found(req, self.release_leases(req).await?);
        }
        self.state.mark_released(&req.contender);
        let version = self.state.core.data_version(&held.entry);
        let c = self.state.client()?;
        let ours = self.state.delete_held(&c, &held.entry, version).await?;
        self.state.core.forget_version(&held.entry);
        // Only a node we deleted ourselves lets the next acquire skip the
        // listing (one a breaker deleted does not).
        if let (Some((dir, _)), Some(seq)) = (held.entry.rsplit_once('/'), sequence_of(&held.entry))
        {
            self.state.chains.released(dir, seq, ours);
        }
        removed_if_found(req, ours)
    }

    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        // Our node's path is unique (it holds the attempt's GUID) and
        // ephemeral: if it is there and no break marked it, it is still
        // ours. The write is conditional on the data version we left it
        // at, as a fenced write's check: unconditional, it overwrote a
        // break's mark (the leader went on proclaiming until the delete,
        // after being told of the loss, and its later fenced writes passed).
        let core = &self.state.core;
        let c = self.state.client()?;
        let data = layout::value_data(value);
        let lost = || {
            Error::new(
                ErrorKind::LockLost,
                format!("{}: our node {} is gone or broken", req.name, held.entry),
            )
        };
        let mut version = core.data_version(&held.entry);
        for _ in 0..8 {
            core.count(1);
            match c.set_data(&held.entry, &data, Some(version)).await {
                Ok(stat) => {
                    core.note_version(&held.entry, stat.version);
                    return Ok(());
                }
                Err(zk::Error::NoNode) => return Err(lost()),
                // Rewritten by someone else: read what it is now.
                Err(zk::Error::BadVersion) => {
                    core.count(1);
                    match crate::fenced::held_version(&c, &held.entry).await? {
                        Some(v) => version = v,
                        None => return Err(lost()),
                    }
                }
                Err(e) => return Err(map(e, "setting our node's value")),
            }
        }
        Err(Error::new(
            ErrorKind::Store,
            format!("{}: our node {} kept changing", req.name, held.entry),
        ))
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let session = &self.state;
        session.mark_released(&req.contender);
        let dir = session.core.lock_dir(&req.name)?;
        let c = session.client()?;
        let dirs = match req.kind {
            // The lease first: it counts against the permits.
            LockKind::Semaphore { .. } => vec![
                format!("{dir}/{}", layout::SEM_LEASES),
                format!("{dir}/{}", layout::SEM_LOCKS),
            ],
            _ => vec![dir],
        };
        for dir in dirs {
            self.remove_attempt_nodes(&c, req, &dir).await?;
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        let session = &self.state;
        session.stop.cancel();
        let client = session.client.lock().expect("poisoned").take();
        if let Some(c) = client {
            let state = c.state_watcher();
            if !state.peek_state().is_terminated() {
                session.core.count(1); // closeSession, sent once every clone is gone
            }
            drop(c);
            if !core::wait_terminal(state, session.core.config.connect_timeout).await {
                tracing::warn!(session = %session.id, "session did not close in time; it will expire");
            }
        }
        core::unregister_session(session.id);
        Ok(())
    }
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        self.state.stop.cancel();
        // Dropping the last client clone closes the session in the
        // library's background task.
        self.state.client.lock().expect("poisoned").take();
    }
}
