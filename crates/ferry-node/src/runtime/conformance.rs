//! The conformance suite every [`PodRuntime`] must pass (the process runtime in this crate's
//! tests; a CRI runtime against a containerd its test starts).
//!
//! Each case is a `pub async fn(&Fixture)` that panics on failure and cleans up what it made
//! (sandboxes are stopped and removed at its end). [`run_all`] runs them in order. Cases wait
//! with generous deadlines and assert no upper bound on timings.
//!
//! ```ignore
//! let dir = tempfile::tempdir().unwrap();
//! let root = dir.path().to_path_buf();
//! let fixture = Fixture {
//!     dir: root.clone(),
//!     image: "busybox".into(),
//!     make: Box::new(move || my_runtime_on(&root)),
//! };
//! ferry_node::runtime::conformance::run_all(&fixture).await;
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::seam::*;

/// What the suite runs against.
pub struct Fixture {
    /// A runtime object on the same state each call (a second call is "the runtime restarted").
    pub make: Box<dyn Fn() -> Arc<dyn PodRuntime> + Send + Sync>,
    /// A directory for the pods' dirs (the data dir's `pods/`).
    pub dir: PathBuf,
    /// An image with a POSIX shell, `sleep`, `echo` and `printf` (busybox).
    pub image: String,
}

/// How long a case waits for something that should happen.
const WAIT: Duration = Duration::from_secs(60);

/// Runs every case.
pub async fn run_all(f: &Fixture) {
    eprintln!("conformance: sandbox_up_down");
    sandbox_up_down(f).await;
    eprintln!("conformance: run_exit_code");
    run_exit_code(f).await;
    eprintln!("conformance: stop_honours_sigterm");
    stop_honours_sigterm(f).await;
    eprintln!("conformance: stop_kills_after_grace");
    stop_kills_after_grace(f).await;
    eprintln!("conformance: exec_sync_output");
    exec_sync_output(f).await;
    eprintln!("conformance: logs_in_cri_format");
    logs_in_cri_format(f).await;
    eprintln!("conformance: list_after_restart");
    list_after_restart(f).await;
}

fn sandbox_spec(f: &Fixture, case: &str) -> SandboxSpec {
    let uid = format!("conformance-{case}-{}", std::process::id());
    let dir = f.dir.join(format!("conformance_{case}_{uid}"));
    std::fs::create_dir_all(&dir).expect("pod dir");
    let resolv = dir.join("resolv.conf");
    let hosts = dir.join("hosts");
    std::fs::write(&resolv, "nameserver 127.0.0.1\n").expect("resolv.conf");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("hosts");
    SandboxSpec {
        uid,
        namespace: "conformance".into(),
        name: case.replace('_', "-"),
        hostname: case.replace('_', "-"),
        host_network: false,
        port_mappings: Vec::new(),
        resolv_conf: resolv,
        hosts_file: hosts,
        labels: Default::default(),
        annotations: Default::default(),
        log_directory: dir,
        preferred_ip: None,
    }
}

fn container(f: &Fixture, sb: &Sandbox, name: &str, script: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        attempt: 0,
        image: f.image.clone(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        args: Vec::new(),
        env: vec![(
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        )],
        working_dir: None,
        mounts: Vec::new(),
        log_path: sb.log_directory.join("logs").join(name).join("0.log"),
        ..Default::default()
    }
}

async fn up(rt: &dyn PodRuntime, spec: &SandboxSpec) -> Sandbox {
    tokio::time::timeout(WAIT, rt.run_sandbox(spec))
        .await
        .expect("run_sandbox in time")
        .expect("run_sandbox")
}

async fn down(rt: &dyn PodRuntime, sb: &Sandbox) {
    rt.stop_sandbox(&sb.id).await.expect("stop_sandbox");
    rt.remove_sandbox(&sb.id).await.expect("remove_sandbox");
    let _ = std::fs::remove_dir_all(&sb.log_directory);
}

/// Creates and starts a container (its image made available first).
async fn run(f: &Fixture, rt: &dyn PodRuntime, sb: &Sandbox, spec: &ContainerSpec) -> ContainerId {
    rt.ensure_image(&ImageRequest {
        image: f.image.clone(),
        pull_policy: "IfNotPresent".into(),
    })
    .await
    .expect("ensure_image");
    let id = rt
        .create_container(sb, spec)
        .await
        .expect("create_container");
    rt.start_container(&id).await.expect("start_container");
    id
}

