//! The steps on one lock's queue: serialise on the queue, purge the
//! entries of dead sessions, grant what now holds by the queue rule
//! (`quorumlock_core::backend::holds`, decided here in Rust inside the
//! transaction), and wake each new holder's session, the one waiter that
//! can go next, with one `NOTIFY` (sent by the server at commit). Where
//! the rule is a window (`layout::fast_window`), a step is first offered
//! to the server's function of `layout::STEPS`, one statement that does
//! the same or answers that it is left to the transaction.

use std::sync::Arc;
use std::time::SystemTime;
use tokio_postgres::types::{ToSql, Type};

use quorumlock_core::backend::{holds_linked, upgrade_refused, waits_for_linked};
use quorumlock_core::{ErrorKind, LockKind, Result};
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use crate::core::{quit, Fail, Pipeline, PostgresCore, Work};
use crate::layout::{self, Sql};

/// One entry of a queue as read in a transaction.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) seq: i64,
    pub(crate) contender: Uuid,
    pub(crate) session: Uuid,
    pub(crate) kind: LockKind,
    /// More entries of its request follow it (a request for several
    /// permits at once; [`layout::MORE_PERMITS`]).
    pub(crate) more: bool,
    /// For an upgrade, the contender of the upgradeable entry it upgrades.
    pub(crate) upgrades: Option<Uuid>,
    pub(crate) token: Option<i64>,
    pub(crate) created: SystemTime,
    pub(crate) value: Vec<u8>,
    /// The remaining life of its session, in ms (0: dead, not purged
    /// yet).
    pub(crate) life_ms: i64,
}

/// Where an entry stands, as a transaction left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Not in the queue (released, broken, its session dead).
    Gone,
    /// Granted, with this token.
    Held { token: u64 },
    /// An upgrade to refuse
    /// (`quorumlock_core::backend::upgrade_refused`): the caller removes
    /// it in the same transaction.
    Refused,
    /// Waiting; the entry it waits for belongs to a session that expires
    /// in this many ms unless renewed.
    Wait { ahead_ms: u64 },
}

/// What an enqueue answers.
#[derive(Debug)]
pub(crate) enum Enqueued {
    Standing(Standing),
    WouldBlock,
}

/// The arguments of one acquire's step.
#[derive(Clone)]
pub(crate) struct Enqueue {
    pub(crate) lock: String,
    pub(crate) contender: Uuid,
    pub(crate) session: Uuid,
    pub(crate) code: &'static str,
    pub(crate) permits: i32,
    pub(crate) value: Arc<[u8]>,
    pub(crate) wait: bool,
}

