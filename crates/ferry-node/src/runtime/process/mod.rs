//! The process runtime: a container is a host process (group), a sandbox is the pod's network
//! (a pod address on loopback, or a CNI network namespace) plus, when isolated, a private mount
//! and UTS namespace per container process with the pod's resolv.conf, hosts and volumes
//! mounted in it. Its images are the built-in ones (see [`crate::images`]); nothing is pulled.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::seam::*;
use crate::images::{self, Launch};
use crate::network::{PodNetwork, PodRef};

mod mounts;
mod spawn;
pub use spawn::{nsenter_command, reap_stale, signal_group};

/// What the process runtime needs from the agent.
pub struct ProcessConfig {
    pub network: Arc<dyn PodNetwork>,
    /// The node's addresses (hostNetwork pods'); the first is where built-in servers of a
    /// hostNetwork pod listen.
    pub node_ips: Vec<IpAddr>,
    /// The node's network namespace (netns mode under `ferry up`), where hostNetwork pods run.
    pub node_netns: Option<PathBuf>,
    /// Give each container its own mount + UTS namespace (root and `unshare` available).
    pub isolate: bool,
    /// argv prefix of the built-in image program.
    pub builtin: Vec<String>,
    /// Where pod dirs are (`<state dir>/pods`): `list_sandboxes` finds the records there.
    pub sandbox_root: PathBuf,
}

/// A sandbox as this runtime keeps it (also written as `sandbox.json` in the pod dir).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SandboxRecord {
    sandbox: Sandbox,
    hostname: String,
    resolv_conf: PathBuf,
    hosts_file: PathBuf,
    /// Command prefix entering the pod's network namespace (empty: the agent's).
    enter: Vec<String>,
}

const RECORD: &str = "sandbox.json";

/// One container process.
struct Proc {
    sandbox: SandboxId,
    spec: ContainerSpec,
    /// The full command line (isolation wrapper included).
    argv: Vec<String>,
    pid: Mutex<Option<u32>>,
    started: std::sync::atomic::AtomicBool,
    io: Mutex<Option<Arc<crate::logs::ContainerIo>>>,
    exited: watch::Sender<Option<Exited>>,
}

pub struct ProcessRuntime {
    cfg: ProcessConfig,
    sandboxes: Mutex<HashMap<SandboxId, SandboxRecord>>,
    containers: Mutex<HashMap<ContainerId, Arc<Proc>>>,
    next: AtomicU64,
}

