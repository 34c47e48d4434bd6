#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]
// docs.rs builds with every feature and `--cfg docsrs`: each backend's
// module then carries a note naming the feature that enables it.
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

use quorumlock_core::backend::Backend;

/// The backend contract, **unstable**: for a store of your own (see
/// [`LockClient::new`]) or a wrapper in tests, not for using locks. It
/// changes in any release; pin an exact version to depend on it.
pub use quorumlock_core::backend;
pub use quorumlock_core::url;
pub use quorumlock_core::{
    default_value, ClientOptions, Contender, Election, Error, ErrorKind, Follow, Leader,
    LeaderGuard, Lock, LockClient, LockGuard, LockKind, LockName, LockState, LossReason,
    MultiGuard, MultiLock, Reentry, Result, RwLock, Semaphore,
};
// Every public constant of quorumlock-core's root (the limits the docs of
// `LockName`, `ErrorKind`, `Election` and `ClientOptions` name), so that
// their links stay inside this crate's docs; `tests::core_constants` names
// each, with the backend contract's (under `backend`) and the connect bounds.
/// The bounds of every network store's `connect_timeout` (URL option and
/// typed configs), and its default.
pub use quorumlock_core::backend::connect::{
    DEFAULT_CONNECT_TIMEOUT, MAX_CONNECT_TIMEOUT, MIN_CONNECT_TIMEOUT,
};
pub use quorumlock_core::{
    DEFAULT_POLL_INTERVAL, DEFAULT_UNAVAILABLE_AFTER, MAX_NAME_LEN, MAX_SEGMENT_LEN,
    MIN_POLL_INTERVAL, RESERVED_NESTED_SEGMENTS,
};

#[cfg(feature = "mem")]
#[cfg_attr(docsrs, doc(cfg(feature = "mem")))]
pub use quorumlock_core::mem;

#[cfg(feature = "consul")]
#[cfg_attr(docsrs, doc(cfg(feature = "consul")))]
#[doc(inline)]
pub use quorumlock_consul as consul;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
#[doc(inline)]
pub use quorumlock_etcd as etcd;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use quorumlock_postgres as postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use quorumlock_redis as redis;
#[cfg(feature = "zk")]
#[cfg_attr(docsrs, doc(cfg(feature = "zk")))]
#[doc(inline)]
pub use quorumlock_zk as zk;

/// The environment variable [`connect_from_env`] reads.
pub const URL_ENV: &str = "QUORUMLOCK_URL";

/// The embedded store's URL, which the examples use when [`URL_ENV`] is
/// unset ([`connect_from_env`] refuses an unset variable instead).
pub const DEFAULT_URL: &str = "mem://";

/// Every scheme quorumlock knows, per cargo feature (features that are
/// off included, so that their error can name the feature):
/// [`quorumlock_core::backend::schemes::ALL`].
pub const SCHEMES: &[(&str, &[&str])] = quorumlock_core::backend::schemes::ALL;

