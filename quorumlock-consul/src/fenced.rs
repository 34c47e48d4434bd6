//! Fenced writes: one txn that checks, for every held entry, that our
//! session still holds it at the index it had when granted (a mutex's
//! `.lock`: a later grant to the same session has another index), and
//! then writes.

use std::borrow::Cow;
use std::time::Duration;

use base64::Engine as _;
use quorumlock_core::backend::{check_kinds, refused, HeldEntry, KeyForm, KeyWrite};
use quorumlock_core::{Error, ErrorKind, Result};

use crate::api::{op, Api, Block, Txn};
use crate::core::ConsulCore;
use crate::error::map;

/// `write` as a Consul key: checked by the shared rules, its leading `/`
/// dropped (Consul keys have none: `/app/config` is `app/config`,
/// [`KeyForm::Relative`]); a key that still starts with `/` (it had two)
/// is refused.
fn check_key<'w>(write: &'w KeyWrite, namespace_prefix: &str) -> Result<Cow<'w, KeyWrite>> {
    write.validate(namespace_prefix)?;
    let write = write.in_form(KeyForm::Relative);
    if write.key().starts_with('/') {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("Consul key {:?}: more than one leading /", write.key()),
        ));
    }
    Ok(write)
}

fn op_of(write: &KeyWrite) -> op::Op {
    match write {
        KeyWrite::Put { key, value } => op::set(
            key,
            &base64::engine::general_purpose::STANDARD.encode(value),
        ),
        KeyWrite::Delete { key } => op::delete(key),
    }
}

/// Writes `write` (its key checked first) only while every entry of
/// `held` is still its grant.
pub(crate) async fn fenced_write(
    core: &ConsulCore,
    held: &[HeldEntry],
    write: &KeyWrite,
) -> Result<()> {
    let write = check_key(write, &core.config.namespace_prefix())?;
    fenced_txn(&core.api, held, &write).await
}

/// A proclaim moves a held `.lock`'s index but not its token: when a
/// check fails, each entry is read, and one that is still its grant at
/// another index (proclaimed) is checked again at that index; a
/// refusal stands only for an entry that is no longer its grant.
async fn fenced_txn(api: &Api, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
    check_kinds(held)?;
    let mut at: Vec<u64> = held.iter().map(|h| h.token).collect();
    for _ in 0..3 {
        let mut ops = Vec::with_capacity(2 * held.len() + 1);
        for (h, i) in held.iter().zip(&at) {
            ops.push(op::check_session(&h.entry, &h.session));
            ops.push(op::check_index(&h.entry, *i));
        }
        let checks = ops.len();
        ops.push(op_of(write));
        match api.txn(ops).await.map_err(|e| map(e, "fenced write"))? {
            Txn::Done(_) => return Ok(()),
            Txn::Failed(errs) if errs.iter().any(|e| e.op_index < checks) => {
                let mut moved = false;
                for (h, i) in held.iter().zip(at.iter_mut()) {
                    let block = Block {
                        index: 0,
                        wait: Duration::ZERO,
                        consistent: true,
                    };
                    let (_, e) = api
                        .kv_get(&h.entry, block)
                        .await
                        .map_err(|e| map(e, "fenced write"))?;
                    match e {
                        Some(e) if e.is_grant(&h.session, h.token) => {
                            moved |= e.modify_index != *i;
                            *i = e.modify_index;
                        }
                        _ => return Err(refused(write, held)),
                    }
                }
                if !moved {
                    return Err(refused(write, held));
                }
            }
            Txn::Failed(errs) => {
                return Err(Error::new(
                    ErrorKind::Store,
                    format!(
                        "fenced write to {:?} failed: {}",
                        write.key(),
                        errs.iter()
                            .map(|e| e.what.as_str())
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                ))
            }
        }
    }
    Err(refused(write, held))
}

/// Reads `key` (checked as a write's key would be), `?consistent`.
pub(crate) async fn read_key(core: &ConsulCore, key: &str) -> Result<Option<Vec<u8>>> {
    let probe = KeyWrite::Delete { key: key.into() };
    let probe = check_key(&probe, &core.config.namespace_prefix())?;
    let key = probe.key();
    let api = &core.api;
    let block = Block {
        index: 0,
        wait: Duration::ZERO,
        consistent: true,
    };
    let (_, entry) = api
        .kv_get(key, block)
        .await
        .map_err(|e| map(e, "reading a key"))?;
    let Some(entry) = entry else {
        return Ok(None);
    };
    let Some(value) = entry.value else {
        return Ok(Some(Vec::new()));
    };
    base64::engine::general_purpose::STANDARD
        .decode(value)
        .map(Some)
        .map_err(|e| {
            Error::new(
                ErrorKind::Store,
                format!("value of {key:?} is not base64: {e}"),
            )
        })
}

/// Writes `write` (its key checked first), unfenced.
pub(crate) async fn write_key(core: &ConsulCore, write: &KeyWrite) -> Result<()> {
    fenced_write(core, &[], write).await
}