async fn wait(rt: &dyn PodRuntime, id: &ContainerId) -> Exited {
    tokio::time::timeout(WAIT, rt.wait_container(id))
        .await
        .expect("container exits in time")
        .expect("wait_container")
}

/// Waits until the container's log holds `needle` (the container is ready for what follows).
async fn log_has(spec: &ContainerSpec, needle: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let log = std::fs::read_to_string(&spec.log_path).unwrap_or_default();
        if log.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "log {} never showed {needle:?}: {log:?}",
            spec.log_path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A sandbox comes up (with an address unless host network), is listed, and goes away.
pub async fn sandbox_up_down(f: &Fixture) {
    let rt = (f.make)();
    let spec = sandbox_spec(f, "sandbox_up_down");
    let sb = up(rt.as_ref(), &spec).await;
    assert_eq!(sb.uid, spec.uid);
    assert!(!sb.ips.is_empty(), "a pod sandbox has an address: {sb:?}");
    let again = up(rt.as_ref(), &spec).await;
    assert_eq!(again.id, sb.id, "run_sandbox is idempotent");
    assert_eq!(again.ips, sb.ips);
    let listed = rt.list_sandboxes().await.expect("list");
    assert!(listed.iter().any(|s| s.id == sb.id), "{listed:?}");
    down(rt.as_ref(), &sb).await;
    let listed = rt.list_sandboxes().await.expect("list");
    assert!(!listed.iter().any(|s| s.id == sb.id), "removed: {listed:?}");
}

/// A container runs to its exit code, reported by wait and status.
pub async fn run_exit_code(f: &Fixture) {
    let rt = (f.make)();
    let sb = up(rt.as_ref(), &sandbox_spec(f, "run_exit_code")).await;
    let spec = container(f, &sb, "exits", "exit 3");
    let id = run(f, rt.as_ref(), &sb, &spec).await;
    let e = wait(rt.as_ref(), &id).await;
    assert_eq!((e.exit_code, e.signal, e.oom_killed), (3, None, false));
    match rt.container_status(&id).await.expect("status") {
        ContainerState::Exited(s) => assert_eq!(s.exit_code, 3),
        other => panic!("status after exit: {other:?}"),
    }
    // A second run of the same container (restart) gets its own id.
    let mut spec2 = spec.clone();
    spec2.attempt = 1;
    spec2.command = vec!["sh".into(), "-c".into(), "exit 0".into()];
    spec2.log_path = spec.log_path.with_file_name("1.log");
    let id2 = run(f, rt.as_ref(), &sb, &spec2).await;
    assert_ne!(id, id2);
    assert_eq!(wait(rt.as_ref(), &id2).await.exit_code, 0);
    rt.remove_container(&id).await.expect("remove");
    rt.remove_container(&id2).await.expect("remove");
    down(rt.as_ref(), &sb).await;
}

/// Stopping with a grace period sends SIGTERM, which the container may handle.
pub async fn stop_honours_sigterm(f: &Fixture) {
    let rt = (f.make)();
    let sb = up(rt.as_ref(), &sandbox_spec(f, "stop_honours_sigterm")).await;
    let spec = container(
        f,
        &sb,
        "graceful",
        "trap 'echo terminated; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
    );
    let id = run(f, rt.as_ref(), &sb, &spec).await;
    log_has(&spec, "ready").await;
    tokio::time::timeout(WAIT, rt.stop_container(&id, Duration::from_secs(45)))
        .await
        .expect("stop in time")
        .expect("stop_container");
    let e = wait(rt.as_ref(), &id).await;
    assert_eq!(e.exit_code, 7, "the TERM handler's exit code: {e:?}");
    log_has(&spec, "terminated").await;
    rt.remove_container(&id).await.expect("remove");
    down(rt.as_ref(), &sb).await;
}

/// A container that ignores SIGTERM is killed when the grace period is over (not before).
pub async fn stop_kills_after_grace(f: &Fixture) {
    let rt = (f.make)();
    let sb = up(rt.as_ref(), &sandbox_spec(f, "stop_kills_after_grace")).await;
    let spec = container(
        f,
        &sb,
        "stubborn",
        "trap '' TERM; echo ready; while :; do sleep 0.1; done",
    );
    let id = run(f, rt.as_ref(), &sb, &spec).await;
    log_has(&spec, "ready").await;
    let t = Instant::now();
    let grace = Duration::from_secs(1);
    tokio::time::timeout(WAIT, rt.stop_container(&id, grace))
        .await
        .expect("stop in time")
        .expect("stop_container");
    assert!(t.elapsed() >= grace, "killed before the grace period ended");
    let e = wait(rt.as_ref(), &id).await;
    assert_eq!((e.exit_code, e.signal), (137, Some(9)), "{e:?}");
    rt.remove_container(&id).await.expect("remove");
    down(rt.as_ref(), &sb).await;
}

/// exec_sync returns the command's stdout, stderr and exit code.
pub async fn exec_sync_output(f: &Fixture) {
    let rt = (f.make)();
    let sb = up(rt.as_ref(), &sandbox_spec(f, "exec_sync_output")).await;
    let spec = container(f, &sb, "sleeper", "echo ready; exec sleep 600");
    let id = run(f, rt.as_ref(), &sb, &spec).await;
    log_has(&spec, "ready").await;
    let cmd: Vec<String> = ["sh", "-c", "echo out; echo err >&2; exit 4"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let o = rt.exec_sync(&id, &cmd, WAIT).await.expect("exec_sync");
    assert_eq!(
        (o.stdout.as_slice(), o.stderr.as_slice(), o.exit_code),
        (&b"out\n"[..], &b"err\n"[..], 4)
    );
    let ok: Vec<String> = vec!["true".into()];
    assert_eq!(
        rt.exec_sync(&id, &ok, WAIT).await.expect("exec").exit_code,
        0
    );
    rt.stop_container(&id, Duration::ZERO).await.expect("stop");
    let e = wait(rt.as_ref(), &id).await;
    assert_eq!(e.signal, Some(9));
    assert!(
        rt.exec_sync(&id, &ok, WAIT).await.is_err(),
        "exec in an exited container fails"
    );
    rt.remove_container(&id).await.expect("remove");
    down(rt.as_ref(), &sb).await;
}

/// One parsed CRI log line: stream, tag, content.
fn cri_line(line: &str) -> (String, String, String) {
    let mut parts = line.splitn(4, ' ');
    let (Some(time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("not a CRI log line: {line:?}");
    };
    let content = parts.next().unwrap_or_default();
    assert!(
        time.parse::<jiff::Timestamp>().is_ok(),
        "RFC 3339 time in {line:?}"
    );
    assert!(stream == "stdout" || stream == "stderr", "{line:?}");
    assert!(tag == "F" || tag == "P", "{line:?}");
    (stream.into(), tag.into(), content.into())
}

/// Output is written to the log path in the CRI format: `<time> <stream> <F|P> <content>`.
pub async fn logs_in_cri_format(f: &Fixture) {
    let rt = (f.make)();
    let sb = up(rt.as_ref(), &sandbox_spec(f, "logs_in_cri_format")).await;
    let spec = container(
        f,
        &sb,
        "talker",
        "echo hello; echo oops >&2; printf partial",
    );
    let id = run(f, rt.as_ref(), &sb, &spec).await;
    assert_eq!(wait(rt.as_ref(), &id).await.exit_code, 0);
    log_has(&spec, "partial").await;
    let log = std::fs::read_to_string(&spec.log_path).expect("log");
    let mut lines: Vec<(String, String, String)> = log.lines().map(cri_line).collect();
    lines.sort();
    let want = |s: &str, t: &str, c: &str| (s.to_string(), t.to_string(), c.to_string());
    assert_eq!(
        lines,
        vec![
            want("stderr", "F", "oops"),
            want("stdout", "F", "hello"),
            want("stdout", "P", "partial"),
        ],
        "{log}"
    );
    rt.remove_container(&id).await.expect("remove");
    down(rt.as_ref(), &sb).await;
}

/// A new runtime object (the agent restarted) lists the sandboxes the previous one left.
pub async fn list_after_restart(f: &Fixture) {
    let spec = sandbox_spec(f, "list_after_restart");
    let sb = {
        let first = (f.make)();
        up(first.as_ref(), &spec).await
    };
    let second = (f.make)();
    let listed = second.list_sandboxes().await.expect("list");
    let found = listed
        .iter()
        .find(|s| s.id == sb.id)
        .unwrap_or_else(|| panic!("sandbox {} not listed after restart: {listed:?}", sb.id));
    assert_eq!(
        (&found.uid, &found.namespace, &found.name),
        (&spec.uid, &spec.namespace, &spec.name)
    );
    down(second.as_ref(), &sb).await;
    let listed = second.list_sandboxes().await.expect("list");
    assert!(!listed.iter().any(|s| s.id == sb.id), "{listed:?}");
}
