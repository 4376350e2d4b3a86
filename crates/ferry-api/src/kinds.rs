//! The registry of served kinds. Adding a kind is one `register!` line naming its strategy
//! functions (defaulting, validation, prepare hooks, Table columns and row, field selectors).

use std::sync::OnceLock;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::decode::{DecodeError, Decoded, decode, encode};
use crate::errors::ErrorList;
use crate::{defaults, hooks, printers, selectors, validation};

/// What happens to `status` in a create request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusOnCreate {
    /// Status is cleared (most kinds with a status subresource).
    Reset,
    /// Status is kept as sent (Node, and kinds without a status subresource).
    Keep,
}

/// Static facts about one served kind.
#[derive(Debug, Clone)]
pub struct KindInfo {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Has a `/status` subresource: the main resource ignores status changes and `/status`
    /// ignores everything but status (and metadata labels/annotations as upstream allows).
    pub status_subresource: bool,
    pub status_on_create: StatusOnCreate,
    /// `metadata.generation` is set to 1 on create and bumped when anything but metadata or status
    /// changes.
    pub generation: bool,
    /// DELETE answers with the object (true) or with a `Status` Success (false) when the object
    /// is gone at once.
    pub delete_returns_object: bool,
    /// The `/scale` subresource exists.
    pub scale_subresource: bool,
}

