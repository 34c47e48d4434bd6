//! The few Consul HTTP API calls this backend needs, on `reqwest`.
//!
//! There is no maintained async Consul client crate, so this is a thin,
//! typed layer: KV listing (plain and blocking), `/v1/txn`, and the
//! session endpoints. Every request is counted in `requests`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use quorumlock_core::url::{Secret, Url};
use quorumlock_core::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::config::ConsulConfig;
use crate::error::ApiError;

/// Timeout of an ordinary (non-blocking) request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many ordinary requests in flight per backend instance:
/// Consul limits concurrent connections per client address (200 by
/// default), and long polls need some of them.
const MAX_IN_FLIGHT: usize = 32;

/// Which path a request takes to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Ordinary requests: at most [`MAX_IN_FLIGHT`] at once, the rest
    /// wait for a slot.
    Ordinary,
    /// A waiter's long poll: no slot (each waiter holds one for minutes),
    /// the ordinary client's connections.
    Wait,
    /// Loss detection (the monitor's reads, its session check) and
    /// renewals: no slot, and a client of their own (its own connection
    /// pool), so that no amount of ordinary traffic delays them.
    Priority,
}

/// One KV entry as Consul returns it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct KvEntry {
    pub key: String,
    #[serde(default)]
    pub flags: u64,
    /// Base64 of the value.
    #[serde(default)]
    pub value: Option<String>,
    /// The session that holds the entry, if any.
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub create_index: u64,
    #[serde(default)]
    pub modify_index: u64,
}

impl KvEntry {
    /// The holding session, if the entry is locked.
    pub fn holder(&self) -> Option<&str> {
        self.session.as_deref().filter(|s| !s.is_empty())
    }

    /// The value decoded as our JSON record, if it is one.
    pub fn record(&self) -> Option<Record> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(self.value.as_deref()?)
            .ok()?;
        let r: Record = serde_json::from_slice(&raw).ok()?;
        (r.quorumlock == 1).then_some(r)
    }

    /// Whether an operator's break rewrote this entry (it is deleted at
    /// the end of the break's grace): nobody holds by it any more.
    pub fn is_broken(&self) -> bool {
        self.record().is_some_and(|r| r.broken)
    }

    /// Whether this entry is still the grant at `token` to `session`:
    /// unchanged since (`ModifyIndex == token`), or rewritten in place by
    /// that holder's proclaim (locked by `session`, our record naming
    /// `token`, not broken). A proclaim writes only under a check of the
    /// grant's last index, so no other grant carries such a record.
    pub fn is_grant(&self, session: &str, token: u64) -> bool {
        self.holder() == Some(session)
            && (self.modify_index == token
                || self
                    .record()
                    .is_some_and(|r| !r.broken && r.token == Some(token)))
    }

    /// The fencing token of the grant this entry shows: a proclaim's
    /// record names its grant's, else the entry's own `ModifyIndex`.
    pub fn grant_token(&self) -> u64 {
        self.record()
            .filter(|r| !r.broken && r.contender.is_some())
            .and_then(|r| r.token)
            .unwrap_or(self.modify_index)
    }

    /// The holder's value of the entry: from our record, else the raw
    /// value a foreign holder wrote (`consul lock` writes none).
    pub fn holder_value(&self) -> Vec<u8> {
        if let Some(r) = self.record() {
            return r.holder_value();
        }
        self.value
            .as_deref()
            .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            .unwrap_or_default()
    }
}

/// The JSON value we write into our keys (`.lock`, queue keys, `.lock.revoke`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// Always 1: marks the value as ours.
    pub quorumlock: u32,
    /// The acquire attempt that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contender: Option<String>,
    /// Milliseconds since the Unix epoch when it was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// For `.lock.revoke`: the token of the holder asked to let go. For a
    /// `.lock` rewritten by a proclaim: its grant's token (the index moved,
    /// the token did not). For a
    /// read-write entry written again at its grant: the index it replaced
    /// (so that write changes the value: Consul skips a write that changes
    /// nothing, and the index with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// For semaphore contender keys: the permits asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// For `.lock`: broken by an operator, about to be deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub broken: bool,
    /// The holder's value when it is UTF-8 (readable in the Consul UI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The holder's value in base64 when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
}

