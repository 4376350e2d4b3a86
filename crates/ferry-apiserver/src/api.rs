//! The REST handlers: get, list, create, update, patch, delete, deletecollection, watch, and the
//! `/status` and `/scale` subresources, for every kind in the registry.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_api::kinds::{KindInfo, StatusOnCreate, Strategy};
use ferry_store::{Store, StoreError};
use serde_json::{Value, json};

use crate::cache::{Cache, CachedObject, ResourceCache, set_resource_version};
use crate::objects::{self, meta_mut};
use crate::request::{Query, ResourcePath, Want};
use crate::rv;
use crate::status::{ApiError, success_status};
use crate::table;
use retry::{Attempt, Outcome, update_with_retry};

mod binding;
pub mod deletion;
mod filter;
mod list;
mod namespace;
mod retry;
pub mod strategy;
#[cfg(test)]
mod tests;

pub use filter::Filter;
pub use strategy::RestStrategy;

/// One served resource: its strategy and where it lives in the store.
pub struct Resource {
    pub strategy: &'static dyn Strategy,
    /// `/registry/services/` or `/registry/apps/deployments/`.
    pub prefix: String,
    /// Objects are served exactly as cached ([`Strategy::on_read`] never changes them): true
    /// for built-in kinds with their own store; false for custom kinds and kinds stored as
    /// another (`events.k8s.io` Events).
    pub as_stored: bool,
}

impl Resource {
    pub fn info(&self) -> &'static KindInfo {
        self.strategy.info()
    }
    /// The kind's REST hooks ([`strategy::REGISTRY`]).
    pub fn rest(&self) -> &'static dyn RestStrategy {
        strategy::for_kind(self.info())
    }
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.info().namespaced => format!("{}{}/{}", self.prefix, ns, name),
            _ => format!("{}{}", self.prefix, name),
        }
    }
    /// The key prefix of a list: the whole resource, or one namespace.
    pub fn list_prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.info().namespaced => format!("{}{}/", self.prefix, ns),
            _ => self.prefix.clone(),
        }
    }
}

/// The store prefix of a built-in kind: its own, or the one of the kind it shares a store with
/// (`events.k8s.io` Events live under the core Events' keys, as upstream).
pub fn kind_prefix(s: &dyn ferry_api::kinds::Strategy) -> String {
    match s.store_as() {
        Some(("", plural)) => format!("/registry/{plural}/"),
        Some((group, plural)) => format!("/registry/{group}/{plural}/"),
        None => store_prefix(s.info()),
    }
}

pub fn store_prefix(info: &KindInfo) -> String {
    if info.group.is_empty() {
        format!("/registry/{}/", info.plural)
    } else {
        format!("/registry/{}/{}/", info.group, info.plural)
    }
}

/// A successful answer.
pub enum Reply {
    /// A JSON body with a status code and optional warnings.
    Json {
        code: u16,
        body: Bytes,
        content_type: &'static str,
        warnings: Vec<String>,
    },
    /// A watch stream.
    Stream {
        content_type: &'static str,
        rx: tokio::sync::mpsc::Receiver<Bytes>,
    },
}

impl Reply {
    pub fn json(code: u16, v: &Value) -> Reply {
        Reply::Json {
            code,
            body: Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
            content_type: "application/json",
            warnings: Vec::new(),
        }
    }
    pub fn with_warnings(mut self, w: Vec<String>) -> Reply {
        if let Reply::Json { warnings, .. } = &mut self {
            *warnings = w;
        }
        self
    }
    /// Puts `w` before the warnings the reply already has.
    pub fn add_warnings(mut self, mut w: Vec<String>) -> Reply {
        if let Reply::Json { warnings, .. } = &mut self
            && !w.is_empty()
        {
            w.append(warnings);
            *warnings = w;
        }
        self
    }
}

pub type ApiResult = Result<Reply, ApiError>;

/// The shared state of the REST layer.
pub struct Api {
    pub store: Arc<dyn Store>,
    pub cache: Arc<Cache>,
    resources: HashMap<(String, String, String), Arc<Resource>>,
    /// The resources of custom kinds, kept by the CRD controller ([`crate::crd`]).
    pub crds: crate::crd::Registry,
    /// ClusterIP and NodePort allocation for Services.
    pub services: crate::alloc::ServiceAlloc,
}

/// How a write treats unknown fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

fn field_validation(q: &Query) -> Result<FieldValidation, ApiError> {
    match q.get("fieldValidation") {
        None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
        Some("Strict") => Ok(FieldValidation::Strict),
        Some("Ignore") => Ok(FieldValidation::Ignore),
        Some(v) => Err(ApiError::bad_request(format!(
            "fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\", got {v:?}"
        ))),
    }
}

/// Duplicate keys in a JSON create or update body (upstream's strict decoding): 400 under
/// `fieldValidation=Strict`, warnings under `Warn` (the default), nothing under `Ignore`.
pub fn duplicate_fields(
    res: &Resource,
    q: &Query,
    content_type: &str,
    body: &[u8],
) -> Result<Vec<String>, ApiError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    if !matches!(ct, "" | "application/json" | "*/*") {
        return Ok(Vec::new());
    }
    let dups = crate::strict::duplicate_fields(body);
    if dups.is_empty() {
        return Ok(Vec::new());
    }
    let msgs: Vec<String> = dups
        .iter()
        .map(|d| format!("duplicate field \"{d}\""))
        .collect();
    let info = res.info();
    match field_validation(q)? {
        FieldValidation::Strict => Err(ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
            info.kind,
            info.version,
            info.kind,
            msgs.join(", ")
        ))),
        FieldValidation::Warn => Ok(msgs),
        FieldValidation::Ignore => Ok(Vec::new()),
    }
}

