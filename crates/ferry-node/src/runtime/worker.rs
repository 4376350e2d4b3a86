//! The pod worker: one task per pod that prepares the pod's network and files, starts and stops
//! its containers, owns its status and finishes it when the pod is deleted.

use super::*;

pub(super) async fn pod_worker(
    rt: Arc<Runtime>,
    mut rx: watch::Receiver<Pod>,
    shared: Arc<PodShared>,
    gone: CancellationToken,
) -> crate::error::Result<()> {
    let pod = rx.borrow_and_update().clone();
    let ns = shared.namespace.clone();
    let name = shared.name.clone();
    let uid = shared.uid.clone();
    let pods: Api<Pod> = Api::namespaced(rt.client.clone(), &ns);
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let mut status = StatusBook::new(&pod, &rt.node_ips);
    let dirs = Arc::new(PodDirs {
        root: rt.state_dir.join("pods").join(format!("{ns}_{name}_{uid}")),
    });
    tokio::fs::create_dir_all(dirs.root.join("logs")).await?;

    // Hostname (an FQDN over 64 characters keeps the pod from starting).
    let hostname = match dns::pod_hostname(&pod, &rt.cluster_dns.domain) {
        Ok(h) => h,
        Err(msg) => {
            rt.event(
                &pod,
                "Warning",
                "FailedCreatePodSandBox",
                &format!("Failed to create pod sandbox: {msg}"),
            )
            .await;
            for c in &spec.containers {
                status.set_state(
                    &c.name,
                    State::Waiting {
                        reason: "ContainerCreating".into(),
                        message: None,
                    },
                    0,
                );
            }
            status.push(&pods, &name, false).await;
            wait_deletion(&mut rx, &gone).await;
            finish(&rt, &pods, &name, &uid, &dirs).await;
            return Ok(());
        }
    };
    // A hostNetwork pod has the node's hostname.
    let hostname = if spec.host_network.unwrap_or(false) {
        rt.node_name.clone()
    } else {
        hostname
    };
    let wanted = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|s| s.parse().ok());
    let host_network = spec.host_network.unwrap_or(false);
    let sandbox_spec = seam::SandboxSpec {
        uid: uid.clone(),
        namespace: ns.clone(),
        name: name.clone(),
        hostname: hostname.clone(),
        host_network,
        port_mappings: port_mappings(&spec),
        resolv_conf: dirs.resolv(),
        hosts_file: dirs.hosts(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        annotations: pod.metadata.annotations.clone().unwrap_or_default(),
        log_directory: dirs.root.clone(),
        preferred_ip: wanted,
    };
    let mut attempt: u32 = 0;
    let sandbox = loop {
        match rt.pods_runtime.run_sandbox(&sandbox_spec).await {
            Ok(sb) => break sb,
            Err(e) => {
                // As kubelet: the sandbox is retried with back-off, each failure an Event; the
                // pod stays Pending (ContainerCreating) meanwhile.
                rt.event(
                    &pod,
                    "Warning",
                    "FailedCreatePodSandBox",
                    &format!("Failed to create pod sandbox: {e}"),
                )
                .await;
                if attempt == 0 {
                    status.push(&pods, &name, false).await;
                }
                let delay = Duration::from_secs((1u64 << attempt.min(5)).min(30));
                attempt += 1;
                let deleted = tokio::select! {
                    _ = tokio::time::sleep(delay) => false,
                    _ = gone.cancelled() => true,
                    r = rx.changed() => r.is_err() || rx.borrow_and_update().metadata.deletion_timestamp.is_some(),
                };
                if deleted {
                    wait_deletion(&mut rx, &gone).await;
                    finish(&rt, &pods, &name, &uid, &dirs).await;
                    return Ok(());
                }
            }
        }
    };
    // A hostNetwork pod has the node's addresses.
    let pod_addrs: Vec<IpAddr> = if host_network {
        rt.node_ips.clone()
    } else {
        sandbox.ips.clone()
    };
    shared
        .netns
        .store(sandbox.netns.is_some(), std::sync::atomic::Ordering::SeqCst);
    let ip = pod_addrs
        .first()
        .copied()
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    status.pod_ips = pod_addrs.iter().map(|i| i.to_string()).collect();
    let outcome = dns::resolv_conf(&pod, &rt.cluster_dns);
    for w in &outcome.warnings {
        rt.event(&pod, "Warning", "DNSConfigForming", w).await;
    }
    tokio::fs::write(dirs.resolv(), outcome.conf.render()).await?;
    let hosts = if spec.host_network.unwrap_or(false) {
        dns::etc_hosts_host_network(
            &tokio::fs::read_to_string("/etc/hosts")
                .await
                .unwrap_or_default(),
        )
    } else {
        dns::etc_hosts(&pod, &status.pod_ips, &rt.cluster_dns.domain)
    };
    tokio::fs::write(dirs.hosts(), hosts).await?;

    // Volumes: populated before any container starts; a missing Secret or ConfigMap keeps the
    // pod ContainerCreating with FailedMount Events, retried with back-off (as kubelet).
    if spec.volumes.as_ref().is_some_and(|v| !v.is_empty()) {
        let mut attempt: u32 = 0;
        // Projected tokens are reused until 80% of their lifetime (kubelet's token manager).
        let tokens = Arc::new(crate::volumes::TokenCache::default());
        loop {
            match sync_volumes(&rt, &pod, &dirs, &tokens).await {
                Ok(()) => break,
                Err(msg) => {
                    rt.event(&pod, "Warning", "FailedMount", &msg.to_string())
                        .await;
                    if attempt == 0 {
                        status.push(&pods, &name, false).await;
                    }
                    let delay = Duration::from_secs((1u64 << attempt.min(4)).min(16));
                    attempt += 1;
                    let deleted = tokio::select! {
                        _ = tokio::time::sleep(delay) => false,
                        _ = gone.cancelled() => true,
                        r = rx.changed() => r.is_err() || rx.borrow_and_update().metadata.deletion_timestamp.is_some(),
                    };
                    if deleted {
                        wait_deletion(&mut rx, &gone).await;
                        finish(&rt, &pods, &name, &uid, &dirs).await;
                        return Ok(());
                    }
                }
            }
        }
        // Kept up to date while the pod runs (kubelet resyncs periodically too).
        let (rt2, pod2, dirs2, gone2) = (rt.clone(), pod.clone(), dirs.clone(), gone.clone());
        let tokens2 = tokens.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = gone2.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
                if !dirs2.root.exists() {
                    return;
                }
                if let Err(e) = sync_volumes(&rt2, &pod2, &dirs2, &tokens2).await {
                    tracing::debug!("volume resync: {e}");
                }
            }
        });
    }
    status.sandbox_ready = true;

    let (utx, mut urx) = mpsc::unbounded_channel();
    let ctx = Ctx {
        rt: rt.clone(),
        pod: pod.clone(),
        ip,
        pod_ips: status.pod_ips.clone(),
        sandbox,
        hostname,
        dirs: dirs.clone(),
        shared: shared.clone(),
        updates: utx,
    };
    for c in &spec.containers {
        status.set_state(
            &c.name,
            State::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            },
            0,
        );
    }
    status.push(&pods, &name, false).await;

    // Init containers, in order, each to completion.
    let stop = CancellationToken::new();
    let mut init_ok = true;
    for c in spec.init_containers.clone().unwrap_or_default() {
        // initContainerStatuses as kubelet reports them (kubectl shows Init:i/n from these).
        let started_at = now();
        status.set_init(
            &c.name,
            State::Running {
                started_at: started_at.clone(),
            },
        );
        status.push(&pods, &name, false).await;
        let code = run_once(&ctx, &c, &stop, &mut rx, &gone).await;
        let exit = code.unwrap_or(128 + 9);
        status.set_init(
            &c.name,
            State::Terminated(Terminated {
                exit_code: exit,
                signal: None,
                reason: Terminated::reason_for(exit).to_string(),
                message: None,
                started_at: Some(started_at),
                finished_at: now(),
            }),
        );
        if code == Some(0) {
            status.push(&pods, &name, false).await;
        }
        if code != Some(0) {
            init_ok = false;
            break;
        }
    }
    if !init_ok {
        if policy == "Never" || stop.is_cancelled() || gone.is_cancelled() {
            status.init_failed = true;
            status.push(&pods, &name, false).await;
            wait_deletion(&mut rx, &gone).await;
            finish(&rt, &pods, &name, &uid, &dirs).await;
            return Ok(());
        }
        // Simplification: a failed init container under Always/OnFailure is not retried.
        status.init_failed = true;
        status.push(&pods, &name, false).await;
        wait_deletion(&mut rx, &gone).await;
        finish(&rt, &pods, &name, &uid, &dirs).await;
        return Ok(());
    }
    status.init_done = true;

    let grace = Arc::new(std::sync::atomic::AtomicI64::new(
        spec.termination_grace_period_seconds.unwrap_or(30),
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for c in spec.containers.clone() {
        let ctx = ctx.clone();
        let stop = stop.clone();
        let policy = policy.clone();
        let grace = grace.clone();
        tasks.spawn(async move { container_task(ctx, c, policy, stop, grace).await });
    }
    drop(ctx);
    let mut terminating = pod.metadata.deletion_timestamp.is_some();
    if terminating {
        start_stop(
            &rt,
            &pod,
            &stop,
            &grace,
            pod.metadata.deletion_grace_period_seconds,
        );
    }
    let mut dirty = true;
    // The update channel closes when the last container task ends; that alone says nothing
    // about the pod (a finished Never/OnFailure pod stays until deleted), so it only stops
    // this arm — the tasks arm decides what happens next.
    let mut updates_open = true;
    loop {
        if dirty && !gone.is_cancelled() {
            status.push(&pods, &name, false).await;
            dirty = false;
        }
        tokio::select! {
            u = urx.recv(), if updates_open => {
                match u {
                    Some(u) => { status.apply(u); dirty = true; }
                    None => { updates_open = false; continue; }
                }
                // Coalesce whatever else is queued.
                while let Ok(u) = urx.try_recv() { status.apply(u); }
            }
            r = rx.changed(), if !terminating => {
                if r.is_err() { break; }
                let p = rx.borrow_and_update().clone();
                if p.metadata.deletion_timestamp.is_some() {
                    terminating = true;
                    dirty = true;
                    start_stop(&rt, &p, &stop, &grace, p.metadata.deletion_grace_period_seconds);
                }
            }
            _ = gone.cancelled(), if !stop.is_cancelled() => {
                grace.store(0, std::sync::atomic::Ordering::SeqCst);
                stop.cancel();
            }
            _r = tasks.join_next(), if !tasks.is_empty() => {
                if tasks.is_empty() && stop.is_cancelled() { break; }
                if tasks.is_empty() {
                    // Every container finished for good (restartPolicy): final status,
                    // then wait for the deletion.
                    while let Ok(u) = urx.try_recv() { status.apply(u); }
                    status.push(&pods, &name, false).await;
                    if gone.is_cancelled() { break; }
                    wait_deletion(&mut rx, &gone).await;
                    break;
                }
            }
        }
    }
    while let Some(_r) = tasks.join_next().await {}
    while let Ok(u) = urx.try_recv() {
        status.apply(u);
    }
    if !gone.is_cancelled() {
        status.push(&pods, &name, true).await;
    }
    finish(&rt, &pods, &name, &uid, &dirs).await;
    Ok(())
}

pub(super) fn start_stop(
    rt: &Arc<Runtime>,
    pod: &Pod,
    stop: &CancellationToken,
    grace: &Arc<std::sync::atomic::AtomicI64>,
    seconds: Option<i64>,
) {
    if let Some(s) = seconds {
        grace.store(s, std::sync::atomic::Ordering::SeqCst);
    }
    if !stop.is_cancelled() {
        let rt = rt.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
                rt.event(
                    &pod,
                    "Normal",
                    "Killing",
                    &format!("Stopping container {}", c.name),
                )
                .await;
            }
        });
    }
    stop.cancel();
}

