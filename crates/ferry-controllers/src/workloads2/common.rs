//! What the issue-16 controllers share: the writes a planner returns and their executor, pod
//! predicates, controller references, revision hashes and "expectations" (writes not yet seen
//! in the cache, so a lagging cache never causes a second create or delete).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::runtime::SlimPod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

/// The resources the controllers write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Res {
    Pods,
    ControllerRevisions,
    StatefulSets,
    DaemonSets,
    Jobs,
    CronJobs,
    PodDisruptionBudgets,
}

impl Res {
    fn api_resource(self) -> ApiResource {
        let (g, k, p) = match self {
            Res::Pods => ("", "Pod", "pods"),
            Res::ControllerRevisions => ("apps", "ControllerRevision", "controllerrevisions"),
            Res::StatefulSets => ("apps", "StatefulSet", "statefulsets"),
            Res::DaemonSets => ("apps", "DaemonSet", "daemonsets"),
            Res::Jobs => ("batch", "Job", "jobs"),
            Res::CronJobs => ("batch", "CronJob", "cronjobs"),
            Res::PodDisruptionBudgets => ("policy", "PodDisruptionBudget", "poddisruptionbudgets"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, "v1", k), p)
    }
}

/// One write a planner asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Create(Value),
    /// Delete by name; `uid` is a precondition; `background` propagation (else the default).
    Delete {
        name: String,
        uid: Option<String>,
        background: bool,
    },
    /// A merge patch of the object (`status: false`) or of its `/status`.
    Patch {
        name: String,
        patch: Value,
        status: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub res: Res,
    pub namespace: String,
    pub op: Op,
}

impl Write {
    pub fn create(res: Res, ns: &str, obj: Value) -> Write {
        Write {
            res,
            namespace: ns.to_string(),
            op: Op::Create(obj),
        }
    }
    pub fn delete(res: Res, ns: &str, name: &str, uid: Option<&str>) -> Write {
        Write {
            res,
            namespace: ns.to_string(),
            op: Op::Delete {
                name: name.to_string(),
                uid: uid.map(String::from),
                background: false,
            },
        }
    }
    pub fn delete_background(res: Res, ns: &str, name: &str, uid: Option<&str>) -> Write {
        let mut w = Write::delete(res, ns, name, uid);
        if let Op::Delete { background, .. } = &mut w.op {
            *background = true;
        }
        w
    }
    pub fn patch(res: Res, ns: &str, name: &str, patch: Value) -> Write {
        Write {
            res,
            namespace: ns.to_string(),
            op: Op::Patch {
                name: name.to_string(),
                patch,
                status: false,
            },
        }
    }
    pub fn status(res: Res, ns: &str, name: &str, status: Value) -> Write {
        Write {
            res,
            namespace: ns.to_string(),
            op: Op::Patch {
                name: name.to_string(),
                patch: json!({ "status": status }),
                status: true,
            },
        }
    }
    /// The name a create asks for (None with generateName).
    pub fn created_name(&self) -> Option<&str> {
        match &self.op {
            Op::Create(v) => v.pointer("/metadata/name").and_then(Value::as_str),
            _ => None,
        }
    }
}

/// What an executed write did: the name of a created object, or of a deleted one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    Created(String),
    Deleted(String),
    Patched,
}

