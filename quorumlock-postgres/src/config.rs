//! `postgres://` URLs: host, credentials, the database (the path's first
//! segment), the namespace (the rest of the path), the schema of the
//! tables, the session TTL and the request timeout; the password from
//! `PGPASSWORD` and the user from `PGUSER` (libpq's variables) when the
//! URL has none. The one place this crate reads the environment.

use std::path::PathBuf;
use std::time::Duration;

use quorumlock_core::backend::connect::DEFAULT_CONNECT_TIMEOUT;
use quorumlock_core::backend::Namespace;
use quorumlock_core::url::{self, Env, Options, Secret, Url};
use quorumlock_core::{Error, ErrorKind, Result};

/// The port when the URL names none.
pub const DEFAULT_PORT: u16 = 5432;
/// The session TTL when the URL gives no `ttl=`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Shortest `ttl=` accepted.
pub const MIN_TTL: Duration = Duration::from_millis(500);
/// Longest `ttl=` accepted.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The request timeout when the URL gives no `timeout=` (or a third of
/// the TTL, if shorter).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections a backend opens for its transactions when the URL
/// gives no `connections=` (each session has one more, for `LISTEN`).
pub const DEFAULT_CONNECTIONS: u32 = 4;
/// The largest `connections=`.
pub const MAX_CONNECTIONS: u32 = 256;
/// The schema of the lock tables when the URL gives no `schema=`.
pub const DEFAULT_SCHEMA: &str = "quorumlock";

const KNOWN: &[&str] = &[
    "ttl",
    "timeout",
    "schema",
    "connect_timeout",
    "lazy",
    "connections",
    "sslmode",
    "ca",
    "cert",
    "key",
];

/// Whether and how the connections use TLS (`sslmode=`, libpq's words).
///
/// Stricter than libpq in two places: the modes that use TLS always check
/// the server's certificate chain (against `ca=`, else the system's
/// roots; libpq's `require` checks nothing without a root file), and
/// `prefer` and `allow` connect without TLS (libpq tries TLS first,
/// unchecked): this backend never sends a session over TLS it has not
/// checked, nor falls back from TLS silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// No TLS (`disable`, `allow`, `prefer`, or no `sslmode=`).
    #[default]
    Disable,
    /// TLS; the chain is checked, not the host name (`require`, as
    /// libpq's `require` with a root file).
    Require,
    /// TLS; the chain is checked, not the host name (`verify-ca`).
    VerifyCa,
    /// TLS; the chain and the host name are checked (`verify-full`).
    VerifyFull,
}

impl SslMode {
    /// Whether connections use TLS.
    pub fn uses_tls(self) -> bool {
        self != SslMode::Disable
    }

    fn parse(v: Option<&str>) -> Result<SslMode> {
        match v {
            None | Some("disable" | "allow" | "prefer") => Ok(SslMode::Disable),
            Some("require") => Ok(SslMode::Require),
            Some("verify-ca") => Ok(SslMode::VerifyCa),
            Some("verify-full") => Ok(SslMode::VerifyFull),
            Some(other) => Err(invalid(format!(
                "sslmode={other:?} is not one of disable, allow, prefer, require, \
                 verify-ca, verify-full"
            ))),
        }
    }
}

/// Why TLS files are refused without a TLS `sslmode=`.
const NEEDS_TLS: &str = "needs sslmode=require, verify-ca or verify-full";