impl KindInfo {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    /// `services` or `deployments.apps`: how upstream names the resource in messages.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

pub use ferry_printers::Column;

/// The behaviour of one kind on JSON values. Implemented by [`Typed`] for every served kind.
pub trait Strategy: Send + Sync {
    fn info(&self) -> &KindInfo;
    /// Reads the value as the kind's type; returns the normalised value and unknown field paths.
    fn decode(&self, value: &Value) -> Result<Decoded<Value>, DecodeError>;
    /// Fills defaults (after decoding).
    fn default(&self, value: &mut Value);
    /// Kind-specific changes on create (e.g. a Namespace's phase); runs before validation.
    fn prepare_create(&self, value: &mut Value);
    /// Kind-specific changes on update of the main resource; runs before validation.
    fn prepare_update(&self, new: &mut Value, old: &Value);
    /// Validation of a create (`old` = None) or an update of the main resource.
    fn validate(&self, value: &Value, old: Option<&Value>) -> ErrorList;
    /// Validation of a `/status` update.
    fn validate_status(&self, value: &Value, old: &Value) -> ErrorList;
    fn columns(&self) -> Vec<Column>;
    fn row(&self, value: &Value) -> Vec<Value>;
    /// The value of a field-selector field other than `metadata.name` / `metadata.namespace`;
    /// `None` when the kind does not support that field.
    fn field(&self, value: &Value, field: &str) -> Option<String>;
    /// The kind's JSON schema (a `$ref` into the generator's definitions).
    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema;
    /// The object as served from storage, when it differs from the stored one (custom kinds:
    /// the apiVersion of the requested version, defaults of its schema). `None`: as stored.
    fn on_read(&self, _value: &Value) -> Option<Value> {
        None
    }
    /// The object as stored, when a write must be stored in another form than it is served
    /// in (`events.k8s.io/v1` Events are stored as `core/v1`). `None`: as served.
    fn to_storage(&self, _value: &Value) -> Option<Value> {
        None
    }
    /// The (group, plural) whose store this kind shares, when not its own.
    fn store_as(&self) -> Option<(&'static str, &'static str)> {
        None
    }
    /// The JSONPaths of a custom kind's `/scale`: spec replicas, status replicas and label
    /// selector. `None`: the built-in `spec.replicas` / `status.replicas` / `spec.selector`.
    fn scale_paths(&self) -> Option<(&str, &str, Option<&str>)> {
        None
    }
}

/// The per-kind functions, on typed objects.
pub struct Hooks<K> {
    pub default: fn(&mut K),
    pub prepare_create: fn(&mut K),
    pub prepare_update: fn(&mut K, &K),
    pub validate: fn(&K, Option<&K>) -> ErrorList,
    pub validate_status: fn(&K, &K) -> ErrorList,
    pub columns: fn() -> Vec<Column>,
    pub row: fn(&K) -> Vec<Value>,
    pub field: fn(&K, &str) -> Option<String>,
}

/// A [`Strategy`] for a `k8s-openapi` (or Ferry) type.
pub struct Typed<K> {
    pub info: KindInfo,
    pub hooks: Hooks<K>,
}

fn typed<K: DeserializeOwned>(v: &Value) -> Option<K> {
    serde_json::from_value(v.clone()).ok()
}

impl<K> Strategy for Typed<K>
where
    K: DeserializeOwned + Serialize + schemars::JsonSchema + Send + Sync + 'static,
{
    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        generator.subschema_for::<K>()
    }
    fn info(&self) -> &KindInfo {
        &self.info
    }
    fn decode(&self, value: &Value) -> Result<Decoded<Value>, DecodeError> {
        let d = decode::<K>(value)?;
        let mut object = encode(&d.object);
        // Keep the identifying fields as sent; the typed round trip drops them for k8s-openapi types.
        if let Value::Object(m) = &mut object {
            m.insert("apiVersion".into(), Value::String(self.info.api_version()));
            m.insert("kind".into(), Value::String(self.info.kind.to_string()));
        }
        let mut unknown = d.unknown;
        if let Some(extra) = extra_fields(&self.info) {
            keep_extra(value, &mut object, extra.paths);
            unknown.retain(|u| !extra.paths.iter().any(|p| covers(p, u)));
        }
        Ok(Decoded { object, unknown })
    }
    fn default(&self, value: &mut Value) {
        if let Some(mut k) = typed::<K>(value) {
            (self.hooks.default)(&mut k);
            merge_back(value, encode(&k), &self.info);
        }
    }
    fn prepare_create(&self, value: &mut Value) {
        if let Some(mut k) = typed::<K>(value) {
            (self.hooks.prepare_create)(&mut k);
            merge_back(value, encode(&k), &self.info);
        }
    }
    fn prepare_update(&self, new: &mut Value, old: &Value) {
        if let (Some(mut k), Some(o)) = (typed::<K>(new), typed::<K>(old)) {
            (self.hooks.prepare_update)(&mut k, &o);
            merge_back(new, encode(&k), &self.info);
        }
    }
    fn validate(&self, value: &Value, old: Option<&Value>) -> ErrorList {
        let Some(k) = typed::<K>(value) else {
            return Vec::new();
        };
        let o = old.and_then(typed::<K>);
        let mut errs = (self.hooks.validate)(&k, o.as_ref());
        if let Some(extra) = extra_fields(&self.info) {
            errs.extend((extra.validate)(value, old));
        }
        errs
    }
    fn validate_status(&self, value: &Value, old: &Value) -> ErrorList {
        match (typed::<K>(value), typed::<K>(old)) {
            (Some(k), Some(o)) => (self.hooks.validate_status)(&k, &o),
            _ => Vec::new(),
        }
    }
    fn columns(&self) -> Vec<Column> {
        (self.hooks.columns)()
    }
    fn row(&self, value: &Value) -> Vec<Value> {
        match typed::<K>(value) {
            Some(k) => (self.hooks.row)(&k),
            None => Vec::new(),
        }
    }
    fn field(&self, value: &Value, field: &str) -> Option<String> {
        typed::<K>(value).and_then(|k| (self.hooks.field)(&k, field))
    }
}

/// Fields Ferry serves beyond the `k8s-openapi` type of a kind (DESIGN: "types on top of
/// k8s-openapi"): kept through the typed round trips, validated on their own.
pub struct ExtraFields {
    pub group: &'static str,
    pub kind: &'static str,
    /// JSON pointers (`/spec/topologyKeys`).
    pub paths: &'static [&'static str],
    pub validate: fn(&Value, Option<&Value>) -> ErrorList,
}

/// Service `spec.topologyKeys` (seed 004: topology-aware traffic routing with topology keys),
/// removed from upstream's types in 1.22 but part of the system Ferry implements.
pub const EXTRA_FIELDS: &[ExtraFields] = &[ExtraFields {
    group: "",
    kind: "Service",
    paths: &["/spec/topologyKeys"],
    validate: validation::service_topology_keys,
}];

