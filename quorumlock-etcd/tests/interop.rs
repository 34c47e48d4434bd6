//! `etcdctl lock` (Go's `concurrency.Mutex`) and our client on the same
//! name exclude each other: both append "start <who>" / "end <who>" lines
//! to one file inside the lock, and the lines never interleave. Likewise
//! `etcdctl elect` and our elections on one name are one election.
//!
//! Runs against etcd 3.4 (`QUORUMLOCK_TEST_ETCD_URL`, etcdctl from
//! `QUORUMLOCK_ETCDCTL`) and 3.5 (`QUORUMLOCK_TEST_ETCD35_URL`, etcdctl
//! from `QUORUMLOCK_ETCDCTL35`); without the etcdctl variable, `etcdctl`
//! on PATH.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::Harness;
use quorumlock_core::url::Url;
use quorumlock_core::{ErrorKind, LockClient};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;

const ROUNDS: usize = 4;

/// A store under test and the etcdctl to run against it.
struct Target {
    harness: Harness,
    etcdctl: String,
}

fn target(url_var: &str, etcdctl_var: &str) -> Option<Target> {
    let harness = Harness::from_env(url_var, |url| async move {
        Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
    })?;
    let etcdctl = std::env::var(etcdctl_var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "etcdctl".to_string());
    Some(Target { harness, etcdctl })
}

