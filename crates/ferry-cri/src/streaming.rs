//! A client for the CRI streaming server (the URL that `Exec` and `Attach` return), over
//! WebSocket with the `v4.channel.k8s.io` protocol, which containerd's streaming server (the
//! kubelet's `cri/streaming` package) accepts beside SPDY. Each binary message starts with a
//! channel byte: 0 stdin, 1 stdout, 2 stderr, 3 the final status (a `metav1.Status`), 4 resize.
//!
//! v4 has no "close stdin" message, so `stdin` data is delivered but the process does not see
//! EOF; commands that read stdin to the end need the SPDY client (or v5, not served by
//! containerd 1.6).

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The WebSocket subprotocol spoken.
pub const PROTOCOL: &str = "v4.channel.k8s.io";

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("streaming URL {0:?} is not http(s)://")]
    BadUrl(String),
    #[error("connecting to the streaming server: {0}")]
    Connect(String),
    #[error("streaming session: {0}")]
    Session(String),
    #[error("bad status on the error channel: {0}")]
    BadStatus(String),
    #[error("exec failed: {0}")]
    Failed(String),
    #[error("the server closed the session without a status")]
    NoStatus,
}

/// What a finished exec/attach produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

/// The `ws://` form of a streaming server's `http://` URL.
pub fn ws_url(url: &str) -> Result<String, StreamError> {
    if let Some(rest) = url.strip_prefix("http://") {
        Ok(format!("ws://{rest}"))
    } else if let Some(rest) = url.strip_prefix("https://") {
        Ok(format!("wss://{rest}"))
    } else {
        Err(StreamError::BadUrl(url.to_string()))
    }
}

/// The exit code a v4 status message reports: 0 for Success, the `ExitCode` cause of a
/// `NonZeroExitCode` failure; other failures are errors (the command could not run).
pub fn exit_code_from_status(body: &[u8]) -> Result<i32, StreamError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| StreamError::BadStatus(format!("{e}: {}", String::from_utf8_lossy(body))))?;
    match v.get("status").and_then(|s| s.as_str()) {
        Some("Success") => Ok(0),
        Some("Failure") => {
            let message = v
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or_default()
                .to_string();
            if v.get("reason").and_then(|r| r.as_str()) == Some("NonZeroExitCode") {
                let code = v
                    .pointer("/details/causes")
                    .and_then(|c| c.as_array())
                    .and_then(|causes| {
                        causes
                            .iter()
                            .find(|c| c.get("reason").and_then(|r| r.as_str()) == Some("ExitCode"))
                    })
                    .and_then(|c| c.get("message").and_then(|m| m.as_str()))
                    .and_then(|m| m.parse::<i32>().ok());
                return code.ok_or(StreamError::BadStatus(message));
            }
            Err(StreamError::Failed(message))
        }
        _ => Err(StreamError::BadStatus(
            String::from_utf8_lossy(body).into_owned(),
        )),
    }
}

/// The `host:port` of a streaming URL.
pub fn authority(url: &str) -> Result<String, StreamError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| StreamError::BadUrl(url.to_string()))?;
    let end = rest.find('/').unwrap_or(rest.len());
    let auth = &rest[..end];
    if auth.is_empty() || !auth.contains(':') {
        return Err(StreamError::BadUrl(url.to_string()));
    }
    Ok(auth.to_string())
}

/// Opens a TCP connection to `addr` from inside the network namespace at `netns` (where a
/// containerd started with `SupervisorConfig::netns` serves its streaming server on its own
/// loopback). The socket keeps that namespace after the helper thread ends.
pub async fn connect_in_netns(
    netns: &std::path::Path,
    addr: &str,
) -> Result<tokio::net::TcpStream, StreamError> {
    let netns = netns.to_path_buf();
    let addr = addr.to_string();
    let std_stream = tokio::task::spawn_blocking(move || {
        // A fresh thread: setns changes only the calling thread's namespace, and this thread
        // is not reused by the runtime afterwards.
        std::thread::spawn(move || -> Result<std::net::TcpStream, StreamError> {
            let f = std::fs::File::open(&netns)
                .map_err(|e| StreamError::Connect(format!("{}: {e}", netns.display())))?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| StreamError::Connect(format!("setns {}: {e}", netns.display())))?;
            std::net::TcpStream::connect(&addr)
                .map_err(|e| StreamError::Connect(format!("{addr}: {e}")))
        })
        .join()
        .map_err(|_| StreamError::Connect("netns connect thread panicked".into()))?
    })
    .await
    .map_err(|e| StreamError::Connect(e.to_string()))??;
    std_stream
        .set_nonblocking(true)
        .map_err(|e| StreamError::Connect(e.to_string()))?;
    tokio::net::TcpStream::from_std(std_stream).map_err(|e| StreamError::Connect(e.to_string()))
}

