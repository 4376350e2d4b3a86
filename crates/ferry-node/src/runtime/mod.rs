//! Running pods as processes: one worker per pod (status owner), one task per container
//! (start, wait, probe, restart with back-off, graceful stop).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Event, Pod, Probe, Secret, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::dns::{self, ClusterDns};
use crate::envvars::{self, EnvSource, PodFacts};
use crate::images::{self, Launch};
use crate::network::PodNetwork;
use crate::podstate::{self, Backoff, ProbeResult, ProbeTracker, State, Terminated};

/// Node-wide runtime configuration.
pub struct Runtime {
    pub client: kube::Client,
    pub node_name: String,
    pub node_ips: Vec<IpAddr>,
    pub network: Arc<dyn PodNetwork>,
    pub cluster_dns: ClusterDns,
    pub state_dir: PathBuf,
    /// Give each pod its own mount + UTS namespace (root and `unshare` available).
    pub isolate: bool,
    /// The node's network namespace (netns mode under `ferry up`): where hostNetwork pods run
    /// and probes connect from. `None`: the agent's own.
    pub node_netns: Option<PathBuf>,
    /// argv prefix of the built-in image program.
    pub builtin: Vec<String>,
    pub backoff: Backoff,
    pub pods: Mutex<HashMap<String, PodHandle>>,
    /// Set on agent shutdown: processes stop but pod objects stay (as when kubelet stops).
    pub shutting_down: std::sync::atomic::AtomicBool,
}

/// What the agent's HTTP endpoint needs about a running container.
#[derive(Debug, Clone, Default)]
pub struct ContainerInfo {
    pub pid: Option<u32>,
    pub log_dir: PathBuf,
    pub restart_count: i32,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    /// Its stdout/stderr (stored in the CRI log format) and stdin, for logs and attach.
    pub io: Option<Arc<crate::logs::ContainerIo>>,
}

pub struct PodShared {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub isolated: bool,
    /// The pod's processes run in a network namespace other than the agent's.
    pub netns: std::sync::atomic::AtomicBool,
    pub containers: Mutex<BTreeMap<String, ContainerInfo>>,
}

pub struct PodHandle {
    pub tx: watch::Sender<Pod>,
    pub shared: Arc<PodShared>,
    pub gone: CancellationToken,
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl Runtime {
    /// Routes a Pod seen on the watch to its worker, starting one for a new uid.
    pub fn apply(self: &Arc<Self>, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let Ok(mut pods) = self.pods.lock() else {
            return;
        };
        if let Some(h) = pods.get(&uid) {
            let _ = h.tx.send(pod);
            return;
        }
        let terminal = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if terminal && !deleting {
            // Finished before this agent started: nothing to run.
            return;
        }
        let shared = Arc::new(PodShared {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.clone(),
            isolated: self.isolate,
            netns: Default::default(),
            containers: Mutex::new(BTreeMap::new()),
        });
        let (tx, rx) = watch::channel(pod);
        let gone = CancellationToken::new();
        pods.insert(
            uid.clone(),
            PodHandle {
                tx,
                shared: shared.clone(),
                gone: gone.clone(),
            },
        );
        let rt = self.clone();
        tokio::spawn(async move {
            if let Err(e) = pod_worker(rt.clone(), rx, shared, gone).await {
                tracing::warn!("pod worker {uid}: {e:#}");
            }
            if let Ok(mut pods) = rt.pods.lock() {
                pods.remove(&uid);
            }
        });
    }

    /// The pod disappeared from the API (force-deleted): stop at once.
    pub fn gone(&self, uid: &str) {
        if let Ok(pods) = self.pods.lock()
            && let Some(h) = pods.get(uid)
        {
            h.gone.cancel();
        }
    }

    /// A pod missing from a re-list is gone only if the API server confirms it: a list may be
    /// served from a cache that has not seen a new pod yet, and a cache miss must never stop
    /// (or delete) a pod.
    pub async fn confirm_gone(&self, uid: &str) {
        let who = self.pods.lock().ok().and_then(|p| {
            p.get(uid)
                .map(|h| (h.shared.namespace.clone(), h.shared.name.clone()))
        });
        let Some((ns, name)) = who else { return };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api.get_opt(&name).await {
            Ok(Some(p)) if p.metadata.uid.as_deref() == Some(uid) => {}
            Ok(_) => self.gone(uid),
            // Unknown: keep the pod; the next re-list decides.
            Err(e) => crate::node::log_api_error(&format!("checking pod {ns}/{name}"), &e),
        }
    }

    pub fn find(&self, ns: &str, name: &str) -> Option<Arc<PodShared>> {
        let pods = self.pods.lock().ok()?;
        pods.values()
            .find(|h| h.shared.namespace == ns && h.shared.name == name)
            .map(|h| h.shared.clone())
    }

    /// Stops every pod's processes (agent shutdown): SIGKILL without touching the API.
    pub fn kill_all(&self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(pods) = self.pods.lock() {
            for h in pods.values() {
                if let Ok(c) = h.shared.containers.lock() {
                    for info in c.values() {
                        if let Some(pid) = info.pid {
                            signal_group(pid, "KILL");
                        }
                    }
                }
                h.gone.cancel();
            }
        }
    }

    pub async fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ts = now();
        let ev: Result<Event, _> = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}.{:x}", rand_suffix()), "namespace": ns},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": ns, "name": name,
                "uid": pod.metadata.uid},
            "reason": reason, "message": message, "type": type_,
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet", "reportingInstance": self.node_name,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        }));
        if let Ok(ev) = ev {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                crate::node::log_api_error(&format!("event {reason} for {ns}/{name}"), &e);
            }
        }
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Sends a signal to a process group with `kill(1)` (no unsafe code in Ferry).
pub fn signal_group(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Messages from container tasks to their pod worker.
#[derive(Debug)]
enum Update {
    State {
        name: String,
        state: State,
        restart_count: i32,
    },
    Ready {
        name: String,
        ready: bool,
    },
    Started {
        name: String,
        started: bool,
    },
}

struct ApiSource {
    cms: HashMap<String, Option<BTreeMap<String, String>>>,
    secrets: HashMap<String, Option<BTreeMap<String, String>>>,
}

impl EnvSource for ApiSource {
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.cms.get(name).cloned().flatten()
    }
    fn secret(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.secrets.get(name).cloned().flatten()
    }
}

