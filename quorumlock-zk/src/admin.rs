//! The operator's operations on [`ZkCore`]: `inspect`, `changes`, `list`,
//! `break_lock`, `request_revoke`, `kill_session`, `leftovers`. All but
//! `kill_session` and `changes` run through [`ZkCore::with_admin`]:
//! `inspect`, `list` and `request_revoke` on the open lock session's
//! connection, the break and `leftovers` (which wait) on the admin
//! session; `changes` on the admin session too, kept open while it
//! watches ([`ZkCore::follow`]). None creates nodes of its own.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use quorumlock_core::backend::{holds_linked, holds_together, Backoff, ChangeFeed};
use quorumlock_core::{
    Contender, Error, ErrorKind, LockKind, LockName, LockState, LossReason, Result,
};
use zookeeper_client as zk;

use crate::core::{
    registry, session_text, unregister_session, wait_terminal, AdminUse, Registered, ZkCore,
};
use crate::error::map;
use crate::layout::*;

/// Whether a read of a lock shows the nodes an operator's break marked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Marked {
    Hide,
    Show,
}

impl ZkCore {
    /// Holders and waiters of `name`, a break's marked nodes hidden.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.lock_dir(name)?; // checked before anything is sent
        self.with_admin(AdminUse::Brief, |c| self.inspect_once(c, name))
            .await
    }

    /// [`Backend::changes`](quorumlock_core::backend::Backend::changes):
    /// a persistent recursive watch on the lock's node (ZooKeeper >= 3.6),
    /// so every event under it is an item: a contender created or
    /// deleted, a value rewritten, a break's mark, a semaphore's leases.
    /// It runs on the admin session ([`ZkCore::follow`]), not on the lock
    /// session (held that long, the lock session's client would keep
    /// that session open past its close), and not on a session of its
    /// own: a client without a lock session holds one connection, pings
    /// included, whether it observes or not (with one, the watch keeps
    /// the admin session open while it runs). A lost
    /// connection ends the stream (with an error): the library does not
    /// set a persistent watch again after a reconnect, and the server
    /// does not replay what happened meanwhile (ZOOKEEPER-4698); the
    /// watcher then sets a new watch (on a new session if that one
    /// ended) and reads again.
    pub(crate) fn changes(self: &Arc<Self>, name: &LockName) -> ChangeFeed {
        let (core, dir) = (self.clone(), self.lock_dir(name));
        let feed = async move {
            let dir = dir?;
            let follow = core.follow().await?;
            core.count(1); // addWatch
            let watcher = follow
                .client()
                .watch(&dir, zk::AddWatchMode::PersistentRecursive)
                .await
                .map_err(|e| map(e, "watching a lock"))?;
            Ok::<_, Error>((watcher, follow))
        };
        futures::stream::once(feed)
            .flat_map(|opened| match opened {
                Err(e) => futures::stream::once(futures::future::ready(Err(e))).boxed(),
                // The watcher first: it is dropped before the session
                // is let go.
                Ok((watcher, follow)) => futures::stream::once(futures::future::ready(Ok(())))
                    .chain(futures::stream::unfold(
                        (Some(watcher), follow),
                        |(watcher, follow)| async move {
                            let mut watcher = watcher?;
                            loop {
                                let ev = watcher.changed().await;
                                if ev.event_type != zk::EventType::Session {
                                    return Some((Ok(()), (Some(watcher), follow)));
                                }
                                match ev.session_state {
                                    // The library does not set a persistent
                                    // watch again after a reconnect (found by
                                    // the explorer: no event after
                                    // `SyncConnected`), and events in between
                                    // are lost anyway (ZOOKEEPER-4698): end
                                    // here, the watcher sets a new watch
                                    // and reads again.
                                    zk::SessionState::Disconnected => {
                                        let e = Error::new(
                                            ErrorKind::Connection,
                                            "the session watching the lock was disconnected",
                                        );
                                        return Some((Err(e), (None, follow)));
                                    }
                                    s if s.is_terminated() => {
                                        // No event comes after this one.
                                        let e = crate::core::lost_session(&format!(
                                            "the session watching the lock ended ({s})"
                                        ));
                                        return Some((Err(e), (None, follow)));
                                    }
                                    _ => {}
                                }
                            }
                        },
                    ))
                    .boxed(),
            })
            .boxed()
    }

    /// Every lock under `prefix` (or the namespace) that someone holds or
    /// waits for.
    pub(crate) async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        if let Some(p) = prefix {
            self.lock_dir(p)?; // checked before anything is sent
        }
        self.with_admin(AdminUse::Brief, |c| self.list_once(c, prefix))
            .await
    }

    /// Marks every holder's node `__BREAK__`, then deletes it; whether a
    /// holder was broken.
    pub(crate) async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.lock_dir(name)?; // checked before anything is sent
        self.with_admin(AdminUse::Waits, |c| self.break_once(c, name))
            .await
    }

    /// Writes a revoke request for every holder; whether one was written.
    pub(crate) async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.lock_dir(name)?; // checked before anything is sent
        self.with_admin(AdminUse::Brief, |c| self.revoke_once(c, name))
            .await
    }

    /// Nodes under the namespace and sessions of this backend still open.
    pub(crate) async fn leftovers(&self) -> Result<Vec<String>> {
        self.with_admin(AdminUse::Waits, |c| self.leftovers_once(c))
            .await
    }

    /// Ends a session opened in this process: ZooKeeper ends a session
    /// only for a client that presents its id and password (see
    /// [`registry`]).
    pub(crate) async fn kill_session(&self, session: &str) -> Result<()> {
        let id = session
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(|v| v as i64)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("{session:?} is not a ZooKeeper session id (0x...)"),
                )
            })?;
        let known = registry()
            .lock()
            .expect("registry poisoned")
            .get(&id)
            .cloned();
        let Some(Registered {
            info,
            liveness,
            state: victim,
            shutdown,
        }) = known
        else {
            return Err(Error::new(
                ErrorKind::Store,
                format!(
                    "cannot kill session {session}: ZooKeeper ends a session only for a client that knows its password, \
                     and only sessions opened in this process are known"
                ),
            ));
        };
        // ZooKeeper itself expires a session only after its owner has been
        // silent for the whole timeout, by which time the owner's local
        // deadline has fired. Ending it at once from outside has no such
        // order, so the owner (in this process) is told first.
        if let Some(l) = liveness.upgrade() {
            l.lose(LossReason::SessionExpired);
        }
        // The owner's client closes the session itself once dropped; that
        // is quick when it is connected.
        if let Some(shutdown) = shutdown {
            shutdown();
            if wait_terminal(victim.clone(), Duration::from_secs(1)).await {
                unregister_session(zk::SessionId(id));
                tracing::info!(%session, "session killed (closed by its owner's client)");
                return Ok(());
            }
        }
        // Else reattach with the session's id and password, then close it:
        // the server ends the session and drops its ephemeral nodes; the
        // original client learns on its next reconnect that it expired.
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(400));
        for _ in 0..5 {
            match self.connect(Some(info.clone())).await {
                Ok((c, _)) => {
                    let state = c.state_watcher();
                    self.count(1); // closeSession
                    drop(c);
                    if wait_terminal(state, self.config.connect_timeout).await {
                        // Closed on the server; the owner's client learns
                        // it on its next reconnect.
                        unregister_session(zk::SessionId(id));
                        tracing::info!(%session, "session killed");
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == ErrorKind::SessionLost => {
                    unregister_session(zk::SessionId(id));
                    return Ok(()); // already gone
                }
                Err(e) if e.is_retryable() => backoff.wait().await,
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::Connection,
            format!("could not end session {session}"),
        ))
    }

    /// A `sync` first: the server our session reads from then has every
    /// write the leader had when it answered, so a read after a change
    /// [`changes`](Self::changes) saw on another session (maybe another
    /// server) never shows the state before it.
    async fn inspect_once(&self, c: zk::Client, name: &LockName) -> Result<LockState> {
        self.sync_lock(&c, name).await?;
        self.read_state(c, name, Marked::Hide).await
    }

    /// Syncs the server of `c` with the leader for lock `name`'s reads.
    async fn sync_lock(&self, c: &zk::Client, name: &LockName) -> Result<()> {
        let dir = self.lock_dir(name)?;
        self.count(1);
        match c.sync(&dir).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(map(e, "syncing with the leader")),
        }
    }

    /// The lock as `inspect` shows it, or with the nodes a break marked
    /// shown as holding ([`Marked::Show`]): a break finds those too, so a
    /// mark whose breaker died before its delete is broken again.
    async fn read_state(
        &self,
        c: zk::Client,
        name: &LockName,
        marked: Marked,
    ) -> Result<LockState> {
        let dir = self.lock_dir(name)?;
        let mut state = LockState::free(name.clone());
        self.count(1);
        let children = match c.list_children(&dir).await {
            Ok(ch) => ch,
            Err(zk::Error::NoNode) => return Ok(state),
            Err(e) => return Err(map(e, "listing contenders")),
        };
        let semaphore = children.iter().any(|c| c == SEM_LEASES || c == SEM_LOCKS);
        let sorted = sort_contenders(children);
        // Pipelined: every request is sent before the first reply is read.
        self.count(sorted.len() as u64);
        let reads =
            futures::future::join_all(sorted.iter().map(|s| c.get_data(&format!("{dir}/{s}"))))
                .await;
        let mut alive = Vec::new();
        for (child, read) in sorted.into_iter().zip(reads) {
            match read {
                Ok((data, st)) => {
                    let role = classify(&child).map_or(Role::Mutex, |(r, _)| r);
                    let entry = format!("{dir}/{child}");
                    let mut cont = contender(&st, entry, role.kind());
                    cont.value = crate::layout::node_value(&data);
                    alive.push((cont, crate::layout::is_broken(&data)));
                }
                Err(zk::Error::NoNode) => {} // gone meanwhile
                Err(e) => return Err(map(e, "reading a contender")),
            }
        }
        // A node a break marked still stands in the line until the break
        // deletes it (nobody behind it holds yet) but is shown neither as
        // holding nor as waiting: its holder has been told of the loss.
        let kinds: Vec<LockKind> = alive.iter().map(|(cont, _)| cont.kind).collect();
        let names: Vec<String> = alive
            .iter()
            .map(|(cont, _)| {
                cont.entry
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let link = crate::layout::links(&names);
        for (i, (cont, broken)) in alive.into_iter().enumerate() {
            if broken && marked == Marked::Hide {
                continue;
            }
            if holds_linked(&kinds, i, |a, b| a == b, link) {
                state.holders.push(cont);
            } else {
                state.waiters.push(cont);
            }
        }
        if semaphore {
            self.inspect_semaphore(&c, &dir, &mut state, marked).await?;
        }
        Ok(state)
    }

    /// Leases (holders: the first `permits` of them by sequence; a lease
    /// beyond that belongs to the waiter that holds the internal mutex),
    /// then the internal mutex's queue (without that waiter's node).
    async fn inspect_semaphore(
        &self,
        c: &zk::Client,
        dir: &str,
        state: &mut LockState,
        marked: Marked,
    ) -> Result<()> {
        let leases_dir = format!("{dir}/{SEM_LEASES}");
        let locks_dir = format!("{dir}/{SEM_LOCKS}");
        self.count(2);
        let (leases, locks) =
            futures::join!(c.list_children(&leases_dir), c.list_children(&locks_dir));
        let leases = match leases {
            Ok(l) => sort_by_marker(l, LEASE_MARKER),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, "listing leases")),
        };
        let locks = match locks {
            Ok(l) => sort_by_marker(l, LOCK_MARKER),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, "listing the semaphore's queue")),
        };
        self.count((leases.len() + locks.len()) as u64);
        let lease_reads = futures::future::join_all(
            leases
                .iter()
                .map(|l| c.get_data(&format!("{leases_dir}/{l}"))),
        );
        let lock_stats = futures::future::join_all(
            locks
                .iter()
                .map(|l| c.check_stat(&format!("{locks_dir}/{l}"))),
        );
        let (lease_reads, lock_stats) = futures::join!(lease_reads, lock_stats);
        let mut found = Vec::new();
        let mut permits = None;
        for (child, r) in leases.iter().zip(lease_reads) {
            match r {
                Ok((data, st)) => {
                    permits = permits.or(parse_permits(&data));
                    found.push((child, st, data));
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map(e, "reading a lease")),
            }
        }
        let permits = permits.unwrap_or(found.len() as u32);
        let kind = LockKind::Semaphore { permits };
        // The leases in sequence order are the semaphore's queue.
        let kinds = vec![kind; found.len()];
        // The leases of one request of several permits (one GUID, side
        // by side) hold together.
        let lease_guids: Vec<_> = found.iter().map(|(c, _, _)| guid_prefix(c)).collect();
        let same =
            |a: usize, b: usize| lease_guids[a].is_some() && lease_guids[a] == lease_guids[b];
        let mut guids = Vec::new();
        let mut waiting_lease_owner = None;
        for (i, (child, st, data)) in found.iter().enumerate() {
            guids.extend(guid_prefix(child));
            let mut cont = contender(st, format!("{leases_dir}/{child}"), kind);
            cont.value = crate::layout::lease_value(data);
            if crate::layout::is_broken(data) && marked == Marked::Hide {
                continue; // as a broken node above: in the count, not shown
            }
            if holds_together(&kinds, i, same) {
                state.holders.push(cont);
            } else {
                waiting_lease_owner = Some(st.ephemeral_owner);
                state.waiters.push(cont);
            }
        }
        for (i, (child, r)) in locks.iter().zip(lock_stats).enumerate() {
            match r {
                Ok(Some(st)) => {
                    // The mutex holder is already shown by its lease: ours
                    // share the GUID; Curator's (another GUID) is the first
                    // in the queue, of the same session as the lease beyond
                    // the permits.
                    if guid_prefix(child).is_some_and(|g| guids.contains(&g))
                        || (i == 0 && waiting_lease_owner == Some(st.ephemeral_owner))
                    {
                        continue;
                    }
                    state
                        .waiters
                        .push(contender(&st, format!("{locks_dir}/{child}"), kind));
                }
                Ok(None) => {}
                Err(e) => return Err(map(e, "reading a semaphore waiter")),
            }
        }
        Ok(())
    }

    /// Walks the tree under `prefix` (or the namespace): a node with
    /// contender children (or a semaphore's `leases`/`locks`) is a lock and
    /// is inspected; its other children are nested locks and walked too.
    async fn list_once(&self, c: zk::Client, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        // (node path, the lock's key below the namespace and its name).
        type Node = (String, Option<(String, Option<LockName>)>);
        let mut stack: Vec<Node> = match prefix {
            Some(p) => vec![(
                self.lock_dir(p)?,
                Some((p.key().into_owned(), Some(p.clone()))),
            )],
            None => vec![(self.root(), None)],
        };
        let mut out = Vec::new();
        while let Some((path, name)) = stack.pop() {
            self.count(1);
            let children = match c.list_children(&path).await {
                Ok(ch) => ch,
                Err(zk::Error::NoNode) => continue, // reaped meanwhile
                Err(e) => return Err(map(e, "listing locks")),
            };
            let layout_child =
                |ch: &str| classify(ch).is_some() || ch == SEM_LEASES || ch == SEM_LOCKS;
            for child in &children {
                if name.is_some() && layout_child(child) {
                    continue;
                }
                if path == "/" && child == "zookeeper" {
                    continue;
                }
                let nested = match &name {
                    Some((k, _)) => format!("{k}/{child}"),
                    None => child.clone(),
                };
                // Nodes whose keys no lock has are someone else's, but
                // `~` (an escaped empty first segment, as in `/x`) is no
                // lock and leads to some.
                let nested_name = LockName::from_key(&nested);
                if nested_name.is_some() || nested == "~" {
                    let base = if path == "/" { "" } else { path.as_str() };
                    stack.push((format!("{base}/{child}"), Some((nested, nested_name))));
                }
            }
            if let Some((_, Some(name))) = name {
                if children.iter().any(|ch| layout_child(ch)) {
                    let state = self.inspect_once(c.clone(), &name).await?;
                    if !state.is_free() {
                        out.push(state);
                    }
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn break_once(&self, c: zk::Client, name: &LockName) -> Result<bool> {
        loop {
            // Synced first: a holder granted through another server before
            // the break was called is among those it breaks.
            self.sync_lock(&c, name).await?;
            let state = self.read_state(c.clone(), name, Marked::Show).await?;
            if state.holders.is_empty() {
                return Ok(false);
            }
            let mut broke = false;
            // Mark every holder first: each of ours watches its own node
            // (a request of several permits only its last lease) and
            // reports the loss on this write, before any delete below
            // can let a waiter in.
            let mut marked = Vec::new();
            for h in &state.holders {
                self.count(1);
                match c.set_data(&h.entry, BREAK_MESSAGE, None).await {
                    Ok(_) => marked.push(&h.entry),
                    Err(zk::Error::NoNode) => continue, // released meanwhile
                    Err(e) => return Err(map(e, "marking the holder's node")),
                }
            }
            if !marked.is_empty() {
                // A holder of the last few milliseconds may not watch its
                // node yet (it starts HELD_WATCH_DELAY after the grant, and
                // then reads the mark): give it that long before the
                // deletes can let a waiter in.
                tokio::time::sleep(2 * quorumlock_core::backend::HELD_WATCH_DELAY).await;
            }
            for entry in marked {
                self.count(1);
                match c.delete(entry, None).await {
                    // Gone already: our holder saw the mark and let go.
                    Ok(()) | Err(zk::Error::NoNode) => {
                        tracing::info!(lock = %name, node = %entry, "lock broken");
                        broke = true;
                    }
                    Err(e) => return Err(map(e, "deleting the holder's node")),
                }
            }
            if broke {
                return Ok(true);
            }
            // Every holder went before we could mark it: look again.
        }
    }

    async fn revoke_once(&self, c: zk::Client, name: &LockName) -> Result<bool> {
        let dir = self.lock_dir(name)?;
        loop {
            let state = self.inspect_once(c.clone(), name).await?;
            if state.holders.is_empty() {
                return Ok(false);
            }
            let mut marked = false;
            for h in &state.holders {
                let done = match h.kind {
                    LockKind::Election => self.mark_leader(&c, &dir, &h.entry).await?,
                    _ => self.mark_holder(&c, &h.entry).await?,
                };
                marked |= done;
            }
            if marked {
                return Ok(true);
            }
        }
    }

    /// Writes the revoke marker on a holder's node (Curator's `Revoker`
    /// protocol); whether the node was there, held. The write is
    /// conditional on the data version just read, and a node that a
    /// break marked is left alone: a break's mark landing between the
    /// `inspect` above and this write was overwritten before (an
    /// unconditional write), which hid the break from its holder until
    /// the delete and let its fenced writes through, for good if the
    /// breaker died (issue 39, suspicion 1; `tests/break_marks.rs`).
    ///
    /// A lease keeps its permit count after the marker, but only a count
    /// read from that lease's own data: `inspect` guesses the count when
    /// only Curator's leases (whose data is a host address) are present,
    /// and a guess written here would later be read back as a fact (a
    /// semaphore of another count then failed with `Conflict`).
    async fn mark_holder(&self, c: &zk::Client, node: &str) -> Result<bool> {
        loop {
            self.count(1);
            let (data, stat) = match c.get_data(node).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(map(e, "reading the holder's node")),
            };
            if is_broken(&data) {
                return Ok(false); // broken: its holder has been told
            }
            let mut marker = REVOKE_MESSAGE.to_vec();
            if let Some(permits) = parse_permits(&data) {
                marker.push(b' ');
                marker.extend(permits_data(permits, b""));
            }
            self.count(1);
            match c.set_data(node, &marker, Some(stat.version)).await {
                Ok(_) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(false),
                Err(zk::Error::BadVersion) => continue, // written meanwhile: read again
                Err(e) => return Err(map(e, "marking the holder's node for revoke")),
            }
        }
    }

    /// A revoke request on an election's leader `node`: written into the
    /// election's node `dir` ([`election_revoke_data`]), which our leader
    /// watches, in one transaction with a check that `node` still exists;
    /// the leader's own node, its value and data version stay as they
    /// are. Whether the leader was there.
    async fn mark_leader(&self, c: &zk::Client, dir: &str, node: &str) -> Result<bool> {
        let child = node.rsplit('/').next().unwrap_or(node);
        let data = election_revoke_data(child);
        let mut m = c.new_multi_writer();
        m.add_check_version(node, -1)
            .and_then(|()| m.add_set_data(dir, &data, None))
            .map_err(|e| map(e, "revoke request"))?;
        self.count(1);
        match m.commit().await {
            Ok(_) => Ok(true),
            // The leader went meanwhile (and with the last candidate, the
            // election's node).
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NoNode,
                ..
            }) => Ok(false),
            Err(e) => Err(map(e.into(), "marking the election for revoke")),
        }
    }

    async fn leftovers_once(&self, c: zk::Client) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.walk(&c, self.root(), &mut out).await?;
        let opened = self.opened.lock().expect("poisoned").clone();
        for (id, state) in opened {
            // A session being closed (or whose expiry its client is about
            // to learn) gets a moment to reach its terminal state.
            let limit = self.config.connect_timeout.min(Duration::from_secs(3));
            if !wait_terminal(state, limit).await {
                out.push(format!("session {} still open", session_text(id.0)));
            }
        }
        Ok(out)
    }

    /// Whether the data of the lock node `path` is an election's revoke
    /// request ([`election_revoke_data`]) and nothing else. Our leader
    /// clears it when it sees it, and the next leader of ours clears a
    /// stale one; one that neither saw (a Curator leader's, or one written
    /// as its leader resigned) stays until the server reaps the node once
    /// it is empty: that is no leftover of a client.
    async fn revoke_mark_only(&self, c: &zk::Client, path: &str) -> Result<bool> {
        self.count(1);
        match c.get_data(path).await {
            Ok((data, _)) => Ok(election_revoke_target(&data).is_some()),
            Err(zk::Error::NoNode) => Ok(true), // gone meanwhile: nothing left
            Err(e) => Err(map(e, "reading a lock node")),
        }
    }

    async fn walk(&self, c: &zk::Client, path: String, out: &mut Vec<String>) -> Result<()> {
        let mut stack = vec![path];
        let root = self.root();
        while let Some(p) = stack.pop() {
            self.count(1);
            let (children, stat) = match c.get_children(&p).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map(e, "listing the namespace")),
            };
            // The server shows containers as plain persistent nodes
            // (ephemeralOwner 0), so empty parents are not told apart from
            // containers; we never create persistent nodes, only
            // containers (reaped by the server) and ephemeral contenders.
            let owner = stat.ephemeral_owner;
            if owner != 0 {
                out.push(format!(
                    "{p} (ephemeral node of session {})",
                    session_text(owner)
                ));
            } else if stat.data_length > 0 && p != root && !self.revoke_mark_only(c, &p).await? {
                out.push(format!("{p} (parent node with data)"));
            }
            for child in children {
                if p == "/" && child == "zookeeper" {
                    continue;
                }
                let base = if p == "/" { String::new() } else { p.clone() };
                stack.push(format!("{base}/{child}"));
            }
        }
        Ok(())
    }
}

/// A contender as `inspect` reports it.
fn contender(st: &zk::Stat, entry: String, kind: LockKind) -> Contender {
    Contender {
        session: session_text(st.ephemeral_owner),
        token: st.czxid as u64,
        entry,
        kind,
        since: u64::try_from(st.ctime)
            .ok()
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        value: Vec::new(),
    }
}