const CONSISTENT_READ_WAIT: Duration = Duration::from_secs(5);

impl Api {
    pub fn new(store: Arc<dyn Store>, cache: Arc<Cache>) -> Api {
        let mut resources = HashMap::new();
        for s in ferry_api::kinds::all() {
            let info = s.info();
            resources.insert(
                (
                    info.group.to_string(),
                    info.version.to_string(),
                    info.plural.to_string(),
                ),
                Arc::new(Resource {
                    strategy: s.as_ref(),
                    prefix: kind_prefix(s.as_ref()),
                    as_stored: s.store_as().is_none(),
                }),
            );
        }
        Api {
            store,
            cache,
            resources,
            crds: Default::default(),
            services: crate::alloc::ServiceAlloc::default(),
        }
    }

    /// Uses these service CIDRs and node port range for allocation.
    pub fn with_service_alloc(mut self, services: crate::alloc::ServiceAlloc) -> Api {
        self.services = services;
        self
    }

    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<Resource>> {
        self.resources
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    pub fn resource_for_kind(&self, api_version: &str, kind: &str) -> Option<&Arc<Resource>> {
        self.resources
            .values()
            .find(|r| r.info().api_version() == api_version && r.info().kind == kind)
    }

    pub fn all_prefixes() -> Vec<String> {
        let mut prefixes: Vec<String> = ferry_api::kinds::all()
            .iter()
            .map(|s| kind_prefix(s.as_ref()))
            .collect();
        prefixes.sort();
        prefixes.dedup();
        prefixes
    }

    fn rc(&self, res: &Resource) -> Result<Arc<ResourceCache>, ApiError> {
        self.cache
            .resource(&res.prefix)
            .ok_or_else(|| ApiError::internal("resource cache missing"))
    }

    /// Waits until the cache has reached `revision`; 504 "Too large resource version" after
    /// [`rv::TOO_LARGE_WAIT`], as upstream's cacher answers.
    async fn wait_fresh(&self, revision: ferry_store::Revision) -> Result<(), ApiError> {
        if self.cache.wait_for(revision, rv::TOO_LARGE_WAIT).await {
            Ok(())
        } else {
            Err(rv::too_large(revision, self.cache.revision()))
        }
    }

    /// Waits until the cache reflects every write acknowledged so far (a consistent read).
    async fn consistent(&self) -> Result<(), ApiError> {
        let rev = self.store.current_revision().await?;
        if self.cache.wait_for(rev, CONSISTENT_READ_WAIT).await {
            Ok(())
        } else {
            Err(ApiError::new(
                504,
                "Timeout",
                "Timeout: too large resource version or the watch cache is behind",
            ))
        }
    }

    // ----- reads -----

    pub async fn get(&self, res: &Resource, p: &ResourcePath, q: &Query, want: Want) -> ApiResult {
        let name = p.name.as_deref().unwrap_or("");
        if !matches!(q.get("resourceVersion"), Some("0")) {
            self.consistent().await?;
        }
        let key = res.key(p.namespace.as_deref(), name);
        let obj = self
            .rc(res)?
            .get(&key)
            .ok_or_else(|| ApiError::not_found(res.info(), name))?;
        let obj = served_object(res, &obj);
        match p.subresource.as_deref() {
            None | Some("status") => {}
            Some("ephemeralcontainers")
                if res.info().group.is_empty() && res.info().kind == "Pod" => {}
            Some("scale") if res.info().scale_subresource => {
                return Ok(Reply::json(200, &scale_of(res.strategy, &obj.value())));
            }
            Some(_) => return Err(ApiError::not_found_path()),
        }
        match want {
            Want::Table { v1beta1 } => {
                let t = table::build(
                    res.strategy,
                    &[obj],
                    q,
                    &self.cache.revision().to_string(),
                    v1beta1,
                );
                Ok(table_reply(&t))
            }
            // PartialObjectMetadata is cut from the object by the server, as for every
            // single-object answer (`metadata::object_reply`).
            Want::Json | Want::Metadata { .. } => Ok(Reply::Json {
                code: 200,
                body: obj.bytes.clone(),
                content_type: "application/json",
                warnings: Vec::new(),
            }),
        }
    }

    pub fn selectors(&self, q: &Query) -> Result<Filter, ApiError> {
        Filter::parse(q)
    }

    // ----- writes -----

    /// Decodes a body into the kind's normalised JSON; applies `fieldValidation`.
    fn decode_body(
        &self,
        res: &Resource,
        body: Value,
        q: &Query,
        warnings: &mut Vec<String>,
    ) -> Result<Value, ApiError> {
        let info = res.info();
        if let Some(kind) = body.get("kind").and_then(Value::as_str)
            && !kind.is_empty()
            && kind != info.kind
        {
            return Err(ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: the kind of the object ({}) does not match the kind of the resource ({})",
                info.kind, info.version, info.kind, kind, info.kind
            )));
        }
        if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
            && !av.is_empty()
            && av != info.api_version()
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                info.api_version()
            )));
        }
        let decoded = res.strategy.decode(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {}",
                info.kind, info.version, info.kind, e
            ))
        })?;
        if !decoded.unknown.is_empty() {
            match field_validation(q)? {
                FieldValidation::Strict => {
                    let list = decoded
                        .unknown
                        .iter()
                        .map(|f| format!("unknown field \"{f}\""))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(ApiError::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                        info.kind, info.version, info.kind, list
                    )));
                }
                FieldValidation::Warn => {
                    warnings.extend(
                        decoded
                            .unknown
                            .iter()
                            .map(|f| format!("unknown field \"{f}\"")),
                    );
                }
                FieldValidation::Ignore => {}
            }
        } else {
            field_validation(q)?;
        }
        Ok(decoded.object)
    }

    /// 404 when the namespace of a namespaced object does not exist, 403 when it is being
    /// terminated (upstream's NamespaceLifecycle admission).
    pub(crate) async fn check_namespace(
        &self,
        res: &Resource,
        ns: Option<&str>,
    ) -> Result<(), ApiError> {
        if !res.info().namespaced {
            return Ok(());
        }
        let ns = ns.unwrap_or("");
        let key = format!("/registry/namespaces/{ns}");
        match self.store.get(&key).await? {
            None => Err(ApiError::namespace_not_found(ns)),
            Some(kv) => {
                let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
                if objects::is_deleting(&v) {
                    Err(ApiError::forbidden(format!(
                        "{} \"{}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                        res.info().plural,
                        "",
                        ns
                    ))
                    .with_details(json!({"name": "", "kind": res.info().plural, "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]})))
                } else {
                    Ok(())
                }
            }
        }
    }

    pub async fn create(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Value,
    ) -> ApiResult {
        self.create_inner(res, p, q, body, true).await
    }

    /// `record_update`: record the writer as an `Update` manager (not for server-side apply,
    /// whose `Apply` entry is already in the object).
    async fn create_inner(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Value,
        record_update: bool,
    ) -> ApiResult {
        let info = res.info();
        let mut warnings = Vec::new();
        let mut obj = self.decode_body(res, body, q, &mut warnings)?;
        let dry_run = q.dry_run()?;
        // Namespace from the URL.
        let url_ns = p.namespace.clone();
        // How admission names the object in a refusal: its name, else its generateName.
        let requested_name = {
            let m = obj.get("metadata");
            let get = |k: &str| {
                m.and_then(|m| m.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            Some(get("name"))
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| get("generateName"))
        };
        {
            let m = meta_mut(&mut obj);
            if info.namespaced {
                let body_ns = m
                    .get("namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let ns = url_ns.clone().unwrap_or_default();
                if !body_ns.is_empty() && body_ns != ns {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            if m.get("resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(ApiError::bad_request(
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            let name = m
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if name.is_empty()
                && let Some(g) = m
                    .get("generateName")
                    .and_then(Value::as_str)
                    .filter(|g| !g.is_empty())
            {
                let g = g.to_string();
                m.insert(
                    "name".into(),
                    json!(format!("{}{}", g, objects::random_suffix())),
                );
            }
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("resourceVersion");
            m.remove("selfLink");
            if info.generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        if info.status_subresource
            && info.status_on_create == StatusOnCreate::Reset
            && let Value::Object(m) = &mut obj
        {
            m.remove("status");
        }
        res.strategy.prepare_create(&mut obj);
        res.strategy.default(&mut obj);
        // Admission and allocation of the kind (a Pod's ServiceAccount, a Service's addresses
        // and node ports claimed in the store before validation and the write, released if
        // either fails).
        let rest = res.rest();
        let cx = strategy::CreateContext {
            api: self,
            res,
            namespace: url_ns.as_deref(),
            requested_name: &requested_name,
            dry_run,
        };
        let txn = rest.admit_create(cx, &mut obj).await?;
        let name = objects::name(&obj).to_string();
        let key = res.key(url_ns.as_deref(), &name);
        let mut errs = res.strategy.validate(&obj, None);
        if name.is_empty() && errs.is_empty() {
            errs.push(ferry_api::errors::FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        }
        if !errs.is_empty() {
            if let Some(t) = txn {
                t.rollback().await;
            }
            return Err(ApiError::invalid(info, &name, &errs));
        }
        if txn.is_none() {
            self.check_namespace(res, url_ns.as_deref()).await?;
        }
        ferry_api::shape::fill_always_present(info, &mut obj);
        if record_update {
            let manager = q.get("fieldManager").unwrap_or("");
            crate::managed::record(&mut obj, None, manager, "Update", None, info);
        }
        if dry_run {
            if let Some(t) = txn {
                t.rollback().await;
            }
            if self.store.get(&key).await?.is_some() {
                return Err(ApiError::already_exists(info, &name));
            }
            return Ok(Reply::json(201, &obj).with_warnings(warnings));
        }
        let stored = res.strategy.to_storage(&obj);
        let bytes = match serde_json::to_vec(stored.as_ref().unwrap_or(&obj)) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                if let Some(t) = txn {
                    t.rollback().await;
                }
                return Err(ApiError::internal(e.to_string()));
            }
        };
        let result = self.store.create(&key, bytes).await;
        settle(txn, result.is_ok()).await;
        match result {
            Ok(kv) => {
                set_resource_version(&mut obj, kv.mod_revision);
                Ok(Reply::json(201, &obj).with_warnings(warnings))
            }
            Err(StoreError::AlreadyExists) => Err(ApiError::already_exists(info, &name)),
            Err(e) => Err(e.into()),
        }
    }

    /// PUT of the main resource or of `/status`.
    pub async fn update(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Value,
    ) -> ApiResult {
        let mut warnings = Vec::new();
        let new = self.decode_body(res, body, q, &mut warnings)?;
        let name = p.name.clone().unwrap_or_default();
        check_name_matches(&new, &name, p.namespace.as_deref(), res.info())?;
        let precondition = objects::meta_str(&new, "resourceVersion")
            .filter(|s| !s.is_empty())
            .map(String::from);
        let sub = p.subresource.clone();
        let reply = self
            .guaranteed_update(
                res,
                p,
                q,
                precondition,
                res.rest().allow_create_on_update(),
                move |_old| Ok(new.clone()),
                sub.as_deref(),
                true,
            )
            .await?;
        Ok(reply.with_warnings(warnings))
    }

    /// The read-modify-write loop shared by PUT and PATCH. `mutate` gets the current object
    /// (None if absent) and returns the desired one.
    #[allow(clippy::too_many_arguments)]
    pub async fn guaranteed_update(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        precondition_rv: Option<String>,
        create_if_missing: bool,
        mutate: impl Fn(Option<&Value>) -> Result<Value, ApiError>,
        subresource: Option<&str>,
        record_update: bool,
    ) -> ApiResult {
        let info = res.info();
        let rest = res.rest();
        let name = p.name.clone().unwrap_or_default();
        let key = res.key(p.namespace.as_deref(), &name);
        let dry_run = q.dry_run()?;
        let manager = q.get("fieldManager").unwrap_or("").to_string();
        for _attempt in 0..16 {
            let current = self.store.get(&key).await?;
            let Some(kv) = current else {
                if create_if_missing && subresource.is_none() {
                    let desired = mutate(None)?;
                    let has_apply_entry = desired
                        .pointer("/metadata/managedFields")
                        .and_then(Value::as_array)
                        .is_some_and(|a| {
                            a.iter().any(|e| {
                                e.get("operation").and_then(Value::as_str) == Some("Apply")
                            })
                        });
                    return self
                        .create_inner(res, p, q, desired, !has_apply_entry)
                        .await;
                }
                return Err(ApiError::not_found(info, &name));
            };
            let mut old: Value =
                serde_json::from_slice(&kv.value).map_err(|e| ApiError::internal(e.to_string()))?;
            if let Some(v) = res.strategy.on_read(&old) {
                old = v;
            }
            set_resource_version(&mut old, kv.mod_revision);
            if let Some(rv) = &precondition_rv
                && rv != &kv.mod_revision.to_string()
            {
                return Err(ApiError::conflict(info, &name));
            }
            let mut new = mutate(Some(&old))?;
            if let Some(rv) = objects::meta_str(&new, "resourceVersion")
                && !rv.is_empty()
                && rv != kv.mod_revision.to_string()
            {
                return Err(ApiError::conflict(info, &name));
            }
            let errs;
            match subresource {
                Some("status") => {
                    // Only status changes; everything else comes from the stored object.
                    let status = new.get("status").cloned();
                    let mut merged = old.clone();
                    if let Value::Object(m) = &mut merged {
                        match status {
                            Some(s) => {
                                m.insert("status".into(), s);
                            }
                            None => {
                                m.remove("status");
                            }
                        }
                    }
                    new = merged;
                    errs = res.strategy.validate_status(&new, &old);
                }
                Some("ephemeralcontainers") if info.group.is_empty() && info.kind == "Pod" => {
                    // Only spec.ephemeralContainers changes (upstream's ephemeral containers
                    // strategy); the containers are defaulted as a pod's.
                    new = crate::ephemeral::merge(&new, &old);
                    res.strategy.default(&mut new);
                    errs = crate::ephemeral::validate(&new, &old);
                }
                Some(_) => return Err(ApiError::not_found_path()),
                None => {
                    prepare_update_meta(&mut new, &old, info)?;
                    if info.status_subresource
                        && let Value::Object(m) = &mut new
                    {
                        match old.get("status") {
                            Some(s) => {
                                m.insert("status".into(), s.clone());
                            }
                            None => {
                                m.remove("status");
                            }
                        }
                    }
                    res.strategy.prepare_update(&mut new, &old);
                    res.strategy.default(&mut new);
                    rest.prepare_update(&mut new, &old);
                    if info.generation && objects::spec_part(&new) != objects::spec_part(&old) {
                        let g = objects::meta(&old)
                            .and_then(|m| m.get("generation"))
                            .and_then(Value::as_i64)
                            .unwrap_or(0);
                        meta_mut(&mut new).insert("generation".into(), json!(g + 1));
                    }
                    errs = res
                        .strategy
                        .validate(&new, Some(&old))
                        .into_iter()
                        .filter(|e| !rest.deferred(e))
                        .collect();
                }
            }
            if !errs.is_empty() {
                return Err(ApiError::invalid(info, &name, &errs));
            }
            ferry_api::shape::fill_always_present(info, &mut new);
            if record_update {
                crate::managed::record(&mut new, Some(&old), &manager, "Update", subresource, info);
            }
            // A no-op write changes nothing and keeps the resourceVersion; only managed-field
            // timestamps do not count as a change (upstream's managed-fields timestamp
            // transformer), but a change of the managed fields themselves does (kubectl's
            // client-side to server-side apply migration patches just those).
            if unchanged_but_times(&new, &old) {
                return Ok(Reply::json(200, &old));
            }
            // Removing the last finalizer of an object being deleted deletes it; a pod in
            // graceful termination stays until its agent deletes it with grace 0 (upstream's
            // ShouldDeleteDuringUpdate).
            if deletion::finalized(
                objects::is_deleting(&new),
                new.pointer("/metadata/deletionGracePeriodSeconds")
                    .and_then(Value::as_i64),
                &objects::finalizers(&new),
                &rest.spec_finalizers(&new),
            ) {
                if dry_run {
                    return Ok(Reply::json(200, &new));
                }
                let Some(rev) = self.remove(res, &key, kv.mod_revision, &old, &name).await? else {
                    continue;
                };
                set_resource_version(&mut new, rev);
                return Ok(Reply::json(200, &new));
            }
            // Services: claim new addresses / node ports before the write, free unused after.
            let txn = if subresource.is_none() {
                rest.begin_update(self, res, &mut new, &old, dry_run)
                    .await?
            } else {
                None
            };
            if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            if dry_run {
                if let Some(t) = txn {
                    t.rollback().await;
                }
                set_resource_version(&mut new, kv.mod_revision);
                return Ok(Reply::json(200, &new));
            }
            let stored = res.strategy.to_storage(&new);
            let result = match serde_json::to_vec(stored.as_ref().unwrap_or(&new)) {
                Ok(b) => {
                    self.store
                        .update(&key, Bytes::from(b), kv.mod_revision)
                        .await
                }
                Err(e) => Err(StoreError::Internal(e.to_string())),
            };
            settle(txn, result.is_ok()).await;
            match result {
                Ok(nkv) => {
                    set_resource_version(&mut new, nkv.mod_revision);
                    return Ok(Reply::json(200, &new));
                }
                Err(StoreError::Conflict { .. }) => {
                    if precondition_rv.is_some() {
                        return Err(ApiError::conflict(info, &name));
                    }
                    continue;
                }
                Err(StoreError::NotFound) => return Err(ApiError::not_found(info, &name)),
                Err(e) => return Err(e.into()),
            }
        }
        Err(ApiError::conflict(info, &name))
    }

    /// Removes an object for good (compare-and-swap on `expected`) and frees what it held
    /// (a Service's addresses and node ports). `Ok(None)`: another writer won; re-read.
    async fn remove(
        &self,
        res: &Resource,
        key: &str,
        expected: i64,
        last: &Value,
        name: &str,
    ) -> Result<Option<i64>, ApiError> {
        let info = res.info();
        let Some((_, rev)) = cas(self.store.delete(key, Some(expected)).await, info, name)? else {
            return Ok(None);
        };
        res.rest().after_remove(self, last).await;
        Ok(Some(rev))
    }

    // ----- delete -----

    pub async fn delete(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Option<Value>,
    ) -> ApiResult {
        let reply = self.delete_stored(res, p, q, body).await?;
        Ok(served_reply(res, reply))
    }

    /// [`Api::delete`] answering with the object as stored.
    async fn delete_stored(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Option<Value>,
    ) -> ApiResult {
        let info = res.info();
        let name = p.name.clone().unwrap_or_default();
        let opts = DeleteOptions::parse(q, body.as_ref())?;
        let key = res.key(p.namespace.as_deref(), &name);
        let decide = |mut obj: Value, rev: i64| {
            set_resource_version(&mut obj, rev);
            if let Some(uid) = &opts.precondition_uid
                && uid != objects::uid(&obj)
            {
                return Err(ApiError::conflict_msg(
                    info,
                    &name,
                    &format!(
                        "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                        uid,
                        objects::uid(&obj)
                    ),
                ));
            }
            if let Some(rv) = &opts.precondition_rv
                && rv != &rev.to_string()
            {
                return Err(ApiError::conflict_msg(
                    info,
                    &name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {}, ResourceVersion in object meta: {}",
                        rv, rev
                    ),
                ));
            }
            let finalizers = objects::finalizers(&obj);
            let spec_finalizers = res.rest().spec_finalizers(&obj);
            let plan = deletion::plan(&deletion::DeleteRequest {
                finalizers: &finalizers,
                spec_finalizers: &spec_finalizers,
                propagation: opts.propagation.as_deref(),
                graceful: res.rest().graceful_delete(&obj, opts.grace_period),
                deleting: objects::is_deleting(&obj),
                current_grace: objects::meta(&obj)
                    .and_then(|m| m.get("deletionGracePeriodSeconds"))
                    .and_then(Value::as_i64),
            });
            // Deferred deletion marks the object; finalizers (or the node agent) finish it.
            let (finalizers, code) = match plan {
                deletion::DeletePlan::Remove => {
                    if opts.dry_run {
                        return Ok(Attempt::Answer(delete_reply(info, &obj, true)));
                    }
                    return Ok(Attempt::Remove(obj, 200));
                }
                deletion::DeletePlan::Unchanged { code } => {
                    return Ok(Attempt::Answer(Reply::json(code, &obj)));
                }
                deletion::DeletePlan::Mark {
                    finalizers,
                    grace,
                    set_timestamp,
                    code,
                } => {
                    let m = meta_mut(&mut obj);
                    if set_timestamp {
                        m.insert(
                            "deletionTimestamp".into(),
                            json!(objects::rfc3339_in(grace)),
                        );
                    }
                    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                    if let Some(g) = m.get("generation").and_then(Value::as_i64)
                        && info.generation
                    {
                        m.insert("generation".into(), json!(g + 1));
                    }
                    m.remove("resourceVersion");
                    (finalizers, code)
                }
            };
            objects::set_finalizers(&mut obj, &finalizers);
            if opts.dry_run {
                return Ok(Attempt::Answer(Reply::json(200, &obj)));
            }
            Ok(Attempt::Update(obj, code))
        };
        match update_with_retry(self.store.as_ref(), info, &key, &name, decide).await? {
            Outcome::Answered(reply) => Ok(reply),
            Outcome::Updated(obj, code) => Ok(Reply::json(code, &obj)),
            Outcome::Removed(obj, _) => {
                res.rest().after_remove(self, &obj).await;
                Ok(delete_reply(info, &obj, true))
            }
        }
    }

    pub async fn delete_collection(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Option<Value>,
    ) -> ApiResult {
        let filter = Filter::parse(q)?;
        self.consistent().await?;
        let items = filter.apply(
            res,
            self.rc(res)?.list(&res.list_prefix(p.namespace.as_deref())),
        )?;
        let mut deleted = Vec::new();
        for o in items {
            let mut ip = p.clone();
            ip.name = Some(o.name().to_string());
            ip.namespace = if res.info().namespaced {
                Some(o.namespace().to_string())
            } else {
                None
            };
            match self.delete(res, &ip, q, body.clone()).await {
                Ok(_) => deleted.push(o.value()),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let info = res.info();
        Ok(Reply::json(
            200,
            &json!({"kind": info.list_kind(), "apiVersion": info.api_version(), "metadata": {"resourceVersion": self.cache.revision().to_string()}, "items": deleted}),
        ))
    }

    // ----- patch -----

    pub async fn patch(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        content_type: &str,
        body: &[u8],
    ) -> ApiResult {
        let info = res.info();
        let ct = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let is_apply = ct == "application/apply-patch+yaml" || ct == "application/apply-patch+cbor";
        // Custom resources have no patch strategies: upstream refuses strategic merge patches.
        if ct == "application/strategic-merge-patch+json"
            && self
                .crds
                .resource(info.group, info.version, info.plural)
                .is_some()
        {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {ct})"
                ),
            ));
        }
        let patch: Value = if is_apply {
            crate::body::parse_yaml_or_json(body)?
        } else {
            crate::body::parse_json(body, "patch")?
        };
        if is_apply && q.get("fieldManager").is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml requests require fieldManager to be specified",
            ));
        }
        let force = q.flag("force");
        if force && !is_apply {
            return Err(ApiError::bad_request(
                "force may not be specified for non-apply patch",
            ));
        }
        let precondition = patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(String::from);
        let mut warnings = Vec::new();
        let warnings_cell = std::sync::Mutex::new(Vec::<String>::new());
        let manager = q.get("fieldManager").unwrap_or("").to_string();
        let sub = p.subresource.clone();
        if sub.as_deref() == Some("scale") {
            return self.patch_scale(res, p, q, &ct, &patch).await;
        }
        let api_version = info.api_version();
        let mutate = |old: Option<&Value>| -> Result<Value, ApiError> {
            let patched = match old {
                None => {
                    if !is_apply {
                        return Err(ApiError::not_found(info, p.name.as_deref().unwrap_or("")));
                    }
                    crate::patching::apply(None, &patch, &manager, force, &api_version, info.kind)?
                }
                Some(old) => {
                    let base = old.clone();
                    match ct.as_str() {
                        "application/merge-patch+json" => crate::patching::merge(&base, &patch)?,
                        "application/json-patch+json" => {
                            crate::patching::json_patch(&base, &patch)?
                        }
                        "application/strategic-merge-patch+json" => {
                            crate::patching::strategic(&base, &patch, &api_version, info.kind)?
                        }
                        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                            crate::patching::apply(
                                Some(&base),
                                &patch,
                                &manager,
                                force,
                                &api_version,
                                info.kind,
                            )?
                        }
                        other => return Err(ApiError::unsupported_media(other)),
                    }
                }
            };
            // A patch may not rename or move the object (upstream: 400 BadRequest).
            check_name_matches(
                &patched,
                p.name.as_deref().unwrap_or(""),
                p.namespace.as_deref(),
                info,
            )?;
            let mut w = Vec::new();
            let decoded = self.decode_body(res, patched, q, &mut w)?;
            if let Ok(mut cell) = warnings_cell.lock() {
                cell.extend(w);
            }
            Ok(decoded)
        };
        let reply = self
            .guaranteed_update(
                res,
                p,
                q,
                precondition,
                is_apply,
                mutate,
                sub.as_deref(),
                !is_apply,
            )
            .await?;
        if let Ok(mut cell) = warnings_cell.lock() {
            warnings.append(&mut cell);
        }
        warnings.dedup();
        Ok(reply.with_warnings(warnings))
    }

    async fn patch_scale(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        ct: &str,
        patch: &Value,
    ) -> ApiResult {
        if !res.info().scale_subresource {
            return Err(ApiError::not_found_path());
        }
        self.write_scale(res, p, q, None, |scale| {
            let patched = match ct {
                "application/json-patch+json" => crate::patching::json_patch(scale, patch)?,
                _ => crate::patching::merge(scale, patch)?,
            };
            Ok(patched
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0))
        })
        .await
    }

    pub async fn update_scale(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        body: Value,
    ) -> ApiResult {
        let replicas = body
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let precondition = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(String::from);
        self.write_scale(res, p, q, precondition, |_| Ok(replicas))
            .await
    }

    /// Writes `spec.replicas` through `/scale`: `replicas` computes the count from the current
    /// Scale; the answer is the resulting Scale.
    async fn write_scale(
        &self,
        res: &Resource,
        p: &ResourcePath,
        q: &Query,
        precondition: Option<String>,
        replicas: impl Fn(&Value) -> Result<i64, ApiError>,
    ) -> ApiResult {
        let info = res.info();
        let name = p.name.as_deref().unwrap_or("");
        let mut main = p.clone();
        main.subresource = None;
        let reply = self
            .guaranteed_update(
                res,
                &main,
                q,
                precondition,
                false,
                |old| {
                    let old = old.ok_or_else(|| ApiError::not_found(info, name))?;
                    let n = replicas(&scale_of(res.strategy, old))?;
                    if n < 0 {
                        return Err(ApiError::invalid(
                            info,
                            name,
                            &[ferry_api::errors::FieldError::invalid(
                                "spec.replicas",
                                n.to_string(),
                                "must be greater than or equal to 0",
                            )],
                        ));
                    }
                    let mut new = old.clone();
                    match res.strategy.scale_paths() {
                        Some((spec, ..)) => {
                            ferry_crd::jsonpath::set(spec, &mut new, json!(n));
                        }
                        None => new["spec"]["replicas"] = json!(n),
                    }
                    Ok(new)
                },
                None,
                true,
            )
            .await?;
        match reply {
            Reply::Json { body, .. } => {
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                Ok(Reply::json(200, &scale_of(res.strategy, &v)))
            }
            other => Ok(other),
        }
    }
}

