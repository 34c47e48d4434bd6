//! Fenced writes: one script (`FENCED`) that applies a write only while
//! every held entry is still on the store with its token and its session
//! lives; and plain key reads and writes.

use quorumlock_core::backend::{check_kinds, refused, HeldEntry, KeyWrite};
use quorumlock_core::{Error, ErrorKind, Result};

use crate::core::RedisCore;
use crate::layout;
use crate::scripts;

pub(crate) async fn fenced_write(
    core: &RedisCore,
    held: &[HeldEntry],
    write: &KeyWrite,
) -> Result<()> {
    write.validate(&core.prefix)?;
    check_kinds(held)?;
    let mut inv = scripts::FENCED.prepare_invoke();
    inv.arg(&core.prefix);
    match write {
        KeyWrite::Put { key, value } => inv.arg("put").arg(key).arg(value.as_slice()),
        KeyWrite::Delete { key } => inv.arg("del").arg(key).arg(""),
    };
    for h in held {
        let Some((lock, contender)) = layout::parse_entry_name(&h.entry) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{:?} is not a Redis lock entry", h.entry),
            ));
        };
        inv.arg(lock).arg(contender).arg(h.token);
    }
    let applied: i64 = core.script("fenced write", &inv).await?;
    if applied == 1 {
        Ok(())
    } else {
        Err(refused(write, held))
    }
}

pub(crate) async fn read_key(core: &RedisCore, key: &str) -> Result<Option<Vec<u8>>> {
    KeyWrite::Delete { key: key.into() }.validate(&core.prefix)?;
    core.cmd("read key", redis::cmd("GET").arg(key)).await
}

pub(crate) async fn write_key(core: &RedisCore, write: &KeyWrite) -> Result<()> {
    write.validate(&core.prefix)?;
    match write {
        KeyWrite::Put { key, value } => {
            core.cmd::<()>(
                "unfenced write",
                redis::cmd("SET").arg(key).arg(value.as_slice()),
            )
            .await
        }
        KeyWrite::Delete { key } => {
            core.cmd::<()>("unfenced write", redis::cmd("DEL").arg(key))
                .await
        }
    }
}
