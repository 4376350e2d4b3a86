//! Images. Ferry runs processes, not images: a few built-in images stand in for the ones the
//! documentation uses, served by a small built-in program (see [`builtin_main`]), and any other
//! image runs its `command` as given.
//!
//! | image (any registry/tag)           | what runs                                               |
//! |------------------------------------|---------------------------------------------------------|
//! | `*/serve_hostname`                 | answers the pod's hostname over HTTP on podIP:9376 (flags `-port`, `-http`, `-tcp`, `-udp` as upstream) |
//! | `nginx`                            | a welcome page over HTTP on podIP:80                    |
//! | `busybox`                          | `command`+`args` with the host's tools (default `sh`)   |
//! | anything else                      | `command`+`args`; none: the container fails             |

use std::net::IpAddr;

/// How to start a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// Arguments for the built-in program (after the agent's builtin prefix).
    Builtin(Vec<String>),
    /// An ordinary command line.
    Command(Vec<String>),
}

/// The image name without registry, tag or digest: `registry.k8s.io/serve_hostname:1.1` ->
/// `serve_hostname`, `docker.io/library/nginx:1.25` -> `nginx`.
pub fn short_name(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split(':').next().unwrap_or(last)
}

/// Images served by the built-in program.
fn is_serve_hostname(image: &str) -> bool {
    short_name(image) == "serve_hostname" || short_name(image) == "serve-hostname"
}

/// Decides what runs for a container. `Err` carries kubelet-like reason and message.
pub fn launch(
    image: &str,
    command: &[String],
    args: &[String],
    pod_ip: IpAddr,
    hostname: &str,
) -> Result<Launch, (String, String)> {
    let short = short_name(image);
    if is_serve_hostname(image) && command.is_empty() {
        let mut a = vec![
            "serve-hostname".to_string(),
            "--ip".into(),
            pod_ip.to_string(),
            "--hostname".into(),
            hostname.to_string(),
        ];
        a.extend(args.iter().cloned());
        return Ok(Launch::Builtin(a));
    }
    if short == "nginx" && command.is_empty() {
        return Ok(Launch::Builtin(vec![
            "nginx".into(),
            "--ip".into(),
            pod_ip.to_string(),
            "--hostname".into(),
            hostname.to_string(),
        ]));
    }
    let mut argv: Vec<String> = command.to_vec();
    argv.extend(args.iter().cloned());
    if command.is_empty() && short == "busybox" && args.is_empty() {
        argv = vec!["sh".into()];
    }
    if command.is_empty() && short != "busybox" {
        return Err((
            "CreateContainerError".into(),
            format!(
                "ferry runs processes, not images: image {image:?} is not built in and the container has no command"
            ),
        ));
    }
    if argv.is_empty() {
        return Err(("CreateContainerError".into(), "no command specified".into()));
    }
    Ok(Launch::Command(argv))
}

/// Options of the built-in programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltinOpts {
    pub program: String,
    pub ip: String,
    pub hostname: String,
    pub port: u16,
    pub http: bool,
    pub tcp: bool,
    pub udp: bool,
}

fn parse_bool(v: &str) -> bool {
    matches!(v, "" | "true" | "1" | "t" | "T" | "TRUE" | "True")
}

/// Why the built-in program's arguments are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuiltinArgsError {
    #[error("missing built-in program name")]
    MissingProgram,
    #[error("flag {0} needs a value")]
    MissingValue(String),
    #[error("bad port: {0}")]
    BadPort(std::num::ParseIntError),
    #[error("unknown flag {0:?}")]
    UnknownFlag(String),
}

