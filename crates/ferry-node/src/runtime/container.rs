//! Container supervision above the seam: a container's spec from the pod, its runs through the
//! [`PodRuntime`] (image, create, start, postStart, wait), restarts with back-off, and stopping it
//! (preStop within the grace period, then the runtime's SIGTERM/SIGKILL).

use super::*;
use seam::{ContainerSpec, Exited, ImageRequest, Mount, PullError, SecurityContext};

/// The runtime's view of a container (its `attempt`-th run): environment and arguments resolved
/// here, above the seam. `Err` carries kubelet's reason and message.
pub(super) async fn prepare(
    ctx: &Ctx,
    c: &Container,
    attempt: i32,
) -> Result<ContainerSpec, (String, String)> {
    let ns = ctx.shared.namespace.as_str();
    let src = env_source(&ctx.rt.client, ns, c).await;
    let svc = service_vars(&ctx.rt.client, &ctx.pod).await;
    let facts = PodFacts {
        pod_ips: ctx.pod_ips.clone(),
        host_ips: ctx.rt.node_ips.iter().map(|i| i.to_string()).collect(),
    };
    let mut env = envvars::container_env(&ctx.pod, c, &facts, &svc, &src)
        .map_err(|m| ("CreateContainerConfigError".to_string(), m.to_string()))?;
    if !env.iter().any(|(k, _)| k == "HOSTNAME") {
        env.insert(0, ("HOSTNAME".into(), ctx.hostname.clone()));
    }
    let path = std::env::var("PATH")
        .unwrap_or_else(|_| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.insert(0, ("PATH".into(), path));
    }
    let command = envvars::expand_args(&c.command.clone().unwrap_or_default(), &env);
    let args = envvars::expand_args(&c.args.clone().unwrap_or_default(), &env);
    let mounts = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let mut src = ctx.dirs.volume(&m.name);
            if let Some(sp) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                src = src.join(sp);
            }
            Mount {
                host_path: src,
                container_path: m.mount_path.clone(),
                read_only: m.read_only.unwrap_or(false),
            }
        })
        .collect();
    let sc = c.security_context.clone().unwrap_or_default();
    let caps = sc.capabilities.clone().unwrap_or_default();
    Ok(ContainerSpec {
        name: c.name.clone(),
        attempt: u32::try_from(attempt).unwrap_or(0),
        image: c.image.clone().unwrap_or_default(),
        command,
        args,
        env,
        working_dir: c.working_dir.clone(),
        mounts,
        log_path: ctx.dirs.logs(&c.name).join(format!("{attempt}.log")),
        tty: c.tty.unwrap_or(false),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        security: SecurityContext {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            read_only_root_filesystem: sc.read_only_root_filesystem.unwrap_or(false),
            privileged: sc.privileged.unwrap_or(false),
            capabilities_add: caps.add.unwrap_or_default(),
            capabilities_drop: caps.drop.unwrap_or_default(),
        },
        // Cgroup settings are the CRI runtime's (the process runtime has none).
        resources: Default::default(),
    })
}

/// A command run "inside" a container for the streaming server: in its namespaces (nsenter)
/// when the pod has its own, with the container's environment and working directory.
pub fn exec_command(
    shared: &PodShared,
    info: &ContainerInfo,
    cmd: &[String],
) -> Result<tokio::process::Command, crate::streaming::StreamError> {
    if cmd.is_empty() {
        return Err(crate::streaming::StreamError::NoCommand);
    }
    let netns = shared.netns.load(std::sync::atomic::Ordering::SeqCst);
    if (shared.isolated || netns) && info.pid.is_none() {
        return Err(crate::streaming::StreamError::NotRunning);
    }
    process::nsenter_command(
        info.pid,
        shared.isolated,
        netns,
        &info.env,
        info.working_dir.as_deref(),
        cmd,
    )
    .ok_or(crate::streaming::StreamError::NoCommand)
}

/// An exit the runtime could not report (it lost the container): as a killed process.
fn lost() -> Exited {
    Exited {
        exit_code: 128 + 9,
        signal: Some(9),
        oom_killed: false,
        finished_at: jiff::Timestamp::now(),
    }
}