/// Fetches the ConfigMaps and Secrets a container's environment refers to.
async fn env_source(client: &kube::Client, ns: &str, c: &Container) -> ApiSource {
    let mut cm_names = Vec::new();
    let mut secret_names = Vec::new();
    for e in c.env.clone().unwrap_or_default() {
        if let Some(f) = e.value_from {
            if let Some(r) = f.config_map_key_ref {
                cm_names.push(r.name);
            }
            if let Some(r) = f.secret_key_ref {
                secret_names.push(r.name);
            }
        }
    }
    for ef in c.env_from.clone().unwrap_or_default() {
        if let Some(r) = ef.config_map_ref {
            cm_names.push(r.name);
        }
        if let Some(r) = ef.secret_ref {
            secret_names.push(r.name);
        }
    }
    let mut src = ApiSource {
        cms: HashMap::new(),
        secrets: HashMap::new(),
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for n in cm_names {
        let v = cms.get_opt(&n).await.ok().flatten().map(|cm| {
            let mut d = cm.data.unwrap_or_default();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                d.insert(k, String::from_utf8_lossy(&v.0).into_owned());
            }
            d
        });
        src.cms.insert(n, v);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for n in secret_names {
        let v = secrets.get_opt(&n).await.ok().flatten().map(|s| {
            let mut d: BTreeMap<String, String> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            for (k, v) in s.string_data.unwrap_or_default() {
                d.insert(k, v);
            }
            d
        });
        src.secrets.insert(n, v);
    }
    src
}

async fn service_vars(client: &kube::Client, pod: &Pod) -> Vec<(String, String)> {
    let api: Api<Service> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(l) => envvars::service_env(pod, &l.items),
        Err(e) => {
            crate::node::log_api_error("listing services for env vars", &e);
            Vec::new()
        }
    }
}

/// Per-pod files: resolv.conf, hosts, hostname, and container logs.
struct PodDirs {
    root: PathBuf,
}

impl PodDirs {
    fn resolv(&self) -> PathBuf {
        self.root.join("resolv.conf")
    }
    fn hosts(&self) -> PathBuf {
        self.root.join("hosts")
    }
    fn volume(&self, name: &str) -> PathBuf {
        self.root.join("volumes").join(name)
    }
    fn logs(&self, container: &str) -> PathBuf {
        self.root.join("logs").join(container)
    }
}

