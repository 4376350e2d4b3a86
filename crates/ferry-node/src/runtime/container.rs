//! Container supervision: preparing and spawning a container's process, waiting for it, restarting
//! it with back-off, stopping it gracefully, and reaping processes of an earlier agent.

use super::*;

/// Everything needed to start a container process.
pub(super) struct Prepared {
    pub(super) argv: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) working_dir: Option<String>,
    /// Volume mounts: (source on the host, mountPath, read-only).
    pub(super) mounts: Vec<(PathBuf, String, bool)>,
}

pub(super) async fn prepare(ctx: &Ctx, c: &Container) -> Result<Prepared, (String, String)> {
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
    let image = c.image.clone().unwrap_or_default();
    // In its own network namespace a built-in server listens on every address of the pod
    // (both families); otherwise on the pod IP.
    let own_netns = !ctx.enter.is_empty()
        && !ctx
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
    let bind_ip = if own_netns {
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    } else {
        ctx.ip
    };
    let argv = match images::launch(&image, &command, &args, bind_ip, &ctx.hostname)? {
        Launch::Builtin(a) => {
            let mut v = ctx.rt.builtin.clone();
            v.extend(a);
            v
        }
        Launch::Command(v) => v,
    };
    let mounts = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let mut src = ctx.dirs.volume(&m.name);
            if let Some(sp) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                src = src.join(sp);
            }
            (src, m.mount_path.clone(), m.read_only.unwrap_or(false))
        })
        .collect();
    Ok(Prepared {
        argv,
        env,
        working_dir: c.working_dir.clone(),
        mounts,
    })
}

/// The command line that runs `argv` in the pod's context: as root, in a fresh mount + UTS
/// namespace with the pod's resolv.conf and hosts bind-mounted and its hostname set.
pub(super) fn wrap(ctx: &Ctx, argv: &[String], mounts: &[(PathBuf, String, bool)]) -> Vec<String> {
    if !ctx.shared.isolated {
        let mut v = ctx.enter.clone();
        v.extend(argv.iter().cloned());
        return v;
    }
    // Volumes are bind-mounted in the pod's mount namespace (a missing mount point is made
    // first: processes share the host's file system).
    let mut vols = String::new();
    for (src, dst, ro) in mounts {
        let (s, d) = (
            crate::volumes::sh_quote(&src.display().to_string()),
            crate::volumes::sh_quote(dst),
        );
        vols += &format!(
            "{{ [ -e {d} ] || {{ if [ -d {s} ]; then mkdir -p {d}; else mkdir -p \"$(dirname {d})\" && : > {d}; fi; }}; }} && mount --bind {s} {d} && "
        );
        if *ro {
            vols += &format!("mount -o remount,bind,ro {d} && ");
        }
    }
    let script = format!(
        "mount --bind \"$1\" /etc/resolv.conf && mount --bind \"$2\" /etc/hosts && hostname \"$3\" && {vols}shift 3 && exec \"$@\""
    );
    let mut v: Vec<String> = ctx.enter.clone();
    v.extend([
        "unshare".into(),
        "--mount".into(),
        "--uts".into(),
        "--propagation".into(),
        "private".into(),
        "--kill-child".into(),
        "--fork".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        script,
        "sh".into(),
        ctx.dirs.resolv().display().to_string(),
        ctx.dirs.hosts().display().to_string(),
        ctx.hostname.clone(),
    ]);
    v.extend(argv.iter().cloned());
    v
}

