//! Streaming for every kubectl (issue 15): SPDY/3.1 `exec`, `cp` and `port-forward` with
//! Debian's kubectl 1.20; the machine's kubectl (WebSocket exec, WebSocket-tunnelled SPDY
//! port-forward); the Python client's WebSocket `portforward`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Ferry, eventually, kubectls};

/// Starts `kubectl port-forward` to `target` on a free local port; returns the child and the
/// local port (from kubectl's "Forwarding from 127.0.0.1:N -> P" line).
fn port_forward(
    f: &Ferry,
    home: &std::path::Path,
    bin: &str,
    target: &str,
    port: u16,
) -> (std::process::Child, u16) {
    let mut child = Command::new(bin)
        .env("KUBECONFIG", &f.kubeconfig)
        .env("HOME", home)
        .args(["port-forward", "--address", "127.0.0.1", target])
        .arg(format!(":{port}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let local = loop {
        let Some(Ok(line)) = lines.next() else {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let _ = child.kill();
            panic!("{bin} port-forward ended: {err}\n{}", f.log());
        };
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            break rest
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
                .expect("local port");
        }
    };
    // Keep draining kubectl's output ("Handling connection for ...").
    std::thread::spawn(move || for _ in lines {});
    (child, local)
}

fn http_get(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn exec_cp_and_port_forward_with_every_kubectl() {
    let f = Ferry::start();
    f.k(
        "kubectl",
        &[
            "run",
            "talker",
            "--image=busybox",
            "--restart=Never",
            "--",
            "sh",
            "-c",
            "echo line one; echo line two; sleep 3600",
        ],
    );
    f.k(
        "kubectl",
        &[
            "run",
            "web",
            "--image=registry.k8s.io/serve_hostname",
            "--restart=Never",
        ],
    );
    for pod in ["talker", "web"] {
        f.k(
            "kubectl",
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                "--timeout=120s",
            ],
        );
    }
    assert!(
        eventually(60, || {
            let out = f.kubectl(&["exec", "talker", "--", "true"]);
            out.status.success()
        }),
        "exec never worked:\n{}",
        f.log()
    );

    for bin in kubectls() {
        let v = if common::is_120(&bin) { "120" } else { "new" };
        // exec: stdout, stderr and the exit code come back separately.
        let out = f.kubectl_with(
            &bin,
            &[
                "exec",
                "talker",
                "--",
                "sh",
                "-c",
                "echo out; echo err >&2; exit 3",
            ],
            None,
        );
        assert_eq!(out.status.code(), Some(3), "{bin}: {out:?}\n{}", f.log());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n", "{bin}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("err"),
            "{bin}: {out:?}"
        );
        // exec -i: stdin reaches the command and its end is the command's EOF.
        let out = f.kubectl_with(
            &bin,
            &["exec", "-i", "talker", "--", "cat"],
            Some("hello\nworld\n"),
        );
        assert!(out.status.success(), "{bin}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello\nworld\n",
            "{bin}"
        );

        // cp (tar over exec stdin/stdout), both ways, with a file bigger than one frame.
        let dir = tempfile::tempdir().expect("tmp");
        let body: String = (0..20_000).map(|i| format!("{v} line {i}\n")).collect();
        let local = dir.path().join("payload.txt");
        std::fs::write(&local, &body).expect("write");
        let remote = format!("/tmp/ferry-cp-{}-{v}.txt", std::process::id());
        f.k(
            &bin,
            &[
                "cp",
                &local.display().to_string(),
                &format!("default/talker:{remote}"),
            ],
        );
        let out = f.k(&bin, &["exec", "talker", "--", "wc", "-c", &remote]);
        assert!(out.starts_with(&body.len().to_string()), "{bin}: {out}");
        let back = dir.path().join("back.txt");
        f.k(
            &bin,
            &[
                "cp",
                &format!("default/talker:{remote}"),
                &back.display().to_string(),
            ],
        );
        assert_eq!(std::fs::read_to_string(&back).expect("read"), body, "{bin}");
        f.k(&bin, &["exec", "talker", "--", "rm", "-f", &remote]);

        // port-forward: two connections through one kubectl.
        let (mut child, local) = port_forward(&f, dir.path(), &bin, "pod/web", 9376);
        for _ in 0..2 {
            let resp = http_get(local);
            assert!(resp.contains("\r\n\r\nweb"), "{bin}: {resp:?}");
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    // The Python client's WebSocket port-forward.
    let out = f.python(
        include_str!("python/portforward.py"),
        &["web", "9376", "web"],
    );
    assert!(out.contains("OK"), "{out}");
}