macro_rules! interop_tests {
    ($url_var:literal, $etcdctl_var:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn etcdctl_elect_and_ours_are_one_election() {
            let Some(t) = super::target($url_var, $etcdctl_var) else {
                return;
            };
            super::one_election(&t).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn etcdctl_lock_and_ours_never_overlap() {
            let Some(t) = super::target($url_var, $etcdctl_var) else {
                return;
            };
            super::etcdctl_lock_and_ours_never_overlap(&t).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn our_waiter_behind_etcdctl_holder() {
            let Some(t) = super::target($url_var, $etcdctl_var) else {
                return;
            };
            super::our_waiter_behind_etcdctl_holder(&t).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn etcdctl_waiter_behind_our_holder() {
            let Some(t) = super::target($url_var, $etcdctl_var) else {
                return;
            };
            super::etcdctl_waiter_behind_our_holder(&t).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn etcdctl_on_an_escaped_names_key_excludes_ours() {
            let Some(t) = super::target($url_var, $etcdctl_var) else {
                return;
            };
            super::etcdctl_on_an_escaped_names_key(&t).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn etcdctl_lock_and_our_readers_and_permits_exclude_each_other() {
            let Some(t) = super::target($url_var, $etcdctl_var) else {
                return;
            };
            super::etcdctl_and_our_readers_and_permits(&t).await;
        }
    };
}

mod etcd34 {
    interop_tests!("QUORUMLOCK_TEST_ETCD_URL", "QUORUMLOCK_ETCDCTL");
}

mod etcd35 {
    interop_tests!("QUORUMLOCK_TEST_ETCD35_URL", "QUORUMLOCK_ETCDCTL35");
}

/// The key prefix our client uses for `url` (the URL's whole path, which
/// includes any base path of the test URL): etcdctl's lock name is
/// `<prefix>/<name>`.
fn key_prefix(url: &Url) -> String {
    quorumlock_etcd::EtcdConfig::from_url(url)
        .expect("test URL")
        .namespace
        .to_string()
}

/// `etcdctl` with the endpoint and credentials of `url`.
fn etcdctl(bin: &str, url: &Url) -> Command {
    let config = quorumlock_etcd::EtcdConfig::from_url(url).expect("test URL");
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", config.endpoints.join(",")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let (Some(u), Some(p)) = (&config.user, &config.password) {
        cmd.arg(format!("--user={u}:{}", p.expose()));
    }
    if let Some(ca) = &config.ca {
        cmd.arg(format!("--cacert={}", ca.display()));
    }
    if let Some((cert, key)) = &config.client_cert {
        cmd.arg(format!("--cert={}", cert.display()))
            .arg(format!("--key={}", key.display()));
    }
    cmd
}

/// `etcdctl lock <ns>/<name> -- sh -c '<append start, sleep, append end>'`.
fn etcdctl_lock(
    bin: &str,
    url: &Url,
    ns: &str,
    name: &str,
    file: &Path,
    who: &str,
    hold: Duration,
) -> Command {
    let script = format!(
        "echo 'start {who}' >> '{f}'; sleep {s}; echo 'end {who}' >> '{f}'",
        f = file.display(),
        s = hold.as_secs_f64()
    );
    let mut cmd = etcdctl(bin, url);
    cmd.arg("lock")
        .arg(format!("{ns}/{name}"))
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(script);
    cmd
}

fn append(file: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

fn lines(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Checks that start/end lines come in non-overlapping pairs; returns the
/// rounds per side.
fn check_no_overlap(file: &Path) -> (usize, usize) {
    let ls = lines(file);
    let (mut ours, mut theirs) = (0, 0);
    let mut it = ls.iter();
    while let Some(start) = it.next() {
        let who = start
            .strip_prefix("start ")
            .unwrap_or_else(|| panic!("expected a start line, got {start:?} in {ls:#?}"));
        let end = it
            .next()
            .unwrap_or_else(|| panic!("no end after {start:?} in {ls:#?}"));
        assert_eq!(end, &format!("end {who}"), "holders overlapped: {ls:#?}");
        if who.starts_with("etcdctl") {
            theirs += 1;
        } else {
            ours += 1;
        }
    }
    (ours, theirs)
}

fn temp_file(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "quorumlock-etcd-interop-{tag}-{}",
        uuid::Uuid::new_v4().simple()
    ))
}

async fn run_ok(mut cmd: Command, bin: &str, what: &str) {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} took more than 60 s"))
        .unwrap_or_else(|e| panic!("{what}: cannot run {bin}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn our_rounds(c: LockClient, name: &str, file: PathBuf, rounds: usize, hold: Duration) {
    for r in 0..rounds {
        let g = tokio::time::timeout(Duration::from_secs(60), c.lock(name).unwrap().acquire())
            .await
            .expect("our acquire took more than 60 s")
            .unwrap();
        append(&file, &format!("start ours-{r}"));
        tokio::time::sleep(hold).await;
        assert!(g.is_held());
        append(&file, &format!("end ours-{r}"));
        g.release().await.unwrap();
        // Give the other side a chance to queue.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Several rounds each, concurrently, on the same name and file.
async fn etcdctl_lock_and_ours_never_overlap(t: &Target) {
    let h = &t.harness;
    let case = h.case();
    let url = h.url_for(case.namespace());
    let ours = case.client().await;
    let file = temp_file("rounds");

    let (u, ns, f) = (url.clone(), key_prefix(&url), file.clone());
    let bin = t.etcdctl.clone();
    let theirs = tokio::spawn(async move {
        for r in 0..ROUNDS {
            let cmd = etcdctl_lock(
                &bin,
                &u,
                &ns,
                "shared",
                &f,
                &format!("etcdctl-{r}"),
                Duration::from_millis(150),
            );
            run_ok(cmd, &bin, "etcdctl lock").await;
        }
    });
    our_rounds(
        ours.clone(),
        "shared",
        file.clone(),
        ROUNDS,
        Duration::from_millis(150),
    )
    .await;
    theirs.await.unwrap();

    let (o, t) = check_no_overlap(&file);
    assert_eq!((o, t), (ROUNDS, ROUNDS), "{:#?}", lines(&file));
    let _ = std::fs::remove_file(&file);
    assert!(ours.inspect("shared").await.unwrap().is_free());
    case.finish().await;
}

/// etcdctl holds; our waiter is granted only after etcdctl lets go.
async fn our_waiter_behind_etcdctl_holder(t: &Target) {
    let h = &t.harness;
    let case = h.case();
    let url = h.url_for(case.namespace());
    let ours = case.client().await;
    let file = temp_file("waiter");

    let mut holder = etcdctl_lock(
        &t.etcdctl,
        &url,
        &key_prefix(&url),
        "held",
        &file,
        "etcdctl",
        Duration::from_millis(1500),
    )
    .spawn()
    .expect("spawn etcdctl");
    let start = Instant::now();
    while !lines(&file).contains(&"start etcdctl".to_string()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "etcdctl never got the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let state = ours.inspect("held").await.unwrap();
    assert_eq!(
        state.holders.len(),
        1,
        "etcdctl's key is not seen as the holder: {state:?}"
    );
    assert_eq!(
        ours.lock("held")
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err()
            .kind(),
        quorumlock_core::ErrorKind::WouldBlock
    );
    let g = ours.lock("held").unwrap().acquire().await.unwrap();
    append(&file, "start ours");
    assert_eq!(
        lines(&file).iter().filter(|l| *l == "end etcdctl").count(),
        1,
        "granted while etcdctl held: {:#?}",
        lines(&file)
    );
    append(&file, "end ours");
    g.release().await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), holder.wait())
        .await
        .expect("etcdctl did not exit")
        .unwrap();
    assert!(status.success());
    assert_eq!(check_no_overlap(&file), (1, 1));
    let _ = std::fs::remove_file(&file);
    case.finish().await;
}

/// We hold; `etcdctl lock` waits until we release.
async fn etcdctl_waiter_behind_our_holder(t: &Target) {
    let h = &t.harness;
    let case = h.case();
    let url = h.url_for(case.namespace());
    let ours = case.client().await;
    let file = temp_file("holder");

    let g = ours.lock("ours").unwrap().acquire().await.unwrap();
    append(&file, "start ours");
    let waiter = etcdctl_lock(
        &t.etcdctl,
        &url,
        &key_prefix(&url),
        "ours",
        &file,
        "etcdctl",
        Duration::from_millis(10),
    )
    .spawn()
    .expect("spawn etcdctl");
    let start = Instant::now();
    while ours.inspect("ours").await.unwrap().waiters.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "etcdctl never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        lines(&file),
        vec!["start ours".to_string()],
        "etcdctl got in while we hold"
    );
    append(&file, "end ours");
    g.release().await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), waiter.wait_with_output())
        .await
        .expect("etcdctl was not granted after our release")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(check_no_overlap(&file), (1, 1));
    let _ = std::fs::remove_file(&file);
    case.finish().await;
}

/// Our read-write lock and semaphore keys are contenders for Go's mutex
/// (they are under the prefix it scans), and Go's key is a writer for our
/// readers: `etcdctl lock` waits for two of our readers (and for two
/// semaphore permits), and our reader waits for `etcdctl lock`.
async fn etcdctl_and_our_readers_and_permits(t: &Target) {
    let h = &t.harness;
    let case = h.case();
    let url = h.url_for(case.namespace());
    let (a, b) = (case.client().await, case.client().await);

    for shared in ["rw", "sem"] {
        let file = temp_file(shared);
        let (g1, g2) = if shared == "rw" {
            let r = a.rwlock("rw").unwrap();
            (
                r.read().await.unwrap(),
                b.rwlock("rw").unwrap().read().await.unwrap(),
            )
        } else {
            (
                a.semaphore("sem", 2).unwrap().acquire().await.unwrap(),
                b.semaphore("sem", 2).unwrap().acquire().await.unwrap(),
            )
        };
        append(&file, "start ours");
        let waiter = etcdctl_lock(
            &t.etcdctl,
            &url,
            &key_prefix(&url),
            shared,
            &file,
            "etcdctl",
            Duration::from_millis(10),
        )
        .spawn()
        .expect("spawn etcdctl");
        let start = Instant::now();
        while a.inspect(shared).await.unwrap().waiters.is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcdctl never queued"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        g1.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            lines(&file),
            vec!["start ours".to_string()],
            "etcdctl got in beside our {shared} holder"
        );
        append(&file, "end ours");
        g2.release().await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(30), waiter.wait_with_output())
            .await
            .expect("etcdctl was not granted after our release")
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(check_no_overlap(&file), (1, 1));
        let _ = std::fs::remove_file(&file);
    }

    // etcdctl holds; our reader waits for it.
    let file = temp_file("rw-reader");
    let mut holder = etcdctl_lock(
        &t.etcdctl,
        &url,
        &key_prefix(&url),
        "rw",
        &file,
        "etcdctl",
        Duration::from_millis(1500),
    )
    .spawn()
    .expect("spawn etcdctl");
    let start = Instant::now();
    while !lines(&file).contains(&"start etcdctl".to_string()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "etcdctl never got the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = a.rwlock("rw").unwrap().read().await.unwrap();
    append(&file, "start ours");
    append(&file, "end ours");
    r.release().await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), holder.wait())
        .await
        .expect("etcdctl did not exit")
        .unwrap();
    assert!(status.success());
    assert_eq!(check_no_overlap(&file), (1, 1));
    let _ = std::fs::remove_file(&file);
    case.finish().await;
}

