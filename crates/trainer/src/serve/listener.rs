//! The listening socket, as axum accepts from it: a failed accept (out of file descriptors,
//! when clients hold more connections than the process may open) is said once and retried
//! after a short pause, instead of ending the server.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// How long to wait before accepting again after a failure: connections closing free
/// descriptors, and a busy loop would only burn a core meanwhile.
const PAUSE: Duration = Duration::from_millis(100);

pub struct Listener {
    inner: TcpListener,
    /// Whether the last accept failed (so that a run of failures is said once).
    failing: bool,
}

impl Listener {
    pub fn new(inner: TcpListener) -> Self {
        Self {
            inner,
            failing: false,
        }
    }
}

impl axum::serve::Listener for Listener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok(accepted) => {
                    if std::mem::take(&mut self.failing) {
                        eprintln!("serve: accepting connections again");
                    }
                    return accepted;
                }
                // One connection that went wrong before it was taken: take the next.
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    if !std::mem::replace(&mut self.failing, true) {
                        eprintln!(
                            "serve: cannot accept a connection ({e}); retrying until \
                             connections close"
                        );
                    }
                    tokio::time::sleep(PAUSE).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
