//! A one-line spinner on stderr with the queue position, while waiting.

use std::io::Write as _;
use std::time::Duration;

use quorumlock::LockClient;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
const FRAME_EVERY: Duration = Duration::from_millis(100);
const POLL_EVERY: Duration = Duration::from_millis(500);

/// The running spinner; [`Spinner::stop`] clears its line.
pub struct Spinner {
    task: JoinHandle<()>,
}

impl Spinner {
    /// Starts drawing on stderr (call only when stderr is a terminal).
    pub fn start(client: LockClient, name: String) -> Self {
        Spinner {
            task: tokio::spawn(draw(client, name)),
        }
    }

    /// Stops and clears the line.
    ///
    /// # Cancel safety
    /// Cancel safe; the line may then stay on the terminal.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
}

async fn draw(client: LockClient, name: String) {
    let started = Instant::now();
    let mut text = format!("waiting for {name}");
    let mut next_poll = Instant::now();
    for frame in FRAMES.iter().cycle() {
        if Instant::now() >= next_poll {
            next_poll = Instant::now() + POLL_EVERY;
            if let Some(t) = describe(&client, &name).await {
                text = t;
            }
        }
        {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r\x1b[2K{frame} {text} ({})",
                super::human(Duration::from_secs(started.elapsed().as_secs()))
            );
            let _ = err.flush();
        }
        tokio::time::sleep(FRAME_EVERY).await;
    }
}

/// "waiting for NAME: 2nd in line behind session S (token T)".
async fn describe(client: &LockClient, name: &str) -> Option<String> {
    let state = client.inspect(name).await.ok()?;
    let me = client.session_id().await;
    let position = me
        .as_deref()
        .and_then(|me| state.waiters.iter().position(|w| w.session == me))
        .map(|i| i + 1);
    let holder = match state.holders.first() {
        Some(h) => format!("held by session {} (token {})", h.session, h.token),
        None => "free".to_string(),
    };
    Some(match position {
        Some(p) => format!(
            "waiting for {name}: position {p} of {} in the queue, {holder}",
            state.waiters.len()
        ),
        None => format!("waiting for {name}: {holder}"),
    })
}