impl Record {
    /// The record carrying the holder's value `value`.
    pub fn with_value(mut self, value: &[u8]) -> Record {
        (self.value, self.value_b64) = match std::str::from_utf8(value) {
            Ok("") => (None, None),
            Ok(v) => (Some(v.to_string()), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(value)),
            ),
        };
        self
    }

    /// The holder's value this record carries (empty if none).
    pub fn holder_value(&self) -> Vec<u8> {
        match (&self.value, &self.value_b64) {
            (Some(v), _) => v.clone().into_bytes(),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }

    /// The record as a base64 KV value.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("a record always serializes");
        base64::engine::general_purpose::STANDARD.encode(json)
    }
}

/// How a read waits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    /// Blocking query: return once the index moves past this (0: at once).
    pub index: u64,
    /// Longest wait of a blocking query.
    pub wait: Duration,
    /// `?consistent`: the leader checks with a quorum that it still leads.
    pub consistent: bool,
}

/// The outcome of a `/v1/txn` call that the agent answered.
#[derive(Debug)]
pub(crate) enum Txn {
    /// Committed (or read); the results in op order, checks included.
    Done(Vec<KvEntry>),
    /// Rolled back; which ops failed and why.
    Failed(Vec<TxnError>),
}

/// One failed op of a rolled-back txn.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct TxnError {
    pub op_index: usize,
    pub what: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnBody {
    #[serde(default)]
    results: Option<Vec<TxnResult>>,
    #[serde(default)]
    errors: Option<Vec<TxnError>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnResult {
    #[serde(rename = "KV")]
    kv: Option<KvEntry>,
}

/// The HTTP client of one backend instance.
pub(crate) struct Api {
    http: reqwest::Client,
    /// The client of [`Lane::Priority`]: a pool of its own when we build
    /// the clients, the caller's client otherwise.
    priority: reqwest::Client,
    base: Url,
    /// `v1/txn` on `base`, the URL of every write: parsed once.
    txn_url: Url,
    /// `v1/txn?consistent`: read-only txns that must not be served stale.
    txn_consistent_url: Url,
    token: Option<Secret>,
    dc: Option<String>,
    requests: AtomicU64,
    in_flight: Semaphore,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("base", &self.base.as_str())
            .finish()
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

impl Api {
    /// A client for the agent of `config` over `http`, a client the
    /// caller built (its TLS settings and timeouts are its own). Loss
    /// detection and renewals skip the in-flight cap but share its
    /// connection pool (which opens a connection whenever none is idle).
    /// Its redirect policy is its own: `redirect(Policy::none())` keeps
    /// the ACL token to the agent's address, as [`Api::new`]'s clients do.
    pub fn with_http(config: &ConsulConfig, http: reqwest::Client) -> Result<Api> {
        Self::with_clients(config, http.clone(), http)
    }

    fn with_clients(
        config: &ConsulConfig,
        http: reqwest::Client,
        priority: reqwest::Client,
    ) -> Result<Api> {
        let base = config.agent_url()?;
        let dc = config.datacenter.clone();
        Ok(Api {
            http,
            priority,
            txn_url: endpoint(&base, dc.as_deref(), "v1/txn"),
            txn_consistent_url: {
                let mut u = endpoint(&base, dc.as_deref(), "v1/txn");
                u.query_pairs_mut().append_key_only("consistent");
                u
            },
            base,
            token: config.token.clone(),
            dc,
            requests: AtomicU64::new(0),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
        })
    }

    /// One read of `key` that needs the token (unlike `status/leader`):
    /// an unknown token is refused here, at connect.
    pub async fn probe(&self, key: &str) -> ApiResult<()> {
        let r = self
            .request(reqwest::Method::GET, self.url(&format!("v1/kv/{key}")))
            .timeout(REQUEST_TIMEOUT);
        let (code, text) = Self::body(self.send(r, Lane::Ordinary).await?).await?;
        match code {
            200 | 404 => Ok(()),
            _ => Err(ApiError::Status { code, body: text }),
        }
    }

    /// A client for the agent of `config`. Reads the CA file and the
    /// client certificate, if any. Without a CA file the agent's
    /// certificate is checked against the system's roots
    /// (rustls-native-certs); with one, against its CAs alone.
    pub fn new(config: &ConsulConfig) -> Result<Api> {
        let mut roots = None;
        if let Some(path) = &config.ca_file {
            let pem = std::fs::read(path).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidUrl,
                    format!("URL option ca={}: cannot read it", path.display()),
                )
                .with_source(e)
            })?;
            let not_pem = || {
                Error::new(
                    ErrorKind::InvalidUrl,
                    format!("URL option ca={}: no PEM certificate in it", path.display()),
                )
            };
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| not_pem().with_source(e))?;
            if certs.is_empty() {
                return Err(not_pem());
            }
            roots = Some(certs);
        }
        let mut identity = None;
        if let (Some(cert), Some(key)) = (&config.client_cert_file, &config.client_key_file) {
            let read = |opt: &str, path: &std::path::Path| {
                std::fs::read(path).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidUrl,
                        format!("URL option {opt}={}: cannot read it", path.display()),
                    )
                    .with_source(e)
                })
            };
            let mut pem = read("cert", cert)?;
            pem.push(b'\n');
            pem.extend(read("key", key)?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidUrl,
                    format!(
                        "URL options cert={} and key={}: not a PEM certificate and private key",
                        cert.display(),
                        key.display()
                    ),
                )
                .with_source(e)
            })?;
            identity = Some(id);
        }
        // Two clients with the same settings: the ordinary one, and the
        // priority one (loss detection and renewals), whose connections
        // ordinary traffic never takes.
        let build = |idle: usize| {
            let mut b = reqwest::Client::builder()
                .use_rustls_tls()
                .connect_timeout(Duration::from_secs(5))
                .pool_max_idle_per_host(idle)
                .pool_idle_timeout(Duration::from_secs(20))
                .tcp_nodelay(true)
                // Every request carries the ACL token in `X-Consul-Token`,
                // which reqwest keeps across a redirect to another host:
                // a redirect is an error (`Api::send`), never followed.
                .redirect(reqwest::redirect::Policy::none());
            if !config.tls && !tls_proxy_for_http() {
                // Plain HTTP checks no certificate: the system's roots,
                // parsed at each build (hundreds of PEM files, about 4 ms
                // of CPU a client here), are not loaded at all.
                b = b.tls_built_in_root_certs(false);
            } else if let Some(certs) = &roots {
                // `ca=` is the trust: not added to the system's roots.
                b = b.tls_built_in_root_certs(false);
                for cert in certs {
                    b = b.add_root_certificate(cert.clone());
                }
            }
            if let Some(id) = &identity {
                b = b.identity(id.clone());
            }
            b.build().map_err(|e| {
                Error::new(ErrorKind::Internal, "building the HTTP client failed").with_source(e)
            })
        };
        Self::with_clients(config, build(8)?, build(2)?)
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn url(&self, path: &str) -> Url {
        endpoint(&self.base, self.dc.as_deref(), path)
    }

    fn request(&self, method: reqwest::Method, u: Url) -> reqwest::RequestBuilder {
        self.request_on(Lane::Ordinary, method, u)
    }

    fn request_on(&self, lane: Lane, method: reqwest::Method, u: Url) -> reqwest::RequestBuilder {
        let client = if lane == Lane::Priority {
            &self.priority
        } else {
            &self.http
        };
        let mut r = client.request(method, u);
        if let Some(t) = &self.token {
            r = r.header("X-Consul-Token", t.expose());
        }
        r
    }

    /// Sends `r` (built by [`Api::request_on`] for the same `lane`),
    /// counting it. Only [`Lane::Ordinary`] requests wait for one of the
    /// [`MAX_IN_FLIGHT`] slots.
    async fn send(&self, r: reqwest::RequestBuilder, lane: Lane) -> ApiResult<reqwest::Response> {
        let _permit = if lane == Lane::Ordinary {
            Some(self.in_flight.acquire().await.expect("never closed"))
        } else {
            None
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let resp = r.send().await.map_err(ApiError::Transport)?;
        if resp.status().is_redirection() {
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("no location");
            return Err(ApiError::Status {
                code: resp.status().as_u16(),
                body: format!(
                    "a redirect to {to:.200}, not followed (a request carries the ACL token, \
                     for the address in the URL only): give the address that serves \
                     Consul's API, with consuls:// for HTTPS"
                ),
            });
        }
        Ok(resp)
    }

    async fn body(resp: reqwest::Response) -> ApiResult<(u16, String)> {
        let code = resp.status().as_u16();
        let text = resp.text().await.map_err(ApiError::Transport)?;
        Ok((code, text))
    }

    fn decode<T: for<'de> Deserialize<'de>>(text: &str) -> ApiResult<T> {
        serde_json::from_str(text).map_err(|e| ApiError::Decode(format!("{e}: {text:.200}")))
    }

    /// Every entry whose key starts with `prefix`, and the index of the
    /// answer (`X-Consul-Index`). With `block.index > 0`, a blocking query.
    pub async fn kv_list(&self, prefix: &str, block: Block) -> ApiResult<(u64, Vec<KvEntry>)> {
        let lane = if block.index > 0 {
            Lane::Wait
        } else {
            Lane::Ordinary
        };
        self.kv_read(prefix, true, block, lane).await
    }

    /// [`Api::kv_list`] for the monitor of held locks: on the priority
    /// lane (never behind ordinary requests, on connections of its own),
    /// blocking or not.
    pub async fn kv_watch(&self, prefix: &str, block: Block) -> ApiResult<(u64, Vec<KvEntry>)> {
        self.kv_read(prefix, true, block, Lane::Priority).await
    }

    /// The entry `key` alone (no other key that starts with it), and the
    /// index of the answer: the entry's `ModifyIndex`, or the KV table's
    /// index if it is missing. A blocking query on it (`block.index > 0`)
    /// returns only when this key changes.
    pub async fn kv_get(&self, key: &str, block: Block) -> ApiResult<(u64, Option<KvEntry>)> {
        let lane = if block.index > 0 {
            Lane::Wait
        } else {
            Lane::Ordinary
        };
        let (index, entries) = self.kv_read(key, false, block, lane).await?;
        Ok((index, entries.into_iter().find(|e| e.key == key)))
    }

    async fn kv_read(
        &self,
        path: &str,
        recurse: bool,
        block: Block,
        lane: Lane,
    ) -> ApiResult<(u64, Vec<KvEntry>)> {
        // Each segment percent-encoded: an escaped lock name's key holds
        // `%` (quorumlock_core's `LockName::key`), which must reach Consul as is.
        let mut u = self.url("v1/kv/");
        u.path_segments_mut()
            .expect("an http(s) URL has path segments")
            .pop_if_empty()
            .extend(path.split('/'));
        {
            let mut q = u.query_pairs_mut();
            if recurse {
                q.append_key_only("recurse");
            }
            if block.consistent {
                q.append_key_only("consistent");
            }
            if block.index > 0 {
                q.append_pair("index", &block.index.to_string());
                q.append_pair("wait", &format!("{}ms", block.wait.as_millis()));
            }
        }
        let timeout = if block.index > 0 {
            // Consul adds up to wait/16 of jitter.
            block.wait + block.wait / 16 + REQUEST_TIMEOUT
        } else {
            REQUEST_TIMEOUT
        };
        let r = self
            .request_on(lane, reqwest::Method::GET, u)
            .timeout(timeout);
        let resp = self.send(r, lane).await?;
        let index = resp
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let (code, text) = Self::body(resp).await?;
        match code {
            200 => Ok((index, Self::decode(&text)?)),
            404 => Ok((index, Vec::new())),
            _ => Err(ApiError::Status { code, body: text }),
        }
    }

    /// Runs one transaction of KV ops (`{"KV": {...}}` objects).
    pub async fn txn(&self, ops: Vec<op::Op>) -> ApiResult<Txn> {
        self.txn_to(self.txn_url.clone(), ops).await
    }

    /// Runs one read-only transaction with `?consistent`: the leader
    /// checks with a quorum that it still leads, so the answer is never
    /// stale (Consul applies the mode to read-only txns; a txn with
    /// writes goes through raft anyway).
    pub async fn txn_consistent(&self, ops: Vec<op::Op>) -> ApiResult<Txn> {
        self.txn_to(self.txn_consistent_url.clone(), ops).await
    }

    async fn txn_to(&self, url: Url, ops: Vec<op::Op>) -> ApiResult<Txn> {
        let r = self
            .request(reqwest::Method::PUT, url)
            .timeout(REQUEST_TIMEOUT)
            .json(&ops);
        let (code, text) = Self::body(self.send(r, Lane::Ordinary).await?).await?;
        match code {
            200 => {
                let b: TxnBody = Self::decode(&text)?;
                Ok(Txn::Done(
                    b.results
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|r| r.kv)
                        .collect(),
                ))
            }
            409 => {
                let b: TxnBody = Self::decode(&text)?;
                let errors = b.errors.unwrap_or_default();
                // ACL refusals come back as failed ops, not as a 403:
                // report them as the agent would for a single request.
                if let Some(e) = errors.iter().find(|e| {
                    let w = e.what.to_ascii_lowercase();
                    w.contains("permission denied") || w.contains("acl not found")
                }) {
                    let body = if e.what.to_ascii_lowercase().contains("acl not found") {
                        "ACL not found".to_string()
                    } else {
                        e.what.clone()
                    };
                    return Err(ApiError::Status { code: 403, body });
                }
                Ok(Txn::Failed(errors))
            }
            _ => Err(ApiError::Status { code, body: text }),
        }
    }

    /// Creates a session; returns its id. Waits up to `timeout` for the
    /// answer: a client cut off from its agent rides out the partition.
    pub async fn session_create(&self, body: &Value, timeout: Duration) -> ApiResult<String> {
        #[derive(Deserialize)]
        struct Created {
            #[serde(rename = "ID")]
            id: String,
        }
        let r = self
            .request(reqwest::Method::PUT, self.url("v1/session/create"))
            .timeout(timeout)
            .json(body);
        let (code, text) = Self::body(self.send(r, Lane::Ordinary).await?).await?;
        match code {
            200 => Ok(Self::decode::<Created>(&text)?.id),
            _ => Err(ApiError::Status { code, body: text }),
        }
    }

    /// Renews a session; `Ok(false)` if the store no longer has it.
    pub async fn session_renew(&self, id: &str, timeout: Duration) -> ApiResult<bool> {
        let r = self
            .request_on(
                Lane::Priority,
                reqwest::Method::PUT,
                self.url(&format!("v1/session/renew/{id}")),
            )
            .timeout(timeout);
        let (code, text) = Self::body(self.send(r, Lane::Priority).await?).await?;
        match code {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(ApiError::Status { code, body: text }),
        }
    }

    /// Destroys a session (its locked keys go with it: behavior `delete`).
    pub async fn session_destroy(&self, id: &str) -> ApiResult<()> {
        let r = self
            .request(
                reqwest::Method::PUT,
                self.url(&format!("v1/session/destroy/{id}")),
            )
            .timeout(REQUEST_TIMEOUT);
        let (code, text) = Self::body(self.send(r, Lane::Ordinary).await?).await?;
        match code {
            200 => Ok(()),
            _ => Err(ApiError::Status { code, body: text }),
        }
    }

    /// Whether the store still has session `id`.
    pub async fn session_exists(&self, id: &str) -> ApiResult<bool> {
        self.session_info(id, Lane::Ordinary, REQUEST_TIMEOUT).await
    }

    /// [`Api::session_exists`] for the monitor, which must report a loss
    /// at once: on the priority lane, waiting at most `timeout`.
    pub async fn session_exists_now(&self, id: &str, timeout: Duration) -> ApiResult<bool> {
        self.session_info(id, Lane::Priority, timeout).await
    }

    async fn session_info(&self, id: &str, lane: Lane, timeout: Duration) -> ApiResult<bool> {
        let r = self
            .request_on(
                lane,
                reqwest::Method::GET,
                self.url(&format!("v1/session/info/{id}")),
            )
            .timeout(timeout);
        let (code, text) = Self::body(self.send(r, lane).await?).await?;
        match code {
            200 => Ok(!Self::decode::<Vec<Value>>(&text)?.is_empty()),
            _ => Err(ApiError::Status { code, body: text }),
        }
    }

    /// The current leader's address (`""` while there is none).
    pub async fn leader(&self) -> ApiResult<String> {
        let r = self
            .request(reqwest::Method::GET, self.url("v1/status/leader"))
            .timeout(REQUEST_TIMEOUT);
        let (code, text) = Self::body(self.send(r, Lane::Ordinary).await?).await?;
        match code {
            200 => Self::decode::<String>(&text),
            _ => Err(ApiError::Status { code, body: text }),
        }
    }
}

