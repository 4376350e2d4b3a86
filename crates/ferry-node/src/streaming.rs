//! Streaming endpoints of the agent beyond WebSocket exec (see [`crate::server`]): kubelet's
//! SPDY/3.1 remote command protocol (`v4.channel.k8s.io` … `channel.k8s.io`) for `exec` and
//! `attach`, and port forwarding in its three wire forms — SPDY `portforward.k8s.io` (data and
//! error stream pairs keyed by `requestID`), SPDY tunnelled in WebSocket binary messages
//! (`SPDY/3.1+portforward.k8s.io`, kubectl 1.30+), and WebSocket channels
//! (`v4.channel.k8s.io`: two channels per port, each opened by the port as two little-endian
//! bytes; the Python client's `portforward`).
//!
//! The decisions (protocol negotiation, which streams a command needs, how port-forward
//! streams pair up, what the error stream says) are pure functions with table tests; the rest
//! moves bytes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_spdy::{Headers, Role as SpdyRole, Session, Stream, StreamWriter};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::runtime::{PodShared, Runtime};

/// Remote command protocols, most preferred first (kubelet's list).
pub const REMOTECOMMAND_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// The SPDY port-forward protocol.
pub const PORTFORWARD_PROTOCOL: &str = "portforward.k8s.io";
/// WebSocket subprotocol of SPDY tunnelled through WebSocket (kubectl 1.30+ port-forward).
pub const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// WebSocket port-forward subprotocol (kubelet's; the Python client's).
pub const WS_PORTFORWARD_PROTOCOL: &str = "v4.channel.k8s.io";
/// How long a client has to open the streams a command needs (kubelet's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The first protocol of ours (in our order of preference) that the client offers.
pub fn negotiate<'a>(offered: &[String], ours: &[&'a str]) -> Option<&'a str> {
    ours.iter()
        .find(|p| offered.iter().any(|o| o.trim() == **p))
        .copied()
}

/// Splits header values (`a, b` and repeated headers) into a list.
pub fn header_list(values: &[&str]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Which streams a remote command waits for (kubelet's `waitForStreams`): always `error`;
/// `stdin`/`stdout`/`stderr` as asked (no `stderr` with a TTY); `resize` with a TTY from v3 on.
pub fn expected_streams(
    protocol: &str,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
) -> Vec<&'static str> {
    let mut v = vec!["error"];
    if stdin {
        v.push("stdin");
    }
    if stdout {
        v.push("stdout");
    }
    if stderr && !tty {
        v.push("stderr");
    }
    if tty && matches!(protocol, "v3.channel.k8s.io" | "v4.channel.k8s.io") {
        v.push("resize");
    }
    v
}

/// What goes on the error stream when a command ends: v4 sends a JSON `Status` (the exit
/// code in `details.causes`), older versions the error text, nothing on success.
pub fn error_stream_payload(protocol: &str, status: &serde_json::Value) -> Option<Vec<u8>> {
    if protocol == "v4.channel.k8s.io" {
        return serde_json::to_vec(status).ok();
    }
    if status.get("status").and_then(|s| s.as_str()) == Some("Success") {
        return None;
    }
    status
        .get("message")
        .and_then(|m| m.as_str())
        .map(|m| m.as_bytes().to_vec())
}

/// A port-forward stream's role, from its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PfStream {
    pub data: bool,
    pub port: u16,
    /// The pairing key: `requestID`, or (clients before it existed) the error stream's id.
    pub key: String,
}

/// Why an exec, attach or port-forward cannot be served; the texts are kubelet's (the client
/// shows them, e.g. in the exec error stream's Status).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("no command given")]
    NoCommand,
    #[error("container is not running")]
    NotRunning,
    #[error("failed to exec in container: {0}")]
    Exec(String),
    /// Allocating or wiring the terminal of a `tty` command failed.
    #[error("{0}")]
    Terminal(String),
    #[error("timed out waiting for client to create streams")]
    StreamTimeout,
    #[error("connection closed before the streams were created")]
    StreamsClosed,
    #[error("invalid stream type {0:?}")]
    StreamType(String),
    #[error("port header is missing")]
    MissingPort,
    #[error("invalid port header {0:?}")]
    PortHeader(String),
    #[error("unable to parse {0:?} as a port")]
    PortParam(String),
    #[error("query parameter \"port\" is required")]
    PortRequired,
    /// `namespace/name` of a pod this node does not run.
    #[error("pod {0} is not running on this node")]
    PodNotHere(String),
    #[error("pod {0} has no running container")]
    NoContainer(String),
    #[error("pod {0} has no IP address yet")]
    NoPodIp(String),
}

