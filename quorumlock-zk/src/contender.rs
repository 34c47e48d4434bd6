//! Curator's protected contender node (`creatingParentContainersIfNeeded
//! ().withProtection().withMode(EPHEMERAL_SEQUENTIAL)`), as a session
//! creates it: the node named with the attempt's GUID, created with the
//! listing of the lock right behind it (or with a new lock node in one
//! transaction), found again by that GUID after a connection loss instead
//! of created twice (CURATOR-498), and the orphans of a lost reply
//! deleted. The acquire protocols in `session.rs` build on it.

use std::time::Duration;

use quorumlock_core::backend::{AcquireRequest, Backoff};
use quorumlock_core::{ErrorKind, Result};
use zookeeper_client as zk;

use crate::core::{lost_session, SessionState, WatchedRead};
use crate::error::map;
use crate::layout::sequence_of;

/// What [`SessionState::create_contender`] reads with the create.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Listing {
    /// Nothing: a repeat acquire of a lock we last found free.
    Skip,
    /// The lock's children, right behind the create.
    Behind,
    /// The children; or, for a lock node not known to exist, none: it is
    /// created with ours in one transaction.
    OrNewLockNode,
}

/// A created contender node.
pub(crate) struct Created {
    pub(crate) node: String,
    pub(crate) seq: u64,
    pub(crate) stat: zk::Stat,
    /// The children, when listed right behind the create (or looked up
    /// after a connection loss).
    pub(crate) listed: Option<Vec<String>>,
    /// The directory's creation zxid, when listed right behind the create.
    pub(crate) dir_czxid: Option<i64>,
    /// Our node read with a watch right behind the create (a new lock
    /// node): the held lock's watch, set with no request of its own.
    pub(crate) watched: Option<WatchedRead>,
}

fn container_options() -> zk::CreateOptions<'static> {
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all())
}

fn create_options() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

/// The name prefix of every node of `req`'s attempt: `_c_<guid>-`.
pub(crate) fn guid_prefix(req: &AcquireRequest) -> String {
    format!("_c_{}-", req.contender.hyphenated())
}

/// The GUID prefix of `req`'s nodes (`_c_<guid>-`) and the path its
/// nodes in `dir` are created with (the server appends the sequence).
fn node_prefix(dir: &str, marker: &str, req: &AcquireRequest) -> (String, String) {
    let guid_prefix = guid_prefix(req);
    let prefix = format!("{dir}/{guid_prefix}{marker}");
    (guid_prefix, prefix)
}

/// Errors the library makes up for requests in flight when a connection
/// breaks: the request may or may not have been applied.
fn is_connection_trouble(e: &zk::Error) -> bool {
    use zk::Error as E;
    matches!(e, E::ConnectionLoss | E::Timeout | E::Custom(_))
}

impl SessionState {
    /// Creates the missing ancestors of `dir` (and `dir`) as containers,
    /// as Curator's `creatingParentContainersIfNeeded` does. All creates
    /// are sent at once; ZooKeeper applies them in order.
    pub(crate) async fn make_parents(&self, c: &zk::Client, dir: &str) -> Result<()> {
        let opts = container_options();
        let mut paths = Vec::new();
        for (i, ch) in dir.char_indices().skip(1) {
            if ch == '/' {
                paths.push(&dir[..i]);
            }
        }
        paths.push(dir);
        let sent = self.send(paths.len() as u64);
        let futs: Vec<_> = paths.iter().map(|p| c.create(p, &[], &opts)).collect();
        for r in futures::future::join_all(futs).await {
            self.heard(sent, &r);
            match r {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(map(e, "creating the lock's parent nodes")),
            }
        }
        Ok(())
    }

