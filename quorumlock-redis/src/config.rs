//! `redis://` and `rediss://` URLs: host, credentials, database, the
//! namespace, the session TTL, the request timeout and the WAIT mode; the
//! password from `REDISCLI_AUTH` (redis-cli's variable) when the URL has
//! none. The one place this crate reads the environment.

use std::path::PathBuf;
use std::time::Duration;

use quorumlock_core::backend::connect::DEFAULT_CONNECT_TIMEOUT;
use quorumlock_core::backend::Namespace;
use quorumlock_core::url::{self, Env, Options, Secret, Url};
use quorumlock_core::{Error, ErrorKind, Result};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

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
/// The bounds of [`RedisConfig::timeout`].
const MIN_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// The largest [`RedisConfig::db`] and [`RedisConfig::wait_replicas`].
const MAX_DB: u32 = 1 << 20;
const MAX_WAIT_REPLICAS: u32 = 1000;

const KNOWN: &[&str] = &[
    "ttl",
    "timeout",
    "db",
    "wait_replicas",
    "ca",
    "cert",
    "key",
    "connect_timeout",
    "lazy",
];

/// Configuration of a Redis client, parsed from
/// `redis[s]://[[user]:password@]host[:port][/namespace][?options]`.
///
/// Unlike the `redis` crate's own URLs, the path is quorumlock's
/// namespace; the database number is `db=`. `Debug` never shows the
/// password. Built in code, start from [`RedisConfig::default`]
/// (`127.0.0.1:6379`, no environment read) and the `with_<field>`
/// setters.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
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
    /// The server's host name or address.
    pub host: String,
    /// The server's port.
    pub port: u16,
    /// ACL user name (the URL user; none: `default`).
    pub user: Option<String>,
    /// Password (the URL password, else `REDISCLI_AUTH`).
    pub password: Option<Secret>,
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
    /// How long `connect()` waits for the server to answer its PING
    /// (`connect_timeout=`, default 10 s, 100 ms ..= 10 min).
    pub connect_timeout: Duration,
    /// `connect()` sends nothing (`lazy=true`).
    pub lazy: bool,
    /// The URL with secrets redacted, for `Display` and logs (empty: the
    /// host and port are shown).
    pub display: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            tls: false,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            host: "127.0.0.1".to_string(),
            port: DEFAULT_PORT,
            user: None,
            password: None,
            namespace: Namespace::default(),
            ttl: DEFAULT_TTL,
            timeout: DEFAULT_TIMEOUT.min(DEFAULT_TTL / 3),
            db: 0,
            wait_replicas: 0,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
            display: String::new(),
        }
    }
}

quorumlock_core::config_setters!(RedisConfig {
    with_tls => tls: bool,
    with_ca_file => ca_file: Option<PathBuf>,
    with_client_cert_file => client_cert_file: Option<PathBuf>,
    with_client_key_file => client_key_file: Option<PathBuf>,
    with_host => host: String,
    with_port => port: u16,
    with_user => user: Option<String>,
    with_password => password: Option<Secret>,
    with_namespace => namespace: Namespace,
    with_ttl => ttl: Duration,
    with_timeout => timeout: Duration,
    with_db => db: u32,
    with_wait_replicas => wait_replicas: u32,
    with_connect_timeout => connect_timeout: Duration,
    with_lazy => lazy: bool,
    with_display => display: String,
});

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.describe())
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("db", &self.db)
            .field("wait_replicas", &self.wait_replicas)
            .field("connect_timeout", &self.connect_timeout)
            .field("lazy", &self.lazy)
            .finish()
    }
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg)
}

impl RedisConfig {
    /// Parses a `redis://` or `rediss://` URL given as text (see
    /// [`RedisConfig::from_url`]).
    pub fn parse(s: &str) -> Result<RedisConfig> {
        Self::from_url(&url::parse(s)?)
    }

    /// Parses and validates a URL; nothing is contacted here. Every bad
    /// input is an [`ErrorKind::InvalidUrl`] error that never contains the
    /// password.
    pub fn from_url(u: &Url) -> Result<RedisConfig> {
        Self::from_url_with_env(u, &url::process_env)
    }

