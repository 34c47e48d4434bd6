//! The operator's operations on [`PostgresCore`]: inspect, list, break,
//! revoke, kill a session, and what of ours is left on the server.

use std::sync::Arc;
use tokio_postgres::types::Type;

use quorumlock_core::{Contender, LockName, LockState, Result};
use uuid::Uuid;

use crate::core::{PostgresCore, Work};
use crate::layout;
use crate::queue::{self, Entry};

impl PostgresCore {
    /// Holders and waiters of `name`, read in a transaction that first
    /// purges dead sessions' entries and grants what then holds.
    pub(crate) async fn inspect(self: &Arc<Self>, name: &LockName) -> Result<LockState> {
        let lock = self.lock_key(name);
        let (c, l) = (self.clone(), lock.clone());
        let work: Work<Vec<Entry>> = Box::new(move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                let entries = queue::settle(&tx, &c.sql, &l, None).await?;
                tx.commit().await?;
                Ok(entries)
            })
        });
        let entries = self.run("inspect", work).await?;
        let mut state = LockState::free(name.clone());
        for e in entries {
            let c = Contender {
                session: e.session.simple().to_string(),
                token: e.token.unwrap_or(e.seq) as u64,
                entry: layout::entry_name(&lock, &e.contender),
                kind: e.kind,
                since: Some(e.created),
                value: e.value,
            };
            if e.token.is_some() {
                state.holders.push(c);
            } else {
                state.waiters.push(c);
            }
        }
        Ok(state)
    }

    /// Every lock under `prefix` (or the namespace) that someone holds or
    /// waits for.
    pub(crate) async fn list(
        self: &Arc<Self>,
        prefix: Option<&LockName>,
    ) -> Result<Vec<LockState>> {
        let exact = prefix.map(|p| self.lock_key(p));
        let under = match &exact {
            Some(l) => format!("{l}/"),
            None => self.prefix.clone(),
        };
        let pattern = layout::like_prefix(exact.as_deref().unwrap_or(&under));
        let c = self.clone();
        let work: Work<Vec<String>> = Box::new(move |client| {
            Box::pin(async move {
                let rows = client
                    .query_typed(&c.sql.locks_like, &[(&pattern, Type::TEXT)])
                    .await?;
                Ok(rows
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<std::result::Result<_, _>>()?)
            })
        });
        let locks = self.run("list locks", work).await?;
        let mut out = Vec::new();
        for lock in locks {
            if !(exact.as_deref() == Some(lock.as_str()) || lock.starts_with(&under)) {
                continue;
            }
            let Some(name) = self.config.namespace.name_of(&lock) else {
                continue;
            };
            let state = self.inspect(&name).await?;
            if !state.is_free() {
                out.push(state);
            }
        }
        out.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(out)
    }

    /// Deletes every holder's entry of `name` (each holder's session told
    /// at commit), then grants the next.
    pub(crate) async fn break_lock(self: &Arc<Self>, name: &LockName) -> Result<bool> {
        self.mark_holders(name, true).await
    }

    /// Marks every holder of `name` (each holder's session told at commit).
    pub(crate) async fn request_revoke(self: &Arc<Self>, name: &LockName) -> Result<bool> {
        self.mark_holders(name, false).await
    }

    async fn mark_holders(self: &Arc<Self>, name: &LockName, delete: bool) -> Result<bool> {
        let lock = self.lock_key(name);
        let c = self.clone();
        let work: Work<usize> = Box::new(move |client| {
            Box::pin(async move {
                let sql = &c.sql;
                let tx = client.transaction().await?;
                queue::lock_queue(&tx, sql, &lock).await?;
                let dead = queue::purge(&tx, sql, &lock).await?;
                let (stmt, msg) = if delete {
                    (&sql.break_holders, "l")
                } else {
                    (&sql.revoke_holders, "r")
                };
                let rows = tx.query_typed(stmt, &[(&lock, Type::TEXT)]).await?;
                let (mut sessions, mut messages) = (Vec::new(), Vec::new());
                for r in &rows {
                    let (s, e): (Uuid, Uuid) = (r.try_get(0)?, r.try_get(1)?);
                    sessions.push(s);
                    messages.push(format!("{msg} {}", e.simple()));
                }
                queue::notify(&tx, sql, sessions, messages).await?;
                // What the purge or the break let go next is granted.
                let entries = queue::read(&tx, sql, &lock).await?;
                queue::grant(&tx, sql, dead, entries, None).await?;
                tx.commit().await?;
                Ok(rows.len())
            })
        });
        let what = if delete {
            "break lock"
        } else {
            "request revoke"
        };
        let n = self.run(what, work).await?;
        if delete && n > 0 {
            tracing::info!(lock = %name, holders = n, "lock broken");
        }
        Ok(n > 0)
    }

    /// Ends session `session` (its client told at once); idempotent.
    pub(crate) async fn kill_session(self: &Arc<Self>, session: &str) -> Result<()> {
        let id = layout::parse_session_id(session)?;
        queue::end_session(self, id, true).await?;
        Ok(())
    }

    /// Entries under the namespace, and this instance's sessions that are
    /// still alive or still have fences. The queues that hold entries of
    /// dead sessions (a client that could not end its session, a crashed
    /// one) are settled first, as their next grant would: such entries
    /// are garbage the next transaction on their queue removes, not ours.
    pub(crate) async fn leftovers(self: &Arc<Self>) -> Result<Vec<String>> {
        let pattern = layout::like_prefix(&self.prefix);
        let (c, p) = (self.clone(), pattern.clone());
        let work: Work<Vec<String>> = Box::new(move |client| {
            Box::pin(async move {
                let rows = client
                    .query_typed(&c.sql.dead_like, &[(&p, Type::TEXT)])
                    .await?;
                Ok(rows
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<std::result::Result<_, _>>()?)
            })
        });
        for lock in self.run("dead entries", work).await? {
            queue::settle_alone(self, lock).await?;
        }
        let opened: Vec<Uuid> = self.opened.lock().expect("poisoned").clone();
        let c = self.clone();
        let work: Work<(Vec<String>, Vec<Uuid>)> = Box::new(move |client| {
            Box::pin(async move {
                let mut out = Vec::new();
                for r in client
                    .query_typed(&c.sql.entries_like, &[(&pattern, Type::TEXT)])
                    .await?
                {
                    let (lock, e): (String, Uuid) = (r.try_get(0)?, r.try_get(1)?);
                    out.push(format!("entry {}", layout::entry_name(&lock, &e)));
                }
                let mut live = Vec::new();
                for r in client
                    .query_typed(&c.sql.sessions_left, &[(&opened, Type::UUID_ARRAY)])
                    .await?
                {
                    live.push(r.try_get(0)?);
                }
                Ok((out, live))
            })
        });
        let (mut out, live) = self.run("leftovers", work).await?;
        out.extend(live.iter().map(|s| format!("session {}", s.simple())));
        self.opened
            .lock()
            .expect("poisoned")
            .retain(|s| live.contains(s));
        out.sort();
        Ok(out)
    }
}
