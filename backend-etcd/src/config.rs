//! `etcd://` and `etcds://` URLs: endpoints, credentials, TLS files, the
//! namespace and the lease TTL.

use std::path::PathBuf;
use std::time::Duration;

use lockcore::backend::Namespace;
use lockcore::url::{self, Options, Secret, Url};
use lockcore::{Error, ErrorKind, Result};

/// The port etcd serves clients on when the URL names none.
pub const DEFAULT_PORT: u16 = 2379;
/// Lease TTL when the URL has no `ttl=`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Shortest lease TTL accepted: etcd raises anything below about 1.5 x its
/// election timeout anyway, and a keepalive every TTL/3 must fit.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// Longest lease TTL accepted.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Per-request deadline when the URL has no `timeout=`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const KNOWN: &[&str] = &["ttl", "timeout", "endpoints", "ca", "cert", "key"];

/// Configuration of an etcd client, parsed from
/// `etcd[s]://[user:password@]host[:port][/namespace][?options]`.
///
/// `Debug` never shows the password (it is a [`Secret`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client endpoints as `http://host:port` (or `https://` for `etcds`):
    /// the URL's host first, then those of `endpoints=`.
    pub endpoints: Vec<String>,
    /// TLS (`etcds://`).
    pub tls: bool,
    /// PEM file with the CA that signed the servers' certificates (`ca=`,
    /// required with `etcds://`).
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key (`cert=` and `key=`, together).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// User name for etcd's auth (the URL user).
    pub user: Option<String>,
    /// Password for etcd's auth (the URL password).
    pub password: Option<Secret>,
    /// Key prefix of every lock (the URL path, without slashes at the ends).
    pub namespace: Namespace,
    /// Lease TTL (`ttl=`, whole seconds, default 10 s, 2 s ..= 24 h).
    pub ttl: Duration,
    /// Deadline of each unary request (`timeout=`, default 5 s,
    /// 100 ms ..= 10 min).
    pub timeout: Duration,
    /// The URL with secrets redacted, for `Display` and logs.
    pub display: String,
}

impl EtcdConfig {
    /// Parses and validates a URL; nothing is contacted here.
    ///
    /// Every bad input is an [`ErrorKind::InvalidUrl`] error whose message
    /// never contains the password.
    pub fn from_url(u: &Url) -> Result<EtcdConfig> {
        let tls = match u.scheme() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(invalid(format!(
                    "expected an etcd:// or etcds:// URL, got {other}://"
                )))
            }
        };
        let host = u
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| invalid("the URL names no etcd host".to_string()))?;
        let port = u.port().unwrap_or(DEFAULT_PORT);
        let scheme = if tls { "https" } else { "http" };
        let mut endpoints = vec![format!("{scheme}://{host}:{port}")];

        let (user, password) = match (u.username(), u.password()) {
            ("", None) => (None, None),
            ("", Some(_)) => return Err(invalid("a password needs a user name".to_string())),
            (_, None) => {
                return Err(invalid(
                    "a user name needs a password (etcd://user:password@host)".to_string(),
                ))
            }
            (user, Some(pw)) => (
                Some(url::percent_decode(user, "user name")?),
                Some(Secret::new(url::percent_decode(pw, "password")?)),
            ),
        };

        let namespace = Namespace::from_url(u)?;
        let mut opts = Options::new(u)?;
        let ttl = opts.duration("ttl", DEFAULT_TTL, MIN_TTL, MAX_TTL)?;
        if ttl.subsec_nanos() != 0 {
            return Err(invalid(format!(
                "URL option ttl={ttl:?}: etcd leases have whole seconds"
            )));
        }
        let timeout = opts.duration(
            "timeout",
            DEFAULT_TIMEOUT,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        if let Some(list) = opts.take("endpoints") {
            for ep in list.split(',').map(str::trim) {
                endpoints.push(format!("{scheme}://{}", host_port(ep)?));
            }
        }
        let ca = opts.take("ca").map(PathBuf::from);
        let cert = opts.take("cert").map(PathBuf::from);
        let key = opts.take("key").map(PathBuf::from);
        opts.finish(KNOWN)?;

        if !tls && (ca.is_some() || cert.is_some() || key.is_some()) {
            return Err(invalid(
                "ca=, cert= and key= need TLS: use etcds://".to_string(),
            ));
        }
        if tls && ca.is_none() {
            return Err(invalid(
                "etcds:// needs ca=<PEM file of the CA that signed the server certificates>"
                    .to_string(),
            ));
        }
        for (name, p) in [("ca", &ca), ("cert", &cert), ("key", &key)] {
            if p.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(invalid(format!("URL option {name}= is empty")));
            }
        }
        let client_cert = match (cert, key) {
            (None, None) => None,
            (Some(c), Some(k)) => Some((c, k)),
            _ => return Err(invalid("cert= and key= go together".to_string())),
        };

        Ok(EtcdConfig {
            endpoints,
            tls,
            ca,
            client_cert,
            user,
            password,
            namespace,
            ttl,
            timeout,
            display: url::redact(u),
        })
    }

    /// The lease TTL in whole seconds, as etcd takes it.
    pub fn ttl_secs(&self) -> i64 {
        self.ttl.as_secs() as i64
    }
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg)
}

