//! Fault injection: a TCP proxy, a fenced resource, a history checker and
//! the scenarios that use them.
//!
//! The pieces:
//! - [`FencedRegister`]: a resource that accepts a write only with a token
//!   at least as high as any it has seen, and records every attempt.
//! - [`History`]: each holder's belief interval (acquire confirmed → release
//!   or loss signalled); [`History::overlaps`] finds two holders that both
//!   believed they held the lock at once.
//! - [`TcpProxy`]: between one client and its store, with the modes of
//!   [`NetMode`]; [`SimNet`] gives the same modes to `mem://` clients.
//! - [`FaultTarget`]: a store under test and how to make clients of it,
//!   plain or behind a fault-injecting link.
//! - [`scenarios`]: one `pub async fn` per scenario, each returning a
//!   [`Row`] and asserting zero overlaps, zero stale writes accepted and
//!   zero leaked entries. [`fault_suite!`](crate::fault_suite) turns them
//!   into tests.
//!
//! Environment: `QUORUMLOCK_CHAOS_SECONDS` (each scenario repeats its
//! rounds for that long; unset: one round), `QUORUMLOCK_CHAOS_RESULTS`
//! (a file each scenario appends its row to, tab-separated).

use std::fmt;
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::backend::Backend;
use quorumlock_core::mem::MemBackend;
use quorumlock_core::url::{self, Url};
use quorumlock_core::LockClient;

use crate::{BackendFactory, Harness};

mod cancel;
pub mod cluster;
pub mod explorer;
mod history;
mod http_proxy;
mod links;
pub mod mutants;
pub mod process;
mod proxy;
mod refusal;
mod register;
mod report;
pub mod scenarios;
mod sim;
mod unavailable;

pub use cluster::{Cluster, ClusterTurn, StoreKind};
pub use history::{History, Hold, HoldEnd, Overlap, Tracked};
pub use http_proxy::{HttpFault, HttpProxy, HttpRule, Match, Seen};
pub use proxy::{OneShot, ProxyStats, TcpProxy};
pub use register::{FencedRegister, StaleToken, Write};
pub use report::{chaos_budget, Row};
pub use sim::SimNet;

/// What a faulty link does to the traffic between one client and its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetMode {
    /// Everything passes.
    Pass,
    /// Open connections closed, new ones refused.
    Cut,
    /// Accepted but never forwarded or answered (a partition).
    Blackhole,
    /// Every message delayed by this much.
    Delay(Duration),
    /// Open connections reset (RST), new ones too while in this mode.
    Reset,
}

/// Control of one client's link to the store.
pub trait NetControl: Send + Sync + fmt::Debug {
    /// Switches the link to `mode`.
    fn set_mode(&self, mode: NetMode);
    /// The mode in force.
    fn mode(&self) -> NetMode;
    /// How many times the link was switched away from [`NetMode::Pass`].
    fn faults(&self) -> u64;
    /// What the client sent across the link, counted on the link: chunks
    /// of client bytes at a [`TcpProxy`] ([`ProxyStats::requests`]), calls
    /// on the simulated `mem://` link.
    fn requests(&self) -> u64;
    /// Arms a one-shot request-level fault ([`OneShot`]); `false` where
    /// the link cannot (the simulated `mem://` link).
    fn arm(&self, _fault: OneShot) -> bool {
        false
    }
    /// Resets what is open and lets new traffic pass.
    fn pulse_reset(&self) {
        self.set_mode(NetMode::Reset);
        self.set_mode(NetMode::Pass);
    }
}

impl NetControl for Arc<TcpProxy> {
    fn set_mode(&self, mode: NetMode) {
        (**self).set_mode(mode)
    }
    fn mode(&self) -> NetMode {
        (**self).mode()
    }
    fn faults(&self) -> u64 {
        (**self).faults()
    }
    fn requests(&self) -> u64 {
        (**self).requests()
    }
    fn arm(&self, fault: OneShot) -> bool {
        TcpProxy::arm(self, fault);
        true
    }
}

