//! `zk://` URLs: servers, namespace, session and connect timeouts, digest
//! auth, TLS.

use std::path::PathBuf;
use std::time::Duration;

use quorumlock_core::backend::Namespace;
use quorumlock_core::url::{self, Secret, Url};
use quorumlock_core::{Error, ErrorKind, Result};

/// The ZooKeeper client port used when a server has none.
pub const DEFAULT_PORT: u16 = 2181;

/// Options a `zk://` URL may carry.
const KNOWN: &[&str] = &[
    "ttl",
    "session_timeout",
    "connect_timeout",
    "lazy",
    "ca",
    "cert",
    "key",
];

/// The default of [`ZkConfig::session_timeout`].
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// The bounds of [`ZkConfig::session_timeout`] (`ttl=`, `session_timeout=`).
const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(600);
/// The default of [`ZkConfig::connect_timeout`]; shorter than the other
/// stores' because it also bounds every reopening of a lost session.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Configuration of a `zk://` client.
///
/// `zk://[user:password@]host[:port][,host[:port]...][/namespace][?options]`
///
/// | option | default | range | meaning |
/// |---|---|---|---|
/// | `ttl` or `session_timeout` | `10s` | `100ms..=10m` | requested ZooKeeper session timeout; the server clamps it to 2..20 of its ticks and the negotiated value is used; under 5 ticks `connect()` refuses it (`InvalidUrl`: the loss deadline needs 5). `ttl` is the name every backend takes (so a URL moves between stores unchanged), `session_timeout` ZooKeeper's own; giving both is an error |
/// | `connect_timeout` | `5s` | `100ms..=10m` | how long opening a session may take: `connect()` then fails with `Unavailable` (refused) or `Timeout` (no answer) |
/// | `lazy` | `false` | | `connect()` opens no session; the first acquire finds out whether the servers answer |
/// | `ca` | none (plain TCP) | PEM file | TLS to every server (its `secureClientPort`), trusting only the CA(s) in this file |
/// | `cert` | none | PEM file, with `key`, needs `ca` | client certificate (for `ssl.clientAuth=need`) |
/// | `key` | none | PEM file, with `cert` | the client certificate's private key (PKCS#8, PKCS#1 or SEC1) |
///
/// `user:password@` adds `digest` auth (`addauth digest user:password`);
/// the password is a [`Secret`] and never shown. Built in code, start
/// from [`ZkConfig::default`] (`127.0.0.1:2181`) and the `with_<field>`
/// setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkConfig {
    /// The servers, `(host, port)`, in the order given.
    pub servers: Vec<(String, u16)>,
    /// The namespace (the URL path without its slashes): lock `n` lives at
    /// `/<namespace>/n`, or `/n` when the namespace is empty.
    pub namespace: Namespace,
    /// Requested session timeout.
    pub session_timeout: Duration,
    /// Deadline for opening a session.
    pub connect_timeout: Duration,
    /// `connect()` opens no session (`lazy=true`).
    pub lazy: bool,
    /// Digest credentials `(user, password)`.
    pub auth: Option<(String, Secret)>,
    /// CA file (PEM); set, the connection uses TLS and trusts only it.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), with `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key_file: Option<PathBuf>,
    /// The URL with secrets redacted, for `describe()` and logs.
    pub display: String,
    /// Send the children listing right behind the create (one round trip
    /// for an uncontended acquire instead of two). On by default; off only
    /// to measure the difference.
    #[doc(hidden)]
    pub pipeline: bool,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            servers: vec![("127.0.0.1".to_string(), DEFAULT_PORT)],
            namespace: Namespace::default(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
            auth: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            display: String::new(),
            pipeline: true,
        }
    }
}

