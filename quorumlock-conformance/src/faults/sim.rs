//! The in-memory network: faults for `mem://`, where there is no socket to
//! proxy. A wrapper backend runs every call through a simulated link, and
//! the keepalive of the wrapped [`MemBackend`] stops while the link is down.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use quorumlock_core::backend::{
    AcquireRequest, Acquired, Backend, Capabilities, HeldEntry, KeyWrite, SessionLiveness,
    StoreSession,
};
use quorumlock_core::mem::MemBackend;
use quorumlock_core::LockState;
use quorumlock_core::{Error, ErrorKind, LockName, Result};
use tokio::sync::watch;

use super::{NetControl, NetMode, OneShot};

#[derive(Debug, Clone, Copy, PartialEq)]
struct Link {
    mode: NetMode,
    /// Bumped by cut and reset: calls in flight from an older epoch fail
    /// (their reply is lost; what they did on the store stays done).
    epoch: u64,
}

/// The simulated link of one `mem://` client.
///
/// - `Blackhole`: calls wait (request and reply held) until healed; the
///   session's keepalive stops, so the store expires it after its TTL.
/// - `Cut`: calls fail with [`ErrorKind::Connection`], calls in flight
///   lose their reply; the keepalive stops.
/// - `Reset`: calls in flight lose their reply, new calls fail; the
///   keepalive goes on (a client reconnects at once).
/// - `Delay(d)`: `d` before each request and each reply (the keepalive is
///   internal to the mem backend and is not delayed).
pub struct SimNet {
    link: watch::Sender<Link>,
    mem: MemBackend,
    faults: AtomicU64,
    armed: Armed,
    calls: Arc<AtomicU64>,
}

/// A one-shot fault armed for the next call ([`NetControl::arm`]).
type Armed = Arc<std::sync::Mutex<Option<OneShot>>>;

impl fmt::Debug for SimNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimNet")
            .field("link", &*self.link.borrow())
            .finish()
    }
}

impl SimNet {
    /// A link to `mem` and the backend to give the client.
    pub fn wrap(mem: MemBackend) -> (Arc<SimNet>, Arc<dyn Backend>) {
        let (tx, rx) = watch::channel(Link {
            mode: NetMode::Pass,
            epoch: 0,
        });
        let armed = Armed::default();
        let calls = Arc::new(AtomicU64::new(0));
        let net = Arc::new(SimNet {
            link: tx,
            mem: mem.clone(),
            faults: AtomicU64::new(0),
            armed: armed.clone(),
            calls: calls.clone(),
        });
        let backend = Arc::new(SimBackend {
            inner: Arc::new(mem),
            wire: Wire {
                link: rx,
                armed,
                calls,
            },
        });
        (net, backend)
    }
}

impl NetControl for SimNet {
    fn set_mode(&self, mode: NetMode) {
        if mode != NetMode::Pass {
            self.faults.fetch_add(1, Ordering::Relaxed);
        }
        self.mem
            .pause_keepalive(matches!(mode, NetMode::Blackhole | NetMode::Cut));
        self.link.send_modify(|l| {
            if matches!(mode, NetMode::Cut | NetMode::Reset) {
                l.epoch += 1;
            }
            l.mode = mode;
        });
    }

    fn mode(&self) -> NetMode {
        self.link.borrow().mode
    }