pub(super) async fn wait_deletion(rx: &mut watch::Receiver<Pod>, gone: &CancellationToken) {
    loop {
        if rx.borrow().metadata.deletion_timestamp.is_some() {
            return;
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = gone.cancelled() => return,
        }
    }
}

/// Deletes the pod object for good (grace 0, same uid) and frees its address and files.
pub(super) async fn finish(
    rt: &Arc<Runtime>,
    pods: &Api<Pod>,
    name: &str,
    uid: &str,
    dirs: &PodDirs,
) {
    let id = seam::SandboxId(uid.to_string());
    let stop_sandbox = || async {
        if let Err(e) = rt.pods_runtime.stop_sandbox(&id).await {
            tracing::warn!("stopping sandbox of pod {name}: {e}");
        }
    };
    if rt.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        // The sandbox's record stays: the next agent finds it (`list_sandboxes`).
        stop_sandbox().await;
        return;
    }
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods.delete(name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => tracing::warn!("deleting pod {name}: {e}"),
    }
    stop_sandbox().await;
    if let Err(e) = rt.pods_runtime.remove_sandbox(&id).await {
        tracing::warn!("removing sandbox of pod {name}: {e}");
    }
    let _ = tokio::fs::remove_dir_all(&dirs.root).await;
}

/// The `hostPort` mappings of a pod's containers (CNI `portMappings`).
pub(super) fn port_mappings(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<seam::PortMapping> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host = p.host_port.filter(|h| *h > 0)?;
            Some(seam::PortMapping {
                host_port: u16::try_from(host).ok()?,
                container_port: u16::try_from(p.container_port).ok()?,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                host_ip: p.host_ip.clone().filter(|i| !i.is_empty()),
            })
        })
        .collect()
}