/// Runs the session at `url` (from CRI `Exec` or `Attach`) to its end: sends `stdin` (if
/// any) and collects stdout, stderr and the exit code. With `netns`, the connection is made
/// from inside that network namespace.
pub async fn run(
    url: &str,
    netns: Option<&std::path::Path>,
    stdin: Option<&[u8]>,
) -> Result<Output, StreamError> {
    let mut req = ws_url(url)?
        .into_client_request()
        .map_err(|e| StreamError::Connect(e.to_string()))?;
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        http::HeaderValue::from_static(PROTOCOL),
    );
    let tcp = match netns {
        Some(ns) => connect_in_netns(ns, &authority(url)?).await?,
        None => tokio::net::TcpStream::connect(authority(url)?)
            .await
            .map_err(|e| StreamError::Connect(e.to_string()))?,
    };
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .map_err(|e| StreamError::Connect(e.to_string()))?;
    if let Some(data) = stdin {
        let mut msg = Vec::with_capacity(data.len() + 1);
        msg.push(0u8);
        msg.extend_from_slice(data);
        ws.send(Message::Binary(msg.into()))
            .await
            .map_err(|e| StreamError::Session(e.to_string()))?;
    }
    let mut out = Output::default();
    let mut status: Option<i32> = None;
    while let Some(msg) = ws.next().await {
        let msg = match msg {
            Ok(m) => m,
            // The server may drop the TCP connection right after the status.
            Err(_) if status.is_some() => break,
            Err(e) => return Err(StreamError::Session(e.to_string())),
        };
        let data = match msg {
            Message::Binary(b) => b,
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((&channel, body)) = data.split_first() else {
            continue;
        };
        match channel {
            1 => out.stdout.extend_from_slice(body),
            2 => out.stderr.extend_from_slice(body),
            3 if !body.is_empty() => status = Some(exit_code_from_status(body)?),
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    out.exit_code = status.ok_or(StreamError::NoStatus)?;
    Ok(out)
}

/// The URL of a WebSocket port-forward to `port` (the streaming server reads the ports of a
/// WebSocket session from `?port=`).
pub fn port_forward_url(url: &str, port: u16) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}port={port}")
}

/// One side of a port-forward message: channel 0 carries data, channel 1 errors; each
/// channel's first message from the server is the port (2 bytes, little-endian).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortForwardFrame {
    Data(Vec<u8>),
    Error(String),
    /// The port announcement, or an empty message.
    Ignore,
}

/// Classifies one server message of a single-port session; `seen` tracks which channels have
/// had their port announcement already.
pub fn port_forward_frame(msg: &[u8], seen: &mut [bool; 2]) -> PortForwardFrame {
    let Some((&channel, body)) = msg.split_first() else {
        return PortForwardFrame::Ignore;
    };
    let idx = usize::from(channel.min(1));
    let body = if !seen[idx] {
        seen[idx] = true;
        body.get(2..).unwrap_or_default()
    } else {
        body
    };
    match (channel, body.is_empty()) {
        (_, true) => PortForwardFrame::Ignore,
        (0, false) => PortForwardFrame::Data(body.to_vec()),
        (1, false) => PortForwardFrame::Error(String::from_utf8_lossy(body).into_owned()),
        _ => PortForwardFrame::Ignore,
    }
}

