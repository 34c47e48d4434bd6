//! The recorded history of a schedule and the checker over it.

use super::*;

/// What one hold was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    Exclusive,
    Read,
    /// An upgradeable read: beside readers, never beside another one or a
    /// writer (its own upgrade aside).
    Upgradeable,
    Permit(u32),
}

#[derive(Debug, Clone)]
pub(super) struct Hold {
    pub(super) name: &'static str,
    pub(super) client: usize,
    pub(super) kind: Held,
    /// Permits held at once (`acquire_many`); 1 for any other hold.
    pub(super) count: u32,
    pub(super) token: u64,
    /// When the acquire was called.
    pub(super) started: Instant,
    /// When it returned the guard.
    pub(super) acquired: Instant,
    pub(super) ended: Option<Instant>,
    /// What ended it (for the report of a violation).
    pub(super) why: &'static str,
    /// A break or session kill hit it while its acquire was in flight:
    /// the store may have granted it before the fault and answered after
    /// it, so it is not a belief the checker can hold against the lock
    /// (its writes are still checked by the fenced register).
    pub(super) forced: bool,
    /// For the write hold of an upgrade, the upgradeable hold (its index
    /// in the log) it upgrades: the two overlap by design.
    pub(super) upgrade_of: Option<usize>,
    /// Its index in the log.
    pub(super) id: usize,
}