/// The configuration of a [`crate::PostgresBackend`]: every URL part and
/// option as a field, with a `with_<field>` setter each.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// The server's host name or address.
    pub host: String,
    /// The server's port.
    pub port: u16,
    /// The user (`PGUSER`, else `postgres`, when the URL has none).
    pub user: String,
    /// The password (`PGPASSWORD` when the URL has none).
    pub password: Option<Secret>,
    /// The database: the URL path's first segment.
    pub database: String,
    /// The namespace: the rest of the URL path.
    pub namespace: Namespace,
    /// The schema of the lock tables (`schema=`), created on first use.
    pub schema: String,
    /// The session TTL (`ttl=`); renewed every TTL/3.
    pub ttl: Duration,
    /// Deadline of each request (`timeout=`).
    pub timeout: Duration,
    /// How long `connect()` waits for the server (`connect_timeout=`).
    pub connect_timeout: Duration,
    /// `lazy=true`: `connect()` sends nothing.
    pub lazy: bool,
    /// Most connections open at once for transactions (`connections=`);
    /// a request that finds them all busy waits for one, within its
    /// timeout. Each session has one more, for `LISTEN` and renewals.
    pub connections: u32,
    /// TLS (`sslmode=`).
    pub sslmode: SslMode,
    /// PEM file of the CA to trust (`ca=`); the system's roots without it.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (`cert=`), with `key=`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's key (`key=`).
    pub client_key_file: Option<PathBuf>,
    /// The URL as shown (credentials redacted); empty: made from the fields.
    pub display: String,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            host: "127.0.0.1".to_string(),
            port: DEFAULT_PORT,
            user: "postgres".to_string(),
            password: None,
            database: "postgres".to_string(),
            namespace: Namespace::default(),
            schema: DEFAULT_SCHEMA.to_string(),
            ttl: DEFAULT_TTL,
            timeout: DEFAULT_TIMEOUT.min(DEFAULT_TTL / 3),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
            connections: DEFAULT_CONNECTIONS,
            sslmode: SslMode::Disable,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            display: String::new(),
        }
    }
}

quorumlock_core::config_setters!(PostgresConfig {
    with_host => host: String,
    with_port => port: u16,
    with_user => user: String,
    with_password => password: Option<Secret>,
    with_database => database: String,
    with_namespace => namespace: Namespace,
    with_schema => schema: String,
    with_ttl => ttl: Duration,
    with_timeout => timeout: Duration,
    with_connect_timeout => connect_timeout: Duration,
    with_lazy => lazy: bool,
    with_connections => connections: u32,
    with_sslmode => sslmode: SslMode,
    with_ca_file => ca_file: Option<PathBuf>,
    with_client_cert_file => client_cert_file: Option<PathBuf>,
    with_client_key_file => client_key_file: Option<PathBuf>,
    with_display => display: String,
});

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.describe())
            .field("user", &self.user)
            .field("password", &self.password)
            .field("database", &self.database)
            .field("namespace", &self.namespace)
            .field("schema", &self.schema)
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("lazy", &self.lazy)
            .field("connections", &self.connections)
            .field("sslmode", &self.sslmode)
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .finish()
    }
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidUrl, msg)
}

impl PostgresConfig {
    /// Parses a `postgres://` URL.
    pub fn parse(s: &str) -> Result<PostgresConfig> {
        Self::from_url(&url::parse(s)?)
    }

    /// The configuration a parsed URL names; `PGUSER` and `PGPASSWORD`
    /// from the process environment fill in what the URL lacks.
    pub fn from_url(u: &Url) -> Result<PostgresConfig> {
        Self::from_url_with_env(u, &url::process_env)
    }

    /// As [`PostgresConfig::from_url`], with `env` for the environment.
    pub fn from_url_with_env(u: &Url, env: Env<'_>) -> Result<PostgresConfig> {
        match u.scheme() {
            "postgres" | "postgresql" => {}
            other => {
                return Err(invalid(format!(
                    "expected a postgres:// or postgresql:// URL, got {other}://"
                )))
            }
        }
        let host = u
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| invalid("the URL names no PostgreSQL host".to_string()))?;
        let port = u.port().unwrap_or(DEFAULT_PORT);
        let path = u.path().trim_start_matches('/');
        let (db, rest) = path.split_once('/').unwrap_or((path, ""));
        if db.is_empty() {
            return Err(invalid(
                "the URL names no database: postgres://host[:port]/database[/namespace]"
                    .to_string(),
            ));
        }
        let database = url::percent_decode(db, "database")?;
        let namespace = Namespace::new(rest)?;
        let mut opts = Options::new(u)?;
        let ttl = opts.duration("ttl", DEFAULT_TTL, MIN_TTL, MAX_TTL)?;
        let timeout = opts.duration(
            "timeout",
            DEFAULT_TIMEOUT.min(ttl / 3),
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        let schema = opts
            .take("schema")
            .unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
        let connections = opts.number("connections", DEFAULT_CONNECTIONS, 1, MAX_CONNECTIONS)?;
        let sslmode = SslMode::parse(opts.take("sslmode").as_deref())?;
        let (ca_file, client_cert_file, client_key_file) =
            opts.tls_files((!sslmode.uses_tls()).then_some(NEEDS_TLS))?;
        let url::ConnectOptions {
            connect_timeout,
            lazy,
            ..
        } = opts.connect_options(DEFAULT_CONNECT_TIMEOUT)?;
        opts.finish(KNOWN)?;
        let c = PostgresConfig {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            user: match u.username() {
                "" => env("PGUSER").unwrap_or_else(|| "postgres".to_string()),
                user => url::percent_decode(user, "user name")?,
            },
            password: match u.password() {
                Some(pw) => Some(Secret::new(url::percent_decode(pw, "password")?)),
                None => env("PGPASSWORD").map(Secret::new),
            },
            database,
            namespace,
            schema,
            ttl,
            timeout,
            connect_timeout,
            lazy,
            connections,
            sslmode,
            ca_file,
            client_cert_file,
            client_key_file,
            display: url::redact(u),
        };
        c.validate().map_err(|e| invalid(e.message().to_string()))?;
        Ok(c)
    }