#[derive(Clone)]
struct Ctx {
    rt: Arc<Runtime>,
    pod: Pod,
    ip: IpAddr,
    pod_ips: Vec<String>,
    /// Command prefix entering the pod's network namespace (empty: the agent's).
    enter: Vec<String>,
    hostname: String,
    dirs: Arc<PodDirs>,
    shared: Arc<PodShared>,
    updates: mpsc::UnboundedSender<Update>,
}

async fn pod_worker(
    rt: Arc<Runtime>,
    mut rx: watch::Receiver<Pod>,
    shared: Arc<PodShared>,
    gone: CancellationToken,
) -> anyhow::Result<()> {
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
            status.push(&pods, &name, false, false).await;
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
    let (addrs, enter) = if host_network {
        // The node's network: its addresses, and (netns mode) its namespace.
        let enter = match &rt.node_netns {
            Some(p) => vec![
                "nsenter".to_string(),
                format!("--net={}", p.display()),
                "--".to_string(),
            ],
            None => Vec::new(),
        };
        (
            crate::network::PodAddresses {
                ips: rt.node_ips.clone(),
            },
            enter,
        )
    } else {
        let podref = crate::network::PodRef {
            uid: uid.clone(),
            namespace: ns.clone(),
            name: name.clone(),
            port_mappings: port_mappings(&spec),
        };
        let mut attempt: u32 = 0;
        let addrs = loop {
            let net = rt.network.clone();
            let pr = podref.clone();
            let r = tokio::task::spawn_blocking(move || net.setup(&pr, wanted))
                .await
                .unwrap_or_else(|e| Err(format!("network set-up task: {e}")));
            match r {
                Ok(a) => break a,
                Err(e) => {
                    // As kubelet: the sandbox is retried with back-off, each failure an Event;
                    // the pod stays Pending (ContainerCreating) meanwhile.
                    rt.event(
                        &pod,
                        "Warning",
                        "FailedCreatePodSandBox",
                        &format!("Failed to create pod sandbox: {e}"),
                    )
                    .await;
                    if attempt == 0 {
                        status.push(&pods, &name, false, false).await;
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
        let enter = rt.network.enter_prefix(&uid);
        (addrs, enter)
    };
    shared
        .netns
        .store(!enter.is_empty(), std::sync::atomic::Ordering::SeqCst);
    let ip = addrs
        .ips
        .first()
        .copied()
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    status.pod_ips = addrs.ips.iter().map(|i| i.to_string()).collect();
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
                    rt.event(&pod, "Warning", "FailedMount", &msg).await;
                    if attempt == 0 {
                        status.push(&pods, &name, false, false).await;
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
        enter,
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
    status.push(&pods, &name, false, false).await;

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
        status.push(&pods, &name, false, false).await;
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
            status.push(&pods, &name, false, false).await;
        }
        if code != Some(0) {
            init_ok = false;
            break;
        }
    }
    if !init_ok {
        if policy == "Never" || stop.is_cancelled() || gone.is_cancelled() {
            status.init_failed = true;
            status.push(&pods, &name, false, false).await;
            wait_deletion(&mut rx, &gone).await;
            finish(&rt, &pods, &name, &uid, &dirs).await;
            return Ok(());
        }
        // Simplification: a failed init container under Always/OnFailure is not retried.
        status.init_failed = true;
        status.push(&pods, &name, false, false).await;
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
            status.push(&pods, &name, terminating, false).await;
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
                    status.push(&pods, &name, terminating, false).await;
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
        status.push(&pods, &name, true, true).await;
    }
    finish(&rt, &pods, &name, &uid, &dirs).await;
    Ok(())
}

fn start_stop(
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

async fn wait_deletion(rx: &mut watch::Receiver<Pod>, gone: &CancellationToken) {
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
async fn finish(rt: &Arc<Runtime>, pods: &Api<Pod>, name: &str, uid: &str, dirs: &PodDirs) {
    let teardown = |rt: &Arc<Runtime>| {
        let net = rt.network.clone();
        let uid = uid.to_string();
        tokio::task::spawn_blocking(move || net.teardown(&uid))
    };
    if rt.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = teardown(rt).await;
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
    let _ = teardown(rt).await;
    let _ = tokio::fs::remove_dir_all(&dirs.root).await;
}

/// The pod status this agent maintains.
struct StatusBook {
    host_ips: Vec<String>,
    pod_ips: Vec<String>,
    start_time: String,
    sandbox_ready: bool,
    init_done: bool,
    init_failed: bool,
    policy: String,
    containers: Vec<podstate::Container>,
    init_containers: Vec<podstate::Container>,
    transitions: HashMap<&'static str, (bool, String)>,
    scheduled: Option<Value>,
    last_sent: Option<Value>,
}

impl StatusBook {
    fn new(pod: &Pod, node_ips: &[IpAddr]) -> StatusBook {
        let spec = pod.spec.clone().unwrap_or_default();
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| serde_json::to_value(c).ok());
        StatusBook {
            host_ips: node_ips.iter().map(|i| i.to_string()).collect(),
            pod_ips: Vec::new(),
            start_time: pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(now),
            sandbox_ready: false,
            init_done: spec.init_containers.as_ref().is_none_or(|v| v.is_empty()),
            init_failed: false,
            policy: spec
                .restart_policy
                .clone()
                .unwrap_or_else(|| "Always".into()),
            init_containers: spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| podstate::Container {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: State::Waiting {
                        reason: "PodInitializing".into(),
                        message: None,
                    },
                    last: None,
                    restart_count: 0,
                    ready: false,
                    started: false,
                })
                .collect(),
            containers: spec
                .containers
                .iter()
                .map(|c| podstate::Container {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: State::Waiting {
                        reason: "ContainerCreating".into(),
                        message: None,
                    },
                    last: None,
                    restart_count: 0,
                    ready: false,
                    started: false,
                })
                .collect(),
            transitions: HashMap::new(),
            scheduled,
            last_sent: None,
        }
    }

    fn set_init(&mut self, name: &str, state: State) {
        if let Some(c) = self.init_containers.iter_mut().find(|c| c.name == name) {
            c.ready = matches!(&state, State::Terminated(t) if t.exit_code == 0);
            c.started = matches!(state, State::Running { .. });
            c.state = state;
        }
    }

    fn set_state(&mut self, name: &str, state: State, restart_count: i32) {
        if let Some(c) = self.containers.iter_mut().find(|c| c.name == name) {
            if let State::Terminated(t) = &c.state
                && !matches!(state, State::Terminated(_))
            {
                c.last = Some(t.clone());
            }
            if !matches!(state, State::Running { .. }) {
                c.ready = false;
                c.started = false;
            }
            c.state = state;
            c.restart_count = restart_count;
        }
    }

    fn apply(&mut self, u: Update) {
        match u {
            Update::State {
                name,
                state,
                restart_count,
            } => self.set_state(&name, state, restart_count),
            Update::Ready { name, ready } => {
                if let Some(c) = self.containers.iter_mut().find(|c| c.name == name) {
                    c.ready = ready && matches!(c.state, State::Running { .. });
                }
            }
            Update::Started { name, started } => {
                if let Some(c) = self.containers.iter_mut().find(|c| c.name == name) {
                    c.started = started;
                }
            }
        }
    }

    fn render(&mut self, terminating: bool, final_: bool) -> Value {
        let phase = if self.init_failed {
            if self.policy == "Never" {
                "Failed"
            } else {
                "Pending"
            }
        } else if final_ {
            // Containers stopped because of the deletion: kubelet reports the terminal phase
            // from the exit codes (Succeeded only if all exited 0).
            let all_ok = self
                .containers
                .iter()
                .all(|c| matches!(&c.state, State::Terminated(t) if t.exit_code == 0));
            let p = podstate::phase(&self.containers, &self.policy, self.init_done);
            if p == "Running" || p == "Pending" {
                if all_ok { "Succeeded" } else { "Failed" }
            } else {
                p
            }
        } else {
            podstate::phase(&self.containers, &self.policy, self.init_done)
        };
        let conds = podstate::conditions(
            &self.containers,
            phase,
            self.sandbox_ready,
            self.init_done,
            terminating,
        );
        let ts = now();
        let mut conditions: Vec<Value> = Vec::new();
        for c in conds {
            let entry = self
                .transitions
                .entry(c.type_)
                .or_insert_with(|| (c.status, ts.clone()));
            if entry.0 != c.status {
                *entry = (c.status, ts.clone());
            }
            let mut v = json!({
                "type": c.type_,
                "status": if c.status { "True" } else { "False" },
                "lastProbeTime": null,
                "lastTransitionTime": entry.1,
            });
            if let Some(r) = c.reason {
                v["reason"] = json!(r);
            }
            if let Some(m) = c.message {
                v["message"] = json!(m);
            }
            conditions.push(v);
        }
        if let Some(s) = &self.scheduled {
            conditions.push(s.clone());
        }
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                let mut v = json!({
                    "name": c.name,
                    "image": c.image,
                    "imageID": format!("ferry://{}", c.image),
                    "ready": c.ready,
                    "started": c.started,
                    "restartCount": c.restart_count,
                    "state": state_json(&c.state),
                    "lastState": c.last.as_ref().map(|t| json!({"terminated": term_json(t)})).unwrap_or(json!({})),
                });
                if !matches!(c.state, State::Waiting { .. }) {
                    v["containerID"] = json!(format!("ferry://{}-{}", c.name, c.restart_count));
                }
                v
            })
            .collect();
        let mut status = json!({
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.host_ips.first(),
            "hostIPs": self.host_ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>(),
            "startTime": self.start_time,
            "containerStatuses": statuses,
        });
        if !self.init_containers.is_empty() {
            status["initContainerStatuses"] = json!(
                self.init_containers
                    .iter()
                    .map(|c| {
                        let mut v = json!({
                            "name": c.name,
                            "image": c.image,
                            "imageID": format!("ferry://{}", c.image),
                            "ready": c.ready,
                            "started": c.started,
                            "restartCount": c.restart_count,
                            "state": state_json(&c.state),
                            "lastState": {},
                        });
                        if !matches!(c.state, State::Waiting { .. }) {
                            v["containerID"] = json!(format!("ferry://{}-0", c.name));
                        }
                        v
                    })
                    .collect::<Vec<_>>()
            );
        }
        if !self.pod_ips.is_empty() {
            status["podIP"] = json!(self.pod_ips[0]);
            status["podIPs"] = json!(
                self.pod_ips
                    .iter()
                    .map(|i| json!({"ip": i}))
                    .collect::<Vec<_>>()
            );
        }
        status
    }

    async fn push(&mut self, pods: &Api<Pod>, name: &str, terminating: bool, final_: bool) {
        let status = self.render(terminating, final_);
        if self.last_sent.as_ref() == Some(&status) {
            return;
        }
        let body = json!({"status": status});
        match pods
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => self.last_sent = Some(status),
            Err(e) => crate::node::log_api_error(&format!("status of {name}"), &e),
        }
    }
}

