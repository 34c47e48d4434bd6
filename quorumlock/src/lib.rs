#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs builds with every feature and `--cfg docsrs`: each backend's
// module then carries a note naming the feature that enables it.
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

use lockcore::backend::Backend;

/// The backend contract (for a store of your own; see
/// [`LockClient::new`]).
pub use lockcore::backend;
pub use lockcore::url;
pub use lockcore::{
    default_value, ClientOptions, Contender, Election, Error, ErrorKind, Leader, LeaderGuard, Lock,
    LockClient, LockGuard, LockKind, LockName, LockState, LossReason, MultiGuard, MultiLock,
    Reentry, Result, RwLock, Semaphore,
};

#[cfg(feature = "mem")]
#[cfg_attr(docsrs, doc(cfg(feature = "mem")))]
pub use lockcore::mem;

#[cfg(feature = "consul")]
#[cfg_attr(docsrs, doc(cfg(feature = "consul")))]
#[doc(inline)]
pub use backend_consul as consul;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
#[doc(inline)]
pub use backend_etcd as etcd;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use backend_redis as redis;
#[cfg(feature = "zk")]
#[cfg_attr(docsrs, doc(cfg(feature = "zk")))]
#[doc(inline)]
pub use backend_zk as zk;

/// The environment variable [`connect_from_env`] reads.
pub const URL_ENV: &str = "QUORUMLOCK_URL";

/// The URL [`connect_from_env`] uses when [`URL_ENV`] is unset.
pub const DEFAULT_URL: &str = "mem://";

/// Every scheme quorumlock knows, per cargo feature: each backend's own
/// `SCHEMES` (for a feature that is off, the same list from
/// [`lockcore::backend::schemes`], so that its error can name the feature).
pub const SCHEMES: &[(&str, &[&str])] = &[
    ("mem", MEM),
    ("etcd", ETCD),
    ("zk", ZK),
    ("consul", CONSUL),
    ("redis", REDIS),
];

#[cfg(feature = "mem")]
const MEM: &[&str] = lockcore::mem::SCHEMES;
#[cfg(not(feature = "mem"))]
const MEM: &[&str] = lockcore::backend::schemes::MEM;
#[cfg(feature = "etcd")]
const ETCD: &[&str] = backend_etcd::SCHEMES;
#[cfg(not(feature = "etcd"))]
const ETCD: &[&str] = lockcore::backend::schemes::ETCD;
#[cfg(feature = "zk")]
const ZK: &[&str] = backend_zk::SCHEMES;
#[cfg(not(feature = "zk"))]
const ZK: &[&str] = lockcore::backend::schemes::ZK;
#[cfg(feature = "consul")]
const CONSUL: &[&str] = backend_consul::SCHEMES;
#[cfg(not(feature = "consul"))]
const CONSUL: &[&str] = lockcore::backend::schemes::CONSUL;
#[cfg(feature = "redis")]
const REDIS: &[&str] = backend_redis::SCHEMES;
#[cfg(not(feature = "redis"))]
const REDIS: &[&str] = lockcore::backend::schemes::REDIS;

/// Connects to the store named by `url` and returns a client.
///
/// | scheme | feature | example |
/// |---|---|---|
/// | `mem` | `mem` (default) | `mem://` or `mem://store/namespace?ttl=10s` |
/// | `etcd`, `etcds` | `etcd` | `etcd://user:pass@127.0.0.1:2379/namespace?ttl=10s` |
/// | `zk` | `zk` | `zk://127.0.0.1:2181,127.0.0.2:2181/namespace` |
/// | `consul`, `consuls` | `consul` | `consul://127.0.0.1:8500/namespace?token=...` |
/// | `redis`, `rediss` | `redis` | `redis://:password@127.0.0.1:6379/namespace?ttl=10s` (not CP: see the backend's README) |
///
/// The URL path is the namespace; query parameters are the backend's
/// options (see each backend's README). An unknown scheme is
/// [`ErrorKind::UnknownScheme`]; a known one whose feature is off is
/// [`ErrorKind::FeatureDisabled`], naming the feature. Credentials never
/// appear in errors or logs.
///
/// # Cancel safety
/// Dropping it before it returns leaves nothing on the store: no session
/// is opened until the first acquire.
pub async fn connect(url: &str) -> Result<LockClient> {
    let backend = backend_for(url).await?;
    tracing::debug!(store = %backend.describe(), "connected");
    Ok(LockClient::new(backend))
}

/// [`connect`] to the URL in `QUORUMLOCK_URL`, or to `mem://` if unset.
///
/// # Cancel safety
/// As [`connect`].
pub async fn connect_from_env() -> Result<LockClient> {
    match std::env::var(URL_ENV) {
        Ok(u) if !u.is_empty() => connect(&u).await,
        _ => connect(DEFAULT_URL).await,
    }
}

/// One arm per feature; every backend has the same constructor,
/// `connect(url)`.
async fn backend_for(url: &str) -> Result<Arc<dyn Backend>> {
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
    match feature {
        "mem" => {
            #[cfg(feature = "mem")]
            return Ok(Arc::new(lockcore::mem::MemBackend::connect(url).await?));
        }
        "etcd" => {
            #[cfg(feature = "etcd")]
            return Ok(Arc::new(backend_etcd::EtcdBackend::connect(url).await?));
        }
        "zk" => {
            #[cfg(feature = "zk")]
            return Ok(Arc::new(backend_zk::ZkBackend::connect(url).await?));
        }
        "consul" => {
            #[cfg(feature = "consul")]
            return Ok(Arc::new(backend_consul::ConsulBackend::connect(url).await?));
        }
        "redis" => {
            #[cfg(feature = "redis")]
            return Ok(Arc::new(backend_redis::RedisBackend::connect(url).await?));
        }
        _ => {}
    }
    Err(Error::new(
        ErrorKind::FeatureDisabled,
        format!(
            "{scheme}:// needs the `{feature}` feature of quorumlock \
             (quorumlock = {{ version = \"*\", features = [\"{feature}\"] }})"
        ),
    ))
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

    #[tokio::test]
    async fn unknown_scheme_lists_the_known_ones() {
        let e = connect("memcached://127.0.0.1:11211").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownScheme);
        assert!(
            e.to_string().contains("etcd") && e.to_string().contains("consul"),
            "{e}"
        );
    }

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
            let enabled = match *feature {
                "mem" => cfg!(feature = "mem"),
                "etcd" => cfg!(feature = "etcd"),
                "zk" => cfg!(feature = "zk"),
                "consul" => cfg!(feature = "consul"),
                "redis" => cfg!(feature = "redis"),
                f => panic!("feature {f} missing from this test"),
            };
            if enabled {
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
    async fn mem_by_default() {
        let c = connect_from_env().await.unwrap();
        let g = c.lock("facade/test").unwrap().acquire().await.unwrap();
        assert!(g.token() > 0);
        g.release().await.unwrap();
        c.close().await;
    }
}
