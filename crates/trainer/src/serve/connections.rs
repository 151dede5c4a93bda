//! The connections: accepted, limited, timed and closed here, with hyper directly (axum's own
//! `serve` sets no limit and no timeout, and a client could hold the server's descriptors,
//! memory and workers for as long as it liked).
//!
//! - At most `max_connections` at once; one more is answered 503 and closed at once.
//! - A request's head must arrive within `header_timeout` of the connection being ready for it
//!   (opened, or its last answer sent: an idle keep-alive connection closes then too), and be
//!   at most [`MAX_HEAD_BYTES`] (431 beyond).
//! - A client that takes none of its answer for `write_timeout` is cut off ([`WriteDeadline`]):
//!   its generation then stops at the next token and frees its worker.
//! - The body's own deadline is a middleware in `routes.rs`, where its 408 can be written.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::{Either, select};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Sleep;

use super::stats::Stats;

/// The largest request head (request line and headers) a connection may buffer.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The kernel's send buffer for each connection (Linux doubles it). Autotuned, it grows to
/// megabytes: memory a client that stops reading holds, and time the server takes to notice
/// that it has. Answers are streams of small events; this is plenty for them.
const SEND_BUFFER: usize = 128 * 1024;

/// How long to wait before accepting again after a failure: connections closing free
/// descriptors, and a busy loop would only burn a core meanwhile.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What one client may hold, and for how long.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once; beyond, 503 and closed.
    pub max_connections: usize,
    /// From a connection being ready for a request to its whole head having arrived.
    pub header_timeout: Duration,
    /// From a request's head to its whole body having arrived (408 beyond).
    pub body_timeout: Duration,
    /// How long a client may take none of its answer before it is cut off.
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Accepts and serves connections until `stopping` turns true, then lets each finish its
/// request in flight and returns once all are closed. Dropping the future drops them all.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    stats: Arc<Stats>,
    mut stopping: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut failing = false;
    loop {
        let accepted = match select(
            Box::pin(listener.accept()),
            Box::pin(async {
                let _ = stopping.wait_for(|&stop| stop).await;
            }),
        )
        .await
        {
            Either::Left((accepted, _)) => accepted,
            Either::Right(_) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                if std::mem::take(&mut failing) {
                    eprintln!("serve: accepting connections again");
                }
                stream
            }
            // One connection that went wrong before it was taken: take the next.
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    eprintln!(
                        "serve: cannot accept a connection ({e}); retrying until connections close"
                    );
                }
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let connection = Connection {
                    router: router.clone(),
                    limits: limits.clone(),
                    stats: stats.clone(),
                    _slot: slot,
                };
                tokio::spawn(connection.serve(stream, stopping.clone()));
            }
            Err(_) => refuse(stream, &stats),
        }
    }
    // Every slot back means every connection closed.
    let _ = slots.acquire_many(limits.max_connections as u32).await;
}

/// One more connection than allowed: a 503 if its socket takes it at once, then closed.
fn refuse(stream: TcpStream, stats: &Stats) {
    stats.connections_refused.fetch_add(1, Ordering::Relaxed);
    let _ = stream.try_write(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\
          Content-Length: 0\r\n\r\n",
    );
}

/// An accepted connection, holding one of the `max_connections` slots until it closes.
struct Connection {
    router: axum::Router,
    limits: ConnectionLimits,
    stats: Arc<Stats>,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    async fn serve(self, stream: TcpStream, mut stopping: watch::Receiver<bool>) {
        let _ = stream.set_nodelay(true);
        limit_send_buffer(&stream);
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let io = WriteDeadline::new(stream, self.limits.write_timeout, self.stats.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(MAX_HEAD_BYTES);
        let service = TowerToHyperService::new(self.router.clone());
        let mut connection = Box::pin(builder.serve_connection(TokioIo::new(io), service));
        let stop = Box::pin(async move {
            let _ = stopping.wait_for(|&stop| stop).await;
        });
        let result = match select(connection.as_mut(), stop).await {
            Either::Left((result, _)) => result,
            Either::Right((_, _)) => {
                // Stopping: finish the request in flight, take no other.
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(e) = result
            && e.is_timeout()
        {
            self.stats.header_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(unix)]
fn limit_send_buffer(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let size = SEND_BUFFER as libc::c_int;
    // SAFETY: a valid socket, and the option's value read from a live c_int of its size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(not(unix))]
fn limit_send_buffer(_: &TcpStream) {}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A socket whose writes fail once the client has taken nothing for `limit`: the answer's
/// stream then ends, its event channel closes, and the worker generating for it stops.
pub(crate) struct WriteDeadline {
    inner: TcpStream,
    limit: Duration,
    /// Running while a write waits on a full socket; gone once one goes through.
    waiting: Option<Pin<Box<Sleep>>>,
    stats: Arc<Stats>,
}

impl WriteDeadline {
    fn new(inner: TcpStream, limit: Duration, stats: Arc<Stats>) -> Self {
        Self {
            inner,
            limit,
            waiting: None,
            stats,
        }
    }

    /// `poll`, with a wait on the client bounded by the deadline.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Ready(done) => {
                self.waiting = None;
                Poll::Ready(done)
            }
            Poll::Pending => {
                let limit = self.limit;
                let waiting = self
                    .waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.stats.write_timeouts.fetch_add(1, Ordering::Relaxed);
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client took nothing of its answer for --write-timeout",
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.bounded(cx, |inner, cx| inner.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.bounded(cx, |inner, cx| inner.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, |inner, cx| inner.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, |inner, cx| inner.poll_shutdown(cx))
    }
}
