//! `quorumlock lock NAME -- CMD`: run a command while holding a lock.

use std::io::IsTerminal;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::ExitStatus;
use std::task::Poll;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal as Sig};
use nix::unistd::Pid;
use quorumlock::{ErrorKind, LockClient, LockGuard};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use super::exit::{self, Failure};
use super::spinner::Spinner;
use super::LockArgs;

/// The signals whose default action ends a process and that can be
/// caught without harm: forwarded to the command while it runs, and the
/// end of a wait before. Left out: those that cannot be caught (SIGKILL,
/// SIGSTOP), the faults a handler must not return from (SIGSEGV, SIGBUS,
/// SIGILL, SIGFPE, SIGTRAP, SIGSYS), SIGPIPE (ignored by every Rust
/// program, so a `kill -PIPE` does nothing, and caught it would turn a
/// write to a closed pipe into a signal for the command), and those that
/// do not end a process (job control, SIGCHLD, SIGURG, SIGWINCH).
const FORWARDED: &[Sig] = &[
    Sig::SIGHUP,
    Sig::SIGINT,
    Sig::SIGQUIT,
    Sig::SIGABRT,
    Sig::SIGUSR1,
    Sig::SIGUSR2,
    Sig::SIGALRM,
    Sig::SIGTERM,
    Sig::SIGXCPU,
    Sig::SIGXFSZ,
    Sig::SIGVTALRM,
    Sig::SIGPROF,
    Sig::SIGIO,
    #[cfg(any(target_os = "linux", target_os = "android"))]
    Sig::SIGSTKFLT,
    #[cfg(any(target_os = "linux", target_os = "android"))]
    Sig::SIGPWR,
];

/// The realtime signals (SIGRTMIN..=SIGRTMAX), which also end a process
/// by default. No safe interface sends them, so they are not forwarded:
/// one stops the command as a lost lock does.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn realtime() -> impl Iterator<Item = i32> {
    nix::libc::SIGRTMIN()..=nix::libc::SIGRTMAX()
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn realtime() -> impl Iterator<Item = i32> {
    std::iter::empty()
}

/// Every signal that would end this process by default and that it can
/// catch: [`FORWARDED`] and the realtime ones. With these caught,
/// quorumlock never dies of a signal with the lock still held (only of
/// SIGKILL, whose lock goes with the session TTL).
pub struct Signals {
    caught: Vec<(i32, Signal)>,
}

