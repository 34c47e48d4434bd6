//! Every kind of holder on one name: tokens increase in grant order.

use super::*;

/// A kind of holder on one name, for [`tokens_increase_across_kinds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
    /// A permit of a semaphore of 2.
    Permit,
}

/// One hold of [`tokens_increase_across_kinds`]: when its acquire
/// started and returned, when its release returned, and its token.
#[derive(Debug, Clone, Copy)]
struct Hold {
    kind: Kind,
    token: u64,
    started: Instant,
    acquired: Instant,
    released: Instant,
}

async fn hold_as(kind: Kind, c: LockClient, name: &'static str, keep: Duration) -> Hold {
    let started = Instant::now();
    let g = tokio::time::timeout(SOON, async {
        match kind {
            Kind::Mutex => c.lock(name).unwrap().acquire().await,
            Kind::Read => c.rwlock(name).unwrap().read().await,
            Kind::Write => c.rwlock(name).unwrap().write().await,
            Kind::Permit => c.semaphore(name, 2).unwrap().acquire().await,
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{kind:?} on {name} not granted within {SOON:?}"))
    .unwrap_or_else(|e| panic!("{kind:?} on {name}: {e}"));
    let acquired = Instant::now();
    tokio::time::sleep(keep).await;
    let token = g.token();
    g.release().await.unwrap();
    Hold {
        kind,
        token,
        started,
        acquired,
        released: Instant::now(),
    }
}

/// Holds `first` on client 0, queues `then` (one client each, in order,
/// each seen waiting before the next comes), lets `first` go; returns
/// every hold.
async fn line_up(
    clients: &[LockClient],
    name: &'static str,
    first: Kind,
    then: &[Kind],
) -> Vec<Hold> {
    let keep = Duration::from_millis(40);
    let head = {
        let c = clients[0].clone();
        tokio::spawn(hold_as(first, c, name, Duration::from_millis(300)))
    };
    eventually("the first holder", || async {
        !clients[0].inspect(name).await.unwrap().holders.is_empty()
    })
    .await;
    let mut tasks = vec![head];
    let entries = |st: quorumlock_core::LockState| st.holders.len() + st.waiters.len();
    for (i, kind) in then.iter().enumerate() {
        let before = entries(clients[0].inspect(name).await.unwrap());
        let t = tokio::spawn(hold_as(*kind, clients[i + 1].clone(), name, keep));
        eventually("the next one to queue (or be granted)", || async {
            t.is_finished() || entries(clients[0].inspect(name).await.unwrap()) > before
        })
        .await;
        tasks.push(t);
    }
    let mut holds = Vec::new();
    for t in tasks {
        holds.push(t.await.expect("a holder panicked"));
    }
    holds
}

/// Tokens on one name increase in grant order across every kind of holder
/// (mutex, reader, writer, semaphore permit): a resource fenced by the
/// name's tokens must refuse every earlier holder, whatever its kind. A
/// mutex that gets the lock between a writer's arrival and its grant must
/// not leave the writer a smaller token. Checked on every pair of holds:
/// one that was granted before the other started, or that let go before
/// the other was granted when both cannot hold together, has the smaller
/// token.
pub async fn tokens_increase_across_kinds(h: &Harness) {
    use Kind::*;
    let case = h.case();
    let clients = case.clients(6).await;
    let name = "kinds";
    let mut holds = Vec::new();
    // Mutex first, then waiters of every lock kind in line behind it.
    holds.extend(line_up(&clients, name, Mutex, &[Mutex, Write, Read, Read, Mutex]).await);
    // Semaphore permits on the same name, once it is free (run from
    // `rwlock_suite!`: only where the backend has semaphores too).
    if clients[0].backend().capabilities().semaphore {
        holds.extend(line_up(&clients, name, Permit, &[Permit, Permit]).await);
    }
    // A reader first, then a mutex, a writer and readers behind it.
    holds.extend(line_up(&clients, name, Read, &[Mutex, Write, Read, Mutex]).await);
    holds.extend(line_up(&clients, name, Write, &[Read, Mutex]).await);
    for a in &holds {
        for b in &holds {
            let shared = a.kind == b.kind && matches!(a.kind, Read | Permit);
            let before = a.acquired < b.started || (!shared && a.released < b.acquired);
            assert!(
                !before || a.token < b.token,
                "{:?} with token {} came before {:?} with token {}: tokens not in grant order\n{holds:#?}",
                a.kind,
                a.token,
                b.kind,
                b.token
            );
        }
    }
    case.finish().await;
}
