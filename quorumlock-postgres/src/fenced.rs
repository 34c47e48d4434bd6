//! Fenced writes: one transaction that first locks every held entry and
//! its session against removal (`FOR KEY SHARE`) while checking they are
//! still there, alive and with the same token, then writes. The same check
//! runs in the caller's own transaction ([`check_held`]), so that the
//! caller's own SQL is fenced the same way.

use quorumlock_core::backend::{check_kinds, refused, HeldEntry, KeyWrite};
use quorumlock_core::{Error, ErrorKind, LockGuard, Result};
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::core::{PostgresCore, Work};
use crate::error;
use crate::layout;

/// The contenders and tokens of `held`.
fn entries(held: &[HeldEntry]) -> Result<(Vec<Uuid>, Vec<i64>)> {
    let mut cs = Vec::with_capacity(held.len());
    let mut ts = Vec::with_capacity(held.len());
    for h in held {
        cs.push(layout::parse_entry_name(&h.entry)?.1);
        ts.push(h.token as i64);
    }
    Ok((cs, ts))
}

pub(crate) async fn fenced_write(
    core: &std::sync::Arc<PostgresCore>,
    held: &[HeldEntry],
    write: &KeyWrite,
) -> Result<()> {
    write.validate(&core.prefix)?;
    check_kinds(held)?;
    let (cs, ts) = entries(held)?;
    let n = cs.len() as i32;
    let (c, w, h) = (core.clone(), write.clone(), held.to_vec());
    let work: Work<()> = Box::new(move |client| {
        Box::pin(async move {
            let sql = &c.sql;
            let tx = client.transaction().await?;
            let found: i32 = tx
                .query_typed_one(
                    &sql.check_held,
                    &[(&cs, Type::UUID_ARRAY), (&ts, Type::INT8_ARRAY)],
                )
                .await?
                .try_get(0)?;
            if found != n {
                return Err(crate::core::Fail::Quit(refused(&w, &h)));
            }
            match &w {
                KeyWrite::Put { key, value } => {
                    tx.execute_typed(&sql.kv_put, &[(key, Type::TEXT), (value, Type::BYTEA)])
                        .await?
                }
                KeyWrite::Delete { key } => {
                    tx.execute_typed(&sql.kv_delete, &[(key, Type::TEXT)])
                        .await?
                }
            };
            tx.commit().await?;
            Ok(())
        })
    });
    core.run("fenced write", work).await
}

pub(crate) async fn read_key(
    core: &std::sync::Arc<PostgresCore>,
    key: &str,
) -> Result<Option<Vec<u8>>> {
    KeyWrite::Delete { key: key.into() }.validate(&core.prefix)?;
    let (c, key) = (core.clone(), key.to_string());
    let work: Work<Option<Vec<u8>>> = Box::new(move |client| {
        Box::pin(async move {
            match client
                .query_typed_opt(&c.sql.kv_get, &[(&key, Type::TEXT)])
                .await?
            {
                Some(r) => Ok(Some(r.try_get(0)?)),
                None => Ok(None),
            }
        })
    });
    core.run("read key", work).await
}

pub(crate) async fn write_key(core: &std::sync::Arc<PostgresCore>, write: &KeyWrite) -> Result<()> {
    write.validate(&core.prefix)?;
    let (c, w) = (core.clone(), write.clone());
    let work: Work<()> = Box::new(move |client| {
        Box::pin(async move {
            match &w {
                KeyWrite::Put { key, value } => {
                    client
                        .execute_typed(&c.sql.kv_put, &[(key, Type::TEXT), (value, Type::BYTEA)])
                        .await?
                }
                KeyWrite::Delete { key } => {
                    client
                        .execute_typed(&c.sql.kv_delete, &[(key, Type::TEXT)])
                        .await?
                }
            };
            Ok(())
        })
    });
    core.run("unfenced write", work).await
}

/// Checks, inside the caller's own transaction `tx` (on the database of
/// the locks, `schema` being the URL's `schema=`, by default
/// [`crate::DEFAULT_SCHEMA`]), that every one of `guards` still holds its
/// lock: each guard's entry is still on the server with its token, and
/// its session has not expired by the server's clock. Each entry and its
/// session are then locked against removal (`FOR KEY SHARE`) until `tx`
/// ends, so no other client can be granted those locks before `tx`
/// commits or rolls back: what `tx` writes after this check is written
/// while the guards hold, and a former holder (paused, partitioned, its
/// session expired, its lock broken) gets [`ErrorKind::LockLost`] here
/// and should roll back.
///
/// Call it first in the transaction, then run your statements, then
/// commit. A `MultiGuard`'s locks are checked together with
/// `multi.guards()`. Any kind of hold can be checked (a reader's check
/// means no writer can be granted until `tx` ends).
///
/// The server waits for `tx` before it grants the next holder of these
/// locks: keep the transaction short.
///
/// ```no_run
/// # async fn f(client: &mut tokio_postgres::Client, guard: &quorumlock_core::LockGuard)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// let tx = client.transaction().await?;
/// quorumlock_postgres::check_held(&tx, "quorumlock", [guard]).await?;
/// tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// One statement in the caller's transaction; if dropped, the transaction
/// is in an unknown state: roll it back (dropping it does).
pub async fn check_held<'a>(
    tx: &Transaction<'_>,
    schema: &str,
    guards: impl IntoIterator<Item = &'a LockGuard>,
) -> Result<()> {
    let mut cs = Vec::new();
    let mut ts = Vec::new();
    let mut names = Vec::new();
    for g in guards {
        if !g.is_held() {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!(
                    "{} is no longer held (checked before asking the server)",
                    g.name()
                ),
            ));
        }
        // The store's token of each entry (an upgrade's `token()` is its
        // upgradeable hold's, and it stands on that hold's entry too).
        for held in g.held_entries() {
            cs.push(layout::parse_entry_name(&held.entry)?.1);
            ts.push(held.token as i64);
            names.push(g.name().as_str().to_string());
        }
    }
    layout::check_schema(schema)?;
    let sql = layout::Sql::new(schema);
    let found: i32 = tx
        .query_typed_one(
            &sql.check_held,
            &[(&cs, Type::UUID_ARRAY), (&ts, Type::INT8_ARRAY)],
        )
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| error::map(e, "checking the guards"))?;
    if found as usize != cs.len() {
        return Err(Error::new(
            ErrorKind::LockLost,
            format!(
                "the server no longer has the entry of every lock of {}: refused",
                names.join(", ")
            ),
        ));
    }
    Ok(())
}
