//! `consul://` and `consuls://` URLs: agent address, namespace, ACL token,
//! datacenter, session TTL, lock-delay, session checks, TLS CA and client
//! certificate.

use std::path::PathBuf;
use std::time::Duration;

use lockcore::backend::Namespace;
use lockcore::url::{self, Secret, Url};
use lockcore::{Error, ErrorKind, LockName, Result};

/// The agent's HTTP port used when a `consul://` URL has none.
pub const DEFAULT_PORT: u16 = 8500;
/// The agent's HTTPS port used when a `consuls://` URL has none.
pub const DEFAULT_TLS_PORT: u16 = 8501;

/// Default session TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// Default lock-delay of our sessions (see the crate README for why).
pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(1);

/// Consul's limits on a session TTL.
const MIN_TTL: Duration = Duration::from_secs(10);
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Consul's upper limit on a session lock-delay.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// Options a `consul(s)://` URL may carry.
const KNOWN: &[&str] = &[
    "token",
    "dc",
    "ttl",
    "lock_delay",
    "checks",
    "ca",
    "cert",
    "key",
];

/// Configuration of a Consul client.
///
/// `consul://host[:port][/namespace][?options]` (plain HTTP) or
/// `consuls://host[:port][/namespace][?options]` (HTTPS).
///
/// | option | default | range | meaning |
/// |---|---|---|---|
/// | `token` | none | | ACL token, sent as `X-Consul-Token`; a [`Secret`], never shown |
/// | `dc` | the agent's | letters, digits, `-`, `_`, `.` | datacenter of every request |
/// | `ttl` | `15s` | `10s..=24h` (Consul's own limits) | session TTL; renewed every TTL/2 |
/// | `lock_delay` | `1s` | `0s..=60s` (Consul's own limits) | session lock-delay: after our session is invalidated, nobody may take its locks for this long |
/// | `checks` | none | comma-separated check ids | node health checks tying the session to its agent's node, e.g. `checks=serfHealth` (Consul's default) |
/// | `ca` | the system's roots | `consuls://` only | PEM file of the CA(s) that signed the agent's certificate; when given, only these are trusted |
/// | `cert` | none | `consuls://` only, with `key` | PEM file of the client certificate (for agents with `verify_incoming_https`) |
/// | `key` | none | `consuls://` only, with `cert` | PEM file of the client certificate's private key (PKCS#8, PKCS#1 or SEC1) |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulConfig {
    /// `true` for `consuls://` (HTTPS).
    pub tls: bool,
    /// The agent's host name or address.
    pub host: String,
    /// The agent's HTTP(S) port.
    pub port: u16,
    /// The namespace (the URL path without its slashes): lock `n` lives
    /// under the key prefix `<namespace>/n/`, or `n/` when it is empty.
    pub namespace: Namespace,
    /// ACL token.
    pub token: Option<Secret>,
    /// Datacenter (`?dc=` on every request).
    pub datacenter: Option<String>,
    /// Session TTL.
    pub ttl: Duration,
    /// Session lock-delay.
    pub lock_delay: Duration,
    /// Node checks the session is tied to (empty: none, the TTL alone).
    pub checks: Vec<String>,
    /// CA certificate file for `consuls://`; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for `consuls://`, with `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key_file: Option<PathBuf>,
    /// The URL with secrets redacted, for `describe()` and logs.
    pub display: String,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg.into())
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

impl ConsulConfig {
    /// Parses a `consul://` or `consuls://` URL given as text.
    pub fn parse(s: &str) -> Result<ConsulConfig> {
        Self::from_url(&url::parse(s)?)
    }

