use std::time::Duration;

use crate::backend::Namespace;
use crate::url::{self, Url};
use crate::{Error, ErrorKind, Result};

/// Configuration of a `mem://` client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemConfig {
    /// Which in-process store (the URL host; `default` when empty).
    pub store: String,
    /// Namespace prefix (the URL path).
    pub namespace: Namespace,
    /// Session TTL (`ttl=`, default 10 s, 100 ms..=1 h).
    pub ttl: Duration,
}

const KNOWN: &[&str] = &["ttl"];

/// The default of [`MemConfig::ttl`].
const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The bounds of [`MemConfig::ttl`].
const MIN_TTL: Duration = Duration::from_millis(100);
const MAX_TTL: Duration = Duration::from_secs(3600);

impl MemConfig {
    /// Parses a `mem://` URL given as text (see [`MemConfig::from_url`]).
    pub fn parse(s: &str) -> Result<Self> {
        Self::from_url(&crate::url::parse(s)?)
    }

    /// Parses `mem://[store][/namespace][?ttl=..]`.
    pub fn from_url(url: &Url) -> Result<Self> {
        if url.scheme() != "mem" {
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                format!("expected a mem:// URL, got {}://", url.scheme()),
            ));
        }
        if !url.username().is_empty() || url.password().is_some() || url.port().is_some() {
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                "mem:// takes no credentials and no port",
            ));
        }
        let store = match url.host_str().unwrap_or("") {
            "" => "default".to_string(),
            h => h.to_string(),
        };
        let namespace = Namespace::from_url(url)?;
        let mut opts = url::Options::new(url)?;
        let ttl = opts.duration("ttl", DEFAULT_TTL, MIN_TTL, MAX_TTL)?;
        opts.finish(KNOWN)?;
        Ok(MemConfig {
            store,
            namespace,
            ttl,
        })
    }

    /// The rules of a `mem://` URL for a config built in code: `ttl`
    /// within 100 ms..=1 h. Breaking it is
    /// [`ErrorKind::InvalidArgument`], naming the field and its bounds;
    /// [`MemBackend::from_config`](super::MemBackend::from_config) calls
    /// this first.
    pub fn validate(&self) -> Result<()> {
        url::check_duration("ttl", self.ttl, MIN_TTL, MAX_TTL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_store_namespace_and_ttl() {
        let c = MemConfig::from_url(&url::parse("mem://s1/app/x?ttl=2s").unwrap()).unwrap();
        assert_eq!(c.store, "s1");
        assert_eq!(c.namespace, "app/x");
        assert_eq!(c.ttl, Duration::from_secs(2));
        let c = MemConfig::from_url(&url::parse("mem://").unwrap()).unwrap();
        assert_eq!((c.store.as_str(), c.namespace.as_str()), ("default", ""));
    }

    #[test]
    fn rejects_bad_options() {
        for u in [
            "mem://s?ttl=0s",
            "mem://s?ttl=abc",
            "mem://s?color=red",
            "mem://u:p@s",
        ] {
            let e = MemConfig::from_url(&url::parse(u).unwrap()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{u}");
        }
    }

    /// A typed config is held to the URL's rules: `from_config` refuses
    /// the TTLs `mem://?ttl=` refuses (issue 45).
    #[tokio::test]
    async fn typed_config_is_validated() {
        let ok = MemConfig::parse("mem://typed-config").unwrap();
        for ttl in [
            Duration::ZERO,
            Duration::from_millis(99),
            Duration::from_secs(3601),
        ] {
            let c = MemConfig { ttl, ..ok.clone() };
            let e = match super::super::MemBackend::from_config(c).await {
                Ok(_) => panic!("from_config accepted ttl={ttl:?}"),
                Err(e) => e,
            };
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.message().contains("ttl"), "{e}");
        }
        super::super::MemBackend::from_config(ok).await.unwrap();
    }
}
