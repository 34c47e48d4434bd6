//! Fenced writes: one txn that compares every held key's create revision
//! with its token (the revision etcd gave the key when the holder created
//! it, so a key deleted and created again does not pass).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use quorumlock_core::backend::{check_kinds, refused, HeldEntry, KeyWrite};
use quorumlock_core::Result;

use crate::core::EtcdCore;

fn op(write: &KeyWrite) -> TxnOp {
    match write {
        KeyWrite::Put { key, value } => TxnOp::put(key.as_str(), value.clone(), None),
        KeyWrite::Delete { key } => TxnOp::delete(key.as_str(), None),
    }
}

pub(crate) async fn fenced_write(
    core: &EtcdCore,
    held: &[HeldEntry],
    write: &KeyWrite,
) -> Result<()> {
    write.validate(&core.namespace_prefix())?;
    check_kinds(held)?;
    let ours: Vec<Compare> = held
        .iter()
        .map(|h| Compare::create_revision(h.entry.as_str(), CompareOp::Equal, h.token as i64))
        .collect();
    let txn = Txn::new().when(ours).and_then([op(write)]);
    if core.txn("fenced write", txn).await?.succeeded() {
        Ok(())
    } else {
        Err(refused(write, held))
    }
}

pub(crate) async fn read_key(core: &EtcdCore, key: &str) -> Result<Option<Vec<u8>>> {
    KeyWrite::Delete { key: key.into() }.validate(&core.namespace_prefix())?;
    let resp = core.get("read key", key, Default::default()).await?;
    Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
}

pub(crate) async fn write_key(core: &EtcdCore, write: &KeyWrite) -> Result<()> {
    write.validate(&core.namespace_prefix())?;
    core.txn("unfenced write", Txn::new().and_then([op(write)]))
        .await?;
    Ok(())
}
