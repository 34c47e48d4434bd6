//! A redirect is not followed: every request carries the ACL token
//! (`X-Consul-Token`, a header that an HTTP client keeps across a
//! redirect to another host, unlike `Authorization`), so following one
//! would send the token, and the write, to whatever address the answer
//! names. No Consul agent redirects; a proxy in front of one, or anyone
//! on the path of plain HTTP, can. Here an address that answers every
//! request with a redirect to a second address, which records what
//! reaches it.

use std::sync::{Arc, Mutex};

use quorumlock_core::ErrorKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const TOKEN: &str = "a-token-for-the-agent-only";

type Answer = Arc<dyn Fn(&str) -> String + Send + Sync>;
type Heads = Arc<Mutex<Vec<String>>>;

/// An address on loopback that answers each request with `answer(head)`,
/// and the request heads it has read.
async fn listen(answer: impl Fn(&str) -> String + Send + Sync + 'static) -> (u16, Heads) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Heads::default();
    tokio::spawn(serve(listener, heads.clone(), Arc::new(answer)));
    (port, heads)
}

/// An HTTP/1.1 answer with `status`, the `headers` lines and `body`.
fn response(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Answers each connection's requests with `answer(head)` until it
/// closes, and keeps every request head it read.
async fn serve(listener: TcpListener, heads: Heads, answer: Answer) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            return;
        };
        let (heads, answer) = (heads.clone(), answer.clone());
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    continue;
                };
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                // A request body (a txn's) is read and dropped.
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                while buf.len() < end + 4 + length {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                buf.drain(..end + 4 + length);
                let reply = answer(&head);
                heads.lock().unwrap().push(head);
                if conn.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_token_stays_with_the_address_given() {
    // A leader, so that a client that got here would go on.
    let (elsewhere_port, reached) = listen(|_| {
        response(
            "200 OK",
            "Content-Type: application/json\r\nX-Consul-Index: 1\r\n",
            "\"127.0.0.1:8300\"",
        )
    })
    .await;
    let (port, asked) = listen(move |head| {
        let path = head.split(' ').nth(1).unwrap_or("/");
        let to = format!("Location: http://127.0.0.1:{elsewhere_port}{path}\r\n");
        response("307 Temporary Redirect", &to, "")
    })
    .await;

    let url = format!("consul://127.0.0.1:{port}/redirect?token={TOKEN}&connect_timeout=3s");
    let connected = quorumlock_consul::ConsulBackend::connect(&url).await;
    assert!(
        !asked.lock().unwrap().is_empty(),
        "the client asked the address it was given"
    );
    let reached = reached.lock().unwrap().clone();
    let with_token = reached
        .iter()
        .filter(|h| {
            h.to_ascii_lowercase()
                .contains(&format!("x-consul-token: {TOKEN}"))
        })
        .count();
    assert!(
        reached.is_empty(),
        "the redirect was followed: {} request(s) reached the other address, {with_token} with the token: {:?}",
        reached.len(),
        reached.first().map(|h| h.lines().next())
    );
    let e =
        connected.expect_err("an address that answers with a redirect is not a Consul agent's API");
    assert_eq!(e.kind(), ErrorKind::Store, "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(text.contains("redirect"), "{text}");
    assert!(!text.contains(TOKEN), "the token is shown: {text}");
}
