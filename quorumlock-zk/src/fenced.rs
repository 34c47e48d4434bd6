//! Fenced writes: one `multi` that checks every held node still exists,
//! unmarked by a break, and then writes. A contender node's path is never
//! reused (its name holds the attempt's GUID), and a break's mark is a new
//! data version of the node: the check is of the data version the holder
//! left the node at ([`checked_write`]).

use std::borrow::Cow;

use quorumlock_core::backend::{check_kinds, refused, HeldEntry, KeyForm, KeyWrite};
use quorumlock_core::{Error, ErrorKind, Result};
use zookeeper_client as zk;

use crate::core::{AdminUse, ZkCore};
use crate::error::map;
use crate::layout::is_broken;

/// `write` as a ZooKeeper path: checked by the shared rules, made
/// absolute (`app/config` is `/app/config`: [`KeyForm::Absolute`]), then
/// checked by ZooKeeper's own rules for a path, here so that a bad one is
/// `InvalidArgument` with a reason rather than the client's `BadArguments`.
fn check_path<'w>(write: &'w KeyWrite, root: &str) -> Result<Cow<'w, KeyWrite>> {
    write.validate(root)?;
    let write = write.in_form(KeyForm::Absolute);
    let path = write.key();
    let bad = |why: &str| {
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("ZooKeeper path {path:?}: {why}"),
        ))
    };
    let rest = path.strip_prefix('/').unwrap_or(path);
    if rest.is_empty()
        || rest
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return bad("empty, \".\" or \"..\" segment, or a trailing /");
    }
    if rest == "zookeeper" || rest.starts_with("zookeeper/") {
        return bad("the server's own tree");
    }
    if let KeyWrite::Put { value, .. } = write.as_ref() {
        if value.len() > MAX_VALUE_LEN {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "ZooKeeper node {path:?}: a value of {} bytes is over {MAX_VALUE_LEN}: \
                     the server closes the connection of a request over its jute.maxbuffer \
                     (1 MiB by default), and that connection is the lock session's",
                    value.len()
                ),
            ));
        }
    }
    Ok(write)
}

/// The largest value a write here sends: ZooKeeper's default
/// `jute.maxbuffer` (0xfffff bytes) less room for the path and the
/// checks of the same request.
pub const MAX_VALUE_LEN: usize = 1_000_000;

fn checks<'c>(
    c: &'c zk::Client,
    held: &[HeldEntry],
    versions: &[i32],
) -> Result<zk::MultiWriter<'c>> {
    let mut m = c.new_multi_writer();
    for (h, v) in held.iter().zip(versions) {
        m.add_check_version(&h.entry, *v)
            .map_err(|e| map(e, "fenced write: our node"))?;
    }
    Ok(m)
}

/// Where a held node of ours stands, read now: `None` if it is gone or a
/// break marked it (its holder has been told of the loss, and the breaker
/// deletes it next, or died before it could), else its data version.
/// Any other rewrite of its data (a revoke request, Curator's `Revoker`,
/// our own proclaim) leaves it held.
pub(crate) async fn held_version(c: &zk::Client, node: &str) -> Result<Option<i32>> {
    match c.get_data(node).await {
        Ok((data, _)) if is_broken(&data) => Ok(None),
        Ok((_, stat)) => Ok(Some(stat.version)),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(map(e, "reading our held node")),
    }
}

/// What the transaction writes besides its checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Sets the node's data.
    Set,
    /// Creates the node (a put to an absent node).
    Create,
    /// Deletes the node.
    Delete,
    /// Nothing: the checks alone (a delete found the node absent).
    Check,
}

/// What one attempt of the transaction found.
enum Outcome {
    Done,
    /// An entry of `held` is gone.
    Refused,
    /// The data of entry `i` of `held` is not at the version expected.
    Rewritten(usize),
    /// The written node is absent (a put must create it, with parents).
    NoTarget,
    /// The node to create appeared meanwhile: set it instead.
    Exists,
}

async fn attempt(
    c: &zk::Client,
    held: &[HeldEntry],
    versions: &[i32],
    write: &KeyWrite,
    op: Op,
) -> Result<Outcome> {
    let mut m = checks(c, held, versions)?;
    let path = write.key();
    let added = match (write, op) {
        (_, Op::Check) => Ok(()),
        (KeyWrite::Put { value, .. }, Op::Create) => {
            let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            m.add_create(path, value, &opts)
        }
        (KeyWrite::Put { value, .. }, _) => m.add_set_data(path, value, None),
        (KeyWrite::Delete { .. }, _) => m.add_delete(path, None),
    };
    added.map_err(|e| map(e, "fenced write"))?;
    match m.commit().await {
        Ok(_) => Ok(Outcome::Done),
        Err(zk::MultiWriteError::OperationFailed { index, source }) if index < held.len() => {
            match source {
                zk::Error::NoNode => Ok(Outcome::Refused),
                zk::Error::BadVersion => Ok(Outcome::Rewritten(index)),
                e => Err(map(e, "fenced write: checking our node")),
            }
        }
        Err(zk::MultiWriteError::OperationFailed { source, .. }) => match source {
            zk::Error::NoNode => Ok(Outcome::NoTarget),
            zk::Error::NodeExists => Ok(Outcome::Exists),
            e => Err(map(e, "fenced write")),
        },
        Err(zk::MultiWriteError::RequestFailed { source }) => Err(map(source, "fenced write")),
    }
}

