//! `quorumlock elect`: run a command while leader, or print the leaders.

use futures::StreamExt;
use quorumlock::{ErrorKind, LockClient};

use super::exit::{self, Failure};
use super::lock::Signals;
use super::status::out;
use super::{ElectArgs, LockArgs};

/// Runs `quorumlock elect`.
///
/// # Cancel safety
/// Not cancel safe when campaigning: it owns a child process; run it to
/// completion.
pub async fn run(client: &LockClient, args: &ElectArgs) -> Result<u8, Failure> {
    let mut signals = Signals::install()?;
    let election = client.election(&args.name)?;
    // One read first: an unreachable store fails now with 69.
    election.leader().await?;
    if args.listen {
        return listen(&election, &mut signals).await;
    }
    let value = args
        .value
        .clone()
        .map_or_else(quorumlock::default_value, String::into_bytes);
    let campaign = async {
        match args.timeout {
            Some(d) => election.campaign_timeout(value, d).await,
            None => election.campaign(value).await,
        }
    };
    let leader = tokio::select! {
        r = campaign => match r {
            Ok(g) => g,
            Err(e) if e.kind() == ErrorKind::Timeout => {
                return Err(Failure::new(exit::NOT_ACQUIRED, e.to_string()))
            }
            Err(e) => return Err(e.into()),
        },
        sig = signals.recv() => {
            tracing::info!(signal = sig, "interrupted while campaigning");
            return Ok(exit::SIGNAL_BASE + sig as u8);
        }
    };
    tracing::info!(election = %args.name, token = leader.token(), "elected");
    // From here on exactly as `lock -- CMD`.
    let as_lock = LockArgs {
        timeout: None,
        nonblock: false,
        conflict_exit_code: exit::NOT_ACQUIRED,
        lost_exit_code: args.lost_exit_code,
        ttl: None,
        max_hold: None,
        grace: args.grace,
        shell_command: None,
        ignore_revoke: false,
        shared: false,
        write: false,
        permits: None,
        count: None,
        value: None,
        name: args.name.clone(),
        argv: args.argv.clone(),
    };
    super::lock::supervise(leader.into_guard(), &as_lock, &[], &mut signals)
        .await
        .map_err(|mut f| {
            if f.code == exit::LOCK_LOST {
                f.code = args.lost_exit_code;
            }
            f
        })
}

/// Prints the leader now and at each change (`VALUE<TAB>TOKEN`, an empty
/// line when nobody leads) until a signal ends it with 0.
async fn listen(election: &quorumlock::Election, signals: &mut Signals) -> Result<u8, Failure> {
    let stream = election.observe();
    tokio::pin!(stream);
    loop {
        tokio::select! {
            next = stream.next() => match next {
                Some(Ok(Some(l))) => out(&format!("{}\t{}\n", l.value_text(), l.token)),
                Some(Ok(None)) => out("\n"),
                Some(Err(e)) => tracing::warn!(error = %e, "reading the leader failed"),
                None => return Ok(exit::OK),
            },
            sig = signals.recv() => {
                tracing::info!(signal = sig, "listen stopped");
                return Ok(exit::OK);
            }
        }
    }
}
