//! Validation of the storage kinds and ReplicationController (upstream
//! `pkg/apis/core/validation`: `ValidatePersistentVolume*`, `ValidatePersistentVolumeClaim*`,
//! `ValidateReplicationController*`; `pkg/apis/storage/validation`: `ValidateStorageClass*`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::storage::v1 as storage;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::common::{
    dns1123_subdomain, go_map, immutable, meta, nonneg, qualified_name, s, slice, validate_labels,
    validate_object_meta_update,
};
use super::pod::validate_pod_template_spec;
use ferry_apimachinery::errors::{ErrorList, FieldError, Path};
use ferry_apimachinery::{names, quantity};

pub const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
pub const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
pub const PV_RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];
pub const SC_RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
pub const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];
const NOT_POSITIVE: &str = "must be greater than zero";

fn go_quantities(m: &BTreeMap<String, Quantity>) -> String {
    let inner: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{}", v.0)).collect();
    format!("map[{}]", inner.join(" "))
}

/// validateResourceQuantityValue + ValidatePositiveQuantityValue.
fn positive_quantity(q: &Quantity, path: &Path) -> ErrorList {
    match quantity::parse(&q.0) {
        Err(e) => vec![FieldError::invalid_str(path, &q.0, e.to_string())],
        Ok(v) if !v.is_positive() => vec![FieldError::invalid_str(path, &q.0, NOT_POSITIVE)],
        Ok(_) => Vec::new(),
    }
}

