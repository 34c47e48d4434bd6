//! The operator's operations on a Consul backend, as methods of
//! [`ConsulCore`]: `inspect`, `changes`, `list`, `break_lock`, `request_revoke`,
//! `kill_session`, `leftovers` (the backend's `impl Backend` delegates to
//! them). They read with `?consistent` and write with check-and-set txns,
//! and re-read when the lock changed under them.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use quorumlock_core::backend::{holds_linked, ChangeFeed};
use quorumlock_core::{Contender, Error, ErrorKind, LockKind, LockName, LockState, Result};

use crate::api::{op, Block, KvEntry, Record, Txn};
use crate::core::{now_ms, read_view, ConsulCore, LONG_POLL};
use crate::error::map;
use crate::layout::{
    line_kinds, others_ahead, rw_revoke, upgrades, Keys, SemView, View, REVOKE_FLAGS,
    SEMAPHORE_FLAGS,
};

/// How many times an admin operation re-reads and retries when the lock
/// changed under it.
const ADMIN_RETRIES: usize = 8;

/// When entry `e` was written, as our record says.
fn since(e: &KvEntry) -> Option<SystemTime> {
    let ms = e.record()?.since_ms?;
    Some(UNIX_EPOCH + Duration::from_millis(ms))
}

/// Whether `.lock` (`l`, held by session `holder`) is a grant of ours
/// that its taker is giving back: taken while contenders were in line
/// ahead of the taker (the fast path's optimistic take, a late grant), so
/// by the taker's own rule (`mutex::Attempt::own_grant`) it is not held
/// and will go at once. Shown as held, an observer would report a leader
/// that never led. A `.lock` another recipe wrote (`consul lock`) holds
/// whatever the line says.
fn given_back(keys: &Keys, line: &[(LockKind, KvEntry)], l: &KvEntry, holder: &str) -> bool {
    if l.record().is_none() || l.is_broken() {
        return false;
    }
    others_ahead(line, &keys.queue(holder), l.grant_token())
}

impl ConsulCore {
    /// One txn of an admin call (`what` it does, for the error).
    async fn txn(&self, ops: Vec<op::Op>, what: &'static str) -> Result<Txn> {
        self.api.txn(ops).await.map_err(|e| map(e, what))
    }

    /// Every key of one lock, `?consistent`.
    async fn view(&self, keys: &Keys) -> Result<View> {
        read_view(&self.api, keys).await
    }

    /// One listing of a semaphore's prefix `P/` (which covers the lock's
    /// own keys too), `?consistent`.
    async fn list_sem(&self, keys: &Keys) -> Result<(u64, Vec<KvEntry>)> {
        self.api
            .kv_list(
                &keys.sem.prefix,
                Block {
                    index: 0,
                    wait: Duration::ZERO,
                    consistent: true,
                },
            )
            .await
            .map_err(|e| map(e, "reading a lock"))
    }

    /// A semaphore's view and its `.lock`'s index, if a live session holds
    /// a permit; `None` if nobody does.
    async fn held_sem(&self, keys: &Keys) -> Result<Option<(SemView, u64)>> {
        let (idx, entries) = self.list_sem(keys).await?;
        let sv = SemView::from_entries(&keys.sem, idx, entries);
        match &sv.lock {
            Some(l) if !sv.live_holders.is_empty() => {
                let index = l.modify_index;
                Ok(Some((sv, index)))
            }
            _ => Ok(None),
        }
    }

    /// Breaks every live holder of a semaphore at once: one CAS-guarded
    /// txn removes `.lock` and the holders' contender keys and markers.
    /// There is no grace: the permits are free at once, so a holder's
    /// loss signal races the next acquire (the fencing token decides).
    async fn break_sem(&self, keys: &Keys) -> Result<Option<bool>> {
        let Some((sv, lock_index)) = self.held_sem(keys).await? else {
            return Ok(Some(false));
        };
        // `check-index` first: `delete-cas` of a missing key succeeds, and
        // the holders' keys must go only with the `.lock` that named them.
        let mut ops = vec![
            op::check_index(&keys.sem.lock, lock_index),
            op::delete_cas(&keys.sem.lock, lock_index),
        ];
        for h in &sv.live_holders {
            ops.push(op::delete(&keys.sem.contender(h)));
            ops.push(op::delete(&keys.sem.revoke(h)));
        }
        match self.txn(ops, "breaking a semaphore").await? {
            Txn::Done(_) => Ok(Some(true)),
            Txn::Failed(_) => Ok(None),
        }
    }