impl Signals {
    /// Installs the handlers: from here on these signals no longer end
    /// this process by themselves.
    pub fn install() -> Result<Self, Failure> {
        let mut caught = Vec::new();
        for &sig in FORWARDED {
            let s = signal(SignalKind::from_raw(sig as i32)).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("cannot install a handler for {sig}: {e}"),
                )
            })?;
            caught.push((sig as i32, s));
        }
        for n in realtime() {
            // Best effort: one tokio refuses is left as it was.
            match signal(SignalKind::from_raw(n)) {
                Ok(s) => caught.push((n, s)),
                Err(e) => tracing::debug!(signal = n, error = %e, "not caught"),
            }
        }
        Ok(Signals { caught })
    }

    /// The number of the next signal received.
    ///
    /// # Cancel safety
    /// Cancel safe: a signal that arrives while nobody waits is kept for
    /// the next call.
    pub async fn recv(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (n, s) in &mut self.caught {
                // `None`: the runtime is shutting down; nothing more comes.
                if let Poll::Ready(Some(())) = s.poll_recv(cx) {
                    return Poll::Ready(*n);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// How long after `--max-hold` and `--grace` the hold limit ends the hold
/// if the command was not stopped and the lock released by then.
const MAX_HOLD_BACKSTOP: Duration = Duration::from_secs(5);

/// `handle` with `value` set by `set`, if one was given.
fn with<T, V>(handle: T, value: Option<V>, set: impl FnOnce(T, V) -> T) -> T {
    match value {
        Some(v) => set(handle, v),
        None => handle,
    }
}

/// What `lock` takes: a mutex, the read or write side of a read-write lock
/// (`--shared`, `--write`), or a semaphore permit (`--permits N`).
enum Target {
    Mutex(quorumlock::Lock),
    Read(quorumlock::RwLock),
    Write(quorumlock::RwLock),
    /// A semaphore and how many of its permits (`--count`).
    Permit(quorumlock::Semaphore, u32),
}

impl Target {
    fn new(client: &LockClient, args: &LockArgs) -> quorumlock::Result<Target> {
        // The holder's value: --value, else the client's (<hostname>:<pid>).
        let v = args.value.clone();
        // `supervise` stops the command at --max-hold and then releases;
        // the hold limit is the backstop should that not happen (a
        // command that SIGKILL does not end, a stalled quorumlock).
        let m = args.max_hold.map(|d| d + args.grace + MAX_HOLD_BACKSTOP);
        Ok(match (args.shared, args.write, args.permits) {
            (true, _, _) => {
                let rw = with(client.rwlock(&args.name)?, v, |l, v| l.with_value(v));
                Target::Read(with(rw, m, |l, d| l.hold_at_most(d)))
            }
            (false, true, _) => {
                let rw = with(client.rwlock(&args.name)?, v, |l, v| l.with_value(v));
                Target::Write(with(rw, m, |l, d| l.hold_at_most(d)))
            }
            (false, false, Some(n)) => {
                let s = with(client.semaphore(&args.name, n)?, v, |s, v| s.with_value(v));
                Target::Permit(
                    with(s, m, |s, d| s.hold_at_most(d)),
                    args.count.unwrap_or(1),
                )
            }
            (false, false, None) => {
                let l = with(client.lock(&args.name)?, v, |l, v| l.with_value(v));
                Target::Mutex(with(l, m, |l, d| l.hold_at_most(d)))
            }
        })
    }

    /// `None` waits forever, zero tries once, else waits at most `timeout`.
    async fn acquire(&self, timeout: Option<Duration>) -> quorumlock::Result<LockGuard> {
        match (self, timeout) {
            (Target::Mutex(l), None) => l.acquire().await,
            (Target::Mutex(l), Some(d)) if d.is_zero() => l.try_acquire().await,
            (Target::Mutex(l), Some(d)) => l.acquire_timeout(d).await,
            (Target::Read(rw), None) => rw.read().await,
            (Target::Read(rw), Some(d)) if d.is_zero() => rw.try_read().await,
            (Target::Read(rw), Some(d)) => rw.read_timeout(d).await,
            (Target::Write(rw), None) => rw.write().await,
            (Target::Write(rw), Some(d)) if d.is_zero() => rw.try_write().await,
            (Target::Write(rw), Some(d)) => rw.write_timeout(d).await,
            (Target::Permit(s, k), None) => s.acquire_many(*k).await,
            (Target::Permit(s, k), Some(d)) if d.is_zero() => s.try_acquire_many(*k).await,
            (Target::Permit(s, k), Some(d)) => s.acquire_many_timeout(*k, d).await,
        }
    }
}

/// Runs `quorumlock lock`.
///
/// # Cancel safety
/// Not cancel safe: it owns a child process; run it to completion.
pub async fn run(client: &LockClient, args: &LockArgs) -> Result<u8, Failure> {
    let mut signals = Signals::install()?;
    run_with(client, args, &mut signals).await
}

/// [`run`] with the signal source given (tests share one).
///
/// # Cancel safety
/// As [`run`].
pub async fn run_with(
    client: &LockClient,
    args: &LockArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    // The two outcomes whose codes the caller chooses (-E, --lost-exit-code).
    run_inner(client, args, signals).await.map_err(|mut f| {
        f.code = match f.code {
            exit::NOT_ACQUIRED => args.conflict_exit_code,
            exit::LOCK_LOST => args.lost_exit_code,
            c => c,
        };
        f
    })
}

async fn run_inner(
    client: &LockClient,
    args: &LockArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let target = Target::new(client, args)?;
    // One read first: an unreachable store fails now with 69 instead of
    // the acquire retrying quietly.
    client.inspect(&args.name).await?;

    let guard = {
        let acquire = target.acquire(args.wait());
        tokio::pin!(acquire);
        // Nothing is drawn for a single try (-n): it says nothing.
        let once = args.wait() == Some(Duration::ZERO);
        let spinner = (std::io::stderr().is_terminal() && !once)
            .then(|| Spinner::start(client.clone(), args.name.clone()));
        if spinner.is_none() {
            tracing::info!(lock = %args.name, "waiting for the lock");
        }
        let outcome = tokio::select! {
            r = &mut acquire => Ok(r),
            sig = signals.recv() => Err(sig),
        };
        if let Some(s) = spinner {
            s.stop().await;
        }
        match outcome {
            Ok(Ok(g)) => g,
            Ok(Err(e)) if e.kind() == ErrorKind::WouldBlock => {
                // As flock -n: only the exit status says it, since cron
                // mails whatever a job prints (`-n -E 0`: skip quietly).
                tracing::info!("{} is held by someone else", args.name);
                return Err(Failure::silent(exit::NOT_ACQUIRED));
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(sig) => {
                // Dropping the acquire abandons our entry in the background;
                // the caller's close() waits for that.
                tracing::info!(signal = sig, "interrupted while waiting");
                return Ok(exit::SIGNAL_BASE + sig as u8);
            }
        }
    };
    tracing::info!(lock = %args.name, token = guard.token(), session = %guard.session_id(), "acquired");
    let native = etcdctl_lock_env(client, &guard);
    supervise(guard, args, &native, signals).await
}

/// What `etcdctl lock NAME CMD` gives its command, on etcd: `ETCD_LOCK_KEY`
/// (the key of our entry, the one etcdctl's own lock would have) and
/// `ETCD_LOCK_REV` (its create revision, which is our fencing token there),
/// so that a script written for etcdctl runs unchanged. Nothing on the
/// other stores, whose native tools give none.
fn etcdctl_lock_env(client: &LockClient, guard: &LockGuard) -> Vec<(&'static str, String)> {
    let store = client.backend().describe();
    if !(store.starts_with("etcd://") || store.starts_with("etcds://")) {
        return Vec::new();
    }
    vec![
        ("ETCD_LOCK_KEY", guard.entry().to_string()),
        ("ETCD_LOCK_REV", guard.token().to_string()),
    ]
}

/// How the command ended, and why.
struct Outcome {
    status: ExitStatus,
    lost: Option<String>,
}

/// Runs the command under `guard`, then releases the lock.
/// `env`: variables the command gets besides `QUORUMLOCK_NAME` and
/// `QUORUMLOCK_TOKEN`.
pub(super) async fn supervise(
    guard: LockGuard,
    args: &LockArgs,
    env: &[(&str, String)],
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let argv = args.program();
    let (program, rest) = argv.split_first().expect("clap requires CMD or -c");
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .env("QUORUMLOCK_NAME", &args.name)
        .env("QUORUMLOCK_TOKEN", guard.token().to_string())
        .envs(env.iter().map(|(k, v)| (k, v)));
    // On a terminal the command stays in our (foreground) process group so
    // that it can read the terminal; otherwise it gets a group of its own
    // and every signal goes to the whole group (shells, pipelines).
    let own_group = !std::io::stdin().is_terminal();
    if own_group {
        cmd.as_std_mut().process_group(0);
    }
    stop_with_parent(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            let msg = format!("cannot run {}: {e}", program.to_string_lossy());
            release(guard, &args.name).await;
            return Err(Failure::new(code, msg));
        }
    };
    let pid = child.id().expect("a child that was just spawned has a pid");
    let pid = Pid::from_raw(pid as i32);
    // The child is not reaped until `wait` below returns, so `pid` is
    // still ours.
    let send = |sig: Sig| {
        let mut sent = if own_group {
            killpg(pid, sig)
        } else {
            kill(pid, sig)
        };
        if sent.is_err() && own_group {
            // The command left its group (setsid): signal it alone.
            sent = kill(pid, sig);
        }
        if let Err(e) = sent {
            tracing::debug!(signal = %sig, error = %e, "kill failed");
        }
    };

    let lost = guard.lost();
    tokio::pin!(lost);
    let revoke = guard.revoke_requested();
    tokio::pin!(revoke);
    let mut lost_reason: Option<String> = None;
    let mut revoked = args.ignore_revoke;
    let mut kill_at: Option<Instant> = None;
    // --max-hold: the command is stopped first, the lock released after.
    let mut hold_end = args.max_hold.map(|d| Instant::now() + d);
    // A realtime signal that stopped the command.
    let mut stopped_by: Option<i32> = None;
    let outcome = loop {
        tokio::select! {
            status = child.wait() => match status {
                Ok(status) => break Outcome { status, lost: lost_reason },
                Err(e) => {
                    // Only if waitpid fails: make sure it is gone.
                    send(Sig::SIGKILL);
                    release(guard, &args.name).await;
                    return Err(Failure::new(exit::SOFTWARE, format!("waiting for the command failed: {e}")));
                }
            },
            sig = signals.recv() => match Sig::try_from(sig) {
                Ok(sig) => {
                    tracing::info!(signal = %sig, "forwarding");
                    send(sig);
                }
                Err(_) => {
                    // Realtime: it would have ended quorumlock, and it
                    // cannot be forwarded, so the command is stopped and
                    // the lock released.
                    if stopped_by.is_none() && kill_at.is_none() {
                        eprintln!(
                            "quorumlock: got signal {sig}; sending SIGTERM to the command, SIGKILL in {}",
                            super::human(args.grace)
                        );
                        send(Sig::SIGTERM);
                        kill_at = Some(Instant::now() + args.grace);
                    }
                    stopped_by.get_or_insert(sig);
                }
            },
            reason = &mut lost, if lost_reason.is_none() => {
                eprintln!(
                    "quorumlock: lock {} lost ({reason}); sending SIGTERM to the command, SIGKILL in {}",
                    args.name,
                    super::human(args.grace)
                );
                send(Sig::SIGTERM);
                kill_at = Some(Instant::now() + args.grace);
                lost_reason = Some(reason.to_string());
            }
            _ = sleep_until(hold_end), if hold_end.is_some() => {
                hold_end = None;
                if lost_reason.is_none() {
                    eprintln!(
                        "quorumlock: --max-hold reached for {}; sending SIGTERM to the command, SIGKILL in {}",
                        args.name,
                        super::human(args.grace)
                    );
                    send(Sig::SIGTERM);
                    kill_at = Some(Instant::now() + args.grace);
                    lost_reason = Some("hold limit reached (--max-hold)".to_string());
                }
            }
            _ = &mut revoke, if !revoked => {
                eprintln!("quorumlock: release of {} requested; sending SIGTERM to the command", args.name);
                send(Sig::SIGTERM);
                revoked = true;
            }
            _ = sleep_until(kill_at), if kill_at.is_some() => {
                eprintln!("quorumlock: the command outlived the grace period; sending SIGKILL");
                send(Sig::SIGKILL);
                kill_at = None;
            }
        }
    };

    let released = guard.release().await;
    if let Some(reason) = outcome.lost {
        return Err(Failure::new(
            exit::LOCK_LOST,
            format!(
                "lock {} was lost while the command ran: {reason}",
                args.name
            ),
        ));
    }
    match released {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::LockLost => {
            // Lost between the command's end and the release: the end of
            // its work may not have been protected.
            return Err(Failure::new(exit::LOCK_LOST, e.to_string()));
        }
        Err(e) => tracing::warn!(error = %e, "release failed; the entry goes with the session"),
    }
    if let Some(sig) = stopped_by {
        return Ok(exit::SIGNAL_BASE.saturating_add(sig as u8));
    }
    Ok(status_code(outcome.status))
}

/// If quorumlock itself dies (SIGKILL, OOM killer), nobody watches the
/// lock any more: have the kernel send the command SIGTERM (Linux).
#[cfg(target_os = "linux")]
fn stop_with_parent(cmd: &mut tokio::process::Command) {
    use nix::errno::Errno;
    use nix::sys::prctl::set_pdeathsig;
    use nix::unistd::getppid;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls prctl(2) and getppid(2), which are async-signal-safe, through
    // nix wrappers that allocate nothing (an error is an errno, made an
    // io::Error without allocating).
    unsafe {
        cmd.as_std_mut().pre_exec(move || {
            set_pdeathsig(Sig::SIGTERM)?;
            // The parent may have died before prctl took effect: then the
            // command is not run at all. (Not by raising SIGTERM: until
            // exec the child has our handlers, which would swallow it.)
            if getppid() != parent {
                return Err(Errno::ESRCH.into());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn stop_with_parent(_cmd: &mut tokio::process::Command) {}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn release(guard: LockGuard, name: &str) {
    if let Err(e) = guard.release().await {
        tracing::warn!(lock = name, error = %e, "release failed");
    }
}

/// The shell's view of an exit status: the code, or 128 + signal.
pub fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => exit::SIGNAL_BASE.saturating_add(s as u8),
        (None, None) => exit::SOFTWARE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn args(name: &str, cmd: &[&str]) -> LockArgs {
        LockArgs {
            timeout: Some(Duration::from_secs(5)),
            nonblock: false,
            conflict_exit_code: exit::NOT_ACQUIRED,
            lost_exit_code: exit::LOCK_LOST,
            ttl: None,
            max_hold: None,
            grace: Duration::from_millis(300),
            shell_command: None,
            ignore_revoke: false,
            shared: false,
            write: false,
            permits: None,
            count: None,
            value: None,
            name: name.into(),
            argv: cmd.iter().map(OsString::from).collect(),
        }
    }

    async fn client(store: &str) -> LockClient {
        quorumlock::connect(&format!("mem://{store}/t"))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn exit_status_and_token_reach_the_caller() {
        let c = client("lock-status").await;
        let mut s = Signals::install().unwrap();
        let a = args(
            "a",
            &["sh", "-c", "test -n \"$QUORUMLOCK_TOKEN\" && exit 7"],
        );
        assert_eq!(run_with(&c, &a, &mut s).await.unwrap(), 7);
        assert!(c.inspect("a").await.unwrap().is_free());
        let a = args("a", &["sh", "-c", "kill -9 $$"]);
        assert_eq!(run_with(&c, &a, &mut s).await.unwrap(), 128 + 9);
        let e = run_with(&c, &args("a", &["/nonexistent/cmd"]), &mut s)
            .await
            .unwrap_err();
        assert_eq!(e.code, exit::NOT_FOUND);
        assert!(c.inspect("a").await.unwrap().is_free());
        c.close().await;
    }

    #[tokio::test]
    async fn timeout_is_75_and_leaves_no_waiter() {
        let holder = client("lock-timeout").await;
        let other = client("lock-timeout").await;
        let g = holder.lock("t").unwrap().acquire().await.unwrap();
        let mut s = Signals::install().unwrap();
        let mut a = args("t", &["true"]);
        a.timeout = Some(Duration::from_millis(200));
        assert_eq!(
            run_with(&other, &a, &mut s).await.unwrap_err().code,
            exit::NOT_ACQUIRED
        );
        a.timeout = Some(Duration::ZERO);
        assert_eq!(
            run_with(&other, &a, &mut s).await.unwrap_err().code,
            exit::NOT_ACQUIRED
        );
        other.wait_idle().await;
        assert!(other.inspect("t").await.unwrap().waiters.is_empty());
        g.release().await.unwrap();
        holder.close().await;
        other.close().await;
    }

    #[tokio::test]
    async fn a_broken_lock_stops_the_command_with_76() {
        let holder = client("lock-break").await;
        let admin = client("lock-break").await;
        let mut s = Signals::install().unwrap();
        // The command ignores SIGTERM, so SIGKILL after the grace is needed.
        let a = args("b", &["sh", "-c", "trap '' TERM; sleep 30; sleep 30"]);
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let r = run_with(&holder, &a, &mut s).await;
            (r, started.elapsed())
        });
        let t0 = Instant::now();
        while admin.inspect("b").await.unwrap().holders.is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(5), "never held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(admin.break_lock("b").await.unwrap());
        let (r, took) = task.await.unwrap();
        assert_eq!(r.unwrap_err().code, exit::LOCK_LOST);
        assert!(took < Duration::from_secs(10), "{took:?}");
        admin.close().await;
    }

    #[tokio::test]
    async fn max_hold_stops_a_command_that_runs_on_with_76() {
        let holder = client("lock-max-hold").await;
        let other = client("lock-max-hold").await;
        let mut s = Signals::install().unwrap();
        let mut a = args("h", &["sleep", "30"]);
        a.max_hold = Some(Duration::from_millis(500));
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let r = run_with(&holder, &a, &mut s).await;
            (r, started.elapsed())
        });
        // The next holder gets the lock once the command was stopped at
        // the limit and the lock released, with a larger token.
        let t0 = Instant::now();
        let first = loop {
            if let Some(h) = other.inspect("h").await.unwrap().holders.first() {
                break h.token;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "never held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let g = other
            .lock("h")
            .unwrap()
            .acquire_timeout(Duration::from_secs(10))
            .await
            .unwrap();
        assert!(g.token() > first, "{} after {first}", g.token());
        let (r, took) = task.await.unwrap();
        assert_eq!(r.unwrap_err().code, exit::LOCK_LOST);
        assert!(took < Duration::from_secs(10), "{took:?}");
        g.release().await.unwrap();
        other.close().await;
    }

    #[tokio::test]
    async fn count_takes_several_permits_at_once() {
        let holder = client("lock-count").await;
        let other = client("lock-count").await;
        let g = holder.semaphore("s", 3).unwrap().acquire().await.unwrap();
        let mut s = Signals::install().unwrap();
        let mut a = args("s", &["true"]);
        a.permits = Some(3);
        a.count = Some(3);
        a.timeout = Some(Duration::ZERO);
        assert_eq!(
            run_with(&other, &a, &mut s).await.unwrap_err().code,
            exit::NOT_ACQUIRED,
            "3 of 3 permits taken while one is held"
        );
        a.count = Some(2);
        a.argv = ["sh", "-c", "exit 4"].iter().map(OsString::from).collect();
        assert_eq!(run_with(&other, &a, &mut s).await.unwrap(), 4);
        other.wait_idle().await;
        assert_eq!(other.inspect("s").await.unwrap().holders.len(), 1);
        g.release().await.unwrap();
        holder.close().await;
        other.close().await;
    }

    #[tokio::test]
    async fn a_revoke_request_sends_sigterm() {
        let holder = client("lock-revoke").await;
        let admin = client("lock-revoke").await;
        let mut s = Signals::install().unwrap();
        let a = args(
            "r",
            &[
                "sh",
                "-c",
                "trap 'exit 3' TERM; while :; do sleep 0.05; done",
            ],
        );
        let task = tokio::spawn(async move { run_with(&holder, &a, &mut s).await });
        let t0 = Instant::now();
        while admin.inspect("r").await.unwrap().holders.is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(5), "never held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(admin.request_revoke("r").await.unwrap());
        assert_eq!(task.await.unwrap().unwrap(), 3);
        admin.close().await;
    }
}
