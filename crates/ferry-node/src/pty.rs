//! Commands with a terminal (`exec -t`, as kubelet gives them through the container runtime):
//! a pseudo-terminal pair from `openpty`, the command run under `setsid -c` so the terminal
//! is its controlling one, the client's keystrokes written to the master side and the
//! master's output sent back as stdout; window size changes (the resize stream's
//! `{"Width":..,"Height":..}`) applied with `stty`.

use crate::streaming::StreamError;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// A terminal size from a resize message (kubelet's `TerminalSize`).
pub fn parse_resize(msg: &[u8]) -> Option<(u16, u16)> {
    let v: serde_json::Value = serde_json::from_slice(msg).ok()?;
    let w = v.get("Width")?.as_u64()?;
    let h = v.get("Height")?.as_u64()?;
    Some((u16::try_from(w).ok()?, u16::try_from(h).ok()?))
}

/// Splits a stream of concatenated JSON resize messages (as they arrive on a SPDY stream).
pub fn split_resizes(buf: &mut Vec<u8>) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    loop {
        let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<serde_json::Value>();
        match it.next() {
            Some(Ok(v)) => {
                let used = it.byte_offset();
                if let Some(s) = serde_json::to_vec(&v).ok().and_then(|b| parse_resize(&b)) {
                    out.push(s);
                }
                buf.drain(..used);
            }
            Some(Err(e)) if e.is_eof() => return out,
            Some(Err(_)) => {
                buf.clear();
                return out;
            }
            None => return out,
        }
    }
}

/// argv that runs `command` as a session leader with its terminal as controlling terminal.
pub fn with_controlling_tty(command: &[String]) -> Vec<String> {
    let mut v = vec!["setsid".to_string(), "-c".to_string()];
    v.extend(command.iter().cloned());
    v
}

fn slave_path(fd: &OwnedFd) -> std::io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Runs `cmd` (already built around [`with_controlling_tty`]) on a new terminal: `stdin`
/// goes to it, its output to `out`, sizes from `resize` are applied. Returns the exit code.
pub async fn run(
    mut cmd: tokio::process::Command,
    stdin: Option<mpsc::Receiver<Bytes>>,
    out: mpsc::Sender<Bytes>,
    mut resize: mpsc::Receiver<(u16, u16)>,
) -> Result<i32, StreamError> {
    let pair = nix::pty::openpty(None, None)
        .map_err(|e| StreamError::Terminal(format!("openpty: {e}")))?;
    let path = slave_path(&pair.slave).map_err(|e| StreamError::Terminal(format!("pty: {e}")))?;
    let fd = |f: &OwnedFd| {
        f.try_clone()
            .map_err(|e| StreamError::Terminal(format!("pty: {e}")))
    };
    cmd.stdin(std::process::Stdio::from(fd(&pair.slave)?))
        .stdout(std::process::Stdio::from(fd(&pair.slave)?))
        .stderr(std::process::Stdio::from(fd(&pair.slave)?))
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| StreamError::Exec(e.to_string()))?;
    // Only the command holds the terminal now (the Command keeps copies until dropped): its
    // end is the master's end of file.
    drop(cmd);
    drop(pair.slave);
    let master = std::fs::File::from(pair.master);
    let mut master_w = tokio::fs::File::from_std(
        master
            .try_clone()
            .map_err(|e| StreamError::Terminal(e.to_string()))?,
    );
    let mut master_r = tokio::fs::File::from_std(master);
    let sizes = {
        let path = path.clone();
        tokio::spawn(async move {
            while let Some((w, h)) = resize.recv().await {
                let _ = tokio::process::Command::new("stty")
                    .arg("-F")
                    .arg(&path)
                    .args(["rows", &h.to_string(), "cols", &w.to_string()])
                    .status()
                    .await;
            }
        })
    };
    let keys = stdin.map(|mut rx| {
        tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if master_w.write_all(&b).await.is_err() || master_w.flush().await.is_err() {
                    return;
                }
            }
        })
    });
    let pump = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        // EIO once the command and its children have closed the terminal.
        while let Ok(n) = master_r.read(&mut buf).await {
            if n == 0 || out.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                break;
            }
        }
    });
    let st = child.wait().await;
    let mut pump = pump;
    if tokio::time::timeout(std::time::Duration::from_secs(5), &mut pump)
        .await
        .is_err()
    {
        // A background process of the command still holds the terminal.
        pump.abort();
    }
    sizes.abort();
    if let Some(k) = keys {
        k.abort();
    }
    Ok(match st {
        Ok(s) => s.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + s.signal().unwrap_or(0)
        }),
        Err(_) => 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_messages() {
        assert_eq!(parse_resize(br#"{"Width":80,"Height":24}"#), Some((80, 24)));
        assert_eq!(parse_resize(br#"{"Width":-1,"Height":24}"#), None);
        let mut buf = br#"{"Width":80,"Height":24}{"Width":100,"Height":50}{"Wid"#.to_vec();
        assert_eq!(split_resizes(&mut buf), vec![(80, 24), (100, 50)]);
        assert_eq!(buf, br#"{"Wid"#);
        buf.extend_from_slice(br#"th":1,"Height":2}"#);
        assert_eq!(split_resizes(&mut buf), vec![(1, 2)]);
        assert!(buf.is_empty());
    }

    #[tokio::test]
    async fn a_command_gets_a_terminal_of_the_asked_size() {
        let argv = with_controlling_tty(&[
            "sh".into(),
            "-c".into(),
            "sleep 0.5; tty; stty size; read x; echo got $x".into(),
        ]);
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        let (in_tx, in_rx) = mpsc::channel(4);
        let (out_tx, mut out_rx) = mpsc::channel(16);
        let (rs_tx, rs_rx) = mpsc::channel(4);
        rs_tx.send((100, 40)).await.expect("resize");
        let run = tokio::spawn(run(cmd, Some(in_rx), out_tx, rs_rx));
        in_tx
            .send(Bytes::from_static(b"hello\r"))
            .await
            .expect("stdin");
        let mut out = Vec::new();
        while let Some(b) = out_rx.recv().await {
            out.extend_from_slice(&b);
        }
        assert_eq!(run.await.expect("join"), Ok(0));
        let out = String::from_utf8_lossy(&out);
        assert!(out.contains("/dev/pts/"), "{out}");
        assert!(out.contains("40 100"), "{out}");
        assert!(out.contains("got hello"), "{out}");
    }
}
