//! A SPDY/3.1 session over any byte stream (the connection an HTTP upgrade hands over):
//! one task reads frames and routes them to streams, one task writes frames in order (the
//! header compressor's order is the wire's order). Stream data is delivered as it arrives;
//! the session answers PINGs, replies to every stream the peer opens (as Go's spdystream
//! server handler does) and ignores WINDOW_UPDATE and SETTINGS (spdystream, the peer of every
//! kubectl, does no flow control either).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::frame::{self, Frame, rst};
use crate::headers::{Compressor, Decompressor, Headers};

/// Most data sent in one DATA frame (Go's spdystream sends at most this much too).
pub const DATA_CHUNK: usize = 32 * 1024;

/// Who opened the session: the client's streams have odd ids, the server's even ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// The session (or the stream) is gone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SPDY session closed")]
pub struct Closed;

enum Out {
    Frame(Frame),
    Syn {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    Reply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    Shutdown,
}

/// A stream: its headers, the data the peer sends on it (the receiver ends at the peer's FIN
/// or RST_STREAM, or when the session ends), and the handle to send on it.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub data: mpsc::Receiver<Bytes>,
    pub writer: StreamWriter,
    /// Becomes true when the peer resets the stream or the session ends (see
    /// [`Aborted::wait`]).
    pub aborted: Aborted,
}

/// Whether a stream was aborted: RST_STREAM from the peer, or the session's end.
#[derive(Clone)]
pub struct Aborted(watch::Receiver<bool>);

impl Aborted {
    /// Resolves once the stream is aborted.
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|v| *v).await;
    }

    pub fn is_aborted(&self) -> bool {
        *self.0.borrow()
    }
}

/// Sends on one stream. Cheap to clone.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Out>,
}

impl StreamWriter {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Sends `data` (split into frames of at most [`DATA_CHUNK`]).
    pub async fn write(&self, data: Bytes) -> Result<(), Closed> {
        if data.is_empty() {
            return Ok(());
        }
        for f in frame::data_frames(self.id, data, false, DATA_CHUNK) {
            self.out.send(Out::Frame(f)).await.map_err(|_| Closed)?;
        }
        Ok(())
    }

    /// Half-closes the stream (an empty DATA frame with FIN).
    pub async fn finish(&self) -> Result<(), Closed> {
        self.out
            .send(Out::Frame(Frame::Data {
                stream: self.id,
                fin: true,
                data: Bytes::new(),
            }))
            .await
            .map_err(|_| Closed)
    }

    /// Aborts the stream (RST_STREAM).
    pub async fn reset(&self, status: u32) -> Result<(), Closed> {
        self.out
            .send(Out::Frame(Frame::RstStream {
                stream: self.id,
                status,
            }))
            .await
            .map_err(|_| Closed)
    }
}

/// The session's handle: open streams, close it, learn when the peer is gone.
#[derive(Clone)]
pub struct Session {
    out: mpsc::Sender<Out>,
    next_id: Arc<AtomicU32>,
    routes: Routes,
    aborts: Aborts,
    ended: watch::Receiver<bool>,
    last_seen: Arc<AtomicU32>,
}

type Routes = Arc<std::sync::Mutex<HashMap<u32, mpsc::Sender<Bytes>>>>;
type Aborts = Arc<std::sync::Mutex<HashMap<u32, watch::Sender<bool>>>>;

/// A new stream's abort signal, registered (entries nobody listens to any more are pruned).
fn register_abort(aborts: &Aborts, id: u32) -> Aborted {
    let (tx, rx) = watch::channel(false);
    if let Ok(mut a) = aborts.lock() {
        a.retain(|_, t| !t.is_closed());
        a.insert(id, tx);
    }
    Aborted(rx)
}