    /// Our contender node among `children`, found by its GUID, if it is a
    /// node of THIS session (never one of an older session: CURATOR-604).
    /// If several nodes of this session carry the GUID (a create whose
    /// reply was lost, made again), the first in the queue is kept and
    /// the others deleted, so that we never wait behind our own orphan.
    /// Returns the kept node and `children` without the deleted ones.
    pub(crate) async fn keep_ours(
        &self,
        c: &zk::Client,
        dir: &str,
        guid_prefix: &str,
        mut children: Vec<String>,
    ) -> Result<(Option<(String, zk::Stat)>, Vec<String>)> {
        let mut mine: Vec<String> = children
            .iter()
            .filter(|n| n.starts_with(guid_prefix))
            .cloned()
            .collect();
        mine.sort_by_key(|n| sequence_of(n));
        let mut kept = None;
        for child in mine {
            let path = format!("{dir}/{child}");
            self.send(1);
            let r = c.check_stat(&path).await;
            self.heard_read(&r);
            match r {
                Ok(Some(st)) if st.ephemeral_owner == self.id.0 => {
                    if kept.is_none() {
                        kept = Some((path, st));
                    } else {
                        tracing::info!(node = %path, "deleting a second contender node of ours (a create whose reply was lost)");
                        self.delete(c, &path).await?;
                        children.retain(|n| *n != child);
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(map(e, "reading our contender node")),
            }
        }
        Ok((kept, children))
    }

    /// Deletes the nodes in `sorted` (a listing of `dir`) that carry our
    /// GUID but are not `ours`: orphans of a create whose reply was lost,
    /// seen only now. Left in place, one ahead of us would make us wait
    /// for ourselves forever (and a reader's would hold a read lock until
    /// the session ends). Whether any was deleted (then list again).
    pub(crate) async fn delete_orphans(
        &self,
        c: &zk::Client,
        dir: &str,
        sorted: &[String],
        guid_prefix: &str,
        ours: &str,
    ) -> Result<bool> {
        let mut deleted = false;
        for orphan in sorted
            .iter()
            .filter(|n| n.starts_with(guid_prefix) && *n != ours)
        {
            let node = format!("{dir}/{orphan}");
            tracing::info!(%node, "deleting a second contender node of ours");
            self.delete(c, &node).await?;
            deleted = true;
        }
        Ok(deleted)
    }

    /// Creates our contender node and, unless [`Listing::Skip`], lists the
    /// lock's children. With pipelining, the listing is sent right behind
    /// the create (one round trip); ZooKeeper answers one session's
    /// requests in order, so the listing already contains our node. With
    /// [`Listing::OrNewLockNode`], a `dir` not known to exist is created in
    /// the same transaction as our node (a lock taken for the first time
    /// costs one round trip, not three); the transaction itself is the
    /// listing then.
    ///
    /// After a connection loss during the create, our node is looked up by
    /// its GUID instead of creating a second one (Curator's protection,
    /// CURATOR-498).
    pub(crate) async fn create_contender(
        &self,
        c: &zk::Client,
        dir: &str,
        marker: &str,
        data: &[u8],
        req: &AcquireRequest,
        listing: Listing,
    ) -> Result<Created> {
        let list = listing != Listing::Skip;
        let (guid_prefix, prefix) = node_prefix(dir, marker, req);
        let opts = create_options();
        let mut attempts = 0;
        loop {
            attempts += 1;
            if !self.liveness.is_alive() {
                return Err(lost_session(
                    "session lost while creating the contender node",
                ));
            }
            let may_create_dir = listing == Listing::OrNewLockNode && self.core.config.pipeline;
            let fresh = may_create_dir && !self.core.dir_known(dir);
            let (created, listed, watched) = if fresh {
                // A lock node we have not seen: create it and our node in
                // one transaction (one log write, as a lone create). If the
                // lock node exists, the transaction fails as a whole and
                // ours is created alone next time round. The server may
                // answer a create in a multi without its stat
                // (ZOOKEEPER-4026): ours is read right behind it (the first
                // child of a new node has sequence number 0), with a watch:
                // the one a held lock needs (a getData of a missing node
                // sets none).
                let sent = self.send(2);
                let mut multi = c.new_multi_writer();
                multi
                    .add_create(dir, &[], &container_options())
                    .and_then(|()| multi.add_create(&prefix, data, &opts))
                    .map_err(|e| map(e, "creating the contender node"))?;
                let first = format!("{prefix}{:010}", 0);
                let (mr, sr) = futures::join!(multi.commit(), c.get_and_watch_data(&first));
                let mut watched = None;
                let cr = match mr {
                    Ok(results) => match &results[..] {
                        [zk::MultiWriteResult::Create { .. }, zk::MultiWriteResult::Create { path, stat }] =>
                        {
                            match (stat.is_invalid(), *path == first, sr) {
                                (false, ours, r) => {
                                    watched = r.ok().filter(|_| ours);
                                    Ok((path.clone(), *stat))
                                }
                                (true, true, Ok(read)) => {
                                    let stat = read.1;
                                    watched = Some(read);
                                    Ok((first, stat))
                                }
                                // Deleted already (broken): never grant.
                                (true, true, Err(zk::Error::NoNode)) => Err(zk::Error::NoNode),
                                (true, false, _) => Err(zk::Error::UnexpectedError(format!(
                                    "our node {path} of a new lock node is not {first}"
                                ))),
                                (true, true, Err(e)) => Err(e),
                            }
                        }
                        other => Err(zk::Error::UnexpectedError(format!(
                            "a transaction of two creates answered {other:?}"
                        ))),
                    },
                    Err(zk::MultiWriteError::OperationFailed { index: 0, source })
                        if source == zk::Error::NodeExists =>
                    {
                        self.heard(sent, &Err::<(), _>(source));
                        self.core.note_dir(dir, true);
                        continue;
                    }
                    Err(e) => Err(e.into()),
                };
                self.heard(sent, &cr);
                // One transaction: the lock node's czxid is ours, and ours
                // is its only child. That is the listing, read in the step
                // that created both.
                let listed = cr.as_ref().ok().map(|(node, stat)| {
                    let ours = node.rsplit('/').next().unwrap_or_default().to_string();
                    (vec![ours], *stat)
                });
                (cr, listed, watched)
            } else if list && self.core.config.pipeline {
                let sent = self.send(2);
                let create = c.create(&prefix, data, &opts);
                let list = c.get_children(dir);
                let (cr, lr) = futures::join!(create, list);
                self.heard(sent, &cr);
                (
                    cr.map(|(stat, seq)| (format!("{prefix}{seq}"), stat)),
                    lr.ok(),
                    None,
                )
            } else {
                let sent = self.send(1);
                let cr = c.create(&prefix, data, &opts).await;
                self.heard(sent, &cr);
                (
                    cr.map(|(stat, seq)| (format!("{prefix}{seq}"), stat)),
                    None,
                    None,
                )
            };
            match created {
                Ok((node, stat)) => {
                    // Otherwise `dir` was known already, or the hint is not
                    // used for it: no lock taken on the repeat path.
                    if fresh {
                        self.core.note_dir(dir, true);
                    }
                    return Ok(Created {
                        seq: sequence_of(&node).unwrap_or(u64::MAX),
                        node,
                        stat,
                        dir_czxid: listed.as_ref().map(|(_, st)| st.czxid),
                        listed: listed.map(|(children, _)| children),
                        watched,
                    });
                }
                Err(zk::Error::NoNode) if attempts < 8 && may_create_dir && !fresh => {
                    // The lock node is gone (a container is reaped once
                    // empty): the next round creates it with ours.
                    self.core.note_dir(dir, false);
                }
                Err(zk::Error::NoNode) if attempts < 8 => {
                    self.make_parents(c, dir).await?;
                    self.core.note_dir(dir, true);
                }
                Err(e) if is_connection_trouble(&e) && attempts < 8 => {
                    // The create may have been applied: find our node by
                    // its GUID. Create again only once a listing proves it
                    // absent (a request of the old connection is applied
                    // before the session moves, or rejected). The listing
                    // follows a `sync`: the server we reconnected to may
                    // not have applied that create yet; once the leader
                    // answers the sync, it has.
                    let mut tries = 0u32;
                    let mut backoff =
                        Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
                    loop {
                        tries += 1;
                        backoff.wait().await;
                        if !self.liveness.is_alive() {
                            return Err(lost_session(
                                "session lost while looking for our contender node",
                            ));
                        }
                        let listed = match self.sync_dir(c, dir).await {
                            Ok(()) => self.list(c, dir).await,
                            Err(e) => Err(e),
                        };
                        match listed {
                            Ok(Some(children)) => {
                                if let (Some((node, stat)), children) =
                                    self.keep_ours(c, dir, &guid_prefix, children).await?
                                {
                                    tracing::debug!(%node, "found our contender node after a connection loss");
                                    return Ok(Created {
                                        seq: sequence_of(&node).unwrap_or(u64::MAX),
                                        node,
                                        stat,
                                        listed: Some(children),
                                        dir_czxid: None,
                                        watched: None,
                                    });
                                }
                                break; // not applied: create it again
                            }
                            Ok(None) => break, // no lock node, so no node of ours
                            Err(e) if e.kind() == ErrorKind::Connection && tries < 10 => {}
                            // The client layer abandons (finds by GUID, deletes).
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(e) => return Err(map(e, "creating the contender node")),
            }
        }
    }

    /// The `count` leases of one request of several permits
    /// (`Semaphore::acquire_many`), in one transaction: side by side in
    /// the semaphore's queue, all or none. Each is named with the
    /// attempt's GUID, so that after a connection loss a listing (after a
    /// `sync`) tells whether the transaction was applied: all of them
    /// there, or none. Returns their paths in sequence order and the last
    /// one's stat (its czxid is the grant's token).
    pub(crate) async fn create_leases(
        &self,
        c: &zk::Client,
        dir: &str,
        marker: &str,
        data: &[u8],
        req: &AcquireRequest,
    ) -> Result<(Vec<String>, zk::Stat)> {
        let count = req.count.max(1) as usize;
        let (guid_prefix, prefix) = node_prefix(dir, marker, req);
        let opts = create_options();
        let mut attempts = 0;
        loop {
            attempts += 1;
            if !self.liveness.is_alive() {
                return Err(lost_session("session lost while creating our leases"));
            }
            let sent = self.send(count as u64);
            let mut multi = c.new_multi_writer();
            for _ in 0..count {
                multi
                    .add_create(&prefix, data, &opts)
                    .map_err(|e| map(e, "creating our leases"))?;
            }
            let committed = multi.commit().await;
            let paths = match committed {
                Ok(results) => {
                    self.heard(sent, &Ok::<(), zk::Error>(()));
                    results
                        .into_iter()
                        .filter_map(|r| match r {
                            zk::MultiWriteResult::Create { path, .. } => Some(path),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                }
                Err(zk::MultiWriteError::OperationFailed { source, .. })
                    if source == zk::Error::NoNode && attempts < 8 =>
                {
                    self.heard(sent, &Err::<(), _>(source));
                    self.make_parents(c, dir).await?;
                    continue;
                }
                Err(e) => {
                    let e: zk::Error = e.into();
                    if !(is_connection_trouble(&e) && attempts < 8) {
                        return Err(map(e, "creating our leases"));
                    }
                    // Applied or not: all of them are there, or none.
                    self.sync_dir(c, dir).await?;
                    let mut mine: Vec<String> = self
                        .list(c, dir)
                        .await?
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|n| n.starts_with(&guid_prefix))
                        .map(|n| format!("{dir}/{n}"))
                        .collect();
                    match mine.len() {
                        0 => continue,
                        n if n == count => {
                            mine.sort_by_key(|n| sequence_of(n));
                            mine
                        }
                        n => {
                            return Err(quorumlock_core::Error::new(
                                ErrorKind::Internal,
                                format!("{n} of the {count} leases of one transaction found"),
                            ))
                        }
                    }
                }
            };
            let Some(last) = paths.last().filter(|_| paths.len() == count) else {
                return Err(quorumlock_core::Error::new(
                    ErrorKind::Internal,
                    format!("a transaction of {count} creates answered {}", paths.len()),
                ));
            };
            // The server may answer a create in a multi without its stat
            // (ZOOKEEPER-4026): read it.
            self.send(1);
            let r = c.check_stat(last).await;
            self.heard_read(&r);
            return match r {
                Ok(Some(stat)) => Ok((paths, stat)),
                Ok(None) => Err(lost_session(
                    "our leases are gone (session expired or broken)",
                )),
                Err(e) => Err(map(e, "reading our last lease")),
            };
        }
    }
}
