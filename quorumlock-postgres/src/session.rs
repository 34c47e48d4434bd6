//! [`PostgresSession`]: one session row per client session, and the lock
//! protocol on it: enqueue (one step that purges, checks for a clash,
//! inserts the entry and grants what holds), wait for the one message
//! that grants it (or for the session ahead to expire), release and
//! abandon (one step each, which grants the next). A step is one
//! statement where the queue's rule is a window (`layout::STEPS`: a
//! mutex-like lock, a semaphore taken one permit at a time), else a
//! transaction decided in Rust (`queue.rs`).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};

use async_trait::async_trait;
use quorumlock_core::backend::{
    entry_gone, AcquireRequest, Acquired, Backoff, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, Result};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::core::{quit, Fail, PostgresCore, SessionState, Statement, Work};
use crate::layout;
use crate::monitor::{keepalive, listen, supervise};
use crate::queue::{self, Enqueue, Enqueued, On, Standing};

/// One session row, shared by every lock of one client.
pub(crate) struct PostgresSession {
    /// What the keepalive and the listener share with us.
    state: Arc<SessionState>,
}

impl fmt::Debug for PostgresSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSession")
            .field("id", &self.state.id.simple())
            .finish()
    }
}

impl PostgresSession {
    /// Opens the connection that single statements share (where the
    /// tables exist: else the first statement does), listens on the
    /// session's channel, inserts its row (confirming it with the
    /// insert's send time: the server set its expiry to its own clock at
    /// the insert plus the TTL), and starts the keepalive and the
    /// listener's supervisor.
    ///
    /// # Cancel safety
    /// Dropped before the row's insert was sent, it leaves no session
    /// row; after, a row that no keepalive renews, which expires.
    pub(crate) async fn open(
        core: Arc<PostgresCore>,
        liveness: Arc<SessionLiveness>,
    ) -> Result<Self> {
        // Before the row: a drop here leaves no session behind.
        core.pipeline().await;
        let id = layout::session_id();
        let ttl = core.config.ttl;
        let state = Arc::new(SessionState {
            core: core.clone(),
            id,
            liveness,
            stop: CancellationToken::new(),
            routes: Mutex::new(HashMap::new()),
            listener: Mutex::new(None),
        });
        let listener = listen(&state).await?;
        let prefix = core.prefix.clone();
        let ttl_ms = ttl.as_millis() as i64;
        let c = core.clone();
        let work: Work<()> = Box::new(move |client| {
            Box::pin(async move {
                client
                    .execute_typed(
                        &c.sql.open_session,
                        &[
                            (&id, Type::UUID),
                            (&prefix, Type::TEXT),
                            (&ttl_ms, Type::INT8),
                        ],
                    )
                    .await?;
                // Sessions that crashed without entries go now.
                client.execute_typed(&c.sql.sweep, &[]).await?;
                Ok(())
            })
        });
        let sent = Instant::now();
        if let Err(e) = core.run("open session", work).await {
            listener.1.abort();
            return Err(e);
        }
        core.record_session(id);
        state.liveness.confirm(sent, ttl);
        let span = tracing::debug_span!("postgres_session", id = %id.simple());
        tokio::spawn(keepalive(state.clone()).instrument(span.clone()));
        tokio::spawn(supervise(state.clone(), listener).instrument(span));
        tracing::debug!(id = %id.simple(), ?ttl, "postgres session opened");
        Ok(PostgresSession { state })
    }

    fn lost(&self, why: &str) -> Error {
        Error::new(ErrorKind::SessionLost, why.to_string())
    }

