//! Container logs in the CRI log format (containerd's, read by kubelet): every line stored as
//! `<RFC3339Nano timestamp> <stdout|stderr> <F|P> <content>`, `P` marking a part of a line
//! longer than [`MAX_LINE`] (or cut by the stream's end without a newline). The agent owns
//! the containers' stdout/stderr pipes: a writer task stamps and stores each line, and hands
//! the raw bytes to whoever is attached ([`ContainerIo`]), which also holds the container's
//! stdin for `attach`.
//!
//! Reading ([`read_logs`]) serves kubelet's options: `tailLines` reads backwards from the end
//! only as far as needed, `limitBytes` stops reading once enough output is made, `timestamps`
//! prefixes each line with its time, `sinceTime`/`sinceSeconds` skip older lines.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::{Mutex, broadcast, watch};

/// Longest line stored as one record (containerd's default `max_container_log_line_size`).
pub const MAX_LINE: usize = 16 * 1024;

/// Which output a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub time: &'a str,
    pub stream: Stream,
    /// `P`: the line goes on in the next record.
    pub partial: bool,
    pub content: &'a [u8],
}

/// The stored form of one record.
pub fn format_record(time: &str, stream: Stream, partial: bool, content: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(time.len() + content.len() + 12);
    v.extend_from_slice(time.as_bytes());
    v.push(b' ');
    v.extend_from_slice(stream.as_str().as_bytes());
    v.extend_from_slice(if partial { b" P " } else { b" F " });
    v.extend_from_slice(content);
    v.push(b'\n');
    v
}

/// Parses one stored line (without its newline). `None` for a line not in the format.
pub fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?;
    let stream = match parts.next()? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let partial = match parts.next()? {
        b"P" => true,
        b"F" => false,
        _ => return None,
    };
    Some(Record {
        time,
        stream,
        partial,
        content: parts.next().unwrap_or(b""),
    })
}

/// Cuts a stream's bytes into records: whole lines (without the newline) and parts of lines
/// longer than [`MAX_LINE`]. Pure; keeps the unfinished line between calls.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; returns (content, partial) records complete so far.
    pub fn push(&mut self, data: &[u8]) -> Vec<(Vec<u8>, bool)> {
        let mut out = Vec::new();
        for &b in data {
            if b == b'\n' {
                out.push((std::mem::take(&mut self.pending), false));
            } else {
                self.pending.push(b);
                if self.pending.len() >= MAX_LINE {
                    out.push((std::mem::take(&mut self.pending), true));
                }
            }
        }
        out
    }

    /// The stream ended: what is left is a last partial record.
    pub fn finish(&mut self) -> Option<(Vec<u8>, bool)> {
        if self.pending.is_empty() {
            None
        } else {
            Some((std::mem::take(&mut self.pending), true))
        }
    }
}

/// What a log request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub timestamps: bool,
    /// Skip records older than this.
    pub since: Option<jiff::Timestamp>,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
}