/// The stores this crate reaches, one line each: the cargo feature, the
/// [`StoreConfig`] variant, the crate (or module) with its config and
/// backend types. Each line makes the variant and its `From`, and one arm
/// in each of the two steps every connection takes: text to typed config
/// (`<Config>::parse`), typed config to backend
/// (`<Backend>::from_config`). A new store is one line here and its line
/// in [`quorumlock_core::backend::schemes::ALL`].
macro_rules! stores {
    ($(
        $(#[$doc:meta])*
        $feature:literal => $variant:ident($($krate:ident)::+ { $config:ident, $backend:ident });
    )+) => {
        /// A typed store configuration, for [`ClientBuilder::from_config`];
        /// each backend's config converts into it with `into()`, and
        /// [`StoreConfig::from_url`] makes one from a URL.
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub enum StoreConfig {
            $(
                $(#[$doc])*
                #[cfg(feature = $feature)]
                #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
                $variant($($krate)::+::$config),
            )+
        }

        $(
            #[cfg(feature = $feature)]
            impl From<$($krate)::+::$config> for StoreConfig {
                fn from(c: $($krate)::+::$config) -> Self {
                    StoreConfig::$variant(c)
                }
            }
        )+

        impl StoreConfig {
            /// The config `url` describes, if `feature` is on.
            fn parse_with(feature: &str, url: &str) -> Option<Result<StoreConfig>> {
                $(
                    #[cfg(feature = $feature)]
                    if feature == $feature {
                        return Some($($krate)::+::$config::parse(url).map(StoreConfig::$variant));
                    }
                )+
                let _ = (feature, url);
                None
            }

            /// Whether the cargo feature that serves a store is on.
            #[cfg(test)]
            fn feature_on(feature: &str) -> bool {
                $(
                    #[cfg(feature = $feature)]
                    if feature == $feature {
                        return true;
                    }
                )+
                let _ = feature;
                false
            }

            /// The backend this config describes, connected.
            // With no store feature at all there is no arm.
            #[allow(unreachable_code)]
            async fn connect(self) -> Result<Arc<dyn Backend>> {
                Ok(match self {
                    $(
                        #[cfg(feature = $feature)]
                        StoreConfig::$variant(c) => {
                            Arc::new($($krate)::+::$backend::from_config(c).await?)
                        }
                    )+
                })
            }
        }
    };
}

stores! {
    /// The in-process store.
    "mem" => Mem(quorumlock_core::mem { MemConfig, MemBackend });
    /// etcd.
    "etcd" => Etcd(quorumlock_etcd { EtcdConfig, EtcdBackend });
    /// ZooKeeper.
    "zk" => Zk(quorumlock_zk { ZkConfig, ZkBackend });
    /// Consul.
    "consul" => Consul(quorumlock_consul { ConsulConfig, ConsulBackend });
    /// Redis.
    "redis" => Redis(quorumlock_redis { RedisConfig, RedisBackend });
    /// PostgreSQL.
    "postgres" => Postgres(quorumlock_postgres { PostgresConfig, PostgresBackend });
}

impl StoreConfig {
    /// The typed configuration `url` names (see [`connect`] for the
    /// schemes); nothing is contacted. Errors: [`ErrorKind::InvalidUrl`],
    /// [`ErrorKind::UnknownScheme`], and [`ErrorKind::FeatureDisabled`]
    /// naming the feature a known scheme needs. Credentials never appear
    /// in errors.
    pub fn from_url(url: &str) -> Result<StoreConfig> {
        let scheme = match url.split_once("://") {
            Some((s, _)) if !s.is_empty() => s,
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidUrl,
                    "expected a store URL such as etcd://host:port/namespace",
                ))
            }
        };
        let feature = feature_of(scheme)?;
        StoreConfig::parse_with(feature, url).unwrap_or_else(|| {
            Err(Error::new(
                ErrorKind::FeatureDisabled,
                format!(
                    "{scheme}:// needs the `{feature}` feature of quorumlock \
                     (quorumlock = {{ version = \"*\", features = [\"{feature}\"] }})"
                ),
            ))
        })
    }
}

/// How to connect: a URL or a typed store configuration, plus the
/// client's [`ClientOptions`]. [`connect`] is `ClientBuilder::new(url)
/// .connect()`.
///
/// ```no_run
/// # async fn demo() -> quorumlock::Result<()> {
/// use std::time::Duration;
/// use quorumlock::{ClientBuilder, ClientOptions};
///
/// let client = ClientBuilder::new("etcd://127.0.0.1:2379/app?connect_timeout=3s")
///     .with_options(ClientOptions::default().with_unavailable_after(Some(Duration::from_secs(20))))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use]
pub struct ClientBuilder {
    target: Target,
    options: ClientOptions,
}

#[derive(Debug)]
enum Target {
    Url(String),
    Config(Box<StoreConfig>),
}

impl ClientBuilder {
    /// A client of the store named by `url` (see [`connect`] for the
    /// schemes).
    pub fn new(url: impl Into<String>) -> Self {
        ClientBuilder {
            target: Target::Url(url.into()),
            options: ClientOptions::default(),
        }
    }

    /// A client of the store `config` describes, e.g.
    /// `EtcdConfig::default().with_namespace(...)`.
    // With no store feature at all StoreConfig has no variant, and the code
    // after `into()` is unreachable.
    #[allow(unreachable_code)]
    pub fn from_config(config: impl Into<StoreConfig>) -> Self {
        ClientBuilder {
            target: Target::Config(Box::new(config.into())),
            options: ClientOptions::default(),
        }
    }