fn terminated(e: &Exited, started_at: Option<String>) -> Terminated {
    Terminated {
        exit_code: e.exit_code,
        signal: e.signal,
        reason: if e.oom_killed {
            "OOMKilled".to_string()
        } else {
            Terminated::reason_for(e.exit_code).to_string()
        },
        message: None,
        started_at,
        finished_at: e
            .finished_at
            .round(jiff::Unit::Second)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| now()),
    }
}

/// Makes the container's image available; `Err` is the pull error (its reason for the status).
async fn image(ctx: &Ctx, c: &Container) -> Result<(), PullError> {
    let image = c.image.clone().unwrap_or_default();
    // Defaulted by the API server; a pod without it is treated as IfNotPresent.
    let pull_policy = c
        .image_pull_policy
        .clone()
        .unwrap_or_else(|| "IfNotPresent".into());
    ctx.rt
        .pods_runtime
        .ensure_image(&ImageRequest { image, pull_policy })
        .await
        .map(|_| ())
}

/// Runs an init container once to completion. Returns its exit code (`None`: the pod is going
/// away, or the container could not run).
pub(super) async fn run_once(
    ctx: &Ctx,
    c: &Container,
    stop: &CancellationToken,
    rx: &mut watch::Receiver<Pod>,
    gone: &CancellationToken,
) -> Option<i32> {
    let rt = ctx.rt.pods_runtime.clone();
    let spec = prepare(ctx, c, 0).await.ok()?;
    image(ctx, c).await.ok()?;
    let id = rt.create_container(&ctx.sandbox, &spec).await.ok()?;
    if rt.start_container(&id).await.is_err() {
        let _ = rt.remove_container(&id).await;
        return None;
    }
    let code = loop {
        tokio::select! {
            e = rt.wait_container(&id) => break Some(e.unwrap_or_else(|_| lost()).exit_code),
            r = rx.changed() => {
                if r.is_err() || rx.borrow().metadata.deletion_timestamp.is_some() {
                    let _ = rt.stop_container(&id, Duration::ZERO).await;
                    stop.cancel();
                    break None;
                }
            }
            _ = gone.cancelled() => {
                let _ = rt.stop_container(&id, Duration::ZERO).await;
                stop.cancel();
                break None;
            }
        }
    };
    let _ = rt.remove_container(&id).await;
    code
}

pub(super) enum Wake {
    Exited(Exited),
    Stop,
    LivenessFailed(String),
    PostStartFailed,
}

/// How long a postStart hook may take (kubelet gives it no deadline; this only bounds a hook
/// that hangs forever).
const POST_START_LIMIT: Duration = Duration::from_secs(24 * 3600);

