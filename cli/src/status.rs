//! `status`, `revoke` and `break`.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use quorumlock::{Contender, Follow, LockClient, LockKind, LockState};
use serde_json::{json, Value};

use super::exit::{self, Failure};
use super::{human, StatusArgs};

/// Runs `quorumlock status`.
///
/// # Cancel safety
/// Read-only; safe to drop.
pub async fn status(client: &LockClient, args: &StatusArgs) -> Result<u8, Failure> {
    if args.watch {
        let mut signals = super::lock::Signals::install()?;
        return watch(client, args, &mut signals).await;
    }
    let state = client.inspect(&args.name).await?;
    let store = client.backend().describe();
    let now = SystemTime::now();
    let text = if args.json {
        format!("{}\n", to_json(&state, &store, now))
    } else {
        to_text(&state, &store, now)
    };
    out(&text);
    Ok(exit::OK)
}

/// Runs `quorumlock status --watch`: reads the lock after each change the
/// store notifies (or every `--interval`) and prints a line when its
/// holders change (the first read too), until a signal ends it with 0. A
/// failed read is logged and the watch goes on.
///
/// # Cancel safety
/// Read-only; safe to drop.
async fn watch(
    client: &LockClient,
    args: &StatusArgs,
    signals: &mut super::lock::Signals,
) -> Result<u8, Failure> {
    let follow = args.interval.map_or(Follow::Notifications, Follow::Poll);
    let states = client.watch(&args.name, follow)?;
    tokio::pin!(states);
    let mut last: Option<Vec<(String, u64, Vec<u8>)>> = None;
    loop {
        let state = tokio::select! {
            next = states.next() => match next {
                Some(Ok(state)) => state,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "reading the lock failed");
                    continue;
                }
                None => return Ok(exit::OK),
            },
            sig = signals.recv() => {
                tracing::info!(signal = sig, "watch stopped");
                return Ok(exit::OK);
            }
        };
        let holders: Vec<(String, u64, Vec<u8>)> = state
            .holders
            .iter()
            .map(|h| (h.session.clone(), h.token, h.value.clone()))
            .collect();
        if last.as_ref() != Some(&holders) {
            let now = SystemTime::now();
            let line = if args.json {
                let mut v = to_json(&state, &client.backend().describe(), now);
                v["time_unix_ms"] = json!(unix_ms(now));
                format!("{v}\n")
            } else {
                change_line(&state, now)
            };
            out(&line);
            last = Some(holders);
        }
    }
}

/// One line of `status --watch`: the time and who holds the lock now.
pub fn change_line(state: &LockState, now: SystemTime) -> String {
    let time = humantime::format_rfc3339_seconds(now);
    if state.holders.is_empty() {
        return format!(
            "{time}  {}  free  waiters {}\n",
            state.name,
            state.waiters.len()
        );
    }
    format!(
        "{time}  {}  held by {}  waiters {}\n",
        state.name,
        holders_text(state),
        state.waiters.len()
    )
}