    /// The enqueue step: idempotent (a retry of an attempt whose entry
    /// exists only reads where it stands), refused on a dead session or a
    /// fenced-off attempt, `Conflict` on a clashing kind, and on `wait ==
    /// false` no entry left unless it holds. One statement where the
    /// server decides it (`queue::enqueue_step`), else a transaction.
    async fn enqueue(&self, req: &AcquireRequest, lock: &str) -> Result<Enqueued> {
        let c = self.state.core.clone();
        let (sid, me, kind, wait) = (self.state.id, req.contender, req.kind, req.wait);
        let upgrades = req
            .upgrades
            .filter(|_| kind == quorumlock_core::LockKind::Upgrade);
        let contenders = layout::request_contenders(me, req.count.max(1));
        let name = req.name.clone();
        let (code, permits) = layout::kind_code(kind);
        let step = Enqueue {
            lock: lock.to_string(),
            contender: me,
            session: sid,
            code,
            permits,
            value: req.value.as_slice().into(),
            wait,
        };
        let one_statement = c.one_statement(kind, req.count.max(1));
        let piped = step.clone();
        let work = move |one_statement: bool| -> Work<Enqueued> {
            Box::new(move |client| {
                Box::pin(async move {
                    let sql = &c.sql;
                    let (lock, value) = (step.lock.as_str(), &step.value[..]);
                    if one_statement {
                        if let Some(out) =
                            c.offered(queue::enqueue_step(On::Own(client), sql, &step).await)?
                        {
                            return Ok(out);
                        }
                        // The transaction below is a request of its own.
                        c.count();
                    }
                    let tx = client.transaction().await?;
                    // One flight: the queue's lock, whether our session lives
                    // and this attempt was fenced off, the purge, the queue.
                    let by_session = [(&sid as &(dyn ToSql + Sync), Type::UUID)];
                    let by_attempt = [(&me as &(dyn ToSql + Sync), Type::UUID)];
                    let checks = async {
                        futures::try_join!(
                            tx.query_typed_opt(&sql.session_alive, &by_session),
                            tx.query_typed_opt(&sql.fenced, &by_attempt)
                        )
                    };
                    let step = queue::step(&tx, sql, lock, checks).await?;
                    let (alive, fenced) = step.own;
                    if alive.is_none() {
                        return quit(ErrorKind::SessionLost, "our PostgreSQL session is gone");
                    }
                    if fenced.is_some() {
                        return quit(ErrorKind::Internal, "this attempt was already abandoned");
                    }
                    let mut entries = step.entries;
                    if !entries.iter().any(|e| e.contender == me) {
                        if let Some(e) = entries.iter().find(|e| kind.conflicts_with(e.kind)) {
                            return quit(
                                ErrorKind::Conflict,
                                format!("{name} is in use as {:?}, not {kind:?}", e.kind),
                            );
                        }
                        let upgrade = upgrades.map(|of| layout::upgrade_code(&of));
                        let code = upgrade.as_deref().unwrap_or(code);
                        // A request for several permits: its entries side by
                        // side, each but the last marked as followed by more.
                        for (j, c) in contenders.iter().enumerate() {
                            let code = if j + 1 < contenders.len() {
                                layout::MORE_PERMITS
                            } else {
                                code
                            };
                            let row: [(&(dyn ToSql + Sync), Type); 6] = [
                                (&lock, Type::TEXT),
                                (c, Type::UUID),
                                (&sid, Type::UUID),
                                (&code, Type::TEXT),
                                (&permits, Type::INT4),
                                (&value, Type::BYTEA),
                            ];
                            let row = tx.query_typed_one(&sql.insert, &row).await?;
                            layout::check_enqueue(row.try_get(0)?, row.try_get(1)?)
                                .map_err(Fail::Quit)?;
                        }
                        entries = queue::read(&tx, sql, lock).await?;
                    }
                    let entries = queue::grant(&tx, sql, step.dead, entries, Some(me)).await?;
                    let standing = queue::standing(&entries, me);
                    let out = match standing {
                        Standing::Refused => {
                            tx.execute_typed(&sql.delete_contender, &[(&me, Type::UUID)])
                                .await?;
                            Enqueued::Standing(Standing::Refused)
                        }
                        Standing::Wait { .. } if !wait => {
                            for c in &contenders {
                                tx.execute_typed(&sql.delete_contender, &[(c, Type::UUID)])
                                    .await?;
                            }
                            Enqueued::WouldBlock
                        }
                        s => Enqueued::Standing(s),
                    };
                    tx.commit().await?;
                    Ok(out)
                })
            })
        };
        let core = self.state.core.clone();
        req.writes
            .run_judged(
                async move {
                    let mut one_statement = one_statement;
                    if one_statement {
                        let c = core.clone();
                        let statement: Statement<Option<Enqueued>> = Box::new(move |client| {
                            Box::pin(async move {
                                c.offered(
                                    queue::enqueue_step(On::Pipeline(client), &c.sql, &piped).await,
                                )
                            })
                        });
                        match core.pipelined("enqueue", statement).await? {
                            Some(Some(out)) => return Ok(out),
                            // Left to the transaction by the server.
                            Some(None) => one_statement = false,
                            // Not sent, or rolled back waiting for the
                            // queue's lock: again on a connection of its own.
                            None => {}
                        }
                    }
                    core.run("enqueue", work(one_statement)).await
                },
                |r| r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Connection),
            )
            .await
    }

    /// Where our entry stands now: its token if it holds (one statement,
    /// `queue::held`), else one transaction that purges and grants first
    /// and then reads.
    async fn check(&self, lock: &str, me: Uuid) -> Result<Standing> {
        let core = &self.state.core;
        // Mostly woken by our grant's message: its token, read in one
        // statement; else the whole step.
        let c = core.clone();
        let read: Statement<Option<u64>> = Box::new(move |client| {
            Box::pin(async move { queue::held(On::Pipeline(client), &c.sql, me).await })
        });
        let read = core.pipelined("check entry", read).await?;
        if let Some(Some(token)) = read {
            return Ok(Standing::Held { token });
        }
        let read_first = read.is_none();
        let c = core.clone();
        let lock = lock.to_string();
        let work: Work<Standing> = Box::new(move |client| {
            Box::pin(async move {
                if read_first {
                    if let Some(token) = queue::held(On::Own(client), &c.sql, me).await? {
                        return Ok(Standing::Held { token });
                    }
                    c.count();
                }
                let tx = client.transaction().await?;
                let entries = queue::settle(&tx, &c.sql, &lock, Some(me)).await?;
                let standing = queue::standing(&entries, me);
                if standing == Standing::Refused {
                    tx.execute_typed(&c.sql.delete_contender, &[(&me, Type::UUID)])
                        .await?;
                }
                tx.commit().await?;
                Ok(standing)
            })
        });
        core.run("check entry", work).await
    }

    /// Removes `me`'s entry, and the others of its request of `count`
    /// permits (fencing the attempt off first when `fence`), and grants
    /// the next: one statement where the server decides it
    /// (`queue::remove_step`: one entry of a window's kind, no fence),
    /// else one transaction.
    async fn remove(
        &self,
        what: &str,
        lock: String,
        me: Uuid,
        kind: quorumlock_core::LockKind,
        count: u32,
        fence: bool,
    ) -> Result<u64> {
        let c = self.state.core.clone();
        let sid = self.state.id;
        let mut one_statement = !fence && c.one_statement(kind, count);
        if one_statement {
            let (step, lock) = (c.clone(), lock.clone());
            let statement: Statement<Option<u64>> = Box::new(move |client| {
                Box::pin(async move {
                    step.offered(
                        queue::remove_step(On::Pipeline(client), &step.sql, &lock, me).await,
                    )
                })
            });
            match c.pipelined(what, statement).await? {
                Some(Some(removed)) => return Ok(removed),
                // Left to the transaction by the server.
                Some(None) => one_statement = false,
                // Not sent, or rolled back waiting for the queue's lock:
                // again on a connection of its own.
                None => {}
            }
        }
        let work: Work<u64> = Box::new(move |client| {
            Box::pin(async move {
                let sql = &c.sql;
                if one_statement {
                    if let Some(removed) =
                        c.offered(queue::remove_step(On::Own(client), sql, &lock, me).await)?
                    {
                        return Ok(removed);
                    }
                    c.count();
                }
                let tx = client.transaction().await?;
                // One flight: the queue's lock, the fence, the removal,
                // the purge and the queue after them.
                let fence_row = [(&me as &(dyn ToSql + Sync), Type::UUID), (&sid, Type::UUID)];
                let others = layout::request_contenders(me, count);
                let others = &others[..others.len() - 1];
                let attempt = [(&me as &(dyn ToSql + Sync), Type::UUID)];
                let own = async {
                    futures::try_join!(
                        async {
                            if fence {
                                tx.execute_typed(&sql.fence, &fence_row).await?;
                            }
                            Ok(())
                        },
                        tx.execute_typed(&sql.delete_contender, &attempt)
                    )
                };
                let step = queue::step(&tx, sql, &lock, own).await?;
                let ((), removed) = step.own;
                let mut entries = step.entries;
                if !others.is_empty() {
                    for c in others {
                        tx.execute_typed(&sql.delete_contender, &[(c, Type::UUID)])
                            .await?;
                    }
                    entries.retain(|e| !others.contains(&e.contender));
                }
                queue::grant(&tx, sql, step.dead, entries, None).await?;
                tx.commit().await?;
                Ok(removed)
            })
        });
        self.state.core.run(what, work).await
    }

    /// Enqueues (retrying transport trouble while the session lives: the
    /// enqueue is idempotent) and waits until the entry holds.
    ///
    /// # Cancel safety
    /// May be dropped at any await point: the client layer then calls
    /// `abandon`, which removes the entry (and fences the attempt off if
    /// an enqueue's outcome is unknown).
    async fn enqueue_and_wait(&self, req: &AcquireRequest, lock: &str) -> Result<Acquired> {
        let me = req.contender;
        let wake = self.state.route(me, req.signals.clone());
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        let mut now = loop {
            match self.enqueue(req, lock).await {
                Err(e) if e.kind() == ErrorKind::Connection && self.state.liveness.is_alive() => {
                    tracing::debug!(error = %e, "enqueue failed; retrying");
                    backoff.wait().await;
                }
                Err(e) => return Err(e),
                Ok(Enqueued::WouldBlock) => {
                    return Err(Error::new(
                        ErrorKind::WouldBlock,
                        format!("lock {} is held", req.name),
                    ))
                }
                Ok(Enqueued::Standing(s)) => break s,
            }
        };
        let ttl = self.state.core.config.ttl;
        loop {
            match now {
                Standing::Held { token } => {
                    self.state.mark_held(&me);
                    return Ok(Acquired {
                        token,
                        entry: layout::entry_name(lock, &me),
                    });
                }
                Standing::Gone => {
                    return Err(self.lost(
                        "our PostgreSQL entry is gone (session expired or killed, entry broken)",
                    ))
                }
                Standing::Refused => {
                    return Err(quorumlock_core::backend::refused_upgrade(&req.name));
                }
                Standing::Wait { ahead_ms } => {
                    // Woken by the grant's message; also read again when
                    // the session ahead would expire unrenewed (nothing
                    // runs on the server when a session expires).
                    let look = Duration::from_millis(ahead_ms + 20).min(ttl);
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(look) => {}
                        _ = self.state.liveness.lost() => {
                            return Err(self.lost("session lost while waiting"));
                        }
                    }
                    backoff.reset();
                    // The token as the grant's message told it: written by
                    // the step that granted, on a session that still
                    // lives. Else (a message without one, a wake by time)
                    // read where the entry stands.
                    if self.state.liveness.is_alive() {
                        if let Some(token) = self.state.take_granted(&me) {
                            now = Standing::Held { token };
                            continue;
                        }
                    }
                    now = loop {
                        match self.check(lock, me).await {
                            Err(e)
                                if e.kind() == ErrorKind::Connection
                                    && self.state.liveness.is_alive() =>
                            {
                                tracing::debug!(error = %e, "checking our entry failed; again");
                                backoff.wait().await;
                            }
                            r => break r?,
                        }
                    };
                }
            }
        }
    }
}