/// Classifies a SPDY port-forward stream (kubelet's `httpStreamHandler`).
pub fn classify_pf_stream(h: &Headers, id: u32) -> Result<PfStream, StreamError> {
    let kind = h.get("streamtype").unwrap_or("");
    let data = match kind {
        "data" => true,
        "error" => false,
        other => return Err(StreamError::StreamType(other.to_string())),
    };
    let port_s = h.get("port").ok_or(StreamError::MissingPort)?;
    let port: u16 = port_s
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| StreamError::PortHeader(port_s.to_string()))?;
    let key = match h.get("requestid") {
        Some(r) => r.to_string(),
        // Old clients: the data stream follows its error stream (ids two apart).
        None if data => id.saturating_sub(2).to_string(),
        None => id.to_string(),
    };
    Ok(PfStream { data, port, key })
}

/// The `ports` of a WebSocket port-forward request (`ports=80,443` or repeated).
pub fn ws_ports(pairs: &[(String, String)]) -> Result<Vec<u16>, StreamError> {
    let mut out = Vec::new();
    for (k, v) in pairs.iter().filter(|(k, _)| k == "ports") {
        let _ = k;
        for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let n: u16 = p
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| StreamError::PortParam(p.to_string()))?;
            out.push(n);
        }
    }
    if out.is_empty() {
        return Err(StreamError::PortRequired);
    }
    Ok(out)
}

/// Where a pod's ports are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Inside the pod's network namespace: localhost (as CRI runtimes do), then the pod's
    /// address (servers bound to it only).
    Netns(PathBuf, Option<IpAddr>),
    /// The pod's address (loopback mode: pods share the agent's network namespace).
    Addr(IpAddr),
}

/// Where `ns/pod`'s ports are, or why it cannot be reached.
pub fn pod_target(rt: &Runtime, ns: &str, pod: &str) -> Result<Target, StreamError> {
    let shared = rt
        .find(ns, pod)
        .ok_or_else(|| StreamError::PodNotHere(format!("{ns}/{pod}")))?;
    let ip = rt
        .pods
        .lock()
        .ok()
        .and_then(|pods| {
            pods.values()
                .find(|h| Arc::ptr_eq(&h.shared, &shared))
                .and_then(|h| h.tx.borrow().status.as_ref().and_then(|s| s.pod_ip.clone()))
        })
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    if shared.netns.load(std::sync::atomic::Ordering::SeqCst) {
        let pid = shared
            .containers
            .lock()
            .ok()
            .and_then(|m| m.values().find_map(|c| c.pid))
            .ok_or_else(|| StreamError::NoContainer(format!("{ns}/{pod}")))?;
        return Ok(Target::Netns(
            PathBuf::from(format!("/proc/{pid}/ns/net")),
            ip,
        ));
    }
    let ip = ip.ok_or_else(|| StreamError::NoPodIp(format!("{ns}/{pod}")))?;
    Ok(Target::Addr(ip))
}