/// Whom a forced fault hit.
#[derive(Debug, Clone, Copy)]
pub(super) enum Forced {
    /// `break_lock` of a name.
    Name(&'static str),
    /// An operator's delete of a name's entries with the store's tool.
    Deleted(&'static str),
    /// `kill_session` of a client's session.
    Client(usize),
    /// A failover to a replica without the last writes: every hold (the
    /// store may have lost any grant since the replication link was cut).
    Failover,
}

/// One fenced write to the store.
#[derive(Debug, Clone)]
pub(super) struct FencedWrite {
    pub(super) name: &'static str,
    pub(super) client: usize,
    pub(super) token: u64,
    /// When it was sent and when the store answered.
    pub(super) sent: Instant,
    pub(super) answered: Instant,
    pub(super) accepted: bool,
}

/// A `release()` of a recorded hold, and whether it returned `Ok`.
#[derive(Debug, Clone)]
pub(super) struct Release {
    pub(super) hold: usize,
    pub(super) called: Instant,
    pub(super) ok: bool,
}

/// The recorded history of a schedule.
#[derive(Debug, Default)]
pub(super) struct Log {
    pub(super) holds: Mutex<Vec<Hold>>,
    /// Break and kill calls: when each was made, when it returned, whom.
    pub(super) forced: Mutex<Vec<(Instant, Instant, Forced)>>,
    /// Fenced writes to the store, accepted or refused.
    pub(super) fenced: Mutex<Vec<FencedWrite>>,
    /// Releases (not drops) of holds.
    pub(super) releases: Mutex<Vec<Release>>,
}

impl Log {
    pub(super) fn begin(
        &self,
        name: &'static str,
        client: usize,
        kind: Held,
        token: u64,
        started: Instant,
    ) -> usize {
        let mut h = self.holds.lock().unwrap();
        let id = h.len();
        h.push(Hold {
            name,
            client,
            kind,
            count: 1,
            token,
            started,
            acquired: Instant::now(),
            ended: None,
            why: "still held",
            forced: false,
            upgrade_of: None,
            id,
        });
        id
    }

    /// Records that hold `id` is the write hold of an upgrade of hold
    /// `of`.
    pub(super) fn upgrade_of(&self, id: usize, of: usize) {
        self.holds.lock().unwrap()[id].upgrade_of = Some(of);
    }

    /// Records that hold `id` holds `count` permits at once.
    pub(super) fn set_count(&self, id: usize, count: u32) {
        self.holds.lock().unwrap()[id].count = count;
    }

    /// Records a fenced write of `token` to the store key of `name`.
    pub(super) fn fenced_write(
        &self,
        name: &'static str,
        client: usize,
        token: u64,
        sent: Instant,
        answered: Instant,
        accepted: bool,
    ) {
        self.fenced.lock().unwrap().push(FencedWrite {
            name,
            client,
            token,
            sent,
            answered,
            accepted,
        });
    }

    /// Records that hold `id` was released by a call at `called`.
    pub(super) fn released(&self, id: usize, called: Instant, ok: bool) {
        self.releases.lock().unwrap().push(Release {
            hold: id,
            called,
            ok,
        });
    }

    /// The earliest end wins.
    pub(super) fn end(&self, id: usize, at: Instant, why: &'static str) {
        let mut h = self.holds.lock().unwrap();
        let hold = &mut h[id];
        if hold.ended.is_none_or(|t| at < t) {
            hold.ended = Some(at);
            hold.why = why;
        }
    }

    /// Records a break or a session kill, called at `at` and answered at
    /// `done` (the store applied it somewhere in between): the holder
    /// cannot know before the store tells it, so its belief is cut there.
    pub(super) fn force(&self, at: Instant, done: Instant, whom: Forced) {
        self.forced.lock().unwrap().push((at, done, whom));
    }

    /// The holds with every forced fault applied: a hold that the fault
    /// found held ends at it; one whose acquire was in flight while the
    /// fault was (started before its answer, returned after its call) is
    /// marked `forced` and ends where it began: the store may have
    /// granted it before applying the fault.
    pub(super) fn settled(&self, now: Instant) -> Vec<Hold> {
        let forced = self.forced.lock().unwrap().clone();
        let mut holds = self.holds.lock().unwrap().clone();
        for h in &mut holds {
            let end = h.ended.unwrap_or(now);
            for (at, done, whom) in &forced {
                let hits = match whom {
                    Forced::Name(n) | Forced::Deleted(n) => *n == h.name,
                    Forced::Client(c) => *c == h.client,
                    Forced::Failover => true,
                };
                if !hits || *done <= h.started || *at >= end {
                    continue;
                }
                if *at < h.acquired {
                    h.forced = true;
                    h.ended = Some(h.acquired);
                } else if h.ended.is_none_or(|t| *at < t) {
                    h.ended = Some(*at);
                    h.why = match whom {
                        Forced::Name(_) => "break",
                        Forced::Deleted(_) => "operator's delete",
                        Forced::Client(_) => "session kill",
                        Forced::Failover => "failover",
                    };
                }
            }
        }
        holds
    }
}

/// Whether holds of kinds `a` and `b` may hold at once: readers with
/// readers and an upgradeable reader, permits with permits.
fn shared(a: Held, b: Held) -> bool {
    matches!(
        (a, b),
        (Held::Read, Held::Read | Held::Upgradeable)
            | (Held::Upgradeable, Held::Read)
            | (Held::Permit(_), Held::Permit(_))
    )
}

/// The checker over the recorded history.
pub(super) fn check(sh: &Shared) -> Vec<String> {
    let now = Instant::now();
    let holds = sh.log.settled(now);
    let forced = sh.log.forced.lock().unwrap().clone();
    let mut out = Vec::new();
    let mut by_name: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for h in holds.iter().filter(|h| !h.forced) {
        by_name.entry(h.name).or_default().push(h);
    }
    // A release that returned `Ok` although a break of its name (or an
    // operator's delete of its entries), called after the grant, had
    // finished before the release was called: the entry was removed (or
    // marked), so no release can have found it as granted. `Ok` would
    // tell the holder its work was protected.
    for r in sh.log.releases.lock().unwrap().iter().filter(|r| r.ok) {
        let h = &holds[r.hold];
        let broke = forced.iter().find(|(at, done, whom)| {
            matches!(whom, Forced::Name(n) | Forced::Deleted(n) if *n == h.name)
                && *at > h.acquired
                && *done < r.called
        });
        if let Some((at, done, whom)) = broke {
            out.push(format!(
                "{}: the release of client {}'s hold (token {}) returned Ok although a break of it had finished before ({:?} +{}..+{} ms, release +{} ms from the grant)",
                h.name,
                h.client,
                h.token,
                whom,
                (*at - h.acquired).as_millis(),
                (*done - h.acquired).as_millis(),
                (r.called - h.acquired).as_millis()
            ));
        }
    }
    for (name, mut hs) in by_name {
        hs.sort_by_key(|h| h.acquired);
        let end = |h: &Hold| h.ended.unwrap_or(now);
        for (i, a) in hs.iter().enumerate() {
            for b in &hs[i + 1..] {
                if b.acquired >= end(a) {
                    continue;
                }
                if b.upgrade_of == Some(a.id) || a.upgrade_of == Some(b.id) {
                    continue;
                }
                match (a.kind, b.kind) {
                    (x, y) if shared(x, y) => {}
                    _ => out.push(format!(
                        "{name}: two holders at once: client {} ({:?}, token {}) and client {} ({:?}, token {}), overlap {:?}; {}",
                        a.client,
                        a.kind,
                        a.token,
                        b.client,
                        b.kind,
                        b.token,
                        end(a).min(end(b)) - b.acquired,
                        timeline(a, b, &forced, now)
                    )),
                }
            }
            // Permits held at the moment `a` began, `a`'s included.
            if let Held::Permit(n) = a.kind {
                let at_once: usize = hs[..=i]
                    .iter()
                    .filter(|h| matches!(h.kind, Held::Permit(_)) && a.acquired < end(h))
                    .map(|h| h.count as usize)
                    .sum();
                if at_once > n as usize {
                    out.push(format!(
                        "{name}: {at_once} permits held at once, more than {n} (token {} among them)",
                        a.token
                    ));
                }
            }
            // Two shared holds (readers, permits) granted together may
            // return to their clients in either order; any other pair is
            // ordered by the store: the later one waited for the earlier.
            // An upgrade keeps its upgradeable hold's token (its place):
            // a reader granted beside that hold may have a larger one.
            // Readers fence nothing; writes stay ordered. Nor is an
            // upgrade held against its own read hold (the same token; the
            // read hold's belief may end at the session's deadline a
            // moment before the upgrade's grant is recorded).
            for b in &hs[i + 1..] {
                if shared(a.kind, b.kind)
                    || (a.kind == Held::Read && b.upgrade_of.is_some())
                    || b.upgrade_of == Some(a.id)
                    || a.upgrade_of == Some(b.id)
                {
                    continue;
                }
                if b.acquired > end(a) && b.token <= a.token {
                    out.push(format!(
                        "{name}: token {} ({:?}, client {}) granted after a hold with token {} ({:?}, client {}) had ended; {}",
                        b.token,
                        b.kind,
                        b.client,
                        a.token,
                        a.kind,
                        a.client,
                        timeline(a, b, &forced, now)
                    ));
                }
            }
        }
        // A fenced write the store accepted although a hold with a larger
        // token had been granted before it was sent: the writer's entry
        // was no longer the holder's when the store checked it.
        for w in sh.log.fenced.lock().unwrap().iter() {
            if !w.accepted || w.name != name {
                continue;
            }
            if let Some(h) = holds.iter().find(|h| {
                h.name == name
                    && h.kind == Held::Exclusive
                    && h.token > w.token
                    && h.acquired <= w.sent
            }) {
                out.push(format!(
                    "{name}: the store accepted a fenced write of token {} by client {} sent after token {} was granted to client {} (sent +{} ms, answered +{} ms from that grant)",
                    w.token,
                    w.client,
                    h.token,
                    h.client,
                    (w.sent - h.acquired).as_millis(),
                    (w.answered - h.acquired).as_millis()
                ));
            }
        }
        // A write accepted with a token lower than a hold already begun.
        let reg = &sh.registers[name];
        for w in reg.log().iter().filter(|w| w.accepted) {
            if hs
                .iter()
                .any(|h| h.kind == Held::Exclusive && h.token > w.token && h.acquired <= w.at)
            {
                out.push(format!(
                    "{name}: the register accepted a stale write of token {} by {}",
                    w.token, w.holder
                ));
            }
        }
    }
    out
}

/// Both holds and the forced faults, in ms from the second grant (what a
/// violation report needs to tell a bug from a slow machine).
fn timeline(a: &Hold, b: &Hold, forced: &[(Instant, Instant, Forced)], now: Instant) -> String {
    let ms = |t: Instant| {
        let (d, sign) = if t >= b.acquired {
            (t - b.acquired, "+")
        } else {
            (b.acquired - t, "-")
        };
        format!("{sign}{}", d.as_millis())
    };
    let hold = |h: &Hold| {
        format!(
            "client {}: called {}, granted {}, ended {} ({})",
            h.client,
            ms(h.started),
            ms(h.acquired),
            ms(h.ended.unwrap_or(now)),
            h.why
        )
    };
    let faults: Vec<String> = forced
        .iter()
        .map(|(at, done, whom)| format!("{whom:?} {}..{}", ms(*at), ms(*done)))
        .collect();
    format!(
        "ms from the second grant: {}; {}; forced faults: [{}]",
        hold(a),
        hold(b),
        faults.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(client: usize, started: Instant, acquired: Instant) -> Hold {
        Hold {
            name: "m1",
            client,
            kind: Held::Exclusive,
            count: 1,
            token: 1,
            started,
            acquired,
            ended: None,
            why: "still held",
            forced: false,
            upgrade_of: None,
            id: 0,
        }
    }

    /// An upgrade recorded as granted a moment after its read hold's
    /// belief ended (the session's deadline) is not a token going back;
    /// a writer of another client with that token would be.
    #[test]
    fn an_upgrade_is_not_held_against_its_own_read_hold() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let sh = Shared::new(&["m1"], HashMap::new(), Vec::new());
        {
            let mut holds = sh.log.holds.lock().unwrap();
            let mut read = hold(0, ms(0), ms(1));
            read.kind = Held::Upgradeable;
            read.ended = Some(ms(50));
            let mut up = hold(0, ms(40), ms(51));
            up.id = 1;
            up.upgrade_of = Some(0);
            up.ended = Some(ms(50));
            holds.extend([read, up]);
        }
        assert_eq!(check(&sh), Vec::<String>::new());
        sh.log.holds.lock().unwrap()[1].upgrade_of = None;
        let found = check(&sh);
        assert!(
            found
                .iter()
                .any(|v| v.contains("granted after a hold with token")),
            "{found:?}"
        );
    }

    #[test]
    fn a_forced_fault_cuts_holds_it_found_and_spares_later_ones() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let log = Log::default();
        log.holds.lock().unwrap().extend([
            hold(2, ms(0), ms(5)),   // held when the kill was called
            hold(2, ms(60), ms(70)), // called after the kill's answer
            hold(1, ms(0), ms(5)),   // another client
        ]);
        log.force(ms(10), ms(50), Forced::Client(2));
        let h = log.settled(ms(100));
        assert_eq!((h[0].ended, h[0].forced), (Some(ms(10)), false));
        assert_eq!((h[1].ended, h[1].forced), (None, false));
        assert_eq!((h[2].ended, h[2].forced), (None, false));
    }

    // A kill's revoke is applied somewhere between its call and its
    // answer: a hold acquired in between may have been granted before it
    // and lost to it, so it is not held against the lock (it was, and
    // a false "two holders" came out of a loaded run).
    #[test]
    fn a_hold_begun_while_a_forced_fault_was_in_flight_is_not_a_belief() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let log = Log::default();
        log.holds.lock().unwrap().push(hold(2, ms(20), ms(30)));
        log.force(ms(10), ms(50), Forced::Client(2));
        let h = log.settled(ms(100));
        assert!(h[0].forced, "{:?}", h[0]);
    }
}