fn term_json(t: &Terminated) -> Value {
    let mut v = json!({
        "exitCode": t.exit_code,
        "reason": t.reason,
        "finishedAt": t.finished_at,
        "containerID": "ferry://",
    });
    if let Some(s) = &t.started_at {
        v["startedAt"] = json!(s);
    }
    if let Some(s) = t.signal {
        v["signal"] = json!(s);
    }
    if let Some(m) = &t.message {
        v["message"] = json!(m);
    }
    v
}

fn state_json(s: &State) -> Value {
    match s {
        State::Waiting { reason, message } => {
            let mut w = json!({"reason": reason});
            if let Some(m) = message {
                w["message"] = json!(m);
            }
            json!({"waiting": w})
        }
        State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
        State::Terminated(t) => json!({"terminated": term_json(t)}),
    }
}

/// Everything needed to start a container process.
struct Prepared {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    working_dir: Option<String>,
    /// Volume mounts: (source on the host, mountPath, read-only).
    mounts: Vec<(PathBuf, String, bool)>,
}

async fn prepare(ctx: &Ctx, c: &Container) -> Result<Prepared, (String, String)> {
    let ns = ctx.shared.namespace.as_str();
    let src = env_source(&ctx.rt.client, ns, c).await;
    let svc = service_vars(&ctx.rt.client, &ctx.pod).await;
    let facts = PodFacts {
        pod_ips: ctx.pod_ips.clone(),
        host_ips: ctx.rt.node_ips.iter().map(|i| i.to_string()).collect(),
    };
    let mut env = envvars::container_env(&ctx.pod, c, &facts, &svc, &src)
        .map_err(|m| ("CreateContainerConfigError".to_string(), m))?;
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
fn wrap(ctx: &Ctx, argv: &[String], mounts: &[(PathBuf, String, bool)]) -> Vec<String> {
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
fn spawn(
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
fn process_start_time(pid: u32) -> Option<u64> {
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
                signal_group(pid, "KILL");
                reaped += 1;
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    reaped
}

fn exit_of(st: std::io::Result<std::process::ExitStatus>) -> (i32, Option<i32>) {
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
async fn run_once(
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
                    if let Some(pid) = child.id() { signal_group(pid, "KILL"); }
                    stop.cancel();
                    let _ = child.wait().await;
                    return None;
                }
            }
            _ = gone.cancelled() => {
                if let Some(pid) = child.id() { signal_group(pid, "KILL"); }
                stop.cancel();
                let _ = child.wait().await;
                return None;
            }
        }
    }
}