    /// Checks what the URL parser checks, for a configuration built in
    /// code (`InvalidArgument` naming the field), as every store's config
    /// does; `from_config` and `from_client` call it first.
    pub fn validate(&self) -> Result<()> {
        url::check_duration("ttl", self.ttl, MIN_TTL, MAX_TTL)?;
        url::check_connect_timeout(self.connect_timeout)?;
        if self.timeout >= self.ttl {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "timeout={:?} must be shorter than ttl={:?}: a renewal that takes \
                     longer than the TTL cannot keep the session",
                    self.timeout, self.ttl
                ),
            ));
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.connections) {
            return Err(url::invalid_config(format!(
                "connections={} is not in 1..={MAX_CONNECTIONS}",
                self.connections
            )));
        }
        url::check_tls_files(
            [
                ("ca_file", self.ca_file.as_deref()),
                ("client_cert_file", self.client_cert_file.as_deref()),
                ("client_key_file", self.client_key_file.as_deref()),
            ],
            (!self.sslmode.uses_tls()).then_some("needs sslmode (SslMode::Require or stricter)"),
        )?;
        crate::layout::check_schema(&self.schema)?;
        Ok(())
    }

    /// The URL with the password redacted.
    pub fn describe(&self) -> String {
        if self.display.is_empty() {
            format!(
                "postgres://{}@{}:{}/{}/{}",
                self.user, self.host, self.port, self.database, self.namespace
            )
        } else {
            self.display.clone()
        }
    }

    /// The `tokio_postgres` configuration of one connection.
    pub(crate) fn client_config(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.database)
            .application_name("quorumlock")
            .connect_timeout(self.timeout.max(Duration::from_secs(1)))
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .ssl_mode(if self.sslmode.uses_tls() {
                tokio_postgres::config::SslMode::Require
            } else {
                tokio_postgres::config::SslMode::Disable
            });
        if let Some(pw) = &self.password {
            c.password(pw.expose());
        }
        c
    }

    /// The TLS side of every connection: trusting `ca=` (else the system's
    /// roots), with the client certificate if given, checking the host
    /// name under [`SslMode::VerifyFull`]. `pg_uses_tls`: whether the
    /// connection settings ask for TLS (they may be the caller's own,
    /// [`crate::PostgresBackend::from_client`]); when neither does, no
    /// file is read and the connector is never used.
    pub(crate) fn tls_connector(
        &self,
        pg_uses_tls: bool,
    ) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
        use quorumlock_core::tls;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        // The name is checked unless the mode says not to (also when the
        // caller's own settings ask for TLS and `sslmode` is off).
        let check = match self.sslmode {
            SslMode::Require | SslMode::VerifyCa => tls::HostCheck::ChainOnly,
            _ => tls::HostCheck::ChainAndName,
        };
        let roots = match &self.ca_file {
            _ if !self.sslmode.uses_tls() && !pg_uses_tls => rustls::RootCertStore::empty(),
            Some(ca) => tls::pem_roots(&tls::read_pem("ca", ca)?)?,
            None => system_roots()?,
        };
        let identity = match (&self.client_cert_file, &self.client_key_file) {
            (Some(c), Some(k)) => Some((tls::read_pem("cert", c)?, tls::read_pem("key", k)?)),
            _ => None,
        };
        let config = tls::client_config(
            provider,
            roots,
            identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
            check,
        )?;
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

