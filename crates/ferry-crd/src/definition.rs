//! The CustomResourceDefinition itself (apiextensions.k8s.io/v1), on its JSON value: defaulting
//! and validation as upstream's `SetDefaults_*` and `ValidateCustomResourceDefinition`, the
//! naming controller's accepted names and conditions, and [`Definition`], the parsed view the API
//! server serves custom objects from.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::{FieldError, child, index, render, structural};

/// The finalizer that keeps a CRD until its custom objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn strings(v: &Value, ptr: &str) -> Vec<String> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Upstream's defaults: `names.singular` (lower-cased kind), `names.listKind` (`<Kind>List`),
/// `conversion.strategy: None`, and per version the printer columns' priority.
pub fn default_crd(crd: &mut Value) {
    let kind = s(crd, "/spec/names/kind").to_string();
    if let Some(names) = crd
        .pointer_mut("/spec/names")
        .and_then(Value::as_object_mut)
    {
        if names
            .get("singular")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
            && !kind.is_empty()
        {
            names.insert("singular".into(), json!(kind.to_lowercase()));
        }
        if names
            .get("listKind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
            && !kind.is_empty()
        {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) {
        let conv = spec
            .entry("conversion")
            .or_insert_with(|| json!({"strategy": "None"}));
        if let Value::Object(c) = conv
            && c.get("strategy")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
        {
            c.insert("strategy".into(), json!("None"));
        }
        if let Some(Value::Array(versions)) = spec.get_mut("versions") {
            for v in versions {
                if let Some(Value::Array(cols)) = v.get_mut("additionalPrinterColumns") {
                    for c in cols {
                        if let Value::Object(m) = c {
                            m.entry("priority").or_insert(json!(0));
                        }
                    }
                }
            }
        }
    }
}

fn dns1123_subdomain(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 253
        && v.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn dns1035_label(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.as_bytes()[0].is_ascii_lowercase()
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.ends_with('-')
}

const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn check_name(value: &str, path: &str, required: bool, errs: &mut Vec<FieldError>) {
    if value.is_empty() {
        if required {
            errs.push(FieldError::required(path, ""));
        }
        return;
    }
    if !dns1035_label(value) {
        errs.push(FieldError::invalid(
            path,
            render(&json!(value)),
            DNS1035_MSG,
        ));
    }
}

fn check_kind(value: &str, path: &str, errs: &mut Vec<FieldError>) {
    if value.is_empty() {
        errs.push(FieldError::required(path, ""));
        return;
    }
    if !dns1035_label(&value.to_lowercase()) {
        errs.push(FieldError::invalid(
            path,
            render(&json!(value)),
            "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
        ));
    }
}

const COLUMN_TYPES: &[&str] = &["integer", "number", "string", "boolean", "date"];

/// Validates a CRD (create: `old` = None). Field paths as upstream (`spec.versions[0].name`).
pub fn validate_crd(crd: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let group = s(crd, "/spec/group");
    let plural = s(crd, "/spec/names/plural");
    let name = s(crd, "/metadata/name");
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            render(&json!(name)),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else if !dns1123_subdomain(group) {
        errs.push(FieldError::invalid("spec.group", render(&json!(group)), "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
    } else if !group.contains('.') {
        errs.push(FieldError::invalid(
            "spec.group",
            render(&json!(group)),
            "should be a domain with at least one dot",
        ));
    }
    let scope = s(crd, "/spec/scope");
    if scope.is_empty() {
        errs.push(FieldError::required("spec.scope", ""));
    } else if scope != "Cluster" && scope != "Namespaced" {
        errs.push(FieldError::not_supported(
            "spec.scope",
            render(&json!(scope)),
            vec!["\"Cluster\"".into(), "\"Namespaced\"".into()],
        ));
    }
    check_name(plural, "spec.names.plural", true, &mut errs);
    check_name(
        s(crd, "/spec/names/singular"),
        "spec.names.singular",
        true,
        &mut errs,
    );
    check_kind(s(crd, "/spec/names/kind"), "spec.names.kind", &mut errs);
    check_kind(
        s(crd, "/spec/names/listKind"),
        "spec.names.listKind",
        &mut errs,
    );
    if !s(crd, "/spec/names/kind").is_empty()
        && s(crd, "/spec/names/kind") == s(crd, "/spec/names/listKind")
    {
        errs.push(FieldError::invalid(
            "spec.names.listKind",
            render(&json!(s(crd, "/spec/names/listKind"))),
            "kind and listKind may not be the same",
        ));
    }
    for (i, sn) in strings(crd, "/spec/names/shortNames").iter().enumerate() {
        check_name(sn, &index("spec.names.shortNames", i), true, &mut errs);
    }
    for (i, c) in strings(crd, "/spec/names/categories").iter().enumerate() {
        check_name(c, &index("spec.names.categories", i), true, &mut errs);
    }
    let strategy = s(crd, "/spec/conversion/strategy");
    if !strategy.is_empty() && strategy != "None" {
        if strategy == "Webhook" {
            errs.push(FieldError::forbidden(
                "spec.conversion.strategy",
                "Webhook conversion is not supported by this server; use None",
            ));
        } else {
            errs.push(FieldError::not_supported(
                "spec.conversion.strategy",
                render(&json!(strategy)),
                vec!["\"None\"".into(), "\"Webhook\"".into()],
            ));
        }
    }
    if crd
        .pointer("/spec/preserveUnknownFields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        errs.push(FieldError::invalid(
            "spec.preserveUnknownFields",
            "true".into(),
            "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead",
        ));
    }
    validate_versions(crd, &mut errs);
    if let Some(old) = old {
        if s(old, "/spec/scope") != scope {
            errs.push(FieldError::invalid(
                "spec.scope",
                render(&json!(scope)),
                "field is immutable",
            ));
        }
        if s(old, "/spec/group") != group {
            errs.push(FieldError::invalid(
                "spec.group",
                render(&json!(group)),
                "field is immutable",
            ));
        }
        // A version objects may still be stored in cannot be removed (upstream: migrate, then
        // drop it from status.storedVersions first).
        let names: Vec<String> = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .map(|vs| vs.iter().map(|v| s(v, "/name").to_string()).collect())
            .unwrap_or_default();
        for (i, sv) in strings(old, "/status/storedVersions").iter().enumerate() {
            if !names.contains(sv) {
                errs.push(FieldError::invalid(
                    &index("status.storedVersions", i),
                    render(&json!(sv)),
                    "must appear in spec.versions",
                ));
            }
        }
        if s(old, "/spec/names/plural") != plural {
            errs.push(FieldError::invalid(
                "spec.names.plural",
                render(&json!(plural)),
                "field is immutable",
            ));
        }
    }
    errs
}

fn validate_versions(crd: &Value, errs: &mut Vec<FieldError>) {
    let Some(versions) = crd.pointer("/spec/versions").and_then(Value::as_array) else {
        errs.push(FieldError::invalid(
            "spec.versions",
            "null".into(),
            "must have exactly one version marked as storage version",
        ));
        return;
    };
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            "spec.versions",
            "[]".into(),
            "must have exactly one version marked as storage version",
        ));
        return;
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if storage != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            format!("{storage}"),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions
        .iter()
        .any(|v| v.get("served").and_then(Value::as_bool) == Some(true))
    {
        errs.push(FieldError::invalid(
            "spec.versions",
            "[]".into(),
            "must have at least one served version",
        ));
    }
    let mut seen = BTreeSet::new();
    let mut structural_ok = BTreeSet::new();
    for (i, v) in versions.iter().enumerate() {
        let p = index("spec.versions", i);
        let name = s(v, "/name");
        check_name(name, &child(&p, "name"), true, errs);
        if !name.is_empty() && !seen.insert(name.to_string()) {
            errs.push(FieldError::duplicate(
                &child(&p, "name"),
                render(&json!(name)),
            ));
        }
        match v.pointer("/schema/openAPIV3Schema") {
            Some(schema) => {
                let found = structural::check(schema, &format!("{p}.schema.openAPIV3Schema"));
                if found.is_empty() {
                    structural_ok.insert(i);
                }
                errs.extend(found);
            }
            None => errs.push(FieldError::required(
                &format!("{p}.schema.openAPIV3Schema"),
                "schemas are required",
            )),
        }
        if let Some(scale) = v.pointer("/subresources/scale") {
            let sp = format!("{p}.subresources.scale");
            let spec_path = s(scale, "/specReplicasPath");
            if spec_path.is_empty() {
                errs.push(FieldError::required(&child(&sp, "specReplicasPath"), ""));
            } else if !spec_path.starts_with(".spec.")
                || crate::jsonpath::parse(spec_path).is_none()
            {
                errs.push(FieldError::invalid(
                    &child(&sp, "specReplicasPath"),
                    render(&json!(spec_path)),
                    "should be a json path under .spec",
                ));
            }
            let status_path = s(scale, "/statusReplicasPath");
            if status_path.is_empty() {
                errs.push(FieldError::required(&child(&sp, "statusReplicasPath"), ""));
            } else if !status_path.starts_with(".status.")
                || crate::jsonpath::parse(status_path).is_none()
            {
                errs.push(FieldError::invalid(
                    &child(&sp, "statusReplicasPath"),
                    render(&json!(status_path)),
                    "should be a json path under .status",
                ));
            }
            let sel = s(scale, "/labelSelectorPath");
            if !sel.is_empty()
                && (!(sel.starts_with(".spec.") || sel.starts_with(".status."))
                    || crate::jsonpath::parse(sel).is_none())
            {
                errs.push(FieldError::invalid(
                    &child(&sp, "labelSelectorPath"),
                    render(&json!(sel)),
                    "should be a json path under either .spec or .status",
                ));
            }
        }
        if let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) {
            for (j, c) in cols.iter().enumerate() {
                let cp = index(&format!("{p}.additionalPrinterColumns"), j);
                if s(c, "/name").is_empty() {
                    errs.push(FieldError::required(&child(&cp, "name"), ""));
                }
                let t = s(c, "/type");
                if t.is_empty() {
                    errs.push(FieldError::required(&child(&cp, "type"), ""));
                } else if !COLUMN_TYPES.contains(&t) {
                    errs.push(FieldError::not_supported(
                        &child(&cp, "type"),
                        render(&json!(t)),
                        COLUMN_TYPES.iter().map(|x| format!("\"{x}\"")).collect(),
                    ));
                }
                let jp = s(c, "/jsonPath");
                if jp.is_empty() {
                    errs.push(FieldError::required(&child(&cp, "JSONPath"), ""));
                } else if crate::jsonpath::parse(jp).is_none() {
                    errs.push(FieldError::invalid(
                        &child(&cp, "JSONPath"),
                        render(&json!(jp)),
                        "must be a simple json path starting with .",
                    ));
                }
                if c.get("priority").and_then(Value::as_i64).unwrap_or(0) < 0 {
                    errs.push(FieldError::invalid(
                        &child(&cp, "priority"),
                        render(c.get("priority").unwrap_or(&Value::Null)),
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
    }
    // x-kubernetes-validations: compiled (and their cost estimated) on structural schemas
    errs.extend(crate::validations::check_crd(crd, |i| {
        structural_ok.contains(&i)
    }));
}

/// One printer column of a version.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i32,
    pub json_path: String,
}

/// The scale subresource of a version.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// One version of a CRD as served.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    pub deprecated: bool,
    pub deprecation_warning: Option<String>,
    pub schema: Value,
    pub status: bool,
    pub scale: Option<Scale>,
    /// Upstream's default when none are given: `Age` from `.metadata.creationTimestamp`.
    pub columns: Vec<Column>,
    /// `selectableFields[].jsonPath`: extra field-selector fields.
    pub selectable: Vec<String>,
}

/// A CRD as the server serves it: the accepted names (from status) and its versions.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub uid: String,
    pub group: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    pub versions: Vec<Version>,
}

impl Definition {
    /// The served view of a stored CRD, if it is established (names accepted, not being deleted
    /// is checked by the caller). Names come from `status.acceptedNames`.
    pub fn from_crd(crd: &Value) -> Option<Definition> {
        if !is_established(crd) {
            return None;
        }
        let names = crd.pointer("/status/acceptedNames")?;
        let versions = crd
            .pointer("/spec/versions")?
            .as_array()?
            .iter()
            .map(|v| {
                let mut columns: Vec<Column> = v
                    .get("additionalPrinterColumns")
                    .and_then(Value::as_array)
                    .map(|cs| {
                        cs.iter()
                            .map(|c| Column {
                                name: s(c, "/name").to_string(),
                                type_: s(c, "/type").to_string(),
                                format: s(c, "/format").to_string(),
                                description: s(c, "/description").to_string(),
                                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0)
                                    as i32,
                                json_path: s(c, "/jsonPath").to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                if columns.is_empty() {
                    columns.push(Column {
                        name: "Age".into(),
                        type_: "date".into(),
                        format: String::new(),
                        description: "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata".into(),
                        priority: 0,
                        json_path: ".metadata.creationTimestamp".into(),
                    });
                }
                Version {
                    name: s(v, "/name").to_string(),
                    served: v.get("served").and_then(Value::as_bool).unwrap_or(false),
                    storage: v.get("storage").and_then(Value::as_bool).unwrap_or(false),
                    deprecated: v.get("deprecated").and_then(Value::as_bool).unwrap_or(false),
                    deprecation_warning: v
                        .get("deprecationWarning")
                        .and_then(Value::as_str)
                        .map(String::from),
                    schema: v
                        .pointer("/schema/openAPIV3Schema")
                        .cloned()
                        .unwrap_or(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})),
                    status: v.pointer("/subresources/status").is_some(),
                    scale: v.pointer("/subresources/scale").map(|sc| Scale {
                        spec_replicas_path: s(sc, "/specReplicasPath").to_string(),
                        status_replicas_path: s(sc, "/statusReplicasPath").to_string(),
                        label_selector_path: sc
                            .get("labelSelectorPath")
                            .and_then(Value::as_str)
                            .map(String::from),
                    }),
                    columns,
                    selectable: v
                        .get("selectableFields")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                                .map(|p| p.trim_start_matches('.').to_string())
                                .collect()
                        })
                        .unwrap_or_default(),
                }
            })
            .collect();
        Some(Definition {
            name: s(crd, "/metadata/name").to_string(),
            uid: s(crd, "/metadata/uid").to_string(),
            group: s(crd, "/spec/group").to_string(),
            plural: s(names, "/plural").to_string(),
            singular: s(names, "/singular").to_string(),
            kind: s(names, "/kind").to_string(),
            list_kind: s(names, "/listKind").to_string(),
            short_names: strings(names, "/shortNames"),
            categories: strings(names, "/categories"),
            namespaced: s(crd, "/spec/scope") == "Namespaced",
            versions,
        })
    }

    pub fn storage_version(&self) -> Option<&Version> {
        self.versions.iter().find(|v| v.storage)
    }
}

/// Whether the CRD's `Established` condition is `True`.
pub fn is_established(crd: &Value) -> bool {
    condition(crd, "Established").is_some_and(|c| s(c, "/status") == "True")
}

fn condition<'a>(crd: &'a Value, t: &str) -> Option<&'a Value> {
    crd.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| s(c, "/type") == t)
}

