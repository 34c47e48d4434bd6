//! [`RedisBackend`]: connecting, and the admin operations (inspect,
//! break, revoke, kill a session, leftovers, fenced writes).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use quorumlock_core::backend::connect::check_connect;
use quorumlock_core::backend::{
    check_kinds, refused, Backend, Capabilities, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use quorumlock_core::{Contender, Error, ErrorKind, LockName, LockState, Result};

use crate::config::RedisConfig;
use crate::core::{lazy_manager, RedisCore};
use crate::error;
use crate::layout;
use crate::scripts;
use crate::session::RedisSession;

/// The Redis backend: one multiplexed connection (reconnected after a
/// failure) for every request of every session, plus one blocking
/// connection per session for its mailbox. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) core: Arc<RedisCore>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.core.config.describe())
            .finish()
    }
}

impl RedisBackend {
    /// Parses `url` ([`RedisConfig::from_url`]) and connects; unless the
    /// URL says `lazy=true`, Redis must answer a PING (see
    /// [`RedisBackend::from_config`]).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn connect(url: impl AsRef<str>) -> Result<RedisBackend> {
        let url = quorumlock_core::url::parse(url.as_ref())?;
        Self::from_config(RedisConfig::from_url(&url)?).await
    }

    /// Connects with a configuration. Unless [`RedisConfig::lazy`], a
    /// PING must be answered within [`RedisConfig::connect_timeout`]:
    /// refused until then is [`ErrorKind::Unavailable`], no answer
    /// [`ErrorKind::Timeout`], a bad password [`ErrorKind::Unauthenticated`]
    /// at once (the connection's handshake sends it).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_config(config: RedisConfig) -> Result<RedisBackend> {
        config.validate()?;
        if config.tls {
            // One process-wide crypto provider for rustls; an error means
            // one is installed already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = client(&config)?;
        Self::from_client(client, config).await
    }

    /// A backend over a `redis::Client` the caller built (its address,
    /// credentials, database and TLS are the client's; those of `config`
    /// are not used). Checked as [`RedisBackend::from_config`].
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_client(client: redis::Client, config: RedisConfig) -> Result<RedisBackend> {
        config.validate()?;
        let conn = lazy_manager(&client, &config, Some(config.timeout))?;
        let prefix = config.namespace.prefix();
        let b = RedisBackend {
            core: Arc::new(RedisCore {
                config,
                client,
                conn,
                requests: AtomicU64::new(0),
                prefix,
                opened: Mutex::new(Vec::new()),
                waits: Mutex::new(Vec::new()),
            }),
        };
        let c = &b.core.config;
        if !c.lazy {
            // A connection of its own, not the manager's: the manager
            // tries a refused handshake three times, and bad credentials
            // must be refused once.
            check_connect(&c.describe(), c.connect_timeout, || async {
                b.core.requests.fetch_add(1, Ordering::Relaxed);
                let mut conn = b
                    .core
                    .client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| error::map(e, "connecting to Redis"))?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .map(drop)
                    .map_err(|e| error::map(e, "PING"))
            })
            .await?;
        }
        tracing::debug!(url = %c.describe(), "redis backend ready");
        Ok(b)
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.core.config
    }
}

/// One row of the INSPECT script's answer.
struct Row {
    contender: String,
    kind: quorumlock_core::LockKind,
    sid: String,
    created: u64,
    token: u64,
    seq: u64,
    holds: bool,
    value: Vec<u8>,
}

