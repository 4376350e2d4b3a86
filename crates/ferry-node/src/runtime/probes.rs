//! Startup, liveness and readiness probes (exec, HTTP GET, TCP socket, gRPC), run from the node's
//! network as kubelet runs them.

use super::*;

/// Connects for a probe from the node's network (as kubelet probes from the host).
pub(super) async fn probe_connect(
    ctx: &Ctx,
    addr: &str,
    timeout: Duration,
) -> std::io::Result<tokio::net::TcpStream> {
    let sa = match addr.parse::<std::net::SocketAddr>() {
        Ok(a) => a,
        Err(_) => tokio::net::lookup_host(addr)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("no address for {addr}")))?,
    };
    crate::netns::connect_in(ctx.rt.node_netns.as_deref(), sa, timeout).await
}

pub(super) fn probe_params(p: &Probe) -> (Duration, Duration, Duration, i32, i32) {
    (
        Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64),
        Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64),
        Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64),
        p.success_threshold.unwrap_or(1),
        p.failure_threshold.unwrap_or(3),
    )
}

/// Runs startup, then liveness and readiness probes until `stop`. Readiness flips are sent
/// as updates; a liveness failure is sent on `live`.
pub(super) async fn probe_loop(
    ctx: Ctx,
    c: Container,
    stop: CancellationToken,
    live: mpsc::Sender<String>,
) {
    let name = c.name.clone();
    let send = |u: Update| {
        let _ = ctx.updates.send(u);
    };
    if let Some(sp) = &c.startup_probe {
        let (delay, period, timeout, st, ft) = probe_params(sp);
        let mut tr = ProbeTracker::new(st, ft, ProbeResult::Failure);
        let mut failures = 0;
        tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(delay) => {} }
        loop {
            let (r, msg) = run_probe(&ctx, &c, sp, timeout).await;
            if tr.observe(r) == Some(ProbeResult::Success) {
                break;
            }
            if r == ProbeResult::Failure {
                failures += 1;
                ctx.rt
                    .event(
                        &ctx.pod,
                        "Warning",
                        "Unhealthy",
                        &format!("Startup probe failed: {msg}"),
                    )
                    .await;
                if failures >= ft.max(1) {
                    let _ = live.send(format!("startup probe failed: {msg}")).await;
                    return;
                }
            } else {
                failures = 0;
            }
            tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(period) => {} }
        }
    }
    send(Update::Started {
        name: name.clone(),
        started: true,
    });
    if c.readiness_probe.is_none() {
        send(Update::Ready {
            name: name.clone(),
            ready: true,
        });
    }
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(rp) = c.readiness_probe.clone() {
        let ctx = ctx.clone();
        let c = c.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let (delay, period, timeout, st, ft) = probe_params(&rp);
            let mut tr = ProbeTracker::new(st, ft, ProbeResult::Failure);
            tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(delay) => {} }
            loop {
                let (r, msg) = run_probe(&ctx, &c, &rp, timeout).await;
                if r == ProbeResult::Failure {
                    ctx.rt
                        .event(&ctx.pod, "Warning", "Unhealthy", &format!("Readiness probe failed: {msg}"))
                        .await;
                }
                if let Some(flip) = tr.observe(r) {
                    let _ = ctx.updates.send(Update::Ready {
                        name: c.name.clone(),
                        ready: flip == ProbeResult::Success,
                    });
                }
                tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(period) => {} }
            }
        });
    }
    if let Some(lp) = c.liveness_probe.clone() {
        let ctx = ctx.clone();
        let c = c.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let (delay, period, timeout, _st, ft) = probe_params(&lp);
            let mut tr = ProbeTracker::new(1, ft, ProbeResult::Success);
            tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(delay) => {} }
            loop {
                let (r, msg) = run_probe(&ctx, &c, &lp, timeout).await;
                if r == ProbeResult::Failure {
                    ctx.rt
                        .event(&ctx.pod, "Warning", "Unhealthy", &format!("Liveness probe failed: {msg}"))
                        .await;
                }
                if tr.observe(r) == Some(ProbeResult::Failure) {
                    let _ = live.send(msg).await;
                    return;
                }
                tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(period) => {} }
            }
        });
    }
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = async { while tasks.join_next().await.is_some() {} } => {}
    }
}