/// A name outside the native characters is one key on the store:
/// `etcdctl lock` on that escaped key (`<ns>/orders/~42`) and our
/// `orders/42` exclude each other, and a native name keeps its own key
/// (`etcdctl lock <ns>/jobs/nightly-1.a:b` meets our `jobs/nightly-1.a:b`).
async fn etcdctl_on_an_escaped_names_key(t: &Target) {
    let h = &t.harness;
    let case = h.case();
    let url = h.url_for(case.namespace());
    let ours = case.client().await;
    for (name, key) in [
        ("orders/42", "orders/~42"),
        ("jobs/nightly-1.a:b", "jobs/nightly-1.a:b"),
    ] {
        assert_eq!(quorumlock_core::LockName::new(name).unwrap().key(), key);
        let file = temp_file("escaped");
        let mut holder = etcdctl_lock(
            &t.etcdctl,
            &url,
            &key_prefix(&url),
            key,
            &file,
            "etcdctl",
            Duration::from_millis(1500),
        )
        .spawn()
        .expect("spawn etcdctl");
        let start = Instant::now();
        while !lines(&file).contains(&"start etcdctl".to_string()) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcdctl never got {key}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let e = ours.lock(name).unwrap().try_acquire().await.unwrap_err();
        assert_eq!(
            e.kind(),
            quorumlock_core::ErrorKind::WouldBlock,
            "{name}: {e}"
        );
        assert_eq!(ours.inspect(name).await.unwrap().holders.len(), 1, "{name}");
        let g = ours.lock(name).unwrap().acquire().await.unwrap();
        append(&file, "start ours");
        append(&file, "end ours");
        g.release().await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), holder.wait())
            .await
            .expect("etcdctl did not exit")
            .unwrap();
        assert!(status.success());
        assert_eq!(check_no_overlap(&file), (1, 1), "{name}");
        let _ = std::fs::remove_file(&file);
    }
    case.finish().await;
}

