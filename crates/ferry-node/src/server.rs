//! The agent's HTTP endpoint (kubelet's port): `/containerLogs/<ns>/<pod>/<container>` and
//! `/exec/<ns>/<pod>/<container>` (WebSocket, `v5.channel.k8s.io` / `v4.channel.k8s.io`).
//! The API server proxies `pods/log` and `pods/exec` here.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::sync::CancellationToken;

use crate::runtime::{Runtime, exec_command};

type Body = BoxBody<Bytes, Infallible>;

pub struct Endpoint {
    pub rt: Arc<Runtime>,
    /// Bearer token callers must present (None: open, for tests on loopback only).
    pub token: Option<String>,
}

fn text(code: u16, msg: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(msg.into())).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// Percent-decodes a query component (`+` is a space).
pub fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// All `key=value` pairs of a query string, decoded, in order.
pub fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn flag(pairs: &[(String, String)], k: &str) -> bool {
    pairs
        .iter()
        .any(|(n, v)| n == k && matches!(v.as_str(), "1" | "true" | "True" | "TRUE" | ""))
}

fn get<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

impl Endpoint {
    fn authorized<B>(&self, req: &Request<B>) -> bool {
        let Some(t) = &self.token else { return true };
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|v| v.trim() == t)
    }

    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        if path == "/healthz" {
            return text(200, "ok");
        }
        if !self.authorized(&req) {
            return text(401, "Unauthorized");
        }
        let pairs = query_pairs(req.uri().query());
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segs.as_slice() {
            ["containerLogs", ns, pod, container] => self.logs(ns, pod, container, &pairs).await,
            ["exec", ns, pod, container] => self.exec(req, ns, pod, container, &pairs),
            _ => text(404, "404 page not found"),
        }
    }

    async fn logs(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        q: &[(String, String)],
    ) -> Response<Body> {
        let Some(shared) = self.rt.find(ns, pod) else {
            return text(404, format!("pod {ns}/{pod} is not running on this node"));
        };
        let Some(info) = shared
            .containers
            .lock()
            .ok()
            .and_then(|m| m.get(container).cloned())
        else {
            return text(
                400,
                format!("container {container:?} in pod {pod:?} is waiting to start"),
            );
        };
        let previous = flag(q, "previous");
        let restart = if previous {
            if info.restart_count == 0 {
                return text(
                    400,
                    format!("previous terminated container {container:?} in pod {pod:?} not found"),
                );
            }
            info.restart_count - 1
        } else {
            info.restart_count
        };
        let file = info.log_dir.join(format!("{restart}.log"));
        let data = tokio::fs::read(&file).await.unwrap_or_default();
        let mut start = 0usize;
        if let Some(n) = get(q, "tailLines").and_then(|v| v.parse::<usize>().ok()) {
            start = tail_offset(&data, n);
        }
        let mut first = data[start..].to_vec();
        if let Some(limit) = get(q, "limitBytes").and_then(|v| v.parse::<usize>().ok()) {
            first.truncate(limit);
        }
        let follow = flag(q, "follow") && !previous;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let offset = data.len() as u64;
        let _ = tx.try_send(Bytes::from(first));
        if follow {
            let shared = shared.clone();
            let container = container.to_string();
            tokio::spawn(async move {
                let Ok(mut f) = tokio::fs::File::open(&file).await else {
                    return;
                };
                if f.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 16384];
                loop {
                    match f.read(&mut buf).await {
                        Ok(0) => {
                            let running = shared
                                .containers
                                .lock()
                                .ok()
                                .and_then(|m| m.get(&container).map(|i| (i.pid, i.restart_count)))
                                .is_some_and(|(pid, rc)| pid.is_some() && rc == restart);
                            if !running || tx.is_closed() {
                                // One last read for what was written before the exit.
                                if let Ok(n) = f.read(&mut buf).await
                                    && n > 0
                                {
                                    let _ = tx.send(Bytes::copy_from_slice(&buf[..n])).await;
                                }
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Ok(n) => {
                            if tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            });
        } else {
            drop(tx);
        }
        let stream = tokio_stream_from(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
        Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "text/plain")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap_or_else(|_| text(500, "response"))
    }

    fn exec(
        &self,
        req: Request<Incoming>,
        ns: &str,
        pod: &str,
        container: &str,
        q: &[(String, String)],
    ) -> Response<Body> {
        let is_ws = req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        if !is_ws {
            return text(
                400,
                "only WebSocket exec (v5.channel.k8s.io / v4.channel.k8s.io) is supported",
            );
        }
        let offered: Vec<String> = req
            .headers()
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(',').map(|s| s.trim().to_string()))
            .collect();
        let Some(proto) = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
            .into_iter()
            .find(|p| offered.iter().any(|o| o == p))
        else {
            return text(
                400,
                format!(
                    "unsupported exec subprotocols {offered:?}: want v5.channel.k8s.io or v4.channel.k8s.io"
                ),
            );
        };
        let Some(key) = req
            .headers()
            .get(header::SEC_WEBSOCKET_KEY)
            .map(|k| k.as_bytes().to_vec())
        else {
            return text(400, "missing Sec-WebSocket-Key");
        };
        let Some(shared) = self.rt.find(ns, pod) else {
            return text(404, format!("pod {ns}/{pod} is not running on this node"));
        };
        let Some(info) = shared
            .containers
            .lock()
            .ok()
            .and_then(|m| m.get(container).cloned())
        else {
            return text(
                404,
                format!("container {container:?} not found in pod {pod:?}"),
            );
        };
        let command: Vec<String> = q
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let want_stdin = flag(q, "stdin");
        let want_stdout = flag(q, "stdout");
        let want_stderr = flag(q, "stderr");
        let cmd = exec_command(&shared, &info, &command);
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
        let v5 = proto.starts_with("v5");
        tokio::spawn(async move {
            let upgraded = match hyper::upgrade::on(req).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!("exec upgrade: {e}");
                    return;
                }
            };
            let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                hyper_util::rt::TokioIo::new(upgraded),
                Role::Server,
                None,
            )
            .await;
            run_exec(ws, cmd, command, want_stdin, want_stdout, want_stderr, v5).await;
        });
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::UPGRADE, "websocket")
            .header(header::CONNECTION, "Upgrade")
            .header(header::SEC_WEBSOCKET_ACCEPT, accept)
            .header(header::SEC_WEBSOCKET_PROTOCOL, proto)
            .body(Full::new(Bytes::new()).boxed())
            .unwrap_or_else(|_| text(500, "response"))
    }
}

