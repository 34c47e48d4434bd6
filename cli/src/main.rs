//! `quorumlock`: distributed locks from the shell, on any store.
//!
//! ```text
//! quorumlock lock [-n | -w D] [-E N] [-s | --write | --permits N] NAME -- CMD [ARGS...]
//! quorumlock lock [OPTIONS] NAME -c 'SHELL COMMAND'
//! quorumlock elect NAME [VALUE] -- CMD [ARGS...] | quorumlock elect -l NAME
//! quorumlock status [--json] [--watch] NAME
//! quorumlock list [--json] [PREFIX]
//! quorumlock revoke NAME
//! quorumlock break --yes NAME
//! quorumlock completions SHELL | quorumlock man
//! ```
//!
//! The store is `--url` or `QUORUMLOCK_URL`; there is no default.
//!
//! Run `quorumlock --help` for the exit codes; the guide (`docs/guide.md`)
//! has the whole story.
#![deny(missing_docs)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use quorumlock::LockClient;

mod args;
mod elect;
mod exit;
mod generate;
mod list;
mod lock;
mod spinner;
mod status;

use args::*;
use exit::Failure;

/// Parses the command line, runs it and returns the exit status.
fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            let _ = e.print();
            return ExitCode::from(match e.kind() {
                K::DisplayHelp | K::DisplayVersion => exit::OK,
                _ => exit::USAGE,
            });
        }
    };
    init_logging(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("quorumlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(f) => {
            if !f.message.is_empty() {
                eprintln!("quorumlock: {f}");
            }
            f.code
        }
    };
    runtime.shutdown_timeout(Duration::from_secs(1));
    ExitCode::from(code)
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs one parsed command line.
///
/// # Cancel safety
/// Not cancel safe: `lock` owns a child process and a held lock; dropping
/// this future drops the guard (the release is queued in the background)
/// but does not stop the child. Run it to completion.
pub async fn run(cli: Cli) -> Result<u8, Failure> {
    // Check the name first: a typo must not cost a connection.
    let name = match &cli.command {
        Command::Lock(a) => &a.name,
        Command::Elect(a) => &a.name,
        Command::Status(a) => &a.name,
        Command::Revoke(a) => &a.name,
        Command::Break(a) => &a.name,
        Command::List(a) => {
            let p = a.prefix.strip_suffix('/').unwrap_or(&a.prefix);
            if !p.is_empty() {
                quorumlock::LockName::new(p)?;
            }
            &a.prefix
        }
        Command::Completions(a) => return generate::completions(a.shell),
        Command::Man => return generate::man(),
    };
    if !matches!(cli.command, Command::List(_)) {
        quorumlock::LockName::new(name.as_str())?;
    }
    if let Command::Break(a) = &cli.command {
        if !a.yes {
            return Err(Failure::usage(format!(
                "refusing to break {name} without --yes: its holder may still be \
                 working and will be told it lost the lock (try `quorumlock revoke {name}` \
                 to ask it to let go)"
            )));
        }
    }
    let ttl = match &cli.command {
        Command::Lock(a) => a.ttl,
        _ => None,
    };
    let Some(url) = cli.url.as_deref() else {
        return Err(Failure::usage(
            "no store given: pass --url URL or set QUORUMLOCK_URL \
             (etcd://, zk://, consul://; mem:// only lives inside this one process)",
        ));
    };
    let url = store_url(url, ttl)?;
    let client = connect(&url).await?;
    let result = match &cli.command {
        Command::Lock(a) => lock::run(&client, a).await,
        Command::Elect(a) => elect::run(&client, a).await,
        Command::Status(a) => status::status(&client, a).await,
        Command::Revoke(a) => status::revoke(&client, &a.name).await,
        Command::Break(a) => status::break_lock(&client, &a.name).await,
        Command::List(a) => list::run(&client, a).await,
        Command::Completions(_) | Command::Man => unreachable!("handled above"),
    };
    close(&client).await;
    result
}

/// The store URL with its session TTL option set to `ttl`, if given.
pub fn store_url(url: &str, ttl: Option<Duration>) -> Result<String, Failure> {
    let Some(ttl) = ttl else {
        return Ok(url.to_string());
    };
    let mut u = quorumlock::url::parse(url)?;
    // Every backend takes `ttl`; ZooKeeper's own name for it goes too.
    let pairs: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| !matches!(k.as_ref(), "ttl" | "session_timeout"))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let ttl = if ttl.subsec_millis() == 0 {
        format!("{}s", ttl.as_secs())
    } else {
        format!("{}ms", ttl.as_millis())
    };
    u.query_pairs_mut()
        .clear()
        .extend_pairs(pairs)
        .append_pair("ttl", &ttl);
    Ok(u.to_string())
}

/// Connects, logging the store without secrets.
async fn connect(url: &str) -> Result<LockClient, Failure> {
    if let Ok(u) = quorumlock::url::parse(url) {
        tracing::info!(store = %quorumlock::url::redact(&u), "connecting");
    }
    Ok(quorumlock::connect(url).await?)
}

/// Closes the client, giving up after a few seconds on a dead store (the
/// session then expires by its TTL).
async fn close(client: &LockClient) {
    if tokio::time::timeout(Duration::from_secs(5), client.close())
        .await
        .is_err()
    {
        tracing::warn!("closing the session timed out; it will expire by its TTL");
    }
}

/// Formats a duration for people: `850ms`, `12.3s`, `4m05s`, `2h07m`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s == 0 {
        format!("{}ms", d.as_millis())
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_added_or_replaced() {
        assert_eq!(
            store_url("etcd://127.0.0.1:2379/ns", Some(Duration::from_secs(3))).unwrap(),
            "etcd://127.0.0.1:2379/ns?ttl=3s"
        );
        let u = store_url(
            "consul://h:1/ns?ttl=9s&token=abc",
            Some(Duration::from_millis(1500)),
        )
        .unwrap();
        assert_eq!(u, "consul://h:1/ns?token=abc&ttl=1500ms");
        assert_eq!(store_url("mem://", None).unwrap(), "mem://");
        assert_eq!(
            store_url(
                "zk://h:2181/ns?session_timeout=9s",
                Some(Duration::from_secs(4))
            )
            .unwrap(),
            "zk://h:2181/ns?ttl=4s"
        );
        let e = store_url("not a url", Some(Duration::from_secs(1))).unwrap_err();
        assert_eq!(e.code, exit::USAGE);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(human(Duration::from_secs(245)), "4m05s");
        assert_eq!(human(Duration::from_secs(7620)), "2h07m");
    }

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
