//! The URL schemes of the workspace's backends. Each backend's `SCHEMES`
//! is its list here, and the facade's table is built from them: kept in
//! quorumlock_core so that the facade knows the schemes of a backend whose
//! feature (and crate) is off, to name the feature in its error.

/// `mem://`: the in-process store of this crate.
pub const MEM: &[&str] = &["mem"];
/// `etcd://`, `etcds://` (TLS): the `quorumlock-etcd` crate.
pub const ETCD: &[&str] = &["etcd", "etcds"];
/// `zk://`: the `quorumlock-zk` crate.
pub const ZK: &[&str] = &["zk"];
/// `consul://`, `consuls://` (HTTPS): the `quorumlock-consul` crate.
pub const CONSUL: &[&str] = &["consul", "consuls"];
/// `redis://`, `rediss://` (TLS): the `quorumlock-redis` crate.
pub const REDIS: &[&str] = &["redis", "rediss"];
/// `postgres://`, `postgresql://`: the `quorumlock-postgres` crate.
pub const POSTGRES: &[&str] = &["postgres", "postgresql"];

/// Every backend of the workspace as `(cargo feature of the quorumlock
/// facade, schemes)`: the facade's table of schemes. A new backend adds
/// its line here.
pub const ALL: &[(&str, &[&str])] = &[
    ("mem", MEM),
    ("etcd", ETCD),
    ("zk", ZK),
    ("consul", CONSUL),
    ("redis", REDIS),
    ("postgres", POSTGRES),
];
