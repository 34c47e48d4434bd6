//! The operator's operations on [`PostgresCore`]: inspect, follow a
//! lock's changes, list, break, revoke, kill a session, and what of ours
//! is left on the server.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use quorumlock_core::backend::{notified_feed, ChangeFeed, Notice, SessionExpiries};
use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::AsyncMessage;

use quorumlock_core::{Contender, LockName, LockState, Result};
use uuid::Uuid;

use crate::core::{PostgresCore, Work};
use crate::error;
use crate::layout;
use crate::queue::{self, Entry};

impl PostgresCore {
    /// Holders and waiters of `name`, read in a transaction that first
    /// purges dead sessions' entries and grants what then holds.
    pub(crate) async fn inspect(self: &Arc<Self>, name: &LockName) -> Result<LockState> {
        let lock = self.lock_key(name);
        let entries = self.inspect_key(&lock).await?;
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

    /// The entries of the lock `lock` (its key), after the purge and the
    /// grants.
    async fn inspect_key(self: &Arc<Self>, lock: &str) -> Result<Vec<Entry>> {
        let (c, l) = (self.clone(), lock.to_string());
        let work: Work<Vec<Entry>> = Box::new(move |client| {
            Box::pin(async move {
                let tx = client.transaction().await?;
                let entries = queue::settle(&tx, &c.sql, &l, None).await?;
                tx.commit().await?;
                Ok(entries)
            })
        });
        self.run("inspect", work).await
    }

    /// [`Backend::changes`](quorumlock_core::backend::Backend::changes):
    /// `LISTEN` on the lock's channel, on a connection of its own (closed
    /// with the stream), where the `entries_changed` trigger notifies
    /// every entry added, removed, granted or given a new value. A session
    /// that expires changes no row until a transaction next reads the
    /// queue, so the stream also wakes when the first session owning an
    /// entry is due to expire ([`layout::Sql::session_expiries`], read on
    /// the same connection after each change): an item if one did, else
    /// it sleeps until the next. The `session_renewed` trigger tells of
    /// each renewal on the same channel: heard, it moves its session's
    /// expiry without a read, so while nothing changes and the holders
    /// renew, nothing is sent.
    pub(crate) fn changes(self: &Arc<Self>, name: &LockName) -> ChangeFeed {
        let (core, lock) = (self.clone(), self.lock_key(name));
        notified_feed(async move {
            // The tables (and the trigger) exist before anyone listens.
            core.inspect_key(&lock).await?;
            let what = "listening to a lock's changes";
            let (mut client, mut connection) = core.open(what).await?;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(m) = messages.next().await {
                    match m {
                        Ok(AsyncMessage::Notification(n)) => {
                            if tx.send(Notice::parse(n.payload())).is_err() {
                                break;
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "a lock follower's connection failed");
                            break;
                        }
                    }
                }
            });
            let listen = async {
                let trigger: bool = client
                    .query_one(&core.sql.trigger_exists, &[])
                    .await?
                    .get(0);
                if !trigger {
                    return Ok(false);
                }
                let channel: String = client
                    .query_one(&core.sql.follow_channel, &[&lock])
                    .await?
                    .get(0);
                client
                    .batch_execute(&format!("{}; LISTEN \"{channel}\"", core.settings))
                    .await?;
                // Listening, then a follower: the trigger notifies only
                // locks with one. Under the lock's queue lock, which
                // every step of its queue takes first: a step that began
                // before this row was there has committed before it, so
                // the first read (after the first item) sees what it
                // did; a later one sees the row.
                let tx = client.transaction().await?;
                tx.execute(&core.sql.lock_queue, &[&lock]).await?;
                tx.execute(&core.sql.follow, &[&lock]).await?;
                tx.commit().await?;
                Ok::<_, tokio_postgres::Error>(true)
            };
            for _ in 0..4 {
                core.count();
            }
            let listening = match tokio::time::timeout(core.config.timeout, listen).await {
                Ok(r) => r.map_err(|e| error::map(e, what))?,
                Err(_) => return Err(error::timed_out(what, core.config.timeout)),
            };
            if !listening {
                return Err(quorumlock_core::Error::new(
                    quorumlock_core::ErrorKind::Unavailable,
                    format!(
                        "{what}: the trigger {}.entries_changed is missing (the user may not \
                         create triggers?): nothing notifies a change",
                        core.config.schema
                    ),
                ));
            }
            let client = Arc::new(client);
            let expiries: SessionExpiries = Box::new(move || {
                let (core, client, lock) = (core.clone(), client.clone(), lock.clone());
                Box::pin(async move { core.session_expiries(&client, &lock).await })
            });
            let notices =
                futures::stream::unfold(
                    rx,
                    |mut rx| async move { rx.recv().await.map(|n| (n, rx)) },
                );
            Ok((Box::pin(notices), expiries))
        })
    }

    /// When each session owning an entry of `lock` expires unless renewed
    /// (now for one that is dead). On the follower's own connection.
    async fn session_expiries(
        &self,
        client: &tokio_postgres::Client,
        lock: &str,
    ) -> Result<Vec<(String, Instant)>> {
        let what = "reading when sessions expire";
        self.count();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&lock];
        let read = client.query(&self.sql.session_expiries, &params);
        let rows = match tokio::time::timeout(self.config.timeout, read).await {
            Ok(r) => r.map_err(|e| error::map(e, what))?,
            Err(_) => return Err(error::timed_out(what, self.config.timeout)),
        };
        let now = Instant::now();
        rows.iter()
            .map(|row| {
                let session: String = row.try_get(0).map_err(|e| error::map(e, what))?;
                let ms: i64 = row.try_get(1).map_err(|e| error::map(e, what))?;
                Ok((session, now + Duration::from_millis(ms.max(0) as u64)))
            })
            .collect()
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