#[derive(Clone)]
enum Link {
    /// Real store: a [`TcpProxy`] to this address, put in the URL.
    Proxy(SocketAddr),
    /// `mem://`: a [`SimNet`].
    Mem,
}

/// A store under fault test: its URL, how to make a backend (one per
/// client, like a process), and how to put a faulty link in between.
#[derive(Clone)]
pub struct FaultTarget {
    name: String,
    base: Url,
    factory: BackendFactory,
    link: Link,
    wrap: Option<Wrap>,
    /// The explorer may run a holder in a separate process (the test
    /// binary has its test: [`fault_suite!`](crate::fault_suite)).
    holder_processes: bool,
    /// How to step the store's clock for one namespace, where it matters.
    clock_step: Option<ClockStep>,
    /// How an operator deletes a lock's entries with the store's own tool.
    entry_delete: Option<EntryDelete>,
    /// How to fail the store over to a replica that lacks the last writes,
    /// where the target is a primary with a replica.
    failover: Option<Arc<dyn Failover>>,
}

/// A primary with a replica that the explorer can fail over, losing the
/// writes the replica did not get (see [`FaultTarget::with_failover`]).
/// Redis replicates asynchronously; so does PostgreSQL without
/// synchronous standbys.
#[async_trait::async_trait]
pub trait Failover: Send + Sync {
    /// Cuts the replication link: every write from now on is lost at the
    /// next [`promote`](Failover::promote).
    async fn partition(&self) -> Result<(), String>;

    /// Promotes the replica, moves the target's address to it (open
    /// connections are closed, as a moved DNS name or Sentinel does), and
    /// makes the old primary its replica, synced, so that the next
    /// failover is one again. Returns when the address moved: from then
    /// on a new request reaches the new primary only. An error means the
    /// failover did not complete (the pair is left healed if it can be).
    async fn promote(&self) -> Result<tokio::time::Instant, String>;
}

/// Steps the store's clock forward by the given span for every key (or
/// row) of one namespace and what is under it, as a step of the server's
/// wall clock acts on them (see [`FaultTarget::with_clock_step`]).
pub type ClockStep = Arc<
    dyn Fn(String, Duration) -> futures::future::BoxFuture<'static, Result<(), String>>
        + Send
        + Sync,
>;

/// Deletes every entry of one lock (`delete(namespace, name)`) with the
/// store's own tool, as an operator clearing a stuck lock by hand does:
/// nothing tells the holder (see [`FaultTarget::with_entry_delete`]).
pub type EntryDelete = Arc<
    dyn Fn(String, String) -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync,
>;

/// What [`FaultTarget::as_mutant`] appends to a target's name.
pub const MUTANT_SUFFIX: &str = "+mutant";

/// Wraps every backend a [`FaultTarget`] makes; see
/// [`FaultTarget::wrap_backends`].
pub type Wrap = Arc<dyn Fn(Arc<dyn Backend>) -> Arc<dyn Backend> + Send + Sync>;

impl fmt::Debug for FaultTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultTarget")
            .field("name", &self.name)
            .field("base", &url::redact(&self.base))
            .finish()
    }
}