/// The holders as `session S token T (kind)`, then `value "V"` when the
/// holder wrote one, comma separated.
pub fn holders_text(state: &LockState) -> String {
    state
        .holders
        .iter()
        .map(|h| {
            format!(
                "session {} token {} ({}){}",
                h.session,
                h.token,
                kind(h.kind),
                value_suffix(h)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// ` value "V"` (quoted and escaped: a value may hold any bytes), or
/// nothing when the entry has no value.
pub fn value_suffix(c: &Contender) -> String {
    if c.value.is_empty() {
        String::new()
    } else {
        format!(" value {:?}", c.value_text())
    }
}

/// Runs `quorumlock revoke`.
///
/// # Cancel safety
/// One store write; dropping it may or may not have marked the holder.
pub async fn revoke(client: &LockClient, name: &str) -> Result<u8, Failure> {
    if client.request_revoke(name).await? {
        out(&format!("asked the holder of {name} to release it\n"));
    } else {
        out(&format!("{name} is not held\n"));
    }
    Ok(exit::OK)
}

/// Runs `quorumlock break --yes`.
///
/// # Cancel safety
/// Dropping it may or may not have broken the lock.
pub async fn break_lock(client: &LockClient, name: &str) -> Result<u8, Failure> {
    if client.break_lock(name).await? {
        out(&format!(
            "broke {name}: its holder is told that it lost the lock\n"
        ));
    } else {
        out(&format!("{name} is not held\n"));
    }
    Ok(exit::OK)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
pub fn out(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

pub fn kind(k: LockKind) -> String {
    match k {
        LockKind::Exclusive => "exclusive".into(),
        LockKind::Read => "read".into(),
        LockKind::Write => "write".into(),
        LockKind::Semaphore { permits } => format!("semaphore({permits})"),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn age(c: &Contender, now: SystemTime) -> Option<Duration> {
    c.since.and_then(|s| now.duration_since(s).ok())
}

fn unix_ms(t: SystemTime) -> Option<u128> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_millis())
}

/// The JSON form: stable field names, times in Unix milliseconds.
pub fn to_json(state: &LockState, store: &str, now: SystemTime) -> Value {
    let holders: Vec<Value> = state
        .holders
        .iter()
        .map(|h| {
            json!({
                "session": h.session,
                "token": h.token,
                "entry": h.entry,
                "kind": kind(h.kind),
                "value": h.value_text(),
                "since_unix_ms": h.since.and_then(unix_ms),
                "held_for_ms": age(h, now).map(|d| d.as_millis()),
            })
        })
        .collect();
    let waiters: Vec<Value> = state
        .waiters
        .iter()
        .enumerate()
        .map(|(i, w)| {
            json!({
                "position": i + 1,
                "session": w.session,
                "queue_key": w.token,
                "entry": w.entry,
                "kind": kind(w.kind),
                "value": w.value_text(),
                "since_unix_ms": w.since.and_then(unix_ms),
                "waiting_for_ms": age(w, now).map(|d| d.as_millis()),
            })
        })
        .collect();
    json!({
        "name": state.name.as_str(),
        "store": store,
        "held": !state.holders.is_empty(),
        "holders": holders,
        "waiters": waiters,
    })
}

/// The text form, one line per holder and waiter.
pub fn to_text(state: &LockState, store: &str, now: SystemTime) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "lock:    {}", state.name);
    let _ = writeln!(out, "store:   {store}");
    if state.holders.is_empty() {
        let _ = writeln!(out, "holder:  none (free)");
    }
    for h in &state.holders {
        let held = age(h, now).map_or("unknown".to_string(), human);
        let _ = writeln!(
            out,
            "holder:  session {}  token {}  held for {}  ({}, entry {}){}",
            h.session,
            h.token,
            held,
            kind(h.kind),
            h.entry,
            value_suffix(h)
        );
    }
    let _ = writeln!(out, "waiters: {}", state.waiters.len());
    for (i, w) in state.waiters.iter().enumerate() {
        let waited = age(w, now).map_or("unknown".to_string(), human);
        let _ = writeln!(
            out,
            "  {}. session {}  waiting for {}  ({}, entry {}){}",
            i + 1,
            w.session,
            waited,
            kind(w.kind),
            w.entry,
            value_suffix(w)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumlock::LockName;

    fn contender(session: &str, token: u64, ago: u64, now: SystemTime) -> Contender {
        Contender {
            session: session.into(),
            token,
            entry: format!("ns/a/{session}"),
            kind: LockKind::Exclusive,
            since: Some(now - Duration::from_secs(ago)),
            value: format!("host-{session}:7").into_bytes(),
        }
    }

    fn j_value(state: &LockState, now: SystemTime) -> String {
        to_json(state, "mem://", now)["holders"][0]["value"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn text_and_json_show_holder_token_age_and_queue() {
        let now = SystemTime::now();
        let state = LockState {
            name: LockName::new("a").unwrap(),
            holders: vec![contender("s1", 42, 75, now)],
            waiters: vec![contender("s2", 43, 3, now), contender("s3", 44, 1, now)],
        };
        let t = to_text(&state, "mem://x/ns", now);
        assert!(t.contains("session s1  token 42  held for 1m15s"), "{t}");
        assert!(t.contains("entry ns/a/s1) value \"host-s1:7\"\n"), "{t}");
        assert_eq!(j_value(&state, now), "host-s1:7");
        assert!(t.contains("waiters: 2\n  1. session s2"), "{t}");
        assert!(t.contains("  2. session s3"), "{t}");
        let j = to_json(&state, "mem://x/ns", now);
        assert_eq!(j["held"], true);
        assert_eq!(j["holders"][0]["token"], 42);
        assert_eq!(j["holders"][0]["held_for_ms"], 75_000);
        assert_eq!(j["waiters"][1]["position"], 2);
        assert_eq!(j["waiters"][1]["session"], "s3");
        let line = change_line(&state, now);
        assert!(
            line.ends_with(
                "  a  held by session s1 token 42 (exclusive) value \"host-s1:7\"  waiters 2\n"
            ),
            "{line}"
        );
        let free = LockState::free(LockName::new("a").unwrap());
        assert!(change_line(&free, now).ends_with("  a  free  waiters 0\n"));
        assert!(to_text(&free, "mem://", now).contains("none (free)"));
        assert_eq!(to_json(&free, "mem://", now)["held"], false);
    }
}
