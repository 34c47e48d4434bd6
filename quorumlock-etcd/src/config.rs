//! `etcd://` and `etcds://` URLs: endpoints, credentials, TLS files, the
//! namespace and the lease TTL; etcdctl's environment variables
//! (`ETCDCTL_ENDPOINTS`, `ETCDCTL_USER`, `ETCDCTL_PASSWORD`,
//! `ETCDCTL_CACERT`, `ETCDCTL_CERT`, `ETCDCTL_KEY`) for what the URL leaves
//! out. The one place this crate reads the environment.

use std::path::PathBuf;
use std::time::Duration;

use quorumlock_core::backend::connect::DEFAULT_CONNECT_TIMEOUT;
use quorumlock_core::backend::Namespace;
use quorumlock_core::url::{self, Env, Options, Secret, Url};
use quorumlock_core::{Error, ErrorKind, Result};

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
/// The bounds of [`EtcdConfig::timeout`].
const MIN_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

const KNOWN: &[&str] = &[
    "ttl",
    "timeout",
    "endpoints",
    "ca",
    "cert",
    "key",
    "connect_timeout",
    "lazy",
];

/// Configuration of an etcd client, parsed from
/// `etcd[s]://[user:password@]host[:port][/namespace][?options]`.
///
/// `Debug` never shows the password (it is a [`Secret`]). Built in code,
/// start from [`EtcdConfig::default`] (plain etcd on `127.0.0.1:2379`, no
/// environment read) and the `with_<field>` setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// How long `connect()` waits for etcd to answer its first request
    /// (`connect_timeout=`, default 10 s, 100 ms ..= 10 min).
    pub connect_timeout: Duration,
    /// `connect()` sends nothing; the first acquire finds out whether etcd
    /// answers (`lazy=true`, default false).
    pub lazy: bool,
    /// The URL with secrets redacted, for `Display` and logs (empty: the
    /// endpoints are shown).
    pub display: String,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec![format!("http://127.0.0.1:{DEFAULT_PORT}")],
            tls: false,
            ca: None,
            client_cert: None,
            user: None,
            password: None,
            namespace: Namespace::default(),
            ttl: DEFAULT_TTL,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
            display: String::new(),
        }
    }
}

quorumlock_core::config_setters!(EtcdConfig {
    with_endpoints => endpoints: Vec<String>,
    with_tls => tls: bool,
    with_ca => ca: Option<PathBuf>,
    with_client_cert => client_cert: Option<(PathBuf, PathBuf)>,
    with_user => user: Option<String>,
    with_password => password: Option<Secret>,
    with_namespace => namespace: Namespace,
    with_ttl => ttl: Duration,
    with_timeout => timeout: Duration,
    with_connect_timeout => connect_timeout: Duration,
    with_lazy => lazy: bool,
    with_display => display: String,
});

impl EtcdConfig {
    /// Parses an `etcd://` or `etcds://` URL given as text (see
    /// [`EtcdConfig::from_url`]).
    pub fn parse(s: &str) -> Result<EtcdConfig> {
        Self::from_url(&url::parse(s)?)
    }

    /// Parses and validates a URL; nothing is contacted here. What the URL
    /// leaves out comes from etcdctl's environment variables (see
    /// [`EtcdConfig::from_url_with_env`]).
    ///
    /// Every bad input is an [`ErrorKind::InvalidUrl`] error whose message
    /// never contains the password.
    pub fn from_url(u: &Url) -> Result<EtcdConfig> {
        Self::from_url_with_env(u, &url::process_env)
    }

    /// The defaults with etcdctl's environment variables applied: the
    /// config of `etcd:///` (or `etcds:///` when `ETCDCTL_ENDPOINTS` names
    /// `https://` endpoints).
    pub fn from_env() -> Result<EtcdConfig> {
        Self::from_env_with(&url::process_env)
    }

    /// [`EtcdConfig::from_env`] with `env` as the environment.
    pub fn from_env_with(env: Env<'_>) -> Result<EtcdConfig> {
        let https = env("ETCDCTL_ENDPOINTS").is_some_and(|e| e.trim().starts_with("https://"));
        let u = url::parse(if https { "etcds:///" } else { "etcd:///" })?;
        Self::from_url_with_env(&u, env)
    }