impl FaultTarget {
    /// A real store at the URL in `var`, reached through a [`TcpProxy`]
    /// for faulty clients: the URL's host and port are the proxy's target
    /// and are rewritten to the proxy's address (so the URL must name one
    /// `host:port`; of a host list, faulty clients reach the first only). Unset: a loud skip (`None`), or a panic when
    /// `QUORUMLOCK_TEST_REQUIRE=1`.
    pub fn from_env<F, Fut>(name: &str, var: &str, factory: F) -> Option<FaultTarget>
    where
        F: Fn(Url) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        let Some(raw) = std::env::var(var).ok().filter(|v| !v.is_empty()) else {
            if crate::harness::require() {
                panic!("{var} is not set and QUORUMLOCK_TEST_REQUIRE=1: the fault suite needs its store");
            }
            eprintln!("SKIPPED: {var} is not set; start the stores with scripts/stores.sh up");
            return None;
        };
        let base = url::parse(&raw).unwrap_or_else(|e| panic!("{var}: {e}"));
        Some(Self::new(name, base, factory))
    }

    /// A real store at `base`; see [`from_env`](Self::from_env).
    pub fn new<F, Fut>(name: &str, base: Url, factory: F) -> FaultTarget
    where
        F: Fn(Url) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        let host = base
            .host_str()
            .unwrap_or_else(|| panic!("{}: no host", url::redact(&base)));
        let port = base.port().unwrap_or_else(|| {
            panic!(
                "{}: the fault suite needs an explicit port",
                url::redact(&base)
            )
        });
        // A list of hosts sharing one port (`zk://a,b,c:2181`): the first.
        let first = host.split(',').next().unwrap_or(host);
        let target = (first.trim_matches(['[', ']']), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("{}: cannot resolve {host}:{port}", url::redact(&base)));
        FaultTarget {
            name: name.to_string(),
            base,
            factory: Arc::new(move |u| Box::pin(factory(u))),
            link: Link::Proxy(target),
            wrap: None,
            holder_processes: false,
            clock_step: None,
            entry_delete: None,
            failover: None,
        }
    }

    /// A real three-node cluster started by [`Cluster::start`], named
    /// `<store>-cluster` in the table; faulty links go to its first node.
    pub fn for_cluster<F, Fut>(cluster: &Cluster, factory: F) -> FaultTarget
    where
        F: Fn(Url) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        let name = format!("{:?}-cluster", cluster.kind()).to_lowercase();
        let url = url::parse(&cluster.url()).expect("cluster URL");
        Self::new(&name, url, factory)
    }

    /// The same target with its clients talking to member `i` of
    /// `cluster` alone (the options of its URL kept), named
    /// `<name>-n<i>`.
    pub fn on_member(&self, cluster: &Cluster, i: usize) -> FaultTarget {
        let mut base = url::parse(&cluster.member_url(i)).expect("member URL");
        base.set_path(self.base.path());
        let options: Vec<(String, String)> = self
            .base
            .query_pairs()
            .filter(|(k, _)| k != "endpoints")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if !options.is_empty() {
            base.query_pairs_mut().extend_pairs(options);
        }
        FaultTarget {
            name: format!("{}-n{i}", self.name),
            base,
            factory: self.factory.clone(),
            link: Link::Proxy(cluster.client_addr(i)),
            wrap: self.wrap.clone(),
            holder_processes: false,
            clock_step: None,
            entry_delete: None,
            failover: None,
        }
    }

    /// The in-memory backend at `base` (a `mem://` URL; its `ttl` option
    /// sets the session TTL), with [`SimNet`] links.
    pub fn mem(base: &str) -> FaultTarget {
        let base = url::parse(base).expect("a mem:// URL");
        FaultTarget {
            name: "mem".to_string(),
            base,
            factory: Arc::new(|u| {
                Box::pin(
                    async move { Ok(Arc::new(MemBackend::connect(&u).await?) as Arc<dyn Backend>) },
                )
            }),
            link: Link::Mem,
            wrap: None,
            holder_processes: false,
            clock_step: None,
            entry_delete: None,
            failover: None,
        }
    }

    /// The same target with `key=value` added to the URL's query (e.g. a
    /// shorter session TTL for faster scenarios).
    pub fn with_option(mut self, key: &str, value: &str) -> FaultTarget {
        self.base.query_pairs_mut().append_pair(key, value);
        self
    }

    /// The same target with every backend (direct or behind a faulty
    /// link) passed through `wrap`, e.g. to prove that the scenarios fail
    /// on a backend that breaks a promise.
    pub fn wrap_backends(
        mut self,
        wrap: impl Fn(Arc<dyn Backend>) -> Arc<dyn Backend> + Send + Sync + 'static,
    ) -> FaultTarget {
        self.wrap = Some(Arc::new(wrap));
        self
    }

    /// The same target, named `<name>+mutant`: its backends are mutated
    /// (see [`wrap_backends`](Self::wrap_backends)), so a violation is
    /// what its test expects, and its rows are printed but not appended to
    /// `scripts/chaos.sh`'s results ([`Row::record`]), where they would
    /// count as failures.
    pub fn as_mutant(mut self) -> FaultTarget {
        self.name.push_str(MUTANT_SUFFIX);
        self
    }

    /// The same target, for a test binary that has the explorer's holder
    /// process test (`explorer_holder_child`, from
    /// [`fault_suite!`](crate::fault_suite)): its schedules may run a
    /// holder in a separate process. No effect on `mem://` (one process).
    pub fn with_holder_processes(mut self) -> FaultTarget {
        self.holder_processes = matches!(self.link, Link::Proxy(_));
        self
    }

    /// The same target, with a way to step its store's clock forward for
    /// one namespace (`step(namespace, by)`): for stores whose session
    /// expiries are absolute times of the server's wall clock (Redis,
    /// PostgreSQL), the explorer then steps it once in some schedules,
    /// by less than TTL/5 (which the documentation promises is safe),
    /// while one client's link is blackholed.
    pub fn with_clock_step<F, Fut>(mut self, step: F) -> FaultTarget
    where
        F: Fn(String, Duration) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        self.clock_step = Some(Arc::new(move |ns, by| Box::pin(step(ns, by))));
        self
    }

    /// The same target, with a way for an operator to delete a lock's
    /// entries behind its holders' backs (`delete(namespace, name)`, with
    /// the store's own tool): the explorer then does so in some rounds,
    /// and the checker holds every release's outcome against it (a holder
    /// that has not heard of the loss must not be told its release went
    /// through).
    pub fn with_entry_delete<F, Fut>(mut self, delete: F) -> FaultTarget
    where
        F: Fn(String, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        self.entry_delete = Some(Arc::new(move |ns, name| Box::pin(delete(ns, name))));
        self
    }

    /// How an operator deletes a lock's entries, if the target says.
    pub fn entry_delete(&self) -> Option<&EntryDelete> {
        self.entry_delete.as_ref()
    }

    /// How to step the store's clock, if the target says.
    pub fn clock_step(&self) -> Option<&ClockStep> {
        self.clock_step.as_ref()
    }

    /// The same target, whose store is a primary with a replica that
    /// `failover` fails over: the explorer then fails it over in some
    /// schedules, losing the writes since the replication link was cut,
    /// and holds the store to what its documentation promises (tokens
    /// keep growing, a fenced write of the lost holder is refused, the
    /// lost holder is told within a TTL). Run such schedules one at a
    /// time ([`explorer::explore`]): a failover hits every namespace.
    pub fn with_failover(mut self, failover: Arc<dyn Failover>) -> FaultTarget {
        self.failover = Some(failover);
        self
    }

    /// How to fail the store over, if the target says.
    pub fn failover(&self) -> Option<&Arc<dyn Failover>> {
        self.failover.as_ref()
    }

    /// Whether the explorer may run a holder in a separate process.
    pub fn holder_processes(&self) -> bool {
        self.holder_processes
    }

    fn wrapped(&self, b: Arc<dyn Backend>) -> Arc<dyn Backend> {
        match &self.wrap {
            Some(w) => w(b),
            None => b,
        }
    }

    /// The store's name in the results table.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A [`Harness`] over the same store, for the conformance cases.
    pub fn harness(&self) -> Harness {
        let (f, w) = (self.factory.clone(), self.wrap.clone());
        Harness::new(&self.name, self.base.clone(), move |u| {
            let (f, w) = (f.clone(), w.clone());
            async move {
                let b = f(u).await?;
                Ok(match w {
                    Some(w) => w(b),
                    None => b,
                })
            }
        })
    }

    fn url_for(&self, namespace: &str) -> Url {
        let mut u = self.base.clone();
        let path = format!("{}/{}", u.path().trim_end_matches('/'), namespace);
        u.set_path(&path);
        u
    }

    /// A backend for `namespace` with a direct link.
    pub async fn backend(&self, namespace: &str) -> Arc<dyn Backend> {
        self.try_backend(namespace)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`FaultTarget::backend`], or why it could not connect.
    pub async fn try_backend(&self, namespace: &str) -> Result<Arc<dyn Backend>, String> {
        let u = self.url_for(namespace);
        let b = (self.factory)(u.clone())
            .await
            .map_err(|e| format!("connecting to {}: {e}", url::redact(&u)))?;
        Ok(self.wrapped(b))
    }

    /// A backend for `namespace` behind a faulty link, and the link.
    pub async fn faulty_backend(&self, namespace: &str) -> (Arc<dyn Backend>, Arc<dyn NetControl>) {
        self.try_faulty_backend(namespace)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`FaultTarget::faulty_backend`], or why it could not connect.
    pub async fn try_faulty_backend(
        &self,
        namespace: &str,
    ) -> Result<(Arc<dyn Backend>, Arc<dyn NetControl>), String> {
        let mut u = self.url_for(namespace);
        match &self.link {
            Link::Mem => {
                let mem = MemBackend::connect(&u).await.expect("mem URL");
                let (net, backend) = SimNet::wrap(mem);
                Ok((self.wrapped(backend), net))
            }
            Link::Proxy(target) => {
                let proxy = Arc::new(TcpProxy::start(*target).await.expect("starting a proxy"));
                u.set_host(Some("127.0.0.1")).expect("set host");
                u.set_port(Some(proxy.addr().port())).expect("set port");
                let backend = (self.factory)(u.clone()).await.map_err(|e| {
                    format!("connecting through the proxy to {}: {e}", url::redact(&u))
                })?;
                Ok((self.wrapped(backend), Arc::new(proxy)))
            }
        }
    }

    /// A client with a direct link.
    pub async fn client(&self, namespace: &str) -> LockClient {
        LockClient::new(self.backend(namespace).await)
    }
}