quorumlock_core::config_setters!(ZkConfig {
    with_servers => servers: Vec<(String, u16)>,
    with_namespace => namespace: Namespace,
    with_session_timeout => session_timeout: Duration,
    with_connect_timeout => connect_timeout: Duration,
    with_lazy => lazy: bool,
    with_auth => auth: Option<(String, Secret)>,
    with_ca_file => ca_file: Option<PathBuf>,
    with_client_cert_file => client_cert_file: Option<PathBuf>,
    with_client_key_file => client_key_file: Option<PathBuf>,
    with_display => display: String,
    with_pipeline => pipeline: bool,
});

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg.into())
}

impl ZkConfig {
    /// Parses a `zk://` URL given as text. Unlike [`ZkConfig::from_url`]
    /// this accepts a port on every server (`zk://a:2181,b:2182/ns`),
    /// which the `url` crate cannot parse.
    pub fn parse(s: &str) -> Result<ZkConfig> {
        let rest = s
            .strip_prefix("zk://")
            .ok_or_else(|| invalid("expected a zk:// URL"))?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let servers = parse_servers(hosts, None)?;
        let synthetic = match userinfo {
            Some(ui) => format!("zk://{ui}@zk-servers{tail}"),
            None => format!("zk://zk-servers{tail}"),
        };
        let u = url::parse(&synthetic)?;
        let mut c = Self::from_parts(&u, servers)?;
        // Show the real server list, with the password redacted.
        let redacted = url::redact(&u);
        c.display = redacted.replacen("zk-servers", hosts, 1);
        Ok(c)
    }

    /// Parses a `zk://` [`Url`]. Several servers sharing one port can be
    /// given as `zk://a,b,c:2181/ns`; for a port per server use
    /// [`ZkConfig::parse`].
    pub fn from_url(u: &Url) -> Result<ZkConfig> {
        if u.scheme() != "zk" {
            return Err(invalid(format!(
                "expected a zk:// URL, got {}://",
                u.scheme()
            )));
        }
        let host = u.host_str().unwrap_or("");
        let servers = parse_servers(host, u.port())?;
        let mut c = Self::from_parts(u, servers)?;
        c.display = url::redact(u);
        Ok(c)
    }

    fn from_parts(u: &Url, servers: Vec<(String, u16)>) -> Result<ZkConfig> {
        if u.scheme() != "zk" {
            return Err(invalid("expected a zk:// URL"));
        }
        if u.fragment().is_some() {
            return Err(invalid("a zk:// URL takes no #fragment"));
        }
        let auth = match (u.username(), u.password()) {
            ("", None) => None,
            ("", Some(_)) => return Err(invalid("a password needs a user name (user:password@)")),
            (_, None) => {
                return Err(invalid(
                    "digest auth needs user:password@, the password is missing",
                ))
            }
            (user, Some(pw)) => {
                let user = url::percent_decode(user, "user name")?;
                let pw = url::percent_decode(pw, "password")?;
                if user.contains(':') {
                    return Err(invalid("the digest user name must not contain ':'"));
                }
                Some((user, Secret::new(pw)))
            }
        };
        let namespace = Namespace::from_url(u)?;
        if namespace.as_str().split('/').next() == Some("zookeeper") {
            return Err(invalid(
                "the namespace must not be under /zookeeper (the server's own tree)",
            ));
        }
        let mut opts = url::Options::new(u)?;
        if opts.has("ttl") && opts.has("session_timeout") {
            return Err(invalid(
                "URL options ttl and session_timeout are the same setting: give one",
            ));
        }
        let timeout_key = if opts.has("ttl") {
            "ttl"
        } else {
            "session_timeout"
        };
        let session_timeout = opts.duration(
            timeout_key,
            DEFAULT_SESSION_TIMEOUT,
            MIN_SESSION_TIMEOUT,
            MAX_SESSION_TIMEOUT,
        )?;
        let connect = opts.connect_options(DEFAULT_CONNECT_TIMEOUT)?;
        let (ca_file, client_cert_file, client_key_file) = opts.tls_files(None)?;
        if client_cert_file.is_some() && ca_file.is_none() {
            return Err(invalid(
                "URL options cert= and key= need ca= (TLS; the client library has no system roots)",
            ));
        }
        opts.finish(KNOWN)?;
        Ok(ZkConfig {
            servers,
            namespace,
            session_timeout,
            connect_timeout: connect.connect_timeout,
            lazy: connect.lazy,
            auth,
            ca_file,
            client_cert_file,
            client_key_file,
            display: String::new(),
            pipeline: true,
        })
    }