/// Renders stored lines as the user sees them (kubelet's log output): the content, a newline
/// after each complete line, the record's time before each line's first record when asked.
/// `at_line_start` tracks partial records across calls. Pure.
pub fn render(stored: &[u8], opts: &LogOptions, at_line_start: &mut bool, out: &mut Vec<u8>) {
    for line in stored.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Some(r) = parse_record(line) else {
            continue;
        };
        if let Some(since) = opts.since
            && r.time.parse::<jiff::Timestamp>().is_ok_and(|t| t < since)
        {
            continue;
        }
        if opts.timestamps && *at_line_start {
            out.extend_from_slice(r.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(r.content);
        if !r.partial {
            out.push(b'\n');
        }
        *at_line_start = !r.partial;
    }
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

const CHUNK: u64 = 64 * 1024;

/// Reads a stored log as asked. Returns the rendered bytes and the offset of the first
/// stored byte not yet rendered (where following continues: always at a line boundary).
/// Reads only what is needed: the tail backwards from the end, and no further than
/// `limit_bytes` of output.
pub async fn read_logs(file: &Path, opts: &LogOptions) -> (Vec<u8>, u64) {
    let Ok(mut f) = tokio::fs::File::open(file).await else {
        return (Vec::new(), 0);
    };
    let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
    let mut start = 0u64;
    if let Some(n) = opts.tail_lines {
        let mut from = len;
        let mut window: Vec<u8> = Vec::new();
        loop {
            let next = from.saturating_sub(CHUNK);
            let mut chunk = vec![0u8; (from - next) as usize];
            if f.seek(std::io::SeekFrom::Start(next)).await.is_err()
                || f.read_exact(&mut chunk).await.is_err()
            {
                return (Vec::new(), len);
            }
            chunk.extend_from_slice(&window);
            window = chunk;
            from = next;
            let off = tail_offset(&window, n);
            if off > 0 || from == 0 {
                start = from + off as u64;
                break;
            }
        }
    }
    let limit = opts.limit_bytes.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut at_line_start = true;
    let mut pos = start;
    if f.seek(std::io::SeekFrom::Start(pos)).await.is_err() {
        return (Vec::new(), len);
    }
    let mut carry: Vec<u8> = Vec::new();
    while pos < len && out.len() < limit {
        let want = (len - pos).min(CHUNK) as usize;
        let mut buf = vec![0u8; want];
        if f.read_exact(&mut buf).await.is_err() {
            break;
        }
        pos += want as u64;
        carry.extend_from_slice(&buf);
        // Render whole stored lines only.
        let cut = carry.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        render(&carry[..cut], opts, &mut at_line_start, &mut out);
        carry.drain(..cut);
    }
    out.truncate(limit);
    (out, pos - carry.len() as u64)
}

/// Where a container's stdin is written: its pipe, or its terminal.
pub type StdinWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A running container's standard streams, as the agent holds them.
pub struct ContainerIo {
    /// The container's stdin (`stdin: true` in its spec), for `attach`.
    pub stdin: Mutex<Option<StdinWriter>>,
    /// The container's terminal (`tty: true`), resized by attached clients.
    pub tty: Option<PathBuf>,
    /// `stdinOnce`: the first attached client's end of stdin closes the container's.
    pub stdin_once: bool,
    out: broadcast::Sender<(Stream, Bytes)>,
    done: watch::Receiver<bool>,
    pub log: PathBuf,
}

impl std::fmt::Debug for ContainerIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerIo")
            .field("log", &self.log)
            .field("stdin_once", &self.stdin_once)
            .finish()
    }
}

/// Why a log request's query is refused (a `400` with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogOptionsError {
    #[error("{param}: invalid value {value:?}")]
    NotANumber { param: String, value: String },
    #[error("sinceTime: {0}")]
    SinceTime(String),
    #[error("sinceSeconds: must be greater than 0")]
    SinceSeconds,
    #[error("tailLines: must be greater than or equal to 0")]
    TailLines,
    #[error("limitBytes: must be greater than 0")]
    LimitBytes,
}

/// The options of a log request from its query (`sinceSeconds` counted from `now`).
pub fn options_from_query(
    pairs: &[(String, String)],
    now: jiff::Timestamp,
) -> Result<LogOptions, LogOptionsError> {
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let truthy = |k: &str| get(k).is_some_and(|v| matches!(v, "1" | "true" | "True" | "TRUE" | ""));
    let num = |k: &str| -> Result<Option<i64>, LogOptionsError> {
        get(k)
            .map(|v| {
                v.parse::<i64>().map_err(|_| LogOptionsError::NotANumber {
                    param: k.to_string(),
                    value: v.to_string(),
                })
            })
            .transpose()
    };
    let mut since = match get("sinceTime") {
        Some(t) => Some(
            t.parse::<jiff::Timestamp>()
                .map_err(|e| LogOptionsError::SinceTime(e.to_string()))?,
        ),
        None => None,
    };
    if let Some(secs) = num("sinceSeconds")? {
        if secs < 1 {
            return Err(LogOptionsError::SinceSeconds);
        }
        since = now.checked_sub(jiff::SignedDuration::from_secs(secs)).ok();
    }
    let tail_lines = match num("tailLines")? {
        Some(n) if n < 0 => return Err(LogOptionsError::TailLines),
        n => n.map(|n| n as usize),
    };
    let limit_bytes = match num("limitBytes")? {
        Some(n) if n < 1 => return Err(LogOptionsError::LimitBytes),
        n => n.map(|n| n as usize),
    };
    Ok(LogOptions {
        timestamps: truthy("timestamps"),
        since,
        tail_lines,
        limit_bytes,
    })
}