enum Wake {
    Exited(i32, Option<i32>),
    Stop,
    LivenessFailed(String),
}

async fn container_task(
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
async fn back_off(
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
async fn terminate(child: &mut tokio::process::Child, grace: Duration) -> (i32, Option<i32>) {
    let Some(pid) = child.id() else {
        return exit_of(child.wait().await);
    };
    if grace.is_zero() {
        signal_group(pid, "KILL");
    } else {
        signal_group(pid, "TERM");
    }
    match tokio::time::timeout(grace.max(Duration::from_millis(1)), child.wait()).await {
        Ok(st) => exit_of(st),
        Err(_) => {
            signal_group(pid, "KILL");
            exit_of(child.wait().await)
        }
    }
}

/// Objects a pod's volumes read, fetched from the API.
struct VolumeObjects {
    cms: HashMap<String, BTreeMap<String, Vec<u8>>>,
    secrets: HashMap<String, BTreeMap<String, Vec<u8>>>,
    tokens: HashMap<(String, i64), Result<String, String>>,
}

impl crate::volumes::Lookup for VolumeObjects {
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        self.cms.get(name).cloned()
    }
    fn secret(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        self.secrets.get(name).cloned()
    }
    fn token(&self, audience: &str, exp: i64) -> Result<String, String> {
        self.tokens
            .get(&(audience.to_string(), exp))
            .cloned()
            .unwrap_or_else(|| Err("token not requested".into()))
    }
}

/// A bound ServiceAccount token through the TokenRequest API, as kubelet asks for projected
/// volumes (bound to the pod), with its expiry.
async fn request_token(
    client: &kube::Client,
    pod: &Pod,
    audience: &str,
    exp: i64,
) -> Result<crate::volumes::CachedToken, String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {
            "audiences": if audience.is_empty() { json!([]) } else { json!([audience]) },
            "expirationSeconds": exp,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                "name": pod.metadata.name, "uid": pod.metadata.uid},
        }
    });
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"
    ))
    .header("content-type", "application/json")
    .body(body.to_string().into_bytes())
    .map_err(|e| e.to_string())?;
    let v: Value = client
        .request(req)
        .await
        .map_err(|e| format!("failed to fetch token: {e}"))?;
    let token = v
        .pointer("/status/token")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "failed to fetch token: no token in the answer".to_string())?;
    let ttl = v
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(exp);
    let now = jiff::Timestamp::now().as_second();
    let expires_unix = v
        .pointer("/status/expirationTimestamp")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .unwrap_or(now + ttl);
    Ok(crate::volumes::CachedToken {
        token,
        expires_unix,
        ttl_seconds: ttl,
    })
}

