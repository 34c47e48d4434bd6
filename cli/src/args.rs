//! The command line's arguments (clap), and their help texts.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::exit;

const ABOUT: &str =
    "Distributed locks over ZooKeeper, etcd, Consul, Redis and PostgreSQL, from the shell.";

const LONG_ABOUT: &str = "\
Distributed locks over ZooKeeper, etcd, Consul, Redis and PostgreSQL,
from the shell.

The store is named by a URL (--url or QUORUMLOCK_URL); there is no
default, so a forgotten variable is an error, not a private lock:
  etcd://127.0.0.1:2379/NAMESPACE      zk://127.0.0.1:2181/NAMESPACE
  consul://127.0.0.1:8500/NAMESPACE    redis://127.0.0.1:6379/NAMESPACE
  postgres://USER@127.0.0.1:5432/DATABASE/NAMESPACE
  mem:// (in this process only)
Query options are the backend's, e.g. ?ttl=10s (see --ttl).

Durations: 250ms, 1.5s, 10s, 1m30s, 2h (a bare number is seconds).

Shell completions: `quorumlock completions bash|zsh|fish|elvish|powershell`;
man page: `quorumlock man > quorumlock.1`.";

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "quorumlock",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = exit::HELP,
    propagate_version = true
)]
pub struct Cli {
    /// The store's URL (required by every command that talks to a store).
    /// mem:// lives inside this one process, so it is only useful for
    /// trying `lock` out, and is used only when named.
    #[arg(
        long,
        global = true,
        env = quorumlock::URL_ENV,
        hide_env_values = true,
        value_name = "URL"
    )]
    pub url: Option<String>,

    /// More logs on stderr: -v info, -vv debug, -vvv trace (RUST_LOG
    /// overrides). Secrets in URLs are never printed.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a lock.
    ///
    /// The command comes after `--` (run as is) or as `-c 'shell command'`
    /// (run by `sh -c`, as flock -c does). It gets QUORUMLOCK_NAME and
    /// QUORUMLOCK_TOKEN (the fencing token: pass it to the resource you
    /// write to, so that it can reject writes from an older holder); on
    /// etcd also ETCD_LOCK_KEY and ETCD_LOCK_REV, as etcdctl lock gives.
    /// If the lock is lost while it runs, it gets SIGTERM, then SIGKILL
    /// after --grace, and quorumlock exits with 76 (--lost-exit-code).
    /// When the command ends, the lock is released and its exit status is
    /// passed on; a lock not acquired (-n, --timeout) exits with 75 (-E),
    /// so pick codes your command does not use.
    ///
    /// Signals: every signal that would end quorumlock and can be caught
    /// (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, ...)
    /// is forwarded to the command; the lock is released when the command
    /// ends. A realtime signal, which cannot be forwarded, stops the
    /// command as a lost lock does, and quorumlock exits with 128+N. While
    /// still waiting, any of them ends the wait (128+N, nothing left on
    /// the store). Only SIGKILL leaves the lock held until the session
    /// TTL runs out.
    ///
    /// When stdin is not a terminal the command runs in its own process
    /// group and signals go to the whole group; on a terminal it stays in
    /// the foreground group so that it can read the terminal.
    #[command(after_help = exit::HELP)]
    Lock(LockArgs),

    /// Show who holds a lock, since when, with which token, and who waits.
    #[command(after_help = exit::HELP)]
    Status(StatusArgs),

    /// Ask the holder of a lock to let go (cooperative).
    ///
    /// The holder's guard sees the request; a `quorumlock lock` holder
    /// sends SIGTERM to its command (unless it runs with --ignore-revoke).
    /// The lock stays held until the holder releases it.
    #[command(after_help = exit::HELP)]
    Revoke(NameArg),

    /// Forcibly break a lock: delete the holder's entry (needs --yes).
    ///
    /// The holder's guard reports the lock lost; a `quorumlock lock`
    /// holder stops its command and exits with 76. The next waiter gets
    /// the lock with a higher fencing token. Use it when a holder is stuck;
    /// the old holder may still be running, which is what fencing tokens
    /// are for.
    #[command(name = "break", after_help = exit::HELP)]
    Break(BreakArgs),

    /// Run a command while leader of an election, or print its leaders.
    ///
    /// `elect NAME [VALUE] -- CMD` campaigns with VALUE (default
    /// <hostname>:<pid>) and runs CMD once leader, as `lock` runs it: on
    /// loss of leadership CMD gets SIGTERM, then SIGKILL after --grace,
    /// and quorumlock exits with 76. CMD also gets QUORUMLOCK_NAME and
    /// QUORUMLOCK_TOKEN. `elect --listen NAME` (-l) prints the leader now and
    /// at each change, one line each: `VALUE<TAB>TOKEN`, or an empty line
    /// when nobody leads. On etcd, `etcdctl elect NAME` candidates take
    /// part in the same election; on ZooKeeper, Curator `LeaderLatch`es on
    /// the same path.
    #[command(after_help = exit::HELP)]
    Elect(ElectArgs),

    /// List the locks under a prefix that someone holds or waits for.
    ///
    /// One line per lock: its name, kind, holders (session and fencing
    /// token) and number of waiters. PREFIX covers whole segments:
    /// `deploy` lists `deploy` and `deploy/prod`, not `deployment`; no
    /// PREFIX lists the whole namespace. Free locks are not shown.
    #[command(after_help = exit::HELP)]
    List(ListArgs),

    /// Print a shell completion script for SHELL on stdout.
    ///
    /// E.g. `quorumlock completions bash > /etc/bash_completion.d/quorumlock`
    /// or `quorumlock completions zsh > "${fpath[1]}/_quorumlock"`.
    Completions(CompletionsArgs),

    /// Print the man page (roff) on stdout: `quorumlock man > quorumlock.1`.
    Man,
}

