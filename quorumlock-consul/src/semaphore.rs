//! Semaphores on the `consul lock -n N` / Go `api.Semaphore` layout (see
//! `layout.rs` for the keys): join, wait in our FIFO among our own
//! contenders, take a permit by CAS of `P/.lock`, leave.

use std::sync::Arc;

use quorumlock_core::backend::{waits_for, AcquireRequest, Acquired};
use quorumlock_core::{Error, ErrorKind, LockKind, Result};

use crate::api::{op, Block, KvEntry, Record, Txn};
use crate::core::{
    failed, now_ms, read_after_lock, session_gone, session_lost, would_block, SemWatched,
    SessionState, Transient, LONG_POLL, MAX_ACQUIRE_RETRIES,
};
use crate::error::map;
use crate::layout::{Keys, SemLock, SemView, SEMAPHORE_FLAGS};

/// Reads `P/` (blocking past `index` if it is not 0).
async fn read_sem(s: &Arc<SessionState>, keys: &Keys, index: u64) -> Result<SemView> {
    let (idx, entries) = s
        .core
        .api
        .kv_list(
            &keys.sem.prefix,
            Block {
                index,
                wait: LONG_POLL,
                consistent: index == 0,
            },
        )
        .await
        .map_err(|e| map(e, "reading a semaphore"))?;
    Ok(SemView::from_entries(&keys.sem, idx, entries))
}

/// Waits until one of `ahead` is gone.
async fn wait_any_gone(s: &Arc<SessionState>, ahead: Vec<KvEntry>) -> Result<()> {
    let waits: Vec<_> = ahead.iter().map(|e| Box::pin(s.wait_gone(e))).collect();
    futures::future::select_all(waits).await.0
}

/// Removes our semaphore contender key, our name from `.lock`'s
/// holders (pruning dead ones; `.lock` goes when nobody holds), and
/// any revoke marker for us, in one txn per attempt: each at the index
/// the read shows (`cas` / `delete-cas`). The contender key and the
/// marker are named by our session, not by the attempt: a copy of the
/// txn that lands late (its answer lost, the removal sent again and
/// done, and this session joined again) finds the newer attempt's keys
/// at other indexes and removes nothing. The client layer keeps the
/// request until this returns, so what our session has here now is
/// this request's. Whether `.lock` named us a holder on the read that
/// the removal went by.
async fn remove_sem(s: &Arc<SessionState>, keys: &Keys) -> Result<bool> {
    let sid = &s.id;
    let contender = keys.sem.contender(sid);
    for _ in 0..MAX_ACQUIRE_RETRIES {
        let v = read_sem(s, keys, 0).await?;
        let mut ops = Vec::new();
        let mut holding = false;
        if let (Some(l), Some(st)) = (&v.lock, &v.state) {
            if l.flags == SEMAPHORE_FLAGS {
                holding = st.holders.contains_key(sid.as_str());
                let rest = v.without(sid, sid);
                if st.holders.contains_key(sid.as_str())
                    || (rest.is_empty() && !st.holders.is_empty())
                {
                    if rest.is_empty() {
                        ops.push(op::delete_cas(&keys.sem.lock, l.modify_index));
                    } else {
                        let new = SemLock {
                            limit: st.limit,
                            holders: rest,
                        };
                        ops.push(op::cas(
                            &keys.sem.lock,
                            l.modify_index,
                            SEMAPHORE_FLAGS,
                            &new.encode(),
                        ));
                    }
                }
            }
        }
        if let Some(e) = v.contenders.iter().find(|e| e.key == contender) {
            ops.push(op::delete_cas(&contender, e.modify_index));
        }
        if let Some(r) = v.revokes.get(sid.as_str()) {
            ops.push(op::delete_cas(&r.key, r.modify_index));
        }
        if ops.is_empty() {
            return Ok(false);
        }
        match s.write(keys, ops, "leaving a semaphore").await? {
            Txn::Done(_) => return Ok(holding),
            Txn::Failed(errs) => {
                tracing::debug!(?errs, "the semaphore changed while leaving it; re-reading");
            }
        }
    }
    // Retryable: the client layer tries again after a pause, until our
    // name is out of `.lock` or the session is gone; a final error
    // would free the local slot with our name still a holder.
    Err(Error::new(
        ErrorKind::Timeout,
        format!("semaphore {} kept changing while leaving it", keys.sem.lock),
    ))
}