    /// [`RedisConfig::from_url`] with `env` as the environment: a URL
    /// without a password takes `REDISCLI_AUTH` (precedence: the URL, then
    /// the environment, then no password).
    pub fn from_url_with_env(u: &Url, env: Env<'_>) -> Result<RedisConfig> {
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
            MIN_TIMEOUT,
            MAX_TIMEOUT,
        )?;
        let db = opts.number("db", 0, 0, MAX_DB)?;
        let wait_replicas = opts.number("wait_replicas", 0, 0, MAX_WAIT_REPLICAS)?;
        let (ca_file, client_cert_file, client_key_file) =
            opts.tls_files((!tls).then_some("needs rediss:// (plain redis:// does not use TLS)"))?;
        let connect = opts.connect_options(DEFAULT_CONNECT_TIMEOUT)?;
        opts.finish(KNOWN)?;
        let c = RedisConfig {
            tls,
            ca_file,
            client_cert_file,
            client_key_file,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            user: match u.username() {
                "" => None,
                user => Some(url::percent_decode(user, "user name")?),
            },
            password: match u.password() {
                Some(pw) => Some(Secret::new(url::percent_decode(pw, "password")?)),
                None => env("REDISCLI_AUTH").map(Secret::new),
            },
            namespace,
            ttl,
            timeout,
            db,
            wait_replicas,
            connect_timeout: connect.connect_timeout,
            lazy: connect.lazy,
            display: url::redact(u),
        };
        c.validate().map_err(|e| invalid(e.message().to_string()))?;
        Ok(c)
    }

    /// The rules of a `redis(s)://` URL, for a config built in code too:
    /// `ttl` within 500 ms..=24 h, `timeout` within 100 ms..=10 min and
    /// shorter than `ttl`, `connect_timeout` within 100 ms..=10 min, a
    /// host, a `user` only with a `password` (Redis ignores a user name
    /// sent without one) and never empty, `db` up to 2^20,
    /// `wait_replicas` up to 1000, and TLS files only with `tls`, none an
    /// empty path, `client_cert_file` and `client_key_file` together.
    /// Breaking one is [`ErrorKind::InvalidArgument`], naming the field
    /// (never the password); [`RedisBackend::from_config`](crate::RedisBackend::from_config)
    /// and `from_client` call this before they send anything.
    pub fn validate(&self) -> Result<()> {
        url::check_duration("ttl", self.ttl, MIN_TTL, MAX_TTL)?;
        url::check_duration("timeout", self.timeout, MIN_TIMEOUT, MAX_TIMEOUT)?;
        if self.timeout >= self.ttl {
            return Err(url::invalid_config(format!(
                "timeout={:?} must be shorter than ttl={:?}: a renewal that takes \
                 longer than the TTL cannot keep the session",
                self.timeout, self.ttl
            )));
        }
        url::check_connect_timeout(self.connect_timeout)?;
        if self.host.is_empty() {
            return Err(url::invalid_config("host is empty: name the Redis server"));
        }
        match (&self.user, &self.password) {
            (Some(user), _) if user.is_empty() => {
                return Err(url::invalid_config(
                    "user is empty (None means Redis's default user)",
                ))
            }
            (Some(_), None) => {
                return Err(url::invalid_config(
                    "user needs a password (Redis ignores a user name sent without one)",
                ))
            }
            _ => {}
        }
        if self.db > MAX_DB {
            return Err(url::invalid_config(format!(
                "db={} is out of range 0..={MAX_DB}",
                self.db
            )));
        }
        if self.wait_replicas > MAX_WAIT_REPLICAS {
            return Err(url::invalid_config(format!(
                "wait_replicas={} is out of range 0..={MAX_WAIT_REPLICAS}",
                self.wait_replicas
            )));
        }
        url::check_tls_files(
            [
                ("ca_file", self.ca_file.as_deref()),
                ("client_cert_file", self.client_cert_file.as_deref()),
                ("client_key_file", self.client_key_file.as_deref()),
            ],
            (!self.tls).then_some("needs tls (rediss://; plain redis:// does not use TLS)"),
        )
    }

    /// What logs and errors show: the redacted URL, or host and port.
    pub fn describe(&self) -> String {
        if self.display.is_empty() {
            let scheme = if self.tls { "rediss" } else { "redis" };
            format!("{scheme}://{}:{}/{}", self.host, self.port, self.namespace)
        } else {
            self.display.clone()
        }
    }

    /// What the `redis` crate connects with (holds the password: never
    /// log it).
    pub(crate) fn connection_info(&self) -> Result<ConnectionInfo> {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: self.host.clone(),
                port: self.port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(self.host.clone(), self.port)
        };
        let mut redis = RedisConnectionInfo::default().set_db(i64::from(self.db));
        if let Some(user) = &self.user {
            redis = redis.set_username(user);
        }
        if let Some(pw) = &self.password {
            redis = redis.set_password(pw.expose());
        }
        let info = addr.into_connection_info().map_err(|e| {
            Error::new(ErrorKind::InvalidUrl, "the Redis address is invalid").with_source(e)
        })?;
        Ok(info.set_redis_settings(redis))
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
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 6379));
        assert_eq!((c.user.as_ref(), c.password.as_ref()), (None, None));
        let c = parse("rediss://:s%40cret@h:7000").unwrap();
        assert!(c.tls);
        assert_eq!((c.host.as_str(), c.port, c.db), ("h", 7000, 0));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("s@cret"));
        let info = c.connection_info().unwrap();
        assert_eq!(info.redis_settings().password(), Some("s@cret"));
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
    fn password_from_rediscli_auth_unless_in_the_url() {
        let env = |k: &str| (k == "REDISCLI_AUTH").then(|| "fromenv".to_string());
        let from = |s: &str| RedisConfig::from_url_with_env(&url::parse(s).unwrap(), &env);
        let c = from("redis://h/ns").unwrap();
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("fromenv"));
        let c = from("redis://:inurl@h/ns").unwrap();
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("inurl"));
        assert!(!format!("{:?}", from("redis://h").unwrap()).contains("fromenv"));
    }

    #[test]
    fn setters_build_what_the_url_does() {
        let by_url = RedisConfig::from_url_with_env(
            &url::parse("redis://bob:pw@h:7/app?ttl=9s&timeout=2s&db=3&lazy=true").unwrap(),
            &|_| None,
        )
        .unwrap();
        let by_code = RedisConfig::default()
            .with_host("h".into())
            .with_port(7)
            .with_user(Some("bob".into()))
            .with_password(Some(Secret::new("pw")))
            .with_namespace(Namespace::new("app").unwrap())
            .with_ttl(Duration::from_secs(9))
            .with_timeout(Duration::from_secs(2))
            .with_db(3)
            .with_lazy(true)
            .with_display(by_url.display.clone());
        assert_eq!(by_url, by_code);
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

    /// A typed config is held to the URL's rules: `from_config` refuses
    /// what `redis://` refuses, lazy or not, before it sends anything
    /// (issue 45).
    #[tokio::test]
    async fn typed_config_is_validated() {
        let ok = RedisConfig::default()
            .with_lazy(true)
            .with_password(Some(Secret::new("hunter2")));
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        let pem = |p: &str| Some(PathBuf::from(p));
        let bad = [
            ("ttl", ok.clone().with_ttl(Duration::ZERO)),
            ("ttl", ok.clone().with_ttl(ms(499))),
            ("ttl", ok.clone().with_ttl(s(25 * 3600))),
            ("timeout", ok.clone().with_timeout(Duration::ZERO)),
            ("timeout", ok.clone().with_timeout(ms(99))),
            ("timeout", ok.clone().with_timeout(ok.ttl)),
            (
                "connect_timeout",
                ok.clone().with_connect_timeout(Duration::ZERO),
            ),
            ("connect_timeout", ok.clone().with_connect_timeout(s(601))),
            ("host", ok.clone().with_host(String::new())),
            ("user", ok.clone().with_user(Some(String::new()))),
            (
                "password",
                ok.clone().with_password(None).with_user(Some("bob".into())),
            ),
            ("db", ok.clone().with_db((1 << 20) + 1)),
            ("wait_replicas", ok.clone().with_wait_replicas(1001)),
            ("ca_file", ok.clone().with_ca_file(pem("/ca.pem"))),
            ("ca_file", ok.clone().with_tls(true).with_ca_file(pem(""))),
            (
                "client_key_file",
                ok.clone().with_tls(true).with_client_cert_file(pem("/c")),
            ),
        ];
        for (field, c) in bad {
            let e = match crate::RedisBackend::from_config(c.clone()).await {
                Ok(_) => panic!("{field}: from_config accepted {c:?}"),
                Err(e) => e,
            };
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{field}: {e}");
            assert!(e.message().contains(field), "{field}: {e}");
            assert!(!e.message().contains("hunter2"), "{field}: {e}");
        }
        crate::RedisBackend::from_config(ok).await.unwrap();
        // The URL takes the same rule: a user name without a password
        // (none in the URL nor in REDISCLI_AUTH) would go unused.
        let e = RedisConfig::from_url_with_env(&url::parse("redis://bob@h").unwrap(), &|_| None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{e}");
        assert!(e.message().contains("password"), "{e}");
    }
}