/// Ends a Service write's address and port claims: kept (and the ones no longer used freed)
/// when the write went through, given back when it did not.
async fn settle(txn: Option<crate::alloc::Txn<'_>>, written: bool) {
    match txn {
        Some(t) if written => t.commit().await,
        Some(t) => t.rollback().await,
        None => {}
    }
}

/// One compare-and-swap write's outcome: `Ok(Some(x))` written, `Ok(None)` another writer won
/// (re-read and try again), `Err` the final answer (404 when the object went away).
fn cas<T>(r: ferry_store::Result<T>, info: &KindInfo, name: &str) -> Result<Option<T>, ApiError> {
    match r {
        Ok(x) => Ok(Some(x)),
        Err(StoreError::Conflict { .. }) => Ok(None),
        Err(StoreError::NotFound) => Err(ApiError::not_found(info, name)),
        Err(e) => Err(e.into()),
    }
}

/// Whether `new` equals `old` up to the resourceVersion and managed-field timestamps.
fn unchanged_but_times(new: &Value, old: &Value) -> bool {
    let plain = |v: &Value| {
        let mut c = strip_managed_time(v);
        if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        c
    };
    plain(new) == plain(old)
}

fn strip_managed_time(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(Value::Array(a)) = c.pointer_mut("/metadata/managedFields") {
        for e in a {
            if let Value::Object(m) = e {
                m.remove("time");
            }
        }
    }
    c
}

