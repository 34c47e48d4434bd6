//! The state: [`PostgresCore`], what the backend and its sessions share
//! (the connection settings, the idle connections, the statements, the
//! request counter; one request: counted, bounded by the timeout, its
//! errors mapped), and [`SessionState`], what one session shares with its
//! tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use quorumlock_core::backend::{EntrySignals, SessionLiveness};
use quorumlock_core::{Error, ErrorKind, LockKind, LockName, LossReason, Result};
use tokio::sync::{Notify, OnceCell};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::PostgresConfig;
use crate::error;
use crate::layout::{self, Sql};

/// A connection to the server, TLS or not: its messages.
pub(crate) type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// The backend-wide state of a [`crate::PostgresBackend`] (its clones
/// share it), held by every session it opened.
pub(crate) struct PostgresCore {
    pub(crate) config: PostgresConfig,
    /// How to open a connection (from the URL, or the caller's own).
    pub(crate) pg: tokio_postgres::Config,
    /// Its TLS side (unused without `sslmode=`).
    pub(crate) tls: MakeRustlsConnect,
    /// Requests sent, for `requests_sent` (the sessions' tasks count too).
    pub(crate) requests: AtomicU64,
    /// `<ns>/` or empty.
    pub(crate) prefix: String,
    /// Every statement, with the schema filled in.
    pub(crate) sql: Sql,
    /// Sent on every new connection before anything else: the server's
    /// timeouts of our transactions and statements.
    pub(crate) settings: String,
    /// Idle connections, each one transaction at a time.
    idle: Mutex<Vec<Client>>,
    /// One permit per connection that may be open for transactions
    /// ([`PostgresConfig::connections`], but for the pipeline's): a
    /// request holds one from taking a connection to giving it back.
    slots: tokio::sync::Semaphore,
    /// The connection that single statements share, each sent without
    /// waiting for the answers before it ([`Self::pipelined`]); `None`
    /// until first used, after it broke or timed out, and always with
    /// `connections=1`.
    pipeline: Mutex<Option<Arc<Pipeline>>>,
    /// Held while the pipeline's connection is opened, so that one is;
    /// with when to try again after an open that failed.
    pipeline_opening: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Set once the tables exist (created on first use).
    schema: OnceCell<()>,
    /// The functions of `layout::STEPS` could not be created: every step
    /// is a transaction decided in Rust.
    slow_only: AtomicBool,
    /// Sessions this instance opened, for `leftovers`.
    pub(crate) opened: Mutex<Vec<Uuid>>,
}

/// One session's state, shared by its tasks: the session's acquires and
/// releases (`PostgresSession`, in `session.rs`), its keepalive and the
/// listener of its channel (`monitor.rs`). Held in an `Arc`.
pub(crate) struct SessionState {
    pub(crate) core: Arc<PostgresCore>,
    /// The session's row in `sessions`.
    pub(crate) id: Uuid,
    pub(crate) liveness: Arc<SessionLiveness>,
    /// Ends the keepalive and the listener when the session is closed or
    /// dropped.
    pub(crate) stop: CancellationToken,
    /// The session's unfinished and held entries, by contender.
    pub(crate) routes: Mutex<HashMap<Uuid, Route>>,
    /// The connection listening on the session's channel, which the
    /// keepalive's renewals use too (one statement each, never a
    /// transaction): a renewal needs no pooled connection, nor a new one
    /// opened under load or latency. With the way to end its reader, so
    /// that a renewal that gets no answer on it makes the listener
    /// reconnect.
    pub(crate) listener: Mutex<Option<(Arc<Client>, tokio::task::AbortHandle)>>,
}

/// One entry of a session: how to wake its waiter, where to report its
/// loss and revoke requests, and whether it holds.
pub(crate) struct Route {
    pub(crate) signals: EntrySignals,
    pub(crate) wake: Arc<Notify>,
    pub(crate) held: bool,
    /// The token a grant's message carried, not yet taken by the waiter.
    pub(crate) granted: Option<u64>,
}

impl SessionState {
    /// Routes `contender`'s messages before its entry exists, so that no
    /// wake-up is missed; the waiter's wake.
    pub(crate) fn route(&self, contender: Uuid, signals: EntrySignals) -> Arc<Notify> {
        let wake = Arc::new(Notify::new());
        self.routes.lock().expect("poisoned").insert(
            contender,
            Route {
                signals,
                wake: wake.clone(),
                held: false,
                granted: None,
            },
        );
        wake
    }

