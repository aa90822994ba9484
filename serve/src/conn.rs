//! One HTTP/1.1 connection and its timeouts. A connection is in one of three phases:
//! - reading a request head: from its first byte (or from the accept, for the first request)
//!   the head must be complete within the header timeout;
//! - serving: from the head until the response body has been sent; never cut here, so a long
//!   generation or server-sent-event stream runs as long as it needs (the request body has its
//!   own limit, [`crate::body`]);
//! - idle between requests: closed once idle for the idle timeout.
//!
//! hyper's own `header_read_timeout` starts when it begins waiting for a head, so it would
//! close idle keep-alive connections after the header timeout; this watchdog keeps the two
//! limits apart.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::ServiceExt;

/// A connection's time limits outside of serving a request.
#[derive(Clone, Copy, Debug)]
pub struct ConnTimeouts {
    /// Longest time to receive a request head, from its first byte (from the accept for a
    /// connection's first request).
    pub header: Duration,
    /// Longest time a keep-alive connection waits for its next request.
    pub idle: Duration,
}

/// Serves `app` on one accepted connection until the client closes it, a timeout passes, or
/// a graceful shutdown (through `watcher`) lets its request in flight finish.
pub async fn serve_connection(stream: TcpStream, app: Router, timeouts: ConnTimeouts, watcher: Watcher) {
    let tracker = Arc::new(Tracker::new(timeouts));
    let io = TokioIo::new(Tracked { io: stream, tracker: Arc::clone(&tracker) });
    let svc_tracker = Arc::clone(&tracker);
    let svc = service_fn(move |req: hyper::Request<Incoming>| {
        let guard = Serving::begin(&svc_tracker);
        let app = app.clone();
        async move {
            let resp = app.oneshot(req.map(Body::new)).await?;
            Ok::<_, Infallible>(resp.map(|inner| Body::new(Guarded { inner, _serving: guard })))
        }
    });
    // The head timeout is the watchdog's (hyper's would also cut idle keep-alive connections).
    let conn = watcher.watch(http1::Builder::new().header_read_timeout(None).serve_connection(io, svc));
    tokio::select! {
        r = conn => {
            if let Err(e) = r {
                tracing::debug!("connection ended: {e}");
            }
        }
        phase = tracker.expired() => tracing::debug!("closing a connection: {phase}"),
    }
}

/// Where a connection stands, for its watchdog.
struct Phase {
    /// Requests being served (more than one only if a client pipelines).
    serving: usize,
    /// When the request head now being read began, if one is.
    head_since: Option<Instant>,
    /// When the connection last became idle.
    idle_since: Instant,
}

struct Tracker {
    phase: Mutex<Phase>,
    changed: Notify,
    timeouts: ConnTimeouts,
}

impl Tracker {
    fn new(timeouts: ConnTimeouts) -> Tracker {
        let now = Instant::now();
        // A new connection owes its first head within the header timeout.
        let phase = Phase { serving: 0, head_since: Some(now), idle_since: now };
        Tracker { phase: Mutex::new(phase), changed: Notify::new(), timeouts }
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // The phase is plain data, valid even if a holder panicked.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes arrived: outside of serving, they begin a request head.
    fn on_read(&self) {
        let mut p = self.lock();
        if p.serving == 0 && p.head_since.is_none() {
            p.head_since = Some(Instant::now());
            drop(p);
            self.changed.notify_one();
        }
    }

    /// The deadline now running and what it limits; None while serving.
    fn deadline(&self) -> Option<(Instant, &'static str)> {
        let p = self.lock();
        match (p.serving, p.head_since) {
            (0, Some(t)) => Some((t + self.timeouts.header, "the request head did not arrive in time")),
            (0, None) => Some((p.idle_since + self.timeouts.idle, "idle for too long")),
            _ => None,
        }
    }

    /// Completes when the deadline of the current phase passes.
    async fn expired(&self) -> &'static str {
        loop {
            match self.deadline() {
                Some((at, why)) if Instant::now() >= at => return why,
                Some((at, _)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                // notify_one keeps a permit, so a change made since `deadline` is not missed.
                None => self.changed.notified().await,
            }
        }
    }
}

/// A request being served, from its head until its response body is sent or dropped.
struct Serving(Arc<Tracker>);

impl Serving {
    fn begin(tracker: &Arc<Tracker>) -> Serving {
        let mut p = tracker.lock();
        p.serving += 1;
        p.head_since = None;
        drop(p);
        tracker.changed.notify_one();
        Serving(Arc::clone(tracker))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut p = self.0.lock();
        p.serving = p.serving.saturating_sub(1);
        if p.serving == 0 {
            p.idle_since = Instant::now();
        }
        drop(p);
        self.0.changed.notify_one();
    }
}

/// A response body that keeps its request counted as served until it is sent.
struct Guarded {
    inner: Body,
    _serving: Serving,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, telling the tracker when bytes arrive.
struct Tracked {
    io: TcpStream,
    tracker: Arc<Tracker>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.tracker.on_read();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