/// Parses the built-in program's arguments (ours, then upstream serve_hostname's Go flags).
pub fn parse_builtin(args: &[String]) -> Result<BuiltinOpts, BuiltinArgsError> {
    let mut it = args.iter();
    let program = it.next().ok_or(BuiltinArgsError::MissingProgram)?.clone();
    let mut o = BuiltinOpts {
        port: if program == "nginx" { 80 } else { 9376 },
        program,
        ip: "127.0.0.1".into(),
        hostname: String::new(),
        http: true,
        tcp: false,
        udp: false,
    };
    while let Some(a) = it.next() {
        let flag = a.trim_start_matches('-');
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        let mut value = |inline: Option<String>| -> Result<String, BuiltinArgsError> {
            inline
                .or_else(|| it.next().cloned())
                .ok_or_else(|| BuiltinArgsError::MissingValue(name.to_string()))
        };
        match name {
            "ip" => o.ip = value(inline)?,
            "hostname" => o.hostname = value(inline)?,
            "port" => o.port = value(inline)?.parse().map_err(BuiltinArgsError::BadPort)?,
            "http" => o.http = parse_bool(inline.as_deref().unwrap_or("")),
            "tcp" => o.tcp = parse_bool(inline.as_deref().unwrap_or("")),
            "udp" => o.udp = parse_bool(inline.as_deref().unwrap_or("")),
            "close" => {}
            other => return Err(BuiltinArgsError::UnknownFlag(other.to_string())),
        }
    }
    Ok(o)
}

const NGINX_PAGE: &str = "<!DOCTYPE html>\n<html>\n<head>\n<title>Welcome to nginx!</title>\n</head>\n<body>\n<h1>Welcome to nginx!</h1>\n<p>If you see this page, the nginx web server is successfully installed and\nworking. Further configuration is required.</p>\n<p><em>Thank you for using nginx.</em></p>\n</body>\n</html>\n";

/// The HTTP response of a built-in program.
pub fn http_response(o: &BuiltinOpts, head_only: bool) -> Vec<u8> {
    let (ctype, body) = if o.program == "nginx" {
        ("text/html", NGINX_PAGE.to_string())
    } else {
        ("text/plain; charset=utf-8", o.hostname.clone())
    };
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        r.extend_from_slice(body.as_bytes());
    }
    r
}

/// The built-in program: `serve-hostname` or `nginx`, binding the pod IP. Runs until killed.
pub async fn builtin_main(args: Vec<String>) -> crate::error::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut o = parse_builtin(&args)?;
    if o.hostname.is_empty() {
        o.hostname = std::env::var("HOSTNAME").unwrap_or_default();
    }
    let o = std::sync::Arc::new(o);
    let mut tasks = tokio::task::JoinSet::new();
    let addr = match o.ip.parse::<std::net::IpAddr>() {
        Ok(ip) => std::net::SocketAddr::new(ip, o.port).to_string(),
        Err(_) => format!("{}:{}", o.ip, o.port),
    };
    if o.udp {
        let sock = tokio::net::UdpSocket::bind(&addr).await?;
        let o = o.clone();
        tasks.spawn(async move {
            let mut buf = [0u8; 2048];
            loop {
                let Ok((_, peer)) = sock.recv_from(&mut buf).await else {
                    continue;
                };
                let _ = sock.send_to(o.hostname.as_bytes(), peer).await;
            }
        });
    }
    if o.http || o.tcp {
        let l = tokio::net::TcpListener::bind(&addr).await?;
        eprintln!("serving {} on {addr}", o.program);
        let o = o.clone();
        tasks.spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    continue;
                };
                let o = o.clone();
                tokio::spawn(async move {
                    if !o.http {
                        let _ = s.write_all(o.hostname.as_bytes()).await;
                        return;
                    }
                    let mut buf = Vec::with_capacity(1024);
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = buf.starts_with(b"HEAD ");
                    let _ = s.write_all(&http_response(&o, head)).await;
                    let _ = s.shutdown().await;
                });
            }
        });
    }
    // A graceful stop: on SIGTERM keep serving for a moment while the pod leaves the endpoints
    // (so clients going through a Service see no failure), then exit.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = async { while tasks.join_next().await.is_some() {} } => {}
        _ = term.recv() => {
            tokio::time::sleep(DRAIN_AFTER_SIGTERM).await;
        }
    }
    Ok(())
}

