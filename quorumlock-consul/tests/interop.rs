//! `consul lock` (Consul's own CLI, Go `api.Lock` underneath) and our
//! client on the same key exclude each other, both ways.
//!
//! Needs `QUORUMLOCK_TEST_CONSUL_URL` and the `consul` binary
//! (`QUORUMLOCK_CONSUL_BIN`, else `consul` on `PATH`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::{Case, Harness};
use quorumlock_core::{ErrorKind, LockClient};
use tokio::process::Command;
use tokio::time::Instant;

const ROUNDS: usize = 4;
const HOLD: Duration = Duration::from_millis(250);

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_CONSUL_URL", |url| async move {
        Ok(Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?) as _)
    })
}

fn consul_bin() -> String {
    std::env::var("QUORUMLOCK_CONSUL_BIN")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "consul".to_string())
}

/// `consul lock` on `<ns>/<name>` (so on `<ns>/<name>/.lock`) running
/// `sh -c script`, against the agent of the case's URL.
fn consul_lock(case: &Case, name: &str, extra: &[&str], script: &str) -> Command {
    let url = case.harness().url_for(case.namespace());
    let addr = format!(
        "{}:{}",
        url.host_str().expect("host"),
        url.port().unwrap_or(quorumlock_consul::DEFAULT_PORT)
    );
    let mut c = Command::new(consul_bin());
    c.arg("lock")
        .arg("-shell=false")
        .args(extra)
        .arg(format!("{}/{name}", case.namespace()))
        .args(["sh", "-c", script])
        .env("CONSUL_HTTP_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

fn scratch(case: &Case, what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ql-consul-{}-{what}", case.namespace()))
}

fn append(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

async fn run_ok(mut cmd: Command, what: &str) {
    let out = cmd.output().await.unwrap_or_else(|e| {
        panic!(
            "running {} failed ({e}); set QUORUMLOCK_CONSUL_BIN",
            consul_bin()
        )
    });
    assert!(
        out.status.success(),
        "{what}: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn wait_for_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Several rounds each of `consul lock` and our client on one key, both
/// appending start/end lines to one file: the lines never interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_lock_and_ours_never_hold_together() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.client().await;
    let log = scratch(&case, "log");
    let _ = std::fs::remove_file(&log);

    let script = format!(
        "echo 'consul start' >> {0}; sleep {1}; echo 'consul end' >> {0}",
        log.display(),
        HOLD.as_secs_f64()
    );
    let theirs = {
        let cmds: Vec<Command> = (0..ROUNDS)
            .map(|_| consul_lock(&case, "shared", &[], &script))
            .collect();
        tokio::spawn(async move {
            for (i, c) in cmds.into_iter().enumerate() {
                run_ok(c, &format!("consul lock round {i}")).await;
            }
        })
    };
    let mine = {
        let (ours, log) = (ours.clone(), log.clone());
        tokio::spawn(async move {
            let lock = ours.lock("shared").unwrap();
            let mut last = 0;
            for _ in 0..ROUNDS {
                let g = tokio::time::timeout(Duration::from_secs(60), lock.acquire())
                    .await
                    .expect("our acquire took over 60 s")
                    .unwrap();
                assert!(g.token() > last, "tokens must increase");
                last = g.token();
                append(&log, "ours start");
                tokio::time::sleep(HOLD).await;
                assert!(g.is_held());
                append(&log, "ours end");
                g.release().await.unwrap();
                // Give `consul lock` (which polls after a release) a chance.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    mine.await.unwrap();
    theirs.await.unwrap();

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * ROUNDS, "{text}");
    for pair in lines.chunks(2) {
        let who = pair[0].strip_suffix(" start").expect(&text);
        assert_eq!(
            pair[1],
            format!("{who} end"),
            "two holders at once:\n{text}"
        );
    }
    let _ = std::fs::remove_file(&log);
    case.finish().await;
}

/// While we hold, `consul lock` waits (and gives up on its timeout without
/// running its command); after our release it gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_lock_waits_for_us() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.client().await;
    let marker = scratch(&case, "ran");
    let _ = std::fs::remove_file(&marker);
    let script = format!("echo ran >> {}", marker.display());

    let g = ours.lock("mine").unwrap().acquire().await.unwrap();
    let mut c = consul_lock(&case, "mine", &["-timeout=1s"], &script);
    let out = c.output().await.expect("running consul lock");
    assert!(!out.status.success(), "consul lock got a lock we hold");
    assert!(
        !marker.exists(),
        "consul lock ran its command while we held the lock"
    );

    // Now a patient one: it runs only after our release.
    let waiting = tokio::spawn({
        let c = consul_lock(&case, "mine", &["-timeout=30s"], &script);
        async move { run_ok(c, "consul lock after our release").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "consul lock ran while we held the lock");
    g.release().await.unwrap();
    waiting.await.unwrap();
    assert!(marker.exists());
    let _ = std::fs::remove_file(&marker);
    case.finish().await;
}

/// While `consul lock` holds, our try-acquire says WouldBlock, inspect
/// shows the foreign holder and our waiter, and our acquire is granted
/// only after its command ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_wait_for_consul_lock() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours: LockClient = case.client().await;
    let (held, done) = (scratch(&case, "held"), scratch(&case, "done"));
    let _ = std::fs::remove_file(&held);
    let _ = std::fs::remove_file(&done);
    let script = format!(
        "touch {}; sleep 1.5; touch {}",
        held.display(),
        done.display()
    );
    let theirs = tokio::spawn({
        let c = consul_lock(&case, "theirs", &[], &script);
        async move { run_ok(c, "consul lock holding").await }
    });
    wait_for_file(&held).await;

    let lock = ours.lock("theirs").unwrap();
    let e = lock
        .try_acquire()
        .await
        .expect_err("try-acquire of a held lock");
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");

    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    let start = Instant::now();
    loop {
        let st = ours.inspect("theirs").await.unwrap();
        if st.waiters.len() == 1 {
            assert_eq!(st.holders.len(), 1, "{st:?}");
            assert_ne!(
                Some(&st.holders[0].session),
                ours.session_id().await.as_ref()
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never queued: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let g = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("not granted after consul lock ended")
        .unwrap()
        .unwrap();
    assert!(
        done.exists(),
        "granted while consul lock's command still ran"
    );
    assert!(g.is_held());
    theirs.await.unwrap();
    g.release().await.unwrap();
    let _ = std::fs::remove_file(&held);
    let _ = std::fs::remove_file(&done);
    case.finish().await;
}

/// A `consul lock -n 2` semaphore on the same prefix is another recipe:
/// its `.lock` has other flags, and our acquire reports a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_prefix_is_a_conflict() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.client().await;
    let held = scratch(&case, "sem");
    let _ = std::fs::remove_file(&held);
    let script = format!("touch {}; sleep 1", held.display());
    let theirs = tokio::spawn({
        let c = consul_lock(&case, "sem", &["-n=2"], &script);
        async move { run_ok(c, "consul lock -n 2").await }
    });
    wait_for_file(&held).await;
    let e = ours
        .lock("sem")
        .unwrap()
        .acquire()
        .await
        .expect_err("acquired a semaphore's prefix as a mutex");
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    theirs.await.unwrap();
    let _ = std::fs::remove_file(&held);
    case.finish().await;
}

/// A `consul lock -n 3` holder takes one of the 3 permits of our
/// semaphore on the same prefix: two of ours hold beside it, a third
/// waits (try-acquire: WouldBlock) until the consul holder ends; a
/// request with another permit count is a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_semaphore_holder_counts_against_ours() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.clients(3).await;
    let (held, done) = (scratch(&case, "sheld"), scratch(&case, "sdone"));
    let _ = std::fs::remove_file(&held);
    let _ = std::fs::remove_file(&done);
    let script = format!(
        "touch {}; sleep 2; touch {}",
        held.display(),
        done.display()
    );
    let theirs = tokio::spawn({
        let c = consul_lock(&case, "pool", &["-n=3"], &script);
        async move { run_ok(c, "consul lock -n 3 holding").await }
    });
    wait_for_file(&held).await;

    let g1 = ours[0]
        .semaphore("pool", 3)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let g2 = ours[1]
        .semaphore("pool", 3)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let sem3 = ours[2].semaphore("pool", 3).unwrap();
    let e = sem3
        .try_acquire()
        .await
        .expect_err("a 4th holder of 3 permits");
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    let e = ours[2]
        .semaphore("pool", 2)
        .unwrap()
        .try_acquire()
        .await
        .expect_err("another permit count");
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    let st = ours[0].inspect("pool").await.unwrap();
    assert_eq!(st.holders.len(), 3, "{st:?}");

    let g3 = tokio::time::timeout(Duration::from_secs(30), sem3.acquire())
        .await
        .expect("not granted after consul lock -n ended")
        .unwrap();
    assert!(
        done.exists(),
        "granted while consul lock's command still ran"
    );
    assert!(g1.is_held() && g2.is_held() && g3.is_held());
    theirs.await.unwrap();
    for g in [g1, g2, g3] {
        g.release().await.unwrap();
    }
    let _ = std::fs::remove_file(&held);
    let _ = std::fs::remove_file(&done);
    case.finish().await;
}

/// Three of ours hold a semaphore of 3: `consul lock -n 3` does not get
/// in (gives up on its timeout without running its command); after one of
/// ours lets go, a patient one runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_semaphore_waits_for_ours() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.clients(3).await;
    let marker = scratch(&case, "sran");
    let _ = std::fs::remove_file(&marker);
    let script = format!("echo ran >> {}", marker.display());
    let mut guards = Vec::new();
    for c in &ours {
        guards.push(c.semaphore("full", 3).unwrap().acquire().await.unwrap());
    }
    let mut c = consul_lock(&case, "full", &["-n=3", "-timeout=1s"], &script);
    let out = c.output().await.expect("running consul lock -n 3");
    assert!(!out.status.success(), "consul lock -n 3 got a 4th permit");
    assert!(!marker.exists(), "consul lock -n 3 ran beside 3 holders");
    // The timed-out run leaves its contender key behind: the CLI exits
    // before it destroys its session, so the key lives until that
    // session's TTL runs out. It shows as a waiter; end its session.
    let st = ours[0].inspect("full").await.unwrap();
    assert_eq!(st.holders.len(), 3, "{st:?}");
    for w in &st.waiters {
        ours[0].backend().kill_session(&w.session).await.unwrap();
    }

    let waiting = tokio::spawn({
        let c = consul_lock(&case, "full", &["-n=3", "-timeout=30s"], &script);
        async move { run_ok(c, "consul lock -n 3 after our release").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "consul lock -n 3 ran beside 3 holders");
    guards.pop().unwrap().release().await.unwrap();
    waiting.await.unwrap();
    assert!(marker.exists());
    for g in guards {
        assert!(g.is_held());
        g.release().await.unwrap();
    }
    let _ = std::fs::remove_file(&marker);
    case.finish().await;
}

/// Several permits of one client count one by one against `consul lock
/// -n`: beside a `consul lock -n 3` holder, one client of ours holds two
/// permits at once and its third owner waits until the consul holder
/// ends; holding all three, it keeps a `consul lock -n 3` out (each permit
/// past the first is held through a permit session of its own, and
/// `consul lock -n` counts holders by session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_permits_count_against_consul_lock_n() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let a = case.client().await;
    let (held, done, ran) = (
        scratch(&case, "mheld"),
        scratch(&case, "mdone"),
        scratch(&case, "mran"),
    );
    for f in [&held, &done, &ran] {
        let _ = std::fs::remove_file(f);
    }
    let script = format!(
        "touch {}; sleep 2; touch {}",
        held.display(),
        done.display()
    );
    let theirs = tokio::spawn({
        let c = consul_lock(&case, "mpool", &["-n=3"], &script);
        async move { run_ok(c, "consul lock -n 3 holding").await }
    });
    wait_for_file(&held).await;
    let sem = a.semaphore("mpool", 3).unwrap();
    let g1 = sem.acquire().await.unwrap();
    let g2 = sem.acquire().await.unwrap();
    let e = sem
        .try_acquire()
        .await
        .expect_err("a 4th holder of 3 permits");
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    let st = a.inspect("mpool").await.unwrap();
    assert_eq!(st.holders.len(), 3, "{st:?}");
    let g3 = tokio::time::timeout(Duration::from_secs(30), sem.acquire())
        .await
        .expect("not granted after consul lock -n ended")
        .unwrap();
    assert!(
        done.exists(),
        "granted while consul lock's command still ran"
    );
    theirs.await.unwrap();

    // All three ours, on one client: consul lock -n 3 stays out.
    let script = format!("echo ran >> {}", ran.display());
    let mut c = consul_lock(&case, "mpool", &["-n=3", "-timeout=1s"], &script);
    let out = c.output().await.expect("running consul lock -n 3");
    assert!(!out.status.success(), "consul lock -n 3 got a 4th permit");
    assert!(
        !ran.exists(),
        "consul lock -n 3 ran beside 3 holders of one client"
    );
    let st = a.inspect("mpool").await.unwrap();
    assert_eq!(st.holders.len(), 3, "{st:?}");
    for w in &st.waiters {
        a.backend().kill_session(&w.session).await.unwrap();
    }
    let waiting = tokio::spawn({
        let c = consul_lock(&case, "mpool", &["-n=3", "-timeout=30s"], &script);
        async move { run_ok(c, "consul lock -n 3 after our release").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ran.exists(), "consul lock -n 3 ran beside 3 holders");
    g3.release().await.unwrap();
    waiting.await.unwrap();
    assert!(ran.exists());
    assert!(g1.is_held() && g2.is_held());
    g1.release().await.unwrap();
    g2.release().await.unwrap();
    for f in [&held, &done, &ran] {
        let _ = std::fs::remove_file(f);
    }
    case.finish().await;
}

/// `consul lock` as a leader guard and our election on the same key are
/// one election: while `consul lock` leads, our candidate waits and our
/// `leader()` names its session; when it ends, ours leads, `consul lock`
/// waits for us, and the key `consul kv get` reads carries our leader's
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_lock_and_our_election_are_one_election() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (ours, other) = (case.client().await, case.client().await);
    let (held, done) = (scratch(&case, "eheld"), scratch(&case, "edone"));
    let script = format!(
        "touch {}; sleep 1.5; touch {}",
        held.display(),
        done.display()
    );
    let theirs = tokio::spawn({
        let c = consul_lock(&case, "leader", &[], &script);
        async move { run_ok(c, "consul lock leading").await }
    });
    wait_for_file(&held).await;
    let leader = other
        .election("leader")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .expect("consul lock's holder is the leader");
    assert_ne!(Some(&leader.session), ours.session_id().await.as_ref());
    let g = tokio::time::timeout(
        Duration::from_secs(30),
        ours.election("leader").unwrap().campaign("ours-1"),
    )
    .await
    .expect("ours not elected after consul lock ended")
    .unwrap();
    assert!(
        done.exists(),
        "elected while consul lock's command still ran"
    );
    theirs.await.unwrap();

    // `consul lock` waits for our leader.
    let (held2, done2) = (scratch(&case, "eheld2"), scratch(&case, "edone2"));
    let script = format!("touch {}; touch {}", held2.display(), done2.display());
    let mut waiting = consul_lock(&case, "leader", &[], &script).spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!held2.exists(), "consul lock ran while we lead");

    // The key's value carries our leader's value.
    let url = case.harness().url_for(case.namespace());
    let addr = format!(
        "{}:{}",
        url.host_str().expect("host"),
        url.port().unwrap_or(quorumlock_consul::DEFAULT_PORT)
    );
    let out = Command::new(consul_bin())
        .args(["kv", "get", &format!("{}/leader/.lock", case.namespace())])
        .env("CONSUL_HTTP_ADDR", addr)
        .output()
        .await
        .unwrap();
    let value = String::from_utf8_lossy(&out.stdout);
    assert!(value.contains(r#""value":"ours-1""#), "{value}");
    let seen = quorumlock_conformance::support::leader_of(&other, "leader").await;
    assert_eq!(seen.value, b"ours-1");

    g.resign().await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), waiting.wait())
        .await
        .expect("consul lock not run after our resign")
        .unwrap();
    assert!(status.success());
    assert!(done2.exists());
    for f in [&held, &done, &held2, &done2] {
        let _ = std::fs::remove_file(f);
    }
    case.finish().await;
}