    /// The rules of a `zk://` URL for a config built in code:
    /// `session_timeout` within 100 ms..=10 min, `connect_timeout` within
    /// 100 ms..=10 min, at least one server, each with a host and a port
    /// other than 0, a digest user name that is not empty and has no `:`,
    /// a namespace not under `/zookeeper`, and TLS files that are not
    /// empty paths, with `client_cert_file` and `client_key_file` together
    /// and only beside `ca_file`. Breaking one is
    /// [`ErrorKind::InvalidArgument`], naming the field (never the
    /// password); [`ZkBackend::from_config`](crate::ZkBackend::from_config)
    /// calls this before it contacts anything.
    pub fn validate(&self) -> Result<()> {
        url::check_duration(
            "session_timeout",
            self.session_timeout,
            MIN_SESSION_TIMEOUT,
            MAX_SESSION_TIMEOUT,
        )?;
        url::check_connect_timeout(self.connect_timeout)?;
        if self.servers.is_empty() {
            return Err(url::invalid_config(
                "servers is empty: give at least one (host, port)",
            ));
        }
        for (host, port) in &self.servers {
            if host.is_empty() || host.contains(['@', ' ', '/', ',']) {
                return Err(url::invalid_config(format!(
                    "servers: {host:?} is not a host name or address"
                )));
            }
            if *port == 0 {
                return Err(url::invalid_config(format!(
                    "servers: port 0 of {host:?} is not a port"
                )));
            }
        }
        if let Some((user, _)) = &self.auth {
            if user.is_empty() || user.contains(':') {
                return Err(url::invalid_config(
                    "auth: the digest user name must be non-empty and have no ':'",
                ));
            }
        }
        if self.namespace.as_str().split('/').next() == Some("zookeeper") {
            return Err(url::invalid_config(
                "namespace must not be under /zookeeper (the server's own tree)",
            ));
        }
        url::check_tls_files(
            [
                ("ca_file", self.ca_file.as_deref()),
                ("client_cert_file", self.client_cert_file.as_deref()),
                ("client_key_file", self.client_key_file.as_deref()),
            ],
            None,
        )?;
        if self.client_cert_file.is_some() && self.ca_file.is_none() {
            return Err(url::invalid_config(
                "client_cert_file and client_key_file need ca_file \
                 (TLS; the client library has no system roots)",
            ));
        }
        Ok(())
    }

    /// What logs and errors show: the redacted URL, or the servers.
    pub fn describe(&self) -> String {
        if self.display.is_empty() {
            format!("zk://{}", self.connect_string())
        } else {
            self.display.clone()
        }
    }

    /// The connect string for the client library: `host:port,host:port`.
    pub fn connect_string(&self) -> String {
        self.servers
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `host[:port],host[:port]`; `shared_port` applies to hosts without one.
fn parse_servers(list: &str, shared_port: Option<u16>) -> Result<Vec<(String, u16)>> {
    if list.is_empty() {
        return Err(invalid(
            "a zk:// URL needs at least one server (zk://host:port/namespace)",
        ));
    }
    let mut out = Vec::new();
    for item in list.split(',') {
        if item.is_empty() {
            return Err(invalid(format!("empty server in {list:?}")));
        }
        let (host, port) = if let Some(rest) = item.strip_prefix('[') {
            let close = rest
                .find(']')
                .ok_or_else(|| invalid(format!("unclosed [ in server {item:?}")))?;
            let host = &rest[..close];
            let after = &rest[close + 1..];
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| invalid(format!("bad server {item:?}")))?,
                ),
            };
            (host, port)
        } else {
            match item.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (item, None),
            }
        };
        if host.is_empty() || host.contains(['@', ' ', '/']) {
            return Err(invalid(format!("bad server host in {item:?}")));
        }
        let port = match port {
            None => shared_port.unwrap_or(DEFAULT_PORT),
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(invalid(format!("bad port in server {item:?}"))),
            },
        };
        out.push((host.to_string(), port));
    }
    Ok(out)
}