fn check_name_matches(
    new: &Value,
    name: &str,
    ns: Option<&str>,
    info: &KindInfo,
) -> Result<(), ApiError> {
    let n = objects::name(new);
    if !n.is_empty() && n != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    if info.namespaced {
        let bns = objects::namespace(new);
        if !bns.is_empty() && Some(bns) != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    Ok(())
}

/// Carries over the metadata the server owns (upstream `BeforeUpdate`).
fn prepare_update_meta(new: &mut Value, old: &Value, info: &KindInfo) -> Result<(), ApiError> {
    let old_meta = objects::meta(old).cloned().unwrap_or_default();
    let name = objects::name(old).to_string();
    let m = meta_mut(new);
    if let Some(uid) = m
        .get("uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        && Some(uid) != old_meta.get("uid").and_then(Value::as_str)
    {
        return Err(ApiError::conflict_msg(
            info,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                uid,
                old_meta.get("uid").and_then(Value::as_str).unwrap_or("")
            ),
        ));
    }
    for k in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old_meta.get(k) {
            Some(v) => {
                m.insert(k.to_string(), v.clone());
            }
            None => {
                m.remove(k);
            }
        }
    }
    if !m.contains_key("managedFields")
        && let Some(mf) = old_meta.get("managedFields")
    {
        m.insert("managedFields".into(), mf.clone());
    }
    Ok(())
}