/// Renders and writes every volume of the pod; the first failure, as kubelet words it.
async fn sync_volumes(
    rt: &Runtime,
    pod: &Pod,
    dirs: &PodDirs,
    tokens: &crate::volumes::TokenCache,
) -> Result<(), String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let refs = crate::volumes::references(pod);
    let mut objs = VolumeObjects {
        cms: HashMap::new(),
        secrets: HashMap::new(),
        tokens: HashMap::new(),
    };
    let cms: Api<ConfigMap> = Api::namespaced(rt.client.clone(), &ns);
    for n in &refs.config_maps {
        match cms.get_opt(n).await {
            Ok(Some(cm)) => {
                let mut d: BTreeMap<String, Vec<u8>> = cm
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect();
                for (k, v) in cm.binary_data.unwrap_or_default() {
                    d.insert(k, v.0);
                }
                objs.cms.insert(n.clone(), d);
            }
            Ok(None) => {}
            Err(e) => return Err(format!("fetching configmap {n:?}: {e}")),
        }
    }
    let secrets: Api<Secret> = Api::namespaced(rt.client.clone(), &ns);
    for n in &refs.secrets {
        match secrets.get_opt(n).await {
            Ok(Some(s)) => {
                let mut d: BTreeMap<String, Vec<u8>> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                for (k, v) in s.string_data.unwrap_or_default() {
                    d.insert(k, v.into_bytes());
                }
                objs.secrets.insert(n.clone(), d);
            }
            Ok(None) => {}
            Err(e) => return Err(format!("fetching secret {n:?}: {e}")),
        }
    }
    let now = jiff::Timestamp::now().as_second();
    for (aud, exp) in &refs.tokens {
        // A jitter in [0, maxJitter) so pods' refreshes spread out.
        let jitter = i64::from(jiff::Timestamp::now().subsec_nanosecond())
            % crate::volumes::MAX_TOKEN_JITTER_SECONDS;
        let t = match tokens.fresh(aud, *exp, now, jitter) {
            Some(t) => Ok(t),
            None => match request_token(&rt.client, pod, aud, *exp).await {
                Ok(t) => {
                    let token = t.token.clone();
                    tokens.put(aud, *exp, t);
                    Ok(token)
                }
                // A failed refresh keeps the previous token while it is still valid.
                Err(e) => match tokens.last(aud, *exp).filter(|t| t.expires_unix > now) {
                    Some(t) => {
                        tracing::warn!("refreshing a projected token: {e}");
                        Ok(t.token)
                    }
                    None => Err(e),
                },
            },
        };
        objs.tokens.insert((aud.clone(), *exp), t);
    }
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let dir = dirs.volume(&v.name);
        let fail = |e: String| format!("MountVolume.SetUp failed for volume \"{}\" : {e}", v.name);
        match crate::volumes::render(v, pod, &objs).map_err(fail)? {
            Some(files) => {
                crate::volumes::write_atomic(&dir, &files).map_err(|e| fail(e.to_string()))?;
            }
            None => {
                tokio::fs::create_dir_all(&dir)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
            }
        }
    }
    Ok(())
}

