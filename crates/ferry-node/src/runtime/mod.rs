//! Running pods as processes: one worker per pod (status owner), one task per container
//! (start, wait, probe, restart with back-off, graceful stop).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Probe, Secret, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::dns::{self, ClusterDns};
use crate::envvars::{self, EnvSource, PodFacts};
use crate::podstate::{self, Backoff, ProbeResult, ProbeTracker, State, Terminated};

pub mod conformance;
mod hooks;
pub mod process;
pub mod seam;
pub use process::reap_stale;
use seam::{ContainerId, PodRuntime, Sandbox};

mod env;
use env::*;
mod worker;
use worker::*;
mod status;
use status::*;
mod container;
pub use container::exec_command;
use container::*;
mod volume_sync;
use volume_sync::*;
mod probes;
use probes::*;

/// Node-wide runtime configuration.
pub struct Runtime {
    pub client: kube::Client,
    pub node_name: String,
    pub node_ips: Vec<IpAddr>,
    /// The container runtime under the seam: everything below is mechanics.
    pub pods_runtime: Arc<dyn PodRuntime>,
    pub cluster_dns: ClusterDns,
    pub state_dir: PathBuf,
    /// Pods run in their own mount + UTS namespace (the process runtime's isolation).
    pub isolate: bool,
    /// The node's network namespace (netns mode under `ferry up`): where probes and HTTP
    /// hooks connect from. `None`: the agent's own.
    pub node_netns: Option<PathBuf>,
    pub backoff: Backoff,
    pub pods: Mutex<HashMap<String, PodHandle>>,
    /// Set on agent shutdown: processes stop but pod objects stay (as when kubelet stops).
    pub shutting_down: std::sync::atomic::AtomicBool,
}

/// What the agent's HTTP endpoint needs about a running container.
#[derive(Debug, Clone, Default)]
pub struct ContainerInfo {
    /// The runtime's id of the container's current run.
    pub id: Option<ContainerId>,
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

    /// Stops every pod's containers (agent shutdown): killed at once (no preStop, no grace)
    /// without touching the API. Pods whose workers have not finished after `wait` have their
    /// sandboxes stopped directly (whatever still runs in them is killed).
    pub async fn kill_all(&self, wait: Duration) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(pods) = self.pods.lock() {
            for h in pods.values() {
                h.gone.cancel();
            }
        }
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if self.pods.lock().map(|m| m.is_empty()).unwrap_or(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left: Vec<String> = self
            .pods
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for uid in left {
            let _ = self.pods_runtime.stop_sandbox(&seam::SandboxId(uid)).await;
        }
    }

    pub async fn event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        use ferry_kubeclient::events::{Recorder, Source, reference};
        let source = Source::new("kubelet").on_host(self.node_name.clone());
        let recorder = Recorder::new(self.client.clone(), source);
        if let Err(e) = recorder
            .publish(reference(pod), type_, reason, message)
            .await
        {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            crate::node::log_api_error(&format!("event {reason} for {ns}/{name}"), &e);
        }
    }
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
    sandbox: Sandbox,
    hostname: String,
    dirs: Arc<PodDirs>,
    shared: Arc<PodShared>,
    updates: mpsc::UnboundedSender<Update>,
}