/// The TTL a confirmed keepalive is counted with: 7/8 of the session
/// timeout, so that the local deadline (`sent + ttl - ttl/5`) falls
/// `timeout/5 + timeout/10` before the leader could expire the session.
/// The extra `timeout/10` covers how late the leader may hear of a request
/// answered through a follower (the follower reports it with its next ping
/// answer, up to `tickTime/2` later; `timeout/10 >= tickTime/2` whenever
/// `timeout >= 5 x tickTime`, which `connect()` checks). See the README's
/// "Safety on an ensemble".
pub(crate) fn deadline_ttl(timeout: Duration) -> Duration {
    timeout * 7 / 8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(s: &str) -> Result<ZkConfig> {
        ZkConfig::from_url(&url::parse(s)?)
    }

    #[test]
    fn defaults() {
        let c = cfg("zk://127.0.0.1:21810").unwrap();
        assert_eq!(c.servers, vec![("127.0.0.1".to_string(), 21810)]);
        assert_eq!(c.namespace, "");
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.auth, None);
        assert!(c.pipeline);
        assert_eq!(
            cfg("zk://zk1").unwrap().servers,
            vec![("zk1".to_string(), 2181)]
        );
    }

    #[test]
    fn namespace_and_options() {
        let c = cfg("zk://h:1/app/locks/?session_timeout=2s&connect_timeout=500ms").unwrap();
        assert_eq!(c.namespace, "app/locks");
        assert_eq!(c.session_timeout, Duration::from_secs(2));
        assert_eq!(c.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.connect_string(), "h:1");
    }

    #[test]
    fn several_servers() {
        let c = cfg("zk://a,b,c:2182/ns").unwrap();
        assert_eq!(c.connect_string(), "a:2182,b:2182,c:2182");
        // `ttl`, the name every backend takes, is the same setting.
        let t = ZkConfig::parse("zk://a:1/ns?ttl=4s").unwrap();
        assert_eq!(t.session_timeout, Duration::from_secs(4));
        let c = ZkConfig::parse("zk://a:1,b,[::1]:3/ns?session_timeout=3s").unwrap();
        assert_eq!(c.connect_string(), "a:1,b:2181,[::1]:3");
        assert_eq!(c.namespace, "ns");
        assert_eq!(c.session_timeout, Duration::from_secs(3));
        assert!(c.display.contains("a:1,b,[::1]:3/ns"), "{}", c.display);
        let c = cfg("zk://[::1]:5/x").unwrap();
        assert_eq!(c.connect_string(), "[::1]:5");
        let c = ZkConfig::parse("zk://a:2281,b:2281/ns?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(c.ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(c.client_cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(c.client_key_file, Some(PathBuf::from("/k.pem")));
    }

    #[test]
    fn digest_auth_is_secret() {
        let c = cfg("zk://alice:hunter%322@h:1/ns").unwrap();
        let (user, pw) = c.auth.clone().unwrap();
        assert_eq!(user, "alice");
        assert_eq!(pw.expose(), "hunter22");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("hunter"), "{dbg}");
        assert!(!c.display.contains("hunter"), "{}", c.display);
        let c = ZkConfig::parse("zk://bob:s3cret@a:1,b:2/ns").unwrap();
        assert_eq!(c.auth.as_ref().unwrap().1.expose(), "s3cret");
        assert!(
            !c.display.contains("s3cret") && c.display.contains("bob"),
            "{}",
            c.display
        );
    }

    #[test]
    fn rejections() {
        for u in [
            "etcd://h:1/ns",
            "zk://h:1/ns?session_timeout=abc",
            "zk://h:1/ns?session_timeout=10ms",
            "zk://h:1/ns?session_timeout=2h",
            "zk://h:1/ns?connect_timeout=0s",
            "zk://h:1/ns?connect_timeout=1x",
            "zk://h:1/ns?sesion_timeout=2s",
            "zk://h:1/ns?session_timeout=2s&session_timeout=3s",
            "zk://h:1/ns?ttl=2s&session_timeout=3s",
            "zk://h:1/ns?ttl=10ms",
            "zk://alice@h:1/ns",
            "zk://:pw@h:1/ns",
            "zk://h:1/zookeeper",
            "zk://h:1/zookeeper/x",
            "zk://h:1/a/%20b",
            "zk://h:1/ns#frag",
            "zk:///ns",
            "zk://a,,b:1/ns",
            "zk://h:1/ns?ca=",
            "zk://h:1/ns?ca=/ca.pem&cert=/c.pem",
            "zk://h:1/ns?cert=/c.pem&key=/k.pem",
        ] {
            let e = url::parse(u)
                .and_then(|u| ZkConfig::from_url(&u))
                .expect_err(u);
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{u}: {e}");
        }
        for s in [
            "zk://a:0/ns",
            "zk://a:x/ns",
            "zk://a:1,/ns",
            "zk://[::1/ns",
            "http://a:1",
            "zk://",
        ] {
            let e = ZkConfig::parse(s).expect_err(s);
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{s}: {e}");
        }
    }

    /// A typed config is held to the URL's rules: `from_config` refuses
    /// what `zk://` refuses, lazy or not, before it contacts anything
    /// (issue 45).
    #[tokio::test]
    async fn typed_config_is_validated() {
        let ok = ZkConfig::default().with_lazy(true);
        let ms = Duration::from_millis;
        let pem = |p: &str| Some(PathBuf::from(p));
        let digest = |u: &str| Some((u.to_string(), Secret::new("hunter2")));
        let bad = [
            (
                "session_timeout",
                ok.clone().with_session_timeout(Duration::ZERO),
            ),
            ("session_timeout", ok.clone().with_session_timeout(ms(99))),
            (
                "session_timeout",
                ok.clone().with_session_timeout(Duration::from_secs(601)),
            ),
            (
                "connect_timeout",
                ok.clone().with_connect_timeout(Duration::ZERO),
            ),
            (
                "connect_timeout",
                ok.clone().with_connect_timeout(Duration::from_secs(601)),
            ),
            ("servers", ok.clone().with_servers(Vec::new())),
            (
                "servers",
                ok.clone().with_servers(vec![(String::new(), 2181)]),
            ),
            ("servers", ok.clone().with_servers(vec![("h".into(), 0)])),
            ("auth", ok.clone().with_auth(digest(""))),
            ("auth", ok.clone().with_auth(digest("a:b"))),
            (
                "namespace",
                ok.clone()
                    .with_namespace(Namespace::new("zookeeper/x").unwrap()),
            ),
            ("ca_file", ok.clone().with_ca_file(pem(""))),
            (
                "client_key_file",
                ok.clone()
                    .with_ca_file(pem("/ca"))
                    .with_client_cert_file(pem("/c")),
            ),
            (
                "ca_file",
                ok.clone()
                    .with_client_cert_file(pem("/c"))
                    .with_client_key_file(pem("/k")),
            ),
        ];
        for (field, c) in bad {
            let e = match crate::ZkBackend::from_config(c.clone()).await {
                Ok(_) => panic!("{field}: from_config accepted {c:?}"),
                Err(e) => e,
            };
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{field}: {e}");
            assert!(e.message().contains(field), "{field}: {e}");
            assert!(!e.message().contains("hunter2"), "{field}: {e}");
        }
        crate::ZkBackend::from_config(ok).await.unwrap();
    }
}