/// Connects to `port` of the pod.
pub async fn connect(target: &Target, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let timeout = Duration::from_secs(10);
    match target {
        Target::Addr(ip) => {
            crate::netns::connect_in(None, SocketAddr::new(*ip, port), timeout).await
        }
        Target::Netns(ns, ip) => {
            let mut tries = vec![
                SocketAddr::from(([127, 0, 0, 1], port)),
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
            ];
            tries.extend(ip.map(|ip| SocketAddr::new(ip, port)));
            let mut first = None;
            for a in tries {
                match crate::netns::connect_in(Some(ns), a, timeout).await {
                    Ok(s) => return Ok(s),
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            Err(first.unwrap_or_else(|| std::io::Error::other("no address")))
        }
    }
}

/// Collects the streams a command needs, by type, until all are there (or the timeout, or
/// the session ends).
async fn wait_for_streams(
    incoming: &mut mpsc::Receiver<Stream>,
    want: &[&str],
) -> Result<HashMap<String, Stream>, StreamError> {
    let mut got: HashMap<String, Stream> = HashMap::new();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while want.iter().any(|w| !got.contains_key(*w)) {
        let s = tokio::time::timeout_at(deadline, incoming.recv())
            .await
            .map_err(|_| StreamError::StreamTimeout)?
            .ok_or(StreamError::StreamsClosed)?;
        let kind = s.headers.get("streamtype").unwrap_or("").to_string();
        if want.contains(&kind.as_str()) {
            got.insert(kind, s);
        } else {
            let _ = s.writer.reset(ferry_spdy::frame::rst::PROTOCOL_ERROR).await;
        }
    }
    Ok(got)
}

type Pipe = Box<dyn AsyncRead + Send + Unpin>;

/// How a command's standard streams are wired to the client.
pub struct CommandIo {
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: Option<StreamWriter>,
    pub stderr: Option<StreamWriter>,
    /// With a TTY the command's stderr goes to stdout.
    pub tty: bool,
}

/// Runs a command with its streams wired to SPDY streams; returns the exit code (None: it
/// could not start, with the message).
async fn run_command(
    cmd: Result<tokio::process::Command, StreamError>,
    io: CommandIo,
) -> Result<i32, StreamError> {
    use std::process::Stdio;
    let mut cmd = cmd?;
    cmd.stdin(if io.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(if io.stdout.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stderr(if io.stderr.is_some() || (io.tty && io.stdout.is_some()) {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| StreamError::Exec(e.to_string()))?;
    let mut pumps = tokio::task::JoinSet::new();
    let err_sink = if io.tty {
        io.stdout.clone()
    } else {
        io.stderr.clone()
    };
    let outs: [(Option<Pipe>, Option<StreamWriter>); 2] = [
        (
            child.stdout.take().map(|p| Box::new(p) as Pipe),
            io.stdout.clone(),
        ),
        (child.stderr.take().map(|p| Box::new(p) as Pipe), err_sink),
    ];
    for (pipe, sink) in outs {
        let (Some(mut pipe), Some(sink)) = (pipe, sink) else {
            continue;
        };
        pumps.spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if sink.write(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    let stdin_task = match (child.stdin.take(), io.stdin) {
        (Some(mut pipe), Some(mut rx)) => Some(tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if pipe.write_all(&b).await.is_err() {
                    return;
                }
            }
            // The client closed stdin: the command sees EOF.
            let _ = pipe.shutdown().await;
        })),
        _ => None,
    };
    let st = child.wait().await;
    while pumps.join_next().await.is_some() {}
    if let Some(t) = stdin_task {
        t.abort();
    }
    Ok(match st {
        Ok(s) => s.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + s.signal().unwrap_or(0)
        }),
        Err(_) => 1,
    })
}

/// Runs a command on a terminal (`tty=true`): its output to the stdout stream, the resize
/// stream's sizes applied.
async fn run_on_terminal(
    cmd: Result<tokio::process::Command, StreamError>,
    stdin: Option<mpsc::Receiver<Bytes>>,
    stdout: Option<StreamWriter>,
    resize: Option<Stream>,
) -> Result<i32, StreamError> {
    let (rs_tx, rs_rx) = mpsc::channel(8);
    if let Some(mut r) = resize {
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(b) = r.data.recv().await {
                buf.extend_from_slice(&b);
                for size in crate::pty::split_resizes(&mut buf) {
                    if rs_tx.send(size).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(32);
    let forward = tokio::spawn(async move {
        while let Some(b) = out_rx.recv().await {
            if let Some(w) = &stdout
                && w.write(b).await.is_err()
            {
                return;
            }
        }
    });
    let code = crate::pty::run(cmd?, stdin, out_tx, rs_rx).await;
    let _ = forward.await;
    code
}

/// The options of a remote command request.
#[derive(Debug, Clone, Default)]
pub struct CommandOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Serves one SPDY remote command session: waits for the client's streams, runs the command,
/// reports its end on the error stream.
pub async fn serve_spdy_exec<T>(
    io: T,
    protocol: &'static str,
    opts: CommandOptions,
    cmd: Result<tokio::process::Command, StreamError>,
) where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (session, mut incoming) = Session::start(io, SpdyRole::Server);
    let want = expected_streams(protocol, opts.stdin, opts.stdout, opts.stderr, opts.tty);
    let mut streams = match wait_for_streams(&mut incoming, &want).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("exec: {e}");
            let _ = session.go_away().await;
            return;
        }
    };
    // Streams opened later (none expected) are refused by dropping the receiver.
    drop(incoming);
    let Some(error) = streams.remove("error") else {
        return;
    };
    let stdin = streams.remove("stdin").map(|s| s.data);
    let stdout = streams.remove("stdout").map(|s| s.writer);
    let stderr = streams.remove("stderr").map(|s| s.writer);
    let resize = streams.remove("resize");
    let code = if opts.tty {
        run_on_terminal(cmd, stdin, stdout.clone(), resize).await
    } else {
        run_command(
            cmd,
            CommandIo {
                stdin,
                stdout: stdout.clone(),
                stderr: stderr.clone(),
                tty: false,
            },
        )
        .await
    };
    for w in [&stdout, &stderr].into_iter().flatten() {
        let _ = w.finish().await;
    }
    let status = match code {
        Ok(c) => crate::server::exit_status(&opts.command, Some(c), None),
        Err(e) => crate::server::exit_status(&opts.command, None, Some(e.to_string())),
    };
    if let Some(p) = error_stream_payload(protocol, &status) {
        let _ = error.writer.write(Bytes::from(p)).await;
    }
    let _ = error.writer.finish().await;
    // The client closes the connection once it has read everything; do not wait forever.
    let _ = tokio::time::timeout(Duration::from_secs(10), session.ended()).await;
    session.shutdown().await;
}

/// Output of an attached container for one client: (1 = stdout, 2 = stderr, data).
pub type AttachOut = mpsc::Sender<(u8, Bytes)>;

/// Attaches a client to a running container until the container's output ends or the client
/// goes: live output to `out` (stderr to stdout with a TTY), the client's stdin to the
/// container's (closed at the client's end when the container has `stdinOnce`).
pub async fn attach_core(
    cio: Arc<crate::logs::ContainerIo>,
    mut stdin: Option<mpsc::Receiver<Bytes>>,
    out: AttachOut,
    want_stdout: bool,
    want_stderr: bool,
    tty: bool,
) {
    use crate::logs::Stream as S;
    use tokio::sync::broadcast::error::RecvError;
    let mut sub = cio.subscribe();
    let deliver = |(stream, b): (S, Bytes)| -> Option<(u8, Bytes)> {
        match stream {
            S::Stdout if want_stdout => Some((1, b)),
            S::Stderr if tty && want_stdout => Some((1, b)),
            S::Stderr if want_stderr && !tty => Some((2, b)),
            _ => None,
        }
    };
    loop {
        tokio::select! {
            r = sub.recv() => match r {
                Ok(m) => {
                    if let Some(m) = deliver(m)
                        && out.send(m).await.is_err()
                    {
                        return;
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            b = async {
                match stdin.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => match b {
                Some(b) => {
                    let _ = cio.write_stdin(&b).await;
                }
                None => {
                    stdin = None;
                    if cio.stdin_once {
                        cio.close_stdin().await;
                    }
                }
            },
            _ = cio.ended() => {
                // What was sent before the end.
                while let Ok(m) = sub.try_recv() {
                    if let Some(m) = deliver(m)
                        && out.send(m).await.is_err()
                    {
                        return;
                    }
                }
                return;
            }
            _ = out.closed() => return,
        }
    }
}

/// Serves one SPDY attach session (kubectl up to 1.29 `attach`/`run -i`).
pub async fn serve_spdy_attach<T>(
    io: T,
    protocol: &'static str,
    opts: CommandOptions,
    cio: Arc<crate::logs::ContainerIo>,
) where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (session, mut incoming) = Session::start(io, SpdyRole::Server);
    let want = expected_streams(protocol, opts.stdin, opts.stdout, opts.stderr, opts.tty);
    let mut streams = match wait_for_streams(&mut incoming, &want).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("attach: {e}");
            session.shutdown().await;
            return;
        }
    };
    drop(incoming);
    let Some(error) = streams.remove("error") else {
        return;
    };
    let stdin = streams.remove("stdin").map(|s| s.data);
    let stdout = streams.remove("stdout").map(|s| s.writer);
    let stderr = streams.remove("stderr").map(|s| s.writer);
    if let Some(mut resize) = streams.remove("resize") {
        let cio = cio.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(b) = resize.data.recv().await {
                buf.extend_from_slice(&b);
                for (w, h) in crate::pty::split_resizes(&mut buf) {
                    cio.resize(w, h).await;
                }
            }
        });
    }
    let (tx, mut rx) = mpsc::channel::<(u8, Bytes)>(32);
    let forward = {
        let (stdout, stderr) = (stdout.clone(), stderr.clone());
        tokio::spawn(async move {
            while let Some((ch, b)) = rx.recv().await {
                let w = if ch == 1 { &stdout } else { &stderr };
                if let Some(w) = w
                    && w.write(b).await.is_err()
                {
                    return;
                }
            }
        })
    };
    let ended = session.clone();
    tokio::select! {
        _ = attach_core(cio, stdin, tx, opts.stdout, opts.stderr, opts.tty) => {}
        _ = ended.ended() => {}
    }
    let _ = forward.await;
    for w in [&stdout, &stderr].into_iter().flatten() {
        let _ = w.finish().await;
    }
    let ok = serde_json::json!({"metadata": {}, "status": "Success"});
    if let Some(p) = error_stream_payload(protocol, &ok) {
        let _ = error.writer.write(Bytes::from(p)).await;
    }
    let _ = error.writer.finish().await;
    let _ = tokio::time::timeout(Duration::from_secs(10), session.ended()).await;
    session.shutdown().await;
}

/// Serves one WebSocket attach session (`v5.channel.k8s.io`/`v4.channel.k8s.io`: channel 0
/// stdin, 1 stdout, 2 stderr, 3 the final status, 4 resize, 255 close of a channel in v5).
pub async fn serve_ws_attach<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    v5: bool,
    opts: CommandOptions,
    cio: Arc<crate::logs::ContainerIo>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(32);
    let want_stdin = opts.stdin;
    let resizer = cio.clone();
    let reader = tokio::spawn(async move {
        let mut stdin_tx = Some(stdin_tx);
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Binary(b)) if !b.is_empty() => match b[0] {
                    0 => {
                        if let Some(tx) = stdin_tx.as_ref()
                            && tx.send(b.slice(1..)).await.is_err()
                        {
                            stdin_tx = None;
                        }
                    }
                    4 => {
                        if let Some((w, h)) = crate::pty::parse_resize(&b[1..]) {
                            resizer.resize(w, h).await;
                        }
                    }
                    255 if v5 && b.get(1) == Some(&0) => stdin_tx = None,
                    _ => {}
                },
                Ok(Message::Close(_)) | Err(_) => break,
                _ => {}
            }
        }
    });
    let (tx, mut rx) = mpsc::channel::<(u8, Bytes)>(32);
    let core = tokio::spawn(attach_core(
        cio,
        want_stdin.then_some(stdin_rx),
        tx,
        opts.stdout,
        opts.stderr,
        opts.tty,
    ));
    while let Some((ch, b)) = rx.recv().await {
        let mut m = Vec::with_capacity(b.len() + 1);
        m.push(ch);
        m.extend_from_slice(&b);
        if sink.send(Message::Binary(Bytes::from(m))).await.is_err() {
            break;
        }
    }
    let _ = core.await;
    let mut status = vec![3u8];
    status.extend(br#"{"metadata":{},"status":"Success"}"#);
    let _ = sink.send(Message::Binary(Bytes::from(status))).await;
    let _ = sink.send(crate::server::normal_close()).await;
    let _ = sink.close().await;
    close_after_reply(reader).await;
}

