//! The PersistentVolume controller on the controller runtime: binding claims to volumes and
//! volume phases ([`binder_core`]), the built-in `ferry.dev/local-path` provisioner (a
//! directory under `--local-path-dir` as a `hostPath` volume pinned to the node the claim's
//! first pod was scheduled to), reclaiming (Retain / Delete), and the `pvc-protection` and
//! `pv-protection` finalizers. Reflector stores of claims, volumes, classes, nodes and the
//! shared pods; one queue of claim and volume keys.

pub mod binder_core;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::runtime::{self, Action, ObjectKey, Reconciler, SlimPod, WorkQueue};
use binder_core::{ClaimPlan, VolumePlan};

const COMPONENT: &str = "persistentvolume-controller";
const WORKERS: usize = 2;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct StorageArgs {
    /// Where the built-in `ferry.dev/local-path` provisioner makes the volumes' directories
    /// (on the node's file system; `ferry up` uses `<data-dir>/storage`). Unset: the
    /// provisioner does not run.
    #[arg(long = "local-path-dir")]
    pub local_path_dir: Option<PathBuf>,
}

/// A claim (namespaced) or a volume (cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Claim(ObjectKey),
    Volume(String),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Claim(k) => write!(f, "persistentvolumeclaim {}/{}", k.namespace, k.name),
            Key::Volume(n) => write!(f, "persistentvolume {n}"),
        }
    }
}

struct Binder {
    client: kube::Client,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    nodes: Store<Node>,
    pods: Store<SlimPod>,
    root: Option<PathBuf>,
    /// The last Pending event per claim uid (an event is recorded when its message changes).
    events: Mutex<HashMap<String, String>>,
}

impl Reconciler for Binder {
    type Key = Key;
    type Error = kube::Error;
    fn name(&self) -> &'static str {
        COMPONENT
    }
    async fn reconcile(&self, key: &Key) -> kube::Result<Action> {
        match key {
            Key::Claim(k) => match k.get(&self.claims) {
                Some(c) => self.sync_claim(&c).await,
                None => Ok(Action::Done),
            },
            Key::Volume(n) => match ObjectKey::new("", n.clone()).get(&self.volumes) {
                Some(v) => self.sync_volume(&v).await,
                None => Ok(Action::Done),
            },
        }
    }
}

fn claim_key_of_volume(v: &PersistentVolume) -> Option<Key> {
    let r = v.spec.as_ref()?.claim_ref.as_ref()?;
    Some(Key::Claim(ObjectKey::new(
        r.namespace.clone().unwrap_or_default(),
        r.name.clone().unwrap_or_default(),
    )))
}

pub async fn run(
    client: kube::Client,
    args: StorageArgs,
    informers: runtime::Informers,
    stop: CancellationToken,
) {
    let queue: Arc<WorkQueue<Key>> = Arc::default();
    let cfg = watcher::Config::default;
    let claims = {
        let q = queue.clone();
        runtime::reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            cfg(),
            stop.clone(),
            move |ch| {
                for c in ch.objects() {
                    q.add(Key::Claim(ObjectKey::of(c)));
                    if let Some(v) = c.spec.as_ref().and_then(|s| s.volume_name.clone()) {
                        q.add(Key::Volume(v));
                    }
                }
            },
        )
    };
    let volumes = {
        let q = queue.clone();
        runtime::reflect(
            Api::<PersistentVolume>::all(client.clone()),
            cfg(),
            stop.clone(),
            move |ch| {
                for v in ch.objects() {
                    q.add(Key::Volume(v.name_any()));
                    q.extend(claim_key_of_volume(v));
                }
            },
        )
    };
    let classes = {
        let (q, cs) = (queue.clone(), claims.clone());
        runtime::reflect(
            Api::<StorageClass>::all(client.clone()),
            cfg(),
            stop.clone(),
            move |ch| {
                // A class appearing or changing: its pending claims look again.
                for sc in ch.objects() {
                    let name = sc.name_any();
                    for c in cs.state() {
                        if binder_core::claim_class(&c) == name
                            && c.spec
                                .as_ref()
                                .and_then(|s| s.volume_name.as_deref())
                                .is_none_or(str::is_empty)
                        {
                            q.add(Key::Claim(ObjectKey::of(c.as_ref())));
                        }
                    }
                }
            },
        )
    };
    let nodes = runtime::reflect(
        Api::<Node>::all(client.clone()),
        cfg(),
        stop.clone(),
        |_| {},
    );
    let pods = {
        let q = queue.clone();
        informers.pods().subscribe(move |ch| {
            // A pod going away may release its claims' protection.
            for p in ch.objects() {
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                for c in p.claim_names() {
                    q.add(Key::Claim(ObjectKey::new(ns.clone(), c)));
                }
            }
        })
    };
    let synced = async {
        claims.wait_until_ready().await.is_ok()
            && volumes.wait_until_ready().await.is_ok()
            && classes.wait_until_ready().await.is_ok()
            && nodes.wait_until_ready().await.is_ok()
            && informers.pods().wait_synced(&stop).await
    };
    tokio::select! {
        _ = stop.cancelled() => return,
        ok = synced => if !ok { return },
    }
    let b = Arc::new(Binder {
        client,
        claims,
        volumes,
        classes,
        nodes,
        pods,
        root: args.local_path_dir,
        events: Mutex::default(),
    });
    runtime::worker::run(b, queue, WORKERS, stop).await;
}

