//! What keeps a session and watches its entries: the keepalive (the
//! renewal task, every TTL/3) and the mailbox reader, which delivers the
//! messages the scripts leave in the session's mailbox (a waiter's grant,
//! a held entry's loss or revoke request, the end of the session).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::backend::Backoff;
use quorumlock_core::{Error, ErrorKind, LossReason, Result};
use redis::aio::ConnectionManager;
use redis::Value;
use tokio::time::Instant;

use crate::core::SessionState;
use crate::error;
use crate::layout;
use crate::scripts;

/// How long a mailbox read blocks on the server before it is sent again
/// (each read is one request): a third of the TTL, like the renewals, so
/// that a dead mailbox connection is noticed about as soon as a dead
/// request connection; at least 1 s, at most 1 h.
fn mailbox_block(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// Renews the session every third of its TTL ([`renew`]); confirms each
/// renewal with its send time, and reports the session lost when Redis no
/// longer has it, and a held entry lost when Redis no longer has that
/// (read by the renewal for a session of at most [`RENEWAL_PART`] held
/// entries, else by its audit). A failed renewal is tried again sooner;
/// the local deadline ends the session if none gets through.
///
/// Each renewal also starts an audit of the session ([`Audit`]: the
/// entries its client no longer owns removed, the followers told, a
/// large session's held entries read), unless the last one is still
/// running. The audit of a session of many entries takes several
/// requests; it never holds up the next renewal.
pub(crate) async fn keepalive(session: Arc<SessionState>) {
    let (liveness, stop) = (&session.liveness, &session.stop);
    let ttl = session.core.config.ttl;
    let mut pause = ttl / 3;
    // This renewal's number, and the last one whose audit was answered
    // whole (0: none yet): see `scripts::RECONCILE`.
    let mut n = 0u64;
    let confirmed = Arc::new(AtomicU64::new(0));
    let auditing = Arc::new(AtomicBool::new(false));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        n += 1;
        // A small session's held entries are read by every renewal, in
        // its own request (as one script did before audits); a larger
        // one's by its audit.
        let held = session.routes.held();
        let (checked, held) = if held.len() <= RENEWAL_PART {
            (held, Vec::new())
        } else {
            (Vec::new(), held)
        };
        let audit = (!auditing.load(Ordering::Acquire)).then(|| Audit::take(&session, held));
        match renew(&session, &checked, audit).await {
            Ok(Renewal::Gone) => {
                tracing::info!("redis session key is gone");
                liveness.lose(LossReason::SessionExpired);
                return;
            }
            Ok(Renewal::Renewed { sent, held, audit }) => {
                liveness.confirm(sent, ttl);
                *session.confirmed.lock().expect("poisoned") = sent;
                pause = ttl / 3;
                if let Err(e) = report_gone(&session, &checked, held) {
                    tracing::debug!(error = %e, "reading the held entries failed");
                }
                if let Some((audit, first)) = audit {
                    auditing.store(true, Ordering::Release);
                    let running = Running(auditing.clone());
                    let (session, confirmed) = (session.clone(), confirmed.clone());
                    let since = confirmed.load(Ordering::Acquire);
                    tokio::spawn(async move {
                        let finished = tokio::select! {
                            _ = session.stop.cancelled() => return,
                            r = audit.finish(&session, n, since, sent, first) => r,
                        };
                        match finished {
                            Ok(()) => confirmed.store(n, Ordering::Release),
                            Err(e) => tracing::debug!(error = %e, "the session's audit failed"),
                        }
                        drop(running);
                    });
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "renewal failed; trying again");
                pause = ttl / 10;
            }
        }
    }
}

/// How many entries one request of a renewal or audit names at most:
/// Redis runs one command (or script) at a time, and an audit's work
/// grows with the session's entries (10,000 held locks checked in one
/// script kept Redis busy for 55 ms).
pub(crate) const RENEWAL_PART: usize = 512;

/// An audit runs while this lives (cleared even if its task panics).
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What one renewal did.
enum Renewal {
    /// The session key is gone.
    Gone,
    /// Renewed (the step sent at `sent`), with the reads of the held
    /// entries sent with it, the audit it started and the answers to the
    /// audit's first reads if they were sent with it.
    Renewed {
        sent: Instant,
        held: Vec<Value>,
        audit: Option<(Audit, Option<Vec<Value>>)>,
    },
}