impl ProcessRuntime {
    pub fn new(cfg: ProcessConfig) -> ProcessRuntime {
        ProcessRuntime {
            cfg,
            sandboxes: Mutex::new(HashMap::new()),
            containers: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    /// The pod network's name (for the agent's start-up line).
    pub fn network_name(&self) -> &'static str {
        self.cfg.network.name()
    }

    pub fn isolated(&self) -> bool {
        self.cfg.isolate
    }

    fn record(&self, id: &SandboxId) -> Result<SandboxRecord, RuntimeError> {
        self.sandboxes
            .lock()
            .ok()
            .and_then(|m| m.get(id).cloned())
            .ok_or_else(|| RuntimeError::SandboxNotFound(id.0.clone()))
    }

    fn proc(&self, id: &ContainerId) -> Result<Arc<Proc>, RuntimeError> {
        self.containers
            .lock()
            .ok()
            .and_then(|m| m.get(id).cloned())
            .ok_or_else(|| RuntimeError::ContainerNotFound(id.0.clone()))
    }

    /// The container's process id while it runs.
    fn pid_of(&self, id: &ContainerId) -> Result<u32, RuntimeError> {
        let p = self.proc(id)?;
        if p.exited.borrow().is_some() {
            return Err(RuntimeError::NotRunning(id.0.clone()));
        }
        p.pid
            .lock()
            .ok()
            .and_then(|g| *g)
            .ok_or_else(|| RuntimeError::NotRunning(id.0.clone()))
    }

    /// A command run in the container's namespaces with its environment and working dir.
    fn command_in(
        &self,
        id: &ContainerId,
        cmd: &[String],
        env: Option<&[(String, String)]>,
        working_dir: Option<&str>,
    ) -> Result<tokio::process::Command, RuntimeError> {
        let p = self.proc(id)?;
        let netns = self.record(&p.sandbox)?.sandbox.netns.is_some();
        // Only in a running container (as CRI), whether or not its namespaces are entered.
        let pid = Some(self.pid_of(id)?);
        let env = env.unwrap_or(&p.spec.env);
        let wd = working_dir.or(p.spec.working_dir.as_deref());
        nsenter_command(pid, self.cfg.isolate, netns, env, wd, cmd)
            .ok_or_else(|| RuntimeError::Exec("no command".into()))
    }

    fn kill_sandbox_containers(&self, id: &SandboxId) -> Vec<Arc<Proc>> {
        let procs: Vec<Arc<Proc>> = self
            .containers
            .lock()
            .map(|m| m.values().filter(|p| &p.sandbox == id).cloned().collect())
            .unwrap_or_default();
        for p in &procs {
            if p.exited.borrow().is_none()
                && let Some(pid) = p.pid.lock().ok().and_then(|g| *g)
            {
                signal_group(pid, Signal::KILL);
            }
        }
        procs
    }
}

fn write_record(rec: &SandboxRecord) -> Result<(), RuntimeError> {
    let json = serde_json::to_vec_pretty(rec).map_err(std::io::Error::other)?;
    std::fs::create_dir_all(&rec.sandbox.log_directory)?;
    let path = rec.sandbox.log_directory.join(RECORD);
    ferry_store::private_fs::private_open_options()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &json))?;
    Ok(())
}

fn read_records(root: &Path) -> Vec<SandboxRecord> {
    let Ok(dirs) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    dirs.flatten()
        .filter_map(|d| std::fs::read(d.path().join(RECORD)).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect()
}

/// Accepts what a container image reference may look like (kubelet's parse, loosely): no
/// blanks, no upper case in the repository part, not empty.
fn check_image_name(image: &str) -> Result<(), &'static str> {
    if image.is_empty() {
        return Err("invalid reference format");
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("invalid reference format");
    }
    let repo = image.split('@').next().unwrap_or(image);
    let repo = match repo.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => repo,
    };
    if repo.chars().any(|c| c.is_ascii_uppercase()) {
        return Err("invalid reference format: repository name must be lowercase");
    }
    Ok(())
}