/// `path` on the agent at `base`, in datacenter `dc` if given. Session
/// UUIDs go into the path as-is; KV reads percent-encode their key one
/// segment at a time (an escaped lock name's key holds `%`).
fn endpoint(base: &Url, dc: Option<&str>, path: &str) -> Url {
    let mut u = base.join(path).unwrap_or_else(|_| base.clone());
    if let Some(dc) = dc {
        u.query_pairs_mut().append_pair("dc", dc);
    }
    u
}

/// KV txn ops for [`Api::txn`], serialized as `{"KV": {"Verb": ..}}`
/// straight from these structs (no JSON tree built per request).
pub(crate) mod op {
    use serde::Serialize;

    /// One op of a txn.
    #[derive(Debug, Clone, Serialize)]
    pub struct Op {
        #[serde(rename = "KV")]
        kv: Kv,
    }

    #[derive(Debug, Clone, Serialize)]
    #[serde(rename_all = "PascalCase")]
    struct Kv {
        verb: &'static str,
        key: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        flags: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        index: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    }

    fn op(verb: &'static str, key: &str) -> Kv {
        Kv {
            verb,
            key: key.to_string(),
            session: None,
            flags: None,
            index: None,
            value: None,
        }
    }

    impl From<Kv> for Op {
        fn from(kv: Kv) -> Op {
            Op { kv }
        }
    }