/// One audit of the session, from what its client had when the renewal
/// that started it was sent: every contender it owns (taken before
/// anything of the session is read: see `scripts::RECONCILE`), its held
/// entries (lock key, contender, token) when there are more than the
/// renewal reads itself, the locks of its entries.
struct Audit {
    owned: HashSet<String>,
    held: Vec<(String, String, u64)>,
    channels: Vec<String>,
}

/// One renewal: the session's expiry moved on ([`scripts::RENEW`], one
/// step of O(1) work), and, in the same request, the reads of `held` (at
/// most [`RENEWAL_PART`]) and the first reads of `audit` if its session
/// is small ([`Audit::rides_along`]). Bounded by the request timeout as a
/// whole (with the script loaded again if the server lost it).
async fn renew(
    session: &SessionState,
    held: &[(String, String, u64)],
    audit: Option<Audit>,
) -> Result<Renewal> {
    let what = "renew session";
    let timeout = session.core.config.timeout;
    tokio::time::timeout(timeout, renew_once(session, held, audit))
        .await
        .unwrap_or_else(|_| Err(error::timed_out(what, timeout)))
}

async fn renew_once(
    session: &SessionState,
    held: &[(String, String, u64)],
    audit: Option<Audit>,
) -> Result<Renewal> {
    let core = &session.core;
    let mut inv = scripts::RENEW.prepare_invoke();
    inv.arg(&core.prefix)
        .arg(&session.sid)
        .arg(core.config.ttl.as_millis() as u64);
    let mut pipe = redis::pipe();
    pipe.ignore_errors().invoke_script(&inv);
    held_reads(held, &mut pipe);
    let along = audit.as_ref().is_some_and(Audit::rides_along);
    if let Some(a) = audit.as_ref().filter(|_| along) {
        a.first_reads(session, &mut pipe);
    }
    let mut loaded = false;
    loop {
        let sent = Instant::now();
        let mut answers = core.pipeline("renew session", &pipe).await?.into_iter();
        match answers.next() {
            Some(Value::Int(1)) => {
                let held = answers.by_ref().take(held.len()).collect();
                let audit = audit.map(|a| (a, along.then(|| answers.collect())));
                return Ok(Renewal::Renewed { sent, held, audit });
            }
            Some(Value::Int(0)) => return Ok(Renewal::Gone),
            // The server lost its scripts (a restart, a failover, `SCRIPT
            // FLUSH`): loaded, and the whole request again.
            Some(Value::ServerError(e))
                if !loaded && e.kind() == Some(redis::ServerErrorKind::NoScript) =>
            {
                loaded = true;
                core.load_script("load the renewal", &scripts::RENEW)
                    .await?;
            }
            Some(Value::ServerError(e)) => return Err(error::map(e.into(), "renew session")),
            _ => {
                return Err(Error::new(
                    ErrorKind::Internal,
                    "the renewal script answered garbage",
                ))
            }
        }
    }
}

impl Audit {
    fn take(session: &SessionState, held: Vec<(String, String, u64)>) -> Audit {
        let routes = &session.routes;
        Audit {
            owned: routes.owned(),
            held,
            channels: routes.locks().into_iter().map(changes_channel).collect(),
        }
    }

    /// Whether its first reads go in the renewal's request: at most
    /// [`RENEWAL_PART`] held entries and locks, so that the renewal's
    /// answer (which confirms the session) stays small. A larger audit
    /// sends them in a request of its own, right after.
    fn rides_along(&self) -> bool {
        self.held.len() <= RENEWAL_PART && self.channels.len() <= RENEWAL_PART
    }

    fn entry_set(session: &SessionState) -> String {
        let key = layout::session_key(&session.core.prefix, &session.sid);
        format!("{key}/.locks")
    }

    /// The reads sent with the renewal, each command of at most
    /// [`RENEWAL_PART`] entries (the server serves other clients between
    /// the commands of a pipeline): every held entry, the first page of
    /// the entry set, the follower counts of every lock.
    fn first_reads(&self, session: &SessionState, pipe: &mut redis::Pipeline) {
        held_reads(&self.held, pipe);
        pipe.add_command(sscan(&Self::entry_set(session), 0));
        for part in self.channels.chunks(RENEWAL_PART) {
            pipe.add_command(numsub(part));
        }
    }

