//! Lifecycle hooks (`postStart`, `preStop`) with `exec`, `httpGet` and `sleep` handlers, run
//! above the seam as kubelet runs them: exec through the runtime's `exec_sync`, HTTP from the
//! node's network to the pod's address.

use k8s_openapi::api::core::v1::LifecycleHandler;

use super::*;

/// After a preStop hook, the container still gets this long between SIGTERM and SIGKILL
/// (kubelet's `minimumGracePeriodInSeconds`).
pub(super) const MIN_GRACE_AFTER_PRE_STOP: i64 = 2;

/// Why a hook failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum HookError {
    #[error("command '{cmd}' exited with {code}: {stderr}")]
    Exit {
        cmd: String,
        code: i32,
        stderr: String,
        stdout: String,
    },
    #[error("{0}")]
    Runtime(#[from] seam::RuntimeError),
    #[error("{0}")]
    Http(String),
    #[error("invalid handler: {0}")]
    Invalid(String),
}

impl HookError {
    /// The message kubelet records for a failed hook.
    pub(super) fn message(&self, ctx: &Ctx, c: &Container, h: &LifecycleHandler) -> String {
        let pod = format!(
            "{}_{}({})",
            ctx.shared.name, ctx.shared.namespace, ctx.shared.uid
        );
        if let Some(e) = &h.exec {
            let output = match self {
                HookError::Exit { stdout, stderr, .. } => format!("{stdout}{stderr}"),
                _ => String::new(),
            };
            let cmd = e.command.clone().unwrap_or_default().join(" ");
            return format!(
                "Exec lifecycle hook ([{cmd}]) for Container {:?} in Pod {pod:?} failed - error: {self}, message: {output:?}",
                c.name
            );
        }
        if let Some(g) = &h.http_get {
            return format!(
                "HTTP lifecycle hook ({}) for Container {:?} in Pod {pod:?} failed - error: {self}",
                g.path.as_deref().unwrap_or_default(),
                c.name
            );
        }
        format!(
            "lifecycle hook for Container {:?} in Pod {pod:?} failed - error: {self}",
            c.name
        )
    }
}

/// Runs a hook's handler for container `id` (at most `limit`; the caller bounds it further).
pub(super) async fn run(
    ctx: &Ctx,
    c: &Container,
    id: &seam::ContainerId,
    h: &LifecycleHandler,
    limit: Duration,
) -> Result<(), HookError> {
    if let Some(e) = &h.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let out = ctx.rt.pods_runtime.exec_sync(id, &cmd, limit).await?;
        if out.exit_code != 0 {
            return Err(HookError::Exit {
                cmd: cmd.join(" "),
                code: out.exit_code,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        return Ok(());
    }
    if let Some(s) = &h.sleep {
        if s.seconds < 0 {
            return Err(HookError::Invalid(format!(
                "sleep seconds must be >= 0, got {}",
                s.seconds
            )));
        }
        tokio::time::sleep(Duration::from_secs(s.seconds as u64).min(limit)).await;
        return Ok(());
    }
    if let Some(g) = &h.http_get {
        return http_get(ctx, c, g, limit).await;
    }
    Err(HookError::Invalid(
        "no exec, httpGet or sleep handler".into(),
    ))
}

/// An HTTP GET hook: any response counts as done (as kubelet, which checks only that the
/// request went through).
async fn http_get(
    ctx: &Ctx,
    c: &Container,
    g: &k8s_openapi::api::core::v1::HTTPGetAction,
    limit: Duration,
) -> Result<(), HookError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if g.scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("https"))
    {
        return Err(HookError::Http(
            "HTTPS lifecycle hooks are not supported by this agent".into(),
        ));
    }
    let port = resolve_port(c, &g.port)
        .ok_or_else(|| HookError::Invalid(format!("invalid port {:?}", g.port)))?;
    let host = g
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| ctx.ip.to_string());
    let path = g.path.clone().unwrap_or_else(|| "/".into());
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let url = format!("http://{addr}{path}");
    let fut = async {
        let mut s = probe_connect(ctx, &addr, limit.min(Duration::from_secs(10))).await?;
        let mut req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-lifecycle/1.33\r\nConnection: close\r\n"
        );
        for hh in g.http_headers.clone().unwrap_or_default() {
            req.push_str(&format!("{}: {}\r\n", hh.name, hh.value));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = vec![0u8; 64];
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "EOF",
            ));
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(HookError::Http(format!("Get {url:?}: {e}"))),
        Err(_) => Err(HookError::Http(format!(
            "Get {url:?}: context deadline exceeded"
        ))),
    }
}