/// WebSocket exec with a terminal (`tty=true`): channel 0 keystrokes, 1 the terminal's
/// output, 3 the final status, 4 resize messages, 255 (v5) the end of stdin.
pub async fn run_ws_exec_tty<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    cmd: Result<tokio::process::Command, StreamError>,
    command: Vec<String>,
    want_stdin: bool,
    v5: bool,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(32);
    let (rs_tx, rs_rx) = mpsc::channel::<(u16, u16)>(8);
    let reader = tokio::spawn(async move {
        let mut stdin_tx = Some(stdin_tx);
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Binary(b)) if !b.is_empty() => match b[0] {
                    0 => {
                        if let Some(tx) = stdin_tx.as_ref()
                            && tx.send(b.slice(1..)).await.is_err()
                        {
                            stdin_tx = None;
                        }
                    }
                    4 => {
                        if let Some(size) = crate::pty::parse_resize(&b[1..]) {
                            let _ = rs_tx.send(size).await;
                        }
                    }
                    255 if v5 && b.get(1) == Some(&0) => stdin_tx = None,
                    _ => {}
                },
                Ok(Message::Close(_)) | Err(_) => break,
                _ => {}
            }
        }
    });
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(32);
    let run = tokio::spawn(async move {
        match cmd {
            Ok(c) => crate::pty::run(c, want_stdin.then_some(stdin_rx), out_tx, rs_rx).await,
            Err(e) => Err(e),
        }
    });
    while let Some(b) = out_rx.recv().await {
        let mut m = Vec::with_capacity(b.len() + 1);
        m.push(1u8);
        m.extend_from_slice(&b);
        if sink.send(Message::Binary(Bytes::from(m))).await.is_err() {
            break;
        }
    }
    let status = match run.await {
        Ok(Ok(code)) => crate::server::exit_status(&command, Some(code), None),
        Ok(Err(e)) => crate::server::exit_status(&command, None, Some(e.to_string())),
        Err(e) => crate::server::exit_status(&command, None, Some(e.to_string())),
    };
    let mut m = vec![3u8];
    m.extend(serde_json::to_vec(&status).unwrap_or_default());
    let _ = sink.send(Message::Binary(Bytes::from(m))).await;
    let _ = sink.send(crate::server::normal_close()).await;
    let _ = sink.close().await;
    close_after_reply(reader).await;
}

