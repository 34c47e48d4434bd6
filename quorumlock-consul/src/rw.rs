//! Read-write locks on our own layout: one entry per attempt,
//! `<prefix>/.rw/<session>-<contender>`, in the line that mutexes of the
//! same name share.

use std::sync::Arc;

use quorumlock_core::backend::{
    entry_gone, refused_upgrade, upgrade_refused, waits_for_linked, AcquireRequest, Acquired,
};
use quorumlock_core::{Error, ErrorKind, Result};

use crate::api::{op, Record, Txn};
use crate::core::{
    failed, now_ms, read_after_lock, read_view, session_gone, session_lost, would_block,
    SessionState, Transient, MAX_ACQUIRE_RETRIES,
};
use crate::layout::{line_kinds, rw_flags, rw_revoke, upgrades, Keys, View, LOCK_FLAGS};

/// Removes a read-write entry of this session and its revoke marker.
async fn remove_rw(s: &Arc<SessionState>, keys: &Keys, entry: &str) -> Result<()> {
    let ops = vec![
        op::check_session(entry, &s.id),
        op::delete(entry),
        op::delete(&rw_revoke(entry)),
    ];
    // Rolled back: the entry is not this session's (gone already).
    s.write(keys, ops, "removing our entry").await?;
    Ok(())
}

/// Read or write side of a read-write lock: one entry per attempt,
/// `<prefix>/.rw/<session>-<contender>`, in the line that mutexes of
/// the same name share (ordered by CreateIndex). A writer waits for its
/// predecessor, a reader for the nearest writer or mutex ahead.
///
/// The grant is decided in the txn that gives the token: the join
/// (`lock` of the entry + `get-tree`) when it finds us holding by our
/// place; after any wait, a `cas` of our entry at the index we read
/// (so never an entry an operator rewrote as broken, or deleted) +
/// `get-tree`. The token is the index of that write, like a mutex's
/// `.lock` write at its grant: tokens of every kind on one name grow
/// in grant order (a mutex granted while we waited got a smaller one).
///
/// # Cancel safety
/// Every write runs to its end if dropped; the `abandon` that follows
/// removes our entry.
pub(crate) async fn acquire_rw(s: &Arc<SessionState>, req: &AcquireRequest) -> Result<Acquired> {
    if !s.liveness.is_alive() {
        return Err(session_lost("the Consul session is lost"));
    }
    let keys = Keys::new(&s.core.config, &req.name);
    let entry = keys.request_entry(&s.id, req);
    let revoke = rw_revoke(&entry);
    let flags = rw_flags(req.kind);
    let record = Record {
        quorumlock: 1,
        contender: Some(req.contender.to_string()),
        since_ms: Some(now_ms()),
        ..Record::default()
    }
    .with_value(&req.value);
    let mut transient = Transient::new(req.wait, &s.liveness);
    let read = || read_view(&s.core.api, &keys);
    // Whether `view` was read in the txn that wrote our entry at its
    // current index (then a grant by place in it is decided there).
    let (mut view, mut decided_in_write) =
        join(s, req, &keys, &entry, flags, &record, &mut transient).await?;
    let leave = || async {
        remove_rw(s, &keys, &entry).await?;
        Err::<Acquired, Error>(would_block(&keys))
    };
    let mut retries = 0;
    loop {
        refuse_foreign_lock(s, &keys, &entry, &view).await?;
        let line = view.line(&keys);
        let Some(pos) = line
            .iter()
            .position(|(_, e)| e.key == entry && e.holder() == Some(s.id.as_str()))
        else {
            return Err(session_lost(
                "our entry is gone (session expired or entry deleted)",
            ));
        };
        let ours = line[pos].1.clone();
        if ours.is_broken() {
            // An operator broke the holders while our grant was on its
            // way: it is not ours to hold. The client layer removes the
            // entry (ending the break) and asks again.
            return Err(session_lost(
                "our entry was broken by an operator before its grant",
            ));
        }
        // The entry ahead whose removal we wait for: for a reader, the
        // nearest writer or mutex ahead; for a writer, whoever is just
        // ahead (our entry's kind in the line is `req.kind`).
        let kinds = line_kinds(&line);
        if upgrade_refused(&kinds, pos, |a, b| upgrades(&line, a, b)) {
            remove_rw(s, &keys, &entry).await?;
            return Err(refused_upgrade(&req.name));
        }
        let waited = waits_for_linked(&kinds, pos, |a, b| upgrades(&line, a, b));
        if let Some(b) = waited.map(|j| line[j].1.clone()) {
            if !req.wait {
                return leave().await;
            }
            transient.retry(|| s.wait_gone(&b)).await?;
            view = transient.retry(read).await?;
            decided_in_write = false;
            continue;
        }
        // Our own mutex holders are in the line ahead of us; a `.lock`
        // held now is a `consul lock` run (or a session whose end is
        // not processed yet): wait for it.
        if let Some(l) = view.lock.clone().filter(|l| l.holder().is_some()) {
            if !req.wait {
                return leave().await;
            }
            transient.retry(|| s.wait_lock(&keys, &l)).await?;
            view = transient.retry(read).await?;
            decided_in_write = false;
            continue;
        }
        if decided_in_write {
            let token = ours.modify_index;
            s.watch_key(&entry, &revoke, token, &req.signals);
            return Ok(Acquired { token, entry });
        }
        // Granted by our place in a read: write our entry again (at the
        // index read, so not if it was broken or deleted since) and
        // read the lock in the same txn, which decides.
        // The value changes (it names the index it replaces): Consul
        // skips a write that changes nothing, index included (seen on
        // 1.8.7 for a key without a session; a locked key's `cas` still
        // moved its index there, but only because the op names no
        // session: not something to rely on).
        let stamp = Record {
            token: Some(ours.modify_index),
            ..record.clone()
        };
        let ops = vec![
            op::cas(&entry, ours.modify_index, flags, &stamp.encode()),
            op::get_tree(&keys.tree),
        ];
        match s.write_attempt(&keys, req, ops, "taking the lock").await {
            Ok(Txn::Done(results)) => {
                view = View::from_entries(&keys, read_after_lock(results));
                decided_in_write = true;
            }
            Ok(Txn::Failed(errs)) => {
                // Our entry changed (broken, or gone with the session):
                // the re-read tells.
                retries += 1;
                if retries > MAX_ACQUIRE_RETRIES {
                    return Err(failed("taking the lock", &errs));
                }
                view = transient.retry(read).await?;
            }
            Err(e) => {
                transient.absorb(e).await?;
                view = transient.retry(read).await?;
            }
        }
    }
}