fn delete_reply(info: &KindInfo, obj: &Value, gone: bool) -> Reply {
    if gone && !info.delete_returns_object {
        Reply::json(
            200,
            &success_status(info, objects::name(obj), objects::uid(obj)),
        )
    } else {
        Reply::json(200, obj)
    }
}

fn table_reply(t: &Value) -> Reply {
    Reply::Json {
        code: 200,
        body: Bytes::from(serde_json::to_vec(t).unwrap_or_default()),
        content_type: "application/json;as=Table;v=v1;g=meta.k8s.io",
        warnings: Vec::new(),
    }
}

/// A reply carrying a stored object (not a `Status`) as the kind serves it.
fn served_reply(res: &Resource, reply: Reply) -> Reply {
    let Reply::Json {
        code,
        body,
        content_type,
        warnings,
    } = reply
    else {
        return reply;
    };
    let converted = serde_json::from_slice::<Value>(&body)
        .ok()
        .filter(|v| v.get("kind").and_then(Value::as_str) != Some("Status"))
        .and_then(|v| res.strategy.on_read(&v))
        .and_then(|v| serde_json::to_vec(&v).ok());
    Reply::Json {
        code,
        body: converted.map(Bytes::from).unwrap_or(body),
        content_type,
        warnings,
    }
}