/// Arguments of `lock`.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// Give up after this long (exit 75, see -E); 0 means try once.
    /// E.g. 500ms, 1.5s, 2m, 1m30s; a bare number is seconds.
    /// Default: wait forever.
    #[arg(
        long,
        short = 'w',
        visible_alias = "wait",
        value_name = "D",
        value_parser = parse_duration
    )]
    pub timeout: Option<Duration>,

    /// Do not wait: if the lock is held, exit at once (75, see -E),
    /// printing nothing, as flock -n (-v logs why). The same as
    /// --timeout 0.
    #[arg(short = 'n', long, conflicts_with = "timeout")]
    pub nonblock: bool,

    /// The exit status when the lock is not acquired (held with -n, or
    /// --timeout ran out) instead of 75.
    #[arg(
        short = 'E',
        long,
        value_name = "N",
        default_value_t = exit::NOT_ACQUIRED
    )]
    pub conflict_exit_code: u8,

    /// The exit status when the lock is lost while the command runs
    /// instead of 76.
    #[arg(long, value_name = "N", default_value_t = exit::LOCK_LOST)]
    pub lost_exit_code: u8,

    /// Session TTL: how long the store keeps the lock after this process
    /// stops renewing it. Sets the URL's `ttl` option (replacing a
    /// `session_timeout` on zk://). Ranges: etcd 2s..24h, Consul
    /// 10s..24h, Redis and PostgreSQL 500ms..24h, ZooKeeper at least 5
    /// server ticks (over 20 clamped).
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub ttl: Option<Duration>,

    /// End the hold after this long even if CMD still runs: a hung command
    /// cannot keep the lock for ever. CMD is stopped first (SIGTERM,
    /// SIGKILL after --grace), then the lock is released and the exit
    /// status is 76. Should CMD outlive SIGKILL, the hold ends 5s after
    /// the grace anyway.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub max_hold: Option<Duration>,

    /// After the lock is lost (or a realtime signal came), how long the
    /// command has between SIGTERM and SIGKILL.
    #[arg(long, value_name = "D", value_parser = parse_duration, default_value = "5s")]
    pub grace: Duration,

    /// Run CMD with `sh -c` instead of a command after `--`.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "CMD",
        conflicts_with = "argv"
    )]
    pub shell_command: Option<String>,

    /// Do not send SIGTERM to the command on a cooperative revoke.
    #[arg(long)]
    pub ignore_revoke: bool,

    /// Take the read side of a read-write lock (flock's -s): `--shared`
    /// holders run together; a plain `lock` or `--write` of the same name
    /// waits for all of them and they wait for it. On ZooKeeper this is
    /// Curator's InterProcessReadWriteLock read side.
    #[arg(short = 's', long, conflicts_with_all = ["permits", "write"])]
    pub shared: bool,

    /// Take the write side of a read-write lock: excludes `--shared`
    /// readers, other writers and plain `lock` holders. On ZooKeeper this
    /// is Curator's InterProcessReadWriteLock write side, so Java services
    /// using that recipe on the same path wait for it (a plain `lock` is
    /// a Curator mutex, which Curator's readers do not see).
    #[arg(long, conflicts_with = "permits")]
    pub write: bool,

    /// Take one permit of a semaphore of N: at most N commands hold NAME
    /// at once. Every user of NAME must give the same N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub permits: Option<u32>,

    /// With --permits N: take K of the N permits at once (never some of
    /// them, in arrival order with every other request).
    #[arg(long, value_name = "K", requires = "permits", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: Option<u32>,

    /// The value our entry carries, shown by `status` and `list` as who
    /// holds the lock (on ZooKeeper the node's data, on etcd the key's
    /// value). Default: <hostname>:<pid>.
    #[arg(long, value_name = "TEXT")]
    pub value: Option<String>,

    /// The lock's name: any UTF-8 text up to 200 bytes (`/` nests).
    pub name: String,

    /// The command to run, after `--` (or give -c).
    #[arg(
        last = true,
        required_unless_present = "shell_command",
        value_name = "CMD"
    )]
    pub argv: Vec<OsString>,
}