    /// Take `key` with `session` (fails if another session holds it).
    pub fn lock(key: &str, session: &str, flags: u64, value_b64: &str) -> Op {
        Kv {
            session: Some(session.to_string()),
            flags: Some(flags),
            value: Some(value_b64.to_string()),
            ..op("lock", key)
        }
        .into()
    }
    /// Read `key` (fails the txn if it is missing).
    pub fn get(key: &str) -> Op {
        op("get", key).into()
    }
    /// Read every key starting with `prefix`.
    pub fn get_tree(prefix: &str) -> Op {
        op("get-tree", prefix).into()
    }
    /// Write `key` if its ModifyIndex is `index` (a held key keeps its
    /// session), else fail.
    pub fn cas(key: &str, index: u64, flags: u64, value_b64: &str) -> Op {
        Kv {
            index: Some(index),
            flags: Some(flags),
            value: Some(value_b64.to_string()),
            ..op("cas", key)
        }
        .into()
    }
    /// Fail unless `key`'s ModifyIndex is `index`.
    pub fn check_index(key: &str, index: u64) -> Op {
        Kv {
            index: Some(index),
            ..op("check-index", key)
        }
        .into()
    }
    /// Fail if `key` exists.
    pub fn check_not_exists(key: &str) -> Op {
        op("check-not-exists", key).into()
    }
    /// Fail unless `session` holds `key`.
    pub fn check_session(key: &str, session: &str) -> Op {
        Kv {
            session: Some(session.to_string()),
            ..op("check-session", key)
        }
        .into()
    }
    /// Set `key` to a value, whoever holds it.
    pub fn set(key: &str, value_b64: &str) -> Op {
        Kv {
            value: Some(value_b64.to_string()),
            ..op("set", key)
        }
        .into()
    }
    /// Delete `key` (no error if missing).
    pub fn delete(key: &str) -> Op {
        op("delete", key).into()
    }
    /// Delete `key` if its ModifyIndex is `index`, else fail.
    pub fn delete_cas(key: &str, index: u64) -> Op {
        Kv {
            index: Some(index),
            ..op("delete-cas", key)
        }
        .into()
    }
}