    /// The client's options (default: [`ClientOptions::default`]).
    pub fn with_options(mut self, options: ClientOptions) -> Self {
        self.options = options;
        self
    }

    /// Connects: checks the store answers within its connect timeout
    /// unless the URL or config says `lazy`. Errors:
    /// [`ErrorKind::InvalidUrl`] (bad input, nothing contacted),
    /// [`ErrorKind::Unavailable`] (refused until the connect timeout),
    /// [`ErrorKind::Timeout`] (no answer), [`ErrorKind::Unauthenticated`]
    /// or [`ErrorKind::PermissionDenied`] (credentials, not retried).
    ///
    /// # Cancel Safety
    /// Dropping it before it returns leaves nothing on the store: no lock
    /// session is opened until the first acquire.
    pub async fn connect(self) -> Result<LockClient> {
        let config = match self.target {
            Target::Url(u) => StoreConfig::from_url(&u)?,
            Target::Config(c) => *c,
        };
        let backend = config.connect().await?;
        tracing::debug!(store = %backend.describe(), "connected");
        Ok(LockClient::with_options(backend, self.options))
    }
}

/// Connects to the store named by `url` and returns a client.
///
/// | scheme | feature | example |
/// |---|---|---|
/// | `mem` | `mem` (default) | `mem://` or `mem://store/namespace?ttl=10s` |
/// | `etcd`, `etcds` | `etcd` | `etcd://user:pass@127.0.0.1:2379/namespace?ttl=10s` |
/// | `zk` | `zk` | `zk://127.0.0.1:2181,127.0.0.2:2181/namespace` |
/// | `consul`, `consuls` | `consul` | `consul://127.0.0.1:8500/namespace?token=...` |
/// | `redis`, `rediss` | `redis` | `redis://:password@127.0.0.1:6379/namespace?ttl=10s` (not CP: see the backend's README) |
/// | `postgres`, `postgresql` | `postgres` | `postgres://user:pass@127.0.0.1:5432/database/namespace?ttl=10s` (the path's first segment is the database; CP only on one primary or with synchronous standbys: see the backend's README) |
///
/// The URL path is the namespace; query parameters are the backend's
/// options (see each backend's README). Every network store (not `mem://`) takes
/// `connect_timeout=` (how long this waits for the store to answer,
/// default 10 s, 5 s on ZooKeeper) and `lazy=true` (send nothing now; the
/// first acquire finds out). See [`ClientBuilder::connect`] for the
/// errors, and [`ClientBuilder`] for options and typed configs. An unknown scheme is
/// [`ErrorKind::UnknownScheme`]; a known one whose feature is off is
/// [`ErrorKind::FeatureDisabled`], naming the feature. Credentials never
/// appear in errors or logs.
///
/// # Cancel Safety
/// Dropping it before it returns leaves nothing on the store: no session
/// is opened until the first acquire.
pub async fn connect(url: &str) -> Result<LockClient> {
    ClientBuilder::new(url).connect().await
}

/// [`connect`] to the URL in `QUORUMLOCK_URL`.
///
/// Unset or empty is [`ErrorKind::InvalidUrl`], never a silent fallback:
/// a deployment that forgot the variable must not run on a process-local
/// `mem://` store, where every process holds "the" lock at once. (Set it
/// to `mem://` for that store on purpose.)
///
/// # Cancel safety
/// As [`connect`].
pub async fn connect_from_env() -> Result<LockClient> {
    match std::env::var(URL_ENV) {
        Ok(u) if !u.is_empty() => connect(&u).await,
        _ => Err(Error::new(
            ErrorKind::InvalidUrl,
            format!("{URL_ENV} is not set: set it to a store URL (etcd://, zk://, consul://, redis://; mem:// for a store inside this process)"),
        )),
    }
}

