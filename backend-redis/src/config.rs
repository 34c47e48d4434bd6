//! `redis://` and `rediss://` URLs: host, credentials, database, the
//! namespace, the session TTL, the request timeout and the WAIT mode.

use std::path::PathBuf;
use std::time::Duration;

use lockcore::backend::Namespace;
use lockcore::url::{self, Options, Url};
use lockcore::{Error, ErrorKind, Result};

/// The port Redis serves on when the URL names none.
pub const DEFAULT_PORT: u16 = 6379;
/// Session TTL when the URL has no `ttl=`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Shortest session TTL accepted: a renewal every third of it must fit
/// in a round trip with room to spare.
pub const MIN_TTL: Duration = Duration::from_millis(500);
/// Longest session TTL accepted.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Per-request deadline when the URL has no `timeout=`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const KNOWN: &[&str] = &["ttl", "timeout", "db", "wait_replicas", "ca", "cert", "key"];

/// Configuration of a Redis client, parsed from
/// `redis[s]://[[user]:password@]host[:port][/namespace][?options]`.
///
/// Unlike the `redis` crate's own URLs, the path is quorumlock's
/// namespace; the database number is `db=`. `Debug` never shows the
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// The URL handed to the `redis` crate (with the password), private.
    connect_url: String,
    /// TLS (`rediss://`, server certificates checked against the system's
    /// roots, or against `ca_file` alone when it is set).
    pub tls: bool,
    /// PEM file of the CA(s) that signed the server's certificate (`ca=`).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (`cert=`, with `key=`), for servers with
    /// `tls-auth-clients yes`.
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key, PEM (`key=`).
    pub client_key_file: Option<PathBuf>,
    /// Key prefix of every lock (the URL path, without slashes at the ends).
    pub namespace: Namespace,
    /// Session TTL (`ttl=`, default 10 s, 500 ms ..= 24 h).
    pub ttl: Duration,
    /// Deadline of each request (`timeout=`, default 5 s or a third of
    /// the TTL if that is shorter, 100 ms ..= 10 min, below the TTL).
    pub timeout: Duration,
    /// Database number (`db=`, default 0).
    pub db: u32,
    /// WAIT mode (`wait_replicas=N`, default 0: off): a grant counts only
    /// after `WAIT N` saw N replicas acknowledge it within `timeout`
    /// (see the README for what this does and does not guarantee).
    pub wait_replicas: u32,
    /// The URL with secrets redacted, for `Display` and logs.
    pub display: String,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.display)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("db", &self.db)
            .field("wait_replicas", &self.wait_replicas)
            .finish()
    }
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg)
}

impl RedisConfig {
    /// Parses and validates a URL; nothing is contacted here. Every bad
    /// input is an [`ErrorKind::InvalidUrl`] error that never contains the
    /// password.
    pub fn from_url(u: &Url) -> Result<RedisConfig> {
        let tls = match u.scheme() {
            "redis" => false,
            "rediss" => true,
            other => {
                return Err(invalid(format!(
                    "expected a redis:// or rediss:// URL, got {other}://"
                )))
            }
        };
        let host = u
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| invalid("the URL names no Redis host".to_string()))?;
        let port = u.port().unwrap_or(DEFAULT_PORT);
        let namespace = Namespace::from_url(u)?;
        let mut opts = Options::new(u)?;
        let ttl = opts.duration("ttl", DEFAULT_TTL, MIN_TTL, MAX_TTL)?;
        // Unless given, no longer than a third of the TTL, so that a
        // renewal that gets no answer is tried again before the TTL runs.
        let timeout = opts.duration(
            "timeout",
            DEFAULT_TIMEOUT.min(ttl / 3),
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        let db = number(&mut opts, "db", 0, 1 << 20)?;
        let wait_replicas = number(&mut opts, "wait_replicas", 0, 1000)?;
        let mut file = |key: &str| match opts.take(key) {
            None => Ok(None),
            Some(_) if !tls => Err(invalid(format!(
                "URL option {key}= needs rediss:// (plain redis:// does not use TLS)"
            ))),
            Some(p) if p.is_empty() => Err(invalid(format!("URL option {key}= is empty"))),
            Some(p) => Ok(Some(PathBuf::from(p))),
        };
        let ca_file = file("ca")?;
        let client_cert_file = file("cert")?;
        let client_key_file = file("key")?;
        if client_cert_file.is_some() != client_key_file.is_some() {
            return Err(invalid(
                "URL options cert= and key= go together".to_string(),
            ));
        }
        opts.finish(KNOWN)?;
        if timeout >= ttl {
            return Err(invalid(format!(
                "timeout={timeout:?} must be shorter than ttl={ttl:?}: a renewal that takes \
                 longer than the TTL cannot keep the session"
            )));
        }

        // The `redis` crate decodes percent-escapes in user and password.
        let auth = match (u.username(), u.password()) {
            ("", None) => String::new(),
            (user, Some(pw)) => format!("{user}:{pw}@"),
            (user, None) => format!("{user}@"),
        };
        let scheme = if tls { "rediss" } else { "redis" };
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        Ok(RedisConfig {
            connect_url: format!("{scheme}://{auth}{host}:{port}/{db}"),
            tls,
            ca_file,
            client_cert_file,
            client_key_file,
            namespace,
            ttl,
            timeout,
            db,
            wait_replicas,
            display: url::redact(u),
        })
    }