/// The object as served: a custom kind's stored object in the requested version, with its
/// schema's defaults ([`Strategy::on_read`]); other kinds as cached.
pub fn served_object(res: &Resource, o: &Arc<CachedObject>) -> Arc<CachedObject> {
    if res.as_stored {
        return o.clone();
    }
    res.strategy
        .on_read(&o.value())
        .and_then(|v| CachedObject::from_value(&v, o.revision))
        .unwrap_or_else(|| o.clone())
}

/// The `autoscaling/v1` Scale of an object: from a custom kind's scale paths, or as
/// [`to_scale`].
pub fn scale_of(strategy: &dyn Strategy, v: &Value) -> Value {
    let Some((spec, status, selector)) = strategy.scale_paths() else {
        return to_scale(strategy.info(), v);
    };
    let int = |p: &str| {
        ferry_crd::jsonpath::get(p, v)
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let mut scale = to_scale(strategy.info(), v);
    scale["spec"] = json!({"replicas": int(spec)});
    scale["status"] = json!({"replicas": int(status)});
    if let Some(sel) = selector
        .and_then(|p| ferry_crd::jsonpath::get(p, v))
        .and_then(Value::as_str)
    {
        scale["status"]["selector"] = json!(sel);
    }
    scale
}

/// An `autoscaling/v1` Scale for a Deployment or ReplicaSet.
pub fn to_scale(info: &KindInfo, v: &Value) -> Value {
    // A ReplicationController's selector is the label map itself.
    let selector = v
        .pointer("/spec/selector/matchLabels")
        .or_else(|| {
            (info.group.is_empty() && info.kind == "ReplicationController")
                .then(|| v.pointer("/spec/selector"))
                .flatten()
        })
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{}={}", k, v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": objects::name(v),
            "namespace": objects::namespace(v),
            "uid": objects::uid(v),
            "resourceVersion": objects::meta_str(v, "resourceVersion").unwrap_or(""),
            "creationTimestamp": objects::meta_str(v, "creationTimestamp"),
        },
        "spec": {"replicas": v.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0)},
        "status": {
            "replicas": v.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": selector,
        }
    })
}