/// Connects for a probe from the node's network (as kubelet probes from the host).
async fn probe_connect(
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

/// The `hostPort` mappings of a pod's containers (CNI `portMappings`).
fn port_mappings(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<Value> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host = p.host_port.filter(|h| *h > 0)?;
            let mut m = json!({
                "hostPort": host,
                "containerPort": p.container_port,
                "protocol": p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
            });
            if let Some(ip) = p.host_ip.as_deref().filter(|i| !i.is_empty()) {
                m["hostIP"] = json!(ip);
            }
            Some(m)
        })
        .collect()
}

fn probe_params(p: &Probe) -> (Duration, Duration, Duration, i32, i32) {
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
async fn probe_loop(ctx: Ctx, c: Container, stop: CancellationToken, live: mpsc::Sender<String>) {
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

fn resolve_port(c: &Container, p: &IntOrString) -> Option<u16> {
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

async fn run_probe(
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
        let Ok(mut command) = exec_command(&ctx.shared, &info, &cmd) else {
            return fail("cannot build exec command".into());
        };
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        return match tokio::time::timeout(timeout, command.output()).await {
            Ok(Ok(o)) if o.status.success() => (ProbeResult::Success, String::new()),
            Ok(Ok(o)) => fail(format!(
                "command {cmd:?} exited with {}: {}",
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout)
            )),
            Ok(Err(e)) => fail(format!("exec: {e}")),
            Err(_) => fail(format!("command {cmd:?} timed out")),
        };
    }
    // gRPC probes are not implemented: reported as success.
    (ProbeResult::Success, String::new())
}

/// A command run "inside" a container: in its namespaces (nsenter) when isolated, with the
/// container's environment and working directory.
pub fn exec_command(
    shared: &PodShared,
    info: &ContainerInfo,
    cmd: &[String],
) -> Result<tokio::process::Command, String> {
    let (first, rest) = cmd.split_first().ok_or("no command given")?;
    let netns = shared.netns.load(std::sync::atomic::Ordering::SeqCst);
    let mut c = if shared.isolated || netns {
        let pid = info.pid.ok_or("container is not running")?;
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

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn init_container_statuses_are_reported() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"initContainers": [{"name": "wait", "image": "busybox"}],
                     "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod");
        let mut book = StatusBook::new(&pod, &[]);
        let s = book.render(false, false);
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["waiting"]["reason"],
            "PodInitializing"
        );
        book.set_init(
            "wait",
            State::Running {
                started_at: "t".into(),
            },
        );
        let s = book.render(false, false);
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["running"]["startedAt"],
            "t"
        );
        assert_eq!(s["phase"], "Pending");
    }
}