/// Starts a container's process; its output goes through the agent into `log` (CRI log
/// format, created 0600: pod logs may hold secrets), its stdin stays open when the container
/// asks for one (`stdin: true`, for attach).
pub(super) fn spawn(
    ctx: &Ctx,
    p: &Prepared,
    c: &Container,
    log: &std::path::Path,
) -> std::io::Result<(tokio::process::Child, Arc<crate::logs::ContainerIo>)> {
    let argv = wrap(ctx, &p.argv, &p.mounts);
    let (prog, rest) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let want_stdin = c.stdin.unwrap_or(false);
    let tty = c.tty.unwrap_or(false);
    // With `tty: true` the container runs on a terminal of its own (setsid -c makes it the
    // controlling one; the session leader's process group is what stopping signals).
    let mut cmd = if tty {
        let mut cmd = tokio::process::Command::new("setsid");
        cmd.arg("-c").arg(prog).args(rest);
        cmd
    } else {
        let mut cmd = tokio::process::Command::new(prog);
        cmd.args(rest).process_group(0);
        cmd
    };
    cmd.env_clear()
        .envs(p.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .kill_on_drop(true);
    if let Some(wd) = &p.working_dir {
        cmd.current_dir(wd);
    }
    let (child, io) = if tty {
        let pair = nix::pty::openpty(None, None).map_err(std::io::Error::other)?;
        let path = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&pair.slave)
        ))?;
        cmd.stdin(Stdio::from(pair.slave.try_clone()?))
            .stdout(Stdio::from(pair.slave.try_clone()?))
            .stderr(Stdio::from(pair.slave.try_clone()?));
        let child = cmd.spawn()?;
        drop(cmd);
        drop(pair.slave);
        let master = std::fs::File::from(pair.master);
        let writer = tokio::fs::File::from_std(master.try_clone()?);
        let io = crate::logs::ContainerIo::start(
            Some(tokio::fs::File::from_std(master)),
            None::<tokio::fs::File>,
            want_stdin.then(|| Box::new(writer) as crate::logs::StdinWriter),
            c.stdin_once.unwrap_or(false),
            Some(path),
            log,
        )?;
        (child, io)
    } else {
        cmd.stdin(if want_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let io = crate::logs::ContainerIo::start(
            child.stdout.take(),
            child.stderr.take(),
            child
                .stdin
                .take()
                .map(|s| Box::new(s) as crate::logs::StdinWriter),
            c.stdin_once.unwrap_or(false),
            None,
            log,
        )?;
        (child, io)
    };
    // Remember the process group, so that an agent restarted after a crash can stop what the
    // previous one left running (see `reap_stale`).
    if let Some(pid) = child.id() {
        let marker = ctx.dirs.root.join(format!("proc-{pid}"));
        if let Some(start) = process_start_time(pid) {
            let _ = std::fs::write(marker, start.to_string());
        }
    }
    Ok((child, io))
}

