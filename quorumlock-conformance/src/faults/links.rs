//! Per-link faults inside a three-member cluster, so that one member can be
//! cut from another while both keep serving their clients.
//!
//! Every member advertises one peer address to all the others, so a proxy
//! in front of that address sees every peer's connections alike. Here each
//! member's advertised peer address is a router that tells which member
//! dialed (the process holding the other end of the connection, read from
//! `/proc`: etcd dials from 127.0.0.1 whoever it is) and sends the
//! connection through the [`TcpProxy`] of that one link, sender to
//! receiver. Cutting two members apart blackholes both directions of their
//! link (nothing forwarded or answered, as in a partition; what was sent
//! waits and is delivered when the link heals). Connections whose sender
//! cannot be told (already closed, or from a process that is not a
//! member) pass.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

use super::{NetControl, NetMode, TcpProxy};

/// The members' process ids, as the cluster starts and kills them.
pub(crate) type Pids = Arc<Mutex<[Option<u32>; 3]>>;

/// The routers in front of each member's peer port and the proxy of each
/// link between two members.
#[derive(Debug)]
pub(crate) struct PeerLinks {
    /// `links[from][to]`: the sender's connections to the receiver.
    links: Vec<Vec<Arc<TcpProxy>>>,
    routers: Vec<tokio::task::JoinHandle<()>>,
}

impl PeerLinks {
    /// Listens on `advertised[i]` for member `i`'s peers and forwards to
    /// `listening[i]`, where member `i` listens.
    pub(crate) async fn start(
        advertised: [SocketAddr; 3],
        listening: [SocketAddr; 3],
        pids: Pids,
    ) -> std::io::Result<PeerLinks> {
        let mut links = Vec::new();
        for _from in 0..3 {
            let mut row = Vec::new();
            for to in listening {
                row.push(Arc::new(TcpProxy::start(to).await?));
            }
            links.push(row);
        }
        // Routers already started stop (on drop) if a later one fails.
        let mut started = PeerLinks {
            links,
            routers: Vec::new(),
        };
        for (to, addr) in advertised.into_iter().enumerate() {
            let listener = TcpListener::bind(addr).await?;
            let inbound: Vec<Arc<TcpProxy>> =
                started.links.iter().map(|row| row[to].clone()).collect();
            started.routers.push(tokio::spawn(route(
                listener,
                listening[to],
                inbound,
                pids.clone(),
            )));
        }
        Ok(started)
    }

    /// Blackholes both directions between members `a` and `b`.
    pub(crate) fn cut(&self, a: usize, b: usize) {
        self.links[a][b].set_mode(NetMode::Blackhole);
        self.links[b][a].set_mode(NetMode::Blackhole);
    }

    /// Lets both directions between `a` and `b` pass again.
    pub(crate) fn heal(&self, a: usize, b: usize) {
        self.links[a][b].set_mode(NetMode::Pass);
        self.links[b][a].set_mode(NetMode::Pass);
    }
}

impl Drop for PeerLinks {
    fn drop(&mut self) {
        for r in &self.routers {
            r.abort();
        }
    }
}

/// Accepts the peers of one member and sends each connection through the
/// link of its sender (`inbound[from]`), or straight to `member`.
async fn route(listener: TcpListener, member: SocketAddr, inbound: Vec<Arc<TcpProxy>>, pids: Pids) {
    loop {
        let Ok((mut sock, peer)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let local = sock.local_addr().ok();
        let pids = *pids.lock().expect("poisoned");
        let to = local
            .and_then(|l| sender(peer, l, &pids))
            .map_or(member, |from| inbound[from].addr());
        tokio::spawn(async move {
            if let Ok(mut next) = TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut sock, &mut next).await;
            }
        });
    }
}

/// Which member's process holds the socket at `peer` connected to `local`.
fn sender(peer: SocketAddr, local: SocketAddr, pids: &[Option<u32>; 3]) -> Option<usize> {
    let (SocketAddr::V4(peer), SocketAddr::V4(local)) = (peer, local) else {
        return None;
    };
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let (want_local, want_remote) = (proc_addr(peer), proc_addr(local));
    // Columns: sl, local_address, rem_address, st, queues, tr, retrnsmt,
    // uid, timeout, inode.
    let inode = table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.len() > 9 && cols[1] == want_local && cols[2] == want_remote).then(|| cols[9])
    })?;
    let socket = format!("socket:[{inode}]");
    pids.iter().position(|pid| {
        pid.and_then(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok())
            .is_some_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == socket.as_str())
                })
            })
    })
}

/// An address as `/proc/net/tcp` writes it: the IPv4 address as one
/// native-endian (little-endian here) hex word, the port in hex.
fn proc_addr(a: SocketAddrV4) -> String {
    let [x, y, z, w] = a.ip().octets();
    format!("{w:02X}{z:02X}{y:02X}{x:02X}:{:04X}", a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_addresses_are_written_as_the_kernel_writes_them() {
        let a: SocketAddrV4 = "127.0.0.1:3306".parse().unwrap();
        assert_eq!(proc_addr(a), "0100007F:0CEA");
    }

    /// This process's own connection is found as its own.
    #[tokio::test]
    async fn the_sender_is_the_process_holding_the_other_end() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (_sock, peer) = listener.accept().await.unwrap();
        let me = std::process::id();
        assert_eq!(sender(peer, addr, &[None, Some(me), None]), Some(1));
        assert_eq!(sender(peer, addr, &[None, None, None]), None);
    }
}