    pub(crate) fn unroute(&self, contender: &Uuid) {
        self.routes.lock().expect("poisoned").remove(contender);
    }

    pub(crate) fn mark_held(&self, contender: &Uuid) {
        if let Some(r) = self.routes.lock().expect("poisoned").get_mut(contender) {
            r.held = true;
        }
    }

    /// The contenders whose entries hold.
    pub(crate) fn held(&self) -> Vec<Uuid> {
        let routes = self.routes.lock().expect("poisoned");
        routes
            .iter()
            .filter(|(_, r)| r.held)
            .map(|(c, _)| *c)
            .collect()
    }

    /// A held entry is gone: its loss, unless the client finished it. A
    /// grant's token not yet taken is dropped: the waiter reads instead,
    /// and finds the entry gone.
    pub(crate) fn entry_gone(&self, contender: &Uuid) {
        let mut routes = self.routes.lock().expect("poisoned");
        if let Some(r) = routes.get_mut(contender) {
            r.granted = None;
            if r.held && !r.signals.is_finished() {
                r.signals.lose(LossReason::EntryDeleted);
            }
        }
    }

    pub(crate) fn revoke_requested(&self, contender: &Uuid) {
        let routes = self.routes.lock().expect("poisoned");
        if let Some(r) = routes.get(contender) {
            if !r.signals.is_finished() {
                r.signals.request_revoke();
            }
        }
    }

    /// A grant's message for `contender`: wakes its waiter, and keeps
    /// the token for it when the message carried one.
    pub(crate) fn granted(&self, contender: &Uuid, token: Option<u64>) {
        if let Some(r) = self.routes.lock().expect("poisoned").get_mut(contender) {
            if token.is_some() {
                r.granted = token;
            }
            r.wake.notify_one();
        }
    }

    /// The token of `contender`'s grant as its message told it, once;
    /// the entry is marked held in the same step, so that a break told
    /// right after is its loss.
    pub(crate) fn take_granted(&self, contender: &Uuid) -> Option<u64> {
        let mut routes = self.routes.lock().expect("poisoned");
        let r = routes.get_mut(contender)?;
        let token = r.granted.take()?;
        r.held = true;
        Some(token)
    }

    /// Wakes every waiter (after missed messages: they read again).
    pub(crate) fn wake_all(&self) {
        for r in self.routes.lock().expect("poisoned").values() {
            r.wake.notify_one();
        }
    }

    /// Drops every grant's token not yet taken: the listener's connection
    /// ended, and a break after the grant may never be told.
    pub(crate) fn forget_granted(&self) {
        for r in self.routes.lock().expect("poisoned").values_mut() {
            r.granted = None;
        }
    }
}

/// Why a transaction ended without its result: the server's error, or
/// ours (the transaction is rolled back either way).
pub(crate) enum Fail {
    Pg(tokio_postgres::Error),
    Quit(Error),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Pg(e)
    }
}

/// A transaction's work: gets the connection, returns its result.
pub(crate) type Work<T> =
    Box<dyn for<'c> FnOnce(&'c mut Client) -> BoxFuture<'c, std::result::Result<T, Fail>> + Send>;

/// One statement's work on the shared connection ([`PostgresCore::pipelined`]).
pub(crate) type Statement<T> =
    Box<dyn for<'c> FnOnce(&'c Pipeline) -> BoxFuture<'c, std::result::Result<T, Fail>> + Send>;

/// The connection that single statements share, with the steps'
/// statements prepared on it once: the server then plans none of them
/// again (planning the call of a step function cost the server as much
/// as a row's `INSERT` does in all).
pub(crate) struct Pipeline {
    pub(crate) client: Client,
    /// [`Sql::enqueue_step`] and [`Sql::remove_step`]: `None` where the
    /// functions of `layout::STEPS` cannot be run (the steps then go to
    /// the transactions).
    pub(crate) enqueue_step: Option<tokio_postgres::Statement>,
    pub(crate) remove_step: Option<tokio_postgres::Statement>,
    /// [`Sql::held`].
    pub(crate) held: tokio_postgres::Statement,
}