/// Executes one write. A create that finds the object already there, and a delete or patch that
/// finds it gone, are not errors.
pub async fn exec(client: &kube::Client, w: Write) -> Result<Done, kube::Error> {
    let ar = w.res.api_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &w.namespace, &ar);
    match w.op {
        Op::Create(v) => {
            let obj: DynamicObject = serde_json::from_value(v).map_err(kube::Error::SerdeError)?;
            match api.create(&PostParams::default(), &obj).await {
                Ok(o) => Ok(Done::Created(o.metadata.name.unwrap_or_default())),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    Ok(Done::Created(obj.metadata.name.unwrap_or_default()))
                }
                Err(e) => Err(e),
            }
        }
        Op::Delete {
            name,
            uid,
            background,
        } => {
            let mut dp = if background {
                DeleteParams::background()
            } else {
                DeleteParams::default()
            };
            if let Some(uid) = uid {
                dp.preconditions = Some(kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                });
            }
            match api.delete(&name, &dp).await {
                Ok(_) => Ok(Done::Deleted(name)),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                    Ok(Done::Deleted(name))
                }
                Err(e) => Err(e),
            }
        }
        Op::Patch {
            name,
            patch,
            status,
        } => {
            let pp = PatchParams::default();
            let r = if status {
                api.patch_status(&name, &pp, &Patch::Merge(&patch)).await
            } else {
                api.patch(&name, &pp, &Patch::Merge(&patch)).await
            };
            match r {
                Ok(_) => Ok(Done::Patched),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(Done::Patched),
                Err(e) => Err(e),
            }
        }
    }
}

// ---- pods ----

pub fn is_terminal(p: &SlimPod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub fn is_deleting(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// Not terminal and not being deleted (upstream's `IsPodActive`).
pub fn is_active(p: &SlimPod) -> bool {
    !is_terminal(p) && !is_deleting(&p.metadata)
}

pub fn is_ready(p: &SlimPod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// When the pod became Ready (seconds since the epoch).
pub fn ready_since(p: &SlimPod) -> Option<i64> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.as_second())
}

/// Ready for at least `min_ready` seconds at `now`.
pub fn is_available(p: &SlimPod, min_ready: i32, now: i64) -> bool {
    is_ready(p)
        && (min_ready <= 0 || ready_since(p).is_some_and(|t| t + i64::from(min_ready) <= now))
}

/// The owner reference of the controller `owner`.
pub fn controller_ref(api_version: &str, kind: &str, meta: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `meta`'s controller is the object with `uid`.
pub fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

pub fn labels_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

// ---- claiming (upstream's `ControllerRefManager.ClaimPods`) ----

/// The controller claiming objects: its kind and metadata, and the finalizer it adds to the
/// objects it adopts and removes from those it releases (the Job's tracking finalizer).
#[derive(Debug, Clone, Copy)]
pub struct Claimer<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub meta: &'a ObjectMeta,
    pub finalizer: Option<&'a str>,
}

/// The result of a claim: the objects owned once `writes` (adoptions and releases) are done,
/// adopted ones shown with the owner's reference (and finalizer) already in.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimPlan<T> {
    pub owned: Vec<T>,
    pub writes: Vec<Write>,
}