impl PodRuntime for ProcessRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    fn run_sandbox<'a>(
        &'a self,
        spec: &'a SandboxSpec,
    ) -> BoxFuture<'a, Result<Sandbox, RuntimeError>> {
        Box::pin(async move {
            let id = SandboxId(spec.uid.clone());
            if let Ok(rec) = self.record(&id) {
                return Ok(rec.sandbox);
            }
            let (ips, netns, enter) = if spec.host_network {
                let enter = match &self.cfg.node_netns {
                    Some(p) => vec![
                        "nsenter".to_string(),
                        format!("--net={}", p.display()),
                        "--".to_string(),
                    ],
                    None => Vec::new(),
                };
                (Vec::new(), self.cfg.node_netns.clone(), enter)
            } else {
                let podref = PodRef {
                    uid: spec.uid.clone(),
                    namespace: spec.namespace.clone(),
                    name: spec.name.clone(),
                    port_mappings: spec
                        .port_mappings
                        .iter()
                        .map(|m| {
                            let mut v = serde_json::json!({
                                "hostPort": m.host_port,
                                "containerPort": m.container_port,
                                "protocol": m.protocol.to_ascii_lowercase(),
                            });
                            if let Some(ip) = &m.host_ip {
                                v["hostIP"] = serde_json::json!(ip);
                            }
                            v
                        })
                        .collect(),
                };
                let net = self.cfg.network.clone();
                let wanted = spec.preferred_ip;
                let addrs = tokio::task::spawn_blocking(move || net.setup(&podref, wanted))
                    .await
                    .map_err(|e| RuntimeError::CreateSandbox(format!("network set-up task: {e}")))?
                    .map_err(|e| RuntimeError::CreateSandbox(e.to_string()))?;
                let enter = self.cfg.network.enter_prefix(&spec.uid);
                let netns = if enter.is_empty() {
                    None
                } else {
                    self.cfg.network.netns_path(&spec.uid)
                };
                (addrs.ips, netns, enter)
            };
            let rec = SandboxRecord {
                sandbox: Sandbox {
                    id: id.clone(),
                    uid: spec.uid.clone(),
                    namespace: spec.namespace.clone(),
                    name: spec.name.clone(),
                    ips,
                    netns,
                    host_network: spec.host_network,
                    log_directory: spec.log_directory.clone(),
                },
                hostname: spec.hostname.clone(),
                resolv_conf: spec.resolv_conf.clone(),
                hosts_file: spec.hosts_file.clone(),
                enter,
            };
            write_record(&rec)?;
            let sb = rec.sandbox.clone();
            if let Ok(mut m) = self.sandboxes.lock() {
                m.insert(id, rec);
            }
            Ok(sb)
        })
    }

    fn stop_sandbox<'a>(&'a self, id: &'a SandboxId) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            for p in self.kill_sandbox_containers(id) {
                let mut rx = p.exited.subscribe();
                if p.started.load(Ordering::SeqCst) {
                    let _ = rx.wait_for(|e| e.is_some()).await;
                }
            }
            // Known here or left by a previous agent: the network goes either way.
            let host_network = self
                .record(id)
                .map(|r| r.sandbox.host_network)
                .unwrap_or(false);
            if !host_network {
                let net = self.cfg.network.clone();
                let uid = id.0.clone();
                let _ = tokio::task::spawn_blocking(move || net.teardown(&uid)).await;
            }
            Ok(())
        })
    }

    fn remove_sandbox<'a>(&'a self, id: &'a SandboxId) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.kill_sandbox_containers(id);
            if let Ok(mut m) = self.containers.lock() {
                m.retain(|_, p| &p.sandbox != id);
            }
            let rec = self.sandboxes.lock().ok().and_then(|mut m| m.remove(id));
            let dir = match rec {
                Some(r) => Some(r.sandbox.log_directory),
                None => read_records(&self.cfg.sandbox_root)
                    .into_iter()
                    .find(|r| &r.sandbox.id == id)
                    .map(|r| r.sandbox.log_directory),
            };
            if let Some(d) = dir
                && let Err(e) = std::fs::remove_file(d.join(RECORD))
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(e.into());
            }
            Ok(())
        })
    }

    fn ensure_image<'a>(
        &'a self,
        req: &'a ImageRequest,
    ) -> BoxFuture<'a, Result<ImageRef, PullError>> {
        Box::pin(async move {
            check_image_name(&req.image).map_err(|message| PullError::InvalidImageName {
                image: req.image.clone(),
                message: message.to_string(),
            })?;
            // Every image is "present": built-in ones are served by the agent, others run
            // their command with the host's tools.
            Ok(ImageRef {
                image: req.image.clone(),
                id: format!("ferry-process://{}", images::short_name(&req.image)),
            })
        })
    }

    fn create_container<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        spec: &'a ContainerSpec,
    ) -> BoxFuture<'a, Result<ContainerId, RuntimeError>> {
        Box::pin(async move {
            let rec = self.record(&sandbox.id)?;
            // In its own network namespace a built-in server listens on every address of the
            // pod (both families); otherwise on the pod's (or node's) first address.
            let bind_ip = if !rec.enter.is_empty() && !rec.sandbox.host_network {
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            } else if rec.sandbox.host_network {
                self.cfg
                    .node_ips
                    .first()
                    .copied()
                    .unwrap_or(IpAddr::from([127, 0, 0, 1]))
            } else {
                rec.sandbox
                    .ips
                    .first()
                    .copied()
                    .unwrap_or(IpAddr::from([127, 0, 0, 1]))
            };
            let argv = match images::launch(
                &spec.image,
                &spec.command,
                &spec.args,
                bind_ip,
                &rec.hostname,
            )
            .map_err(|(_, m)| RuntimeError::CreateContainer(m))?
            {
                Launch::Builtin(a) => {
                    let mut v = self.cfg.builtin.clone();
                    v.extend(a);
                    v
                }
                Launch::Command(v) => v,
            };
            let argv = if self.cfg.isolate {
                spawn::isolated_argv(
                    &rec.enter,
                    &mounts::Plan {
                        resolv_conf: rec.resolv_conf.clone(),
                        hosts_file: rec.hosts_file.clone(),
                        hostname: rec.hostname.clone(),
                        mounts: spec.mounts.clone(),
                        scratch: rec.sandbox.log_directory.join("rootfs"),
                    },
                    &argv,
                )
            } else {
                let mut v = rec.enter.clone();
                v.extend(argv);
                v
            };
            let n = self.next.fetch_add(1, Ordering::SeqCst);
            let id = ContainerId(format!("{}-{}-{}-{n}", sandbox.id, spec.name, spec.attempt));
            let (exited, _) = watch::channel(None);
            let proc = Arc::new(Proc {
                sandbox: sandbox.id.clone(),
                spec: spec.clone(),
                argv,
                pid: Mutex::new(None),
                started: Default::default(),
                io: Mutex::new(None),
                exited,
            });
            if let Ok(mut m) = self.containers.lock() {
                m.insert(id.clone(), proc);
            }
            Ok(id)
        })
    }

    fn start_container<'a>(
        &'a self,
        id: &'a ContainerId,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let p = self.proc(id)?;
            let rec = self.record(&p.sandbox)?;
            if p.started.swap(true, Ordering::SeqCst) {
                return Err(RuntimeError::StartContainer {
                    name: p.spec.name.clone(),
                    message: "already started".into(),
                });
            }
            if let Some(dir) = p.spec.log_path.parent() {
                tokio::fs::create_dir_all(dir).await?;
            }
            let (mut child, io) = spawn::spawn(&p.argv, &p.spec).map_err(|e| {
                let _ = p.exited.send_replace(Some(Exited {
                    exit_code: 128,
                    signal: None,
                    oom_killed: false,
                    finished_at: jiff::Timestamp::now(),
                }));
                RuntimeError::StartContainer {
                    name: p.spec.name.clone(),
                    message: e.to_string(),
                }
            })?;
            let pid = child.id();
            // Remember the process group, so that an agent restarted after a crash can stop
            // what the previous one left running (see `reap_stale`).
            if let Some(pid) = pid
                && let Some(start) = spawn::process_start_time(pid)
            {
                let _ = std::fs::write(
                    rec.sandbox.log_directory.join(format!("proc-{pid}")),
                    start.to_string(),
                );
            }
            if let Ok(mut g) = p.pid.lock() {
                *g = pid;
            }
            if let Ok(mut g) = p.io.lock() {
                *g = Some(io);
            }
            let p2 = p.clone();
            let marker = pid.map(|pid| rec.sandbox.log_directory.join(format!("proc-{pid}")));
            tokio::spawn(async move {
                let (exit_code, signal) = spawn::exit_of(child.wait().await);
                if let Some(m) = marker {
                    let _ = std::fs::remove_file(m);
                }
                let _ = p2.exited.send_replace(Some(Exited {
                    exit_code,
                    signal,
                    oom_killed: false,
                    finished_at: jiff::Timestamp::now(),
                }));
            });
            Ok(())
        })
    }

    fn wait_container<'a>(
        &'a self,
        id: &'a ContainerId,
    ) -> BoxFuture<'a, Result<Exited, RuntimeError>> {
        Box::pin(async move {
            let p = self.proc(id)?;
            let mut rx = p.exited.subscribe();
            let e = rx
                .wait_for(|e| e.is_some())
                .await
                .map_err(|_| RuntimeError::ContainerNotFound(id.0.clone()))?;
            e.clone()
                .ok_or_else(|| RuntimeError::ContainerNotFound(id.0.clone()))
        })
    }

    fn stop_container<'a>(
        &'a self,
        id: &'a ContainerId,
        grace: Duration,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let p = self.proc(id)?;
            if !p.started.load(Ordering::SeqCst) || p.exited.borrow().is_some() {
                return Ok(());
            }
            let Some(pid) = p.pid.lock().ok().and_then(|g| *g) else {
                return Ok(());
            };
            let mut rx = p.exited.subscribe();
            signal_group(
                pid,
                if grace.is_zero() {
                    Signal::KILL
                } else {
                    Signal::TERM
                },
            );
            let in_time = tokio::time::timeout(
                grace.max(Duration::from_millis(1)),
                rx.wait_for(|e| e.is_some()),
            )
            .await
            .is_ok();
            if !in_time && p.exited.borrow().is_none() {
                signal_group(pid, Signal::KILL);
                let _ = rx.wait_for(|e| e.is_some()).await;
            }
            Ok(())
        })
    }

    fn remove_container<'a>(
        &'a self,
        id: &'a ContainerId,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.stop_container(id, Duration::ZERO).await?;
            if let Ok(mut m) = self.containers.lock() {
                m.remove(id);
            }
            Ok(())
        })
    }

    fn container_status<'a>(
        &'a self,
        id: &'a ContainerId,
    ) -> BoxFuture<'a, Result<ContainerState, RuntimeError>> {
        Box::pin(async move {
            let p = self.proc(id)?;
            if let Some(e) = p.exited.borrow().clone() {
                return Ok(ContainerState::Exited(e));
            }
            if !p.started.load(Ordering::SeqCst) {
                return Ok(ContainerState::Created);
            }
            Ok(ContainerState::Running {
                pid: p.pid.lock().ok().and_then(|g| *g),
            })
        })
    }

    fn exec_sync<'a>(
        &'a self,
        id: &'a ContainerId,
        cmd: &'a [String],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<ExecOutput, RuntimeError>> {
        Box::pin(async move {
            let mut c = self.command_in(id, cmd, None, None)?;
            c.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true);
            match tokio::time::timeout(timeout, c.output()).await {
                Err(_) => Err(RuntimeError::ExecTimeout(timeout)),
                Ok(Err(e)) => Err(RuntimeError::Exec(e.to_string())),
                Ok(Ok(o)) => Ok(ExecOutput {
                    exit_code: spawn::exit_of(Ok(o.status)).0,
                    stdout: o.stdout,
                    stderr: o.stderr,
                }),
            }
        })
    }

    fn exec<'a>(
        &'a self,
        id: &'a ContainerId,
        req: ExecRequest,
    ) -> BoxFuture<'a, Result<StreamSession, RuntimeError>> {
        Box::pin(async move {
            let cmd = if req.tty {
                crate::pty::with_controlling_tty(&req.cmd)
            } else {
                req.cmd.clone()
            };
            let env = (!req.env.is_empty()).then_some(req.env.as_slice());
            Ok(StreamSession::Command(self.command_in(
                id,
                &cmd,
                env,
                req.working_dir.as_deref(),
            )?))
        })
    }

    fn attach<'a>(
        &'a self,
        id: &'a ContainerId,
        _req: AttachRequest,
    ) -> BoxFuture<'a, Result<StreamSession, RuntimeError>> {
        Box::pin(async move {
            let p = self.proc(id)?;
            let io = p.io.lock().ok().and_then(|g| g.clone());
            io.map(StreamSession::Io)
                .ok_or_else(|| RuntimeError::NotRunning(id.0.clone()))
        })
    }

    fn port_forward<'a>(
        &'a self,
        sandbox: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, Result<DuplexStream, RuntimeError>> {
        Box::pin(async move {
            use crate::streaming::Target;
            let ip = sandbox.ips.first().copied();
            let target = match (&sandbox.netns, ip) {
                (Some(ns), ip) => Target::Netns(ns.clone(), ip),
                (None, Some(ip)) => Target::Addr(ip),
                (None, None) => Target::Addr(
                    self.cfg
                        .node_ips
                        .first()
                        .copied()
                        .unwrap_or(IpAddr::from([127, 0, 0, 1])),
                ),
            };
            let s = crate::streaming::connect(&target, port).await?;
            Ok(Box::new(s) as DuplexStream)
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<ContainerStats>, RuntimeError>> {
        Box::pin(async move {
            let procs: Vec<(ContainerId, Arc<Proc>)> = self
                .containers
                .lock()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            let mut out = Vec::new();
            for (id, p) in procs {
                if p.exited.borrow().is_some() {
                    continue;
                }
                let Some(pid) = p.pid.lock().ok().and_then(|g| *g) else {
                    continue;
                };
                if let Some((cpu, mem)) = spawn::usage(pid) {
                    out.push(ContainerStats {
                        id,
                        sandbox: p.sandbox.clone(),
                        name: p.spec.name.clone(),
                        cpu_usage_nanos: cpu,
                        memory_working_set_bytes: mem,
                    });
                }
            }
            Ok(out)
        })
    }

    fn list_sandboxes(&self) -> BoxFuture<'_, Result<Vec<Sandbox>, RuntimeError>> {
        Box::pin(async move {
            let mut known: HashMap<SandboxId, Sandbox> = self
                .sandboxes
                .lock()
                .map(|m| {
                    m.values()
                        .map(|r| (r.sandbox.id.clone(), r.sandbox.clone()))
                        .collect()
                })
                .unwrap_or_default();
            for r in read_records(&self.cfg.sandbox_root) {
                known.entry(r.sandbox.id.clone()).or_insert(r.sandbox);
            }
            let mut v: Vec<Sandbox> = known.into_values().collect();
            v.sort_by(|a, b| a.id.cmp(&b.id));
            Ok(v)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::conformance::{self, Fixture};

    #[test]
    fn image_names() {
        for ok in [
            "busybox",
            "nginx:1.25",
            "registry.k8s.io/serve_hostname:1.1",
            "localhost:5000/a/b@sha256:abc",
        ] {
            assert_eq!(check_image_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "Busybox", "nginx latest", "a/B:1"] {
            assert!(check_image_name(bad).is_err(), "{bad:?}");
        }
    }

    fn fixture(isolate: bool, cidr: &str) -> (Fixture, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("pods");
        std::fs::create_dir_all(&root).expect("pods dir");
        let network: Arc<dyn PodNetwork> =
            Arc::new(crate::network::Loopback::new(cidr.parse().expect("cidr")).expect("loopback"));
        let sandbox_root = root.clone();
        let make = move || {
            Arc::new(ProcessRuntime::new(ProcessConfig {
                network: network.clone(),
                node_ips: vec![IpAddr::from([127, 0, 0, 1])],
                node_netns: None,
                isolate,
                builtin: Vec::new(),
                sandbox_root: sandbox_root.clone(),
            })) as Arc<dyn PodRuntime>
        };
        (
            Fixture {
                make: Box::new(make),
                dir: root,
                image: "busybox".into(),
            },
            dir,
        )
    }

    /// Isolation needs root, `unshare` and `nsenter`.
    fn can_isolate() -> bool {
        if !crate::is_root() {
            eprintln!("skipped: isolation needs root");
            return false;
        }
        true
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn process_runtime_conformance() {
        let (f, _dir) = fixture(false, "127.71.0.0/16");
        conformance::run_all(&f).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn isolated_process_runtime_conformance() {
        if !can_isolate() {
            return;
        }
        let (f, _dir) = fixture(true, "127.72.0.0/16");
        conformance::run_all(&f).await;
    }

    /// A volume whose mountPath does not exist on the host is mounted in the container's
    /// namespace, and nothing appears on the host's file system (issue 27): right below `/`
    /// (a new root), below an existing directory (a covered `/etc`), read-only included; exec
    /// sees the same view.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_mount_points_stay_off_the_host() {
        if !can_isolate() {
            return;
        }
        let (f, _dir) = fixture(true, "127.73.0.0/16");
        let rt = (f.make)();
        let tag = format!("ferry-mp-test-{}", std::process::id());
        let top = format!("/{tag}");
        let etc = format!("/etc/{tag}");
        assert!(
            !Path::new(&top).exists() && !Path::new(&etc).exists(),
            "left over from an earlier run"
        );
        let log_directory = f.dir.join(format!("t_mounts_{tag}"));
        let vol = log_directory.join("volumes").join("secret");
        std::fs::create_dir_all(&vol).expect("volume dir");
        std::fs::write(vol.join("key"), "s3cret").expect("volume file");
        let resolv = log_directory.join("resolv.conf");
        let hosts = log_directory.join("hosts");
        std::fs::write(&resolv, "nameserver 127.0.0.53\n").expect("resolv");
        std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("hosts");
        let sb = rt
            .run_sandbox(&SandboxSpec {
                uid: tag.clone(),
                namespace: "t".into(),
                name: "mounts".into(),
                hostname: "mounts".into(),
                resolv_conf: resolv,
                hosts_file: hosts,
                log_directory: log_directory.clone(),
                ..Default::default()
            })
            .await
            .expect("sandbox");
        let mounts = vec![
            Mount {
                host_path: vol.clone(),
                container_path: format!("{top}/deep/dir"),
                read_only: false,
            },
            Mount {
                host_path: vol.clone(),
                container_path: format!("{etc}/ssl"),
                read_only: true,
            },
        ];
        let script = format!(
            "cat {top}/deep/dir/key {etc}/ssl/key && echo && \
             if touch {etc}/ssl/new 2>/dev/null; then echo writable; exit 3; fi && \
             grep -q 127.0.0.53 /etc/resolv.conf && test -e /etc/passwd && test -d /proc/self && \
             echo ready && exec sleep 600"
        );
        let spec = ContainerSpec {
            name: "c".into(),
            image: "busybox".into(),
            command: vec!["sh".into(), "-c".into(), script],
            env: vec![(
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            )],
            mounts,
            log_path: log_directory.join("logs").join("c").join("0.log"),
            ..Default::default()
        };
        let id = rt.create_container(&sb, &spec).await.expect("create");
        rt.start_container(&id).await.expect("start");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read_to_string(&spec.log_path).unwrap_or_default();
            if log.contains("ready") {
                assert!(log.contains("s3crets3cret"), "{log}");
                break;
            }
            if let Ok(ContainerState::Exited(e)) = rt.container_status(&id).await {
                panic!("container exited {e:?}: {log}");
            }
            assert!(std::time::Instant::now() < deadline, "never ready: {log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cat: Vec<String> = vec!["cat".into(), format!("{top}/deep/dir/key")];
        let o = rt
            .exec_sync(&id, &cat, Duration::from_secs(60))
            .await
            .expect("exec");
        assert_eq!((o.exit_code, o.stdout.as_slice()), (0, &b"s3cret"[..]));
        let top_seen = Path::new(&top).exists();
        let etc_seen = Path::new(&etc).exists();
        rt.stop_container(&id, Duration::ZERO).await.expect("stop");
        rt.remove_container(&id).await.expect("remove");
        rt.stop_sandbox(&sb.id).await.expect("stop sandbox");
        rt.remove_sandbox(&sb.id).await.expect("remove sandbox");
        // Clean up before asserting, should the host have been written to.
        let _ = std::fs::remove_dir_all(&top);
        let _ = std::fs::remove_dir_all(&etc);
        assert!(!top_seen, "{top} was made on the host");
        assert!(!etc_seen, "{etc} was made on the host");
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        assert!(
            !mounts.contains(&tag),
            "a mount leaked to the host's namespace: {mounts}"
        );
    }
}