/// How long a statement on the pipeline's connection may wait for a lock
/// (PostgreSQL's `lock_timeout` there) before it is rolled back and sent
/// again on a connection of its own: about a hundred times what a step
/// holds its queue's lock for, far less than what a transaction
/// decided in Rust (several round trips), or one whose client went
/// silent, holds it for.
const PIPELINE_LOCK_TIMEOUT: Duration = Duration::from_millis(5);

/// The connections of `connections=` that run transactions: all but the
/// pipeline's, which takes one when there are two or more.
fn transaction_connections(connections: u32) -> u32 {
    if connections >= 2 {
        connections - 1
    } else {
        connections
    }
}

impl PostgresCore {
    pub(crate) fn new(
        config: PostgresConfig,
        pg: tokio_postgres::Config,
        tls: MakeRustlsConnect,
    ) -> PostgresCore {
        // A transaction whose client went silent (a partition, a proxy
        // that keeps the connection open, a paused process) must not keep
        // its queue's advisory lock and row locks: the server ends it
        // after the request timeout, as the client has given up on it by
        // then; a statement that waits twice that long is given up too.
        // Set by a statement on each new connection, not by the startup
        // packet's `options`, which poolers refuse (pgbouncer: "unsupported
        // startup parameter: options"); in session mode the pooler's
        // `DISCARD ALL` drops them with the client. And no bitmap scans,
        // as in the lock functions (`layout::STEPS`, which carry the
        // setting themselves for a plain caller and a client of an
        // earlier version, whose connections lack it): a busy lock's queue
        // holds its dead entries until a vacuum, and a bitmap scan reads
        // every one at every step, where an index scan marks them so the
        // next one skips them (`tests/steps.rs`
        // `a_busy_read_locks_dead_entries_are_not_read_at_every_step`).
        let ms = config.timeout.as_millis();
        let settings = format!(
            "SET idle_in_transaction_session_timeout = {ms}; SET statement_timeout = {}; \
             SET enable_bitmapscan = off",
            ms * 2
        );
        let prefix = config.namespace.prefix();
        let sql = Sql::new(&config.schema);
        let slots = transaction_connections(config.connections) as usize;
        PostgresCore {
            config,
            pg,
            tls,
            requests: AtomicU64::new(0),
            prefix,
            sql,
            settings,
            idle: Mutex::new(Vec::new()),
            slots: tokio::sync::Semaphore::new(slots),
            pipeline: Mutex::new(None),
            pipeline_opening: tokio::sync::Mutex::new(None),
            schema: OnceCell::new(),
            slow_only: AtomicBool::new(false),
            opened: Mutex::new(Vec::new()),
        }
    }

    /// The key of lock `name` (`<ns>/<name>`).
    pub(crate) fn lock_key(&self, name: &LockName) -> String {
        self.config.namespace.lock_key(name)
    }