    /// Marks every live holder of a semaphore (one marker per holder
    /// session, locked by it, naming its contender key's index).
    async fn revoke_sem(&self, keys: &Keys) -> Result<Option<bool>> {
        let Some((sv, lock_index)) = self.held_sem(keys).await? else {
            return Ok(Some(false));
        };
        let mut ops = vec![op::check_index(&keys.sem.lock, lock_index)];
        for h in &sv.live_holders {
            let Some(c) = sv
                .contenders
                .iter()
                .find(|c| c.holder() == Some(h.as_str()))
            else {
                continue;
            };
            if c.record().is_none() {
                tracing::warn!(session = %h, "a semaphore holder is not a quorumlock client (consul lock -n?); it cannot see revoke requests");
                continue;
            }
            let rec = Record {
                quorumlock: 1,
                since_ms: Some(now_ms()),
                token: Some(c.modify_index),
                ..Record::default()
            };
            ops.push(op::lock(
                &keys.sem.revoke(h),
                h,
                REVOKE_FLAGS,
                &rec.encode(),
            ));
        }
        match self.txn(ops, "requesting a revoke").await? {
            Txn::Done(_) => Ok(Some(true)),
            Txn::Failed(_) => Ok(None),
        }
    }

    /// Breaks the holders of a read-write lock in the same two phases as
    /// a mutex: rewrite every holder's entry (its index moves off the
    /// holder's token, its session keeps it, so nobody behind moves up),
    /// wait the lock-delay, delete them. `Ok(false)`: the line changed
    /// under phase 1; re-read.
    async fn break_rw(&self, holders: &[(LockKind, KvEntry)]) -> Result<bool> {
        let grace = self.config.lock_delay;
        let mut at: Vec<(String, u64)> = holders
            .iter()
            .map(|(_, e)| (e.key.clone(), e.modify_index))
            .collect();
        if !grace.is_zero() {
            let rec = Record {
                quorumlock: 1,
                since_ms: Some(now_ms()),
                broken: true,
                ..Record::default()
            };
            let ops = holders
                .iter()
                .map(|(_, e)| op::cas(&e.key, e.modify_index, e.flags, &rec.encode()))
                .collect();
            match self.txn(ops, "breaking a lock").await? {
                Txn::Done(r) => {
                    for (k, i) in at.iter_mut() {
                        if let Some(e) = r.iter().find(|e| &e.key == k) {
                            *i = e.modify_index;
                        }
                    }
                }
                Txn::Failed(errs) => {
                    tracing::debug!(?errs, "the lock changed while breaking it; re-reading");
                    return Ok(false);
                }
            }
            tokio::time::sleep(grace).await;
        }
        // Each holder on its own: one that let go during the grace must
        // not stop the others' deletes. From the back of the line: an
        // upgrade before the upgradeable entry it upgrades (deleted
        // first, that entry would let a writer queued between the two
        // in beside the upgrade, whose key still stands).
        for (k, i) in at.into_iter().rev() {
            let ops = vec![op::delete_cas(&k, i), op::delete(&rw_revoke(&k))];
            self.txn(ops, "breaking a lock").await?;
        }
        Ok(true)
    }

    /// [`Backend::changes`](quorumlock_core::backend::Backend::changes):
    /// blocking queries on the lock's prefix `P/` (our tree and the
    /// semaphore's keys; a nested lock's change brings an item for
    /// nothing), `?consistent` as every read here. The first query does
    /// not block: its index is where the watch starts. Then each answer
    /// with a new index is an item; one with the same index (the wait ran
    /// out) is the watch renewed, once per [`LONG_POLL`]. An index that
    /// went back (a restored snapshot) starts over, as Consul's docs say.
    pub(crate) fn changes(self: &Arc<Self>, name: &LockName) -> ChangeFeed {
        let prefix = Keys::new(&self.config, name).sem.prefix;
        let start = Some((self.clone(), prefix, 0));
        futures::stream::unfold(start, |state| async move {
            let (core, prefix, index) = state?;
            let mut index: u64 = index;
            loop {
                let block = Block {
                    index,
                    wait: LONG_POLL,
                    consistent: true,
                };
                match core.api.kv_list(&prefix, block).await {
                    Ok((now, _)) if index > 0 && now == index => continue,
                    Ok((now, _)) => {
                        // 0 (no index): a non-blocking query again, and
                        // an item each time; never a busy loop.
                        let next = if now < index { 0 } else { now.max(1) };
                        index = next;
                        return Some((Ok(()), Some((core, prefix, index))));
                    }
                    Err(e) => return Some((Err(map(e, "watching a lock")), None)),
                }
            }
        })
        .boxed()
    }