    /// The rest of the audit of renewal `n`, from the answers to its
    /// `first` reads (sent now if they did not go with the renewal): the
    /// held entries gone (or another's now) reported lost (a failover to
    /// a replica that never got a grant keeps the session key but not
    /// the entry); the entry set's members listed
    /// and those not owned sent to [`scripts::RECONCILE`] (with
    /// `confirmed`, the last renewal whose audit was answered whole); the
    /// followers of each lock told that the session lives a TTL after
    /// `sent` (`r <session key> <ms>` on the lock's channel, where `PUBSUB
    /// NUMSUB` shows a subscriber; best effort): they need not read its
    /// expiry ([`scripts::SESSION_EXPIRIES`]). `Ok` if all of it was
    /// answered.
    async fn finish(
        self,
        session: &SessionState,
        n: u64,
        confirmed: u64,
        sent: Instant,
        first: Option<Vec<Value>>,
    ) -> Result<()> {
        let core = &session.core;
        let what = "audit the session";
        let first = match first {
            Some(answers) => answers,
            None => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                self.first_reads(session, &mut pipe);
                core.pipeline(what, &pipe).await?
            }
        };
        let bad = || Error::new(ErrorKind::Internal, "an audit read answered garbage");
        let mut first = first.into_iter();
        // The held entries.
        let answers: Vec<Value> = first.by_ref().take(self.held.len()).collect();
        report_gone(session, &self.held, answers)?;
        // The members not owned.
        let set = Self::entry_set(session);
        let mut page = first.next().ok_or_else(bad)?;
        let mut not_owned = Vec::new();
        loop {
            let (next, members) = scan_page(page)?;
            not_owned.extend(members.into_iter().filter(|m| {
                layout::parse_entry_name(m)
                    .is_some_and(|(_, id)| !self.owned.contains(layout::contender_of(id)))
            }));
            if next == 0 {
                break;
            }
            page = core.cmd::<Value>(what, &sscan(&set, next)).await?;
        }
        // SSCAN may name a member twice.
        not_owned.sort_unstable();
        not_owned.dedup();
        // The followers.
        let counts: Vec<Value> = first.collect();
        tell_followers(session, sent, &self.channels, counts).await;
        // Those of the locks of entries not owned, counted now.
        let mut more: HashSet<String> = not_owned
            .iter()
            .filter_map(|m| layout::parse_entry_name(m))
            .map(|(lock, _)| changes_channel(lock.to_string()))
            .collect();
        for c in &self.channels {
            more.remove(c);
        }
        let more: Vec<String> = more.into_iter().collect();
        tell_followers(session, sent, &more, Vec::new()).await;
        // The members not owned.
        for part in not_owned.chunks(RENEWAL_PART) {
            let mut inv = scripts::RECONCILE.prepare_invoke();
            inv.arg(&core.prefix)
                .arg(&session.sid)
                .arg(core.config.ttl.as_millis() as u64)
                .arg(n)
                .arg(confirmed)
                .arg(part);
            let removed: i64 = core.script("reconcile the session's entries", &inv).await?;
            if removed > 0 {
                tracing::warn!(
                    removed,
                    "removed entries of this session that its client no longer owns \
                     (a request that landed late, or a release a failover lost)"
                );
            }
        }
        Ok(())
    }
}

/// The reads of each held entry (lock key, contender, token).
fn held_reads(held: &[(String, String, u64)], pipe: &mut redis::Pipeline) {
    for (key, id, _) in held {
        pipe.cmd("HGET").arg(format!("{key}/.e")).arg(id);
    }
}

/// Reports lost each entry of `held` whose read (in `answers`) is not
/// ours with its token.
fn report_gone(
    session: &SessionState,
    held: &[(String, String, u64)],
    answers: Vec<Value>,
) -> Result<()> {
    if answers.len() != held.len() {
        return Err(Error::new(
            ErrorKind::Internal,
            "a read of the held entries answered garbage",
        ));
    }
    let mut gone = Vec::new();
    for ((_, id, token), answer) in held.iter().zip(answers) {
        let ours = match answer {
            Value::ServerError(e) => return Err(error::map(e.into(), "read the held entries")),
            Value::BulkString(v) => std::str::from_utf8(&v)
                .is_ok_and(|v| layout::entry_is(v, &session.sid, &session.core.prefix, *token)),
            _ => false,
        };
        if !ours {
            gone.push(id.clone());
        }
    }
    session.routes.missing(&gone);
    Ok(())
}

fn changes_channel(lock: String) -> String {
    format!("{lock}/.changes")
}

fn sscan(set: &str, cursor: u64) -> redis::Cmd {
    let mut c = redis::cmd("SSCAN");
    c.arg(set).arg(cursor).arg("COUNT").arg(RENEWAL_PART);
    c
}