    /// Sets the CA file (PEM) the server's certificate is checked against.
    pub fn with_ca_file(mut self, v: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(v.into());
        self
    }

    /// Sets the client certificate file (PEM); give the key file too.
    pub fn with_client_cert_file(mut self, v: impl Into<PathBuf>) -> Self {
        self.client_cert_file = Some(v.into());
        self
    }

    /// Sets the client certificate's private key file (PEM).
    pub fn with_client_key_file(mut self, v: impl Into<PathBuf>) -> Self {
        self.client_key_file = Some(v.into());
        self
    }

    /// The URL for the `redis` crate (holds the password: never log it).
    pub(crate) fn connect_url(&self) -> &str {
        &self.connect_url
    }
}

fn number(opts: &mut Options, key: &str, default: u32, max: u32) -> Result<u32> {
    let Some(v) = opts.take(key) else {
        return Ok(default);
    };
    match v.parse::<u32>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(invalid(format!(
            "URL option {key}={v:?} is not a whole number in 0..={max}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<RedisConfig> {
        RedisConfig::from_url(&url::parse(s).unwrap())
    }

    #[test]
    fn parses_host_namespace_and_options() {
        let c =
            parse("redis://127.0.0.1/app/locks?ttl=3s&timeout=1s&db=2&wait_replicas=1").unwrap();
        assert_eq!(c.namespace.as_str(), "app/locks");
        assert_eq!(c.ttl, Duration::from_secs(3));
        assert_eq!(c.timeout, Duration::from_secs(1));
        assert_eq!((c.db, c.wait_replicas, c.tls), (2, 1, false));
        assert_eq!(c.connect_url(), "redis://127.0.0.1:6379/2");
        let c = parse("rediss://:s%40cret@h:7000").unwrap();
        assert!(c.tls);
        assert_eq!(c.connect_url(), "rediss://:s%40cret@h:7000/0");
        assert!(!format!("{c:?} {}", c.display).contains("cret"), "{c:?}");
        assert_eq!(c.ttl, DEFAULT_TTL);
        let c = parse("rediss://h?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(c.ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(c.client_cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(c.client_key_file, Some(PathBuf::from("/k.pem")));
        let c = parse("redis://h?ttl=3s").unwrap();
        assert_eq!(c.timeout, Duration::from_secs(1), "a third of a short TTL");
    }

    #[test]
    fn rejects_bad_urls() {
        for u in [
            "etcd://h:1",
            "redis://h?ttl=100ms",
            "redis://h?ttl=2s&timeout=5s",
            "redis://h?db=x",
            "redis://h?wait_replicas=-1",
            "redis://h?color=red",
            "redis://h/a//b",
            "redis:///ns",
            "redis://h?ca=/ca.pem",
            "rediss://h?ca=",
            "rediss://h?cert=/c.pem",
            "rediss://h?key=/k.pem",
        ] {
            let e = parse(u).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{u}: {e}");
        }
        let e = parse("redis://:hunter2@h?db=x").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