pub(super) async fn container_task(
    ctx: Ctx,
    c: Container,
    policy: String,
    stop: CancellationToken,
    grace: Arc<std::sync::atomic::AtomicI64>,
) {
    let rt = ctx.rt.pods_runtime.clone();
    let name = c.name.clone();
    let image_name = c.image.clone().unwrap_or_default();
    let mut restart_count: i32 = 0;
    let mut crashes: u32 = 0;
    let send = |u: Update| {
        let _ = ctx.updates.send(u);
    };
    let log_dir = ctx.dirs.logs(&name);
    let _ = tokio::fs::create_dir_all(&log_dir).await;
    let waiting = |reason: &str, message: String, restart_count: i32| Update::State {
        name: name.clone(),
        state: State::Waiting {
            reason: reason.to_string(),
            message: Some(message),
        },
        restart_count,
    };
    loop {
        if stop.is_cancelled() {
            return;
        }
        let spec = match prepare(&ctx, &c, restart_count).await {
            Ok(p) => p,
            Err((reason, message)) => {
                ctx.rt
                    .event(&ctx.pod, "Warning", "Failed", &format!("Error: {message}"))
                    .await;
                let config = reason == "CreateContainerConfigError";
                send(waiting(&reason, message, restart_count));
                if config {
                    // The referenced object may appear: retry like kubelet does.
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                    }
                }
                stop.cancelled().await;
                return;
            }
        };
        match image(&ctx, &c).await {
            Ok(()) => {
                if restart_count == 0 {
                    ctx.rt
                        .event(
                            &ctx.pod,
                            "Normal",
                            "Pulled",
                            &format!("Container image \"{image_name}\" already present on machine"),
                        )
                        .await;
                }
            }
            Err(e) => {
                ctx.rt
                    .event(&ctx.pod, "Warning", "Failed", &format!("Error: {e}"))
                    .await;
                let retry = matches!(e, PullError::Pull { .. });
                send(waiting(e.reason(), e.to_string(), restart_count));
                if retry {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(ctx.rt.backoff.delay(2)) => continue,
                    }
                }
                stop.cancelled().await;
                return;
            }
        }
        let id = match rt.create_container(&ctx.sandbox, &spec).await {
            Ok(id) => id,
            Err(e) => {
                ctx.rt
                    .event(&ctx.pod, "Warning", "Failed", &format!("Error: {e}"))
                    .await;
                send(waiting(e.reason(), e.to_string(), restart_count));
                stop.cancelled().await;
                return;
            }
        };
        let started = Instant::now();
        let started_at = now();
        if let Err(e) = rt.start_container(&id).await {
            let _ = rt.remove_container(&id).await;
            let msg = e.to_string();
            ctx.rt
                .event(&ctx.pod, "Warning", "Failed", &format!("Error: {msg}"))
                .await;
            send(Update::State {
                name: name.clone(),
                state: State::Terminated(Terminated {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(msg),
                    started_at: None,
                    finished_at: now(),
                }),
                restart_count,
            });
            if !podstate::should_restart(&policy, 128) {
                stop.cancelled().await;
                return;
            }
            crashes = ctx.rt.backoff.next_crashes(crashes, Duration::ZERO);
            if !back_off(&ctx, &c, crashes, &stop, restart_count).await {
                return;
            }
            restart_count += 1;
            continue;
        }
        let pid = match rt.container_status(&id).await {
            Ok(seam::ContainerState::Running { pid }) => pid,
            _ => None,
        };
        let io = match rt.attach(&id, seam::AttachRequest::default()).await {
            Ok(seam::StreamSession::Io(io)) => Some(io),
            _ => None,
        };
        if let Ok(mut m) = ctx.shared.containers.lock() {
            m.insert(
                name.clone(),
                ContainerInfo {
                    id: Some(id.clone()),
                    pid,
                    log_dir: log_dir.clone(),
                    restart_count,
                    env: spec.env.clone(),
                    working_dir: spec.working_dir.clone(),
                    io,
                },
            );
        }
        if restart_count == 0 {
            ctx.rt
                .event(
                    &ctx.pod,
                    "Normal",
                    "Created",
                    &format!("Created container: {name}"),
                )
                .await;
        }
        ctx.rt
            .event(
                &ctx.pod,
                "Normal",
                "Started",
                &format!("Started container {name}"),
            )
            .await;
        // postStart: the container is not Running (nor started) until its hook returned; a
        // failed hook kills it (and the restart policy decides).
        let mut wake = None;
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            tokio::select! {
                r = hooks::run(&ctx, &c, &id, h, POST_START_LIMIT) => {
                    if let Err(e) = r {
                        ctx.rt
                            .event(&ctx.pod, "Warning", "FailedPostStartHook", &e.message(&ctx, &c, h))
                            .await;
                        ctx.rt
                            .event(&ctx.pod, "Normal", "Killing", "FailedPostStartHook")
                            .await;
                        wake = Some(Wake::PostStartFailed);
                    }
                }
                e = rt.wait_container(&id) => wake = Some(Wake::Exited(e.unwrap_or_else(|_| lost()))),
                _ = stop.cancelled() => wake = Some(Wake::Stop),
            }
        }
        let wake = match wake {
            Some(w) => w,
            None => {
                send(Update::State {
                    name: name.clone(),
                    state: State::Running {
                        started_at: started_at.clone(),
                    },
                    restart_count,
                });
                // Probes.
                let probe_stop = stop.child_token();
                let (live_tx, mut live_rx) = mpsc::channel::<String>(1);
                tokio::spawn(probe_loop(
                    ctx.clone(),
                    c.clone(),
                    probe_stop.clone(),
                    live_tx,
                ));
                let wake = tokio::select! {
                    e = rt.wait_container(&id) => Wake::Exited(e.unwrap_or_else(|_| lost())),
                    _ = stop.cancelled() => Wake::Stop,
                    Some(msg) = live_rx.recv() => Wake::LivenessFailed(msg),
                };
                probe_stop.cancel();
                wake
            }
        };
        let exited = match wake {
            Wake::Exited(e) => e,
            Wake::Stop | Wake::LivenessFailed(_) | Wake::PostStartFailed => {
                if let Wake::LivenessFailed(msg) = &wake {
                    ctx.rt
                        .event(
                            &ctx.pod,
                            "Normal",
                            "Killing",
                            &format!(
                                "Container {name} failed liveness probe, will be restarted: {msg}"
                            ),
                        )
                        .await;
                }
                let g = grace.load(std::sync::atomic::Ordering::SeqCst).max(0);
                kill(&ctx, &c, &id, g).await;
                rt.wait_container(&id).await.unwrap_or_else(|_| lost())
            }
        };
        let _ = rt.remove_container(&id).await;
        if let Ok(mut m) = ctx.shared.containers.lock()
            && let Some(i) = m.get_mut(&name)
        {
            i.pid = None;
        }
        let code = exited.exit_code;
        send(Update::State {
            name: name.clone(),
            state: State::Terminated(terminated(&exited, Some(started_at))),
            restart_count,
        });
        if stop.is_cancelled() || !podstate::should_restart(&policy, code) {
            return;
        }
        crashes = ctx.rt.backoff.next_crashes(crashes, started.elapsed());
        if !back_off(&ctx, &c, crashes, &stop, restart_count).await {
            return;
        }
        restart_count += 1;
    }
}