fn access_modes(modes: &[String], path: &Path, required_detail: &str) -> ErrorList {
    let mut errs = Vec::new();
    if modes.is_empty() {
        errs.push(FieldError::required(path, required_detail));
    }
    let mut rwop = false;
    for m in modes {
        if !ACCESS_MODES.contains(&m.as_str()) {
            errs.push(FieldError::not_supported(path, m, ACCESS_MODES));
        }
        rwop |= m == "ReadWriteOncePod";
    }
    if rwop && modes.len() > 1 {
        errs.push(FieldError::forbidden(
            path,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
    errs
}

fn volume_mode(mode: &Option<String>, path: &Path) -> ErrorList {
    match mode {
        Some(m) if !VOLUME_MODES.contains(&m.as_str()) => {
            vec![FieldError::not_supported(path, m, VOLUME_MODES)]
        }
        _ => Vec::new(),
    }
}

/// The volume sources of a PV spec present, in upstream's order of checking.
fn sources(spec: &core::PersistentVolumeSpec) -> Vec<&'static str> {
    let present = [
        ("hostPath", spec.host_path.is_some()),
        ("gcePersistentDisk", spec.gce_persistent_disk.is_some()),
        (
            "awsElasticBlockStore",
            spec.aws_elastic_block_store.is_some(),
        ),
        ("glusterfs", spec.glusterfs.is_some()),
        ("flocker", spec.flocker.is_some()),
        ("nfs", spec.nfs.is_some()),
        ("rbd", spec.rbd.is_some()),
        ("quobyte", spec.quobyte.is_some()),
        ("cephfs", spec.cephfs.is_some()),
        ("iscsi", spec.iscsi.is_some()),
        ("cinder", spec.cinder.is_some()),
        ("fc", spec.fc.is_some()),
        ("flexVolume", spec.flex_volume.is_some()),
        ("azureFile", spec.azure_file.is_some()),
        ("vsphereVolume", spec.vsphere_volume.is_some()),
        (
            "photonPersistentDisk",
            spec.photon_persistent_disk.is_some(),
        ),
        ("portworxVolume", spec.portworx_volume.is_some()),
        ("azureDisk", spec.azure_disk.is_some()),
        ("scaleIO", spec.scale_io.is_some()),
        ("local", spec.local.is_some()),
        ("storageos", spec.storageos.is_some()),
        ("csi", spec.csi.is_some()),
    ];
    present
        .into_iter()
        .filter(|(_, p)| *p)
        .map(|(n, _)| n)
        .collect()
}

const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];

fn no_backsteps(p: &str, path: &Path) -> ErrorList {
    if p.split('/').any(|c| c == "..") {
        vec![FieldError::invalid_str(path, p, "must not contain '..'")]
    } else {
        Vec::new()
    }
}

fn pv_spec(spec: &core::PersistentVolumeSpec, path: &Path) -> ErrorList {
    let mut errs = access_modes(slice(&spec.access_modes), &path.child("accessModes"), "");
    let cap = spec.capacity.clone().unwrap_or_default();
    let cp = path.child("capacity");
    if cap.is_empty() {
        errs.push(FieldError::required(&cp, ""));
    }
    if !cap.contains_key("storage") || cap.len() > 1 {
        errs.push(FieldError::not_supported(
            &cp,
            &go_quantities(&cap),
            &["storage"],
        ));
    }
    for (k, q) in &cap {
        errs.extend(positive_quantity(q, &cp.key(k)));
    }
    let found = sources(spec);
    match found.as_slice() {
        [] => errs.push(FieldError::required(path, "must specify a volume type")),
        [_, more @ ..] => {
            for m in more {
                errs.push(FieldError::forbidden(
                    path.child(m),
                    "may not specify more than 1 volume type",
                ));
            }
        }
    }
    if let Some(hp) = &spec.host_path {
        let hpp = path.child("hostPath");
        if hp.path.is_empty() {
            errs.push(FieldError::required(hpp.child("path"), ""));
        } else {
            errs.extend(no_backsteps(&hp.path, &hpp.child("path")));
        }
        let t = s(&hp.type_);
        if !HOST_PATH_TYPES.contains(&t) {
            errs.push(FieldError::not_supported(
                hpp.child("type"),
                t,
                &HOST_PATH_TYPES[1..],
            ));
        }
    }
    if let Some(l) = &spec.local {
        let lp = path.child("local").child("path");
        if l.path.is_empty() {
            errs.push(FieldError::required(&lp, ""));
        } else {
            if !l.path.starts_with('/') {
                errs.push(FieldError::invalid_str(
                    &lp,
                    &l.path,
                    "must be an absolute path",
                ));
            }
            errs.extend(no_backsteps(&l.path, &lp));
        }
        if spec.node_affinity.is_none() {
            errs.push(FieldError::required(
                path.child("nodeAffinity"),
                "Local volume requires node affinity",
            ));
        }
    }
    if let Some(na) = &spec.node_affinity
        && na.required.is_none()
    {
        errs.push(FieldError::required(
            path.child("nodeAffinity").child("required"),
            "must specify required node constraints",
        ));
    }
    let policy = s(&spec.persistent_volume_reclaim_policy);
    if !policy.is_empty() && !PV_RECLAIM_POLICIES.contains(&policy) {
        errs.push(FieldError::not_supported(
            path.child("persistentVolumeReclaimPolicy"),
            policy,
            PV_RECLAIM_POLICIES,
        ));
    }
    let class = s(&spec.storage_class_name);
    if !class.is_empty() {
        errs.extend(dns1123_subdomain(class, &path.child("storageClassName")));
    }
    errs.extend(volume_mode(&spec.volume_mode, &path.child("volumeMode")));
    errs
}

/// ValidatePersistentVolume / ValidatePersistentVolumeUpdate.
pub fn persistent_volume(
    pv: &core::PersistentVolume,
    old: Option<&core::PersistentVolume>,
) -> ErrorList {
    let mut errs = meta(
        &pv.metadata,
        old.map(|o| &o.metadata),
        false,
        names::name_is_dns_subdomain,
    );
    let spec = pv.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    errs.extend(pv_spec(&spec, &path));
    if let Some(old) = old {
        let os = old.spec.clone().unwrap_or_default();
        // The volume source may not change (everything but the fields below).
        let source = |sp: &core::PersistentVolumeSpec| {
            let mut c = sp.clone();
            c.access_modes = None;
            c.capacity = None;
            c.claim_ref = None;
            c.mount_options = None;
            c.node_affinity = None;
            c.persistent_volume_reclaim_policy = None;
            c.storage_class_name = None;
            c.volume_mode = None;
            c.volume_attributes_class_name = None;
            c
        };
        if source(&spec) != source(&os) {
            errs.push(FieldError::forbidden(
                path.child("persistentvolumesource"),
                "spec.persistentvolumesource is immutable after creation",
            ));
        }
        errs.extend(immutable(
            &spec.volume_mode,
            &os.volume_mode,
            &path.child("volumeMode"),
            || quote_opt(&spec.volume_mode),
        ));
        if os.node_affinity.is_some() {
            errs.extend(immutable(
                &spec.node_affinity,
                &os.node_affinity,
                &path.child("nodeAffinity"),
                || "<object>".to_string(),
            ));
        }
    }
    errs
}

fn quote_opt(v: &Option<String>) -> String {
    match v {
        Some(s) => ferry_apimachinery::errors::quote(s),
        None => "null".to_string(),
    }
}

/// ValidatePersistentVolumeStatusUpdate.
pub fn persistent_volume_status(
    pv: &core::PersistentVolume,
    old: &core::PersistentVolume,
) -> ErrorList {
    let mut errs = validate_object_meta_update(&pv.metadata, &old.metadata, &Path::new("metadata"));
    if let Some(p) = pv.status.as_ref().and_then(|s| s.phase.as_deref()) {
        let phases = ["Available", "Bound", "Failed", "Pending", "Released"];
        if !phases.contains(&p) {
            errs.push(FieldError::not_supported(
                Path::new("status").child("phase"),
                p,
                &phases,
            ));
        }
    }
    errs
}

fn pvc_spec(spec: &core::PersistentVolumeClaimSpec, path: &Path) -> ErrorList {
    let mut errs = access_modes(
        slice(&spec.access_modes),
        &path.child("accessModes"),
        "at least 1 access mode is required",
    );
    if let Some(sel) = &spec.selector {
        errs.extend(super::common::validate_label_selector(
            Some(sel),
            &path.child("selector"),
        ));
    }
    let rp = path.child("resources").key("storage");
    match spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
    {
        None => errs.push(FieldError::required(&rp, "")),
        Some(q) => errs.extend(positive_quantity(q, &rp)),
    }
    let class = s(&spec.storage_class_name);
    if !class.is_empty() {
        errs.extend(dns1123_subdomain(class, &path.child("storageClassName")));
    }
    errs.extend(volume_mode(&spec.volume_mode, &path.child("volumeMode")));
    errs
}

fn storage_request(c: &core::PersistentVolumeClaim) -> Option<quantity::Quantity> {
    c.spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .and_then(|q| quantity::parse(&q.0).ok())
}

/// ValidatePersistentVolumeClaim / ValidatePersistentVolumeClaimUpdate: the spec is immutable
/// but for `volumeName` set once (binding), a class set once, and a larger storage request of
/// a bound claim (expansion).
pub fn persistent_volume_claim(
    c: &core::PersistentVolumeClaim,
    old: Option<&core::PersistentVolumeClaim>,
) -> ErrorList {
    let mut errs = meta(
        &c.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = c.spec.clone().unwrap_or_default();
    errs.extend(pvc_spec(&spec, &Path::new("spec")));
    let Some(old) = old else {
        return errs;
    };
    let os = old.spec.clone().unwrap_or_default();
    let mut new_clone = spec.clone();
    if s(&os.volume_name).is_empty() {
        new_clone.volume_name = os.volume_name.clone();
    }
    if os.storage_class_name.is_none() {
        new_clone.storage_class_name = None;
    }
    let bound = old.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if bound && let (Some(n), Some(o)) = (new_clone.resources.as_mut(), os.resources.as_ref()) {
        let old_storage = o.requests.as_ref().and_then(|r| r.get("storage")).cloned();
        if let Some(r) = n.requests.as_mut() {
            match old_storage {
                Some(q) => {
                    r.insert("storage".into(), q);
                }
                None => {
                    r.remove("storage");
                }
            }
        }
    }
    new_clone.volume_attributes_class_name = os.volume_attributes_class_name.clone();
    if new_clone != os {
        errs.push(FieldError::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    if bound {
        let capacity = old
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .and_then(|q| quantity::parse(&q.0).ok());
        if let (Some(new), Some(cap)) = (storage_request(c), capacity)
            && new < cap
            && storage_request(old).is_some_and(|o| new < o)
        {
            errs.push(FieldError::forbidden(
                "spec.resources.requests.storage",
                "field can not be less than status.capacity",
            ));
        }
    }
    errs.extend(immutable(
        &spec.volume_mode,
        &os.volume_mode,
        &Path::new("spec").child("volumeMode"),
        || quote_opt(&spec.volume_mode),
    ));
    errs
}

/// ValidatePersistentVolumeClaimStatusUpdate.
pub fn persistent_volume_claim_status(
    c: &core::PersistentVolumeClaim,
    old: &core::PersistentVolumeClaim,
) -> ErrorList {
    let mut errs = validate_object_meta_update(&c.metadata, &old.metadata, &Path::new("metadata"));
    let st = c.status.clone().unwrap_or_default();
    let sp = Path::new("status");
    if let Some(p) = st.phase.as_deref() {
        let phases = ["Bound", "Lost", "Pending"];
        if !phases.contains(&p) {
            errs.push(FieldError::not_supported(sp.child("phase"), p, &phases));
        }
    }
    for (k, q) in st.capacity.iter().flatten() {
        if let Err(e) = quantity::parse(&q.0) {
            errs.push(FieldError::invalid(
                sp.child("capacity").key(k),
                q.0.clone(),
                e.to_string(),
            ));
        }
    }
    errs
}

/// ValidateStorageClass / ValidateStorageClassUpdate.
pub fn storage_class(sc: &storage::StorageClass, old: Option<&storage::StorageClass>) -> ErrorList {
    let mut errs = meta(
        &sc.metadata,
        old.map(|o| &o.metadata),
        false,
        names::name_is_dns_subdomain,
    );
    let pp = Path::new("provisioner");
    if sc.provisioner.is_empty() {
        errs.push(FieldError::required(&pp, ""));
    } else {
        errs.extend(qualified_name(&sc.provisioner.to_lowercase(), &pp));
    }
    for k in sc.parameters.iter().flat_map(|p| p.keys()) {
        if k.is_empty() {
            errs.push(FieldError::invalid(
                "parameters",
                "",
                "field can not be empty.",
            ));
        }
    }
    let rp = s(&sc.reclaim_policy);
    if !rp.is_empty() && !SC_RECLAIM_POLICIES.contains(&rp) {
        errs.push(FieldError::not_supported(
            "reclaimPolicy",
            rp,
            SC_RECLAIM_POLICIES,
        ));
    }
    match sc.volume_binding_mode.as_deref() {
        None => errs.push(FieldError::required("volumeBindingMode", "")),
        Some(m) if !BINDING_MODES.contains(&m) => {
            errs.push(FieldError::not_supported(
                "volumeBindingMode",
                m,
                BINDING_MODES,
            ));
        }
        Some(_) => {}
    }
    if let Some(old) = old {
        if sc.parameters != old.parameters {
            errs.push(FieldError::forbidden(
                "parameters",
                "updates to parameters are forbidden.",
            ));
        }
        if sc.provisioner != old.provisioner {
            errs.push(FieldError::forbidden(
                "provisioner",
                "updates to provisioner are forbidden.",
            ));
        }
        if sc.reclaim_policy != old.reclaim_policy {
            errs.push(FieldError::forbidden(
                "reclaimPolicy",
                "updates to reclaimPolicy are forbidden.",
            ));
        }
        errs.extend(immutable(
            &sc.volume_binding_mode,
            &old.volume_binding_mode,
            &Path::new("volumeBindingMode"),
            || quote_opt(&sc.volume_binding_mode),
        ));
    }
    errs
}

/// ValidateReplicationController / ValidateReplicationControllerUpdate.
pub fn replication_controller(
    rc: &core::ReplicationController,
    old: Option<&core::ReplicationController>,
) -> ErrorList {
    let mut errs = meta(
        &rc.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = rc.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    errs.extend(nonneg(
        i64::from(spec.replicas.unwrap_or(0)),
        &path.child("replicas"),
    ));
    errs.extend(nonneg(
        i64::from(spec.min_ready_seconds.unwrap_or(0)),
        &path.child("minReadySeconds"),
    ));
    let selector = spec.selector.clone().unwrap_or_default();
    let sp = path.child("selector");
    if selector.is_empty() {
        errs.push(FieldError::required(&sp, ""));
    } else {
        errs.extend(validate_labels(Some(&selector), &sp));
    }
    let tp = path.child("template");
    match &spec.template {
        None => errs.push(FieldError::required(&tp, "")),
        Some(t) => {
            let labels = t.metadata.as_ref().and_then(|m| m.labels.clone());
            let lbl = labels.clone().unwrap_or_default();
            if !selector.is_empty() && !selector.iter().all(|(k, v)| lbl.get(k) == Some(v)) {
                errs.push(FieldError::invalid(
                    tp.child("metadata").child("labels"),
                    go_map(labels.as_ref()),
                    "`selector` does not match template `labels`",
                ));
            }
            errs.extend(validate_pod_template_spec(t, &tp));
            let ps = t.spec.clone().unwrap_or_default();
            let rp = s(&ps.restart_policy);
            if rp != "Always" {
                errs.push(FieldError::not_supported(
                    tp.child("spec").child("restartPolicy"),
                    rp,
                    &["Always"],
                ));
            }
            if ps.active_deadline_seconds.is_some() {
                errs.push(FieldError::forbidden(
                    tp.child("spec").child("activeDeadlineSeconds"),
                    "activeDeadlineSeconds in ReplicationController is not Supported",
                ));
            }
        }
    }
    errs
}

/// ValidateReplicationControllerStatusUpdate.
pub fn replication_controller_status(
    rc: &core::ReplicationController,
    old: &core::ReplicationController,
) -> ErrorList {
    let mut errs = validate_object_meta_update(&rc.metadata, &old.metadata, &Path::new("metadata"));
    let st = rc.status.clone().unwrap_or_default();
    let sp = Path::new("status");
    errs.extend(nonneg(i64::from(st.replicas), &sp.child("replicas")));
    for (n, v) in [
        ("fullyLabeledReplicas", st.fully_labeled_replicas),
        ("readyReplicas", st.ready_replicas),
        ("availableReplicas", st.available_replicas),
    ] {
        let v = v.unwrap_or(0);
        errs.extend(nonneg(i64::from(v), &sp.child(n)));
        if v > st.replicas {
            errs.push(FieldError::invalid(
                sp.child(n),
                v.to_string(),
                "cannot be greater than status.replicas",
            ));
        }
    }
    errs.extend(nonneg(
        st.observed_generation.unwrap_or(0),
        &sp.child("observedGeneration"),
    ));
    if st.available_replicas.unwrap_or(0) > st.ready_replicas.unwrap_or(0) {
        errs.push(FieldError::invalid(
            sp.child("availableReplicas"),
            st.available_replicas.unwrap_or(0).to_string(),
            "cannot be greater than readyReplicas",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn fields<T: serde::de::DeserializeOwned>(
        v: Value,
        f: impl Fn(&T) -> ErrorList,
    ) -> Vec<(String, String)> {
        let o: T = serde_json::from_value(v).expect("decodes");
        f(&o)
            .into_iter()
            .map(|e| (e.field.clone(), e.body()))
            .collect()
    }

    fn pvc(spec: Value) -> Value {
        json!({"metadata": {"name": "c", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn claim_create_table() {
        let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
            (
                pvc(
                    json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}),
                ),
                vec![],
            ),
            (
                pvc(json!({"resources": {"requests": {"storage": "1Gi"}}})),
                vec![(
                    "spec.accessModes",
                    "Required value: at least 1 access mode is required",
                )],
            ),
            (
                pvc(json!({"accessModes": ["ReadWriteOnce"]})),
                vec![("spec.resources[storage]", "Required value")],
            ),
            (
                pvc(
                    json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "0"}}}),
                ),
                vec![(
                    "spec.resources[storage]",
                    "Invalid value: \"0\": must be greater than zero",
                )],
            ),
            (
                pvc(
                    json!({"accessModes": ["Sometimes"], "resources": {"requests": {"storage": "1"}}}),
                ),
                vec![(
                    "spec.accessModes",
                    "Unsupported value: \"Sometimes\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"",
                )],
            ),
            (
                pvc(
                    json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1"}}, "volumeMode": "Disk"}),
                ),
                vec![(
                    "spec.volumeMode",
                    "Unsupported value: \"Disk\": supported values: \"Block\", \"Filesystem\"",
                )],
            ),
        ];
        for (obj, want) in cases {
            let got = fields(obj.clone(), |c: &core::PersistentVolumeClaim| {
                persistent_volume_claim(c, None)
            });
            let want: Vec<(String, String)> = want
                .into_iter()
                .map(|(f, m)| (f.to_string(), m.to_string()))
                .collect();
            assert_eq!(got, want, "{obj}");
        }
    }

    #[test]
    fn claim_update_table() {
        let base = json!({"metadata": {"name": "c", "namespace": "default", "resourceVersion": "1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut v = base.clone();
            f(&mut v);
            v
        };
        let bound = |v: &mut Value| {
            v["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"}});
        };
        let immutable = "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims";
        let cases: Vec<(Value, Value, Vec<&str>)> = vec![
            // Binding sets volumeName once.
            (
                base.clone(),
                with(&|v| v["spec"]["volumeName"] = json!("pv1")),
                vec![],
            ),
            // Not once more.
            (
                with(&|v| v["spec"]["volumeName"] = json!("pv1")),
                with(&|v| v["spec"]["volumeName"] = json!("pv2")),
                vec![immutable],
            ),
            // Growth of a bound claim.
            (
                with(&bound),
                with(&|v| {
                    bound(v);
                    v["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
                }),
                vec![],
            ),
            // Growth of an unbound claim.
            (
                base.clone(),
                with(&|v| v["spec"]["resources"]["requests"]["storage"] = json!("2Gi")),
                vec![immutable],
            ),
            (
                base.clone(),
                with(&|v| v["spec"]["accessModes"] = json!(["ReadWriteMany"])),
                vec![immutable],
            ),
            // Shrinking below the capacity.
            (
                with(&bound),
                with(&|v| {
                    bound(v);
                    v["spec"]["resources"]["requests"]["storage"] = json!("512Mi");
                }),
                vec!["Forbidden: field can not be less than status.capacity"],
            ),
        ];
        for (old, new, want) in cases {
            let o: core::PersistentVolumeClaim = serde_json::from_value(old).expect("old");
            let got: Vec<String> = fields(new.clone(), |c: &core::PersistentVolumeClaim| {
                persistent_volume_claim(c, Some(&o))
            })
            .into_iter()
            .map(|(_, m)| m)
            .collect();
            assert_eq!(got, want, "{new}");
        }
    }

    #[test]
    fn volume_table() {
        let pv = |spec: Value| json!({"metadata": {"name": "v"}, "spec": spec});
        let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
            (
                pv(
                    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/d"}}),
                ),
                vec![],
            ),
            (
                pv(json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]})),
                vec![("spec", "Required value: must specify a volume type")],
            ),
            (
                pv(
                    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "hostPath": {"path": "/d"}, "nfs": {"server": "s", "path": "/p"}}),
                ),
                vec![(
                    "spec.nfs",
                    "Forbidden: may not specify more than 1 volume type",
                )],
            ),
            (
                pv(json!({"accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/d"}})),
                vec![
                    ("spec.capacity", "Required value"),
                    (
                        "spec.capacity",
                        "Unsupported value: \"map[]\": supported values: \"storage\"",
                    ),
                ],
            ),
            (
                pv(
                    json!({"capacity": {"storage": "1Gi"}, "hostPath": {"path": "/d"}, "persistentVolumeReclaimPolicy": "Keep"}),
                ),
                vec![
                    ("spec.accessModes", "Required value"),
                    (
                        "spec.persistentVolumeReclaimPolicy",
                        "Unsupported value: \"Keep\": supported values: \"Delete\", \"Recycle\", \"Retain\"",
                    ),
                ],
            ),
            (
                pv(
                    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "local": {"path": "/d"}}),
                ),
                vec![(
                    "spec.nodeAffinity",
                    "Required value: Local volume requires node affinity",
                )],
            ),
        ];
        for (obj, want) in cases {
            let got = fields(obj.clone(), |v: &core::PersistentVolume| {
                persistent_volume(v, None)
            });
            let want: Vec<(String, String)> = want
                .into_iter()
                .map(|(f, m)| (f.to_string(), m.to_string()))
                .collect();
            assert_eq!(got, want, "{obj}");
        }
    }

    #[test]
    fn storage_class_table() {
        let sc = json!({"metadata": {"name": "fast", "resourceVersion": "1"}, "provisioner": "ferry.dev/local-path",
            "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate", "parameters": {"a": "b"}});
        let got = fields(sc.clone(), |c: &storage::StorageClass| {
            storage_class(c, None)
        });
        assert!(got.is_empty(), "{got:?}");
        let mut no_prov = sc.clone();
        no_prov["provisioner"] = json!("");
        let got = fields(no_prov, |c: &storage::StorageClass| storage_class(c, None));
        assert_eq!(
            got,
            vec![("provisioner".to_string(), "Required value".to_string())]
        );
        let old: storage::StorageClass = serde_json::from_value(sc.clone()).expect("sc");
        let mut upd = sc.clone();
        upd["parameters"] = json!({"a": "c"});
        upd["reclaimPolicy"] = json!("Retain");
        upd["volumeBindingMode"] = json!("WaitForFirstConsumer");
        let got: Vec<String> = fields(upd, |c: &storage::StorageClass| {
            storage_class(c, Some(&old))
        })
        .into_iter()
        .map(|(f, m)| format!("{f}: {m}"))
        .collect();
        assert_eq!(
            got,
            vec![
                "parameters: Forbidden: updates to parameters are forbidden.",
                "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
                "volumeBindingMode: Invalid value: \"WaitForFirstConsumer\": field is immutable",
            ]
        );
    }

    #[test]
    fn replication_controller_table() {
        let rc = |selector: Value, labels: Value| {
            json!({"metadata": {"name": "r", "namespace": "default"}, "spec": {"replicas": 1, "selector": selector,
                "template": {"metadata": {"labels": labels}, "spec": {"restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "c", "image": "i", "imagePullPolicy": "Always", "terminationMessagePolicy": "File"}]}}}})
        };
        let ok = fields(
            rc(json!({"a": "b"}), json!({"a": "b"})),
            |r: &core::ReplicationController| replication_controller(r, None),
        );
        assert!(ok.is_empty(), "{ok:?}");
        let bad = fields(
            rc(json!({"a": "b"}), json!({"a": "c"})),
            |r: &core::ReplicationController| replication_controller(r, None),
        );
        assert_eq!(
            bad,
            vec![(
                "spec.template.metadata.labels".to_string(),
                "Invalid value: map[string]string{\"a\":\"c\"}: `selector` does not match template `labels`".to_string()
            )]
        );
        let none = fields(
            rc(json!({}), json!({"a": "c"})),
            |r: &core::ReplicationController| replication_controller(r, None),
        );
        assert_eq!(
            none,
            vec![("spec.selector".to_string(), "Required value".to_string())]
        );
    }
}