    /// [`EtcdConfig::from_url`] with `env` as the environment. Precedence:
    /// the URL, then the environment, then the defaults.
    ///
    /// | variable | used when the URL has no | as |
    /// |---|---|---|
    /// | `ETCDCTL_ENDPOINTS` | host (`etcd:///ns`) | comma-separated `[http[s]://]host:port` |
    /// | `ETCDCTL_USER` | user | `user:password` (or `user` with `ETCDCTL_PASSWORD`) |
    /// | `ETCDCTL_CACERT` | `ca=` (`etcds://` only) | CA file |
    /// | `ETCDCTL_CERT`, `ETCDCTL_KEY` | `cert=`, `key=` (`etcds://` only) | client certificate and key |
    pub fn from_url_with_env(u: &Url, env: Env<'_>) -> Result<EtcdConfig> {
        let tls = match u.scheme() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(invalid(format!(
                    "expected an etcd:// or etcds:// URL, got {other}://"
                )))
            }
        };
        let scheme = if tls { "https" } else { "http" };
        let mut endpoints = match u.host_str().filter(|h| !h.is_empty()) {
            Some(host) => vec![format!(
                "{scheme}://{host}:{}",
                u.port().unwrap_or(DEFAULT_PORT)
            )],
            None if u.port().is_some() => {
                return Err(invalid("the URL names a port but no etcd host".to_string()))
            }
            None => match env("ETCDCTL_ENDPOINTS") {
                Some(list) => env_endpoints(&list, scheme)?,
                None => vec![format!("{scheme}://127.0.0.1:{DEFAULT_PORT}")],
            },
        };

        let (user, password) = match (u.username(), u.password()) {
            ("", None) => match env("ETCDCTL_USER") {
                None => (None, None),
                Some(up) => {
                    let (user, pw) = match up.split_once(':') {
                        Some((user, pw)) => (user.to_string(), Some(pw.to_string())),
                        None => (up.clone(), env("ETCDCTL_PASSWORD")),
                    };
                    let pw = pw.ok_or_else(|| {
                        invalid(
                            "ETCDCTL_USER names a user without a password \
                             (ETCDCTL_USER=user:password or ETCDCTL_PASSWORD)"
                                .to_string(),
                        )
                    })?;
                    if user.is_empty() {
                        return Err(invalid("ETCDCTL_USER has an empty user name".to_string()));
                    }
                    (Some(user), Some(Secret::new(pw)))
                }
            },
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
        let timeout = opts.duration("timeout", DEFAULT_TIMEOUT, MIN_TIMEOUT, MAX_TIMEOUT)?;
        let connect = opts.connect_options(DEFAULT_CONNECT_TIMEOUT)?;
        if let Some(list) = opts.take("endpoints") {
            for ep in list.split(',').map(str::trim) {
                endpoints.push(format!("{scheme}://{}", host_port(ep)?));
            }
        }
        let mut ca = opts.take("ca").map(PathBuf::from);
        let mut cert = opts.take("cert").map(PathBuf::from);
        let mut key = opts.take("key").map(PathBuf::from);
        opts.finish(KNOWN)?;
        if tls {
            // etcdctl's TLS files, for an etcds:// URL that names none.
            ca = ca.or_else(|| env("ETCDCTL_CACERT").map(PathBuf::from));
            if cert.is_none() && key.is_none() {
                cert = env("ETCDCTL_CERT").map(PathBuf::from);
                key = env("ETCDCTL_KEY").map(PathBuf::from);
            }
        }

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
            connect_timeout: connect.connect_timeout,
            lazy: connect.lazy,
            display: url::redact(u),
        })
    }

    /// The rules of an `etcd(s)://` URL for a config built in code: `ttl`
    /// in whole seconds within 2 s..=24 h, `timeout` and `connect_timeout`
    /// within 100 ms..=10 min, at least one endpoint, each
    /// `http://host:port` (`https://` with `tls`), `user` and `password`
    /// together and the user not empty, `ca` and `client_cert` only with
    /// `tls`, `ca` required with it, no empty path. Breaking one is
    /// [`ErrorKind::InvalidArgument`], naming the field (never the
    /// password); [`EtcdBackend::from_config`](crate::EtcdBackend::from_config)
    /// and `from_client` call this before they read a file or send
    /// anything.
    pub fn validate(&self) -> Result<()> {
        url::check_duration("ttl", self.ttl, MIN_TTL, MAX_TTL)?;
        if self.ttl.subsec_nanos() != 0 {
            return Err(url::invalid_config(format!(
                "ttl={:?}: etcd leases have whole seconds",
                self.ttl
            )));
        }
        url::check_duration("timeout", self.timeout, MIN_TIMEOUT, MAX_TIMEOUT)?;
        url::check_connect_timeout(self.connect_timeout)?;
        if self.endpoints.is_empty() {
            return Err(url::invalid_config(
                "endpoints is empty: give at least one http://host:port",
            ));
        }
        let scheme = if self.tls { "https://" } else { "http://" };
        for ep in &self.endpoints {
            // The URL's host is taken as the url crate parsed it, so only
            // the shape is checked here: a host, a port other than 0.
            let ok = ep
                .strip_prefix(scheme)
                .and_then(|hp| hp.rsplit_once(':'))
                .is_some_and(|(host, port)| {
                    !host.is_empty()
                        && !host.contains(['/', '@', ' ', ','])
                        && port.parse::<u16>().is_ok_and(|p| p > 0)
                });
            if !ok {
                return Err(url::invalid_config(format!(
                    "endpoints: {ep:?} is not {scheme}host:port{}",
                    if self.tls {
                        " (tls)"
                    } else {
                        " (https:// needs tls)"
                    }
                )));
            }
        }
        match (&self.user, &self.password) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(url::invalid_config("user needs a password"));
            }
            (None, Some(_)) => {
                return Err(url::invalid_config("a password needs a user"));
            }
            (Some(user), Some(_)) if user.is_empty() => {
                return Err(url::invalid_config("user is empty"));
            }
            (Some(_), Some(_)) => {}
        }
        let (cert, key) = match &self.client_cert {
            Some((c, k)) => (Some(c.as_path()), Some(k.as_path())),
            None => (None, None),
        };
        url::check_tls_files(
            [
                ("ca", self.ca.as_deref()),
                ("client_cert (its certificate)", cert),
                ("client_cert (its key)", key),
            ],
            (!self.tls).then_some("needs tls (etcds://)"),
        )?;
        if self.tls && self.ca.is_none() {
            return Err(url::invalid_config(
                "tls needs ca (PEM file of the CA that signed the server certificates)",
            ));
        }
        Ok(())
    }

    /// What logs and errors show: the redacted URL, or the endpoints.
    pub fn describe(&self) -> String {
        if self.display.is_empty() {
            format!("etcd {}", self.endpoints.join(","))
        } else {
            self.display.clone()
        }
    }

    /// The lease TTL in whole seconds, as etcd takes it.
    pub fn ttl_secs(&self) -> i64 {
        self.ttl.as_secs() as i64
    }
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg)
}