    /// Parses a `consul://` or `consuls://` [`Url`]. Every bad input is an
    /// [`ErrorKind::InvalidUrl`] error; nothing is contacted.
    pub fn from_url(u: &Url) -> Result<ConsulConfig> {
        let tls = match u.scheme() {
            "consul" => false,
            "consuls" => true,
            s => {
                return Err(invalid(format!(
                    "expected a consul:// or consuls:// URL, got {s}://"
                )))
            }
        };
        if !u.username().is_empty() || u.password().is_some() {
            return Err(invalid(
                "consul URLs take no user or password; pass an ACL token as ?token=",
            ));
        }
        if u.fragment().is_some() {
            return Err(invalid("consul URLs take no #fragment"));
        }
        let host = match u.host_str() {
            Some(h) if !h.is_empty() => h.to_string(),
            _ => return Err(invalid("the consul URL needs the agent's host")),
        };
        let port = u
            .port()
            .unwrap_or(if tls { DEFAULT_TLS_PORT } else { DEFAULT_PORT });
        if port == 0 {
            return Err(invalid("port 0 is not a valid agent port"));
        }
        let namespace = Namespace::from_url(u)?;
        let mut opts = url::Options::new(u)?;
        let token = match opts.take("token") {
            None => None,
            Some(t) if t.is_empty() => return Err(invalid("URL option token= is empty")),
            Some(t) if t.chars().any(|c| c.is_control() || c == ' ') => {
                return Err(invalid(
                    "URL option token contains spaces or control characters",
                ))
            }
            Some(t) => Some(Secret::new(t)),
        };
        let datacenter = match opts.take("dc") {
            None => None,
            Some(dc) if !dc.is_empty() && dc.chars().all(is_id_char) => Some(dc),
            Some(dc) => {
                return Err(invalid(format!(
                    "URL option dc={dc:?} is not a datacenter name (letters, digits, '-', '_', '.')"
                )))
            }
        };
        let ttl = opts.duration("ttl", DEFAULT_TTL, MIN_TTL, MAX_TTL)?;
        let lock_delay = opts.duration(
            "lock_delay",
            DEFAULT_LOCK_DELAY,
            Duration::ZERO,
            MAX_LOCK_DELAY,
        )?;
        let checks = match opts.take("checks") {
            None => Vec::new(),
            Some(v) if v.is_empty() => Vec::new(),
            Some(v) => {
                let list: Vec<String> = v.split(',').map(|c| c.trim().to_string()).collect();
                if let Some(bad) = list
                    .iter()
                    .find(|c| c.is_empty() || !c.chars().all(|ch| is_id_char(ch) || ch == ':'))
                {
                    return Err(invalid(format!(
                        "URL option checks={v:?}: {bad:?} is not a check id"
                    )));
                }
                list
            }
        };
        let ca_file = match opts.take("ca") {
            None => None,
            Some(_) if !tls => {
                return Err(invalid(
                    "URL option ca= needs consuls:// (plain consul:// does not use TLS)",
                ))
            }
            Some(p) if p.is_empty() => return Err(invalid("URL option ca= is empty")),
            Some(p) => Some(PathBuf::from(p)),
        };
        let mut file = |key: &str| match opts.take(key) {
            None => Ok(None),
            Some(_) if !tls => Err(invalid(format!(
                "URL option {key}= needs consuls:// (plain consul:// does not use TLS)"
            ))),
            Some(p) if p.is_empty() => Err(invalid(format!("URL option {key}= is empty"))),
            Some(p) => Ok(Some(PathBuf::from(p))),
        };
        let client_cert_file = file("cert")?;
        let client_key_file = file("key")?;
        if client_cert_file.is_some() != client_key_file.is_some() {
            return Err(invalid("URL options cert= and key= go together"));
        }
        opts.finish(KNOWN)?;
        Ok(ConsulConfig {
            tls,
            host,
            port,
            namespace,
            token,
            datacenter,
            ttl,
            lock_delay,
            checks,
            ca_file,
            client_cert_file,
            client_key_file,
            display: url::redact(u),
        })
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

    /// The agent's base URL, `http(s)://host:port/`.
    pub fn agent_url(&self) -> Result<Url> {
        let scheme = if self.tls { "https" } else { "http" };
        url::parse(&format!("{scheme}://{}:{}/", self.host, self.port))
    }

    /// The key prefix of lock `name`: `<namespace>/<name>`.
    pub fn lock_prefix(&self, name: &LockName) -> String {
        self.namespace.lock_key(name)
    }

    /// The prefix every key of this namespace starts with (`""` for none).
    pub fn namespace_prefix(&self) -> String {
        self.namespace.prefix()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ConsulConfig> {
        ConsulConfig::parse(s)
    }

    fn rejects(s: &str, why: &str) {
        let e = parse(s).expect_err(s);
        assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{s}: {e}");
        assert!(e.to_string().contains(why), "{s}: {e} (wanted {why:?})");
    }

    #[test]
    fn defaults() {
        let c = parse("consul://127.0.0.1").unwrap();
        assert!(!c.tls);
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", DEFAULT_PORT));
        assert_eq!(c.namespace, "");
        assert_eq!(c.token, None);
        assert_eq!(c.datacenter, None);
        assert_eq!(c.ttl, Duration::from_secs(15));
        assert_eq!(c.lock_delay, Duration::from_secs(1));
        assert!(c.checks.is_empty());
        assert_eq!(c.ca_file, None);
        assert_eq!(c.agent_url().unwrap().as_str(), "http://127.0.0.1:8500/");
        assert_eq!(c.lock_prefix(&LockName::new("a/b").unwrap()), "a/b");
        assert_eq!(c.namespace_prefix(), "");
    }

    #[test]
    fn every_option() {
        let c = parse(
            "consul://agent:18500/app/locks?token=s3cr3t&dc=dc-2&ttl=30s&lock_delay=0s&checks=serfHealth,service:web",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("agent", 18500));
        assert_eq!(c.namespace, "app/locks");
        assert_eq!(c.token.as_ref().map(Secret::expose), Some("s3cr3t"));
        assert_eq!(c.datacenter.as_deref(), Some("dc-2"));
        assert_eq!(c.ttl, Duration::from_secs(30));
        assert_eq!(c.lock_delay, Duration::ZERO);
        assert_eq!(c.checks, vec!["serfHealth", "service:web"]);
        assert_eq!(c.lock_prefix(&LockName::new("x").unwrap()), "app/locks/x");
        assert_eq!(c.namespace_prefix(), "app/locks/");
        let c = parse("consul://h?ttl=24h&lock_delay=60s&checks=").unwrap();
        assert_eq!(c.ttl, Duration::from_secs(86400));
        assert_eq!(c.lock_delay, Duration::from_secs(60));
        assert!(c.checks.is_empty());
    }

    #[test]
    fn tls_scheme_and_ca() {
        let c = parse("consuls://consul.example/ns?ca=/etc/consul/ca.pem").unwrap();
        assert!(c.tls);
        assert_eq!(c.port, DEFAULT_TLS_PORT);
        assert_eq!(c.ca_file, Some(PathBuf::from("/etc/consul/ca.pem")));
        assert_eq!(
            c.agent_url().unwrap().as_str(),
            "https://consul.example:8501/"
        );
        let c = parse("consuls://[::1]:9501").unwrap();
        assert_eq!(c.agent_url().unwrap().as_str(), "https://[::1]:9501/");
        let c = parse("consuls://h?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(c.client_cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(c.client_key_file, Some(PathBuf::from("/k.pem")));
        let c = parse("consuls://h")
            .unwrap()
            .with_client_cert_file("/c2.pem")
            .with_client_key_file("/k2.pem");
        assert_eq!(c.client_cert_file, Some(PathBuf::from("/c2.pem")));
        assert_eq!(c.client_key_file, Some(PathBuf::from("/k2.pem")));
    }

    #[test]
    fn token_is_redacted() {
        let c = parse("consul://h/ns?token=hunter2&ttl=20s").unwrap();
        let shown = format!("{c:?} {}", c.display);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(c.display.contains("ttl=20s"), "{}", c.display);
    }

    #[test]
    fn rejections() {
        rejects("etcd://h", "expected a consul");
        rejects("consul://user:pw@h", "no user or password");
        rejects("consul://user@h", "no user or password");
        rejects("consul:///ns", "host");
        rejects("consul://h:0", "port 0");
        rejects("consul://h/ns#frag", "fragment");
        rejects("consul://h/a/%20b", "namespace");
        rejects("consul://h?token=", "empty");
        rejects("consul://h?token=a%20b", "spaces");
        rejects("consul://h?dc=", "datacenter");
        rejects("consul://h?dc=a/b", "datacenter");
        rejects("consul://h?ttl=9s", "out of range");
        rejects("consul://h?ttl=25h", "out of range");
        rejects("consul://h?ttl=soon", "ttl");
        rejects("consul://h?lock_delay=61s", "out of range");
        rejects("consul://h?lock_delay=1x", "unit");
        rejects("consul://h?checks=a,,b", "check id");
        rejects("consul://h?checks=a%20b", "check id");
        rejects("consul://h?ca=/x.pem", "needs consuls://");
        rejects("consuls://h?ca=", "empty");
        rejects("consul://h?cert=/c.pem&key=/k.pem", "needs consuls://");
        rejects("consuls://h?cert=/c.pem", "go together");
        rejects("consuls://h?key=/k.pem", "go together");
        rejects("consuls://h?cert=&key=/k.pem", "empty");
        rejects("consul://h?ttl=15s&ttl=20s", "twice");
        rejects("consul://h?tll=15s", "unknown URL option");
        rejects(
            "consul://h?wait=5s",
            "known: token, dc, ttl, lock_delay, checks, ca, cert, key",
        );
    }
}