/// Whether the environment names a proxy for plain HTTP that is itself
/// reached over TLS (`http_proxy` or `all_proxy`, either case, with
/// `https://`: the variables reqwest reads for an `http://` URL). Such a
/// proxy's certificate is checked against the system's roots, so a
/// `consul://` client loads them after all.
fn tls_proxy_for_http() -> bool {
    ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        .iter()
        .any(|v| {
            std::env::var(v).is_ok_and(|p| p.trim().to_ascii_lowercase().starts_with("https://"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_foreign_values() {
        let r = Record {
            quorumlock: 1,
            contender: Some("c".into()),
            since_ms: Some(7),
            token: Some(9),
            broken: false,
            permits: None,
            value: None,
            value_b64: None,
        }
        .with_value(b"host:1");
        let e = KvEntry {
            key: "k".into(),
            flags: 0,
            value: Some(r.encode()),
            session: Some(String::new()),
            create_index: 1,
            modify_index: 2,
        };
        assert_eq!(e.record(), Some(r));
        assert_eq!(e.holder_value(), b"host:1");
        let binary = Record::default().with_value(b"\xff\x00");
        assert_eq!(binary.value, None);
        assert_eq!(binary.holder_value(), b"\xff\x00");
        assert_eq!(e.holder(), None, "an empty session is no holder");
        let foreign = KvEntry {
            value: Some(base64::engine::general_purpose::STANDARD.encode("not json")),
            ..e.clone()
        };
        assert_eq!(foreign.record(), None);
        assert_eq!(foreign.holder_value(), b"not json", "a foreign value as is");
        let none = KvEntry { value: None, ..e };
        assert_eq!(none.record(), None);
    }

    #[test]
    fn bad_ca_file_is_an_invalid_url() {
        let missing = ConsulConfig::parse("consuls://h?ca=/nonexistent/ca.pem").unwrap();
        let e = Api::new(&missing).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{e}");
        let junk = std::env::temp_dir().join(format!("ql-consul-junk-{}.pem", std::process::id()));
        std::fs::write(&junk, "not a certificate").unwrap();
        let cfg = ConsulConfig::parse(&format!("consuls://h?ca={}", junk.display())).unwrap();
        let e = Api::new(&cfg).unwrap_err();
        let _ = std::fs::remove_file(&junk);
        assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{e}");
    }
}