    pub(crate) fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Opens a connection (counted, within the request timeout, TLS as
    /// configured): the client and the connection, whose messages the
    /// caller drives.
    pub(crate) async fn open(&self, what: &str) -> Result<(Client, Connection)> {
        self.count();
        match tokio::time::timeout(self.config.timeout, self.pg.connect(self.tls.clone())).await {
            Ok(r) => r.map_err(|e| error::map(e, what)),
            Err(_) => Err(error::timed_out(what, self.config.timeout)),
        }
    }

    /// A new connection, its messages driven by a task of its own (which
    /// ends with the connection).
    pub(crate) async fn connect(&self) -> Result<Client> {
        self.connect_with(&self.settings).await
    }

    /// [`Self::connect`], with `settings` sent first.
    async fn connect_with(&self, settings: &str) -> Result<Client> {
        let what = "connecting to PostgreSQL";
        let (client, connection) = self.open(what).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "PostgreSQL connection ended");
            }
        });
        match tokio::time::timeout(self.config.timeout, client.batch_execute(settings)).await {
            Ok(r) => r.map_err(|e| error::map(e, what))?,
            Err(_) => return Err(error::timed_out(what, self.config.timeout)),
        }
        Ok(client)
    }

    /// An idle connection, or a new one; the tables exist.
    async fn take(&self) -> Result<Client> {
        let idle = self.idle.lock().expect("poisoned").pop();
        let mut client = match idle {
            Some(c) if !c.is_closed() => c,
            _ => self.connect().await?,
        };
        if self.schema.initialized() {
            return Ok(client);
        }
        let sql = &self.sql;
        let c = &mut client;
        self.schema
            .get_or_try_init(|| async move {
                self.count();
                let serialised = format!(
                    "SELECT pg_advisory_xact_lock({}, 0)",
                    layout::ADVISORY_CLASS
                );
                let create = async {
                    // Found complete: nothing to create, and no table lock
                    // taken (see `layout::schema_exists`).
                    let found = c.query_typed(&sql.schema_exists, &[]).await?;
                    let (tables, trigger, steps, current) = (
                        found[0].get::<_, bool>(0),
                        found[0].get::<_, bool>(1),
                        found[0].get::<_, bool>(2),
                        found[0].get::<_, bool>(3),
                    );
                    if !tables {
                        let tx = c.transaction().await?;
                        tx.execute_typed(&serialised, &[]).await?;
                        tx.batch_execute(&sql.schema).await?;
                        tx.commit().await?;
                    }
                    // Each in a transaction of its own: without the right
                    // to make it, locks still work.
                    if !trigger {
                        if let Err(e) = serialised_batch(c, &serialised, &sql.trigger).await? {
                            tracing::warn!(
                                error = %e,
                                "could not create the trigger that notifies followers \
                                 of a lock (observe, status --watch): they will read \
                                 every few seconds instead"
                            );
                        }
                    }
                    if !steps {
                        // Without them, every step is a transaction
                        // decided in Rust.
                        if let Err(e) = serialised_batch(c, &serialised, &sql.steps).await? {
                            tracing::warn!(
                                error = %e,
                                "could not create the lock functions: each acquire \
                                 and release takes a transaction of several round \
                                 trips instead of one statement"
                            );
                            self.slow_only.store(true, Ordering::Relaxed);
                        }
                    } else if !current {
                        // Made by an earlier version, without a setting
                        // they have now: replaced, the same steps. Without
                        // the right to, they are still used as they are.
                        if let Err(e) = serialised_batch(c, &serialised, &sql.steps).await? {
                            tracing::warn!(
                                error = %e,
                                "could not update the lock functions to this version's \
                                 settings: they are used as they are (a busy lock's dead \
                                 entries may be read at each step until a vacuum, and its \
                                 statements planned again at each call)"
                            );
                        }
                    }
                    Ok::<_, tokio_postgres::Error>(())
                };
                match tokio::time::timeout(
                    self.config.timeout.max(self.config.connect_timeout),
                    create,
                )
                .await
                {
                    Ok(r) => r.map_err(|e| error::map(e, "creating the lock tables")),
                    Err(_) => Err(error::timed_out(
                        "creating the lock tables",
                        self.config.timeout,
                    )),
                }
            })
            .await?;
        Ok(client)
    }

    fn give_back(&self, client: Client) {
        if client.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().expect("poisoned");
        if idle.len() < transaction_connections(self.config.connections) as usize {
            idle.push(client);
        }
    }

    /// Sends one statement of `work` on the connection that single
    /// statements share ([`Pipeline`], where the steps are prepared),
    /// behind those still in flight and without waiting for their
    /// answers (PostgreSQL runs them in order): one request, counted,
    /// bounded by the timeout, its errors mapped.
    ///
    /// `Ok(None)`, having sent nothing or written nothing: the statement
    /// is the caller's to run on a connection of its own ([`Self::run`]).
    /// So it is when there is no such connection (`connections=1`, the
    /// tables not yet made), and when the statement waited for a lock
    /// longer than [`PIPELINE_LOCK_TIMEOUT`]: the server then rolled it
    /// back. A statement waiting for a queue whose lock a slow
    /// transaction holds would hold up every statement behind it, of
    /// every lock of the client; so it waits on a connection of its own.
    ///
    /// A connection that broke or gave no answer within the timeout is
    /// not used again; the statements already on it end as it does (it
    /// closes when the last of them ends, so until then the client has
    /// one connection more than `connections=`). A statement slow for
    /// another reason than a lock (a purge of thousands of dead entries)
    /// holds up those behind it.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop a statement already sent; it
    /// runs to its end on the server, in its place in the line.
    pub(crate) async fn pipelined<T: Send + 'static>(
        &self,
        what: &str,
        work: Statement<T>,
    ) -> Result<Option<T>> {
        let Some(pipeline) = self.pipeline().await else {
            return Ok(None);
        };
        self.count();
        let r = tokio::time::timeout(self.config.timeout, work(&pipeline)).await;
        match r {
            Ok(Ok(v)) => Ok(Some(v)),
            Ok(Err(Fail::Quit(e))) => Err(e),
            Ok(Err(Fail::Pg(e))) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                tracing::debug!(
                    what,
                    "a pipelined statement waited for a lock; again on a connection of its own"
                );
                Ok(None)
            }
            // A broken connection is closed: the next statement opens
            // another.
            Ok(Err(Fail::Pg(e))) => Err(error::map(e, what)),
            Err(_) => {
                let mut shared = self.pipeline.lock().expect("poisoned");
                if shared.as_ref().is_some_and(|c| Arc::ptr_eq(c, &pipeline)) {
                    *shared = None;
                }
                Err(error::timed_out(what, self.config.timeout))
            }
        }
    }

    /// The pipeline's connection, opened if there is none; `None` with
    /// `connections=1`, before the tables exist, while another caller
    /// opens it, and for a second after it could not be opened (the
    /// statements go to the transactions' connections meanwhile, rather
    /// than each waiting for a connection the server may refuse:
    /// `max_connections` reached).
    ///
    /// # Cancel safety
    /// Dropped while it opens the connection, that connection is closed;
    /// the next caller opens another.
    pub(crate) async fn pipeline(&self) -> Option<Arc<Pipeline>> {
        if self.config.connections < 2 || !self.schema.initialized() {
            return None;
        }
        let shared = || {
            let c = self.pipeline.lock().expect("poisoned");
            c.as_ref().filter(|c| !c.client.is_closed()).cloned()
        };
        if let Some(c) = shared() {
            return Some(c);
        }
        // One caller opens it; the others meanwhile send theirs on
        // connections of their own rather than wait for an open that may
        // take up to three timeouts.
        let Ok(mut retry) = self.pipeline_opening.try_lock() else {
            return None;
        };
        if let Some(c) = shared() {
            return Some(c);
        }
        if retry.is_some_and(|at| tokio::time::Instant::now() < at) {
            return None;
        }
        match self.open_pipeline().await {
            Ok(p) => {
                *self.pipeline.lock().expect("poisoned") = Some(p.clone());
                Some(p)
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not open the pipeline's connection");
                *retry = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                None
            }
        }
    }

    /// A new [`Pipeline`].
    ///
    /// # Cancel safety
    /// Dropped, the connection it opened is closed.
    async fn open_pipeline(&self) -> Result<Arc<Pipeline>> {
        let what = "preparing the lock statements";
        let settings = format!(
            "{}; SET lock_timeout = {}",
            self.settings,
            PIPELINE_LOCK_TIMEOUT.as_millis()
        );
        let client = self.connect_with(&settings).await?;
        let prepare = async {
            use tokio_postgres::types::Type;
            let sql = &self.sql;
            // Without the functions (dropped, or not ours to run) the
            // steps are transactions, as `offered` decides.
            let step = |answer| match answer {
                Ok(statement) => Ok(Some(statement)),
                Err(e) => self.offered(Err(Fail::Pg(e))).map_err(|f| match f {
                    Fail::Pg(e) => e,
                    Fail::Quit(_) => unreachable!("preparing quits nothing"),
                }),
            };
            let enqueue = [
                Type::TEXT,
                Type::UUID,
                Type::UUID,
                Type::TEXT,
                Type::INT4,
                Type::BYTEA,
                Type::BOOL,
            ];
            let enqueue_step = step(client.prepare_typed(&sql.enqueue_step, &enqueue).await)?;
            let remove_step = step(
                client
                    .prepare_typed(&sql.remove_step, &[Type::TEXT, Type::UUID])
                    .await,
            )?;
            let held = client.prepare_typed(&sql.held, &[Type::UUID]).await?;
            Ok::<_, tokio_postgres::Error>((enqueue_step, remove_step, held))
        };
        let (enqueue_step, remove_step, held) =
            match tokio::time::timeout(self.config.timeout, prepare).await {
                Ok(r) => r.map_err(|e| error::map(e, what))?,
                Err(_) => return Err(error::timed_out(what, self.config.timeout)),
            };
        Ok(Arc::new(Pipeline {
            client,
            enqueue_step,
            remove_step,
            held,
        }))
    }

    /// Runs `work` on a connection of its own: one request, counted,
    /// bounded by the timeout, its errors mapped. The connection is kept
    /// for the next request unless the work failed on it or ran out of
    /// time (a transaction then left unfinished is rolled back by the
    /// server when the connection closes).
    ///
    /// At most [`PostgresConfig::connections`] run at once; one that finds
    /// them all busy waits for one within the timeout, then fails
    /// retryable ([`ErrorKind::Connection`]) having sent nothing.
    pub(crate) async fn run<T: Send + 'static>(&self, what: &str, work: Work<T>) -> Result<T> {
        let _slot = match tokio::time::timeout(self.config.timeout, self.slots.acquire()).await {
            Ok(slot) => slot.expect("never closed"),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Connection,
                    format!(
                        "{what}: all {} connections of this client stayed busy for {:?} \
                         (connections= in the URL)",
                        self.config.connections, self.config.timeout
                    ),
                ))
            }
        };
        let mut client = self.take().await?;
        self.count();
        let r = tokio::time::timeout(self.config.timeout, work(&mut client)).await;
        match r {
            Ok(Ok(v)) => {
                self.give_back(client);
                Ok(v)
            }
            Ok(Err(Fail::Quit(e))) => {
                self.give_back(client);
                Err(e)
            }
            Ok(Err(Fail::Pg(e))) => {
                if e.as_db_error().is_some() {
                    self.give_back(client);
                }
                Err(error::map(e, what))
            }
            Err(_) => Err(error::timed_out(what, self.config.timeout)),
        }
    }

    /// Whether a step of `kind` for `count` permits may be offered to
    /// the functions of `layout::STEPS` (a window's kind, a single entry,
    /// and the functions there: read after the first request, which
    /// creates them).
    pub(crate) fn one_statement(&self, kind: LockKind, count: u32) -> bool {
        let (code, permits) = layout::kind_code(kind);
        count <= 1
            && layout::fast_window(code, permits).is_some()
            && !self.slow_only.load(Ordering::Relaxed)
    }

    /// A step's `answer` from the functions of `layout::STEPS`, with
    /// their absence read as "left to the transaction" (`Ok(None)`):
    /// dropped since, or this user may not execute them. Then this one
    /// and every later step go to the transactions.
    pub(crate) fn offered<T>(
        &self,
        answer: std::result::Result<Option<T>, Fail>,
    ) -> std::result::Result<Option<T>, Fail> {
        let Err(Fail::Pg(e)) = &answer else {
            return answer;
        };
        let unavailable = e.code().is_some_and(|c| {
            *c == tokio_postgres::error::SqlState::UNDEFINED_FUNCTION
                || *c == tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE
        });
        if !unavailable {
            return answer;
        }
        tracing::warn!(
            error = %e,
            "the lock functions cannot be run: each acquire and release takes a \
             transaction of several round trips instead of one statement"
        );
        self.slow_only.store(true, Ordering::Relaxed);
        Ok(None)
    }

    pub(crate) fn record_session(&self, id: Uuid) {
        self.opened.lock().expect("poisoned").push(id);
    }
}

/// A quorumlock error as the end of a transaction.
pub(crate) fn quit<T>(kind: ErrorKind, msg: impl Into<String>) -> std::result::Result<T, Fail> {
    Err(Fail::Quit(Error::new(kind, msg.into())))
}

/// Runs `batch` in a transaction of its own after `serialised` (the
/// advisory lock every client's schema work takes): `Ok(Err(e))` if the
/// batch failed and was rolled back (a right the user lacks, say), `Err`
/// if the connection did.
async fn serialised_batch(
    c: &mut Client,
    serialised: &str,
    batch: &str,
) -> std::result::Result<std::result::Result<(), tokio_postgres::Error>, tokio_postgres::Error> {
    let tx = c.transaction().await?;
    tx.execute_typed(serialised, &[]).await?;
    match tx.batch_execute(batch).await {
        Ok(()) => {
            tx.commit().await?;
            Ok(Ok(()))
        }
        Err(e) => {
            tx.rollback().await?;
            Ok(Err(e))
        }
    }
}