/// Plans the claim of `candidates` (the namespace's objects) by `owner`, with upstream's rules
/// ([`crate::lifecycle::workload_core::claim`]): ours and matching → owned; ours and no longer
/// matching → released; a matching orphan → adopted (neither side being deleted); another
/// controller's → untouched. `matches` is the selector plus any extra filter of the owner.
/// The patches carry the object's uid and resourceVersion as preconditions.
pub fn plan_claim<T>(
    owner: &Claimer<'_>,
    res: Res,
    candidates: &[&T],
    matches: impl Fn(&T) -> bool,
) -> ClaimPlan<T>
where
    T: kube::Resource + Clone,
{
    use crate::lifecycle::workload_core::{Candidate, Claim, claim};
    let owner_uid = owner.meta.uid.clone().unwrap_or_default();
    let owner_deleting = is_deleting(owner.meta);
    let ns = owner.meta.namespace.clone().unwrap_or_default();
    let mut out = ClaimPlan {
        owned: Vec::new(),
        writes: Vec::new(),
    };
    for c in candidates {
        let meta = c.meta();
        if meta.namespace != owner.meta.namespace {
            continue;
        }
        let view = Candidate {
            controller_uid: crate::runtime::keys::controller_ref(meta).map(|r| r.uid.clone()),
            matches: matches(c),
            deleting: is_deleting(meta),
        };
        let name = meta.name.clone().unwrap_or_default();
        match claim(&owner_uid, owner_deleting, &view) {
            Claim::Owned => out.owned.push((*c).clone()),
            Claim::Adopt => {
                let mut refs = meta.owner_references.clone().unwrap_or_default();
                refs.push(controller_ref(owner.api_version, owner.kind, owner.meta));
                let mut fins = meta.finalizers.clone().unwrap_or_default();
                if let Some(f) = owner.finalizer
                    && !fins.iter().any(|x| x == f)
                {
                    fins.push(f.to_string());
                }
                let mut patch = json!({"metadata": {
                    "ownerReferences": refs,
                    "uid": meta.uid,
                    "resourceVersion": meta.resource_version,
                }});
                if owner.finalizer.is_some() {
                    patch["metadata"]["finalizers"] = json!(fins);
                }
                let mut adopted = (*c).clone();
                adopted.meta_mut().owner_references = Some(refs);
                if owner.finalizer.is_some() {
                    adopted.meta_mut().finalizers = Some(fins);
                }
                out.owned.push(adopted);
                out.writes.push(Write::patch(res, &ns, &name, patch));
            }
            Claim::Release => {
                let keep: Vec<OwnerReference> = meta
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|r| r.uid != owner_uid)
                    .cloned()
                    .collect();
                let mut patch = json!({"metadata": {
                    "ownerReferences": if keep.is_empty() { Value::Null } else { json!(keep) },
                    "uid": meta.uid,
                    "resourceVersion": meta.resource_version,
                }});
                if let Some(f) = owner.finalizer {
                    let fins: Vec<&String> = meta
                        .finalizers
                        .iter()
                        .flatten()
                        .filter(|x| *x != f)
                        .collect();
                    if fins.len() != meta.finalizers.as_ref().map_or(0, Vec::len) {
                        patch["metadata"]["finalizers"] = if fins.is_empty() {
                            Value::Null
                        } else {
                            json!(fins)
                        };
                    }
                }
                out.writes.push(Write::patch(res, &ns, &name, patch));
            }
            Claim::Ignore => {}
        }
    }
    out
}

/// For tests: each candidate's fate in `plan`, as `name=owned|adopt|release|-`.
#[cfg(test)]
pub fn claim_outcomes<T: kube::Resource>(
    plan: &ClaimPlan<T>,
    names: &[&str],
    owner_uid: &str,
) -> Vec<String> {
    names
        .iter()
        .map(|n| {
            let w = plan
                .writes
                .iter()
                .find(|w| matches!(&w.op, Op::Patch { name, .. } if name == n));
            let what = match w {
                Some(w) if adopts(w, owner_uid) => "adopt",
                Some(_) => "release",
                None if plan
                    .owned
                    .iter()
                    .any(|o| o.meta().name.as_deref() == Some(n)) =>
                {
                    "owned"
                }
                None => "-",
            };
            format!("{n}={what}")
        })
        .collect()
}

/// Whether any write of a claim adopts (so the owner must be rechecked first).
pub fn adopts(w: &Write, owner_uid: &str) -> bool {
    matches!(&w.op, Op::Patch { patch, .. } if patch
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == owner_uid)))
}

/// Upstream's `RecheckDeletionTimestamp`: before adopting, read the owner afresh from the API
/// server (not the cache) and refuse if it is gone, replaced (another uid) or being deleted.
pub async fn can_adopt(
    client: &kube::Client,
    res: Res,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<bool, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &res.api_resource());
    Ok(match api.get_opt(name).await? {
        Some(o) => {
            o.metadata.uid.as_deref() == Some(uid) && o.metadata.deletion_timestamp.is_none()
        }
        None => false,
    })
}