/// Takes the sessions `ended` (ours, destroyed by a close: their
/// contender keys and revoke markers went with them) out of `P/.lock`,
/// which no session locks and which would otherwise name them until
/// the next writer of the semaphore prunes them: the `cas` of `.lock`
/// at the index read, without them and without any other dead holder
/// (Go's rule, as every writer applies it), or its `delete-cas` when
/// no live holder is left, as a release does. Called only after the
/// destroys were answered, so no write of theirs can land later (every
/// write that adds a holder checks its session's contender key) and
/// the `?consistent` read sees the last of them. Nothing to do (no
/// `.lock`, not a semaphore's, none of them named): no write.
pub(crate) async fn prune_ended(
    s: &Arc<SessionState>,
    keys: &Keys,
    ended: &std::collections::BTreeSet<String>,
) -> Result<()> {
    for _ in 0..MAX_ACQUIRE_RETRIES {
        let v = read_sem(s, keys, 0).await?;
        let (Some(l), Some(st)) = (&v.lock, &v.state) else {
            return Ok(());
        };
        if l.flags != SEMAPHORE_FLAGS || !st.holders.keys().any(|h| ended.contains(h)) {
            return Ok(());
        }
        let rest: std::collections::BTreeMap<String, bool> = st
            .holders
            .keys()
            .filter(|h| v.alive.contains(*h) && !ended.contains(*h))
            .map(|h| (h.clone(), true))
            .collect();
        let op = if rest.is_empty() {
            op::delete_cas(&keys.sem.lock, l.modify_index)
        } else {
            let new = SemLock {
                limit: st.limit,
                holders: rest,
            };
            op::cas(
                &keys.sem.lock,
                l.modify_index,
                SEMAPHORE_FLAGS,
                &new.encode(),
            )
        };
        match s
            .write(keys, vec![op], "pruning a semaphore's ended holders")
            .await?
        {
            Txn::Done(_) => return Ok(()),
            Txn::Failed(errs) => {
                tracing::debug!(?errs, "the semaphore changed while pruning it; re-reading");
            }
        }
    }
    Err(Error::new(
        ErrorKind::Timeout,
        format!("semaphore {} kept changing while pruning it", keys.sem.lock),
    ))
}