/// `.lock` belongs to another recipe (a `consul lock -n` semaphore?):
/// our entry goes, and the error says whose it is.
async fn refuse_foreign_lock(
    s: &Arc<SessionState>,
    keys: &Keys,
    entry: &str,
    view: &View,
) -> Result<()> {
    match &view.lock {
        Some(l) if l.flags != LOCK_FLAGS => {
            remove_rw(s, keys, entry).await?;
            Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "{} has flags {:#x}, not the lock flags {LOCK_FLAGS:#x}: another recipe (a consul lock -n semaphore?) owns it",
                    keys.lock, l.flags
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Releases a held read or write entry: one txn, the entry at our token
/// and its revoke marker; if it is not at our token any more (gone, or
/// rewritten by a break), removes what this session has of it and
/// reports the loss.
pub(crate) async fn release(
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    held: &Acquired,
) -> Result<()> {
    s.unwatch_key(&held.entry);
    // `check-index` fails on a missing key; `delete-cas` alone would not.
    let ops = vec![
        op::check_index(&held.entry, held.token),
        op::delete_cas(&held.entry, held.token),
        op::delete(&rw_revoke(&held.entry)),
    ];
    match s.write(keys, ops, "releasing").await? {
        Txn::Done(_) => Ok(()),
        Txn::Failed(_) => {
            remove_rw(s, keys, &held.entry).await?;
            Err(entry_gone(req))
        }
    }
}

/// Abandons attempt `req`: removes its entry, wherever it is in line.
pub(crate) async fn abandon(
    s: &Arc<SessionState>,
    keys: &Keys,
    req: &AcquireRequest,
) -> Result<()> {
    let entry = keys.request_entry(&s.id, req);
    s.unwatch_key(&entry);
    remove_rw(s, keys, &entry).await
}

/// Joins the line with our entry `entry` and reads the whole lock in one
/// txn. The view, and whether it was read in that txn (`false`: the
/// join's answer was lost, and a read shows our entry, so it went
/// through).
async fn join(
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    entry: &str,
    flags: u64,
    record: &Record,
    transient: &mut Transient<'_>,
) -> Result<(View, bool)> {
    loop {
        let ops = vec![
            op::lock(entry, &s.id, flags, &record.encode()),
            op::get_tree(&keys.tree),
        ];
        match s.write_attempt(keys, req, ops, "joining the queue").await {
            Ok(Txn::Done(results)) => {
                return Ok((View::from_entries(keys, read_after_lock(results)), true));
            }
            // Our entry's key is named by our session: a lock-delay on
            // it means our own session was invalidated (Consul checks
            // the delay before the session, so it says that instead).
            Ok(Txn::Failed(errs)) if errs.iter().any(|e| session_gone(&e.what)) => {
                return Err(session_lost("the Consul session is gone"));
            }
            Ok(Txn::Failed(errs)) => return Err(failed("joining the queue", &errs)),
            Err(e) => {
                transient.absorb(e).await?;
                let v = transient.retry(|| read_view(&s.core.api, keys)).await?;
                if v.rw.iter().any(|e| e.key == entry) {
                    return Ok((v, false));
                }
            }
        }
    }
}