/// Field 22 of `/proc/<pid>/stat`: the process's start time, which tells a process from a
/// later one that reused its PID.
pub(super) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; count from the closing parenthesis.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Kills the process groups that a previous agent (killed without a chance to stop its pods)
/// left running, as recorded under `<state dir>/pods/*/proc-<pid>`; returns how many.
pub fn reap_stale(state_dir: &std::path::Path) -> usize {
    let mut reaped = 0;
    let Ok(pods) = std::fs::read_dir(state_dir.join("pods")) else {
        return 0;
    };
    for pod in pods.flatten() {
        let Ok(entries) = std::fs::read_dir(pod.path()) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("proc-")
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let recorded = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if recorded.is_some() && recorded == process_start_time(pid) {
                signal_group(pid, Signal::KILL);
                reaped += 1;
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    reaped
}

pub(super) fn exit_of(st: std::io::Result<std::process::ExitStatus>) -> (i32, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    match st {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => (c, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            _ => (255, None),
        },
        Err(_) => (255, None),
    }
}

/// Runs an init container once to completion. Returns its exit code.
pub(super) async fn run_once(
    ctx: &Ctx,
    c: &Container,
    stop: &CancellationToken,
    rx: &mut watch::Receiver<Pod>,
    gone: &CancellationToken,
) -> Option<i32> {
    let p = prepare(ctx, c).await.ok()?;
    let dir = ctx.dirs.logs(&c.name);
    tokio::fs::create_dir_all(&dir).await.ok()?;
    let (mut child, _io) = spawn(ctx, &p, c, &dir.join("0.log")).ok()?;
    loop {
        tokio::select! {
            st = child.wait() => return Some(exit_of(st).0),
            r = rx.changed() => {
                if r.is_err() || rx.borrow().metadata.deletion_timestamp.is_some() {
                    if let Some(pid) = child.id() { signal_group(pid, Signal::KILL); }
                    stop.cancel();
                    let _ = child.wait().await;
                    return None;
                }
            }
            _ = gone.cancelled() => {
                if let Some(pid) = child.id() { signal_group(pid, Signal::KILL); }
                stop.cancel();
                let _ = child.wait().await;
                return None;
            }
        }
    }
}

pub(super) enum Wake {
    Exited(i32, Option<i32>),
    Stop,
    LivenessFailed(String),
}

pub(super) async fn container_task(
    ctx: Ctx,
    c: Container,
    policy: String,
    stop: CancellationToken,
    grace: Arc<std::sync::atomic::AtomicI64>,
) {
    let name = c.name.clone();
    let image = c.image.clone().unwrap_or_default();
    let mut restart_count: i32 = 0;
    let mut crashes: u32 = 0;
    let send = |u: Update| {
        let _ = ctx.updates.send(u);
    };
    let log_dir = ctx.dirs.logs(&name);
    let _ = tokio::fs::create_dir_all(&log_dir).await;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let prepared = match prepare(&ctx, &c).await {
            Ok(p) => p,
            Err((reason, message)) => {
                ctx.rt
                    .event(&ctx.pod, "Warning", "Failed", &format!("Error: {message}"))
                    .await;
                send(Update::State {
                    name: name.clone(),
                    state: State::Waiting {
                        reason: reason.clone(),
                        message: Some(message),
                    },
                    restart_count,
                });
                if reason == "CreateContainerConfigError" {
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
        if restart_count == 0 {
            ctx.rt
                .event(
                    &ctx.pod,
                    "Normal",
                    "Pulled",
                    &format!("Container image \"{image}\" already present on machine"),
                )
                .await;
        }
        let log = log_dir.join(format!("{restart_count}.log"));
        let started = Instant::now();
        let started_at = now();
        let (mut child, io) = match spawn(&ctx, &prepared, &c, &log) {
            Ok(ch) => ch,
            Err(e) => {
                let msg = format!("failed to start container {name:?}: {e}");
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
        };
        let pid = child.id();
        if let Ok(mut m) = ctx.shared.containers.lock() {
            m.insert(
                name.clone(),
                ContainerInfo {
                    pid,
                    log_dir: log_dir.clone(),
                    restart_count,
                    env: prepared.env.clone(),
                    working_dir: prepared.working_dir.clone(),
                    io: Some(io),
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
            st = child.wait() => { let (c, s) = exit_of(st); Wake::Exited(c, s) }
            _ = stop.cancelled() => Wake::Stop,
            Some(msg) = live_rx.recv() => Wake::LivenessFailed(msg),
        };
        probe_stop.cancel();
        let (code, signal, reason) = match wake {
            Wake::Exited(code, sig) => (code, sig, Terminated::reason_for(code).to_string()),
            Wake::Stop | Wake::LivenessFailed(_) => {
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
                let g = grace.load(std::sync::atomic::Ordering::SeqCst).max(0) as u64;
                let (code, sig) = terminate(&mut child, Duration::from_secs(g)).await;
                (code, sig, Terminated::reason_for(code).to_string())
            }
        };
        if let Ok(mut m) = ctx.shared.containers.lock()
            && let Some(i) = m.get_mut(&name)
        {
            i.pid = None;
        }
        send(Update::State {
            name: name.clone(),
            state: State::Terminated(Terminated {
                exit_code: code,
                signal,
                reason,
                message: None,
                started_at: Some(started_at),
                finished_at: now(),
            }),
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

/// SIGTERM to the container's process group, SIGKILL after `grace`.
pub(super) async fn terminate(
    child: &mut tokio::process::Child,
    grace: Duration,
) -> (i32, Option<i32>) {
    let Some(pid) = child.id() else {
        return exit_of(child.wait().await);
    };
    if grace.is_zero() {
        signal_group(pid, Signal::KILL);
    } else {
        signal_group(pid, Signal::TERM);
    }
    match tokio::time::timeout(grace.max(Duration::from_millis(1)), child.wait()).await {
        Ok(st) => exit_of(st),
        Err(_) => {
            signal_group(pid, Signal::KILL);
            exit_of(child.wait().await)
        }
    }
}

/// A command run "inside" a container: in its namespaces (nsenter) when isolated, with the
/// container's environment and working directory.
pub fn exec_command(
    shared: &PodShared,
    info: &ContainerInfo,
    cmd: &[String],
) -> Result<tokio::process::Command, crate::streaming::StreamError> {
    let (first, rest) = cmd
        .split_first()
        .ok_or(crate::streaming::StreamError::NoCommand)?;
    let netns = shared.netns.load(std::sync::atomic::Ordering::SeqCst);
    let mut c = if shared.isolated || netns {
        let pid = info.pid.ok_or(crate::streaming::StreamError::NotRunning)?;
        let mut c = tokio::process::Command::new("nsenter");
        c.arg("-t").arg(pid.to_string());
        if shared.isolated {
            c.arg("-m").arg("-u");
        }
        if netns {
            c.arg("-n");
        }
        c.arg("--").arg(first).args(rest);
        c
    } else {
        let mut c = tokio::process::Command::new(first);
        c.args(rest);
        c
    };
    c.env_clear()
        .envs(info.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Some(wd) = &info.working_dir {
        c.current_dir(wd);
    }
    Ok(c)
}

#[cfg(test)]
mod reap_tests {
    use super::*;

    #[test]
    fn reaps_what_a_previous_agent_left_running() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = dir.path().join("pods").join("default_p_uid");
        std::fs::create_dir_all(&pod).expect("mkdir");
        let mut child = {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("sleep")
                .arg("30")
                .process_group(0)
                .spawn()
                .expect("sleep")
        };
        let pid = child.id();
        let start = process_start_time(pid).expect("start time");
        std::fs::write(pod.join(format!("proc-{pid}")), start.to_string()).expect("marker");
        // A marker whose start time does not match (a reused PID) is left alone.
        let me = std::process::id();
        std::fs::write(pod.join(format!("proc-{me}")), "1").expect("marker");
        assert_eq!(reap_stale(dir.path()), 1);
        let status = child.wait().expect("wait");
        assert!(!status.success(), "sleep was not killed");
        assert!(
            std::fs::read_dir(&pod).expect("dir").next().is_none(),
            "markers removed"
        );
    }
}