/// Executes a claim's writes for the owner `(owner_res, ns, name, uid)`: adoptions only after
/// [`can_adopt`]; any failure fails the sync (upstream returns the claim error and retries).
/// Returns whether the adoptions were made (false: they were refused and the caller must not
/// count the adopted objects).
pub async fn exec_claim(
    client: &kube::Client,
    owner_res: Res,
    owner: &ObjectMeta,
    writes: Vec<Write>,
) -> Result<bool, kube::Error> {
    let ns = owner.namespace.clone().unwrap_or_default();
    let name = owner.name.clone().unwrap_or_default();
    let uid = owner.uid.clone().unwrap_or_default();
    let (adopt, release): (Vec<Write>, Vec<Write>) =
        writes.into_iter().partition(|w| adopts(w, &uid));
    let mut adopted = true;
    if !adopt.is_empty() && !can_adopt(client, owner_res, &ns, &name, &uid).await? {
        adopted = false;
    }
    let todo: Vec<Write> = if adopted {
        release.into_iter().chain(adopt).collect()
    } else {
        release
    };
    crate::runtime::execute_all(todo, |w| exec(client, w))
        .await
        .map_err(|e| e.first)?;
    Ok(adopted)
}

/// Whether a label selector selects `labels` (an empty or invalid selector selects nothing, as
/// upstream's controllers treat them).
pub fn selects(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    match ferry_api::selectors::from_label_selector(sel) {
        Ok(s) => !s.is_empty() && s.matches(labels),
        Err(_) => false,
    }
}

// ---- revisions ----

/// FNV-1a 32-bit, as upstream's `ComputeHash` uses, rendered with the safe alphabet of
/// `rand.SafeEncodeString` (no vowels, no confusable characters).
pub fn hash_string(data: &[u8]) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string()
        .bytes()
        .map(|d| ALPHABET[usize::from(d - b'0') % ALPHABET.len()] as char)
        .collect()
}

/// The `data` of a ControllerRevision for a pod template (the patch `kubectl rollout undo`
/// applies): `{"spec":{"template":{..., "$patch":"replace"}}}`.
pub fn revision_data(template: &Value) -> Value {
    let mut t = template.clone();
    if let Value::Object(m) = &mut t {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// The hash of a revision's data (collision count folded in, as upstream).
pub fn revision_hash(data: &Value, collision_count: i32) -> String {
    let mut bytes = serde_json::to_vec(data).unwrap_or_default();
    if collision_count > 0 {
        bytes.extend_from_slice(&collision_count.to_le_bytes());
    }
    hash_string(&bytes)
}

// ---- expectations ----

/// Creates and deletes issued per owner and not yet seen in the cache (upstream's
/// `ControllerExpectations`), with a timeout after which they are forgotten.
#[derive(Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Pending>>,
}

struct Pending {
    creates: HashSet<String>,
    deletes: HashSet<String>,
    creates_unnamed: usize,
    at: Instant,
}

pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(30);

impl Expectations {
    /// Records what was done for `owner`.
    pub fn record(&self, owner: &str, done: &[Done], unnamed_creates: usize) {
        let mut m = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let p = m.entry(owner.to_string()).or_insert_with(|| Pending {
            creates: HashSet::new(),
            deletes: HashSet::new(),
            creates_unnamed: 0,
            at: Instant::now(),
        });
        p.at = Instant::now();
        p.creates_unnamed += unnamed_creates;
        for d in done {
            match d {
                Done::Created(n) => {
                    p.creates.insert(n.clone());
                }
                Done::Deleted(n) => {
                    p.deletes.insert(n.clone());
                }
                Done::Patched => {}
            }
        }
    }

    /// Whether the cache (`present`: names of the owner's objects now cached) reflects every
    /// write recorded for `owner`; satisfied entries are dropped.
    pub fn satisfied(&self, owner: &str, present: &HashSet<String>) -> bool {
        let mut m = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(p) = m.get_mut(owner) else {
            return true;
        };
        p.creates.retain(|n| !present.contains(n));
        p.deletes.retain(|n| present.contains(n));
        let ok =
            (p.creates.is_empty() && p.deletes.is_empty()) || p.at.elapsed() > EXPECTATIONS_TIMEOUT;
        if ok {
            m.remove(owner);
        }
        ok
    }

    pub fn forget(&self, owner: &str) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(owner);
    }
}

pub fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