/// Expands to one `#[tokio::test]` per fault scenario, each running
/// against the [`FaultTarget`] that `$target` (an expression of type
/// `Option<FaultTarget>`, evaluated in each test) gives. `None` skips.
///
/// ```ignore
/// quorumlock_conformance::fault_suite!(quorumlock_conformance::faults::FaultTarget::from_env(
///     "etcd",
///     "QUORUMLOCK_TEST_ETCD_URL",
///     |url| async move { Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _) },
/// ));
/// ```
#[macro_export]
macro_rules! fault_suite {
    ($target:expr) => {
        $crate::__fault_suite_expand!($target;
            contention_no_fault,
            holder_session_killed,
            operator_breaks_lock,
            partitioned_holder,
            partitioned_waiter,
            paused_holder_fenced,
            reset_during_acquire,
            waiter_session_killed_while_queued,
            cancelled_acquires_under_contention,
            keepalive_delay_then_failure,
            cancel_at_every_poll,
            calls_return_within_bounds_on_a_dead_link,
            refused_removal_ends_the_session,
            late_grant_is_given_back,
            unreachable_store_is_unavailable,
            connect_checks_the_store,
            idle_watch_sends_nothing_on_its_link
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn explore_random_schedules() {
            let Some(target) = $target else { return };
            // This binary has the holder process's test (below).
            let target = target.with_holder_processes();
            $crate::faults::scenarios::explore_random_schedules(&target).await;
        }

        /// A holder process of `explore_random_schedules`, which runs it;
        /// ignored otherwise.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "a holder process of explore_random_schedules, run by it"]
        async fn explorer_holder_child() {
            let Some(target) = $target else { return };
            $crate::faults::explorer::holder_child(&target).await;
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __fault_suite_expand {
    ($t:expr; $($s:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $s() {
                let Some(target) = $t else { return };
                $crate::faults::scenarios::$s(&target).await;
            }
        )*
    };
}

/// Expands to one `#[tokio::test]` per cluster scenario. Each starts its
/// own three-node cluster of `$kind` ([`StoreKind`]) on 127.0.0.2-4
/// (linked where it can be: [`Cluster::start_linked_if_supported`]),
/// connects through `$factory` to [`Cluster::url`] with `$key=$value`
/// added to the URL (a short TTL), runs, and stops the cluster. Skipped
/// `#[ignore]`d unless asked for (`cargo test -- --include-ignored`).
///
/// ```ignore
/// quorumlock_conformance::cluster_fault_suite!(
///     quorumlock_conformance::faults::StoreKind::Etcd,
///     |url| async move { Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _) },
///     "ttl", "2s"
/// );
/// ```
#[macro_export]
macro_rules! cluster_fault_suite {
    ($kind:expr, $factory:expr, $key:expr, $value:expr) => {
        $crate::__cluster_fault_suite_expand!($kind, $factory, $key, $value;
            leader_killed_while_held,
            cluster_paused_while_held,
            cluster_restarted_while_held,
            explore_on_cluster
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cluster_fault_suite_expand {
    ($kind:expr, $factory:expr, $key:expr, $value:expr; $($s:ident),* $(,)?) => {
        $(
            // Minutes per store and three servers each: run on purpose
            // (scripts/chaos.sh: `-- --include-ignored`), reported as
            // ignored otherwise, never as passed.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "three-node cluster scenario: scripts/chaos.sh runs it"]
            async fn $s() {
                let kind: $crate::faults::StoreKind = $kind;
                // etcd and Consul with per-link proxies (the explorer cuts
                // single links there too).
                let (cluster, turn) = $crate::faults::Cluster::start_linked_if_supported(kind)
                    .await
                    .expect("starting a three-node cluster");
                // Dropped in reverse order, also on a panic: the cluster
                // first, then the turn.
                let _turn = turn;
                let mut cluster = cluster;
                let target = $crate::faults::FaultTarget::for_cluster(&cluster, $factory)
                    .with_option($key, $value);
                $crate::faults::scenarios::$s(&target, &mut cluster).await;
            }
        )*
    };
}

/// Expands to the per-link cluster scenarios of `$kind` (etcd or Consul),
/// each on its own three-node cluster from [`Cluster::start_linked`], as
/// [`cluster_fault_suite!`](crate::cluster_fault_suite) does: the
/// follower cut from its leader, and the same scenario failing on
/// [`mutants::trusting_its_member`] (a client that believes what its
/// member says). `#[ignore]`d: scripts/chaos.sh runs them.
#[macro_export]
macro_rules! cluster_link_suite {
    ($kind:expr, $factory:expr, $key:expr, $value:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "three-node cluster scenario: scripts/chaos.sh runs it"]
        async fn follower_cut_from_leader() {
            $crate::faults::scenarios::on_linked_cluster($kind, $key, $value, $factory, false)
                .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "three-node cluster scenario: scripts/chaos.sh runs it"]
        #[should_panic(expected = "two holders believed they held the lock at once")]
        async fn follower_cut_catches_a_client_trusting_its_member() {
            let kind: $crate::faults::StoreKind = $kind;
            let factory = $factory;
            $crate::faults::scenarios::on_linked_cluster(
                kind,
                $key,
                $value,
                move |url| {
                    let inner = factory(url.clone());
                    async move {
                        Ok($crate::faults::mutants::trusting_its_member(
                            inner.await?,
                            &url,
                            kind,
                        ))
                    }
                },
                true,
            )
            .await;
        }
    };
}