/// Where a step's statement runs: on a connection of its own (its text
/// and types sent with it, nothing prepared), or on the pipeline's
/// connection, prepared there.
#[derive(Clone, Copy)]
pub(crate) enum On<'a> {
    Own(&'a Client),
    Pipeline(&'a Pipeline),
}

/// The one row of a step function's call with `params`: its `text` and
/// types sent on a connection of its own, or the statement `prepared`
/// picks on the pipeline (whose types the server knows). `None` where it
/// was not prepared there (the functions cannot be run): nothing sent,
/// the step left to the transaction.
async fn step_row(
    on: On<'_>,
    text: &str,
    prepared: fn(&Pipeline) -> Option<&tokio_postgres::Statement>,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> std::result::Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
    match on {
        On::Own(client) => client.query_typed_one(text, params).await.map(Some),
        On::Pipeline(p) => match prepared(p) {
            Some(statement) => {
                let values: Vec<_> = params.iter().map(|(v, _)| *v).collect();
                p.client.query_one(statement, &values).await.map(Some)
            }
            None => Ok(None),
        },
    }
}

/// One acquire as one statement (`layout::STEPS`), where its queue's
/// rule is a window ([`layout::fast_window`]): `None` when the server
/// left it to the transaction (it wrote nothing then).
///
/// # Cancel safety
/// One statement: dropped, it may or may not have been applied (the
/// caller's writes are judged, as for the transaction).
pub(crate) async fn enqueue_step(
    on: On<'_>,
    sql: &Sql,
    e: &Enqueue,
) -> std::result::Result<Option<Enqueued>, Fail> {
    let params: [(&(dyn ToSql + Sync), Type); 7] = [
        (&e.lock, Type::TEXT),
        (&e.contender, Type::UUID),
        (&e.session, Type::UUID),
        (&e.code, Type::TEXT),
        (&e.permits, Type::INT4),
        (&&*e.value, Type::BYTEA),
        (&e.wait, Type::BOOL),
    ];
    let Some(row) = step_row(on, &sql.enqueue_step, |p| p.enqueue_step.as_ref(), &params)
        .await
        .map_err(refused)?
    else {
        return Ok(None);
    };
    let (outcome, granted, ahead_ms): (&str, Option<i64>, Option<i64>) =
        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    Ok(Some(match (outcome, granted) {
        ("slow", _) => return Ok(None),
        ("held", Some(token)) => Enqueued::Standing(Standing::Held {
            token: token as u64,
        }),
        ("wait", _) => Enqueued::Standing(Standing::Wait {
            ahead_ms: ahead_ms.unwrap_or(0).max(0) as u64,
        }),
        ("busy", _) => Enqueued::WouldBlock,
        ("dead", _) => return quit(ErrorKind::SessionLost, "our PostgreSQL session is gone"),
        ("fenced", _) => return quit(ErrorKind::Internal, "this attempt was already abandoned"),
        (other, _) => {
            return quit(
                ErrorKind::Internal,
                format!("the lock function answered {other:?}"),
            )
        }
    }))
}

/// One release (or abandon) of a single entry as one statement
/// (`layout::STEPS`): `None` when the server left it to the transaction
/// (it wrote nothing then), else how many entries it removed: 0 when a
/// session's end deleted it since (the caller's release then fails, as
/// after the transaction).
///
/// # Cancel safety
/// One statement: dropped, it may or may not have been applied.
pub(crate) async fn remove_step(
    on: On<'_>,
    sql: &Sql,
    lock: &str,
    contender: Uuid,
) -> std::result::Result<Option<u64>, Fail> {
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&lock, Type::TEXT), (&contender, Type::UUID)];
    let Some(row) = step_row(on, &sql.remove_step, |p| p.remove_step.as_ref(), &params)
        .await
        .map_err(refused)?
    else {
        return Ok(None);
    };
    Ok(row.try_get::<_, Option<i64>>(0)?.map(|n| n as u64))
}

/// Whether `contender` holds, read in one statement (no lock taken: a
/// granted entry stays granted until removed): its token while its
/// session lives, on a primary; `None` otherwise (the caller's
/// transaction then reads where it stands, and fails on a standby).
///
/// # Cancel safety
/// Reads only.
pub(crate) async fn held(
    on: On<'_>,
    sql: &Sql,
    contender: Uuid,
) -> std::result::Result<Option<u64>, Fail> {
    let params: [(&(dyn ToSql + Sync), Type); 1] = [(&contender, Type::UUID)];
    let row = match on {
        On::Own(client) => client.query_typed_opt(&sql.held, &params).await?,
        On::Pipeline(p) => p.client.query_opt(&p.held, &[&contender]).await?,
    };
    Ok(match row {
        Some(r) => Some(r.try_get::<_, i64>(0)? as u64),
        None => None,
    })
}

/// A step's error: the words of `QLTOK` (a token or arrival value that
/// does not fit, `layout::raised`), or the server's.
fn refused(e: tokio_postgres::Error) -> Fail {
    match e.as_db_error() {
        Some(db) if db.code().code() == "QLTOK" => Fail::Quit(layout::raised(db.message())),
        _ => Fail::Pg(e),
    }
}

