//! The `ServiceAccount` admission plugin (upstream's plugin/pkg/admission/serviceaccount), as a
//! pure function of the pod being created and its ServiceAccount.
//!
//! On pod create: mirror pods are left untouched (and may reference neither a ServiceAccount,
//! nor Secrets, nor a ServiceAccountToken projection); every other pod gets
//! `spec.serviceAccountName` (and the deprecated alias `spec.serviceAccount`) defaulted to
//! `default`, its ServiceAccount must exist, and unless `automountServiceAccountToken` is false
//! (the pod's setting wins over the ServiceAccount's) the projected `kube-api-access-<suffix>`
//! volume (bound token, `kube-root-ca.crt`, namespace) is mounted read-only at
//! [`DEFAULT_API_TOKEN_MOUNT_PATH`] in every init container and container that has no mount
//! there yet. Image pull secrets of the ServiceAccount are copied when the pod has none.

use serde_json::{Map, Value, json};

/// The ServiceAccount a pod gets when it names none.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Where the token volume is mounted.
pub const DEFAULT_API_TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Prefix of the projected volume's name.
pub const VOLUME_NAME_PREFIX: &str = "kube-api-access-";
/// Lifetime the projected token asks for (upstream's WarnOnlyBoundTokenExpirationSeconds).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The annotation that marks a mirror pod (kubelet's static pods).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// How many times the `default` ServiceAccount is looked up before the pod is refused (the
/// identity controller creates it shortly after its namespace); other names are looked up once.
pub const DEFAULT_LOOKUP_ATTEMPTS: u32 = 10;

/// What admitting a pod needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do: a mirror pod that references nothing it must not.
    Done,
    /// Refused with this reason (the caller words it as a 403 for the pod).
    Forbidden(String),
    /// Look up this ServiceAccount in the pod's namespace, then call [`admit_with`].
    LookUp(String),
}

fn spec(pod: &Value) -> Option<&Map<String, Value>> {
    pod.get("spec").and_then(Value::as_object)
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn is_mirror_pod(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

fn containers(spec: &Map<String, Value>) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .filter_map(|k| spec.get(k).and_then(Value::as_array))
        .flatten()
}

/// Whether the pod references any Secret (volumes, projections, env, envFrom, pull secrets),
/// as upstream's VisitPodSecretNames.
fn references_secrets(spec: &Map<String, Value>) -> bool {
    let pull = spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let env = containers(spec).any(|c| {
        c.get("envFrom")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|e| e.get("secretRef").is_some()))
            || c.get("env").and_then(Value::as_array).is_some_and(|a| {
                a.iter()
                    .any(|e| e.pointer("/valueFrom/secretKeyRef").is_some())
            })
    });
    let volumes = spec
        .get("volumes")
        .and_then(Value::as_array)
        .is_some_and(|vs| {
            vs.iter().any(|v| {
                v.get("secret").is_some()
                    || v.pointer("/projected/sources")
                        .and_then(Value::as_array)
                        .is_some_and(|s| s.iter().any(|p| p.get("secret").is_some()))
                    || [
                        "cephfs",
                        "cinder",
                        "flexVolume",
                        "iscsi",
                        "rbd",
                        "scaleIO",
                        "storageos",
                        "csi",
                    ]
                    .iter()
                    .any(|k| {
                        v.get(*k).is_some_and(|s| {
                            s.get("secretRef").is_some() || s.get("nodePublishSecretRef").is_some()
                        })
                    })
                    || v.pointer("/azureFile/secretName").is_some()
            })
        });
    pull || env || volumes
}

fn uses_token_projection(spec: &Map<String, Value>) -> bool {
    spec.get("volumes")
        .and_then(Value::as_array)
        .is_some_and(|vs| {
            vs.iter().any(|v| {
                v.pointer("/projected/sources")
                    .and_then(Value::as_array)
                    .is_some_and(|s| s.iter().any(|p| p.get("serviceAccountToken").is_some()))
            })
        })
}