pub(super) fn resolve_port(c: &Container, p: &IntOrString) -> Option<u16> {
    match p {
        IntOrString::Int(i) => u16::try_from(*i).ok(),
        IntOrString::String(s) => {
            if let Ok(n) = s.parse() {
                return Some(n);
            }
            c.ports
                .as_ref()?
                .iter()
                .find(|cp| cp.name.as_deref() == Some(s.as_str()))
                .and_then(|cp| u16::try_from(cp.container_port).ok())
        }
    }
}

pub(super) async fn run_probe(
    ctx: &Ctx,
    c: &Container,
    p: &Probe,
    timeout: Duration,
) -> (ProbeResult, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fail = |m: String| (ProbeResult::Failure, m);
    if let Some(h) = &p.http_get {
        let Some(port) = resolve_port(c, &h.port) else {
            return fail(format!("invalid port {:?}", h.port));
        };
        let host = h.host.clone().unwrap_or_else(|| ctx.ip.to_string());
        let path = h.path.clone().unwrap_or_else(|| "/".into());
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let fut = async {
            let mut s = probe_connect(ctx, &addr, timeout).await?;
            let mut req = format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.32\r\nAccept: */*\r\nConnection: close\r\n"
            );
            for hh in h.http_headers.clone().unwrap_or_default() {
                req.push_str(&format!("{}: {}\r\n", hh.name, hh.value));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes()).await?;
            let mut buf = vec![0u8; 256];
            let mut n = 0;
            while n < 12 {
                let k = s.read(&mut buf[n..]).await?;
                if k == 0 {
                    break;
                }
                n += k;
            }
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf[..n]).into_owned())
        };
        return match tokio::time::timeout(timeout, fut).await {
            Err(_) => fail(format!(
                "Get \"http://{addr}{path}\": context deadline exceeded"
            )),
            Ok(Err(e)) => fail(format!("Get \"http://{addr}{path}\": {e}")),
            Ok(Ok(head)) => {
                let code: u16 = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                if podstate::http_status_ok(code) {
                    (ProbeResult::Success, String::new())
                } else {
                    fail(format!("HTTP probe failed with statuscode: {code}"))
                }
            }
        };
    }
    if let Some(t) = &p.tcp_socket {
        let Some(port) = resolve_port(c, &t.port) else {
            return fail(format!("invalid port {:?}", t.port));
        };
        let host = t.host.clone().unwrap_or_else(|| ctx.ip.to_string());
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        return match tokio::time::timeout(timeout, probe_connect(ctx, &addr, timeout)).await {
            Ok(Ok(_)) => (ProbeResult::Success, String::new()),
            Ok(Err(e)) => fail(format!("dial tcp {addr}: {e}")),
            Err(_) => fail(format!("dial tcp {addr}: i/o timeout")),
        };
    }
    if let Some(e) = &p.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let info = ctx
            .shared
            .containers
            .lock()
            .ok()
            .and_then(|m| m.get(&c.name).cloned())
            .unwrap_or_default();
        let Some(id) = info.id else {
            return fail(format!("container {:?} is not running", c.name));
        };
        return match ctx.rt.pods_runtime.exec_sync(&id, &cmd, timeout).await {
            Ok(o) if o.exit_code == 0 => (ProbeResult::Success, String::new()),
            Ok(o) => fail(format!(
                "command {cmd:?} exited with {}: {}",
                o.exit_code,
                String::from_utf8_lossy(&o.stdout)
            )),
            Err(seam::RuntimeError::ExecTimeout(_)) => fail(format!("command {cmd:?} timed out")),
            Err(e) => fail(format!("exec: {e}")),
        };
    }
    // gRPC probes are not implemented: reported as success.
    (ProbeResult::Success, String::new())
}