// `etcdctl elect` (Go's `concurrency.Election`) and our elections on the
// same name are one election: never two leaders at once, each sees the
// other's leader value (`etcdctl elect -l` prints ours, our `leader()`
// reads etcdctl's proposal), and a resign hands over across the two.

fn election_key(url: &Url, name: &str) -> String {
    format!("{}/{name}", key_prefix(url))
}

fn spawn_lines(mut cmd: Command) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = cmd.spawn().expect("spawn etcdctl");
    let out = child.stdout.take().expect("piped stdout");
    (child, BufReader::new(out).lines())
}

/// The next line within `limit`, `None` if there was none by then.
async fn line_within(lines: &mut Lines<BufReader<ChildStdout>>, limit: Duration) -> Option<String> {
    match tokio::time::timeout(limit, lines.next_line()).await {
        Ok(Ok(Some(l))) => Some(l),
        Ok(_) => panic!("etcdctl's output ended"),
        Err(_) => None,
    }
}

/// SIGINT: `etcdctl elect` resigns and exits on it.
async fn interrupt(child: &mut Child) {
    let pid = child.id().expect("running").to_string();
    let ok = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("kill");
    assert!(ok.success());
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("etcdctl elect did not exit on SIGINT")
        .unwrap();
}

async fn one_election(t: &Target) {
    let h = &t.harness;
    let case = h.case();
    let url = h.url_for(case.namespace());
    let (ours, other) = (case.client().await, case.client().await);
    let key = election_key(&url, "leader");
    let election = ours.election("leader").unwrap();

    // 1. We lead; etcdctl campaigns behind us and is not elected.
    let leader = election.campaign("ours-1").await.unwrap();
    let mut cmd = etcdctl(&t.etcdctl, &url);
    cmd.stderr(Stdio::null());
    cmd.args(["elect", &key, "etcdctl-1"]);
    let (mut theirs, mut their_out) = spawn_lines(cmd);
    tokio::time::timeout(Duration::from_secs(20), async {
        while other.inspect("leader").await.unwrap().waiters.len() != 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("etcdctl's candidate never queued behind ours");
    assert_eq!(
        line_within(&mut their_out, Duration::from_millis(1500)).await,
        None,
        "etcdctl elected while we lead"
    );

    // 2. `etcdctl elect -l` sees our leader and its value.
    let mut cmd = etcdctl(&t.etcdctl, &url);
    cmd.stderr(Stdio::null());
    cmd.args(["elect", "-l", &key]);
    let (mut listener, mut listen_out) = spawn_lines(cmd);
    let k = line_within(&mut listen_out, Duration::from_secs(20))
        .await
        .expect("etcdctl elect -l printed no leader");
    let v = line_within(&mut listen_out, Duration::from_secs(5))
        .await
        .expect("etcdctl elect -l printed no value");
    assert!(k.starts_with(&format!("{key}/")), "{k}");
    assert_eq!(v, "ours-1", "etcdctl elect -l does not see our value");

    // 3. We resign: etcdctl leads, prints its key and value; everyone
    // (our leader(), the listener) sees its proposal.
    leader.resign().await.unwrap();
    let elected = line_within(&mut their_out, Duration::from_secs(20))
        .await
        .expect("etcdctl not elected after our resign");
    assert!(elected.starts_with(&format!("{key}/")), "{elected}");
    let now = quorumlock_conformance::support::leader_of(&other, "leader").await;
    assert_eq!(now.value, b"etcdctl-1");
    let mut seen = Vec::new();
    while let Some(l) = line_within(&mut listen_out, Duration::from_secs(10)).await {
        seen.push(l);
        if seen.last().map(String::as_str) == Some("etcdctl-1") {
            break;
        }
    }
    assert_eq!(
        seen.last().map(String::as_str),
        Some("etcdctl-1"),
        "{seen:?}"
    );

    // 4. While etcdctl leads, ours waits; when it resigns, ours leads.
    let e = election.clone();
    let next = tokio::spawn(async move { e.campaign("ours-2").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!next.is_finished(), "two leaders at once");
    assert_eq!(
        election
            .campaign_timeout("x", Duration::from_millis(200))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Timeout
    );
    interrupt(&mut theirs).await;
    let g = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("ours not elected after etcdctl resigned")
        .unwrap()
        .unwrap();
    assert!(g.token() > now.token);
    let mut seen = Vec::new();
    while let Some(l) = line_within(&mut listen_out, Duration::from_secs(10)).await {
        seen.push(l);
        if seen.last().map(String::as_str) == Some("ours-2") {
            break;
        }
    }
    assert_eq!(seen.last().map(String::as_str), Some("ours-2"), "{seen:?}");
    g.resign().await.unwrap();
    listener.kill().await.unwrap();
    case.finish().await;
}
