//! `consul://` and `consuls://` URLs: agent address, namespace, ACL token,
//! datacenter, session TTL, lock-delay, session checks, TLS CA and client
//! certificate; the Consul CLI's environment variables (`CONSUL_HTTP_ADDR`,
//! `CONSUL_HTTP_TOKEN`, `CONSUL_HTTP_TOKEN_FILE`, `CONSUL_CACERT`,
//! `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY`) for what the URL leaves out.
//! The one place this crate reads the environment.

use std::path::PathBuf;
use std::time::Duration;

use quorumlock_core::backend::connect::DEFAULT_CONNECT_TIMEOUT;
use quorumlock_core::backend::Namespace;
use quorumlock_core::url::{self, Env, Secret, Url};
use quorumlock_core::{Error, ErrorKind, LockName, Result};

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
    "connect_timeout",
    "lazy",
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
/// | `connect_timeout` | `10s` | `100ms..=10m` | how long `connect()` waits for the agent to answer |
/// | `lazy` | `false` | | `connect()` sends nothing; the first acquire finds out whether the agent answers |
///
/// What the URL leaves out comes from the Consul CLI's environment
/// variables (see [`ConsulConfig::from_url_with_env`]). Built in code,
/// start from [`ConsulConfig::default`] (`127.0.0.1:8500`, no environment
/// read) and the `with_<field>` setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// How long `connect()` waits for the agent to answer.
    pub connect_timeout: Duration,
    /// `connect()` sends nothing.
    pub lazy: bool,
    /// The URL with secrets redacted, for `describe()` and logs (empty:
    /// the agent's address is shown).
    pub display: String,
}

impl Default for ConsulConfig {
    fn default() -> Self {
        ConsulConfig {
            tls: false,
            host: "127.0.0.1".to_string(),
            port: DEFAULT_PORT,
            namespace: Namespace::default(),
            token: None,
            datacenter: None,
            ttl: DEFAULT_TTL,
            lock_delay: DEFAULT_LOCK_DELAY,
            checks: Vec::new(),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
            display: String::new(),
        }
    }
}

quorumlock_core::config_setters!(ConsulConfig {
    with_tls => tls: bool,
    with_host => host: String,
    with_port => port: u16,
    with_namespace => namespace: Namespace,
    with_token => token: Option<Secret>,
    with_datacenter => datacenter: Option<String>,
    with_ttl => ttl: Duration,
    with_lock_delay => lock_delay: Duration,
    with_checks => checks: Vec<String>,
    with_ca_file => ca_file: Option<PathBuf>,
    with_client_cert_file => client_cert_file: Option<PathBuf>,
    with_client_key_file => client_key_file: Option<PathBuf>,
    with_connect_timeout => connect_timeout: Duration,
    with_lazy => lazy: bool,
    with_display => display: String,
});

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg.into())
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// `CONSUL_HTTP_ADDR`: `[http[s]://]host[:port]` as (TLS, host, port).
fn env_addr(addr: &str) -> Result<(bool, String, Option<u16>)> {
    let (https, rest) = match addr.split_once("://") {
        None => (false, addr),
        Some(("http", r)) => (false, r),
        Some(("https", r)) => (true, r),
        Some((s, _)) => {
            return Err(invalid(format!(
                "CONSUL_HTTP_ADDR: {s}:// is not supported (http:// or https://)"
            )))
        }
    };
    let u = url::parse(&format!("consul://{}", rest.trim_end_matches('/')))
        .map_err(|_| invalid(format!("CONSUL_HTTP_ADDR={addr:?} is not host[:port]")))?;
    match u.host_str() {
        Some(h) if !h.is_empty() && u.path().is_empty() && u.port() != Some(0) => {
            Ok((https, h.to_string(), u.port()))
        }
        _ => Err(invalid(format!(
            "CONSUL_HTTP_ADDR={addr:?} is not host[:port]"
        ))),
    }
}