/// The feature that serves `scheme`, or [`ErrorKind::UnknownScheme`].
fn feature_of(scheme: &str) -> Result<&'static str> {
    SCHEMES
        .iter()
        .find(|(_, schemes)| schemes.contains(&scheme))
        .map(|(f, _)| *f)
        .ok_or_else(|| {
            let known: Vec<&str> = SCHEMES
                .iter()
                .flat_map(|(_, s)| s.iter().copied())
                .collect();
            Error::new(
                ErrorKind::UnknownScheme,
                format!("unknown scheme {scheme}:// (known: {})", known.join(", ")),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every public constant of quorumlock-core is reachable from here: the
    /// root's by the same name, the backend contract's and mem's through
    /// their modules.
    #[test]
    // The point is that each constant is reachable here by its name.
    #[allow(clippy::assertions_on_constants)]
    fn core_constants() {
        use std::time::Duration;
        let durations: [Duration; 7] = [
            DEFAULT_POLL_INTERVAL,
            MIN_POLL_INTERVAL,
            DEFAULT_UNAVAILABLE_AFTER,
            backend::HELD_WATCH_DELAY,
            DEFAULT_CONNECT_TIMEOUT,
            MIN_CONNECT_TIMEOUT,
            MAX_CONNECT_TIMEOUT,
        ];
        assert!(durations.iter().all(|d| !d.is_zero()));
        assert!(MAX_SEGMENT_LEN < MAX_NAME_LEN && backend::MAX_KEY_LEN > MAX_NAME_LEN);
        assert_eq!(RESERVED_NESTED_SEGMENTS.len(), 2);
        assert!(MIN_CONNECT_TIMEOUT <= DEFAULT_CONNECT_TIMEOUT);
        assert!(DEFAULT_CONNECT_TIMEOUT <= MAX_CONNECT_TIMEOUT);
        assert_eq!(SCHEMES, backend::schemes::ALL);
    }

    #[tokio::test]
    async fn unknown_scheme_lists_the_known_ones() {
        let e = connect("memcached://127.0.0.1:11211").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownScheme);
        assert!(
            e.to_string().contains("etcd") && e.to_string().contains("consul"),
            "{e}"
        );
    }

    #[cfg(feature = "mem")]
    #[tokio::test]
    async fn bad_urls_are_typed_errors() {
        for u in ["not a url", "mem://?ttl=forever", "mem://x/a//b"] {
            let e = connect(u).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{u}: {e}");
        }
    }

    #[tokio::test]
    async fn disabled_feature_is_named_and_secrets_stay_hidden() {
        for (feature, scheme) in SCHEMES
            .iter()
            .flat_map(|(f, schemes)| schemes.iter().map(move |s| (f, s)))
        {
            if StoreConfig::feature_on(feature) {
                continue;
            }
            let e = connect(&format!("{scheme}://bob:s3cret@127.0.0.1:1/ns"))
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::FeatureDisabled, "{scheme}");
            assert!(e.to_string().contains(&format!("`{feature}`")), "{e}");
            assert!(!format!("{e} {e:?}").contains("s3cret"), "{e:?}");
        }
    }

    #[cfg(feature = "mem")]
    #[tokio::test]
    async fn builder_takes_options() {
        let c = ClientBuilder::new("mem://")
            .with_options(ClientOptions::default().with_unavailable_after(None))
            .connect()
            .await
            .unwrap();
        c.lock("facade/builder")
            .unwrap()
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let e = ClientBuilder::new("mem://?ttl=forever")
            .connect()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl);
    }

    /// A typed config reaches its backend: a dead port is Unavailable
    /// within its connect timeout, lazy connects at once.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn builder_from_a_typed_config() {
        use std::time::{Duration, Instant};
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let config = quorumlock_redis::RedisConfig::default()
            .with_port(port)
            .with_connect_timeout(Duration::from_millis(500));
        let start = Instant::now();
        let e = ClientBuilder::from_config(config.clone())
            .connect()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(start.elapsed() < Duration::from_secs(3));
        ClientBuilder::from_config(config.with_lazy(true))
            .connect()
            .await
            .unwrap();
    }

    #[cfg(feature = "mem")]
    #[tokio::test]
    async fn from_env_refuses_an_unset_variable() {
        // The only test of this crate that reads the variable.
        std::env::remove_var(URL_ENV);
        let e = connect_from_env().await.map(drop).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{e}");
        assert!(e.message().contains(URL_ENV), "{e}");
        std::env::set_var(URL_ENV, "mem://from-env");
        let c = connect_from_env().await.unwrap();
        std::env::remove_var(URL_ENV);
        let g = c.lock("facade/test").unwrap().acquire().await.unwrap();
        assert!(g.token() > 0);
        g.release().await.unwrap();
        c.close().await;
    }
}