impl Session {
    /// Starts a session on `io`; returns its handle and the streams the peer opens.
    pub fn start<T>(io: T, role: Role) -> (Session, mpsc::Receiver<Stream>)
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out_tx, out_rx) = mpsc::channel::<Out>(256);
        let (in_tx, in_rx) = mpsc::channel::<Stream>(64);
        let (ended_tx, ended_rx) = watch::channel(false);
        let routes: Routes = Arc::default();
        let aborts: Aborts = Arc::default();
        let last_seen = Arc::new(AtomicU32::new(0));
        tokio::spawn(write_loop(wr, out_rx));
        tokio::spawn(read_loop(
            rd,
            role,
            out_tx.clone(),
            in_tx,
            Tables {
                routes: routes.clone(),
                aborts: aborts.clone(),
                last_seen: last_seen.clone(),
            },
            ended_tx,
        ));
        let session = Session {
            out: out_tx,
            next_id: Arc::new(AtomicU32::new(match role {
                Role::Client => 1,
                Role::Server => 2,
            })),
            routes,
            aborts,
            ended: ended_rx,
            last_seen,
        };
        (session, in_rx)
    }

    /// Opens a stream with `headers` (SYN_STREAM); the peer's reply is not awaited.
    pub async fn open(&self, headers: Headers) -> Result<Stream, Closed> {
        let id = self.next_id.fetch_add(2, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel(32);
        if let Ok(mut r) = self.routes.lock() {
            r.insert(id, tx);
        }
        self.out
            .send(Out::Syn {
                stream: id,
                fin: false,
                headers: headers.clone(),
            })
            .await
            .map_err(|_| Closed)?;
        Ok(Stream {
            id,
            headers,
            data: rx,
            writer: StreamWriter {
                id,
                out: self.out.clone(),
            },
            aborted: register_abort(&self.aborts, id),
        })
    }

    /// Sends a PING (the peer answers it; see [`Session::ended`] for liveness).
    pub async fn ping(&self, id: u32) -> Result<(), Closed> {
        self.out
            .send(Out::Frame(Frame::Ping { id }))
            .await
            .map_err(|_| Closed)
    }

    /// Says goodbye (GOAWAY with the last stream the peer opened). Frames queued before it
    /// are still written.
    pub async fn go_away(&self) -> Result<(), Closed> {
        self.out
            .send(Out::Frame(Frame::GoAway {
                last_good: self.last_seen.load(Ordering::SeqCst),
                status: 0,
            }))
            .await
            .map_err(|_| Closed)
    }

    /// Writes what is queued, then closes the sending side of the connection (the peer
    /// reads EOF). Nothing is sent after it.
    pub async fn shutdown(&self) {
        let _ = self.out.send(Out::Shutdown).await;
    }

    /// Resolves when the peer's side of the connection has ended (EOF, error, protocol
    /// violation).
    pub async fn ended(&self) {
        let mut e = self.ended.clone();
        let _ = e.wait_for(|v| *v).await;
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::Receiver<Out>) {
    let mut z = Compressor::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut stop = false;
        // Batch whatever is queued into one write.
        while let Some(m) = next {
            let f = match m {
                Out::Shutdown => {
                    stop = true;
                    None
                }
                Out::Frame(f) => Some(f),
                Out::Syn {
                    stream,
                    fin,
                    headers,
                } => z.compress(&headers).ok().map(|block| Frame::SynStream {
                    stream,
                    associated: 0,
                    priority: 0,
                    flags: if fin { frame::FLAG_FIN } else { 0 },
                    block,
                }),
                Out::Reply {
                    stream,
                    fin,
                    headers,
                } => z
                    .compress(&headers)
                    .ok()
                    .map(|block| Frame::SynReply { stream, fin, block }),
            };
            if let Some(f) = f {
                f.encode(&mut buf);
            }
            next = if !stop && buf.len() < 256 * 1024 {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
            return;
        }
        buf.clear();
        if stop {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// What the reader shares with the session's handle.
struct Tables {
    routes: Routes,
    aborts: Aborts,
    last_seen: Arc<AtomicU32>,
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    role: Role,
    out: mpsc::Sender<Out>,
    incoming: mpsc::Sender<Stream>,
    tables: Tables,
    ended: watch::Sender<bool>,
) {
    let Tables {
        routes,
        aborts,
        last_seen,
    } = tables;
    let mut z = Decompressor::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut incoming = Some(incoming);
    let route = |id: u32| routes.lock().ok().and_then(|r| r.get(&id).cloned());
    let unroute = |id: u32| {
        if let Ok(mut r) = routes.lock() {
            r.remove(&id);
        }
    };
    'conn: loop {
        loop {
            let parsed = match frame::parse(&buf) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!("spdy: {e}");
                    let _ = out
                        .send(Out::Frame(Frame::GoAway {
                            last_good: last_seen.load(Ordering::SeqCst),
                            status: 1,
                        }))
                        .await;
                    break 'conn;
                }
            };
            let Some((f, used)) = parsed else { break };
            let _ = buf.split_to(used);
            match f {
                Frame::Data { stream, fin, data } => {
                    if let Some(tx) = route(stream) {
                        if !data.is_empty() && tx.send(data).await.is_err() {
                            // The consumer does not want more: nothing to deliver to.
                        }
                        if fin {
                            unroute(stream);
                        }
                    }
                }
                Frame::SynStream {
                    stream,
                    flags,
                    block,
                    ..
                } => {
                    let headers = match z.decompress(&block) {
                        Ok(h) => h,
                        Err(e) => {
                            // The compression context is lost: the session cannot go on.
                            tracing::debug!("spdy: stream {stream}: {e}");
                            break 'conn;
                        }
                    };
                    let from_peer = match role {
                        Role::Server => stream % 2 == 1,
                        Role::Client => stream % 2 == 0,
                    };
                    if !from_peer || route(stream).is_some() {
                        let _ = out
                            .send(Out::Frame(Frame::RstStream {
                                stream,
                                status: if from_peer {
                                    rst::STREAM_IN_USE
                                } else {
                                    rst::PROTOCOL_ERROR
                                },
                            }))
                            .await;
                        continue;
                    }
                    let Some(inc) = incoming.as_ref() else {
                        let _ = out
                            .send(Out::Frame(Frame::RstStream {
                                stream,
                                status: rst::REFUSED_STREAM,
                            }))
                            .await;
                        continue;
                    };
                    last_seen.fetch_max(stream, Ordering::SeqCst);
                    let (tx, rx) = mpsc::channel(32);
                    if flags & frame::FLAG_FIN == 0
                        && let Ok(mut r) = routes.lock()
                    {
                        r.insert(stream, tx);
                    }
                    let _ = out
                        .send(Out::Reply {
                            stream,
                            fin: false,
                            headers: Headers::new(),
                        })
                        .await;
                    let s = Stream {
                        id: stream,
                        headers,
                        data: rx,
                        writer: StreamWriter {
                            id: stream,
                            out: out.clone(),
                        },
                        aborted: register_abort(&aborts, stream),
                    };
                    if inc.send(s).await.is_err() {
                        incoming = None;
                    }
                }
                Frame::SynReply { stream, fin, block } | Frame::Headers { stream, fin, block } => {
                    if let Err(e) = z.decompress(&block) {
                        tracing::debug!("spdy: stream {stream}: {e}");
                        break 'conn;
                    }
                    if fin {
                        unroute(stream);
                    }
                }
                Frame::RstStream { stream, .. } => {
                    unroute(stream);
                    if let Some(tx) = aborts.lock().ok().and_then(|mut a| a.remove(&stream)) {
                        let _ = tx.send(true);
                    }
                }
                Frame::Ping { id } => {
                    // Answer the peer's pings (ids of the other parity); ours come back.
                    let theirs = match role {
                        Role::Server => id % 2 == 1,
                        Role::Client => id % 2 == 0,
                    };
                    if theirs {
                        let _ = out.send(Out::Frame(Frame::Ping { id })).await;
                    }
                }
                Frame::GoAway { .. } => incoming = None,
                Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Ignored { .. } => {}
            }
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    if let Ok(mut r) = routes.lock() {
        r.clear();
    }
    if let Ok(mut a) = aborts.lock() {
        for (_, tx) in a.drain() {
            let _ = tx.send(true);
        }
    }
    drop(incoming);
    let _ = ended.send(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(rx: &mut mpsc::Receiver<Bytes>) -> Vec<u8> {
        let mut v = Vec::new();
        while let Some(b) = rx.recv().await {
            v.extend_from_slice(&b);
        }
        v
    }

    #[tokio::test]
    async fn streams_carry_data_both_ways() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, _) = Session::start(a, Role::Client);
        let (_server, mut incoming) = Session::start(b, Role::Server);
        let mut s = client
            .open(Headers::new().with("streamType", "stdin"))
            .await
            .expect("open");
        let mut t = client
            .open(Headers::new().with("streamType", "stdout"))
            .await
            .expect("open");
        assert_eq!((s.id, t.id), (1, 3));
        let mut srv_s = incoming.recv().await.expect("stream");
        let srv_t = incoming.recv().await.expect("stream");
        assert_eq!(srv_s.headers.get("streamtype"), Some("stdin"));
        assert_eq!(srv_t.headers.get("StreamType"), Some("stdout"));
        // 100 KiB through a 1 KiB pipe: frames are split and interleaving is fine.
        let big: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
        let send = {
            let w = s.writer.clone();
            let big = Bytes::from(big.clone());
            tokio::spawn(async move {
                w.write(big).await.expect("write");
                w.finish().await.expect("fin");
            })
        };
        assert_eq!(read_all(&mut srv_s.data).await, big);
        send.await.expect("send");
        srv_t
            .writer
            .write(Bytes::from_static(b"out"))
            .await
            .expect("write");
        srv_t.writer.finish().await.expect("fin");
        assert_eq!(read_all(&mut t.data).await, b"out");
        // The server's end of stream 1 was never finished; a reset ends it for the client.
        assert!(!srv_t.aborted.is_aborted());
        srv_s.writer.reset(rst::CANCEL).await.expect("reset");
        assert!(s.data.recv().await.is_none());
        s.aborted.wait().await;
    }

    #[tokio::test]
    async fn pings_are_answered_and_eof_ends_the_session() {
        let (a, mut b) = tokio::io::duplex(1024);
        let (server, mut incoming) = Session::start(a, Role::Server);
        b.write_all(&Frame::Ping { id: 7 }.to_bytes())
            .await
            .expect("ping");
        let mut got = [0u8; 12];
        b.read_exact(&mut got).await.expect("pong");
        assert_eq!(&got[..], &Frame::Ping { id: 7 }.to_bytes()[..]);
        // A stream whose SYN_STREAM carries FIN delivers no data, but is replied to.
        let block = Compressor::new()
            .compress(&Headers::new().with("streamtype", "error"))
            .expect("z");
        let syn = Frame::SynStream {
            stream: 1,
            associated: 0,
            priority: 0,
            flags: frame::FLAG_FIN,
            block,
        };
        b.write_all(&syn.to_bytes()).await.expect("syn");
        let mut s = incoming.recv().await.expect("stream");
        assert!(s.data.recv().await.is_none());
        let mut reply = vec![0u8; 8];
        b.read_exact(&mut reply).await.expect("reply");
        assert_eq!(&reply[..4], &[0x80, 0x03, 0x00, 0x02]);
        assert!(!s.aborted.is_aborted());
        drop(b);
        server.ended().await;
        assert!(incoming.recv().await.is_none());
        // The end of the session aborts every stream.
        s.aborted.wait().await;
    }

    #[tokio::test]
    async fn random_input_always_ends_the_session() {
        // A small deterministic generator: inputs that start like control frames, data
        // frames and SYN_STREAMs with random header blocks.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..300 {
            let len = (next() % 200) as usize;
            let mut input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            match round % 3 {
                0 if input.len() >= 4 => input[..4].copy_from_slice(&[0x80, 0x03, 0x00, 0x01]),
                1 if !input.is_empty() => input[0] &= 0x7f,
                _ => {}
            }
            let (a, mut b) = tokio::io::duplex(4096);
            let (server, _incoming) = Session::start(a, Role::Server);
            let _ = b.write_all(&input).await;
            drop(b);
            tokio::time::timeout(std::time::Duration::from_secs(5), server.ended())
                .await
                .unwrap_or_else(|_| panic!("session did not end on {input:02x?}"));
        }
    }

    #[tokio::test]
    async fn garbage_ends_the_session_with_goaway() {
        let (a, mut b) = tokio::io::duplex(1024);
        let (server, _incoming) = Session::start(a, Role::Server);
        b.write_all(&[0x80, 0x02, 0, 1, 0, 0, 0, 0])
            .await
            .expect("write");
        let mut got = [0u8; 16];
        b.read_exact(&mut got).await.expect("goaway");
        assert_eq!(&got[..4], &[0x80, 0x03, 0x00, 0x07]);
        server.ended().await;
    }
}