/// The current time as stored (RFC 3339 with nanoseconds, as Go's `RFC3339Nano`).
fn stamp() -> String {
    jiff::Timestamp::now().to_string()
}

impl ContainerIo {
    /// Starts storing `stdout`/`stderr` in `log` (created 0600, appended to) and hands them to
    /// attached clients.
    pub fn start<O, E>(
        stdout: Option<O>,
        stderr: Option<E>,
        stdin: Option<StdinWriter>,
        stdin_once: bool,
        tty: Option<PathBuf>,
        log: &Path,
    ) -> std::io::Result<Arc<ContainerIo>>
    where
        O: AsyncRead + Unpin + Send + 'static,
        E: AsyncRead + Unpin + Send + 'static,
    {
        let file = ferry_store::private_fs::private_open_options()
            .create(true)
            .append(true)
            .open(log)?;
        let (out, _) = broadcast::channel(256);
        let (done_tx, done) = watch::channel(false);
        let io = Arc::new(ContainerIo {
            stdin: Mutex::new(stdin),
            stdin_once,
            tty,
            out: out.clone(),
            done,
            log: log.to_path_buf(),
        });
        let (rec_tx, mut rec_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(256);
        let mut readers = tokio::task::JoinSet::new();
        fn pump<R: AsyncRead + Unpin + Send + 'static>(
            set: &mut tokio::task::JoinSet<()>,
            pipe: Option<R>,
            stream: Stream,
            out: broadcast::Sender<(Stream, Bytes)>,
            rec: tokio::sync::mpsc::Sender<Vec<u8>>,
        ) {
            let Some(mut pipe) = pipe else { return };
            set.spawn(async move {
                let mut split = LineSplitter::default();
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    let n = match pipe.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let _ = out.send((stream, Bytes::copy_from_slice(&buf[..n])));
                    let t = stamp();
                    let mut block = Vec::new();
                    for (content, partial) in split.push(&buf[..n]) {
                        block.extend(format_record(&t, stream, partial, &content));
                    }
                    if !block.is_empty() && rec.send(block).await.is_err() {
                        break;
                    }
                }
                if let Some((content, partial)) = split.finish() {
                    let _ = rec
                        .send(format_record(&stamp(), stream, partial, &content))
                        .await;
                }
            });
        }
        pump(
            &mut readers,
            stdout,
            Stream::Stdout,
            out.clone(),
            rec_tx.clone(),
        );
        pump(&mut readers, stderr, Stream::Stderr, out, rec_tx.clone());
        drop(rec_tx);
        tokio::spawn(async move {
            let mut file = tokio::fs::File::from_std(file);
            while let Some(block) = rec_rx.recv().await {
                if file.write_all(&block).await.is_err() {
                    tracing::warn!("container log: write failed");
                }
            }
            let _ = file.flush().await;
            while readers.join_next().await.is_some() {}
            let _ = done_tx.send(true);
        });
        Ok(io)
    }

    /// Output from now on, for an attached client.
    pub fn subscribe(&self) -> broadcast::Receiver<(Stream, Bytes)> {
        self.out.subscribe()
    }

    /// Resolves when the container's output has ended (its streams closed) and is stored.
    pub async fn ended(&self) {
        let mut d = self.done.clone();
        let _ = d.wait_for(|v| *v).await;
    }

    /// Writes to the container's stdin (if it has one open).
    pub async fn write_stdin(&self, data: &[u8]) -> bool {
        let mut g = self.stdin.lock().await;
        match g.as_mut() {
            Some(s) => {
                if s.write_all(data).await.is_err() || s.flush().await.is_err() {
                    *g = None;
                    return false;
                }
                true
            }
            None => false,
        }
    }

    /// Applies a window size to the container's terminal (if it has one).
    pub async fn resize(&self, width: u16, height: u16) {
        if let Some(path) = &self.tty {
            let _ = tokio::process::Command::new("stty")
                .arg("-F")
                .arg(path)
                .args(["rows", &height.to_string(), "cols", &width.to_string()])
                .status()
                .await;
        }
    }

    /// Closes the container's stdin (EOF).
    pub async fn close_stdin(&self) {
        if let Some(mut s) = self.stdin.lock().await.take() {
            let _ = s.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_options() {
        let now: jiff::Timestamp = "2026-01-01T00:01:00Z".parse().expect("ts");
        let q = |s: &str| options_from_query(&crate::server::query_pairs(Some(s)), now);
        let o = q("timestamps=true&sinceSeconds=60&tailLines=3&limitBytes=10").expect("ok");
        assert!(o.timestamps);
        assert_eq!(o.since, Some("2026-01-01T00:00:00Z".parse().expect("ts")));
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(3), Some(10)));
        let o = q("sinceTime=2026-01-01T00:00:30.5Z").expect("ok");
        assert_eq!(o.since, Some("2026-01-01T00:00:30.5Z".parse().expect("ts")));
        assert!(!o.timestamps);
        for bad in [
            "sinceSeconds=0",
            "tailLines=-1",
            "limitBytes=0",
            "sinceTime=yesterday",
            "tailLines=x",
        ] {
            assert!(q(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_round_trip() {
        let r = format_record(
            "2026-01-02T03:04:05.123456789Z",
            Stream::Stderr,
            true,
            b"a b",
        );
        assert_eq!(r, b"2026-01-02T03:04:05.123456789Z stderr P a b\n");
        let p = parse_record(&r[..r.len() - 1]).expect("parse");
        assert_eq!(
            p,
            Record {
                time: "2026-01-02T03:04:05.123456789Z",
                stream: Stream::Stderr,
                partial: true,
                content: b"a b"
            }
        );
        // An empty line is a record with empty content.
        assert_eq!(
            parse_record(b"t stdout F ").map(|r| r.content.to_vec()),
            Some(Vec::new())
        );
        assert_eq!(parse_record(b"t stdin F x"), None);
        assert_eq!(parse_record(b"garbage"), None);
    }

    #[test]
    fn lines_are_split_and_long_ones_cut() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"ab"), vec![]);
        assert_eq!(
            s.push(b"c\n\nde"),
            vec![(b"abc".to_vec(), false), (Vec::new(), false)]
        );
        assert_eq!(s.finish(), Some((b"de".to_vec(), true)));
        assert_eq!(s.finish(), None);
        let long = vec![b'x'; MAX_LINE + 5];
        let mut recs = s.push(&long);
        recs.extend(s.push(b"\n"));
        assert_eq!(recs.len(), 2);
        assert!(recs[0].1 && recs[0].0.len() == MAX_LINE);
        assert_eq!(recs[1], (vec![b'x'; 5], false));
    }

    fn stored() -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(format_record(
            "2026-01-01T00:00:01Z",
            Stream::Stdout,
            false,
            b"one",
        ));
        v.extend(format_record(
            "2026-01-01T00:00:02.5Z",
            Stream::Stderr,
            true,
            b"tw",
        ));
        v.extend(format_record(
            "2026-01-01T00:00:03Z",
            Stream::Stderr,
            false,
            b"o",
        ));
        v.extend(format_record(
            "2026-01-01T00:00:04Z",
            Stream::Stdout,
            false,
            b"three",
        ));
        v
    }

    #[test]
    fn rendering_follows_the_options() {
        let r = |o: LogOptions| {
            let mut out = Vec::new();
            render(&stored(), &o, &mut true, &mut out);
            String::from_utf8(out).expect("utf8")
        };
        assert_eq!(r(LogOptions::default()), "one\ntwo\nthree\n");
        assert_eq!(
            r(LogOptions {
                timestamps: true,
                ..Default::default()
            }),
            "2026-01-01T00:00:01Z one\n2026-01-01T00:00:02.5Z two\n2026-01-01T00:00:04Z three\n"
        );
        assert_eq!(
            r(LogOptions {
                since: Some("2026-01-01T00:00:03Z".parse().expect("ts")),
                ..Default::default()
            }),
            "o\nthree\n"
        );
    }

    #[tokio::test]
    async fn reading_tails_limits_and_offsets() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("0.log");
        // 20,000 records (several 64 KiB chunks).
        let mut text = Vec::new();
        for i in 0..20_000 {
            text.extend(format_record(
                "2026-01-01T00:00:00.000000001Z",
                Stream::Stdout,
                false,
                format!("line {i}").as_bytes(),
            ));
        }
        std::fs::write(&path, &text).expect("write");
        let len = text.len() as u64;
        let o = |tail: Option<usize>, limit: Option<usize>| LogOptions {
            tail_lines: tail,
            limit_bytes: limit,
            ..Default::default()
        };
        let (all, end) = read_logs(&path, &o(None, None)).await;
        assert_eq!(end, len);
        assert!(all.starts_with(b"line 0\nline 1\n") && all.ends_with(b"line 19999\n"));
        let (t, end) = read_logs(&path, &o(Some(2), None)).await;
        assert_eq!((t.as_slice(), end), (&b"line 19998\nline 19999\n"[..], len));
        let (t, _) = read_logs(&path, &o(Some(15_000), None)).await;
        assert!(t.starts_with(b"line 5000\n") && t.ends_with(b"line 19999\n"));
        // limitBytes stops early: only the first chunk is read.
        let (t, end) = read_logs(&path, &o(None, Some(12))).await;
        assert_eq!(t, b"line 0\nline ");
        assert!(end <= CHUNK, "read {end} bytes for 12");
        let (t, _) = read_logs(&path, &o(Some(0), None)).await;
        assert!(t.is_empty());
        let (t, end) = read_logs(&dir.path().join("missing.log"), &o(Some(3), None)).await;
        assert!(t.is_empty() && end == 0);
    }

    #[tokio::test]
    async fn the_writer_stores_stamped_lines_and_feeds_attachers() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = dir.path().join("0.log");
        let (mut out_w, out_r) = tokio::io::duplex(1024);
        let (mut err_w, err_r) = tokio::io::duplex(1024);
        let io =
            ContainerIo::start(Some(out_r), Some(err_r), None, false, None, &log).expect("start");
        let mut sub = io.subscribe();
        out_w.write_all(b"hello\nwor").await.expect("w");
        assert_eq!(
            sub.recv().await.expect("recv"),
            (Stream::Stdout, Bytes::from_static(b"hello\nwor"))
        );
        err_w.write_all(b"oops\n").await.expect("w");
        out_w.write_all(b"ld\n").await.expect("w");
        drop(out_w);
        drop(err_w);
        io.ended().await;
        let stored = std::fs::read(&log).expect("read");
        let lines: Vec<Record> = stored
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| parse_record(l).expect("record"))
            .collect();
        let mut contents: Vec<(Stream, &[u8])> =
            lines.iter().map(|r| (r.stream, r.content)).collect();
        contents.sort();
        assert_eq!(
            contents,
            vec![
                (Stream::Stdout, &b"hello"[..]),
                (Stream::Stdout, &b"world"[..]),
                (Stream::Stderr, &b"oops"[..])
            ]
        );
        for r in &lines {
            assert!(r.time.parse::<jiff::Timestamp>().is_ok(), "{}", r.time);
        }
    }
}