fn numsub(channels: &[String]) -> redis::Cmd {
    let mut c = redis::cmd("PUBSUB");
    c.arg("NUMSUB").arg(channels);
    c
}

/// An `SSCAN` answer: the next cursor, and the members.
fn scan_page(page: Value) -> Result<(u64, Vec<String>)> {
    if let Value::ServerError(e) = page {
        return Err(error::map(e.into(), "list the session's entries"));
    }
    redis::from_redis_value(page).map_err(|e| error::map(e.into(), "list the session's entries"))
}

/// Tells the followers of `channels` (lock change channels) that the
/// session lives a TTL after `sent`: where `PUBSUB NUMSUB` shows a
/// subscriber (`counts`: the answers for the first parts, sent with the
/// renewal), or everywhere if the count was refused (an ACL without
/// `PUBSUB`: as the steps' `changed`, which publish regardless). Best
/// effort.
async fn tell_followers(
    session: &SessionState,
    sent: Instant,
    channels: &[String],
    counts: Vec<Value>,
) {
    let core = &session.core;
    let key = layout::session_key(&core.prefix, &session.sid);
    let mut counts = counts.into_iter();
    for part in channels.chunks(RENEWAL_PART) {
        let answer = match counts.next() {
            Some(c) => Ok(c),
            None => {
                core.cmd::<Value>("count a lock's followers", &numsub(part))
                    .await
            }
        };
        let counted: Option<Vec<(String, u64)>> = match answer {
            Ok(v @ Value::Array(_)) => redis::from_redis_value(v).ok(),
            _ => None,
        };
        let followed: Vec<&String> = match counted {
            Some(counted) => part
                .iter()
                .zip(counted)
                .filter(|(_, (_, n))| *n > 0)
                .map(|(c, _)| c)
                .collect(),
            None => part.iter().collect(),
        };
        if followed.is_empty() {
            continue;
        }
        // What is left of the TTL as this part is sent (a follower counts
        // it from when the store sent the notice).
        let left = core.config.ttl.saturating_sub(sent.elapsed());
        let notice = format!("r {key} {}", left.as_millis());
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for c in followed {
            pipe.cmd("PUBLISH").arg(c).arg(&notice);
        }
        if let Err(e) = core.pipeline("tell a lock's followers", &pipe).await {
            tracing::debug!(error = %e, "could not tell the followers of a renewal");
        }
    }
}

/// Blocks on the session's mailbox (its own connection: a blocking read
/// would hold up every request behind it on a shared one) and delivers
/// each message: the herd-free wake-up of one waiter, a forced break, a
/// revoke request, or the end of the session.
pub(crate) async fn read_mailbox(session: Arc<SessionState>, mut conn: ConnectionManager) {
    let core = &session.core;
    let (liveness, stop) = (&session.liveness, &session.stop);
    let key = format!("{}/.mail", layout::session_key(&core.prefix, &session.sid));
    let block = mailbox_block(core.config.ttl);
    let bound = block + core.config.timeout;
    // After a failed read; from the shortest delay again once one is
    // answered.
    let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        core.requests.fetch_add(1, Ordering::Relaxed);
        let mut cmd = redis::cmd("BLPOP");
        cmd.arg(&key).arg(block.as_secs_f64());
        let read = tokio::time::timeout(
            bound,
            cmd.query_async::<Option<(String, String)>>(&mut conn),
        );
        let r = tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            r = read => r,
        };
        match r {
            Ok(Ok(answer)) => {
                retry.reset();
                if let Some((_, msg)) = answer {
                    deliver(&session, &msg);
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "mailbox read failed; reading again");
                retry.wait().await;
            }
            Err(_) => tracing::debug!("mailbox read got no answer; reading again"),
        }
    }
}

/// One mailbox message: `x` (the session was killed), or `g`, `l` or `r`
/// and a contender id (its grant, its loss, a revoke request for it).
fn deliver(session: &SessionState, msg: &str) {
    if msg == "x" {
        session.liveness.lose(LossReason::SessionExpired);
        return;
    }
    let Some((what, id)) = msg.split_once(' ') else {
        tracing::warn!(msg, "unknown mailbox message");
        return;
    };
    // No route: released or abandoned meanwhile.
    session.routes.with(id, |route| match what {
        "g" => route.wake.notify_one(),
        "l" => route.signals.lose(LossReason::EntryDeleted),
        "r" => route.signals.request_revoke(),
        _ => tracing::warn!(msg, "unknown mailbox message"),
    });
}