/// The names a CRD asks for, conflicting with another CRD of the same group: the reason and
/// message of the `NamesAccepted=False` condition (upstream's naming controller).
fn conflict(crd: &Value, others: &[&Value]) -> Option<(&'static str, String)> {
    let group = s(crd, "/spec/group");
    let me = s(crd, "/metadata/name");
    let same_group: Vec<&&Value> = others
        .iter()
        .filter(|o| s(o, "/spec/group") == group && s(o, "/metadata/name") != me)
        .collect();
    let taken = |f: &dyn Fn(&Value) -> Vec<String>| -> BTreeSet<String> {
        same_group
            .iter()
            .flat_map(|o| f(o.pointer("/status/acceptedNames").unwrap_or(&Value::Null)))
            .collect()
    };
    let one = |p: &'static str| move |n: &Value| vec![s(n, p).to_string()];
    let plural = s(crd, "/spec/names/plural");
    let singular = s(crd, "/spec/names/singular");
    let resources: BTreeSet<String> = taken(&one("/plural"))
        .into_iter()
        .chain(taken(&one("/singular")))
        .chain(taken(&|n: &Value| strings(n, "/shortNames")))
        .collect();
    if resources.contains(plural) {
        return Some(("PluralConflict", format!("\"{plural}\" is already in use")));
    }
    if resources.contains(singular) {
        return Some((
            "SingularConflict",
            format!("\"{singular}\" is already in use"),
        ));
    }
    for sn in strings(crd, "/spec/names/shortNames") {
        if resources.contains(&sn) {
            return Some(("ShortNamesConflict", format!("\"{sn}\" is already in use")));
        }
    }
    let kinds: BTreeSet<String> = taken(&one("/kind"))
        .into_iter()
        .chain(taken(&one("/listKind")))
        .collect();
    let kind = s(crd, "/spec/names/kind");
    if kinds.contains(kind) {
        return Some(("KindConflict", format!("\"{kind}\" is already in use")));
    }
    let list_kind = s(crd, "/spec/names/listKind");
    if kinds.contains(list_kind) {
        return Some((
            "ListKindConflict",
            format!("\"{list_kind}\" is already in use"),
        ));
    }
    None
}

