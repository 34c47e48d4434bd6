//! Fenced writes: one `multi` that checks every held node still exists
//! (a contender node's path is never reused: its sequence number is
//! unique) and then writes.

use lockcore::backend::{check_kinds, refused, HeldEntry, KeyWrite};
use lockcore::{Error, ErrorKind, Result};
use zookeeper_client as zk;

use crate::error::map;

/// ZooKeeper's own rules for a path, checked here so that a bad one is
/// `InvalidArgument` with a reason rather than the client's `BadArguments`.
pub(crate) fn check_path(write: &KeyWrite, root: &str) -> Result<()> {
    write.validate(root)?;
    let path = write.key();
    let bad = |why: &str| {
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("ZooKeeper path {path:?}: {why}"),
        ))
    };
    let Some(rest) = path.strip_prefix('/') else {
        return bad("must start with /");
    };
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
    Ok(())
}

fn checks<'c>(c: &'c zk::Client, held: &[HeldEntry]) -> Result<zk::MultiWriter<'c>> {
    let mut m = c.new_multi_writer();
    for h in held {
        m.add_check_version(&h.entry, -1)
            .map_err(|e| map(e, "fenced write: our node"))?;
    }
    Ok(m)
}

/// What one attempt of the transaction found.
enum Outcome {
    Done,
    /// An entry of `held` is gone.
    Refused,
    /// The written node is absent (a put must create it, with parents).
    NoTarget,
    /// The node to create appeared meanwhile: set it instead.
    Exists,
}

async fn attempt(
    c: &zk::Client,
    held: &[HeldEntry],
    write: &KeyWrite,
    create: bool,
) -> Result<Outcome> {
    let mut m = checks(c, held)?;
    let path = write.key();
    let added = match write {
        KeyWrite::Put { value, .. } if create => {
            let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            m.add_create(path, value, &opts)
        }
        KeyWrite::Put { value, .. } => m.add_set_data(path, value, None),
        KeyWrite::Delete { .. } => m.add_delete(path, None),
    };
    added.map_err(|e| map(e, "fenced write"))?;
    match m.commit().await {
        Ok(_) => Ok(Outcome::Done),
        Err(zk::MultiWriteError::OperationFailed { index, source }) if index < held.len() => {
            match source {
                zk::Error::NoNode => Ok(Outcome::Refused),
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
async fn make_parents(c: &zk::Client, path: &str) -> Result<()> {
    let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut at = 0;
    while let Some(i) = path[at + 1..].find('/') {
        at += 1 + i;
        match c.create(&path[..at], &[], &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(map(e, "fenced write: creating a parent")),
        }
    }
    Ok(())
}

pub(crate) async fn fenced_write(
    c: &zk::Client,
    held: &[HeldEntry],
    write: &KeyWrite,
) -> Result<()> {
    check_kinds(held)?;
    let mut create = false;
    // A put flips between set and create when another writer creates or
    // deletes the node in between; a few rounds settle it.
    for _ in 0..8 {
        match attempt(c, held, write, create).await? {
            Outcome::Done => return Ok(()),
            Outcome::Refused => return Err(refused(write, held)),
            Outcome::NoTarget => match write {
                KeyWrite::Delete { .. } => {
                    // Absent already: done, if our entries still stand.
                    let mut m = checks(c, held)?;
                    return match m.commit().await {
                        Ok(_) => Ok(()),
                        Err(zk::MultiWriteError::OperationFailed {
                            source: zk::Error::NoNode,
                            ..
                        }) => Err(refused(write, held)),
                        Err(e) => Err(map(e.into(), "fenced write: checking our node")),
                    };
                }
                KeyWrite::Put { .. } if create => make_parents(c, write.key()).await?,
                KeyWrite::Put { .. } => create = true,
            },
            Outcome::Exists => create = false,
        }
    }
    Err(Error::new(
        ErrorKind::Store,
        format!(
            "fenced write to {:?}: the node kept appearing and vanishing",
            write.key()
        ),
    ))
}

pub(crate) async fn read_key(c: &zk::Client, path: &str) -> Result<Option<Vec<u8>>> {
    match c.get_data(path).await {
        Ok((data, _)) => Ok(Some(data)),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(map(e, "reading a node")),
    }
}

pub(crate) async fn write_key(c: &zk::Client, write: &KeyWrite) -> Result<()> {
    fenced_write(c, &[], write).await
}