/// DeleteOptions from the body or the query.
#[derive(Debug, Default)]
pub struct DeleteOptions {
    pub propagation: Option<String>,
    pub grace_period: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    pub fn parse(q: &Query, body: Option<&Value>) -> Result<DeleteOptions, ApiError> {
        let mut o = DeleteOptions {
            dry_run: q.dry_run()?,
            ..Default::default()
        };
        o.propagation = q
            .get("propagationPolicy")
            .filter(|s| !s.is_empty())
            .map(String::from);
        o.grace_period = q.int("gracePeriodSeconds")?;
        if let Some(orphan) = q.get("orphanDependents")
            && o.propagation.is_none()
        {
            o.propagation = Some(if orphan == "true" {
                "Orphan".into()
            } else {
                "Background".into()
            });
        }
        if let Some(b) = body.filter(|b| b.is_object()) {
            if let Some(p) = b.get("propagationPolicy").and_then(Value::as_str) {
                o.propagation = Some(p.to_string());
            }
            if let Some(g) = b.get("gracePeriodSeconds").and_then(Value::as_i64) {
                o.grace_period = Some(g);
            }
            if let Some(orphan) = b.get("orphanDependents").and_then(Value::as_bool)
                && o.propagation.is_none()
            {
                o.propagation = Some(if orphan {
                    "Orphan".into()
                } else {
                    "Background".into()
                });
            }
            if let Some(pre) = b.get("preconditions") {
                o.precondition_uid = pre.get("uid").and_then(Value::as_str).map(String::from);
                o.precondition_rv = pre
                    .get("resourceVersion")
                    .and_then(Value::as_str)
                    .map(String::from);
            }
            if let Some(d) = b.get("dryRun").and_then(Value::as_array)
                && d.iter().any(|x| x.as_str() == Some("All"))
            {
                o.dry_run = true;
            }
        }
        if let Some(p) = &o.propagation
            && !matches!(p.as_str(), "Foreground" | "Background" | "Orphan")
        {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                ),
            ));
        }
        if o.grace_period.is_some_and(|g| g < 0) {
            o.grace_period = Some(1);
        }
        Ok(o)
    }
}