/// Stops a container as kubelet's killContainer: its preStop hook first (when there is a grace
/// period), whose time counts against the grace, then the runtime's stop with what is left —
/// at least 2 s after a preStop hook ran.
pub(super) async fn kill(ctx: &Ctx, c: &Container, id: &seam::ContainerId, grace_secs: i64) {
    let mut grace = grace_secs;
    if grace > 0
        && let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
    {
        let started = Instant::now();
        let budget = Duration::from_secs(grace as u64);
        match tokio::time::timeout(budget, hooks::run(ctx, c, id, h, budget)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::info!(
                    "preStop hook of {}/{} container {}: {}",
                    ctx.shared.namespace,
                    ctx.shared.name,
                    c.name,
                    e.message(ctx, c, h)
                );
                // Not the message: it may hold secrets (as kubelet).
                ctx.rt
                    .event(
                        &ctx.pod,
                        "Warning",
                        "FailedPreStopHook",
                        "PreStopHook failed",
                    )
                    .await;
            }
            Err(_) => tracing::info!(
                "preStop hook of {}/{} container {} not done within {grace}s",
                ctx.shared.namespace,
                ctx.shared.name,
                c.name
            ),
        }
        grace = (grace - started.elapsed().as_secs() as i64).max(hooks::MIN_GRACE_AFTER_PRE_STOP);
    }
    let _ = ctx
        .rt
        .pods_runtime
        .stop_container(id, Duration::from_secs(grace.max(0) as u64))
        .await;
}

/// Waits the restart back-off (reporting CrashLoopBackOff). False when the pod is stopping.
pub(super) async fn back_off(
    ctx: &Ctx,
    c: &Container,
    crashes: u32,
    stop: &CancellationToken,
    restart_count: i32,
) -> bool {
    let delay = ctx.rt.backoff.delay(crashes);
    if delay.is_zero() {
        return !stop.is_cancelled();
    }
    let msg = format!(
        "back-off {}s restarting failed container={} pod={}_{}({})",
        delay.as_secs(),
        c.name,
        ctx.shared.name,
        ctx.shared.namespace,
        ctx.shared.uid
    );
    ctx.rt
        .event(
            &ctx.pod,
            "Warning",
            "BackOff",
            &format!(
                "Back-off restarting failed container {} in pod {}_{}({})",
                c.name, ctx.shared.name, ctx.shared.namespace, ctx.shared.uid
            ),
        )
        .await;
    let _ = ctx.updates.send(Update::State {
        name: c.name.clone(),
        state: State::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: Some(msg),
        },
        restart_count,
    });
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}
