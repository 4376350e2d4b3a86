//! Streaming for every kubectl (issue 15): SPDY/3.1 `exec`, `cp`, `port-forward`, `attach`
//! and `run -i` with Debian's kubectl 1.20; the same with the machine's kubectl (WebSocket
//! exec/attach, WebSocket-tunnelled SPDY port-forward); `logs --timestamps`, `--tail`,
//! `--limit-bytes`, `--since`/`--since-time`; the Python client's WebSocket `portforward`.

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
        eprintln!("streaming with {bin}");
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

        // exec -it from a terminal (script(1) gives kubectl one): the command runs on a
        // terminal of its own.
        let out = Command::new("script")
            .env("KUBECONFIG", &f.kubeconfig)
            .args(["-qec"])
            .arg(format!(
                "{bin} exec -it talker -- sh -c 'tty; test -t 0 && echo on-a-terminal'"
            ))
            .arg("/dev/null")
            .stdin(Stdio::null())
            .output()
            .expect("script");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{bin} exec -it: {out:?}");
        assert!(
            stdout.contains("/dev/pts/") && stdout.contains("on-a-terminal"),
            "{bin} exec -it: {stdout:?}"
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

        // attach -i to a container that keeps stdin open: what is typed reaches it, its
        // output comes back, and the attach ends when the container does.
        let att = format!("att-{v}");
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {att}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: busybox\n    stdin: true\n    command: [sh, -c, 'while read l; do echo got $l; [ \"$l\" = quit ] && exit 0; done']\n"
        );
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], &manifest);
        assert!(out.status.success(), "{out:?}");
        f.k(
            &bin,
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{att}"),
                "--timeout=120s",
            ],
        );
        let out = f.kubectl_with(&bin, &["attach", "-i", &att], Some("a\nquit\n"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{bin} attach: {out:?}\n{}", f.log());
        assert!(
            stdout.contains("got a\ngot quit\n"),
            "{bin} attach: {stdout:?}"
        );

        // run -i --rm: the command reads what kubectl sends, its output comes back, and
        // the pod is deleted afterwards.
        let rt = format!("rt-{v}");
        let out = f.kubectl_with(
            &bin,
            &[
                "run",
                "-i",
                "--rm",
                "--restart=Never",
                "--image=busybox",
                &rt,
                "--",
                "sh",
                "-c",
                "read x; echo got $x",
            ],
            Some("hello\n"),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{bin} run -i: {out:?}\n{}", f.log());
        assert!(stdout.contains("got hello"), "{bin} run -i: {stdout:?}");
        assert!(
            eventually(60, || !f.kubectl(&["get", "pod", &rt]).status.success()),
            "{bin}: pod {rt} was not deleted"
        );
    }

    // A container with `tty: true` runs on a terminal; attach reaches it through that
    // terminal.
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: tt\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: busybox\n    stdin: true\n    tty: true\n    command: [sh, -c, 'tty; test -t 1 && echo on-a-terminal; read x; echo got $x']\n";
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], manifest);
    assert!(out.status.success(), "{out:?}");
    f.k(
        "kubectl",
        &["wait", "--for=condition=Ready", "pod/tt", "--timeout=120s"],
    );
    assert!(
        eventually(30, || {
            let out = f.kubectl(&["logs", "tt"]);
            let s = String::from_utf8_lossy(&out.stdout);
            s.contains("/dev/pts/") && s.contains("on-a-terminal")
        }),
        "{}",
        String::from_utf8_lossy(&f.kubectl(&["logs", "tt"]).stdout)
    );
    let out = f.kubectl_with("kubectl", &["attach", "-i", "tt"], Some("hello\n"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("got hello"),
        "attach to a tty container: {out:?}"
    );

    // logs: real timestamps (the CRI log format), tail, limit and since.
    let out = f.k("kubectl", &["logs", "talker", "--timestamps"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for (line, want) in lines.iter().zip(["line one", "line two"]) {
        let (ts, rest) = line.split_once(' ').expect("timestamp");
        assert_eq!(rest, want);
        assert!(
            ts.ends_with('Z') && ts.contains('T') && ts.len() > 20,
            "{line}"
        );
    }
    assert_eq!(
        f.k("kubectl", &["logs", "talker", "--tail=1"]),
        "line two\n"
    );
    assert_eq!(
        f.k("kubectl", &["logs", "talker", "--limit-bytes=6"]),
        "line o"
    );
    assert_eq!(
        f.k("kubectl", &["logs", "talker", "--since=1h"]),
        "line one\nline two\n"
    );
    // logs -f follows a running container until it ends.
    f.k(
        "kubectl",
        &[
            "run",
            "counter",
            "--image=busybox",
            "--restart=Never",
            "--",
            "sh",
            "-c",
            "sleep 1; for i in 1 2 3; do echo n $i; sleep 1; done; printf tail",
        ],
    );
    f.k(
        "kubectl",
        &[
            "wait",
            "--for=condition=Ready",
            "pod/counter",
            "--timeout=120s",
        ],
    );
    let out = f.k("kubectl", &["logs", "-f", "counter", "--timestamps"]);
    let contents: Vec<&str> = out
        .lines()
        .map(|l| l.split_once(' ').map_or("", |(_, c)| c))
        .collect();
    assert_eq!(contents, vec!["n 1", "n 2", "n 3", "tail"], "{out}");

    // Lines older than sinceTime are skipped: the second line's own time keeps only it.
    let second = lines[1].split_once(' ').map(|(t, _)| t).expect("ts");
    let out = f.k(
        "kubectl",
        &["logs", "talker", &format!("--since-time={second}")],
    );
    assert!(out.ends_with("line two\n"), "{out}");

    // The Python client's WebSocket port-forward.
    let out = f.python(
        include_str!("python/portforward.py"),
        &["web", "9376", "web"],
    );
    assert!(out.contains("OK"), "{out}");
}
