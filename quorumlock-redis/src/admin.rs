//! The operator's operations on [`RedisCore`]: inspect, follow a lock's
//! changes, list, break a lock, request a revoke, kill a session,
//! leftovers. Which entry holds
//! is decided by the scripts, on the server (`holds` in
//! [`scripts`](crate::scripts), checked against
//! `quorumlock_core::backend::holds`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures::StreamExt;
use quorumlock_core::backend::{notified_feed, ChangeFeed, Notice, SessionExpiries};
use tokio::time::Instant;

use quorumlock_core::{Contender, Error, ErrorKind, LockName, LockState, Result};

use crate::core::RedisCore;
use crate::error;
use crate::layout;
use crate::scripts;

/// One row of the INSPECT script's answer.
struct Row {
    contender: String,
    kind: quorumlock_core::LockKind,
    sid: String,
    created: u64,
    token: u64,
    seq: u64,
    holds: bool,
    value: Vec<u8>,
}

fn rows(flat: Vec<Vec<u8>>) -> Result<Vec<Row>> {
    let bad = || Error::new(ErrorKind::Internal, "the inspect script answered garbage");
    flat.chunks(9)
        .map(|c| {
            let [id, kind, permits, sid, created, token, seq, holds, value] = c else {
                return Err(bad());
            };
            let text = |s: &Vec<u8>| String::from_utf8(s.clone()).map_err(|_| bad());
            let num = |s: &Vec<u8>| text(s)?.parse::<u64>().map_err(|_| bad());
            Ok(Row {
                contender: text(id)?,
                kind: layout::kind_of(&text(kind)?, num(permits)? as u32),
                sid: text(sid)?,
                created: num(created)?,
                token: num(token)?,
                seq: num(seq)?,
                holds: holds == b"1",
                value: value.clone(),
            })
        })
        .collect()
}

