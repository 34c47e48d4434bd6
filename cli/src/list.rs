//! `quorumlock list [PREFIX]`: the locks someone holds or waits for.

use std::fmt::Write as _;
use std::time::SystemTime;

use quorumlock::{LockClient, LockKind, LockState};
use serde_json::json;

use super::exit::{self, Failure};
use super::status::{holders_text, kind, out, to_json};
use super::ListArgs;

/// Runs `quorumlock list`.
///
/// # Cancel safety
/// Read-only; safe to drop.
pub async fn run(client: &LockClient, args: &ListArgs) -> Result<u8, Failure> {
    let locks = client.list(&args.prefix).await?;
    let store = client.backend().describe();
    let now = SystemTime::now();
    let text = if args.json {
        let locks: Vec<_> = locks.iter().map(|s| to_json(s, &store, now)).collect();
        let prefix = args.prefix.trim_end_matches('/');
        format!(
            "{}\n",
            json!({ "store": store, "prefix": prefix, "locks": locks })
        )
    } else {
        to_text(&locks)
    };
    out(&text);
    Ok(exit::OK)
}

/// What kind of lock the entries make: a semaphore, a read-write lock
/// (any read or write entry), or a mutex.
pub fn lock_kind(state: &LockState) -> String {
    let all = || state.holders.iter().chain(&state.waiters);
    if let Some(k) = all().find(|c| matches!(c.kind, LockKind::Semaphore { .. })) {
        return kind(k.kind);
    }
    if all().any(|c| matches!(c.kind, LockKind::Read | LockKind::Write)) {
        return "rwlock".into();
    }
    "exclusive".into()
}

/// One line per lock: name, kind, holders, waiters.
pub fn to_text(locks: &[LockState]) -> String {
    let width = locks
        .iter()
        // `{:width$}` pads by characters, not bytes (names may be UTF-8).
        .map(|s| s.name.as_str().chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for s in locks {
        let holders = if s.holders.is_empty() {
            "free".to_string()
        } else {
            format!("held by {}", holders_text(s))
        };
        let _ = writeln!(
            out,
            "{:width$}  {:<13}  {holders}  waiters {}",
            s.name.as_str(),
            lock_kind(s),
            s.waiters.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumlock::{Contender, LockName};

    fn c(session: &str, token: u64, kind: LockKind) -> Contender {
        Contender {
            session: session.into(),
            token,
            entry: format!("e/{session}"),
            kind,
            since: None,
            value: Vec::new(),
        }
    }

    #[test]
    fn one_line_per_lock_with_kind_holders_and_waiters() {
        let locks = vec![
            LockState {
                name: LockName::new("deploy/prod").unwrap(),
                holders: vec![c("s1", 42, LockKind::Exclusive)],
                waiters: vec![c("s2", 43, LockKind::Exclusive)],
            },
            LockState {
                name: LockName::new("db").unwrap(),
                holders: vec![c("s3", 7, LockKind::Read), c("s4", 8, LockKind::Read)],
                waiters: vec![c("s5", 9, LockKind::Write)],
            },
        ];
        let t = to_text(&locks);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "deploy/prod  exclusive      held by session s1 token 42 (exclusive)  waiters 1"
        );
        assert!(lines[1].starts_with("db           rwlock         held by session s3 token 7 (read), session s4 token 8 (read)"), "{t}");
        assert_eq!(to_text(&[]), "");
    }
}