pub fn extra_fields(info: &KindInfo) -> Option<&'static ExtraFields> {
    EXTRA_FIELDS
        .iter()
        .find(|e| e.group == info.group && e.kind == info.kind)
}

/// Does the JSON pointer `ptr` name the dotted field path `field` or one inside it?
fn covers(ptr: &str, field: &str) -> bool {
    let dotted = ptr.trim_start_matches('/').replace('/', ".");
    field == dotted
        || field.starts_with(&format!("{dotted}."))
        || field.starts_with(&format!("{dotted}["))
}

/// Copies the extra fields present in `from` into `to`.
fn keep_extra(from: &Value, to: &mut Value, paths: &[&str]) {
    for p in paths {
        let Some(v) = from.pointer(p).filter(|v| !v.is_null()).cloned() else {
            continue;
        };
        let Some((parent, leaf)) = p.rsplit_once('/') else {
            continue;
        };
        if to.pointer(parent).is_none() {
            continue;
        }
        if let Some(Value::Object(m)) = to.pointer_mut(parent) {
            m.insert(leaf.to_string(), v);
        }
    }
}

fn merge_back(value: &mut Value, mut encoded: Value, info: &KindInfo) {
    if let Some(extra) = extra_fields(info) {
        keep_extra(value, &mut encoded, extra.paths);
    }
    if let Value::Object(m) = &mut encoded {
        m.insert("apiVersion".into(), Value::String(info.api_version()));
        m.insert("kind".into(), Value::String(info.kind.to_string()));
    }
    *value = encoded;
}

fn noop<K>(_: &mut K) {}
fn noop2<K>(_: &mut K, _: &K) {}
fn no_status_validation<K>(_: &K, _: &K) -> ErrorList {
    Vec::new()
}

macro_rules! register {
    ($out:ident, $ty:ty, $f:ident, {
        group: $group:expr, version: $version:expr, kind: $kind:expr, plural: $plural:expr,
        singular: $singular:expr, namespaced: $ns:expr, short: $short:expr, categories: $cat:expr,
        status: $status:expr, status_on_create: $soc:expr, generation: $gen:expr,
        delete_returns_object: $dro:expr, scale: $scale:expr,
        prepare_create: $pc:expr, prepare_update: $pu:expr, validate_status: $vs:expr $(,)?
    }) => {
        $out.push(Box::new(Typed::<$ty> {
            info: KindInfo {
                group: $group,
                version: $version,
                kind: $kind,
                plural: $plural,
                singular: $singular,
                namespaced: $ns,
                short_names: $short,
                categories: $cat,
                status_subresource: $status,
                status_on_create: $soc,
                generation: $gen,
                delete_returns_object: $dro,
                scale_subresource: $scale,
            },
            hooks: Hooks {
                default: defaults::$f,
                prepare_create: $pc,
                prepare_update: $pu,
                validate: validation::$f,
                validate_status: $vs,
                columns: printers::columns::$f,
                row: printers::$f,
                field: selectors::$f,
            },
        }));
    };
}

use StatusOnCreate::{Keep, Reset};
use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::api::storage::v1 as storage;