/// Waits (a while) for the WebSocket client's close reply, read by `reader`, before the
/// connection is dropped: dropping it first can reset it, and what is still on its way to
/// the client through the API server (the final status) would be lost.
async fn close_after_reply(mut reader: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(Duration::from_secs(5), &mut reader)
        .await
        .is_err()
    {
        reader.abort();
    }
}

/// Serves one SPDY port-forward session: pairs each data stream with its error stream and
/// copies bytes between the data stream and a new connection to the pod's port.
pub async fn serve_spdy_portforward<T>(io: T, target: Target, pod: String)
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (session, mut incoming) = Session::start(io, SpdyRole::Server);
    let mut pending: HashMap<String, (Option<Stream>, Option<Stream>)> = HashMap::new();
    while let Some(s) = incoming.recv().await {
        let pf = match classify_pf_stream(&s.headers, s.id) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("port-forward {pod}: {e}");
                let _ = s.writer.reset(ferry_spdy::frame::rst::PROTOCOL_ERROR).await;
                continue;
            }
        };
        let entry = pending.entry(pf.key.clone()).or_default();
        if pf.data {
            entry.0 = Some(s);
        } else {
            entry.1 = Some(s);
        }
        if entry.0.is_some()
            && entry.1.is_some()
            && let Some((Some(data), Some(error))) = pending.remove(&pf.key)
        {
            let target = target.clone();
            let pod = pod.clone();
            tokio::spawn(forward_pair(data, error, target, pf.port, pod));
        }
    }
    session.shutdown().await;
}