/// Serialises this transaction with every other on the queue of `lock`
/// (an advisory lock until commit).
pub(crate) async fn lock_queue(
    tx: &Transaction<'_>,
    sql: &Sql,
    lock: &str,
) -> std::result::Result<(), tokio_postgres::Error> {
    tx.execute_typed(&sql.lock_queue, &[(&lock, Type::TEXT)])
        .await
        .map(drop)
}

/// Removes the entries of `lock` whose session is dead: how many. Their
/// sessions, once they own nothing, go by [`grant`]'s sweep.
pub(crate) async fn purge(
    tx: &Transaction<'_>,
    sql: &Sql,
    lock: &str,
) -> std::result::Result<u64, tokio_postgres::Error> {
    tx.execute_typed(&sql.purge, &[(&lock, Type::TEXT)]).await
}

/// What the first flight of a queue step read: the caller's own
/// statements' answers, how many dead entries the purge removed, and the
/// queue after the purge.
pub(crate) struct Step<T> {
    pub(crate) own: T,
    pub(crate) dead: u64,
    pub(crate) entries: Vec<Entry>,
}

/// The first flight of every step on `lock`'s queue, one round trip: the
/// queue's lock, then `own` (the caller's statements, each of which must
/// send its request on its first poll, as every `tokio_postgres` call
/// does), the purge of dead entries, and the queue as it is after. All
/// are sent before any answer is awaited; the server runs them in that
/// order, in this transaction, so everything after the lock runs under
/// it and the read sees the caller's changes and the purge.
pub(crate) async fn step<T>(
    tx: &Transaction<'_>,
    sql: &Sql,
    lock: &str,
    own: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> std::result::Result<Step<T>, tokio_postgres::Error> {
    // `futures::try_join!` polls its futures in the order given (each
    // sends its request when first polled).
    let ((), own, dead, entries) = futures::try_join!(
        lock_queue(tx, sql, lock),
        own,
        purge(tx, sql, lock),
        read(tx, sql, lock)
    )?;
    if dead > 0 {
        tracing::debug!(lock, dead, "purged entries of dead sessions");
    }
    Ok(Step { own, dead, entries })
}

/// The queue of `lock`, in arrival order.
pub(crate) async fn read(
    tx: &Transaction<'_>,
    sql: &Sql,
    lock: &str,
) -> std::result::Result<Vec<Entry>, tokio_postgres::Error> {
    let rows = tx.query_typed(&sql.queue, &[(&lock, Type::TEXT)]).await?;
    rows.iter()
        .map(|r| {
            Ok(Entry {
                seq: r.try_get(0)?,
                contender: r.try_get(1)?,
                session: r.try_get(2)?,
                kind: layout::kind_of(r.try_get(3)?, r.try_get(4)?),
                more: r.try_get::<_, &str>(3)? == layout::MORE_PERMITS,
                upgrades: layout::upgraded(r.try_get(3)?),
                token: r.try_get(5)?,
                created: r.try_get(6)?,
                value: r.try_get(7)?,
                life_ms: r.try_get(9)?,
            })
        })
        .collect()
}

/// Grants every entry of `entries` (a queue read after its purge, under
/// its lock) that holds and has no token yet, and wakes its session,
/// except for `quiet` (the contender of the transaction's own caller, who
/// reads its standing from the answer); first, if the purge removed
/// `dead` entries, sweeps the dead sessions that own nothing any more
/// (and their fences), so that nothing of a crashed client is left. The
/// statements go in one flight, the grants in queue order (tokens grow
/// along the queue). The queue as it is after. Refused (`Fail::Quit`, the
/// transaction rolls back) if a token would not fit ([`layout::token`]).
pub(crate) async fn grant(
    tx: &Transaction<'_>,
    sql: &Sql,
    dead: u64,
    mut entries: Vec<Entry>,
    quiet: Option<Uuid>,
) -> std::result::Result<Vec<Entry>, Fail> {
    let kinds: Vec<LockKind> = entries.iter().map(|e| e.kind).collect();
    // A request's entries hold together: the run of `more` entries and
    // the one after it.
    let granted: Vec<usize> = (0..entries.len())
        .filter(|&i| {
            entries[i].token.is_none()
                && holds_linked(
                    &kinds,
                    i,
                    |a, b| (a..b).all(|x| entries[x].more),
                    |a, b| upgrades(&entries, a, b),
                )
                && !upgrade_refused(&kinds, i, |a, b| upgrades(&entries, a, b))
        })
        .collect();
    let (mut sessions, mut messages) = (Vec::new(), Vec::new());
    // Upgrades to refuse are woken too, to learn it.
    let refused = (0..entries.len()).filter(|&i| {
        entries[i].token.is_none() && upgrade_refused(&kinds, i, |a, b| upgrades(&entries, a, b))
    });
    for i in granted.iter().copied().chain(refused) {
        let e = &entries[i];
        // A request of several permits is told once, by its last entry.
        if Some(e.contender) != quiet && !e.more {
            sessions.push(e.session);
            messages.push(format!("g {}", e.contender.simple()));
        }
    }
    let sweep = async {
        if dead > 0 {
            tx.execute_typed(&sql.sweep, &[]).await?;
        }
        Ok(())
    };
    let params: Vec<[(&(dyn ToSql + Sync), Type); 1]> = granted
        .iter()
        .map(|&i| [(&entries[i].contender as &(dyn ToSql + Sync), Type::UUID)])
        .collect();
    let grants = params
        .iter()
        .map(|p| tx.query_typed_one(&sql.grant, p))
        .collect();
    let ((), rows, ()) =
        futures::try_join!(sweep, in_order(grants), notify(tx, sql, sessions, messages))?;
    for (&i, row) in granted.iter().zip(rows) {
        let token = layout::token(row.try_get(0)?, row.try_get(1)?).map_err(Fail::Quit)?;
        entries[i].token = Some(token as i64);
    }
    Ok(entries)
}

/// Awaits `statements` as one flight: each is polled once, in order (so
/// each sends its request, and the server runs them in that order),
/// before any answer is awaited. Their answers in the same order; the
/// first error (the server answers in order, so that of the first
/// statement that failed).
async fn in_order<F, T>(statements: Vec<F>) -> std::result::Result<Vec<T>, tokio_postgres::Error>
where
    F: std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
{
    let mut pending: Vec<std::pin::Pin<Box<F>>> = statements.into_iter().map(Box::pin).collect();
    let mut early = Vec::with_capacity(pending.len());
    for f in &mut pending {
        early.push(match futures::poll!(f.as_mut()) {
            std::task::Poll::Ready(r) => Some(r),
            std::task::Poll::Pending => None,
        });
    }
    let mut out = Vec::with_capacity(pending.len());
    for (f, early) in pending.into_iter().zip(early) {
        out.push(match early {
            Some(r) => r?,
            None => f.await?,
        });
    }
    Ok(out)
}

/// Sends each of `messages` to the matching session's channel (at
/// commit).
pub(crate) async fn notify(
    tx: &Transaction<'_>,
    sql: &Sql,
    sessions: Vec<Uuid>,
    messages: Vec<String>,
) -> std::result::Result<(), tokio_postgres::Error> {
    if !sessions.is_empty() {
        tx.execute_typed(
            &sql.notify,
            &[(&sessions, Type::UUID_ARRAY), (&messages, Type::TEXT_ARRAY)],
        )
        .await?;
    }
    Ok(())
}

/// A whole step with nothing of the caller's own: [`step`], then
/// [`grant`].
pub(crate) async fn settle(
    tx: &Transaction<'_>,
    sql: &Sql,
    lock: &str,
    quiet: Option<Uuid>,
) -> std::result::Result<Vec<Entry>, Fail> {
    let s = step(tx, sql, lock, async { Ok(()) }).await?;
    grant(tx, sql, s.dead, s.entries, quiet).await
}

/// Where `contender` stands in `entries` (a queue after [`grant`]).
pub(crate) fn standing(entries: &[Entry], contender: Uuid) -> Standing {
    let Some(i) = entries.iter().position(|e| e.contender == contender) else {
        return Standing::Gone;
    };
    if let Some(t) = entries[i].token {
        return Standing::Held { token: t as u64 };
    }
    let kinds: Vec<LockKind> = entries.iter().map(|e| e.kind).collect();
    if upgrade_refused(&kinds, i, |a, b| upgrades(entries, a, b)) {
        return Standing::Refused;
    }
    let ahead_ms = waits_for_linked(&kinds, i, |a, b| upgrades(entries, a, b))
        .map_or(0, |j| entries[j].life_ms.max(0) as u64);
    Standing::Wait { ahead_ms }
}

/// Whether `entries[a]` upgrades `entries[b]`.
fn upgrades(entries: &[Entry], a: usize, b: usize) -> bool {
    entries[a].upgrades == Some(entries[b].contender)
}

/// Settles the queue of `lock` in a transaction of its own (after entries
/// of it were removed elsewhere: a session's end).
pub(crate) async fn settle_alone(core: &std::sync::Arc<PostgresCore>, lock: String) -> Result<()> {
    let c = core.clone();
    let work: Work<()> = Box::new(move |client| {
        Box::pin(async move {
            let tx = client.transaction().await?;
            settle(&tx, &c.sql, &lock, None).await?;
            tx.commit().await?;
            Ok(())
        })
    });
    core.run("settle queue", work).await
}

/// Ends session `id` on the server: its row, fences and entries go in one
/// transaction (with `notify`, its own client is told: a kill), then each
/// queue it was in is settled, its next waiters granted. Whether the
/// session was there.
pub(crate) async fn end_session(
    core: &std::sync::Arc<PostgresCore>,
    id: Uuid,
    notify_it: bool,
) -> Result<bool> {
    let c = core.clone();
    let work: Work<(bool, Vec<String>)> = Box::new(move |client| {
        Box::pin(async move {
            let tx = client.transaction().await?;
            let sql = &c.sql;
            let existed = tx
                .execute_typed(&sql.end_session, &[(&id, Type::UUID)])
                .await?
                > 0;
            tx.execute_typed(&sql.end_fences, &[(&id, Type::UUID)])
                .await?;
            let mut locks: Vec<String> = tx
                .query_typed(&sql.end_entries, &[(&id, Type::UUID)])
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<std::result::Result<_, _>>()?;
            locks.sort();
            locks.dedup();
            if notify_it {
                notify(&tx, sql, vec![id], vec!["x".to_string()]).await?;
            }
            tx.commit().await?;
            Ok((existed, locks))
        })
    });
    let (existed, locks) = core.run("end session", work).await?;
    for lock in locks {
        settle_alone(core, lock).await?;
    }
    Ok(existed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: LockKind, token: Option<i64>, life_ms: i64) -> Entry {
        Entry {
            seq: 0,
            contender: Uuid::new_v4(),
            session: Uuid::new_v4(),
            kind,
            more: false,
            upgrades: None,
            token,
            created: SystemTime::now(),
            value: Vec::new(),
            life_ms,
        }
    }

    #[test]
    fn standing_follows_the_queue_rule() {
        let q = vec![
            entry(LockKind::Read, Some(5), 900),
            entry(LockKind::Write, None, 800),
            entry(LockKind::Read, None, 700),
        ];
        assert_eq!(standing(&q, q[0].contender), Standing::Held { token: 5 });
        // The writer waits for the reader ahead, the reader behind for
        // the writer: each is told when that one's session would expire.
        assert_eq!(
            standing(&q, q[1].contender),
            Standing::Wait { ahead_ms: 900 }
        );
        assert_eq!(
            standing(&q, q[2].contender),
            Standing::Wait { ahead_ms: 800 }
        );
        assert_eq!(standing(&q, Uuid::new_v4()), Standing::Gone);
    }
}