fn rows(flat: Vec<Vec<u8>>) -> Result<Vec<Row>> {
    let bad = || Error::new(ErrorKind::Internal, "the inspect script answered garbage");
    flat.chunks(9)
        .map(|c| {
            let [id, kind, permits, sid, created, token, seq, holds, value] = c else {
                return Err(bad());
            };
            let text = |s: &Vec<u8>| String::from_utf8(s.clone()).map_err(|_| bad());
            let num = |s: &Vec<u8>| text(s)?.parse::<u64>().map_err(|_| bad());
            Ok(Row {
                contender: text(id)?,
                kind: layout::kind_of(&text(kind)?, num(permits)? as u32),
                sid: text(sid)?,
                created: num(created)?,
                token: num(token)?,
                seq: num(seq)?,
                holds: holds == b"1",
                value: value.clone(),
            })
        })
        .collect()
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: true,
            semaphore: true,
            session_ttl: self.core.config.ttl,
            proclaim: true,
        }
    }

    fn describe(&self) -> String {
        self.core.config.describe()
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        Ok(Arc::new(
            RedisSession::open(self.core.clone(), liveness).await?,
        ))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let key = self.core.lock_key(name);
        let mut inv = scripts::INSPECT.prepare_invoke();
        inv.arg(&self.core.prefix).arg(&key);
        let flat: Vec<Vec<u8>> = self.core.script("inspect", &inv).await?;
        let mut state = LockState::free(name.clone());
        for r in rows(flat)? {
            let c = Contender {
                session: r.sid,
                token: if r.holds { r.token } else { r.seq },
                entry: layout::entry_name(&key, &r.contender),
                kind: r.kind,
                since: Some(UNIX_EPOCH + Duration::from_millis(r.created)),
                value: r.value,
            };
            if r.holds {
                state.holders.push(c);
            } else {
                state.waiters.push(c);
            }
        }
        Ok(state)
    }

    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        // Every lock with a queue has its `L/.q` key: scan for those under
        // the prefix, then read each as `inspect` does.
        let ns = self.core.prefix.clone();
        let under = match prefix {
            Some(p) => format!("{}/", self.core.lock_key(p)),
            None => ns.clone(),
        };
        let mut names = std::collections::BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .core
                .cmd(
                    "scan locks",
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(layout::glob_prefix(&ns))
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            for k in keys {
                let Some(lock) = k.strip_suffix("/.q") else {
                    continue;
                };
                let exact = prefix.is_some_and(|p| lock == self.core.lock_key(p));
                if !(exact || lock.starts_with(under.as_str())) {
                    continue;
                }
                if let Some(name) = LockName::from_key(&lock[ns.len()..]) {
                    names.insert(name);
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut out = Vec::new();
        for name in names {
            let state = self.inspect(&name).await?;
            if !state.is_free() {
                out.push(state);
            }
        }
        Ok(out)
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        let mut inv = scripts::BREAK.prepare_invoke();
        inv.arg(&self.core.prefix).arg(self.core.lock_key(name));
        let n: i64 = self.core.script("break lock", &inv).await?;
        if n > 0 {
            tracing::info!(lock = %name, holders = n, "lock broken");
        }
        Ok(n > 0)
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        let mut inv = scripts::REVOKE.prepare_invoke();
        inv.arg(&self.core.prefix).arg(self.core.lock_key(name));
        let n: i64 = self.core.script("request revoke", &inv).await?;
        Ok(n > 0)
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        layout::check_session_id(session)?;
        self.core.end_session(session, true).await?;
        Ok(())
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        let prefix = self.core.prefix.clone();
        let mut out = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .core
                .cmd(
                    "scan namespace",
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(layout::glob_prefix(&prefix))
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            out.extend(
                keys.into_iter()
                    .filter(|k| !layout::is_bookkeeping(&prefix, k))
                    .map(|k| format!("key {k}")),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let sessions: Vec<String> = self.core.opened.lock().expect("poisoned").clone();
        let mut dead = Vec::new();
        for sid in sessions {
            let key = layout::session_key(&prefix, &sid);
            let n: i64 = self
                .core
                .cmd("session exists", redis::cmd("EXISTS").arg(&key))
                .await?;
            if n == 1 {
                out.push(format!("session {sid}"));
            } else {
                dead.push(sid);
            }
        }
        self.core
            .opened
            .lock()
            .expect("poisoned")
            .retain(|s| !dead.contains(s));
        out.sort();
        Ok(out)
    }

    fn requests_sent(&self) -> u64 {
        self.core.requests.load(Ordering::Relaxed)
    }

    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        write.validate(&self.core.prefix)?;
        check_kinds(held)?;
        let mut inv = scripts::FENCED.prepare_invoke();
        inv.arg(&self.core.prefix);
        match write {
            KeyWrite::Put { key, value } => inv.arg("put").arg(key).arg(value.as_slice()),
            KeyWrite::Delete { key } => inv.arg("del").arg(key).arg(""),
        };
        for h in held {
            let Some((lock, contender)) = layout::parse_entry_name(&h.entry) else {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("{:?} is not a Redis lock entry", h.entry),
                ));
            };
            inv.arg(lock).arg(contender).arg(h.token);
        }
        let applied: i64 = self.core.script("fenced write", &inv).await?;
        if applied == 1 {
            Ok(())
        } else {
            Err(refused(write, held))
        }
    }

    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        KeyWrite::Delete { key: key.into() }.validate(&self.core.prefix)?;
        self.core.cmd("read key", redis::cmd("GET").arg(key)).await
    }

    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        write.validate(&self.core.prefix)?;
        match write {
            KeyWrite::Put { key, value } => {
                self.core
                    .cmd::<()>(
                        "unfenced write",
                        redis::cmd("SET").arg(key).arg(value.as_slice()),
                    )
                    .await
            }
            KeyWrite::Delete { key } => {
                self.core
                    .cmd::<()>("unfenced write", redis::cmd("DEL").arg(key))
                    .await
            }
        }
    }
}

/// The `redis` client of `config`: with the CA file and the client
/// certificate when given (the crate then trusts that CA alone), else the
/// crate's own (the system's roots for `rediss://`).
fn client(config: &RedisConfig) -> Result<redis::Client> {
    let custom = config.ca_file.is_some() || config.client_cert_file.is_some();
    if !custom {
        return redis::Client::open(config.connection_info()?)
            .map_err(|e| error::map(e, "configuring the Redis client"));
    }
    let read = |opt: &str, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            quorumlock_core::Error::new(
                quorumlock_core::ErrorKind::InvalidUrl,
                format!("URL option {opt}={}: cannot read it", p.display()),
            )
            .with_source(e)
        })
    };
    let root_cert = match &config.ca_file {
        Some(p) => Some(read("ca", p)?),
        None => None,
    };
    let client_tls = match (&config.client_cert_file, &config.client_key_file) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read("cert", c)?,
            client_key: read("key", k)?,
        }),
        _ => None,
    };
    redis::Client::build_with_tls(
        config.connection_info()?,
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| {
        quorumlock_core::Error::new(
            quorumlock_core::ErrorKind::InvalidUrl,
            "URL options ca=, cert=, key=: not PEM certificates and a private key",
        )
        .with_source(e)
    })
}