    /// Holders and waiters of lock `name`, as one listing of its keys
    /// shows them (a broken entry is shown neither holding nor waiting, a
    /// `.lock` being given back neither: see [`given_back`]).
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let keys = Keys::new(&self.config, name);
        // One listing of `P/` covers our lock tree `P/.` and the
        // semaphore's contender keys.
        let (idx, entries) = self.list_sem(&keys).await?;
        let sv = SemView::from_entries(&keys.sem, idx, entries.clone());
        let v = View::from_entries(&keys, entries);
        let mut state = LockState::free(name.clone());
        let line = v.line(&keys);
        let holder = v
            .holder()
            .filter(|h| {
                !v.lock
                    .as_ref()
                    .is_some_and(|l| given_back(&keys, &line, l, h))
            })
            .map(str::to_string);
        // A broken entry stays until the break's grace ends, still locked
        // by its holder's session, but its holder has been told of the
        // loss: it is shown neither as holding nor as waiting. It still
        // stands in the line, so nobody behind it is shown as holding.
        if let (Some(l), Some(h)) = (v.lock.as_ref().filter(|l| !l.is_broken()), &holder) {
            state.holders.push(Contender {
                session: h.clone(),
                token: l.grant_token(),
                entry: l.key.clone(),
                kind: LockKind::Exclusive,
                since: since(l),
                value: l.holder_value(),
            });
        }
        let kinds = line_kinds(&line);
        for (i, (kind, q)) in line.iter().enumerate() {
            let c = |token| Contender {
                session: q.holder().unwrap_or_default().to_string(),
                token,
                entry: q.key.clone(),
                kind: *kind,
                since: since(q),
                value: q.holder_value(),
            };
            if q.is_broken() {
                continue;
            }
            if *kind == LockKind::Exclusive {
                if q.holder() != holder.as_deref() {
                    state.waiters.push(c(q.create_index));
                }
            } else if holds_linked(&kinds, i, |a, b| a == b, |a, b| upgrades(&line, a, b)) {
                state.holders.push(c(q.modify_index));
            } else {
                state.waiters.push(c(q.create_index));
            }
        }
        if v.lock.as_ref().is_some_and(|l| l.flags == SEMAPHORE_FLAGS) || !sv.contenders.is_empty()
        {
            let kind = LockKind::Semaphore {
                permits: sv.limit().unwrap_or(0),
            };
            let token = sv.lock.as_ref().map_or(0, |l| l.modify_index);
            for c in &sv.contenders {
                let h = c.holder().unwrap_or_default().to_string();
                let held = sv.live_holders.contains(&h);
                let entry = Contender {
                    session: h,
                    token: if held { token } else { c.create_index },
                    entry: c.key.clone(),
                    kind,
                    since: since(c),
                    value: c.holder_value(),
                };
                if held {
                    state.holders.push(entry);
                } else {
                    state.waiters.push(entry);
                }
            }
        }
        Ok(state)
    }

    /// Every lock under `prefix` (the namespace if `None`) that someone
    /// holds or waits for.
    pub(crate) async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        // One listing finds the names: a lock's own keys sit under
        // `<name>/.` (our layout and `consul lock`) or directly under
        // `<name>/` with the semaphore's flags (`consul lock -n`). Each
        // name is then read as `inspect` reads it.
        let ns = self.config.namespace_prefix();
        let start = match prefix {
            Some(p) => format!("{}/", self.config.lock_prefix(p)),
            None => ns.clone(),
        };
        let (_, entries) = self
            .api
            .kv_list(
                &start,
                Block {
                    index: 0,
                    wait: Duration::ZERO,
                    consistent: true,
                },
            )
            .await
            .map_err(|e| map(e, "listing locks"))?;
        let mut names = std::collections::BTreeSet::new();
        for e in &entries {
            let Some(rest) = e.key.strip_prefix(ns.as_str()) else {
                continue;
            };
            let base = match rest.find("/.") {
                Some(i) => &rest[..i],
                None if e.flags == SEMAPHORE_FLAGS => rest.rsplit_once('/').map_or("", |(b, _)| b),
                None => continue,
            };
            if let Some(name) = LockName::from_key(base) {
                names.insert(name);
            }
        }
        let mut out = Vec::new();
        for name in names {
            let state = self.inspect(&name).await?;
            if !state.is_free() {
                out.push(state);
            }
        }
        Ok(out)
    }

    /// Breaks the holders of lock `name`: a mutex's `.lock` and a
    /// read-write lock's holders in two phases with the lock-delay as
    /// grace, a semaphore's holders at once. `false`: nobody held it.
    pub(crate) async fn break_lock(&self, name: &LockName) -> Result<bool> {
        let keys = Keys::new(&self.config, name);
        let grace = self.config.lock_delay;
        for _ in 0..ADMIN_RETRIES {
            let v = self.view(&keys).await?;
            if v.lock.as_ref().is_some_and(|l| l.flags == SEMAPHORE_FLAGS) {
                match self.break_sem(&keys).await? {
                    Some(r) => return Ok(r),
                    None => continue,
                }
            }
            let (Some(l), Some(h)) = (&v.lock, v.holder()) else {
                let holders = v.rw_holders(&keys);
                if holders.is_empty() {
                    return Ok(false);
                }
                if self.break_rw(&holders).await? {
                    return Ok(true);
                }
                continue;
            };
            let holder = h.to_string();
            // The holder's queue key as it is now (a queued holder has one):
            // phase 2 deletes that one only, never a newer one of the same
            // session (a new acquire after the holder let go).
            let mut holder_queued = v
                .queue
                .iter()
                .find(|q| q.holder() == Some(holder.as_str()))
                .map(|q| (q.key.clone(), q.create_index, q.modify_index));
            let mut at = l.modify_index;
            if !grace.is_zero() {
                // Phase 1: rewrite `.lock` in place. It stays locked by the
                // holder's session, so nobody can take it yet, but its index
                // moves: the holder's monitor reports the loss. Then wait
                // the lock-delay, as Consul does after invalidating a
                // session, so the loss fires before anyone else acquires.
                let rec = Record {
                    quorumlock: 1,
                    since_ms: Some(now_ms()),
                    broken: true,
                    ..Record::default()
                };
                let ops = vec![op::cas(&keys.lock, l.modify_index, l.flags, &rec.encode())];
                match self.txn(ops, "breaking a lock").await? {
                    Txn::Done(r) => {
                        at = r
                            .iter()
                            .find(|e| e.key == keys.lock)
                            .map_or(at, |e| e.modify_index);
                    }
                    Txn::Failed(errs) => {
                        tracing::debug!(?errs, "the lock changed while breaking it; re-reading");
                        continue;
                    }
                }
                tokio::time::sleep(grace).await;
            }
            // Phase 2: delete `.lock` at the index we left it at, the
            // holder's queue key (so our next waiter, which watches it,
            // moves up), and any revoke marker. `check-index` first:
            // `delete-cas` of a missing key succeeds, and a holder that let
            // go during the grace may have queued again since.
            for _ in 0..ADMIN_RETRIES {
                let mut ops = vec![
                    op::check_index(&keys.lock, at),
                    op::delete_cas(&keys.lock, at),
                ];
                if let Some((qkey, _, qindex)) = &holder_queued {
                    ops.push(op::delete_cas(qkey, *qindex));
                }
                ops.push(op::delete(&keys.revoke));
                match self.txn(ops, "breaking a lock").await? {
                    Txn::Done(_) => {
                        tracing::info!(lock = %name, session = %holder, "lock broken");
                        return Ok(true);
                    }
                    Txn::Failed(errs) if !grace.is_zero() => {
                        // During the grace the holder let go (it saw the
                        // loss and released, or its session ended): broken
                        // all the same. Unless `.lock` is still the one we
                        // broke and only the holder's queue key moved (a
                        // waiter that took `.lock` unawares rewrites its key
                        // before it waits again, see the mutex's `settle`):
                        // again, with that key as it is now.
                        let v = self.view(&keys).await?;
                        if v.lock.as_ref().is_none_or(|l| l.modify_index != at) {
                            return Ok(true);
                        }
                        tracing::debug!(?errs, "the holder's queue key moved during the grace");
                        holder_queued = holder_queued.and_then(|(k, c, _)| {
                            v.queue
                                .iter()
                                .find(|q| q.key == k && q.create_index == c)
                                .map(|q| (k, c, q.modify_index))
                        });
                    }
                    Txn::Failed(errs) => {
                        tracing::debug!(?errs, "the lock changed while breaking it; re-reading");
                        break;
                    }
                }
            }
        }
        Err(Error::new(
            ErrorKind::Store,
            format!("lock {name} kept changing while breaking it"),
        ))
    }

    /// Asks the holders of lock `name` to let go: a revoke marker locked
    /// with each holder's session, naming its token. `false`: nobody held
    /// it.
    pub(crate) async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        let keys = Keys::new(&self.config, name);
        for _ in 0..ADMIN_RETRIES {
            let v = self.view(&keys).await?;
            if v.lock.as_ref().is_some_and(|l| l.flags == SEMAPHORE_FLAGS) {
                match self.revoke_sem(&keys).await? {
                    Some(r) => return Ok(r),
                    None => continue,
                }
            }
            let (Some(l), Some(h)) = (&v.lock, v.holder()) else {
                let holders = v.rw_holders(&keys);
                if holders.is_empty() {
                    return Ok(false);
                }
                let mut ops = Vec::new();
                for (_, e) in &holders {
                    let rec = Record {
                        quorumlock: 1,
                        since_ms: Some(now_ms()),
                        token: Some(e.modify_index),
                        ..Record::default()
                    };
                    ops.push(op::check_index(&e.key, e.modify_index));
                    ops.push(op::lock(
                        &rw_revoke(&e.key),
                        e.holder().unwrap_or_default(),
                        REVOKE_FLAGS,
                        &rec.encode(),
                    ));
                }
                match self.txn(ops, "requesting a revoke").await? {
                    Txn::Done(_) => return Ok(true),
                    Txn::Failed(errs) => {
                        tracing::debug!(?errs, "the lock changed while marking it; re-reading");
                        continue;
                    }
                }
            };
            if l.record().is_none() {
                tracing::warn!(lock = %name, session = h,
                    "the holder is not a quorumlock client (consul lock?); it cannot see revoke requests");
                return Ok(true);
            }
            // The marker is locked with the holder's session, and written
            // only while `.lock` is still at the holder's index: it can
            // neither outlive the holder's session nor reach a later holder.
            let rec = Record {
                quorumlock: 1,
                since_ms: Some(now_ms()),
                // The grant's token, which a proclaim keeps (the index
                // moves): what the holder's monitor compares.
                token: Some(l.grant_token()),
                ..Record::default()
            };
            let mut ops = vec![op::check_index(&keys.lock, l.modify_index)];
            if let Some(old) = &v.revoke {
                // An earlier holder's marker, left by a short hold (or ours
                // again): replace it.
                ops.push(op::delete_cas(&keys.revoke, old.modify_index));
            }
            ops.push(op::lock(&keys.revoke, h, REVOKE_FLAGS, &rec.encode()));
            match self.txn(ops, "requesting a revoke").await? {
                Txn::Done(_) => return Ok(true),
                Txn::Failed(errs) => {
                    tracing::debug!(?errs, "the lock changed while marking it; re-reading");
                }
            }
        }
        Err(Error::new(
            ErrorKind::Store,
            format!("lock {name} kept changing while requesting a revoke"),
        ))
    }

    /// Destroys Consul session `session` (its keys go with it).
    pub(crate) async fn kill_session(&self, session: &str) -> Result<()> {
        // Consul's ids are hyphenated UUIDs; it answers anything else with
        // an HTTP 500, which would read as a store fault.
        if session.len() != 36 || uuid::Uuid::try_parse(session).is_err() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{session:?} is not a Consul session id"),
            ));
        }
        self.api
            .session_destroy(session)
            .await
            .map_err(|e| map(e, "destroying a session"))
    }

    /// Keys of our layout left in the namespace, and the sessions this
    /// backend opened that still live.
    pub(crate) async fn leftovers(&self) -> Result<Vec<String>> {
        let prefix = self.config.namespace_prefix();
        let (_, entries) = self
            .api
            .kv_list(
                &prefix,
                Block {
                    index: 0,
                    wait: Duration::ZERO,
                    consistent: true,
                },
            )
            .await
            .map_err(|e| map(e, "listing the namespace"))?;
        let mut out: Vec<String> = entries
            .into_iter()
            .filter(|e| {
                // With an empty namespace the whole KV store is listed:
                // report only keys of our layout there.
                !prefix.is_empty()
                    || e.key.ends_with("/.lock")
                    || e.key.ends_with("/.lock.revoke")
                    || e.key.contains("/.queue/")
                    || e.key.contains("/.rw/")
                    || e.key.contains("/.revoke/")
                    || e.key.starts_with(".fence/")
                    || e.flags == SEMAPHORE_FLAGS
            })
            .map(|e| e.key)
            .collect();
        let opened = self.opened.lock().expect("poisoned").clone();
        let mut gone = Vec::new();
        for id in opened {
            if self
                .api
                .session_exists(&id)
                .await
                .map_err(|e| map(e, "reading a session"))?
            {
                out.push(format!("session {id}"));
            } else {
                gone.push(id);
            }
        }
        self.opened
            .lock()
            .expect("poisoned")
            .retain(|id| !gone.contains(id));
        Ok(out)
    }
}