/// `CONSUL_HTTP_TOKEN`, else the contents of `CONSUL_HTTP_TOKEN_FILE`.
fn env_token(env: Env<'_>) -> Result<Option<Secret>> {
    if let Some(t) = env("CONSUL_HTTP_TOKEN") {
        return Ok(Some(Secret::new(t.trim())));
    }
    let Some(path) = env("CONSUL_HTTP_TOKEN_FILE") else {
        return Ok(None);
    };
    let t = std::fs::read_to_string(&path).map_err(|e| {
        invalid(format!("CONSUL_HTTP_TOKEN_FILE={path}: cannot read it")).with_source(e)
    })?;
    match t.trim() {
        "" => Err(invalid(format!("CONSUL_HTTP_TOKEN_FILE={path} is empty"))),
        t => Ok(Some(Secret::new(t))),
    }
}

impl ConsulConfig {
    /// Parses a `consul://` or `consuls://` URL given as text.
    pub fn parse(s: &str) -> Result<ConsulConfig> {
        Self::from_url(&url::parse(s)?)
    }

    /// Parses a `consul://` or `consuls://` [`Url`]. Every bad input is an
    /// [`ErrorKind::InvalidUrl`] error; nothing is contacted.
    pub fn from_url(u: &Url) -> Result<ConsulConfig> {
        Self::from_url_with_env(u, &url::process_env)
    }

    /// The defaults with the Consul CLI's environment variables applied:
    /// the config of `consul:///`.
    pub fn from_env() -> Result<ConsulConfig> {
        Self::from_url_with_env(&url::parse("consul:///")?, &url::process_env)
    }

    /// [`ConsulConfig::from_url`] with `env` as the environment.
    /// Precedence: the URL, then the environment, then the defaults.
    ///
    /// | variable | used when the URL has no | as |
    /// |---|---|---|
    /// | `CONSUL_HTTP_ADDR` | host (`consul:///ns`) | `[http[s]://]host[:port]`; `https://` means TLS |
    /// | `CONSUL_HTTP_TOKEN` | `token=` | ACL token |
    /// | `CONSUL_HTTP_TOKEN_FILE` | `token=` and `CONSUL_HTTP_TOKEN` | file holding the ACL token |
    /// | `CONSUL_CACERT` | `ca=` (TLS only) | CA file |
    /// | `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY` | (TLS only) | client certificate and key |
    pub fn from_url_with_env(u: &Url, env: Env<'_>) -> Result<ConsulConfig> {
        let mut tls = match u.scheme() {
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
        let (host, port) = match u.host_str() {
            Some(h) if !h.is_empty() => (h.to_string(), u.port()),
            _ if u.port().is_some() => {
                return Err(invalid("the consul URL names a port but no agent host"))
            }
            _ => match env("CONSUL_HTTP_ADDR") {
                None => ("127.0.0.1".to_string(), None),
                Some(addr) => {
                    let (https, host, port) = env_addr(&addr)?;
                    tls |= https;
                    (host, port)
                }
            },
        };
        let port = port.unwrap_or(if tls { DEFAULT_TLS_PORT } else { DEFAULT_PORT });
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
        let token = match token {
            Some(t) => Some(t),
            None => env_token(env)?,
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
        let (ca_file, client_cert_file, client_key_file) = opts
            .tls_files((!tls).then_some("needs consuls:// (plain consul:// does not use TLS)"))?;
        let connect = opts.connect_options(DEFAULT_CONNECT_TIMEOUT)?;
        opts.finish(KNOWN)?;
        let (mut ca_file, mut client_cert_file, mut client_key_file) =
            (ca_file, client_cert_file, client_key_file);
        if tls {
            ca_file = ca_file.or_else(|| env("CONSUL_CACERT").map(PathBuf::from));
            if client_cert_file.is_none() {
                client_cert_file = env("CONSUL_CLIENT_CERT").map(PathBuf::from);
                client_key_file = env("CONSUL_CLIENT_KEY").map(PathBuf::from);
                if client_cert_file.is_some() != client_key_file.is_some() {
                    return Err(invalid(
                        "CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY go together",
                    ));
                }
            }
        }
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
            connect_timeout: connect.connect_timeout,
            lazy: connect.lazy,
            display: url::redact(u),
        })
    }