pub fn rfc3339(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// Subscribes the controllers of kind `O` to the shared pod informer: an owned pod wakes its
/// controller, an orphan wakes every `O` in its namespace whose selector matches it (those
/// may adopt it).
pub fn reflect_pods_for<O>(
    informers: &crate::runtime::Informers,
    queue: &std::sync::Arc<crate::runtime::WorkQueue<crate::runtime::ObjectKey>>,
    owners: kube::runtime::reflector::Store<O>,
    selects: fn(&O, &BTreeMap<String, String>) -> bool,
) -> kube::runtime::reflector::Store<SlimPod>
where
    O: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    use crate::runtime::keys;
    let q = queue.clone();
    informers.pods().subscribe(move |ch| {
        for o in ch.objects() {
            match keys::controller_ref(&o.metadata) {
                Some(_) => q.extend(keys::controller_key::<O>(&o.metadata)),
                None => q.extend(keys::selecting(
                    &owners,
                    o.metadata.namespace.as_deref().unwrap_or(""),
                    o.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                    selects,
                )),
            }
        }
    })
}

/// Watches ControllerRevisions: each wakes its controller of kind `O`.
pub fn reflect_revisions_for<O>(
    client: &kube::Client,
    queue: &std::sync::Arc<crate::runtime::WorkQueue<crate::runtime::ObjectKey>>,
    stop: tokio_util::sync::CancellationToken,
) -> kube::runtime::reflector::Store<k8s_openapi::api::apps::v1::ControllerRevision>
where
    O: kube::Resource<DynamicType = ()>,
{
    let q = queue.clone();
    crate::runtime::reflect(
        Api::<k8s_openapi::api::apps::v1::ControllerRevision>::all(client.clone()),
        kube::runtime::watcher::Config::default(),
        stop,
        move |ch| {
            for o in ch.objects() {
                if let Some(k) = crate::runtime::keys::controller_key::<O>(&o.metadata) {
                    q.add(k);
                }
            }
        },
    )
}

/// Runs `first` (revisions, a status write) before `rest`, each set concurrently; stops at the
/// first failure.
pub async fn exec_in_order(
    client: &kube::Client,
    first: Vec<Write>,
    rest: Vec<Write>,
) -> Result<Vec<Done>, kube::Error> {
    let mut done = crate::runtime::execute_all(first, |w| exec(client, w))
        .await
        .map_err(|e| e.first)?;
    done.extend(
        crate::runtime::execute_all(rest, |w| exec(client, w))
            .await
            .map_err(|e| e.first)?,
    );
    Ok(done)
}

/// The runtime's action for a plan's `requeue_after` (seconds).
pub fn requeue(after: Option<i64>) -> crate::runtime::Action {
    match after {
        Some(s) => crate::runtime::Action::RequeueAfter(Duration::from_secs(s.max(1) as u64)),
        None => crate::runtime::Action::Done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_and_safe() {
        let a = hash_string(b"abc");
        assert_eq!(a, hash_string(b"abc"));
        assert_ne!(a, hash_string(b"abd"));
        assert!(
            a.bytes()
                .all(|c| b"bcdfghjklmnpqrstvwxz2456789".contains(&c))
        );
        let d = revision_data(&json!({"spec": {"containers": []}}));
        assert_eq!(d["spec"]["template"]["$patch"], json!("replace"));
        assert_ne!(revision_hash(&d, 0), revision_hash(&d, 1));
    }

    #[test]
    fn expectations() {
        let e = Expectations::default();
        e.record(
            "u",
            &[Done::Created("a".into()), Done::Deleted("b".into())],
            0,
        );
        let present: HashSet<String> = ["b".to_string()].into();
        assert!(!e.satisfied("u", &present));
        let present: HashSet<String> = ["a".to_string(), "b".to_string()].into();
        assert!(!e.satisfied("u", &present), "b still present");
        let present: HashSet<String> = ["a".to_string()].into();
        assert!(e.satisfied("u", &present));
        assert!(e.satisfied("other", &present));
    }
}