/// Opens a port-forward session to one port (`url` from CRI `PortForward`) and returns a
/// byte stream to it: what is written goes to the pod's port, what the pod sends is read.
/// An error reported by the server ends the stream.
pub async fn port_forward(
    url: &str,
    netns: Option<&std::path::Path>,
    port: u16,
) -> Result<tokio::io::DuplexStream, StreamError> {
    let full = port_forward_url(url, port);
    let mut req = ws_url(&full)?
        .into_client_request()
        .map_err(|e| StreamError::Connect(e.to_string()))?;
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        http::HeaderValue::from_static(PROTOCOL),
    );
    let tcp = match netns {
        Some(ns) => connect_in_netns(ns, &authority(url)?).await?,
        None => tokio::net::TcpStream::connect(authority(url)?)
            .await
            .map_err(|e| StreamError::Connect(e.to_string()))?,
    };
    let (ws, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .map_err(|e| StreamError::Connect(e.to_string()))?;
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(pump_port_forward(ws, theirs, port));
    Ok(ours)
}

async fn pump_port_forward<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    local: tokio::io::DuplexStream,
    port: u16,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(local);
    let mut seen = [false; 2];
    let mut buf = vec![0u8; 32 * 1024];
    let mut local_open = true;
    loop {
        tokio::select! {
            n = rd.read(&mut buf), if local_open => {
                match n {
                    Ok(0) | Err(_) => {
                        // v4 cannot half-close: keep reading until the pod side ends.
                        local_open = false;
                    }
                    Ok(n) => {
                        let mut msg = Vec::with_capacity(n + 1);
                        msg.push(0u8);
                        msg.extend_from_slice(&buf[..n]);
                        if sink.send(Message::Binary(msg.into())).await.is_err() {
                            break;
                        }
                    }
                }
            }
            m = stream.next() => {
                let data = match m {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                match port_forward_frame(&data, &mut seen) {
                    PortForwardFrame::Data(d) => {
                        if wr.write_all(&d).await.is_err() {
                            break;
                        }
                    }
                    PortForwardFrame::Error(e) => {
                        tracing::debug!(port, error = %e, "port-forward error from the runtime");
                        break;
                    }
                    PortForwardFrame::Ignore => {}
                }
            }
        }
    }
    let _ = wr.shutdown().await;
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            ws_url("http://127.0.0.1:3456/exec/abc").ok().as_deref(),
            Some("ws://127.0.0.1:3456/exec/abc")
        );
        assert_eq!(ws_url("https://h/x").ok().as_deref(), Some("wss://h/x"));
        assert!(ws_url("unix:///x").is_err());
        assert_eq!(
            authority("http://127.0.0.1:3456/exec/abc").ok().as_deref(),
            Some("127.0.0.1:3456")
        );
        assert!(authority("http://host/exec").is_err());
        assert!(authority("https://h:1/x").is_err());
    }

    #[test]
    fn port_forward_frames() {
        assert_eq!(
            port_forward_url("http://h:1/portforward/tok", 80),
            "http://h:1/portforward/tok?port=80"
        );
        let mut seen = [false; 2];
        let cases: Vec<(Vec<u8>, PortForwardFrame)> = vec![
            (vec![0, 80, 0], PortForwardFrame::Ignore),
            (vec![1, 80, 0], PortForwardFrame::Ignore),
            (
                b"\0hello".to_vec(),
                PortForwardFrame::Data(b"hello".to_vec()),
            ),
            (
                b"\x01refused".to_vec(),
                PortForwardFrame::Error("refused".into()),
            ),
            (vec![], PortForwardFrame::Ignore),
            (vec![0], PortForwardFrame::Ignore),
        ];
        for (msg, want) in cases {
            assert_eq!(port_forward_frame(&msg, &mut seen), want, "{msg:?}");
        }
        // Data in the same message as the port announcement.
        let mut fresh = [false; 2];
        assert_eq!(
            port_forward_frame(b"\0\x50\0hi", &mut fresh),
            PortForwardFrame::Data(b"hi".to_vec())
        );
    }

    #[test]
    fn status_table() {
        let ok = br#"{"metadata":{},"status":"Success"}"#;
        let three = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        let failed = br#"{"metadata":{},"status":"Failure","message":"executable file not found"}"#;
        assert_eq!(exit_code_from_status(ok).ok(), Some(0));
        assert_eq!(exit_code_from_status(three).ok(), Some(3));
        assert!(matches!(
            exit_code_from_status(failed),
            Err(StreamError::Failed(m)) if m == "executable file not found"
        ));
        assert!(matches!(
            exit_code_from_status(b"nope"),
            Err(StreamError::BadStatus(_))
        ));
    }
}