    /// The rules of a `consul(s)://` URL for a config built in code: `ttl`
    /// within 10 s..=24 h and `lock_delay` within 0..=60 s (Consul's own
    /// limits), `connect_timeout` within 100 ms..=10 min, an agent host
    /// and a port other than 0, a token that is not empty and has no
    /// spaces or control characters, datacenter and check names of
    /// letters, digits, `-`, `_`, `.` (and `:` in a check), and TLS files
    /// only with `tls`, none an empty path, `client_cert_file` and
    /// `client_key_file` together. Breaking one is
    /// [`ErrorKind::InvalidArgument`], naming the field (never the
    /// token); [`ConsulBackend::from_config`](crate::ConsulBackend::from_config)
    /// and `from_client` call this before they read a file or send
    /// anything.
    pub fn validate(&self) -> Result<()> {
        url::check_duration("ttl", self.ttl, MIN_TTL, MAX_TTL)?;
        url::check_duration(
            "lock_delay",
            self.lock_delay,
            Duration::ZERO,
            MAX_LOCK_DELAY,
        )?;
        url::check_connect_timeout(self.connect_timeout)?;
        if self.host.is_empty() {
            return Err(url::invalid_config("host is empty: name the agent"));
        }
        if self.port == 0 {
            return Err(url::invalid_config("port 0 is not a valid agent port"));
        }
        if let Some(t) = &self.token {
            let t = t.expose();
            if t.is_empty() || t.chars().any(|c| c.is_control() || c == ' ') {
                return Err(url::invalid_config(
                    "token is empty or contains spaces or control characters",
                ));
            }
        }
        if let Some(dc) = &self.datacenter {
            if dc.is_empty() || !dc.chars().all(is_id_char) {
                return Err(url::invalid_config(format!(
                    "datacenter={dc:?} is not a datacenter name (letters, digits, '-', '_', '.')"
                )));
            }
        }
        if let Some(bad) = self
            .checks
            .iter()
            .find(|c| c.is_empty() || !c.chars().all(|ch| is_id_char(ch) || ch == ':'))
        {
            return Err(url::invalid_config(format!(
                "checks: {bad:?} is not a check id"
            )));
        }
        url::check_tls_files(
            [
                ("ca_file", self.ca_file.as_deref()),
                ("client_cert_file", self.client_cert_file.as_deref()),
                ("client_key_file", self.client_key_file.as_deref()),
            ],
            (!self.tls).then_some("needs tls (consuls://; plain consul:// does not use TLS)"),
        )
    }

    /// What logs and errors show: the redacted URL, or the agent.
    pub fn describe(&self) -> String {
        if self.display.is_empty() {
            let scheme = if self.tls { "consuls" } else { "consul" };
            format!("{scheme}://{}:{}/{}", self.host, self.port, self.namespace)
        } else {
            self.display.clone()
        }
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
            .with_client_cert_file(Some("/c2.pem".into()))
            .with_client_key_file(Some("/k2.pem".into()));
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

    fn with_env(s: &str, vars: &[(&str, &str)]) -> Result<ConsulConfig> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        ConsulConfig::from_url_with_env(&url::parse(s).unwrap(), &env)
    }

