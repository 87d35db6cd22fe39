//! A fault-injecting TCP relay of our own, named as such: this kernel has no `tc netem`, so a
//! flaky link is made by a relay in front of each voter's cluster listener. The voters are told
//! the relay's address as that voter's cluster URL, so every peer reaches it through the relay;
//! mutual TLS passes through untouched (the relay forwards bytes, and a voter checks the name in
//! its peer's certificate, not the address).
//!
//! What it does to the link while a fault holds: delays every chunk (with jitter), stalls (holds
//! every byte, connections left open: a link that says nothing), or resets connections at random
//! (the nearest a TCP stream comes to loss: the peer reconnects and Raft sends again). Bytes in
//! one connection are never reordered, as TCP never would; across connections they are, since
//! each chunk's delay is drawn on its own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the relay does to the bytes through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkFault {
    Clean,
    /// Each chunk waits `ms` plus up to `jitter_ms` more.
    Delay {
        ms: u64,
        jitter_ms: u64,
    },
    /// Nothing passes until the fault ends.
    Stall,
    /// Each chunk resets its connection (both ends, RST) with this chance.
    Reset {
        percent: u64,
    },
}

pub struct Relay {
    pub addr: SocketAddr,
    fault: watch::Sender<LinkFault>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on `ip` (a free port) and forwards every connection to `target`.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        ip: std::net::IpAddr,
        target: SocketAddr,
    ) -> Self {
        let listener = std::net::TcpListener::bind((ip, 0)).expect("bind a relay");
        listener.set_nonblocking(true).expect("nonblocking relay");
        let addr = listener.local_addr().expect("relay address");
        let (fault, watching) = watch::channel(LinkFault::Clean);
        let accept = runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("relay listener");
            while let Ok((inbound, _)) = listener.accept().await {
                let watching = watching.clone();
                tokio::spawn(async move {
                    // A target that does not answer (killed, cut off) closes the inbound side,
                    // as a refused connection would.
                    if let Ok(Ok(outbound)) =
                        tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(target))
                            .await
                    {
                        pipe(inbound, outbound, watching).await;
                    }
                });
            }
        });
        Self {
            addr,
            fault,
            accept,
        }
    }

    pub fn set(&self, fault: LinkFault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Both directions until either ends; then both connections close (reset if the fault said so).
async fn pipe(inbound: TcpStream, outbound: TcpStream, fault: watch::Receiver<LinkFault>) {
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    // Dropping the other direction's halves closes both connections.
    tokio::select! {
        () = forward(in_read, out_write, fault.clone()) => {}
        () = forward(out_read, in_write, fault) => {}
    }
}

/// Copies `from` to `to` under the current fault, until either ends or the fault resets them.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut fault: watch::Receiver<LinkFault>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let now = *fault.borrow_and_update();
            match now {
                LinkFault::Clean => break,
                LinkFault::Delay { ms, jitter_ms } => {
                    let wait = ms + draw(jitter_ms + 1);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    break;
                }
                LinkFault::Stall => {
                    if fault.changed().await.is_err() {
                        return;
                    }
                }
                LinkFault::Reset { percent } => {
                    if draw(100) < percent {
                        // `from` and `to` are halves of the two connections: both close
                        // with RST. (A zero linger never blocks the drop, which is why
                        // tokio deprecates the setter in general.)
                        #[allow(deprecated)]
                        for side in [from.as_ref(), to.as_ref()] {
                            let _ = side.set_linger(Some(Duration::ZERO));
                        }
                        return;
                    }
                    break;
                }
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// A number below `bound`: jitter and reset draws need no seed (process timing is not
/// seeded either), only a spread.
fn draw(bound: u64) -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let mut x = STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce9_b619);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) % bound
}