impl LockArgs {
    /// How long to wait: `None` forever, zero once.
    pub fn wait(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.timeout
        }
    }

    /// The program and its arguments.
    pub fn program(&self) -> Vec<OsString> {
        match &self.shell_command {
            Some(c) => vec!["sh".into(), "-c".into(), c.into()],
            None => self.argv.clone(),
        }
    }
}

/// Arguments of `elect`.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// Print each change of leader instead of campaigning (etcdctl
    /// elect's -l).
    #[arg(short = 'l', long, conflicts_with_all = ["value", "argv", "timeout"])]
    pub listen: bool,

    /// Give up campaigning after this long (exit 75).
    #[arg(long, short = 'w', value_name = "D", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// The exit status when leadership is lost while the command runs
    /// instead of 76.
    #[arg(long, value_name = "N", default_value_t = exit::LOCK_LOST)]
    pub lost_exit_code: u8,

    /// After leadership is lost, how long the command has between SIGTERM
    /// and SIGKILL.
    #[arg(long, value_name = "D", value_parser = parse_duration, default_value = "5s")]
    pub grace: Duration,

    /// The election's name.
    pub name: String,

    /// The value to campaign with (what `--listen` and `etcdctl elect -l`
    /// print). Default: <hostname>:<pid>.
    pub value: Option<String>,

    /// The command to run while leader, after `--`.
    #[arg(last = true, required_unless_present = "listen", value_name = "CMD")]
    pub argv: Vec<OsString>,
}

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of text (with --watch, one object per line).
    #[arg(long)]
    pub json: bool,

    /// Keep going: print a line each time the holders change, following
    /// the store's change notifications, until interrupted (then exit 0).
    #[arg(short = 'w', long)]
    pub watch: bool,

    /// With --watch: read the lock every D instead of following the
    /// store's notifications (a change shorter than D can be missed).
    #[arg(long, value_name = "D", value_parser = parse_duration, requires = "watch")]
    pub interval: Option<Duration>,

    /// The lock's name.
    pub name: String,
}

/// Arguments of `list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// Lock names to list: this name and the names nested under it.
    /// Default: the whole namespace.
    #[arg(default_value = "")]
    pub prefix: String,
}

/// Arguments of `completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// A lone lock name.
#[derive(Debug, Args)]
pub struct NameArg {
    /// The lock's name.
    pub name: String,
}

/// Arguments of `break`.
#[derive(Debug, Args)]
pub struct BreakArgs {
    /// Really break the lock.
    #[arg(long)]
    pub yes: bool,

    /// The lock's name.
    pub name: String,
}

/// `humantime` durations (`250ms`, `1.5s`, `1m30s`), and a bare number of
/// seconds as flock's `-w` takes (`0`, `5`, `0.5`): the library's parser,
/// so that URL options and flags read durations alike.
pub use quorumlock::url::parse_duration;