impl RedisCore {
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let key = self.lock_key(name);
        let mut inv = scripts::INSPECT.prepare_invoke();
        inv.arg(&self.prefix).arg(&key);
        let flat: Vec<Vec<u8>> = self.script("inspect", &inv).await?;
        let mut state = LockState::free(name.clone());
        for r in rows(flat)? {
            let c = Contender {
                session: r.sid,
                token: if r.holds { r.token } else { r.seq },
                entry: layout::entry_name(&key, &r.contender),
                kind: r.kind,
                since: Some(UNIX_EPOCH + Duration::from_millis(r.created)),
                value: r.value,
            };
            if r.holds {
                state.holders.push(c);
            } else {
                state.waiters.push(c);
            }
        }
        Ok(state)
    }

    /// [`Backend::changes`](quorumlock_core::backend::Backend::changes):
    /// a subscription (a connection of its own) to the lock's channel,
    /// where every script that changes its queue publishes. A session
    /// that expires changes nothing until a script next loads the queue,
    /// so the stream also wakes when the first session owning an entry is
    /// due to expire ([`scripts::SESSION_EXPIRIES`], read after each
    /// change): an item if one did, else it sleeps until the next. Each
    /// renewal's audit (`monitor.rs`) publishes on the channel too:
    /// heard, it moves its session's expiry without a read, so while
    /// nothing changes and the holders renew, nothing is sent.
    pub(crate) fn changes(self: &Arc<Self>, name: &LockName) -> ChangeFeed {
        let (core, key) = (self.clone(), self.lock_key(name));
        notified_feed(async move {
            core.requests.fetch_add(2, Ordering::Relaxed); // connect, SUBSCRIBE
            let timeout = core.config.timeout;
            let subscribe = async {
                let mut ps = core.client.get_async_pubsub().await?;
                ps.subscribe(format!("{key}/.changes")).await?;
                Ok::<_, redis::RedisError>(ps)
            };
            let ps = tokio::time::timeout(timeout, subscribe)
                .await
                .map_err(|_| error::timed_out("subscribing to a lock's changes", timeout))?
                .map_err(|e| error::map(e, "subscribing to a lock's changes"))?;
            let (sink, messages) = ps.split();
            // The heartbeat pings the subscription's own connection: the
            // expiry read goes over another one.
            let expiries: SessionExpiries = Box::new(move || {
                let (core, key, mut sink) = (core.clone(), key.clone(), sink.clone());
                Box::pin(async move {
                    let timeout = core.config.timeout;
                    core.requests.fetch_add(1, Ordering::Relaxed);
                    match tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(error::map(e, "pinging a lock's subscription")),
                        Err(_) => {
                            return Err(error::timed_out("pinging a lock's subscription", timeout))
                        }
                    }
                    core.session_expiries(&key).await
                })
            });
            let notices =
                messages.map(|m| Notice::parse(&m.get_payload::<String>().unwrap_or_default()));
            Ok((notices, expiries))
        })
    }

    /// When each session owning an entry of the lock `key` expires unless
    /// renewed (now for one that is gone).
    async fn session_expiries(&self, key: &str) -> Result<Vec<(String, Instant)>> {
        let mut inv = scripts::SESSION_EXPIRIES.prepare_invoke();
        inv.arg(&self.prefix).arg(key);
        let flat: Vec<(String, u64)> = self.script("reading when sessions expire", &inv).await?;
        let now = Instant::now();
        Ok(flat
            .into_iter()
            .map(|(session, ms)| (session, now + Duration::from_millis(ms)))
            .collect())
    }

    pub(crate) async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        // Every lock with a queue has its `L/.q` key: scan for those under
        // the prefix, then read each as `inspect` does.
        let ns = self.prefix.clone();
        let under = match prefix {
            Some(p) => format!("{}/", self.lock_key(p)),
            None => ns.clone(),
        };
        let mut names = std::collections::BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .cmd(
                    "scan locks",
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(layout::glob_prefix(&ns))
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            for k in keys {
                let Some(lock) = k.strip_suffix("/.q") else {
                    continue;
                };
                let exact = prefix.is_some_and(|p| lock == self.lock_key(p));
                if !(exact || lock.starts_with(under.as_str())) {
                    continue;
                }
                if let Some(name) = LockName::from_key(&lock[ns.len()..]) {
                    names.insert(name);
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
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

    pub(crate) async fn break_lock(&self, name: &LockName) -> Result<bool> {
        let mut inv = scripts::BREAK.prepare_invoke();
        inv.arg(&self.prefix).arg(self.lock_key(name));
        let n: i64 = self.script("break lock", &inv).await?;
        if n > 0 {
            tracing::info!(lock = %name, holders = n, "lock broken");
        }
        Ok(n > 0)
    }

    pub(crate) async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        let mut inv = scripts::REVOKE.prepare_invoke();
        inv.arg(&self.prefix).arg(self.lock_key(name));
        let n: i64 = self.script("request revoke", &inv).await?;
        Ok(n > 0)
    }

    pub(crate) async fn kill_session(&self, session: &str) -> Result<()> {
        layout::check_session_id(session)?;
        self.end_session(session, true).await?;
        Ok(())
    }

    pub(crate) async fn leftovers(&self) -> Result<Vec<String>> {
        let prefix = self.prefix.clone();
        let mut out = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .cmd(
                    "scan namespace",
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(layout::glob_prefix(&prefix))
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            out.extend(
                keys.into_iter()
                    .filter(|k| !layout::is_bookkeeping(&prefix, k))
                    .map(|k| format!("key {k}")),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let sessions: Vec<String> = self.opened.lock().expect("poisoned").clone();
        let mut dead = Vec::new();
        for sid in sessions {
            let key = layout::session_key(&prefix, &sid);
            let n: i64 = self
                .cmd("session exists", redis::cmd("EXISTS").arg(&key))
                .await?;
            if n == 1 {
                out.push(format!("session {sid}"));
            } else {
                dead.push(sid);
            }
        }
        self.opened
            .lock()
            .expect("poisoned")
            .retain(|s| !dead.contains(s));
        out.sort();
        Ok(out)
    }
}