async fn forward_pair(data: Stream, error: Stream, target: Target, port: u16, pod: String) {
    let Stream {
        data: mut from_client,
        writer,
        aborted: mut data_aborted,
        ..
    } = data;
    // The client only reads the error stream; drain what it might send.
    let Stream {
        data: mut err_in,
        writer: err_out,
        ..
    } = error;
    tokio::spawn(async move { while err_in.recv().await.is_some() {} });
    let conn = match connect(&target, port).await {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("error forwarding port {port} to pod {pod}: {e}");
            tracing::info!("{msg}");
            let _ = err_out.write(Bytes::from(msg)).await;
            let _ = err_out.finish().await;
            let _ = writer.finish().await;
            return;
        }
    };
    let (mut rd, mut wr) = conn.into_split();
    let up = tokio::spawn(async move {
        while let Some(b) = from_client.recv().await {
            if wr.write_all(&b).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if writer
                        .write(Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    // The client resets the stream when its side of the connection is done (or the whole
    // session goes): then the pod's connection is closed too.
    tokio::select! {
        _ = down => {}
        _ = data_aborted.wait() => {
            up.abort();
            return;
        }
    }
    let _ = writer.finish().await;
    let _ = err_out.finish().await;
    let _ = up.await;
}

/// A WebSocket as a byte stream: binary messages in, binary messages out (the SPDY tunnel).
pub fn ws_byte_stream<S>(ws: tokio_tungstenite::WebSocketStream<S>) -> tokio::io::DuplexStream
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(ours);
    tokio::spawn(async move {
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Binary(b)) if wr.write_all(&b).await.is_err() => break,
                Ok(Message::Close(_)) | Err(_) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink
                        .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = sink.close().await;
    });
    theirs
}

/// Serves a WebSocket port-forward (`v4.channel.k8s.io`): for port i, channel 2i carries
/// data and 2i+1 errors; each channel's first message is the port (little-endian u16).
pub async fn serve_ws_portforward<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    target: Target,
    ports: Vec<u16>,
    pod: String,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (otx, mut orx) = mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = orx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let frame = |ch: u8, data: &[u8]| {
        let mut b = Vec::with_capacity(data.len() + 1);
        b.push(ch);
        b.extend_from_slice(data);
        Message::Binary(Bytes::from(b))
    };
    for (i, port) in ports.iter().enumerate() {
        for ch in [2 * i as u8, 2 * i as u8 + 1] {
            let _ = otx.send(frame(ch, &port.to_le_bytes())).await;
        }
    }
    let mut to_pod: Vec<Option<mpsc::Sender<Bytes>>> = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (tx, mut rx) = mpsc::channel::<Bytes>(32);
        to_pod.push(Some(tx));
        let otx = otx.clone();
        let target = target.clone();
        let pod = pod.clone();
        let data_ch = 2 * i as u8;
        tasks.spawn(async move {
            let conn = match connect(&target, port).await {
                Ok(c) => c,
                Err(e) => {
                    let msg = format!("error forwarding port {port} to pod {pod}: {e}");
                    let _ = otx.send(frame(data_ch + 1, msg.as_bytes())).await;
                    return;
                }
            };
            let (mut rd, mut wr) = conn.into_split();
            let up = tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    if wr.write_all(&b).await.is_err() {
                        return;
                    }
                }
                let _ = wr.shutdown().await;
            });
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if otx.send(frame(data_ch, &buf[..n])).await.is_err() {
                            break;
                        }
                    }
                }
            }
            up.abort();
        });
    }
    let reader = tokio::spawn(async move {
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Binary(b)) if !b.is_empty() => {
                    let ch = b[0] as usize;
                    if ch.is_multiple_of(2)
                        && let Some(Some(tx)) = to_pod.get(ch / 2)
                        && tx.send(b.slice(1..)).await.is_err()
                    {
                        to_pod[ch / 2] = None;
                    }
                }
                Ok(Message::Close(_)) | Err(_) => break,
                _ => {}
            }
        }
    });
    // The session ends when every forwarded connection has ended (or the client left).
    tokio::select! {
        _ = async { while tasks.join_next().await.is_some() {} } => {}
        _ = reader => {}
    }
    let _ = otx.send(crate::server::normal_close()).await;
    drop(otx);
    let _ = writer.await;
}