#[allow(clippy::vec_init_then_push)]
fn build() -> Vec<Box<dyn Strategy>> {
    let mut v: Vec<Box<dyn Strategy>> = Vec::new();
    register!(v, core::Namespace, namespace, {
        group: "", version: "v1", kind: "Namespace", plural: "namespaces", singular: "namespace",
        namespaced: false, short: &["ns"], categories: &[], status: true, status_on_create: Reset,
        generation: false, delete_returns_object: true, scale: false,
        prepare_create: hooks::namespace_create, prepare_update: hooks::namespace_update,
        validate_status: validation::namespace_status,
    });
    register!(v, core::Node, node, {
        group: "", version: "v1", kind: "Node", plural: "nodes", singular: "node",
        namespaced: false, short: &["no"], categories: &[], status: true, status_on_create: Keep,
        generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: validation::node_status,
    });
    register!(v, core::Pod, pod, {
        group: "", version: "v1", kind: "Pod", plural: "pods", singular: "pod",
        namespaced: true, short: &["po"], categories: &["all"], status: true, status_on_create: Reset,
        generation: true, delete_returns_object: true, scale: false,
        prepare_create: hooks::pod_create, prepare_update: noop2, validate_status: validation::pod_status,
    });
    register!(v, core::Service, service, {
        group: "", version: "v1", kind: "Service", plural: "services", singular: "service",
        namespaced: true, short: &["svc"], categories: &["all"], status: true, status_on_create: Reset,
        generation: false, delete_returns_object: true, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: validation::service_status,
    });
    register!(v, core::Endpoints, endpoints, {
        group: "", version: "v1", kind: "Endpoints", plural: "endpoints", singular: "endpoints",
        namespaced: true, short: &["ep"], categories: &[], status: false, status_on_create: Keep,
        generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, core::ConfigMap, config_map, {
        group: "", version: "v1", kind: "ConfigMap", plural: "configmaps", singular: "configmap",
        namespaced: true, short: &["cm"], categories: &[], status: false, status_on_create: Keep,
        generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, core::Secret, secret, {
        group: "", version: "v1", kind: "Secret", plural: "secrets", singular: "secret",
        namespaced: true, short: &[], categories: &[], status: false, status_on_create: Keep,
        generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, core::Event, core_event, {
        group: "", version: "v1", kind: "Event", plural: "events", singular: "event",
        namespaced: true, short: &["ev"], categories: &[], status: false, status_on_create: Keep,
        generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, core::ServiceAccount, service_account, {
        group: "", version: "v1", kind: "ServiceAccount", plural: "serviceaccounts", singular: "serviceaccount",
        namespaced: true, short: &["sa"], categories: &[], status: false, status_on_create: Keep,
        generation: false, delete_returns_object: true, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, core::ReplicationController, replication_controller, {
        group: "", version: "v1", kind: "ReplicationController", plural: "replicationcontrollers",
        singular: "replicationcontroller", namespaced: true, short: &["rc"], categories: &["all"],
        status: true, status_on_create: Reset, generation: true, delete_returns_object: false,
        scale: true, prepare_create: noop, prepare_update: noop2,
        validate_status: validation::replication_controller_status,
    });
    register!(v, core::PersistentVolume, persistent_volume, {
        group: "", version: "v1", kind: "PersistentVolume", plural: "persistentvolumes",
        singular: "persistentvolume", namespaced: false, short: &["pv"], categories: &[],
        status: true, status_on_create: Reset, generation: false, delete_returns_object: true,
        scale: false, prepare_create: noop, prepare_update: noop2,
        validate_status: validation::persistent_volume_status,
    });
    register!(v, core::PersistentVolumeClaim, persistent_volume_claim, {
        group: "", version: "v1", kind: "PersistentVolumeClaim", plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim", namespaced: true, short: &["pvc"], categories: &[],
        status: true, status_on_create: Reset, generation: false, delete_returns_object: true,
        scale: false, prepare_create: noop, prepare_update: noop2,
        validate_status: validation::persistent_volume_claim_status,
    });
    register!(v, apps::Deployment, deployment, {
        group: "apps", version: "v1", kind: "Deployment", plural: "deployments", singular: "deployment",
        namespaced: true, short: &["deploy"], categories: &["all"], status: true, status_on_create: Reset,
        generation: true, delete_returns_object: false, scale: true,
        prepare_create: noop, prepare_update: noop2, validate_status: validation::deployment_status,
    });
    register!(v, apps::ReplicaSet, replica_set, {
        group: "apps", version: "v1", kind: "ReplicaSet", plural: "replicasets", singular: "replicaset",
        namespaced: true, short: &["rs"], categories: &["all"], status: true, status_on_create: Reset,
        generation: true, delete_returns_object: false, scale: true,
        prepare_create: noop, prepare_update: noop2, validate_status: validation::replica_set_status,
    });
    register!(v, discovery::EndpointSlice, endpoint_slice, {
        group: "discovery.k8s.io", version: "v1", kind: "EndpointSlice", plural: "endpointslices",
        singular: "endpointslice", namespaced: true, short: &[], categories: &[], status: false,
        status_on_create: Keep, generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, networking::Ingress, ingress, {
        group: "networking.k8s.io", version: "v1", kind: "Ingress", plural: "ingresses", singular: "ingress",
        namespaced: true, short: &["ing"], categories: &[], status: true, status_on_create: Reset,
        generation: true, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: validation::ingress_status,
    });
    register!(v, networking::IngressClass, ingress_class, {
        group: "networking.k8s.io", version: "v1", kind: "IngressClass", plural: "ingressclasses",
        singular: "ingressclass", namespaced: false, short: &[], categories: &[], status: false,
        status_on_create: Keep, generation: true, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, networking::NetworkPolicy, network_policy, {
        group: "networking.k8s.io", version: "v1", kind: "NetworkPolicy", plural: "networkpolicies",
        singular: "networkpolicy", namespaced: true, short: &["netpol"], categories: &[], status: false,
        status_on_create: Keep, generation: true, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, storage::StorageClass, storage_class, {
        group: "storage.k8s.io", version: "v1", kind: "StorageClass", plural: "storageclasses",
        singular: "storageclass", namespaced: false, short: &["sc"], categories: &[], status: false,
        status_on_create: Keep, generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    register!(v, coordination::Lease, lease, {
        group: "coordination.k8s.io", version: "v1", kind: "Lease", plural: "leases", singular: "lease",
        namespaced: true, short: &[], categories: &[], status: false, status_on_create: Keep,
        generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    let mut ev: Vec<Box<dyn Strategy>> = Vec::new();
    register!(ev, events::Event, events_event, {
        group: "events.k8s.io", version: "v1", kind: "Event", plural: "events", singular: "event",
        namespaced: true, short: &["ev"], categories: &[], status: false, status_on_create: Keep,
        generation: false, delete_returns_object: false, scale: false,
        prepare_create: noop, prepare_update: noop2, validate_status: no_status_validation,
    });
    // Served from the core Events' store, as upstream.
    for inner in ev {
        v.push(Box::new(crate::event_convert::StoredAsCore { inner }));
    }
    // Ferry's own kinds carry their strategy functions in their module.
    v.push(Box::new(crate::custom::cluster_cidr_config::strategy()));
    v.push(Box::new(crate::rbac::cluster_role_binding_strategy()));
    v.push(Box::new(crate::rbac::cluster_role_strategy()));
    v.push(Box::new(crate::rbac::role_binding_strategy()));
    v.push(Box::new(crate::rbac::role_strategy()));
    v.push(Box::new(crate::custom::crd::strategy()));
    // Issue 16 workload kinds (their strategy functions live in `workloads`).
    v.push(Box::new(crate::workloads::stateful_set_strategy()));
    v.push(Box::new(crate::workloads::daemon_set_strategy()));
    v.push(Box::new(crate::workloads::controller_revision_strategy()));
    v.push(Box::new(crate::workloads::job_strategy()));
    v.push(Box::new(crate::workloads::cron_job_strategy()));
    v.push(Box::new(crate::workloads::pod_disruption_budget_strategy()));
    v
}

/// Every served kind, in discovery order.
pub fn all() -> &'static [Box<dyn Strategy>] {
    static ALL: OnceLock<Vec<Box<dyn Strategy>>> = OnceLock::new();
    ALL.get_or_init(build)
}

/// Looks a kind up by group, version and plural resource name (built-in kinds, then the custom
/// kinds of established CRDs).
pub fn by_resource(group: &str, version: &str, plural: &str) -> Option<&'static dyn Strategy> {
    all()
        .iter()
        .find(|s| {
            s.info().group == group && s.info().version == version && s.info().plural == plural
        })
        .map(|b| b.as_ref())
        .or_else(|| {
            crate::custom::resource::by_resource(group, version, plural)
                .map(|k| k as &'static dyn Strategy)
        })
}

/// Looks a kind up by apiVersion and kind.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static dyn Strategy> {
    all()
        .iter()
        .find(|s| s.info().api_version() == api_version && s.info().kind == kind)
        .map(|b| b.as_ref())
        .or_else(|| {
            crate::custom::resource::by_kind(api_version, kind).map(|k| k as &'static dyn Strategy)
        })
}
