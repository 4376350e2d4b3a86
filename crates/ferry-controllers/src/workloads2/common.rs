//! What the issue-16 controllers share: the writes a planner returns and their executor, pod
//! predicates, controller references, revision hashes and "expectations" (writes not yet seen
//! in the cache, so a lagging cache never causes a second create or delete).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
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

pub fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub fn is_deleting(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// Not terminal and not being deleted (upstream's `IsPodActive`).
pub fn is_active(p: &Pod) -> bool {
    !is_terminal(p) && !is_deleting(&p.metadata)
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// When the pod became Ready (seconds since the epoch).
pub fn ready_since(p: &Pod) -> Option<i64> {
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
pub fn is_available(p: &Pod, min_ready: i32, now: i64) -> bool {
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