/// First step: mirror pods are checked and left alone; every other pod gets its
/// ServiceAccount name defaulted and is told which ServiceAccount to look up.
pub fn admit(pod: &mut Value) -> Step {
    if is_mirror_pod(pod) {
        let Some(s) = spec(pod) else {
            return Step::Done;
        };
        if !str_at(
            pod.get("spec").unwrap_or(&Value::Null),
            "serviceAccountName",
        )
        .is_empty()
        {
            return Step::Forbidden("a mirror pod may not reference service accounts".into());
        }
        if references_secrets(s) {
            return Step::Forbidden("a mirror pod may not reference secrets".into());
        }
        if uses_token_projection(s) {
            return Step::Forbidden(
                "a mirror pod may not use ServiceAccountToken volume projections".into(),
            );
        }
        return Step::Done;
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Step::Done;
    };
    let mut name = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name.is_empty() {
        // The deprecated alias stands in for the name (v1 conversion), then the default.
        name = spec
            .get("serviceAccount")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
            .to_string();
    }
    spec.insert("serviceAccountName".into(), json!(name));
    spec.insert("serviceAccount".into(), json!(name));
    Step::LookUp(name)
}

/// Upstream's refusal when the ServiceAccount does not exist.
pub fn not_found_reason(namespace: &str, name: &str) -> String {
    format!(
        "error looking up service account {namespace}/{name}: serviceaccount \"{name}\" not found"
    )
}

/// Whether the token is mounted: the pod's `automountServiceAccountToken` wins, then the
/// ServiceAccount's, then true.
pub fn should_automount(sa: &Value, pod: &Value) -> bool {
    if let Some(b) = pod
        .pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
    {
        return b;
    }
    sa.get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

/// The projected volume source of the token volume (with its defaults filled in, as stored).
pub fn token_volume_source() -> Value {
    json!({
        "defaultMode": 0o644,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]
    })
}