    fn faults(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    fn requests(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Spent on the next call of this client: `LoseAnswer` runs the call
    /// on the store and then fails it as a lost reply would.
    fn arm(&self, fault: OneShot) -> bool {
        self.faults.fetch_add(1, Ordering::Relaxed);
        *self.armed.lock().expect("poisoned") = Some(fault);
        true
    }
}

fn broken() -> Error {
    Error::new(ErrorKind::Connection, "simulated link is down")
}

/// Waits until the link lets a message through; `Err` if it is cut.
async fn pass(link: &mut watch::Receiver<Link>, epoch: Option<u64>) -> Result<()> {
    loop {
        let l = *link.borrow_and_update();
        if epoch.is_some_and(|e| e != l.epoch) {
            return Err(broken());
        }
        match l.mode {
            NetMode::Pass => return Ok(()),
            NetMode::Delay(d) => {
                tokio::time::sleep(d).await;
                return Ok(());
            }
            NetMode::Cut | NetMode::Reset => return Err(broken()),
            NetMode::Blackhole => {
                if link.changed().await.is_err() {
                    return Err(broken());
                }
            }
        }
    }
}

/// Resolves when the link's epoch moves past `epoch`.
async fn broken_since(mut link: watch::Receiver<Link>, epoch: u64) {
    let _ = link.wait_for(|l| l.epoch != epoch).await;
}

/// The link of one simulated client and its armed one-shot fault.
#[derive(Debug, Clone)]
struct Wire {
    link: watch::Receiver<Link>,
    armed: Armed,
    /// Calls that went out on the link ([`NetControl::requests`]).
    calls: Arc<AtomicU64>,
}

impl Wire {
    /// Runs `call` across the link: the request and the reply each wait
    /// for the link to pass, and an armed one-shot fault is spent on it.
    async fn through<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let link = &self.link;
        self.calls.fetch_add(1, Ordering::Relaxed);
        let fault = self.armed.lock().expect("poisoned").take();
        let mut rx = link.clone();
        match fault {
            Some(OneShot::LoseRequest) => return Err(broken()),
            Some(OneShot::DelayRequest(d)) => tokio::time::sleep(d).await,
            _ => {}
        }
        pass(&mut rx, None).await?;
        let epoch = rx.borrow().epoch;
        let r = tokio::select! {
            r = call => r,
            _ = broken_since(link.clone(), epoch) => return Err(broken()),
        };
        match fault {
            // Done on the store; the caller never hears of it.
            Some(OneShot::LoseAnswer) => return Err(broken()),
            Some(OneShot::DelayAnswer(d)) => tokio::time::sleep(d).await,
            _ => {}
        }
        // The reply crosses the link too.
        pass(&mut rx, Some(epoch)).await?;
        r
    }
}

#[derive(Debug)]
struct SimBackend {
    inner: Arc<MemBackend>,
    wire: Wire,
}

#[derive(Debug)]
struct SimSession {
    inner: Arc<dyn StoreSession>,
    wire: Wire,
}

#[async_trait]
impl Backend for SimBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn changes(&self, name: &LockName) -> Option<quorumlock_core::backend::ChangeFeed> {
        self.inner.changes(name)
    }
    fn describe(&self) -> String {
        format!("simnet {}", self.inner.describe())
    }
    async fn open_session(&self, l: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let inner = self.wire.through(self.inner.open_session(l)).await?;
        Ok(Arc::new(SimSession {
            inner,
            wire: self.wire.clone(),
        }))
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.wire.through(self.inner.inspect(name)).await
    }
    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.wire.through(self.inner.break_lock(name)).await
    }
    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.wire.through(self.inner.request_revoke(name)).await
    }
    async fn kill_session(&self, session: &str) -> Result<()> {
        self.wire.through(self.inner.kill_session(session)).await
    }
    async fn leftovers(&self) -> Result<Vec<String>> {
        self.wire.through(self.inner.leftovers()).await
    }
    fn requests_sent(&self) -> u64 {
        self.inner.requests_sent()
    }
    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        self.wire
            .through(self.inner.fenced_write(held, write))
            .await
    }
    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.wire.through(self.inner.read_key(key)).await
    }
    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        self.wire.through(self.inner.list(prefix)).await
    }
    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        self.wire.through(self.inner.write_key(write)).await
    }
}

#[async_trait]
impl StoreSession for SimSession {
    fn id(&self) -> String {
        self.inner.id()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        self.wire.through(self.inner.acquire(req)).await
    }
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        self.wire.through(self.inner.release(req, held)).await
    }
    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        self.wire
            .through(self.inner.set_value(req, held, value))
            .await
    }
    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        self.wire.through(self.inner.abandon(req)).await
    }
    async fn close(&self) -> Result<()> {
        self.wire.through(self.inner.close()).await
    }
}