#[async_trait]
impl StoreSession for PostgresSession {
    fn id(&self) -> String {
        self.state.id.simple().to_string()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        if !self.state.liveness.is_alive() {
            return Err(self.lost("the PostgreSQL session is lost"));
        }
        let lock = self.state.core.lock_key(&req.name);
        let r = self.enqueue_and_wait(req, &lock).await;
        if r.as_ref()
            .is_err_and(|e| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Conflict))
        {
            self.state.unroute(&req.contender);
        }
        r
    }

    async fn release(&self, req: &AcquireRequest, _held: &Acquired) -> Result<()> {
        self.state.unroute(&req.contender);
        let lock = self.state.core.lock_key(&req.name);
        let fence = req.writes.outcome_unknown();
        match self
            .remove(
                "release",
                lock,
                req.contender,
                req.kind,
                req.count.max(1),
                fence,
            )
            .await?
        {
            0 => Err(entry_gone(req)),
            _ => Ok(()),
        }
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        self.state.unroute(&req.contender);
        let lock = self.state.core.lock_key(&req.name);
        let fence = req.writes.outcome_unknown();
        self.remove(
            "abandon",
            lock,
            req.contender,
            req.kind,
            req.count.max(1),
            fence,
        )
        .await?;
        Ok(())
    }

    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        let c = self.state.core.clone();
        let (me, token, value) = (req.contender, held.token as i64, value.to_vec());
        let work: Work<u64> = Box::new(move |client| {
            Box::pin(async move {
                Ok(client
                    .execute_typed(
                        &c.sql.set_value,
                        &[
                            (&me, Type::UUID),
                            (&token, Type::INT8),
                            (&value, Type::BYTEA),
                        ],
                    )
                    .await?)
            })
        });
        match self.state.core.run("set value", work).await? {
            1 => Ok(()),
            _ => Err(Error::new(
                ErrorKind::LockLost,
                format!("{}: our entry is gone", req.name),
            )),
        }
    }

    async fn close(&self) -> Result<()> {
        self.state.stop.cancel();
        queue::end_session(&self.state.core, self.state.id, false).await?;
        Ok(())
    }
}

impl Drop for PostgresSession {
    fn drop(&mut self) {
        self.state.stop.cancel();
    }
}
