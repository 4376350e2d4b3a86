//! Keep-alive HTTP/1.1 connections to backend endpoints, pooled per endpoint address.
//!
//! A connection is handed back to the pool only when the response body it carried has been
//! read to its end (so it is free for the next request); connections closed by the backend
//! are dropped when seen. Upgraded connections (WebSocket) never come back.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The sending half of a backend connection.
pub type Sender = SendRequest<ReqBody>;

/// A request body towards a backend: the client's, streamed, or none (requests rebuilt for a
/// retry carry no body).
pub enum ReqBody {
    Stream(Incoming),
    Empty,
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Stream(b) => Pin::new(b).poll_frame(cx),
            ReqBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Stream(b) => b.is_end_stream(),
            ReqBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Stream(b) => b.size_hint(),
            ReqBody::Empty => SizeHint::with_exact(0),
        }
    }
}

struct Idle {
    tx: Sender,
    since: Instant,
}

/// Idle connections per endpoint.
pub struct Pool {
    idle: Mutex<HashMap<SocketAddr, Vec<Idle>>>,
    pub max_idle_per_endpoint: usize,
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Pool {
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Pool {
        Pool {
            idle: Mutex::new(HashMap::new()),
            max_idle_per_endpoint: 256,
            idle_timeout,
            connect_timeout,
        }
    }

    /// An idle connection to `ep` that is still open, if any (most recently used first), and
    /// how long it has been idle.
    pub fn checkout(&self, ep: SocketAddr) -> Option<(Sender, Duration)> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(&ep)?;
        while let Some(c) = list.pop() {
            let idle_for = c.since.elapsed();
            if !c.tx.is_closed() && idle_for < self.idle_timeout {
                return Some((c.tx, idle_for));
            }
        }
        None
    }

    pub fn checkin(&self, ep: SocketAddr, tx: Sender) {
        if tx.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            let list = idle.entry(ep).or_default();
            if list.len() < self.max_idle_per_endpoint {
                list.push(Idle {
                    tx,
                    since: Instant::now(),
                });
            }
        }
    }

    /// Drops idle connections that are closed, too old, or to endpoints no longer in use.
    pub fn sweep(&self, keep: impl Fn(&SocketAddr) -> bool) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain(|ep, list| {
                if !keep(ep) {
                    return false;
                }
                list.retain(|c| !c.tx.is_closed() && c.since.elapsed() < self.idle_timeout);
                !list.is_empty()
            });
        }
    }

    /// Opens a new connection to `ep`.
    pub async fn connect(&self, ep: SocketAddr) -> std::io::Result<Sender> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(ep))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timeout"))??;
        let _ = stream.set_nodelay(true);
        let (tx, conn) = hyper::client::conn::http1::Builder::new()
            .preserve_header_case(false)
            .max_buf_size(256 * 1024)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::trace!("backend connection: {e}");
            }
        });
        Ok(tx)
    }
}

/// A backend response body that returns its connection to the pool once read to the end.
pub struct PooledBody {
    inner: Incoming,
    done: bool,
    ret: Option<(Arc<Pool>, SocketAddr, Sender)>,
}

impl PooledBody {
    pub fn new(inner: Incoming, pool: Arc<Pool>, ep: SocketAddr, tx: Sender) -> PooledBody {
        PooledBody {
            inner,
            done: false,
            ret: Some((pool, ep, tx)),
        }
    }

    /// A body whose connection is not reused (upgrades).
    pub fn unpooled(inner: Incoming) -> PooledBody {
        PooledBody {
            inner,
            done: false,
            ret: None,
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) => this.done = true,
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.done = true,
            Poll::Ready(Some(Err(_))) => this.ret = None,
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        if (self.done || self.inner.is_end_stream())
            && let Some((pool, ep, tx)) = self.ret.take()
        {
            pool.checkin(ep, tx);
        }
    }
}