/// A permit of a `consul lock -n N` semaphore (layout in `layout.rs`).
/// Our contenders queue by CreateIndex: one with `permits` or more of
/// ours ahead waits for one of the `permits` nearest to go; one
/// nearer the head adds itself to `.lock`'s holders by CAS when the
/// live holders plus our waiters ahead of it leave a free permit,
/// else it blocks on `P/` (as `consul lock -n` waiters do). The token
/// is the `.lock` index our CAS wrote.
pub(crate) async fn acquire_sem(
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    permits: u32,
) -> Result<Acquired> {
    if !s.liveness.is_alive() {
        return Err(session_lost("the Consul session is lost"));
    }
    let keys = Keys::new(&s.core.config, &req.name);
    let sid = s.id.as_str();
    let contender = keys.sem.contender(sid);
    let record = Record {
        quorumlock: 1,
        contender: Some(req.contender.to_string()),
        since_ms: Some(now_ms()),
        permits: Some(permits),
        ..Record::default()
    }
    .with_value(&req.value);
    let mut transient = Transient::new(req.wait, &s.liveness);
    let read = || read_sem(s, &keys, 0);
    let mut view = join_sem(s, req, &keys, &record, &mut transient).await?;
    let mut retries = 0;
    loop {
        let conflict = conflict(&view, &keys, permits);
        if let Some(msg) = conflict {
            remove_sem(s, &keys).await?;
            return Err(Error::new(ErrorKind::Conflict, msg));
        }
        let ours = view.ours();
        let Some(pos) = ours.iter().position(|e| e.key == contender) else {
            return Err(session_lost(
                "our contender key is gone (session expired or entry deleted)",
            ));
        };
        let my_index = ours[pos].modify_index;
        if let Some(l) = view
            .lock
            .clone()
            .filter(|_| view.live_holders.contains(sid))
        {
            if let Some(held) = retake(s, req, &keys, &l, my_index, &mut transient).await? {
                return Ok(held);
            }
            view = transient.retry(read).await?;
            continue;
        }
        let n = permits as usize;
        // Our contenders are one queue of this count (`conflict` refused
        // any other): with `permits` or more of ours ahead we wait for
        // the entry `permits` places ahead (`waits_for`), watching every
        // entry from it to us, since the release of any of them lets us in.
        let kinds = vec![LockKind::Semaphore { permits }; ours.len()];
        if let Some(j) = waits_for(&kinds, pos) {
            if !req.wait {
                remove_sem(s, &keys).await?;
                return Err(would_block(&keys));
            }
            let ahead: Vec<KvEntry> = ours[j..pos].iter().map(|e| (*e).clone()).collect();
            transient.retry(|| wait_any_gone(s, ahead.clone())).await?;
            view = transient.retry(read).await?;
            continue;
        }
        let waiting_ahead = ours[..pos]
            .iter()
            .filter(|e| !e.holder().is_some_and(|h| view.live_holders.contains(h)))
            .count();
        if view.live_holders.len() + waiting_ahead >= n {
            if !req.wait {
                remove_sem(s, &keys).await?;
                return Err(would_block(&keys));
            }
            let index = view.index.max(1);
            view = transient.retry(|| read_sem(s, &keys, index)).await?;
            continue;
        }
        let mut holders: std::collections::BTreeMap<String, bool> = view
            .live_holders
            .iter()
            .map(|h| (h.clone(), true))
            .collect();
        holders.insert(sid.to_string(), true);
        let new = SemLock {
            limit: permits,
            holders,
        };
        let at = view.lock.as_ref().map_or(0, |l| l.modify_index);
        let ops = vec![
            op::check_session(&contender, sid),
            op::cas(&keys.sem.lock, at, SEMAPHORE_FLAGS, &new.encode()),
            op::get(&keys.sem.lock),
        ];
        match s.write_attempt(&keys, req, ops, "taking a permit").await {
            Ok(Txn::Done(results)) => {
                let token = results
                    .iter()
                    .rev()
                    .find(|e| e.key == keys.sem.lock)
                    .map(|e| e.modify_index)
                    .ok_or_else(|| {
                        Error::new(ErrorKind::Internal, "Consul txn returned no .lock entry")
                    })?;
                return Ok(granted_sem(s, &keys, token, my_index, req));
            }
            Ok(Txn::Failed(errs)) => {
                if errs
                    .iter()
                    .any(|e| e.op_index == 0 || e.what.contains("invalid session"))
                {
                    return Err(session_lost(
                        "our contender key or session is gone (session expired?)",
                    ));
                }
                retries += 1;
                if retries > 1000 {
                    return Err(failed("taking a permit", &errs));
                }
            }
            Err(e) => transient.absorb(e).await?,
        }
        view = transient.retry(read).await?;
    }
}

fn granted_sem(
    s: &Arc<SessionState>,
    keys: &Keys,
    token: u64,
    contender_index: u64,
    req: &AcquireRequest,
) -> Acquired {
    let contender = keys.sem.contender(&s.id);
    s.watch_entry(
        &contender,
        &keys.sem.revoke(&s.id),
        token,
        &req.signals,
        Some(SemWatched {
            lock_key: keys.sem.lock.clone(),
            contender_index,
        }),
    );
    Acquired {
        token,
        entry: contender,
    }
}

/// A base64 value with a trailing newline added (or removed if it has
/// one): a different value that JSON readers take for the same.
fn toggle_trailing_newline(b64: &str) -> String {
    use base64::Engine as _;
    let engine = base64::engine::general_purpose::STANDARD;
    let mut raw = engine.decode(b64).unwrap_or_default();
    if raw.last() == Some(&b'\n') {
        raw.pop();
    } else {
        raw.push(b'\n');
    }
    engine.encode(raw)
}