/// Whether a pod (by its shared state) has a container named `c` running.
pub fn container_running(shared: &PodShared, c: &str) -> bool {
    shared
        .containers
        .lock()
        .ok()
        .and_then(|m| m.get(c).map(|i| i.pid.is_some()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn negotiation_prefers_our_order() {
        let offered = header_list(&["channel.k8s.io, v4.channel.k8s.io", "v3.channel.k8s.io"]);
        assert_eq!(
            negotiate(&offered, REMOTECOMMAND_PROTOCOLS),
            Some("v4.channel.k8s.io")
        );
        let old = header_list(&["v2.channel.k8s.io", "channel.k8s.io"]);
        assert_eq!(
            negotiate(&old, REMOTECOMMAND_PROTOCOLS),
            Some("v2.channel.k8s.io")
        );
        assert_eq!(
            negotiate(&header_list(&["v9"]), REMOTECOMMAND_PROTOCOLS),
            None
        );
    }

    #[test]
    fn streams_a_command_needs() {
        for (proto, stdin, stdout, stderr, tty, want) in [
            (
                "v4.channel.k8s.io",
                false,
                true,
                true,
                false,
                vec!["error", "stdout", "stderr"],
            ),
            (
                "v4.channel.k8s.io",
                true,
                true,
                true,
                false,
                vec!["error", "stdin", "stdout", "stderr"],
            ),
            (
                "v4.channel.k8s.io",
                true,
                true,
                true,
                true,
                vec!["error", "stdin", "stdout", "resize"],
            ),
            (
                "v2.channel.k8s.io",
                true,
                true,
                false,
                true,
                vec!["error", "stdin", "stdout"],
            ),
        ] {
            assert_eq!(
                expected_streams(proto, stdin, stdout, stderr, tty),
                want,
                "{proto}"
            );
        }
    }

    #[test]
    fn error_stream_by_version() {
        let ok = json!({"metadata": {}, "status": "Success"});
        let bad = crate::server::exit_status(&["false".into()], Some(1), None);
        assert_eq!(
            error_stream_payload("v4.channel.k8s.io", &ok),
            Some(br#"{"metadata":{},"status":"Success"}"#.to_vec())
        );
        let v4: serde_json::Value = serde_json::from_slice(
            &error_stream_payload("v4.channel.k8s.io", &bad).expect("payload"),
        )
        .expect("json");
        assert_eq!(v4["details"]["causes"][0]["message"], "1");
        assert_eq!(error_stream_payload("v3.channel.k8s.io", &ok), None);
        let text = error_stream_payload("v2.channel.k8s.io", &bad).expect("text");
        assert!(String::from_utf8_lossy(&text).contains("exit code 1"));
    }

    #[test]
    fn port_forward_streams_pair_up() {
        let h = Headers::new()
            .with("streamType", "data")
            .with("port", "8080")
            .with("requestID", "4");
        assert_eq!(
            classify_pf_stream(&h, 3),
            Ok(PfStream {
                data: true,
                port: 8080,
                key: "4".into()
            })
        );
        // Without requestID the data stream (id 3) pairs with the error stream (id 1).
        let err = Headers::new()
            .with("streamType", "error")
            .with("port", "80");
        let data = Headers::new().with("streamType", "data").with("port", "80");
        assert_eq!(
            classify_pf_stream(&err, 1).map(|p| p.key),
            classify_pf_stream(&data, 3).map(|p| p.key)
        );
        for bad in [
            Headers::new()
                .with("streamType", "stdin")
                .with("port", "80"),
            Headers::new().with("streamType", "data"),
            Headers::new().with("streamType", "data").with("port", "0"),
            Headers::new()
                .with("streamType", "data")
                .with("port", "70000"),
        ] {
            assert!(classify_pf_stream(&bad, 1).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn websocket_ports() {
        let q = |s: &str| crate::server::query_pairs(Some(s));
        assert_eq!(
            ws_ports(&q("ports=80,443&ports=8080")),
            Ok(vec![80, 443, 8080])
        );
        assert!(ws_ports(&q("ports=http")).is_err());
        assert!(ws_ports(&q("x=1")).is_err());
    }

    #[tokio::test]
    async fn spdy_exec_runs_a_command_end_to_end() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "cat; echo err >&2; exit 3"]);
        let opts = CommandOptions {
            command: vec!["sh".into()],
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        };
        let server = tokio::spawn(serve_spdy_exec(b, "v4.channel.k8s.io", opts, Ok(cmd)));
        let (client, _) = Session::start(a, SpdyRole::Client);
        let open = |t: &str| client.open(Headers::new().with("streamType", t));
        let mut error = open("error").await.expect("error");
        let stdin = open("stdin").await.expect("stdin");
        let mut stdout = open("stdout").await.expect("stdout");
        let mut stderr = open("stderr").await.expect("stderr");
        stdin
            .writer
            .write(Bytes::from_static(b"hello\n"))
            .await
            .expect("write");
        stdin.writer.finish().await.expect("fin");
        let mut out = Vec::new();
        while let Some(b) = stdout.data.recv().await {
            out.extend_from_slice(&b);
        }
        assert_eq!(out, b"hello\n");
        let mut err = Vec::new();
        while let Some(b) = stderr.data.recv().await {
            err.extend_from_slice(&b);
        }
        assert_eq!(err, b"err\n");
        let mut status = Vec::new();
        while let Some(b) = error.data.recv().await {
            status.extend_from_slice(&b);
        }
        let v: serde_json::Value = serde_json::from_slice(&status).expect("status json");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
        // As kubectl does once it has the status: close the connection; the server ends.
        client.shutdown().await;
        server.await.expect("server");
    }

    async fn upper_echo_server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1024];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 || c.write_all(&buf[..n].to_ascii_uppercase()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn websocket_port_forward_channels() {
        use tokio_tungstenite::tungstenite::protocol::Role as WsRole;
        let port = upper_echo_server().await;
        let (a, b) = tokio::io::duplex(64 * 1024);
        let server_ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(b, WsRole::Server, None).await;
        tokio::spawn(serve_ws_portforward(
            server_ws,
            Target::Addr(IpAddr::from([127, 0, 0, 1])),
            vec![port, 1],
            "default/p".into(),
        ));
        let mut ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(a, WsRole::Client, None).await;
        // Each channel opens with its port, little-endian.
        let mut openers = Vec::new();
        for _ in 0..4 {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => openers.push(b.to_vec()),
                other => panic!("unexpected {other:?}"),
            }
        }
        let p = port.to_le_bytes();
        assert_eq!(
            openers,
            vec![
                vec![0, p[0], p[1]],
                vec![1, p[0], p[1]],
                vec![2, 1, 0],
                vec![3, 1, 0]
            ]
        );
        ws.send(Message::Binary(Bytes::from_static(b"\x00hello")))
            .await
            .expect("send");
        let mut data = Vec::new();
        let mut error = String::new();
        while data != b"HELLO" || error.is_empty() {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => match b[0] {
                    0 => data.extend_from_slice(&b[1..]),
                    3 => error.push_str(&String::from_utf8_lossy(&b[1..])),
                    other => panic!("channel {other}"),
                },
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(
            error.contains("error forwarding port 1 to pod default/p"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn attach_relays_output_and_stdin() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "read x; echo got $x; echo oops >&2"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let cio = crate::logs::ContainerIo::start(
            child.stdout.take(),
            child.stderr.take(),
            child
                .stdin
                .take()
                .map(|s| Box::new(s) as crate::logs::StdinWriter),
            true,
            None,
            &dir.path().join("0.log"),
        )
        .expect("io");
        let (in_tx, in_rx) = mpsc::channel(4);
        let (out_tx, mut out_rx) = mpsc::channel(16);
        let core = tokio::spawn(attach_core(cio, Some(in_rx), out_tx, true, true, false));
        in_tx
            .send(Bytes::from_static(b"hi\n"))
            .await
            .expect("stdin");
        drop(in_tx);
        let mut got = Vec::new();
        while let Some(m) = out_rx.recv().await {
            got.push(m);
        }
        core.await.expect("core");
        let _ = child.wait().await;
        let mut out = Vec::new();
        let mut err = Vec::new();
        for (ch, b) in got {
            if ch == 1 {
                out.extend_from_slice(&b)
            } else {
                err.extend_from_slice(&b)
            }
        }
        assert_eq!(
            (out.as_slice(), err.as_slice()),
            (&b"got hi\n"[..], &b"oops\n"[..])
        );
    }

    #[tokio::test]
    async fn spdy_port_forward_copies_both_ways() {
        let port = upper_echo_server().await;
        let (a, b) = tokio::io::duplex(64 * 1024);
        tokio::spawn(serve_spdy_portforward(
            b,
            Target::Addr(IpAddr::from([127, 0, 0, 1])),
            "default/p".into(),
        ));
        let (client, _) = Session::start(a, SpdyRole::Client);
        for (req, p) in [("0", port), ("1", 1)] {
            let h = |t: &str| {
                Headers::new()
                    .with("streamType", t)
                    .with("port", p.to_string())
                    .with("requestID", req)
            };
            let mut error = client.open(h("error")).await.expect("error");
            error.writer.finish().await.expect("fin");
            let mut data = client.open(h("data")).await.expect("data");
            if p == 1 {
                // Nothing listens on port 1: the error stream says so.
                let mut msg = Vec::new();
                while let Some(b) = error.data.recv().await {
                    msg.extend_from_slice(&b);
                }
                let msg = String::from_utf8_lossy(&msg);
                assert!(
                    msg.contains("error forwarding port 1 to pod default/p"),
                    "{msg}"
                );
                continue;
            }
            data.writer
                .write(Bytes::from_static(b"ping"))
                .await
                .expect("w");
            data.writer.finish().await.expect("fin");
            let mut got = Vec::new();
            while let Some(b) = data.data.recv().await {
                got.extend_from_slice(&b);
            }
            assert_eq!(got, b"PING");
        }
    }
}