/// Second step, with the pod's ServiceAccount: mounts the token volume (unless automount is
/// off) and copies the ServiceAccount's image pull secrets to a pod that has none.
/// `suffix` makes the 5-character volume name suffix (random in the server).
pub fn admit_with(pod: &mut Value, sa: &Value, suffix: &mut dyn FnMut() -> String) {
    if should_automount(sa, pod) {
        mount_token(pod, suffix);
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let has_pull = spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !has_pull
        && let Some(sa_pull) = sa
            .get("imagePullSecrets")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
    {
        let refs: Vec<Value> = sa_pull
            .iter()
            .map(|r| json!({"name": str_at(r, "name")}))
            .collect();
        spec.insert("imagePullSecrets".into(), Value::Array(refs));
    }
}

fn mount_token(pod: &mut Value, suffix: &mut dyn FnMut() -> String) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let names: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|v| str_at(v, "name").to_string())
        .collect();
    // A volume named like the token volume already there is reused (as upstream).
    let existing = names
        .iter()
        .find(|n| n.starts_with(VOLUME_NAME_PREFIX))
        .cloned();
    let volume_name = match &existing {
        Some(n) => n.clone(),
        None => {
            let mut n = format!("{VOLUME_NAME_PREFIX}{}", suffix());
            // Upstream does not retry a clash; a clash would make the pod invalid, so pick again.
            for _ in 0..8 {
                if !names.contains(&n) {
                    break;
                }
                n = format!("{VOLUME_NAME_PREFIX}{}", suffix());
            }
            n
        }
    };
    let mount =
        json!({"name": volume_name, "readOnly": true, "mountPath": DEFAULT_API_TOKEN_MOUNT_PATH});
    let mut needs_volume = false;
    for key in ["initContainers", "containers"] {
        let Some(list) = spec.get_mut(key).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in list.iter_mut() {
            let Some(c) = c.as_object_mut() else {
                continue;
            };
            let mounts = c
                .entry("volumeMounts")
                .or_insert_with(|| Value::Array(Vec::new()));
            if !mounts.is_array() {
                *mounts = Value::Array(Vec::new());
            }
            let Some(mounts) = mounts.as_array_mut() else {
                continue;
            };
            if mounts
                .iter()
                .any(|m| str_at(m, "mountPath") == DEFAULT_API_TOKEN_MOUNT_PATH)
            {
                continue;
            }
            mounts.push(mount.clone());
            needs_volume = true;
        }
    }
    if needs_volume && existing.is_none() {
        let volumes = spec
            .entry("volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        if !volumes.is_array() {
            *volumes = Value::Array(Vec::new());
        }
        if let Some(vs) = volumes.as_array_mut() {
            vs.push(json!({"name": volume_name, "projected": token_volume_source()}));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fixed() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            if n == 1 {
                "abcde".to_string()
            } else {
                format!("x{n:04}")
            }
        }
    }

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    }

    fn run(p: &mut Value, sa: &Value) -> Step {
        let step = admit(p);
        if let Step::LookUp(_) = &step {
            admit_with(p, sa, &mut fixed());
        }
        step
    }

    fn sa() -> Value {
        json!({"metadata": {"name": "default", "namespace": "ns"}})
    }

    #[test]
    fn defaults_the_name_and_mounts_everywhere() {
        let mut p = pod(json!({
            "initContainers": [{"name": "i", "image": "x"}],
            "containers": [{"name": "a", "image": "x", "volumeMounts": [{"name": "d", "mountPath": "/d"}]},
                           {"name": "b", "image": "x"}],
            "volumes": [{"name": "d", "emptyDir": {}}]}));
        assert_eq!(run(&mut p, &sa()), Step::LookUp("default".into()));
        assert_eq!(p["spec"]["serviceAccountName"], "default");
        assert_eq!(p["spec"]["serviceAccount"], "default");
        let want_mount = json!({"name": "kube-api-access-abcde", "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
        assert_eq!(
            p["spec"]["initContainers"][0]["volumeMounts"],
            json!([want_mount])
        );
        assert_eq!(p["spec"]["containers"][0]["volumeMounts"][1], want_mount);
        assert_eq!(
            p["spec"]["containers"][1]["volumeMounts"],
            json!([want_mount])
        );
        let vols = p["spec"]["volumes"].as_array().unwrap();
        assert_eq!(vols.len(), 2);
        assert_eq!(vols[1]["name"], "kube-api-access-abcde");
        let src = &vols[1]["projected"]["sources"];
        assert_eq!(
            src[0]["serviceAccountToken"],
            json!({"expirationSeconds": 3607, "path": "token"})
        );
        assert_eq!(src[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(
            src[1]["configMap"]["items"],
            json!([{"key": "ca.crt", "path": "ca.crt"}])
        );
        assert_eq!(
            src[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        assert_eq!(src[2]["downwardAPI"]["items"][0]["path"], "namespace");
        assert_eq!(vols[1]["projected"]["defaultMode"], 420);
    }

    #[test]
    fn names_and_deprecated_alias() {
        let table = [
            (json!({"serviceAccountName": "robot"}), "robot"),
            (json!({"serviceAccount": "old"}), "old"),
            (
                json!({"serviceAccountName": "new", "serviceAccount": "old"}),
                "new",
            ),
            (json!({"serviceAccountName": ""}), "default"),
        ];
        for (mut s, want) in table {
            s["containers"] = json!([{"name": "c", "image": "x"}]);
            let mut p = pod(s);
            assert_eq!(admit(&mut p), Step::LookUp(want.into()));
            assert_eq!(p["spec"]["serviceAccountName"], want);
            assert_eq!(p["spec"]["serviceAccount"], want);
        }
    }

    #[test]
    fn automount_preference() {
        // (pod's setting, ServiceAccount's setting, mounted)
        let table = [
            (None, None, true),
            (Some(false), None, false),
            (None, Some(false), false),
            (Some(true), Some(false), true),
            (Some(false), Some(true), false),
            (None, Some(true), true),
        ];
        for (pod_pref, sa_pref, mounted) in table {
            let mut s = json!({"containers": [{"name": "c", "image": "x"}]});
            if let Some(b) = pod_pref {
                s["automountServiceAccountToken"] = json!(b);
            }
            let mut account = sa();
            if let Some(b) = sa_pref {
                account["automountServiceAccountToken"] = json!(b);
            }
            let mut p = pod(s);
            run(&mut p, &account);
            let has = p["spec"]["volumes"]
                .as_array()
                .is_some_and(|v| !v.is_empty());
            assert_eq!(has, mounted, "{pod_pref:?} {sa_pref:?}");
            assert_eq!(
                p["spec"]["containers"][0]["volumeMounts"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty()),
                mounted
            );
        }
    }

    #[test]
    fn existing_mount_at_the_path_is_kept() {
        let mut p = pod(json!({
            "containers": [{"name": "a", "image": "x",
                "volumeMounts": [{"name": "mine", "mountPath": DEFAULT_API_TOKEN_MOUNT_PATH}]}],
            "volumes": [{"name": "mine", "secret": {"secretName": "s"}}]}));
        run(&mut p, &sa());
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            p["spec"]["volumes"].as_array().unwrap().len(),
            1,
            "no volume when nobody needs it"
        );

        // One container has its own mount, the other gets the token volume.
        let mut p = pod(json!({
            "containers": [{"name": "a", "image": "x",
                "volumeMounts": [{"name": "mine", "mountPath": DEFAULT_API_TOKEN_MOUNT_PATH}]},
                {"name": "b", "image": "x"}],
            "volumes": [{"name": "mine", "emptyDir": {}}]}));
        run(&mut p, &sa());
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            p["spec"]["containers"][1]["volumeMounts"][0]["name"],
            "kube-api-access-abcde"
        );
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn existing_token_volume_is_reused_and_clashes_avoided() {
        let mut p = pod(json!({
            "containers": [{"name": "a", "image": "x"}],
            "volumes": [{"name": "kube-api-access-zzzzz", "projected": token_volume_source()}]}));
        run(&mut p, &sa());
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][0]["name"],
            "kube-api-access-zzzzz"
        );

        let mut p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        admit(&mut p);
        let mut same = || "abcde".to_string();
        admit_with(&mut p, &sa(), &mut same);
        assert_eq!(p["spec"]["volumes"][0]["name"], "kube-api-access-abcde");
    }

    #[test]
    fn pull_secrets_copied_when_the_pod_has_none() {
        let account = json!({"imagePullSecrets": [{"name": "reg"}]});
        let mut p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        run(&mut p, &account);
        assert_eq!(p["spec"]["imagePullSecrets"], json!([{"name": "reg"}]));
        let mut p = pod(json!({"containers": [{"name": "a", "image": "x"}],
            "imagePullSecrets": [{"name": "mine"}]}));
        run(&mut p, &account);
        assert_eq!(p["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));
    }

    #[test]
    fn mirror_pods() {
        let mirror = |spec: Value| json!({"metadata": {"name": "m", "annotations": {MIRROR_POD_ANNOTATION: "x"}}, "spec": spec});
        let table = [
            (json!({"containers": [{"name": "a", "image": "x"}]}), None),
            (
                json!({"serviceAccountName": "default", "containers": []}),
                Some("a mirror pod may not reference service accounts"),
            ),
            (
                json!({"containers": [{"name": "a", "image": "x",
                "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}),
                Some("a mirror pod may not reference secrets"),
            ),
            (
                json!({"containers": [], "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
                Some("a mirror pod may not reference secrets"),
            ),
            (
                json!({"containers": [], "volumes": [{"name": "v", "projected": {"sources": [
                {"serviceAccountToken": {"path": "t"}}]}}]}),
                Some("a mirror pod may not use ServiceAccountToken volume projections"),
            ),
        ];
        for (spec, want) in table {
            let mut p = mirror(spec.clone());
            let before = p.clone();
            let step = admit(&mut p);
            match want {
                None => assert_eq!(step, Step::Done),
                Some(w) => assert_eq!(step, Step::Forbidden(w.into()), "{spec}"),
            }
            assert_eq!(p, before, "a mirror pod is never changed");
        }
    }

    #[test]
    fn refusal_wording() {
        assert_eq!(
            not_found_reason("ns", "robot"),
            "error looking up service account ns/robot: serviceaccount \"robot\" not found"
        );
    }
}
