//! `/healthz` (and `/livez`), as kube-proxy's health server: 200 while no change has waited
//! longer than the timeout for the sync loop, 503 otherwise. The body is JSON with
//! `lastUpdated` and `currentTime`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::sync::{SyncStatus, Tracker};

/// Whether the proxy is healthy: no change pending longer than `timeout`.
pub fn healthy(pending_for: Option<Duration>, timeout: Duration) -> bool {
    pending_for.is_none_or(|p| p <= timeout)
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The status line and body of a health request for `path`.
pub fn respond(path: &str, ok: bool, last: Option<SystemTime>) -> (u16, String) {
    match path.split('?').next().unwrap_or_default() {
        "/healthz" | "/livez" => {
            let body = serde_json::json!({
                "lastUpdated": last.map(rfc3339).unwrap_or_default(),
                "currentTime": rfc3339(SystemTime::now()),
            })
            .to_string();
            (if ok { 200 } else { 503 }, body)
        }
        _ => (404, "404 page not found\n".into()),
    }
}

async fn handle(
    mut s: TcpStream,
    tracker: Arc<Tracker>,
    status: watch::Receiver<SyncStatus>,
    timeout: Duration,
) {
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    let read = async {
        while n < buf.len() {
            match s.read(&mut buf[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    n += k;
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .is_err()
    {
        return;
    }
    let req = String::from_utf8_lossy(&buf[..n]);
    let path = req.split_whitespace().nth(1).unwrap_or("/");
    let ok = healthy(tracker.pending_for(), timeout);
    let last = status.borrow().last_sync;
    let (code, body) = respond(path, ok, last);
    let reason = match code {
        200 => "OK",
        503 => "Service Unavailable",
        _ => "Not Found",
    };
    let ctype = if code == 404 {
        "text/plain; charset=utf-8"
    } else {
        "application/json"
    };
    let resp = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// Binds the health server; returns its address.
pub async fn serve(
    addr: SocketAddr,
    tracker: Arc<Tracker>,
    status: watch::Receiver<SyncStatus>,
    timeout: Duration,
    cancel: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind(addr).await?;
    let local = l.local_addr()?;
    tokio::spawn(async move {
        // Health checks are few; a cap keeps a flood from taking the proxy's descriptors.
        let limiter = ferry_limits::ConnLimiter::new("proxy-healthz", 64);
        let mut acceptor = ferry_limits::Acceptor::new("proxy-healthz");
        loop {
            let (s, _) = tokio::select! {
                _ = cancel.cancelled() => return,
                r = acceptor.accept(&l) => r,
            };
            let Some(permit) = limiter.try_acquire() else {
                continue;
            };
            let (tracker, status) = (tracker.clone(), status.clone());
            tokio::spawn(async move {
                handle(s, tracker, status, timeout).await;
                drop(permit);
            });
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_table() {
        let t = Duration::from_secs(10);
        for (pending, want) in [
            (None, true),
            (Some(Duration::from_secs(1)), true),
            (Some(Duration::from_secs(10)), true),
            (Some(Duration::from_secs(11)), false),
        ] {
            assert_eq!(healthy(pending, t), want, "{pending:?}");
        }
        assert_eq!(respond("/healthz", true, None).0, 200);
        assert_eq!(respond("/healthz?verbose", false, None).0, 503);
        assert_eq!(respond("/livez", true, Some(SystemTime::now())).0, 200);
        assert_eq!(respond("/metrics", true, None).0, 404);
        assert!(respond("/healthz", true, None).1.contains("currentTime"));
    }
}