fn set_condition(
    conds: &mut Vec<Value>,
    t: &str,
    status: &str,
    reason: &str,
    msg: &str,
    now: &str,
) {
    let new = json!({"type": t, "status": status, "lastTransitionTime": now, "reason": reason, "message": msg});
    match conds.iter_mut().find(|c| s(c, "/type") == t) {
        Some(c) => {
            let keep_time = s(c, "/status") == status;
            let time = if keep_time {
                c.get("lastTransitionTime").cloned().unwrap_or(json!(now))
            } else {
                json!(now)
            };
            *c = new;
            c["lastTransitionTime"] = time;
        }
        None => conds.push(new),
    }
}

/// The status the naming and establishing controllers give a CRD, knowing the other CRDs:
/// `acceptedNames`, `NamesAccepted`, `Established`, `storedVersions` (the storage version
/// appended when new). A CRD being deleted keeps its status but for a `Terminating` condition.
pub fn desired_status(crd: &Value, others: &[&Value], now: &str) -> Value {
    let mut status = crd.get("status").cloned().unwrap_or_else(|| json!({}));
    if !status.is_object() {
        status = json!({});
    }
    let mut conds: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let deleting = crd.pointer("/metadata/deletionTimestamp").is_some();
    if deleting {
        set_condition(
            &mut conds,
            "Terminating",
            "True",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
            now,
        );
        status["conditions"] = Value::Array(conds);
        return status;
    }
    match conflict(crd, others) {
        None => {
            let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
            status["acceptedNames"] = names;
            set_condition(
                &mut conds,
                "NamesAccepted",
                "True",
                "NoConflicts",
                "no conflicts found",
                now,
            );
            set_condition(
                &mut conds,
                "Established",
                "True",
                "InitialNamesAccepted",
                "the initial names have been accepted",
                now,
            );
        }
        Some((reason, msg)) => {
            if status.get("acceptedNames").is_none() {
                status["acceptedNames"] = json!({"plural": "", "kind": ""});
            }
            set_condition(&mut conds, "NamesAccepted", "False", reason, &msg, now);
            if !is_established(crd) {
                set_condition(
                    &mut conds,
                    "Established",
                    "False",
                    "NotAccepted",
                    "not all names are accepted",
                    now,
                );
            }
        }
    }
    status["conditions"] = Value::Array(conds);
    let mut stored = strings(&status, "/storedVersions");
    if let Some(sv) = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .map(|v| s(v, "/name").to_string())
        && !stored.contains(&sv)
    {
        stored.push(sv);
    }
    status["storedVersions"] = json!(stored);
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's CronTab example (the CRD documentation), with printer columns and subresources.
    pub(crate) fn crontab() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "crontabs.stable.example.com"},
            "spec": {
                "group": "stable.example.com", "scope": "Namespaced",
                "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab", "shortNames": ["ct"]},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
                        "cronSpec": {"type": "string"}, "image": {"type": "string"}, "replicas": {"type": "integer"}}}}}},
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                    "additionalPrinterColumns": [{"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"}]
                }]
            }
        })
    }

    fn errs_of(mut crd: Value, f: impl FnOnce(&mut Value)) -> Vec<String> {
        f(&mut crd);
        default_crd(&mut crd);
        validate_crd(&crd, None)
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn defaults() {
        let mut c = crontab();
        c["spec"]["names"]
            .as_object_mut()
            .map(|m| m.remove("singular"));
        default_crd(&mut c);
        assert_eq!(c["spec"]["names"]["singular"], json!("crontab"));
        assert_eq!(c["spec"]["names"]["listKind"], json!("CronTabList"));
        assert_eq!(c["spec"]["conversion"]["strategy"], json!("None"));
        assert_eq!(
            c["spec"]["versions"][0]["additionalPrinterColumns"][0]["priority"],
            json!(0)
        );
    }

    #[test]
    fn validation_table() {
        let none: Vec<String> = vec![];
        assert_eq!(errs_of(crontab(), |_| {}), none);
        type Case = (Box<dyn FnOnce(&mut Value)>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            (
                Box::new(|c| c["metadata"]["name"] = json!("x.stable.example.com")),
                vec!["metadata.name"],
            ),
            (
                Box::new(|c| {
                    c["spec"]["group"] = json!("example");
                    c["metadata"]["name"] = json!("crontabs.example");
                }),
                vec!["spec.group"],
            ),
            (
                Box::new(|c| c["spec"]["scope"] = json!("Global")),
                vec!["spec.scope"],
            ),
            (
                Box::new(|c| c["spec"]["names"]["kind"] = json!("")),
                vec!["spec.names.kind", "spec.names.listKind"],
            ),
            (
                Box::new(|c| c["spec"]["names"]["kind"] = json!("Cron_Tab")),
                vec!["spec.names.kind", "spec.names.listKind"],
            ),
            (
                Box::new(|c| c["spec"]["names"]["shortNames"] = json!(["CT"])),
                vec!["spec.names.shortNames[0]"],
            ),
            (
                Box::new(|c| c["spec"]["versions"][0]["storage"] = json!(false)),
                vec!["spec.versions"],
            ),
            (
                Box::new(|c| {
                    let v = c["spec"]["versions"][0].clone();
                    if let Some(a) = c["spec"]["versions"].as_array_mut() {
                        a.push(v);
                    }
                }),
                vec!["spec.versions", "spec.versions[1].name"],
            ),
            (
                Box::new(|c| c["spec"]["versions"][0]["schema"] = json!({})),
                vec!["spec.versions[0].schema.openAPIV3Schema"],
            ),
            (
                Box::new(|c| {
                    c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                        ["x"] = json!({})
                }),
                vec!["spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[x].type"],
            ),
            (
                Box::new(|c| {
                    c["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"] =
                        json!(".status.replicas")
                }),
                vec!["spec.versions[0].subresources.scale.specReplicasPath"],
            ),
            (
                Box::new(|c| {
                    c["spec"]["versions"][0]["additionalPrinterColumns"][0]["type"] = json!("text")
                }),
                vec!["spec.versions[0].additionalPrinterColumns[0].type"],
            ),
            (
                Box::new(|c| c["spec"]["conversion"] = json!({"strategy": "Webhook"})),
                vec!["spec.conversion.strategy"],
            ),
        ];
        for (f, want) in cases {
            assert_eq!(errs_of(crontab(), f), want);
        }
    }

    #[test]
    fn stored_versions_stay_in_spec() {
        let mut old = crontab();
        default_crd(&mut old);
        old["status"] = json!({"storedVersions": ["v1"]});
        let mut new = old.clone();
        new["spec"]["versions"][0]["name"] = json!("v2");
        let f: Vec<String> = validate_crd(&new, Some(&old))
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(f, vec!["status.storedVersions[0]"]);
    }

    #[test]
    fn immutable_fields() {
        let mut old = crontab();
        default_crd(&mut old);
        let mut new = old.clone();
        new["spec"]["scope"] = json!("Cluster");
        let f: Vec<String> = validate_crd(&new, Some(&old))
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(f, vec!["spec.scope"]);
    }

    #[test]
    fn naming_and_establishing() {
        let mut c = crontab();
        default_crd(&mut c);
        let st = desired_status(&c, &[], "2026-01-01T00:00:00Z");
        assert_eq!(st["acceptedNames"]["plural"], json!("crontabs"));
        assert_eq!(st["storedVersions"], json!(["v1"]));
        c["status"] = st;
        assert!(is_established(&c));
        let d = Definition::from_crd(&c).expect("served");
        assert_eq!(d.kind, "CronTab");
        assert!(d.namespaced);
        assert_eq!(d.versions[0].columns[0].name, "Spec");
        assert!(d.versions[0].scale.is_some());
        // A second CRD of the same group asking for the same plural is not accepted.
        let mut other = crontab();
        other["metadata"]["name"] = json!("crontabs2.stable.example.com");
        other["spec"]["names"]["plural"] = json!("crontabs2");
        other["spec"]["names"]["singular"] = json!("crontab2");
        other["spec"]["names"]["shortNames"] = json!(["ct"]);
        default_crd(&mut other);
        let st2 = desired_status(&other, &[&c], "2026-01-01T00:00:00Z");
        let cond = st2["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["type"] == "NamesAccepted"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(cond["status"], json!("False"));
        assert_eq!(cond["reason"], json!("ShortNamesConflict"));
        other["status"] = st2;
        assert!(!is_established(&other));
        assert!(Definition::from_crd(&other).is_none());
        // Re-running keeps the transition time.
        let again = desired_status(&c, &[], "2027-01-01T00:00:00Z");
        assert_eq!(
            again["conditions"][0]["lastTransitionTime"],
            json!("2026-01-01T00:00:00Z")
        );
    }
}

/// Kubernetes' version priority (upstream `version.CompareKubeAwareVersionStrings`): GA before
/// beta before alpha, higher numbers first, other names last in alphabetical order. Discovery
/// lists a group's versions in this order; the first is the preferred version.
pub fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn parse(v: &str) -> Option<(u8, u64, u64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: u64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((2, major, 0));
        }
        let (rank, num) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            return None;
        };
        Some((rank, major, num.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[cfg(test)]
mod order_tests {
    #[test]
    fn kube_aware_order() {
        let mut v = vec![
            "v1alpha1",
            "foo",
            "v11alpha2",
            "v1",
            "v2beta1",
            "v10",
            "v1beta2",
            "v12alpha1",
            "bar",
            "v2",
        ];
        v.sort_by(|a, b| super::version_order(a, b));
        assert_eq!(
            v,
            vec![
                "v10",
                "v2",
                "v1",
                "v2beta1",
                "v1beta2",
                "v12alpha1",
                "v11alpha2",
                "v1alpha1",
                "bar",
                "foo"
            ]
        );
    }
}