/// The system's trust roots, for TLS without `ca=`.
fn system_roots() -> Result<rustls::RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(Error::new(
            ErrorKind::Tls,
            "PostgreSQL TLS without ca=: no trusted root certificate found on this system \
             (give the server's CA with ca=)",
        ));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<PostgresConfig> {
        PostgresConfig::from_url_with_env(&url::parse(s).unwrap(), &|_| None)
    }

    #[test]
    fn parses_database_namespace_and_options() {
        let c =
            parse("postgres://bob:s%40cret@h:7/db/app/locks?ttl=3s&schema=ql2&lazy=true").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("h", 7));
        assert_eq!((c.user.as_str(), c.database.as_str()), ("bob", "db"));
        assert_eq!(c.namespace.as_str(), "app/locks");
        assert_eq!(c.schema, "ql2");
        assert_eq!(c.ttl, Duration::from_secs(3));
        assert_eq!(c.timeout, Duration::from_secs(1), "a third of a short TTL");
        assert!(c.lazy);
        assert_eq!(c.connections, DEFAULT_CONNECTIONS);
        assert_eq!(
            parse("postgres://h/db?connections=16").unwrap().connections,
            16
        );
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("s@cret"));
        assert!(!format!("{c:?} {}", c.describe()).contains("cret"), "{c:?}");
        let c = parse("postgresql://h/db").unwrap();
        assert_eq!((c.port, c.schema.as_str()), (DEFAULT_PORT, DEFAULT_SCHEMA));
        assert!(c.namespace.is_empty());
        assert_eq!(c.user, "postgres");
    }

    #[test]
    fn user_and_password_from_the_environment_unless_in_the_url() {
        let env = |k: &str| match k {
            "PGUSER" => Some("envuser".to_string()),
            "PGPASSWORD" => Some("envpw".to_string()),
            _ => None,
        };
        let from = |s: &str| PostgresConfig::from_url_with_env(&url::parse(s).unwrap(), &env);
        let c = from("postgres://h/db").unwrap();
        assert_eq!(c.user, "envuser");
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("envpw"));
        let c = from("postgres://u:p@h/db").unwrap();
        assert_eq!(c.user, "u");
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p"));
    }

    #[test]
    fn rejects_bad_urls() {
        for u in [
            "redis://h/db",
            "postgres://h",
            "postgres://h/",
            "postgres://h/db?ttl=1ms",
            "postgres://h/db?schema=Bad-Name",
            "postgres://h/db?sslmode=on",
            "postgres://h/db?connections=0",
            "postgres://h/db?connections=many",
            "postgres://h/db?ca=/x.pem",
            "postgres://h/db?sslmode=prefer&ca=/x.pem",
            "postgres://h/db?sslmode=verify-full&cert=/c.pem",
            "postgres://h/db?sslmode=verify-full&ca=",
            "postgres://h/db?nope=1",
            "postgres://h/db?ttl=3s&timeout=3s",
            "postgres://h/db/a//b",
        ] {
            let e = parse(u).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{u}: {e}");
        }
        let e = parse("postgres://h/db?ca=/x.pem").unwrap_err();
        assert!(e.message().contains("sslmode=require"), "{e}");
    }

    #[test]
    fn sslmode_and_tls_files() {
        for (mode, want) in [
            ("", SslMode::Disable),
            ("?sslmode=disable", SslMode::Disable),
            ("?sslmode=prefer", SslMode::Disable),
            ("?sslmode=allow", SslMode::Disable),
            ("?sslmode=require", SslMode::Require),
            ("?sslmode=verify-ca", SslMode::VerifyCa),
            ("?sslmode=verify-full", SslMode::VerifyFull),
        ] {
            let c = parse(&format!("postgres://h/db{mode}")).unwrap();
            assert_eq!(c.sslmode, want, "{mode}");
            let pg = c.client_config();
            assert_eq!(
                pg.get_ssl_mode() == tokio_postgres::config::SslMode::Require,
                want.uses_tls(),
                "{mode}"
            );
        }
        let c =
            parse("postgres://h/db?sslmode=verify-full&ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(c.ca_file.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(
            c.client_cert_file.as_deref(),
            Some(std::path::Path::new("/c.pem"))
        );
        assert_eq!(
            c.client_key_file.as_deref(),
            Some(std::path::Path::new("/k.pem"))
        );
        let e = PostgresConfig::default()
            .with_ca_file(Some("/ca.pem".into()))
            .validate()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        PostgresConfig::default()
            .with_sslmode(SslMode::VerifyCa)
            .with_ca_file(Some("/ca.pem".into()))
            .validate()
            .unwrap();
    }
}