    #[test]
    fn consul_cli_environment_fills_what_the_url_leaves_out() {
        let vars = [
            ("CONSUL_HTTP_ADDR", "https://agent.example:9501"),
            ("CONSUL_HTTP_TOKEN", "env-token"),
            ("CONSUL_CACERT", "/env/ca.pem"),
            ("CONSUL_CLIENT_CERT", "/env/c.pem"),
            ("CONSUL_CLIENT_KEY", "/env/k.pem"),
        ];
        let c = with_env("consul:///ns", &vars).unwrap();
        assert!(c.tls, "https:// in CONSUL_HTTP_ADDR means TLS");
        assert_eq!((c.host.as_str(), c.port), ("agent.example", 9501));
        assert_eq!(c.token.as_ref().map(Secret::expose), Some("env-token"));
        assert_eq!(c.ca_file, Some(PathBuf::from("/env/ca.pem")));
        assert_eq!(c.client_cert_file, Some(PathBuf::from("/env/c.pem")));
        assert_eq!(c.client_key_file, Some(PathBuf::from("/env/k.pem")));
        assert!(!format!("{c:?}").contains("env-token"));
        // The URL wins.
        let c = with_env("consul://h:1/ns?token=url-token", &vars).unwrap();
        assert!(!c.tls);
        assert_eq!((c.host.as_str(), c.port), ("h", 1));
        assert_eq!(c.token.as_ref().map(Secret::expose), Some("url-token"));
        assert_eq!((c.ca_file, c.client_cert_file), (None, None));
        // Defaults without any variable.
        let c = with_env("consul:///", &[]).unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.token),
            ("127.0.0.1", 8500, None)
        );
        let c = with_env("consul:///", &[("CONSUL_HTTP_ADDR", "10.0.0.1")]).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("10.0.0.1", 8500));
        // The token file, when CONSUL_HTTP_TOKEN is unset.
        let dir = std::env::temp_dir().join(format!("qlc-token-{}", std::process::id()));
        std::fs::write(&dir, "file-token\n").unwrap();
        let path = dir.display().to_string();
        let c = with_env("consul://h", &[("CONSUL_HTTP_TOKEN_FILE", &path)]).unwrap();
        assert_eq!(c.token.as_ref().map(Secret::expose), Some("file-token"));
        std::fs::remove_file(&dir).unwrap();
        let e = with_env("consul://h", &[("CONSUL_HTTP_TOKEN_FILE", &path)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl);
        let e = with_env("consul:///", &[("CONSUL_HTTP_ADDR", "unix:///s.sock")]).unwrap_err();
        assert!(e.to_string().contains("unix"), "{e}");
    }

    #[test]
    fn setters_build_what_the_url_does() {
        let by_url = with_env(
            "consul://h:1/app?token=t&dc=d1&ttl=20s&lock_delay=0s&checks=serfHealth&connect_timeout=2s&lazy=1",
            &[],
        )
        .unwrap();
        let by_code = ConsulConfig::default()
            .with_host("h".into())
            .with_port(1)
            .with_namespace(Namespace::new("app").unwrap())
            .with_token(Some(Secret::new("t")))
            .with_datacenter(Some("d1".into()))
            .with_ttl(Duration::from_secs(20))
            .with_lock_delay(Duration::ZERO)
            .with_checks(vec!["serfHealth".into()])
            .with_connect_timeout(Duration::from_secs(2))
            .with_lazy(true)
            .with_display(by_url.display.clone());
        assert_eq!(by_url, by_code);
    }

    #[test]
    fn rejections() {
        rejects("etcd://h", "expected a consul");
        rejects("consul://user:pw@h", "no user or password");
        rejects("consul://user@h", "no user or password");
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

    /// A typed config is held to the URL's rules: `from_config` refuses
    /// what `consul://` refuses, lazy or not, before it sends anything
    /// (issue 45).
    #[tokio::test]
    async fn typed_config_is_validated() {
        let ok = ConsulConfig::default().with_lazy(true);
        let s = Duration::from_secs;
        let pem = |p: &str| Some(PathBuf::from(p));
        let bad = [
            ("ttl", ok.clone().with_ttl(Duration::ZERO)),
            ("ttl", ok.clone().with_ttl(s(9))),
            ("ttl", ok.clone().with_ttl(s(25 * 3600))),
            ("lock_delay", ok.clone().with_lock_delay(s(61))),
            (
                "connect_timeout",
                ok.clone().with_connect_timeout(Duration::ZERO),
            ),
            ("connect_timeout", ok.clone().with_connect_timeout(s(601))),
            ("host", ok.clone().with_host(String::new())),
            ("port", ok.clone().with_port(0)),
            ("token", ok.clone().with_token(Some(Secret::new("")))),
            (
                "token",
                ok.clone().with_token(Some(Secret::new("hunter2 x"))),
            ),
            ("datacenter", ok.clone().with_datacenter(Some("a/b".into()))),
            (
                "checks",
                ok.clone().with_checks(vec!["a".into(), String::new()]),
            ),
            ("ca_file", ok.clone().with_ca_file(pem("/ca.pem"))),
            ("ca_file", ok.clone().with_tls(true).with_ca_file(pem(""))),
            (
                "client_key_file",
                ok.clone().with_tls(true).with_client_cert_file(pem("/c")),
            ),
        ];
        for (field, c) in bad {
            let e = match crate::ConsulBackend::from_config(c.clone()).await {
                Ok(_) => panic!("{field}: from_config accepted {c:?}"),
                Err(e) => e,
            };
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{field}: {e}");
            assert!(e.message().contains(field), "{field}: {e}");
            assert!(!e.message().contains("hunter2"), "{field}: {e}");
        }
        crate::ConsulBackend::from_config(ok).await.unwrap();
    }
}