fn without(list: Option<&Vec<String>>, f: &str) -> Vec<String> {
    list.into_iter()
        .flatten()
        .filter(|x| x.as_str() != f)
        .cloned()
        .collect()
}

impl Binder {
    fn event<K: Resource<DynamicType = ()>>(&self, o: &K, type_: &str, reason: &str, msg: String) {
        crate::lifecycle::events::record(
            &self.client,
            crate::lifecycle::events::reference(o),
            type_,
            reason,
            msg,
            COMPONENT,
        );
    }

    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        ObjectKey::new("", node)
            .get(&self.nodes)
            .map(|n| n.labels().clone())
    }

    fn pods_using(&self, c: &PersistentVolumeClaim) -> usize {
        let ns = c.metadata.namespace.as_deref().unwrap_or("");
        let name = c.metadata.name.as_deref().unwrap_or("");
        self.pods
            .state()
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .filter(|p| p.claim_names().any(|n| n == name))
            .count()
    }

    async fn sync_claim(&self, c: &PersistentVolumeClaim) -> kube::Result<Action> {
        let ns = c.namespace().unwrap_or_default();
        let name = c.name_any();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        if binder_core::claim_releasable(c, self.pods_using(c)) {
            let fin = without(c.metadata.finalizers.as_ref(), binder_core::PVC_PROTECTION);
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": fin,
                    "resourceVersion": c.metadata.resource_version}})),
            )
            .await?;
            return Ok(Action::Done);
        }
        let volumes = self.volumes.state();
        let refs: Vec<&PersistentVolume> = volumes.iter().map(|v| v.as_ref()).collect();
        let class_name = binder_core::claim_class(c);
        let class = (!class_name.is_empty())
            .then(|| ObjectKey::new("", class_name.clone()).get(&self.classes))
            .flatten();
        let labels = |n: &str| self.node_labels(n);
        let plan = binder_core::plan_claim(c, &refs, class.as_deref(), &labels);
        match plan {
            ClaimPlan::None => {}
            ClaimPlan::Bind(v) | ClaimPlan::EnsureBound(v) => {
                let Some(pv) = refs.iter().find(|x| x.metadata.name.as_deref() == Some(&v)) else {
                    return Ok(Action::Done);
                };
                self.bind(c, pv).await?;
            }
            ClaimPlan::Provision(node) => {
                if c.metadata.deletion_timestamp.is_none()
                    && let Some(sc) = class
                {
                    self.provision(c, &sc, node.as_deref()).await?;
                }
            }
            ClaimPlan::Pending(ev) => {
                self.claim_phase(c, "Pending").await?;
                if let Some((t, reason, msg)) = ev {
                    let uid = c.uid().unwrap_or_default();
                    let new = {
                        let mut seen = self.events.lock().unwrap_or_else(PoisonError::into_inner);
                        seen.insert(uid, msg.clone()).as_deref() != Some(msg.as_str())
                    };
                    if new {
                        self.event(c, t, reason, msg);
                    }
                }
            }
            ClaimPlan::Lost(reason, msg) => {
                if c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Lost") {
                    self.claim_phase(c, "Lost").await?;
                    self.event(c, "Warning", reason, msg.to_string());
                }
            }
        }
        Ok(Action::Done)
    }

    async fn claim_phase(&self, c: &PersistentVolumeClaim, phase: &str) -> kube::Result<()> {
        if c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase) {
            return Ok(());
        }
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &c.namespace().unwrap_or_default());
        api.patch_status(
            &c.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase}})),
        )
        .await?;
        Ok(())
    }

    /// Upstream's `bind`: the volume's claimRef (and bound-by-controller when we set it), the
    /// volume's phase, the claim's volumeName and annotations, the claim's status — each
    /// written only when it differs.
    async fn bind(&self, c: &PersistentVolumeClaim, pv: &PersistentVolume) -> kube::Result<()> {
        let pv_name = pv.name_any();
        let ns = c.namespace().unwrap_or_default();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let spec = pv.spec.clone().unwrap_or_default();
        let has_ref = spec.claim_ref.as_ref();
        let complete = has_ref.is_some_and(|r| r.uid == c.metadata.uid);
        if !complete {
            let mut patch = json!({"spec": {"claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": ns, "name": c.name_any(), "uid": c.uid(),
                "resourceVersion": c.metadata.resource_version}},
                "metadata": {"resourceVersion": pv.metadata.resource_version}});
            if has_ref.is_none() {
                patch["metadata"]["annotations"] =
                    json!({binder_core::ANN_BOUND_BY_CONTROLLER: "yes"});
            }
            pvs.patch(&pv_name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            pvs.patch_status(
                &pv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound"}})),
            )
            .await?;
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let cspec = c.spec.clone().unwrap_or_default();
        let anns = c.annotations();
        let set_by_us = cspec.volume_name.as_deref().unwrap_or("").is_empty();
        if cspec.volume_name.as_deref() != Some(pv_name.as_str())
            || !anns.contains_key(binder_core::ANN_BIND_COMPLETED)
        {
            let mut a = json!({binder_core::ANN_BIND_COMPLETED: "yes"});
            if set_by_us {
                a[binder_core::ANN_BOUND_BY_CONTROLLER] = json!("yes");
            }
            api.patch(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"volumeName": pv_name},
                    "metadata": {"annotations": a, "resourceVersion": c.metadata.resource_version}})),
            )
            .await?;
            self.events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&c.uid().unwrap_or_default());
        }
        let st = c.status.clone().unwrap_or_default();
        let cap = spec.capacity.clone();
        let modes = spec.access_modes.clone();
        if st.phase.as_deref() != Some("Bound") || st.capacity != cap || st.access_modes != modes {
            api.patch_status(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"phase": "Bound", "capacity": cap, "accessModes": modes}}),
                ),
            )
            .await?;
        }
        Ok(())
    }

    async fn provision(
        &self,
        c: &PersistentVolumeClaim,
        sc: &StorageClass,
        node: Option<&str>,
    ) -> kube::Result<()> {
        let Some(root) = self.root.as_ref() else {
            return Ok(());
        };
        let ns = c.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let anns = c.annotations();
        if anns
            .get(binder_core::ANN_STORAGE_PROVISIONER)
            .map(String::as_str)
            != Some(binder_core::LOCAL_PATH_PROVISIONER)
        {
            api.patch(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    binder_core::ANN_STORAGE_PROVISIONER: binder_core::LOCAL_PATH_PROVISIONER,
                    binder_core::ANN_BETA_STORAGE_PROVISIONER: binder_core::LOCAL_PATH_PROVISIONER}}})),
            )
            .await?;
            self.event(
                c,
                "Normal",
                "Provisioning",
                format!(
                    "External provisioner is provisioning volume for claim \"{ns}/{}\"",
                    c.name_any()
                ),
            );
        }
        let hostname = node.and_then(|n| {
            self.node_labels(n)
                .and_then(|l| l.get(binder_core::HOSTNAME_LABEL).cloned())
        });
        let root_s = root.display().to_string();
        let pv =
            binder_core::provisioned_volume(c, sc, node.map(|n| (n, hostname.as_deref())), &root_s);
        if let Some(path) = pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| PathBuf::from(&h.path))
            && let Err(e) = make_dir(&path)
        {
            self.event(
                c,
                "Warning",
                "ProvisioningFailed",
                format!(
                    "failed to provision volume with StorageClass \"{}\": creating {}: {e}",
                    sc.name_any(),
                    path.display()
                ),
            );
            return Ok(());
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        match pvs.create(&PostParams::default(), &pv).await {
            Ok(v) => self.event(
                c,
                "Normal",
                "ProvisioningSucceeded",
                format!("Successfully provisioned volume {}", v.name_any()),
            ),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    async fn sync_volume(&self, v: &PersistentVolume) -> kube::Result<Action> {
        let name = v.name_any();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        if binder_core::volume_releasable(v) {
            let fin = without(v.metadata.finalizers.as_ref(), binder_core::PV_PROTECTION);
            pvs.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": fin,
                    "resourceVersion": v.metadata.resource_version}})),
            )
            .await?;
            return Ok(Action::Done);
        }
        let claim = claim_key_of_volume(v).and_then(|k| match k {
            Key::Claim(k) => k.get(&self.claims),
            Key::Volume(_) => None,
        });
        match binder_core::plan_volume(v, claim.as_deref()) {
            VolumePlan::None => {}
            VolumePlan::Phase(p, msg) => {
                pvs.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": p, "message": msg}})),
                )
                .await?;
                if p == "Failed"
                    && let Some(m) = msg
                {
                    self.event(v, "Warning", "VolumeFailedRecycle", m);
                }
            }
            VolumePlan::Unbind => {
                pvs.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"claimRef": null},
                        "metadata": {"annotations": {binder_core::ANN_BOUND_BY_CONTROLLER: null},
                            "resourceVersion": v.metadata.resource_version}})),
                )
                .await?;
            }
            VolumePlan::Delete => {
                if v.metadata.deletion_timestamp.is_some() {
                    return Ok(Action::Done);
                }
                if let (Some(root), Some(path)) = (
                    self.root.as_ref(),
                    v.spec
                        .as_ref()
                        .and_then(|s| s.host_path.as_ref())
                        .map(|h| PathBuf::from(&h.path)),
                ) && path.starts_with(root)
                    && path != *root
                    && let Err(e) = std::fs::remove_dir_all(&path)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    self.event(
                        v,
                        "Warning",
                        "VolumeFailedDelete",
                        format!("removing {}: {e}", path.display()),
                    );
                    return Ok(Action::Done);
                }
                match pvs.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Action::Done)
    }
}

/// The volume's directory, writable by any user of the pods (as k3s's local-path
/// provisioner makes it).
fn make_dir(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))
}