/// Creates the parents of `path` (empty persistent nodes); creating an
/// empty parent needs no fence, the write itself is fenced.
async fn make_parents(c: &zk::Client, core: &ZkCore, path: &str) -> Result<()> {
    let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut at = 0;
    while let Some(i) = path[at + 1..].find('/') {
        at += 1 + i;
        core.count(1);
        match c.create(&path[..at], &[], &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(map(e, "fenced write: creating a parent")),
        }
    }
    Ok(())
}

/// One transaction: each held node checked at the data version its
/// holder left it at, then the write. Not only its existence: a break
/// marks the node (`__BREAK__`, a new data version) and deletes it only
/// 2 x `HELD_WATCH_DELAY` later, and its holder reports the loss on the
/// mark, so a write checked for existence alone still landed after the
/// holder was told it had lost the lock. A node found at another version
/// is read: gone or marked refuses the write, anything else (a revoke
/// request: the holder still holds) is checked again at the new version.
async fn checked_write(
    c: &zk::Client,
    core: &ZkCore,
    held: &[HeldEntry],
    write: &KeyWrite,
) -> Result<()> {
    check_kinds(held)?;
    let mut versions: Vec<i32> = held.iter().map(|h| core.data_version(&h.entry)).collect();
    let mut op = match write {
        KeyWrite::Put { .. } => Op::Set,
        KeyWrite::Delete { .. } => Op::Delete,
    };
    // A put flips between set and create when another writer creates or
    // deletes the node in between, a revoke request moves a held node's
    // version; a few rounds settle it.
    for round in 0..8 {
        if round > 0 {
            core.count(1);
        }
        match attempt(c, held, &versions, write, op).await? {
            Outcome::Done => return Ok(()),
            Outcome::Refused => return Err(refused(write, held)),
            Outcome::Rewritten(i) => {
                core.count(1);
                match held_version(c, &held[i].entry).await? {
                    None => return Err(refused(write, held)),
                    Some(v) => {
                        core.note_version(&held[i].entry, v);
                        versions[i] = v;
                    }
                }
            }
            Outcome::NoTarget => match op {
                // Absent already: done, if our entries still stand.
                Op::Delete => op = Op::Check,
                Op::Create => make_parents(c, core, write.key()).await?,
                Op::Set => op = Op::Create,
                Op::Check => unreachable!("a transaction of checks writes no node"),
            },
            Outcome::Exists => op = Op::Set,
        }
    }
    Err(Error::new(
        ErrorKind::Store,
        format!(
            "fenced write to {:?}: the node kept appearing and vanishing, or ours kept changing",
            write.key()
        ),
    ))
}

/// `Backend::fenced_write`, on the admin session: [`checked_write`].
pub(crate) async fn fenced_write(
    core: &ZkCore,
    held: &[HeldEntry],
    write: &KeyWrite,
) -> Result<()> {
    let write = check_path(write, &core.root())?;
    let write = write.as_ref();
    core.count(1);
    core.with_admin(AdminUse::Brief, |c| async move {
        checked_write(&c, core, held, write).await
    })
    .await
}

/// `Backend::read_key`, on the admin session.
pub(crate) async fn read_key(core: &ZkCore, key: &str) -> Result<Option<Vec<u8>>> {
    let probe = KeyWrite::Delete { key: key.into() };
    let probe = check_path(&probe, &core.root())?;
    let key = probe.key();
    core.count(1);
    core.with_admin(AdminUse::Brief, |c| async move {
        match c.get_data(key).await {
            Ok((data, _)) => Ok(Some(data)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(e, "reading a node")),
        }
    })
    .await
}

/// `Backend::write_key`: a write checked against no held node.
pub(crate) async fn write_key(core: &ZkCore, write: &KeyWrite) -> Result<()> {
    let write = check_path(write, &core.root())?;
    let write = write.as_ref();
    core.count(1);
    core.with_admin(AdminUse::Brief, |c| async move {
        checked_write(&c, core, &[], write).await
    })
    .await
}