/// `ETCDCTL_ENDPOINTS`: `[http[s]://]host:port,...`; a scheme given must
/// match the URL's (`https` for `etcds://`).
fn env_endpoints(list: &str, scheme: &str) -> Result<Vec<String>> {
    list.split(',')
        .map(str::trim)
        .map(|ep| {
            let hp = match ep.split_once("://") {
                None => ep,
                Some((s, rest)) if s == scheme => rest.trim_end_matches('/'),
                Some((s, _)) => {
                    return Err(invalid(format!(
                        "ETCDCTL_ENDPOINTS names a {s}:// endpoint but the URL wants {scheme}:// \
                         (etcds:// for https)"
                    )))
                }
            };
            Ok(format!("{scheme}://{}", host_port(hp)?))
        })
        .collect()
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

    fn with_env(s: &str, vars: &[(&str, &str)]) -> Result<EtcdConfig> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        EtcdConfig::from_url_with_env(&url::parse(s).unwrap(), &env)
    }

    #[test]
    fn etcdctl_environment_fills_what_the_url_leaves_out() {
        let vars = [
            ("ETCDCTL_ENDPOINTS", "http://e1:1,e2:2"),
            ("ETCDCTL_USER", "bob:pw"),
            ("ETCDCTL_CACERT", "/env/ca.pem"),
            ("ETCDCTL_CERT", "/env/c.pem"),
            ("ETCDCTL_KEY", "/env/k.pem"),
        ];
        let c = with_env("etcd:///ns", &vars).unwrap();
        assert_eq!(c.endpoints, vec!["http://e1:1", "http://e2:2"]);
        assert_eq!(c.user.as_deref(), Some("bob"));
        assert_eq!(c.password.as_ref().unwrap().expose(), "pw");
        assert_eq!((c.ca, c.client_cert), (None, None), "TLS files need etcds");
        // The URL wins.
        let c = with_env("etcd://alice:x@h:9/ns", &vars).unwrap();
        assert_eq!(c.endpoints, vec!["http://h:9"]);
        assert_eq!(c.user.as_deref(), Some("alice"));
        let c = with_env("etcds://h/ns?ca=/url/ca.pem", &vars).unwrap();
        assert_eq!(c.ca, Some(PathBuf::from("/url/ca.pem")));
        assert_eq!(
            c.client_cert,
            Some((PathBuf::from("/env/c.pem"), PathBuf::from("/env/k.pem")))
        );
        // etcds:// with no ca= is fine when ETCDCTL_CACERT names one.
        let c = with_env("etcds://h", &vars).unwrap();
        assert_eq!(c.ca, Some(PathBuf::from("/env/ca.pem")));
        // Defaults without any variable.
        let c = with_env("etcd:///", &[]).unwrap();
        assert_eq!(c.endpoints, vec!["http://127.0.0.1:2379"]);
        // ETCDCTL_PASSWORD with a bare ETCDCTL_USER; a user alone is an error.
        let c = with_env(
            "etcd://h",
            &[("ETCDCTL_USER", "u"), ("ETCDCTL_PASSWORD", "p")],
        )
        .unwrap();
        assert_eq!(c.password.as_ref().unwrap().expose(), "p");
        let e = with_env("etcd://h", &[("ETCDCTL_USER", "u")]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl);
        let e = with_env("etcd:///", &[("ETCDCTL_ENDPOINTS", "https://e:1")]).unwrap_err();
        assert!(e.to_string().contains("etcds"), "{e}");
        let c = EtcdConfig::from_env_with(&|k| {
            (k == "ETCDCTL_ENDPOINTS").then(|| "https://e:1".into())
        })
        .unwrap_err();
        assert!(c.to_string().contains("needs ca="), "{c}");
    }

    #[test]
    fn setters_build_what_the_url_does() {
        let by_url = with_env(
            "etcd://u:p@h:1/app?ttl=3s&timeout=1s&connect_timeout=2s&lazy=true&endpoints=g:2",
            &[],
        )
        .unwrap();
        let by_code = EtcdConfig::default()
            .with_endpoints(vec!["http://h:1".into(), "http://g:2".into()])
            .with_user(Some("u".into()))
            .with_password(Some(Secret::new("p")))
            .with_namespace(Namespace::new("app").unwrap())
            .with_ttl(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(1))
            .with_connect_timeout(Duration::from_secs(2))
            .with_lazy(true)
            .with_display(by_url.display.clone());
        assert_eq!(by_url, by_code);
        assert_eq!(
            EtcdConfig::default().describe(),
            "etcd http://127.0.0.1:2379"
        );
    }

    #[test]
    fn rejections() {
        rejected("zk://h", "expected an etcd");
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

    /// A typed config is held to the URL's rules: `from_config` refuses
    /// what `etcd://` refuses, lazy or not, before it sends anything
    /// (issue 45).
    #[tokio::test]
    async fn typed_config_is_validated() {
        let ok = EtcdConfig::default().with_lazy(true);
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        let pem = |p: &str| Some(PathBuf::from(p));
        let pw = || Some(Secret::new("hunter2"));
        let tls = ok
            .clone()
            .with_tls(true)
            .with_endpoints(vec!["https://h:1".into()]);
        let bad = [
            ("ttl", ok.clone().with_ttl(Duration::ZERO)),
            ("ttl", ok.clone().with_ttl(s(1))),
            ("ttl", ok.clone().with_ttl(s(25 * 3600))),
            ("ttl", ok.clone().with_ttl(ms(2500))),
            ("timeout", ok.clone().with_timeout(Duration::ZERO)),
            ("timeout", ok.clone().with_timeout(s(601))),
            (
                "connect_timeout",
                ok.clone().with_connect_timeout(Duration::ZERO),
            ),
            ("connect_timeout", ok.clone().with_connect_timeout(s(601))),
            ("endpoints", ok.clone().with_endpoints(Vec::new())),
            ("endpoints", ok.clone().with_endpoints(vec!["h:1".into()])),
            (
                "endpoints",
                ok.clone().with_endpoints(vec!["http://h".into()]),
            ),
            (
                "endpoints",
                ok.clone().with_endpoints(vec!["https://h:1".into()]),
            ),
            (
                "endpoints",
                tls.clone()
                    .with_ca(pem("/ca"))
                    .with_endpoints(vec!["http://h:1".into()]),
            ),
            ("password", ok.clone().with_user(Some("bob".into()))),
            ("user", ok.clone().with_password(pw())),
            (
                "user",
                ok.clone()
                    .with_user(Some(String::new()))
                    .with_password(pw()),
            ),
            ("ca", ok.clone().with_ca(pem("/ca.pem"))),
            ("ca", tls.clone()),
            ("ca", tls.clone().with_ca(pem(""))),
            (
                "client_cert",
                ok.clone()
                    .with_client_cert(Some(("/c".into(), "/k".into()))),
            ),
            (
                "client_cert",
                tls.clone()
                    .with_ca(pem("/ca"))
                    .with_client_cert(Some(("/c".into(), "".into()))),
            ),
        ];
        for (field, c) in bad {
            let e = match crate::EtcdBackend::from_config(c.clone()).await {
                Ok(_) => panic!("{field}: from_config accepted {c:?}"),
                Err(e) => e,
            };
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{field}: {e}");
            assert!(e.message().contains(field), "{field}: {e}");
            assert!(!e.message().contains("hunter2"), "{field}: {e}");
        }
        crate::EtcdBackend::from_config(ok).await.unwrap();
    }
}