fn normal_close() -> Message {
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures::Stream<Item = Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Byte offset where the last `n` lines of `data` start.
pub fn tail_offset(data: &[u8], n: usize) -> usize {
    if n == 0 {
        return data.len();
    }
    let body = if data.ends_with(b"\n") {
        &data[..data.len() - 1]
    } else {
        data
    };
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

/// The `Status` sent on the error channel when the command ends.
pub fn exit_status(
    command: &[String],
    code: Option<i32>,
    err: Option<String>,
) -> serde_json::Value {
    match (code, err) {
        (_, Some(e)) => json!({"metadata": {}, "status": "Failure", "message": e,
            "reason": "InternalError", "code": 500}),
        (Some(0), None) => json!({"metadata": {}, "status": "Success"}),
        (c, None) => {
            let c = c.unwrap_or(1);
            json!({"metadata": {}, "status": "Failure",
                "message": format!("command terminated with non-zero exit code: error executing command {command:?}, exit code {c}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": c.to_string()}]}})
        }
    }
}

async fn run_exec<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    cmd: Result<tokio::process::Command, String>,
    command: Vec<String>,
    want_stdin: bool,
    want_stdout: bool,
    want_stderr: bool,
    v5: bool,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (otx, mut orx) = tokio::sync::mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = orx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let send_status = |v: serde_json::Value| {
        let mut b = vec![3u8];
        b.extend(serde_json::to_vec(&v).unwrap_or_default());
        Message::Binary(b.into())
    };
    let mut cmd = match cmd {
        Ok(c) => c,
        Err(e) => {
            let _ = otx
                .send(send_status(exit_status(&command, None, Some(e))))
                .await;
            let _ = otx.send(normal_close()).await;
            drop(otx);
            let _ = writer.await;
            return;
        }
    };
    cmd.stdin(if want_stdin {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(if want_stdout {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stderr(if want_stderr {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("failed to exec in container: {e}");
            let _ = otx
                .send(send_status(exit_status(&command, None, Some(msg))))
                .await;
            let _ = otx.send(normal_close()).await;
            drop(otx);
            let _ = writer.await;
            return;
        }
    };
    let mut pumps = tokio::task::JoinSet::new();
    for (ch, pipe) in [
        (
            1u8,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            2u8,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(mut pipe) = pipe else { continue };
        let otx = otx.clone();
        pumps.spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match pipe.read(&mut buf[1..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        buf[0] = ch;
                        if otx
                            .send(Message::Binary(Bytes::copy_from_slice(&buf[..n + 1])))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    }
    let mut stdin = child.stdin.take();
    let client_gone = CancellationToken::new();
    let reader = {
        let client_gone = client_gone.clone();
        tokio::spawn(async move {
            while let Some(m) = stream.next().await {
                match m {
                    Ok(Message::Binary(b)) if !b.is_empty() => match b[0] {
                        0 => {
                            if let Some(s) = stdin.as_mut()
                                && s.write_all(&b[1..]).await.is_err()
                            {
                                stdin = None;
                            }
                        }
                        255 if v5 && b.get(1) == Some(&0) => stdin = None,
                        _ => {}
                    },
                    Ok(Message::Close(_)) | Err(_) => break,
                    _ => {}
                }
            }
            client_gone.cancel();
        })
    };
    let code = tokio::select! {
        st = child.wait() => st.ok().and_then(|s| s.code().or(Some(1))),
        _ = client_gone.cancelled() => { let _ = child.kill().await; None }
    };
    while pumps.join_next().await.is_some() {}
    reader.abort();
    if !client_gone.is_cancelled() {
        let _ = otx
            .send(send_status(exit_status(&command, code, None)))
            .await;
        let _ = otx.send(normal_close()).await;
    }
    drop(otx);
    let _ = writer.await;
}

/// Serves the endpoint until `stop`.
pub async fn serve(ep: Arc<Endpoint>, listener: TcpListener, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
        };
        let ep = ep.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let ep = ep.clone();
                async move { Ok::<_, Infallible>(ep.handle(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .with_upgrades()
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let p = query_pairs(Some(
            "command=cat&command=%2Fetc%2Fresolv.conf&stdout=true&x=a+b&stdin",
        ));
        assert_eq!(get(&p, "x"), Some("a b"));
        let cmds: Vec<&str> = p
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(cmds, vec!["cat", "/etc/resolv.conf"]);
        assert!(flag(&p, "stdout") && flag(&p, "stdin") && !flag(&p, "stderr"));
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
    }

    #[test]
    fn tails() {
        let d = b"a\nb\nc\n";
        for (n, want) in [
            (0, ""),
            (1, "c\n"),
            (2, "b\nc\n"),
            (3, "a\nb\nc\n"),
            (9, "a\nb\nc\n"),
        ] {
            assert_eq!(
                std::str::from_utf8(&d[tail_offset(d, n)..]).expect("utf8"),
                want,
                "{n}"
            );
        }
        assert_eq!(&b"x\ny"[tail_offset(b"x\ny", 1)..], b"y");
    }

    #[test]
    fn statuses() {
        let c = vec!["sh".to_string(), "-c".to_string(), "exit 3".to_string()];
        assert_eq!(exit_status(&c, Some(0), None)["status"], "Success");
        let f = exit_status(&c, Some(3), None);
        assert_eq!(f["reason"], "NonZeroExitCode");
        assert_eq!(f["details"]["causes"][0]["message"], "3");
    }
}
