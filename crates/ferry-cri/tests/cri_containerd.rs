//! Root-only: a supervised containerd in a test network namespace runs pods from Ferry's
//! offline images through the CRI client. Skips (passing, with the reason printed) without
//! root or containerd.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use ferry_cri::containerd::{self, Supervisor, SupervisorConfig};
use ferry_cri::{CriClient, images, pb};

const MIB: i64 = 1024 * 1024;

fn sandbox_config(
    name: &str,
    uid: &str,
    logs: &std::path::Path,
    cgroup: &str,
) -> pb::PodSandboxConfig {
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.display().to_string(),
        labels: HashMap::from([("app".into(), "ferry-cri-test".into())]),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: cgroup.into(),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(pb::NamespaceOption {
                    network: pb::NamespaceMode::Pod as i32,
                    pid: pb::NamespaceMode::Container as i32,
                    ipc: pb::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str, argv: &[&str], memory: i64) -> pb::ContainerConfig {
    pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ferry_cri::client::image_spec(images::BUSYBOX_IMAGE)),
        command: argv.iter().map(|s| s.to_string()).collect(),
        envs: vec![pb::KeyValue {
            key: "GREETING".into(),
            value: "hello".into(),
        }],
        log_path: format!("{name}/0.log"),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(pb::LinuxContainerResources {
                memory_limit_in_bytes: memory,
                ..Default::default()
            }),
            security_context: Some(pb::LinuxContainerSecurityContext {
                namespace_options: Some(pb::NamespaceOption {
                    network: pb::NamespaceMode::Pod as i32,
                    pid: pb::NamespaceMode::Container as i32,
                    ipc: pb::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

async fn state_of(c: &CriClient, id: &str) -> pb::ContainerStatus {
    c.container_status(id, false)
        .await
        .expect("container status")
        .status
        .expect("status present")
}

/// Runs a sandbox with one running container; returns (sandbox id, container id, time taken).
async fn run_pod(
    c: &CriClient,
    cfg: &pb::PodSandboxConfig,
    container: pb::ContainerConfig,
) -> (String, String, Duration) {
    let t = Instant::now();
    let sb = c
        .run_pod_sandbox(cfg.clone(), "")
        .await
        .expect("RunPodSandbox");
    let id = c
        .create_container(&sb, container, cfg.clone())
        .await
        .expect("CreateContainer");
    c.start_container(&id).await.expect("StartContainer");
    let cid = id.clone();
    poll(60, "container running", || {
        let c = c.clone();
        let id = cid.clone();
        async move {
            let st = state_of(&c, &id).await;
            (st.state == pb::ContainerState::ContainerRunning as i32).then_some(())
        }
    })
    .await;
    (sb, id, t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_real_oci_images() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIP pods_run_real_oci_images: {why}");
        return;
    }
    let before = default_paths();
    let etc_before = etc_containerd();
    let tmp = tempfile::Builder::new()
        .prefix("ferry-cri-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let netns = Netns::new("pods");
    let cgroup = CgroupParent::new("pods");
    let data = tmp.path().join("containerd");
    let result = tokio::spawn(pods_body(
        tmp.path().to_path_buf(),
        netns.path(),
        cgroup.name.clone(),
    ))
    .await;
    // Whatever happened: nothing of this test may stay behind.
    let found = containerd::cleanup_leftovers(&data).await.expect("cleanup");
    if let Err(e) = result {
        tidy_default_paths(&before);
        let log = std::fs::read_to_string(data.join("containerd.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!(
            "containerd log (last lines, newest first):\n{}",
            tail.join("\n")
        );
        drop(cgroup);
        drop(netns);
        std::panic::resume_unwind(e.into_panic());
    }
    assert!(
        found.shims.is_empty() && found.containerd.is_empty(),
        "{found:?}"
    );
    assert_nothing_left(&data, tmp.path());
    drop(cgroup);
    drop(netns);
    assert!(
        !std::path::Path::new(&format!(
            "/run/netns/ferry-cri-test-{}-pods",
            std::process::id()
        ))
        .exists()
    );
    check_default_paths(&before);
    assert_eq!(etc_containerd(), etc_before, "/etc/containerd changed");
}

async fn pods_body(tmp: std::path::PathBuf, netns: std::path::PathBuf, cgroup: String) {
    let data = tmp.join("containerd");
    let (pause_tar, busybox_tar) = write_images(&tmp, images::BUSYBOX_IMAGE);

    let mut cfg = SupervisorConfig::new(&data);
    std::fs::create_dir_all(&data).expect("mkdir");
    cfg.options.snapshotter = containerd::choose_snapshotter(&data).into();
    let netns_path = netns.clone();
    cfg.netns = Some(netns);
    cfg.options.log_level = "debug".into();
    write_cni_conf(&cfg.layout, &tmp, "10.88.41.0/24", "ferrycri0");
    let sup = Supervisor::start(cfg.clone())
        .await
        .expect("containerd starts");
    eprintln!(
        "MEASURE containerd start -> CRI Version ready: {:?} (snapshotter {})",
        sup.ready_after, cfg.options.snapshotter
    );
    let c = sup.client();
    let v = c.version().await.expect("version");
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");

    let sock = cfg.layout.socket();
    images::import_image(&sock, &pause_tar, &cfg.options.snapshotter)
        .await
        .expect("import pause");
    images::import_image(&sock, &busybox_tar, &cfg.options.snapshotter)
        .await
        .expect("import busybox");
    let img = c
        .image_status(images::BUSYBOX_IMAGE)
        .await
        .expect("image status")
        .expect("busybox imported");
    assert!(
        img.repo_tags.iter().any(|t| t == images::BUSYBOX_IMAGE),
        "{img:?}"
    );
    assert!(
        c.image_status("ferry.local/absent:1")
            .await
            .expect("status")
            .is_none()
    );
    let listed = c.list_images().await.expect("list images");
    assert!(
        listed
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| t == images::PAUSE_IMAGE))
    );
    let fs = c.image_fs_info().await.expect("imagefsinfo");
    assert!(!fs.image_filesystems.is_empty());

    // A pod: sandbox + busybox echo/sleep.
    let logs = tmp.join("logs").join("default_web-1_uid1");
    std::fs::create_dir_all(&logs).expect("mkdir logs");
    let sb_cfg = sandbox_config("web-1", "uid-1", &logs, &cgroup);
    let (sb, id, took) = run_pod(
        &c,
        &sb_cfg,
        container_config("main", &["sh", "-c", "echo $GREETING; sleep 1000"], 0),
    )
    .await;
    eprintln!("MEASURE sandbox+container create -> running (run 1): {took:?}");
    let status = c
        .pod_sandbox_status(&sb, true)
        .await
        .expect("sandbox status");
    let st = status.status.expect("status");
    assert_eq!(st.state, pb::PodSandboxState::SandboxReady as i32);
    let ip = st.network.expect("network").ip;
    assert!(ip.starts_with("10.88.41."), "pod IP {ip}");
    let listed = c.list_pod_sandbox(None).await.expect("list sandboxes");
    assert!(listed.iter().any(|s| s.id == sb));

    // The CRI log file has the container's output.
    let log_file = logs.join("main/0.log");
    let line = poll(60, "hello in the CRI log", || {
        let f = log_file.clone();
        async move {
            let text = std::fs::read_to_string(&f).ok()?;
            text.lines()
                .find(|l| l.ends_with(" stdout F hello"))
                .map(str::to_string)
        }
    })
    .await;
    assert!(line.contains('T'), "RFC 3339 time first: {line}");

    let out = c
        .exec_sync(&id, vec!["hostname".into()], Duration::from_secs(30))
        .await
        .expect("exec hostname");
    assert_eq!(out.exit_code, 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "web-1");
    let out = c
        .exec_sync(
            &id,
            vec!["cat".into(), "/proc/1/cmdline".into()],
            Duration::from_secs(30),
        )
        .await
        .expect("exec cat");
    // busybox sh execs its last command: PID 1 (of the container's own PID namespace) is sleep.
    assert_eq!(out.stdout, b"sleep\x001000\0");
    let out = c
        .exec_sync(
            &id,
            vec!["sh".into(), "-c".into(), "echo err >&2; exit 3".into()],
            Duration::from_secs(30),
        )
        .await
        .expect("exec exit 3");
    assert_eq!(
        (out.exit_code, out.stderr.as_slice()),
        (3, b"err\n".as_slice())
    );
    // Exec through the streaming server (WebSocket, v4.channel.k8s.io).
    let url = c
        .exec(pb::ExecRequest {
            container_id: id.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "echo out; echo err >&2; exit 3".into(),
            ],
            stdout: true,
            stderr: true,
            ..Default::default()
        })
        .await
        .expect("exec url");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let streamed = ferry_cri::streaming::run(&url, Some(&netns_path), None)
        .await
        .expect("streamed exec");
    assert_eq!(
        (
            streamed.stdout.as_slice(),
            streamed.stderr.as_slice(),
            streamed.exit_code
        ),
        (b"out\n".as_slice(), b"err\n".as_slice(), 3)
    );
    let url = c
        .exec(pb::ExecRequest {
            container_id: id.clone(),
            cmd: vec!["hostname".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("exec url");
    let streamed = ferry_cri::streaming::run(&url, Some(&netns_path), None)
        .await
        .expect("streamed exec");
    assert_eq!(
        (streamed.stdout.as_slice(), streamed.exit_code),
        (b"web-1\n".as_slice(), 0)
    );
    // Port-forward through the streaming server to a busybox httpd in the pod.
    let web = c
        .create_container(
            &sb,
            container_config(
                "web",
                &["sh", "-c", "mkdir -p /www && echo ferry-pf > /www/index.html && exec httpd -f -p 8080 -h /www"],
                0,
            ),
            sb_cfg.clone(),
        )
        .await
        .expect("create web");
    c.start_container(&web).await.expect("start web");
    let pf_url = c
        .port_forward(&sb, &[8080])
        .await
        .expect("port-forward url");
    let body = poll(60, "page through port-forward", || {
        let url = pf_url.clone();
        let ns = netns_path.clone();
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = ferry_cri::streaming::port_forward(&url, Some(&ns), 8080)
                .await
                .ok()?;
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.ok()?;
            let mut out = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
                .await
                .ok()?
                .ok()?;
            let text = String::from_utf8_lossy(&out).into_owned();
            text.contains("ferry-pf").then_some(text)
        }
    })
    .await;
    assert!(body.starts_with("HTTP/1."), "{body}");
    c.stop_container(&web, Duration::ZERO)
        .await
        .expect("stop web");
    c.remove_container(&web).await.expect("remove web");

    let stats = c.list_container_stats(None).await.expect("stats");
    assert!(
        stats
            .iter()
            .any(|s| s.attributes.as_ref().is_some_and(|a| a.id == id))
    );

    // OOM: 16 MiB limit, the shell holds 64 MiB.
    let oom = c
        .create_container(
            &sb,
            container_config(
                "hog",
                &[
                    "sh",
                    "-c",
                    "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived",
                ],
                16 * MIB,
            ),
            sb_cfg.clone(),
        )
        .await
        .expect("create hog");
    c.start_container(&oom).await.expect("start hog");
    let st = tokio::time::timeout(
        Duration::from_secs(60),
        c.wait_container_exit(&oom, Duration::from_millis(200)),
    )
    .await
    .expect("hog exits within 60 s")
    .expect("hog status");
    assert_eq!(st.reason, "OOMKilled", "{st:?}");
    assert_eq!(st.exit_code, 137, "{st:?}");

    // Errors are typed.
    let e = c
        .container_status("no-such-container", false)
        .await
        .expect_err("absent");
    assert!(e.is_not_found(), "{e:?}");

    // Orderly teardown.
    for cid in [&id, &oom] {
        c.stop_container(cid, Duration::from_secs(2))
            .await
            .expect("stop");
        c.remove_container(cid).await.expect("remove");
    }
    c.stop_pod_sandbox(&sb).await.expect("stop sandbox");
    c.remove_pod_sandbox(&sb).await.expect("remove sandbox");
    c.remove_pod_sandbox(&sb)
        .await
        .expect("remove is idempotent");

    // More timings.
    for run in 2..=3 {
        let cfg_n = sandbox_config(&format!("web-{run}"), &format!("uid-{run}"), &logs, &cgroup);
        let (sb, id, took) =
            run_pod(&c, &cfg_n, container_config("main", &["sleep", "1000"], 0)).await;
        eprintln!("MEASURE sandbox+container create -> running (run {run}): {took:?}");
        c.stop_container(&id, Duration::ZERO).await.expect("stop");
        c.remove_container(&id).await.expect("remove");
        c.stop_pod_sandbox(&sb).await.expect("stop sandbox");
        c.remove_pod_sandbox(&sb).await.expect("remove sandbox");
    }
    if let Some(pid) = sup.pid() {
        eprintln!(
            "MEASURE containerd RSS idle: {} KiB",
            rss_kib(pid).unwrap_or(0)
        );
    }

    // A pod left running, then containerd stops as if Ferry had been killed: the cleanup
    // of a restarted `ferry up` removes the shim, the container, mounts and state.
    let cfg_k = sandbox_config("left", "uid-left", &logs, &cgroup);
    let (_sb, _id, _) = run_pod(&c, &cfg_k, container_config("main", &["sleep", "1000"], 0)).await;
    let before_kill = containerd::detect_leftovers(&cfg.layout);
    assert!(!before_kill.shims.is_empty(), "{before_kill:?}");
    assert!(!before_kill.mounts.is_empty(), "{before_kill:?}");
    if let Some(pid) = sup.pid() {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).expect("pid"),
            rustix::process::Signal::KILL,
        );
    }
    sup.stop().await;
    let found = containerd::cleanup_leftovers(&data).await.expect("cleanup");
    assert!(!found.shims.is_empty(), "{found:?}");
    assert_nothing_left(&data, &tmp);
}

/// A containerd that exits at once is reported with its status and log, not waited on.
#[tokio::test]
async fn start_reports_an_exiting_containerd() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = SupervisorConfig::new(tmp.path().join("containerd"));
    cfg.containerd_bin = "/bin/false".into();
    match Supervisor::start(cfg).await {
        Err(containerd::ContainerdError::Exited { status, .. }) => {
            assert!(status.contains("exit status: 1"), "{status}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("/bin/false cannot serve CRI"),
    }
}