/// Checks one `host:port` of `endpoints=`.
fn host_port(ep: &str) -> Result<String> {
    let bad = || {
        invalid(format!(
            "URL option endpoints: {ep:?} is not host:port (comma-separated list)"
        ))
    };
    let (host, port) = ep.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'));
    if !host_ok || port == 0 {
        return Err(bad());
    }
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(s: &str) -> Result<EtcdConfig> {
        EtcdConfig::from_url(&url::parse(s).unwrap())
    }

    fn rejected(s: &str, why: &str) {
        let e = cfg(s).expect_err(s);
        assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{s}: {e}");
        assert!(e.to_string().contains(why), "{s}: {e}");
        assert!(!e.to_string().contains("hunter2"), "{s}: {e}");
    }

    #[test]
    fn defaults() {
        let c = cfg("etcd://127.0.0.1").unwrap();
        assert_eq!(c.endpoints, vec!["http://127.0.0.1:2379".to_string()]);
        assert!(!c.tls);
        assert_eq!(c.namespace, "");
        assert_eq!(c.ttl, DEFAULT_TTL);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(
            (c.user, c.password, c.ca, c.client_cert),
            (None, None, None, None)
        );
    }

    #[test]
    fn host_port_namespace_ttl_timeout() {
        let c = cfg("etcd://h1:23790/app/locks/?ttl=3s&timeout=750ms").unwrap();
        assert_eq!(c.endpoints, vec!["http://h1:23790".to_string()]);
        assert_eq!(c.namespace, "app/locks");
        assert_eq!(c.ttl, Duration::from_secs(3));
        assert_eq!(c.ttl_secs(), 3);
        assert_eq!(c.timeout, Duration::from_millis(750));
        assert_eq!(
            cfg("etcd://h?ttl=2m").unwrap().ttl,
            Duration::from_secs(120)
        );
    }

    #[test]
    fn extra_endpoints() {
        let c = cfg("etcd://a:1/ns?endpoints=b:2,%20c.example:3").unwrap();
        assert_eq!(
            c.endpoints,
            vec!["http://a:1", "http://b:2", "http://c.example:3"]
        );
    }

    #[test]
    fn credentials_are_decoded_and_redacted() {
        let c = cfg("etcd://alice:hun%40ter2@h:1/ns").unwrap();
        assert_eq!(c.user.as_deref(), Some("alice"));
        assert_eq!(c.password.as_ref().unwrap().expose(), "hun@ter2");
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("hun@ter2") && !dbg.contains("hun%40ter2"),
            "{dbg}"
        );
        assert!(!c.display.contains("hun"), "{}", c.display);
        assert!(c.display.contains("alice"), "{}", c.display);
    }

    #[test]
    fn tls_with_ca_and_client_cert() {
        let c = cfg("etcds://h/ns?ca=/etc/ca.pem").unwrap();
        assert!(c.tls);
        assert_eq!(c.endpoints, vec!["https://h:2379".to_string()]);
        assert_eq!(c.ca, Some(PathBuf::from("/etc/ca.pem")));
        let c = cfg("etcds://h/ns?ca=/ca.pem&cert=/c.pem&key=/k.pem&endpoints=g:5").unwrap();
        assert_eq!(
            c.client_cert,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        assert_eq!(c.endpoints[1], "https://g:5");
    }

    #[test]
    fn rejections() {
        rejected("zk://h", "expected an etcd");
        rejected("etcd:///ns", "no etcd host");
        rejected("etcd://h?ttl=1s", "out of range");
        rejected("etcd://h?ttl=25h", "out of range");
        rejected("etcd://h?ttl=2500ms", "whole seconds");
        rejected("etcd://h?ttl=soon", "ttl");
        rejected("etcd://h?timeout=10ms", "out of range");
        rejected("etcd://h?ttl=2s&ttl=3s", "twice");
        rejected("etcd://h?tll=3s", "unknown URL option \"tll\"");
        rejected("etcd://h?endpoints=b", "not host:port");
        rejected("etcd://h?endpoints=b:x", "not host:port");
        rejected("etcd://h?endpoints=b:0", "not host:port");
        rejected("etcd://h?endpoints=a:1,,b:2", "not host:port");
        rejected("etcd://h?ca=/ca.pem", "need TLS");
        rejected("etcds://h", "needs ca=");
        rejected("etcds://h?ca=", "empty");
        rejected("etcds://h?ca=/ca&cert=/c", "go together");
        rejected("etcd://alice@h", "needs a password");
        rejected("etcd://:hunter2@h", "needs a user name");
        rejected("etcd://a:hunter2%zz@h", "%-escape");
        rejected("etcd://h/a/%20b", "namespace");
        rejected("etcd://h/.hidden", "namespace");
    }
}