/// How long a built-in server keeps serving after SIGTERM (well inside the default 30 s grace
/// period, well beyond the time endpoint removal takes to reach the proxies).
const DRAIN_AFTER_SIGTERM: std::time::Duration = std::time::Duration::from_millis(1500);

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn short_names() {
        for (image, want) in [
            ("registry.k8s.io/serve_hostname", "serve_hostname"),
            ("k8s.gcr.io/serve_hostname:1.4", "serve_hostname"),
            ("nginx", "nginx"),
            ("nginx:1.14.2", "nginx"),
            ("docker.io/library/nginx@sha256:abc", "nginx"),
            ("localhost:5000/busybox:1.28", "busybox"),
        ] {
            assert_eq!(short_name(image), want, "{image}");
        }
    }

    #[test]
    fn launch_table() {
        let ip: IpAddr = "127.100.0.5".parse().expect("ip");
        type Case<'a> = (&'a str, Vec<String>, Vec<String>, Result<Launch, ()>);
        let cases: Vec<Case> = vec![
            (
                "registry.k8s.io/serve_hostname",
                vec![],
                vec![],
                Ok(Launch::Builtin(s(&[
                    "serve-hostname",
                    "--ip",
                    "127.100.0.5",
                    "--hostname",
                    "h",
                ]))),
            ),
            (
                "k8s.gcr.io/serve_hostname",
                vec![],
                s(&["-udp=true"]),
                Ok(Launch::Builtin(s(&[
                    "serve-hostname",
                    "--ip",
                    "127.100.0.5",
                    "--hostname",
                    "h",
                    "-udp=true",
                ]))),
            ),
            (
                "nginx:1.25",
                vec![],
                vec![],
                Ok(Launch::Builtin(s(&[
                    "nginx",
                    "--ip",
                    "127.100.0.5",
                    "--hostname",
                    "h",
                ]))),
            ),
            (
                "busybox:1.28",
                s(&["sleep"]),
                s(&["3600"]),
                Ok(Launch::Command(s(&["sleep", "3600"]))),
            ),
            ("busybox", vec![], vec![], Ok(Launch::Command(s(&["sh"])))),
            (
                "busybox",
                vec![],
                s(&["echo", "hi"]),
                Ok(Launch::Command(s(&["echo", "hi"]))),
            ),
            (
                "python:3",
                s(&["python3", "-c", "1"]),
                vec![],
                Ok(Launch::Command(s(&["python3", "-c", "1"]))),
            ),
            ("redis", vec![], vec![], Err(())),
        ];
        for (image, cmd, args, want) in cases {
            let got = launch(image, &cmd, &args, ip, "h");
            match want {
                Ok(w) => assert_eq!(got, Ok(w), "{image}"),
                Err(()) => {
                    let (reason, msg) = got.expect_err("no command");
                    assert_eq!(reason, "CreateContainerError");
                    assert!(msg.contains("not built in"), "{msg}");
                }
            }
        }
    }

    #[test]
    fn builtin_flags() {
        let o = parse_builtin(&s(&[
            "serve-hostname",
            "--ip",
            "127.1.2.3",
            "--hostname",
            "x",
            "-udp=true",
            "-http=false",
            "-port",
            "80",
        ]))
        .expect("flags");
        assert_eq!(
            (o.ip.as_str(), o.port, o.udp, o.http, o.tcp),
            ("127.1.2.3", 80, true, false, false)
        );
        let n = parse_builtin(&s(&["nginx"])).expect("nginx");
        assert_eq!(n.port, 80);
        assert!(parse_builtin(&s(&["nginx", "--bogus"])).is_err());
        let r = String::from_utf8(http_response(
            &parse_builtin(&s(&["serve-hostname", "--hostname", "pod-a"])).expect("o"),
            false,
        ))
        .expect("utf8");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\npod-a"));
    }
}