/// Releases or abandons our permit (or our place in line): out of the
/// monitor's hands, then [`remove_sem`].
pub(crate) async fn remove(s: &Arc<SessionState>, keys: &Keys) -> Result<bool> {
    s.unwatch_key(&keys.sem.contender(&s.id));
    remove_sem(s, keys).await
}

/// Joins the semaphore with our contender key and reads `P/` in one txn;
/// a join whose answer was lost is read back (our key there: it went
/// through).
async fn join_sem(
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    record: &Record,
    transient: &mut Transient<'_>,
) -> Result<SemView> {
    let sid = s.id.as_str();
    let contender = keys.sem.contender(sid);
    loop {
        let ops = vec![
            op::lock(&contender, sid, SEMAPHORE_FLAGS, &record.encode()),
            op::get_tree(&keys.sem.prefix),
        ];
        match s.write_attempt(keys, req, ops, "joining a semaphore").await {
            Ok(Txn::Done(results)) => {
                return Ok(SemView::from_entries(
                    &keys.sem,
                    0,
                    read_after_lock(results),
                ));
            }
            // Our contender key is named by our session (see
            // `session_gone`).
            Ok(Txn::Failed(errs)) if errs.iter().any(|e| session_gone(&e.what)) => {
                return Err(session_lost("the Consul session is gone"));
            }
            Ok(Txn::Failed(errs)) => return Err(failed("joining a semaphore", &errs)),
            Err(e) => {
                transient.absorb(e).await?;
                let v = transient.retry(|| read_sem(s, keys, 0)).await?;
                if v.contenders.iter().any(|e| e.key == contender) {
                    return Ok(v);
                }
            }
        }
    }
}

/// Why we may not take a permit of this semaphore at all: `.lock` is a
/// mutex's, the semaphore has another number of permits, or the prefix
/// holds mutex or read-write entries. `None`: no conflict.
fn conflict(view: &SemView, keys: &Keys, permits: u32) -> Option<String> {
    match (&view.lock, view.limit()) {
        (Some(l), _) if l.flags != SEMAPHORE_FLAGS => Some(format!(
            "{} has flags {:#x}: a mutex owns it, not a semaphore",
            keys.sem.lock, l.flags
        )),
        (_, Some(n)) if n != permits => Some(format!(
            "semaphore {} has {n} permits, not {permits}",
            keys.sem.lock
        )),
        _ if view.lock_entries > 0 => Some(format!(
            "{} is used as a mutex or read-write lock",
            keys.sem.prefix
        )),
        _ => None,
    }
}

/// Our CAS went through but its answer was lost: its index is unknown
/// (another holder's CAS may have moved `.lock` since, and its index is
/// that holder's token). Write `.lock` (`l`, as read) again for a token
/// of our own, larger than every earlier grant's: the same JSON with a
/// trailing newline added or removed (Consul skips a write that changes
/// nothing, index included; JSON readers, Go's too, ignore it). `None`:
/// not done (the semaphore changed, or the answer was lost again): re-read.
async fn retake(
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    l: &KvEntry,
    my_index: u64,
    transient: &mut Transient<'_>,
) -> Result<Option<Acquired>> {
    let sid = s.id.as_str();
    let contender = keys.sem.contender(sid);
    let ops = vec![
        op::check_session(&contender, sid),
        op::cas(
            &keys.sem.lock,
            l.modify_index,
            SEMAPHORE_FLAGS,
            &toggle_trailing_newline(l.value.as_deref().unwrap_or_default()),
        ),
        op::get(&keys.sem.lock),
    ];
    match s.write_attempt(keys, req, ops, "taking a permit").await {
        Ok(Txn::Done(results)) => {
            if let Some(t) = results.iter().rev().find(|e| e.key == keys.sem.lock) {
                return Ok(Some(granted_sem(s, keys, t.modify_index, my_index, req)));
            }
        }
        Ok(Txn::Failed(errs)) => {
            tracing::debug!(?errs, "the semaphore changed; re-reading");
        }
        Err(e) => transient.absorb(e).await?,
    }
    Ok(None)
}
